//! PUSH (core §7.1): one job or a batch, all or none, also across a crash
//! (docs/architecture.md §4 PUSH).

use std::collections::BTreeSet;
use std::time::Duration;

use async_nats::jetstream::kv;
use chrono::{DateTime, Utc};
use futures::future::join_all;
use tracing::warn;
use uuid::Uuid;

use super::batches::AT_ONCE;
use super::records::{found, Lookup};
use super::Jobs;
use crate::domain::envelope::too_large;
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::job::{Job, JobRecord};
use crate::domain::lifecycle;
use crate::domain::state::JobState;
use crate::store::cas::{self, Replica};
use crate::store::deadline::answered;
use crate::store::error::{lost_race, nats_failed};
use crate::store::timers::Timer;

impl Jobs {
    /// PUSH one or more jobs, all or none (core §7.1): no accepted job is ever left
    /// without its message, no job of a refused PUSH is ever handed out.
    ///
    /// # Errors
    /// 409 `duplicate` when an id exists or a unique key is held (nothing of the batch
    /// stays), 413 for an envelope
    /// over the server's payload limit, 429 `queue_full` when its timers would pass
    /// `max_pending_timers`, `backend_error` when NATS fails.
    pub async fn enqueue(&self, jobs: Vec<Job>, block: Duration) -> Result<Enqueued, OjsError> {
        let mut records: Vec<JobRecord> = jobs
            .into_iter()
            .map(|job| JobRecord::created(job, None))
            .collect();
        if records.iter().all(|r| r.job.unique.is_none()) {
            return Ok(Enqueued::Created(
                self.create_jobs(records, async { Ok(()) }, block).await?,
            ));
        }
        // Unique jobs: their keys' locks first (`unique.rs`, architecture §3.18).
        let taken = match self.take_unique_locks(&mut records).await? {
            Ok(taken) => taken,
            Err(existing) => return Ok(Enqueued::Existing(existing)),
        };
        self.conn.failpoint("unique.locked").await;
        match self.create_jobs(records, async { Ok(()) }, block).await {
            Ok(jobs) => Ok(Enqueued::Created(jobs)),
            Err(err) => {
                self.release_taken(&taken).await;
                Err(err)
            }
        }
    }

    /// PUSH of records made ready (the jobs of a workflow carry their place in it). `first`
    /// runs once every check has passed, before anything is written (a workflow's own
    /// records), so a refused job leaves nothing behind.
    ///
    /// One job: its message first, then its record (the commit point). A batch: its
    /// records under an open batch mark, the commit of the mark, then the messages, so a
    /// batch cut short by a crash is undone or finished whole (architecture §4 PUSH).
    pub(in crate::store) async fn create_jobs(
        &self,
        mut records: Vec<JobRecord>,
        first: impl std::future::Future<Output = Result<(), OjsError>>,
        block: Duration,
    ) -> Result<Vec<Job>, OjsError> {
        self.schemas.check(&records).await?;
        let now = Utc::now();
        let batch = (records.len() > 1).then(|| Uuid::now_v7().to_string());
        for rec in &mut records {
            rec.batch.clone_from(&batch);
        }
        let mut encoded = Vec::with_capacity(records.len());
        let max_job = self.conn.max_job_bytes();
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
        self.queues
            .own
            .registry
            .admit(lanes(&records).iter().copied())?;
        // The batch's promote and expire timers, within `max_pending_timers` (before any
        // write: a refused PUSH leaves nothing behind).
        let timers = records
            .iter()
            .map(|rec| {
                let promote = rec.dispatch == 0 && lifecycle::due_at(rec).is_some();
                u64::from(promote) + u64::from(expires_at(rec).is_some())
            })
            .sum();
        self.timers.admit_timers(timers).await?;
        // Places in bounded queues, the last check and the first write (architecture §3.27).
        let tokens = self.take_depth_tokens(&mut records, block).await?;
        for (rec, bytes) in records.iter().zip(encoded.iter_mut()) {
            if rec.depth_token.is_some() {
                *bytes = bytes::Bytes::from(rec.to_bytes());
            }
        }
        let written = self.write_jobs(records, encoded, first, now).await;
        if written.is_err() && !tokens.is_empty() {
            self.give_back_unheld(&tokens).await;
        }
        written
    }

