//! The OJS HTTP binding on axum: routes, the response conventions every endpoint shares
//! (content type, `OJS-Version`, `X-Request-Id`, error bodies) and request metrics.

mod admin;
pub mod auth;
mod bulk;
mod cron;
mod dashboard;
mod dead_letter;
mod error;
mod events;
mod extract;
mod jobs;
mod openapi;
mod progress;
pub mod queues;
mod rate_limits;
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
use axum::Router;
use serde::Serialize;
use tracing::error;
use tracing::Instrument;
use uuid::Uuid;

use crate::config::Config;
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::fields::truncated;
use crate::store::{deadline, Store};
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
    /// This replica's last leadership given up for a stalled service, for the health check.
    pub stalls: crate::coordinator::Stalls,
}

pub type SharedState = Arc<AppState>;

use openapi::Routes;
pub use stream::MAX_STREAMS as MAX_EVENT_STREAMS;

/// The whole HTTP API. Every route goes through `Routes::add`, which also documents it
/// for `GET /ojs/v1/openapi.json`.
pub fn router(state: SharedState) -> Router {
    use axum::http::Method as M;
    let mut api = Routes::new()
        .add(
            M::GET,
            "/ojs/manifest",
            "What this server implements",
            system::manifest,
        )
        .add(
            M::GET,
            "/ojs/v1/health",
            "Health and NATS connectivity",
            system::health,
        )
        .add(
            M::GET,
            "/ojs/v1/health/live",
            "Liveness: the process serves HTTP",
            system::live,
        )
        .add(M::GET, "/healthz", "Liveness (alias)", system::live)
        .add(
            M::GET,
            "/ojs/v1/health/ready",
            "Readiness: 503 while NATS is unreachable",
            system::ready,
        )
        .add(M::GET, "/readyz", "Readiness (alias)", system::ready)
        .add(M::GET, "/metrics", "Prometheus metrics", system::metrics)
        .add(
            M::POST,
            "/ojs/v1/jobs",
            "Enqueue a job (PUSH)",
            jobs::enqueue,
        )
        .add(
            M::POST,
            "/ojs/v1/jobs/batch",
            "Enqueue jobs, all or none",
            jobs::enqueue_batch,
        )
        .add(
            M::POST,
            "/ojs/v1/jobs/bulk/cancel",
            "Cancel jobs by id",
            bulk::cancel,
        )
        .add(
            M::POST,
            "/ojs/v1/jobs/bulk/retry",
            "Retry discarded or retryable jobs by id",
            bulk::retry,
        )
        .add(
            M::POST,
            "/ojs/v1/jobs/bulk/delete",
            "Delete finished jobs by id",
            bulk::delete,
        )
        .add(M::GET, "/ojs/v1/jobs/{id}", "A job (INFO)", jobs::info)
        .add(
            M::DELETE,
            "/ojs/v1/jobs/{id}",
            "Cancel a job (CANCEL)",
            jobs::cancel,
        )
        .add(
            M::POST,
            "/ojs/v1/jobs/{id}/activate",
            "Release a pending job",
            jobs::activate,
        )
        .add(
            M::GET,
            "/ojs/v1/jobs/{id}/progress",
            "A job's progress",
            progress::get,
        )
        .add(
            M::PUT,
            "/ojs/v1/jobs/{id}/progress",
            "Report progress (also a heartbeat)",
            progress::put,
        )
        .add(
            M::GET,
            "/ojs/v1/jobs/{id}/events",
            "A job's live events (SSE)",
            stream::job,
        )
        .add(
            M::POST,
            "/ojs/v1/workers/fetch",
            "Claim jobs (FETCH)",
            workers::fetch,
        )
        .add(
            M::POST,
            "/ojs/v1/workers/ack",
            "Report success (ACK)",
            workers::ack,
        )
        .add(
            M::POST,
            "/ojs/v1/workers/nack",
            "Report failure (FAIL)",
            workers::fail,
        )
        .add(
            M::POST,
            "/ojs/v1/workers/fail",
            "Report failure (FAIL)",
            workers::fail,
        )
        .add(
            M::POST,
            "/ojs/v1/workers/heartbeat",
            "A worker's heartbeat (BEAT)",
            workers::heartbeat,
        )
        .add(
            M::POST,
            "/ojs/v1/workers/progress",
            "Report progress as a percentage",
            progress::post,
        )
        .add(M::GET, "/ojs/v1/queues", "Queues", queues::list)
        .add(
            M::GET,
            "/ojs/v1/queues/{name}/stats",
            "A queue's statistics",
            queues::stats,
        )
        .add(
            M::POST,
            "/ojs/v1/queues/{name}/pause",
            "Pause a queue",
            queues::pause,
        )
        .add(
            M::POST,
            "/ojs/v1/queues/{name}/resume",
            "Resume a queue",
            queues::resume,
        )
        .add(
            M::GET,
            "/ojs/v1/queues/{name}/events",
            "A queue's live events (SSE)",
            stream::queue,
        )
        .add(
            M::GET,
            "/ojs/v1/dead-letter",
            "Dead-lettered jobs",
            dead_letter::list,
        )
        .add(
            M::GET,
            "/ojs/v1/dead-letter/{id}",
            "A dead-lettered job",
            dead_letter::get,
        )
        .add(
            M::DELETE,
            "/ojs/v1/dead-letter/{id}",
            "Delete a dead-lettered job",
            dead_letter::delete,
        )
        .add(
            M::POST,
            "/ojs/v1/dead-letter/{id}/retry",
            "Retry a dead-lettered job",
            dead_letter::retry,
        )
        .add(
            M::GET,
            "/ojs/v1/admin/stats",
            "Aggregate statistics",
            admin::stats::get,
        )
        .add(
            M::GET,
            "/ojs/v1/admin/system/config",
            "The settings in force, without secrets",
            admin::system::config,
        )
        .add(
            M::GET,
            "/ojs/v1/admin/queues",
            "Queues with their counts",
            admin::queues::list,
        )
        .add(
            M::GET,
            "/ojs/v1/admin/queues/{name}",
            "A queue: counts, limits, dead letters",
            admin::queues::get,
        )
        .add(
            M::POST,
            "/ojs/v1/admin/queues/{name}/pause",
            "Pause a queue",
            queues::pause,
        )
        .add(
            M::POST,
            "/ojs/v1/admin/queues/{name}/resume",
            "Resume a queue",
            queues::resume,
        )
        .add(
            M::PUT,
            "/ojs/v1/admin/queues/{name}/config",
            "Set a queue's concurrency and rate limits",
            admin::queues::configure,
        )
        .add(
            M::DELETE,
            "/ojs/v1/admin/queues/{name}/jobs",
            "Purge a queue's finished jobs",
            admin::queues::purge_jobs,
        )
        .add(
            M::GET,
            "/ojs/v1/admin/jobs",
            "List jobs by queue, state and type",
            admin::jobs::list,
        )
        .add(
            M::GET,
            "/ojs/v1/admin/jobs/{id}",
            "A job's whole envelope",
            admin::jobs::get,
        )
        .add(
            M::POST,
            "/ojs/v1/admin/jobs/{id}/cancel",
            "Cancel a job",
            jobs::cancel,
        )
        .add(
            M::POST,
            "/ojs/v1/admin/jobs/{id}/retry",
            "Retry a discarded or retryable job now",
            admin::jobs::retry,
        )
        .add(
            M::POST,
            "/ojs/v1/admin/jobs/bulk/retry",
            "Retry jobs by ids or filter",
            admin::jobs::bulk_retry,
        )
        .add(
            M::POST,
            "/ojs/v1/admin/jobs/bulk/cancel",
            "Cancel jobs by ids or filter",
            admin::jobs::bulk_cancel,
        )
        .add(
            M::POST,
            "/ojs/v1/admin/jobs/bulk/delete",
            "Delete finished jobs by ids or filter",
            admin::jobs::bulk_delete,
        )
        .add(
            M::GET,
            "/ojs/v1/admin/dead-letter",
            "List dead-lettered jobs",
            admin::dead_letter::list,
        )
        .add(
            M::DELETE,
            "/ojs/v1/admin/dead-letter",
            "Purge dead-lettered jobs",
            admin::dead_letter::purge_all,
        )
        .add(
            M::POST,
            "/ojs/v1/admin/dead-letter/{id}/retry",
            "Retry a dead-lettered job",
            dead_letter::retry,
        )
        .add(
            M::DELETE,
            "/ojs/v1/admin/dead-letter/{id}",
            "Delete a dead-lettered job",
            dead_letter::delete,
        )
        .add(
            M::GET,
            "/ojs/v1/dead-letter/stats",
            "Dead letter queue statistics",
            dead_letter::stats,
        )
        .add(
            M::GET,
            "/ojs/v1/rate-limits",
            "Limited queues and their use",
            rate_limits::list,
        )
        .add(
            M::GET,
            "/ojs/v1/rate-limits/{key}",
            "A queue's limits and their use",
            rate_limits::get,
        )
        .add(
            M::GET,
            "/ojs/v1/admin/workers",
            "Workers with their state",
            admin::workers::list,
        )
        .add(
            M::GET,
            "/ojs/v1/admin/workers/{id}",
            "A worker's registry entry",
            admin::workers::get,
        )
        .add(
            M::DELETE,
            "/ojs/v1/admin/workers/{id}",
            "Deregister a stale worker",
            admin::workers::deregister,
        )
        .add(
            M::POST,
            "/ojs/v1/admin/workers/{id}/quiet",
            "Tell a worker to stop fetching",
            admin::workers::quiet,
        )
        .add(
            M::POST,
            "/ojs/v1/admin/workers/{id}/terminate",
            "Tell a worker to stop",
            admin::workers::terminate,
        )
        .add(
            M::GET,
            "/ojs/v1/events",
            "Page through stored events",
            events::list,
        )
        .add(
            M::GET,
            "/ojs/v1/events/stream",
            "Live events (SSE), by channel",
            stream::events,
        )
        .add(
            M::POST,
            "/ojs/v1/cron",
            "Register or replace a cron entry",
            cron::register,
        )
        .add(M::GET, "/ojs/v1/cron", "Cron entries", cron::list)
        .add(M::GET, "/ojs/v1/cron/{name}", "A cron entry", cron::get)
        .add(
            M::DELETE,
            "/ojs/v1/cron/{name}",
            "Remove a cron entry",
            cron::delete,
        )
        .add(
            M::POST,
            "/ojs/v1/workflows",
            "Create a workflow",
            workflows::create,
        )
        .add(
            M::GET,
            "/ojs/v1/workflows/{id}",
            "A workflow and its steps",
            workflows::get,
        )
        .add(
            M::DELETE,
            "/ojs/v1/workflows/{id}",
            "Cancel a workflow",
            workflows::cancel,
        );
    if state.config.allow_reset {
        api = api.add(
            M::POST,
            "/ojs/v1/admin/reset",
            "Delete all data (allow_reset only)",
            admin::reset,
        );
    }
    let api = api.finish().merge(dashboard::routes());
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
        None | Some("1" | "1.0" | "1.0.0-rc.1") => {
            // At debug level: an enabled span per request costs the gateway about a tenth
            // of its throughput (measured with scripts/bench.sh); a disabled one nothing.
            let span = tracing::debug_span!("request", request_id = %request_id, method = %method, route = %route);
            // Every NATS step of the request shares its deadline (`store::deadline`).
            let deadline = started + state.config.request_deadline();
            deadline::within(deadline.into(), next.run(req).instrument(span)).await
        }
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
pub(crate) fn job_id(raw: &str) -> Result<String, OjsError> {
    crate::domain::envelope::parse_job_id(raw)
        .ok_or_else(|| OjsError::not_found("job", &truncated(raw)))
}
