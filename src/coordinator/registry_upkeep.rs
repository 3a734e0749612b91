//! Leader service: the queue registry's upkeep. Ends operators' rate-limit overrides when
//! they expire and keeps the token streams of those in force at their limits (a gateway
//! that died between an override's entry and its streams; docs/architecture.md §3.19), and
//! removes the entries of deleted queues once no job can still be on its way to them
//! (§3.17).

use std::time::Duration;

use chrono::Utc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::progress::Pulse;
use crate::store::Store;

/// How often the registry is looked at: an expired override ends within this.
const EVERY: Duration = Duration::from_secs(1);

pub struct RegistryUpkeep {
    store: Store,
}

impl RegistryUpkeep {
    pub fn new(store: Store) -> RegistryUpkeep {
        RegistryUpkeep { store }
    }

    /// Works (`pulse`) through each round, one every `EVERY`.
    pub async fn run(self, cancel: CancellationToken, pulse: Pulse) {
        pulse
            .every(EVERY, &cancel, || async {
                self.run_once().await;
            })
            .await;
    }

    /// One round over every overridden and every deleted queue; how many overrides it
    /// ended and entries it removed.
    pub async fn run_once(&self) -> usize {
        let leader = self.store.leader();
        let now = Utc::now();
        let mut done = 0;
        for (queue, set) in leader.limit_overrides() {
            match leader.keep_override(&queue, set, now).await {
                Ok(true) => {
                    info!(
                        queue,
                        "a rate-limit override expired; the queue's own limits apply"
                    );
                    done += 1;
                }
                Ok(false) => {}
                Err(err) => warn!(queue, error = %err, "could not keep a rate-limit override"),
            }
        }
        for queue in leader.deleted_queues_due(now) {
            match leader.remove_deleted_queue(&queue, now).await {
                Ok(true) => {
                    info!(queue, "a deleted queue's entry is removed");
                    done += 1;
                }
                Ok(false) => {}
                Err(err) => warn!(queue, error = %err, "could not remove a deleted queue's entry"),
            }
        }
        done
    }
}
