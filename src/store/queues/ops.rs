//! Queue operations (HTTP binding §11): the list of queues, pause and resume with their
//! events.

use chrono::Utc;
use futures::StreamExt;

use super::registry::QueueMeta;
use super::Queues;
use crate::domain::error::OjsError;
use crate::domain::event::queue_event;
use crate::store::deadline::answered;
use crate::store::error::backend;

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

    /// Deletes `queue` (the `ojs` command line's `queues --delete`), which the caller found
    /// holding no unfinished job: no longer listed; its streams, counters and finished
    /// jobs stay, and a job that reaches it again brings it back (architecture §3.17).
    ///
    /// # Errors
    /// 404 for a queue not registered; `backend_error` when NATS fails.
    pub async fn delete(&self, queue: &str) -> Result<(), OjsError> {
        self.own.registry.delete(queue, Utc::now()).await
    }

    /// How many of `queue`'s jobs wait or run in each of its priorities (priority spec
    /// §10.3), highest first: the messages of each priority's subject in the queue's
    /// stream, from one stream info. A job cancelled or moved to another priority while it
    /// waited still counts in its old lane until a FETCH passes its message. `None` for a
    /// queue never seen.
    ///
    /// # Errors
    /// `backend_error` when NATS fails.
    pub async fn by_priority(&self, queue: &str) -> Result<Option<Vec<(i32, u64)>>, OjsError> {
        let Some(meta) = self.own.registry.lookup(queue).await? else {
            return Ok(None);
        };
        let t = &self.conn.topology;
        let doing = "counting a queue's jobs by priority";
        let mut counts: Vec<(i32, u64)> = meta.priorities.iter().map(|&p| (p, 0)).collect();
        if counts.is_empty() {
            return Ok(Some(counts));
        }
        let name = t.queue_stream(queue);
        let stream = answered(doing, || self.conn.js.get_stream(&name))
            .await?
            .said
            .map_err(backend(doing))?;
        let mut subjects = stream
            .info_with_subjects(t.queue_subject_filter(queue))
            .await
            .map_err(backend(doing))?;
        while let Some(counted) = subjects.next().await {
            let (subject, n) = counted.map_err(backend(doing))?;
            if let Some(entry) = counts
                .iter_mut()
                .find(|(p, _)| t.queue_subject(queue, *p) == subject)
            {
                entry.1 = n as u64;
            }
        }
        Ok(Some(counts))
    }
}
