//! The dead letter queue for operators (admin spec §11): the discarded jobs it holds,
//! listed like any other state and purged by age (jobs discarded without an entry there are
//! the jobs listing's `discarded`). Retry and delete of one job are the data plane's.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::Utc;
use serde_json::Value;

use super::jobs::page_body;
use super::{older_than, purge, run_on_listing};
use crate::domain::bulk::{confirmed, finished_before, BulkOp};
use crate::domain::envelope::validate_queue;
use crate::domain::error::OjsError;
use crate::domain::fields;
use crate::domain::listing::ListQuery;
use crate::domain::state::JobState;
use crate::http::error::ApiError;
use crate::http::extract::JsonObject;
use crate::http::respond::respond;
use crate::http::state::SharedState;

/// `GET /admin/dead-letter?queue&per_page&cursor&order`: the jobs listing of `discarded`.
pub async fn list(
    State(state): State<SharedState>,
    Query(mut params): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    params.insert("state".into(), JobState::Discarded.as_str().into());
    let q = ListQuery {
        dead_letter_only: true,
        ..ListQuery::parse(&params)?
    };
    let page = state.store.jobs().list(&q).await?;
    Ok(respond(StatusCode::OK, &page_body(&q, page)))
}

/// `DELETE /admin/dead-letter` with `{confirm: true, older_than?, queue?}`.
pub async fn purge_all(
    State(state): State<SharedState>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    confirmed(&body)?;
    let queue = fields::string(body.get("queue"), "queue")?.map(str::to_owned);
    if let Some(q) = &queue {
        validate_queue(q)?;
    }
    let older_than = older_than(&body)?;
    let q = ListQuery {
        dead_letter_only: true,
        ..ListQuery::of(queue, None, None)
    };
    purge(&state.store, q, vec![JobState::Discarded], older_than).await
}

/// `POST /ojs/v1/dead-letter/purge?older_than=7d&queue=` (the `ojs` command line's
/// `dead-letter --purge`): the purge above, its path the confirmation, the age as a
/// duration; `{deleted}`.
pub async fn purge_by_age(
    State(state): State<SharedState>,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let queue = params.get("queue").filter(|q| !q.is_empty()).cloned();
    if let Some(q) = &queue {
        validate_queue(q)?;
    }
    let older_than = params
        .get("older_than")
        .filter(|a| !a.is_empty())
        .map(|text| finished_before(text, Utc::now()))
        .transpose()?;
    let q = ListQuery {
        dead_letter_only: true,
        ..ListQuery::of(queue, None, None)
    };
    purge(&state.store, q, vec![JobState::Discarded], older_than).await
}

/// `POST /ojs/v1/admin/dead-letter/retry` with `{filter: {queue?, type?}, confirm: true}`
/// (the admin UI's "Bulk Retry All": an empty filter is the whole dead letter queue): its
/// jobs run again, up to `MAX_BULK_IDS` a request, answered as a bulk retry.
pub async fn retry_all(
    State(state): State<SharedState>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    confirmed(&body)?;
    let mut params = HashMap::new();
    match fields::present(body.get("filter")) {
        None => {}
        Some(Value::Object(filter)) => {
            for (key, value) in filter {
                match (key.as_str(), value) {
                    (_, Value::Null) => {}
                    ("queue" | "type", Value::String(v)) => {
                        params.insert(key.clone(), v.clone());
                    }
                    ("queue" | "type", other) => {
                        return Err(fields::type_error(key, "a string", other).into())
                    }
                    (other, _) => {
                        return Err(OjsError::invalid(
                            "filter",
                            format!(
                                "Unknown filter field {:?}: the dead letter queue is filtered by queue and type.",
                                fields::truncated(other)
                            ),
                        )
                        .into())
                    }
                }
            }
        }
        Some(other) => return Err(fields::type_error("filter", "an object", other).into()),
    }
    let q = ListQuery::parse(&params)?;
    let q = ListQuery {
        dead_letter_only: true,
        ..ListQuery::of(q.queue, Some(JobState::Discarded), q.job_type)
    };
    run_on_listing(&state.store, BulkOp::Retry, q).await
}
