//! The slot sweeper's upkeep of concurrency slots: freeing those no active job holds.

use std::time::Duration;

use chrono::Utc;

use super::Leader;
use crate::domain::error::OjsError;
use crate::domain::rate_limit;
use crate::domain::requests::MAX_FETCH_WAIT_MS;
use crate::store::cas::Replica;
use crate::store::queues::rate_limit::Slot;

impl Leader {
    /// Every queue with a concurrency limit, as this replica knows them.
    pub fn concurrency_limited_queues(&self) -> Vec<String> {
        self.queues.own.registry.concurrency_limited()
    }

    /// How old a running place must be before the sweep may free it: older than any claim
    /// still on its way (a FETCH takes no NATS step past its wait plus `nats_timeout_ms`,
    /// and its record write takes at most one `nats_timeout_ms` more).
    pub fn slot_grace(&self) -> Duration {
        Duration::from_millis(MAX_FETCH_WAIT_MS) + 2 * self.conn.nats_timeout
    }

    /// Leader: frees the running places of `queue` whose job no longer runs under them —
    /// a FETCH or ACK that died between its place and its record, or a lost delete — once
    /// older than `grace` (a claim still on its way may not have written its record yet).
    /// Reads every place (at most the limit) and one record per place.
    ///
    /// # Errors
    /// When NATS fails; the next sweep repeats it.
    pub async fn sweep_slots(&self, queue: &str, grace: Duration) -> Result<usize, OjsError> {
        let stream = self.conn.topology.slot_stream(queue);
        let places = self
            .conn
            .read_stream_from(&stream, None, 1, rate_limit::MAX_CONCURRENCY as usize)
            .await?;
        let mut freed = 0;
        for place in places {
            let age = Utc::now().timestamp_millis() - place.published_ms;
            if age < grace.as_millis() as i64 {
                continue;
            }
            let Ok(slot) = serde_json::from_slice::<Slot>(&place.payload) else {
                continue;
            };
            let held = self
                .jobs
                .read(&slot.id, Replica::Leader)
                .await?
                .is_some_and(|(rec, _)| {
                    rate_limit::holds_slot(&rec, slot.dispatch, place.sequence)
                });
            if !held {
                self.queues.give_back_slot(queue, place.sequence).await;
                freed += 1;
            }
        }
        Ok(freed)
    }
}