    /// `create_jobs` once every check has passed and the bounded queues' places are taken.
    async fn write_jobs(
        &self,
        records: Vec<JobRecord>,
        encoded: Vec<bytes::Bytes>,
        first: impl std::future::Future<Output = Result<(), OjsError>>,
        now: DateTime<Utc>,
    ) -> Result<Vec<Job>, OjsError> {
        let batch = records.first().and_then(|r| r.batch.clone());
        first.await?;
        for (queue, priority) in lanes(&records) {
            self.queues
                .own
                .registry
                .ensure(queue, priority, now)
                .await?;
        }
        self.queues.ensure_rate_limits(&records, now).await?;

        let revisions = match &batch {
            None => {
                // A claim that gets this message before its record exists waits for this
                // PUSH instead of re-reading (architecture §3.12); withdrawn however the
                // PUSH ends.
                let _expected = self.own.recent.expect(
                    records
                        .iter()
                        .filter(|r| r.dispatch > 0)
                        .map(|r| r.job.id.clone())
                        .collect(),
                );
                self.publish_jobs(&records).await?;
                self.conn.failpoint("enqueue.published").await;
                self.create_records(&records, &encoded, None).await?
            }
            Some(id) => {
                let open = self.open_batch(id, &records).await?;
                let revisions = self.create_records(&records, &encoded, Some(id)).await?;
                self.conn.failpoint("batch.created").await;
                if let Err(err) = self.commit_batch(&open).await {
                    self.roll_back(records.iter().zip(revisions.iter().copied()))
                        .await;
                    return Err(err);
                }
                self.conn.failpoint("batch.committed").await;
                self.publish_jobs(&records).await?;
                self.close_batch(id);
                revisions
            }
        };
        // Only the batch's last jobs can stay remembered; cloning the others would be wasted.
        let forgotten = records.len().saturating_sub(self.own.recent.capacity());
        for (rec, revision) in records.iter().zip(&revisions).skip(forgotten) {
            if let (JobState::Available, Some(revision)) = (rec.job.state, revision) {
                self.own
                    .recent
                    .remember(&rec.job.id, rec.clone(), *revision);
            }
        }
        Ok(records.into_iter().map(|r| r.job).collect())
    }

    /// Publishes what makes each job fetchable or due: the queue message of an available
    /// job, the promote timer of a waiting one, the expire timer of one with `expires_at`;
    /// all acknowledged.
    pub(in crate::store) async fn publish_jobs(
        &self,
        records: &[JobRecord],
    ) -> Result<(), OjsError> {
        let mut sent = Vec::new();
        for rec in records {
            if rec.dispatch > 0 {
                sent.push(self.send_dispatch(rec).await?);
            } else if let Some(at) = lifecycle::due_at(rec) {
                sent.push(self.timers.send_timer(&Timer::promote(rec, at)).await?);
            }
            if let Some(at) = expires_at(rec) {
                sent.push(self.timers.send_timer(&Timer::expire(rec, at)).await?);
            }
        }
        self.conn.all_stored(sent).await
    }

    /// Creates every record, concurrently: the revision each create wrote (`None` for a
    /// record a worker already changed, see `holder`). A batch's create that finds
    /// a record left over from another batch that never committed takes its id over. If
    /// any create fails, the batch is aborted and what was created removed again.
    async fn create_records(
        &self,
        records: &[JobRecord],
        encoded: &[bytes::Bytes],
        batch: Option<&str>,
    ) -> Result<Vec<Option<u64>>, OjsError> {
        let creates = records
            .iter()
            .zip(encoded)
            .map(|(rec, bytes)| self.create_record(&rec.job.id, bytes));
        let mut results: Vec<Creation> = join_all(creates).await;
        let taken: Vec<usize> = (0..results.len())
            .filter(|&i| matches!(&results[i], Err(CreateFailure::Taken)))
            .collect();
        for some in taken.chunks(AT_ONCE) {
            let again = some
                .iter()
                .map(|&i| self.create_again(&records[i], &encoded[i], batch.is_some()));
            for (&i, outcome) in some.iter().zip(join_all(again).await) {
                if let Some(creation) = outcome? {
                    results[i] = creation;
                }
            }
        }
        let Some(index) = results.iter().position(Result::is_err) else {
            return Ok(results.into_iter().map(|r| r.ok().flatten()).collect());
        };
        let created: Vec<Option<u64>> = results
            .iter()
            .map(|r| r.as_ref().ok().copied().flatten())
            .collect();
        let error = match results.swap_remove(index) {
            Err(CreateFailure::Failed(err)) => err,
            _ => {
                let id = &records[index].job.id;
                OjsError::new(
                    ErrorCode::Duplicate,
                    format!("A job with id '{id}' already exists."),
                )
                .with_detail("job_id", id.as_str())
                .with_detail("index", index)
            }
        };
        if let Some(id) = batch {
            if let Err(err) = self.abort_batch(id).await {
                warn!(batch_id = id, error = %err, "could not abort a refused batch; its timer will");
            }
            self.conn.failpoint("enqueue.rolling_back").await;
            self.roll_back(records.iter().zip(created)).await;
        }
        Err(error)
    }

