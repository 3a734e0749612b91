//! Job progress (progress spec §5–§8): `PUT`/`GET /ojs/v1/jobs/{id}/progress`, the client
//! libraries' `POST /ojs/v1/workers/progress`, the throttle, progress as a heartbeat, the
//! `job.progress` event and `JobContext::progress` in the Rust worker.

use crate::common;

use std::time::Duration;

use common::{eventually, spawn_app, NatsServer, TestApp};
use ojs_client::worker::{JobContext, Worker, WorkerConfig};
use serde_json::{json, Value};

/// Enqueues a job on `queue` and fetches it as `w1`; its id.
async fn running(app: &TestApp, queue: &str, options: Value) -> String {
    let mut options = options;
    options["queue"] = json!(queue);
    let id = app
        .enqueue(json!({"type": "t.long", "args": [], "options": options}))
        .await;
    let jobs = app.fetch(&[queue], "w1").await;
    assert_eq!(jobs[0]["id"], id.as_str());
    id
}

/// The `job.progress` events of job `id` stored so far.
async fn progress_events(app: &TestApp, queue: &str, id: &str) -> Vec<Value> {
    let r = app
        .get(&format!(
            "/ojs/v1/events?queues={queue}&types=job.progress&limit=1000"
        ))
        .await;
    r.body["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["data"]["job_id"] == id)
        .cloned()
        .collect()
}

const SECOND: Duration = Duration::from_millis(1050);

#[tokio::test]
async fn progress_is_clamped_never_decreases_shows_in_the_job_and_ends_at_one() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let id = running(&app, "p1", json!({})).await;
    let path = format!("/ojs/v1/jobs/{id}/progress");

    let r = app.get(&path).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.body["progress"],
        Value::Null,
        "nothing reported: null, not 404"
    );
    assert_eq!(r.body["data"], Value::Null);
    assert_eq!(r.body["state"], "active");

    let r = app
        .put(
            &path,
            json!({"progress": 0.4, "data": {"rows": 4}, "message": "reading"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        (r.body["progress"].as_f64(), r.body["throttled"].as_bool()),
        (Some(0.4), Some(false))
    );
    let job = app.job(&id).await;
    assert_eq!(job["progress"], 0.4);
    assert_eq!(job["progress_data"], json!({"rows": 4}));
    assert_eq!(job["progress_message"], "reading");

    tokio::time::sleep(SECOND).await;
    let r = app.put(&path, json!({"progress": 0.2})).await;
    assert_eq!(r.body["progress"], 0.4, "a lower value is ignored");
    assert_eq!(r.body["message"], "reading", "what it does not say is kept");
    tokio::time::sleep(SECOND).await;
    let r = app.put(&path, json!({"progress": 1.7})).await;
    assert_eq!(r.body["progress"], 1.0, "clamped");
    let r = app.get(&path).await;
    assert_eq!(r.header("x-ojs-progress"), "1");
    assert_eq!(r.header("cache-control"), "no-cache");
    assert!(r.body["updated_at"].is_string());

    // Bad reports are refused in the OJS error format; unknown jobs are 404.
    app.put(&path, json!({}))
        .await
        .assert_error(400, "invalid_request");
    app.put(&path, json!({"progress": "half"}))
        .await
        .assert_error(400, "invalid_request");
    app.put(&path, json!({"data": {"s": "x".repeat(20_000)}}))
        .await
        .assert_error(413, "envelope_too_large");
    let unknown = "019539a4-b68c-7def-8000-1a2b3c4d5e6f";
    app.put(
        &format!("/ojs/v1/jobs/{unknown}/progress"),
        json!({"progress": 0.1}),
    )
    .await
    .assert_error(404, "not_found");
    app.get("/ojs/v1/jobs/nope/progress")
        .await
        .assert_error(404, "not_found");

    // ACK: progress 1 (spec §8.1); a report after the end is ignored, not refused.
    let r = app.ack(json!({"job_id": id})).await;
    assert_eq!(r.body["state"], "completed");
    let r = app.get(&path).await;
    assert_eq!(
        (r.body["progress"].as_f64(), r.body["state"].as_str()),
        (Some(1.0), Some("completed"))
    );
    tokio::time::sleep(SECOND).await;
    let r = app.put(&path, json!({"progress": 0.5})).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["ignored"], true);
    assert_eq!(r.body["state"], "completed");
}

