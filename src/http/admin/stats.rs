//! Aggregate statistics (admin spec §10.1): the queue counters summed, the workers counted;
//! no job is read. Their history (§10.2) from the leader's samples.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::Utc;
use serde_json::json;

use crate::domain::state::JobState;
use crate::domain::stats_history::{HistoryQuery, ALL_QUEUES};
use crate::domain::time;
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

/// `GET /admin/stats/history?period&since&until&queue` (admin spec §10.2; the admin UI's
/// graph, the `ojs` command line's `stats --history`): per period, the jobs enqueued,
/// completed (`processed`) and failed, and the depth, from the samples the leader takes
/// each minute and hour (architecture §3.30). Answered under `data` and `data_points`.
pub async fn history(
    State(state): State<SharedState>,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let now = Utc::now();
    let q = HistoryQuery::parse(&params, now)?;
    let resolution = q.resolution(now);
    // The samples from a little before the first period: its starting totals.
    let from = q.since - q.step - resolution.lookback();
    let samples = state
        .store
        .stats()
        .samples(resolution, &q.queue, from)
        .await?;
    let points = q.points(&samples);
    let queue = (q.queue != ALL_QUEUES).then_some(q.queue.as_str());
    Ok(respond(
        StatusCode::OK,
        &json!({
            "period": q.period,
            "since": time::format(q.since),
            "until": time::format(q.until),
            "queue": queue,
            "data": points,
            "data_points": points,
        }),
    ))
}
