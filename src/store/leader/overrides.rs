//! The upkeep of operators' rate-limit overrides: ending those expired, sizing the token
//! streams of those in force.

use chrono::{DateTime, Utc};

use super::Leader;
use crate::domain::error::OjsError;
use crate::domain::rate_limit::LimitOverride;

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
}
