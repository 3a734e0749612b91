//! Level 1 through the HTTP API: heartbeats, visibility and execution timeouts, dead-worker
//! recovery, operator directives and the dead letter queue (worker protocol, retry and
//! dead-letter specs).

use crate::common;

use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::PullConsumer;
use common::{
    dead_letter_a_job, eventually, job_on, spawn_app, spawn_app_with, test_config, NatsServer,
};
use futures::{StreamExt, TryStreamExt};
use ojs_jetstream::config::Config;
use serde_json::{json, Value};

async fn state_of(app: &common::TestApp, id: &str) -> Value {
    app.job(id).await
}

#[tokio::test]
async fn heartbeats_extend_the_reservation_and_silence_lets_it_lapse() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let id = app
        .enqueue(json!({"type": "t.v", "args": [], "options": {"queue": "vis", "visibility_timeout_ms": 1000}}))
        .await;
    app.fetch(&["vis"], "w1").await;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(600)).await;
        let r = app
            .post(
                "/ojs/v1/workers/heartbeat",
                json!({"worker_id": "w1", "active_jobs": [id]}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.body["state"], "running");
        assert_eq!(r.body["jobs_extended"], json!([id]));
    }
    assert_eq!(
        state_of(&app, &id).await["state"],
        "active",
        "heartbeats kept it"
    );
    // Silence: the reservation lapses and the job is back, attempt kept, error recorded.
    let silent = Instant::now();
    let job = eventually(Duration::from_secs(3), "the lapse", || async {
        let j = app.job(&id).await;
        (j["state"] == "available").then_some(j)
    })
    .await;
    let waited = silent.elapsed();
    assert!(
        waited >= Duration::from_millis(800) && waited < Duration::from_millis(2000),
        "lapsed after {waited:?}"
    );
    assert_eq!(job["attempt"], 1);
    assert_eq!(job["error"]["type"], "visibility_timeout");
    let again = app.fetch(&["vis"], "w2").await;
    assert_eq!(again[0]["attempt"], 2);
    // The first holder's late ACK is refused.
    app.ack(json!({"job_id": id, "worker_id": "w1"}))
        .await
        .assert_error(409, "conflict");
    let r = app.ack(json!({"job_id": id, "worker_id": "w2"})).await;
    assert_eq!(r.body["state"], "completed");
}

#[tokio::test]
async fn a_job_running_past_its_timeout_fails_with_timeout() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let id = app
        .enqueue(
            json!({"type": "t.t", "args": [], "options": {"queue": "slow", "timeout_ms": 700,
            "retry": {"max_attempts": 2, "initial_interval": "PT30S"}}}),
        )
        .await;
    app.fetch(&["slow"], "w").await;
    let started = Instant::now();
    // Heartbeats do not stop an execution timeout.
    app.post(
        "/ojs/v1/workers/heartbeat",
        json!({"worker_id": "w", "active_job_ids": [id], "active_jobs": 1}),
    )
    .await;
    let job = eventually(Duration::from_secs(3), "the timeout", || async {
        let j = app.job(&id).await;
        (j["state"] == "retryable").then_some(j)
    })
    .await;
    assert!(
        started.elapsed() < Duration::from_millis(1700),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(job["error"]["code"], "timeout");
    assert_eq!(job["error"]["type"], "timeout");
    app.ack(json!({"job_id": id}))
        .await
        .assert_error(409, "conflict");
}

