//! PUSH validation and the error contract, through the HTTP API (core §5; HTTP binding §3,
//! §4, §6, §9.1–§9.2, §16).

use crate::common;

use common::{spawn_app, NatsServer};
use serde_json::json;

#[tokio::test]
async fn minimal_job_gets_defaults_and_ojs_headers() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let r = app
        .post(
            "/ojs/v1/jobs",
            json!({"type": "email.send", "args": ["a@b.c"]}),
        )
        .await;
    assert_eq!(r.status, 201);
    assert_eq!(r.header("content-type"), "application/openjobspec+json");
    assert_eq!(r.header("ojs-version"), "1.0");
    assert!(r.header("x-request-id").starts_with("req_"));
    let job = &r.body["job"];
    assert_eq!(
        r.header("location"),
        format!("/ojs/v1/jobs/{}", job["id"].as_str().unwrap())
    );
    assert_eq!(job["queue"], "default");
    assert_eq!(job["state"], "available");
    assert_eq!(job["attempt"], 0);
    assert_eq!(job["priority"], 0);
    assert_eq!(job["max_attempts"], 3);
    assert_eq!(job["specversion"], "1.0.0-rc.1");
    assert_eq!(job["created_at"], job["enqueued_at"]);
    for absent in ["started_at", "completed_at", "error", "result"] {
        assert!(job.get(absent).is_none(), "{absent} must be absent");
    }
    let id = job["id"].as_str().unwrap();
    assert_eq!(&id[14..15], "7", "a UUIDv7");
}

#[tokio::test]
async fn every_attribute_is_kept_and_system_fields_ignored() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let r = app
        .post(
            "/ojs/v1/jobs",
            json!({
                "type": "report.generate", "args": [42, "q", {"charts": true}, null, 2.5],
                "meta": {"trace_id": "t1", "tags": ["a"]},
                "state": "completed", "attempt": 7, "result": {"forged": true},
                "x_custom": {"nested": true},
                "options": {"queue": "reports", "priority": 10, "timeout_ms": 60000, "tags": ["x"],
                    "expires_at": "2099-12-31T23:59:59Z", "delay_until": "2020-01-01T00:00:00Z",
                    "retry": {"max_attempts": 5, "initial_interval": "PT2S"},
                    "unique": {"keys": ["type"], "period": "PT1H"}, "x_option": 1}
            }),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let job = &r.body["job"];
    assert_eq!(job["args"], json!([42, "q", {"charts": true}, null, 2.5]));
    assert_eq!(job["meta"]["trace_id"], "t1");
    assert_eq!(job["state"], "available");
    assert_eq!(job["attempt"], 0);
    assert!(job.get("result").is_none());
    assert_eq!(job["x_custom"]["nested"], true);
    assert_eq!(job["queue"], "reports");
    assert_eq!(job["priority"], 10);
    assert_eq!(job["timeout_ms"], 60000);
    assert_eq!(job["expires_at"], "2099-12-31T23:59:59Z");
    assert_eq!(job["scheduled_at"], "2020-01-01T00:00:00Z");
    assert_eq!(job["max_attempts"], 5);
    assert_eq!(job["retry"]["initial_interval"], "PT2S");
    assert_eq!(job["unique"]["period"], "PT1H");
    assert_eq!(job["options"]["x_option"], 1);
    // INFO returns the same envelope, and is stable.
    let id = job["id"].as_str().unwrap();
    let a = app.get(&format!("/ojs/v1/jobs/{id}")).await;
    let b = app.get(&format!("/ojs/v1/jobs/{id}")).await;
    assert_eq!(a.body, b.body);
    assert_eq!(&a.body["job"], job);
}

