//! Leader service: turns every job-record write into the events it implies (events seed §3)
//! and publishes them on `<namespace>.events.<type>`. Reading the writes from the jobs
//! bucket's own stream means an event can never be lost between a state write and its
//! publication: a write stays unacknowledged until its events are stored.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::domain::event::{job_events, Event};
use crate::store::Store;

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
            loop {
                let batch = tokio::select! {
                    _ = cancel.cancelled() => return,
                    batch = writes.next_batch() => batch,
                };
                let Some(batch) = batch else { break };
                let source = self.store.event_source();
                let events: Vec<Event> = batch
                    .iter()
                    .filter_map(|w| w.record.as_ref().map(|r| job_events(r, w.revision, source)))
                    .flatten()
                    .collect();
                // The same batch again until it is stored: later writes wait, so each job's
                // events keep their order.
                while let Err(err) = self.store.publish_events(&events).await {
                    warn!(error = %err, "publishing events failed; retrying");
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                    }
                }
                if let Some(last) = batch.last() {
                    last.done_through().await;
                }
            }
        }
    }
}