#[tokio::test]
async fn a_worker_that_stops_heartbeating_loses_its_jobs() {
    let nats = NatsServer::start();
    let app = spawn_app_with(Config {
        heartbeat_timeout_ms: 1500,
        ..test_config(&nats.url)
    })
    .await;
    let id = app.enqueue(job_on("crew")).await;
    app.fetch(&["crew"], "doomed").await;
    // A worker that never heartbeats is never declared dead (only its reservation counts).
    let r = app
        .post(
            "/ojs/v1/workers/heartbeat",
            json!({"worker_id": "doomed", "active_jobs": [id], "hostname": "h1"}),
        )
        .await;
    assert_eq!(r.status, 200);
    let last_beat = Instant::now();
    let worker = app.get("/ojs/v1/admin/workers/doomed").await;
    assert_eq!(worker.body["worker"]["active_job_ids"], json!([id]));
    assert_eq!(worker.body["worker"]["info"]["hostname"], "h1");
    let job = eventually(Duration::from_secs(5), "dead-worker recovery", || async {
        let j = app.job(&id).await;
        (j["state"] == "available").then_some(j)
    })
    .await;
    let after = last_beat.elapsed();
    println!(
        "dead-worker recovery: job available {after:?} after the last heartbeat (timeout 1.5 s)"
    );
    assert!(
        after >= Duration::from_millis(1400) && after < Duration::from_millis(2500),
        "{after:?}"
    );
    assert_eq!(job["error"]["type"], "worker_death");
    app.get("/ojs/v1/admin/workers/doomed")
        .await
        .assert_error(404, "not_found");
    assert_eq!(app.fetch(&["crew"], "w2").await[0]["id"], id.as_str());
}

#[tokio::test]
async fn operators_quiet_and_terminate_workers_through_heartbeats() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let beat = || {
        app.post(
            "/ojs/v1/workers/heartbeat",
            json!({"worker_id": "w.9/x", "active_jobs": 0, "state": "running"}),
        )
    };
    let r = beat().await;
    assert_eq!(
        (r.body["state"].clone(), r.body["directive"].clone()),
        (json!("running"), json!(""))
    );
    assert!(r.body["server_time"].is_string());
    let r = app
        .post("/ojs/v1/admin/workers/w.9%2Fx/quiet", json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(beat().await.body["state"], "quiet");
    app.post("/ojs/v1/admin/workers/w.9%2Fx/terminate", json!({}))
        .await;
    assert_eq!(beat().await.body["directive"], "terminate");
    // Directives never go back.
    app.post("/ojs/v1/admin/workers/w.9%2Fx/quiet", json!({}))
        .await;
    assert_eq!(beat().await.body["state"], "terminate");
    app.post("/ojs/v1/admin/workers/nobody/quiet", json!({}))
        .await
        .assert_error(404, "not_found");
    app.post("/ojs/v1/workers/heartbeat", json!({"active_jobs": []}))
        .await
        .assert_error(400, "invalid_request");
    app.post(
        "/ojs/v1/workers/heartbeat",
        json!({"worker_id": "w", "active_jobs": "x"}),
    )
    .await
    .assert_error(400, "invalid_request");
}

#[tokio::test]
async fn a_cancelled_job_is_reported_on_the_next_heartbeat() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let id = app.enqueue(job_on("stop")).await;
    app.fetch(&["stop"], "w").await;
    app.delete(&format!("/ojs/v1/jobs/{id}")).await;
    let r = app
        .post(
            "/ojs/v1/workers/heartbeat",
            json!({"worker_id": "w", "active_jobs": [id]}),
        )
        .await;
    assert_eq!(r.body["jobs_cancelled"], json!([id]));
    assert_eq!(r.body["jobs_extended"], json!([]));
}

