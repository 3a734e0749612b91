//! Leader service, once per deployment: indexes the jobs dead-lettered before discarded
//! jobs had index entries of their own (an upgrade), a batch at a time, so that listings by
//! state show every discarded job (docs/architecture.md §3.26). Once done, it only waits for
//! the leadership to end.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::progress::Pulse;
use crate::store::Store;

/// Pause after a failed batch before it is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(1);

pub struct DeadLetteredIndex {
    store: Store,
}

impl DeadLetteredIndex {
    pub fn new(store: Store) -> DeadLetteredIndex {
        DeadLetteredIndex { store }
    }

    /// Works (`pulse`) from each batch until one succeeds, then idles until cancelled.
    pub async fn run(self, cancel: CancellationToken, pulse: Pulse) {
        loop {
            pulse.working();
            let step = tokio::select! {
                _ = cancel.cancelled() => return,
                step = self.store.leader().index_dead_lettered() => step,
            };
            match step {
                Ok(done) => {
                    pulse.idle();
                    if done {
                        break;
                    }
                }
                Err(err) => {
                    warn!(error = %err, "could not index dead-lettered jobs; trying again");
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(RETRY_AFTER) => {}
                    }
                }
            }
        }
        cancel.cancelled().await;
    }
}
