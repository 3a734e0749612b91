//! The job envelope as stored and returned (core §5, HTTP binding §9.3), and the record the
//! store keeps around it: the envelope plus what any replica needs to act on the job later.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::retry::RetryPolicy;
use super::state::JobState;
use super::time;

/// The envelope version this server writes (core §5.1).
pub const SPEC_VERSION: &str = "1.0.0-rc.1";

/// A job: client attributes, effective options (flattened, HTTP binding §9.3) and system
/// fields. Fields without a value are omitted, never `null` (JSON format §14.2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub specversion: String,
    pub id: String,
    #[serde(rename = "type")]
    pub job_type: String,
    pub queue: String,
    pub args: Vec<Value>,
    #[serde(default)]
    pub meta: Map<String, Value>,
    pub priority: i32,
    pub state: JobState,
    pub attempt: u32,
    pub max_attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visibility_timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<Vec<String>>,
    pub retry: RetryPolicy,
    /// The unique-job policy as sent (`domain/unique.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unique: Option<Value>,
    /// The rate limit as sent; PUSH makes it its queue's (`domain/rate_limit.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    /// Absolute RFC 3339; a client's absolute value is kept verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_at: Option<String>,
    /// Kept verbatim as the client sent it (JSON format §5.3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    #[serde(with = "time::millis")]
    pub created_at: DateTime<Utc>,
    #[serde(
        default,
        with = "time::opt_millis",
        skip_serializing_if = "Option::is_none"
    )]
    pub enqueued_at: Option<DateTime<Utc>>,
    #[serde(
        default,
        with = "time::opt_millis",
        skip_serializing_if = "Option::is_none"
    )]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(
        default,
        with = "time::opt_millis",
        skip_serializing_if = "Option::is_none"
    )]
    pub completed_at: Option<DateTime<Utc>>,
    #[serde(
        default,
        with = "time::opt_millis",
        skip_serializing_if = "Option::is_none"
    )]
    pub cancelled_at: Option<DateTime<Utc>>,
    #[serde(
        default,
        with = "time::opt_millis",
        skip_serializing_if = "Option::is_none"
    )]
    pub discarded_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<JobError>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<JobError>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_delay_ms: Option<u64>,
    #[serde(
        default,
        with = "time::opt_millis",
        skip_serializing_if = "Option::is_none"
    )]
    pub next_attempt_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_id: Option<String>,
    /// Progress of the current attempt, 0 to 1 (progress spec §5; `progress.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_data: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_message: Option<String>,
    #[serde(
        default,
        with = "time::opt_millis",
        skip_serializing_if = "Option::is_none"
    )]
    pub progress_updated_at: Option<DateTime<Utc>>,
    /// The workflow the job belongs to (workflows spec §7.1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_id: Option<String>,
    /// Results of the workflow members before it, set when the workflow starts it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_results: Option<Value>,
    /// Option keys this server does not know, preserved (JSON format §14.3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<Map<String, Value>>,
    /// Unknown top-level fields, preserved and echoed (core §5.3).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Job {
    /// When a finished job finished; `None` while it has not.
    pub fn finished_at(&self) -> Option<DateTime<Utc>> {
        match self.state {
            JobState::Completed => self.completed_at,
            JobState::Cancelled => self.cancelled_at,
            JobState::Discarded => self.discarded_at,
            _ => None,
        }
    }

    /// The error reported at `attempt`: the latest, else the history's entry (which keeps at
    /// least the last ten).
    pub fn error_at(&self, attempt: u32) -> Option<&JobError> {
        self.error
            .as_ref()
            .filter(|e| e.attempt == attempt)
            .or_else(|| self.errors.iter().rev().find(|e| e.attempt == attempt))
    }
}

/// A structured failure (core §8, errors spec §6.1): the latest in `error`, all in `errors`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobError {
    pub code: String,
    pub message: String,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub error_type: Option<String>,
    pub retryable: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backtrace: Option<Value>,
    pub attempt: u32,
    #[serde(with = "time::millis")]
    pub occurred_at: DateTime<Utc>,
}

/// Who holds an active job and how to settle its queue message from any replica.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Holder {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_id: Option<String>,
    /// The JetStream reply subject of the delivered message: publishing an ack to it from
    /// any connection settles the message.
    pub ack_subject: String,
    /// The message's stream sequence: a redelivery of it carries the same one, a second
    /// message for the same dispatch (a repeated publish) does not.
    pub sequence: u64,
    #[serde(with = "time::millis")]
    pub visible_until: DateTime<Utc>,
    /// When the holder last sent a heartbeat naming this job.
    #[serde(
        default,
        with = "time::opt_millis",
        skip_serializing_if = "Option::is_none"
    )]
    pub last_beat: Option<DateTime<Utc>>,
    /// The sequence of the job's message in its queue's concurrency stream, while it runs
    /// under a concurrency limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<u64>,
    /// The reservation the claim gave, in milliseconds: a heartbeat that asks for none
    /// extends by it (the JavaScript OJS client's beats carry no timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visibility_ms: Option<u64>,
}

