//! System operations (admin spec §12): maintenance mode, and the configuration in force
//! without secrets.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use chrono::Utc;

use crate::domain::maintenance::Maintenance;
use crate::http::error::ApiError;
use crate::http::extract::JsonObject;
use crate::http::respond::respond;
use crate::http::state::SharedState;

/// `GET /admin/system/maintenance` (also `/admin/maintenance`): the switch as it stands.
pub async fn maintenance(State(state): State<SharedState>) -> Response {
    let now = Utc::now();
    respond(
        StatusCode::OK,
        &state.store.system().maintenance().answer(now),
    )
}

/// `POST /admin/system/maintenance` (admin spec §12.1; also `/admin/maintenance`) with
/// `{enabled, reason?, duration?}`: every replica stops handing out work, promoting and
/// firing cron ticks while enqueues go on (architecture §3.31).
pub async fn set_maintenance(
    State(state): State<SharedState>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let now = Utc::now();
    let m = Maintenance::parse(&body, now)?;
    state.store.system().set_maintenance(&m).await?;
    Ok(respond(StatusCode::OK, &m.answer(now)))
}

/// `GET /admin/system/config` (admin spec §12.2): this replica's settings (`Config::public`).
pub async fn config(State(state): State<SharedState>) -> Response {
    respond(StatusCode::OK, &state.config.public())
}
