//! Cron registrations (HTTP binding §13, cron spec §8): register (upsert), list, get, delete.
//! Responses carry `cron`/`crons` (the suites' names) and `cron_job`/`cron_jobs` (the spec's).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::Utc;
use serde_json::json;

use super::extract::JsonObject;
use super::{respond, ApiError, SharedState};
use crate::domain::cron::{is_entry_name, CronEntry};
use crate::domain::error::OjsError;
use crate::domain::fields::truncated;

pub async fn register(
    State(state): State<SharedState>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let entry = CronEntry::parse(&body, Utc::now())?;
    let (entry, created) = state.store.register_cron(entry).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(respond(
        status,
        &json!({ "cron": entry, "cron_job": entry }),
    ))
}

pub async fn list(State(state): State<SharedState>) -> Result<Response, ApiError> {
    let entries = state.store.cron_entries();
    let count = entries.len();
    Ok(respond(
        StatusCode::OK,
        &json!({ "crons": entries, "cron_jobs": entries, "count": count }),
    ))
}

pub async fn get(
    State(state): State<SharedState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let entry = state.store.cron_entry(entry_name(&name)?).await?;
    Ok(respond(
        StatusCode::OK,
        &json!({ "cron": entry, "cron_job": entry }),
    ))
}

pub async fn delete(
    State(state): State<SharedState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let entry = state.store.delete_cron(entry_name(&name)?).await?;
    Ok(respond(
        StatusCode::OK,
        &json!({ "cron": entry, "deleted": true, "name": name }),
    ))
}

/// A path segment that cannot be an entry's name names none (404); it never becomes a key.
fn entry_name(name: &str) -> Result<&str, OjsError> {
    if is_entry_name(name) {
        Ok(name)
    } else {
        Err(OjsError::not_found("cron entry", &truncated(name)))
    }
}
