//! A leader whose service makes no progress for `leader_stall_ms` gives the lead up, and
//! one that is idle, or slow but getting on, keeps it (docs/architecture.md §3.10, stalls).

use crate::common;

use std::time::{Duration, Instant};

use common::{eventually, job_on, spawn_app_with, test_config, GatewayProcess, NatsServer};
use ojs_jetstream::config::{Config, Secret};
use serde_json::json;

/// The stall limit of these gateways, and their NATS timeout (a limit must exceed it).
const STALL_MS: u64 = 3000;
const NATS_TIMEOUT_MS: u64 = 2000;

/// Three NATS users: `denied` may not publish events, `no_queues` may not publish queue
/// messages, `ojs` may do anything.
const USERS: &str = r#"authorization { users: [
  { user: denied, password: "denied-password", permissions: { publish: { deny: ["ojs.events.>"] } } },
  { user: no_queues, password: "no-queues-password", permissions: { publish: { deny: ["ojs.q.>"] } } },
  { user: ojs, password: "ojs-password" }
] }"#;

fn settings(nats_url: &str) -> Config {
    Config {
        leader_stall_ms: STALL_MS,
        nats_timeout_ms: NATS_TIMEOUT_MS,
        ..test_config(nats_url)
    }
}

/// Whether the gateway's `/metrics` says it leads.
async fn leads(app: &common::TestApp) -> bool {
    app.metrics().await.lines().any(|l| l == "ojs_leader 1")
}

/// A gateway process as NATS user `user`, started first so that it leads, and beside it a
/// gateway whose user may do anything.
async fn leader_as(
    nats: &NatsServer,
    (user, password): (&str, &str),
    log: Option<&std::path::Path>,
) -> (GatewayProcess, common::TestApp) {
    let (stall, timeout) = (STALL_MS.to_string(), NATS_TIMEOUT_MS.to_string());
    let leader = GatewayProcess::start_logging_to(
        &nats.url,
        &[
            ("OJS_NATS_USER", user),
            ("OJS_NATS_PASSWORD", password),
            ("OJS_LEADER_STALL_MS", &stall),
            ("OJS_NATS_TIMEOUT_MS", &timeout),
        ],
        log,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let healthy = spawn_app_with(Config {
        nats_user: "ojs".into(),
        nats_password: Secret("ojs-password".into()),
        ..settings(&nats.url)
    })
    .await;
    (leader, healthy)
}

/// `app`'s health once it says `degraded`, within `within`.
async fn degraded(app: &common::TestApp, within: Duration) -> common::Reply {
    eventually(within, "the stalled leader's health to say so", || async {
        let r = app.get("/ojs/v1/health").await;
        (r.body["status"] == "degraded").then_some(r)
    })
    .await
}

#[tokio::test]
async fn a_leader_whose_publisher_cannot_publish_hands_the_lead_over() {
    let nats = NatsServer::start_with_config(USERS);
    let log = nats.dir.path().join("denied.log");
    // The leader's NATS user may not publish events.
    let (denied, healthy) = leader_as(&nats, ("denied", "denied-password"), Some(&log)).await;
    let stalled = denied.client();

    // With nothing to do for longer than the limit, it is not stalled.
    tokio::time::sleep(Duration::from_millis(STALL_MS + 1000)).await;
    assert!(leads(&stalled).await, "an idle leader keeps the lead");
    let r = stalled.get("/ojs/v1/health").await;
    assert_eq!(r.body["status"], "ok", "{}", r.body);
    assert_eq!(r.body["coordinator"]["leader"], true, "{}", r.body);

    // A job's write is work its publisher cannot finish.
    let written = Instant::now();
    let id = healthy.enqueue(job_on("stall")).await;
    let health = degraded(&stalled, Duration::from_millis(3 * STALL_MS)).await;
    let took = written.elapsed();
    assert!(
        took >= Duration::from_millis(STALL_MS) && took < Duration::from_millis(STALL_MS + 1200),
        "stepped down {took:?} after the write (limit {STALL_MS} ms, ticks of 300 ms)"
    );
    assert_eq!(health.status, 200, "it still serves: {}", health.body);
    let coordinator = &health.body["coordinator"];
    assert_eq!(coordinator["leader"], false, "{}", health.body);
    assert_eq!(coordinator["stalled"]["service"], "event_publisher");
    assert!(coordinator["stalled"]["no_progress_ms"].as_u64().unwrap() > STALL_MS);
    assert!(coordinator["stalled"]["at"].is_string());
    let metrics = stalled.metrics().await;
    assert!(
        metrics.contains("ojs_leader_stalls_total{service=\"event_publisher\"} 1"),
        "{metrics}"
    );

    // The other gateway leads and publishes what the stalled one could not.
    eventually(Duration::from_secs(5), "the job's event", || async {
        let r = healthy.get("/ojs/v1/events?types=job.enqueued").await;
        r.body["events"]
            .as_array()?
            .iter()
            .any(|e| e["subject"] == id.as_str())
            .then_some(())
    })
    .await;
    assert!(leads(&healthy).await);
    assert_eq!(healthy.get("/ojs/v1/health").await.body["status"], "ok");

    // Later: the lead stays where it works, and the step-down was logged once.
    tokio::time::sleep(Duration::from_millis(STALL_MS)).await;
    assert!(!leads(&stalled).await && leads(&healthy).await);
    assert_eq!(
        stalled.get("/ojs/v1/health").await.body["status"],
        "degraded"
    );
    let logged = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        logged.matches("made no progress").count(),
        1,
        "logged once: {logged}"
    );
}

