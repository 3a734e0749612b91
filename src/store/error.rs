//! NATS failures become `backend_error`s here, once, with the operation named.

use crate::domain::error::OjsError;

/// Wraps any NATS error as a retryable backend error naming what was being done.
pub fn backend<E: std::fmt::Display>(doing: &'static str) -> impl FnOnce(E) -> OjsError {
    move |err| OjsError::backend(format!("NATS failed while {doing}: {err}"))
}
