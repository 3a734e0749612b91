//! The worker side of the binding: FETCH, ACK and FAIL (HTTP binding §10).

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json, Map, Value};

use super::extract::JsonObject;
use super::{respond, truncated, ApiError, SharedState};
use crate::domain::duration;
use crate::domain::envelope::{parse_job_id, too_large, validate_queue};
use crate::domain::error::OjsError;
use crate::domain::lifecycle::{Failure, MAX_ERROR_BYTES};
use crate::domain::time;
use crate::domain::worker::validate_worker_id;
use crate::store::{Beat, FetchRequest, WorkerState};

/// Most jobs one FETCH may claim.
const MAX_FETCH: u64 = 1000;
/// Longest an empty FETCH may wait for a job (`wait_ms`); short enough for load balancers'
/// idle timeouts and a graceful shutdown.
const MAX_FETCH_WAIT_MS: u64 = 10_000;

pub async fn fetch(
    State(state): State<SharedState>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let queues = match body.get("queues") {
        Some(Value::Array(list)) if !list.is_empty() => list
            .iter()
            .map(|q| {
                let q = q.as_str().ok_or_else(|| {
                    OjsError::invalid("queues", "queues must be an array of queue names.")
                })?;
                validate_queue(q)?;
                Ok(q.to_owned())
            })
            .collect::<Result<Vec<_>, OjsError>>()?,
        _ => {
            return Err(OjsError::invalid(
                "queues",
                "Missing required field 'queues' (a non-empty array of queue names).",
            )
            .into())
        }
    };
    let count = match body.get("count") {
        None | Some(Value::Null) => 1,
        Some(v) => v
            .as_u64()
            .filter(|n| (1..=MAX_FETCH).contains(n))
            .ok_or_else(|| {
                OjsError::invalid(
                    "count",
                    format!("count must be an integer from 1 to {MAX_FETCH}, got {v}."),
                )
            })?,
    };
    let visibility = optional_millis(&body, "visibility_timeout_ms")?;
    let wait = match body.get("wait_ms") {
        None | Some(Value::Null) => None,
        Some(v) => v
            .as_u64()
            .filter(|ms| *ms <= MAX_FETCH_WAIT_MS)
            .map(|ms| Some(Duration::from_millis(ms)))
            .ok_or_else(|| {
                OjsError::invalid(
                    "wait_ms",
                    format!("wait_ms must be an integer from 0 to {MAX_FETCH_WAIT_MS}, got {v}."),
                )
            })?,
    };
    let req = FetchRequest {
        queues,
        count: count as usize,
        worker_id: optional_worker_id(&body)?,
        visibility,
        wait,
    };
    // A spawned task finishes its claims even if the client goes away mid-request, so no
    // delivered message is left unsettled.
    let store = state.store.clone();
    let jobs = tokio::spawn(async move { store.fetch(&req).await })
        .await
        .map_err(|e| OjsError::backend(format!("fetch task failed: {e}")))??;
    Ok(respond(StatusCode::OK, &json!({ "jobs": jobs })))
}

pub async fn ack(
    State(state): State<SharedState>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let id = required_job_id(&body)?;
    let worker_id = optional_worker_id(&body)?;
    let result = body.get("result").cloned();
    let settled = state.store.ack(&id, worker_id.as_deref(), result).await?;
    let job = settled.after.job;
    Ok(respond(
        StatusCode::OK,
        &json!({
            "acknowledged": true,
            "id": job.id,
            "job_id": job.id,
            "state": job.state,
            "completed_at": job.completed_at.map(time::format),
            "job": job,
        }),
    ))
}

/// FAIL; `requeue: true` puts the job straight back (digest §5 #22).
pub async fn fail(
    State(state): State<SharedState>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let id = required_job_id(&body)?;
    let worker_id = optional_worker_id(&body)?;
    let failure = parse_failure(&body)?;
    let requeue = match body.get("requeue") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(OjsError::invalid(
                "requeue",
                format!("requeue must be a boolean, got {v}."),
            )
            .into())
        }
    };
    let settled = state
        .store
        .fail(&id, worker_id.as_deref(), &failure, requeue)
        .await?;
    let job = settled.after.job;
    let mut out = json!({
        "id": job.id,
        "job_id": job.id,
        "state": job.state,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
    });
    if let Some(at) = job.next_attempt_at {
        out["next_attempt_at"] = json!(time::format(at));
        out["retry_delay_ms"] = json!(job.retry_delay_ms);
    }
    for (key, at) in [
        ("completed_at", job.completed_at),
        ("discarded_at", job.discarded_at),
    ] {
        if let Some(at) = at {
            out[key] = json!(time::format(at));
        }
    }
    out["job"] = serde_json::to_value(&job).expect("jobs serialize");
    Ok(respond(StatusCode::OK, &out))
}

