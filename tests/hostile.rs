//! Hostile input: each scenario of a client trying to stop the cluster or poison its data,
//! through the HTTP API against a real nats-server. Every answer is a 4xx in the OJS error
//! format, never a 5xx or a dropped connection, and the leader keeps working afterwards.

use crate::common;

use std::time::{Duration, Instant};

use common::{eventually, job_on, spawn_app, spawn_app_with, test_config, NatsServer, TestApp};
use ojs_jetstream::config::Config;
use serde_json::{json, Value};

/// A job scheduled `ms` ahead on `queue`; its id.
async fn schedule(app: &TestApp, queue: &str, ms: u64) -> String {
    app.enqueue(
        json!({"type": "t.later", "args": [], "options": {"queue": queue,
        "scheduled_at": format!("+PT{}S", ms as f64 / 1000.0)}}),
    )
    .await
}

/// Waits until the job is `available`; how long that took.
async fn until_available(app: &TestApp, id: &str, within: Duration) -> Duration {
    let started = Instant::now();
    eventually(within, "the scheduled job to become available", || async {
        (app.job(id).await["state"] == "available").then_some(())
    })
    .await;
    started.elapsed()
}

#[tokio::test]
async fn durations_that_would_overflow_time_are_refused_and_the_leader_keeps_firing() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let max_ms = 31_536_000_000u64;
    for options in [
        json!({"timeout_ms": 18_446_744_073_709_551_615u64}),
        json!({"timeout_ms": max_ms + 1}),
        json!({"timeout": 18_446_744_073_709_551u64}),
        json!({"visibility_timeout_ms": u64::MAX}),
        json!({"visibility_timeout": "P20000000D"}),
        json!({"scheduled_at": "+P100000000D"}),
        json!({"expires_at": "+P100000000D"}),
    ] {
        let r = app
            .post(
                "/ojs/v1/jobs",
                json!({"type": "a", "args": [], "queue": "poison", "options": options}),
            )
            .await;
        r.assert_error(400, "invalid_request");
        assert!(
            r.body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("P365D"),
            "{}",
            r.body
        );
    }
    for retry in [
        json!({"initial_interval": "P20000000D"}),
        json!({"max_interval_ms": u64::MAX}),
    ] {
        app.post(
            "/ojs/v1/jobs",
            json!({"type": "a", "args": [], "options": {"retry": retry}}),
        )
        .await
        .assert_error(422, "invalid_request");
    }
    let r = app
        .post(
            "/ojs/v1/cron",
            json!({"name": "forever", "expression": "@every 87600000h",
            "job_template": {"type": "a"}}),
        )
        .await;
    r.assert_error(400, "invalid_request");
    for path in ["/ojs/v1/workers/fetch", "/ojs/v1/workers/heartbeat"] {
        app.post(
            path,
            json!({"queues": ["poison"], "worker_id": "w", "visibility_timeout_ms": u64::MAX}),
        )
        .await
        .assert_error(400, "invalid_request");
    }

    // The longest accepted durations run through claim and deadline arithmetic.
    let id = app
        .enqueue(
            json!({"type": "a", "args": [], "queue": "poison", "options": {"timeout_ms": max_ms}}),
        )
        .await;
    let r = app
        .post(
            "/ojs/v1/workers/fetch",
            json!({"queues": ["poison"], "worker_id": "w", "visibility_timeout_ms": max_ms}),
        )
        .await;
    assert_eq!(
        common::job_ids(&r.body["jobs"]),
        [id.as_str()],
        "{}",
        r.body
    );

    // The leader still fires timers on time.
    let later = schedule(&app, "poison", 1000).await;
    let took = until_available(&app, &later, Duration::from_secs(5)).await;
    assert!(took < Duration::from_millis(1400), "{took:?}");
    assert_eq!(app.job(&id).await["state"], "active");
}

#[tokio::test]
async fn nesting_past_the_limit_is_refused_and_the_deepest_accepted_job_reads_back() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let nested = |depth: usize| {
        let mut v = json!(1);
        for _ in 0..depth {
            v = json!([v]);
        }
        v
    };
    // 125 deep passed the JSON reader, and its record (one level deeper) could not be read.
    let r = app
        .post(
            "/ojs/v1/jobs",
            json!({"type": "a", "args": [nested(125)], "queue": "deep"}),
        )
        .await;
    r.assert_error(400, "invalid_payload");
    // The deepest body accepted: 64 levels, the body object being the first.
    let id = app
        .enqueue(json!({"type": "a", "args": nested(62), "queue": "deep"}))
        .await;
    app.fetch(&["deep"], "w").await;
    let r = app.ack(json!({"job_id": id, "result": nested(62)})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let job = app.job(&id).await;
    assert_eq!(job["state"], "completed");
    assert_eq!(job["result"], nested(62));
}

