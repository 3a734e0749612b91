//! The timer scheduler's side of the timers stream: reading it in due order, firing what is
//! due (promotions, retries, expiries, deadlines, batch, workflow and worker timers) and
//! arming the deadlines of jobs the event publisher sees start.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy, PullConsumer};
use async_nats::jetstream::AckKind;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use tracing::{info, warn};

use super::{taken_over, Leader};
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::job::JobRecord;
use crate::domain::lifecycle::{self, Deadline};
use crate::store::cas::{self, Replica};
use crate::store::connection::Connection;
use crate::store::error::{backend, consumer_missing, nats_failed};
use crate::store::feed::{self, Deliveries};
use crate::store::jobs::records::{found, Lookup, ORPHAN_GRACE};
use crate::store::timers::{Timer, TimerKind};
use crate::store::topology::Topology;

/// The scheduler consumer's bound on unacknowledged timers; `max_pending_timers` stays
/// below it (`config::MAX_PENDING_TIMERS_LIMIT`).
pub const MAX_ACK_PENDING: i64 = 10_000_000;

/// A job record read ahead of its timer's due time. The firing's first compare-and-set uses
/// it instead of a read; like a remembered record (§3.12) it only ever decides a write, so a
/// record changed meanwhile costs a refused write and a read, nothing else.
pub struct ReadAhead {
    pub(super) record: JobRecord,
    pub(super) revision: u64,
    bytes: usize,
}

