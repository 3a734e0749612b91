//! PUSH (single and batch), INFO, CANCEL and ACTIVATE (HTTP binding §9).

use axum::extract::{Path, Query, State};
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use chrono::Utc;
use serde_json::{json, Value};
use uuid::Uuid;

use super::error::ApiError;
use super::extract::JsonObject;
use super::respond::{job_id, respond, respond_wrapped_and_bare, wrapped_and_bare};
use super::state::SharedState;
use crate::domain::backpressure;
use crate::domain::envelope;
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::fields;
use crate::domain::job::Job;
use crate::domain::state::JobState;
use crate::domain::time;
use crate::store::{deadline, Enqueued};

/// The request header of a PUSH willing to wait for room in a full queue.
const BLOCK_TIMEOUT: &str = "ojs-block-timeout";

/// The longest a PUSH's answer waits for a queue's depth for its pressure headers.
const PRESSURE_PATIENCE: Duration = Duration::from_millis(250);

/// Most jobs one batch may carry.
const MAX_BATCH: usize = 10_000;

pub async fn enqueue(
    State(state): State<SharedState>,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let job = envelope::parse_with_default_exhaustion(
        Value::Object(body),
        Utc::now(),
        Uuid::now_v7(),
        state.config.default_on_exhaustion,
    )?;
    let queue = job.queue.clone();
    let job = match push(&state, &headers, vec![job]).await? {
        Enqueued::Created(mut jobs) => jobs.remove(0),
        // Unique `ignore`: the job holding the key (unique-jobs spec §5.4).
        Enqueued::Existing(job) => {
            let mut body = wrapped_and_bare("job", json!(job));
            body["deduplicated"] = json!(true);
            return Ok(respond(StatusCode::OK, &body));
        }
    };
    let location = format!("/ojs/v1/jobs/{}", job.id);
    let mut response = respond_wrapped_and_bare(StatusCode::CREATED, "job", &job);
    if let Ok(v) = HeaderValue::from_str(&location) {
        response.headers_mut().insert(header::LOCATION, v);
    }
    add_pressure(&state, [queue.as_str()], &mut response).await;
    Ok(response)
}

/// All or none: every element is validated before anything is written (HTTP binding §9.2).
pub async fn enqueue_batch(
    State(state): State<SharedState>,
    headers: HeaderMap,
    JsonObject(mut body): JsonObject,
) -> Result<Response, ApiError> {
    let items = match body.remove("jobs") {
        Some(Value::Array(items)) if !items.is_empty() => items,
        Some(Value::Array(_)) => {
            return Err(OjsError::invalid("jobs", "jobs must contain at least one job.").into())
        }
        _ => {
            return Err(OjsError::invalid(
                "jobs",
                "Missing required field 'jobs' (an array of jobs).",
            )
            .into())
        }
    };
    if items.len() > MAX_BATCH {
        return Err(OjsError::invalid(
            "jobs",
            format!(
                "A batch may carry at most {MAX_BATCH} jobs, got {}.",
                items.len()
            ),
        )
        .into());
    }
    let now = Utc::now();
    let jobs = items
        .into_iter()
        .enumerate()
        .map(|(index, item)| {
            envelope::parse_with_default_exhaustion(
                item,
                now,
                Uuid::now_v7(),
                state.config.default_on_exhaustion,
            )
            .map_err(|mut e| {
                e.message = format!(
                    "Batch validation failed: job at index {index}: {}",
                    e.message
                );
                e.details.insert("index".into(), json!(index));
                e
            })
        })
        .collect::<Result<Vec<Job>, OjsError>>()?;
    if let Some(index) = first_repeated_id(&jobs) {
        return Err(OjsError::new(
            ErrorCode::Duplicate,
            format!("Batch validation failed: job at index {index} repeats an id of the batch."),
        )
        .with_detail("index", index)
        .into());
    }
    let queues: Vec<String> = jobs
        .iter()
        .map(|j| j.queue.as_str())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .map(str::to_owned)
        .collect();
    Ok(match push(&state, &headers, jobs).await? {
        // `enqueued` and `failed` are what the `ojs` command line prints; a batch is all
        // or none, so none failed.
        Enqueued::Created(jobs) => {
            let mut response = respond(
                StatusCode::CREATED,
                &json!({ "jobs": jobs, "count": jobs.len(), "enqueued": jobs.len(), "failed": 0 }),
            );
            add_pressure(&state, queues.iter().map(String::as_str), &mut response).await;
            response
        }
        Enqueued::Existing(job) => respond(
            StatusCode::OK,
            &json!({ "jobs": [job], "count": 1, "enqueued": 0, "failed": 0, "deduplicated": true }),
        ),
    })
}

/// PUSH with the request's `OJS-Block-Timeout` (backpressure spec §5.2); a refusal by a
/// queue's bound is counted in `ojs_backpressure_rejected_total`.
async fn push(
    state: &SharedState,
    headers: &HeaderMap,
    jobs: Vec<Job>,
) -> Result<Enqueued, ApiError> {
    let raw = headers
        .get(BLOCK_TIMEOUT)
        .map(|v| v.to_str().unwrap_or("(not text)"));
    let block = backpressure::block_timeout(raw)?;
    deadline::wait_on_top(block);
    match state.store.jobs().enqueue(jobs, block).await {
        Err(err) if err.code == ErrorCode::QueueFull => {
            if let Some(queue) = err.details.get("queue").and_then(Value::as_str) {
                state.metrics.backpressure_rejected(queue);
            }
            Err(err.into())
        }
        other => Ok(other?),
    }
}

