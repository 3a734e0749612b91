//! Schemas for job arguments (HTTP binding §15): register, list, get, delete. A single
//! schema is answered under `schema` (the binding's form) and with its fields at the top
//! level too (the Rust OJS client reads them there).

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::Utc;
use serde_json::{json, Value};

use super::error::ApiError;
use super::extract::{pagination, paging, JsonObject};
use super::respond::{respond, wrapped_and_bare};
use super::state::SharedState;
use crate::domain::schema::{self, SchemaEntry};

const DEFAULT_LIMIT: usize = 50;
const MAX_LIMIT: usize = 1_000;

/// `POST /ojs/v1/schemas`: 201 when registered, 200 when the same schema already was.
pub async fn register(
    State(state): State<SharedState>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let entry = schema::registration(&body, Utc::now(), state.config.max_job_bytes)?;
    let (entry, created) = state.store.schemas().register(entry).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(respond(status, &whole(&entry)))
}

/// `GET /ojs/v1/schemas`: summaries by URI, a page at a time (`limit`/`offset` or
/// `page`/`per_page`).
pub async fn list(
    State(state): State<SharedState>,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let (limit, offset) = paging(&params, DEFAULT_LIMIT, MAX_LIMIT)?;
    let entries = state.store.schemas().list();
    let page: Vec<Value> = entries
        .iter()
        .skip(offset)
        .take(limit)
        .map(SchemaEntry::summary)
        .collect();
    Ok(respond(
        StatusCode::OK,
        &json!({
            "pagination": pagination(entries.len(), limit, offset, page.len()),
            "schemas": page,
        }),
    ))
}

/// `GET /ojs/v1/schemas/{uri}` (the URI percent-encoded).
pub async fn get(
    State(state): State<SharedState>,
    Path(uri): Path<String>,
) -> Result<Response, ApiError> {
    let entry = state.store.schemas().get(&uri).await?;
    Ok(respond(StatusCode::OK, &whole(&entry)))
}

/// `DELETE /ojs/v1/schemas/{uri}`: jobs already enqueued naming it are unaffected.
pub async fn delete(
    State(state): State<SharedState>,
    Path(uri): Path<String>,
) -> Result<Response, ApiError> {
    let entry = state.store.schemas().delete(&uri).await?;
    Ok(respond(
        StatusCode::OK,
        &json!({"deleted": true, "uri": entry.uri}),
    ))
}

/// An entry with its schema document, under `schema` and at the top level.
fn whole(entry: &SchemaEntry) -> Value {
    let mut fields = entry.summary();
    fields["schema"] = entry.schema.clone();
    wrapped_and_bare("schema", fields)
}
