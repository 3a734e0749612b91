//! Job inspection for operators (admin spec §7, §8): listings by queue, state and type a
//! page at a time, the whole envelope, cancel, retry, and bulk operations by ids or filter.

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json, Value};

use super::run_bulk;
use crate::domain::bulk::BulkOp;
use crate::domain::listing::{detail, summary, ListQuery};
use crate::http::error::ApiError;
use crate::http::extract::JsonObject;
use crate::http::respond::{job_id, respond, respond_wrapped_and_bare};
use crate::http::state::SharedState;
use crate::store::JobPage;

/// `GET /admin/jobs`: `{items, pagination: {total, page, per_page, next_cursor}}`.
pub async fn list(
    State(state): State<SharedState>,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    Ok(respond(StatusCode::OK, &listing(&state, &params).await?))
}

/// The page of the jobs listing `params` ask for (also `GET /ojs/v1/jobs`'s).
pub async fn listing(
    state: &SharedState,
    params: &HashMap<String, String>,
) -> Result<Value, ApiError> {
    let q = ListQuery::parse(params)?;
    let page = state.store.jobs().list(&q).await?;
    Ok(page_body(&q, page))
}

/// The body of a listing page, shared with the dead-letter listing.
pub fn page_body(q: &ListQuery, page: JobPage) -> Value {
    json!({
        "items": page.jobs.iter().map(summary).collect::<Vec<_>>(),
        "pagination": {
            "total": page.total,
            "page": q.page,
            "per_page": q.per_page,
            "next_cursor": page.next.map(|c| c.encode()),
        },
    })
}

/// `GET /admin/jobs/{id}`: the whole envelope at the top level, with `errors` and
/// `metadata` (admin spec §7.2).
pub async fn get(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let job = state.store.jobs().info(&job_id(&id)?).await?;
    Ok(respond(StatusCode::OK, &detail(&job)))
}

/// `POST /admin/jobs/{id}/retry` (admin spec §7.4): a discarded or retryable job runs
/// again now, as the bulk retry does it.
pub async fn retry(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = job_id(&id)?;
    if let Some(Err(err)) = state
        .store
        .jobs()
        .bulk(BulkOp::Retry, std::slice::from_ref(&id))
        .await
        .pop()
    {
        return Err(err.into());
    }
    let job = state.store.jobs().info(&id).await?;
    Ok(respond_wrapped_and_bare(StatusCode::OK, "job", &job))
}

pub async fn bulk_retry(
    State(state): State<SharedState>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    run_bulk(&state.store, &body, BulkOp::Retry).await
}

pub async fn bulk_cancel(
    State(state): State<SharedState>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    run_bulk(&state.store, &body, BulkOp::Cancel).await
}

pub async fn bulk_delete(
    State(state): State<SharedState>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    run_bulk(&state.store, &body, BulkOp::Delete).await
}
