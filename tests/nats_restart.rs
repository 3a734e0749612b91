//! One nats-server killed and restarted under load (docs/architecture.md §4, "NATS goes
//! away"): the gateways reconnect by themselves, health says degraded meanwhile, a long
//! poll open at the kill ends, nothing accepted is lost, and the coordinator resumes —
//! timers due during the gap fire after it, and every cron tick of the gap fires once.

use crate::common;

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::load::{self, Seen};
use common::{eventually, spawn_app_with, test_config, NatsServer, TestApp};
use ojs_jetstream::config::Config;
use serde_json::json;

/// How long NATS stays away: longer than `nats_timeout_ms`, so requests in the gap fail.
const DOWN: Duration = Duration::from_secs(7);

/// Every cron tick fired into queue `ticks`, as Unix seconds, with duplicates kept.
async fn ticks(app: &TestApp) -> Vec<i64> {
    let mut seconds = Vec::new();
    loop {
        let r = app
            .post(
                "/ojs/v1/workers/fetch",
                json!({"queues": ["ticks"], "count": 1000}),
            )
            .await;
        let jobs = r.body["jobs"].as_array().expect("a FETCH answer").clone();
        if jobs.is_empty() {
            return seconds;
        }
        seconds.extend(jobs.iter().map(|j| {
            let at = j["meta"]["cron_triggered_at"].as_str().unwrap();
            chrono::DateTime::parse_from_rfc3339(at)
                .unwrap()
                .timestamp_millis()
                / 1000
        }));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_restart_under_load_loses_nothing_and_the_coordinator_resumes() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("warn")
        .with_test_writer()
        .try_init();
    let nats = NatsServer::start();
    let config = Config {
        visibility_timeout_ms: load::VISIBILITY_MS,
        ..test_config(&nats.url)
    };
    let a = spawn_app_with(config.clone()).await;
    let b = spawn_app_with(config).await;
    let r = a
        .post(
            "/ojs/v1/cron",
            json!({"name": "pulse", "expression": "@every 1s", "overlap_policy": "allow",
                "job_template": {"type": "cron.tick", "args": [], "options": {"queue": "ticks"}}}),
        )
        .await;
    assert!(r.status.is_success(), "{}", r.body);
    let registered = chrono::Utc::now().timestamp();
    let nats = Mutex::new(nats);
    let seen = Mutex::new(Seen::default());

    let faults = async {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let poll = async {
            let started = Instant::now();
            let r = a
                .post(
                    "/ojs/v1/workers/fetch",
                    json!({"queues": ["quiet"], "count": 1, "wait_ms": 5000}),
                )
                .await;
            (started.elapsed(), r)
        };
        let outage = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let down = Instant::now();
            nats.lock().unwrap().kill();
            for app in [&a, &b] {
                eventually(
                    Duration::from_secs(10),
                    "health saying degraded",
                    || async {
                        let r = app.get("/ojs/v1/health").await;
                        (r.status == 503 && r.body["status"] == "degraded").then_some(())
                    },
                )
                .await;
            }
            tokio::time::sleep(DOWN.saturating_sub(down.elapsed())).await;
            tokio::task::block_in_place(|| nats.lock().unwrap().restart());
            down
        };
        let ((polled, poll), down) = tokio::join!(poll, outage);
        for app in [&a, &b] {
            eventually(Duration::from_secs(20), "health ok again", || async {
                (app.get("/ojs/v1/health").await.status == 200).then_some(())
            })
            .await;
        }
        let healthy = down.elapsed();
        tokio::time::sleep(Duration::from_secs(4)).await;
        (down, healthy, polled, poll)
    };
    let (down, healthy, polled, poll) = load::through_faults(&a, &b, &seen, faults).await;

    {
        let seen = seen.lock().unwrap();
        seen.report(&[down], DOWN + Duration::from_secs(10));
        println!(
            "NATS away for {DOWN:?}; both gateways healthy {healthy:?} after the kill; the long poll open then ended after {polled:?} with {}",
            poll.status
        );
        seen.check(Duration::from_secs(12));
    }
    // The long poll (wait 5 s) ended by its deadline, either empty or saying retry.
    assert!(
        polled < Duration::from_secs(16),
        "long poll took {polled:?}"
    );
    assert!(
        poll.status == 200 && poll.body["jobs"] == json!([]) || poll.status == 503,
        "{} {}",
        poll.status,
        poll.body
    );

    // Each tick since registration fired once, the ones due while NATS was away included.
    let r = a.delete("/ojs/v1/cron/pulse").await;
    assert!(r.status.is_success(), "{}", r.body);
    let deleted = chrono::Utc::now().timestamp();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let fired = ticks(&a).await;
    let distinct: BTreeSet<i64> = fired.iter().copied().collect();
    assert_eq!(distinct.len(), fired.len(), "a tick fired twice: {fired:?}");
    let missing: Vec<i64> = (registered + 1..deleted - 1)
        .filter(|s| !distinct.contains(s))
        .collect();
    println!(
        "cron @every 1s: {} ticks from {registered} to {deleted}, missing {missing:?}",
        fired.len()
    );
    assert!(missing.is_empty(), "ticks were lost: {missing:?}");
}

/// A PUSH whose first NATS step is one a plain PUSH does not take waits a NATS restart out
/// within its deadline too, each NATS request timing out meanwhile (`nats_timeout_ms`
/// 500): one that opens a new queue (its stream and consumer) and one to a bounded,
/// concurrency- and rate-limited queue (its depth token).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_steps_of_new_limited_and_bounded_queues_wait_out_a_nats_restart() {
    let nats = NatsServer::start();
    let app = spawn_app_with(Config {
        nats_timeout_ms: 500,
        ..test_config(&nats.url)
    })
    .await;
    load::limit(&app).await;
    let on = |queue: &str| json!({"type": "r.t", "args": [], "options": {"queue": queue}});
    app.enqueue(on("limited")).await;
    let nats = Mutex::new(nats);

    tokio::task::block_in_place(|| nats.lock().unwrap().kill());
    let pushes = async {
        let started = Instant::now();
        let (fresh, bounded) = tokio::join!(
            app.post("/ojs/v1/jobs", on("opened-while-away")),
            app.post("/ojs/v1/jobs", on("limited")),
        );
        (started.elapsed(), fresh, bounded)
    };
    let outage = async {
        tokio::time::sleep(Duration::from_secs(3)).await;
        tokio::task::block_in_place(|| nats.lock().unwrap().restart());
    };
    let ((took, fresh, bounded), ()) = tokio::join!(pushes, outage);
    println!("both PUSHes answered {took:?} after NATS went away for 3 s");
    assert_eq!(fresh.status, 201, "{}", fresh.body);
    assert_eq!(bounded.status, 201, "{}", bounded.body);
    assert!(took >= Duration::from_secs(3), "{took:?}");

    for pushed in [fresh, bounded] {
        let id = pushed.body["job"]["id"].as_str().unwrap();
        assert_eq!(app.job(id).await["state"], "available");
    }
}
