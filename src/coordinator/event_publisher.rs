//! Leader service: turns every job-record write into the events it implies (events seed §3)
//! and publishes them on `<namespace>.events.<type>`, and feeds the same writes to the
//! deadline watch. Reading the writes from the jobs bucket's own stream means neither an
//! event nor a deadline can be lost between a state write and its handling: a write stays
//! unacknowledged until its events are stored and the watch no longer needs it.

use std::collections::VecDeque;
use std::time::Duration;

use chrono::Utc;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::deadline_watch::{DeadlineWatch, WATCH_HOLD};
use crate::domain::event::{job_events, Event};
use crate::store::{JobWrite, Store};

/// Pause before publishing again what NATS refused.
const RETRY_PAUSE: Duration = Duration::from_millis(500);

pub struct EventPublisher {
    store: Store,
}

impl EventPublisher {
    pub fn new(store: Store) -> EventPublisher {
        EventPublisher { store }
    }

    pub async fn run(self, cancel: CancellationToken) {
        while !cancel.is_cancelled() {
            let mut writes = match self.store.job_writes().await {
                Ok(w) => w,
                Err(err) => {
                    warn!(error = %err, "event publisher cannot open the job-write feed");
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    }
                }
            };
            let mut watch = DeadlineWatch::new(WATCH_HOLD, self.store.execution_timeout());
            // The last write of every batch not yet acknowledged, oldest first.
            let mut unacked: VecDeque<JobWrite> = VecDeque::new();
            loop {
                let arm_at = watch.next_arm_at();
                let until_arm = arm_at.map_or(Duration::ZERO, |at| {
                    (at - Utc::now()).to_std().unwrap_or(Duration::ZERO)
                });
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    batch = writes.next_batch() => {
                        let Some(batch) = batch else { break };
                        if !self.publish(&batch, &cancel).await {
                            return;
                        }
                        let now = Utc::now();
                        for w in &batch {
                            watch.observe(&w.id, w.revision, w.record.as_ref(), now);
                        }
                        unacked.extend(batch.into_iter().last().map(JobWrite::into_ack_only));
                    }
                    _ = tokio::time::sleep(until_arm), if arm_at.is_some() => {}
                }
                let due = watch.due(Utc::now());
                if !due.is_empty() {
                    match self.store.arm_deadlines(&due).await {
                        Ok(()) => due.iter().for_each(|t| watch.armed(t)),
                        Err(err) => {
                            warn!(error = %err, "storing deadline timers failed; retrying");
                            tokio::select! {
                                _ = cancel.cancelled() => return,
                                _ = tokio::time::sleep(RETRY_PAUSE) => {}
                            }
                        }
                    }
                }
                // Acknowledge up to just before the oldest write the watch still needs.
                let pinned = watch.pinned_from();
                let mut through = None;
                while unacked
                    .front()
                    .is_some_and(|w| pinned.is_none_or(|p| w.revision < p))
                {
                    through = unacked.pop_front();
                }
                if let Some(w) = through {
                    w.done_through().await;
                }
            }
        }
    }

    /// Publishes the batch's events until they are stored; `false` when cancelled first.
    /// The same batch again until it is stored: later writes wait, so each job's events keep
    /// their order.
    async fn publish(&self, batch: &[JobWrite], cancel: &CancellationToken) -> bool {
        let source = self.store.event_source();
        let events: Vec<Event> = batch
            .iter()
            .filter_map(|w| w.record.as_ref().map(|r| job_events(r, w.revision, source)))
            .flatten()
            .collect();
        while let Err(err) = self.store.publish_events(&events).await {
            warn!(error = %err, "publishing events failed; retrying");
            tokio::select! {
                _ = cancel.cancelled() => return false,
                _ = tokio::time::sleep(RETRY_PAUSE) => {}
            }
        }
        true
    }
}
