//! Leader service: removes finished jobs once they are older than
//! `finished_jobs_max_age_secs`, walking the jobs stream in sequence order — which is write
//! time order — behind a cursor stored in the coordinator bucket (architecture §3.13).

use std::time::Duration;

use chrono::Utc;
use futures::future::join_all;
use tokio_util::sync::CancellationToken;
use tracing::warn;

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
}

impl Pruner {
    pub fn new(store: Store, max_age: Duration) -> Pruner {
        Pruner { store, max_age }
    }

    pub async fn run(self, cancel: CancellationToken) {
        // Read from the bucket when leading starts and after a failure; kept in memory between.
        let mut cursor = None;
        while !cancel.is_cancelled() {
            let pause = match self.round(&mut cursor).await {
                Ok(pause) => pause,
                Err(err) => {
                    warn!(error = %err, "pruning finished jobs failed; retrying");
                    cursor = None;
                    IDLE
                }
            };
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// Prunes what is due in the next window; returns how long to wait before the next round.
    async fn round(&self, cursor: &mut Option<u64>) -> Result<Duration, OjsError> {
        let from = match *cursor {
            Some(next) => next,
            None => self.store.pruner_cursor().await?,
        };
        let readable = self.store.prunable_sequences().await?;
        let from = from.max(*readable.start());
        if from > *readable.end() {
            *cursor = Some(from);
            return Ok(IDLE);
        }
        let through = (*readable.end()).min(from + WINDOW - 1);
        let now = Utc::now();
        let mut next = through + 1;
        let mut pause = Duration::ZERO;
        let mut finished = Vec::new();
        for write in self.store.stored_writes(from..=through).await? {
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
            .map(|w| self.store.prune_job(&w.job_id, w.sequence));
        for pruned in join_all(prunes).await {
            pruned?;
        }
        if next > from {
            self.store.save_pruner_cursor(next).await?;
        }
        *cursor = Some(next);
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
                    !self.store.dead_letter_entry_exists(entry).await?
                }
            },
        })
    }
}
