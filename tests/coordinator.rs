//! The coordinator under load and failure: timer lateness, jobs in backoff not stalling a
//! queue, and leader failover across gateway processes. Run one at a time, so the numbers
//! they print are not skewed by each other.

use crate::common;

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use common::{eventually, job_on, spawn_app, ts, GatewayProcess, NatsServer};
use futures::{stream, StreamExt};
use serde_json::{json, Value};

/// Enqueues `n` jobs on `queue` in batches of 1000 and claims them all.
async fn claimed_jobs(app: &common::TestApp, queue: &str, n: usize, retry: Value) -> Vec<String> {
    for chunk in 0..n.div_ceil(1000) {
        let size = (n - chunk * 1000).min(1000);
        let jobs: Vec<_> = (0..size).map(|i| json!({"type": "t.c", "args": [i], "options": {"queue": queue, "retry": retry}})).collect();
        assert_eq!(
            app.post("/ojs/v1/jobs/batch", json!({"jobs": jobs}))
                .await
                .status,
            201
        );
    }
    let mut ids = Vec::new();
    while ids.len() < n {
        let r = app
            .post(
                "/ojs/v1/workers/fetch",
                json!({"queues": [queue], "count": 1000, "worker_id": "w"}),
            )
            .await;
        let got = r.body["jobs"].as_array().unwrap();
        assert!(!got.is_empty(), "only {} of {n} claimed", ids.len());
        ids.extend(got.iter().map(|j| j["id"].as_str().unwrap().to_string()));
    }
    ids
}

/// Fails every job, 32 at a time; returns each job's due time.
async fn fail_all(app: &common::TestApp, ids: &[String]) -> Vec<(String, DateTime<Utc>)> {
    stream::iter(ids.iter().cloned())
        .map(|id| async move {
            let r = app
                .nack(json!({"job_id": id, "error": {"code": "e", "message": "again"}}))
                .await;
            assert_eq!(r.body["state"], "retryable", "{}", r.body);
            (id, ts(&r.body["next_attempt_at"]))
        })
        .buffer_unordered(32)
        .collect()
        .await
}

/// How late each job became available after its due time, in ms, sorted; every job must
/// be available by now.
async fn promotion_lateness(app: &common::TestApp, due: Vec<(String, DateTime<Utc>)>) -> Vec<i64> {
    let mut lateness: Vec<i64> = stream::iter(due)
        .map(|(id, due)| async move {
            let job = app.job(&id).await;
            assert_eq!(job["state"], "available", "{job}");
            (ts(&job["enqueued_at"]) - due).num_milliseconds()
        })
        .buffer_unordered(32)
        .collect()
        .await;
    lateness.sort_unstable();
    lateness
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::test]
async fn a_thousand_retries_come_due_within_100_ms() {
    let _measuring = common::measuring();
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let ids = claimed_jobs(
        &app,
        "backoff",
        1000,
        json!({"initial_interval": "PT0.5S", "jitter": false}),
    )
    .await;
    let due = fail_all(&app, &ids).await;
    let last_due = due.iter().map(|(_, d)| *d).max().unwrap();
    tokio::time::sleep(
        (last_due - Utc::now()).to_std().unwrap_or_default() + Duration::from_millis(500),
    )
    .await;
    let lateness = promotion_lateness(&app, due).await;
    let (p50, p99, max) = (
        percentile(&lateness, 0.5),
        percentile(&lateness, 0.99),
        *lateness.last().unwrap(),
    );
    println!("retry promotion lateness over 1000 jobs: p50 {p50} ms, p99 {p99} ms, max {max} ms, min {} ms", lateness[0]);
    assert!(lateness[0] >= 0, "a job became available before its time");
    assert!(max <= 100, "latest promotion was {max} ms late");
    // And they are fetchable.
    let r = app
        .post(
            "/ojs/v1/workers/fetch",
            json!({"queues": ["backoff"], "count": 1000}),
        )
        .await;
    assert_eq!(r.body["jobs"].as_array().unwrap().len(), 1000);
}

