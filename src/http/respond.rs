//! The response conventions handlers share: the OJS media type, JSON bodies, and path ids
//! read before they reach NATS.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::domain::error::OjsError;
use crate::domain::fields::truncated;
use crate::domain::job::Job;

/// The only response media type (HTTP binding §4.3).
pub const OJS_MEDIA_TYPE: &str = "application/openjobspec+json";

/// `{"job": …}`, serialized straight from the job: the hot paths answer without building a
/// JSON tree first.
#[derive(Serialize)]
pub struct OneJob<'a> {
    pub job: &'a Job,
}

/// `{"jobs": […]}`, as [`OneJob`].
#[derive(Serialize)]
pub struct SomeJobs<'a> {
    pub jobs: &'a [Job],
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

/// Reads a path id as a job id; anything else names no job (404) and never reaches NATS,
/// where it would become part of a subject.
pub(crate) fn job_id(raw: &str) -> Result<String, OjsError> {
    crate::domain::envelope::parse_job_id(raw)
        .ok_or_else(|| OjsError::not_found("job", &truncated(raw)))
}
