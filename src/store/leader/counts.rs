//! The event publisher's counting of job writes into the queue statistics.

use std::collections::BTreeMap;

use futures::future::try_join_all;

use super::Leader;
use crate::domain::error::OjsError;
use crate::domain::stats::{Change, QueueCounts};
use crate::store::cas;
use crate::store::stats::{counts_key, Counted, COUNTED};

impl Leader<'_> {
    /// Leader: counts one batch of job writes, `changes` by queue, then marks every write
    /// up to `through` (the batch's last) counted. Each queue's counters skip the writes
    /// they counted before, so a batch replayed after a crash changes nothing.
    ///
    /// # Errors
    /// When NATS fails or a write keeps being refused; the caller retries the batch.
    pub async fn count_writes(
        self,
        changes: &BTreeMap<String, Vec<Change>>,
        through: u64,
    ) -> Result<(), OjsError> {
        let kv = &self.store.stats().own.kv;
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
    pub async fn mark_counted(self, through: u64) -> Result<(), OjsError> {
        cas::change(
            &self.store.stats().own.kv,
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
}
