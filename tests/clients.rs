//! What the official OJS client libraries (Python, JavaScript, Rust) send and read, each
//! request recorded in the shape `docs/clients.md` of the shared documents gives, served
//! without changing what the conformance suites see.

use crate::common;

use std::time::{Duration, Instant};

use common::{eventually, spawn_app, spawn_app_with, test_config, NatsServer, TestApp};
use ojs_jetstream::config::Config;
use ojs_jetstream::domain::retry::OnExhaustion;
use serde_json::{json, Value};

const OJS: &str = "application/openjobspec+json";

async fn send(
    app: &TestApp,
    method: reqwest::Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> (u16, String, Value) {
    let mut req = app.http.request(method, app.url(path));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    if let Some(body) = body {
        req = req.body(body.to_string());
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let content_type = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let bytes = resp.bytes().await.unwrap();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or(Value::Null)
    };
    (status, content_type, body)
}

#[tokio::test]
async fn responses_are_labelled_application_json_for_clients_that_accept_only_that() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let post = reqwest::Method::POST;
    let job = json!({"type": "email.send", "args": ["a@example.com"]});
    // The Python client asked for plain JSON: success and error bodies are labelled so.
    let python = [
        ("accept", "application/json"),
        ("content-type", "application/json"),
    ];
    let (status, content_type, body) = send(
        &app,
        post.clone(),
        "/ojs/v1/jobs",
        &python,
        Some(job.clone()),
    )
    .await;
    assert_eq!((status, content_type.as_str()), (201, "application/json"));
    assert_eq!(body["job"]["type"], "email.send");
    let (status, content_type, body) = send(
        &app,
        reqwest::Method::GET,
        "/ojs/v1/jobs/019a0000-0000-7000-8000-000000000000",
        &python,
        None,
    )
    .await;
    assert_eq!((status, content_type.as_str()), (404, "application/json"));
    assert_eq!(body["error"]["code"], "not_found");
    // Weighted lists and parameters are read too.
    let (_, content_type, _) = send(
        &app,
        post.clone(),
        "/ojs/v1/jobs",
        &[("accept", "text/html;q=0.5, application/json; charset=utf-8")],
        Some(job.clone()),
    )
    .await;
    assert_eq!(content_type, "application/json");
    // The OJS media type wins whenever it is accepted; no Accept gets it too (the suites).
    for accept in [
        Some(OJS),
        Some("application/json, application/openjobspec+json"),
        None,
    ] {
        let headers: Vec<(&str, &str)> = accept.map(|a| ("accept", a)).into_iter().collect();
        let (status, content_type, _) = send(
            &app,
            post.clone(),
            "/ojs/v1/jobs",
            &headers,
            Some(job.clone()),
        )
        .await;
        assert_eq!(
            (status, content_type.as_str()),
            (201, OJS),
            "Accept {accept:?}"
        );
    }
    // Prometheus text stays text.
    let (_, content_type, _) = send(
        &app,
        reqwest::Method::GET,
        "/metrics",
        &[("accept", "application/json")],
        None,
    )
    .await;
    assert!(content_type.starts_with("text/plain"), "{content_type}");
}

/// The Python OJS client with its defaults: it asks for the OJS media type, sends its HTTP
/// library's `User-Agent`, and reads only bodies labelled `application/json` — so it is
/// answered with that label, successes and errors alike, while the same request from any
/// other client keeps the OJS media type.
#[tokio::test]
async fn python_sdk_with_its_default_headers_gets_answers_it_can_read() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let python = [
        ("accept", OJS),
        ("content-type", OJS),
        ("ojs-version", "1.0"),
        ("user-agent", "python-httpx/0.28.1"),
    ];
    let job = json!({"type": "email.send", "args": ["a@example.com"], "options": {"queue": "py-defaults"}});
    let (status, content_type, body) = send(
        &app,
        reqwest::Method::POST,
        "/ojs/v1/jobs",
        &python,
        Some(job.clone()),
    )
    .await;
    assert_eq!((status, content_type.as_str()), (201, "application/json"));
    let id = body["job"]["id"].as_str().unwrap().to_owned();
    let (status, content_type, body) = send(
        &app,
        reqwest::Method::POST,
        "/ojs/v1/workers/fetch",
        &python,
        Some(json!({"queues": ["py-defaults"], "count": 1, "visibility_timeout_ms": 30000})),
    )
    .await;
    assert_eq!((status, content_type.as_str()), (200, "application/json"));
    assert_eq!(body["jobs"][0]["id"], id.as_str());
    let (status, content_type, body) = send(
        &app,
        reqwest::Method::GET,
        "/ojs/v1/jobs/019a0000-0000-7000-8000-000000000000",
        &python,
        None,
    )
    .await;
    assert_eq!((status, content_type.as_str()), (404, "application/json"));
    assert_eq!(body["error"]["code"], "not_found");
    // Another client sending the same Accept keeps the OJS media type.
    for agent in [
        "Go-http-client/1.1",
        "python-requests/2.32",
        "my-httpx-wrapper",
    ] {
        let (status, content_type, _) = send(
            &app,
            reqwest::Method::POST,
            "/ojs/v1/jobs",
            &[("accept", OJS), ("user-agent", agent)],
            Some(job.clone()),
        )
        .await;
        assert_eq!((status, content_type.as_str()), (201, OJS), "{agent}");
    }
}

