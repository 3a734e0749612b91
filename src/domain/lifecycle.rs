//! The operations on a job record (core §7), as pure functions from the current record to the
//! next one. The store writes the result with a revision check, so each function is the whole
//! decision of one transition.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::error::{ErrorCode, OjsError};
use super::job::{Holder, Job, JobError, JobRecord, Transition};
use super::state::{self, JobState};
use super::time;

/// Kept entries of `errors[]`; errors spec §6.2 asks for at least 10.
pub const MAX_ERROR_HISTORY: usize = 50;
/// Largest `error` a FAIL may report, serialized (message, type, details, backtrace).
pub const MAX_ERROR_BYTES: usize = 16 * 1024;
/// Bytes of `errors[]` kept: the oldest entries go first, the newest always stays. Without
/// it, forty retries with 25 KB backtraces would push the record past what NATS stores.
pub const MAX_ERROR_HISTORY_BYTES: usize = 32 * 1024;
/// What a job's record may grow by after PUSH without a client sending more: its latest
/// error, the error history, the trail, progress, the holder and timestamps. PUSH keeps
/// this much room below the record limit, so no transition the server makes on its own can
/// be refused for size.
pub const RECORD_HEADROOM: usize = MAX_ERROR_BYTES
    + MAX_ERROR_HISTORY_BYTES
    + super::trail::MAX_TRAIL_BYTES
    + MAX_PROGRESS_DATA_BYTES
    + MAX_PROGRESS_MESSAGE_BYTES
    + 4096;
/// Largest `data` object of a progress update, serialized (the spec recommends 4 KiB).
pub const MAX_PROGRESS_DATA_BYTES: usize = 16 * 1024;
/// Longest `message` of a progress update.
pub const MAX_PROGRESS_MESSAGE_BYTES: usize = 1024;

/// A worker's failure report (core §8; HTTP binding §10.3).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Failure {
    pub code: String,
    pub message: String,
    /// `false` makes the failure final whatever the retry policy says.
    pub retryable: bool,
    pub error_type: Option<String>,
    pub details: Option<Value>,
    pub backtrace: Option<Value>,
}

impl Failure {
    /// The type matched against `non_retryable_errors`: `type`, else `details.error_class`,
    /// else the code (retry spec §6; conformance case retry-non-retryable-error.json).
    pub fn effective_type(&self) -> String {
        self.error_type
            .clone()
            .or_else(|| {
                self.details
                    .as_ref()
                    .and_then(|d| d.get("error_class"))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .unwrap_or_else(|| self.code.clone())
    }
}

/// The queue message a FETCH claims a job through.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    pub ack_subject: String,
    pub sequence: u64,
}

/// FETCH claims an available job: `attempt + 1`, `started_at`, the holder (core §7.2).
pub fn claim(
    rec: &JobRecord,
    now: DateTime<Utc>,
    worker_id: Option<&str>,
    delivery: &Delivery,
    visibility: Duration,
) -> Result<JobRecord, OjsError> {
    state::check(&rec.job.id, rec.job.state, JobState::Active)?;
    let mut next = rec.clone();
    let job = &mut next.job;
    job.state = JobState::Active;
    job.attempt += 1;
    job.started_at = Some(now);
    job.worker_id = worker_id.map(str::to_owned);
    job.next_attempt_at = None;
    clear_progress(job);
    next.holder = Some(Holder {
        worker_id: worker_id.map(str::to_owned),
        ack_subject: delivery.ack_subject.clone(),
        sequence: delivery.sequence,
        visible_until: time::add(now, visibility),
        last_beat: None,
        slot: None,
        visibility_ms: Some(visibility.as_millis() as u64),
    });
    next.transition = Transition::Started;
    Ok(next)
}

/// A claim the FETCH could not hand over (its client went away first): the job is available
/// again as before the claim — the attempt not counted, the same dispatch, so the claim's
/// queue message, released with a NAK rather than acknowledged, dispatches it again first
/// in line. `None` when the job has moved on from that claim (`attempt`).
pub fn hand_back(rec: &JobRecord, attempt: u32) -> Option<JobRecord> {
    if rec.job.state != JobState::Active || rec.job.attempt != attempt || rec.holder.is_none() {
        return None;
    }
    let mut next = leave_active(rec);
    let job = &mut next.job;
    job.state = JobState::Available;
    job.attempt = attempt.saturating_sub(1);
    job.started_at = None;
    next.transition = Transition::Requeued;
    Some(next)
}

/// The active job's queue message was delivered again (JetStream's ack-wait backstop) while
/// the holder's reservation still runs: keep the holder, settle through the new subject.
pub fn redelivered(rec: &JobRecord, delivery: &Delivery) -> JobRecord {
    let mut next = rec.clone();
    if let Some(holder) = next.holder.as_mut() {
        holder.ack_subject = delivery.ack_subject.clone();
    }
    next.transition = Transition::Redelivered;
    next
}

/// ACK: `active → completed` with the result; the previous error is cleared (core §7.3).
pub fn complete(
    rec: &JobRecord,
    now: DateTime<Utc>,
    worker_id: Option<&str>,
    result: Option<Value>,
) -> Result<JobRecord, OjsError> {
    expect_holder(rec, worker_id)?;
    let mut next = leave_active(rec);
    let job = &mut next.job;
    job.state = JobState::Completed;
    job.completed_at = Some(now);
    job.result = result.filter(|r| !r.is_null());
    job.error = None;
    complete_progress(job, now);
    next.transition = Transition::Completed;
    Ok(next)
}

/// FAIL (core §7.4, retry spec §7): record the error, then requeue, retry with backoff or
/// discard. `jitter_factor` is a draw from [0.5, 1.5).
pub fn fail(
    rec: &JobRecord,
    now: DateTime<Utc>,
    worker_id: Option<&str>,
    failure: &Failure,
    requeue: bool,
    jitter_factor: f64,
) -> Result<JobRecord, OjsError> {
    expect_holder(rec, worker_id)?;
    let mut next = leave_active(rec);
    let error_type = failure.effective_type();
    let policy = &rec.job.retry;
    let job = &mut next.job;
    let entry = JobError {
        code: failure.code.clone(),
        message: failure.message.clone(),
        error_type: Some(error_type.clone()),
        retryable: failure.retryable,
        details: failure.details.clone(),
        backtrace: failure.backtrace.clone(),
        attempt: job.attempt,
        occurred_at: now,
    };
    record_error(job, entry);

    if requeue {
        job.state = JobState::Available;
        job.enqueued_at = Some(now);
        next.dispatch += 1;
        next.transition = Transition::Requeued;
        return Ok(next);
    }
    let final_failure = !failure.retryable || policy.is_non_retryable(&error_type);
    if final_failure || job.attempt >= job.max_attempts {
        job.state = JobState::Discarded;
        job.completed_at = Some(now);
        job.discarded_at = Some(now);
    } else {
        let delay = policy.delay(job.attempt, jitter_factor);
        job.state = JobState::Retryable;
        job.retry_delay_ms = Some(delay.as_millis() as u64);
        job.next_attempt_at = Some(time::add(now, delay));
    }
    next.transition = Transition::Failed;
    Ok(next)
}

/// Why a holder lost its job without ACK or FAIL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LapseCause {
    /// The reservation ran out (worker protocol §5.5).
    Visibility,
    /// The holder stopped heartbeating (worker protocol §10).
    WorkerDeath,
}

