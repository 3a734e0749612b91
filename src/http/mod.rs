//! The OJS HTTP binding on axum: routes, the response conventions every endpoint shares
//! (content type, `OJS-Version`, `X-Request-Id`, error bodies) and request metrics.

mod admin;
pub mod auth;
mod bulk;
mod cron;
mod dead_letter;
mod error;
mod events;
mod extract;
mod jobs;
mod progress;
mod queues;
mod stream;
mod system;
mod workers;
mod workflows;

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Serialize;
use tracing::error;
use uuid::Uuid;

use crate::config::Config;
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::fields::truncated;
use crate::store::Store;
use crate::telemetry::metrics::Metrics;
pub use error::ApiError;

/// The only response media type (HTTP binding §4.3).
pub const OJS_MEDIA_TYPE: &str = "application/openjobspec+json";

/// Shared by every handler.
pub struct AppState {
    pub store: Store,
    pub config: Config,
    pub metrics: Metrics,
    /// The API keys the routes ask for.
    pub keys: auth::Keys,
    pub started: Instant,
    /// Live event streams this gateway may still open (`stream.rs`).
    pub event_streams: Arc<tokio::sync::Semaphore>,
}

pub type SharedState = Arc<AppState>;

pub use stream::MAX_STREAMS as MAX_EVENT_STREAMS;

/// The whole HTTP API.
pub fn router(state: SharedState) -> Router {
    let mut api = Router::new()
        .route("/ojs/manifest", get(system::manifest))
        .route("/ojs/v1/health", get(system::health))
        .route("/ojs/v1/health/live", get(system::live))
        .route("/healthz", get(system::live))
        .route("/ojs/v1/health/ready", get(system::ready))
        .route("/readyz", get(system::ready))
        .route("/metrics", get(system::metrics))
        .route("/ojs/v1/jobs", post(jobs::enqueue))
        .route("/ojs/v1/jobs/batch", post(jobs::enqueue_batch))
        .route("/ojs/v1/jobs/bulk/cancel", post(bulk::cancel))
        .route("/ojs/v1/jobs/bulk/retry", post(bulk::retry))
        .route("/ojs/v1/jobs/bulk/delete", post(bulk::delete))
        .route("/ojs/v1/jobs/{id}", get(jobs::info).delete(jobs::cancel))
        .route("/ojs/v1/jobs/{id}/activate", post(jobs::activate))
        .route(
            "/ojs/v1/jobs/{id}/progress",
            get(progress::get).put(progress::put),
        )
        .route("/ojs/v1/workers/fetch", post(workers::fetch))
        .route("/ojs/v1/workers/ack", post(workers::ack))
        .route("/ojs/v1/workers/nack", post(workers::fail))
        .route("/ojs/v1/workers/fail", post(workers::fail))
        .route("/ojs/v1/workers/heartbeat", post(workers::heartbeat))
        .route("/ojs/v1/workers/progress", post(progress::post))
        .route("/ojs/v1/queues", get(queues::list))
        .route("/ojs/v1/queues/{name}/stats", get(queues::stats))
        .route("/ojs/v1/queues/{name}/pause", post(queues::pause))
        .route("/ojs/v1/queues/{name}/resume", post(queues::resume))
        .route("/ojs/v1/dead-letter", get(dead_letter::list))
        .route(
            "/ojs/v1/dead-letter/{id}",
            get(dead_letter::get).delete(dead_letter::delete),
        )
        .route("/ojs/v1/dead-letter/{id}/retry", post(dead_letter::retry))
        .route("/ojs/v1/admin/workers/{id}", get(admin::worker))
        .route("/ojs/v1/admin/workers/{id}/quiet", post(admin::quiet))
        .route(
            "/ojs/v1/admin/workers/{id}/terminate",
            post(admin::terminate),
        )
        .route("/ojs/v1/events", get(events::list))
        .route("/ojs/v1/events/stream", get(stream::events))
        .route("/ojs/v1/jobs/{id}/events", get(stream::job))
        .route("/ojs/v1/queues/{name}/events", get(stream::queue))
        .route("/ojs/v1/cron", post(cron::register).get(cron::list))
        .route("/ojs/v1/cron/{name}", get(cron::get).delete(cron::delete))
        .route("/ojs/v1/workflows", post(workflows::create))
        .route(
            "/ojs/v1/workflows/{id}",
            get(workflows::get).delete(workflows::cancel),
        );
    if state.config.allow_reset {
        api = api.route("/ojs/v1/admin/reset", post(admin::reset));
    }
    api.fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            auth::authenticate,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), conventions))
        .with_state(state)
}

/// A JSON response with the OJS media type.
pub fn respond<T: Serialize>(status: StatusCode, body: &T) -> Response {
    let bytes = serde_json::to_vec(body).expect("response bodies serialize");
    let mut response = (status, bytes).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(OJS_MEDIA_TYPE),
    );
    response
}

