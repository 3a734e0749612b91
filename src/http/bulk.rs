//! Bulk CANCEL, RETRY and DELETE by job ids or a filter (bulk-operations spec §6–§8): one
//! answer naming the outcome of every job, 200, 207 or 422 as the outcomes go
//! (`domain/bulk.rs`); a filter is walked through the admin listings (architecture §3.26).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use chrono::Utc;
use serde_json::json;

use super::admin::select;
use super::error::ApiError;
use super::extract::JsonObject;
use super::respond::respond;
use super::state::SharedState;
use crate::domain::bulk::{self, BulkOp, DataSelection, Filter, MAX_BULK_IDS};
use crate::domain::error::OjsError;

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
    let (ids, more) = match bulk::data_selection(&body, op, Utc::now())? {
        DataSelection::Ids(ids) => (ids, false),
        DataSelection::Filter(filter) => selected(&state, &filter).await?,
    };
    let outcomes = state.store.jobs().bulk(op, &ids).await;
    let (status, mut answer) = bulk::answer(op, &ids, &outcomes);
    answer["more"] = json!(more);
    let status = StatusCode::from_u16(status).expect("bulk statuses are valid");
    Ok(respond(status, &answer))
}

/// The ids of the jobs `filter` matches, state by state, at most `MAX_BULK_IDS`; and
/// whether more may match.
async fn selected(state: &SharedState, filter: &Filter) -> Result<(Vec<String>, bool), OjsError> {
    let mut ids = Vec::new();
    for q in &filter.queries {
        let (jobs, more) = select(&state.store, q.clone(), MAX_BULK_IDS - ids.len()).await?;
        ids.extend(jobs.into_iter().filter(|j| filter.matches(j)).map(|j| j.id));
        if more || ids.len() >= MAX_BULK_IDS {
            return Ok((ids, true));
        }
    }
    Ok((ids, false))
}