/// The holder lost the job (`cause`): the error is recorded and the job is available again —
/// same attempt number, the next claim counts the next one — or discarded when its attempts
/// are spent. The caller decides which queue message dispatches it again.
pub fn lapse(rec: &JobRecord, now: DateTime<Utc>, cause: LapseCause) -> JobRecord {
    let mut next = leave_active(rec);
    let job = &mut next.job;
    let (error_type, message) = match cause {
        LapseCause::Visibility => (
            "visibility_timeout",
            "The visibility timeout expired before the job was acknowledged.",
        ),
        LapseCause::WorkerDeath => (
            "worker_death",
            "The worker holding the job stopped sending heartbeats.",
        ),
    };
    let entry = JobError {
        code: "timeout".into(),
        message: message.into(),
        error_type: Some(error_type.into()),
        retryable: true,
        details: None,
        backtrace: None,
        attempt: job.attempt,
        occurred_at: now,
    };
    record_error(job, entry);
    if job.attempt >= job.max_attempts {
        job.state = JobState::Discarded;
        job.completed_at = Some(now);
        job.discarded_at = Some(now);
        next.transition = Transition::Failed;
    } else {
        job.state = JobState::Available;
        job.enqueued_at = Some(now);
        next.transition = Transition::Requeued;
    }
    next
}

/// What a job's deadline timer finds when it fires.
#[derive(Debug, Clone, PartialEq)]
pub enum Deadline {
    /// The job moved on (another attempt, dispatch or state): nothing to do.
    Stale,
    /// Still running and within both deadlines (a heartbeat extended it): look again then.
    NotYet(DateTime<Utc>),
    /// A deadline passed: the record to write.
    Expired(Box<JobRecord>),
}

/// When the active job's next deadline falls: the earlier of its reservation and its
/// execution timeout (core §5.2, measured from `started_at`, no grace; conformance case
/// timeout-execution-triggers-failure.json).
pub fn deadline_of(rec: &JobRecord, default_timeout: Duration) -> Option<DateTime<Utc>> {
    let holder = rec.holder.as_ref()?;
    let timeout = rec
        .job
        .timeout_ms
        .map_or(default_timeout, Duration::from_millis);
    let execution = time::add(rec.job.started_at?, timeout);
    Some(holder.visible_until.min(execution))
}

/// A deadline timer set for `(dispatch, attempt)` fired: an execution timeout fails the job
/// through its retry policy; a lapsed reservation makes it available under a new dispatch.
pub fn on_deadline(
    rec: &JobRecord,
    now: DateTime<Utc>,
    dispatch: u64,
    attempt: u32,
    default_timeout: Duration,
    jitter_factor: f64,
) -> Deadline {
    let current =
        rec.job.state == JobState::Active && rec.dispatch == dispatch && rec.job.attempt == attempt;
    let Some(due) = deadline_of(rec, default_timeout).filter(|_| current) else {
        return Deadline::Stale;
    };
    if due > now {
        return Deadline::NotYet(due);
    }
    let timeout = rec
        .job
        .timeout_ms
        .map_or(default_timeout, Duration::from_millis);
    let execution_over = rec
        .job
        .started_at
        .is_some_and(|s| time::add(s, timeout) <= now);
    if execution_over {
        let failure = Failure {
            code: "timeout".into(),
            message: format!(
                "The job ran longer than its timeout of {} ms.",
                timeout.as_millis()
            ),
            retryable: true,
            error_type: Some("timeout".into()),
            details: Some(serde_json::json!({"timeout_kind": "execution"})),
            backtrace: None,
        };
        return match fail(rec, now, None, &failure, false, jitter_factor) {
            Ok(next) => Deadline::Expired(Box::new(next)),
            Err(_) => Deadline::Stale,
        };
    }
    Deadline::Expired(Box::new(redispatch(lapse(
        rec,
        now,
        LapseCause::Visibility,
    ))))
}