/// A worker already waiting in a long-polling FETCH gets a scheduled job when it comes due,
/// not a NAK delay later: the promotion publishes the job's message just before it writes
/// the record, and the claim waits for that write instead of putting the message back.
#[tokio::test]
async fn a_waiting_worker_gets_scheduled_jobs_within_100_ms_of_their_time() {
    let _measuring = common::measuring();
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    // The worker asks a second gateway, as behind a load balancer: its claim does not
    // follow the leader's writes on one connection.
    let other = spawn_app(&nats.url).await;
    let first = Utc::now() + chrono::Duration::seconds(1);
    for i in 0..20 {
        let at = (first + chrono::Duration::milliseconds(100 * i))
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        app.enqueue(json!({"type": "t.s", "args": [i], "options": {"queue": "waiting", "scheduled_at": at}}))
            .await;
    }
    let lateness = common::lateness_to_a_waiting_worker(&other, "waiting", 20).await;
    println!("scheduled job → waiting worker: {lateness:?} ms");
    assert!(lateness[0] >= 0, "a job came before its time");
    assert!(lateness[19] <= 100, "{} ms late", lateness[19]);
}

#[tokio::test]
async fn five_thousand_jobs_in_backoff_do_not_stall_their_queue() {
    let _measuring = common::measuring();
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let ids = claimed_jobs(&app, "crowded", 5000, json!({"initial_interval": "PT1H"})).await;
    fail_all(&app, &ids).await;
    let fresh = app.enqueue(job_on("crowded")).await;
    let started = Instant::now();
    let got = app.fetch(&["crowded"], "w").await;
    println!(
        "fetch with 5000 jobs in backoff on the queue: {:?}",
        started.elapsed()
    );
    assert_eq!(got[0]["id"], fresh.as_str());
    assert!(started.elapsed() < Duration::from_millis(500));
}

