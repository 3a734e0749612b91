//! Leader service: removes finished jobs once they are older than
//! `finished_jobs_max_age_ms`, walking the jobs stream in sequence order — which is write
//! time order — behind a cursor stored in the coordinator bucket (architecture §3.13).

use std::time::Duration;

use chrono::Utc;
use futures::future::join_all;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::progress::Pulse;
use crate::domain::error::OjsError;
use crate::domain::retention::{aged, Aged};
use crate::store::{Store, StoredWrite, WriteBody};

/// Sequences read per round, concurrently.
const WINDOW: u64 = 64;
/// Pause when everything readable is done, or after a failure.
const IDLE: Duration = Duration::from_secs(1);

pub struct Pruner {
    store: Store,
    max_age: Duration,
    /// The leadership it prunes for: only behind that leadership's event publisher.
    term: u64,
    /// Where the next round starts: read from the bucket when leading starts and after a
    /// failure, kept in memory between.
    cursor: Option<u64>,
}

impl Pruner {
    pub fn new(store: Store, max_age: Duration, term: u64) -> Pruner {
        Pruner {
            store,
            max_age,
            term,
            cursor: None,
        }
    }

    /// Works (`pulse`) through each round.
    pub async fn run(mut self, cancel: CancellationToken, pulse: Pulse) {
        let version = self.store.nats_version();
        if purges_scan_the_stream(&version) {
            warn!(
                nats_version = %version,
                "this nats-server purges a finished job in time that grows with the jobs \
                 stream's size; on a large bucket pruning can fall behind and load NATS \
                 (nats-server 2.10 or newer does not; finished_jobs_max_age_ms = 0 turns \
                 pruning off)"
            );
        }
        while !cancel.is_cancelled() {
            pulse.working();
            let pause = self.run_once().await;
            pulse.idle();
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// One round: prunes what is due in the next window of the jobs stream; how long to
    /// wait before the next round (until the next job comes due, or a second when nothing
    /// is readable or the round failed).
    pub async fn run_once(&mut self) -> Duration {
        match self.round().await {
            Ok(pause) => pause,
            Err(err) => {
                warn!(error = %err, "pruning finished jobs failed; retrying");
                self.cursor = None;
                IDLE
            }
        }
    }

    /// Prunes what is due in the next window; returns how long to wait before the next round.
    async fn round(&mut self) -> Result<Duration, OjsError> {
        let from = match self.cursor {
            Some(next) => next,
            None => self.store.leader().pruner_cursor().await?,
        };
        let readable = self.store.leader().prunable_sequences(self.term).await?;
        // Sequences start at 1; an empty stream reports 0 as its first.
        let from = from.max(*readable.start()).max(1);
        if from > *readable.end() {
            self.cursor = Some(from);
            return Ok(IDLE);
        }
        let through = (*readable.end()).min(from + WINDOW - 1);
        let now = Utc::now();
        let mut next = through + 1;
        let mut pause = Duration::ZERO;
        let mut finished = Vec::new();
        for write in self.store.leader().stored_writes(from..=through).await? {
            let due = write.written_at + self.max_age;
            if due > now {
                next = write.sequence;
                pause = (due - now).to_std().unwrap_or_default();
                break;
            }
            if self.prunable(&write).await? {
                finished.push(write);
            }
        }
        let prunes = finished
            .iter()
            .map(|w| self.store.leader().prune_job(&w.job_id, w.sequence));
        for pruned in join_all(prunes).await {
            pruned?;
        }
        if next > from {
            self.store.leader().save_pruner_cursor(next).await?;
        }
        self.cursor = Some(next);
        Ok(pause)
    }

    async fn prunable(&self, write: &StoredWrite) -> Result<bool, OjsError> {
        Ok(match &write.body {
            WriteBody::Removed => true,
            WriteBody::Unreadable => false,
            WriteBody::Record(rec) => match aged(rec) {
                Aged::Prune => true,
                Aged::Keep => false,
                Aged::PruneUnlessInDeadLetter(entry) => {
                    !self.store.dead_letter().entries().exists(entry).await?
                }
            },
        })
    }
}

/// nats-server before 2.10 has no index from subjects to message blocks, so a filtered purge
/// visits every block of the stream (measured: architecture §3.13).
fn purges_scan_the_stream(version: &str) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor) < (2, 10),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_servers_before_2_10_scan_the_stream_to_purge() {
        assert!(purges_scan_the_stream("2.9.10"));
        assert!(!purges_scan_the_stream("2.10.0"));
        assert!(!purges_scan_the_stream("2.15.1"));
        assert!(!purges_scan_the_stream("3.0.0-beta"));
        assert!(!purges_scan_the_stream("unknown"));
    }
}