#[tokio::test]
async fn results_and_errors_cannot_grow_a_record_past_what_nats_stores() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let id = app
        .enqueue(json!({"type": "a", "args": [], "queue": "big", "options": {"retry": {"max_attempts": 60}}}))
        .await;
    // Forty failures with 15 KB backtraces: every one is recorded, the record stays readable.
    for attempt in 1..=40 {
        let jobs = app.fetch(&["big"], "w").await;
        assert_eq!(jobs.len(), 1, "attempt {attempt}");
        let r = app
            .fail(json!({"job_id": id, "requeue": true,
                "error": {"code": "boom", "message": format!("attempt {attempt}"), "backtrace": "x".repeat(15_000)}}))
            .await;
        assert_eq!(r.status, 200, "attempt {attempt}: {}", r.body);
    }
    let job = app.job(&id).await;
    assert_eq!(job["attempt"], 40);
    assert_eq!(job["error"]["message"], "attempt 40");
    let kept = job["errors"].as_array().unwrap();
    assert!(
        !kept.is_empty() && kept.len() < 40,
        "history trimmed by bytes: {}",
        kept.len()
    );
    assert_eq!(kept.last().unwrap()["message"], "attempt 40");

    // An error over 16 KiB, and a result that would not fit in the record: 413, and the job
    // is still the worker's to finish.
    app.fetch(&["big"], "w").await;
    let r = app
        .fail(json!({"job_id": id,
            "error": {"code": "boom", "message": "m", "backtrace": "x".repeat(25_000)}}))
        .await;
    r.assert_error(413, "envelope_too_large");
    assert_eq!(r.body["error"]["details"]["field"], "error");
    let r = app
        .ack(json!({"job_id": id, "result": "r".repeat(1_100_000)}))
        .await;
    r.assert_error(413, "envelope_too_large");
    assert_eq!(app.job(&id).await["state"], "active");
    // Progress at its limits (16 KiB of data, 1 KiB of message) fits beside a full history.
    let r = app
        .put(
            &format!("/ojs/v1/jobs/{id}/progress"),
            json!({"progress": 0.5, "data": {"d": "d".repeat(16_000)}, "message": "m".repeat(1024)}),
        )
        .await;
    assert_eq!(
        (r.status.as_u16(), &r.body["ignored"]),
        (200, &json!(false)),
        "{}",
        r.body
    );
    let r = app.ack(json!({"job_id": id, "result": {"ok": true}})).await;
    assert_eq!(r.status, 200, "{}", r.body);

    // meta is bounded at 64 KiB (payload limits PL-002).
    let r = app
        .post(
            "/ojs/v1/jobs",
            json!({"type": "a", "args": [], "meta": {"m": "x".repeat(70_000)}}),
        )
        .await;
    r.assert_error(413, "envelope_too_large");
    assert_eq!(r.body["error"]["details"]["field"], "meta");
}

/// Streams in the NATS account.
async fn stream_count(nats_url: &str) -> usize {
    use futures::StreamExt;
    let js = async_nats::jetstream::new(async_nats::connect(nats_url).await.unwrap());
    js.stream_names().count().await
}

