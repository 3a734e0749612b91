//! OJS errors as HTTP responses: the one place codes meet statuses (HTTP binding §16,
//! JSON format §12.1). Bodies are always `{"error":{...}}`; the request id is added by the
//! middleware.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::respond::respond;
use crate::domain::error::{Category, ErrorCode, OjsError};

/// An error leaving a handler.
#[derive(Debug)]
pub struct ApiError(pub OjsError);

impl From<OjsError> for ApiError {
    fn from(e: OjsError) -> Self {
        ApiError(e)
    }
}

pub fn status(e: &OjsError) -> StatusCode {
    match e.code {
        ErrorCode::InvalidPayload => StatusCode::BAD_REQUEST,
        ErrorCode::InvalidRequest if e.category == Category::Semantic => {
            StatusCode::UNPROCESSABLE_ENTITY
        }
        ErrorCode::InvalidRequest | ErrorCode::SchemaValidation => StatusCode::BAD_REQUEST,
        ErrorCode::NotFound => StatusCode::NOT_FOUND,
        ErrorCode::Duplicate | ErrorCode::Conflict => StatusCode::CONFLICT,
        ErrorCode::Unsupported => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorCode::EnvelopeTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorCode::Unauthenticated => StatusCode::UNAUTHORIZED,
        ErrorCode::PermissionDenied => StatusCode::FORBIDDEN,
        ErrorCode::QueueFull => StatusCode::TOO_MANY_REQUESTS,
        ErrorCode::BackendError => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorCode::BackendUnavailable => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// The error body; `request_id` mirrors the `X-Request-Id` header.
pub fn body(e: &OjsError, request_id: Option<&str>) -> Value {
    let docs = format!("https://openjobspec.org/errors/{}", e.code.as_str());
    let mut error = json!({
        "code": e.code.as_str(),
        "type": e.kind(),
        "message": e.message,
        "retryable": e.code.retryable(),
        "hint": e.code.hint(),
        "docs_url": docs,
    });
    if !e.details.is_empty() {
        error["details"] = Value::Object(e.details.clone());
    }
    if let Some(id) = request_id {
        error["request_id"] = json!(id);
    }
    json!({ "error": error })
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = respond(status(&self.0), &body(&self.0, None));
        if matches!(
            self.0.code,
            ErrorCode::QueueFull | ErrorCode::BackendUnavailable
        ) {
            // Required with every 429 and 503 (errors spec §5.1, ERR-006); the timer count is
            // re-read each second, and NATS answers again within seconds of losing a node.
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        if self.0.code == ErrorCode::QueueFull {
            // A queue at its bound names its depth and bound (backpressure spec §7.2).
            for (detail, name) in [
                ("depth", "x-ojs-queue-depth"),
                ("bound", "x-ojs-queue-bound"),
            ] {
                if let Some(n) = self.0.details.get(detail).and_then(Value::as_u64) {
                    response.headers_mut().insert(name, n.into());
                }
            }
        }
        if self.0.code == ErrorCode::Unauthenticated {
            // Required with every 401 (errors spec §5.1).
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer realm=\"ojs\""),
            );
        }
        // The middleware re-renders the body with the request id, and logs server errors.
        response.extensions_mut().insert(self.0);
        response
    }
}
