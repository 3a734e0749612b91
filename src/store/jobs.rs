//! PUSH, FETCH, ACK, FAIL, CANCEL, ACTIVATE and INFO over JetStream. The order of NATS calls
//! in each operation, and what a crash between two of them leaves, is written down in
//! docs/architecture.md ("Operations"); the code follows it step by step.

use std::collections::BTreeSet;
use std::time::Duration;

use async_nats::jetstream::{context::PublishAckFuture, kv, message::PublishMessage, AckKind};
use chrono::{DateTime, Utc};
use futures::future::join_all;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::error::{all_stored, backend};
use super::puller::Puller;
use super::timers::Timer;
use super::Store;
use crate::domain::claim::{self, ClaimStep, Claimant, Delivered};
use crate::domain::envelope::too_large;
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::job::{Job, JobRecord, Transition};
use crate::domain::lifecycle::{self, Delivery, Failure};
use crate::domain::retry::OnExhaustion;
use crate::domain::state::JobState;

/// A queue message whose job record does not show up within this time came from an enqueue
/// that died between its two writes (or was rolled back); it is dropped.
const ORPHAN_GRACE: Duration = Duration::from_secs(30);
/// Compare-and-set attempts before an operation gives up under contention.
pub(super) const MAX_CAS_ATTEMPTS: usize = 16;
/// Longest a claim waits for the record a PUSH through this gateway is still creating.
const RECORD_ON_ITS_WAY: Duration = Duration::from_secs(1);

/// What the jobs bucket holds for an id.
enum Lookup {
    Found(Box<JobRecord>, u64),
    /// Deleted or purged (a rolled-back batch): its queue messages are spent.
    Removed,
    Missing,
}

/// The body of a queue message: which job, and which dispatch of it.
#[derive(Debug, Serialize, Deserialize)]
struct Dispatch {
    id: String,
    dispatch: u64,
}

/// A FETCH (core §7.2).
#[derive(Debug, Clone)]
pub struct FetchRequest {
    /// Queues in the order to try them.
    pub queues: Vec<String>,
    pub count: usize,
    pub worker_id: Option<String>,
    /// Reservation for these jobs; else the job's own, else the server default.
    pub visibility: Option<Duration>,
    /// How long an empty FETCH may wait for a job to arrive (long polling).
    pub wait: Option<Duration>,
}

/// What a FETCH has claimed so far, and the first failure.
#[derive(Default)]
struct Claims {
    jobs: Vec<Job>,
    failure: Option<OjsError>,
}

impl Claims {
    fn is_empty(&self) -> bool {
        self.jobs.is_empty() && self.failure.is_none()
    }
}