#[tokio::test]
async fn exhausted_jobs_land_in_the_dead_letter_queue_and_can_be_retried() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let mut ids = Vec::new();
    for queue in ["dl-a", "dl-a", "dl-b"] {
        ids.push(dead_letter_a_job(&app, queue).await);
    }
    // A plain discard is not dead-lettered.
    let plain = app.enqueue(json!({"type": "t.d", "args": [], "options": {"queue": "dl-a", "retry": {"max_attempts": 1}}})).await;
    app.fetch(&["dl-a"], "w").await;
    app.nack(json!({"job_id": plain, "error": {"message": "no"}}))
        .await;

    let all = app.get("/ojs/v1/dead-letter").await;
    assert_eq!(all.status, 200);
    assert_eq!(
        common::job_ids(&all.body["jobs"]),
        [ids[2].as_str(), ids[1].as_str(), ids[0].as_str()],
        "newest first"
    );
    assert_eq!(all.body["pagination"]["total"], 3);
    assert_eq!(all.body["jobs"][0]["errors"].as_array().unwrap().len(), 1);
    let a = app.get("/ojs/v1/dead-letter?queue=dl-a&limit=1").await;
    assert_eq!(a.body["jobs"][0]["id"], ids[1].as_str());
    assert_eq!(a.body["pagination"]["total"], 2);
    assert_eq!(a.body["pagination"]["has_more"], true);
    let a2 = app
        .get("/ojs/v1/dead-letter?queue=dl-a&limit=1&offset=1")
        .await;
    assert_eq!(a2.body["jobs"][0]["id"], ids[0].as_str());
    assert_eq!(
        app.get(&format!("/ojs/v1/dead-letter/{}", ids[0]))
            .await
            .body["job"]["state"],
        "discarded"
    );
    app.get(&format!("/ojs/v1/dead-letter/{plain}"))
        .await
        .assert_error(404, "not_found");

    let r = app
        .post(&format!("/ojs/v1/dead-letter/{}/retry", ids[0]), json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        (
            r.body["job"]["state"].clone(),
            r.body["job"]["attempt"].clone()
        ),
        (json!("available"), json!(0))
    );
    let fetched = app.fetch(&["dl-a"], "w").await;
    assert_eq!(
        (
            fetched[0]["id"].as_str().unwrap(),
            fetched[0]["attempt"].clone()
        ),
        (ids[0].as_str(), json!(1))
    );
    app.post(&format!("/ojs/v1/dead-letter/{}/retry", ids[0]), json!({}))
        .await
        .assert_error(409, "conflict");

    let r = app.delete(&format!("/ojs/v1/dead-letter/{}", ids[1])).await;
    assert_eq!(r.body, json!({"deleted": true, "job_id": ids[1]}));
    app.get(&format!("/ojs/v1/jobs/{}", ids[1]))
        .await
        .assert_error(404, "not_found");
    let left: Vec<String> = app.get("/ojs/v1/dead-letter").await.body["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(left, [ids[2].clone()]);
    app.post(
        "/ojs/v1/dead-letter/019539a4-0000-7000-8000-000000000000/retry",
        json!({}),
    )
    .await
    .assert_error(404, "not_found");
    app.get("/ojs/v1/dead-letter?limit=-1")
        .await
        .assert_error(400, "invalid_request");
}

/// Beyond `dead_letter_max_count` entries the oldest leave the dead letter queue (dead-letter
/// spec §5), also when a restart lowers the limit; a pruned job stays an ordinary discarded
/// job.
#[tokio::test]
async fn dead_letter_retention_keeps_only_the_newest_max_count_jobs() {
    let nats = NatsServer::start();
    let before = spawn_app(&nats.url).await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        ids.push(dead_letter_a_job(&before, "dl-keep").await);
    }
    before.stop().await;
    let app = spawn_app_with(Config {
        dead_letter_max_count: 2,
        ..test_config(&nats.url)
    })
    .await;
    ids.push(dead_letter_a_job(&app, "dl-other").await);
    let all = app.get("/ojs/v1/dead-letter").await;
    assert_eq!(
        common::job_ids(&all.body["jobs"]),
        [ids[2].as_str(), ids[1].as_str()]
    );
    assert_eq!(all.body["pagination"]["total"], 2);
    let one_queue = app.get("/ojs/v1/dead-letter?queue=dl-keep").await;
    assert_eq!(common::job_ids(&one_queue.body["jobs"]), [ids[1].as_str()]);
    assert_eq!(one_queue.body["pagination"]["total"], 1);
    app.get(&format!("/ojs/v1/dead-letter/{}", ids[0]))
        .await
        .assert_error(404, "not_found");
    app.delete(&format!("/ojs/v1/dead-letter/{}", ids[0]))
        .await
        .assert_error(404, "not_found");
    assert_eq!(app.job(&ids[0]).await["state"], "discarded");
    assert_eq!(
        app.get(&format!("/ojs/v1/dead-letter/{}", ids[1]))
            .await
            .status,
        200
    );
    // Like every discarded job, a pruned one can still be retried.
    let r = app
        .post(&format!("/ojs/v1/dead-letter/{}/retry", ids[0]), json!({}))
        .await;
    assert_eq!(r.body["job"]["state"], "available", "{}", r.body);
}

