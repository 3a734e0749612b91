//! JetStream publishes awaited until stored: sent without waiting for their
//! acknowledgement (so that many go to NATS together), and sent again while NATS does not
//! answer (`deadline.rs`). Only for messages of which a spare copy is harmless (queue
//! messages, timers, dead-letter entries: architecture §2) or which NATS drops as repeats
//! (events, by their `Nats-Msg-Id`).

use async_nats::jetstream::context::PublishAckFuture;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::publish::PublishAck;
use async_nats::Subject;

use super::deadline::answered;
use super::error::{nats_failed, unanswered};
use super::Store;
use crate::domain::error::OjsError;

/// A publish sent, its acknowledgement not yet awaited.
pub(super) struct Sent {
    subject: Subject,
    message: PublishMessage,
    ack: PublishAckFuture,
    doing: &'static str,
}

impl Store {
    /// Sends `message` on `subject` without waiting for NATS to store it.
    pub(super) async fn send(
        &self,
        subject: Subject,
        message: PublishMessage,
        doing: &'static str,
    ) -> Result<Sent, OjsError> {
        let ack = self
            .inner
            .js
            .send_publish(subject.clone(), message.clone())
            .await
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
        match ack.await {
            Ok(ack) => Ok(ack),
            Err(err) if unanswered(&err) => {
                let again = || async {
                    self.inner
                        .js
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
}
