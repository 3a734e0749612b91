//! Durable timers: "look at this job (or worker) at T". Each timer is a message in the
//! timers stream; the coordinator leader holds those due within its horizon in memory, hands
//! later ones back to JetStream with a NAK delay, fires each when due and only then
//! acknowledges it. A new leader starts the feed over and sees every timer that was not
//! fired, so no timer is lost when a leader dies. Firing always re-reads the record and
//! decides from it, so a spare, early or stale timer does nothing.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy, PullConsumer};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::AckKind;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::cas::{self, Replica};
use super::deadline::{self, answered};
use super::error::{backend, consumer_missing, nats_failed};
use super::publish::Sent;
use super::records::{found, Lookup, ORPHAN_GRACE};
use super::Store;
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::horizon;
use crate::domain::job::JobRecord;
use crate::domain::lifecycle::{self, Deadline};
use crate::domain::time;

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

/// A job record read ahead of its timer's due time. The firing's first compare-and-set uses
/// it instead of a read; like a remembered record (§3.12) it only ever decides a write, so a
/// record changed meanwhile costs a refused write and a read, nothing else.
pub struct ReadAhead {
    record: JobRecord,
    revision: u64,
    bytes: usize,
}

impl ReadAhead {
    /// The size of the record as stored, for the leader's bound on what it keeps.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// The leader's feed of pending timers.
pub struct TimerFeed {
    messages: futures::stream::BoxStream<
        'static,
        Result<async_nats::jetstream::Message, pull::MessagesError>,
    >,
}

/// A timer read from the feed; acknowledge it once fired.
///
/// Keeps a copy of the delivery's reply subject rather than the message: a received payload
/// shares its allocation with everything else read from the connection at the time, so
/// holding messages until they are due would keep all of that alive too (gateway RSS
/// +122 MB against +39 MB with 100,000 timers pending, `bench --scenarios timers`).
pub struct PendingTimer {
    pub timer: Timer,
    /// The timer's sequence in the timers stream: the same on every redelivery.
    pub sequence: u64,
    /// When NATS stored it.
    stored_at: DateTime<Utc>,
    ack_subject: String,
}

impl PendingTimer {
    /// Takes over a redelivery's reply subject: only the latest delivery's ack settles the
    /// message.
    pub fn redelivered(&mut self, again: PendingTimer) {
        self.ack_subject = again.ack_subject;
    }
}

/// The scheduler consumer's bound on unacknowledged timers; `max_pending_timers` stays
/// below it (`config::MAX_PENDING_TIMERS_LIMIT`).
pub const MAX_ACK_PENDING: i64 = 10_000_000;

/// How long a timer count read from the stream is used for PUSH's cap check.
const TIMER_COUNT_TTL: Duration = Duration::from_secs(1);
/// How long a PUSH waits to refresh an outdated timer count before it uses the outdated one.
const STALE_COUNT_WAIT: Duration = Duration::from_secs(1);

/// The timers stream's message count, as last read.
#[derive(Default)]
pub(super) struct TimerCount(Mutex<Option<(Instant, u64)>>);

impl Store {
    /// Publishes a timer. Callers await its acknowledgement before the write that needs it,
    /// so a waiting job always has its timer.
    pub(super) async fn send_timer(&self, timer: &Timer) -> Result<Sent, OjsError> {
        let body = serde_json::to_vec(timer).expect("timers serialize");
        self.send(
            self.inner.topology.timers_subject().into(),
            // No Nats-Msg-Id: a spare timer is harmless (firing re-reads the record), a
            // dropped one would strand the job.
            PublishMessage::build().payload(body.into()),
            "publishing a timer",
        )
        .await
    }

    /// Stores deadline timers (from the leader's deadline watch), all acknowledged.
    ///
    /// # Errors
    /// When one is not stored; publishing them all again is harmless.
    pub async fn arm_deadlines(&self, timers: &[Timer]) -> Result<(), OjsError> {
        let mut sent = Vec::with_capacity(timers.len());
        for timer in timers {
            sent.push(self.send_timer(timer).await?);
        }
        self.all_stored(sent).await
    }

