//! The leader's upkeep of bounded queues' depth tokens: deleting those of jobs that left
//! their queue, and sweeping those no job holds.

use std::time::Duration;

use chrono::Utc;

use super::Leader;
use crate::domain::backpressure::Bound;
use crate::domain::error::OjsError;

impl Leader {
    /// Every bounded queue with its bound, as this replica knows them.
    pub fn bounded_queues(&self) -> Vec<(String, Bound)> {
        self.queues.own.registry.bounded()
    }

    /// How old a token must be before the sweep may free it: older than any PUSH still
    /// between its tokens and its records (a batch may take `batch_grace_ms`).
    pub fn token_grace(&self) -> Duration {
        self.conn.batch_grace + 2 * self.conn.nats_timeout
    }

    /// Leader: looks at `queue`'s tokens from sequence `from` on, at most `max` of them and
    /// only those older than `grace`, and deletes each whose job does not hold it (a PUSH
    /// that died between its tokens and its records, a refused one whose give-back was
    /// lost). A token held when looked at stays held until its job finishes, so each is
    /// looked at once: the answer is where the next look starts, and how many were freed.
    ///
    /// # Errors
    /// When NATS fails; the next sweep repeats it.
    pub async fn sweep_depth_tokens(
        &self,
        queue: &str,
        from: u64,
        grace: Duration,
        max: usize,
    ) -> Result<(u64, usize), OjsError> {
        let stream = self.conn.topology.depth_stream(queue);
        let tokens = self.conn.read_stream_from(&stream, None, from, max).await?;
        let now_ms = Utc::now().timestamp_millis();
        let old: Vec<_> = tokens
            .into_iter()
            .take_while(|t| now_ms - t.published_ms >= grace.as_millis() as i64)
            .collect();
        let next = old.last().map_or(from, |t| t.sequence + 1);
        let ids = old.iter().map(|t| {
            (
                std::str::from_utf8(&t.payload).unwrap_or_default(),
                t.sequence,
            )
        });
        let leaked: Vec<(&str, u64)> = self
            .jobs
            .unheld(ids)
            .await?
            .into_iter()
            .map(|i| (queue, old[i].sequence))
            .collect();
        let freed = leaked.len();
        self.queues.delete_depth_tokens(leaked).await?;
        Ok((next, freed))
    }
}