#[tokio::test]
async fn reports_within_a_second_gather_into_one_write_that_keeps_the_latest() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let id = running(&app, "p2", json!({})).await;
    // The client libraries' shape: a percentage.
    let mut throttled = Vec::new();
    for pct in 1..=20 {
        let r = app
            .post(
                "/ojs/v1/workers/progress",
                json!({"job_id": id, "percentage": pct, "message": format!("step {pct}")}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
        throttled.push(r.body["throttled"].as_bool().unwrap());
    }
    assert!(
        !throttled[0] && throttled[1..].iter().all(|t| *t),
        "{throttled:?}"
    );
    let events = eventually(Duration::from_secs(5), "two progress events", || async {
        let e = progress_events(&app, "p2", &id).await;
        (e.len() >= 2).then_some(e)
    })
    .await;
    let r = app.get(&format!("/ojs/v1/jobs/{id}/progress")).await;
    assert_eq!(r.body["progress"], 0.2, "the latest value was stored");
    assert_eq!(r.body["message"], "step 20");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        progress_events(&app, "p2", &id).await.len(),
        2,
        "20 reports in well under a second: two writes, two events"
    );
    let last = &events[1]["data"];
    assert_eq!(last["progress_percent"], 20.0);
    assert_eq!(last["progress_message"], "step 20");
    assert_eq!(last["worker_id"], "w1");
    assert_eq!(last["attempt"], 1);
    assert_eq!(last["job_type"], "t.long");
}

#[tokio::test]
async fn a_progress_report_extends_the_reservation_and_a_retry_starts_without_progress() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let id = app
        .enqueue(
            json!({"type": "t.long", "args": [], "options": {"queue": "p3",
            "retry": {"max_attempts": 2, "initial_interval": "PT1S"}}}),
        )
        .await;
    let r = app
        .post(
            "/ojs/v1/workers/fetch",
            json!({"queues": ["p3"], "worker_id": "w1", "visibility_timeout_ms": 2000}),
        )
        .await;
    assert_eq!(r.body["jobs"][0]["id"], id.as_str());
    // Reports every 400 ms for almost five seconds and no heartbeat: the 2 s reservation
    // would have lapsed twice over. (Written at most once a second, each report leaves a
    // second of margin before the reservation it extends runs out.)
    let path = format!("/ojs/v1/jobs/{id}/progress");
    for step in 1..=12 {
        let r = app
            .put(&path, json!({"progress": f64::from(step) / 20.0}))
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let job = app.job(&id).await;
    assert_eq!(
        (job["state"].as_str(), job["attempt"].as_u64()),
        (Some("active"), Some(1))
    );

    // Failed once the gathered report is written: the last progress stays (spec §8.2);
    // the next attempt starts without it.
    tokio::time::sleep(SECOND).await;
    let r = app
        .fail(json!({"job_id": id, "error": {"code": "x", "message": "again"}}))
        .await;
    assert_eq!(r.body["state"], "retryable");
    assert_eq!(app.job(&id).await["progress"], 0.6);
    let again = eventually(Duration::from_secs(10), "the retry", || async {
        let jobs = app.fetch(&["p3"], "w2").await;
        jobs.into_iter().next()
    })
    .await;
    assert_eq!(again["attempt"], 2);
    assert!(again.get("progress").is_none(), "{again}");
    assert_eq!(app.get(&path).await.body["progress"], Value::Null);
}

#[tokio::test]
async fn a_rust_worker_reports_progress_from_its_handler() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let id = app
        .enqueue(json!({"type": "t.report", "args": [], "options": {"queue": "p4"}}))
        .await;
    let mut worker = Worker::new(WorkerConfig::new(&app.base, &["p4"]));
    worker.register("t.report", |ctx: JobContext| async move {
        ctx.progress(0.5, Some("half way"))
            .await
            .map_err(|e| ojs_client::worker::HandlerError::new("Progress", e.to_string()))?;
        Ok(Value::Null)
    });
    let control = worker.control();
    let run = tokio::spawn(worker.run_until_terminated());
    eventually(Duration::from_secs(5), "the job", || async {
        (app.job(&id).await["state"] == "completed").then_some(())
    })
    .await;
    control.terminate();
    run.await.unwrap();
    let events = eventually(Duration::from_secs(5), "its progress event", || async {
        let e = progress_events(&app, "p4", &id).await;
        (!e.is_empty()).then_some(e)
    })
    .await;
    assert_eq!(events[0]["data"]["progress_percent"], 50.0);
    assert_eq!(events[0]["data"]["progress_message"], "half way");
    assert_eq!(app.job(&id).await["progress"], 1.0);
}
