//! Queue statistics in the stats bucket (docs/architecture.md §3.17): the leader counts the
//! job writes it reads for events (`leader/counts.rs`), one compare-and-set per queue per
//! batch plus the `counted` mark; a reader waits until the mark covers every job write
//! stored when it asked, so the counts are exact for the client that just wrote
//! (`queue_counts`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use async_nats::jetstream::kv;
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tracing::debug;

use super::cas::{self, Current, Replica};
use super::connection::Connection;
use super::dead_letter::entries::Entries;
use super::error::backend;
use super::queues::registry::QueueMeta;
use super::queues::Queues;
use super::topology::encode_queue;
use crate::domain::error::OjsError;
use crate::domain::stats::QueueCounts;
use crate::domain::stats_history::{Resolution, Sample};

/// The statistics resource, as a caller holds it: the connection and what the resource owns.
#[derive(Clone)]
pub struct Stats {
    pub(super) conn: Arc<Connection>,
    pub(super) own: Arc<Owned>,
    pub(super) queues: Queues,
    pub(super) dead_letter: Entries,
}

/// What the statistics resource owns.
pub(super) struct Owned {
    /// Queue statistics.
    pub(super) kv: kv::Store,
    /// The jobs bucket's stream: the counts are measured against its last write.
    pub(super) jobs_stream: async_nats::jetstream::stream::Stream,
}

/// Key of the mark: every job write up to it is counted.
pub(super) const COUNTED: &str = "counted";
/// Longest a read waits for the leader to count the writes before it (a failover, NATS
/// trouble); past it the counts are answered as far as they go.
const COUNT_WAIT: Duration = Duration::from_secs(2);

/// Queue reads in flight at once while gathering every queue's counts.
const READS_AT_ONCE: usize = 32;

/// What `GET /queues/{name}/stats` reports.
#[derive(Debug, Clone)]
pub struct QueueStats {
    pub meta: Option<QueueMeta>,
    pub counts: QueueCounts,
    /// Entries in the dead letter queue.
    pub dead: u64,
    pub computed_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub(super) struct Counted {
    pub(super) through: u64,
}

/// The statistics entries as this process last wrote them as leader (at most one per
/// queue), with their revisions: the next batch's compare-and-sets start from them instead
/// of reading them back (`leader/counts.rs`). Another writer (an admin reset, a leader
/// before or after this one) makes one stale, which costs a refused write and a round that
/// reads.
#[derive(Default)]
pub(super) struct CountsWritten {
    pub(super) queues: HashMap<String, Current<QueueCounts>>,
    pub(super) mark: Option<Current<Counted>>,
}

pub(super) fn counts_key(queue: &str) -> String {
    format!("queue.{}", encode_queue(queue))
}

impl Stats {
    /// Every registered queue's counters, exact for what was written before the call (as
    /// [`Stats::queue_counts`]).
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn current_queue_counts(&self) -> Result<Vec<(String, QueueCounts)>, OjsError> {
        self.wait_counted().await?;
        self.all_queue_counts().await
    }

    /// Waits (pauses 1, 2, 4, 8, 16 ms; at most `COUNT_WAIT`) until every job write stored
    /// now is counted; past that, the counts are read as they are (no leader).
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn wait_counted(&self) -> Result<(), OjsError> {
        let stored = self.last_job_write().await?;
        let started = Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            let counted = self.counted_through().await?;
            if counted >= stored {
                return Ok(());
            }
            if started.elapsed() >= COUNT_WAIT {
                debug!(counted, stored, "queue counts are behind the job writes");
                return Ok(());
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(16));
        }
    }

    /// Every registered queue's counters as stored (a queue no job was written to has none).
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn all_queue_counts(&self) -> Result<Vec<(String, QueueCounts)>, OjsError> {
        futures::stream::iter(self.queues.list())
            .map(|q| async move {
                let counts = cas::read::<QueueCounts>(
                    &self.own.kv,
                    &counts_key(&q.name),
                    Replica::Nearest,
                    "queue count",
                )
                .await?;
                Ok::<_, OjsError>(counts.value.map(|c| (q.name, c)))
            })
            .buffered(READS_AT_ONCE)
            .try_filter_map(|found| async move { Ok(found) })
            .try_collect()
            .await
    }

