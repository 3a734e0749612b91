//! Leader service: frees the running places of concurrency-limited queues whose job no
//! longer runs under them (a gateway that died between a place and its record, or a lost
//! delete; docs/architecture.md §3.19). Without it a queue could lose a place for good.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::progress::Pulse;
use crate::store::Store;

/// How often every limited queue's places are looked at.
const EVERY: Duration = Duration::from_secs(2);

pub struct SlotSweeper {
    store: Store,
}

impl SlotSweeper {
    pub fn new(store: Store) -> SlotSweeper {
        SlotSweeper { store }
    }

    /// Works (`pulse`) through each round, one every `EVERY`.
    pub async fn run(self, cancel: CancellationToken, pulse: Pulse) {
        pulse
            .every(EVERY, &cancel, || async {
                self.run_once().await;
            })
            .await;
    }

    /// One round: frees the places of every limited queue whose job no longer runs under
    /// them and is older than the grace; how many it freed.
    pub async fn run_once(&self) -> usize {
        let grace = self.store.leader().slot_grace();
        let mut freed_in_all = 0;
        for queue in self.store.leader().concurrency_limited_queues() {
            match self.store.leader().sweep_slots(&queue, grace).await {
                Ok(0) => {}
                Ok(freed) => {
                    info!(queue, freed, "freed running places whose jobs had ended");
                    freed_in_all += freed;
                }
                Err(err) => {
                    warn!(queue, error = %err, "could not sweep a queue's running places")
                }
            }
        }
        freed_in_all
    }
}
