//! Leader service: fires timers when they come due (retry backoff, scheduled jobs, expiry,
//! job deadlines, silent workers), driven
//! by a timer heap, not by polling. All pending timers are held in memory, ordered by due
//! time; firing runs concurrently so thousands due at one instant finish together.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::store::{PendingTimer, Store};

/// Timers fired at once; each is a few NATS round trips.
const CONCURRENCY: usize = 256;

pub struct Scheduler {
    store: Store,
}

impl Scheduler {
    pub fn new(store: Store) -> Scheduler {
        Scheduler { store }
    }

    pub async fn run(self, cancel: CancellationToken) {
        while !cancel.is_cancelled() {
            let mut feed = match self.store.timer_feed().await {
                Ok(feed) => feed,
                Err(err) => {
                    warn!(error = %err, "scheduler cannot open the timer feed");
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    }
                }
            };
            let mut heap: BinaryHeap<Reverse<(i64, u64)>> = BinaryHeap::new();
            let mut pending: HashMap<u64, PendingTimer> = HashMap::new();
            let mut seq = 0u64;
            let permits = Arc::new(Semaphore::new(CONCURRENCY));
            // Timers whose firing failed come back here to be tried again a second later.
            let (retry_tx, mut retries) = tokio::sync::mpsc::unbounded_channel::<PendingTimer>();
            loop {
                let next_due = heap.peek().map(|Reverse((due, _))| *due);
                let wait = next_due.map_or(Duration::from_secs(3600), |due| {
                    Duration::from_millis((due - Utc::now().timestamp_millis()).max(0) as u64)
                });
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    timer = feed.next() => {
                        let Some(timer) = timer else { break };
                        self.store.failpoint("scheduler.timer_received");
                        seq += 1;
                        heap.push(Reverse((timer.timer.due.timestamp_millis(), seq)));
                        pending.insert(seq, timer);
                    }
                    Some(timer) = retries.recv() => {
                        seq += 1;
                        heap.push(Reverse((Utc::now().timestamp_millis() + 1000, seq)));
                        pending.insert(seq, timer);
                    }
                    _ = tokio::time::sleep(wait), if next_due.is_some() => {
                        let now = Utc::now().timestamp_millis();
                        while let Some(Reverse((due, key))) = heap.peek().copied() {
                            if due > now {
                                break;
                            }
                            heap.pop();
                            let Some(timer) = pending.remove(&key) else { continue };
                            let store = self.store.clone();
                            let retry = retry_tx.clone();
                            let permit = permits.clone().acquire_owned().await.expect("semaphore open");
                            tokio::spawn(async move {
                                match store.fire(&timer.timer).await {
                                    Ok(_) => store.timer_done(timer).await,
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
    }
}