/// The `error` object of a FAIL (core §8): `message` required, `code` defaults to
/// `handler_error`, `retryable` to true.
fn parse_failure(body: &Map<String, Value>) -> Result<Failure, OjsError> {
    let Some(error @ Value::Object(e)) = body.get("error") else {
        return Err(OjsError::invalid(
            "error",
            "Missing required field 'error' (an object with code and message).",
        ));
    };
    let bytes = serde_json::to_vec(error).map_or(0, |b| b.len());
    if bytes > MAX_ERROR_BYTES {
        return Err(too_large("error", bytes, MAX_ERROR_BYTES));
    }
    let text = |key: &str| -> Result<Option<String>, OjsError> {
        match e.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(OjsError::invalid(
                &format!("error.{key}"),
                format!("error.{key} must be a string, got {v}."),
            )),
        }
    };
    let message = text("message")?.ok_or_else(|| {
        OjsError::invalid("error.message", "Missing required field 'error.message'.")
    })?;
    let retryable = match e.get("retryable") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(OjsError::invalid(
                "error.retryable",
                format!("error.retryable must be a boolean, got {v}."),
            ))
        }
    };
    let details = match e.get("details") {
        None | Some(Value::Null) => None,
        Some(v @ Value::Object(_)) => Some(v.clone()),
        Some(v) => {
            return Err(OjsError::invalid(
                "error.details",
                format!("error.details must be an object, got {v}."),
            ))
        }
    };
    Ok(Failure {
        code: text("code")?.unwrap_or_else(|| "handler_error".into()),
        message,
        retryable,
        error_type: text("type")?,
        details,
        backtrace: e.get("backtrace").filter(|v| !v.is_null()).cloned(),
    })
}

fn required_job_id(body: &Map<String, Value>) -> Result<String, OjsError> {
    match body.get("job_id") {
        Some(Value::String(s)) => {
            parse_job_id(s).ok_or_else(|| OjsError::not_found("job", &truncated(s)))
        }
        None | Some(Value::Null) => Err(OjsError::invalid(
            "job_id",
            "Missing required field 'job_id'.",
        )),
        Some(v) => Err(OjsError::invalid(
            "job_id",
            format!("job_id must be a string, got {v}."),
        )),
    }
}

/// A positive duration in milliseconds of at most `duration::MAX`, if given.
fn optional_millis(body: &Map<String, Value>, key: &str) -> Result<Option<Duration>, OjsError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => duration::from_number(v, key, 1, true).map(Some),
    }
}

fn optional_string(body: &Map<String, Value>, key: &str) -> Result<Option<String>, OjsError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
        Some(v) => Err(OjsError::invalid(
            key,
            format!("{key} must be a non-empty string, got {v}."),
        )),
    }
}

/// `worker_id`, if given, within the bounds of `validate_worker_id`.
fn optional_worker_id(body: &Map<String, Value>) -> Result<Option<String>, OjsError> {
    let id = optional_string(body, "worker_id")?;
    if let Some(id) = &id {
        validate_worker_id(id, "worker_id")?;
    }
    Ok(id)
}

/// BEAT (HTTP binding §10.4, worker protocol §4): accepts both request shapes — `active_jobs`
/// as the id list, or as a count with `active_job_ids` beside it.
pub async fn heartbeat(
    State(state): State<SharedState>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let worker_id = optional_worker_id(&body)?
        .ok_or_else(|| OjsError::invalid("worker_id", "Missing required field 'worker_id'."))?;
    let mut ids = Vec::new();
    for key in ["active_jobs", "active_job_ids"] {
        match body.get(key) {
            None | Some(Value::Null) | Some(Value::Number(_)) => {}
            Some(Value::Array(list)) => {
                for v in list {
                    let id = v.as_str().ok_or_else(|| {
                        OjsError::invalid(key, format!("{key} must list job ids as strings."))
                    })?;
                    // An id that is no job id cannot name a job this worker holds.
                    ids.extend(parse_job_id(id));
                }
            }
            Some(v) => {
                return Err(OjsError::invalid(
                    key,
                    format!("{key} must be an array of job ids, got {v}."),
                )
                .into())
            }
        }
    }
    if let Some(id) = optional_string(&body, "job_id")? {
        ids.extend(parse_job_id(&id));
    }
    ids.sort();
    ids.dedup();
    let visibility = optional_millis(&body, "visibility_timeout_ms")?;
    let reported_state = optional_string(&body, "state")?;
    let info: Map<String, Value> = [
        "hostname",
        "pid",
        "queues",
        "concurrency",
        "labels",
        "started_at",
    ]
    .into_iter()
    .filter_map(|k| body.get(k).map(|v| (k.to_owned(), v.clone())))
    .collect();
    let beat = Beat {
        worker_id,
        active_job_ids: ids,
        reported_state,
        visibility,
        info,
        test_directives: state.config.allow_reset,
    };
    let reply = state.store.heartbeat(&beat).await?;
    let directive = if reply.state == WorkerState::Running {
        ""
    } else {
        reply.state.as_str()
    };
    Ok(respond(
        StatusCode::OK,
        &json!({
            "state": reply.state.as_str(),
            "directive": directive,
            "jobs_extended": reply.jobs_extended,
            "jobs_cancelled": reply.jobs_cancelled,
            "server_time": time::format(chrono::Utc::now()),
        }),
    ))
}