#[tokio::test]
async fn invalid_envelopes_are_refused_with_the_field_named() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let cases = [
        (json!({"args": []}), "type"),
        (json!({"type": "Email.Send", "args": []}), "type"),
        (json!({"type": "", "args": []}), "type"),
        (json!({"type": 5, "args": []}), "type"),
        (json!({"type": "a.b"}), "args"),
        (json!({"type": "a.b", "args": {"k": 1}}), "args"),
        (json!({"type": "a.b", "args": "x"}), "args"),
        (json!({"type": "a.b", "args": [], "id": "not-a-uuid"}), "id"),
        (
            json!({"type": "a.b", "args": [], "id": "550e8400-e29b-41d4-a716-446655440000"}),
            "id",
        ),
        (json!({"type": "a.b", "args": [], "meta": []}), "meta"),
        (json!({"type": "a.b", "args": [], "options": []}), "options"),
        (
            json!({"type": "a.b", "args": [], "options": {"queue": "My_Queue"}}),
            "queue",
        ),
        (
            json!({"type": "a.b", "args": [], "options": {"queue": "-q"}}),
            "queue",
        ),
        (
            json!({"type": "a.b", "args": [], "options": {"priority": 101}}),
            "priority",
        ),
        (
            json!({"type": "a.b", "args": [], "options": {"priority": "urgent"}}),
            "priority",
        ),
        (
            json!({"type": "a.b", "args": [], "options": {"timeout_ms": -1}}),
            "timeout_ms",
        ),
        (
            json!({"type": "a.b", "args": [], "options": {"scheduled_at": "tomorrow"}}),
            "scheduled_at",
        ),
        (
            json!({"type": "a.b", "args": [], "options": {"expires_at": "2099-12-31T23:59:59"}}),
            "expires_at",
        ),
        (
            json!({"type": "a.b", "args": [], "options": {"tags": [1]}}),
            "tags",
        ),
        (
            json!({"type": "a.b", "args": [], "specversion": "2.0"}),
            "specversion",
        ),
    ];
    for (body, field) in cases {
        let r = app.post("/ojs/v1/jobs", body.clone()).await;
        r.assert_error(400, "invalid_request");
        let e = &r.body["error"];
        assert_eq!(e["type"], "validation_error", "{body}");
        assert_eq!(e["retryable"], false);
        assert_eq!(e["details"]["field"], field, "{body}: {e}");
        assert!(e["hint"].is_string() && e["docs_url"].is_string());
        assert_eq!(e["request_id"], r.header("x-request-id"));
    }
}

#[tokio::test]
async fn bad_retry_policy_is_422_naming_the_field() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    for (retry, field) in [
        (json!({"max_attempts": -1}), "max_attempts"),
        (json!({"backoff_coefficient": 0.5}), "backoff_coefficient"),
        (json!({"initial_interval": "soon"}), "initial_interval"),
        (json!({"on_exhaustion": "explode"}), "on_exhaustion"),
    ] {
        let r = app
            .post(
                "/ojs/v1/jobs",
                json!({"type": "a.b", "args": [], "options": {"retry": retry}}),
            )
            .await;
        r.assert_error(422, "invalid_request");
        assert_eq!(r.body["error"]["type"], "validation_error");
        assert!(r.body["error"]["message"].as_str().unwrap().contains(field));
    }
}

#[tokio::test]
async fn malformed_bodies_get_spec_errors_never_a_panic() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let json_ct = Some("application/json");
    for body in [
        &b"{ invalid json }"[..],
        b"",
        b"   ",
        b"[1,2]",
        b"\"text\"",
        b"null",
        b"{\"type\":",
        &[0xff, 0xfe, 0x00],
    ] {
        app.post_raw("/ojs/v1/jobs", json_ct, body.to_vec())
            .await
            .assert_error(400, "invalid_payload");
    }
    // A missing content type is taken as JSON; a non-JSON one is refused.
    let ok = app
        .post_raw(
            "/ojs/v1/jobs",
            None,
            br#"{"type":"a.b","args":[]}"#.to_vec(),
        )
        .await;
    assert_eq!(ok.status, 201);
    app.post_raw(
        "/ojs/v1/jobs",
        Some("text/plain"),
        br#"{"type":"a.b","args":[]}"#.to_vec(),
    )
    .await
    .assert_error(400, "invalid_request");
    let with_charset = app
        .post_raw(
            "/ojs/v1/jobs",
            Some("application/openjobspec+json; charset=utf-8"),
            br#"{"type":"a.b","args":[]}"#.to_vec(),
        )
        .await;
    assert_eq!(with_charset.status, 201);
    // Other endpoints use the same extractor.
    for path in [
        "/ojs/v1/workers/fetch",
        "/ojs/v1/workers/ack",
        "/ojs/v1/workers/nack",
        "/ojs/v1/jobs/batch",
    ] {
        app.post_raw(path, json_ct, b"{oops".to_vec())
            .await
            .assert_error(400, "invalid_payload");
    }
}