/// What the write that produced a record did; the events of that write follow from it alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transition {
    /// Created (available, scheduled or pending).
    Created,
    /// `pending → available` by ACTIVATE.
    Activated,
    /// `available → active` by FETCH.
    Started,
    /// `active → completed` by ACK.
    Completed,
    /// `active → retryable | discarded` by FAIL.
    Failed,
    /// `active → available` by FAIL with `requeue`, or a lapsed reservation.
    Requeued,
    /// `retryable | scheduled → available` when its time came.
    Promoted,
    Cancelled,
    /// The holder's message was redelivered; only the ack subject changed.
    Redelivered,
    /// A worker heartbeat extended the reservation.
    Heartbeat,
    /// A worker reported progress, which also extended the reservation.
    Progressed,
    /// `discarded → available` by an operator's dead-letter retry.
    Retried,
    /// `scheduled | available | retryable → discarded`: `expires_at` passed before it ran.
    Expired,
    /// `available → discarded`: the oldest waiting job of a full queue whose bound drops
    /// the oldest for a newer one (`backpressure.rs`).
    Dropped,
    /// A waiting job's priority changed (priority spec §8.1); its state did not.
    Reprioritized,
}

/// The value kept in the jobs bucket under the job id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub job: Job,
    /// Generation of the queue message allowed to claim this job: each time the job becomes
    /// `available` a message with a new generation is published, and older ones are stale.
    pub dispatch: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<Holder>,
    pub transition: Transition,
    /// Stream sequence of this job's dead-letter entry, while it is in the dead letter queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<u64>,
    /// Earlier writes of this job the event publisher may not have handled yet (`trail.rs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trail: Vec<Step>,
    /// Its place in its workflow (`job.workflow_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<Slot>,
    /// The state the write of this record left (none for the creation): what the queue
    /// statistics count it from (`domain/stats.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<JobState>,
    /// The batch PUSH that created it, whose mark says whether it counts
    /// (`domain/batch.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<String>,
    /// The sequence of the job's depth token in its bounded queue's depth stream, from its
    /// PUSH (or dead-letter retry) until it finishes (`domain/backpressure.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth_token: Option<u64>,
}

impl JobRecord {
    /// The record a job is created with (its first dispatch if it starts available).
    pub fn created(job: Job, slot: Option<Slot>) -> JobRecord {
        JobRecord {
            dispatch: u64::from(job.state == JobState::Available),
            holder: None,
            transition: Transition::Created,
            dead_letter: None,
            trail: Vec::new(),
            slot,
            from: None,
            batch: None,
            depth_token: None,
            job,
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a job record always serializes")
    }
}

/// One write of a job record, as much of it as its events need beyond what every later
/// record of the job still says (id, type, queue, creation, priority, errors by attempt).
/// Short field names: a record carries several.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// The write's revision in the jobs bucket, which also fixes its event ids.
    #[serde(rename = "r")]
    pub revision: u64,
    #[serde(rename = "t")]
    pub transition: Transition,
    /// The job's state after the write.
    #[serde(rename = "s")]
    pub state: JobState,
    /// When the transition happened: the time of its events.
    #[serde(rename = "at", with = "time::millis")]
    pub at: DateTime<Utc>,
    #[serde(rename = "a")]
    pub attempt: u32,
    /// The worker that started the attempt (`started`) or beat (`heartbeat`).
    #[serde(rename = "w", default, skip_serializing_if = "Option::is_none")]
    pub worker_id: Option<String>,
    /// `visible_until` of a heartbeat, the next attempt's time of a retry.
    #[serde(
        rename = "u",
        default,
        with = "time::opt_millis",
        skip_serializing_if = "Option::is_none"
    )]
    pub until: Option<DateTime<Utc>>,
    /// The job's state before the write, for the queue statistics.
    #[serde(rename = "f", default, skip_serializing_if = "Option::is_none")]
    pub from: Option<JobState>,
}

/// A job's or nested workflow's place in its workflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Slot {
    Member(usize),
    Callback(Callback),
}

/// A batch's callbacks, in the order they are listed and fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Callback {
    OnComplete,
    OnSuccess,
    OnFailure,
}

/// A UUIDv7 whose time is `at` and whose random bits are a hash of `seed`: the same seed and
/// time always give the same id. Event ids and cron tick job ids use it, so that redoing the
/// same work after a crash is recognised as a repeat (events seed §2.3).
pub fn stable_uuid(seed: &str, at: DateTime<Utc>) -> uuid::Uuid {
    let a = fnv1a(seed.as_bytes(), 0xcbf2_9ce4_8422_2325);
    let b = fnv1a(seed.as_bytes(), a ^ 0x9e37_79b9_7f4a_7c15);
    let mut bytes = [0u8; 10];
    bytes[..8].copy_from_slice(&a.to_be_bytes());
    bytes[8..].copy_from_slice(&b.to_be_bytes()[..2]);
    uuid::Builder::from_unix_timestamp_millis(at.timestamp_millis().max(0) as u64, &bytes)
        .into_uuid()
}

pub(crate) fn fnv1a(data: &[u8], seed: u64) -> u64 {
    data.iter().fold(seed, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