/// The pressure headers of a PUSH into a bounded queue past its warning threshold
/// (backpressure spec §7.3): the first such queue of `queues`. Best effort: a depth NATS
/// does not give within `PRESSURE_PATIENCE` (an election) leaves the headers out rather
/// than hold up a PUSH that is done.
async fn add_pressure<'a>(
    state: &SharedState,
    queues: impl IntoIterator<Item = &'a str>,
    response: &mut Response,
) {
    for queue in queues {
        let pressure = state.store.queues().pressure(queue);
        let Ok(Some(p)) = deadline::patient(PRESSURE_PATIENCE, pressure).await else {
            continue;
        };
        if p.bound.warns(p.depth) {
            let headers = response.headers_mut();
            headers.insert("x-ojs-queue-depth", p.depth.into());
            headers.insert("x-ojs-queue-bound", p.bound.max_depth.into());
            let pressure = format!("{:.2}", p.bound.pressure(p.depth));
            if let Ok(v) = HeaderValue::from_str(&pressure) {
                headers.insert("x-ojs-queue-pressure", v);
            }
            return;
        }
    }
}

fn first_repeated_id(jobs: &[Job]) -> Option<usize> {
    let mut seen = std::collections::HashSet::with_capacity(jobs.len());
    jobs.iter().position(|j| !seen.insert(j.id.as_str()))
}

/// `GET /ojs/v1/jobs` (the `ojs` command line's `jobs`): the admin listing (admin spec
/// §7.1, its filters and cursor), with the page's jobs also under `jobs` and the count
/// under `total`, where the command line reads them.
pub async fn list(
    State(state): State<SharedState>,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let mut body = super::admin::jobs::listing(&state, &params).await?;
    body["jobs"] = body["items"].clone();
    body["total"] = body["pagination"]["total"].clone();
    Ok(respond(StatusCode::OK, &body))
}

pub async fn info(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let job = state.store.jobs().info(&job_id(&id)?).await?;
    Ok(respond_wrapped_and_bare(StatusCode::OK, "job", &job))
}

pub async fn cancel(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let settled = state.store.jobs().cancel(&job_id(&id)?).await?;
    let mut job = serde_json::to_value(&settled.after.job).expect("jobs serialize");
    job["previous_state"] = json!(settled.before.job.state);
    Ok(respond(StatusCode::OK, &wrapped_and_bare("job", job)))
}

/// `PATCH /ojs/v1/jobs/{id}` (priority spec §8.1, §10.2; the `ojs` command line's
/// `priority`): a waiting job's new priority, answered with the job and its
/// `previous_priority`.
pub async fn reprioritize(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let id = job_id(&id)?;
    let priority = envelope::priority_update(&body)?;
    let settled = state.store.jobs().reprioritize(&id, priority).await?;
    let mut job = serde_json::to_value(&settled.after.job).expect("jobs serialize");
    job["previous_priority"] = json!(settled.before.job.priority);
    Ok(respond(StatusCode::OK, &wrapped_and_bare("job", job)))
}

pub async fn activate(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let job = state.store.jobs().activate(&job_id(&id)?).await?;
    let mut body = serde_json::to_value(&job).expect("jobs serialize");
    body["previous_state"] = json!("pending");
    Ok(respond(StatusCode::OK, &json!({ "job": body })))
}

/// The longest `GET /jobs/{id}/result?wait=true` waits, in seconds.
const MAX_RESULT_WAIT_SECS: usize = 60;

/// `GET /ojs/v1/jobs/{id}/result[?wait=true&timeout=N]` (the `ojs` command line's
/// `result`, the admin UI's "Fetch Result"): the job's outcome at the top level. With
/// `wait`, the answer comes when the job finishes or after `timeout` seconds (30 by
/// default, at most 60), whichever is first; the record is read again at growing
/// intervals meanwhile, never faster than ten times a second.
pub async fn result(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let id = job_id(&id)?;
    let wait = match params.get("wait").map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(OjsError::invalid(
                "wait",
                format!(
                    "wait must be true or false, not {:?}.",
                    fields::truncated(other)
                ),
            )
            .into())
        }
    };
    let timeout = super::extract::query_number(&params, "timeout", 30, MAX_RESULT_WAIT_SECS)?;
    let until = tokio::time::Instant::now() + Duration::from_secs(timeout as u64);
    let mut pause = Duration::from_millis(100);
    let job = loop {
        let job = state.store.jobs().info(&id).await?;
        if !wait || job.state.is_terminal() || tokio::time::Instant::now() >= until {
            break job;
        }
        tokio::time::sleep_until((tokio::time::Instant::now() + pause).min(until)).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    };
    Ok(respond(
        StatusCode::OK,
        &json!({
            "job_id": job.id,
            "state": job.state,
            "result": job.result,
            "error": job.error,
            "completed_at": job.completed_at.map(time::format),
        }),
    ))
}

/// `GET /ojs/v1/jobs/{id}/retries` (the `ojs` command line's `retries`): each failed
/// attempt from the job's error history, the message as a string, and the retry policy.
pub async fn retries(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let job = state.store.jobs().info(&job_id(&id)?).await?;
    let last = job.errors.last().map(|e| e.attempt);
    let retries: Vec<Value> = job
        .errors
        .iter()
        .map(|e| {
            let next = (Some(e.attempt) == last && job.state == JobState::Retryable)
                .then_some(job.next_attempt_at.map(time::format))
                .flatten();
            json!({
                "attempt": e.attempt,
                "state": "failed",
                "error": e.message,
                "code": e.code,
                "failed_at": time::format(e.occurred_at),
                "next_retry_at": next,
            })
        })
        .collect();
    Ok(respond(
        StatusCode::OK,
        &json!({
            "job_id": job.id,
            "state": job.state,
            "attempt": job.attempt,
            "retries": retries,
            "policy": job.retry,
        }),
    ))
}
