//! The dead letter queue (dead-letter spec §4, §6.1; HTTP binding §12): jobs discarded under
//! a `dead_letter` exhaustion policy, each with an entry in the dead-letter stream
//! (`entries.rs`) that its record names, so the queue is listed newest first by walking the
//! stream backwards — no key listing.

pub(super) mod entries;

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};

pub(super) use entries::Owned;
pub use entries::{DeadLetterStats, Entries};

use crate::domain::error::OjsError;
use crate::domain::job::{Job, JobRecord};
use crate::domain::lifecycle;
use crate::store::cas::Replica;
use crate::store::connection::Connection;
use crate::store::jobs::Jobs;
use entries::Entry;

/// The dead letter queue, as a caller holds it: its entries and the jobs they name.
#[derive(Clone)]
pub struct DeadLetter {
    pub(super) conn: Arc<Connection>,
    pub(super) entries: Entries,
    pub(super) jobs: Jobs,
}

/// One page of the dead letter queue, newest first.
#[derive(Debug, Clone)]
pub struct DeadLetterPage {
    pub jobs: Vec<Job>,
    /// Entries in the queue (or in the named queue), stale ones included.
    pub total: u64,
}

impl DeadLetter {
    /// The entries' stream: counts, statistics, whether an entry is still stored.
    pub fn entries(&self) -> &Entries {
        &self.entries
    }

    /// Lists dead-lettered jobs newest first, optionally of one queue: the entries at
    /// positions `offset` to `offset + limit` from the newest (stale ones take a position
    /// and show nothing). The entries are read oldest first in one go up to the page
    /// (a filtered consumer: a few NATS requests, at most `dead_letter_max_count` small
    /// messages), then the page's jobs, 32 at a time; so every entry retention keeps is
    /// reachable, and a page costs O(its size) NATS calls wherever it lies.
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn list(
        &self,
        queue: Option<&str>,
        limit: usize,
        offset: usize,
    ) -> Result<DeadLetterPage, OjsError> {
        let t = &self.conn.topology;
        let subject = queue.map(|q| t.dead_letter_subject(q));
        let entries = self
            .conn
            .read_stream_from(&t.dead_letter_stream(), subject.as_deref(), 1, usize::MAX)
            .await?;
        let page: Vec<(u64, Entry)> = entries
            .iter()
            .rev()
            .skip(offset)
            .take(limit)
            .filter_map(|e| Some((e.sequence, serde_json::from_slice(&e.payload).ok()?)))
            .collect();
        let records = futures::stream::iter(page)
            .map(|(sequence, entry)| async move {
                let found = self.jobs.read(&entry.id, Replica::Nearest).await?;
                // Only the job's current entry counts; a retried job left a stale one.
                Ok::<_, OjsError>(found.filter(|(rec, _)| rec.dead_letter == Some(sequence)))
            })
            .buffered(32)
            .try_collect::<Vec<_>>()
            .await?;
        Ok(DeadLetterPage {
            jobs: records
                .into_iter()
                .flatten()
                .map(|(rec, _)| rec.job)
                .collect(),
            total: entries.len() as u64,
        })
    }

    /// A job in the dead letter queue.
    ///
    /// # Errors
    /// 404 when the job is unknown or not in the dead letter queue.
    pub async fn get(&self, id: &str) -> Result<Job, OjsError> {
        Ok(self.dead_lettered(id, Replica::Nearest).await?.0.job)
    }

    /// The job's record and its revision while it is in the dead letter queue: the record
    /// names an entry and retention has not pruned that entry.
    async fn dead_lettered(&self, id: &str, from: Replica) -> Result<(JobRecord, u64), OjsError> {
        let not_in_queue = || OjsError::not_found("dead-letter job", id);
        let Some((record, revision)) = self.jobs.read(id, from).await? else {
            return Err(not_in_queue());
        };
        let Some(entry) = record.dead_letter else {
            return Err(not_in_queue());
        };
        if !self.entries.exists(entry).await? {
            return Err(not_in_queue());
        }
        Ok((record, revision))
    }

    /// Operator retry: the discarded job is available again with its attempts reset.
    ///
    /// # Errors
    /// 404 unknown job; 409 when it is not discarded.
    pub async fn retry(&self, id: &str) -> Result<Job, OjsError> {
        self.jobs.retry(id, lifecycle::retry_discarded).await
    }

    /// Removes a job from the dead letter queue for good: its entry and its record.
    ///
    /// # Errors
    /// 404 when the job is not in the dead letter queue; 409 when it keeps changing.
    pub async fn delete(&self, id: &str) -> Result<(), OjsError> {
        self.jobs
            .remove_job(id, |from| self.dead_lettered(id, from))
            .await
    }
}
