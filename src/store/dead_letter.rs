//! The dead letter queue (dead-letter spec §4, §6.1; HTTP binding §12): jobs discarded under
//! a `dead_letter` exhaustion policy. Each one has an entry in the dead-letter stream,
//! published before the job's discard is written and named in its record, so the queue is
//! listed newest first by walking the stream backwards — no key listing. Retention is the
//! stream's own limits, so NATS prunes entries and a job counts only while its entry exists.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::DirectGetErrorKind;
use chrono::{DateTime, Utc};
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::cas::{gave_up, pause_after, Cas, Replica, MAX_CAS_ATTEMPTS};
use super::deadline::by_deadline;
use super::error::{already_deleted, backend};
use super::topology::decode_queue;
use super::Store;
use crate::domain::error::OjsError;
use crate::domain::job::{Job, JobRecord};
use crate::domain::lifecycle;

/// The dead-letter resource, as a caller holds it: the store and what the resource owns.
#[derive(Clone, Copy)]
pub struct DeadLetter<'a> {
    pub(super) store: &'a Store,
    pub(super) own: &'a Owned,
}

/// What the dead-letter resource owns.
pub(super) struct Owned {
    /// The dead-letter stream, for listings.
    pub(super) stream: async_nats::jetstream::stream::Stream,
}

#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    id: String,
}

/// One page of the dead letter queue, newest first.
#[derive(Debug, Clone)]
pub struct DeadLetterPage {
    pub jobs: Vec<Job>,
    /// Entries in the queue (or in the named queue), stale ones included.
    pub total: u64,
}

/// The dead letter queue as a whole (dead-letter spec §10.1), from the stream's own state:
/// no entry is read but the oldest and the newest.
#[derive(Debug, Clone)]
pub struct DeadLetterStats {
    pub total: u64,
    /// Entries by queue (by their subject), stale ones included.
    pub by_queue: BTreeMap<String, u64>,
    pub oldest_at: Option<DateTime<Utc>>,
    pub newest_at: Option<DateTime<Utc>>,
    pub max_age: std::time::Duration,
    pub max_count: i64,
}

impl DeadLetter<'_> {
    /// Publishes the dead-letter entry of a job about to be discarded into the DLQ and
    /// returns its stream sequence, which the discard write stores in the record.
    pub(super) async fn add(self, rec: &JobRecord) -> Result<u64, OjsError> {
        let body = serde_json::to_vec(&Entry {
            id: rec.job.id.clone(),
        })
        .expect("entries serialize");
        let sent = self
            .store
            .send(
                self.store
                    .inner
                    .topology
                    .dead_letter_subject(&rec.job.queue)
                    .into(),
                PublishMessage::build().payload(body.into()),
                "adding a dead-letter entry",
            )
            .await?;
        Ok(self.store.stored(sent).await?.sequence)
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
        self,
        queue: Option<&str>,
        limit: usize,
        offset: usize,
    ) -> Result<DeadLetterPage, OjsError> {
        let t = &self.store.inner.topology;
        let subject = queue.map(|q| t.dead_letter_subject(q));
        let entries = self
            .store
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
                let found = self.store.jobs().read(&entry.id, Replica::Nearest).await?;
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
    pub async fn get(self, id: &str) -> Result<Job, OjsError> {
        Ok(self.dead_lettered(id, Replica::Nearest).await?.0.job)
    }

    /// The job's record and its revision while it is in the dead letter queue: the record
    /// names an entry and retention has not pruned that entry.
    async fn dead_lettered(self, id: &str, from: Replica) -> Result<(JobRecord, u64), OjsError> {
        let not_in_queue = || OjsError::not_found("dead-letter job", id);
        let Some((record, revision)) = self.store.jobs().read(id, from).await? else {
            return Err(not_in_queue());
        };
        let Some(entry) = record.dead_letter else {
            return Err(not_in_queue());
        };
        if !self.entry_exists(entry).await? {
            return Err(not_in_queue());
        }
        Ok((record, revision))
    }

    /// Whether the dead-letter entry at `sequence` is still stored (retention removes them).
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn entry_exists(self, sequence: u64) -> Result<bool, OjsError> {
        match self.own.stream.direct_get(sequence).await {
            Ok(_) => Ok(true),
            Err(err) if err.kind() == DirectGetErrorKind::NotFound => Ok(false),
            Err(err) => Err(backend("reading the dead letter queue")(err)),
        }
    }

    /// Operator retry: the discarded job is available again with its attempts reset.
    ///
    /// # Errors
    /// 404 unknown job; 409 when it is not discarded.
    pub async fn retry_dead_letter(self, id: &str) -> Result<Job, OjsError> {
        self.retry(id, lifecycle::retry_discarded).await
    }

    /// A retry decided by `decide`; a job that was in the dead letter queue leaves it. A
    /// finished job of a bounded queue takes a place in it first (429 `queue_full` when
    /// there is none), given back when the retry is refused.
    pub(super) async fn retry(
        self,
        id: &str,
        decide: fn(&JobRecord, DateTime<Utc>) -> Result<JobRecord, OjsError>,
    ) -> Result<Job, OjsError> {
        let (found, revision) = self
            .store
            .jobs()
            .read(id, Replica::Nearest)
            .await?
            .ok_or_else(|| OjsError::not_found("job", id))?;
        let mut tokens = Vec::new();
        let mut token = None;
        if found.job.state.is_terminal() {
            let mut taking = [found.clone()];
            tokens = self
                .store
                .queues()
                .take_depth_tokens(&mut taking, Duration::ZERO)
                .await?;
            token = taking[0].depth_token;
        }
        let settled = self
            .store
            .jobs()
            .transition_from(id, Some((found, revision)), |rec, now| {
                let mut next = decide(rec, now)?;
                if rec.job.state.is_terminal() {
                    next.depth_token = token;
                }
                Ok(Some(next))
            })
            .await;
        let settled = match settled {
            Ok(settled) => settled,
            Err(err) => {
                self.store.queues().give_back_unheld(&tokens).await;
                return Err(err);
            }
        };
        if let Some(seq) = settled.before.dead_letter {
            self.drop_dead_letter_entry(seq).await;
        }
        Ok(settled.after.job)
    }

    /// Removes a job from the dead letter queue for good: its entry and its record.
    ///
    /// # Errors
    /// 404 when the job is not in the dead letter queue; 409 when it keeps changing.
    pub async fn delete(self, id: &str) -> Result<(), OjsError> {
        self.remove_job(id, |from| self.dead_lettered(id, from))
            .await
    }

    /// Removes the record `find` reads and accepts, then its dead-letter entry if it has one.
    /// The removal names the revision `find` decided on, so a job changed meanwhile (retried,
    /// say) is decided again, never lost.
    ///
    /// # Errors
    /// What `find` refuses with; 409 when the job keeps changing.
    pub(super) async fn remove_job<F, Fut>(self, id: &str, find: F) -> Result<(), OjsError>
    where
        F: Fn(Replica) -> Fut,
        Fut: Future<Output = Result<(JobRecord, u64), OjsError>>,
    {
        let mut raced = None;
        for round in 0..MAX_CAS_ATTEMPTS {
            let (record, revision) = find(Replica::after(raced.is_some())).await?;
            match self.store.jobs().remove_record(&record, revision).await? {
                Cas::Written(_) => {
                    self.store.failpoint("dead_letter.purged").await;
                    if let Some(entry) = record.dead_letter {
                        self.drop_dead_letter_entry(entry).await;
                    }
                    return Ok(());
                }
                Cas::Refused(why) => {
                    raced = Some(why);
                    pause_after(why, round).await;
                }
            }
        }
        Err(gave_up("job", id, raced))
    }

    /// Best effort, by the deadline: a stale entry left behind is skipped by listings.
    async fn drop_dead_letter_entry(self, seq: u64) {
        let Some(dropped) = by_deadline(self.own.stream.delete_message(seq)).await else {
            warn!(
                sequence = seq,
                "could not remove a dead-letter entry by the request's deadline"
            );
            return;
        };
        match dropped {
            Ok(_) => {}
            // Retention pruned it already.
            Err(err) if already_deleted(&err) => {}
            Err(err) => {
                warn!(sequence = seq, error = %err, "could not remove a dead-letter entry");
            }
        }
    }
}

