//! What the leader's pruner (`coordinator/pruner.rs`, architecture §3.13) reads and removes:
//! the jobs stream's writes by sequence, its cursor, and every message of a finished job.

use async_nats::jetstream::context::ConsumerInfoErrorKind;
use async_nats::jetstream::stream::DirectGetErrorKind;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::future::join_all;

use super::Leader;
use crate::domain::error::OjsError;
use crate::domain::job::JobRecord;
use crate::store::error::backend;

/// Key of the cursor in the coordinator bucket.
const CURSOR_KEY: &str = "pruner";

/// One message of the jobs stream, as the pruner sees it.
pub struct StoredWrite {
    pub sequence: u64,
    pub job_id: String,
    pub written_at: DateTime<Utc>,
    pub body: WriteBody,
}

pub enum WriteBody {
    Record(Box<JobRecord>),
    /// A removal marker (`DELETE /dead-letter/{id}`).
    Removed,
    /// A record this build cannot read: never pruned.
    Unreadable,
}

impl Leader {
    /// The sequence the pruner continues from; 0 when it never ran.
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn pruner_cursor(&self) -> Result<u64, OjsError> {
        let entry = self
            .own
            .kv
            .get(CURSOR_KEY)
            .await
            .map_err(backend("reading the pruner's cursor"))?;
        Ok(entry
            .and_then(|v| std::str::from_utf8(&v).ok()?.parse().ok())
            .unwrap_or(0))
    }

    /// # Errors
    /// When NATS fails.
    pub async fn save_pruner_cursor(&self, next: u64) -> Result<(), OjsError> {
        self.own
            .kv
            .put(CURSOR_KEY, Bytes::from(next.to_string()))
            .await
            .map_err(backend("storing the pruner's cursor"))?;
        Ok(())
    }

    /// The sequences of the jobs stream the pruner of leadership `term` may look at now:
    /// from the stream's first one through the last write that leadership's event publisher
    /// has acknowledged, so no write is removed before its events are stored. Empty
    /// (`first > last`) before that, and for a leadership whose feed a later one replaced.
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn prunable_sequences(
        &self,
        term: u64,
    ) -> Result<std::ops::RangeInclusive<u64>, OjsError> {
        let stream = &self.jobs.own.kv.stream;
        let first = stream
            .get_info()
            .await
            .map_err(backend("reading the jobs stream"))?
            .state
            .first_sequence;
        let acked = match stream
            .consumer_info(self.conn.topology.event_publisher_consumer(term))
            .await
        {
            Ok(info) => info.ack_floor.stream_sequence,
            Err(err) if err.kind() == ConsumerInfoErrorKind::NotFound => 0,
            Err(err) => return Err(backend("reading the event publisher's progress")(err)),
        };
        Ok(first..=acked)
    }

    /// The writes stored at `sequences`, in order; sequences no longer stored are left out.
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn stored_writes(
        &self,
        sequences: std::ops::RangeInclusive<u64>,
    ) -> Result<Vec<StoredWrite>, OjsError> {
        let stream = &self.jobs.own.kv.stream;
        let reads = join_all(sequences.map(|seq| stream.direct_get(seq))).await;
        let mut writes = Vec::with_capacity(reads.len());
        for read in reads {
            let msg = match read {
                Ok(msg) => msg,
                Err(err) if err.kind() == DirectGetErrorKind::NotFound => continue,
                Err(err) => return Err(backend("reading the jobs stream")(err)),
            };
            // `$KV.<bucket>.<job id>`
            let Some(job_id) = msg.subject.splitn(3, '.').nth(2) else {
                continue;
            };
            let body = if msg.headers.get("KV-Operation").is_some() {
                WriteBody::Removed
            } else {
                match serde_json::from_slice(&msg.payload) {
                    Ok(rec) => WriteBody::Record(Box::new(rec)),
                    Err(_) => WriteBody::Unreadable,
                }
            };
            writes.push(StoredWrite {
                sequence: msg.sequence,
                job_id: job_id.to_string(),
                written_at: DateTime::from_timestamp_nanos(msg.time.unix_timestamp_nanos() as i64),
                body,
            });
        }
        Ok(writes)
    }

    /// Removes every message of job `id` up to and including sequence `through`; a later
    /// write (the job was retried, or its id reused) stays.
    ///
    /// # Errors
    /// When NATS refuses the purge.
    pub async fn prune_job(&self, id: &str, through: u64) -> Result<(), OjsError> {
        self.jobs
            .own
            .kv
            .stream
            .purge()
            .filter(format!("$KV.{}.{id}", self.conn.topology.jobs_bucket()))
            .sequence(through + 1)
            .await
            .map_err(backend("pruning a finished job"))?;
        Ok(())
    }
}
