//! The dead letter queue for operators (admin spec §11): the discarded jobs it holds,
//! listed like any other state and purged by age (jobs discarded without an entry there are
//! the jobs listing's `discarded`). Retry and delete of one job are the data plane's.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;

use super::jobs::page_body;
use super::{older_than, purge};
use crate::domain::bulk::confirmed;
use crate::domain::envelope::validate_queue;
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