/// Entries older than `dead_letter_max_age_ms` leave the dead letter queue.
#[tokio::test]
async fn dead_letter_retention_prunes_jobs_older_than_max_age() {
    let nats = NatsServer::start();
    let app = spawn_app_with(Config {
        dead_letter_max_age_ms: 1000,
        ..test_config(&nats.url)
    })
    .await;
    let id = dead_letter_a_job(&app, "dl-age").await;
    let path = format!("/ojs/v1/dead-letter/{id}");
    assert_eq!(app.get(&path).await.status, 200);
    let started = Instant::now();
    eventually(Duration::from_secs(10), "the entry's expiry", || async {
        (app.get(&path).await.status == 404).then_some(())
    })
    .await;
    assert!(
        started.elapsed() > Duration::from_millis(500),
        "pruned after {:?}, before its max_age",
        started.elapsed()
    );
    let listed = app.get("/ojs/v1/dead-letter").await;
    assert_eq!(listed.body["jobs"], json!([]));
    assert_eq!(listed.body["pagination"]["total"], 0);
    assert_eq!(app.job(&id).await["state"], "discarded");
}

/// The priority consumer of `queue` (priority 0), read directly from NATS.
async fn lane_consumer(nats: &NatsServer, queue: &str) -> PullConsumer {
    let js = async_nats::jetstream::new(async_nats::connect(&nats.url).await.unwrap());
    js.get_consumer_from_stream("p0", &format!("ojs-q-{queue}"))
        .await
        .unwrap()
}

/// A job delivered to a gateway that died before claiming it can be fetched again after
/// AckWait; a changed `ack_wait_ms` reaches a queue made under the old one. A PUSH makes
/// no consumer (that needs NATS's meta leader); the lane's first FETCH does.
#[tokio::test]
async fn a_delivery_stranded_by_a_dead_gateway_comes_back_after_ack_wait() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    app.enqueue(job_on("stranded")).await;
    let js = async_nats::jetstream::new(async_nats::connect(&nats.url).await.unwrap());
    let names: Vec<String> = js
        .get_stream("ojs-q-stranded")
        .await
        .unwrap()
        .consumer_names()
        .try_collect()
        .await
        .unwrap();
    assert!(names.is_empty(), "{names:?}");
    assert_eq!(app.fetch(&["stranded"], "w").await.len(), 1);
    let mut consumer = lane_consumer(&nats, "stranded").await;
    assert_eq!(
        consumer.info().await.unwrap().config.ack_wait,
        Duration::from_secs(60),
        "the default"
    );
    app.stop().await;

    let app = spawn_app_with(Config {
        ack_wait_ms: 1000,
        ..test_config(&nats.url)
    })
    .await;
    assert!(app.fetch(&["stranded"], "w").await.is_empty());
    assert_eq!(
        consumer.info().await.unwrap().config.ack_wait,
        Duration::from_secs(1),
        "updated by the first fetch under the new setting"
    );
    let stranded = app.enqueue(job_on("stranded")).await;
    let other = app.enqueue(job_on("stranded")).await;

    // What a gateway that dies mid-FETCH leaves: a delivery nobody claims.
    let mut pulled = consumer.fetch().max_messages(1).messages().await.unwrap();
    let msg = pulled.next().await.unwrap().unwrap();
    let body: Value = serde_json::from_slice(&msg.payload).unwrap();
    assert_eq!(body["id"], stranded.as_str());
    drop(pulled);
    let lost_at = Instant::now();

    let fetched = app.fetch(&["stranded"], "w").await;
    assert_eq!(fetched[0]["id"], other.as_str());
    assert!(app.fetch(&["stranded"], "w").await.is_empty());
    let job = eventually(Duration::from_secs(5), "the stranded job", || async {
        app.fetch(&["stranded"], "w").await.pop()
    })
    .await;
    assert!(lost_at.elapsed() >= Duration::from_millis(900));
    assert_eq!(job["id"], stranded.as_str());
    assert_eq!(job["attempt"], 1);
}

