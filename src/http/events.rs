//! `GET /ojs/v1/events`: pages through lifecycle events, oldest first (events seed §6.4).

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::json;

use super::{respond, ApiError, SharedState};
use crate::domain::envelope::validate_type;
use crate::domain::error::OjsError;
use crate::domain::fields::truncated;
use crate::store::EventQuery;

const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;
/// Cursors are stream sequences; nothing larger is ever handed out.
const MAX_CURSOR: u64 = i64::MAX as u64;

pub async fn list(
    State(state): State<SharedState>,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let list = |key: &str| -> Vec<String> {
        params
            .get(key)
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut types = list("types");
    types.extend(list("event_types"));
    // A type becomes part of a subject filter: only the event vocabulary's shape is accepted.
    if let Some(bad) = types.iter().find(|t| validate_type(t).is_err()) {
        return Err(OjsError::invalid(
            "types",
            format!(
                "types must list event types such as job.completed, got {:?}.",
                truncated(bad)
            ),
        )
        .into());
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
        queues: list("queues"),
        job_types: list("job_types"),
        after,
        limit,
    };
    let page = state.store.query_events(&query).await?;
    Ok(respond(
        StatusCode::OK,
        &json!({
            "events": page.events,
            "cursor": page.cursor.map(|c| c.to_string()),
            "has_more": page.has_more,
        }),
    ))
}
