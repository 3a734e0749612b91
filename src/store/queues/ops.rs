//! Queue operations (HTTP binding §11): the list of queues, pause and resume with their
//! events, and the statistics of one queue (docs/architecture.md §3.17).

use chrono::{DateTime, Utc};

use super::Queues;
use crate::domain::error::OjsError;
use crate::domain::event::queue_event;
use crate::domain::stats::QueueCounts;
use crate::store::queues::QueueMeta;

/// What `GET /queues/{name}/stats` reports.
#[derive(Debug, Clone)]
pub struct QueueStats {
    pub meta: Option<QueueMeta>,
    pub counts: QueueCounts,
    /// Entries in the dead letter queue.
    pub dead: u64,
    pub computed_at: DateTime<Utc>,
}

impl Queues<'_> {
    /// Every queue, by name.
    pub fn list(self) -> Vec<QueueMeta> {
        self.own.registry.list()
    }

    /// Pauses (`paused`) or resumes `queue`, registering a queue never seen, and publishes
    /// `queue.paused` / `queue.resumed`. Every replica stops (or starts again) handing out
    /// its jobs as soon as its copy of the registry has the entry (a KV watch,
    /// milliseconds). The event of the entry in force is published on every call, under an
    /// id fixed by that entry: a client repeating a call whose answer was lost also repairs
    /// an event lost with it.
    ///
    /// # Errors
    /// 400 past `max_queues`; `backend_error` when NATS fails.
    pub async fn pause(self, queue: &str, paused: bool) -> Result<QueueMeta, OjsError> {
        let (meta, revision) = self
            .own
            .registry
            .set_paused(queue, paused, Utc::now())
            .await?;
        let event = queue_event(
            queue,
            meta.paused,
            revision,
            meta.status_since(),
            &self.store.inner.source,
        );
        self.store.events().publish(&[event]).await?;
        Ok(meta)
    }

    /// The statistics of `queue`, exact for every job write stored before the call.
    ///
    /// # Errors
    /// 404 for a queue never seen; `backend_error` when NATS fails.
    pub async fn stats(self, queue: &str) -> Result<QueueStats, OjsError> {
        let (meta, counts, dead) = tokio::try_join!(
            self.own.registry.lookup(queue),
            self.store.stats().queue_counts(queue),
            self.store.dead_letter().count(queue),
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
