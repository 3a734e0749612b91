//! The response conventions handlers share: the OJS media type, JSON bodies, and path ids
//! read before they reach NATS.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::domain::job::Job;

/// The only response media type (HTTP binding §4.3).
pub const OJS_MEDIA_TYPE: &str = "application/openjobspec+json";

/// `{"jobs": […]}`, serialized straight from the jobs: the hot paths answer without
/// building a JSON tree first.
#[derive(Serialize)]
pub struct SomeJobs<'a> {
    pub jobs: &'a [Job],
}

/// A JSON response with the OJS media type.
pub fn respond<T: Serialize>(status: StatusCode, body: &T) -> Response {
    respond_bytes(
        status,
        serde_json::to_vec(body).expect("response bodies serialize"),
    )
}

fn respond_bytes(status: StatusCode, bytes: Vec<u8>) -> Response {
    let mut response = (status, bytes).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(OJS_MEDIA_TYPE),
    );
    response
}

/// `{key: object}` with the object's fields also at the top level: the body the suites
/// read (wrapped) and the one OJS client libraries and the `ojs` command line read (bare)
/// at once (clients.md items 14-16). The object is serialized once and its bytes written
/// twice, so a hot path (PUSH) builds no JSON tree; it has no field named `key`, which is
/// plain ASCII (see [`wrapped_and_bare`] otherwise).
pub fn respond_wrapped_and_bare<T: Serialize>(
    status: StatusCode,
    key: &'static str,
    object: &T,
) -> Response {
    let inner = serde_json::to_vec(object).expect("response bodies serialize");
    let fields = inner
        .strip_prefix(b"{")
        .and_then(|i| i.strip_suffix(b"}"))
        .unwrap_or_default();
    let mut body = Vec::with_capacity(2 * inner.len() + key.len() + 4);
    body.push(b'{');
    body.extend_from_slice(fields);
    if !fields.is_empty() {
        body.push(b',');
    }
    body.push(b'"');
    body.extend_from_slice(key.as_bytes());
    body.extend_from_slice(b"\":");
    body.extend_from_slice(&inner);
    body.push(b'}');
    respond_bytes(status, body)
}

/// [`respond_wrapped_and_bare`]'s body as a JSON tree, for an object that may have a field
/// named `key` (the wrapper wins).
pub fn wrapped_and_bare(key: &str, object: serde_json::Value) -> serde_json::Value {
    let mut body = match &object {
        serde_json::Value::Object(fields) => fields.clone(),
        _ => serde_json::Map::new(),
    };
    body.insert(key.to_owned(), object);
    serde_json::Value::Object(body)
}

pub(crate) use crate::domain::envelope::named_job_id as job_id;
