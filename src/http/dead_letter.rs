//! The dead letter queue (HTTP binding §12, dead-letter spec §10): list newest first,
//! inspect, retry, delete.

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::json;

use super::error::ApiError;
use super::extract::query_number;
use super::respond::{job_id, respond, wrapped_and_bare};
use super::state::SharedState;
use crate::domain::envelope::validate_queue;

const DEFAULT_LIMIT: usize = 50;
const MAX_LIMIT: usize = 1000;
/// An offset past the retention count (`dead_letter_max_count`) can only give an empty page.
const MAX_OFFSET: usize = 1_000_000;

pub async fn list(
    State(state): State<SharedState>,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let limit = query_number(&params, "limit", DEFAULT_LIMIT, MAX_LIMIT)?.max(1);
    let offset = query_number(&params, "offset", 0, MAX_OFFSET)?;
    // An empty `queue=` is no filter (the Rust client sends one when it names no queue).
    let queue = params
        .get("queue")
        .map(String::as_str)
        .filter(|q| !q.is_empty());
    if let Some(q) = queue {
        validate_queue(q)?;
    }
    let page = state.store.dead_letter().list(queue, limit, offset).await?;
    // Positions, not jobs: a stale entry takes one and shows nothing.
    let has_more = offset.saturating_add(limit) < page.total as usize;
    Ok(respond(
        StatusCode::OK,
        &json!({
            "jobs": page.jobs,
            // Also at the top level, where the `ojs` command line reads it.
            "total": page.total,
            "pagination": {"total": page.total, "limit": limit, "offset": offset, "has_more": has_more},
        }),
    ))
}

pub async fn get(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let job = state.store.dead_letter().get(&job_id(&id)?).await?;
    Ok(respond(StatusCode::OK, &json!({ "job": job })))
}

pub async fn retry(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let job = state.store.dead_letter().retry(&job_id(&id)?).await?;
    let mut body = serde_json::to_value(&job).expect("jobs serialize");
    body["re_enqueued_at"] = body["enqueued_at"].clone();
    Ok(respond(StatusCode::OK, &wrapped_and_bare("job", body)))
}

pub async fn delete(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = job_id(&id)?;
    state.store.dead_letter().delete(&id).await?;
    Ok(respond(
        StatusCode::OK,
        &json!({ "deleted": true, "job_id": id }),
    ))
}

/// `GET /dead-letter/stats` (dead-letter spec §10.1): entries in all and by queue, the
/// oldest and newest, and the retention in force.
pub async fn stats(State(state): State<SharedState>) -> Result<Response, ApiError> {
    let stats = state.store.dead_letter().entries().stats().await?;
    let at = |t: Option<chrono::DateTime<chrono::Utc>>| t.map(crate::domain::time::format);
    Ok(respond(
        StatusCode::OK,
        &json!({
            "total": stats.total,
            "by_queue": stats.by_queue,
            "oldest_at": at(stats.oldest_at),
            "newest_at": at(stats.newest_at),
            "retention": {
                "max_age_ms": stats.max_age.as_millis() as u64,
                "max_count": stats.max_count,
            },
        }),
    ))
}
