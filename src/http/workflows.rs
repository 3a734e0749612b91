//! Workflows (HTTP binding §14, workflows spec §11; http-api §3.7): create, get, cancel.
//! A workflow answers as `{"workflow":{…}}` with both counter families the suites read
//! (`steps_*`, `jobs_*`) and the spec's `metadata`, and the same fields again at the top
//! level for the clients that read the workflow unwrapped (clients.md items 14 and 16).

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use serde_json::{json, Map, Value};

use super::error::ApiError;
use super::extract::{pagination, paging, JsonObject};
use super::respond::respond;
use super::state::SharedState;
use crate::domain::error::OjsError;
use crate::domain::fields::truncated;
use crate::domain::listing::{DEFAULT_PER_PAGE, MAX_PER_PAGE};
use crate::domain::time;
use crate::domain::workflow::{self, kind_name, Status, WorkflowRecord, WorkflowState};
use crate::store::WorkflowView;

pub async fn create(
    State(state): State<SharedState>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let request = workflow::parse(Value::Object(body))?;
    let view = state.store.workflows().create(&request).await?;
    let location = format!("/ojs/v1/workflows/{}", view.record.id);
    let mut response = respond(StatusCode::CREATED, &answer(describe(&view)));
    if let Ok(v) = HeaderValue::from_str(&location) {
        response.headers_mut().insert(header::LOCATION, v);
    }
    Ok(response)
}

pub async fn get(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let view = state.store.workflows().get(&id).await?;
    Ok(respond(StatusCode::OK, &answer(describe(&view))))
}

pub async fn cancel(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let (view, cancelled) = state.store.workflows().cancel(&id).await?;
    let mut described = describe(&view);
    let rec = &view.record;
    described.insert(
        "cancelled_at".into(),
        json!(rec.finished_at.map(time::format)),
    );
    described.insert("steps_cancelled".into(), json!(cancelled));
    described.insert("steps_already_completed".into(), json!(rec.completed()));
    // The names the `ojs` command line and the Rust client read.
    described.insert("cancelled_steps".into(), json!(cancelled));
    described.insert("steps_already_complete".into(), json!(rec.completed()));
    Ok(respond(StatusCode::OK, &answer(described)))
}

/// `GET /ojs/v1/workflows/{id}/progress` (the admin UI's workflow detail): the share of
/// steps finished, and each step's (1 once it ended, 0 before), from the workflow's two
/// reads; no member job is read.
pub async fn progress(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let view = state.store.workflows().get(&id).await?;
    let rec = &view.record;
    let steps: Vec<Value> = (0..rec.members())
        .map(|i| {
            let status = rec.status_of(i);
            let id = view
                .plan
                .step_ids
                .get(i)
                .cloned()
                .flatten()
                .unwrap_or_else(|| rec.member_id(i));
            let done = matches!(
                status,
                Status::Completed | Status::Failed | Status::Cancelled | Status::Skipped
            );
            json!({"id": id, "state": status.as_str(), "progress": if done { 1.0 } else { 0.0 }})
        })
        .collect();
    let ended = steps.iter().filter(|s| s["progress"] == 1.0).count();
    let progress = if steps.is_empty() {
        1.0
    } else {
        ended as f64 / steps.len() as f64
    };
    Ok(respond(
        StatusCode::OK,
        &json!({
            "workflow_id": rec.id,
            "state": rec.state.as_str(),
            "progress": progress,
            "steps": steps,
            "updated_at": time::format(rec.finished_at.or(rec.started_at).unwrap_or(rec.created_at)),
        }),
    ))
}

/// `{"workflow": w}` with `w`'s fields also at the top level.
fn answer(described: Map<String, Value>) -> Value {
    super::respond::wrapped_and_bare("workflow", Value::Object(described))
}

