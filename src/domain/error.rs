//! OJS error vocabulary (HTTP binding §16.3, errors spec): what went wrong in terms a client
//! can branch on. How a code becomes an HTTP status lives in `http::error`, once.

use serde_json::{Map, Value};

/// The machine-readable error codes this server emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// The body is not JSON, or not an object.
    InvalidPayload,
    /// A field is missing or invalid.
    InvalidRequest,
    NotFound,
    /// A client-supplied id already exists.
    Duplicate,
    /// The job's state does not allow the operation.
    Conflict,
    /// Unsupported `OJS-Version` or feature.
    Unsupported,
    /// The request body is larger than the configured limit.
    EnvelopeTooLarge,
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
            ErrorCode::NotFound => "not_found",
            ErrorCode::Duplicate => "duplicate",
            ErrorCode::Conflict => "conflict",
            ErrorCode::Unsupported => "unsupported",
            ErrorCode::EnvelopeTooLarge => "envelope_too_large",
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
            ErrorCode::NotFound => {
                "Check the id; it may never have existed, or have been removed (finished jobs are pruned after finished_jobs_max_age_secs)."
            }
            ErrorCode::Duplicate => "Use a new id, or fetch the existing job.",
            ErrorCode::Conflict => "Read the job's current state before retrying the operation.",
            ErrorCode::Unsupported => "Use OJS-Version 1.0.",
            ErrorCode::EnvelopeTooLarge => "Send a smaller body, or store large data elsewhere.",
            ErrorCode::QueueFull => {
                "Retry after the Retry-After delay with backoff; scheduled jobs are admitted again as pending ones come due."
            }
            ErrorCode::BackendError | ErrorCode::BackendUnavailable => {
                "The job store failed; retry with backoff."
            }
        }
    }
}

/// An OJS error: code, message and structured details.
#[derive(Debug, Clone, PartialEq)]
pub struct OjsError {
    pub code: ErrorCode,
    pub message: String,
    pub details: Map<String, Value>,
    /// A validation failure (`type: "validation_error"`).
    pub validation: bool,
    /// Syntactically fine but semantically invalid (a retry policy), answered with 422.
    pub semantic: bool,
}

impl OjsError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        OjsError {
            code,
            message: message.into(),
            details: Map::new(),
            validation: false,
            semantic: false,
        }
    }

    /// An invalid field: 400 `invalid_request` naming the field.
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        let mut e = OjsError::new(ErrorCode::InvalidRequest, message);
        e.validation = true;
        e.details.insert("field".into(), Value::from(field));
        e
    }

    /// A semantically invalid option (retry policy): 422 with `type: "validation_error"`.
    pub fn unprocessable(field: &str, message: impl Into<String>) -> Self {
        let mut e = OjsError::invalid(field, message);
        e.semantic = true;
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

    #[must_use]
    pub fn with_detail(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.details.insert(key.into(), value.into());
        self
    }

    /// The `type` field of the error body: the category, or the code itself.
    pub fn kind(&self) -> &'static str {
        if self.validation {
            "validation_error"
        } else {
            self.code.as_str()
        }
    }
}

impl std::fmt::Display for OjsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

impl std::error::Error for OjsError {}
