//! What every response shares (HTTP binding §3.2, §6.5): the media type, `OJS-Version`,
//! `X-Request-Id`, errors in the OJS format (the framework's own rejections and unknown
//! routes too), the request's deadline, request metrics, and cross-origin calls.

use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tower_http::cors::{AllowMethods, AllowOrigin, CorsLayer};
use tracing::Instrument;
use tracing::{error, warn};
use uuid::Uuid;

use super::error::{self, ApiError};
use super::respond::{respond, OJS_MEDIA_TYPE};
use super::state::SharedState;
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::fields::truncated;
use crate::store::deadline;

pub(super) async fn not_found(req: Request) -> ApiError {
    OjsError::new(
        ErrorCode::NotFound,
        format!("No endpoint at {} {}.", req.method(), req.uri().path()),
    )
    .with_detail("resource_type", "route")
    .with_detail("resource_id", truncated(req.uri().path()))
    .into()
}

pub(super) async fn method_not_allowed(req: Request) -> Response {
    let err = OjsError::new(
        ErrorCode::InvalidRequest,
        format!("{} is not allowed on {}.", req.method(), req.uri().path()),
    );
    let mut response = ApiError(err).into_response();
    *response.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
    response
}

/// Cross-origin calls from the pages of `origins` (HTTP binding §20; `cors_allowed_origins`,
/// validated at load): preflights answered before any route or key check, the headers
/// clients send allowed and the ones they read exposed. `None` when no origin is allowed.
pub(super) fn cors(origins: &[String]) -> Option<CorsLayer> {
    let allow = match origins {
        [] => return None,
        [any] if any == "*" => AllowOrigin::any(),
        listed => AllowOrigin::list(listed.iter().filter_map(|o| HeaderValue::from_str(o).ok())),
    };
    let names = |names: &[&'static str]| -> Vec<header::HeaderName> {
        names
            .iter()
            .map(|n| header::HeaderName::from_static(n))
            .collect()
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods(AllowMethods::list([
                Method::GET,
                Method::POST,
                Method::PUT,
                Method::PATCH,
                Method::DELETE,
                Method::OPTIONS,
            ]))
            .allow_headers(names(&[
                "content-type",
                "accept",
                "authorization",
                "x-request-id",
                "ojs-version",
                "ojs-block-timeout",
                "traceparent",
                "tracestate",
            ]))
            .expose_headers(names(&[
                "x-request-id",
                "ojs-version",
                "retry-after",
                "location",
                "x-ratelimit-limit",
                "x-ratelimit-remaining",
                "x-ratelimit-reset",
                "x-ojs-queue-depth",
                "x-ojs-queue-bound",
            ]))
            .max_age(Duration::from_secs(86_400)),
    )
}

/// Header conventions of HTTP binding §3.2 and §6.5 on every response, the request id in
/// error bodies, one log line per server error, and request metrics.
pub(super) async fn conventions(
    State(state): State<SharedState>,
    req: Request,
    next: Next,
) -> Response {
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
            match deadline::serve(deadline.into(), next.run(req).instrument(span)).await {
                Ok(response) => response,
                Err(err) => {
                    warn!(%method, route, request_id, took_ms = started.elapsed().as_millis() as u64,
                        "a request ran past its deadline and was cut: a step of it was not bounded by the deadline, or the process was starved of CPU");
                    ApiError(err).into_response()
                }
            }
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

/// Whether JSON responses are labelled `application/json` rather than with the OJS media
/// type (HTTP binding §4.3; the JSON format spec §2.2 allows either):
/// - when `Accept` names `application/json` and not the OJS media type;
/// - for the official Python OJS client, which asks for the OJS media type yet reads a body
///   only when its label contains `application/json` (docs/api-tour.md): with its defaults
///   every answer would be lost on it. It is known by its HTTP library's `User-Agent`
///   (`python-httpx/…`, which it does not replace); the conformance suites and every other
///   client keep the OJS media type.
fn wants_plain_json(headers: &axum::http::HeaderMap) -> bool {
    let mut json = false;
    for accept in headers.get_all(header::ACCEPT) {
        for media in accept.to_str().unwrap_or("").split(',') {
            let media = media.split(';').next().unwrap_or("").trim();
            if media.eq_ignore_ascii_case(OJS_MEDIA_TYPE) {
                return reads_only_plain_json(headers);
            }
            json |= media.eq_ignore_ascii_case("application/json");
        }
    }
    json
}

/// Whether the client is the Python OJS client's HTTP library (see `wants_plain_json`).
fn reads_only_plain_json(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(header::USER_AGENT)
        .is_some_and(|agent| agent.as_bytes().starts_with(b"python-httpx/"))
}