/// The holder `worker_id` was declared dead: its job goes back to the queue (or is discarded
/// when its attempts are spent). `None` when the job is no longer that worker's.
pub fn worker_died(rec: &JobRecord, now: DateTime<Utc>, worker_id: &str) -> Option<JobRecord> {
    let held = rec.job.state == JobState::Active
        && rec.holder.as_ref().and_then(|h| h.worker_id.as_deref()) == Some(worker_id);
    held.then(|| redispatch(lapse(rec, now, LapseCause::WorkerDeath)))
}

/// How far a BEAT (or a progress report) extends `rec`'s reservation: what it `asked`,
/// else what the FETCH that claimed the job asked for, else the job's own visibility
/// timeout, else the server's `default`.
pub fn beat_visibility(rec: &JobRecord, asked: Option<Duration>, default: Duration) -> Duration {
    let claimed = rec.holder.as_ref().and_then(|h| h.visibility_ms);
    asked
        .or(claimed.map(Duration::from_millis))
        .or(rec.job.visibility_timeout_ms.map(Duration::from_millis))
        .unwrap_or(default)
}

/// BEAT for one job (core §7.5): the holder extends its reservation to `now + visibility`.
/// `None` when the job is not active or held by someone else.
pub fn heartbeat(
    rec: &JobRecord,
    now: DateTime<Utc>,
    worker_id: &str,
    visibility: Duration,
) -> Option<JobRecord> {
    let holder = rec.holder.as_ref()?;
    let mine = holder.worker_id.as_deref().is_none_or(|h| h == worker_id);
    if rec.job.state != JobState::Active || !mine {
        return None;
    }
    let mut next = rec.clone();
    let holder = next.holder.as_mut()?;
    holder.visible_until = time::add(now, visibility);
    holder.last_beat = Some(now);
    next.transition = Transition::Heartbeat;
    Some(next)
}

/// Operator retry from the dead letter queue (dead-letter spec §6.1, HTTP binding §12.2): a
/// discarded job is available again with a fresh attempt count; its error history stays.
pub fn retry_discarded(rec: &JobRecord, now: DateTime<Utc>) -> Result<JobRecord, OjsError> {
    state::expect(&rec.job.id, rec.job.state, JobState::Discarded)?;
    let mut next = rec.clone();
    let job = &mut next.job;
    job.state = JobState::Available;
    job.attempt = 0;
    job.enqueued_at = Some(now);
    job.completed_at = None;
    job.discarded_at = None;
    job.error = None;
    next.dead_letter = None;
    next.dispatch += 1;
    next.transition = Transition::Retried;
    Ok(next)
}

/// Bulk retry (bulk-operations spec §7): a discarded job as the dead letter queue's retry
/// does; a retryable one now rather than at its next attempt time, keeping its attempt count
/// (the promote timer set for its dispatch is then stale). Other states are refused with 409.
pub fn retry_now(rec: &JobRecord, now: DateTime<Utc>) -> Result<JobRecord, OjsError> {
    match rec.job.state {
        JobState::Discarded => retry_discarded(rec, now),
        JobState::Retryable => Ok(waited(rec, now, Transition::Retried)),
        other => Err(refused(
            rec,
            format!(
                "Job '{}' is {other}; only discarded and retryable jobs can be retried.",
                rec.job.id
            ),
        )),
    }
}

/// Bulk delete (bulk-operations spec §8): only a finished job (completed, cancelled or
/// discarded) may be removed, and not a workflow's member, which its workflow still names.
///
/// # Errors
/// 409 otherwise.
pub fn check_deletable(rec: &JobRecord) -> Result<(), OjsError> {
    let id = &rec.job.id;
    if !matches!(
        rec.job.state,
        JobState::Completed | JobState::Cancelled | JobState::Discarded
    ) {
        return Err(refused(
            rec,
            format!(
                "Job '{id}' is {}; only completed, cancelled and discarded jobs can be deleted.",
                rec.job.state
            ),
        ));
    }
    if rec.job.workflow_id.is_some() {
        return Err(refused(
            rec,
            format!("Job '{id}' belongs to a workflow, which still names it."),
        ));
    }
    Ok(())
}

/// 409 for an operation `rec`'s state does not allow, naming the job and its state.
fn refused(rec: &JobRecord, message: String) -> OjsError {
    OjsError::new(ErrorCode::Conflict, message)
        .with_detail("job_id", rec.job.id.as_str())
        .with_detail("current_state", rec.job.state.as_str())
}

/// A lapsed job that is available again needs a queue message of its own: the old one is
/// still held by the lost reservation and will be acknowledged as spent.
fn redispatch(mut next: JobRecord) -> JobRecord {
    if next.job.state == JobState::Available {
        next.dispatch += 1;
    }
    next
}

