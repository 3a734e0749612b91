//! Leader service: ends operators' rate-limit overrides when they expire, and keeps the
//! token streams of those in force at their limits (a gateway that died between an
//! override's registry entry and its streams; docs/architecture.md §3.19).

use std::time::Duration;

use chrono::Utc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::progress::Pulse;
use crate::store::Store;

/// How often the overrides are looked at: an expired one ends within this.
const EVERY: Duration = Duration::from_secs(1);

pub struct LimitOverrides {
    store: Store,
}

impl LimitOverrides {
    pub fn new(store: Store) -> LimitOverrides {
        LimitOverrides { store }
    }

    /// Works (`pulse`) through each round, one every `EVERY`.
    pub async fn run(self, cancel: CancellationToken, pulse: Pulse) {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(EVERY) => {}
            }
            pulse.working();
            self.run_once().await;
            pulse.idle();
        }
    }

    /// One round over every queue with an override; how many overrides it ended.
    pub async fn run_once(&self) -> usize {
        let now = Utc::now();
        let mut ended = 0;
        for (queue, set) in self.store.leader().limit_overrides() {
            match self.store.leader().keep_override(&queue, set, now).await {
                Ok(true) => {
                    info!(
                        queue,
                        "a rate-limit override expired; the queue's own limits apply"
                    );
                    ended += 1;
                }
                Ok(false) => {}
                Err(err) => warn!(queue, error = %err, "could not keep a rate-limit override"),
            }
        }
        ended
    }
}
