//! OJS error vocabulary (HTTP binding §16.3, errors spec): what went wrong in terms a client
//! can branch on. How a code becomes an HTTP status lives in `http::error`, once.

use std::sync::Arc;

use serde_json::{Map, Value};

/// The machine-readable error codes this server emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// The body is not JSON, or not an object.
    InvalidPayload,
    /// A field is missing or invalid.
    InvalidRequest,
    /// A job's args do not match the schema it names (HTTP binding §16).
    SchemaValidation,
    NotFound,
    /// A client-supplied id already exists.
    Duplicate,
    /// The job's state does not allow the operation.
    Conflict,
    /// Unsupported `OJS-Version` or feature.
    Unsupported,
    /// The request body is larger than the configured limit.
    EnvelopeTooLarge,
    /// No API key, or one that is not valid (security spec §6): 401.
    Unauthenticated,
    /// A valid key without the right to the route (an API key on an admin route): 403.
    PermissionDenied,
    /// A bound on pending work is reached (backpressure spec §7): too many pending timers.
    QueueFull,
    /// NATS failed or timed out; retrying may succeed.
    BackendError,
    /// NATS is unreachable.
    BackendUnavailable,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidPayload => "invalid_payload",
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::SchemaValidation => "schema_validation",
            ErrorCode::NotFound => "not_found",
            ErrorCode::Duplicate => "duplicate",
            ErrorCode::Conflict => "conflict",
            ErrorCode::Unsupported => "unsupported",
            ErrorCode::EnvelopeTooLarge => "envelope_too_large",
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::QueueFull => "queue_full",
            ErrorCode::BackendError | ErrorCode::BackendUnavailable => "backend_error",
        }
    }

    /// Only backend failures and backpressure are worth retrying unchanged.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::BackendError | ErrorCode::BackendUnavailable | ErrorCode::QueueFull
        )
    }

    pub fn hint(self) -> &'static str {
        match self {
            ErrorCode::InvalidPayload => "Send a JSON object as the request body.",
            ErrorCode::InvalidRequest => "Correct the field named in the message and retry.",
            ErrorCode::SchemaValidation => {
                "Make the job's args match its schema (details.violations), or name another schema."
            }
            ErrorCode::NotFound => {
                "Check the id; it may never have existed, or have been removed (finished jobs are pruned after finished_jobs_max_age_ms)."
            }
            ErrorCode::Duplicate => "Use a new id, or fetch the existing job.",
            ErrorCode::Conflict => "Read the job's current state before retrying the operation.",
            ErrorCode::Unsupported => "Use OJS-Version 1.0.",
            ErrorCode::EnvelopeTooLarge => "Send a smaller body, or store large data elsewhere.",
            ErrorCode::Unauthenticated => {
                "Send a valid API key as Authorization: Bearer <key>; ask the operator for one."
            }
            ErrorCode::PermissionDenied => "Use an admin API key for this route.",
            ErrorCode::QueueFull => {
                "Retry after the Retry-After delay with backoff; scheduled jobs are admitted again as pending ones come due."
            }
            ErrorCode::BackendError | ErrorCode::BackendUnavailable => {
                "The job store failed; retry with backoff."
            }
        }
    }
}

/// Any error, as the source of an `OjsError`.
pub type BoxedError = Box<dyn std::error::Error + Send + Sync>;

/// What an error is beyond its code: the body's `type`, and 400 or 422 for
/// `invalid_request`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    /// The code says it all; it is also the body's `type`.
    Plain,
    /// A field breaks a rule: 400 with `type: "validation_error"`.
    Validation,
    /// Well-formed but semantically invalid (a retry policy): 422 with
    /// `type: "validation_error"`.
    Semantic,
}

/// An OJS error: code, message and structured details, and for a backend failure the error
/// it came from, which is logged but never sent to the client.
#[derive(Debug, Clone)]
pub struct OjsError {
    pub code: ErrorCode,
    /// Says what failed, in the client's terms.
    pub message: String,
    pub details: Map<String, Value>,
    pub category: Category,
    pub source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

/// Equal when a client could not tell them apart: the source is not compared.
impl PartialEq for OjsError {
    fn eq(&self, other: &Self) -> bool {
        (self.code, &self.message, &self.details, self.category)
            == (other.code, &other.message, &other.details, other.category)
    }
}

impl OjsError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        OjsError {
            code,
            message: message.into(),
            details: Map::new(),
            category: Category::Plain,
            source: None,
        }
    }

    /// An invalid field: 400 `invalid_request` naming the field.
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        let mut e = OjsError::new(ErrorCode::InvalidRequest, message);
        e.category = Category::Validation;
        e.details.insert("field".into(), Value::from(field));
        e
    }

    /// A semantically invalid option (retry policy): 422 with `type: "validation_error"`.
    pub fn unprocessable(field: &str, message: impl Into<String>) -> Self {
        let mut e = OjsError::invalid(field, message);
        e.category = Category::Semantic;
        e
    }

    pub fn not_found(resource: &str, id: &str) -> Self {
        OjsError::new(ErrorCode::NotFound, format!("{resource} '{id}' not found."))
            .with_detail("resource_type", resource)
            .with_detail("resource_id", id)
    }

    pub fn backend(message: impl Into<String>) -> Self {
        OjsError::new(ErrorCode::BackendError, message)
    }

    /// Keeps the error this one came from, for the log.
    #[must_use]
    pub fn with_source(mut self, source: impl Into<BoxedError>) -> Self {
        self.source = Some(Arc::from(source.into()));
        self
    }

    /// The message followed by every source in the chain: what the log shows.
    pub fn with_causes(&self) -> String {
        let mut text = self.message.trim_end_matches('.').to_owned();
        let mut next = std::error::Error::source(self);
        while let Some(cause) = next {
            text.push_str(": ");
            text.push_str(&cause.to_string());
            next = cause.source();
        }
        text
    }

    #[must_use]
    pub fn with_detail(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.details.insert(key.into(), value.into());
        self
    }

    /// The `type` field of the error body: the category, or the code itself.
    pub fn kind(&self) -> &'static str {
        match self.category {
            Category::Validation | Category::Semantic => "validation_error",
            Category::Plain => self.code.as_str(),
        }
    }
}

impl std::fmt::Display for OjsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

impl std::error::Error for OjsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_category_decides_the_type() {
        assert_eq!(OjsError::invalid("f", "m").kind(), "validation_error");
        assert_eq!(OjsError::unprocessable("f", "m").kind(), "validation_error");
        assert_eq!(OjsError::not_found("job", "x").kind(), "not_found");
        assert_eq!(
            OjsError::unprocessable("f", "m").category,
            Category::Semantic
        );
    }

    #[test]
    fn a_source_is_logged_with_its_chain_but_does_not_change_the_error() {
        let io = std::io::Error::other("connection reset");
        let err = OjsError::backend("NATS failed while writing a job.").with_source(io);
        assert_eq!(err.message, "NATS failed while writing a job.");
        assert_eq!(
            err.with_causes(),
            "NATS failed while writing a job: connection reset"
        );
        assert_eq!(err, OjsError::backend("NATS failed while writing a job."));
        assert!(std::error::Error::source(&err).is_some());
    }
}
