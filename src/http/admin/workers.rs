//! Workers for operators (admin spec §9): every worker with its state, one worker, the
//! quiet and terminate directives answered on its next heartbeat, and removing a stale one.

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::Utc;
use serde_json::{json, Value};

use crate::domain::error::OjsError;
use crate::domain::fields::truncated;
use crate::domain::time::format;
use crate::domain::worker::{is_worker_id, takes_no_jobs};
use crate::http::error::ApiError;
use crate::http::extract::{pagination, paging};
use crate::http::respond::respond;
use crate::http::state::SharedState;
use crate::store::{WorkerRecord, WorkerState};

const DEFAULT_PER_PAGE: usize = 100;
const MAX_PER_PAGE: usize = 1000;

/// `GET /admin/workers`: `{items, summary: {total, running, quiet, terminate, stale},
/// pagination}`, a page at a time (`page`/`per_page` or `limit`/`offset`) by worker id.
pub async fn list(
    State(state): State<SharedState>,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let (limit, offset) = paging(&params, DEFAULT_PER_PAGE, MAX_PER_PAGE)?;
    let (census, workers) = state.store.workers().list(offset, limit).await?;
    let items: Vec<Value> = workers.iter().map(|(w, stale)| item(w, *stale)).collect();
    Ok(respond(
        StatusCode::OK,
        &json!({
            "summary": {
                "total": census.total,
                "running": census.running,
                "quiet": census.quiet,
                "terminate": census.terminate,
                "stale": census.stale,
            },
            "pagination": pagination(census.total, limit, offset, items.len()),
            "items": items,
        }),
    ))
}

pub async fn get(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let worker = state.store.workers().get(known_worker(&id)?).await?;
    // As listed, at the top level (the `ojs` command line's `workers --detail`), and the
    // whole record under `worker`.
    let stale = state.store.workers().is_stale(worker.last_seen, Utc::now());
    let mut body = item(&worker, stale);
    body["worker"] = json!(worker);
    Ok(respond(StatusCode::OK, &body))
}

/// Admin spec §9.3: the worker stops fetching and finishes what it holds.
pub async fn quiet(state: State<SharedState>, id: Path<String>) -> Result<Response, ApiError> {
    direct(state, id, WorkerState::Quiet).await
}

/// The worker finishes or releases what it holds and exits.
pub async fn terminate(state: State<SharedState>, id: Path<String>) -> Result<Response, ApiError> {
    direct(state, id, WorkerState::Terminate).await
}

/// Admin spec §9.4: a stale worker's jobs go back to their queues and its entry goes.
pub async fn deregister(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = known_worker(&id)?;
    state.store.workers().deregister(id).await?;
    Ok(respond(
        StatusCode::OK,
        &json!({ "deregistered": true, "worker_id": id }),
    ))
}

async fn direct(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    to: WorkerState,
) -> Result<Response, ApiError> {
    let worker = state.store.workers().direct(known_worker(&id)?, to).await?;
    Ok(respond(StatusCode::OK, &json!({ "worker": worker })))
}

/// A worker as listed (admin spec §9.1); `state` is `stale` for a worker silent past the
/// heartbeat timeout, else what it reported once it winds down (`quiet`, `drain`,
/// `terminate`: it takes no new job), else the directive in force, which
/// `directive` always names. `last_heartbeat` and `pid` are what the `ojs` command line
/// reads.
fn item(w: &WorkerRecord, stale: bool) -> Value {
    let directive = w.directive.as_str();
    let winding_down = w.reported_state.as_deref().filter(|s| takes_no_jobs(s));
    let state = match (stale, winding_down) {
        (true, _) => "stale",
        (false, Some(reported)) => reported,
        (false, None) => directive,
    };
    json!({
        "id": w.worker_id,
        "hostname": w.info.get("hostname"),
        "pid": w.info.get("pid"),
        "state": state,
        "directive": directive,
        "reported_state": w.reported_state,
        "queues": w.info.get("queues"),
        "concurrency": w.info.get("concurrency"),
        "active_jobs": w.active_job_ids.len(),
        "active_job_ids": w.active_job_ids,
        "started_at": format(w.first_seen),
        "last_heartbeat_at": format(w.last_seen),
        "last_heartbeat": format(w.last_seen),
        "metadata": w.info,
    })
}

/// A path segment that cannot be a worker id names no worker (404); it never becomes a key.
fn known_worker(id: &str) -> Result<&str, OjsError> {
    if is_worker_id(id) {
        Ok(id)
    } else {
        Err(OjsError::not_found("worker", &truncated(id)))
    }
}