/// Sets the latest error and appends it to the history, bounded by count and by bytes.
fn record_error(job: &mut super::job::Job, entry: JobError) {
    job.errors.push(entry.clone());
    let mut bytes = 0;
    let kept = job
        .errors
        .iter()
        .rev()
        .take(MAX_ERROR_HISTORY)
        .take_while(|e| {
            bytes += serde_json::to_vec(e).map_or(0, |b| b.len());
            bytes <= MAX_ERROR_HISTORY_BYTES
        })
        .count()
        .max(1);
    let excess = job.errors.len() - kept;
    job.errors.drain(..excess);
    job.error = Some(entry);
}

/// CANCEL (core §7.6, HTTP binding §9.4): `None` when the job is already cancelled
/// (idempotent); completed and discarded jobs are refused with 409.
pub fn cancel(rec: &JobRecord, now: DateTime<Utc>) -> Result<Option<JobRecord>, OjsError> {
    if rec.job.state == JobState::Cancelled {
        return Ok(None);
    }
    state::check(&rec.job.id, rec.job.state, JobState::Cancelled)?;
    let mut next = leave_active(rec);
    next.job.state = JobState::Cancelled;
    next.job.cancelled_at = Some(now);
    next.transition = Transition::Cancelled;
    Ok(Some(next))
}

/// ACTIVATE (HTTP binding §9.5): `pending → available`.
pub fn activate(rec: &JobRecord, now: DateTime<Utc>) -> Result<JobRecord, OjsError> {
    state::expect(&rec.job.id, rec.job.state, JobState::Pending)?;
    let mut next = rec.clone();
    next.job.state = JobState::Available;
    next.job.enqueued_at = Some(now);
    next.dispatch += 1;
    next.transition = Transition::Activated;
    Ok(next)
}

/// A waiting job takes a new priority (priority spec §8.1). An available job is dispatched
/// again under the next dispatch, so its message goes to the new priority's lane and the
/// old one is spent; a scheduled or pending job takes the priority when it becomes
/// available. `None` when it already has that priority; 409 for every other state (the
/// spec's MUST NOT: a running job gains nothing, a finished one means nothing, a retryable
/// one is not waiting in a lane).
pub fn reprioritize(rec: &JobRecord, priority: i32) -> Result<Option<JobRecord>, OjsError> {
    let waiting = matches!(
        rec.job.state,
        JobState::Available | JobState::Scheduled | JobState::Pending
    );
    if !waiting {
        return Err(refused(
            rec,
            format!(
                "Job {} is {}; only an available, scheduled or pending job can change its priority.",
                rec.job.id,
                rec.job.state.as_str()
            ),
        ));
    }
    if rec.job.priority == priority {
        return Ok(None);
    }
    let mut next = rec.clone();
    next.job.priority = priority;
    if next.job.state == JobState::Available {
        next.dispatch += 1;
    }
    next.transition = Transition::Reprioritized;
    Ok(Some(next))
}

/// A workflow starts its pending member: `pending → available` with the results of the
/// members before it; `None` when it is no longer pending (started already, or
/// cancelled), so starting it twice changes nothing.
pub fn activate_member(
    rec: &JobRecord,
    now: DateTime<Utc>,
    parent_results: Option<Value>,
) -> Option<JobRecord> {
    if rec.job.state != JobState::Pending {
        return None;
    }
    let mut next = activate(rec, now).ok()?;
    next.job.parent_results = parent_results;
    Some(next)
}

/// A cancelled or failed workflow withdraws a member: cancelled unless it runs (it finishes,
/// workflows spec §11.3) or already ended; `None` then.
pub fn withdraw(rec: &JobRecord, now: DateTime<Utc>) -> Option<JobRecord> {
    if rec.job.state == JobState::Active || rec.job.state.is_terminal() {
        return None;
    }
    cancel(rec, now).ok().flatten()
}

/// When a waiting job becomes available: a retryable one at its next attempt, a scheduled
/// one at its `scheduled_at`. `None` for jobs in other states.
pub fn due_at(rec: &JobRecord) -> Option<DateTime<Utc>> {
    match rec.job.state {
        JobState::Retryable => rec.job.next_attempt_at,
        JobState::Scheduled => rec.job.scheduled_at.as_deref().and_then(super::time::parse),
        _ => None,
    }
}

/// A timer for dispatch `dispatch` came due: a retryable or scheduled job becomes available
/// under the next dispatch (core §6.4). `None` when the timer is stale — the job moved on.
pub fn promote(rec: &JobRecord, now: DateTime<Utc>, dispatch: u64) -> Option<JobRecord> {
    if let Some(expired) = expire(rec, now) {
        return Some(expired);
    }
    if !matches!(rec.job.state, JobState::Retryable | JobState::Scheduled) {
        return None;
    }
    // A timer set for an earlier attempt, or repeated, must not make the job run early.
    if rec.dispatch != dispatch || due_at(rec).is_some_and(|at| at > now) {
        return None;
    }
    Some(waited(rec, now, Transition::Promoted))
}

/// Whether a promote timer set for `(dispatch, attempt)` finds `rec` still running that
/// attempt: the write the timer was stored ahead of (a FAIL, an execution timeout) has not
/// landed yet — it waits out an election, or a replica answered from before it — or never
/// will (its writer died between the two). Not stale, then: the firing looks again.
pub fn behind_timer(rec: &JobRecord, dispatch: u64, attempt: u32) -> bool {
    rec.job.state == JobState::Active && rec.dispatch == dispatch && rec.job.attempt == attempt
}

