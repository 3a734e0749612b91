//! How a leader service shows that it gets on with its work, and what the replica remembers
//! of a leadership that ended because one did not (architecture §3.10, stalls).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What a round of a stream-driven service (`run_once`) came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Round {
    /// Something delivered or come due was handled.
    Handled,
    /// The feed ended (NATS closed its consumer); open another.
    Closed,
    /// The leadership ended.
    Cancelled,
    /// Deliveries were lost on the way, and this leadership cannot go on from where it is:
    /// the service ends, so that the coordinator steps down and the next leadership reads
    /// on from what was acknowledged.
    Lost,
}

/// A service's progress marks: it is `working` from when it takes up work it must finish
/// until it is `idle` again. Waiting for work is idle, so a leader with nothing to do never
/// stalls. Each mark is one atomic operation: cheap enough for every batch.
#[derive(Clone)]
pub struct Pulse(Arc<Marks>);

struct Marks {
    origin: Instant,
    /// Milliseconds after `origin`, plus one, at which the unfinished work began; 0: idle.
    since: AtomicU64,
}

impl Default for Pulse {
    fn default() -> Pulse {
        Pulse(Arc::new(Marks {
            origin: Instant::now(),
            since: AtomicU64::new(0),
        }))
    }
}

impl Pulse {
    /// Work begins, unless unfinished work already had: a piece of work retried keeps the
    /// instant it began.
    pub fn working(&self) {
        let _ = self
            .0
            .since
            .compare_exchange(0, self.now(), Ordering::Relaxed, Ordering::Relaxed);
    }

    /// The work is done, or there is none.
    pub fn idle(&self) {
        self.0.since.store(0, Ordering::Relaxed);
    }

    /// The loop of a periodic leader service: `round` every `period` until `cancel`, each
    /// round marked as work.
    pub async fn every<F, Fut>(&self, period: Duration, cancel: &CancellationToken, mut round: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = ()>,
    {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(period) => {}
            }
            self.working();
            round().await;
            self.idle();
        }
    }

    /// Part of the work is done and more is under way: what is left counts from now.
    pub fn progressed(&self) {
        self.0.since.store(self.now(), Ordering::Relaxed);
    }

    /// Milliseconds after the origin, plus one: never the idle mark.
    fn now(&self) -> u64 {
        self.0.origin.elapsed().as_millis() as u64 + 1
    }

    /// How long the unfinished work has gone on; `None` while idle.
    pub fn working_for(&self) -> Option<Duration> {
        match self.0.since.load(Ordering::Relaxed) {
            0 => None,
            since => Some(
                self.0
                    .origin
                    .elapsed()
                    .saturating_sub(Duration::from_millis(since - 1)),
            ),
        }
    }
}

/// A leadership this replica gave up because a service made no progress.
#[derive(Debug, Clone, Serialize)]
pub struct Stall {
    pub service: &'static str,
    #[serde(with = "crate::domain::time::millis")]
    pub at: DateTime<Utc>,
    pub no_progress_ms: u64,
}

/// The replica's last stall, shared with `/ojs/v1/health`: set at the step-down, cleared
/// when this replica leads again.
#[derive(Clone, Default)]
pub struct Stalls(Arc<Mutex<Option<Stall>>>);

impl Stalls {
    pub fn last(&self) -> Option<Stall> {
        self.0.lock().expect("stalls lock").clone()
    }

    fn set(&self, stall: Option<Stall>) {
        *self.0.lock().expect("stalls lock") = stall;
    }

    pub(super) fn stepped_down(&self, service: &'static str, no_progress: Duration) {
        self.set(Some(Stall {
            service,
            at: Utc::now(),
            no_progress_ms: no_progress.as_millis() as u64,
        }));
    }

    pub(super) fn leads_again(&self) {
        self.set(None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_is_timed_from_when_it_began_and_idle_is_never_timed() {
        let pulse = Pulse::default();
        assert_eq!(pulse.working_for(), None);
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(pulse.working_for(), None, "waiting for work is not work");
        pulse.working();
        tokio::time::sleep(Duration::from_millis(60)).await;
        // Taken up again (a retry): still timed from the first mark.
        pulse.working();
        tokio::time::sleep(Duration::from_millis(60)).await;
        let took = pulse.working_for().expect("working");
        assert!(took >= Duration::from_millis(115), "{took:?}");
        pulse.idle();
        assert_eq!(pulse.working_for(), None);
        pulse.working();
        assert!(pulse.working_for().unwrap() < Duration::from_millis(50));
    }
}
