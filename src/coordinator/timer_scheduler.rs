//! Leader service: fires timers when they come due (retry backoff, scheduled jobs, expiry,
//! job deadlines, silent workers), driven by a timer heap, not by polling. Only timers due
//! within the horizon are held in memory, once each (keyed by stream sequence); later ones
//! are handed back to JetStream with a NAK delay and come back shortly before they are due
//! (architecture §3.5). The job records of promote and expire timers are read ahead of their
//! due time, so a firing is a publish and a compare-and-set. Firing runs concurrently so
//! thousands due at one instant finish together.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::progress::{Pulse, Round};
use crate::domain::error::OjsError;
use crate::domain::horizon::{self, Placement};
use crate::store::{Firing, PendingTimer, ReadAhead, Store, Timer, TimerFeed, TimerKind};
use crate::telemetry::metrics::Metrics;

/// Timers fired (or handed back) at once; each is a few NATS round trips.
const CONCURRENCY: usize = 256;

/// Fired timers are acknowledged this long after firing, so the acks of a burst (each a
/// delete in the timers stream) come after its firings rather than among them. A leader that
/// stops meanwhile leaves those timers to fire again as no-ops.
const ACK_DELAY: Duration = Duration::from_secs(1);

/// How soon a promotion held back by maintenance mode is looked at again.
const MAINTENANCE_RECHECK_MS: i64 = 2_000;

/// Records read ahead at once: fewer than firings, which come first.
const READ_AHEAD_CONCURRENCY: usize = 64;

/// Records read ahead and kept, or being read, at most; beyond, timers fire with a read.
const MAX_READ_AHEAD: usize = 20_000;

/// Bytes of records read ahead kept at most (records may be up to the bucket's message size).
const MAX_READ_AHEAD_BYTES: usize = 64 << 20;

pub struct TimerScheduler {
    store: Store,
    metrics: Metrics,
    /// The leadership it fires for; it reads the timers through that term's consumer.
    term: u64,
    /// Working from a firing's start until a firing succeeds: firings that all fail (NATS
    /// refusing every promotion, say) stall the leadership as a stuck loop would, though
    /// the loop itself goes on (architecture §3.10, stalls).
    firings: Pulse,
}

/// What the heap wakes the scheduler for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Wake {
    ReadAhead,
    Fire,
}

/// The timers held in memory: a heap of (ms, stream sequence, what for) over a map by
/// sequence, and the records read ahead for them. A heap entry whose sequence is no longer
/// in the map (fired) is skipped.
#[derive(Default)]
struct Held {
    heap: BinaryHeap<Reverse<(i64, u64, Wake)>>,
    timers: HashMap<u64, PendingTimer>,
    ahead: HashMap<u64, ReadAhead>,
    ahead_bytes: usize,
    /// Reads ahead sent and not yet back.
    reading: usize,
}

impl Held {
    fn hold(&mut self, due: i64, timer: PendingTimer, now: i64) {
        if timer.timer.reads_ahead() {
            if let Some(at) = horizon::read_ahead_at(due, now) {
                self.heap
                    .push(Reverse((at, timer.sequence, Wake::ReadAhead)));
            }
        }
        self.heap.push(Reverse((due, timer.sequence, Wake::Fire)));
        self.timers.insert(timer.sequence, timer);
    }

    /// Whether one more record may be read ahead.
    fn may_read_ahead(&self) -> bool {
        self.ahead.len() + self.reading < MAX_READ_AHEAD && self.ahead_bytes < MAX_READ_AHEAD_BYTES
    }

    /// Keeps a record read ahead for a timer still held, within the bounds.
    fn keep_ahead(&mut self, sequence: u64, ahead: ReadAhead) {
        if self.timers.contains_key(&sequence)
            && self.ahead_bytes + ahead.bytes() <= MAX_READ_AHEAD_BYTES
        {
            self.ahead_bytes += ahead.bytes();
            if let Some(replaced) = self.ahead.insert(sequence, ahead) {
                self.ahead_bytes -= replaced.bytes();
            }
        }
    }

    /// Takes a timer due now out, with its record read ahead if there is one.
    fn take(&mut self, sequence: u64) -> Option<(PendingTimer, Option<ReadAhead>)> {
        let timer = self.timers.remove(&sequence)?;
        let ahead = self.ahead.remove(&sequence);
        if let Some(a) = &ahead {
            self.ahead_bytes -= a.bytes();
        }
        Some((timer, ahead))
    }
}

