//! Operator endpoints (admin spec): worker inspection and directives, and the conformance
//! reset. The reset is routed only when `allow_reset` is on; it is never on by default.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::json;

use super::{respond, ApiError, SharedState};
use crate::domain::error::OjsError;
use crate::domain::fields::truncated;
use crate::domain::worker::is_worker_id;
use crate::store::WorkerState;

/// Wipes every job, queue, worker and event of this namespace.
pub async fn reset(State(state): State<SharedState>) -> Result<Response, ApiError> {
    state.store.reset().await?;
    Ok(respond(StatusCode::OK, &json!({ "reset": true })))
}

pub async fn worker(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let worker = state.store.worker(known_worker(&id)?).await?;
    Ok(respond(StatusCode::OK, &json!({ "worker": worker })))
}

/// Admin spec §9.3: the worker stops fetching and finishes what it holds.
pub async fn quiet(state: State<SharedState>, id: Path<String>) -> Result<Response, ApiError> {
    direct(state, id, WorkerState::Quiet).await
}

/// The worker finishes or releases what it holds and exits.
pub async fn terminate(state: State<SharedState>, id: Path<String>) -> Result<Response, ApiError> {
    direct(state, id, WorkerState::Terminate).await
}

async fn direct(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    to: WorkerState,
) -> Result<Response, ApiError> {
    let worker = state.store.direct_worker(known_worker(&id)?, to).await?;
    Ok(respond(StatusCode::OK, &json!({ "worker": worker })))
}

/// A path segment that cannot be a worker id names no worker (404); it never becomes a key.
fn known_worker(id: &str) -> Result<&str, OjsError> {
    if is_worker_id(id) {
        Ok(id)
    } else {
        Err(OjsError::not_found("worker", &truncated(id)))
    }
}