    /// Opens the timer feed from the start: the consumer is recreated, so every timer not
    /// yet acknowledged — including ones a previous leader held — is delivered again.
    ///
    /// # Errors
    /// When the consumer cannot be created.
    pub async fn timer_feed(&self) -> Result<TimerFeed, OjsError> {
        let t = &self.inner.topology;
        let stream = self
            .inner
            .js
            .get_stream(t.timers_stream())
            .await
            .map_err(backend("opening the timers stream"))?;
        // Only a consumer known gone may be created again: were the delete lost (a NATS
        // election), the create would return the old consumer, whose timers the previous
        // leader holds unacknowledged for its 24 h AckWait.
        match stream.delete_consumer(&t.scheduler_consumer()).await {
            Ok(_) => {}
            Err(err) if consumer_missing(&err) => {}
            Err(err) => return Err(nats_failed("removing the old timer consumer", err)),
        }
        let consumer: PullConsumer = stream
            .create_consumer(pull::Config {
                durable_name: Some(t.scheduler_consumer()),
                ack_policy: AckPolicy::Explicit,
                deliver_policy: DeliverPolicy::All,
                // Held until fired; a new leader recreates the consumer instead of waiting.
                ack_wait: Duration::from_secs(24 * 3600),
                max_ack_pending: MAX_ACK_PENDING,
                num_replicas: t.replicas,
                ..Default::default()
            })
            .await
            .map_err(backend("creating the timer consumer"))?;
        let messages = consumer
            .messages()
            .await
            .map_err(backend("reading timers"))?;
        Ok(TimerFeed {
            messages: messages.boxed(),
        })
    }

    /// Fires a due timer. Stale timers, and timers of jobs that no longer exist (an admin
    /// reset), do nothing.
    ///
    /// # Errors
    /// When NATS fails; the timer stays pending and is fired again later.
    ///
    /// # Errors
    /// `not_found` for a promote or expire timer younger than `ORPHAN_GRACE` whose record
    /// is not written yet (its PUSH is still under way): to be fired again a moment later.
    /// Otherwise when NATS fails.
    pub async fn fire(
        &self,
        pending: &PendingTimer,
        ahead: Option<ReadAhead>,
    ) -> Result<(), OjsError> {
        let timer = &pending.timer;
        let ahead = ahead.map(|a| (a.record, a.revision));
        let fired = match timer.kind {
            TimerKind::Promote => self
                .transition_from(&timer.id, ahead, |rec, now| {
                    Ok(lifecycle::promote(rec, now, timer.dispatch))
                })
                .await
                .map(drop),
            TimerKind::Deadline => self.fire_deadline(timer).await,
            TimerKind::Worker => self.worker_expired(&timer.id).await,
            TimerKind::Workflow => self.workflow_timer_fired(&timer.id).await,
            TimerKind::Batch => self.batch_timer_fired(timer).await,
            TimerKind::Expire => self
                .transition_from(&timer.id, ahead, |rec, now| Ok(lifecycle::expire(rec, now)))
                .await
                .map(drop),
        };
        let awaits_its_record = matches!(timer.kind, TimerKind::Promote | TimerKind::Expire)
            && Utc::now() - pending.stored_at
                < chrono::Duration::from_std(ORPHAN_GRACE).expect("small");
        match fired {
            Err(err) if err.code == ErrorCode::NotFound && !awaits_its_record => Ok(()),
            other => other,
        }
    }

