//! Faults between two NATS calls, opened on purpose with failpoints (docs/architecture.md
//! §3.15): what each leaves behind is what architecture.md §4 says.

use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{spawn_app, spawn_app_with, test_config, NatsServer};
use ojs_jetstream::config::Config;
use serde_json::json;

/// A batch refused for a duplicate id is rolled back while a worker on another gateway
/// waits for its queue (the PUSH is held at `enqueue.rolling_back`): a batch publishes its
/// messages only once committed, so the worker never gets a job of it, and the client
/// hears 409 — nothing written.
#[tokio::test]
async fn a_refused_batch_hands_no_job_to_a_worker_waiting_through_its_rollback() {
    let nats = NatsServer::start();
    let pushing = spawn_app_with(Config {
        failpoints: "enqueue.rolling_back=delay(1500)".into(),
        ..test_config(&nats.url)
    })
    .await;
    let working = spawn_app(&nats.url).await;
    let existing = pushing
        .enqueue(json!({"type": "t.old", "args": [], "options": {"queue": "elsewhere"}}))
        .await;

    let push = pushing.post(
        "/ojs/v1/jobs/batch",
        json!({"jobs": [
            {"type": "t.a", "args": [], "options": {"queue": "rolled"}},
            {"type": "t.b", "args": [], "options": {"queue": "rolled"}},
            {"type": "t.dup", "args": [], "id": existing, "options": {"queue": "rolled"}},
        ]}),
    );
    let claim = async {
        let mut claimed = BTreeSet::new();
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            let r = working
                .post(
                    "/ojs/v1/workers/fetch",
                    json!({"queues": ["rolled"], "count": 2, "wait_ms": 500, "worker_id": "w"}),
                )
                .await;
            claimed.extend(
                common::job_ids(&r.body["jobs"])
                    .iter()
                    .map(|s| s.to_string()),
            );
        }
        claimed
    };
    let (refused, claimed) = tokio::join!(push, claim);

    refused.assert_error(409, "duplicate");
    assert!(claimed.is_empty(), "handed out: {claimed:?}");
    assert_eq!(pushing.job(&existing).await["type"], "t.old");
}

/// Without a worker in the window the same refusal removes the batch's jobs: 409, and
/// nothing of the batch can be read or fetched.
#[tokio::test]
async fn a_refused_batch_nobody_claimed_leaves_nothing() {
    let nats = NatsServer::start();
    let app = spawn_app_with(Config {
        failpoints: "enqueue.rolling_back=delay(300)".into(),
        ..test_config(&nats.url)
    })
    .await;
    let existing = app.enqueue(common::job_on("elsewhere")).await;
    let refused = app
        .post(
            "/ojs/v1/jobs/batch",
            json!({"jobs": [
                {"type": "t.a", "args": [], "options": {"queue": "rolled"}},
                {"type": "t.dup", "args": [], "id": existing, "options": {"queue": "rolled"}},
            ]}),
        )
        .await;
    refused.assert_error(409, "duplicate");
    let r = app
        .post(
            "/ojs/v1/workers/fetch",
            json!({"queues": ["rolled"], "count": 5, "wait_ms": 1000, "worker_id": "w"}),
        )
        .await;
    assert_eq!(r.body["jobs"], json!([]), "{}", r.body);
}