/// A retryable or scheduled job available now, under the next dispatch.
fn waited(rec: &JobRecord, now: DateTime<Utc>, transition: Transition) -> JobRecord {
    let mut next = rec.clone();
    next.job.state = JobState::Available;
    next.job.enqueued_at = Some(now);
    next.job.next_attempt_at = None;
    next.dispatch += 1;
    next.transition = transition;
    next
}

/// Core §5.2: a job whose `expires_at` has passed before it started is discarded without
/// running, whether it waits scheduled, available or retryable. `None` when it has not
/// expired (or has no `expires_at`, or is past waiting).
pub fn expire(rec: &JobRecord, now: DateTime<Utc>) -> Option<JobRecord> {
    let waiting = matches!(
        rec.job.state,
        JobState::Scheduled | JobState::Available | JobState::Retryable
    );
    let deadline = rec.job.expires_at.as_deref().and_then(super::time::parse)?;
    if !waiting || deadline > now {
        return None;
    }
    let mut next = rec.clone();
    let job = &mut next.job;
    job.state = JobState::Discarded;
    job.completed_at = Some(now);
    job.discarded_at = Some(now);
    job.next_attempt_at = None;
    next.transition = Transition::Expired;
    Some(next)
}

/// A full bounded queue's `drop_oldest` (backpressure spec §5.3): the oldest available job
/// is discarded to make room, with an `overflow` error saying why.
///
/// # Errors
/// 409 when the job is no longer available (claimed, cancelled, dropped meanwhile).
pub fn drop_overflow(rec: &JobRecord, now: DateTime<Utc>) -> Result<JobRecord, OjsError> {
    state::expect(&rec.job.id, rec.job.state, JobState::Available)?;
    let mut next = rec.clone();
    let job = &mut next.job;
    job.state = JobState::Discarded;
    job.completed_at = Some(now);
    job.discarded_at = Some(now);
    job.error = Some(JobError {
        code: "overflow".into(),
        message: format!(
            "Dropped for a newer job: queue '{}' was at its depth bound.",
            job.queue
        ),
        error_type: Some("overflow".into()),
        retryable: false,
        details: None,
        backtrace: None,
        attempt: job.attempt,
        occurred_at: now,
    });
    next.transition = Transition::Dropped;
    Ok(next)
}

/// ACK and FAIL need the job active and, when both sides name a worker, held by the caller
/// (worker protocol §5.6; HTTP binding §10.2–§10.3).
fn expect_holder(rec: &JobRecord, worker_id: Option<&str>) -> Result<(), OjsError> {
    state::expect(&rec.job.id, rec.job.state, JobState::Active)?;
    let holder = rec.holder.as_ref().and_then(|h| h.worker_id.as_deref());
    match (worker_id, holder) {
        (Some(caller), Some(holder)) if caller != holder => Err(OjsError::new(
            ErrorCode::Conflict,
            format!(
                "Job '{}' is held by worker '{holder}', not '{caller}'.",
                rec.job.id
            ),
        )
        .with_detail("job_id", rec.job.id.as_str())
        .with_detail("worker_id", caller)
        .with_detail("holder", holder)),
        _ => Ok(()),
    }
}

/// A copy without the reservation: the job is no longer held by anyone.
fn leave_active(rec: &JobRecord) -> JobRecord {
    let mut next = rec.clone();
    next.holder = None;
    next.job.worker_id = None;
    next
}

/// A new attempt starts with no progress (spec §5.3).
fn clear_progress(job: &mut Job) {
    job.progress = None;
    job.progress_data = None;
    job.progress_message = None;
    job.progress_updated_at = None;
}

