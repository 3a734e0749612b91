//! Queues for operators (admin spec §6): every queue with its counts and throughput, one
//! queue's configuration read and changed, and purging its finished jobs. Pause and resume
//! are the data plane's (`http/queues.rs`) under the admin path.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::Utc;
use serde_json::{json, Value};

use super::older_than;
use crate::domain::bulk::confirmed;
use crate::domain::envelope::validate_queue;
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::fields;
use crate::domain::listing::ListQuery;
use crate::domain::queue_config::{self, QueueConfig};
use crate::domain::state::JobState;
use crate::domain::stats::QueueCounts;
use crate::domain::time::format;
use crate::http::error::ApiError;
use crate::http::extract::JsonObject;
use crate::http::queues::backpressure_json;
use crate::http::respond::respond;
use crate::http::state::SharedState;
use crate::store::QueueMeta;

/// `GET /admin/queues`: every registered queue, one counter read each (admin spec §6.1).
pub async fn list(State(state): State<SharedState>) -> Result<Response, ApiError> {
    let counts = state.store.stats().current_queue_counts().await?;
    let mut queues = state.store.queues().list();
    queues.sort_by(|a, b| a.name.cmp(&b.name));
    let items: Vec<Value> = queues
        .iter()
        .map(|meta| {
            let c = counts
                .iter()
                .find(|(name, _)| *name == meta.name)
                .map(|(_, c)| c);
            item(&meta.name, Some(meta), c)
        })
        .collect();
    Ok(respond(
        StatusCode::OK,
        &json!({
            "items": items,
            "pagination": {"total": items.len(), "page": 1, "per_page": items.len()},
        }),
    ))
}

/// `GET /admin/queues/{name}`: the list item, the limits in force and the DLQ count.
pub async fn get(
    State(state): State<SharedState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    validate_queue(&name)?;
    let stats = state.store.stats().queue(&name).await?;
    let meta = stats.meta.as_ref();
    let mut body = item(&name, meta, Some(&stats.counts));
    body["configuration"] = json!({
        "rate_limit": meta.and_then(|m| m.rate_limit).map(|r| json!({"limit": r.limit, "window_ms": r.window_ms})),
        "concurrency": meta.and_then(|m| m.concurrency),
        "priorities": meta.map(|m| m.priorities.clone()).unwrap_or_default(),
        "backpressure": state.store.queues().pressure(&name).await?.map(|p| backpressure_json(&p)),
    });
    body["dead_letter"] = json!(stats.dead);
    if let Some(at) = meta.and_then(|m| m.paused_at) {
        body["paused_at"] = json!(format(at));
    }
    Ok(respond(StatusCode::OK, &body))
}

/// `PUT /admin/queues/{name}/config` (admin spec §6.6): concurrency and rate limits, in
/// force on every replica as a job's `rate_limit` makes them, and the queue's bound
/// (backpressure spec §6.2); answers the queue's detail.
pub async fn configure(
    State(state): State<SharedState>,
    Path(name): Path<String>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    validate_queue(&name)?;
    let config = queue_config::parse(&body, &name)?;
    apply(&state, &name, config).await?;
    get(State(state), Path(name)).await
}

/// A queue's limits, then its bound, each when the configuration names it.
async fn apply(state: &SharedState, name: &str, config: QueueConfig) -> Result<(), OjsError> {
    if let Some(limits) = config.limits {
        state.store.queues().configure_queue(name, limits).await?;
    }
    if let Some(bound) = config.bound {
        state.store.queues().configure_bound(name, bound).await?;
    }
    Ok(())
}

/// `POST /ojs/v1/queues` with `{name, concurrency?, max_size?, …}` (the `ojs` command
/// line's `queues --create`): registers the queue, then applies the settings as `PUT
/// /admin/queues/{name}/config` does; 201 with the queue as `GET /admin/queues/{name}`
/// shows it, 200 when it existed.
pub async fn create(
    State(state): State<SharedState>,
    JsonObject(mut body): JsonObject,
) -> Result<Response, ApiError> {
    let name = fields::string(body.get("name"), "name")?
        .ok_or_else(|| fields::missing("name", "the queue's name"))?
        .to_owned();
    validate_queue(&name)?;
    body.remove("name");
    let config = if body.values().any(|v| !v.is_null()) {
        Some(queue_config::parse(&body, &name)?)
    } else {
        None
    };
    let existed = state.store.queues().list().iter().any(|q| q.name == name);
    state.store.queues().register(&name).await?;
    if let Some(config) = config {
        apply(&state, &name, config).await?;
    }
    let mut response = get(State(state), Path(name)).await?;
    if !existed {
        *response.status_mut() = StatusCode::CREATED;
    }
    Ok(response)
}

