//! JetStream publishes awaited until stored: sent without waiting for their
//! acknowledgement (so that many go to NATS together), and sent again while NATS does not
//! answer (`deadline.rs`). Only for messages of which a spare copy is harmless (queue
//! messages, timers, dead-letter entries: architecture §2) or which NATS drops as repeats
//! (events, by their `Nats-Msg-Id`). Tokens of the limit streams (running places, starts,
//! depth) are sent again too: a spare token holds a place until the leader's sweep frees
//! it, or spends one start of its window.

use std::time::Duration;

use async_nats::jetstream::context::{
    GetStreamByNameErrorKind, PublishAckFuture, PublishErrorKind,
};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::publish::PublishAck;
use async_nats::jetstream::stream;
use async_nats::Subject;
use bytes::Bytes;
use tracing::warn;

use super::connection::{ensure_stream, Connection};
use super::deadline::{self, answered, out_of_time};
use super::error::{nats_failed, server_refused, unanswered};
use crate::domain::error::OjsError;

/// How long a token's publish waits for NATS to say which stream listens on its subject.
const STREAM_CHECK: Duration = Duration::from_millis(250);

/// A publish sent, its acknowledgement not yet awaited.
pub(super) struct Sent {
    subject: Subject,
    message: PublishMessage,
    ack: PublishAckFuture,
    doing: &'static str,
}

impl Connection {
    /// Sends `message` on `subject` without waiting for NATS to store it.
    pub(super) async fn send(
        &self,
        subject: Subject,
        message: PublishMessage,
        doing: &'static str,
    ) -> Result<Sent, OjsError> {
        // Handing the message to the client waits while its buffer is full (a reconnect):
        // by the deadline.
        let handed = self.js.send_publish(subject.clone(), message.clone());
        let ack = tokio::time::timeout_at(deadline::current(), handed)
            .await
            .map_err(|_| out_of_time(doing))?
            .map_err(|e| nats_failed(doing, e))?;
        Ok(Sent {
            subject,
            message,
            ack,
            doing,
        })
    }

    /// Waits until NATS stored every message of `sent`.
    ///
    /// # Errors
    /// The first message NATS refused, or did not store by the deadline.
    pub(super) async fn all_stored(&self, sent: Vec<Sent>) -> Result<(), OjsError> {
        for stored in futures::future::join_all(sent.into_iter().map(|s| self.stored(s))).await {
            stored?;
        }
        Ok(())
    }

    /// Waits until NATS stored `sent`, publishing it again while NATS does not answer.
    ///
    /// # Errors
    /// When NATS refused the message, or did not store it by the deadline.
    pub(super) async fn stored(&self, sent: Sent) -> Result<PublishAck, OjsError> {
        let Sent {
            subject,
            message,
            ack,
            doing,
        } = sent;
        // The acknowledgement waits up to `nats_timeout_ms`, which may end past the
        // request's deadline: the deadline cuts it, as it cuts every step of a request
        // (the message may have landed, as after any write NATS did not answer).
        let Ok(said) = tokio::time::timeout_at(deadline::current(), ack).await else {
            return Err(out_of_time(doing));
        };
        match said {
            Ok(ack) => Ok(ack),
            Err(err) if unanswered(&err) => {
                let again = || async {
                    self.js
                        .send_publish(subject.clone(), message.clone())
                        .await?
                        .await
                };
                answered(doing, again)
                    .await?
                    .said
                    .map_err(|e| nats_failed(doing, e))
            }
            Err(err) => Err(nats_failed(doing, err)),
        }
    }

    /// Publishes a token of a limit stream (`config`, whose limit refuses a token when
    /// every place is taken) on `subject`: `None` when the limit refused it. Sent again
    /// while NATS does not answer; the stream is made again when no stream listens on the
    /// subject any more (deleted by hand, or of an earlier layout), told apart from an
    /// election by asking NATS which stream listens.
    ///
    /// # Errors
    /// When NATS failed otherwise, or did not answer by the deadline.
    pub(super) async fn take_token(
        &self,
        subject: String,
        body: Bytes,
        config: impl Fn() -> stream::Config,
        doing: &'static str,
    ) -> Result<Option<PublishAck>, OjsError> {
        let js = &self.js;
        let publish = || async { js.publish(subject.clone(), body.clone()).await?.await };
        let step = || async {
            match publish().await {
                Err(err) if err.kind() == PublishErrorKind::StreamNotFound => {
                    // Briefly: during an election of the cluster's meta leader nobody
                    // answers, and the step is run again anyway.
                    let listened =
                        tokio::time::timeout(STREAM_CHECK, js.stream_by_subject(subject.as_str()))
                            .await;
                    if listened.is_ok_and(|l| {
                        l.is_err_and(|e| e.kind() == GetStreamByNameErrorKind::NotFound)
                    }) {
                        if let Err(err) = ensure_stream(js, config()).await {
                            warn!(subject, error = %err, "could not make a limit stream again");
                        }
                        return publish().await;
                    }
                    Err(err)
                }
                said => said,
            }
        };
        match answered(doing, step).await?.said {
            Ok(ack) => Ok(Some(ack)),
            Err(err) if server_refused(&err) => Ok(None),
            Err(err) => Err(nats_failed(doing, err)),
        }
    }
}