/// `GET /ojs/v1/workflows?state&page&per_page` (the admin UI's list, the `ojs` command
/// line's `workflow list`): the workflows changed last, most recent first, each without
/// its steps; `state` is one of the workflow states, `active` (running) or `pending`
/// (running, no step started yet).
pub async fn list(
    State(state): State<SharedState>,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let (limit, offset) = paging(&params, DEFAULT_PER_PAGE, MAX_PER_PAGE)?;
    let wanted: Option<fn(&WorkflowRecord) -> bool> = match params.get("state").map(String::as_str)
    {
        None | Some("") => None,
        Some("running" | "active") => Some(|r| r.state == WorkflowState::Running),
        Some("pending") => Some(|r| r.state == WorkflowState::Running && r.started_at.is_none()),
        Some("completed") => Some(|r| r.state == WorkflowState::Completed),
        Some("failed") => Some(|r| r.state == WorkflowState::Failed),
        Some("cancelled") => Some(|r| r.state == WorkflowState::Cancelled),
        Some(other) => {
            return Err(OjsError::invalid(
                "state",
                format!(
                    "state must be running, pending, completed, failed or cancelled, not {:?}.",
                    truncated(other)
                ),
            )
            .into())
        }
    };
    let mut records = state.store.workflows().recent().await?;
    if let Some(wanted) = wanted {
        records.retain(wanted);
    }
    let page: Vec<Value> = records
        .iter()
        .skip(offset)
        .take(limit)
        .map(|r| Value::Object(summary(r)))
        .collect();
    Ok(respond(
        StatusCode::OK,
        &json!({
            "items": page,
            "workflows": page,
            "total": records.len(),
            "pagination": pagination(records.len(), limit, offset, page.len()),
        }),
    ))
}

/// What a workflow shows without its plan: name, state, counts and times.
fn summary(rec: &WorkflowRecord) -> Map<String, Value> {
    let completed = rec.completed();
    let failed = rec.failed();
    let at = |t: Option<chrono::DateTime<chrono::Utc>>| json!(t.map(time::format));
    let Value::Object(summary) = json!({
        "id": rec.id,
        "type": kind_name(rec.kind),
        "name": rec.name,
        "state": rec.state.as_str(),
        "steps_total": rec.members(),
        "steps_completed": completed,
        "step_count": rec.members(),
        "jobs_total": rec.members(),
        "jobs_completed": completed,
        "jobs_failed": failed,
        "created_at": time::format(rec.created_at),
        "started_at": at(rec.started_at),
        "completed_at": at(rec.finished_at),
    }) else {
        unreachable!("built as an object")
    };
    summary
}

fn describe(view: &WorkflowView) -> Map<String, Value> {
    let (rec, plan) = (&view.record, &view.plan);
    let completed = rec.completed();
    let failed = rec.failed();
    let at = |t: Option<chrono::DateTime<chrono::Utc>>| json!(t.map(time::format));
    let steps: Vec<Value> = (0..rec.members())
        .map(|i| {
            let job_id = rec.member_id(i);
            let step_id = plan
                .step_ids
                .get(i)
                .cloned()
                .flatten()
                .unwrap_or_else(|| job_id.clone());
            json!({
                "index": i,
                "id": step_id,
                "type": plan.types.get(i),
                "state": rec.status_of(i).as_str(),
                "job_id": job_id,
            })
        })
        .collect();
    let callbacks: Map<String, Value> = rec
        .callbacks
        .iter()
        .zip(&plan.callback_types)
        .map(|((c, letter), job_type)| {
            let status = Status::from_letter(*letter);
            (
                c.name().to_owned(),
                json!({"type": job_type, "state": status.as_str(), "job_id": rec.callback_id(*c)}),
            )
        })
        .collect();
    let mut out = Value::Object(summary(rec));
    out["steps"] = json!(steps);
    out["metadata"] = json!({
            "created_at": time::format(rec.created_at),
            "started_at": at(rec.started_at),
            "completed_at": at(rec.finished_at),
            "job_count": rec.members(),
            "completed_count": completed,
            "failed_count": failed,
    });
    if !callbacks.is_empty() {
        out["callbacks"] = Value::Object(callbacks);
    }
    if let Some(failure) = &rec.failure {
        out["error"] = json!({
            "failed_step_index": failure.index,
            "failed_job_ids": [failure.id],
            "errors": [{"job_id": failure.id, "error": failure.error}],
        });
    }
    if let Some(parent) = &rec.parent {
        out["parent_workflow_id"] = json!(parent.workflow_id);
    }
    let Value::Object(described) = out else {
        return Map::new(); // built as an object above
    };
    described
}