impl DeadLetter<'_> {
    /// How many entries the dead letter queue holds for `queue` (one stream info; stale
    /// entries count, architecture §6 item 6).
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn count(self, queue: &str) -> Result<u64, OjsError> {
        let subject = self.store.inner.topology.dead_letter_subject(queue);
        self.subject_count(&subject).await
    }

    /// Counts by queue and the oldest and newest entries' times: one stream info with
    /// subject counts (one per queue with entries) and two direct gets.
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn stats(self) -> Result<DeadLetterStats, OjsError> {
        let t = &self.store.inner.topology;
        let doing = "reading the dead letter queue";
        let mut info = self
            .own
            .stream
            .info_with_subjects(format!("{}.dlq.*", t.namespace))
            .await
            .map_err(backend(doing))?;
        let state = info.info.state.clone();
        let mut by_queue = BTreeMap::new();
        while let Some(subject) = info.next().await {
            let (subject, n) = subject.map_err(backend(doing))?;
            if let Some(queue) = subject.rsplit('.').next() {
                by_queue.insert(decode_queue(queue), n as u64);
            }
        }
        let time_of = |seq: u64| async move {
            if seq == 0 {
                return Ok(None);
            }
            match self.own.stream.direct_get(seq).await {
                Ok(msg) => Ok(Some(DateTime::from_timestamp_nanos(
                    msg.time.unix_timestamp_nanos() as i64,
                ))),
                Err(err) if err.kind() == DirectGetErrorKind::NotFound => Ok(None),
                Err(err) => Err(backend(doing)(err)),
            }
        };
        let (oldest_at, newest_at) =
            tokio::try_join!(time_of(state.first_sequence), time_of(state.last_sequence))?;
        Ok(DeadLetterStats {
            total: state.messages,
            by_queue,
            oldest_at: oldest_at.filter(|_| state.messages > 0),
            newest_at: newest_at.filter(|_| state.messages > 0),
            max_age: t.dead_letter_max_age,
            max_count: t.dead_letter_max_count,
        })
    }

    /// Entries in the dead letter queue, of every queue.
    pub async fn total(self) -> Result<u64, OjsError> {
        let info = self
            .own
            .stream
            .get_info()
            .await
            .map_err(backend("reading the dead letter queue"))?;
        Ok(info.state.messages)
    }

    /// How many entries of the dead-letter stream are on `subject`.
    async fn subject_count(self, subject: &str) -> Result<u64, OjsError> {
        let mut info = self
            .own
            .stream
            .info_with_subjects(subject)
            .await
            .map_err(backend("reading the dead letter queue"))?;
        let mut count = 0;
        while let Some(Ok((name, n))) = info.next().await {
            if name == subject {
                count = n as u64;
            }
        }
        Ok(count)
    }
}
