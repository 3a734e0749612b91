//! Background work that must happen once per cluster, not once per replica. Every gateway
//! runs a [`Coordinator`]; the one holding the coordinator lease leads and runs the leader
//! services until it loses the lease or shuts down.

mod cron;
mod deadline_watch;
mod event_publisher;
mod progress;
mod pruner;
mod queue_bounds;
mod registry_upkeep;
mod slot_sweeper;
mod stats_history;
mod timer_scheduler;
mod unseen_writes;

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use tokio::task::{Id, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::store::{Lease, Store};
use crate::telemetry::metrics::Metrics;
use crate::telemetry::otlp::SpanExporter;
pub use cron::CronScheduler;
pub use event_publisher::EventPublisher;
pub use progress::{Pulse, Round, Stall, Stalls};
pub use pruner::Pruner;
pub use queue_bounds::QueueBounds;
pub use registry_upkeep::RegistryUpkeep;
pub use slot_sweeper::SlotSweeper;
pub use stats_history::StatsHistory;
pub use timer_scheduler::TimerScheduler;

/// The lease every replica competes for.
const LEASE: &str = "coordinator";

pub struct Coordinator {
    store: Store,
    metrics: Metrics,
    /// Identifies this replica in the lease.
    instance: String,
    lease_ttl: Duration,
    /// A leader service working this long on one piece of work ends the leadership.
    stall_limit: Duration,
    /// Where the last such step-down is kept for `/ojs/v1/health`.
    stalls: Stalls,
    /// The OTLP exporter of job spans, when `otlp_endpoint` is set.
    spans: Option<SpanExporter>,
}

impl Coordinator {
    pub fn new(
        store: Store,
        metrics: Metrics,
        instance: String,
        lease_ttl: Duration,
        stall_limit: Duration,
        stalls: Stalls,
        spans: Option<SpanExporter>,
    ) -> Coordinator {
        Coordinator {
            store,
            metrics,
            instance,
            lease_ttl,
            stall_limit,
            stalls,
            spans,
        }
    }

    /// Competes for the lease and runs the leader services while holding it; renews every
    /// third of the lease's time-to-live, so one missed renewal does not lose it.
    ///
    /// A leader service that ends, panics, or works on one piece of work past the stall
    /// limit ends this leadership: the others are stopped, the lease is given up at once and
    /// this replica stays out of the contest for one lease TTL, so another replica takes
    /// over (or, alone, this one restarts the services then). A leader that kept renewing
    /// the lease with a dead or stuck service would stop timers, events and cron for the
    /// whole cluster.
    pub async fn run(self, cancel: CancellationToken) {
        let mut lease = self.store.leases().contender(LEASE, &self.instance);
        let mut leading: Option<Leadership> = None;
        let mut resting_until: Option<Instant> = None;
        let mut tick = tokio::time::interval(self.lease_ttl / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            self.metrics.set_leading(leading.is_some());
            tokio::select! {
                // At shutdown the services end too (their token is a child of `cancel`):
                // that is not a failure.
                biased;
                _ = cancel.cancelled() => break,
                _ = tick.tick() => {}
                (service, reason) = async {
                    match leading.as_mut() {
                        Some(l) => l.ended().await,
                        None => std::future::pending().await,
                    }
                } => {
                    error!(instance = %self.instance, service, %reason,
                        "a leader service stopped; stepping down so that another replica leads");
                    self.metrics.leader_service_failed(service);
                    resting_until = Some(self.step_down(&mut leading, &mut lease).await);
                    continue;
                }
            }
            if let Some((service, working_for)) =
                leading.as_ref().and_then(|l| l.stalled(self.stall_limit))
            {
                error!(instance = %self.instance, service,
                    no_progress_ms = working_for.as_millis() as u64,
                    limit_ms = self.stall_limit.as_millis() as u64,
                    "a leader service made no progress within leader_stall_ms; stepping down so that another replica leads");
                self.metrics.leader_stalled(service);
                resting_until = Some(self.step_down(&mut leading, &mut lease).await);
                self.stalls.stepped_down(service, working_for);
                continue;
            }
            if resting_until.is_some_and(|until| Instant::now() < until) {
                continue;
            }
            match (lease.try_hold().await, leading.is_some()) {
                (Some(term), false) => {
                    info!(instance = %self.instance, term, "this replica now leads the coordinator");
                    self.stalls.leads_again();
                    leading = Some(self.lead(&cancel, term));
                }
                (None, true) => {
                    warn!(instance = %self.instance, "lost the coordinator lease; stepping down");
                    if let Some(l) = leading.take() {
                        l.stop(self.lease_ttl / 3).await;
                    }
                }
                _ => {}
            }
        }
        self.step_down(&mut leading, &mut lease).await;
    }

    /// Ends the leadership: stops its services and gives the lease up at once. Returns until
    /// when this replica, if it failed, stays out of the contest.
    async fn step_down(&self, leading: &mut Option<Leadership>, lease: &mut Lease) -> Instant {
        if let Some(l) = leading.take() {
            l.stop(self.lease_ttl / 3).await;
        }
        lease.release().await;
        self.metrics.set_leading(false);
        Instant::now() + self.lease_ttl
    }

    /// Starts every leader service, each in its own task. Those that must not act on
    /// another leadership's behalf are fenced by `term` (architecture §3.10).
    fn lead(&self, cancel: &CancellationToken, term: u64) -> Leadership {
        let mut l = Leadership::new(cancel);
        let (store, token) = (&self.store, l.token.clone());
        l.spawn("event_publisher", |pulse| {
            EventPublisher::new(
                store.clone(),
                self.metrics.clone(),
                self.spans.clone(),
                term,
            )
            .run(token.clone(), pulse)
        });
        // Firings run in tasks of their own, so the scheduler's loop shows nothing of them:
        // their own pulse is working from a firing's start until one succeeds.
        let firings = Pulse::default();
        l.watch("scheduler_firings", firings.clone());
        l.spawn("scheduler", |pulse| {
            TimerScheduler::new(store.clone(), self.metrics.clone(), term, firings)
                .run(token.clone(), pulse)
        });
        l.spawn("cron", |pulse| {
            CronScheduler::new(store.clone()).run(token.clone(), pulse)
        });
        l.spawn("slot_sweeper", |pulse| {
            SlotSweeper::new(store.clone()).run(token.clone(), pulse)
        });
        l.spawn("registry_upkeep", |pulse| {
            RegistryUpkeep::new(store.clone()).run(token.clone(), pulse)
        });
        l.spawn("stats_history", |pulse| {
            StatsHistory::new(store.clone()).run(token.clone(), pulse)
        });
        l.spawn("queue_bounds", |pulse| {
            QueueBounds::new(store.clone(), self.metrics.clone()).run(token.clone(), pulse)
        });
        if let Some(max_age) = store.finished_jobs_max_age() {
            l.spawn("pruner", |pulse| {
                Pruner::new(store.clone(), max_age, term).run(token, pulse)
            });
        }
        l
    }
}

/// The leader services of one leadership, watched: each runs in its own task, so one that
/// ends or panics is noticed at once instead of dying unseen, and reports its progress on
/// its pulse, so one that gets stuck is noticed too.
struct Leadership {
    token: CancellationToken,
    services: JoinSet<()>,
    names: HashMap<Id, &'static str>,
    pulses: Vec<(&'static str, Pulse)>,
}

impl Leadership {
    fn new(parent: &CancellationToken) -> Leadership {
        Leadership {
            token: parent.child_token(),
            services: JoinSet::new(),
            names: HashMap::new(),
            pulses: Vec::new(),
        }
    }

    /// Starts the service `start` makes, giving it the pulse it reports its progress on.
    fn spawn<F>(&mut self, name: &'static str, start: impl FnOnce(Pulse) -> F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let pulse = Pulse::default();
        let id = self.services.spawn(start(pulse.clone())).id();
        self.names.insert(id, name);
        self.pulses.push((name, pulse));
    }

    /// Watches `pulse` under `name` too: work a service hands to tasks of its own.
    fn watch(&mut self, name: &'static str, pulse: Pulse) {
        self.pulses.push((name, pulse));
    }

    /// The first service working on one piece of work for longer than `limit`, and how long.
    fn stalled(&self, limit: Duration) -> Option<(&'static str, Duration)> {
        self.pulses.iter().find_map(|(name, pulse)| {
            pulse
                .working_for()
                .filter(|took| *took > limit)
                .map(|took| (*name, took))
        })
    }

    /// Waits for the first service to end on its own: its name and why. Services end only
    /// when cancelled, so any end seen here is a failure.
    async fn ended(&mut self) -> (&'static str, String) {
        let Some(joined) = self.services.join_next_with_id().await else {
            return std::future::pending().await;
        };
        let (id, reason) = match joined {
            Ok((id, ())) => (id, "it returned".to_owned()),
            Err(err) => (err.id(), failure_reason(err)),
        };
        (self.names.get(&id).copied().unwrap_or("unknown"), reason)
    }

    /// Cancels the services, waits up to `grace`, then aborts what still runs, so a service
    /// stuck in a NATS call cannot go on leading next to a successor. Aborting is safe: every
    /// leader service survives a crash at any await (architecture §3.10).
    async fn stop(mut self, grace: Duration) {
        self.token.cancel();
        let all_ended = async { while self.services.join_next().await.is_some() {} };
        if tokio::time::timeout(grace, all_ended).await.is_err() {
            warn!(
                grace_ms = grace.as_millis() as u64,
                "leader services did not stop in time; aborting them"
            );
            self.services.abort_all();
            while self.services.join_next().await.is_some() {}
        }
    }
}

/// A failed service task's panic message, or that it was aborted.
fn failure_reason(err: tokio::task::JoinError) -> String {
    match err.try_into_panic() {
        Ok(payload) => payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .map_or_else(|| "it panicked".to_owned(), |m| format!("it panicked: {m}")),
        Err(_) => "it was cancelled".to_owned(),
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
        let mut l = Leadership::new(&CancellationToken::new());
        // Ignores its token, like a service waiting on a NATS call that does not answer.
        l.spawn("stuck", |_| async move {
            let _guard = guard;
            std::future::pending::<()>().await;
        });
        let started = tokio::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(2), l.stop(Duration::from_millis(50)))
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
        let done = Arc::new(AtomicBool::new(false));
        let finished = done.clone();
        let mut l = Leadership::new(&CancellationToken::new());
        let watching = l.token.clone();
        l.spawn("polite", |_| async move {
            watching.cancelled().await;
            finished.store(true, Ordering::SeqCst);
        });
        let started = tokio::time::Instant::now();
        l.stop(Duration::from_secs(5)).await;
        assert!(done.load(Ordering::SeqCst), "it ran to its end");
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test]
    async fn a_service_that_panics_or_returns_is_reported_by_name() {
        let mut l = Leadership::new(&CancellationToken::new());
        l.spawn("steady", |_| std::future::pending());
        l.spawn("fragile", |_| async { panic!("overflowed") });
        let (name, reason) = tokio::time::timeout(Duration::from_secs(2), l.ended())
            .await
            .expect("a panic is seen at once");
        assert_eq!(name, "fragile");
        assert!(reason.contains("overflowed"), "{reason}");
        l.spawn("quitter", |_| async {});
        assert_eq!(l.ended().await.0, "quitter");
        l.stop(Duration::from_millis(50)).await;
    }

    #[tokio::test]
    async fn only_a_service_working_past_the_limit_is_stalled() {
        let mut l = Leadership::new(&CancellationToken::new());
        let (tx, rx) = std::sync::mpsc::channel();
        for name in ["idle", "busy", "stuck"] {
            let tx = tx.clone();
            l.spawn(name, move |pulse| {
                tx.send((name, pulse)).unwrap();
                std::future::pending()
            });
        }
        let pulses: HashMap<_, _> = rx.try_iter().collect();
        pulses["stuck"].working();
        tokio::time::sleep(Duration::from_millis(120)).await;
        pulses["busy"].working();
        let limit = Duration::from_millis(100);
        let (name, took) = l.stalled(limit).expect("one is stalled");
        assert_eq!(name, "stuck");
        assert!(took > limit, "{took:?}");
        pulses["stuck"].idle();
        assert!(l.stalled(limit).is_none(), "idle for long, or busy briefly");
        l.stop(Duration::from_millis(50)).await;
    }
}