    /// An active job's deadline: fail it (execution timeout) or return it to the queue
    /// (lapsed reservation); if a heartbeat moved the deadline, set a timer for the new one.
    async fn fire_deadline(&self, timer: &Timer) -> Result<(), OjsError> {
        let later = Mutex::new(None);
        let jitter = rand::random_range(0.5..1.5);
        let default_timeout = self.inner.execution_timeout;
        let settled = self
            .transition(&timer.id, |rec, now| {
                Ok(
                    match lifecycle::on_deadline(
                        rec,
                        now,
                        timer.dispatch,
                        timer.attempt,
                        default_timeout,
                        jitter,
                    ) {
                        Deadline::Expired(next) => Some(*next),
                        Deadline::NotYet(due) => {
                            *later.lock().expect("deadline lock") = Some(due);
                            None
                        }
                        Deadline::Stale => None,
                    },
                )
            })
            .await?;
        self.release(&settled).await;
        let later = *later.lock().expect("deadline lock");
        if let Some(due) = later {
            self.stored(
                self.send_timer(&Timer::deadline(&settled.after, due))
                    .await?,
            )
            .await?;
        }
        Ok(())
    }
}

impl TimerFeed {
    /// The next pending timer; `None` when the feed ended.
    pub async fn next(&mut self) -> Option<PendingTimer> {
        loop {
            let msg = match self.messages.next().await? {
                Ok(msg) => msg,
                Err(err) => {
                    warn!(error = %err, "timer feed error");
                    continue;
                }
            };
            let Some(reply) = msg.reply.as_ref() else {
                continue;
            };
            let Ok((sequence, published)) = msg
                .info()
                .map(|info| (info.stream_sequence, info.published))
            else {
                continue;
            };
            let stored_at = DateTime::from_timestamp_nanos(published.unix_timestamp_nanos() as i64);
            match serde_json::from_slice::<Timer>(&msg.payload) {
                Ok(timer) => {
                    return Some(PendingTimer {
                        timer,
                        sequence,
                        stored_at,
                        ack_subject: reply.to_string(),
                    })
                }
                Err(err) => {
                    warn!(error = %err, "dropping an unreadable timer");
                    let _ = msg.ack().await;
                }
            }
        }
    }
}

impl Store {
    /// Reads the job record `timer` will change, ahead of its due time; `None` for other
    /// kinds of timer, a job that is gone, or a read that failed (the firing reads then).
    pub async fn read_ahead(&self, timer: &Timer) -> Option<ReadAhead> {
        if !timer.reads_ahead() {
            return None;
        }
        let last = cas::last(
            &self.inner.jobs,
            &timer.id,
            Replica::Nearest,
            "reading a job ahead of its timer",
        )
        .await
        .ok()??;
        let bytes = last.value.as_ref()?.len();
        match found(&timer.id, last.value.as_deref(), last.revision).ok()? {
            Lookup::Found(record, revision) => Some(ReadAhead {
                record: *record,
                revision,
                bytes,
            }),
            Lookup::Removed | Lookup::Missing => None,
        }
    }

    /// Removes a fired timer from the stream.
    pub async fn timer_done(&self, timer: PendingTimer) {
        let client = self.inner.js.client();
        if let Err(err) = client.publish(timer.ack_subject, Bytes::new()).await {
            warn!(error = %err, "could not acknowledge a fired timer");
        }
    }

    /// Hands a timer back to JetStream, to be delivered again after `delay` (a NAK with a
    /// delay, confirmed by the server).
    ///
    /// # Errors
    /// When the server does not confirm it; the caller keeps the timer then.
    pub async fn hand_back(&self, timer: &PendingTimer, delay: Duration) -> Result<(), OjsError> {
        self.inner
            .js
            .client()
            .request(
                timer.ack_subject.clone(),
                Bytes::from(AckKind::Nak(Some(delay))),
            )
            .await
            .map(drop)
            .map_err(backend("handing a timer back"))
    }

    /// How many timers the leader may hold in memory ahead of their due time, in ms.
    pub fn timer_horizon_ms(&self) -> u64 {
        self.inner.timer_horizon_ms
    }

    /// Refuses `adding` client timers that would take the pending timers past
    /// `max_pending_timers`. One stream info per second at most, whatever the PUSH rate.
    ///
    /// # Errors
    /// 429 `queue_full` (`horizon::admit`), or `backend_error` when the count cannot be read.
    pub(super) async fn admit_timers(&self, adding: u64) -> Result<(), OjsError> {
        if adding == 0 {
            return Ok(());
        }
        let cached = *self.inner.timer_count.0.lock().expect("timer count lock");
        let refreshed = match cached {
            Some((read, count)) if read.elapsed() < TIMER_COUNT_TTL => {
                return horizon::admit(count, adding, self.inner.max_pending_timers)
            }
            // The cap bounds memory, not an exact count: while the stream's leader is being
            // elected, the count last read serves rather than holding the PUSH up.
            Some((_, count)) => {
                let soon = deadline::current().min(tokio::time::Instant::now() + STALE_COUNT_WAIT);
                match deadline::within(soon, self.timers_stored()).await {
                    Err(err) if err.code == ErrorCode::BackendUnavailable => {
                        return horizon::admit(count, adding, self.inner.max_pending_timers)
                    }
                    other => other?,
                }
            }
            None => self.timers_stored().await?,
        };
        *self.inner.timer_count.0.lock().expect("timer count lock") =
            Some((Instant::now(), refreshed));
        horizon::admit(refreshed, adding, self.inner.max_pending_timers)
    }

    /// Timers in the timers stream: stored and not yet fired.
    pub(super) async fn timers_stored(&self) -> Result<u64, OjsError> {
        let doing = "reading the timers stream";
        let name = self.inner.topology.timers_stream();
        let stream = answered(doing, || self.inner.js.get_stream(&name))
            .await?
            .said
            .map_err(backend(doing))?;
        Ok(stream.cached_info().state.messages)
    }
}
