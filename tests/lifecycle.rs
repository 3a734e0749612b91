//! The job lifecycle through PUSH, FETCH, ACK, FAIL, CANCEL and INFO (core §6–§7).

use crate::common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::{eventually, job_on, spawn_app, NatsServer};
use futures::StreamExt;
use serde_json::json;

#[tokio::test]
async fn enqueue_fetch_ack_completes_with_result() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let id = app.enqueue(job_on("work")).await;
    let jobs = app.fetch(&["work"], "w1").await;
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0]["id"], id.as_str());
    assert_eq!(jobs[0]["state"], "active");
    assert_eq!(jobs[0]["attempt"], 1);
    assert_eq!(jobs[0]["worker_id"], "w1");
    assert!(jobs[0]["started_at"].is_string());

    let r = app
        .ack(json!({"job_id": id, "worker_id": "w1", "result": {"n": 42}}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["acknowledged"], true);
    assert_eq!(r.body["id"], id.as_str());
    assert_eq!(r.body["state"], "completed");
    assert!(r.body["completed_at"].is_string());
    let job = app.job(&id).await;
    assert_eq!(job["state"], "completed");
    assert_eq!(job["result"], json!({"n": 42}));
    assert!(job.get("worker_id").is_none());
    // Completed is terminal.
    app.ack(json!({"job_id": id}))
        .await
        .assert_error(409, "conflict");
    let r = app
        .nack(json!({"job_id": id, "error": {"message": "x"}}))
        .await;
    r.assert_error(409, "conflict");
    assert_eq!(r.body["error"]["details"]["current_state"], "completed");
}

/// A FETCH that does not wait, sent the moment a PUSH was answered, gets that job: NATS
/// answers a publish before it tells the queue's consumer, and many producers at once make
/// that gap milliseconds long.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fetch_right_after_a_push_was_answered_gets_the_job() {
    let nats = NatsServer::start();
    let app = std::sync::Arc::new(spawn_app(&nats.url).await);
    let producers = (0..16).map(|p| {
        let app = app.clone();
        tokio::spawn(async move {
            let queue = format!("settle-{p}");
            let mut missed = Vec::new();
            for _ in 0..200 {
                let id = app.enqueue(job_on(&queue)).await;
                let jobs = app.fetch(&[&queue], "w").await;
                if common::job_ids(&json!(jobs)) != [id.as_str()] {
                    missed.push(id);
                }
            }
            missed
        })
    });
    for missed in futures::future::join_all(producers).await {
        let missed = missed.unwrap();
        assert!(
            missed.is_empty(),
            "FETCHes right after their PUSH missed {missed:?}"
        );
    }
}