/// The timer feed of one opening, with the timers held from it and the channels its
/// spawned work reports back on.
pub struct Feed {
    feed: TimerFeed,
    horizon: u64,
    held: Held,
    /// Firings and hand-backs under way at once.
    permits: Arc<Semaphore>,
    /// Reads ahead under way at once.
    read_permits: Arc<Semaphore>,
    /// Timers whose firing failed come back here to be tried again a second later.
    retry_tx: UnboundedSender<PendingTimer>,
    retries: UnboundedReceiver<PendingTimer>,
    /// Timers fired, acknowledged `ACK_DELAY` later.
    acks: UnboundedSender<(Instant, PendingTimer)>,
    /// Timers the server did not take back: held after all, whatever their due time.
    keep_tx: UnboundedSender<PendingTimer>,
    kept: UnboundedReceiver<PendingTimer>,
    /// Records read ahead, by timer sequence (`None`: nothing to keep).
    ahead_tx: UnboundedSender<(u64, Option<ReadAhead>)>,
    read: UnboundedReceiver<(u64, Option<ReadAhead>)>,
}

impl TimerScheduler {
    pub fn new(store: Store, metrics: Metrics, term: u64, firings: Pulse) -> TimerScheduler {
        TimerScheduler {
            store,
            metrics,
            term,
            firings,
        }
    }