#[tokio::test]
async fn empty_bodied_posts_and_bodiless_gets_with_a_content_type_are_served() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let empty = [("content-type", OJS), ("content-length", "0")];
    let id = app
        .enqueue(json!({"type": "t.dead", "args": [], "options": {"queue": "py", "retry": {"max_attempts": 1, "on_exhaustion": "dead_letter"}}}))
        .await;
    app.fetch(&["py"], "w").await;
    let r = app
        .fail(json!({"job_id": id, "error": {"type": "Boom", "message": "no"}}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);

    for path in ["/ojs/v1/queues/py/pause", "/ojs/v1/queues/py/resume"] {
        let (status, _, body) = send(&app, reqwest::Method::POST, path, &empty, None).await;
        assert_eq!(status, 200, "{path}: {body}");
    }
    let (status, _, body) = send(
        &app,
        reqwest::Method::POST,
        &format!("/ojs/v1/dead-letter/{id}/retry"),
        &empty,
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = send(
        &app,
        reqwest::Method::GET,
        &format!("/ojs/v1/jobs/{id}"),
        &[("content-type", OJS)],
        None,
    )
    .await;
    assert_eq!(
        (status, body["job"]["state"].as_str()),
        (200, Some("available"))
    );
}

#[tokio::test]
async fn unknown_routes_and_methods_answer_json_errors_naming_the_path() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let r = app.get("/ojs/v1/no/such/route").await;
    r.assert_error(404, "not_found");
    assert_eq!(r.body["error"]["details"]["resource_type"], "route");
    assert_eq!(
        r.body["error"]["details"]["resource_id"],
        "/ojs/v1/no/such/route"
    );
    app.delete("/ojs/v1/workers/fetch")
        .await
        .assert_error(405, "invalid_request");
}

#[tokio::test]
async fn a_single_job_reads_wrapped_and_bare_with_its_failed_attempts_error() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let id = app
        .enqueue(json!({"type": "t.bare", "args": [7], "options": {"queue": "bare", "retry": {"max_attempts": 2, "initial_interval": "PT60S"}}}))
        .await;
    app.fetch(&["bare"], "w").await;
    app.fail(json!({"job_id": id, "error": {"type": "Boom", "message": "no"}}))
        .await;
    let r = app.get(&format!("/ojs/v1/jobs/{id}")).await;
    assert_eq!(r.status, 200);
    // The Rust client reads these at the top level, the suites under `job`.
    for field in [
        "id",
        "type",
        "state",
        "args",
        "attempt",
        "queue",
        "created_at",
    ] {
        assert_eq!(r.body[field], r.body["job"][field], "{field}");
    }
    assert_eq!(r.body["state"], "retryable");
    assert_eq!(r.body["job"]["error"]["type"], "Boom");
    // The Rust client and the `ojs` command line read a failed attempt's error bare too;
    // every client tells a failed request by its status, not by this field.
    assert_eq!(r.body["error"], r.body["job"]["error"]);
    let r = app.delete(&format!("/ojs/v1/jobs/{id}")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["state"], "cancelled");
    assert_eq!(r.body["previous_state"], "retryable");
    assert_eq!(r.body["job"]["state"], "cancelled");
}

#[tokio::test]
async fn a_beat_without_a_timeout_extends_by_what_the_fetch_asked_for() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let id = app
        .enqueue(json!({"type": "t.js", "args": [], "options": {"queue": "js"}}))
        .await;
    // Both clients fetch with a visibility timeout (here 1 s; they send 30 s).
    let r = app
        .post(
            "/ojs/v1/workers/fetch",
            json!({"queues": ["js"], "count": 1, "worker_id": "w-js", "visibility_timeout_ms": 1000}),
        )
        .await;
    assert_eq!(r.body["jobs"][0]["id"], id.as_str());
    // The JavaScript client's beat: no visibility_timeout_ms.
    let beat = json!({"worker_id": "w-js", "state": "running", "active_jobs": 1,
        "active_job_ids": [id], "hostname": "h", "pid": 1, "queues": ["js"],
        "concurrency": 1, "labels": []});
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(600)).await;
        let r = app.post("/ojs/v1/workers/heartbeat", beat.clone()).await;
        assert_eq!(r.body["jobs_extended"], json!([id]), "{}", r.body);
    }
    // Extended by 1 s each time (not the server's 30 minutes): silence lets it lapse.
    let silent = Instant::now();
    eventually(Duration::from_secs(3), "the lapse", || async {
        (app.job(&id).await["state"] == "available").then_some(())
    })
    .await;
    assert!(
        silent.elapsed() < Duration::from_millis(2000),
        "lapsed after {:?}",
        silent.elapsed()
    );
}

#[tokio::test]
async fn cron_entries_answer_in_the_names_clients_read_and_page_both_ways() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    // The JavaScript and Python clients' form.
    for i in 0..3 {
        let r = app
            .post(
                "/ojs/v1/cron",
                json!({"name": format!("nightly-{i}"), "cron": "0 3 * * *", "type": "report.build",
                    "args": [i], "timezone": "UTC", "options": {"queue": "reports"}}),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.body);
        let entry = &r.body["cron_job"];
        // The Rust client reads the entry bare, its `cron` the expression.
        for field in [
            "name", "cron", "type", "args", "timezone", "enabled", "status",
        ] {
            assert_eq!(r.body[field], entry[field], "{field}");
        }
        assert_eq!(entry["cron"], "0 3 * * *");
        assert_eq!(entry["expression"], "0 3 * * *");
        assert_eq!(entry["type"], "report.build");
        assert_eq!(entry["args"], json!([i]));
        assert_eq!(entry["options"]["queue"], "reports");
        assert_eq!(entry["status"], "active");
    }
    let r = app.get("/ojs/v1/cron?page=2&per_page=2").await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["cron_jobs"].as_array().unwrap().len(), 1);
    assert_eq!(r.body["crons"], r.body["cron_jobs"]);
    assert_eq!(
        r.body["pagination"],
        json!({"total": 3, "limit": 2, "offset": 2, "has_more": false, "page": 2, "per_page": 2})
    );
    let r = app.get("/ojs/v1/cron?limit=2&offset=0").await;
    assert_eq!(r.body["crons"].as_array().unwrap().len(), 2);
    assert_eq!(r.body["pagination"]["has_more"], true);
    app.get("/ojs/v1/cron?per_page=lots")
        .await
        .assert_error(400, "invalid_request");
    let r = app.delete("/ojs/v1/cron/nightly-0").await;
    assert_eq!(r.body["cron_job"]["name"], "nightly-0");
    assert_eq!(r.body["cron_job"]["cron"], "0 3 * * *");
}