/// A FETCH without `wait_ms` that finds nothing answers after its 20 ms settle wait
/// (`a_fetch_right_after_a_push…` above), not after a long poll.
#[tokio::test]
async fn an_empty_fetch_without_a_wait_answers_within_its_settle_wait() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    app.enqueue(job_on("other")).await; // a queue that exists, with nothing for us
    let started = Instant::now();
    assert!(app
        .fetch(&["never-used", "other-empty"], "w")
        .await
        .is_empty());
    let id = app.enqueue(job_on("drained")).await;
    assert_eq!(app.fetch(&["drained"], "w").await[0]["id"], id.as_str());
    assert!(app.fetch(&["drained"], "w").await.is_empty());
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn fifo_within_priority_and_higher_priority_first() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let mut expected = Vec::new();
    let mut ids = Vec::new();
    for (i, priority) in [0, -10, 10, 0, 10, -10, 100].into_iter().enumerate() {
        let id = app
            .enqueue(json!({"type": "t.p", "args": [i], "options": {"queue": "prio", "priority": priority}}))
            .await;
        ids.push((priority, i, id));
    }
    ids.sort_by_key(|(p, i, _)| (-p, *i));
    expected.extend(ids.into_iter().map(|(_, _, id)| id));
    let mut got = Vec::new();
    for _ in 0..expected.len() {
        got.push(
            app.fetch(&["prio"], "w").await[0]["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(got, expected);
}

/// `PATCH /ojs/v1/jobs/{id}` (priority spec §8.1; the `ojs` command line's `priority`): a
/// waiting job moves to its new priority's lane and is handed out once, from there; a
/// running job keeps its own; bad requests change nothing.
#[tokio::test]
async fn a_waiting_job_takes_its_new_priority_and_a_running_one_keeps_its_own() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let job = |i: i32| json!({"type": "t.p", "args": [i], "options": {"queue": "reprio"}});
    let first = app.enqueue(job(1)).await;
    let second = app.enqueue(job(2)).await;
    let last = app.enqueue(job(3)).await;
    let r = app
        .patch(&format!("/ojs/v1/jobs/{last}"), json!({"priority": 10}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        (
            &r.body["priority"],
            &r.body["previous_priority"],
            &r.body["id"]
        ),
        (&json!(10), &json!(0), &json!(last))
    );
    assert_eq!(r.body["job"]["priority"], 10);
    assert_eq!(app.job(&last).await["priority"], 10);
    // The same priority again writes nothing and says so.
    let again = app
        .patch(&format!("/ojs/v1/jobs/{last}"), json!({"priority": 10}))
        .await;
    assert_eq!(again.body["previous_priority"], 10);
    let scheduled = app
        .enqueue(json!({"type": "t.p", "args": [4], "options": {"queue": "reprio", "delay_until": "2099-01-01T00:00:00Z"}}))
        .await;
    let r = app
        .patch(
            &format!("/ojs/v1/jobs/{scheduled}"),
            json!({"priority": "LOW"}),
        )
        .await;
    assert_eq!((r.status.as_u16(), &r.body["priority"]), (200, &json!(-10)));
    // Handed out from its new lane first, then the others in order, each once: the
    // message of its old priority is spent.
    let mut got = Vec::new();
    for _ in 0..3 {
        let fetched = app.fetch(&["reprio"], "w").await;
        got.push(fetched[0]["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(got, [last.clone(), first, second]);
    assert!(app.fetch(&["reprio"], "w").await.is_empty());
    let r = app
        .patch(&format!("/ojs/v1/jobs/{last}"), json!({"priority": 1}))
        .await;
    assert_eq!(r.status, 409, "{}", r.body);
    assert_eq!(r.body["error"]["details"]["current_state"], "active");
    assert_eq!(app.job(&last).await["priority"], 10);
    for (body, status) in [
        (json!({"priority": 1000}), 400),
        (json!({"priority": 1, "queue": "elsewhere"}), 400),
        (json!({}), 400),
    ] {
        let r = app
            .patch(&format!("/ojs/v1/jobs/{scheduled}"), body.clone())
            .await;
        assert_eq!(r.status, status, "{body}: {}", r.body);
    }
    assert_eq!(app.job(&scheduled).await["priority"], -10);
    let r = app
        .patch(
            "/ojs/v1/jobs/019a0000-0000-7000-8000-000000000000",
            json!({"priority": 1}),
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.body);
}

#[tokio::test]
async fn queues_are_tried_in_the_order_given() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let low = app.enqueue(job_on("low")).await;
    let high = app.enqueue(job_on("high")).await;
    assert_eq!(
        app.fetch(&["high", "low"], "w").await[0]["id"],
        high.as_str()
    );
    assert_eq!(
        app.fetch(&["high", "low"], "w").await[0]["id"],
        low.as_str()
    );
}

#[tokio::test]
async fn concurrent_fetches_claim_each_job_exactly_once() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let mut ids = HashSet::new();
    for _ in 0..40 {
        ids.insert(app.enqueue(job_on("race")).await);
    }
    let fetches = (0..80).map(|i| {
        let http = app.http.clone();
        let url = app.url("/ojs/v1/workers/fetch");
        async move {
            let r = http
                .post(url)
                .header("content-type", "application/json")
                .body(json!({"queues": ["race"], "worker_id": format!("w{i}")}).to_string())
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let body: serde_json::Value = r.json().await.unwrap();
            body["jobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|j| j["id"].as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        }
    });
    let claimed: Vec<String> = futures::future::join_all(fetches)
        .await
        .into_iter()
        .flatten()
        .collect();
    let unique: HashSet<_> = claimed.iter().cloned().collect();
    assert_eq!(claimed.len(), unique.len(), "a job was handed out twice");
    // Every job is claimed once, by these fetches or the ones that follow.
    let mut rest = unique;
    loop {
        let more = app.fetch(&["race"], "late").await;
        if more.is_empty() {
            break;
        }
        assert!(
            rest.insert(more[0]["id"].as_str().unwrap().to_string()),
            "claimed twice"
        );
    }
    assert_eq!(rest, ids);
}

#[tokio::test]
async fn fetch_count_claims_several() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(app.enqueue(job_on("multi")).await);
    }
    // Claimed side by side, handed out in queue order.
    for expected in [&ids[..3], &ids[3..]] {
        let r = app
            .post(
                "/ojs/v1/workers/fetch",
                json!({"queues": ["multi"], "count": 3}),
            )
            .await;
        assert_eq!(common::job_ids(&r.body["jobs"]), expected);
    }
    for bad in [
        json!({"queues": []}),
        json!({}),
        json!({"queues": ["Bad!"]}),
        json!({"queues": ["a"], "count": 0}),
    ] {
        app.post("/ojs/v1/workers/fetch", bad)
            .await
            .assert_error(400, "invalid_request");
    }
}

#[tokio::test]
async fn ack_and_fail_refuse_wrong_state_and_wrong_worker() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let id = app.enqueue(job_on("own")).await;
    let r = app.ack(json!({"job_id": id})).await;
    r.assert_error(409, "conflict");
    assert_eq!(r.body["error"]["details"]["current_state"], "available");
    assert_eq!(r.body["error"]["details"]["expected_state"], "active");
    app.fetch(&["own"], "holder").await;
    app.ack(json!({"job_id": id, "worker_id": "intruder"}))
        .await
        .assert_error(409, "conflict");
    app.nack(json!({"job_id": id, "worker_id": "intruder", "error": {"message": "x"}}))
        .await
        .assert_error(409, "conflict");
    assert_eq!(app.job(&id).await["state"], "active");
    app.ack(json!({"job_id": "019539a4-0000-7000-8000-000000000000"}))
        .await
        .assert_error(404, "not_found");
    app.ack(json!({}))
        .await
        .assert_error(400, "invalid_request");
    app.nack(json!({"job_id": id}))
        .await
        .assert_error(400, "invalid_request");
}

#[tokio::test]
async fn failure_with_retries_left_comes_back_after_its_backoff() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let id = app
        .enqueue(
            json!({"type": "t.f", "args": [], "options": {"queue": "retry",
            "retry": {"max_attempts": 3, "initial_interval": "PT0.5S", "jitter": false}}}),
        )
        .await;
    app.fetch(&["retry"], "w").await;
    let r = app
        .nack(json!({"job_id": id, "error": {"code": "handler_error", "message": "boom", "details": {"k": 1}}}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["state"], "retryable");
    assert_eq!(r.body["attempt"], 1);
    assert_eq!(r.body["max_attempts"], 3);
    assert_eq!(r.body["retry_delay_ms"], 500);
    assert!(r.body["next_attempt_at"].is_string());
    let job = app.job(&id).await;
    assert_eq!(job["state"], "retryable");
    assert!(job.get("completed_at").is_none());
    assert_eq!(job["errors"][0]["attempt"], 1);
    assert_eq!(job["error"]["message"], "boom");
    // Not before its time...
    assert!(app.fetch(&["retry"], "w").await.is_empty());
    // ...and soon after it.
    let started = Instant::now();
    let again = eventually(Duration::from_secs(3), "the retry", || async {
        app.fetch(&["retry"], "w").await.into_iter().next()
    })
    .await;
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(again["id"], id.as_str());
    assert_eq!(again["attempt"], 2);
    assert_eq!(again["retry_delay_ms"], 500);
    // ACK clears the error but keeps the history.
    app.ack(json!({"job_id": id})).await;
    let job = app.job(&id).await;
    assert!(job.get("error").is_none());
    assert_eq!(job["errors"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn exhausted_or_non_retryable_failures_discard() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let once = app.enqueue(json!({"type": "t.f", "args": [], "options": {"queue": "d", "retry": {"max_attempts": 1}}})).await;
    app.fetch(&["d"], "w").await;
    let r = app
        .nack(json!({"job_id": once, "error": {"code": "handler_error", "message": "x"}}))
        .await;
    assert_eq!(r.body["state"], "discarded");
    assert!(r.body["completed_at"].is_string() && r.body["discarded_at"].is_string());

    let typed = app
        .enqueue(json!({"type": "t.f", "args": [], "options": {"queue": "d", "retry": {"non_retryable_errors": ["FatalError"]}}}))
        .await;
    app.fetch(&["d"], "w").await;
    let r = app
        .nack(json!({"job_id": typed, "error": {"code": "handler_error", "message": "x", "details": {"error_class": "FatalError"}}}))
        .await;
    assert_eq!(r.body["state"], "discarded");

    let flagged = app.enqueue(job_on("d")).await;
    app.fetch(&["d"], "w").await;
    let r = app
        .nack(json!({"job_id": flagged, "error": {"message": "x", "retryable": false}}))
        .await;
    assert_eq!(r.body["state"], "discarded");
    // Discarded is terminal.
    app.delete(&format!("/ojs/v1/jobs/{flagged}"))
        .await
        .assert_error(409, "conflict");
}

#[tokio::test]
async fn requeue_puts_the_job_straight_back() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let id = app.enqueue(job_on("rq")).await;
    app.fetch(&["rq"], "w").await;
    let r = app.nack(json!({"job_id": id, "requeue": true, "error": {"code": "shutdown", "message": "stopping"}})).await;
    assert_eq!(r.body["state"], "available");
    let again = app.fetch(&["rq"], "w2").await;
    assert_eq!(again[0]["id"], id.as_str());
    assert_eq!(again[0]["attempt"], 2);
}

#[tokio::test]
async fn cancel_from_every_state() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let waiting = app.enqueue(job_on("c")).await;
    let r = app.delete(&format!("/ojs/v1/jobs/{waiting}")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["job"]["state"], "cancelled");
    assert_eq!(r.body["job"]["previous_state"], "available");
    assert!(r.body["job"]["cancelled_at"].is_string());
    assert!(r.body["job"].get("completed_at").is_none());
    // Idempotent, and never handed out.
    assert_eq!(
        app.delete(&format!("/ojs/v1/jobs/{waiting}")).await.status,
        200
    );
    assert!(app.fetch(&["c"], "w").await.is_empty());

    let running = app.enqueue(job_on("c")).await;
    app.fetch(&["c"], "w").await;
    let r = app.delete(&format!("/ojs/v1/jobs/{running}")).await;
    assert_eq!(r.body["job"]["state"], "cancelled");
    assert_eq!(r.body["job"]["attempt"], 1);
    app.ack(json!({"job_id": running}))
        .await
        .assert_error(409, "conflict");

    let scheduled = app
        .enqueue(json!({"type": "t.s", "args": [], "options": {"queue": "c", "scheduled_at": "2099-01-01T00:00:00Z"}}))
        .await;
    assert_eq!(app.job(&scheduled).await["state"], "scheduled");
    assert_eq!(
        app.delete(&format!("/ojs/v1/jobs/{scheduled}")).await.body["job"]["state"],
        "cancelled"
    );

    let done = app.enqueue(job_on("c")).await;
    app.fetch(&["c"], "w").await;
    app.ack(json!({"job_id": done})).await;
    app.delete(&format!("/ojs/v1/jobs/{done}"))
        .await
        .assert_error(409, "conflict");
    app.delete("/ojs/v1/jobs/019539a4-0000-7000-8000-000000000000")
        .await
        .assert_error(404, "not_found");
}

#[tokio::test]
async fn pending_jobs_wait_for_activation() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let id = app
        .enqueue(json!({"type": "t.p", "args": [], "options": {"queue": "pend", "pending": true}}))
        .await;
    assert_eq!(app.job(&id).await["state"], "pending");
    assert!(app.fetch(&["pend"], "w").await.is_empty());
    let r = app
        .post(&format!("/ojs/v1/jobs/{id}/activate"), json!({}))
        .await;
    assert_eq!(r.body["job"]["state"], "available");
    assert_eq!(app.fetch(&["pend"], "w").await[0]["id"], id.as_str());
    app.post(&format!("/ojs/v1/jobs/{id}/activate"), json!({}))
        .await
        .assert_error(409, "conflict");
}

#[tokio::test]
async fn client_ids_are_kept_and_duplicates_refused() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let id = "019539a4-aaaa-7000-8000-111111111111";
    let first = app
        .post(
            "/ojs/v1/jobs",
            json!({"type": "t.d", "args": [1], "id": id}),
        )
        .await;
    assert_eq!(first.body["job"]["id"], id);
    let dup = app
        .post(
            "/ojs/v1/jobs",
            json!({"type": "t.d", "args": [2], "id": id}),
        )
        .await;
    dup.assert_error(409, "duplicate");
    assert_eq!(app.job(id).await["args"], json!([1]));
    // The refused duplicate left nothing behind to fetch.
    assert_eq!(app.fetch(&["default"], "w").await.len(), 1);
    assert!(app.fetch(&["default"], "w").await.is_empty());
}

