//! PUSH (core §7.1): one job or a batch, all or none. Messages first, then the records
//! (docs/architecture.md §4.1).

use std::collections::BTreeSet;

use async_nats::jetstream::kv;
use chrono::Utc;
use futures::future::join_all;
use tracing::warn;

use super::error::{all_stored, lost_race, nats_failed};
use super::timers::Timer;
use super::Store;
use crate::domain::envelope::too_large;
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::job::{Job, JobRecord};
use crate::domain::lifecycle;
use crate::domain::state::JobState;

impl Store {
    /// PUSH one or more jobs, all or none (core §7.1). Messages first, then the records: a
    /// message without a record is dropped by FETCH, so no accepted job can be left
    /// without a message.
    ///
    /// # Errors
    /// 409 `duplicate` when an id exists or a unique key is held (nothing of the batch
    /// stays), 413 for an envelope
    /// over the server's payload limit, 429 `queue_full` when its timers would pass
    /// `max_pending_timers`, `backend_error` when NATS fails.
    pub async fn enqueue(&self, jobs: Vec<Job>) -> Result<Enqueued, OjsError> {
        let mut records: Vec<JobRecord> = jobs
            .into_iter()
            .map(|job| JobRecord::created(job, None))
            .collect();
        if records.iter().all(|r| r.job.unique.is_none()) {
            return Ok(Enqueued::Created(
                self.create_jobs(records, async { Ok(()) }).await?,
            ));
        }
        // Unique jobs: their keys' locks first (`unique.rs`, architecture §3.18).
        let taken = match self.take_unique_locks(&mut records).await? {
            Ok(taken) => taken,
            Err(existing) => return Ok(Enqueued::Existing(existing)),
        };
        self.failpoint("unique.locked").await;
        match self.create_jobs(records, async { Ok(()) }).await {
            Ok(jobs) => Ok(Enqueued::Created(jobs)),
            Err(err) => {
                let kept: Vec<String> = err
                    .details
                    .get("kept_job_ids")
                    .and_then(|v| serde_json::from_value(v.clone()).ok())
                    .unwrap_or_default();
                self.release_taken(&taken, &kept).await;
                Err(err)
            }
        }
    }

    /// PUSH of records made ready (the jobs of a workflow carry their place in it). `first`
    /// runs once every check has passed, before anything is written (a workflow's own
    /// records), so a refused job leaves nothing behind.
    pub(super) async fn create_jobs(
        &self,
        records: Vec<JobRecord>,
        first: impl std::future::Future<Output = Result<(), OjsError>>,
    ) -> Result<Vec<Job>, OjsError> {
        let now = Utc::now();
        let mut encoded = Vec::with_capacity(records.len());
        let max_job = self.max_job_bytes();
        for (index, rec) in records.iter().enumerate() {
            let bytes = rec.to_bytes();
            if bytes.len() > max_job {
                let mut err = too_large("job", bytes.len(), max_job).with_detail("index", index);
                err.message = format!("The job at index {index}: {}", err.message);
                return Err(err);
            }
            encoded.push(bytes::Bytes::from(bytes));
        }

        // Every job's lane, scheduled ones too: creating a queue's stream when its first
        // scheduled job comes due would make that promotion late.
        let lanes: BTreeSet<(&str, i32)> = records
            .iter()
            .map(|r| (r.job.queue.as_str(), r.job.priority))
            .collect();
        self.inner.queues.admit(lanes.iter().copied())?;
        // The batch's promote and expire timers, within `max_pending_timers` (before any
        // write: a refused PUSH leaves nothing behind).
        let timers = records
            .iter()
            .map(|rec| {
                let promote = rec.dispatch == 0 && lifecycle::due_at(rec).is_some();
                let expire = rec
                    .job
                    .expires_at
                    .as_deref()
                    .and_then(crate::domain::time::parse)
                    .is_some();
                u64::from(promote) + u64::from(expire)
            })
            .sum();
        self.admit_timers(timers).await?;
        first.await?;
        for (queue, priority) in lanes {
            self.inner.queues.ensure(queue, priority, now).await?;
        }
        self.ensure_rate_limits(&records, now).await?;

        // A claim that gets one of these messages before its record exists waits for this
        // PUSH instead of re-reading (architecture §3.12); withdrawn however the PUSH ends.
        let _expected = self.inner.recent.expect(
            records
                .iter()
                .filter(|r| r.dispatch > 0)
                .map(|r| r.job.id.clone())
                .collect(),
        );
        // Queue messages for available jobs, timers for scheduled ones and for expiry: all
        // stored before any record exists.
        let mut acks = Vec::new();
        for rec in &records {
            if rec.dispatch > 0 {
                acks.push(self.send_dispatch(rec).await?);
            } else if let Some(at) = lifecycle::due_at(rec) {
                acks.push(self.send_timer(&Timer::promote(rec, at)).await?);
            }
            if let Some(at) = rec
                .job
                .expires_at
                .as_deref()
                .and_then(crate::domain::time::parse)
            {
                acks.push(self.send_timer(&Timer::expire(rec, at)).await?);
            }
        }
        all_stored(acks, "publishing a job to its queue").await?;
        self.failpoint("enqueue.published").await;

        let creates = records
            .iter()
            .zip(&encoded)
            .map(|(rec, bytes)| self.inner.jobs.create(&rec.job.id, bytes.clone()));
        let mut results: Vec<Result<Created, kv::CreateError>> = join_all(creates)
            .await
            .into_iter()
            .map(|r| r.map(Created::At))
            .collect();
        for ((rec, bytes), result) in records.iter().zip(&encoded).zip(&mut results) {
            if let Err(err) = result {
                if lost_race(err, kv::CreateErrorKind::AlreadyExists) {
                    if let Some(created) = self.created_anyway(rec, bytes).await {
                        *result = Ok(created);
                    }
                }
            }
        }
        if let Some((index, err)) = results
            .iter()
            .enumerate()
            .find_map(|(i, r)| r.as_ref().err().map(|e| (i, e)))
        {
            let error = if lost_race(err, kv::CreateErrorKind::AlreadyExists) {
                let id = &records[index].job.id;
                OjsError::new(
                    ErrorCode::Duplicate,
                    format!("A job with id '{id}' already exists."),
                )
                .with_detail("job_id", id.as_str())
                .with_detail("index", index)
            } else {
                nats_failed("creating a job record", err.to_string())
            };
            self.failpoint("enqueue.rolling_back").await;
            let kept = self.roll_back(&records, &results).await;
            if !kept.is_empty() {
                // The client must not believe nothing was written.
                return Err(OjsError::backend(format!(
                    "The batch was refused ({}), but {} of its jobs could not be removed again \
                     and will run: {}",
                    error.message,
                    kept.len(),
                    kept.join(", ")
                ))
                .with_detail("kept_job_ids", kept));
            }
            return Err(error);
        }
        // Only the batch's last jobs can stay remembered; cloning the others would be wasted.
        let forgotten = records.len().saturating_sub(self.inner.recent.capacity());
        for (rec, result) in records.iter().zip(&results).skip(forgotten) {
            if let (JobState::Available, Ok(Created::At(revision))) = (rec.job.state, result) {
                self.inner
                    .recent
                    .remember(&rec.job.id, rec.clone(), *revision);
            }
        }
        Ok(records.into_iter().map(|r| r.job).collect())
    }

