//! Health, manifest, metrics, the admin reset, and jobs surviving restarts.

mod common;

use std::time::Duration;

use common::{eventually, job_on, spawn_app, spawn_app_with, test_config, NatsServer};
use ojs_jetstream::config::Config;
use serde_json::json;

#[tokio::test]
async fn health_reports_nats_and_degrades_when_it_is_gone() {
    let mut nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let r = app.get("/ojs/v1/health").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["status"], "ok");
    assert_eq!(r.body["backend"]["status"], "connected");
    for probe in ["/ojs/v1/health/ready", "/readyz"] {
        let r = app.get(probe).await;
        assert_eq!(
            (r.status.as_u16(), r.body["status"].as_str()),
            (200, Some("ready"))
        );
    }
    nats.kill();
    eventually(Duration::from_secs(10), "a degraded health", || async {
        let r = app.get("/ojs/v1/health").await;
        (r.status == 503 && r.body["status"] == "degraded").then_some(())
    })
    .await;
    // Not ready for traffic, but alive: restarting the gateway would not bring NATS back.
    for probe in ["/ojs/v1/health/ready", "/readyz"] {
        let r = app.get(probe).await;
        assert_eq!(r.status, 503, "{probe}");
        assert_eq!(r.body["reason"], "nats");
    }
    for probe in ["/ojs/v1/health/live", "/healthz"] {
        assert_eq!(app.get(probe).await.status, 200, "{probe}");
    }
    // Operations fail with a backend error saying when to retry, not a hang or a panic.
    let r = app.post("/ojs/v1/jobs", job_on("down")).await;
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(r.header("retry-after"), "1");
    assert_eq!(r.body["error"]["code"], "backend_error");
    assert_eq!(r.body["error"]["retryable"], true);
    // The body says what failed; NATS's own error text stays in the gateway's log.
    let message = r.body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("NATS failed while") && !message.contains(": "),
        "{message}"
    );
    nats.restart();
    eventually(Duration::from_secs(15), "recovery", || async {
        (app.get("/ojs/v1/health").await.status == 200).then_some(())
    })
    .await;
    assert_eq!(app.get("/ojs/v1/health/ready").await.status, 200);
}

#[tokio::test]
async fn manifest_claims_level_four_and_metrics_count_requests() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let r = app.get("/ojs/manifest").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["conformance_level"], 4);
    assert_eq!(r.body["unique_job_strength"], "strong");
    assert_eq!(r.body["queue_strategies"], json!(["strict", "weighted"]));
    for capability in ["workflows", "unique_jobs", "rate_limiting", "pause_resume"] {
        assert_eq!(r.body["capabilities"][capability], true, "{capability}");
    }
    assert_eq!(r.body["capabilities"]["cron_jobs"], true);
    assert_eq!(r.body["capabilities"]["dead_letter"], true);
    assert_eq!(r.body["capabilities"]["batch_enqueue"], true);
    app.get("/ojs/v1/health").await;
    let text = app.metrics().await;
    assert!(
        text.contains(
            r#"ojs_http_requests_total{method="GET",route="/ojs/v1/health",status="200"}"#
        ),
        "{text}"
    );
}

#[tokio::test]
async fn reset_exists_only_when_enabled_and_wipes_everything() {
    let nats = NatsServer::start();
    let off = spawn_app_with(Config {
        allow_reset: false,
        ..test_config(&nats.url)
    })
    .await;
    off.post("/ojs/v1/admin/reset", json!({}))
        .await
        .assert_error(404, "not_found");

    let app = spawn_app(&nats.url).await;
    let id = app.enqueue(job_on("wipe")).await;
    let r = app.post("/ojs/v1/admin/reset", json!({})).await;
    assert_eq!(r.status, 200);
    app.get(&format!("/ojs/v1/jobs/{id}"))
        .await
        .assert_error(404, "not_found");
    assert!(app.fetch(&["wipe"], "w").await.is_empty());
    let after = app.enqueue(job_on("wipe")).await;
    assert_eq!(app.fetch(&["wipe"], "w").await[0]["id"], after.as_str());
}

#[tokio::test]
async fn jobs_survive_gateway_and_nats_restarts() {
    let mut nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let id = app.enqueue(job_on("durable")).await;
    app.stop().await;
    nats.restart();
    let app = spawn_app_with(test_config(&nats.url)).await;
    assert_eq!(app.job(&id).await["state"], "available");
    assert_eq!(app.fetch(&["durable"], "w").await[0]["id"], id.as_str());
}
