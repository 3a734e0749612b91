//! Workflows (HTTP binding §14, workflows spec §11; http-api §3.7): create, get, cancel.
//! A workflow answers as `{"workflow":{…}}` with both counter families the suites read
//! (`steps_*`, `jobs_*`) and the spec's `metadata`, and the same fields again at the top
//! level for the clients that read the workflow unwrapped (clients.md items 14 and 16).

use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use serde_json::{json, Map, Value};

use super::error::ApiError;
use super::extract::JsonObject;
use super::respond::respond;
use super::state::SharedState;
use crate::domain::time;
use crate::domain::workflow::{self, kind_name, Status};
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

/// `{"workflow": w}` with `w`'s fields also at the top level.
fn answer(described: Map<String, Value>) -> Value {
    super::respond::wrapped_and_bare("workflow", Value::Object(described))
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
    let mut out = json!({
        "id": rec.id,
        "type": kind_name(rec.kind),
        "name": rec.name,
        "state": rec.state.as_str(),
        "steps_total": rec.members(),
        "steps_completed": completed,
        "jobs_total": rec.members(),
        "jobs_completed": completed,
        "jobs_failed": failed,
        "steps": steps,
        "created_at": time::format(rec.created_at),
        "started_at": at(rec.started_at),
        "completed_at": at(rec.finished_at),
        "metadata": {
            "created_at": time::format(rec.created_at),
            "started_at": at(rec.started_at),
            "completed_at": at(rec.finished_at),
            "job_count": rec.members(),
            "completed_count": completed,
            "failed_count": failed,
        },
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
