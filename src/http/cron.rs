//! Cron registrations (HTTP binding §13, cron spec §8): register (upsert), list, get, delete.
//! Responses carry `cron`/`crons` (the suites' names) and `cron_job`/`cron_jobs` (the spec's),
//! and each entry the field names OJS clients read beside the spec's (`describe`).

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::Utc;
use serde_json::{json, Value};

use std::time::Duration;

use uuid::Uuid;

use super::error::ApiError;
use super::extract::{pagination, paging, JsonObject};
use super::respond::{respond, wrapped_and_bare};
use super::state::SharedState;
use crate::domain::cron::{is_entry_name, CronEntry, HISTORY};
use crate::domain::envelope;
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::fields::truncated;
use crate::domain::time;
use crate::store::Enqueued;

pub async fn register(
    State(state): State<SharedState>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    // The clients' form names the expression `cron` and reads the entry back bare, with
    // `cron` the expression (the Rust client); the suites' form names it `expression` and
    // reads `cron` as the entry.
    let clients_form = body.contains_key("cron") && !body.contains_key("expression");
    let entry = CronEntry::parse(&body, Utc::now())?;
    let (entry, created) = state.store.cron().register(entry).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let entry = describe(&entry);
    let answer = if clients_form {
        let mut bare = entry.clone();
        bare["cron_job"] = entry;
        bare
    } else {
        answer(entry)
    };
    Ok(respond(status, &answer))
}

/// An entry's answer: its fields at the top level (the `ojs` command line, the Rust
/// client), under `cron` (the suites) and under `cron_job` (the HTTP binding, the
/// JavaScript client).
fn answer(entry: Value) -> Value {
    let mut answer = wrapped_and_bare("cron", entry.clone());
    answer["cron_job"] = entry;
    answer
}

const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;

pub async fn list(
    State(state): State<SharedState>,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let (limit, offset) = paging(&params, DEFAULT_LIMIT, MAX_LIMIT)?;
    // `?enabled=true|false` (cron spec §8.2) keeps the entries in that state.
    let enabled = match params.get("enabled").map(String::as_str) {
        None => None,
        Some("true") => Some(true),
        Some("false") => Some(false),
        Some(other) => {
            return Err(OjsError::invalid(
                "enabled",
                format!("enabled must be true or false, got {:?}.", truncated(other)),
            )
            .into())
        }
    };
    let mut entries = state.store.cron().list();
    entries.retain(|e| enabled.is_none_or(|wanted| e.enabled == wanted));
    let page: Vec<Value> = entries
        .iter()
        .skip(offset)
        .take(limit)
        .map(describe)
        .collect();
    Ok(respond(
        StatusCode::OK,
        &json!({
            "count": entries.len(),
            "pagination": pagination(entries.len(), limit, offset, page.len()),
            "crons": page,
            "cron_jobs": page,
            "items": page,
        }),
    ))
}

pub async fn get(
    State(state): State<SharedState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let entry = describe(&state.store.cron().get(entry_name(&name)?).await?);
    Ok(respond(StatusCode::OK, &answer(entry)))
}

pub async fn delete(
    State(state): State<SharedState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let entry = describe(&state.store.cron().delete(entry_name(&name)?).await?);
    Ok(respond(
        StatusCode::OK,
        &json!({ "cron": entry, "cron_job": entry, "deleted": true, "name": name }),
    ))
}

/// An entry as answered: its fields, and the names the OJS client libraries read —
/// `cron` (the expression), `type`, `args` and `options` (of the job template) and
/// `status` (`active` or `paused`).
fn describe(entry: &CronEntry) -> Value {
    let mut answer = serde_json::to_value(entry).expect("cron entries serialize");
    answer["cron"] = json!(entry.expression);
    for field in ["type", "args", "options"] {
        if let Some(value) = entry.job_template.get(field) {
            answer[field] = value.clone();
        }
    }
    answer["status"] = json!(if entry.enabled { "active" } else { "paused" });
    // The admin UI's names: the entry's `id` is its name, `schedule` its expression.
    answer["id"] = json!(entry.name);
    answer["schedule"] = json!(entry.expression);
    answer["queue"] = entry
        .job_template
        .pointer("/options/queue")
        .cloned()
        .unwrap_or_else(|| json!("default"));
    answer
}

