//! The dead-letter stream's entries (dead-letter spec §4, §6.1): one per job discarded
//! under a `dead_letter` exhaustion policy, published before the job's discard is written
//! and named in its record. Retention is the stream's own limits, so NATS prunes entries and
//! a job counts only while its entry exists. The jobs resource adds and drops entries; the
//! dead letter queue's listings read them (`mod.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;

use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::{DirectGetErrorKind, State as StreamState};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::domain::error::OjsError;
use crate::domain::job::JobRecord;
use crate::store::connection::Connection;
use crate::store::deadline::by_deadline;
use crate::store::error::{already_deleted, backend};
use crate::store::topology::decode_queue;

/// The dead-letter entries, as a caller holds them: the connection and the stream.
#[derive(Clone)]
pub struct Entries {
    pub(in crate::store) conn: Arc<Connection>,
    pub(in crate::store) own: Arc<Owned>,
}

/// What the dead-letter entries own.
pub(in crate::store) struct Owned {
    /// The dead-letter stream.
    pub(in crate::store) stream: async_nats::jetstream::stream::Stream,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Entry {
    pub(super) id: String,
}

/// The dead letter queue as a whole (dead-letter spec §10.1), from the stream's own state:
/// no entry is read but the oldest and the newest.
#[derive(Debug, Clone)]
pub struct DeadLetterStats {
    pub total: u64,
    /// Entries by queue (by their subject), stale ones included.
    pub by_queue: BTreeMap<String, u64>,
    pub oldest_at: Option<DateTime<Utc>>,
    pub newest_at: Option<DateTime<Utc>>,
    pub max_age: std::time::Duration,
    pub max_count: i64,
}

impl Entries {
    /// Publishes the dead-letter entry of a job about to be discarded into the DLQ and
    /// returns its stream sequence, which the discard write stores in the record.
    pub(in crate::store) async fn add(&self, rec: &JobRecord) -> Result<u64, OjsError> {
        let body = serde_json::to_vec(&Entry {
            id: rec.job.id.clone(),
        })
        .expect("entries serialize");
        let sent = self
            .conn
            .send(
                self.conn
                    .topology
                    .dead_letter_subject(&rec.job.queue)
                    .into(),
                PublishMessage::build().payload(body.into()),
                "adding a dead-letter entry",
            )
            .await?;
        Ok(self.conn.stored(sent).await?.sequence)
    }

    /// Whether the dead-letter entry at `sequence` is still stored (retention removes them).
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn exists(&self, sequence: u64) -> Result<bool, OjsError> {
        match self.own.stream.direct_get(sequence).await {
            Ok(_) => Ok(true),
            Err(err) if err.kind() == DirectGetErrorKind::NotFound => Ok(false),
            Err(err) => Err(backend("reading the dead letter queue")(err)),
        }
    }

    /// Best effort, by the deadline: a stale entry left behind is skipped by listings.
    pub(in crate::store) async fn drop_entry(&self, seq: u64) {
        let Some(dropped) = by_deadline(self.own.stream.delete_message(seq)).await else {
            warn!(
                sequence = seq,
                "could not remove a dead-letter entry by the request's deadline"
            );
            return;
        };
        match dropped {
            Ok(_) => {}
            // Retention pruned it already.
            Err(err) if already_deleted(&err) => {}
            Err(err) => {
                warn!(sequence = seq, error = %err, "could not remove a dead-letter entry");
            }
        }
    }

    /// How many entries the dead letter queue holds for `queue` (one stream info; stale
    /// entries count, architecture §6 item 6).
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn count(&self, queue: &str) -> Result<u64, OjsError> {
        let subject = self.conn.topology.dead_letter_subject(queue);
        self.subject_count(&subject).await
    }

    /// Counts by queue and the oldest and newest entries' times: one stream info with
    /// subject counts (one per queue with entries) and two direct gets.
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn stats(&self) -> Result<DeadLetterStats, OjsError> {
        let t = &self.conn.topology;
        let doing = "reading the dead letter queue";
        let (state, by_queue) = self.by_queue().await?;
        let time_of = |seq: u64| async move {
            if seq == 0 {
                return Ok(None);
            }
            match self.own.stream.direct_get(seq).await {
                Ok(msg) => Ok(Some(DateTime::from_timestamp_nanos(
                    msg.time.unix_timestamp_nanos() as i64,
                ))),
                Err(err) if err.kind() == DirectGetErrorKind::NotFound => Ok(None),
                Err(err) => Err(backend(doing)(err)),
            }
        };
        let (oldest_at, newest_at) =
            tokio::try_join!(time_of(state.first_sequence), time_of(state.last_sequence))?;
        Ok(DeadLetterStats {
            total: state.messages,
            by_queue,
            oldest_at: oldest_at.filter(|_| state.messages > 0),
            newest_at: newest_at.filter(|_| state.messages > 0),
            max_age: t.dead_letter_max_age,
            max_count: t.dead_letter_max_count,
        })
    }

    /// The stream's state and its entries by source queue (queues with none left out): one
    /// stream info with subject counts.
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn by_queue(&self) -> Result<(StreamState, BTreeMap<String, u64>), OjsError> {
        let doing = "reading the dead letter queue";
        let mut info = self
            .own
            .stream
            .info_with_subjects(format!("{}.dlq.*", self.conn.topology.namespace))
            .await
            .map_err(backend(doing))?;
        let state = info.info.state.clone();
        let mut by_queue = BTreeMap::new();
        while let Some(subject) = info.next().await {
            let (subject, n) = subject.map_err(backend(doing))?;
            if let Some(queue) = subject.rsplit('.').next() {
                by_queue.insert(decode_queue(queue), n as u64);
            }
        }
        Ok((state, by_queue))
    }

    /// Entries in the dead letter queue, of every queue.
    pub async fn total(&self) -> Result<u64, OjsError> {
        let info = self
            .own
            .stream
            .get_info()
            .await
            .map_err(backend("reading the dead letter queue"))?;
        Ok(info.state.messages)
    }

    /// How many entries of the dead-letter stream are on `subject`.
    async fn subject_count(&self, subject: &str) -> Result<u64, OjsError> {
        let mut info = self
            .own
            .stream
            .info_with_subjects(subject)
            .await
            .map_err(backend("reading the dead letter queue"))?;
        let mut count = 0;
        while let Some(Ok((name, n))) = info.next().await {
            if name == subject {
                count = n as u64;
            }
        }
        Ok(count)
    }
}
