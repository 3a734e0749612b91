//! Bounded queues (backpressure spec, architecture §3.27) through HTTP on a real
//! nats-server: the bound holds across replicas, refusals carry the spec's headers and
//! event, batches are all or none, blocked PUSHes wait for room, finished jobs give their
//! place back, and places left by a PUSH that died are freed by the leader.

use crate::common;

use std::time::{Duration, Instant};

use common::{
    dead_letter_a_job, eventually, spawn_app, spawn_app_with, test_config, NatsServer, TestApp,
};
use ojs_jetstream::config::Config;
use serde_json::{json, Value};

fn on(queue: &str) -> Value {
    json!({"type": "bp.t", "args": [], "options": {"queue": queue}})
}

async fn bound(app: &TestApp, queue: &str, backpressure: Value) -> Value {
    let r = app
        .put(
            &format!("/ojs/v1/admin/queues/{queue}/config"),
            json!({ "backpressure": backpressure }),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.body
}

/// Fetches one job of `queue` and acknowledges it.
async fn finish_one(app: &TestApp, queue: &str) {
    let jobs = app.fetch(&[queue], "w-bp").await;
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    let r = app
        .ack(json!({"job_id": jobs[0]["id"], "result": null}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
}

/// A PUSH into `queue` willing to wait `block_secs` for room, under way: its answer and how
/// long it took.
fn blocked_push(
    app: &TestApp,
    queue: &str,
    block_secs: u64,
) -> tokio::task::JoinHandle<(common::Reply, Duration)> {
    let waiting = app.with_header("ojs-block-timeout", &block_secs.to_string());
    let job = on(queue);
    tokio::spawn(async move {
        let started = Instant::now();
        (waiting.post("/ojs/v1/jobs", job).await, started.elapsed())
    })
}

/// Pushes `job` until it is accepted: once the leader has given back a finished job's place.
async fn accepted_once_room(app: &TestApp, job: Value) -> String {
    eventually(Duration::from_secs(5), "a place to be given back", || {
        let job = job.clone();
        async move {
            let r = app.post("/ojs/v1/jobs", job).await;
            (r.status == 201).then(|| r.body["job"]["id"].as_str().unwrap().to_owned())
        }
    })
    .await
}

#[tokio::test]
async fn a_bounded_queue_refuses_pushes_past_its_bound_on_every_replica_until_jobs_finish() {
    let nats = NatsServer::start();
    let a = spawn_app(&nats.url).await;
    let b = spawn_app(&nats.url).await;
    // Configuring needs a queue a job was written to; that job came before the bound and
    // does not count.
    a.enqueue(on("bp")).await;
    finish_one(&a, "bp").await;
    let detail = bound(&a, "bp", json!({"max_depth": 3})).await;
    assert_eq!(
        detail["configuration"]["backpressure"],
        json!({"max_depth": 3, "strategy": "reject", "warning_threshold": 0.8, "depth": 0, "pressure": 0.0})
    );

    let first = a.post("/ojs/v1/jobs", on("bp")).await;
    assert_eq!(first.status, 201, "{}", first.body);
    assert_eq!(
        first.header("x-ojs-queue-pressure"),
        "",
        "below the threshold"
    );
    eventually(
        Duration::from_secs(5),
        "the other replica to follow the bound",
        || async {
            let r = b.get("/ojs/v1/admin/queues/bp").await;
            (r.body["configuration"]["backpressure"]["max_depth"] == 3).then_some(())
        },
    )
    .await;
    assert_eq!(b.post("/ojs/v1/jobs", on("bp")).await.status, 201);
    // A gateway's read of the depth serves its answers for 250 ms (plus its own PUSHes).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let third = a.post("/ojs/v1/jobs", on("bp")).await;
    assert_eq!(third.status, 201, "{}", third.body);
    // Past the warning threshold: the answer says how full the queue is (spec §7.3).
    assert_eq!(third.header("x-ojs-queue-depth"), "3");
    assert_eq!(third.header("x-ojs-queue-bound"), "3");
    assert_eq!(third.header("x-ojs-queue-pressure"), "1.00");

    for app in [&a, &b] {
        let r = app.post("/ojs/v1/jobs", on("bp")).await;
        r.assert_error(429, "queue_full");
        assert_eq!(r.header("retry-after"), "1");
        assert_eq!(r.header("x-ojs-queue-depth"), "3");
        assert_eq!(r.header("x-ojs-queue-bound"), "3");
        assert_eq!(r.body["error"]["retryable"], true);
        assert_eq!(r.body["error"]["details"]["strategy"], "reject");
        assert_eq!(r.body["error"]["details"]["queue"], "bp");
    }
    assert!(
        a.metrics()
            .await
            .contains("ojs_backpressure_rejected_total{queue=\"bp\"} 1"),
        "{}",
        a.metrics().await
    );
    let events = a
        .get("/ojs/v1/events?types=backpressure.rejected&queues=bp")
        .await;
    let rejected = events.body["events"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(rejected.len(), 2, "{}", events.body);
    assert_eq!(
        rejected[0]["data"],
        json!({"queue": "bp", "depth": 3, "bound": 3, "job_type": "bp.t"})
    );
    eventually(Duration::from_secs(5), "backpressure.warning", || async {
        let r = a.get("/ojs/v1/events?types=backpressure.warning").await;
        (r.body["events"].as_array().map(Vec::len) == Some(1)).then_some(())
    })
    .await;
    let stats = b.get("/ojs/v1/queues/bp/stats").await;
    assert_eq!(
        stats.body["queue"]["backpressure"]["depth"], 3,
        "{}",
        stats.body
    );

    // A finished job gives its place back; a batch needing two places when one is free is
    // refused whole and takes none.
    finish_one(&a, "bp").await;
    eventually(
        Duration::from_secs(5),
        "the finished job's place",
        || async {
            (b.get("/ojs/v1/queues/bp/stats").await.body["queue"]["backpressure"]["depth"] == 2)
                .then_some(())
        },
    )
    .await;
    let batch = b
        .post("/ojs/v1/jobs/batch", json!({"jobs": [on("bp"), on("bp")]}))
        .await;
    batch.assert_error(429, "queue_full");
    assert_eq!(
        b.get("/ojs/v1/queues/bp/stats").await.body["queue"]["backpressure"]["depth"],
        2,
        "the refused batch gave back the place it took"
    );
    assert_eq!(b.post("/ojs/v1/jobs", on("bp")).await.status, 201);
    eventually(
        Duration::from_secs(5),
        "backpressure.cleared after draining",
        || async {
            if let Some(job) = a.fetch(&["bp"], "w-bp").await.first() {
                a.ack(json!({"job_id": job["id"], "result": null})).await;
            }
            let r = a.get("/ojs/v1/events?types=backpressure.cleared").await;
            (r.body["events"].as_array().map(Vec::len) == Some(1)).then_some(())
        },
    )
    .await;

    // Unbounded again: no refusals.
    let detail = bound(&a, "bp", json!({"max_depth": 0})).await;
    assert_eq!(detail["configuration"]["backpressure"], Value::Null);
    for _ in 0..5 {
        assert_eq!(a.post("/ojs/v1/jobs", on("bp")).await.status, 201);
    }
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn a_blocked_push_waits_for_room_and_a_dead_letter_retry_needs_a_place() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let dead = dead_letter_a_job(&app, "bp-block").await;
    bound(
        &app,
        "bp-block",
        json!({"max_depth": 1, "strategy": "block"}),
    )
    .await;
    let held = app.enqueue(on("bp-block")).await;

    // Without OJS-Block-Timeout a blocking queue refuses at once (spec §5.2).
    let started = Instant::now();
    app.post("/ojs/v1/jobs", on("bp-block"))
        .await
        .assert_error(429, "queue_full");
    assert!(started.elapsed() < Duration::from_millis(500));
    // With one, it waits that long, then refuses.
    let started = Instant::now();
    app.with_header("ojs-block-timeout", "1")
        .post("/ojs/v1/jobs", on("bp-block"))
        .await
        .assert_error(429, "queue_full");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    app.with_header("ojs-block-timeout", "31")
        .post("/ojs/v1/jobs", on("bp-block"))
        .await
        .assert_error(400, "invalid_request");

    // The dead-lettered job needs a place to run again.
    app.post(&format!("/ojs/v1/dead-letter/{dead}/retry"), json!({}))
        .await
        .assert_error(429, "queue_full");
    assert_eq!(app.job(&dead).await["state"], "discarded");

    // A PUSH waiting for room is accepted when the job holding the place finishes.
    let push = blocked_push(&app, "bp-block", 10);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let jobs = app.fetch(&["bp-block"], "w-bp").await;
    assert_eq!(jobs[0]["id"], held.as_str());
    app.ack(json!({"job_id": held, "result": null})).await;
    let (r, waited) = push.await.unwrap();
    assert_eq!(r.status, 201, "{}", r.body);
    assert!(waited >= Duration::from_millis(300), "{waited:?}");
    finish_one(&app, "bp-block").await;
    let retried = eventually(Duration::from_secs(5), "a place for the retry", || async {
        let r = app
            .post(&format!("/ojs/v1/dead-letter/{dead}/retry"), json!({}))
            .await;
        (r.status == 200).then_some(r)
    })
    .await;
    assert_eq!(
        retried.body["job"]["state"], "available",
        "{}",
        retried.body
    );
    app.stop().await;
}

/// A blocked PUSH's wait comes on top of the request deadline, as a FETCH's does: room
/// made after the deadline but within `OJS-Block-Timeout` still admits the job.
#[tokio::test]
async fn a_push_blocked_longer_than_the_request_deadline_is_admitted_when_room_comes() {
    let nats = NatsServer::start();
    let app = spawn_app_with(Config {
        request_deadline_ms: 500,
        ..test_config(&nats.url)
    })
    .await;
    bound(
        &app,
        "bp-long",
        json!({"max_depth": 1, "strategy": "block"}),
    )
    .await;
    let held = app.enqueue(on("bp-long")).await;
    let push = blocked_push(&app, "bp-long", 5);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let r = app.delete(&format!("/ojs/v1/jobs/{held}")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let (r, waited) = push.await.unwrap();
    assert_eq!(r.status, 201, "{}", r.body);
    assert!(waited >= Duration::from_millis(1500), "{waited:?}");
}

#[tokio::test]
async fn a_drop_oldest_queue_discards_its_oldest_waiting_job_for_a_new_one() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    bound(
        &app,
        "bp-drop",
        json!({"max_depth": 2, "strategy": "drop_oldest"}),
    )
    .await;
    let oldest = app.enqueue(on("bp-drop")).await;
    let second = app.enqueue(on("bp-drop")).await;
    let newest = app.enqueue(on("bp-drop")).await;
    let dropped = app.job(&oldest).await;
    assert_eq!(dropped["state"], "discarded", "{dropped}");
    assert_eq!(dropped["error"]["code"], "overflow", "{dropped}");
    let events = eventually(Duration::from_secs(5), "the drop's events", || async {
        let r = app
            .get("/ojs/v1/events?types=job.discarded,backpressure.dropped&queues=bp-drop")
            .await;
        let events = r.body["events"].as_array().cloned().unwrap_or_default();
        (events.len() == 2).then_some(events)
    })
    .await;
    assert!(
        events
            .iter()
            .all(|e| e["data"]["job_id"] == oldest.as_str()),
        "{events:?}"
    );
    // The two newest run, oldest first; the dropped one is never handed out.
    let mut fetched = Vec::new();
    for _ in 0..2 {
        for job in app.fetch(&["bp-drop"], "w").await {
            fetched.push(job["id"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(fetched, [second, newest]);
    // Only available jobs are dropped: with both running there is nothing to drop.
    app.post("/ojs/v1/jobs", on("bp-drop"))
        .await
        .assert_error(429, "queue_full");
    // A PUSH refused anyway drops nothing: more jobs than the bound, or than are available.
    bound(
        &app,
        "bp-drop",
        json!({"max_depth": 3, "strategy": "drop_oldest"}),
    )
    .await;
    let waiting = app.enqueue(on("bp-drop")).await;
    for jobs in [4, 2] {
        let batch: Vec<Value> = (0..jobs).map(|_| on("bp-drop")).collect();
        app.post("/ojs/v1/jobs/batch", json!({ "jobs": batch }))
            .await
            .assert_error(429, "queue_full");
        assert_eq!(app.job(&waiting).await["state"], "available", "{jobs} jobs");
    }
    eventually(
        Duration::from_secs(5),
        "the dropped job in the job metrics",
        || async {
            app.metrics()
                .await
                .contains("ojs_job_dropped_total{queue=\"bp-drop\",type=\"bp.t\"} 1")
                .then_some(())
        },
    )
    .await;
    app.stop().await;
}

#[tokio::test]
async fn a_place_left_by_a_push_that_died_is_freed_by_the_leader() {
    let nats = NatsServer::start();
    let mut config = test_config(&nats.url);
    config.batch_grace_ms = 500;
    config.nats_timeout_ms = 500;
    let app = spawn_app_with(config).await;
    app.enqueue(on("bp-leak")).await;
    bound(&app, "bp-leak", json!({"max_depth": 1})).await;
    // What a PUSH that died after its token and before its record leaves behind.
    let client = async_nats::connect(&nats.url).await.unwrap();
    let js = async_nats::jetstream::new(client);
    js.publish(
        "ojs.depth.bp-leak",
        "0190d1c2-0000-7000-8000-000000000000".into(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    app.post("/ojs/v1/jobs", on("bp-leak"))
        .await
        .assert_error(429, "queue_full");
    let started = Instant::now();
    accepted_once_room(&app, on("bp-leak")).await;
    // Freed after its grace (0.5 s + 2 × 0.5 s) at the next sweep.
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    app.post("/ojs/v1/jobs", on("bp-leak"))
        .await
        .assert_error(429, "queue_full");
    app.stop().await;
}

#[tokio::test]
async fn bounds_the_server_cannot_enforce_are_refused_with_the_field_named() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    app.enqueue(on("bp-bad")).await;
    for (body, status, code, field) in [
        (
            json!({"backpressure": {"maxdepth": 5}}),
            400,
            "invalid_request",
            "backpressure.maxdepth",
        ),
        (
            json!({"backpressure": {"max_depth": 5, "strategy": "newest"}}),
            400,
            "invalid_request",
            "backpressure.strategy",
        ),
        (
            json!({"backpressure": {"max_depth": 5, "max_size_bytes": 1000}}),
            422,
            "unsupported",
            "backpressure.max_size_bytes",
        ),
        (json!({"max_size": -3}), 400, "invalid_request", "max_size"),
        (
            json!({"backpressure": {"max_depth": 5, "warning_threshold": 2}}),
            400,
            "invalid_request",
            "backpressure.warning_threshold",
        ),
    ] {
        let r = app
            .put("/ojs/v1/admin/queues/bp-bad/config", body.clone())
            .await;
        r.assert_error(status, code);
        assert_eq!(r.body["error"]["details"]["field"], field, "{body}");
    }
    // The queue-config spec's spelling works too.
    let r = app
        .put(
            "/ojs/v1/admin/queues/bp-bad/config",
            json!({"max_size": 2, "overflow_policy": "reject"}),
        )
        .await;
    assert_eq!(
        r.body["configuration"]["backpressure"]["max_depth"], 2,
        "{}",
        r.body
    );
    for _ in 0..2 {
        assert_eq!(app.post("/ojs/v1/jobs", on("bp-bad")).await.status, 201);
    }
    // A bound lowered below the depth keeps every job; the queue takes new ones once it
    // has drained below the bound.
    let lowered = bound(&app, "bp-bad", json!({"max_depth": 1})).await;
    assert_eq!(lowered["configuration"]["backpressure"]["depth"], 2);
    app.post("/ojs/v1/jobs", on("bp-bad"))
        .await
        .assert_error(429, "queue_full");
    // A queue can be bounded before its first job.
    bound(&app, "bp-new", json!({"max_depth": 2})).await;
    for _ in 0..2 {
        assert_eq!(app.post("/ojs/v1/jobs", on("bp-new")).await.status, 201);
    }
    app.post("/ojs/v1/jobs", on("bp-new"))
        .await
        .assert_error(429, "queue_full");
    // A depth stream deleted by hand is made again with the bound in force (its places
    // start empty) instead of failing every PUSH.
    let js = async_nats::jetstream::new(async_nats::connect(&nats.url).await.unwrap());
    js.delete_stream("ojs-depth-bp-new").await.unwrap();
    for _ in 0..2 {
        let r = app.post("/ojs/v1/jobs", on("bp-new")).await;
        assert_eq!(r.status, 201, "{}", r.body);
    }
    app.post("/ojs/v1/jobs", on("bp-new"))
        .await
        .assert_error(429, "queue_full");
    app.stop().await;
}
