//! Stateless replicas: any gateway answers any request; one leader at a time publishes events
//! and fires timers; another takes over when the leader dies.

mod common;

use std::time::{Duration, Instant};

use common::{eventually, job_on, spawn_app, GatewayProcess, NatsServer};
use serde_json::{json, Value};

#[tokio::test]
async fn a_job_fetched_through_one_gateway_is_settled_through_another() {
    let nats = NatsServer::start();
    let a = spawn_app(&nats.url).await;
    let b = spawn_app(&nats.url).await;

    let acked = a.enqueue(job_on("shared")).await;
    assert_eq!(b.fetch(&["shared"], "w1").await[0]["id"], acked.as_str());
    let r = a
        .post(
            "/ojs/v1/workers/ack",
            json!({"job_id": acked, "worker_id": "w1"}),
        )
        .await;
    assert_eq!(r.body["state"], "completed");

    let failed = b.enqueue(job_on("shared")).await;
    a.fetch(&["shared"], "w2").await;
    let r = b
        .post(
            "/ojs/v1/workers/nack",
            json!({"job_id": failed, "requeue": true, "error": {"message": "again"}}),
        )
        .await;
    assert_eq!(r.body["state"], "available");
    assert_eq!(b.fetch(&["shared"], "w3").await[0]["id"], failed.as_str());
    let r = a.delete(&format!("/ojs/v1/jobs/{failed}")).await;
    assert_eq!(r.body["job"]["state"], "cancelled");

    // A queue and priority first used through A is fetched in order through B.
    let low = a
        .enqueue(json!({"type": "t.x", "args": [], "options": {"queue": "fresh", "priority": -5}}))
        .await;
    let high = a
        .enqueue(json!({"type": "t.x", "args": [], "options": {"queue": "fresh", "priority": 7}}))
        .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(b.fetch(&["fresh"], "w").await[0]["id"], high.as_str());
    assert_eq!(b.fetch(&["fresh"], "w").await[0]["id"], low.as_str());

    // Events are published once, by the one leader.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let events = b.get("/ojs/v1/events?queues=shared&limit=100").await.body["events"].clone();
    let for_acked: Vec<&Value> = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["subject"] == acked.as_str())
        .collect();
    let types: Vec<_> = for_acked
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["job.enqueued", "job.started", "job.completed"]);
}

#[tokio::test]
async fn replicas_starting_at_once_on_an_empty_nats_all_come_up() {
    let nats = NatsServer::start();
    let apps = futures::future::join_all((0..3).map(|_| spawn_app(&nats.url))).await;
    // They share one topology: a job enqueued through one is fetched through another.
    let id = apps[0].enqueue(job_on("together")).await;
    assert_eq!(
        apps[2].fetch(&["together"], "w").await[0]["id"],
        id.as_str()
    );
    // And exactly one of them leads: the job's enqueue event is published once.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let events = apps[1]
        .get("/ojs/v1/events?types=job.enqueued&queues=together")
        .await;
    assert_eq!(events.body["events"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn when_the_leader_is_killed_another_takes_over_and_pending_timers_fire() {
    let nats = NatsServer::start();
    let mut first = GatewayProcess::start(&nats.url, &[]).await;
    let http = reqwest::Client::new();
    let post = |base: String, path: &str, body: Value| {
        let http = http.clone();
        let url = format!("{base}{path}");
        async move {
            http.post(url)
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    // The first gateway leads (it started alone); the second follows.
    let mut second = GatewayProcess::start(&nats.url, &[]).await;
    let job = post(
        first.base.clone(),
        "/ojs/v1/jobs",
        json!({"type": "t.k", "args": [], "options": {"queue": "failover",
        "retry": {"initial_interval": "PT2S", "jitter": false}}}),
    )
    .await;
    let id = job["job"]["id"].as_str().unwrap().to_string();
    post(
        first.base.clone(),
        "/ojs/v1/workers/fetch",
        json!({"queues": ["failover"]}),
    )
    .await;
    let failed = post(
        first.base.clone(),
        "/ojs/v1/workers/nack",
        json!({"job_id": id, "error": {"message": "x"}}),
    )
    .await;
    assert_eq!(failed["state"], "retryable");

    first.kill();
    let killed = Instant::now();
    // The retry timer set before the kill still fires, through the new leader.
    let again = eventually(Duration::from_secs(10), "the retry after failover", || {
        let base = second.base.clone();
        async move {
            let r = post(
                base,
                "/ojs/v1/workers/fetch",
                json!({"queues": ["failover"]}),
            )
            .await;
            r["jobs"].as_array().and_then(|j| j.first().cloned())
        }
    })
    .await;
    assert_eq!(again["id"], id.as_str());
    assert!(
        killed.elapsed() < Duration::from_secs(6),
        "took {:?}",
        killed.elapsed()
    );
    // And the new leader publishes events.
    let later = post(second.base.clone(), "/ojs/v1/jobs", job_on("failover")).await;
    let later_id = later["job"]["id"].as_str().unwrap().to_string();
    eventually(Duration::from_secs(5), "events from the new leader", || {
        let url = format!(
            "{}/ojs/v1/events?types=job.enqueued&queues=failover&limit=100",
            second.base
        );
        let http = http.clone();
        let later_id = later_id.clone();
        async move {
            let body: Value = http.get(url).send().await.ok()?.json().await.ok()?;
            body["events"]
                .as_array()?
                .iter()
                .any(|e| e["subject"] == later_id.as_str())
                .then_some(())
        }
    })
    .await;
    second.kill();
}
