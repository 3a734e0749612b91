//! The event publisher's counting of job writes into the queue statistics, and the
//! cluster's totals the leader reports as metrics.

use std::collections::BTreeMap;

use futures::future::try_join_all;

use super::Leader;
use crate::domain::error::OjsError;
use crate::domain::stats::{Change, QueueCounts};
use crate::store::cas;
use crate::store::stats::{counts_key, Counted, CountsWritten, COUNTED};

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

impl Leader {
    /// The cluster's job totals, queue counts, workers and backlogs, for the metrics the
    /// leader reports and the admin statistics. Costs one read per registered queue and two
    /// stream-info requests; workers are counted in memory.
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn cluster_totals(&self) -> Result<ClusterTotals, OjsError> {
        let queues = self.stats.all_queue_counts().await?;
        let workers = self.workers.count() as u64;
        let counted = self.stats.counted_through().await?;
        Ok(ClusterTotals {
            queues,
            workers,
            unhandled_writes: self.stats.last_job_write().await?.saturating_sub(counted),
            timers_pending: self.timers.timers_stored().await?,
        })
    }

    /// After the admin reset: nothing stored before now will be counted.
    pub(in crate::store) async fn restart_counting(&self) -> Result<(), OjsError> {
        self.mark_counted(self.stats.last_job_write().await?).await
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
        let kv = &self.stats.own.kv;
        let written = try_join_all(changes.iter().map(|(queue, changes)| async move {
            let known = self.written().queues.get(queue).cloned();
            let current = cas::change_from(
                kv,
                &counts_key(queue),
                "queue count",
                queue,
                known,
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
            .await?;
            Ok::<_, OjsError>((queue.clone(), current))
        }))
        .await?;
        self.written().queues.extend(written);
        self.mark_counted(through).await
    }

    fn written(&self) -> std::sync::MutexGuard<'_, CountsWritten> {
        self.own
            .counts_written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Marks every job write up to `through` counted (the mark never goes back). The
    /// leader's feed opens after what earlier leaderships handled, and writes from before
    /// counting began (an upgrade) will never be counted: marking them lets readers stop
    /// waiting for them.
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn mark_counted(&self, through: u64) -> Result<(), OjsError> {
        let known = self.written().mark.clone();
        let current = cas::change_from(
            &self.stats.own.kv,
            COUNTED,
            "counting mark",
            COUNTED,
            known,
            |current: Option<&Counted>| {
                (current.is_none_or(|c| c.through < through)).then_some(Counted { through })
            },
        )
        .await?;
        self.written().mark = Some(current);
        Ok(())
    }
}