/// Parks one waiter on every lane and returns the first message delivered, with any that
/// arrived at the same moment, tagged with their lane; empty at `until`, or when `stop`
/// completes first.
async fn wait_for_delivery(
    lanes: &[(String, i32, Puller)],
    until: Instant,
    stop: impl std::future::Future<Output = ()>,
) -> Vec<(usize, async_nats::jetstream::Message)> {
    let (sink, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for (lane, (_, _, puller)) in lanes.iter().enumerate() {
        puller.wait(lane, until, sink.clone()).await;
    }
    drop(sink);
    let first = tokio::select! {
        first = rx.recv(), if !lanes.is_empty() => first,
        () = tokio::time::sleep_until(until) => None,
        () = stop => None,
    };
    // Withdraw from every lane, then take what was sent before that: nothing is dropped.
    rx.close();
    let mut got: Vec<_> = first.into_iter().collect();
    while let Ok(more) = rx.try_recv() {
        got.push(more);
    }
    got
}

/// Adds a claim's outcome to `got`; a message whose claim failed is released for another
/// fetch, and the failure reported only if nothing was claimed.
async fn record_claim(
    msg: &async_nats::jetstream::Message,
    claim: Result<Option<Job>, OjsError>,
    got: &mut Claims,
) {
    match claim {
        Ok(Some(job)) => got.jobs.push(job),
        Ok(None) => {}
        Err(err) => {
            settle(msg, AckKind::Nak(Some(Duration::from_secs(1)))).await;
            got.failure.get_or_insert(err);
        }
    }
}

/// The record before and after a settling operation (ACK, FAIL, CANCEL).
#[derive(Debug, Clone)]
pub struct Settled {
    pub before: JobRecord,
    pub after: JobRecord,
}

impl Store {
    /// PUSH one or more jobs, all or none (core §7.1). Messages first, then the records: a
    /// message without a record is dropped by FETCH, so no accepted job can be left
    /// without a message.
    ///
    /// # Errors
    /// 409 `duplicate` when an id exists (nothing of the batch stays), 413 for an envelope
    /// over the server's payload limit, 429 `queue_full` when its timers would pass
    /// `max_pending_timers`, `backend_error` when NATS fails.
    pub async fn enqueue(&self, jobs: Vec<Job>) -> Result<Vec<Job>, OjsError> {
        let now = Utc::now();
        let records: Vec<JobRecord> = jobs
            .into_iter()
            .map(|job| JobRecord {
                dispatch: u64::from(job.state == JobState::Available),
                holder: None,
                transition: Transition::Created,
                dead_letter: None,
                job,
            })
            .collect();
        let mut encoded = Vec::with_capacity(records.len());
        let max_job = self.max_job_bytes();
        for (index, rec) in records.iter().enumerate() {
            let bytes = rec.to_bytes();
            if bytes.len() > max_job {
                let mut err = too_large("job", bytes.len(), max_job).with_detail("index", index);
                err.message = format!("The job at index {index}: {}", err.message);
                return Err(err);
            }
            encoded.push(bytes);
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
        for (queue, priority) in lanes {
            self.inner.queues.ensure(queue, priority, now).await?;
        }

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

        let creates = records
            .iter()
            .zip(encoded)
            .map(|(rec, bytes)| self.inner.jobs.create(&rec.job.id, bytes.into()));
        let results = join_all(creates).await;
        if let Some((index, err)) = results
            .iter()
            .enumerate()
            .find_map(|(i, r)| r.as_ref().err().map(|e| (i, e)))
        {
            let error = if err.kind() == kv::CreateErrorKind::AlreadyExists {
                let id = &records[index].job.id;
                OjsError::new(
                    ErrorCode::Duplicate,
                    format!("A job with id '{id}' already exists."),
                )
                .with_detail("job_id", id.as_str())
                .with_detail("index", index)
            } else {
                OjsError::backend(format!("NATS failed while creating a job record: {err}"))
            };
            let stranded = self.roll_back(&records, &results).await;
            if !stranded.is_empty() {
                // The client must not believe nothing was written.
                return Err(OjsError::backend(format!(
                    "The batch was refused ({}), but {} of its jobs could not be removed again: {}",
                    error.message,
                    stranded.len(),
                    stranded.join(", ")
                )));
            }
            return Err(error);
        }
        // Only the batch's last jobs can stay remembered; cloning the others would be wasted.
        let forgotten = records.len().saturating_sub(self.inner.recent.capacity());
        for (rec, result) in records.iter().zip(&results).skip(forgotten) {
            if let (JobState::Available, Ok(revision)) = (rec.job.state, result) {
                self.inner
                    .recent
                    .remember(&rec.job.id, rec.clone(), *revision);
            }
        }
        Ok(records.into_iter().map(|r| r.job).collect())
    }

    /// Removes the records a failed batch did create; their queue messages become orphans
    /// that FETCH drops. Returns the ids that could not be removed.
    async fn roll_back(
        &self,
        records: &[JobRecord],
        results: &[Result<u64, kv::CreateError>],
    ) -> Vec<String> {
        let mut stranded = Vec::new();
        for (rec, result) in records.iter().zip(results) {
            if result.is_ok() {
                let mut removed = false;
                for _ in 0..3 {
                    match self.inner.jobs.purge(&rec.job.id).await {
                        Ok(()) => {
                            removed = true;
                            break;
                        }
                        Err(err) => {
                            warn!(job_id = %rec.job.id, error = %err, "could not roll back a job of a refused batch")
                        }
                    }
                }
                if !removed {
                    stranded.push(rec.job.id.clone());
                }
            }
        }
        stranded
    }

    /// Publishes the queue message of the record's current dispatch.
    async fn send_dispatch(&self, rec: &JobRecord) -> Result<PublishAckFuture, OjsError> {
        let t = &self.inner.topology;
        let body = serde_json::to_vec(&Dispatch {
            id: rec.job.id.clone(),
            dispatch: rec.dispatch,
        })
        .expect("dispatch serializes");
        self.inner
            .js
            .send_publish(
                t.queue_subject(&rec.job.queue, rec.job.priority),
                // No Nats-Msg-Id: a repeated publish must never be dropped (a client's retry
                // after an orphaned first attempt needs its message); FETCH drops the spare.
                PublishMessage::build().payload(body.into()),
            )
            .await
            .map_err(backend("publishing a job to its queue"))
    }

    /// INFO (core §7.7).
    ///
    /// # Errors
    /// 404 for an unknown id.
    pub async fn info(&self, id: &str) -> Result<Job, OjsError> {
        match self.read(id).await? {
            Some((rec, _)) => Ok(rec.job),
            None => Err(OjsError::not_found("job", id)),
        }
    }

    /// FETCH (core §7.2): queues in the given order, priorities highest first, FIFO within a
    /// priority; each job claimed by one compare-and-set on its record. With `wait`, an
    /// empty answer waits up to that long for the first job to arrive.
    ///
    /// # Errors
    /// `backend_error` when NATS fails before anything was claimed.
    pub async fn fetch(&self, req: &FetchRequest) -> Result<Vec<Job>, OjsError> {
        let until = req.wait.map(|w| Instant::now() + w);
        let stop_waiting = &self.inner.stop_waiting;
        let mut got = Claims::default();
        loop {
            // Armed before looking, so a queue (or priority) created meanwhile is not missed.
            let registry_changed = self.inner.queues.changed();
            tokio::pin!(registry_changed);
            registry_changed.as_mut().enable();
            let lanes = self.fetch_now(req, &mut got).await;
            let Some(until) = until
                .filter(|u| got.is_empty() && *u > Instant::now() && !stop_waiting.is_cancelled())
            else {
                break;
            };
            let stop = async {
                tokio::select! {
                    () = registry_changed => {}
                    () = stop_waiting.cancelled() => {}
                }
            };
            let delivered = wait_for_delivery(&lanes, until, stop).await;
            for (lane, msg) in delivered {
                let (queue, priority, _) = &lanes[lane];
                if got.jobs.len() < req.count {
                    let claim = self.claim(&msg, queue, *priority, req).await;
                    record_claim(&msg, claim, &mut got).await;
                } else {
                    settle(&msg, AckKind::Nak(None)).await;
                }
            }
        }
        match got.failure {
            Some(err) if got.jobs.is_empty() => Err(err),
            _ => Ok(got.jobs),
        }
    }

    /// Ends every long-polling FETCH now, with what it holds, and lets no later one wait:
    /// a shutting-down gateway answers its workers at once (architecture §3.3).
    pub fn stop_waiting(&self) {
        self.inner.stop_waiting.cancel();
    }

    /// Claims what the named queues hold now, up to the request's count; returns every
    /// queue lane it looked at. A failure stops it and is kept in `got`, so jobs already
    /// claimed are still handed out.
    async fn fetch_now(&self, req: &FetchRequest, got: &mut Claims) -> Vec<(String, i32, Puller)> {
        let mut lanes = Vec::new();
        for queue in &req.queues {
            let meta = match self.inner.queues.lookup(queue).await {
                Ok(Some(meta)) if !meta.paused => meta,
                Ok(_) => continue,
                Err(err) => {
                    got.failure.get_or_insert(err);
                    return lanes;
                }
            };
            for priority in meta.priorities {
                let puller = match self.inner.queues.puller(queue, priority).await {
                    Ok(puller) => puller,
                    Err(err) => {
                        got.failure.get_or_insert(err);
                        return lanes;
                    }
                };
                loop {
                    let need = req.count.saturating_sub(got.jobs.len());
                    if need == 0 || got.failure.is_some() {
                        return lanes;
                    }
                    let delivered = puller.pull(need).await;
                    if delivered.is_empty() {
                        break;
                    }
                    // Each message is its own job: claimed side by side, so the reads and
                    // writes of a FETCH of many go to NATS together; kept in delivery order.
                    let claims = delivered
                        .iter()
                        .map(|msg| self.claim(msg, queue, priority, req));
                    for (msg, claim) in delivered.iter().zip(join_all(claims).await) {
                        record_claim(msg, claim, got).await;
                    }
                }
                lanes.push((queue.clone(), priority, puller));
            }
        }
        lanes
    }

    /// Claims the job a delivered queue message points to, or settles the message when it
    /// is stale. `None` when nothing was claimed.
    async fn claim(
        &self,
        msg: &async_nats::jetstream::Message,
        queue: &str,
        priority: i32,
        req: &FetchRequest,
    ) -> Result<Option<Job>, OjsError> {
        let Ok(d) = serde_json::from_slice::<Dispatch>(&msg.payload) else {
            warn!(subject = %msg.subject, "dropping an unreadable queue message");
            settle(msg, AckKind::Term).await;
            return Ok(None);
        };
        let (Some(reply), Ok(info)) = (msg.reply.as_ref(), msg.info()) else {
            return Ok(None);
        };
        let delivery = Delivery {
            ack_subject: reply.to_string(),
            sequence: info.stream_sequence,
        };
        let age = Utc::now().timestamp_millis() as i128
            - info.published.unix_timestamp_nanos() / 1_000_000;
        let delivered = Delivered {
            dispatch: d.dispatch,
            queue,
            priority,
            delivery,
            orphan_age_passed: age > ORPHAN_GRACE.as_millis() as i128,
        };

        for attempt in 0..MAX_CAS_ATTEMPTS {
            // The first try may use the record this gateway wrote last, or is writing now
            // (`recent.rs`).
            let guess = if attempt == 0 {
                self.inner
                    .recent
                    .take_when_written(&d.id, RECORD_ON_ITS_WAY)
                    .await
            } else {
                None
            };
            let guessed = guess.is_some();
            let (rec, revision) = match guess {
                Some(found) => found,
                None => match self.lookup(&d.id).await? {
                    Lookup::Found(rec, revision) => (*rec, revision),
                    Lookup::Removed => {
                        settle(msg, AckKind::Term).await;
                        return Ok(None);
                    }
                    Lookup::Missing => {
                        // The enqueue that published this message may still be creating the
                        // record.
                        if look_again(attempt, &delivered).await {
                            continue;
                        }
                        let kind = if delivered.orphan_age_passed {
                            AckKind::Term
                        } else {
                            AckKind::Nak(Some(Duration::from_secs(1)))
                        };
                        settle(msg, kind).await;
                        return Ok(None);
                    }
                },
            };
            let claimant = Claimant {
                worker_id: req.worker_id.as_deref(),
                visibility: req.visibility,
                default_visibility: self.inner.visibility_timeout,
            };
            let step = claim::decide(&rec, &delivered, claimant, Utc::now());
            let mut next = match step {
                Ok(ClaimStep::Write(next)) => *next,
                // A remembered record only ever decides a write; anything else is decided on
                // a fresh read.
                _ if guessed => continue,
                Ok(ClaimStep::Behind) => {
                    if look_again(attempt, &delivered).await {
                        continue;
                    }
                    settle(msg, AckKind::Nak(Some(Duration::from_millis(200)))).await;
                    return Ok(None);
                }
                Ok(ClaimStep::Spent) => {
                    settle(msg, AckKind::Ack).await;
                    return Ok(None);
                }
                Ok(ClaimStep::Foreign) => {
                    settle(msg, AckKind::Term).await;
                    return Ok(None);
                }
                Err(err) => return Err(err),
            };
            self.prepare(&rec, &mut next).await?;
            // No deadline timer here: the leader watches the job from this write (§3.6).
            let Some(written) = self.write(&d.id, &next, revision).await? else {
                continue;
            };
            if next.job.state == JobState::Active {
                self.inner.recent.remember(&d.id, next.clone(), written);
            }
            return Ok(match next.job.state {
                JobState::Active if next.transition == Transition::Redelivered => {
                    settle(msg, AckKind::Progress).await;
                    None
                }
                JobState::Active => Some(next.job),
                _ => {
                    settle(msg, AckKind::Ack).await;
                    None
                }
            });
        }
        debug!(job_id = %d.id, "claim lost every compare-and-set; leaving the message for later");
        settle(msg, AckKind::Nak(Some(Duration::from_millis(100)))).await;
        Ok(None)
    }

    /// ACK (core §7.3).
    ///
    /// # Errors
    /// 404 unknown job; 409 when it is not active or held by another worker.
    pub async fn ack(
        &self,
        id: &str,
        worker_id: Option<&str>,
        result: Option<Value>,
    ) -> Result<Settled, OjsError> {
        let settled = self
            .transition(id, |rec, now| {
                lifecycle::complete(rec, now, worker_id, result.clone()).map(Some)
            })
            .await?;
        self.release(&settled).await;
        Ok(settled)
    }

    /// FAIL (core §7.4).
    ///
    /// # Errors
    /// 404 unknown job; 409 when it is not active or held by another worker.
    pub async fn fail(
        &self,
        id: &str,
        worker_id: Option<&str>,
        failure: &Failure,
        requeue: bool,
    ) -> Result<Settled, OjsError> {
        let jitter = rand::random_range(0.5..1.5);
        let settled = self
            .transition(id, |rec, now| {
                lifecycle::fail(rec, now, worker_id, failure, requeue, jitter).map(Some)
            })
            .await?;
        self.release(&settled).await;
        Ok(settled)
    }

    /// CANCEL (core §7.6). Cancelling a cancelled job changes nothing.
    ///
    /// # Errors
    /// 404 unknown job; 409 for a completed or discarded job.
    pub async fn cancel(&self, id: &str) -> Result<Settled, OjsError> {
        let settled = self.transition(id, lifecycle::cancel).await?;
        self.release(&settled).await;
        Ok(settled)
    }

    /// ACTIVATE (HTTP binding §9.5): a pending job becomes available.
    ///
    /// # Errors
    /// 404 unknown job; 409 when it is not pending.
    pub async fn activate(&self, id: &str) -> Result<Job, OjsError> {
        let settled = self
            .transition(id, |rec, now| lifecycle::activate(rec, now).map(Some))
            .await?;
        Ok(settled.after.job)
    }

    /// Reads, decides with `decide`, stores what the decision needs first (`prepare`),
    /// writes with a revision check, and retries the whole decision when another writer came
    /// first.
    pub(super) async fn transition<F>(&self, id: &str, decide: F) -> Result<Settled, OjsError>
    where
        F: Fn(&JobRecord, DateTime<Utc>) -> Result<Option<JobRecord>, OjsError>,
    {
        for attempt in 0..MAX_CAS_ATTEMPTS {
            // The first try may use the record this gateway wrote last (`recent.rs`).
            let guess = (attempt == 0).then(|| self.inner.recent.take(id)).flatten();
            let guessed = guess.is_some();
            let (before, revision) = match guess {
                Some(found) => found,
                None => self
                    .read(id)
                    .await?
                    .ok_or_else(|| OjsError::not_found("job", id))?,
            };
            let mut after = match decide(&before, Utc::now()) {
                Ok(Some(after)) => after,
                // A remembered record only ever decides a write; a refusal or "nothing to
                // do" is decided on a fresh read.
                _ if guessed => continue,
                Ok(None) => {
                    return Ok(Settled {
                        after: before.clone(),
                        before,
                    })
                }
                Err(err) => return Err(err),
            };
            self.prepare(&before, &mut after).await?;
            if let Some(written) = self.write(id, &after, revision).await? {
                if after.job.state == JobState::Active {
                    self.inner.recent.remember(id, after.clone(), written);
                }
                return Ok(Settled { before, after });
            }
        }
        Err(changing_too_fast(id))
    }

    /// What must be stored before a transition is written, so that no crash between the two
    /// can strand the job: the queue message of a new dispatch, the timer of a retry wait,
    /// the dead-letter entry of a discard into the dead letter queue (whose sequence the
    /// record then names).
    async fn prepare(&self, before: &JobRecord, after: &mut JobRecord) -> Result<(), OjsError> {
        if after.job.state == JobState::Available && after.dispatch > before.dispatch {
            self.inner
                .queues
                .ensure(&after.job.queue, after.job.priority, Utc::now())
                .await?;
            self.send_dispatch(after)
                .await?
                .await
                .map_err(backend("publishing a job to its queue"))?;
        }
        if let (JobState::Retryable, Some(due)) = (after.job.state, lifecycle::due_at(after)) {
            if before.job.state != JobState::Retryable {
                self.send_timer(&Timer::promote(after, due))
                    .await?
                    .await
                    .map_err(backend("publishing a timer"))?;
            }
        }
        let dead_lettered = after.job.state == JobState::Discarded
            && before.job.state != JobState::Discarded
            && after.transition == Transition::Failed
            && after.job.retry.on_exhaustion == OnExhaustion::DeadLetter;
        if dead_lettered {
            after.dead_letter = Some(self.add_dead_letter(after).await?);
        }
        Ok(())
    }

    /// After a job leaves `active`, its queue message is acknowledged through the subject
    /// stored at claim time — from whichever replica runs this. Best effort: a lost ack
    /// only means JetStream redelivers the message later, and FETCH drops it as spent.
    pub(super) async fn release(&self, settled: &Settled) {
        let Some(holder) = &settled.before.holder else {
            return;
        };
        if settled.after.holder.is_some() {
            return;
        }
        if let Err(err) = self
            .inner
            .client
            .publish(holder.ack_subject.clone(), "+ACK".into())
            .await
        {
            warn!(job_id = %settled.after.job.id, error = %err, "could not acknowledge a settled job's message");
        }
    }

    /// The record and its revision; `None` for unknown or removed ids.
    pub(super) async fn read(&self, id: &str) -> Result<Option<(JobRecord, u64)>, OjsError> {
        Ok(match self.lookup(id).await? {
            Lookup::Found(rec, revision) => Some((*rec, revision)),
            Lookup::Removed | Lookup::Missing => None,
        })
    }

    async fn lookup(&self, id: &str) -> Result<Lookup, OjsError> {
        if crate::domain::envelope::parse_job_id(id).is_none() {
            return Ok(Lookup::Missing);
        }
        let entry = self
            .inner
            .jobs
            .entry(id)
            .await
            .map_err(backend("reading a job"))?;
        let Some(entry) = entry else {
            return Ok(Lookup::Missing);
        };
        if entry.operation != kv::Operation::Put {
            return Ok(Lookup::Removed);
        }
        let rec = serde_json::from_slice(&entry.value)
            .map_err(|err| OjsError::backend(format!("job record {id} is unreadable: {err}")))?;
        Ok(Lookup::Found(Box::new(rec), entry.revision))
    }

    /// Writes `rec` if the record is still at `revision`. `None` when another writer won.
    async fn write(
        &self,
        id: &str,
        rec: &JobRecord,
        revision: u64,
    ) -> Result<Option<u64>, OjsError> {
        let bytes = rec.to_bytes();
        if bytes.len() > self.inner.max_record_bytes {
            let mut err = too_large("job", bytes.len(), self.inner.max_record_bytes);
            err.message = format!(
                "This would make job {id} {} bytes, over the maximum of {} bytes: send a smaller result or error.",
                bytes.len(),
                self.inner.max_record_bytes
            );
            return Err(err);
        }
        match self.inner.jobs.update(id, bytes.into(), revision).await {
            Ok(rev) => Ok(Some(rev)),
            Err(err) if err.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(None),
            Err(err) => Err(OjsError::backend(format!(
                "NATS failed while writing a job: {err}"
            ))),
        }
    }
}

/// Pauses before looking again for the record a young message points to that is missing or
/// `Behind`: its writer publishes the message first and writes the record a moment later,
/// and a waiting FETCH gets the message that fast. Looks after 0.5, 1, 2, 4 and 8 ms; false
/// once they are spent.
async fn look_again(attempt: usize, delivered: &Delivered<'_>) -> bool {
    let again = attempt < 5 && !delivered.orphan_age_passed;
    if again {
        tokio::time::sleep(Duration::from_micros(500 << attempt)).await;
    }
    again
}

/// 409 for an operation that lost every compare-and-set round on the job's record.
pub(super) fn changing_too_fast(id: &str) -> OjsError {
    OjsError::new(
        ErrorCode::Conflict,
        format!("Job '{id}' is changing too fast; retry."),
    )
}

/// Acknowledges, extends or rejects a delivered message; a lost ack is repaired by redelivery.
async fn settle(msg: &async_nats::jetstream::Message, kind: AckKind) {
    if let Err(err) = msg.ack_with(kind).await {
        warn!(error = %err, "could not settle a queue message");
    }
}
