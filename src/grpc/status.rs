//! OJS errors as gRPC statuses (gRPC binding §7, §8): the one place codes meet statuses.
//! Every error carries a `google.rpc.ErrorInfo` with the OJS code as its reason; an
//! invalid field also a `BadRequest` naming it, a refusal worth retrying a `RetryInfo` and
//! `retry-after` metadata.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::domain::error::{ErrorCode, OjsError};

/// The `ErrorInfo` domain of every OJS error (§8.4).
pub const DOMAIN: &str = "openjobspec.org";

/// After how long a refused request may be tried again: the timer count is read again each
/// second, and NATS answers again within seconds of losing a node.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The status for `code` (§7.1).
pub fn code(code: ErrorCode) -> Code {
    match code {
        ErrorCode::InvalidPayload | ErrorCode::InvalidRequest | ErrorCode::SchemaValidation => {
            Code::InvalidArgument
        }
        ErrorCode::NotFound => Code::NotFound,
        ErrorCode::Duplicate => Code::AlreadyExists,
        ErrorCode::Conflict | ErrorCode::Unsupported => Code::FailedPrecondition,
        ErrorCode::EnvelopeTooLarge | ErrorCode::QueueFull => Code::ResourceExhausted,
        ErrorCode::Unauthenticated => Code::Unauthenticated,
        ErrorCode::PermissionDenied => Code::PermissionDenied,
        ErrorCode::BackendError => Code::Internal,
        ErrorCode::BackendUnavailable => Code::Unavailable,
    }
}

/// `err` as a status with its details; `request_id` is the caller's, when it sent one.
pub fn status(err: &OjsError, request_id: Option<&str>) -> Status {
    if err.code == ErrorCode::BackendError {
        tracing::warn!(error = %err.with_causes(), "a gRPC call failed in the store");
    }
    let mut metadata: HashMap<String, String> = err
        .details
        .iter()
        .map(|(k, v)| {
            let text = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (k.clone(), text)
        })
        .collect();
    metadata.insert("retryable".into(), err.code.retryable().to_string());
    if let Some(id) = request_id {
        metadata.insert("request_id".into(), id.to_owned());
    }
    let mut details = ErrorDetails::new();
    details.set_error_info(err.code.as_str(), DOMAIN, metadata);
    if let Some(field) = err.details.get("field").and_then(Value::as_str) {
        details.add_bad_request_violation(field, err.message.clone());
    }
    let mut headers = MetadataMap::new();
    if matches!(
        err.code,
        ErrorCode::QueueFull | ErrorCode::BackendUnavailable
    ) {
        details.set_retry_info(Some(RETRY_AFTER));
        headers.insert("retry-after", MetadataValue::from(RETRY_AFTER.as_secs()));
    }
    Status::with_error_details_and_metadata(code(err.code), err.message.clone(), details, headers)
}

/// What the transport says of a request it could not read, as the OJS error it is: a
/// message that is no valid protobuf is `invalid_payload`, one over the size limit
/// `envelope_too_large`. Other statuses are left as they are.
pub fn of_transport(status: &Status) -> Option<OjsError> {
    let message = status.message();
    match status.code() {
        Code::Internal if message.contains("failed to decode Protobuf message") => {
            Some(OjsError::new(
                ErrorCode::InvalidPayload,
                format!("The request is not a valid message of this RPC: {message}"),
            ))
        }
        Code::OutOfRange if message.contains("message length too large") => Some(OjsError::new(
            ErrorCode::EnvelopeTooLarge,
            format!("The request is larger than this server accepts: {message}"),
        )),
        _ => None,
    }
}

/// Rewrites the transport's own answer to a request it could not read (a status in the
/// headers of a response with no message) as the OJS error it is, with its details.
pub fn readable_transport_errors<B>(
    mut response: tonic::codegen::http::Response<B>,
) -> tonic::codegen::http::Response<B> {
    let readable = Status::from_header_map(response.headers())
        .as_ref()
        .and_then(of_transport);
    if let Some(err) = readable {
        let _ = status(&err, None).add_header(response.headers_mut());
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_ojs_code_has_the_status_the_binding_names() {
        assert_eq!(code(ErrorCode::InvalidRequest), Code::InvalidArgument);
        assert_eq!(code(ErrorCode::Duplicate), Code::AlreadyExists);
        assert_eq!(code(ErrorCode::Conflict), Code::FailedPrecondition);
        assert_eq!(code(ErrorCode::QueueFull), Code::ResourceExhausted);
        assert_eq!(code(ErrorCode::BackendUnavailable), Code::Unavailable);
    }

    #[test]
    fn an_error_carries_its_code_field_and_retry_advice_as_details() {
        let err = OjsError::invalid("queue", "queue is too long");
        let s = status(&err, Some("req-1"));
        assert_eq!(s.code(), Code::InvalidArgument);
        let details = s.get_error_details();
        let info = details.error_info().unwrap();
        assert_eq!(info.reason, "invalid_request");
        assert_eq!(info.domain, DOMAIN);
        assert_eq!(info.metadata["retryable"], "false");
        assert_eq!(info.metadata["request_id"], "req-1");
        assert_eq!(info.metadata["field"], "queue");
        assert_eq!(
            details.bad_request().unwrap().field_violations[0].field,
            "queue"
        );

        let busy = status(&OjsError::new(ErrorCode::QueueFull, "full"), None);
        assert_eq!(busy.metadata().get("retry-after").unwrap(), "1");
        assert!(busy.get_error_details().retry_info().is_some());
    }
}