    /// Works (`pulse`) while opening its feed and while waiting for a slot to fire or hand
    /// back a timer in; a firing that fails is retried on its own and does not hold it up.
    pub async fn run(self, cancel: CancellationToken, pulse: Pulse) {
        while !cancel.is_cancelled() {
            pulse.working();
            let mut feed = match self.open(&cancel).await {
                Ok(feed) => feed,
                Err(err) => {
                    warn!(error = %err, "scheduler cannot open the timer feed");
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    }
                }
            };
            pulse.idle();
            while self.run_once(&mut feed, &cancel, &pulse).await == Round::Handled {}
        }
        self.metrics.set_timers_held(0);
    }

    /// Opens the timer feed; the timers fired from it are acknowledged until `cancel`.
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn open(&self, cancel: &CancellationToken) -> Result<Feed, OjsError> {
        let feed = self.store.leader().timer_feed(self.term).await?;
        let (retry_tx, retries) = tokio::sync::mpsc::unbounded_channel();
        let (keep_tx, kept) = tokio::sync::mpsc::unbounded_channel();
        let (ahead_tx, read) = tokio::sync::mpsc::unbounded_channel();
        Ok(Feed {
            feed,
            horizon: self.store.leader().timer_horizon_ms(),
            held: Held::default(),
            permits: Arc::new(Semaphore::new(CONCURRENCY)),
            read_permits: Arc::new(Semaphore::new(READ_AHEAD_CONCURRENCY)),
            retry_tx,
            retries,
            acks: self.acknowledge_later(cancel.clone()),
            keep_tx,
            kept,
            ahead_tx,
            read,
        })
    }

    /// One round: waits for the next thing to do — a timer delivered, a firing to retry, a
    /// hand-back refused, a record read ahead, or the next held timer's time — and does it.
    /// Firings run on in tasks of their own.
    pub async fn run_once(&self, f: &mut Feed, cancel: &CancellationToken, pulse: &Pulse) -> Round {
        self.metrics.set_timers_held(f.held.timers.len());
        let next_wake = f.held.heap.peek().map(|Reverse((at, _, _))| *at);
        let wait = next_wake.map_or(Duration::from_secs(3600), |at| {
            Duration::from_millis((at - Utc::now().timestamp_millis()).max(0) as u64)
        });
        tokio::select! {
            _ = cancel.cancelled() => return Round::Cancelled,
            timer = f.feed.next() => {
                let Some(timer) = timer else { return Round::Closed };
                self.store.failpoint("scheduler.timer_received").await;
                if let Some(known) = f.held.timers.get_mut(&timer.sequence) {
                    // Redelivered (AckWait) while held: one entry, the latest reply.
                    known.redelivered(timer);
                    return Round::Handled;
                }
                let due = timer.timer.due.timestamp_millis();
                let now = Utc::now().timestamp_millis();
                match horizon::place(due, now, f.horizon) {
                    Placement::Fire | Placement::Hold => f.held.hold(due, timer, now),
                    Placement::HandBack(delay) => {
                        pulse.working();
                        let permit = f.permits.clone().acquire_owned().await.expect("semaphore open");
                        pulse.idle();
                        self.hand_back(timer, delay, f.keep_tx.clone(), permit);
                    }
                }
            }
            Some(timer) = f.retries.recv() => {
                let now = Utc::now().timestamp_millis();
                f.held.hold(now + 1000, timer, now);
            }
            Some(timer) = f.kept.recv() => {
                if !f.held.timers.contains_key(&timer.sequence) {
                    f.held.hold(timer.timer.due.timestamp_millis(), timer, Utc::now().timestamp_millis());
                }
            }
            Some((sequence, ahead)) = f.read.recv() => {
                f.held.reading -= 1;
                if let Some(ahead) = ahead {
                    f.held.keep_ahead(sequence, ahead);
                }
            }
            _ = tokio::time::sleep(wait), if next_wake.is_some() => {
                let now = Utc::now().timestamp_millis();
                while let Some(Reverse((at, key, wake))) = f.held.heap.peek().copied() {
                    if at > now {
                        break;
                    }
                    f.held.heap.pop();
                    if wake == Wake::ReadAhead {
                        if let Some(timer) = f.held.timers.get(&key).filter(|_| f.held.may_read_ahead()) {
                            f.held.reading += 1;
                            self.read_ahead(timer.timer.clone(), key, f.ahead_tx.clone(), f.read_permits.clone());
                        }
                        continue;
                    }
                    let Some((timer, ahead)) = f.held.take(key) else { continue };
                    // Maintenance mode: promotions wait, looked at again in 2 s
                    // (architecture §3.31); deadlines and expiries go on.
                    if timer.timer.kind == TimerKind::Promote && self.store.system().in_maintenance(Utc::now()) {
                        f.held.hold(now + MAINTENANCE_RECHECK_MS, timer, now);
                        continue;
                    }
                    pulse.working();
                    let permit = f.permits.clone().acquire_owned().await.expect("semaphore open");
                    pulse.idle();
                    self.fire(timer, ahead, f.retry_tx.clone(), f.acks.clone(), permit);
                }
            }
        }
        Round::Handled
    }

    /// Fires `timer` in a task of its own: acknowledged later once fired, tried again a
    /// second later when it fails or its record does not show the write it is for yet.
    fn fire(
        &self,
        timer: PendingTimer,
        ahead: Option<ReadAhead>,
        retry: UnboundedSender<PendingTimer>,
        ack: UnboundedSender<(Instant, PendingTimer)>,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) {
        let store = self.store.clone();
        let firings = self.firings.clone();
        firings.working();
        tokio::spawn(async move {
            match store.leader().fire_timer(&timer, ahead).await {
                Ok(Firing::Fired) => {
                    firings.idle();
                    store.failpoint("scheduler.timer_fired").await;
                    let _ = ack.send((Instant::now(), timer));
                }
                // NATS answered; the write the timer is for has not landed yet.
                Ok(Firing::NotYet) => {
                    firings.idle();
                    let _ = retry.send(timer);
                }
                Err(err) => {
                    warn!(job_id = %timer.timer.id, error = %err, "firing a timer failed; retrying");
                    let _ = retry.send(timer);
                }
            }
            drop(permit);
        });
    }

    /// Acknowledges each timer sent to the returned channel `ACK_DELAY` after the instant
    /// it was sent with (its firing), in the order fired.
    fn acknowledge_later(
        &self,
        cancel: CancellationToken,
    ) -> UnboundedSender<(Instant, PendingTimer)> {
        let (tx, mut fired) = tokio::sync::mpsc::unbounded_channel::<(Instant, PendingTimer)>();
        let store = self.store.clone();
        tokio::spawn(async move {
            while let Some((at, timer)) = fired.recv().await {
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = tokio::time::sleep_until(at + ACK_DELAY) => store.leader().timer_done(timer).await,
                }
            }
        });
        tx
    }

    /// Reads the record `timer` will change ahead of its due time and sends it back to the
    /// loop, which keeps it for the firing if the timer is still held.
    fn read_ahead(
        &self,
        timer: Timer,
        sequence: u64,
        back: UnboundedSender<(u64, Option<ReadAhead>)>,
        permits: Arc<Semaphore>,
    ) {
        let store = self.store.clone();
        tokio::spawn(async move {
            let _permit = permits.acquire_owned().await.expect("semaphore open");
            let _ = back.send((sequence, store.leader().read_ahead(&timer).await));
        });
    }

    /// Sends a timer due beyond the horizon back to JetStream for `delay`; if the server does
    /// not confirm, the timer is held instead.
    fn hand_back(
        &self,
        timer: PendingTimer,
        delay: Duration,
        keep: UnboundedSender<PendingTimer>,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) {
        let store = self.store.clone();
        let metrics = self.metrics.clone();
        tokio::spawn(async move {
            match store.leader().hand_back(&timer, delay).await {
                Ok(()) => metrics.timer_handed_back(),
                Err(err) => {
                    warn!(job_id = %timer.timer.id, error = %err, "handing a timer back failed; holding it");
                    let _ = keep.send(timer);
                }
            }
            drop(permit);
        });
    }
}
