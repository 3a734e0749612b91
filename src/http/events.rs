//! `GET /ojs/v1/events`: pages through lifecycle events, oldest first (events seed §6.4).

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::json;

use super::error::ApiError;
use super::extract::{event_types, query_list};
use super::respond::respond;
use super::state::SharedState;
use crate::domain::error::OjsError;
use crate::store::EventQuery;

const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;
/// Cursors are stream sequences; nothing larger is ever handed out.
const MAX_CURSOR: u64 = i64::MAX as u64;

pub async fn list(
    State(state): State<SharedState>,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let types = event_types(&params)?;
    let limit = match params.get("limit") {
        None => DEFAULT_LIMIT,
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_LIMIT).contains(n))
            .ok_or_else(|| {
                OjsError::invalid(
                    "limit",
                    format!("limit must be an integer from 1 to {MAX_LIMIT}, got {v:?}."),
                )
            })?,
    };
    let after = match params.get("after").or_else(|| params.get("cursor")) {
        None => None,
        Some(v) => Some(
            v.parse::<u64>()
                .ok()
                .filter(|n| *n <= MAX_CURSOR)
                .ok_or_else(|| {
                    OjsError::invalid(
                        "after",
                        format!("after must be a cursor returned by this endpoint, got {v:?}."),
                    )
                })?,
        ),
    };
    let query = EventQuery {
        types,
        queues: query_list(&params, "queues"),
        job_types: query_list(&params, "job_types"),
        after,
        limit,
    };
    let page = state.store.events().query(&query).await?;
    Ok(respond(
        StatusCode::OK,
        &json!({
            "events": page.events,
            "cursor": page.cursor.map(|c| c.to_string()),
            "has_more": page.has_more,
        }),
    ))
}
