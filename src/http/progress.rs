//! Job progress (progress spec §6–§7, §10): `PUT` and `GET /ojs/v1/jobs/{id}/progress`, and
//! the OJS client libraries' `POST /ojs/v1/workers/progress` with a percentage.

use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};

use super::error::ApiError;
use super::extract::JsonObject;
use super::respond::{job_id, respond};
use super::state::SharedState;
use crate::domain::job::Job;
use crate::domain::progress::Update;
use crate::domain::time;
use crate::store::Reported;

/// `PUT /ojs/v1/jobs/{id}/progress` with `{progress: 0..1, data?, message?, worker_id?}`.
pub async fn put(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let id = job_id(&id)?;
    let update = Update::from_put(&body)?;
    report(&state, &id, update).await
}

/// `POST /ojs/v1/workers/progress` with `{job_id, percentage: 0..100, message?, data?}`.
pub async fn post(
    State(state): State<SharedState>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let (id, update) = Update::from_worker(&body)?;
    report(&state, &id, update).await
}

/// 200 for every report the job exists for: written, ignored because the job is not
/// active (the spec's fire-and-forget), or throttled into the next write.
async fn report(state: &SharedState, id: &str, update: Update) -> Result<Response, ApiError> {
    let body = match state.store.jobs().report_progress(id, update).await? {
        Reported::Written(job) => view(&job, json!({"ignored": false, "throttled": false})),
        Reported::Ignored(job) => view(&job, json!({"ignored": true, "throttled": false})),
        Reported::Throttled => json!({"job_id": id, "ignored": false, "throttled": true}),
    };
    Ok(respond(StatusCode::OK, &body))
}

/// `GET /ojs/v1/jobs/{id}/progress`: nulls when nothing was reported (spec §7.1).
pub async fn get(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let job = state.store.jobs().info(&job_id(&id)?).await?;
    let mut response = respond(StatusCode::OK, &view(&job, json!({})));
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Some(p) = job.progress {
        if let Ok(v) = HeaderValue::from_str(&p.to_string()) {
            headers.insert("x-ojs-progress", v);
        }
    }
    Ok(response)
}

/// The job's progress as the spec's GET answers it, with `extra` fields.
fn view(job: &Job, extra: Value) -> Value {
    let mut out = json!({
        "job_id": job.id,
        "state": job.state,
        "progress": job.progress,
        "data": job.progress_data,
        "message": job.progress_message,
        "updated_at": job.progress_updated_at.map(time::format),
    });
    if let (Some(out), Value::Object(extra)) = (out.as_object_mut(), extra) {
        out.extend(extra);
    }
    out
}
