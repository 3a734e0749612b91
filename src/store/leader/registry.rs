//! The queue registry's upkeep: ending expired rate-limit overrides and sizing their
//! streams, removing the entries of deleted queues.

use chrono::{DateTime, Utc};

use super::Leader;
use crate::domain::error::OjsError;
use crate::domain::rate_limit::LimitOverride;
use crate::domain::time;

impl Leader {
    /// Every queue with an override, expired or not, as this replica knows them.
    pub fn limit_overrides(&self) -> Vec<(String, LimitOverride)> {
        self.queues.own.registry.overridden()
    }

    /// Leader: ends `queue`'s override `set` when it has expired at `now` (whether it
    /// ended it), else makes sure its token streams hold its limits.
    ///
    /// # Errors
    /// When NATS fails; the next round repeats it.
    pub async fn keep_override(
        &self,
        queue: &str,
        set: LimitOverride,
        now: DateTime<Utc>,
    ) -> Result<bool, OjsError> {
        if set.in_force(now) {
            self.queues.keep_override(queue, set).await?;
            return Ok(false);
        }
        self.queues.end_override(queue, Some(set.set_at)).await
    }

    /// How long a deleted queue's entry is kept: past it, no PUSH or timer that read the
    /// entry before the deletion is still under way (each is bounded by the request
    /// deadline, a batch by `batch_grace_ms`, plus a NATS timeout for its publish).
    fn deleted_queue_grace(&self) -> std::time::Duration {
        self.conn.request_deadline.max(self.conn.batch_grace) + 2 * self.conn.nats_timeout
    }

    /// The deleted queues whose entry may be removed at `now`, as this replica knows them.
    pub fn deleted_queues_due(&self, now: DateTime<Utc>) -> Vec<String> {
        let grace = self.deleted_queue_grace();
        self.queues
            .own
            .registry
            .deleted()
            .into_iter()
            .filter(|(_, at)| time::add(*at, grace) <= now)
            .map(|(queue, _)| queue)
            .collect()
    }

    /// Leader: removes the entry of deleted `queue` unless a job reached it after all
    /// (then it is listed again). Whether it removed it.
    ///
    /// # Errors
    /// When NATS fails; the next round repeats it.
    pub async fn remove_deleted_queue(
        &self,
        queue: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, OjsError> {
        let before =
            now - chrono::Duration::from_std(self.deleted_queue_grace()).unwrap_or_default();
        self.queues.own.registry.remove_deleted(queue, before).await
    }
}
