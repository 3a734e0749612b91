//! Leader service for bounded queues (docs/architecture.md §3.27): each second it reads
//! every bounded queue's depth for the pressure gauge and announces `backpressure.warning`
//! and `backpressure.cleared` when a queue crosses its warning threshold; and it frees the
//! depth tokens whose job never came to be (a PUSH that died between its tokens and its
//! records). Without the sweep a queue could lose places for good.

use std::collections::HashMap;
use std::time::Duration;

use chrono::Utc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::progress::Pulse;
use crate::domain::event::backpressure_event;
use crate::store::Store;
use crate::telemetry::metrics::Metrics;

/// How often every bounded queue is looked at.
const EVERY: Duration = Duration::from_secs(1);
/// Most tokens one look sweeps per queue: a queue's tokens are each looked at once after
/// their grace, so this bounds the work per second, not the coverage.
const SWEEP_MAX: usize = 1_000;

pub struct QueueBounds {
    store: Store,
    metrics: Metrics,
    /// The bounded queues this leadership watches.
    watched: HashMap<String, Watched>,
}

/// What the leadership knows of one bounded queue.
#[derive(Default)]
struct Watched {
    /// Whether its last crossing announced was a warning.
    warned: bool,
    /// Where its next sweep starts (0 at the start of a leadership: every token once).
    sweep_from: u64,
}

impl QueueBounds {
    pub fn new(store: Store, metrics: Metrics) -> QueueBounds {
        QueueBounds {
            store,
            metrics,
            watched: HashMap::new(),
        }
    }

    /// Works (`pulse`) through each round, one every `EVERY`.
    pub async fn run(mut self, cancel: CancellationToken, pulse: Pulse) {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => {
                    self.metrics.set_backpressure(&[]);
                    return;
                }
                _ = tokio::time::sleep(EVERY) => {}
            }
            pulse.working();
            self.run_once().await;
            pulse.idle();
        }
    }

    /// One round: every bounded queue's depth read, a crossing of its warning level
    /// announced, its pressure published as a metric, and its places left by crashes freed.
    pub async fn run_once(&mut self) {
        let grace = self.store.leader().token_grace();
        let bounded = self.store.leader().bounded_queues();
        self.watched
            .retain(|queue, _| bounded.iter().any(|(q, _)| q == queue));
        let mut pressures = Vec::with_capacity(bounded.len());
        for (queue, bound) in bounded {
            let seen = self.watched.entry(queue.clone()).or_default();
            match self.store.queues().depth_now(&queue).await {
                Ok(depth) => {
                    pressures.push((queue.clone(), bound.pressure(depth)));
                    if let Some(warns) = bound.crossing(seen.warned, depth) {
                        let kind = if warns {
                            "backpressure.warning"
                        } else {
                            "backpressure.cleared"
                        };
                        let event = backpressure_event(
                            kind,
                            bound.event_data(&queue, depth, None),
                            uuid::Uuid::now_v7(),
                            Utc::now(),
                            self.store.events().source(),
                        );
                        match self.store.events().publish(&[event]).await {
                            Ok(()) => seen.warned = warns,
                            Err(err) => {
                                warn!(queue, error = %err, "could not announce a queue's pressure")
                            }
                        }
                    }
                }
                Err(err) => {
                    warn!(queue, error = %err, "could not read a bounded queue's depth")
                }
            }
            match self
                .store
                .leader()
                .sweep_depth_tokens(&queue, seen.sweep_from, grace, SWEEP_MAX)
                .await
            {
                Ok((next, freed)) => {
                    seen.sweep_from = next;
                    if freed > 0 {
                        info!(
                            queue,
                            freed, "freed places in a bounded queue whose jobs never came to be"
                        );
                    }
                }
                Err(err) => {
                    warn!(queue, error = %err, "could not sweep a bounded queue's places")
                }
            }
        }
        self.metrics.set_backpressure(&pressures);
    }
}