    /// A create that found its key taken, looked at again at the stream leader: its own
    /// write after all (`holder`), a key that is free after all (created again), or — for
    /// a batch's job — a record left over from another batch that never committed, taken
    /// over and created again (`take_over`). `None`: taken.
    ///
    /// "Free" contradicts the create, whose refusal came from a replica that held a
    /// record: the record was removed meanwhile, or the leader's word is stale. A stream
    /// leader cut off from its peers keeps answering as leader from what it had — for up
    /// to 10 s after the cut, and after a heal until it hears of its successor — so the
    /// gateways connected to its node read the past (`cluster::a_gateway_cut_off…` once
    /// answered 409 `duplicate` for its own job). The create is made again after a pause
    /// that grows round by round; a key still both free and taken after the last is 503.
    async fn create_again(
        &self,
        rec: &JobRecord,
        bytes: &bytes::Bytes,
        in_batch: bool,
    ) -> Result<Option<Creation>, OjsError> {
        for round in 0..CREATE_AGAIN_ROUNDS {
            self.conn.failpoint("enqueue.found_taken").await;
            match self.holder(rec, bytes).await? {
                Holder::This(revision) => return Ok(Some(Ok(revision))),
                Holder::Another(found, revision) => {
                    if !in_batch || !self.take_over(&found, revision).await? {
                        return Ok(None);
                    }
                }
                Holder::Nobody => tokio::time::sleep(Duration::from_millis(50 << round)).await,
            }
            match self.create_record(&rec.job.id, bytes).await {
                Err(CreateFailure::Taken) => {}
                creation => return Ok(Some(creation)),
            }
        }
        Err(OjsError::new(
            ErrorCode::BackendUnavailable,
            format!(
                "NATS kept finding the job id '{}' taken while its stream leader found it free (a partition healing); retry shortly.",
                rec.job.id
            ),
        ))
    }

    /// Creates a record, again while NATS does not answer (`deadline.rs`). A create that
    /// landed with its answer lost then finds its key taken: `create_again` tells.
    async fn create_record(&self, id: &str, bytes: &bytes::Bytes) -> Creation {
        let doing = "creating a job record";
        let said = answered(doing, || self.own.kv.create(id, bytes.clone()))
            .await
            .map_err(CreateFailure::Failed)?
            .said;
        match said {
            Ok(revision) => Ok(Some(revision)),
            Err(err) if lost_race(&err, kv::CreateErrorKind::AlreadyExists) => {
                Err(CreateFailure::Taken)
            }
            Err(err) => Err(CreateFailure::Failed(nats_failed(doing, err))),
        }
    }

    /// Who holds the key of a create that found it taken, read at the stream leader. This
    /// very create when its first answer was lost (a stream leader change under a write
    /// that landed) and async-nats, reading the key before giving up, found the record —
    /// untouched (its revision), or already claimed through the queue message published
    /// before it (`None`). A job of another PUSH differs in its creation time.
    async fn holder(&self, rec: &JobRecord, bytes: &bytes::Bytes) -> Result<Holder, OjsError> {
        // At the leader: a replica catching up (a node rejoining after a partition) may
        // not have the record yet.
        let id = &rec.job.id;
        let Some(last) = cas::last(&self.own.kv, id, Replica::Leader, "reading a job").await?
        else {
            return Ok(Holder::Nobody);
        };
        if last.value.as_ref() == Some(bytes) {
            return Ok(Holder::This(Some(last.revision)));
        }
        Ok(match found(id, last.value.as_deref(), last.revision)? {
            Lookup::Found(stored, _)
                if stored.job.created_at.timestamp_millis()
                    == rec.job.created_at.timestamp_millis() =>
            {
                Holder::This(None)
            }
            Lookup::Found(stored, revision) => Holder::Another(stored, revision),
            Lookup::Removed | Lookup::Missing => Holder::Nobody,
        })
    }

    /// Removes the records a refused batch created, each at the revision its create wrote.
    /// No worker can have had them (the batch published no message); one not removed is
    /// removed by the batch's timer.
    async fn roll_back<'a>(&self, created: impl Iterator<Item = (&'a JobRecord, Option<u64>)>) {
        let created: Vec<(&JobRecord, u64)> = created
            .filter_map(|(rec, revision)| Some((rec, revision?)))
            .collect();
        if let Err(err) = self.remove_untouched(&created).await {
            warn!(error = %err, "could not roll back a refused batch; its timer will");
        }
    }
}

/// Every job's lane: its queue and priority.
fn lanes(records: &[JobRecord]) -> BTreeSet<(&str, i32)> {
    records
        .iter()
        .map(|r| (r.job.queue.as_str(), r.job.priority))
        .collect()
}

/// A record's create: the revision it wrote (`None`: already changed by a worker, see
/// `holder`), or why it failed.
type Creation = Result<Option<u64>, CreateFailure>;

/// How many times `create_again` looks at a taken key and creates again.
const CREATE_AGAIN_ROUNDS: u32 = 6;

/// Who holds a job id whose create found it taken (`Jobs::holder`).
enum Holder {
    /// This create: the revision it wrote, `None` once a worker changed the record.
    This(Option<u64>),
    /// Another job's record, at its revision.
    Another(Box<JobRecord>, u64),
    /// No record: removed meanwhile, or a stale leader's word.
    Nobody,
}

/// Why a record's create failed.
enum CreateFailure {
    /// The id is taken (and not by this create).
    Taken,
    Failed(OjsError),
}

/// When a job's `expires_at` passes.
fn expires_at(rec: &JobRecord) -> Option<chrono::DateTime<Utc>> {
    rec.job
        .expires_at
        .as_deref()
        .and_then(crate::domain::time::parse)
}

/// What a PUSH came to.
#[derive(Debug)]
pub enum Enqueued {
    /// The jobs, as created.
    Created(Vec<Job>),
    /// A unique job under `ignore` met the job holding its key: that job, nothing written.
    Existing(Box<Job>),
}
