//! NATS failures become `backend_error`s here, once, with the operation named.

use crate::domain::error::{BoxedError, OjsError};

/// Awaits publish acknowledgements sent without waiting (pipelined); the first failure
/// becomes a backend error naming what was being done.
pub(super) async fn all_stored(
    acks: Vec<async_nats::jetstream::context::PublishAckFuture>,
    doing: &'static str,
) -> Result<(), OjsError> {
    let acks = acks.into_iter().map(std::future::IntoFuture::into_future);
    for ack in futures::future::join_all(acks).await {
        ack.map_err(backend(doing))?;
    }
    Ok(())
}

/// Wraps any NATS error as a retryable backend error naming what was being done; the NATS
/// error is kept for the log, not shown to the client.
pub fn backend<E: Into<BoxedError>>(doing: &'static str) -> impl FnOnce(E) -> OjsError {
    move |err| OjsError::backend(format!("NATS failed while {doing}.")).with_source(err)
}