/// A PUSH whose create finds its id taken, by a refused batch's record that is rolled back
/// before the PUSH looks at it (held at `enqueue.found_taken`), finds the id free and
/// creates its job: 201, and the job is the PUSH's. The same look at a free key is what
/// tells a stream leader answering from before a partition healed — which once answered
/// 409 `duplicate` to a PUSH for its own job.
#[tokio::test]
async fn a_push_whose_id_is_freed_while_it_looks_at_the_holder_creates_its_job() {
    let nats = NatsServer::start();
    let rolling = spawn_app_with(Config {
        failpoints: "enqueue.rolling_back=delay(1500)".into(),
        ..test_config(&nats.url)
    })
    .await;
    let creating = spawn_app_with(Config {
        failpoints: "enqueue.found_taken=delay(2000)".into(),
        ..test_config(&nats.url)
    })
    .await;
    let existing = rolling.enqueue(common::job_on("elsewhere")).await;
    let id = uuid::Uuid::now_v7().to_string();

    let batch = rolling.post(
        "/ojs/v1/jobs/batch",
        json!({"jobs": [
            {"type": "t.batch", "args": [], "id": id, "options": {"queue": "freed"}},
            {"type": "t.dup", "args": [], "id": existing, "options": {"queue": "freed"}},
        ]}),
    );
    let single = async {
        // The batch's record of `id` is created and its rollback held.
        tokio::time::sleep(Duration::from_millis(300)).await;
        creating
            .post(
                "/ojs/v1/jobs",
                json!({"type": "t.mine", "args": [], "id": id, "options": {"queue": "freed"}}),
            )
            .await
    };
    let (batch, single) = tokio::join!(batch, single);
    batch.assert_error(409, "duplicate");
    assert_eq!(single.status, 201, "{}", single.body);
    assert_eq!(creating.job(&id).await["type"], "t.mine");
    let r = creating
        .post(
            "/ojs/v1/workers/fetch",
            json!({"queues": ["freed"], "count": 5, "wait_ms": 1000, "worker_id": "w"}),
        )
        .await;
    let fetched: Vec<&str> = r.body["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["type"].as_str().unwrap())
        .collect();
    assert_eq!(fetched, ["t.mine"], "{}", r.body);
}

/// A FETCH whose claim is held past its deadline (`wait_ms` + `request_deadline_ms`, the
/// point `fetch.claiming` standing in for a NATS that does not answer) starts no write: it
/// answers 503 with `Retry-After` in time, the job stays available, and another gateway's
/// worker gets it at its first attempt.
#[tokio::test]
async fn a_fetch_past_its_deadline_claims_nothing_and_says_retry() {
    let nats = NatsServer::start();
    let slow = spawn_app_with(Config {
        failpoints: "fetch.claiming=delay(3000)".into(),
        request_deadline_ms: 500,
        ..test_config(&nats.url)
    })
    .await;
    let other = spawn_app(&nats.url).await;
    let id = other.enqueue(common::job_on("late")).await;

    let started = Instant::now();
    let r = slow
        .post(
            "/ojs/v1/workers/fetch",
            json!({"queues": ["late"], "count": 1, "wait_ms": 200, "worker_id": "slow"}),
        )
        .await;
    let took = started.elapsed();
    r.assert_error(503, "backend_error");
    assert_eq!(r.header("retry-after"), "1");
    // Deadline 0.7 s; the 3 s hold escapes it, so the request is cut 0.25 s past it.
    assert!(
        took < Duration::from_millis(1200),
        "answered after {took:?}"
    );
    assert_eq!(other.job(&id).await["state"], "available");

    let r = other
        .post(
            "/ojs/v1/workers/fetch",
            json!({"queues": ["late"], "count": 1, "wait_ms": 8000, "worker_id": "w"}),
        )
        .await;
    assert_eq!(
        common::job_ids(&r.body["jobs"]),
        [id.as_str()],
        "{}",
        r.body
    );
    assert_eq!(r.body["jobs"][0]["attempt"], 1);
}

/// A PUSH held past its deadline where no step's deadline reaches (`enqueue.published`
/// standing in for a step that escaped it, or a descheduled process) is cut 0.25 s past
/// its deadline: a retryable 503 in time, not an answer whenever the hold ends. The cut
/// leaves what a crash there leaves (architecture §4, PUSH 2→3): the client's retry with
/// the same id through another gateway runs the job once.
#[tokio::test]
async fn a_push_held_past_its_deadline_is_cut_in_time_and_its_retry_runs_once() {
    let nats = NatsServer::start();
    let slow = spawn_app_with(Config {
        failpoints: "enqueue.published=delay(5000)".into(),
        request_deadline_ms: 500,
        ..test_config(&nats.url)
    })
    .await;
    let other = spawn_app(&nats.url).await;
    let job = json!({"id": uuid::Uuid::now_v7().to_string(), "type": "t.cut", "args": [],
        "options": {"queue": "cut"}});

    let started = Instant::now();
    let r = slow.post("/ojs/v1/jobs", job.clone()).await;
    let took = started.elapsed();
    r.assert_error(503, "backend_error");
    assert_eq!(r.body["error"]["retryable"], true, "{}", r.body);
    assert_eq!(r.header("retry-after"), "1");
    assert!(
        took >= Duration::from_millis(700) && took < Duration::from_millis(1200),
        "answered after {took:?}"
    );

    let r = other.post("/ojs/v1/jobs", job.clone()).await;
    assert_eq!(r.status, 201, "{}", r.body);
    let id = job["id"].as_str().unwrap();
    let r = other
        .post(
            "/ojs/v1/workers/fetch",
            json!({"queues": ["cut"], "count": 10, "wait_ms": 3000, "worker_id": "w"}),
        )
        .await;
    assert_eq!(common::job_ids(&r.body["jobs"]), [id], "{}", r.body);
    other.ack(json!({"job_id": id, "result": null})).await;
    assert_eq!(other.job(id).await["state"], "completed");
}