#[tokio::test]
async fn batches_are_all_or_nothing() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let jobs: Vec<_> = (0..100)
        .map(|i| json!({"type": "t.b", "args": [i], "options": {"queue": "batch"}}))
        .collect();
    let r = app.post("/ojs/v1/jobs/batch", json!({"jobs": jobs})).await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["count"], 100);
    let created = r.body["jobs"].as_array().unwrap();
    assert_eq!(created[99]["args"], json!([99]));
    assert!(created.iter().all(|j| j["state"] == "available"));

    let invalid = json!({"jobs": [job_on("atomic"), job_on("atomic"), {"args": []}]});
    let r = app.post("/ojs/v1/jobs/batch", invalid).await;
    r.assert_error(400, "invalid_request");
    assert_eq!(r.body["error"]["details"]["index"], 2);
    assert!(r.body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("index 2"));

    let existing = app
        .enqueue(json!({"type": "t.b", "args": [], "options": {"queue": "other"}}))
        .await;
    let clash = json!({"jobs": [job_on("atomic"), {"type": "t.b", "args": [], "id": existing, "options": {"queue": "atomic"}}]});
    app.post("/ojs/v1/jobs/batch", clash)
        .await
        .assert_error(409, "duplicate");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        app.fetch(&["atomic"], "w").await.is_empty(),
        "a rejected batch left jobs behind"
    );

    for bad in [json!({}), json!({"jobs": []}), json!({"jobs": {}})] {
        app.post("/ojs/v1/jobs/batch", bad)
            .await
            .assert_error(400, "invalid_request");
    }
}

