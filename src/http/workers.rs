//! The worker side of the binding: FETCH, ACK, FAIL and BEAT (HTTP binding §10). The
//! request rules are `domain::requests`; these handlers call them and the store.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;

use super::error::ApiError;
use super::extract::JsonObject;
use super::respond::{respond, SomeJobs};
use super::state::SharedState;
use crate::domain::job::Job;
use crate::domain::requests;
use crate::domain::state::JobState;
use crate::domain::time;
use crate::store::WorkerState;

pub async fn fetch(
    State(state): State<SharedState>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let req = requests::fetch(&body, &state.config.request_limits())?;
    let jobs = state.store.workers().fetch(req).await?;
    Ok(respond(StatusCode::OK, &SomeJobs { jobs: &jobs }))
}

pub async fn ack(
    State(state): State<SharedState>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let req = requests::ack(&body)?;
    let settled = state
        .store
        .jobs()
        .ack(&req.job_id, req.worker_id.as_deref(), req.result)
        .await?;
    let job = &settled.after.job;
    Ok(respond(
        StatusCode::OK,
        &Acked {
            acknowledged: true,
            id: &job.id,
            job_id: &job.id,
            state: job.state,
            completed_at: job.completed_at,
            job,
        },
    ))
}

/// ACK's answer: the job's outcome at the top level (HTTP binding §10.2), and the job.
#[derive(Serialize)]
struct Acked<'a> {
    acknowledged: bool,
    id: &'a str,
    job_id: &'a str,
    state: JobState,
    #[serde(with = "time::opt_millis")]
    completed_at: Option<DateTime<Utc>>,
    job: &'a Job,
}

/// FAIL; `requeue: true` puts the job straight back (conformance case
/// worker-graceful-shutdown.json).
pub async fn fail(
    State(state): State<SharedState>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let req = requests::fail(&body)?;
    let settled = state
        .store
        .jobs()
        .fail(
            &req.job_id,
            req.worker_id.as_deref(),
            &req.failure,
            req.requeue,
        )
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

/// BEAT (HTTP binding §10.4, worker protocol §4).
pub async fn heartbeat(
    State(state): State<SharedState>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let beat = requests::heartbeat(&body, &state.config.request_limits())?;
    let reply = state
        .store
        .workers()
        .heartbeat(&beat, state.config.allow_reset)
        .await?;
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
