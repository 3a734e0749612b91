//! Request bodies: our own JSON extractor, so every malformed or oversized body gets an OJS
//! error object instead of the framework's plain-text rejection.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use serde_json::{Map, Value};

use super::error::ApiError;
use crate::domain::envelope::{check_depth, validate_type};
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::fields::truncated;

/// A request body that is a JSON object (HTTP binding §6.1).
pub struct JsonObject(pub Map<String, Value>);

impl<S: Send + Sync> FromRequest<S> for JsonObject {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        check_content_type(&req)?;
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                OjsError::new(
                    ErrorCode::EnvelopeTooLarge,
                    "The request body is larger than this server accepts.",
                )
            } else {
                OjsError::new(
                    ErrorCode::InvalidPayload,
                    format!("The request body could not be read: {rejection}"),
                )
            }
        })?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(OjsError::new(
                ErrorCode::InvalidPayload,
                "The request body is empty; send a JSON object.",
            )
            .into());
        }
        let body = serde_json::from_slice::<Value>(&bytes).map_err(|err| {
            OjsError::new(
                ErrorCode::InvalidPayload,
                format!("The request body is not valid JSON: {err}."),
            )
        })?;
        check_depth(&body)?;
        match body {
            Value::Object(map) => Ok(JsonObject(map)),
            _ => Err(OjsError::new(
                ErrorCode::InvalidPayload,
                "The request body must be a JSON object.",
            )
            .into()),
        }
    }
}

/// JSON or OJS JSON, with parameters; a missing type is taken as JSON (HTTP binding §4.1).
fn check_content_type(req: &Request) -> Result<(), ApiError> {
    let Some(value) = req.headers().get(CONTENT_TYPE) else {
        return Ok(());
    };
    let media = value
        .to_str()
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    if media == "application/json" || media == "application/openjobspec+json" {
        Ok(())
    } else {
        Err(OjsError::new(
            ErrorCode::InvalidRequest,
            format!("Content-Type {media:?} is not supported; use application/openjobspec+json or application/json."),
        )
        .into())
    }
}

/// A comma-separated query parameter's items (`a,b, c`), empty when absent.
pub fn query_list(params: &std::collections::HashMap<String, String>, key: &str) -> Vec<String> {
    params
        .get(key)
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// The event types a query names in `types`, `event_types` (both spellings are in use) or
/// `type` (one, the admin UI).
/// A type becomes part of a subject filter: only the event vocabulary's shape is accepted.
///
/// # Errors
/// 400 naming the parameter for a type of another shape.
pub fn event_types(
    params: &std::collections::HashMap<String, String>,
) -> Result<Vec<String>, OjsError> {
    let mut types = query_list(params, "types");
    types.extend(query_list(params, "event_types"));
    // `type`: the admin UI's one type.
    types.extend(query_list(params, "type"));
    match types.iter().find(|t| validate_type(t).is_err()) {
        Some(bad) => Err(OjsError::invalid(
            "event_types",
            format!(
                "event_types must list event types such as job.completed, got {:?}.",
                truncated(bad)
            ),
        )),
        None => Ok(types),
    }
}

/// A whole-number query parameter from 0 to `max`, `default` when absent.
///
/// # Errors
/// 400 naming the parameter for anything else.
pub fn query_number(
    params: &std::collections::HashMap<String, String>,
    key: &str,
    default: usize,
    max: usize,
) -> Result<usize, OjsError> {
    match params.get(key) {
        None => Ok(default),
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| *n <= max)
            .ok_or_else(|| {
                OjsError::invalid(
                    key,
                    format!("{key} must be an integer from 0 to {max}, got {v:?}."),
                )
            }),
    }
}

/// The page a listing asks for, as `(limit, offset)`: `limit` and `offset`, or `page` (from
/// 1) and `per_page` as some OJS clients send them.
///
/// # Errors
/// A parameter that is not a number in range (400 naming it).
pub fn paging(
    params: &std::collections::HashMap<String, String>,
    default_limit: usize,
    max_limit: usize,
) -> Result<(usize, usize), OjsError> {
    if params.contains_key("page") || params.contains_key("per_page") {
        let per_page = query_number(params, "per_page", default_limit, max_limit)?.max(1);
        let page = query_number(params, "page", 1, usize::MAX / per_page)?.max(1);
        return Ok((per_page, (page - 1) * per_page));
    }
    let limit = query_number(params, "limit", default_limit, max_limit)?.max(1);
    Ok((limit, query_number(params, "offset", 0, usize::MAX)?))
}

/// A listing's `pagination` object, in both vocabularies clients read.
pub fn pagination(total: usize, limit: usize, offset: usize, returned: usize) -> serde_json::Value {
    serde_json::json!({
        "total": total,
        "limit": limit,
        "offset": offset,
        "has_more": offset.saturating_add(returned) < total,
        "page": offset / limit + 1,
        "per_page": limit,
    })
}
