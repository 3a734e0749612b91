//! Queue statistics in the stats bucket (docs/architecture.md §3.17): the leader counts the
//! job writes it reads for events (`leader/counts.rs`), one compare-and-set per queue per
//! batch plus the `counted` mark; a reader waits until the mark covers every job write
//! stored when it asked, so the counts are exact for the client that just wrote
//! (`queue_counts`).

use std::time::Duration;

use async_nats::jetstream::kv;
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tracing::debug;

use super::cas::{self, Replica};
use super::error::backend;
use super::topology::encode_queue;
use super::Store;
use crate::domain::error::OjsError;
use crate::domain::stats::QueueCounts;

/// The statistics resource, as a caller holds it: the store and what the resource owns.
#[derive(Clone, Copy)]
pub struct Stats<'a> {
    pub(super) store: &'a Store,
    pub(super) own: &'a Owned,
}

/// What the statistics resource owns.
pub(super) struct Owned {
    /// Queue statistics.
    pub(super) kv: kv::Store,
}

/// Key of the mark: every job write up to it is counted.
pub(super) const COUNTED: &str = "counted";
/// Longest a read waits for the leader to count the writes before it (a failover, NATS
/// trouble); past it the counts are answered as far as they go.
const COUNT_WAIT: Duration = Duration::from_secs(2);

/// Queue reads in flight at once while gathering [`ClusterTotals`].
const READS_AT_ONCE: usize = 32;

/// What the job metrics report of the whole cluster (`telemetry/job_metrics.rs`).
#[derive(Debug, Clone, Default)]
pub struct ClusterTotals {
    /// Every registered queue's counters (a queue no job was written to has none).
    pub queues: Vec<(String, QueueCounts)>,
    /// Workers in the registry: heartbeating, or not yet declared dead.
    pub workers: u64,
    /// Job writes stored but not yet handled (events, counts) by the event publisher.
    pub unhandled_writes: u64,
    /// Timers stored and not yet fired.
    pub timers_pending: u64,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub(super) struct Counted {
    pub(super) through: u64,
}

pub(super) fn counts_key(queue: &str) -> String {
    format!("queue.{}", encode_queue(queue))
}

impl Stats<'_> {
    /// After the admin reset: nothing stored before now will be counted.
    pub(super) async fn restart_counting(self) -> Result<(), OjsError> {
        self.store
            .leader()
            .mark_counted(self.last_job_write().await?)
            .await
    }

    /// The cluster's job totals, queue counts, workers and backlogs, for the metrics the
    /// leader reports. Costs one read per registered queue and two stream-info requests —
    /// per scrape, on the leader only; workers are counted in memory.
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn cluster_totals(self) -> Result<ClusterTotals, OjsError> {
        let queues = self.all_queue_counts().await?;
        let workers = self.store.workers().count() as u64;
        let counted = self.counted_through().await?;
        Ok(ClusterTotals {
            queues,
            workers,
            unhandled_writes: self.last_job_write().await?.saturating_sub(counted),
            timers_pending: self.store.timers().timers_stored().await?,
        })
    }

    /// Every registered queue's counters, exact for what was written before the call (as
    /// [`Stats::queue_counts`]).
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn current_queue_counts(self) -> Result<Vec<(String, QueueCounts)>, OjsError> {
        self.wait_counted().await?;
        self.all_queue_counts().await
    }

    /// Waits (pauses 1, 2, 4, 8, 16 ms; at most `COUNT_WAIT`) until every job write stored
    /// now is counted; past that, the counts are read as they are (no leader).
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn wait_counted(self) -> Result<(), OjsError> {
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
    pub async fn all_queue_counts(self) -> Result<Vec<(String, QueueCounts)>, OjsError> {
        futures::stream::iter(self.store.queues().list())
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
    async fn counted_through(self) -> Result<u64, OjsError> {
        Ok(
            cas::read::<Counted>(&self.own.kv, COUNTED, Replica::Nearest, "counting mark")
                .await?
                .value
                .unwrap_or_default()
                .through,
        )
    }

    /// The sequence of the last job write stored.
    async fn last_job_write(self) -> Result<u64, OjsError> {
        Ok(self
            .store
            .jobs()
            .own
            .kv
            .stream
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
    pub async fn queue_counts(self, queue: &str) -> Result<Option<QueueCounts>, OjsError> {
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
}
