//! Leader service: fires cron ticks (cron spec §7). It sleeps until the earliest due entry,
//! and looks again at least once a second so registrations made through other replicas are
//! picked up (cron spec §7.3 asks for no more than that). Firing is idempotent
//! (`Leader::fire_cron`), so a tick interrupted by a leader's death is completed, once, by
//! the next leader.

use std::time::Duration;

use chrono::Utc;
use futures::future::join_all;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::progress::Pulse;
use crate::store::{Store, TickOutcome};

pub struct CronScheduler {
    store: Store,
}

impl CronScheduler {
    pub fn new(store: Store) -> CronScheduler {
        CronScheduler { store }
    }

    /// Works (`pulse`) through each round; a tick that failed stays due for the next.
    pub async fn run(self, cancel: CancellationToken, pulse: Pulse) {
        loop {
            pulse.working();
            let wait = self.run_once().await;
            pulse.idle();
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One round: fires every tick due now; how long until the next round (the earliest
    /// next tick, a second at most; 200 ms after a round that fired, for entries due again).
    pub async fn run_once(&self) -> Duration {
        let now = Utc::now();
        // Maintenance mode (architecture §3.31): no tick fires; a tick due meanwhile fires
        // once it ends.
        if self.store.system().in_maintenance(now) {
            return Duration::from_secs(1);
        }
        let entries = self.store.cron().list();
        let due: Vec<_> = entries
            .iter()
            .filter(|e| e.enabled)
            .filter_map(|e| {
                e.next_run_at
                    .filter(|t| *t <= now)
                    .map(|t| (e.name.clone(), t))
            })
            .collect();
        let fired = join_all(
            due.iter()
                .map(|(name, tick)| self.store.leader().fire_cron(name, *tick)),
        )
        .await;
        for ((name, tick), outcome) in due.iter().zip(fired) {
            match outcome {
                Ok(TickOutcome::Stale) | Ok(TickOutcome::Enqueued(_)) => {}
                Ok(TickOutcome::Skipped(previous)) => {
                    debug!(cron = %name, %tick, %previous, "tick skipped: previous job still running")
                }
                Ok(TickOutcome::Refused(reason)) => {
                    warn!(cron = %name, %tick, %reason, "tick skipped: its job was refused")
                }
                Err(err) => {
                    warn!(cron = %name, %tick, error = %err, "firing a cron tick failed; it stays due")
                }
            }
        }
        let next = self
            .store
            .cron()
            .list()
            .iter()
            .filter(|e| e.enabled)
            .filter_map(|e| e.next_run_at)
            .min();
        let until_next = next.map_or(Duration::from_secs(1), |t| {
            (t - Utc::now()).to_std().unwrap_or_default()
        });
        if due.is_empty() {
            until_next.min(Duration::from_secs(1))
        } else {
            until_next.min(Duration::from_millis(200))
        }
    }
}