/// A job running longer than AckWait keeps its worker: each redelivery of its message only
/// renews the hold, no other worker gets the job, and the worker's ACK settles the message.
#[tokio::test]
async fn a_job_running_longer_than_ack_wait_stays_with_its_worker() {
    let nats = NatsServer::start();
    let app = spawn_app_with(Config {
        ack_wait_ms: 1000,
        ..test_config(&nats.url)
    })
    .await;
    let id = app
        .enqueue(json!({"type": "t.long", "args": [], "options": {"queue": "long", "visibility_timeout_ms": 30000}}))
        .await;
    assert_eq!(app.fetch(&["long"], "w1").await.len(), 1);
    let running = Instant::now();
    while running.elapsed() < Duration::from_millis(3500) {
        assert!(app.fetch(&["long"], "w2").await.is_empty());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut consumer = lane_consumer(&nats, "long").await;
    let deliveries = consumer.info().await.unwrap().delivered.consumer_sequence;
    assert!(deliveries >= 3, "redelivered only {} times", deliveries - 1);
    let job = app.job(&id).await;
    assert_eq!(
        (job["state"].as_str(), job["attempt"].as_i64()),
        (Some("active"), Some(1))
    );

    let r = app.ack(json!({"job_id": id, "worker_id": "w1"})).await;
    assert_eq!(r.body["state"], "completed", "{}", r.body);
    eventually(Duration::from_secs(3), "the message settled", || {
        let mut consumer = consumer.clone();
        async move {
            let info = consumer.info().await.ok()?.clone();
            (info.num_ack_pending == 0 && info.num_pending == 0).then_some(())
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(app.fetch(&["long"], "w2").await.is_empty());
    let after = consumer.info().await.unwrap().delivered.consumer_sequence;
    assert_eq!(after, deliveries, "delivered again after the ACK");
}

/// A DELETE racing a RETRY of the same dead-lettered job: exactly one of them wins, so a job
/// whose retry was answered 200 is never deleted behind the caller's back.
#[tokio::test]
async fn a_dead_letter_delete_racing_a_retry_never_removes_the_retried_job() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let mut ids = Vec::new();
    for _ in 0..40 {
        ids.push(dead_letter_a_job(&app, "dl-race").await);
    }
    let (mut retried, mut deleted) = (0, 0);
    for (i, id) in ids.iter().enumerate() {
        // The DELETE starts a little later each time, so its read and purge fall on
        // every side of the RETRY's write.
        let lag = Duration::from_micros(10 * i as u64);
        let retry_path = format!("/ojs/v1/dead-letter/{id}/retry");
        let retry = app.post(&retry_path, json!({}));
        let delete = async {
            let start = Instant::now();
            while start.elapsed() < lag {
                tokio::task::yield_now().await;
            }
            app.delete(&format!("/ojs/v1/dead-letter/{id}")).await
        };
        let (r, d) = tokio::join!(retry, delete);
        match (r.status.as_u16(), d.status.as_u16()) {
            (200, 404) => {
                assert_eq!(app.job(id).await["state"], "available");
                retried += 1;
            }
            (404, 200) => {
                app.get(&format!("/ojs/v1/jobs/{id}"))
                    .await
                    .assert_error(404, "not_found");
                deleted += 1;
            }
            other => panic!("retry and delete of {id} answered {other:?}"),
        }
    }
    assert!(
        retried > 0 && deleted > 0,
        "the race was not exercised: {retried} retried, {deleted} deleted"
    );
}

/// A client that gives up on a long poll after 200 ms, as a worker's HTTP timeout, crash
/// or deploy does.
async fn fetch_gone_after_200ms(app: &common::TestApp, queue: &str) {
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let body = json!({"queues": [queue], "wait_ms": 8000, "worker_id": "w-gone"});
    let sent = impatient
        .post(app.url("/ojs/v1/workers/fetch"))
        .json(&body)
        .send()
        .await;
    assert!(sent.is_err(), "the long poll answered within 200 ms");
}

#[tokio::test]
async fn a_long_poll_whose_client_went_away_claims_nothing_for_it() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    app.enqueue(job_on("left")).await;
    app.fetch(&["left"], "w0").await;
    fetch_gone_after_200ms(&app, "left").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let id = app.enqueue(job_on("left")).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(app.job(&id).await["state"], "available");
    let r = app
        .post(
            "/ojs/v1/workers/fetch",
            json!({"queues": ["left"], "wait_ms": 2000, "worker_id": "w-next"}),
        )
        .await;
    assert_eq!(common::job_ids(&r.body["jobs"]), [id.as_str()]);
    assert_eq!(r.body["jobs"][0]["attempt"], 1);
}

#[tokio::test]
async fn a_job_claimed_as_its_client_went_away_goes_straight_back_attempt_uncounted() {
    let nats = NatsServer::start();
    // The claim is written, then held 600 ms before the answer: the client is gone by then.
    let app = spawn_app_with(Config {
        failpoints: "fetch.claimed=delay(600)".into(),
        ..test_config(&nats.url)
    })
    .await;
    let id = app.enqueue(job_on("instant")).await;
    fetch_gone_after_200ms(&app, "instant").await;
    let back = eventually(Duration::from_secs(3), "the job handed back", || async {
        let job = app.job(&id).await;
        (job["state"] == "available").then_some(job)
    })
    .await;
    assert_eq!(back["attempt"], 0);
    let r = app
        .post(
            "/ojs/v1/workers/fetch",
            json!({"queues": ["instant"], "worker_id": "w-next"}),
        )
        .await;
    let jobs = r.body["jobs"].as_array().unwrap();
    assert_eq!(common::job_ids(&r.body["jobs"]), [id.as_str()]);
    assert_eq!(jobs[0]["attempt"], 1);
}

/// Fails every job of `queue` (`n` of them, enqueued in batches) into the dead letter queue.
async fn dead_letter_many(app: &common::TestApp, queue: &str, n: usize) {
    let job = json!({"type": "t.d", "args": [], "options": {"queue": queue,
        "retry": {"max_attempts": 1, "on_exhaustion": "dead_letter"}}});
    for chunk in 0..n.div_ceil(1000) {
        let jobs = vec![job.clone(); (n - chunk * 1000).min(1000)];
        let r = app
            .post("/ojs/v1/jobs/batch", json!({ "jobs": jobs }))
            .await;
        assert_eq!(r.status, 201, "{}", r.body);
        let r = app
            .post(
                "/ojs/v1/workers/fetch",
                json!({"queues": [queue], "count": 1000}),
            )
            .await;
        let ids: Vec<String> = common::job_ids(&r.body["jobs"])
            .iter()
            .map(|s| s.to_string())
            .collect();
        futures::stream::iter(ids)
            .for_each_concurrent(32, |id| async move {
                let r = app
                    .nack(json!({"job_id": id, "error": {"message": "no"}}))
                    .await;
                assert_eq!(r.body["state"], "discarded", "{}", r.body);
            })
            .await;
    }
}

#[tokio::test]
async fn every_dead_lettered_job_is_reachable_by_paging_and_deep_pages_are_quick() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    dead_letter_many(&app, "deep", 6_000).await;
    dead_letter_many(&app, "beside", 300).await;
    for (query, total) in [("queue=deep&", 6_000), ("", 6_300)] {
        let mut seen = std::collections::HashSet::new();
        let mut offset = 0;
        loop {
            let started = Instant::now();
            let r = app
                .get(&format!(
                    "/ojs/v1/dead-letter?{query}limit=1000&offset={offset}"
                ))
                .await;
            assert!(
                started.elapsed() < Duration::from_secs(3),
                "{query}{offset}: {:?}",
                started.elapsed()
            );
            assert_eq!(r.status, 200, "{}", r.body);
            assert_eq!(r.body["pagination"]["total"], total);
            let ids = common::job_ids(&r.body["jobs"]);
            assert_eq!(
                ids.len(),
                1000.min(total - offset),
                "{query}offset {offset}"
            );
            seen.extend(ids.iter().map(|s| s.to_string()));
            offset += 1000;
            assert_eq!(
                r.body["pagination"]["has_more"],
                offset < total,
                "{query}{offset}"
            );
            if offset >= total {
                break;
            }
        }
        assert_eq!(seen.len(), total, "{query}every entry once");
    }
}
