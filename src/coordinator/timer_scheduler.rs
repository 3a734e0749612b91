//! Leader service: fires timers when they come due (retry backoff, scheduled jobs, expiry,
//! job deadlines, silent workers), driven by a timer heap, not by polling. Only timers due
//! within the horizon are held in memory, once each (keyed by stream sequence); later ones
//! are handed back to JetStream with a NAK delay and come back shortly before they are due
//! (architecture §3.5). Firing runs concurrently so thousands due at one instant finish
//! together.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::domain::horizon::{self, Placement};
use crate::store::{PendingTimer, Store};
use crate::telemetry::metrics::Metrics;

/// Timers fired (or handed back) at once; each is a few NATS round trips.
const CONCURRENCY: usize = 256;

pub struct TimerScheduler {
    store: Store,
    metrics: Metrics,
}

/// The timers held in memory: a heap of (due ms, stream sequence) over a map by sequence.
/// A heap entry whose sequence is no longer in the map (fired) is skipped.
#[derive(Default)]
struct Held {
    heap: BinaryHeap<Reverse<(i64, u64)>>,
    timers: HashMap<u64, PendingTimer>,
}

impl Held {
    fn hold(&mut self, due: i64, timer: PendingTimer) {
        self.heap.push(Reverse((due, timer.sequence)));
        self.timers.insert(timer.sequence, timer);
    }
}

impl TimerScheduler {
    pub fn new(store: Store, metrics: Metrics) -> TimerScheduler {
        TimerScheduler { store, metrics }
    }

    pub async fn run(self, cancel: CancellationToken) {
        while !cancel.is_cancelled() {
            let mut feed = match self.store.timer_feed().await {
                Ok(feed) => feed,
                Err(err) => {
                    warn!(error = %err, "scheduler cannot open the timer feed");
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    }
                }
            };
            let horizon = self.store.timer_horizon_ms();
            let mut held = Held::default();
            let permits = Arc::new(Semaphore::new(CONCURRENCY));
            // Timers whose firing failed come back here to be tried again a second later.
            let (retry_tx, mut retries) = tokio::sync::mpsc::unbounded_channel::<PendingTimer>();
            // Timers the server did not take back: held after all, whatever their due time.
            let (keep_tx, mut kept) = tokio::sync::mpsc::unbounded_channel::<PendingTimer>();
            loop {
                self.metrics.set_timers_held(held.timers.len());
                let next_due = held.heap.peek().map(|Reverse((due, _))| *due);
                let wait = next_due.map_or(Duration::from_secs(3600), |due| {
                    Duration::from_millis((due - Utc::now().timestamp_millis()).max(0) as u64)
                });
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    timer = feed.next() => {
                        let Some(timer) = timer else { break };
                        self.store.failpoint("scheduler.timer_received").await;
                        if let Some(known) = held.timers.get_mut(&timer.sequence) {
                            // Redelivered (AckWait) while held: one entry, the latest reply.
                            known.redelivered(timer);
                            continue;
                        }
                        let due = timer.timer.due.timestamp_millis();
                        match horizon::place(due, Utc::now().timestamp_millis(), horizon) {
                            Placement::Fire | Placement::Hold => held.hold(due, timer),
                            Placement::HandBack(delay) => {
                                let permit = permits.clone().acquire_owned().await.expect("semaphore open");
                                self.hand_back(timer, delay, keep_tx.clone(), permit);
                            }
                        }
                    }
                    Some(timer) = retries.recv() => {
                        held.hold(Utc::now().timestamp_millis() + 1000, timer);
                    }
                    Some(timer) = kept.recv() => {
                        if !held.timers.contains_key(&timer.sequence) {
                            held.hold(timer.timer.due.timestamp_millis(), timer);
                        }
                    }
                    _ = tokio::time::sleep(wait), if next_due.is_some() => {
                        let now = Utc::now().timestamp_millis();
                        while let Some(Reverse((due, key))) = held.heap.peek().copied() {
                            if due > now {
                                break;
                            }
                            held.heap.pop();
                            let Some(timer) = held.timers.remove(&key) else { continue };
                            let store = self.store.clone();
                            let retry = retry_tx.clone();
                            let permit = permits.clone().acquire_owned().await.expect("semaphore open");
                            tokio::spawn(async move {
                                match store.fire(&timer.timer).await {
                                    Ok(_) => {
                                        store.failpoint("scheduler.timer_fired").await;
                                        store.timer_done(timer).await;
                                    }
                                    Err(err) => {
                                        warn!(job_id = %timer.timer.id, error = %err, "firing a timer failed; retrying");
                                        let _ = retry.send(timer);
                                    }
                                }
                                drop(permit);
                            });
                        }
                    }
                }
            }
        }
        self.metrics.set_timers_held(0);
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
            match store.hand_back(&timer, delay).await {
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
