//! Rate-limit inspection and override (rate-limiting spec §10.1–§10.3): each limited
//! queue's limits and how much of them is in use. Limits are per queue here, so a
//! partition's key is the queue's name; they are set by a job's `rate_limit` or `PUT
//! /admin/queues/{name}/config`, and an operator's override rules over them for a while.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::Utc;
use serde_json::{json, Value};
use std::collections::HashMap;

use super::error::ApiError;
use super::extract::{pagination, paging, JsonObject};
use super::respond::respond;
use super::state::SharedState;
use crate::domain::envelope::validate_queue;
use crate::domain::error::OjsError;
use crate::domain::rate_limit::{LimitOverride, RateLimit};
use crate::domain::state::JobState;
use crate::domain::{duration, time};
use crate::store::LimitUsage;

/// Limited queues a page shows unless `per_page` or `limit` says otherwise, and at most.
const DEFAULT_PER_PAGE: usize = 50;
const MAX_PER_PAGE: usize = 1_000;

/// `GET /rate-limits`: the limited queues, as `GET /rate-limits/{key}` shows each, a page
/// at a time (by `page`/`per_page` or `limit`/`offset`).
pub async fn list(
    State(state): State<SharedState>,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let (limit, offset) = paging(&params, DEFAULT_PER_PAGE, MAX_PER_PAGE)?;
    let mut queues = state.store.queues().limited_queues();
    queues.sort();
    let total = queues.len();
    let mut items = Vec::new();
    for queue in queues.into_iter().skip(offset).take(limit) {
        if let Some(usage) = state.store.queues().limit_usage(&queue).await? {
            items.push(item(&state, &queue, usage).await?);
        }
    }
    // `rate_limits`: the same limits flat, a concurrency limit as a number beside its
    // `active` and `available` (the `ojs` command line reads them so).
    let flat: Vec<Value> = items.iter().map(flat).collect();
    Ok(respond(
        StatusCode::OK,
        &json!({
            "pagination": pagination(total, limit, offset, items.len()),
            "items": items,
            "rate_limits": flat,
        }),
    ))
}

fn flat(item: &Value) -> Value {
    let mut out = item.clone();
    if let Some(concurrency) = item.get("concurrency") {
        out["concurrency"] = concurrency["limit"].clone();
        out["active"] = concurrency["active"].clone();
        out["available"] = concurrency["available"].clone();
    }
    out
}

/// `GET /rate-limits/{key}`, the key being a queue's name.
pub async fn get(
    State(state): State<SharedState>,
    Path(key): Path<String>,
) -> Result<Response, ApiError> {
    validate_queue(&key)?;
    let usage = state
        .store
        .queues()
        .limit_usage(&key)
        .await?
        .ok_or_else(|| OjsError::not_found("rate limit", &key))?;
    Ok(respond(StatusCode::OK, &item(&state, &key, usage).await?))
}

async fn item(state: &SharedState, queue: &str, usage: LimitUsage) -> Result<Value, OjsError> {
    let counts = state.store.stats().queue_counts(queue).await?;
    let of = |s: JobState| counts.as_ref().map_or(0, |c| c.states.of(s));
    let waiting = of(JobState::Available);
    // `waiting`, `active`, `limit` and `period` flat as well: the admin UI's columns (a
    // concurrency limit's places taken replace `active` below).
    let mut body = json!({
        "key": queue,
        "waiting_count": waiting,
        "waiting": waiting,
        "active": of(JobState::Active),
    });
    if let Some(limit) = usage.limits.concurrency {
        let available = limit.saturating_sub(usage.active);
        body["limit"] = json!(limit);
        body["concurrency"] = json!({
            "limit": limit,
            "active": usage.active,
            "available": available,
        });
        // Also flat, where the `ojs` command line's `rate-limits --inspect` reads them.
        body["active"] = json!(usage.active);
        body["available"] = json!(available);
    }
    if let Some(rate) = usage.limits.rate {
        body["limit"] = json!(rate.limit);
        body["period"] = json!(short_period(rate));
        body["rate"] = json!({
            "limit": rate.limit,
            "period": duration::format_iso(rate.window()),
            "window_ms": rate.window_ms,
            "current_count": usage.started,
            "window_resets_at": chrono::DateTime::from_timestamp_millis(usage.window_ends_ms)
                .map(time::format),
        });
    }
    // What the override sets, in the spec's shape and flat (`limit`/`period`: the admin
    // UI's badge).
    if let Some(set) = usage.overridden {
        let mut shown = json!({"set_at": time::format(set.set_at)});
        if let Some(concurrency) = set.concurrency {
            shown["concurrency"] = json!(concurrency);
        }
        if let Some(rate) = set.rate {
            shown["rate"] =
                json!({"limit": rate.limit, "period": duration::format_iso(rate.window())});
            shown["limit"] = json!(rate.limit);
            shown["period"] = json!(short_period(rate));
        } else if let Some(concurrency) = set.concurrency {
            shown["limit"] = json!(concurrency);
        }
        if let Some(end) = set.expires_at {
            shown["expires_at"] = json!(time::format(end));
        }
        body["override"] = shown;
    }
    Ok(body)
}

fn short_period(rate: RateLimit) -> String {
    duration::format_short(rate.window())
}

/// `PUT /rate-limits/{key}` (rate-limiting spec §10.2), also at `…/override` (the `ojs`
/// command line): an operator's limits in force on every replica instead of the queue's
/// own until `expires_at` or their removal. Answers the limits as `GET` shows them.
pub async fn set_override(
    State(state): State<SharedState>,
    Path(key): Path<String>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    validate_queue(&key)?;
    let set = LimitOverride::parse(&body, Utc::now())?;
    state.store.queues().override_limits(&key, set).await?;
    get(State(state), Path(key)).await
}

/// `DELETE /rate-limits/{key}/override`: the queue's own limits apply again. Answers the
/// limits in force (`removed` says whether there was an override).
pub async fn remove_override(
    State(state): State<SharedState>,
    Path(key): Path<String>,
) -> Result<Response, ApiError> {
    validate_queue(&key)?;
    let removed = state.store.queues().end_override(&key, None).await?;
    let mut body = match state.store.queues().limit_usage(&key).await? {
        Some(usage) => item(&state, &key, usage).await?,
        None => json!({"key": key}),
    };
    body["removed"] = json!(removed);
    Ok(respond(StatusCode::OK, &body))
}
