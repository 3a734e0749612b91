//! The uniqueness locks held (the admin UI's unique-jobs page): each key with the job that
//! holds it, read from the unique bucket's stream, never from every job.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use futures::future::join_all;
use serde_json::{json, Value};

use super::error::ApiError;
use super::extract::{pagination, paging};
use super::respond::respond;
use super::state::SharedState;
use crate::domain::error::ErrorCode;
use crate::domain::listing::{DEFAULT_PER_PAGE, MAX_PER_PAGE};
use crate::domain::time;

/// `GET /ojs/v1/unique-jobs?page&per_page`: the locks taken last first, each with its
/// job's type, queue and state (`null` for a job no longer stored; the leader releases
/// such a lock shortly).
pub async fn list(
    State(state): State<SharedState>,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let (limit, offset) = paging(&params, DEFAULT_PER_PAGE, MAX_PER_PAGE)?;
    let locks = state.store.jobs().unique_locks().await?;
    let page: Vec<_> = locks.iter().skip(offset).take(limit).collect();
    let jobs = state.store.jobs();
    let reads = join_all(page.iter().map(|held| jobs.info(&held.lock.job_id))).await;
    let mut items = Vec::with_capacity(page.len());
    for (held, read) in page.into_iter().zip(reads) {
        let job = match read {
            Ok(job) => Some(job),
            Err(err) if err.code == ErrorCode::NotFound => None,
            Err(err) => return Err(err.into()),
        };
        items.push(json!({
            "key": held.key,
            "job_id": held.lock.job_id,
            "locked_at": time::format(held.lock.at),
            "type": job.as_ref().map(|j| j.job_type.clone()),
            "queue": job.as_ref().map(|j| j.queue.clone()),
            "state": job.as_ref().map(|j| j.state),
            "unique": job.as_ref().map_or(Value::Null, |j| j.unique.clone().unwrap_or(Value::Null)),
        }));
    }
    Ok(respond(
        StatusCode::OK,
        &json!({
            "items": items,
            "pagination": pagination(locks.len(), limit, offset, items.len()),
        }),
    ))
}
