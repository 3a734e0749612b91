//! NATS failures become `backend_error`s here, once, with the operation named: 503 when NATS
//! could not answer (retry shortly), 500 for anything else.

use async_nats::jetstream::stream::{DeleteMessageError, DeleteMessageErrorKind};
use async_nats::jetstream::{Error as JsError, ErrorCode as NatsCode};

use crate::domain::error::{BoxedError, ErrorCode, OjsError};

/// Wraps any NATS error as a retryable backend error naming what was being done; the NATS
/// error is kept for the log, not shown to the client.
pub fn backend<E: Into<BoxedError>>(doing: &'static str) -> impl FnOnce(E) -> OjsError {
    move |err| nats_failed(doing, err)
}

/// A NATS error as the client hears it: `BackendUnavailable` (503 with `Retry-After`) when
/// NATS could not answer — a lost connection, a timeout, a stream without a leader while a
/// cluster elects one after losing a node — which a retry a moment later fixes; otherwise
/// `BackendError` (500).
pub fn nats_failed(doing: &str, err: impl Into<BoxedError>) -> OjsError {
    let err = err.into();
    let code = if unanswered(err.as_ref()) {
        ErrorCode::BackendUnavailable
    } else {
        ErrorCode::BackendError
    };
    OjsError::new(code, format!("NATS failed while {doing}.")).with_source(err)
}

/// Whether a consumer call failed because the consumer does not exist.
pub fn consumer_missing(err: &async_nats::jetstream::stream::ConsumerError) -> bool {
    use async_nats::jetstream::{stream::ConsumerErrorKind, ErrorCode as JsCode};
    matches!(err.kind(), ConsumerErrorKind::JetStream(e) if e.error_code() == JsCode::CONSUMER_NOT_FOUND)
}

/// Why a compare-and-set write (update or create) did not land; either way nothing was
/// written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Another write of the key landed first (the wrong revision async-nats names): a
    /// fresh read decides.
    Outdated,
    /// On a clustered stream of nats-server 2.10+, the leader refused without comparing
    /// because another write of the key is still being proposed (JetStream error 10164,
    /// which async-nats reports only as "other"). That write may land or not, and its mark
    /// can outlast it for a moment (longer across a leader change): reading again at once
    /// would be refused again, so the next try waits a little.
    InFlight,
}

/// Why `err` refused a compare-and-set; `None` for any other failure. `outdated` is the
/// error kind async-nats uses for a wrong revision.
pub fn refusal<K>(err: &async_nats::error::Error<K>, outdated: K) -> Option<Refused>
where
    K: Clone + std::fmt::Debug + std::fmt::Display + PartialEq,
{
    let in_flight = std::iter::successors(std::error::Error::source(err), |e| e.source())
        .filter_map(|e| e.downcast_ref::<JsError>())
        .any(|e| e.error_code() == NatsCode::STREAM_WRONG_LAST_SEQUENCE_CONSTANT);
    if in_flight {
        Some(Refused::InFlight)
    } else {
        (err.kind() == outdated).then_some(Refused::Outdated)
    }
}

/// Whether JetStream itself refused (an API error answer, such as a stream limit), as
/// opposed to not answering.
pub fn server_refused(err: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(err), |e| e.source()).any(|e| e.downcast_ref::<JsError>().is_some())
}

/// Whether a compare-and-set write lost to another write of the key, for either reason
/// of [`Refused`].
pub fn lost_race<K>(err: &async_nats::error::Error<K>, outdated: K) -> bool
where
    K: Clone + std::fmt::Debug + std::fmt::Display + PartialEq,
{
    refusal(err, outdated).is_some()
}

/// Whether NATS did not answer, at any level of the error chain: a request or publish that
/// timed out, found no responders or no stream (a stream without a leader while a cluster
/// elects one), a publish on a broken connection, or JetStream saying its cluster is not
/// available. async-nats spreads these over a dozen error kinds (publish, request, KV
/// entry, stream info…) and nests them (a KV create wraps the read that failed), so each
/// link of the chain is asked for its kind.
pub(super) fn unanswered(err: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(err), |e| e.source()).any(said_nothing)
}