/// A completed job's progress is 1 (spec §8.1).
fn complete_progress(job: &mut Job, now: DateTime<Utc>) {
    job.progress = Some(1.0);
    job.progress_updated_at = Some(now);
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::fixtures::{now, record};

    fn active(options: Value, worker: Option<&str>) -> JobRecord {
        claim(
            &record(options),
            now(),
            worker,
            &delivery(1),
            Duration::from_secs(30),
        )
        .unwrap()
    }

    fn delivery(sequence: u64) -> Delivery {
        Delivery {
            ack_subject: format!("ack.{sequence}"),
            sequence,
        }
    }

    fn failure(retryable: bool) -> Failure {
        Failure {
            code: "handler_error".into(),
            message: "boom".into(),
            retryable,
            ..Failure::default()
        }
    }

    #[test]
    fn claim_increments_attempt_and_sets_holder() {
        let a = active(json!({}), Some("w1"));
        assert_eq!(a.job.state, JobState::Active);
        assert_eq!(a.job.attempt, 1);
        assert_eq!(a.job.started_at, Some(now()));
        assert_eq!(a.holder.as_ref().unwrap().ack_subject, "ack.1");
        assert_eq!(a.holder.as_ref().unwrap().sequence, 1);
        assert!(claim(&a, now(), None, &delivery(2), Duration::from_secs(1)).is_err());
    }

    #[test]
    fn ack_completes_clears_error_and_refuses_other_workers() {
        let a = active(json!({}), Some("w1"));
        let err = complete(&a, now(), Some("w2"), None).unwrap_err();
        assert_eq!(err.code, ErrorCode::Conflict);
        let c = complete(&a, now(), None, Some(json!({"ok": true}))).unwrap();
        assert_eq!(c.job.state, JobState::Completed);
        assert_eq!(c.job.result, Some(json!({"ok": true})));
        assert!(c.holder.is_none() && c.job.error.is_none());
        assert_eq!(
            complete(&c, now(), None, None).unwrap_err().details["current_state"],
            "completed"
        );
    }

    #[test]
    fn ack_on_available_is_a_conflict() {
        let err = complete(&record(json!({})), now(), None, None).unwrap_err();
        assert_eq!(err.details["expected_state"], "active");
    }

    #[test]
    fn fail_with_retries_left_is_retryable_with_delay() {
        let a = active(json!({"retry": {"jitter": false}}), None);
        let f = fail(&a, now(), None, &failure(true), false, 1.0).unwrap();
        assert_eq!(f.job.state, JobState::Retryable);
        assert_eq!(f.job.retry_delay_ms, Some(1000));
        assert_eq!(f.job.errors.len(), 1);
        assert_eq!(f.job.errors[0].attempt, 1);
        assert!(f.job.completed_at.is_none());
    }

    #[test]
    fn the_error_history_is_bounded_by_bytes_keeping_the_newest() {
        let mut rec = active(json!({"retry": {"max_attempts": 100}}), None);
        let big = Failure {
            backtrace: Some(json!("x".repeat(MAX_ERROR_BYTES - 512))),
            ..failure(true)
        };
        for n in 0..40 {
            let failed = fail(&rec, now(), None, &big, true, 1.0).unwrap();
            let bytes = serde_json::to_vec(&failed.job.errors).unwrap().len();
            assert!(
                bytes <= MAX_ERROR_HISTORY_BYTES,
                "after {n} failures: {bytes}"
            );
            assert_eq!(failed.job.errors.last(), failed.job.error.as_ref());
            rec = claim(
                &failed,
                now(),
                None,
                &delivery(n + 2),
                Duration::from_secs(30),
            )
            .unwrap();
        }
        let small = fail(&rec, now(), None, &failure(true), true, 1.0).unwrap();
        assert_eq!(small.job.errors.last().unwrap().message, "boom");
        assert!(
            small.job.errors.len() >= 2,
            "room for one big and the new small one"
        );
    }

    #[test]
    fn deadlines_of_the_longest_timeouts_stay_readable() {
        let a = active(json!({"timeout_ms": 31_536_000_000u64}), None);
        let due = deadline_of(&a, Duration::from_secs(1800)).unwrap();
        assert!(due <= time::LATEST);
        let near_the_end = JobRecord {
            job: crate::domain::job::Job {
                started_at: Some(time::LATEST),
                ..a.job.clone()
            },
            ..a.clone()
        };
        assert_eq!(
            deadline_of(&near_the_end, Duration::MAX),
            Some(a.holder.unwrap().visible_until)
        );
        let retry = crate::domain::retry::RetryPolicy::from_value(
            &json!({"initial_interval": "P365D", "backoff_coefficient": 1e300}),
        )
        .unwrap();
        assert!(retry.delay(50, 1.0) <= crate::domain::duration::MAX);
    }

    #[test]
    fn fail_exhausted_or_non_retryable_discards() {
        let one = active(json!({"retry": {"max_attempts": 1}}), None);
        let d = fail(&one, now(), None, &failure(true), false, 1.0).unwrap();
        assert_eq!(d.job.state, JobState::Discarded);
        assert!(d.job.discarded_at.is_some() && d.job.completed_at.is_some());

        let a = active(json!({}), None);
        assert_eq!(
            fail(&a, now(), None, &failure(false), false, 1.0)
                .unwrap()
                .job
                .state,
            JobState::Discarded
        );

        let typed = active(
            json!({"retry": {"non_retryable_errors": ["FatalError"]}}),
            None,
        );
        let mut f = failure(true);
        f.details = Some(json!({"error_class": "FatalError"}));
        assert_eq!(
            fail(&typed, now(), None, &f, false, 1.0).unwrap().job.state,
            JobState::Discarded
        );
    }

    #[test]
    fn a_claim_handed_back_is_available_again_as_before_it() {
        let before = record(json!({}));
        let claimed = active(json!({}), Some("w1"));
        let back = hand_back(&claimed, 1).unwrap();
        assert_eq!(back.job.state, JobState::Available);
        assert_eq!(back.job.attempt, before.job.attempt);
        assert_eq!(back.dispatch, claimed.dispatch);
        assert!(back.holder.is_none() && back.job.started_at.is_none());
        assert_eq!(back.transition, Transition::Requeued);
        // A later attempt, or a job no longer active, is not this claim's to hand back.
        assert!(hand_back(&claimed, 2).is_none());
        assert!(hand_back(&back, 1).is_none());
    }

    #[test]
    fn requeue_returns_to_available_with_new_dispatch() {
        let a = active(json!({}), None);
        let r = fail(&a, now(), None, &failure(false), true, 1.0).unwrap();
        assert_eq!(r.job.state, JobState::Available);
        assert_eq!(r.dispatch, a.dispatch + 1);
        assert_eq!(r.job.attempt, 1);
    }

    #[test]
    fn lapse_requeues_or_discards_when_attempts_are_spent() {
        let a = active(json!({}), Some("w"));
        let l = lapse(&a, now(), LapseCause::Visibility);
        assert_eq!(l.job.state, JobState::Available);
        assert_eq!(l.job.attempt, 1);
        assert_eq!(
            l.job.error.as_ref().unwrap().error_type.as_deref(),
            Some("visibility_timeout")
        );
        assert!(l.holder.is_none());
        let last = active(json!({"retry": {"max_attempts": 1}}), None);
        assert_eq!(
            lapse(&last, now(), LapseCause::Visibility).job.state,
            JobState::Discarded
        );
    }

    #[test]
    fn promote_only_the_dispatch_the_timer_was_set_for() {
        let a = active(json!({}), None);
        let r = fail(&a, now(), None, &failure(true), false, 1.0).unwrap();
        let due = r.job.next_attempt_at.unwrap();
        assert!(promote(&r, due, r.dispatch + 1).is_none());
        assert!(
            promote(&r, now(), r.dispatch).is_none(),
            "not before its time"
        );
        let p = promote(&r, due, r.dispatch).unwrap();
        assert_eq!(p.job.state, JobState::Available);
        assert_eq!(p.dispatch, r.dispatch + 1);
        assert!(p.job.next_attempt_at.is_none());
        assert!(promote(&p, due, p.dispatch).is_none());
    }

    #[test]
    fn only_a_waiting_job_changes_priority_and_an_available_one_is_dispatched_again() {
        let available = record(json!({}));
        let moved = reprioritize(&available, 7).unwrap().unwrap();
        assert_eq!(moved.job.priority, 7);
        assert_eq!(moved.job.state, JobState::Available);
        assert_eq!(
            moved.dispatch,
            available.dispatch + 1,
            "a message in the new lane"
        );
        assert_eq!(moved.transition, Transition::Reprioritized);
        assert!(
            reprioritize(&moved, 7).unwrap().is_none(),
            "no change, no write"
        );
        let scheduled = record(json!({"scheduled_at": "2026-02-12T11:00:00Z"}));
        assert_eq!(scheduled.job.state, JobState::Scheduled);
        let later = reprioritize(&scheduled, -3).unwrap().unwrap();
        assert_eq!(
            (later.job.priority, later.dispatch),
            (-3, scheduled.dispatch),
            "its message comes at promotion, in the lane of its priority then"
        );
        let running = active(json!({}), None);
        let retrying = fail(&running, now(), None, &failure(true), false, 1.0).unwrap();
        let done = complete(&running, now(), None, None).unwrap();
        for rec in [running, retrying, done] {
            let err = reprioritize(&rec, 1).unwrap_err();
            assert_eq!(err.code, ErrorCode::Conflict, "{:?}", rec.job.state);
        }
    }

    #[test]
    fn a_retry_timer_is_behind_only_the_attempt_whose_failure_stored_it() {
        let a = active(json!({}), None);
        let r = fail(&a, now(), None, &failure(true), false, 1.0).unwrap();
        let due = r.job.next_attempt_at.unwrap();
        assert!(
            promote(&a, due, r.dispatch).is_none(),
            "the FAIL has not landed"
        );
        assert!(behind_timer(&a, r.dispatch, r.job.attempt));
        assert!(!behind_timer(&r, r.dispatch, r.job.attempt), "it landed");
        let p = promote(&r, due, r.dispatch).unwrap();
        assert!(!behind_timer(&p, r.dispatch, r.job.attempt), "moved on");
        let next = claim(&p, due, Some("w"), &delivery(2), Duration::from_secs(60)).unwrap();
        assert!(
            !behind_timer(&next, r.dispatch, r.job.attempt),
            "the next attempt runs under the next dispatch"
        );
    }

    #[test]
    fn deadline_fires_execution_timeout_then_lapse_and_ignores_stale_timers() {
        let timeout = Duration::from_secs(1800);
        let a = claim(
            &record(json!({"timeout_ms": 2000})),
            now(),
            Some("w"),
            &delivery(1),
            Duration::from_secs(60),
        )
        .unwrap();
        let due = deadline_of(&a, timeout).unwrap();
        assert_eq!(due, now() + chrono::Duration::seconds(2));
        assert_eq!(
            on_deadline(&a, now(), a.dispatch, 1, timeout, 1.0),
            Deadline::NotYet(due)
        );
        assert_eq!(
            on_deadline(&a, due, a.dispatch, 2, timeout, 1.0),
            Deadline::Stale
        );
        let Deadline::Expired(failed) = on_deadline(&a, due, a.dispatch, 1, timeout, 1.0) else {
            panic!()
        };
        assert_eq!(failed.job.state, JobState::Retryable);
        assert_eq!(
            failed.job.error.as_ref().unwrap().error_type.as_deref(),
            Some("timeout")
        );

        let short = claim(
            &record(json!({})),
            now(),
            Some("w"),
            &delivery(1),
            Duration::from_secs(3),
        )
        .unwrap();
        let due = deadline_of(&short, timeout).unwrap();
        let Deadline::Expired(lapsed) = on_deadline(&short, due, short.dispatch, 1, timeout, 1.0)
        else {
            panic!()
        };
        assert_eq!(lapsed.job.state, JobState::Available);
        assert_eq!(lapsed.dispatch, short.dispatch + 1);
        assert_eq!(
            lapsed.job.error.as_ref().unwrap().error_type.as_deref(),
            Some("visibility_timeout")
        );
    }

    #[test]
    fn heartbeat_extends_only_the_holders_active_job() {
        let a = active(json!({}), Some("w"));
        let later = now() + chrono::Duration::seconds(10);
        let b = heartbeat(&a, later, "w", Duration::from_secs(5)).unwrap();
        assert_eq!(
            b.holder.as_ref().unwrap().visible_until,
            later + chrono::Duration::seconds(5)
        );
        assert_eq!(b.transition, Transition::Heartbeat);
        assert!(heartbeat(&a, later, "other", Duration::from_secs(5)).is_none());
        assert!(heartbeat(&record(json!({})), later, "w", Duration::from_secs(5)).is_none());
    }

    #[test]
    fn dead_worker_loses_its_jobs_and_dead_letter_retry_resets_attempts() {
        let a = active(json!({}), Some("w"));
        assert!(worker_died(&a, now(), "other").is_none());
        let back = worker_died(&a, now(), "w").unwrap();
        assert_eq!(back.job.state, JobState::Available);
        assert_eq!(
            back.job.error.as_ref().unwrap().error_type.as_deref(),
            Some("worker_death")
        );

        let once = active(json!({"retry": {"max_attempts": 1}}), None);
        let dead = fail(&once, now(), None, &failure(true), false, 1.0).unwrap();
        assert!(retry_discarded(&a, now()).is_err());
        let again = retry_discarded(&dead, now()).unwrap();
        assert_eq!(
            (again.job.state, again.job.attempt),
            (JobState::Available, 0)
        );
        assert_eq!(again.dispatch, dead.dispatch + 1);
        assert_eq!(again.job.errors.len(), 1);
        assert!(again.job.error.is_none() && again.job.discarded_at.is_none());
    }

    #[test]
    fn waiting_jobs_expire_and_running_ones_do_not() {
        let soon = json!({"expires_at": "2026-02-12T10:30:01Z"});
        let later = now() + chrono::Duration::seconds(2);
        assert!(expire(&record(soon.clone()), now()).is_none(), "not yet");
        let gone = expire(&record(soon.clone()), later).unwrap();
        assert_eq!(
            (gone.job.state, gone.transition),
            (JobState::Discarded, Transition::Expired)
        );
        assert!(expire(&active(soon.clone(), None), later).is_none());
        assert!(expire(&record(json!({})), later).is_none());
        let retry = fail(&active(soon, None), now(), None, &failure(true), false, 1.0).unwrap();
        let promoted = promote(&retry, later, retry.dispatch).unwrap();
        assert_eq!(
            promoted.job.state,
            JobState::Discarded,
            "an expired retry is not run"
        );
    }

    #[test]
    fn cancel_rules() {
        let c = cancel(&record(json!({})), now()).unwrap().unwrap();
        assert_eq!(c.job.state, JobState::Cancelled);
        assert!(c.job.completed_at.is_none());
        assert_eq!(cancel(&c, now()).unwrap(), None);
        let active = active(json!({}), None);
        let done = complete(&active, now(), None, None).unwrap();
        assert_eq!(cancel(&done, now()).unwrap_err().code, ErrorCode::Conflict);
        let from_active = cancel(&active, now()).unwrap().unwrap();
        assert_eq!(from_active.job.attempt, 1);
        assert!(from_active.job.started_at.is_some());
    }

    #[test]
    fn bulk_retry_takes_discarded_and_retryable_jobs_and_refuses_the_rest() {
        let mut waiting = record(json!({}));
        waiting.job.state = JobState::Retryable;
        waiting.job.attempt = 2;
        waiting.job.next_attempt_at = Some(now() + chrono::Duration::hours(1));
        let next = retry_now(&waiting, now()).unwrap();
        assert_eq!(next.job.state, JobState::Available);
        assert_eq!(next.job.attempt, 2, "the attempt count is kept");
        assert_eq!(next.job.next_attempt_at, None);
        assert_eq!(
            next.dispatch,
            waiting.dispatch + 1,
            "the pending timer is stale"
        );

        let mut dead = record(json!({}));
        dead.job.state = JobState::Discarded;
        dead.job.attempt = 3;
        assert_eq!(retry_now(&dead, now()).unwrap().job.attempt, 0);

        for state in [JobState::Available, JobState::Active, JobState::Completed] {
            let mut rec = record(json!({}));
            rec.job.state = state;
            let err = retry_now(&rec, now()).unwrap_err();
            assert_eq!(err.code, ErrorCode::Conflict);
            assert_eq!(err.details["current_state"], state.as_str());
        }
    }

    #[test]
    fn only_finished_jobs_outside_workflows_can_be_deleted() {
        for (state, ok) in [
            (JobState::Completed, true),
            (JobState::Cancelled, true),
            (JobState::Discarded, true),
            (JobState::Available, false),
            (JobState::Active, false),
            (JobState::Retryable, false),
            (JobState::Scheduled, false),
            (JobState::Pending, false),
        ] {
            let mut rec = record(json!({}));
            rec.job.state = state;
            assert_eq!(check_deletable(&rec).is_ok(), ok, "{state}");
        }
        let mut member = record(json!({}));
        member.job.state = JobState::Completed;
        member.job.workflow_id = Some("wf".into());
        assert_eq!(
            check_deletable(&member).unwrap_err().code,
            ErrorCode::Conflict
        );
    }
}
