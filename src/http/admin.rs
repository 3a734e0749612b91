//! `POST /ojs/v1/admin/reset`: wipes every job, queue and event of this namespace. Routed
//! only when `allow_reset` is on, for conformance runs; it is never on by default.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::json;

use super::{respond, ApiError, SharedState};

pub async fn reset(State(state): State<SharedState>) -> Result<Response, ApiError> {
    state.store.reset().await?;
    Ok(respond(StatusCode::OK, &json!({ "reset": true })))
}