/// A path segment that cannot be an entry's name names none (404); it never becomes a key.
fn entry_name(name: &str) -> Result<&str, OjsError> {
    if is_entry_name(name) {
        Ok(name)
    } else {
        Err(OjsError::not_found("cron entry", &truncated(name)))
    }
}

/// `POST /ojs/v1/cron/{name}/pause` and `…/resume` (the `ojs` command line): the entry
/// stops or starts firing, as a registration with `enabled` set would do; a resumed entry
/// fires from its next occurrence after now, not the ones it missed.
pub async fn pause(
    State(state): State<SharedState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    set_enabled(&state, &name, false).await
}

pub async fn resume(
    State(state): State<SharedState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    set_enabled(&state, &name, true).await
}

async fn set_enabled(state: &SharedState, name: &str, enabled: bool) -> Result<Response, ApiError> {
    let mut entry = state.store.cron().get(entry_name(name)?).await?;
    entry.enabled = enabled;
    // Registration keeps the stored creation time; this one only anchors the next run.
    entry.created_at = Utc::now();
    let (entry, _) = state.store.cron().register(entry).await?;
    Ok(respond(StatusCode::OK, &answer(describe(&entry))))
}

/// `POST /ojs/v1/cron/{name}/trigger`: one job of the entry now, beside its schedule (a new
/// id each time; `meta.cron_name` and `meta.cron_triggered_at` as a tick's job has them).
pub async fn trigger(
    State(state): State<SharedState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let entry = state.store.cron().get(entry_name(&name)?).await?;
    let now = Utc::now();
    let mut body = entry.job_for_tick(now);
    if let Value::Object(fields) = &mut body {
        fields.remove("id");
    }
    let job = envelope::parse_with_default_exhaustion(
        body,
        now,
        Uuid::now_v7(),
        state.config.default_on_exhaustion,
    )?;
    let job = match state
        .store
        .jobs()
        .enqueue(vec![job], Duration::ZERO)
        .await?
    {
        Enqueued::Created(mut jobs) => jobs.remove(0),
        Enqueued::Existing(job) => *job,
    };
    Ok(respond(
        StatusCode::CREATED,
        &json!({ "job_id": job.id, "job": job }),
    ))
}

/// `PATCH /ojs/v1/cron/{name}` (also `/crons/{name}`): changes the fields the body names
/// (`CronEntry::patched`); the entry fires from its next occurrence after now, as a
/// registration does, keeping its counts and history.
pub async fn update(
    State(state): State<SharedState>,
    Path(name): Path<String>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let entry = state.store.cron().get(entry_name(&name)?).await?;
    let changed = entry.patched(&body, Utc::now())?;
    let (entry, _) = state.store.cron().register(changed).await?;
    Ok(respond(StatusCode::OK, &answer(describe(&entry))))
}

/// `GET /ojs/v1/cron/{name}/history?limit=N` (the `ojs` command line's `cron --history`):
/// the jobs of the entry's last ticks, newest first, each as it is now; a job pruned
/// since is left out.
pub async fn history(
    State(state): State<SharedState>,
    Path(name): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let limit = super::extract::query_number(&params, "limit", 10, HISTORY)?.max(1);
    let entry = state.store.cron().get(entry_name(&name)?).await?;
    let jobs = state.store.jobs();
    let reads = entry
        .recent_job_ids
        .iter()
        .rev()
        .take(limit)
        .map(|id| jobs.info(id));
    let mut executions = Vec::new();
    for read in futures::future::join_all(reads).await {
        match read {
            Ok(job) => executions.push(json!({
                "job_id": job.id,
                "state": job.state,
                "scheduled_at": job.meta.get("cron_triggered_at").cloned().or_else(|| job.enqueued_at.map(|t| json!(time::format(t)))),
                "started_at": job.started_at.map(time::format),
                "completed_at": job.finished_at().map(time::format),
            })),
            Err(err) if err.code == ErrorCode::NotFound => {}
            Err(err) => return Err(err.into()),
        }
    }
    Ok(respond(
        StatusCode::OK,
        &json!({"name": entry.name, "executions": executions}),
    ))
}
