//! Health, manifest and metrics (HTTP binding §8, §21).

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use serde_json::json;

use super::error::ApiError;
use super::respond::respond;
use super::state::SharedState;
use crate::domain::error::OjsError;
use crate::domain::fields;
use crate::domain::state::JobState;
use crate::domain::totals::Histogram;
use crate::telemetry::job_metrics;
use tracing::warn;

/// 200 while NATS answers, 503 otherwise (the load balancer's signal). `degraded` also
/// when this replica gave up its last leadership for a stalled leader service (architecture
/// §3.10), until it leads again: still 200, as it serves requests as before.
pub async fn health(State(state): State<SharedState>) -> Response {
    let uptime = state.started.elapsed().as_secs();
    // From the queue registry's in-memory copy: free to read on every probe.
    let queues = state.store.queues().list();
    let paused = queues.iter().filter(|q| q.paused).count();
    let stalled = state.stalls.last();
    let mut coordinator = json!({"leader": state.metrics.leading()});
    if let Some(stall) = &stalled {
        coordinator["stalled"] = json!(stall);
    }
    match state.store.ping().await {
        Ok(latency) => respond(
            StatusCode::OK,
            &json!({
                "status": if stalled.is_some() { "degraded" } else { "ok" },
                "version": "1.0",
                "uptime_seconds": uptime,
                "backend": {"type": "nats", "status": "connected", "latency_ms": latency.as_millis() as u64},
                "queues": {"total": queues.len(), "active": queues.len() - paused, "paused": paused},
                "coordinator": coordinator,
            }),
        ),
        Err(err) => respond(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({
                "status": "degraded",
                "version": "1.0",
                "uptime_seconds": uptime,
                "backend": {"type": "nats", "status": "disconnected", "error": err.message},
                "coordinator": coordinator,
            }),
        ),
    }
}

/// Liveness (`/ojs/v1/health/live`, `/healthz`): the process serves HTTP. It does not ask
/// NATS, so an orchestrator does not restart gateways for an outage a restart cannot fix.
pub async fn live() -> Response {
    respond(StatusCode::OK, &json!({"status": "ok"}))
}

/// Readiness (`/ojs/v1/health/ready`, `/readyz`): 200 while NATS answers, 503 otherwise, so
/// a load balancer sends new requests elsewhere. A draining gateway (SIGTERM) accepts no
/// new connection from the moment the signal arrives, which fails the probe as well.
pub async fn ready(State(state): State<SharedState>) -> Response {
    match state.store.ping().await {
        Ok(_) => respond(StatusCode::OK, &json!({"status": "ready"})),
        Err(err) => respond(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"status": "unready", "reason": "nats", "error": err.message}),
        ),
    }
}

/// What this server implements. Claims only what its tests and the conformance suite show.
/// `extensions` is the conformance spec's flat list (§4.2.1, which consumers must read
/// as well as the structured form): the official Rust client reads only the list, and
/// there are no extensions to name either way.
///
/// `protocols` names `grpc` when this gateway serves the gRPC binding, and
/// `endpoints.grpc` its listen address.
pub async fn manifest(State(state): State<SharedState>) -> Response {
    let mut manifest = json!({
        "ojs_version": "1.0",
        "specversion": "1.0",
        "implementation": {"name": "ojs-jetstream", "version": env!("CARGO_PKG_VERSION"), "language": "rust"},
        "conformance_level": 4,
        "conformance_tier": "runtime",
        "backend": "nats-jetstream",
        "capabilities": {
            "batch_enqueue": true,
            "cron_jobs": true,
            // The admin UI's name for the same capability.
            "cron": true,
            "dead_letter": true,
            "delayed_jobs": true,
            "job_ttl": true,
            "priority_queues": true,
            "rate_limiting": true,
            "backpressure": true,
            "schema_validation": true,
            "unique_jobs": true,
            "workflows": true,
            "pause_resume": true,
            "queue_stats": true,
            "events": true,
            "progress": true,
        },
        "unique_job_strength": "strong",
        "queue_strategies": ["strict", "weighted"],
        "event_delivery": "at-least-once, in order per job; event ids are stable and repeats within two minutes are dropped by the events stream",
        "extensions": [],
        "endpoints": {"manifest": "/ojs/manifest", "health": "/ojs/v1/health", "liveness": "/ojs/v1/health/live", "readiness": "/ojs/v1/health/ready", "events": "/ojs/v1/events", "event_stream": "/ojs/v1/events/stream", "openapi": "/ojs/v1/openapi.json"},
    });
    manifest["protocols"] = json!(state.protocols());
    if let Some(addr) = state.grpc_addr {
        manifest["endpoints"]["grpc"] = json!(addr.to_string());
    }
    respond(StatusCode::OK, &manifest)
}

/// Prometheus text format: this replica's metrics, and on the leader the cluster's job
/// metrics (left out, and logged, when NATS cannot give them).
pub async fn metrics(State(state): State<SharedState>) -> Response {
    state.metrics.set_pullers_open(state.store.pullers_open());
    let jobs = if state.metrics.leading() {
        // The dead-letter counts are read here only: the admin statistics have no use for
        // them (one stream info fewer per dashboard poll).
        let read = async {
            let totals = state.store.leader().cluster_totals().await?;
            let (_, dead_letter) = state.store.dead_letter().entries().by_queue().await?;
            Ok::<_, crate::domain::error::OjsError>(job_metrics::families(&totals, &dead_letter))
        };
        match read.await {
            Ok(families) => families,
            Err(err) => {
                warn!(error = %err, "job metrics left out of a scrape: NATS did not answer");
                Vec::new()
            }
        }
    } else {
        Vec::new()
    };
    let mut response = state.metrics.render(jobs).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    response
}

/// `GET /ojs/v1/metrics` (the `ojs` command line's `metrics`): the cluster's job totals as
/// one JSON object, read from the queue counters as the admin statistics are;
/// `?format=prometheus` answers `/metrics`.
pub async fn metrics_summary(
    State(state): State<SharedState>,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    match params.get("format").map(String::as_str) {
        None | Some("json") => {}
        Some("prometheus") => return Ok(metrics(State(state)).await),
        Some(other) => {
            return Err(OjsError::invalid(
                "format",
                format!(
                    "format must be json or prometheus, not {:?}.",
                    fields::truncated(other)
                ),
            )
            .into())
        }
    }
    let totals = state.store.leader().cluster_totals().await?;
    let now = Utc::now();
    let types = || totals.queues.iter().flat_map(|(_, c)| c.types.values());
    let mut run = Histogram::default();
    for t in types() {
        if let Some(h) = t.durations.get(&JobState::Completed) {
            run.merge(h);
        }
    }
    let avg_latency_ms = match run.count() {
        0 => 0.0,
        n => run.sum / n as f64 * 1000.0,
    };
    Ok(respond(
        StatusCode::OK,
        &json!({
            "uptime_seconds": state.started.elapsed().as_secs_f64(),
            "jobs_enqueued_total": types().map(|t| t.enqueued).sum::<u64>(),
            "jobs_completed_total": types().map(|t| t.completed).sum::<u64>(),
            "jobs_failed_total": types().map(|t| t.discarded()).sum::<u64>(),
            "jobs_active": totals.queues.iter().map(|(_, c)| c.states.of(JobState::Active)).sum::<u64>(),
            "queues_active": state.store.queues().list().len(),
            "workers_active": totals.workers,
            "avg_latency_ms": avg_latency_ms,
            "throughput_per_second": totals.queues.iter().map(|(_, c)| c.throughput(now)).sum::<f64>(),
        }),
    ))
}