#[tokio::test]
async fn scheduled_jobs_become_available_at_their_time_not_before() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let r = app
        .post("/ojs/v1/jobs", json!({"type": "t.s", "args": [], "options": {"queue": "later", "scheduled_at": "+PT1S"}}))
        .await;
    assert_eq!(r.body["job"]["state"], "scheduled");
    let id = r.body["job"]["id"].as_str().unwrap().to_string();
    let due = chrono::DateTime::parse_from_rfc3339(r.body["job"]["scheduled_at"].as_str().unwrap())
        .unwrap();
    assert!(app.fetch(&["later"], "w").await.is_empty());
    let job = eventually(Duration::from_secs(4), "the scheduled job", || async {
        app.fetch(&["later"], "w").await.into_iter().next()
    })
    .await;
    assert!(chrono::Utc::now() >= due);
    assert_eq!(job["id"], id.as_str());
    assert!(job["enqueued_at"].is_string());
}

#[tokio::test]
async fn jobs_not_started_by_expires_at_are_discarded_without_running() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let soon = |ms: i64| (chrono::Utc::now() + chrono::Duration::milliseconds(ms)).to_rfc3339();
    let waiting = app.enqueue(json!({"type": "t.x", "args": [], "options": {"queue": "ttl", "expires_at": soon(600)}})).await;
    let scheduled = app
        .enqueue(json!({"type": "t.x", "args": [], "options": {"queue": "ttl", "expires_at": soon(600), "scheduled_at": "+PT2S"}}))
        .await;
    let keeps = app
        .enqueue(json!({"type": "t.x", "args": [], "options": {"queue": "ttl-ok", "expires_at": "2099-12-31T23:59:59Z"}}))
        .await;
    for id in [&waiting, &scheduled] {
        let job = eventually(Duration::from_secs(3), "expiry", || async {
            let j = app.job(id).await;
            (j["state"] == "discarded").then_some(j)
        })
        .await;
        assert!(job["discarded_at"].is_string());
    }
    assert!(
        app.fetch(&["ttl"], "w").await.is_empty(),
        "an expired job was handed out"
    );
    let events = eventually(Duration::from_secs(3), "job.expired events", || async {
        let r = app.get("/ojs/v1/events?types=job.expired").await;
        let e = r.body["events"].as_array().unwrap().clone();
        (e.len() == 2).then_some(e)
    })
    .await;
    assert!(events[0]["data"]["ttl_ms"].as_i64().unwrap() > 0);
    assert!(
        events[0]["data"]["expired_at"].is_string() && events[0]["data"]["created_at"].is_string()
    );
    let job = app.fetch(&["ttl-ok"], "w").await;
    assert_eq!(job[0]["id"], keeps.as_str());
    assert_eq!(job[0]["expires_at"], "2099-12-31T23:59:59Z");
}

