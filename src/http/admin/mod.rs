//! The admin API (admin spec, `/ojs/v1/admin/…`): queues, jobs, bulk operations, workers,
//! statistics and the dead letter queue for operators and their tools, and the conformance
//! reset. Listings read the per-state sources of architecture §3.26, never every job.

pub mod dead_letter;
pub mod jobs;
pub mod queues;
pub mod stats;
pub mod system;
pub mod workers;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use chrono::{DateTime, Utc};
use serde_json::{json, Map, Value};

use super::error::ApiError;
use super::respond::respond;
use super::state::SharedState;
use crate::domain::bulk::{self, BulkOp, MAX_BULK_IDS};
use crate::domain::error::OjsError;
use crate::domain::fields;
use crate::domain::job::Job;
use crate::domain::listing::ListQuery;
use crate::domain::state::JobState;
use crate::store::Store;

/// Wipes every job, queue, worker and event of this namespace. Routed only when
/// `allow_reset` is on; it is never on by default.
pub async fn reset(State(state): State<SharedState>) -> Result<Response, ApiError> {
    state.store.reset().await?;
    Ok(respond(StatusCode::OK, &json!({ "reset": true })))
}

/// The jobs a filter matches, oldest first, at most `cap`; and whether more match.
pub(super) async fn select(
    store: &Store,
    mut q: ListQuery,
    cap: usize,
) -> Result<(Vec<Job>, bool), OjsError> {
    let mut jobs = Vec::new();
    loop {
        q.per_page = (cap - jobs.len()).clamp(1, crate::domain::listing::MAX_PER_PAGE);
        let page = store.jobs().list(&q).await?;
        jobs.extend(page.jobs);
        match page.next {
            Some(next) if jobs.len() < cap => q.cursor = Some(next),
            next => return Ok((jobs, next.is_some())),
        }
    }
}

/// Removes the finished jobs of `states` matching `q` that finished before `older_than`,
/// up to `MAX_BULK_IDS` a request (admin spec §6.5, §11.3): `{purged_count, states, more}`,
/// and `deleted` as the `ojs` command line reads it.
async fn purge(
    store: &Store,
    q: ListQuery,
    states: Vec<JobState>,
    older_than: Option<DateTime<Utc>>,
) -> Result<Response, ApiError> {
    let mut purged = 0;
    let mut more = false;
    for state in &states {
        let (jobs, left) = select(
            store,
            ListQuery {
                state: Some(*state),
                ..q.clone()
            },
            MAX_BULK_IDS - purged,
        )
        .await?;
        let ids: Vec<String> = jobs
            .into_iter()
            .filter(|job| {
                older_than.is_none_or(|limit| job.finished_at().is_some_and(|at| at < limit))
            })
            .map(|job| job.id)
            .collect();
        purged += store
            .jobs()
            .bulk(BulkOp::Delete, &ids)
            .await
            .iter()
            .filter(|r| r.is_ok())
            .count();
        more |= left;
        if purged >= MAX_BULK_IDS {
            more = true;
            break;
        }
    }
    Ok(respond(
        StatusCode::OK,
        &json!({
            "purged_count": purged,
            "deleted": purged,
            "states": states.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
            "more": more,
        }),
    ))
}

/// `older_than` of a purge request, an RFC 3339 time.
fn older_than(body: &Map<String, Value>) -> Result<Option<DateTime<Utc>>, OjsError> {
    match fields::string(body.get("older_than"), "older_than")? {
        None => Ok(None),
        Some(text) => DateTime::parse_from_rfc3339(text)
            .map(|t| Some(t.with_timezone(&Utc)))
            .map_err(|_| {
                OjsError::invalid(
                    "older_than",
                    format!(
                        "older_than must be an RFC 3339 time, got {:?}.",
                        fields::truncated(text)
                    ),
                )
            }),
    }
}

/// Runs a bulk operation over its selection (admin spec §8).
async fn run_bulk(
    store: &Store,
    body: &Map<String, Value>,
    op: BulkOp,
) -> Result<Response, ApiError> {
    match bulk::selection(body)? {
        bulk::Selection::Ids(ids) => run_on(store, op, ids, false).await,
        bulk::Selection::Filter(q) => run_on_listing(store, op, q).await,
    }
}

/// Runs a bulk operation over the first `MAX_BULK_IDS` jobs of a listing.
async fn run_on_listing(store: &Store, op: BulkOp, q: ListQuery) -> Result<Response, ApiError> {
    let (jobs, more) = select(store, q, MAX_BULK_IDS).await?;
    run_on(store, op, jobs.into_iter().map(|j| j.id).collect(), more).await
}

async fn run_on(
    store: &Store,
    op: BulkOp,
    ids: Vec<String>,
    more: bool,
) -> Result<Response, ApiError> {
    let results = store.jobs().bulk(op, &ids).await;
    let mut answer = bulk::admin_answer(op, &ids, &results);
    answer["more"] = json!(more);
    Ok(respond(StatusCode::OK, &answer))
}