#[tokio::test]
async fn oversized_bodies_are_refused_with_413() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    // Over the HTTP body limit (16 MiB by default).
    let huge = vec![b' '; 17 * 1024 * 1024];
    app.post_raw("/ojs/v1/jobs", Some("application/json"), huge)
        .await
        .assert_error(413, "envelope_too_large");
    // Under the body limit but over what the NATS server accepts for one record.
    let big = "x".repeat(2 * 1024 * 1024);
    let r = app
        .post("/ojs/v1/jobs", json!({"type": "a.b", "args": [big]}))
        .await;
    r.assert_error(413, "envelope_too_large");
}

#[tokio::test]
async fn version_header_routes_and_methods() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let r = app
        .http
        .post(app.url("/ojs/v1/jobs"))
        .header("content-type", "application/json")
        .header("ojs-version", "9.9")
        .header("x-request-id", "client-chosen-1")
        .body(r#"{"type":"a.b","args":[]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
    assert_eq!(r.headers()["x-request-id"], "client-chosen-1");
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unsupported");
    assert_eq!(body["error"]["request_id"], "client-chosen-1");

    app.get("/ojs/v1/nope").await.assert_error(404, "not_found");
    let r = app
        .get("/ojs/v1/jobs/019539a4-0000-7000-8000-000000000000")
        .await;
    r.assert_error(404, "not_found");
    assert_eq!(r.body["error"]["details"]["resource_type"], "job");
    app.get("/ojs/v1/jobs/not-a-uuid")
        .await
        .assert_error(404, "not_found");
    let r = app.get("/ojs/v1/workers/fetch").await;
    assert_eq!(r.status, 405);
    assert_eq!(r.header("content-type"), "application/openjobspec+json");
}

/// Every batch job's queue message is published before any acknowledgement is awaited, so
/// a gateway-wide cap on unacknowledged publishes would deadlock once concurrent batches
/// hold more than it allows (it did at async-nats' default of 5000: the whole gateway hung).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_and_concurrent_batches_are_all_accepted() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let batch = |n: usize| {
        let jobs: Vec<_> = (0..n)
            .map(|i| json!({"type": "bulk.load", "args": [i], "queue": "bulk"}))
            .collect();
        json!({ "jobs": jobs })
    };
    let started = std::time::Instant::now();
    let mut requests = vec![app.post("/ojs/v1/jobs/batch", batch(10_000))];
    requests.extend((0..8).map(|_| app.post("/ojs/v1/jobs/batch", batch(1000))));
    let replies = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        futures::future::join_all(requests),
    )
    .await
    .expect("the batches were answered");
    for (r, n) in replies
        .iter()
        .zip([10_000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000])
    {
        assert_eq!(r.status, 201, "{}", r.body);
        let jobs = r.body["jobs"].as_array().expect("jobs");
        assert_eq!(jobs.len(), n);
        let last = jobs.last().unwrap()["id"].as_str().unwrap();
        assert_eq!(app.job(last).await["state"], "available");
    }
    println!("18,000 jobs in 9 batches: {:?}", started.elapsed());
}
