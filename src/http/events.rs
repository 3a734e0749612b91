//! `GET /ojs/v1/events`: pages through lifecycle events, oldest first by cursor (events
//! seed §6.4), or newest first by page number (the admin UI).

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json, Value};

use super::error::ApiError;
use super::extract::{event_types, pagination, paging, query_list};
use super::respond::respond;
use super::state::SharedState;
use crate::domain::error::OjsError;
use crate::store::EventQuery;

const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;
/// Events a page by number shows unless `per_page` says otherwise, at most, and how far
/// back pages reach.
const DEFAULT_PER_PAGE: usize = 50;
const MAX_PER_PAGE: usize = 500;
const MAX_PAGE_REACH: usize = 10_000;
/// Cursors are stream sequences; nothing larger is ever handed out.
const MAX_CURSOR: u64 = i64::MAX as u64;

pub async fn list(
    State(state): State<SharedState>,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let types = event_types(&params)?;
    if params.contains_key("page") || params.contains_key("per_page") {
        return newest(&state, &params, types).await;
    }
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

/// By `page` and `per_page` (the admin UI): the newest events first, `{items, pagination}`
/// beside `events`, each event with its `time` also as `timestamp`. Pages reach back
/// [`MAX_PAGE_REACH`] events.
async fn newest(
    state: &SharedState,
    params: &HashMap<String, String>,
    types: Vec<String>,
) -> Result<Response, ApiError> {
    let (per_page, offset) = paging(params, DEFAULT_PER_PAGE, MAX_PER_PAGE)?;
    if offset + per_page > MAX_PAGE_REACH {
        return Err(OjsError::invalid(
            "page",
            format!(
                "Pages reach the newest {MAX_PAGE_REACH} events; page through older ones with after (the cursor)."
            ),
        )
        .into());
    }
    let query = EventQuery {
        types,
        queues: query_list(params, "queues"),
        job_types: query_list(params, "job_types"),
        after: None,
        limit: per_page,
    };
    let page = offset / per_page + 1;
    let found = state.store.events().newest(&query, page, per_page).await?;
    let items: Vec<Value> = found
        .events
        .iter()
        .map(|e| {
            let mut item = json!(e);
            item["timestamp"] = item["time"].clone();
            item
        })
        .collect();
    let mut pagination = pagination(found.total, per_page, offset, items.len());
    pagination["complete"] = json!(found.complete);
    Ok(respond(
        StatusCode::OK,
        &json!({"items": items, "events": items, "pagination": pagination}),
    ))
}
