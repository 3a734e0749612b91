//! System operations (admin spec §12): the configuration in force, without secrets.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;

use crate::http::respond::respond;
use crate::http::state::SharedState;

/// `GET /admin/system/config` (admin spec §12.2): this replica's settings (`Config::public`).
pub async fn config(State(state): State<SharedState>) -> Response {
    respond(StatusCode::OK, &state.config.public())
}