/// The kind of `err` if it is an async-nats error of kind `K`.
fn kind<K>(err: &(dyn std::error::Error + 'static)) -> Option<K>
where
    K: Clone + std::fmt::Debug + std::fmt::Display + PartialEq + 'static,
{
    err.downcast_ref::<async_nats::error::Error<K>>()
        .map(async_nats::error::Error::kind)
}

/// Whether this one error (not its sources) says that NATS did not answer.
fn said_nothing(err: &(dyn std::error::Error + 'static)) -> bool {
    use async_nats::jetstream::consumer::{pull, StreamErrorKind};
    use async_nats::jetstream::{context as cx, kv, stream as st};
    let cluster_down = |e: &JsError| e.error_code() == NatsCode::CLUSTER_NOT_AVAILABLE;
    if let Some(e) = err.downcast_ref::<JsError>() {
        return cluster_down(e);
    }
    if let Some(k) = kind::<async_nats::RequestErrorKind>(err) {
        use async_nats::RequestErrorKind as K;
        return matches!(k, K::TimedOut | K::NoResponders);
    }
    if let Some(k) = kind::<cx::RequestErrorKind>(err) {
        use cx::RequestErrorKind as K;
        return matches!(k, K::TimedOut | K::NoResponders);
    }
    if let Some(k) = kind::<cx::PublishErrorKind>(err) {
        use cx::PublishErrorKind as K;
        return matches!(k, K::TimedOut | K::StreamNotFound | K::BrokenPipe);
    }
    if let Some(k) = kind::<cx::ConsumerInfoErrorKind>(err) {
        use cx::ConsumerInfoErrorKind as K;
        return match k {
            K::TimedOut | K::NoResponders => true,
            K::JetStream(e) => cluster_down(&e),
            _ => false,
        };
    }
    if let Some(k) = kind::<cx::CreateStreamErrorKind>(err) {
        use cx::CreateStreamErrorKind as K;
        return match k {
            K::TimedOut => true,
            K::JetStream(e) => cluster_down(&e),
            _ => false,
        };
    }
    if let Some(cx::GetStreamErrorKind::JetStream(e)) = kind(err) {
        return cluster_down(&e);
    }
    if let Some(k) = kind::<kv::EntryErrorKind>(err) {
        return k == kv::EntryErrorKind::TimedOut;
    }
    if let Some(k) = kind::<kv::UpdateErrorKind>(err) {
        return k == kv::UpdateErrorKind::TimedOut;
    }
    if let Some(k) = kind::<kv::WatchErrorKind>(err) {
        return k == kv::WatchErrorKind::TimedOut;
    }
    if let Some(k) = kind::<st::DirectGetErrorKind>(err) {
        use st::DirectGetErrorKind as K;
        return match k {
            K::TimedOut => true,
            K::ErrorResponse(status, _) => status == async_nats::StatusCode::NO_RESPONDERS,
            _ => false,
        };
    }
    if let Some(k) = kind::<st::DeleteMessageErrorKind>(err) {
        use st::DeleteMessageErrorKind as K;
        return match k {
            K::TimedOut => true,
            K::JetStream(e) => cluster_down(&e),
            _ => false,
        };
    }
    if let Some(k) = kind::<st::PurgeErrorKind>(err) {
        use st::PurgeErrorKind as K;
        return match k {
            K::TimedOut => true,
            K::JetStream(e) => cluster_down(&e),
            _ => false,
        };
    }
    if let Some(k) = kind::<st::ConsumerErrorKind>(err) {
        use st::ConsumerErrorKind as K;
        return match k {
            K::TimedOut => true,
            K::JetStream(e) => cluster_down(&e),
            _ => false,
        };
    }
    if let Some(st::LastRawMessageErrorKind::JetStream(e)) = kind(err) {
        return cluster_down(&e);
    }
    if let Some(k) = kind::<StreamErrorKind>(err) {
        return k == StreamErrorKind::TimedOut;
    }
    if let Some(k) = kind::<pull::MessagesErrorKind>(err) {
        return k == pull::MessagesErrorKind::NoResponders;
    }
    false
}

/// Whether a message delete found nothing to delete: deleted before (an earlier try whose
/// answer was lost, a sweep, retention) or its stream gone. NATS answers a missing message
/// of a file stream with 10057 "no message found", of a memory stream with 10043 "sequence
/// not found".
pub fn already_deleted(err: &DeleteMessageError) -> bool {
    match err.kind() {
        DeleteMessageErrorKind::JetStream(e) => {
            e.error_code() == NatsCode::NO_MESSAGE_FOUND
                || e.error_code() == NatsCode::SEQUENCE_NOT_FOUND
                || e.error_code() == NatsCode::STREAM_NOT_FOUND
                // 10057 is any failed delete; only its description says the message was
                // missing, and async-nats gives the description only as text.
                || (e.error_code() == NatsCode::STREAM_MESSAGE_DELETE_FAILED
                    && e.to_string().contains("no message found"))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_nats::jetstream::context::{PublishError, PublishErrorKind};

    #[test]
    fn nobody_answering_is_unavailable_anything_else_an_error() {
        for (kind, code) in [
            (
                PublishErrorKind::StreamNotFound,
                ErrorCode::BackendUnavailable,
            ),
            (PublishErrorKind::TimedOut, ErrorCode::BackendUnavailable),
            (PublishErrorKind::BrokenPipe, ErrorCode::BackendUnavailable),
            (
                PublishErrorKind::MaxPayloadExceeded,
                ErrorCode::BackendError,
            ),
        ] {
            let err = nats_failed("writing", PublishError::new(kind));
            assert_eq!(err.code, code, "{kind:?}");
        }
        // Nested, as a KV create reports the read that found no stream leader.
        let nested = PublishError::with_source(
            PublishErrorKind::Other,
            PublishError::new(PublishErrorKind::StreamNotFound),
        );
        assert_eq!(
            nats_failed("creating", nested).code,
            ErrorCode::BackendUnavailable
        );
        assert_eq!(
            nats_failed("writing", PublishError::new(PublishErrorKind::TimedOut)).message,
            "NATS failed while writing."
        );
    }

    #[test]
    fn silence_is_read_from_the_error_kinds_at_any_depth() {
        use async_nats::jetstream::kv::{EntryError, EntryErrorKind};
        use async_nats::jetstream::stream::{DirectGetError, DirectGetErrorKind};
        let no_responders = DirectGetError::new(DirectGetErrorKind::ErrorResponse(
            async_nats::StatusCode::NO_RESPONDERS,
            "no responders".into(),
        ));
        assert!(unanswered(&EntryError::with_source(
            EntryErrorKind::Other,
            no_responders
        )));
        let said = |code: u64| -> JsError {
            serde_json::from_str(&format!(
                r#"{{"code":503,"err_code":{code},"description":"said"}}"#
            ))
            .unwrap()
        };
        let cluster_down = PublishError::with_source(PublishErrorKind::Other, said(10008));
        assert!(unanswered(&cluster_down));
        let limit = PublishError::with_source(PublishErrorKind::Other, said(10077));
        assert!(!unanswered(&limit));
    }

    #[test]
    fn a_write_refused_for_another_in_flight_lost_a_race_of_its_own_kind() {
        use async_nats::jetstream::kv::{UpdateError, UpdateErrorKind};
        let said = |code: u64| {
            let said: async_nats::jetstream::Error = serde_json::from_str(&format!(
                r#"{{"code":400,"err_code":{code},"description":"wrong last sequence"}}"#
            ))
            .unwrap();
            UpdateError::from(PublishError::with_source(PublishErrorKind::Other, said))
        };
        let outdated = UpdateErrorKind::WrongLastRevision;
        assert_eq!(refusal(&said(10164), outdated), Some(Refused::InFlight));
        assert!(!lost_race(&said(10077), outdated));
        let wrong_revision =
            UpdateError::from(PublishError::new(PublishErrorKind::WrongLastSequence));
        assert_eq!(refusal(&wrong_revision, outdated), Some(Refused::Outdated));
        let timed_out = UpdateError::from(PublishError::new(PublishErrorKind::TimedOut));
        assert!(!lost_race(&timed_out, UpdateErrorKind::WrongLastRevision));
    }
}
