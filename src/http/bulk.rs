//! Bulk CANCEL, RETRY and DELETE by job id (bulk-operations spec §6–§8): one answer naming
//! the outcome of every job, 200, 207 or 422 as the outcomes go (`domain/bulk.rs`).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;

use super::error::ApiError;
use super::extract::JsonObject;
use super::respond::respond;
use super::state::SharedState;
use crate::domain::bulk::{self, BulkOp};

pub async fn cancel(state: State<SharedState>, body: JsonObject) -> Result<Response, ApiError> {
    run(state, body, BulkOp::Cancel).await
}

pub async fn retry(state: State<SharedState>, body: JsonObject) -> Result<Response, ApiError> {
    run(state, body, BulkOp::Retry).await
}

pub async fn delete(state: State<SharedState>, body: JsonObject) -> Result<Response, ApiError> {
    run(state, body, BulkOp::Delete).await
}

async fn run(
    State(state): State<SharedState>,
    JsonObject(body): JsonObject,
    op: BulkOp,
) -> Result<Response, ApiError> {
    let ids = bulk::job_ids(&body)?;
    let outcomes = state.store.jobs().bulk(op, &ids).await;
    let (status, answer) = bulk::answer(op, &ids, &outcomes);
    let status = StatusCode::from_u16(status).expect("bulk statuses are valid");
    Ok(respond(status, &answer))
}
