//! Durable timers: "look at this job (or worker) at T". Each timer is a message in the
//! timers stream; the coordinator leader holds those due within its horizon in memory, hands
//! later ones back to JetStream with a NAK delay, fires each when due and only then
//! acknowledges it. A new leader starts the feed over and sees every timer that was not
//! fired, so no timer is lost when a leader dies. Firing always re-reads the record and
//! decides from it, so a spare, early or stale timer does nothing. Here timers are stored;
//! the leader reads and fires them (`leader/timers.rs`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::message::PublishMessage;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::connection::Connection;
use super::deadline::{self, answered};
use super::error::backend;
use super::publish::Sent;
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::horizon;
use crate::domain::job::JobRecord;
use crate::domain::time;

/// The timers resource, as a caller holds it: the connection and what the resource owns.
#[derive(Clone)]
pub struct Timers {
    pub(super) conn: Arc<Connection>,
    pub(super) own: Arc<Owned>,
}

/// What the timers resource owns.
pub(super) struct Owned {
    /// PUSH's cap on pending timers is checked against this count.
    pub(super) count: TimerCount,
}

/// What a timer is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimerKind {
    /// A retryable or scheduled job becomes available.
    #[default]
    Promote,
    /// An active job's reservation or execution timeout runs out.
    Deadline,
    /// A worker that stopped heartbeating is declared dead; `id` is the worker id.
    Worker,
    /// A waiting job's `expires_at` passes.
    Expire,
    /// A workflow's creation or cancel should have finished; `id` is the workflow id.
    Workflow,
    /// A batch PUSH should have finished; `id` is the batch id, `jobs` its job ids.
    Batch,
}

/// A due time for one dispatch (and attempt) of one job, or for one worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timer {
    pub id: String,
    #[serde(default)]
    pub kind: TimerKind,
    /// The dispatch the job had when the timer was set; a later one makes the timer stale.
    #[serde(default)]
    pub dispatch: u64,
    /// The attempt an execution deadline belongs to.
    #[serde(default)]
    pub attempt: u32,
    #[serde(with = "time::millis")]
    pub due: DateTime<Utc>,
    /// The jobs of a batch (`Batch` timers only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jobs: Vec<String>,
}

impl Timer {
    /// The timer that makes a waiting job available at `due`.
    pub fn promote(rec: &JobRecord, due: DateTime<Utc>) -> Timer {
        Timer {
            id: rec.job.id.clone(),
            kind: TimerKind::Promote,
            dispatch: rec.dispatch,
            attempt: rec.job.attempt,
            due,
            jobs: Vec::new(),
        }
    }

    /// A timer of a worker, workflow or batch (`id`), not of a job's dispatch.
    pub fn named(kind: TimerKind, id: &str, due: DateTime<Utc>) -> Timer {
        Timer {
            id: id.to_owned(),
            kind,
            dispatch: 0,
            attempt: 0,
            due,
            jobs: Vec::new(),
        }
    }

    /// The timer that discards a job still waiting at `due`.
    pub fn expire(rec: &JobRecord, due: DateTime<Utc>) -> Timer {
        Timer {
            kind: TimerKind::Expire,
            ..Timer::promote(rec, due)
        }
    }

    /// The timer that checks an active job's deadlines at `due`.
    pub fn deadline(rec: &JobRecord, due: DateTime<Utc>) -> Timer {
        Timer {
            kind: TimerKind::Deadline,
            ..Timer::promote(rec, due)
        }
    }

    /// Whether the leader reads this timer's job record ahead of its due time (§3.5):
    /// promote and expire timers, whose records as a rule nothing else writes meanwhile.
    pub fn reads_ahead(&self) -> bool {
        matches!(self.kind, TimerKind::Promote | TimerKind::Expire)
    }
}

/// How long a timer count read from the stream is used for PUSH's cap check.
const TIMER_COUNT_TTL: Duration = Duration::from_secs(1);
/// How long a PUSH waits to refresh an outdated timer count before it uses the outdated one.
const STALE_COUNT_WAIT: Duration = Duration::from_secs(1);

/// The timers stream's message count, as last read.
#[derive(Default)]
pub(super) struct TimerCount(Mutex<Option<(Instant, u64)>>);

impl Timers {
    /// Publishes a timer. Callers await its acknowledgement before the write that needs it,
    /// so a waiting job always has its timer.
    pub(super) async fn send_timer(&self, timer: &Timer) -> Result<Sent, OjsError> {
        let body = serde_json::to_vec(timer).expect("timers serialize");
        self.conn
            .send(
                self.conn.topology.timers_subject().into(),
                // No Nats-Msg-Id: a spare timer is harmless (firing re-reads the record), a
                // dropped one would strand the job.
                PublishMessage::build().payload(body.into()),
                "publishing a timer",
            )
            .await
    }
}

impl Timers {
    /// Refuses `adding` client timers that would take the pending timers past
    /// `max_pending_timers`. One stream info per second at most, whatever the PUSH rate.
    ///
    /// # Errors
    /// 429 `queue_full` (`horizon::admit`), or `backend_error` when the count cannot be read.
    pub(super) async fn admit_timers(&self, adding: u64) -> Result<(), OjsError> {
        if adding == 0 {
            return Ok(());
        }
        let cached = *self.own.count.0.lock().expect("timer count lock");
        let refreshed = match cached {
            Some((read, count)) if read.elapsed() < TIMER_COUNT_TTL => {
                return horizon::admit(count, adding, self.conn.max_pending_timers)
            }
            // The cap bounds memory, not an exact count: while the stream's leader is being
            // elected, the count last read serves rather than holding the PUSH up.
            Some((_, count)) => {
                match deadline::patient(STALE_COUNT_WAIT, self.timers_stored()).await {
                    Err(err) if err.code == ErrorCode::BackendUnavailable => {
                        return horizon::admit(count, adding, self.conn.max_pending_timers)
                    }
                    other => other?,
                }
            }
            None => self.timers_stored().await?,
        };
        *self.own.count.0.lock().expect("timer count lock") = Some((Instant::now(), refreshed));
        horizon::admit(refreshed, adding, self.conn.max_pending_timers)
    }

    /// Timers in the timers stream: stored and not yet fired.
    pub(super) async fn timers_stored(&self) -> Result<u64, OjsError> {
        let doing = "reading the timers stream";
        let name = self.conn.topology.timers_stream();
        let stream = answered(doing, || self.conn.js.get_stream(&name))
            .await?
            .said
            .map_err(backend(doing))?;
        Ok(stream.cached_info().state.messages)
    }
}