    /// Whether a create that found its key taken was taken by this very create: its first
    /// answer was lost (a stream leader change under a write that landed) and async-nats,
    /// reading the key before giving up, found the record — untouched, or already claimed
    /// through the queue message published before it. A job of another PUSH differs in its
    /// creation time.
    async fn created_anyway(&self, rec: &JobRecord, bytes: &bytes::Bytes) -> Option<Created> {
        let entry = self.inner.jobs.entry(&rec.job.id).await.ok()??;
        if entry.operation != kv::Operation::Put {
            return None;
        }
        if entry.value == bytes {
            return Some(Created::At(entry.revision));
        }
        let stored: JobRecord = serde_json::from_slice(&entry.value).ok()?;
        (stored.job.created_at.timestamp_millis() == rec.job.created_at.timestamp_millis())
            .then_some(Created::Changed)
    }

    /// Removes the records a failed batch did create, each only at the revision its create
    /// wrote: a record that moved on was claimed by a worker, so that job stays and runs.
    /// Their queue messages become orphans that FETCH drops. Returns the ids of the jobs
    /// that stay.
    async fn roll_back(
        &self,
        records: &[JobRecord],
        results: &[Result<Created, kv::CreateError>],
    ) -> Vec<String> {
        let mut kept = Vec::new();
        for (rec, result) in records.iter().zip(results) {
            let id = &rec.job.id;
            let revision = match result {
                Ok(Created::At(revision)) => revision,
                Ok(Created::Changed) => {
                    kept.push(id.clone());
                    continue;
                }
                Err(_) => continue,
            };
            let mut removed = false;
            for _ in 0..3 {
                let err = match self.remove_record(rec, *revision).await {
                    Ok(()) => {
                        removed = true;
                        break;
                    }
                    Err(err) => err,
                };
                warn!(job_id = %id, error = %err, "could not roll back a job of a refused batch");
                match self.inner.jobs.entry(id).await {
                    // An earlier try removed it; only its answer was lost.
                    Ok(Some(entry)) if entry.operation != kv::Operation::Put => {
                        removed = true;
                        break;
                    }
                    // Written since the create: a worker claimed the job, it stays.
                    Ok(Some(entry)) if entry.revision != *revision => break,
                    _ => {}
                }
            }
            if !removed {
                kept.push(id.clone());
            }
        }
        kept
    }
}

/// What a PUSH came to.
#[derive(Debug)]
pub enum Enqueued {
    /// The jobs, as created.
    Created(Vec<Job>),
    /// A unique job under `ignore` met the job holding its key: that job, nothing written.
    Existing(Box<Job>),
}

/// A record this PUSH created: still at the revision its create wrote, or already changed
/// (claimed) when a lost answer made the create look refused (`created_anyway`).
enum Created {
    At(u64),
    Changed,
}
