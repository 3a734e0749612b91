//! Reading a stream's messages in order from a sequence or a time, for the leader's sweeps
//! of running places (`rate_limit.rs`) and depth tokens (`backpressure.rs`), the dead
//! letter queue's pages (`dead_letter/mod.rs`), the workflow and unique-lock listings and
//! the statistics history (`stats.rs`).

use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use futures::StreamExt;

use super::connection::Connection;
use super::error::backend;
use crate::domain::error::OjsError;

/// A message as stored.
pub(super) struct Stored {
    pub sequence: u64,
    pub subject: String,
    /// When NATS stored it, Unix milliseconds.
    pub published_ms: i64,
    pub payload: bytes::Bytes,
}

impl Connection {
    /// At most `max` messages of `stream` (on `subject`, else all) from sequence `from` on,
    /// in order, through an ephemeral consumer (memory, no acks) deleted afterwards: a few
    /// NATS requests, however many messages.
    ///
    /// # Errors
    /// When NATS fails.
    pub(super) async fn read_stream_from(
        &self,
        stream: &str,
        subject: Option<&str>,
        from: u64,
        max: usize,
    ) -> Result<Vec<Stored>, OjsError> {
        let deliver_policy = match from {
            0 | 1 => DeliverPolicy::All,
            start_sequence => DeliverPolicy::ByStartSequence { start_sequence },
        };
        self.read_stream(stream, subject, deliver_policy, max).await
    }

    /// As `read_stream_from`, from the first message stored at or after `since`.
    ///
    /// # Errors
    /// When NATS fails.
    pub(super) async fn read_stream_since(
        &self,
        stream: &str,
        subject: Option<&str>,
        since: chrono::DateTime<chrono::Utc>,
        max: usize,
    ) -> Result<Vec<Stored>, OjsError> {
        let start_time = time::OffsetDateTime::from_unix_timestamp_nanos(
            i128::from(since.timestamp_millis()) * 1_000_000,
        )
        .map_err(|_| OjsError::invalid("since", "since is out of range."))?;
        self.read_stream(
            stream,
            subject,
            DeliverPolicy::ByStartTime { start_time },
            max,
        )
        .await
    }

    async fn read_stream(
        &self,
        stream: &str,
        subject: Option<&str>,
        deliver_policy: DeliverPolicy,
        max: usize,
    ) -> Result<Vec<Stored>, OjsError> {
        let doing = "reading a stream in order";
        let stream = self
            .js
            .get_stream_no_info(stream)
            .await
            .map_err(backend(doing))?;
        let mut consumer = stream
            .create_consumer(pull::Config {
                deliver_policy,
                ack_policy: AckPolicy::None,
                inactive_threshold: Duration::from_secs(10),
                memory_storage: true,
                filter_subject: subject.unwrap_or_default().to_owned(),
                ..Default::default()
            })
            .await
            .map_err(backend(doing))?;
        let pending =
            (consumer.info().await.map_err(backend(doing))?.num_pending as usize).min(max);
        let mut stored = Vec::with_capacity(pending);
        // Pull until all are read, or a pull brings nothing (they went meanwhile).
        let mut pulled = true;
        while stored.len() < pending && pulled {
            pulled = false;
            let mut messages = consumer
                .fetch()
                .max_messages(pending - stored.len())
                .expires(Duration::from_secs(1))
                .messages()
                .await
                .map_err(backend(doing))?;
            while stored.len() < pending {
                let Some(message) = messages.next().await else {
                    break;
                };
                pulled = true;
                let message = message.map_err(backend(doing))?;
                let info = message.info().map_err(backend(doing))?;
                stored.push(Stored {
                    sequence: info.stream_sequence,
                    subject: message.subject.to_string(),
                    published_ms: (info.published.unix_timestamp_nanos() / 1_000_000) as i64,
                    payload: message.payload.clone(),
                });
            }
        }
        let _ = stream.delete_consumer(&consumer.cached_info().name).await;
        Ok(stored)
    }
}
