//! Aggregate statistics (admin spec §10.1): the queue counters summed, the workers counted;
//! no job is read.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use chrono::Utc;
use serde_json::json;

use crate::domain::state::JobState;
use crate::http::error::ApiError;
use crate::http::respond::respond;
use crate::http::state::SharedState;

pub async fn get(State(state): State<SharedState>) -> Result<Response, ApiError> {
    // Exact for what was written before the request, as a queue's statistics are.
    state.store.stats().wait_counted().await?;
    let totals = state.store.leader().cluster_totals().await?;
    let now = Utc::now();
    let mut jobs = serde_json::Map::new();
    for s in JobState::ALL {
        let n: u64 = totals.queues.iter().map(|(_, c)| c.states.of(s)).sum();
        jobs.insert(s.as_str().into(), json!(n));
    }
    let per_second: f64 = totals.queues.iter().map(|(_, c)| c.throughput(now)).sum();
    let failed: u64 = totals
        .queues
        .iter()
        .map(|(_, c)| c.failed_per_minute(now))
        .sum();
    Ok(respond(
        StatusCode::OK,
        &json!({
            "queues": state.store.queues().list().len(),
            "workers": totals.workers,
            "jobs": jobs,
            "throughput": {"processed_per_minute": per_second * 60.0, "failed_per_minute": failed},
            "unhandled_writes": totals.unhandled_writes,
            "timers_pending": totals.timers_pending,
            "uptime_seconds": state.started.elapsed().as_secs(),
        }),
    ))
}