#[tokio::test]
async fn killing_the_leader_of_three_hands_over_within_five_seconds() {
    let _measuring = common::measuring();
    let nats = NatsServer::start();
    // Default lease settings: a 3 s time-to-live, renewed every second.
    let env = [("OJS_LEASE_TTL_MS", "3000")];
    let mut leader = GatewayProcess::start(&nats.url, &env).await;
    tokio::time::sleep(Duration::from_millis(300)).await; // it takes the lease first
    let mut others = vec![
        GatewayProcess::start(&nats.url, &env).await,
        GatewayProcess::start(&nats.url, &env).await,
    ];
    let http = reqwest::Client::new();
    let call = |base: &str, path: &str, body: Value| {
        let req = http
            .post(format!("{base}{path}"))
            .header("content-type", "application/json")
            .body(body.to_string());
        async move { req.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let r = call(
        &leader.base,
        "/ojs/v1/jobs",
        json!({"type": "t.k", "args": [], "options": {"queue": "handover",
        "retry": {"initial_interval": "PT1S", "jitter": false}}}),
    )
    .await;
    let id = r["job"]["id"].as_str().unwrap().to_string();
    call(
        &leader.base,
        "/ojs/v1/workers/fetch",
        json!({"queues": ["handover"]}),
    )
    .await;
    let failed = call(
        &others[0].base,
        "/ojs/v1/workers/nack",
        json!({"job_id": id, "error": {"message": "x"}}),
    )
    .await;
    let due = ts(&failed["next_attempt_at"]);

    leader.kill();
    let killed = Utc::now();
    let back = eventually(
        Duration::from_secs(10),
        "the retry after the leader died",
        || {
            let (base, call) = (others[1].base.clone(), &call);
            async move {
                let r = call(
                    &base,
                    "/ojs/v1/workers/fetch",
                    json!({"queues": ["handover"]}),
                )
                .await;
                r["jobs"].as_array().and_then(|j| j.first().cloned())
            }
        },
    )
    .await;
    let promoted = ts(&back["enqueued_at"]);
    let handover = (promoted - killed).num_milliseconds();
    println!("leader killed {} ms before the timer was due; the new leader fired it {handover} ms after the kill", (due - killed).num_milliseconds());
    assert_eq!(back["id"], id.as_str());
    assert!(handover <= 5000, "handover took {handover} ms");
    // The survivors keep publishing events.
    let later = call(&others[0].base, "/ojs/v1/jobs", job_on("handover")).await["job"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    eventually(Duration::from_secs(5), "events after the handover", || {
        let url = format!(
            "{}/ojs/v1/events?types=job.enqueued&queues=handover",
            others[1].base
        );
        let (http, later) = (http.clone(), later.clone());
        async move {
            let body: Value = http.get(url).send().await.ok()?.json().await.ok()?;
            body["events"]
                .as_array()?
                .iter()
                .any(|e| e["subject"] == later.as_str())
                .then_some(())
        }
    })
    .await;
    for g in &mut others {
        g.kill();
    }
}

#[tokio::test]
async fn ten_thousand_jobs_scheduled_for_one_instant_are_available_within_a_second() {
    let _measuring = common::measuring();
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let at = Utc::now() + chrono::Duration::seconds(8);
    let at_text = at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let mut ids = Vec::new();
    for _ in 0..10 {
        let jobs: Vec<_> = (0..1000).map(|i| json!({"type": "t.s", "args": [i], "options": {"queue": "instant", "scheduled_at": at_text}})).collect();
        let r = app.post("/ojs/v1/jobs/batch", json!({"jobs": jobs})).await;
        assert_eq!(r.status, 201);
        ids.extend(
            r.body["jobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|j| j["id"].as_str().unwrap().to_string()),
        );
    }
    assert!(
        Utc::now() < at,
        "enqueueing took too long for the test's margin"
    );
    tokio::time::sleep(
        (at - Utc::now()).to_std().unwrap_or_default() + Duration::from_millis(1500),
    )
    .await;
    let lateness = promotion_lateness(&app, ids.into_iter().map(|id| (id, at)).collect()).await;
    let (p50, p99, max) = (
        percentile(&lateness, 0.5),
        percentile(&lateness, 0.99),
        *lateness.last().unwrap(),
    );
    println!("10,000 jobs due at one instant: lateness p50 {p50} ms, p99 {p99} ms, max {max} ms, min {} ms", lateness[0]);
    assert!(lateness[0] >= 0, "a job became available before its time");
    assert!(max <= 1000, "the last one was {max} ms late");
}

/// Jobs finished within the deadline watch's hold leave no deadline timer behind; one still
/// running after it gets exactly one.
#[tokio::test]
async fn only_jobs_running_past_the_hold_get_deadline_timers() {
    let _measuring = common::measuring();
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    for _ in 0..20 {
        let id = app.enqueue(job_on("quick")).await;
        assert_eq!(app.fetch(&["quick"], "w").await.len(), 1);
        let r = app.ack(json!({"job_id": id, "worker_id": "w"})).await;
        assert_eq!(r.status, 200);
    }
    app.enqueue(job_on("slow")).await;
    assert_eq!(app.fetch(&["slow"], "w").await.len(), 1);

    let js = async_nats::jetstream::new(async_nats::connect(&nats.url).await.unwrap());
    let mut timers = js.get_stream("ojs-timers").await.unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(timers.info().await.unwrap().state.messages, 0);
    let stored = eventually(Duration::from_secs(5), "the slow job's timer", || {
        let timers = timers.clone();
        async move {
            let mut timers = timers;
            let n = timers.info().await.ok()?.state.messages;
            (n > 0).then_some(n)
        }
    })
    .await;
    assert_eq!(stored, 1);
}

/// A claim whose deadline timer was not yet stored when the leader died is watched again
/// by the next leader, so the lapsed reservation still returns the job to its queue.
#[tokio::test]
async fn a_reservation_claimed_just_before_the_leader_dies_still_lapses() {
    let _measuring = common::measuring();
    let nats = NatsServer::start();
    let mut leader = GatewayProcess::start(&nats.url, &[]).await;
    tokio::time::sleep(Duration::from_millis(300)).await; // it takes the lease first
    let other = GatewayProcess::start(&nats.url, &[]).await;
    let http = reqwest::Client::new();
    let post = |path: &str, body: Value| {
        let req = http
            .post(format!("{}{path}", other.base))
            .header("content-type", "application/json")
            .body(body.to_string());
        async move { req.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let id = post("/ojs/v1/jobs", job_on("lapse")).await["job"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let fetched = post(
        "/ojs/v1/workers/fetch",
        json!({"queues": ["lapse"], "worker_id": "w", "visibility_timeout_ms": 4000}),
    )
    .await;
    assert_eq!(fetched["jobs"][0]["id"], id.as_str());
    // The leader has seen the claim (events are published within milliseconds) but holds
    // it for the watch's 2 s before storing a timer.
    tokio::time::sleep(Duration::from_millis(500)).await;
    leader.kill();
    let back = eventually(Duration::from_secs(20), "the lapsed job", || {
        let url = format!("{}/ojs/v1/jobs/{id}", other.base);
        let http = http.clone();
        async move {
            let job: Value = http.get(url).send().await.ok()?.json().await.ok()?;
            (job["job"]["state"] == "available").then_some(job)
        }
    })
    .await;
    assert_eq!(back["job"]["attempt"], 1);
}

/// Two leaders at once (architecture §3.10): the leader freezes (SIGSTOP) past its lease
/// while its event publisher holds a job write, another replica leads and acknowledges
/// later writes, then the frozen one resumes and steps down without publishing what it
/// held. That write's event still comes: each leadership reads the writes through a
/// consumer of its own, starting where the one before it had acknowledged.
#[tokio::test]
async fn a_leader_frozen_past_its_lease_loses_no_event() {
    let _measuring = common::measuring();
    let nats = NatsServer::start();
    let frozen = GatewayProcess::start(
        &nats.url,
        &[("OJS_FAILPOINTS", "events.pulled=delay(10000)")],
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let app = spawn_app(&nats.url).await;
    let enqueued = |id: String| {
        let app = &app;
        async move {
            let r = app
                .get("/ojs/v1/events?types=job.enqueued&queues=frozen")
                .await;
            r.body["events"]
                .as_array()?
                .iter()
                .any(|e| e["subject"] == id.as_str())
                .then_some(())
        }
    };
    let first = app.enqueue(job_on("frozen")).await;
    // The leader's publisher takes the write and holds it at the failpoint.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        enqueued(first.clone()).await.is_none(),
        "the frozen gateway leads"
    );
    frozen.pause();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let later = app.enqueue(job_on("frozen")).await;
    eventually(Duration::from_secs(5), "the new leader's events", || {
        enqueued(later.clone())
    })
    .await;
    frozen.resume();
    eventually(Duration::from_secs(10), "the held write's event", || {
        enqueued(first.clone())
    })
    .await;
}

/// A failover with a job written more often than the bucket keeps (`job_history = 2`):
/// while no publisher runs, the job is enqueued, claimed, beaten four times and completed,
/// so the bucket drops its first five writes before the new leader's publisher reads on.
/// Every one of its events arrives anyway, in order, from the trail the later writes carry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_behind_more_writes_than_the_bucket_keeps_loses_no_event() {
    let _measuring = common::measuring();
    let nats = NatsServer::start();
    let leader = GatewayProcess::start(&nats.url, &[("OJS_JOB_HISTORY", "2")]).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let app = common::spawn_app_with(ojs_jetstream::config::Config {
        job_history: 2,
        ..common::test_config(&nats.url)
    })
    .await;
    let events_of = |id: String| {
        let app = &app;
        async move {
            let r = app.get("/ojs/v1/events?limit=100").await;
            let types: Vec<String> = r.body["events"]
                .as_array()?
                .iter()
                .filter(|e| e["subject"] == id.as_str())
                .map(|e| e["type"].as_str().unwrap().to_owned())
                .collect();
            Some(types)
        }
    };
    let warm = app.enqueue(job_on("warm")).await;
    eventually(Duration::from_secs(5), "the leader publishing", || {
        let f = events_of(warm.clone());
        async move { f.await.filter(|t| !t.is_empty()) }
    })
    .await;

    leader.pause();
    let id = app.enqueue(job_on("behind")).await;
    let jobs = app.fetch(&["behind"], "w").await;
    assert_eq!(jobs[0]["id"], id.as_str());
    for _ in 0..4 {
        let r = app
            .post(
                "/ojs/v1/workers/heartbeat",
                json!({"worker_id": "w", "active_jobs": [id]}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    assert_eq!(app.ack(json!({"job_id": id})).await.status, 200);

    let expected = [
        "job.enqueued",
        "job.started",
        "job.heartbeat",
        "job.heartbeat",
        "job.heartbeat",
        "job.heartbeat",
        "job.completed",
    ];
    let got = eventually(Duration::from_secs(10), "the job's events", || {
        let f = events_of(id.clone());
        async move { f.await.filter(|t| t.len() >= expected.len()) }
    })
    .await;
    assert_eq!(got, expected);
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("ojs_events_recovered_total 5"),
        "five events came from the trail: {}",
        metrics
            .lines()
            .filter(|l| l.starts_with("ojs_events"))
            .collect::<Vec<_>>()
            .join("; ")
    );
    leader.resume();
}