#[tokio::test]
async fn queues_and_priorities_are_capped_before_anything_is_created() {
    let nats = NatsServer::start();
    let app = spawn_app_with(Config {
        max_queues: 5,
        max_priorities_per_queue: 3,
        ..test_config(&nats.url)
    })
    .await;
    app.enqueue(job_on("q0")).await;
    let before = stream_count(&nats.url).await;
    let jobs: Vec<Value> = (0..10_000).map(|i| job_on(&format!("q{i}"))).collect();
    let r = app
        .post("/ojs/v1/jobs/batch", json!({ "jobs": jobs }))
        .await;
    r.assert_error(400, "invalid_request");
    assert_eq!(r.body["error"]["details"]["max_queues"], 5);
    assert_eq!(
        stream_count(&nats.url).await,
        before,
        "no stream was created"
    );
    for i in 1..5 {
        app.enqueue(job_on(&format!("q{i}"))).await;
    }
    app.post("/ojs/v1/jobs", job_on("q5"))
        .await
        .assert_error(400, "invalid_request");
    assert_eq!(stream_count(&nats.url).await, before + 4);

    for p in [1, 2] {
        app.enqueue(json!({"type": "a", "args": [], "options": {"queue": "q0", "priority": p}}))
            .await;
    }
    let r = app
        .post(
            "/ojs/v1/jobs",
            json!({"type": "a", "args": [], "options": {"queue": "q0", "priority": 3}}),
        )
        .await;
    r.assert_error(400, "invalid_request");
    assert_eq!(r.body["error"]["details"]["field"], "priority");
    // Lanes in use still take jobs.
    app.enqueue(json!({"type": "a", "args": [], "options": {"queue": "q0", "priority": 2}}))
        .await;
}

/// The gateway's `ojs_queue_pullers_open` gauge.
async fn pullers_open(app: &TestApp) -> u64 {
    let text = app.metrics().await;
    let line = text
        .lines()
        .find(|l| l.starts_with("ojs_queue_pullers_open "))
        .expect("the pullers gauge");
    line.split(' ').nth(1).unwrap().parse().unwrap()
}

#[tokio::test]
async fn idle_pull_loops_are_closed_without_losing_a_job_and_reopen_on_the_next_fetch() {
    let nats = NatsServer::start();
    let app = spawn_app_with(Config {
        idle_puller_ms: 400,
        ..test_config(&nats.url)
    })
    .await;
    // Each lane's first FETCH opens its loop; it waits, so a loaded machine cannot make the
    // first pull's answer late.
    let fetch_waiting = |queue: String| {
        let app = &app;
        async move {
            let body = json!({"queues": [queue], "worker_id": "w", "wait_ms": 5000});
            app.post("/ojs/v1/workers/fetch", body).await.body["jobs"]
                .as_array()
                .map_or(0, Vec::len)
        }
    };
    for i in 0..20 {
        let queue = format!("lane{i}");
        app.enqueue(job_on(&queue)).await;
        assert_eq!(fetch_waiting(queue).await, 1);
    }
    app.enqueue(job_on("other")).await;
    assert_eq!(fetch_waiting("other".into()).await, 1);
    assert_eq!(pullers_open(&app).await, 21);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(app.fetch(&["other"], "w").await.is_empty());
    assert_eq!(pullers_open(&app).await, 1, "idle loops were closed");

    // A FETCH long-polling on a lane whose loop is closed under it still gets its job.
    let long_poll = app.post(
        "/ojs/v1/workers/fetch",
        json!({"queues": ["lane0"], "worker_id": "w", "wait_ms": 3000}),
    );
    let meanwhile = async {
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(app.fetch(&["other"], "w").await.is_empty());
        assert_eq!(
            pullers_open(&app).await,
            1,
            "lane0's loop left the registry"
        );
        app.enqueue(job_on("lane0")).await
    };
    let (r, id) = tokio::join!(long_poll, meanwhile);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["jobs"][0]["id"], id.as_str());

    // A loop closed while a waiting pull of a finished FETCH is still open at the server
    // releases what that pull brings: the next FETCH gets it, not AckWait later.
    let started = Instant::now();
    let long_poll = app.post(
        "/ojs/v1/workers/fetch",
        json!({"queues": ["lane1", "lane2"], "worker_id": "w", "wait_ms": 5000}),
    );
    let (r, _) = tokio::join!(long_poll, async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        app.enqueue(job_on("lane2")).await
    });
    assert_eq!(r.body["jobs"].as_array().unwrap().len(), 1);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(app.fetch(&["other"], "w").await.is_empty());
    assert_eq!(
        pullers_open(&app).await,
        1,
        "lane1's loop left the registry"
    );
    let id = app.enqueue(job_on("lane1")).await;
    let got = eventually(Duration::from_secs(3), "the job on lane1", || async {
        let jobs = app.fetch(&["lane1"], "w").await;
        jobs.first().map(|j| j["id"].as_str().unwrap().to_owned())
    })
    .await;
    assert_eq!(got, id);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "lane1's waiting pull was still open"
    );
}

