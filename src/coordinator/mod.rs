//! Background work that must happen once per cluster, not once per replica. Every gateway
//! runs a [`Coordinator`]; the one holding the coordinator lease leads and runs the leader
//! services until it loses the lease or shuts down.

mod cron;
mod deadline_watch;
mod event_publisher;
mod scheduler;

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::store::Store;
pub use cron::CronScheduler;
pub use event_publisher::EventPublisher;
pub use scheduler::Scheduler;

/// The lease every replica competes for.
const LEASE: &str = "coordinator";

pub struct Coordinator {
    store: Store,
    /// Identifies this replica in the lease.
    instance: String,
    lease_ttl: Duration,
}

impl Coordinator {
    pub fn new(store: Store, instance: String, lease_ttl: Duration) -> Coordinator {
        Coordinator {
            store,
            instance,
            lease_ttl,
        }
    }

    /// Competes for the lease and runs the leader services while holding it; renews every
    /// third of the lease's time-to-live, so one missed renewal does not lose it.
    pub async fn run(self, cancel: CancellationToken) {
        let mut lease = self.store.lease(LEASE, &self.instance);
        let mut leading: Option<(CancellationToken, JoinHandle<()>)> = None;
        let mut tick = tokio::time::interval(self.lease_ttl / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tick.tick() => {}
            }
            let holding = lease.try_hold().await;
            match (holding, leading.is_some()) {
                (true, false) => {
                    info!(instance = %self.instance, "this replica now leads the coordinator");
                    let token = cancel.child_token();
                    let publisher = EventPublisher::new(self.store.clone()).run(token.clone());
                    let scheduler = Scheduler::new(self.store.clone()).run(token.clone());
                    let cron = CronScheduler::new(self.store.clone()).run(token.clone());
                    let services = tokio::spawn(async move {
                        tokio::join!(publisher, scheduler, cron);
                    });
                    leading = Some((token, services));
                }
                (false, true) => {
                    warn!(instance = %self.instance, "lost the coordinator lease; stepping down");
                    if let Some((token, task)) = leading.take() {
                        token.cancel();
                        let _ = task.await;
                    }
                }
                _ => {}
            }
        }
        if let Some((token, task)) = leading.take() {
            token.cancel();
            let _ = task.await;
        }
        lease.release().await;
    }
}
