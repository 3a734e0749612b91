//! Level 4 queues through the HTTP API on a real nats-server, with two gateways: pause and
//! resume seen by every replica (also by FETCHes already waiting), statistics exact for the
//! client that just wrote, exact priority order at size, weighted queue order, and
//! per-queue rate and concurrency limits held across replicas.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{eventually, spawn_app, spawn_app_with, test_config, ts, NatsServer, TestApp};
use serde_json::{json, Value};

fn job(queue: &str, options: Value) -> Value {
    let mut options = options;
    options["queue"] = json!(queue);
    json!({"type": "t.x", "args": [], "options": options})
}

async fn stats(app: &TestApp, queue: &str) -> Value {
    let r = app.get(&format!("/ojs/v1/queues/{queue}/stats")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.body
}

#[tokio::test]
async fn a_pause_stops_every_replica_within_100_ms_and_a_resume_restarts_them_in_order() {
    let nats = NatsServer::start();
    let a = spawn_app(&nats.url).await;
    let b = spawn_app(&nats.url).await;
    let first = a.enqueue(job("p", json!({}))).await;

    // A worker long-polling through B while A pauses the queue.
    let waiting = {
        let b = b.client();
        tokio::spawn(async move {
            b.post(
                "/ojs/v1/workers/fetch",
                json!({"queues": ["other", "p"], "worker_id": "w", "wait_ms": 3000}),
            )
            .await
        })
    };
    // The queue had a job: the waiting FETCH took it at once. The next one waits.
    let got = waiting.await.unwrap();
    assert_eq!(got.body["jobs"][0]["id"], first.as_str());
    let waiting = {
        let b = b.client();
        tokio::spawn(async move {
            let r = b
                .post(
                    "/ojs/v1/workers/fetch",
                    json!({"queues": ["p"], "worker_id": "w", "wait_ms": 2000}),
                )
                .await;
            r.body["jobs"].as_array().unwrap().len()
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;

    let r = a.post("/ojs/v1/queues/p/pause", json!({})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["queue"]["paused"], true);
    assert_eq!(r.body["queue"]["status"], "paused");
    let paused = Instant::now();
    let seen = eventually(Duration::from_secs(1), "B sees the pause", || async {
        let list = b.get("/ojs/v1/queues").await.body;
        let p = list["queues"]
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["name"] == "p")
            .cloned();
        p.filter(|q| q["paused"] == true).map(|_| paused.elapsed())
    })
    .await;
    eprintln!("the other replica saw the pause {seen:?} after the answer");
    assert!(
        seen < Duration::from_millis(100),
        "B saw the pause after {seen:?}"
    );

    // Jobs are accepted while paused, and handed out by no replica.
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(a.enqueue(job("p", json!({}))).await);
    }
    assert!(a.fetch(&["p"], "w").await.is_empty());
    assert!(b.fetch(&["p"], "w").await.is_empty());
    assert_eq!(
        waiting.await.unwrap(),
        0,
        "the waiting FETCH got a paused queue's job"
    );
    assert_eq!(stats(&b, "p").await["queue"]["paused"], true);

    // Idempotent; resumed through the other replica, the jobs come in FIFO order.
    assert_eq!(
        b.post("/ojs/v1/queues/p/pause", json!({})).await.status,
        200
    );
    let r = b.post("/ojs/v1/queues/p/resume", json!({})).await;
    assert_eq!(r.body["queue"]["paused"], false);
    assert_eq!(r.body["queue"]["status"], "active");
    for id in &ids {
        let got = eventually(
            Duration::from_secs(1),
            "the resumed queue's job",
            || async { a.fetch(&["p"], "w").await.into_iter().next() },
        )
        .await;
        assert_eq!(got["id"], id.as_str());
    }

    // A queue never seen can be paused, and both changes are events.
    let r = a.post("/ojs/v1/queues/never.seen/pause", json!({})).await;
    assert_eq!(r.body["queue"]["name"], "never.seen");
    let events = eventually(Duration::from_secs(2), "queue events", || async {
        let e = a
            .get("/ojs/v1/events?types=queue.paused,queue.resumed&limit=100")
            .await
            .body["events"]
            .clone();
        (e.as_array().unwrap().len() >= 3).then_some(e)
    })
    .await;
    let seen: Vec<(String, String)> = events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap().to_owned(),
                e["data"]["queue"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("queue.paused".to_owned(), "p".to_owned()),
            ("queue.resumed".to_owned(), "p".to_owned()),
            ("queue.paused".to_owned(), "never.seen".to_owned()),
        ],
        "the repeated pause is the same event"
    );

    // Bad names are refused; stats of a queue never seen are 404.
    a.post("/ojs/v1/queues/Bad!/pause", json!({}))
        .await
        .assert_error(400, "invalid_request");
    a.get("/ojs/v1/queues/nothing-here/stats")
        .await
        .assert_error(404, "not_found");
}

#[tokio::test]
async fn stats_equal_a_count_by_hand_after_a_mixed_workload_through_two_replicas() {
    let nats = NatsServer::start();
    let a = spawn_app(&nats.url).await;
    let b = spawn_app(&nats.url).await;
    let q = "mixed";
    let later = json!({"scheduled_at": "+PT1H"});
    let slow_retry = json!({"retry": {"max_attempts": 5, "initial_interval": "PT1H"}});
    let dead = json!({"retry": {"max_attempts": 1, "on_exhaustion": "dead_letter"}});
    for i in 0..40 {
        let app = if i % 2 == 0 { &a } else { &b };
        let options = match i {
            0..=9 => slow_retry.clone(),
            10..=12 => dead.clone(),
            _ => json!({}),
        };
        app.enqueue(job(q, options)).await;
    }
    for _ in 0..10 {
        a.enqueue(job(q, later.clone())).await;
    }
    for _ in 0..5 {
        b.enqueue(job(q, json!({"pending": true}))).await;
    }
    let batch: Vec<Value> = (0..100).map(|_| job(q, json!({}))).collect();
    assert_eq!(
        a.post("/ojs/v1/jobs/batch", json!({"jobs": batch}))
            .await
            .status,
        201
    );
    // 140 available. Fetch 20 in enqueue order: the 10 slow retries, the 3 dead-letter
    // jobs and 7 plain ones.
    let mut fetched = Vec::new();
    for i in 0..20 {
        let app = if i % 2 == 0 { &b } else { &a };
        fetched.push(
            app.fetch(&[q], "w").await[0]["id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    for id in &fetched[0..5] {
        let r = a
            .nack(json!({"job_id": id, "error": {"code": "e", "message": "again"}}))
            .await;
        assert_eq!(r.body["state"], "retryable");
    }
    for id in &fetched[10..13] {
        let r = b
            .nack(json!({"job_id": id, "error": {"code": "e", "message": "dead"}}))
            .await;
        assert_eq!(r.body["state"], "discarded");
    }
    for id in &fetched[13..20] {
        assert_eq!(
            a.ack(json!({"job_id": id})).await.body["state"],
            "completed"
        );
    }
    // Four more jobs enqueued and cancelled, one dead-lettered job retried.
    for _ in 0..4 {
        let id = b.enqueue(job(q, json!({}))).await;
        assert_eq!(
            a.delete(&format!("/ojs/v1/jobs/{id}")).await.body["job"]["state"],
            "cancelled"
        );
    }
    let r = b
        .post(
            &format!("/ojs/v1/dead-letter/{}/retry", fetched[10]),
            json!({}),
        )
        .await;
    assert_eq!(r.body["job"]["state"], "available");

    // By hand: 140 + 4 enqueued available − 20 fetched − 4 cancelled + 1 retried.
    let expected = json!({
        "available": 121, "active": 5, "completed": 7, "retryable": 5, "discarded": 2,
        "dead": 2, "scheduled": 10, "pending": 5, "cancelled": 4,
    });
    // Read at once, through either replica: exact for the writes just made.
    for app in [&a, &b] {
        let s = stats(app, q).await;
        for (state, n) in expected.as_object().unwrap() {
            assert_eq!(s["queue"][state], *n, "{state} in {s}");
            assert_eq!(s["stats"][state], *n, "{state} in {s}");
            assert_eq!(s[state], *n, "{state} in {s}");
        }
        assert_eq!(s["queue"]["name"], q);
        assert_eq!(s["status"], "active");
    }
}

/// A job handed out: when its FETCH began and ended, its priority and enqueue order.
type Fetched = (Instant, Instant, i64, u64);

#[tokio::test]
async fn ten_priorities_and_ten_thousand_jobs_come_out_in_order_through_two_replicas() {
    let nats = NatsServer::start();
    let a = spawn_app(&nats.url).await;
    let b = spawn_app(&nats.url).await;
    let q = "ranked";
    // Priorities -45..=45 in steps of 10, mixed; the job's place in enqueue order is its arg.
    let mut order = 0u64;
    for chunk in 0..10 {
        let jobs: Vec<Value> = (0..1000)
            .map(|i| {
                let priority = ((i * 7 + chunk * 3) % 10) as i64 * 10 - 45;
                order += 1;
                json!({"type": "t.x", "args": [order], "options": {"queue": q, "priority": priority}})
            })
            .collect();
        let r = a.post("/ojs/v1/jobs/batch", json!({"jobs": jobs})).await;
        assert_eq!(r.status, 201, "{}", r.body);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;

    // 16 workers, 8 per replica.
    let fetched: Arc<Mutex<Vec<Fetched>>> = Arc::default();
    let mut workers = Vec::new();
    for w in 0..16 {
        let app = if w % 2 == 0 { a.client() } else { b.client() };
        let fetched = fetched.clone();
        workers.push(tokio::spawn(async move {
            loop {
                let began = Instant::now();
                let jobs = app.fetch(&[q], &format!("w{w}")).await;
                let ended = Instant::now();
                let Some(job) = jobs.into_iter().next() else {
                    break;
                };
                fetched.lock().unwrap().push((
                    began,
                    ended,
                    job["priority"].as_i64().unwrap(),
                    job["args"][0].as_u64().unwrap(),
                ));
                let r = app.ack(json!({"job_id": job["id"]})).await;
                assert_eq!(r.status, 200);
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    let mut fetched = fetched.lock().unwrap().clone();
    assert_eq!(fetched.len(), 10_000);
    // A FETCH that ended before another began got a job that ranks before it: a higher
    // priority, or the same one enqueued earlier. (Overlapping FETCHes race fairly.)
    let rank = |p: i64, o: u64| (-p, o as i64);
    fetched.sort_by_key(|f| f.1);
    let mut best_before: Vec<(i64, i64)> = Vec::with_capacity(fetched.len());
    for f in &fetched {
        let r = rank(f.2, f.3);
        best_before.push(best_before.last().map_or(r, |b: &(i64, i64)| (*b).max(r)));
    }
    let mut inversions = 0;
    for g in &fetched {
        let before = fetched.partition_point(|f| f.1 < g.0);
        if before > 0 && best_before[before - 1] > rank(g.2, g.3) {
            inversions += 1;
        }
    }
    assert_eq!(
        inversions, 0,
        "jobs handed out after a later-ranked one had been"
    );
}

/// 64 workers through two gateways drain a queue limited to 50 starts a second: over 10 s
/// the rate is the limit within 10 %, and no second holds more than the limit and one
/// burst.
#[tokio::test]
async fn a_rate_limit_holds_across_two_replicas_and_64_workers() {
    let nats = NatsServer::start();
    let a = spawn_app(&nats.url).await;
    let b = spawn_app(&nats.url).await;
    let q = "limited";
    const LIMIT: usize = 50;
    let jobs: Vec<Value> = (0..1500)
        .map(|_| job(q, json!({"rate_limit": {"max_per_second": LIMIT}})))
        .collect();
    assert_eq!(
        a.post("/ojs/v1/jobs/batch", json!({"jobs": jobs}))
            .await
            .status,
        201
    );
    tokio::time::sleep(Duration::from_millis(100)).await;

    let starts: Arc<Mutex<Vec<chrono::DateTime<chrono::Utc>>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..64 {
        let app = if w % 2 == 0 { a.client() } else { b.client() };
        let (starts, stop) = (starts.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let r = app
                    .post(
                        "/ojs/v1/workers/fetch",
                        json!({"queues": [q], "worker_id": format!("w{w}"), "wait_ms": 500}),
                    )
                    .await;
                assert_eq!(r.status, 200, "{}", r.body);
                for job in r.body["jobs"].as_array().unwrap() {
                    starts.lock().unwrap().push(ts(&job["started_at"]));
                    app.ack(json!({"job_id": job["id"]})).await;
                }
            }
        }));
    }
    // Workers run past the measured 10 s on both sides.
    tokio::time::sleep(Duration::from_secs(12)).await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    let mut starts = starts.lock().unwrap().clone();
    starts.sort();
    // The 10 s after the first second (the first window may hold a full burst at once).
    let from = starts[0] + chrono::Duration::seconds(1);
    let to = from + chrono::Duration::seconds(10);
    let in_ten = starts.iter().filter(|t| **t >= from && **t < to).count();
    let expected = LIMIT * 10;
    assert!(
        in_ten.abs_diff(expected) <= expected / 10,
        "{in_ten} starts in 10 s, the limit allows {expected}"
    );
    // No window of one second holds more than the limit and one burst more.
    let most = starts
        .iter()
        .enumerate()
        .map(|(i, t)| starts[i..].partition_point(|u| *u < *t + chrono::Duration::seconds(1)))
        .max()
        .unwrap();
    assert!(most <= 2 * LIMIT, "{most} starts within one second");
    eprintln!("rate limit {LIMIT}/s: {in_ten} starts in 10 s, at most {most} in any second");
    // Jobs of other queues are not limited.
    let other: Vec<Value> = (0..200).map(|_| job("free", json!({}))).collect();
    a.post("/ojs/v1/jobs/batch", json!({"jobs": other})).await;
    let started = Instant::now();
    for _ in 0..200 {
        assert_eq!(b.fetch(&["free"], "w").await.len(), 1);
    }
    assert!(started.elapsed() < Duration::from_secs(4));
}

/// A weighted FETCH over three full queues (weights 5, 2, 1) takes from each in its share
/// of the weights, and none starves; without a strategy the first listed queue always wins.
#[tokio::test]
async fn a_weighted_fetch_takes_from_each_queue_in_its_share_of_the_weights() {
    let nats = NatsServer::start();
    let a = spawn_app(&nats.url).await;
    let b = spawn_app(&nats.url).await;
    for q in ["critical", "default", "low"] {
        let jobs: Vec<Value> = (0..800).map(|_| job(q, json!({}))).collect();
        let r = a.post("/ojs/v1/jobs/batch", json!({"jobs": jobs})).await;
        assert_eq!(r.status, 201, "{}", r.body);
    }
    let strict = json!({"queues": ["low", "critical"], "worker_id": "w"});
    for _ in 0..20 {
        let r = b.post("/ojs/v1/workers/fetch", strict.clone()).await;
        assert_eq!(r.body["jobs"][0]["queue"], "low", "{}", r.body);
    }
    let weighted = json!({
        "queues": [{"name": "critical", "weight": 5}, {"name": "default", "weight": 2}, "low"],
        "strategy": "weighted",
        "worker_id": "w",
    });
    let mut taken = std::collections::HashMap::new();
    for i in 0..800 {
        let app = if i % 2 == 0 { &a } else { &b };
        let r = app.post("/ojs/v1/workers/fetch", weighted.clone()).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let queue = r.body["jobs"][0]["queue"].as_str().unwrap().to_owned();
        *taken.entry(queue).or_insert(0usize) += 1;
    }
    eprintln!("weighted 5/2/1 over 800 FETCHes: {taken:?}");
    // Expected 500/200/100; six standard deviations of the draw at most apart.
    for (queue, share) in [("critical", 500), ("default", 200), ("low", 100)] {
        let got = taken.get(queue).copied().unwrap_or(0);
        assert!(
            got.abs_diff(share) <= 80,
            "{queue}: {got} of 800, expected about {share}"
        );
    }
    a.post(
        "/ojs/v1/workers/fetch",
        json!({"queues": ["low"], "strategy": "random"}),
    )
    .await
    .assert_error(400, "invalid_request");
}

/// A queue limited to 5 running jobs, drained by 64 workers through two gateways, each job
/// held 100 ms: never more than 5 run at once (the time between a FETCH's answer and the
/// ACK's request lies within the job's running place), and 5 do.
#[tokio::test]
async fn a_concurrency_limit_holds_across_two_replicas_and_64_workers() {
    let nats = NatsServer::start();
    let a = spawn_app(&nats.url).await;
    let b = spawn_app(&nats.url).await;
    const LIMIT: usize = 5;
    const JOBS: usize = 100;
    let jobs: Vec<Value> = (0..JOBS)
        .map(|_| job("capped", json!({"rate_limit": {"concurrency": LIMIT}})))
        .collect();
    let r = a.post("/ojs/v1/jobs/batch", json!({"jobs": jobs})).await;
    assert_eq!(r.status, 201, "{}", r.body);

    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let until = Instant::now() + Duration::from_secs(30);
    let mut workers = Vec::new();
    for w in 0..64 {
        let app = if w % 2 == 0 { a.client() } else { b.client() };
        let (running, most, done) = (running.clone(), most.clone(), done.clone());
        workers.push(tokio::spawn(async move {
            while done.load(Ordering::SeqCst) < JOBS && Instant::now() < until {
                let r = app
                    .post(
                        "/ojs/v1/workers/fetch",
                        json!({"queues": ["capped"], "worker_id": format!("w{w}"), "wait_ms": 300}),
                    )
                    .await;
                assert_eq!(r.status, 200, "{}", r.body);
                for job in r.body["jobs"].as_array().unwrap() {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    running.fetch_sub(1, Ordering::SeqCst);
                    let r = app.ack(json!({"job_id": job["id"]})).await;
                    assert_eq!(r.status, 200, "{}", r.body);
                    done.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    eprintln!("concurrency limit {LIMIT}: at most {most} jobs ran at once");
    assert_eq!(done.load(Ordering::SeqCst), JOBS, "every job ran");
    assert_eq!(
        most, LIMIT,
        "never more than the limit at once, and the limit reached"
    );
}

/// A running place whose job never took it (a gateway that died between the place and
/// the job's record) is freed by the leader once older than any claim on its way, so it
/// does not hold the queue back for good.
#[tokio::test]
async fn a_running_place_left_by_a_dead_claim_is_freed_by_the_leader() {
    let nats = NatsServer::start();
    let app = spawn_app_with(ojs_jetstream::config::Config {
        nats_timeout_ms: 1000,
        ..test_config(&nats.url)
    })
    .await;
    let id = app
        .enqueue(job("single", json!({"rate_limit": {"concurrency": 1}})))
        .await;
    // The dead claim's place, as a FETCH stores it before its record write.
    let js = async_nats::jetstream::new(async_nats::connect(&nats.url).await.unwrap());
    let orphan = json!({"id": "019539a4-0000-7000-8000-000000000000", "dispatch": 1});
    js.publish("ojs.slot.single", orphan.to_string().into())
        .await
        .unwrap()
        .await
        .unwrap();
    let taken = Instant::now();
    let fetch = json!({"queues": ["single"], "worker_id": "w", "wait_ms": 1000});
    let r = app.post("/ojs/v1/workers/fetch", fetch.clone()).await;
    assert_eq!(
        r.body["jobs"],
        json!([]),
        "the only place is taken: {}",
        r.body
    );
    let handed = eventually(Duration::from_secs(20), "the place freed", || async {
        let r = app.post("/ojs/v1/workers/fetch", fetch.clone()).await;
        r.body["jobs"][0]["id"].as_str().map(str::to_owned)
    })
    .await;
    assert_eq!(handed, id);
    // Not before the grace: 10 s of FETCH wait and two NATS timeouts.
    assert!(
        taken.elapsed() >= Duration::from_secs(12),
        "{:?}",
        taken.elapsed()
    );
    eprintln!(
        "a left-over place was freed {:?} after it was taken",
        taken.elapsed()
    );
}

/// An operator's override (rate-limiting spec §10.2) rules every replica at once: a zero
/// holds a concurrency-limited queue back until it expires, then the queue's own limit
/// applies and the leader clears the override; a higher one lets more run until removed.
/// The command line's and the admin UI's forms are read too.
#[tokio::test]
async fn an_override_holds_a_queue_everywhere_until_it_expires_or_is_removed() {
    let nats = NatsServer::start();
    let a = spawn_app(&nats.url).await;
    let b = spawn_app(&nats.url).await;
    let jobs: Vec<Value> = (0..6)
        .map(|_| job("ovr", json!({"rate_limit": {"concurrency": 2}})))
        .collect();
    let r = a.post("/ojs/v1/jobs/batch", json!({"jobs": jobs})).await;
    assert_eq!(r.status, 201, "{}", r.body);
    let fetch =
        |count: usize| json!({"queues": ["ovr"], "worker_id": "w", "count": count, "wait_ms": 300});

    // A zero for 3 s, set through one gateway: no FETCH through the other hands out work.
    let ends = chrono::Utc::now() + chrono::Duration::seconds(3);
    let r = a
        .put(
            "/ojs/v1/rate-limits/ovr",
            json!({"concurrency": 0, "expires_at": ends.to_rfc3339()}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["override"]["concurrency"], 0, "{}", r.body);
    assert_eq!(r.body["concurrency"]["limit"], 0, "{}", r.body);
    eventually(Duration::from_secs(2), "the override seen by b", || async {
        let r = b.get("/ojs/v1/rate-limits/ovr").await;
        r.body.get("override").map(drop)
    })
    .await;
    let r = b.post("/ojs/v1/workers/fetch", fetch(5)).await;
    assert_eq!(r.body["jobs"], json!([]), "held: {}", r.body);

    // Expired: the queue's own 2, and the leader clears the override.
    let taken = eventually(Duration::from_secs(6), "jobs after the expiry", || async {
        let r = b.post("/ojs/v1/workers/fetch", fetch(5)).await;
        let jobs = r.body["jobs"].as_array().cloned().unwrap_or_default();
        (!jobs.is_empty()).then_some(jobs)
    })
    .await;
    assert!(
        chrono::Utc::now() >= ends,
        "not before expires_at: {taken:?}"
    );
    let mut running: Vec<Value> = taken;
    let r = a.post("/ojs/v1/workers/fetch", fetch(5)).await;
    running.extend(r.body["jobs"].as_array().unwrap().iter().cloned());
    assert_eq!(running.len(), 2, "the queue's own limit: {running:?}");
    eventually(
        Duration::from_secs(3),
        "the expired override cleared",
        || async {
            let r = a.get("/ojs/v1/rate-limits/ovr").await;
            r.body.get("override").is_none().then_some(())
        },
    )
    .await;

    // A higher one, in the command line's form: two more run beside the two.
    let r = b
        .put(
            "/ojs/v1/rate-limits/ovr/override",
            json!({"concurrency": 4}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["concurrency"]["limit"], 4, "{}", r.body);
    let more = eventually(Duration::from_secs(2), "two more running", || async {
        let r = a.post("/ojs/v1/workers/fetch", fetch(5)).await;
        let jobs = r.body["jobs"].as_array().cloned().unwrap_or_default();
        (!jobs.is_empty()).then_some(jobs)
    })
    .await;
    running.extend(more);
    let r = a.post("/ojs/v1/workers/fetch", fetch(5)).await;
    running.extend(r.body["jobs"].as_array().unwrap().iter().cloned());
    assert_eq!(running.len(), 4, "the override's limit: {running:?}");
    eventually(Duration::from_secs(2), "the override seen by a", || async {
        let r = a.get("/ojs/v1/rate-limits/ovr").await;
        r.body.get("override").map(drop)
    })
    .await;

    // Removed: the queue's own limit again; nothing starts until the running end.
    let r = a.delete("/ojs/v1/rate-limits/ovr/override").await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["removed"], true, "{}", r.body);
    assert!(r.body.get("override").is_none(), "{}", r.body);
    assert_eq!(r.body["concurrency"]["limit"], 2, "{}", r.body);
    let r = a.delete("/ojs/v1/rate-limits/ovr/override").await;
    assert_eq!(r.body["removed"], false, "once: {}", r.body);
    eventually(Duration::from_secs(2), "the removal seen by b", || async {
        let r = b.get("/ojs/v1/rate-limits/ovr").await;
        r.body.get("override").is_none().then_some(())
    })
    .await;
    let r = b.post("/ojs/v1/workers/fetch", fetch(5)).await;
    assert_eq!(
        r.body["jobs"],
        json!([]),
        "four run, two allowed: {}",
        r.body
    );
    for job in &running {
        let r = a.ack(json!({"job_id": job["id"]})).await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let r = b.post("/ojs/v1/workers/fetch", fetch(5)).await;
    assert_eq!(r.body["jobs"].as_array().unwrap().len(), 2, "{}", r.body);

    // The admin UI's form: a rate, shown flat for its badge.
    let r = a
        .put(
            "/ojs/v1/rate-limits/ovr",
            json!({"limit": 100, "period": "1m"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["override"]["limit"], 100, "{}", r.body);
    assert_eq!(r.body["override"]["period"], "1m", "{}", r.body);
    assert_eq!(r.body["rate"]["period"], "PT1M", "{}", r.body);
    assert_eq!(
        r.body["concurrency"]["limit"], 2,
        "its own concurrency stays: {}",
        r.body
    );
    // Removed through the gateway that set it: the answer and every read after agree.
    let r = a.delete("/ojs/v1/rate-limits/ovr/override").await;
    assert_eq!(r.body["removed"], true, "{}", r.body);
    assert!(r.body.get("override").is_none(), "{}", r.body);
    let r = a.get("/ojs/v1/rate-limits/ovr").await;
    assert!(r.body.get("override").is_none(), "{}", r.body);

    // Bad input and unknown queues.
    let r = a
        .put("/ojs/v1/rate-limits/ovr", json!({"concurrency": -1}))
        .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(
        r.body["error"]["details"]["field"], "concurrency",
        "{}",
        r.body
    );
    let r = a
        .put("/ojs/v1/rate-limits/never-seen", json!({"concurrency": 1}))
        .await;
    assert_eq!(r.status, 404, "{}", r.body);
}

/// `DELETE /ojs/v1/queues/{name}` (the command line's `queues --delete`): refused while the
/// queue holds unfinished jobs; once empty, no longer listed, and a PUSH brings it back.
/// The leader removes a deleted queue's entry once no job can be on its way, and brings
/// the queue back instead when a message reached its stream after all.
#[tokio::test]
async fn a_queue_is_deleted_only_when_empty_and_comes_back_with_a_job() {
    let nats = NatsServer::start();
    let app = spawn_app_with(ojs_jetstream::config::Config {
        request_deadline_ms: 1_000,
        batch_grace_ms: 1_000,
        nats_timeout_ms: 500,
        ..test_config(&nats.url)
    })
    .await;
    let listed = |app: &TestApp| {
        let app = app.client();
        async move {
            let r = app.get("/ojs/v1/queues").await;
            r.body["queues"]
                .as_array()
                .unwrap()
                .iter()
                .map(|q| q["name"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        }
    };
    let id = app.enqueue(job("del", json!({}))).await;
    let r = app.delete("/ojs/v1/queues/del").await;
    r.assert_error(409, "conflict");
    assert_eq!(r.body["error"]["details"]["available"], 1, "{}", r.body);
    let jobs = app.fetch(&["del"], "w").await;
    assert_eq!(app.ack(json!({"job_id": jobs[0]["id"]})).await.status, 200);
    let r = app.delete("/ojs/v1/queues/del").await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["deleted"], true);
    assert!(!listed(&app).await.contains(&"del".to_owned()));
    app.delete("/ojs/v1/queues/del")
        .await
        .assert_error(404, "not_found");
    assert_eq!(
        app.job(&id).await["state"],
        "completed",
        "its finished jobs stay"
    );

    // A PUSH brings it back, and its job is served.
    let again = app.enqueue(job("del", json!({}))).await;
    assert!(listed(&app).await.contains(&"del".to_owned()));
    assert_eq!(app.fetch(&["del"], "w").await[0]["id"], again);

    // Deleted and left alone: the leader removes its entry after the grace (2 s here).
    app.enqueue(job("gone", json!({}))).await;
    let jobs = app.fetch(&["gone"], "w").await;
    app.ack(json!({"job_id": jobs[0]["id"]})).await;
    assert_eq!(app.delete("/ojs/v1/queues/gone").await.status, 200);
    let js = async_nats::jetstream::new(async_nats::connect(&nats.url).await.unwrap());
    let registry = js.get_key_value("ojs-queues").await.unwrap();
    eventually(Duration::from_secs(10), "the entry removed", || async {
        registry.get("gone").await.unwrap().is_none().then_some(())
    })
    .await;
    assert!(!listed(&app).await.contains(&"gone".to_owned()));

    // A message that reached a deleted queue's stream (a PUSH that had read the entry
    // before the deletion) brings the queue back instead.
    app.enqueue(job("late", json!({}))).await;
    let jobs = app.fetch(&["late"], "w").await;
    app.ack(json!({"job_id": jobs[0]["id"]})).await;
    assert_eq!(app.delete("/ojs/v1/queues/late").await.status, 200);
    js.publish("ojs.q.late.0", "late".into())
        .await
        .unwrap()
        .await
        .unwrap();
    eventually(Duration::from_secs(10), "the queue back", || async {
        listed(&app)
            .await
            .contains(&"late".to_owned())
            .then_some(())
    })
    .await;
    assert!(registry.get("late").await.unwrap().is_some());
}