/// A FETCH with `wait_ms` on empty queues (long polling).
async fn waiting_fetch(
    app: &common::TestApp,
    queues: &[&str],
    wait_ms: u64,
) -> Vec<serde_json::Value> {
    let r = app
        .post(
            "/ojs/v1/workers/fetch",
            json!({"queues": queues, "worker_id": "lp", "wait_ms": wait_ms}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.body["jobs"].as_array().unwrap().clone()
}

/// Pushes a job onto `queue` while a FETCH waits there, asserts the FETCH got exactly that
/// job, and returns its id.
async fn push_during_a_wait(app: &std::sync::Arc<common::TestApp>, queue: &'static str) -> String {
    let waiting = {
        let app = app.clone();
        tokio::spawn(async move { waiting_fetch(&app, &[queue], 5000).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let id = app.enqueue(job_on(queue)).await;
    let jobs = waiting.await.unwrap();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0]["id"], id.as_str());
    id
}

#[tokio::test]
async fn a_waiting_fetch_gets_the_job_pushed_while_it_waits() {
    let nats = NatsServer::start();
    let app = std::sync::Arc::new(spawn_app(&nats.url).await);
    for queue in ["lp-a", "lp-b"] {
        // The queues exist (a known queue is waited on through JetStream, not rechecked).
        app.enqueue(job_on(queue)).await;
        assert_eq!(app.fetch(&[queue], "w").await.len(), 1);
    }
    let waiting = {
        let app = app.clone();
        tokio::spawn(async move {
            let asked = Instant::now();
            (waiting_fetch(&app, &["lp-a", "lp-b"], 5000).await, asked)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pushed = Instant::now();
    let id = app.enqueue(job_on("lp-b")).await;
    let (jobs, asked) = waiting.await.unwrap();
    let answered = pushed.elapsed();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0]["id"], id.as_str());
    assert_eq!(jobs[0]["state"], "active");
    assert!(asked.elapsed() < Duration::from_secs(2));
    println!("answered {} ms after the PUSH", answered.as_millis());
    assert!(answered < Duration::from_millis(500), "took {answered:?}");

    // The wait on lp-a was withdrawn: a job pushed there now is not held back by it.
    let next = app.enqueue(job_on("lp-a")).await;
    let got = eventually(Duration::from_secs(2), "the next job on lp-a", || async {
        app.fetch(&["lp-a"], "w").await.first().cloned()
    })
    .await;
    assert_eq!(got["id"], next.as_str());
}

#[tokio::test]
async fn a_waiting_fetch_claims_a_job_pushed_through_its_gateway_without_reading_the_record() {
    let nats = NatsServer::start();
    let app = std::sync::Arc::new(spawn_app(&nats.url).await);
    app.enqueue(job_on("lp-own")).await;
    assert_eq!(app.fetch(&["lp-own"], "w").await.len(), 1);
    // Every read of a record is a direct get on the jobs stream: watch them.
    let nats_client = async_nats::connect(&nats.url).await.unwrap();
    let mut reads = nats_client.subscribe("$JS.API.DIRECT.GET.>").await.unwrap();
    nats_client.flush().await.unwrap();
    let id = push_during_a_wait(&app, "lp-own").await;
    // The message reached the waiting FETCH before its record existed; the claim waited for
    // the PUSH's record instead of reading the bucket.
    let mut read = Vec::new();
    while let Ok(Some(msg)) = tokio::time::timeout(Duration::from_millis(200), reads.next()).await {
        read.push(msg.subject.to_string());
    }
    assert!(
        !read.iter().any(|s| s.contains(&id)),
        "the claim read the record: {read:?}"
    );
}

#[tokio::test]
async fn a_waiting_fetch_on_empty_queues_answers_empty_after_its_wait() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    app.enqueue(job_on("lp-empty")).await;
    assert_eq!(app.fetch(&["lp-empty"], "w").await.len(), 1);
    for queues in [&["lp-empty"][..], &["lp-never-created"][..]] {
        let asked = Instant::now();
        assert!(waiting_fetch(&app, queues, 700).await.is_empty());
        let waited = asked.elapsed();
        assert!(
            waited >= Duration::from_millis(700) && waited < Duration::from_millis(1500),
            "{queues:?} waited {waited:?}"
        );
    }
    // A queue created while a fetch waits on it is picked up too.
    push_during_a_wait(&std::sync::Arc::new(app), "lp-new").await;
}

#[tokio::test]
async fn waiting_fetches_share_arriving_jobs_one_each() {
    let nats = NatsServer::start();
    let app = std::sync::Arc::new(spawn_app(&nats.url).await);
    app.enqueue(job_on("lp-share")).await;
    assert_eq!(app.fetch(&["lp-share"], "w").await.len(), 1);
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { waiting_fetch(&app, &["lp-share"], 4000).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut pushed = HashSet::new();
    for _ in 0..4 {
        pushed.insert(app.enqueue(job_on("lp-share")).await);
    }
    let mut got = HashSet::new();
    for w in waiters {
        let jobs = w.await.unwrap();
        assert_eq!(jobs.len(), 1, "each waiter gets one job");
        got.insert(jobs[0]["id"].as_str().unwrap().to_string());
    }
    assert_eq!(got, pushed);
}

#[tokio::test]
async fn shutdown_ends_waiting_fetches_at_once() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let (http, url) = (app.http.clone(), app.url("/ojs/v1/workers/fetch"));
    let waiting = tokio::spawn(async move {
        let r = http
            .post(url)
            .json(&json!({"queues": ["lp-stop"], "worker_id": "lp", "wait_ms": 10_000}))
            .send()
            .await
            .unwrap();
        (r.status(), r.json::<serde_json::Value>().await.unwrap())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopping = Instant::now();
    app.stop().await;
    let stopped = stopping.elapsed();
    let (status, body) = waiting.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["jobs"], json!([]));
    assert!(
        stopped < Duration::from_secs(2),
        "shutdown took {stopped:?}"
    );
}

#[tokio::test]
async fn fetch_rejects_a_bad_wait() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    for wait in [json!(-1), json!(10_001), json!("1s"), json!(1.5)] {
        let r = app
            .post(
                "/ojs/v1/workers/fetch",
                json!({"queues": ["q"], "wait_ms": wait}),
            )
            .await;
        r.assert_error(400, "invalid_request");
        assert_eq!(r.body["error"]["details"]["field"], "wait_ms", "{wait}");
    }
}