/// A leader whose every timer firing fails (NATS refuses the promoted job's queue message)
/// makes no progress though its scheduler's loop goes on: it hands the lead over within the
/// limit, and the next leader promotes the job.
#[tokio::test]
async fn a_leader_whose_timers_all_fail_to_fire_hands_the_lead_over() {
    let nats = NatsServer::start_with_config(USERS);
    let (failing, healthy) = leader_as(&nats, ("no_queues", "no-queues-password"), None).await;
    let stalled = failing.client();
    assert!(leads(&stalled).await, "the first gateway leads");

    // Its promotion publishes the job's queue message, which the leader may not.
    let due = Instant::now() + Duration::from_secs(1);
    let id = healthy
        .enqueue(json!({"type": "t.later", "args": [],
            "options": {"queue": "stall-timers", "scheduled_at": "+PT1S"}}))
        .await;
    let health = degraded(&stalled, Duration::from_millis(4 * STALL_MS)).await;
    let took = due.elapsed();
    assert!(
        took >= Duration::from_millis(STALL_MS) && took < Duration::from_millis(STALL_MS + 1500),
        "stepped down {took:?} after the timer came due (limit {STALL_MS} ms)"
    );
    let coordinator = &health.body["coordinator"];
    assert_eq!(coordinator["leader"], false, "{}", health.body);
    assert_eq!(coordinator["stalled"]["service"], "scheduler_firings");
    let metrics = stalled.metrics().await;
    assert!(
        metrics.contains("ojs_leader_stalls_total{service=\"scheduler_firings\"} 1"),
        "{metrics}"
    );

    // The other gateway leads and promotes the job.
    eventually(Duration::from_secs(10), "the job promoted", || async {
        (healthy.job(&id).await["state"] == "available").then_some(())
    })
    .await;
    assert!(leads(&healthy).await);
}

#[tokio::test]
async fn a_leader_whose_publisher_is_slow_but_gets_on_keeps_the_lead() {
    let nats = NatsServer::start();
    // Each batch takes two thirds of the limit, one after the other.
    let slow = spawn_app_with(Config {
        failpoints: format!("events.pulled=delay({})", STALL_MS * 2 / 3),
        ..settings(&nats.url)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let other = spawn_app_with(settings(&nats.url)).await;
    let mut ids = Vec::new();
    let until = Instant::now() + Duration::from_millis(3 * STALL_MS);
    while Instant::now() < until {
        ids.push(other.enqueue(job_on("slow")).await);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let metrics = slow.metrics().await;
    assert!(!metrics.contains("ojs_leader_stalls_total{"), "{metrics}");
    assert!(leads(&slow).await, "it kept the lead");
    assert_eq!(slow.get("/ojs/v1/health").await.body["status"], "ok");
    // And it got through every write.
    eventually(
        Duration::from_millis(3 * STALL_MS),
        "every job's event",
        || async {
            let r = other
                .get("/ojs/v1/events?types=job.enqueued&limit=1000")
                .await;
            let events = r.body["events"].as_array()?.clone();
            ids.iter()
                .all(|id| events.iter().any(|e| e["subject"] == id.as_str()))
                .then_some(())
        },
    )
    .await;
    assert!(leads(&slow).await);
}
