//! Queue statistics in the stats bucket (docs/architecture.md §3.17): the leader counts the
//! job writes it reads for events (`count_writes`), one compare-and-set per queue per batch
//! plus the `counted` mark; a reader waits until the mark covers every job write stored
//! when it asked, so the counts are exact for the client that just wrote (`queue_counts`).

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::try_join_all;
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tracing::debug;

use super::cas::{self, Replica};
use super::error::backend;
use super::topology::encode_queue;
use super::Store;
use crate::domain::error::OjsError;
use crate::domain::stats::{Change, QueueCounts};

/// Key of the mark: every job write up to it is counted.
const COUNTED: &str = "counted";
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
struct Counted {
    through: u64,
}

fn counts_key(queue: &str) -> String {
    format!("queue.{}", encode_queue(queue))
}

impl Store {
    /// After the admin reset: nothing stored before now will be counted.
    pub(super) async fn restart_counting(&self) -> Result<(), OjsError> {
        self.mark_counted(self.last_job_write().await?).await
    }

    /// Leader: counts one batch of job writes, `changes` by queue, then marks every write
    /// up to `through` (the batch's last) counted. Each queue's counters skip the writes
    /// they counted before, so a batch replayed after a crash changes nothing.
    ///
    /// # Errors
    /// When NATS fails or a write keeps being refused; the caller retries the batch.
    pub async fn count_writes(
        &self,
        changes: &BTreeMap<String, Vec<Change>>,
        through: u64,
    ) -> Result<(), OjsError> {
        let kv = &self.inner.stats;
        try_join_all(changes.iter().map(|(queue, changes)| async move {
            cas::change(
                kv,
                &counts_key(queue),
                "queue count",
                queue,
                move |current: Option<&QueueCounts>| {
                    let mut counts = current.cloned().unwrap_or_default();
                    if counts.through >= through {
                        return None;
                    }
                    for change in changes {
                        counts.apply(change);
                    }
                    counts.counted_through(through);
                    Some(counts)
                },
            )
            .await
        }))
        .await?;
        self.mark_counted(through).await
    }

    /// Marks every job write up to `through` counted (the mark never goes back). The
    /// leader's feed opens after what earlier leaderships handled, and writes from before
    /// counting began (an upgrade) will never be counted: marking them lets readers stop
    /// waiting for them.
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn mark_counted(&self, through: u64) -> Result<(), OjsError> {
        cas::change(
            &self.inner.stats,
            COUNTED,
            "counting mark",
            COUNTED,
            |current: Option<&Counted>| {
                (current.is_none_or(|c| c.through < through)).then_some(Counted { through })
            },
        )
        .await?;
        Ok(())
    }

    /// The cluster's job totals, queue counts, workers and backlogs, for the metrics the
    /// leader reports. Costs one read per registered queue and two stream-info requests —
    /// per scrape, on the leader only; workers are counted in memory.
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn cluster_totals(&self) -> Result<ClusterTotals, OjsError> {
        let queues = self.all_queue_counts().await?;
        let workers = self.worker_count() as u64;
        let counted = self.counted_through().await?;
        Ok(ClusterTotals {
            queues,
            workers,
            unhandled_writes: self.last_job_write().await?.saturating_sub(counted),
            timers_pending: self.timers_stored().await?,
        })
    }

    /// Every registered queue's counters, exact for what was written before the call (as
    /// [`Store::queue_counts`]).
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
        futures::stream::iter(self.queues())
            .map(|q| async move {
                let counts = cas::read::<QueueCounts>(
                    &self.inner.stats,
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
    async fn counted_through(&self) -> Result<u64, OjsError> {
        Ok(cas::read::<Counted>(
            &self.inner.stats,
            COUNTED,
            Replica::Nearest,
            "counting mark",
        )
        .await?
        .value
        .unwrap_or_default()
        .through)
    }

    /// The sequence of the last job write stored.
    async fn last_job_write(&self) -> Result<u64, OjsError> {
        Ok(self
            .inner
            .jobs
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
    pub async fn queue_counts(&self, queue: &str) -> Result<Option<QueueCounts>, OjsError> {
        self.wait_counted().await?;
        let counts = cas::read::<QueueCounts>(
            &self.inner.stats,
            &counts_key(queue),
            Replica::Nearest,
            "queue count",
        )
        .await?;
        Ok(counts.value)
    }
}
