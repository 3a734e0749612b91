//! Queue operations (HTTP binding §11): the list of queues, pause and resume with their
//! events.

use chrono::Utc;

use super::registry::QueueMeta;
use super::Queues;
use crate::domain::error::OjsError;
use crate::domain::event::queue_event;

impl Queues {
    /// Every queue, by name.
    pub fn list(&self) -> Vec<QueueMeta> {
        self.own.registry.list()
    }

    /// Registers `queue` before any job is pushed to it (the `ojs` command line's `queues
    /// --create`): listed, with the lane of the default priority made. A queue that exists
    /// is left as it is.
    ///
    /// # Errors
    /// 400 past `max_queues`; `backend_error` when NATS fails.
    pub async fn register(&self, queue: &str) -> Result<QueueMeta, OjsError> {
        self.own.registry.admit_new(queue)?;
        self.own.registry.ensure(queue, 0, Utc::now()).await?;
        self.own
            .registry
            .lookup(queue)
            .await?
            .ok_or_else(|| OjsError::not_found("queue", queue))
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
    pub async fn pause(&self, queue: &str, paused: bool) -> Result<QueueMeta, OjsError> {
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
            &self.conn.source,
        );
        self.events.publish(&[event]).await?;
        Ok(meta)
    }
}
