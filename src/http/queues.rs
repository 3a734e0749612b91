//! Queues (HTTP binding §11): list, statistics (also by priority), pause and resume.

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json, Value};

use super::error::ApiError;
use super::extract::{pagination, paging};
use super::respond::respond;
use super::state::SharedState;
use crate::domain::envelope::validate_queue;
use crate::domain::error::OjsError;
use crate::domain::state::JobState;
use crate::store::Pressure;

const DEFAULT_LIMIT: usize = 50;
const MAX_LIMIT: usize = 200;

fn status(paused: bool) -> &'static str {
    if paused {
        "paused"
    } else {
        "active"
    }
}

pub async fn list(
    State(state): State<SharedState>,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let (limit, offset) = paging(&params, DEFAULT_LIMIT, MAX_LIMIT)?;
    let all = state.store.queues().list();
    let total = all.len();
    let page: Vec<Value> = all
        .iter()
        .skip(offset)
        .take(limit)
        .map(|q| {
            json!({
                "name": q.name,
                "status": status(q.paused),
                "paused": q.paused,
                "created_at": crate::domain::time::format(q.created_at),
            })
        })
        .collect();
    Ok(respond(
        StatusCode::OK,
        &json!({
            "pagination": pagination(total, limit, offset, page.len()),
            "queues": page,
        }),
    ))
}

/// The union of the shapes clients read (docs: the suites' `queue` object, the HTTP
/// binding's `stats` and `status`, flat counters with `name` and `paused`).
pub async fn stats(
    State(state): State<SharedState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    validate_queue(&name)?;
    let stats = state.store.stats().queue(&name).await?;
    let paused = stats.meta.as_ref().is_some_and(|m| m.paused);
    let mut counts = serde_json::Map::new();
    for s in JobState::ALL {
        counts.insert(s.as_str().into(), json!(stats.counts.states.of(s)));
    }
    counts.insert("dead".into(), json!(stats.dead));
    counts.insert(
        "throughput_per_second".into(),
        json!(stats.counts.throughput(stats.computed_at)),
    );
    let mut queue = counts.clone();
    if let Some(p) = state.store.queues().pressure(&name).await? {
        queue.insert("backpressure".into(), backpressure_json(&p));
    }
    queue.insert("name".into(), json!(name));
    queue.insert("paused".into(), json!(paused));
    queue.insert("status".into(), json!(status(paused)));
    let mut body = queue.clone();
    body.insert("queue".into(), Value::Object(queue));
    body.insert("stats".into(), Value::Object(counts));
    body.insert(
        "computed_at".into(),
        json!(crate::domain::time::format(stats.computed_at)),
    );
    Ok(respond(StatusCode::OK, &body))
}

/// `GET /queues/{name}/priority-stats` (priority spec §10.3): the queue's waiting and
/// running jobs by priority, as the spec (`counts_by_priority`, `total`) and the admin UI
/// (`distribution`) read them.
pub async fn priority_stats(
    State(state): State<SharedState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    validate_queue(&name)?;
    let counts = state
        .store
        .queues()
        .by_priority(&name)
        .await?
        .ok_or_else(|| OjsError::not_found("queue", &name))?;
    let by_priority: serde_json::Map<String, Value> = counts
        .iter()
        .map(|(p, n)| (p.to_string(), json!(n)))
        .collect();
    let distribution: Vec<Value> = counts
        .iter()
        .map(|(p, n)| json!({"priority": p, "count": n}))
        .collect();
    Ok(respond(
        StatusCode::OK,
        &json!({
            "queue": name,
            "counts_by_priority": by_priority,
            "distribution": distribution,
            "total": counts.iter().map(|(_, n)| n).sum::<u64>(),
        }),
    ))
}

pub async fn pause(
    State(state): State<SharedState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    set_paused(state, name, true).await
}

pub async fn resume(
    State(state): State<SharedState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    set_paused(state, name, false).await
}

async fn set_paused(state: SharedState, name: String, paused: bool) -> Result<Response, ApiError> {
    validate_queue(&name)?;
    let meta = state.store.queues().pause(&name, paused).await?;
    let mut queue = json!({
        "name": meta.name,
        "paused": meta.paused,
        "status": status(meta.paused),
    });
    if let Some(at) = meta.paused_at {
        queue["paused_at"] = json!(crate::domain::time::format(at));
    }
    if let Some(at) = meta.resumed_at {
        queue["resumed_at"] = json!(crate::domain::time::format(at));
    }
    // The queue's fields also at the top level, where the HTTP binding puts them.
    let mut body = queue.clone();
    body["queue"] = queue;
    Ok(respond(StatusCode::OK, &body))
}

/// A bound as the backpressure spec configures it (§6.2), with the depth now and the
/// pressure (§7.3).
pub fn backpressure_json(p: &Pressure) -> Value {
    json!({
        "max_depth": p.bound.max_depth,
        "strategy": p.bound.strategy.as_str(),
        "warning_threshold": p.bound.warning_threshold,
        "depth": p.depth,
        "pressure": p.bound.pressure(p.depth),
    })
}