/// `DELETE /ojs/v1/queues/{name}` (the `ojs` command line's `queues --delete`): deletes a
/// queue that holds no unfinished job, counted exactly as of the request (409 otherwise:
/// let them finish, or cancel and purge them first). It is no longer listed; its finished
/// jobs stay until pruned, and a job that reaches it again (a PUSH, a cron tick) brings
/// it back (architecture §3.17).
pub async fn delete(
    State(state): State<SharedState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    validate_queue(&name)?;
    let stats = state.store.stats().queue(&name).await?;
    let states = &stats.counts.states;
    let unfinished = states.unfinished();
    if stats.meta.is_some_and(|m| m.deleted_at.is_none()) && unfinished > 0 {
        let mut err = OjsError::new(
            ErrorCode::Conflict,
            format!(
                "Queue '{name}' holds {unfinished} unfinished jobs: let them finish, or cancel and purge them, before deleting it."
            ),
        )
        .with_detail("queue", name.clone())
        .with_detail("unfinished", unfinished);
        for s in JobState::ALL.into_iter().filter(|s| !s.is_terminal()) {
            err = err.with_detail(s.as_str(), states.of(s));
        }
        return Err(err.into());
    }
    state.store.queues().delete(&name).await?;
    Ok(respond(
        StatusCode::OK,
        &json!({"queue": name, "deleted": true}),
    ))
}

/// `DELETE /admin/queues/{name}/jobs` with `{states, older_than?, confirm: true}`: removes
/// finished jobs only; waiting and running ones are cancelled first (bulk cancel).
pub async fn purge_jobs(
    State(state): State<SharedState>,
    Path(name): Path<String>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    validate_queue(&name)?;
    confirmed(&body)?;
    purge_finished(&state, name, &body).await
}

/// `POST /ojs/v1/queues/{name}/purge` with `{states, older_than?}` (the `ojs` command
/// line's `queues --purge`): the purge above, its path the confirmation; `{deleted}`.
pub async fn purge(
    State(state): State<SharedState>,
    Path(name): Path<String>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    validate_queue(&name)?;
    purge_finished(&state, name, &body).await
}

async fn purge_finished(
    state: &SharedState,
    name: String,
    body: &serde_json::Map<String, Value>,
) -> Result<Response, ApiError> {
    let states = fields::array(body.get("states"), "states", "an array of states")?
        .ok_or_else(|| fields::missing("states", "an array of finished states"))?
        .iter()
        .map(|v| {
            v.as_str()
                .and_then(JobState::parse)
                .filter(|s| s.is_terminal())
                .ok_or_else(|| {
                    OjsError::invalid(
                        "states",
                        "states may name completed, cancelled and discarded; cancel waiting or running jobs first.",
                    )
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if states.is_empty() {
        return Err(OjsError::invalid("states", "Name at least one state to purge.").into());
    }
    let older_than = older_than(body)?;
    super::purge(
        &state.store,
        ListQuery::of(Some(name), None, None),
        states,
        older_than,
    )
    .await
}

/// A queue as listed: name, state, counts by state, throughput.
fn item(name: &str, meta: Option<&QueueMeta>, counts: Option<&QueueCounts>) -> Value {
    let mut by_state = serde_json::Map::new();
    for s in JobState::ALL {
        by_state.insert(
            s.as_str().into(),
            json!(counts.map_or(0, |c| c.states.of(s))),
        );
    }
    let now = Utc::now();
    let per_second = counts.map_or(0.0, |c| c.throughput(now));
    let failed = counts.map_or(0, |c| c.failed_per_minute(now));
    let paused = meta.is_some_and(|m| m.paused);
    json!({
        "name": name,
        "state": if paused { "paused" } else { "active" },
        "paused": paused,
        "counts": by_state,
        "throughput": {"processed_per_minute": per_second * 60.0, "failed_per_minute": failed},
        "created_at": meta.map(|m| format(m.created_at)),
    })
}