impl ReadAhead {
    /// The size of the record as stored, for the leader's bound on what it keeps.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// How long a delivered timer waits for its acknowledgement before NATS delivers it again:
/// twice the horizon (a timer is held at most until it is due, within the horizon) plus
/// 5 s. A timer delivered to a leader that stopped without firing it (its pull outlived its
/// leadership and met the consumer its successor recreated by the same name) so comes back
/// within minutes; a redelivery to the leader that holds it only renews its reply subject
/// (`PendingTimer::redelivered`), and one of a timer firing meanwhile fires as a no-op.
pub fn timer_ack_wait(horizon_ms: u64) -> Duration {
    Duration::from_millis(2 * horizon_ms) + Duration::from_secs(5)
}

/// What firing a timer came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Firing {
    /// Done (or nothing to do): acknowledge the timer.
    Fired,
    /// Its record does not show the write that stored the timer yet: fire it again shortly.
    NotYet,
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

/// The leader's feed of pending timers.
pub struct TimerFeed {
    messages: futures::stream::BoxStream<
        'static,
        Result<async_nats::jetstream::Message, pull::MessagesError>,
    >,
    deliveries: Deliveries,
    /// The feed's consumer, for the deliveries it counts when the feed is quiet.
    consumer: PullConsumer,
    /// When to read the consumer's deliveries next, unless a timer arrives first.
    probe_at: tokio::time::Instant,
    conn: Arc<Connection>,
}

/// How long the timer feed stays quiet before its consumer's deliveries are read: a
/// delivery lost with none after it is found at the second such probe.
const QUIET_PROBE: Duration = Duration::from_secs(2);

impl TimerFeed {
    /// The next pending timer; `None` when the feed ended, or when a delivery was lost on
    /// the way (its consumer is then made again, which delivers every pending timer anew).
    ///
    /// A delivery in flight when the reader's connection or the consumer's leader goes down
    /// is lost, and counts as pending until the AckWait (over two minutes): a retry's
    /// timer so lost once held its job past a rolling restart's drain. The next delivery
    /// shows the gap; with none after it, the consumer's count of deliveries does, read
    /// while the feed is quiet. The probe's time is kept across calls, since the scheduler
    /// drops this future whenever something else wakes it first.
    pub async fn next(&mut self) -> Option<PendingTimer> {
        loop {
            let item = tokio::select! {
                item = self.messages.next() => item?,
                _ = tokio::time::sleep_until(self.probe_at) => {
                    self.probe_at = tokio::time::Instant::now() + QUIET_PROBE;
                    if self.lost_while_quiet().await {
                        return None;
                    }
                    continue;
                }
            };
            self.probe_at = tokio::time::Instant::now() + QUIET_PROBE;
            let msg = match item {
                Ok(msg) => msg,
                Err(err) => {
                    warn!(error = %err, "timer feed error");
                    continue;
                }
            };
            let Some(reply) = msg.reply.as_ref() else {
                continue;
            };
            let Ok((sequence, delivery, published)) = msg
                .info()
                .map(|info| (info.stream_sequence, info.consumer_sequence, info.published))
            else {
                continue;
            };
            if self.conn.loses("timers.delivered") {
                continue;
            }
            let lost = self.deliveries.lost_before(delivery);
            if lost > 0 {
                warn!(
                    lost,
                    "timer deliveries were lost on the way; reading every pending timer again"
                );
                return None;
            }
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

    /// Whether the consumer's count of deliveries, read now, says some never arrived. A
    /// failed read (NATS electing the consumer's leader) says nothing.
    async fn lost_while_quiet(&mut self) -> bool {
        let Ok(info) = self.consumer.get_info().await else {
            return false;
        };
        let lost = self.deliveries.quiet(info.delivered.consumer_sequence);
        if lost > 0 {
            warn!(
                lost,
                "the last timer deliveries were lost on the way; reading every pending timer again"
            );
        }
        lost > 0
    }
}

impl Leader {
    /// Stores deadline timers (from the leader's deadline watch), all acknowledged.
    ///
    /// # Errors
    /// When one is not stored; publishing them all again is harmless.
    pub async fn arm_deadlines(&self, timers: &[Timer]) -> Result<(), OjsError> {
        let mut sent = Vec::with_capacity(timers.len());
        for timer in timers {
            sent.push(self.timers.send_timer(timer).await?);
        }
        self.conn.all_stored(sent).await
    }

    /// Opens the timer feed of the leadership `term` from the start. Its consumer
    /// (`scheduler-<term>`) is made once every consumer of it and of earlier leaderships is
    /// gone, so every timer not yet acknowledged — including those an earlier leader held —
    /// is delivered again, and a pull request an earlier leader's feed still has open meets
    /// no consumer. The timers stream is a work queue, which allows one consumer: while a
    /// later leadership's exists, this one refuses to go on, and could not make its own.
    ///
    /// # Errors
    /// When NATS fails, or a later leadership fires the timers.
    pub async fn timer_feed(&self, term: u64) -> Result<TimerFeed, OjsError> {
        let t = &self.conn.topology;
        let stream = self
            .conn
            .js
            .get_stream(t.timers_stream())
            .await
            .map_err(backend("opening the timers stream"))?;
        let gone = taken_over(&stream, term, Topology::scheduler_term, "fires the timers").await?;
        // Only once each is known gone is the consumer created: were a delete lost (a NATS
        // election), the create would fail beside the old consumer, or (the same name)
        // return it, whose timers the previous leader holds unacknowledged until its
        // AckWait.
        for (_, name) in gone {
            match stream.delete_consumer(&name).await {
                Ok(_) => {}
                Err(err) if consumer_missing(&err) => {}
                Err(err) => return Err(nats_failed("removing an earlier timer consumer", err)),
            }
        }
        let consumer: PullConsumer = stream
            .create_consumer(pull::Config {
                durable_name: Some(Topology::scheduler_consumer(term)),
                ack_policy: AckPolicy::Explicit,
                deliver_policy: DeliverPolicy::All,
                ack_wait: timer_ack_wait(self.conn.timer_horizon_ms),
                max_ack_pending: MAX_ACK_PENDING,
                num_replicas: t.replicas,
                ..Default::default()
            })
            .await
            .map_err(backend("creating the timer consumer"))?;
        let messages = feed::renewed(consumer.clone(), "timers")
            .await
            .map_err(backend("reading timers"))?;
        Ok(TimerFeed {
            messages,
            deliveries: Deliveries::after(0),
            consumer,
            probe_at: tokio::time::Instant::now() + QUIET_PROBE,
            conn: self.conn.clone(),
        })
    }

    /// Fires a due timer. Stale timers, and timers of jobs that no longer exist (an admin
    /// reset), do nothing.
    ///
    /// A promote or expire timer is stored before the write that needs it, which may land
    /// later than the timer comes due (it waits out an election). Younger than
    /// `ORPHAN_GRACE`, such a timer whose record does not show that write yet — no record,
    /// or a promote timer's job still running the attempt whose failure set it — is
    /// `NotYet`, to be fired again a moment later; older, that write never landed, and the
    /// timer is spent.
    ///
    /// # Errors
    /// When NATS fails; the timer stays pending and is fired again later.
    pub async fn fire_timer(
        &self,
        pending: &PendingTimer,
        ahead: Option<ReadAhead>,
    ) -> Result<Firing, OjsError> {
        let timer = &pending.timer;
        let ahead = ahead.map(|a| (a.record, a.revision));
        // The state the last read showed, when it was behind the write that stored the timer.
        let behind = Mutex::new(None);
        let fired = match timer.kind {
            TimerKind::Promote => self
                .jobs
                .transition_from(&timer.id, ahead, |rec, now| {
                    *behind.lock().expect("behind lock") =
                        lifecycle::behind_timer(rec, timer.dispatch, timer.attempt)
                            .then_some(rec.job.state);
                    Ok(lifecycle::promote(rec, now, timer.dispatch))
                })
                .await
                .map(drop),
            TimerKind::Deadline => self.fire_deadline(timer).await,
            TimerKind::Worker => self.workers.worker_expired(&timer.id).await,
            TimerKind::Workflow => self.workflow_timer_fired(&timer.id).await,
            TimerKind::Batch => self.jobs.batch_timer_fired(timer).await,
            TimerKind::Expire => self
                .jobs
                .transition_from(&timer.id, ahead, |rec, now| Ok(lifecycle::expire(rec, now)))
                .await
                .map(drop),
        };
        let awaits_its_write = matches!(timer.kind, TimerKind::Promote | TimerKind::Expire)
            && Utc::now() - pending.stored_at
                < chrono::Duration::from_std(ORPHAN_GRACE).expect("small");
        let behind = behind.into_inner().expect("behind lock");
        match fired {
            Ok(()) => match behind {
                Some(state) if awaits_its_write => {
                    info!(
                        job_id = %timer.id,
                        state = state.as_str(),
                        dispatch = timer.dispatch,
                        attempt = timer.attempt,
                        "a job's record does not show the write that stored its timer yet; firing it again"
                    );
                    Ok(Firing::NotYet)
                }
                _ => Ok(Firing::Fired),
            },
            Err(err) if err.code == ErrorCode::NotFound => Ok(if awaits_its_write {
                Firing::NotYet
            } else {
                Firing::Fired
            }),
            Err(err) => Err(err),
        }
    }

    /// An active job's deadline: fail it (execution timeout) or return it to the queue
    /// (lapsed reservation); if a heartbeat moved the deadline, set a timer for the new one.
    async fn fire_deadline(&self, timer: &Timer) -> Result<(), OjsError> {
        let later = Mutex::new(None);
        let jitter = rand::random_range(0.5..1.5);
        let default_timeout = self.conn.execution_timeout;
        let settled = self
            .jobs
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
        self.jobs.release(&settled).await;
        let later = *later.lock().expect("deadline lock");
        if let Some(due) = later {
            self.conn
                .stored(
                    self.timers
                        .send_timer(&Timer::deadline(&settled.after, due))
                        .await?,
                )
                .await?;
        }
        Ok(())
    }

    /// Reads the job record `timer` will change, ahead of its due time; `None` for other
    /// kinds of timer, a job that is gone, or a read that failed (the firing reads then).
    pub async fn read_ahead(&self, timer: &Timer) -> Option<ReadAhead> {
        if !timer.reads_ahead() {
            return None;
        }
        let last = cas::last(
            &self.jobs.own.kv,
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
        let client = self.conn.js.client();
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
        self.conn
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
        self.conn.timer_horizon_ms
    }
}