    /// The mark: every job write up to it is counted.
    pub(super) async fn counted_through(&self) -> Result<u64, OjsError> {
        Ok(
            cas::read::<Counted>(&self.own.kv, COUNTED, Replica::Nearest, "counting mark")
                .await?
                .value
                .unwrap_or_default()
                .through,
        )
    }

    /// The sequence of the last job write stored.
    pub(super) async fn last_job_write(&self) -> Result<u64, OjsError> {
        Ok(self
            .own
            .jobs_stream
            .get_info()
            .await
            .map_err(backend("reading the jobs stream"))?
            .state
            .last_sequence)
    }

    /// The counters of `queue`, with every job write stored before the call counted (it
    /// waits for the leader to get there, up to two seconds); `None` for a queue no job
    /// was ever written to.
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn queue_counts(&self, queue: &str) -> Result<Option<QueueCounts>, OjsError> {
        self.wait_counted().await?;
        let counts = cas::read::<QueueCounts>(
            &self.own.kv,
            &counts_key(queue),
            Replica::Nearest,
            "queue count",
        )
        .await?;
        Ok(counts.value)
    }

    /// The statistics of `queue`, exact for every job write stored before the call.
    ///
    /// # Errors
    /// 404 for a queue never seen; `backend_error` when NATS fails.
    pub async fn queue(&self, queue: &str) -> Result<QueueStats, OjsError> {
        let (meta, counts, dead) = tokio::try_join!(
            self.queues.own.registry.lookup(queue),
            self.queue_counts(queue),
            self.dead_letter.count(queue),
        )?;
        if meta.is_none() && counts.is_none() {
            return Err(OjsError::not_found("queue", queue));
        }
        Ok(QueueStats {
            meta,
            counts: counts.unwrap_or_default(),
            dead,
            computed_at: Utc::now(),
        })
    }
}

/// Samples one history read takes at most: a day of minutes, a month of hours.
const SAMPLES_READ: usize = 2_000;

impl Stats {
    /// Stores the samples of one sampling time, `(queue, sample)` each, with their
    /// acknowledgements awaited together; a sample's message id names its queue and time,
    /// so a repeat (two leaders, a retried round) is stored once.
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn record_samples(
        &self,
        resolution: Resolution,
        samples: &[(String, Sample)],
    ) -> Result<(), OjsError> {
        let t = &self.conn.topology;
        let doing = "storing a statistics sample";
        let mut acks = Vec::with_capacity(samples.len());
        for (queue, sample) in samples {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(
                async_nats::header::NATS_MESSAGE_ID,
                format!("{queue}@{}", sample.at.timestamp()).as_str(),
            );
            let payload = serde_json::to_vec(sample).expect("samples serialize");
            acks.push(
                self.conn
                    .js
                    .publish_with_headers(
                        t.stats_history_subject(resolution, queue),
                        headers,
                        payload.into(),
                    )
                    .await
                    .map_err(backend(doing))?,
            );
        }
        for ack in
            futures::future::join_all(acks.into_iter().map(std::future::IntoFuture::into_future))
                .await
        {
            ack.map_err(backend(doing))?;
        }
        Ok(())
    }

    /// The samples of `queue` (or `ALL_QUEUES`) stored at or after `since`, oldest first.
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn samples(
        &self,
        resolution: Resolution,
        queue: &str,
        since: DateTime<Utc>,
    ) -> Result<Vec<Sample>, OjsError> {
        let t = &self.conn.topology;
        let stored = self
            .conn
            .read_stream_since(
                &t.stats_history_stream(resolution),
                Some(&t.stats_history_subject(resolution, queue)),
                since,
                SAMPLES_READ,
            )
            .await?;
        Ok(stored
            .iter()
            .filter_map(|m| serde_json::from_slice(&m.payload).ok())
            .collect())
    }
}
