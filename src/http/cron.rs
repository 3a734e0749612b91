//! Cron registrations (HTTP binding §13, cron spec §8): register (upsert), list, get, delete.
//! Responses carry `cron`/`crons` (the suites' names) and `cron_job`/`cron_jobs` (the spec's).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::Utc;
use serde_json::json;

use super::extract::JsonObject;
use super::{respond, ApiError, SharedState};
use crate::domain::cron::CronEntry;

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
    let entry = state.store.cron_entry(&name).await?;
    Ok(respond(
        StatusCode::OK,
        &json!({ "cron": entry, "cron_job": entry }),
    ))
}

pub async fn delete(
    State(state): State<SharedState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let entry = state.store.delete_cron(&name).await?;
    Ok(respond(
        StatusCode::OK,
        &json!({ "cron": entry, "deleted": true, "name": name }),
    ))
}
