//! Background work that must happen once per cluster, not once per replica. Every gateway
//! runs a [`Coordinator`]; the one holding the coordinator lease leads and runs the leader
//! services until it loses the lease or shuts down.

mod cron;
mod deadline_watch;
mod event_publisher;
mod pruner;
mod scheduler;

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::store::Store;
pub use cron::CronScheduler;
pub use event_publisher::EventPublisher;
pub use pruner::Pruner;
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
                    let pruner = self
                        .store
                        .finished_jobs_max_age()
                        .map(|max_age| Pruner::new(self.store.clone(), max_age).run(token.clone()));
                    let services = tokio::spawn(async move {
                        tokio::join!(publisher, scheduler, cron, async {
                            if let Some(pruner) = pruner {
                                pruner.await;
                            }
                        });
                    });
                    leading = Some((token, services));
                }
                (false, true) => {
                    warn!(instance = %self.instance, "lost the coordinator lease; stepping down");
                    if let Some((token, services)) = leading.take() {
                        stop_leading(token, services, self.lease_ttl / 3).await;
                    }
                }
                _ => {}
            }
        }
        if let Some((token, services)) = leading.take() {
            stop_leading(token, services, self.lease_ttl / 3).await;
        }
        lease.release().await;
    }
}

/// Stops the leader services: cancels them, waits up to `grace`, then aborts what still runs,
/// so a service stuck in a NATS call cannot go on leading next to a successor. Aborting is
/// safe: every leader service survives a crash at any await (architecture §3.10).
async fn stop_leading(token: CancellationToken, mut services: JoinHandle<()>, grace: Duration) {
    token.cancel();
    if tokio::time::timeout(grace, &mut services).await.is_err() {
        warn!(
            grace_ms = grace.as_millis() as u64,
            "leader services did not stop in time; aborting them"
        );
        services.abort();
        let _ = services.await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use super::*;

    /// Sets its flag when dropped: the service's future is gone.
    struct Dropped(Arc<AtomicBool>);

    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn a_service_stuck_past_the_grace_is_aborted() {
        let dropped = Arc::new(AtomicBool::new(false));
        let guard = Dropped(dropped.clone());
        // Ignores its token, like a service waiting on a NATS call that does not answer.
        let stuck = tokio::spawn(async move {
            let _guard = guard;
            std::future::pending::<()>().await;
        });
        let started = tokio::time::Instant::now();
        let stopping = stop_leading(CancellationToken::new(), stuck, Duration::from_millis(50));
        tokio::time::timeout(Duration::from_secs(2), stopping)
            .await
            .expect("step-down does not wait for a stuck service");
        let took = started.elapsed();
        assert!(dropped.load(Ordering::SeqCst), "the stuck service is gone");
        assert!(
            took >= Duration::from_millis(50) && took < Duration::from_secs(1),
            "{took:?}"
        );
    }

    #[tokio::test]
    async fn a_service_that_honours_its_token_stops_without_waiting_for_the_grace() {
        let token = CancellationToken::new();
        let watching = token.clone();
        let done = Arc::new(AtomicBool::new(false));
        let finished = done.clone();
        let service = tokio::spawn(async move {
            watching.cancelled().await;
            finished.store(true, Ordering::SeqCst);
        });
        let started = tokio::time::Instant::now();
        stop_leading(token, service, Duration::from_secs(5)).await;
        assert!(done.load(Ordering::SeqCst), "it ran to its end");
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}