/// `{key: object}` with the object's fields also at the top level, but `except`: the body
/// the suites read (wrapped) and the one OJS client libraries read (bare) at once
/// (clients.md items 14-16).
pub fn wrapped_and_bare(
    key: &str,
    object: serde_json::Value,
    except: &[&str],
) -> serde_json::Value {
    let mut body = match &object {
        serde_json::Value::Object(fields) => fields.clone(),
        _ => serde_json::Map::new(),
    };
    for field in except {
        body.remove(*field);
    }
    body.insert(key.to_owned(), object);
    serde_json::Value::Object(body)
}

async fn not_found(req: Request) -> ApiError {
    OjsError::new(
        ErrorCode::NotFound,
        format!("No endpoint at {} {}.", req.method(), req.uri().path()),
    )
    .with_detail("resource_type", "route")
    .with_detail("resource_id", truncated(req.uri().path()))
    .into()
}

async fn method_not_allowed(req: Request) -> Response {
    let err = OjsError::new(
        ErrorCode::InvalidRequest,
        format!("{} is not allowed on {}.", req.method(), req.uri().path()),
    );
    let mut response = ApiError(err).into_response();
    *response.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
    response
}

/// Header conventions of HTTP binding §3.2 and §6.5 on every response, the request id in
/// error bodies, one log line per server error, and request metrics.
async fn conventions(State(state): State<SharedState>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let request_id = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 200)
        .map(str::to_owned)
        .unwrap_or_else(|| format!("req_{}", Uuid::now_v7()));
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_owned();
    let method = req.method().clone();
    let plain_json = wants_plain_json(req.headers());
    let version = req
        .headers()
        .get("ojs-version")
        .map(|v| v.to_str().unwrap_or("?").trim().to_owned());

    let mut response = match version.as_deref() {
        None | Some("1" | "1.0" | "1.0.0-rc.1") => next.run(req).await,
        Some(other) => ApiError(OjsError::new(
            ErrorCode::Unsupported,
            format!("OJS-Version {other:?} is not supported; this server speaks 1.0."),
        ))
        .into_response(),
    };
    // A rejection by the framework itself (a path or query that does not decode, say) is
    // plain text: answer it in the OJS error format like every other error.
    if response.status().is_client_error()
        && response.extensions().get::<OjsError>().is_none()
        && response
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.as_bytes())
            != Some(OJS_MEDIA_TYPE.as_bytes())
    {
        let text = axum::body::to_bytes(std::mem::take(response.body_mut()), 4096)
            .await
            .unwrap_or_default();
        let reason = String::from_utf8_lossy(&text);
        response.extensions_mut().insert(OjsError::new(
            ErrorCode::InvalidRequest,
            format!("The request could not be read: {}", reason.trim()),
        ));
    }
    if let Some(err) = response.extensions_mut().remove::<OjsError>() {
        if response.status().is_server_error() {
            error!(request_id = %request_id, %method, route = %route, error = %err.with_causes(), "request failed");
        }
        let status = response.status();
        let mut rendered = respond(status, &error::body(&err, Some(&request_id)));
        std::mem::swap(response.body_mut(), rendered.body_mut());
        response.headers_mut().remove(header::CONTENT_LENGTH);
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(OJS_MEDIA_TYPE),
        );
    }
    let headers = response.headers_mut();
    if plain_json
        && headers.get(header::CONTENT_TYPE).map(|v| v.as_bytes())
            == Some(OJS_MEDIA_TYPE.as_bytes())
    {
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    headers.insert("ojs-version", HeaderValue::from_static("1.0"));
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        headers.insert("x-request-id", v);
    }
    state.metrics.observe_request(
        method.as_str(),
        &route,
        response.status().as_u16(),
        started.elapsed(),
    );
    response
}

/// Whether `Accept` names `application/json` and not the OJS media type: such clients (the
/// Python OJS client, asked to) read only bodies labelled `application/json`, so JSON
/// responses are labelled so for them; everyone else gets the OJS media type.
fn wants_plain_json(headers: &axum::http::HeaderMap) -> bool {
    let mut json = false;
    for accept in headers.get_all(header::ACCEPT) {
        for media in accept.to_str().unwrap_or("").split(',') {
            let media = media.split(';').next().unwrap_or("").trim();
            if media.eq_ignore_ascii_case(OJS_MEDIA_TYPE) {
                return false;
            }
            json |= media.eq_ignore_ascii_case("application/json");
        }
    }
    json
}

/// Reads a path id as a job id; anything else names no job (404) and never reaches NATS,
/// where it would become part of a subject.
fn job_id(raw: &str) -> Result<String, OjsError> {
    crate::domain::envelope::parse_job_id(raw)
        .ok_or_else(|| OjsError::not_found("job", &truncated(raw)))
}