#[tokio::test]
async fn ids_that_would_become_subjects_are_bounded_and_the_connection_survives() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let long = "w".repeat(4096);
    let r = app
        .post("/ojs/v1/workers/heartbeat", json!({"worker_id": long}))
        .await;
    r.assert_error(400, "invalid_request");
    app.post(
        "/ojs/v1/workers/fetch",
        json!({"queues": ["q"], "worker_id": long}),
    )
    .await
    .assert_error(400, "invalid_request");
    for path in [
        format!("/ojs/v1/admin/workers/{long}"),
        format!("/ojs/v1/cron/{}", "c".repeat(4096)),
        "/ojs/v1/cron/a*b".to_owned(),
        format!("/ojs/v1/jobs/{}", "j".repeat(5000)),
        "/ojs/v1/jobs/01945C3A-0000-7000-8000-000000000000".to_owned(),
        format!("/ojs/v1/dead-letter/{}", "d".repeat(5000)),
    ] {
        app.get(&path).await.assert_error(404, "not_found");
    }
    app.post(&format!("/ojs/v1/admin/workers/{long}/quiet"), json!({}))
        .await
        .assert_error(404, "not_found");
    app.ack(json!({"job_id": "j".repeat(5000)}))
        .await
        .assert_error(404, "not_found");
    // A heartbeat naming ids that are no job ids extends nothing and fails nothing.
    let r = app
        .post(
            "/ojs/v1/workers/heartbeat",
            json!({"worker_id": "w1", "active_jobs": ["x".repeat(5000), "a.>"]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    // The gateway's NATS connection is intact: a job goes through.
    let id = app.enqueue(job_on("after")).await;
    assert_eq!(app.fetch(&["after"], "w1").await.len(), 1);
    assert_eq!(app.job(&id).await["state"], "active");
}

#[tokio::test]
async fn smaller_inputs_get_ojs_errors_instead_of_500s_or_silence() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    for path in [
        "/ojs/v1/events?after=18446744073709551615",
        "/ojs/v1/events?types=a%20b",
        "/ojs/v1/events?types=job.*",
        "/ojs/v1/dead-letter?offset=18446744073709551615",
        "/ojs/v1/jobs/%FF%FE",
        "/ojs/v1/events?limit=%FF",
    ] {
        let r = app.get(path).await;
        assert_eq!(r.status.as_u16(), 400, "{path}: {}", r.body);
        assert_eq!(
            r.header("content-type"),
            "application/openjobspec+json",
            "{path}"
        );
        assert!(r.body["error"]["code"].is_string(), "{path}: {}", r.body);
    }
    let r = app
        .get("/ojs/v1/events?types=job.unheard_of&after=9223372036854775807")
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["events"], json!([]));
    // A limit this server does not enforce is refused rather than ignored in silence.
    let r = app
        .post(
            "/ojs/v1/jobs",
            json!({"type": "a", "args": [], "options": {"rate_limit": {"key": "tenant-7", "max_per_second": 1}}}),
        )
        .await;
    r.assert_error(422, "unsupported");
    assert_eq!(r.body["error"]["details"]["field"], "rate_limit.key");
    let r = app
        .post(
            "/ojs/v1/jobs",
            json!({"type": "a", "args": [], "options": {"unique": {"period": "PT1H"}}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let plain = app.post("/ojs/v1/jobs", job_on("plain")).await;
    assert!(plain.body.get("warnings").is_none(), "{}", plain.body);
    // A made-up method token is counted as "other", not as a new series per token.
    for method in ["FOO1", "FOO2"] {
        app.http
            .request(
                reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
                app.url("/ojs/v1/health"),
            )
            .send()
            .await
            .unwrap();
    }
    let metrics = app.metrics().await;
    assert!(!metrics.contains("FOO"), "{metrics}");
    assert!(metrics.contains("method=\"other\""), "{metrics}");
}

#[tokio::test]
async fn a_leader_service_that_dies_hands_the_lead_to_another_replica() {
    let nats = NatsServer::start();
    // The first gateway leads; its scheduler panics on the first timer it receives.
    let doomed = spawn_app_with(Config {
        failpoints: "scheduler.timer_received=panic".into(),
        ..test_config(&nats.url)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let healthy = spawn_app(&nats.url).await;
    let id = schedule(&healthy, "sv", 2000).await;
    let took = until_available(&healthy, &id, Duration::from_secs(6)).await;
    assert!(
        took < Duration::from_millis(2200),
        "fired {took:?} after scheduling (due at 2 s)"
    );
    let metrics = doomed.metrics().await;
    assert!(
        metrics.contains("ojs_leader_service_failures_total{service=\"scheduler\"} 1"),
        "{metrics}"
    );
}

/// Asserts a refusal of a request whose size the client chose: the status and code, the
/// limit and the count in the details, answered within `within`.
fn assert_capped(
    r: &common::Reply,
    status: u16,
    code: &str,
    count: (&str, usize),
    max: (&str, usize),
) {
    r.assert_error(status, code);
    let details = &r.body["error"]["details"];
    assert_eq!(
        (&details[count.0], &details[max.0]),
        (&json!(count.1), &json!(max.1)),
        "{}",
        r.body
    );
}

#[tokio::test]
async fn a_heartbeat_naming_too_many_jobs_or_carrying_too_much_info_is_refused_at_once() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    // 200,000 job ids (8 MB): each would be a read and a compare-and-set.
    let ids: Vec<String> = (0..200_000)
        .map(|_| uuid::Uuid::now_v7().to_string())
        .collect();
    let started = Instant::now();
    let r = app
        .post(
            "/ojs/v1/workers/heartbeat",
            json!({"worker_id": "w", "active_jobs": ids.len(), "active_job_ids": ids}),
        )
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_capped(
        &r,
        400,
        "invalid_request",
        ("count", 200_000),
        ("max", 1_000),
    );
    assert_eq!(r.body["error"]["details"]["setting"], "max_heartbeat_jobs");
    // 4 MB of worker info would outgrow the worker's entry (one NATS message).
    let queues: Vec<String> = (0..40_000).map(|i| format!("queue-{i:093}")).collect();
    let started = Instant::now();
    let r = app
        .post(
            "/ojs/v1/workers/heartbeat",
            json!({"worker_id": "w", "active_job_ids": [], "queues": queues}),
        )
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let info_bytes = serde_json::to_vec(&json!({"queues": queues}))
        .unwrap()
        .len();
    assert_capped(
        &r,
        413,
        "envelope_too_large",
        ("actual_bytes", info_bytes),
        ("max_bytes", 64 * 1024),
    );
    // The most a beat may name: 1,000 held jobs, all extended, in a few seconds.
    let batch: Vec<Value> = (0..1_000).map(|_| job_on("held")).collect();
    let r = app
        .post("/ojs/v1/jobs/batch", json!({ "jobs": batch }))
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let r = app
        .post(
            "/ojs/v1/workers/fetch",
            json!({"queues": ["held"], "count": 1000, "worker_id": "w"}),
        )
        .await;
    let held: Vec<&str> = common::job_ids(&r.body["jobs"]);
    assert_eq!(held.len(), 1_000);
    let started = Instant::now();
    let r = app
        .post(
            "/ojs/v1/workers/heartbeat",
            json!({"worker_id": "w", "active_job_ids": held, "hostname": "h"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(r.body["jobs_extended"].as_array().unwrap().len(), 1_000);
    let worker = app.get("/ojs/v1/admin/workers/w").await;
    assert_eq!(
        worker.body["worker"]["active_job_ids"]
            .as_array()
            .unwrap()
            .len(),
        1_000
    );
}

#[tokio::test]
async fn a_fetch_tries_a_repeated_queue_once_and_may_name_only_so_many() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let distinct: Vec<String> = (0..20_000).map(|i| format!("nowhere-{i}")).collect();
    let started = Instant::now();
    let r = app
        .post(
            "/ojs/v1/workers/fetch",
            json!({"queues": distinct, "worker_id": "w"}),
        )
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_capped(&r, 400, "invalid_request", ("count", 20_000), ("max", 100));
    assert_eq!(r.body["error"]["details"]["setting"], "max_fetch_queues");
    // The same queue 20,000 times is one queue: its job, once.
    let id = app.enqueue(job_on("often")).await;
    let often = vec!["often"; 20_000];
    let r = app
        .post(
            "/ojs/v1/workers/fetch",
            json!({"queues": often, "count": 5, "worker_id": "w"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(common::job_ids(&r.body["jobs"]), [id.as_str()]);
}