#[tokio::test]
async fn a_server_default_sends_jobs_whose_policy_cannot_say_so_to_the_dead_letter_queue() {
    let nats = NatsServer::start();
    let app = spawn_app_with(Config {
        default_on_exhaustion: OnExhaustion::DeadLetter,
        ..test_config(&nats.url)
    })
    .await;
    let once = |on_exhaustion: Option<&str>| {
        let mut retry = json!({"max_attempts": 1});
        if let Some(choice) = on_exhaustion {
            retry["on_exhaustion"] = json!(choice);
        }
        json!({"type": "t.once", "args": [], "options": {"queue": "dlq-default", "retry": retry}})
    };
    // A policy without on_exhaustion (as a client sends it), one that says discard, and a
    // workflow's member without it.
    let silent = app.enqueue(once(None)).await;
    let discard = app.enqueue(once(Some("discard"))).await;
    let workflow = app
        .post(
            "/ojs/v1/workflows",
            json!({"type": "chain", "name": "w", "steps": [once(None)]}),
        )
        .await;
    assert_eq!(workflow.status, 201, "{}", workflow.body);
    let member = workflow.body["steps"][0]["job_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = app
        .post(
            "/ojs/v1/workers/fetch",
            json!({"queues": ["dlq-default"], "count": 10, "worker_id": "w"}),
        )
        .await;
    assert_eq!(r.body["jobs"].as_array().unwrap().len(), 3, "{}", r.body);
    for id in [&silent, &discard, &member] {
        let r = app
            .fail(json!({"job_id": id, "error": {"type": "Boom", "message": "no"}}))
            .await;
        assert_eq!(r.body["state"], "discarded", "{}", r.body);
    }
    for (id, dead_lettered) in [(&silent, true), (&discard, false), (&member, true)] {
        let r = app.get(&format!("/ojs/v1/dead-letter/{id}")).await;
        assert_eq!(r.status == 200, dead_lettered, "{id}: {}", r.body);
    }
}

/// The `ojs` command line: `enqueue` sends `options.max_attempts` and a caller's own unique
/// key with `within`, and prints the job's fields from the top level; `enqueue --batch`
/// prints `enqueued` and `failed`; `cron --detail` and `retry` read bare answers.
#[tokio::test]
async fn the_command_lines_enqueue_options_take_effect_and_its_answers_read_bare() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let job = json!({"type": "cli.job", "args": [], "options": {"queue": "cli", "priority": 5,
        "max_attempts": 1, "unique": {"key": "invoice-42", "within": "1h"}}});
    let r = app.post("/ojs/v1/jobs", job.clone()).await;
    assert_eq!(r.status, 201, "{}", r.body);
    for field in ["id", "type", "queue", "state", "max_attempts"] {
        assert_eq!(r.body[field], r.body["job"][field], "{field}");
    }
    assert_eq!(
        r.body["max_attempts"], 1,
        "options.max_attempts is the policy's"
    );
    let id = r.body["id"].as_str().unwrap().to_owned();
    // The same key again, whatever the args: refused as a duplicate for the hour.
    let mut again = job.clone();
    again["args"] = json!(["other"]);
    app.post("/ojs/v1/jobs", again)
        .await
        .assert_error(409, "duplicate");
    let mut other_key = job.clone();
    other_key["options"]["unique"]["key"] = json!("invoice-43");
    assert_eq!(app.post("/ojs/v1/jobs", other_key).await.status, 201);
    app.post(
        "/ojs/v1/jobs",
        json!({"type": "cli.job", "args": [], "options": {"max_attempts": "three"}}),
    )
    .await
    .assert_error(422, "invalid_request");

    let r = app
        .post(
            "/ojs/v1/jobs/batch",
            json!({"jobs": [{"type": "cli.b", "args": [1]}, {"type": "cli.b", "args": [2]}]}),
        )
        .await;
    assert_eq!(
        (r.body["enqueued"].clone(), r.body["failed"].clone()),
        (json!(2), json!(0))
    );

    // Its one attempt fails: discarded, then retried by an operator.
    assert_eq!(app.fetch(&["cli"], "w").await.len(), 1);
    let r = app
        .fail(json!({"job_id": id, "error": {"message": "no"}}))
        .await;
    assert_eq!(r.body["state"], "discarded", "{}", r.body);
    let r = app
        .post(&format!("/ojs/v1/admin/jobs/{id}/retry"), json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["state"], "available");
    assert_eq!(r.body["job"]["state"], "available");

    let r = app
        .post(
            "/ojs/v1/cron",
            json!({"name": "cli-nightly", "expression": "0 3 * * *",
                "job_template": {"type": "cli.report", "options": {"queue": "cli"}}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(
        r.body["cron"]["name"], "cli-nightly",
        "the suites' form keeps the wrapper"
    );
    let r = app.get("/ojs/v1/cron/cli-nightly").await;
    assert_eq!(r.body["name"], "cli-nightly");
    assert_eq!(r.body["expression"], "0 3 * * *");
    assert_eq!(r.body["job_template"]["type"], "cli.report");
    assert_eq!(r.body["cron"]["name"], "cli-nightly");
}

/// The Rust client library: its manifest reads `extensions` as a list, a dead-letter retry
/// and a registered cron entry come back bare, and a fetched job's error carries a
/// `backtrace` of frame strings whatever form another worker reported it in.
#[tokio::test]
async fn the_rust_clients_reads_find_the_shapes_it_parses() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let r = app.get("/ojs/manifest").await;
    assert!(r.body["extensions"].is_array(), "{}", r.body);

    let id = common::dead_letter_a_job(&app, "rust-dlq").await;
    let r = app
        .post(&format!("/ojs/v1/dead-letter/{id}/retry"), json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        (r.body["id"].as_str(), r.body["type"].as_str()),
        (Some(id.as_str()), Some("t.d"))
    );
    assert_eq!(r.body["job"]["id"], r.body["id"]);

    let r = app
        .post(
            "/ojs/v1/cron",
            json!({"name": "rust-cron", "cron": "*/5 * * * *", "timezone": "UTC", "type": "t.r",
                "args": [], "overlap_policy": "skip", "enabled": true}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(
        (
            r.body["name"].as_str(),
            r.body["cron"].as_str(),
            r.body["type"].as_str()
        ),
        (Some("rust-cron"), Some("*/5 * * * *"), Some("t.r"))
    );

    // A Python-style worker reports its trace as one string; the next fetch (a Rust
    // worker's) finds it as frames.
    let id = app
        .enqueue(
            json!({"type": "t.bt", "args": [], "options": {"queue": "rust-bt",
            "retry": {"max_attempts": 2, "initial_interval": "PT0.1S", "jitter": false}}}),
        )
        .await;
    app.fetch(&["rust-bt"], "py").await;
    let r = app
        .fail(
            json!({"job_id": id, "error": {"type": "ValueError", "message": "bad",
            "backtrace": "Traceback (most recent call last):\n  File \"w.py\", line 3\n"}}),
        )
        .await;
    assert_eq!(r.body["state"], "retryable", "{}", r.body);
    let fetched = eventually(Duration::from_secs(5), "the retry", || async {
        let jobs = app.fetch(&["rust-bt"], "rs").await;
        jobs.into_iter().next()
    })
    .await;
    assert_eq!(
        fetched["error"]["backtrace"],
        json!([
            "Traceback (most recent call last):",
            "  File \"w.py\", line 3"
        ])
    );
    let r = app
        .fail(json!({"job_id": id, "error": {"message": "m", "backtrace": {"frame": 1}}}))
        .await;
    r.assert_error(400, "invalid_request");
    assert_eq!(r.body["error"]["details"]["field"], "error.backtrace");
}

/// The `ojs` command line's cron controls, job listing, dead-letter count and workflow
/// cancel: `cron --pause/--resume/--trigger`, `cron --enabled`, `jobs`, the `total` it
/// prints over the dead letter queue, and `cancelled_steps`.
#[tokio::test]
async fn the_command_lines_cron_controls_listings_and_counts() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let r = app
        .post(
            "/ojs/v1/cron",
            json!({"name": "cli-tick", "expression": "* * * * * *", "overlap_policy": "allow",
                "job_template": {"type": "cli.tick", "args": [1], "options": {"queue": "cli-cron"}}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let runs = || async {
        app.get("/ojs/v1/cron/cli-tick").await.body["run_count"]
            .as_u64()
            .unwrap()
    };
    eventually(Duration::from_secs(5), "a first tick", || async {
        (runs().await > 0).then_some(())
    })
    .await;
    let r = app.post("/ojs/v1/cron/cli-tick/pause", json!({})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        (r.body["enabled"].clone(), r.body["next_run_at"].clone()),
        (json!(false), Value::Null)
    );
    let paused_at = runs().await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        runs().await <= paused_at + 1,
        "a paused entry fires no more (one tick may be under way)"
    );
    let listed = |enabled: &'static str| {
        let app = &app;
        async move {
            let r = app.get(&format!("/ojs/v1/cron?enabled={enabled}")).await;
            r.body["cron_jobs"].as_array().unwrap().len()
        }
    };
    assert_eq!((listed("false").await, listed("true").await), (1, 0));
    app.get("/ojs/v1/cron?enabled=maybe")
        .await
        .assert_error(400, "invalid_request");
    let r = app.post("/ojs/v1/cron/cli-tick/resume", json!({})).await;
    assert_eq!(r.body["enabled"], true, "{}", r.body);
    let resumed_at = runs().await;
    eventually(Duration::from_secs(5), "ticks again", || async {
        (runs().await > resumed_at).then_some(())
    })
    .await;

    let r = app.post("/ojs/v1/cron/cli-tick/trigger", json!({})).await;
    assert_eq!(r.status, 201, "{}", r.body);
    let job = app
        .get(&format!(
            "/ojs/v1/jobs/{}",
            r.body["job_id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(job.body["meta"]["cron_name"], "cli-tick");
    assert_eq!(job.body["args"], json!([1]));
    app.post("/ojs/v1/cron/no-such/trigger", json!({}))
        .await
        .assert_error(404, "not_found");

    // `jobs --queue cli-cron`: the listing, its jobs and count where the command line
    // reads them.
    let r = app.get("/ojs/v1/jobs?queue=cli-cron&limit=100").await;
    assert_eq!(r.status, 200, "{}", r.body);
    let total = r.body["total"].as_u64().unwrap();
    assert!(total >= 2, "{}", r.body);
    assert_eq!(r.body["jobs"], r.body["items"]);
    assert_eq!(r.body["jobs"][0]["queue"], "cli-cron");

    common::dead_letter_a_job(&app, "cli-dlq").await;
    let r = app.get("/ojs/v1/dead-letter?limit=5&queue=").await;
    assert_eq!(r.status, 200, "an empty queue is no filter: {}", r.body);
    assert_eq!(r.body["total"], r.body["pagination"]["total"]);
    assert!(r.body["total"].as_u64().unwrap() >= 1);

    let r = app
        .post(
            "/ojs/v1/workflows",
            json!({"name": "cli-wf", "steps": [
                {"id": "step-0", "type": "t.a", "args": []},
                {"id": "step-1", "type": "t.b", "args": [], "depends_on": ["step-0"]}]}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let r = app
        .delete(&format!(
            "/ojs/v1/workflows/{}",
            r.body["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(r.body["cancelled_steps"], r.body["steps_cancelled"]);
    assert_eq!(r.body["cancelled_steps"], 2);
    assert_eq!(r.body["steps_already_complete"], 0);
}

/// The Rust client's workflows: `batch()` sends its callbacks as steps named for their
/// type after every job, and workflow options are every step's defaults.
#[tokio::test]
async fn the_rust_clients_batch_and_workflow_options() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let r = app
        .post(
            "/ojs/v1/workflows",
            json!({"name": "rust-batch", "steps": [
                {"id": "job-0", "type": "t.a", "args": [0]},
                {"id": "job-1", "type": "t.a", "args": [1]},
                {"id": "on-complete", "type": "t.done", "args": [], "depends_on": ["job-0", "job-1"]}],
                "options": {"queue": "rust-wf"}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["type"], "batch", "{}", r.body);
    for _ in 0..2 {
        let jobs = app.fetch(&["rust-wf"], "w").await;
        assert_eq!(jobs.len(), 1, "the members run in the workflow's queue");
        app.ack(json!({"job_id": jobs[0]["id"]})).await;
    }
    let callback = eventually(Duration::from_secs(5), "the callback", || async {
        app.fetch(&["rust-wf"], "w").await.into_iter().next()
    })
    .await;
    assert_eq!(callback["type"], "t.done");
}

/// The `ojs` command line's `workers`, `workers --detail`, `rate-limits` and `system config`:
/// flat fields where it reads them, beside the shapes the admin UI and the specs give.
#[tokio::test]
async fn the_command_lines_workers_rate_limits_and_config_read_flat() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let r = app
        .post(
            "/ojs/v1/workers/heartbeat",
            json!({"worker_id": "w-cli", "active_jobs": [], "hostname": "box", "pid": 42}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = app.get("/ojs/v1/admin/workers").await;
    let listed = &r.body["items"][0];
    assert_eq!(
        (listed["directive"].as_str(), listed["pid"].as_u64()),
        (Some("running"), Some(42))
    );
    assert_eq!(listed["last_heartbeat"], listed["last_heartbeat_at"]);
    let r = app.get("/ojs/v1/admin/workers/w-cli").await;
    assert_eq!(r.status, 200, "{}", r.body);
    for field in [
        "id",
        "state",
        "directive",
        "last_heartbeat",
        "hostname",
        "pid",
    ] {
        assert_eq!(r.body[field], listed[field], "{field}");
    }
    assert_eq!(r.body["worker"]["worker_id"], "w-cli");

    for i in 0..2 {
        app.enqueue(
            json!({"type": "t.rl", "args": [i], "options": {"queue": "cli-rl",
            "rate_limit": {"concurrency": 2}}}),
        )
        .await;
    }
    assert_eq!(app.fetch(&["cli-rl"], "w").await.len(), 1);
    let r = app.get("/ojs/v1/rate-limits").await;
    let flat = &r.body["rate_limits"][0];
    assert_eq!(
        (
            flat["key"].as_str(),
            flat["concurrency"].as_u64(),
            flat["active"].as_u64(),
            flat["available"].as_u64()
        ),
        (Some("cli-rl"), Some(2), Some(1), Some(1)),
        "{}",
        r.body
    );
    assert_eq!(r.body["items"][0]["concurrency"]["limit"], 2);
    let r = app.get("/ojs/v1/rate-limits/cli-rl").await;
    assert_eq!(
        (r.body["active"].as_u64(), r.body["available"].as_u64()),
        (Some(1), Some(1))
    );

    let r = app.get("/ojs/v1/admin/config").await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body, app.get("/ojs/v1/admin/system/config").await.body);
}

/// The command line's `result` (also the admin UI's "Fetch Result") and `retries`: a job's
/// outcome at the top level, waited for on request, and its failed attempts as strings.
#[tokio::test]
async fn the_command_lines_result_and_retries_read_a_jobs_outcome() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let id = app
        .enqueue(
            json!({"type": "cli.result", "args": [], "options": {"queue": "cli-res",
            "retry": {"max_attempts": 3, "initial_interval": "PT0.1S", "jitter": false}}}),
        )
        .await;
    let r = app.get(&format!("/ojs/v1/jobs/{id}/result")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        (r.body["state"].clone(), r.body["result"].clone()),
        (json!("available"), Value::Null)
    );
    app.fetch(&["cli-res"], "w").await;
    let r = app
        .fail(json!({"job_id": id, "error": {"code": "boom", "message": "first try failed"}}))
        .await;
    assert_eq!(r.body["state"], "retryable", "{}", r.body);
    let r = app.get(&format!("/ojs/v1/jobs/{id}/retries")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["job_id"], id.as_str());
    assert_eq!(r.body["retries"][0]["attempt"], 1);
    assert_eq!(r.body["retries"][0]["error"], "first try failed");
    assert!(
        r.body["retries"][0]["next_retry_at"].is_string(),
        "{}",
        r.body
    );
    assert_eq!(r.body["policy"]["max_attempts"], 3);
    assert!(
        r.body["policy"]["backoff_strategy"].is_string(),
        "{}",
        r.body
    );

    // A waiting `result` answers when the job completes, not before.
    let waiting = {
        let request = app.http.get(format!(
            "{}/ojs/v1/jobs/{id}/result?wait=true&timeout=20",
            app.base
        ));
        tokio::spawn(async move {
            let started = Instant::now();
            let r = request.send().await.unwrap();
            let status = r.status().as_u16();
            let body: Value = r.json().await.unwrap();
            ((status, body), started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    let jobs = app.fetch(&["cli-res"], "w").await;
    assert_eq!(jobs[0]["id"], id.as_str());
    let r = app.ack(json!({"job_id": id, "result": {"sent": 3}})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let ((status, body), took) = waiting.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "completed");
    assert_eq!(body["result"], json!({"sent": 3}));
    assert!(body["completed_at"].is_string());
    assert!(
        took >= Duration::from_millis(700) && took < Duration::from_secs(10),
        "{took:?}"
    );

    // A timeout that runs out answers the state it reached; bad parameters are refused.
    let other = app
        .enqueue(json!({"type": "cli.result", "args": [], "options": {"queue": "cli-res2"}}))
        .await;
    let r = app
        .get(&format!("/ojs/v1/jobs/{other}/result?wait=true&timeout=1"))
        .await;
    assert_eq!(r.body["state"], "available", "{}", r.body);
    for bad in ["wait=soon", "timeout=61", "timeout=x"] {
        app.get(&format!("/ojs/v1/jobs/{other}/result?{bad}"))
            .await
            .assert_error(400, "invalid_request");
    }
    app.get("/ojs/v1/jobs/019a0000-0000-7000-8000-000000000000/result")
        .await
        .assert_error(404, "not_found");
    app.stop().await;
}

/// The command line's bulk by filter (data plane, no confirmation), queue and dead-letter
/// purges, and `metrics`; the admin UI's dead-letter "Bulk Retry All" and statistics.
#[tokio::test]
async fn the_command_lines_bulk_filters_purges_and_metrics() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let waiting = [
        app.enqueue(json!({"type": "cli.b", "args": [], "options": {"queue": "cli-bulk"}}))
            .await,
        app.enqueue(json!({"type": "cli.b", "args": [], "options": {"queue": "cli-bulk"}}))
            .await,
    ];
    // A filter without a state takes the states the operation applies to.
    let r = app
        .post(
            "/ojs/v1/jobs/bulk/cancel",
            json!({"filter": {"queue": "cli-bulk"}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        (r.body["cancelled"].as_u64(), r.body["failed"].as_u64()),
        (Some(2), Some(0))
    );
    for id in &waiting {
        assert_eq!(app.job(id).await["state"], "cancelled");
    }
    // None that old: nothing selected.
    let r = app
        .post(
            "/ojs/v1/jobs/bulk/delete",
            json!({"filter": {"state": "cancelled", "queue": "cli-bulk", "older_than": "7d"}}),
        )
        .await;
    assert_eq!(
        (r.status.as_u16(), r.body["deleted"].as_u64()),
        (200, Some(0)),
        "{}",
        r.body
    );
    app.post(
        "/ojs/v1/jobs/bulk/cancel",
        json!({"filter": {"priority": 1}}),
    )
    .await
    .assert_error(422, "unsupported");
    // When no job went through, the reason is under `error` too.
    let r = app
        .post(
            "/ojs/v1/jobs/bulk/cancel",
            json!({"job_ids": ["019a0000-0000-7000-8000-000000000000"]}),
        )
        .await;
    assert_eq!(r.status, 422, "{}", r.body);
    assert_eq!(r.body["error"]["code"], "not_found", "{}", r.body);
    // `queues --purge`: the cancelled jobs, once the leader has indexed them.
    eventually(Duration::from_secs(5), "the queue purged", || async {
        let r = app
            .post(
                "/ojs/v1/queues/cli-bulk/purge",
                json!({"states": ["cancelled"]}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
        (r.body["deleted"] == 2).then_some(())
    })
    .await;
    app.get(&format!("/ojs/v1/jobs/{}", waiting[1]))
        .await
        .assert_error(404, "not_found");

    // Dead letters: retried all at once by the admin UI, purged by the command line.
    for _ in 0..3 {
        common::dead_letter_a_job(&app, "cli-dead").await;
    }
    let r = app.get("/ojs/v1/admin/dead-letter/stats").await;
    assert_eq!(r.body["total"], 3, "{}", r.body);
    app.post("/ojs/v1/admin/dead-letter/retry", json!({"filter": {}}))
        .await
        .assert_error(400, "invalid_request");
    let r = app
        .post(
            "/ojs/v1/admin/dead-letter/retry",
            json!({"filter": {}, "confirm": true}),
        )
        .await;
    assert_eq!(
        (r.status.as_u16(), r.body["succeeded"].as_u64()),
        (200, Some(3)),
        "{}",
        r.body
    );
    for _ in 0..3 {
        let jobs = app.fetch(&["cli-dead"], "w").await;
        let id = jobs[0]["id"].as_str().unwrap();
        app.nack(json!({"job_id": id, "error": {"code": "e", "message": "again"}}))
            .await;
    }
    let r = app
        .post("/ojs/v1/dead-letter/purge?older_than=7d", json!({}))
        .await;
    assert_eq!(
        (r.status.as_u16(), r.body["deleted"].as_u64()),
        (200, Some(0)),
        "{}",
        r.body
    );
    app.post("/ojs/v1/dead-letter/purge?older_than=soon", json!({}))
        .await
        .assert_error(400, "invalid_request");
    let r = app.post("/ojs/v1/dead-letter/purge", json!({})).await;
    assert_eq!(r.body["deleted"], 3, "{}", r.body);
    assert_eq!(app.get("/ojs/v1/dead-letter/stats").await.body["total"], 0);

    // `metrics`: JSON with integer totals; Prometheus text on request.
    eventually(Duration::from_secs(5), "jobs counted", || async {
        let r = app.get("/ojs/v1/metrics").await;
        assert_eq!(r.status, 200, "{}", r.body);
        (r.body["jobs_enqueued_total"].as_u64() == Some(5)).then_some(r.body)
    })
    .await;
    let r = app.get("/ojs/v1/metrics").await;
    assert!(r.body["jobs_failed_total"].is_u64(), "{}", r.body);
    assert!(r.body["uptime_seconds"].is_f64(), "{}", r.body);
    let text = app
        .http
        .get(format!("{}/ojs/v1/metrics?format=prometheus", app.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("# TYPE"), "{text}");
    app.stop().await;
}

/// The command line's `cron --update` and `cron --history`, and the admin UI's cron pages
/// (`/crons`, each entry with `id`, `schedule` and `queue`, enabled switched by PATCH).
#[tokio::test]
async fn cron_entries_change_in_place_and_show_their_last_runs() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let r = app
        .post(
            "/ojs/v1/cron",
            json!({"name": "ui-tick", "expression": "@every 1s", "overlap_policy": "allow",
                "job_template": {"type": "ui.tick", "args": [], "options": {"queue": "ui-cron"}}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let history = eventually(Duration::from_secs(8), "three runs", || async {
        let r = app.get("/ojs/v1/cron/ui-tick/history?limit=2").await;
        assert_eq!(r.status, 200, "{}", r.body);
        let runs = app.get("/ojs/v1/cron/ui-tick").await.body["run_count"].as_u64();
        (runs >= Some(3)).then_some(r.body)
    })
    .await;
    let executions = history["executions"].as_array().unwrap();
    assert_eq!(executions.len(), 2, "{history}");
    let newest = executions[0]["job_id"].as_str().unwrap();
    assert_eq!(app.job(newest).await["type"], "ui.tick");
    assert!(executions[0]["scheduled_at"].is_string(), "{history}");
    assert!(executions[0]["state"].is_string(), "{history}");

    // `cron --update`: a new schedule and type; the runs are kept.
    let r = app
        .patch(
            "/ojs/v1/cron/ui-tick",
            json!({"expression": "0 0 1 1 *", "job_template": {"type": "ui.yearly", "options": {"queue": "ui-cron"}}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["expression"], "0 0 1 1 *");
    assert_eq!(r.body["job_template"]["type"], "ui.yearly");
    assert!(r.body["run_count"].as_u64().unwrap() >= 3);
    app.patch("/ojs/v1/cron/ui-tick", json!({"run_count": 0}))
        .await
        .assert_error(400, "invalid_request");
    app.patch("/ojs/v1/cron/no-such", json!({"enabled": false}))
        .await
        .assert_error(404, "not_found");

    // The admin UI's page: items with id, schedule and queue; its switch and delete.
    let r = app.get("/ojs/v1/crons?page=1&per_page=25").await;
    assert_eq!(r.status, 200, "{}", r.body);
    let item = &r.body["items"][0];
    assert_eq!(
        (
            &item["id"],
            &item["schedule"],
            &item["queue"],
            &item["enabled"]
        ),
        (
            &json!("ui-tick"),
            &json!("0 0 1 1 *"),
            &json!("ui-cron"),
            &json!(true)
        )
    );
    assert_eq!(r.body["pagination"]["page"], 1);
    let r = app
        .patch("/ojs/v1/crons/ui-tick", json!({"enabled": false}))
        .await;
    assert_eq!(
        (r.status.as_u16(), &r.body["enabled"]),
        (200, &json!(false)),
        "{}",
        r.body
    );
    assert_eq!(
        app.get("/ojs/v1/crons/ui-tick").await.body["enabled"],
        false
    );
    let r = app.delete("/ojs/v1/crons/ui-tick").await;
    assert_eq!(r.status, 200, "{}", r.body);
    app.get("/ojs/v1/cron/ui-tick")
        .await
        .assert_error(404, "not_found");
    app.stop().await;
}

/// The command line's `queues --create NAME [--concurrency N] [--max-size N]`: the queue is
/// listed before any job is pushed to it, with its limit and bound.
#[tokio::test]
async fn the_command_lines_queue_create_registers_a_queue_with_its_settings() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let r = app
        .post(
            "/ojs/v1/queues",
            json!({"name": "cli-new", "concurrency": 2, "max_size": 100}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let listed = app.get("/ojs/v1/queues").await;
    let names: Vec<&str> = listed.body["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"cli-new"), "{}", listed.body);
    let limits = app.get("/ojs/v1/rate-limits/cli-new").await;
    assert_eq!(limits.body["concurrency"]["limit"], 2, "{}", limits.body);
    let r = app
        .post("/ojs/v1/queues", json!({"name": "cli-plain"}))
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let r = app
        .post("/ojs/v1/queues", json!({"name": "cli-plain"}))
        .await;
    assert_eq!(
        r.status, 200,
        "an existing queue is left as it is: {}",
        r.body
    );
    for (bad, field) in [
        (json!({}), "name"),
        (json!({"name": "Bad Name"}), "queue"),
        (json!({"name": "cli-x", "colour": "red"}), "colour"),
    ] {
        let r = app.post("/ojs/v1/queues", bad.clone()).await;
        r.assert_error(400, "invalid_request");
        assert_eq!(
            r.body["error"]["details"]["field"], field,
            "{bad}: {}",
            r.body
        );
    }
    app.stop().await;
}

/// The admin UI's reads and actions that have shapes of their own: a job's detail always
/// with `errors` and `metadata` (it reads both), the events page by number newest first
/// (`items`, `pagination`, `timestamp`), the health's queue total, the priority change at
/// its admin path, the priority distribution, and a rate-only limit's `active`.
#[tokio::test]
async fn the_admin_uis_pages_and_actions_read_their_shapes() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let fresh = app
        .enqueue(json!({"type": "t.ui", "args": [1], "options": {"queue": "ui", "priority": 3}}))
        .await;
    let r = app.get(&format!("/ojs/v1/admin/jobs/{fresh}")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["errors"], json!([]), "{}", r.body);
    assert_eq!(r.body["metadata"]["created_at"], r.body["created_at"]);
    assert!(r.body["metadata"]["completed_at"].is_null(), "{}", r.body);

    let failing = app
        .enqueue(
            json!({"type": "t.ui", "args": [2], "options": {"queue": "ui-fail",
            "retry": {"max_attempts": 2}}}),
        )
        .await;
    let jobs = app.fetch(&["ui-fail"], "w").await;
    let r = app
        .fail(json!({"job_id": jobs[0]["id"], "error": {"type": "Boom", "message": "no"}}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = app.get(&format!("/ojs/v1/admin/jobs/{failing}")).await;
    assert_eq!(r.body["errors"][0]["message"], "no", "{}", r.body);

    // The priority change at the admin path, then the distribution by priority.
    let r = app
        .patch(
            &format!("/ojs/v1/admin/jobs/{fresh}"),
            json!({"priority": 7}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(app.job(&fresh).await["priority"], 7);
    for priority in [3, 7, 3] {
        app.enqueue(json!({"type": "t.ui", "args": [3], "options": {"queue": "ui-prio", "priority": priority}}))
            .await;
    }
    let r = app.get("/ojs/v1/queues/ui-prio/priority-stats").await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.body["counts_by_priority"],
        json!({"7": 1, "3": 2}),
        "{}",
        r.body
    );
    assert_eq!(r.body["total"], 3);
    let distribution = r.body["distribution"].as_array().unwrap();
    assert!(
        distribution.contains(&json!({"priority": 7, "count": 1})),
        "{}",
        r.body
    );
    app.get("/ojs/v1/queues/never-seen/priority-stats")
        .await
        .assert_error(404, "not_found");

    let r = app.get("/ojs/v1/health").await;
    assert_eq!(r.body["queues"]["total"], 3, "{}", r.body);

    // Events by page: the newest first, the same as the cursor's listing read backwards.
    let all = eventually(Duration::from_secs(5), "the events published", || async {
        let r = app.get("/ojs/v1/events?limit=1000").await;
        let events = r.body["events"].as_array().cloned().unwrap_or_default();
        (events.len() >= 5).then_some(events)
    })
    .await;
    let r = app.get("/ojs/v1/events?page=1&per_page=2").await;
    assert_eq!(r.status, 200, "{}", r.body);
    let items = r.body["items"].as_array().unwrap();
    let newest: Vec<&Value> = all.iter().rev().take(2).collect();
    assert_eq!(
        items.iter().map(|e| &e["id"]).collect::<Vec<_>>(),
        newest.iter().map(|e| &e["id"]).collect::<Vec<_>>()
    );
    assert_eq!(items[0]["timestamp"], items[0]["time"]);
    assert!(r.body["pagination"]["total"].as_u64().unwrap() >= all.len() as u64);
    assert_eq!(r.body["pagination"]["page"], 1);
    let r = app.get("/ojs/v1/events?page=2&per_page=2").await;
    assert_eq!(
        r.body["items"][0]["id"],
        all[all.len() - 3]["id"],
        "{}",
        r.body
    );
    let r = app
        .get("/ojs/v1/events?page=1&per_page=50&type=job.enqueued")
        .await;
    let enqueued = all.iter().filter(|e| e["type"] == "job.enqueued").count();
    assert_eq!(
        r.body["items"].as_array().unwrap().len(),
        enqueued,
        "{}",
        r.body
    );
    assert_eq!(r.body["pagination"]["total"], enqueued);
    app.get("/ojs/v1/events?page=500&per_page=50")
        .await
        .assert_error(400, "invalid_request");

    // The schemas page lists the registry under the admin path.
    let r = app
        .post(
            "/ojs/v1/schemas",
            json!({"uri": "urn:ojs:schema:t.ui:v1", "type": "t.ui", "version": 1,
                "schema": {"type": "array"}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let r = app.get("/ojs/v1/admin/schemas").await;
    assert_eq!(r.body["schemas"][0]["type"], "t.ui", "{}", r.body);
    assert_eq!(
        r.body["schemas"][0]["uri"], "urn:ojs:schema:t.ui:v1",
        "{}",
        r.body
    );

    // A rate-only limit still shows the jobs running.
    let limited = app
        .enqueue(
            json!({"type": "t.ui", "args": [4], "options": {"queue": "ui-rate",
            "rate_limit": {"max_per_second": 10}}}),
        )
        .await;
    assert_eq!(app.fetch(&["ui-rate"], "w").await[0]["id"], limited);
    eventually(
        Duration::from_secs(5),
        "the running job counted",
        || async {
            let r = app.get("/ojs/v1/rate-limits/ui-rate").await;
            (r.body["active"] == 1).then_some(())
        },
    )
    .await;
}
