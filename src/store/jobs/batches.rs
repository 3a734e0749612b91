//! The mark of a batch PUSH (architecture §4 PUSH): opened before its records, committed
//! before its messages, deleted once they are stored; and the leader's repair when the
//! batch's timer finds the mark still there. Decisions in `domain/batch.rs`.

use chrono::Utc;
use futures::future::join_all;
use tracing::warn;

use super::Jobs;
use crate::domain::batch::{self, Mark, Repair};
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::job::JobRecord;
use crate::domain::time;
use crate::store::cas::{self, Cas, Replica};
use crate::store::error::backend;
use crate::store::timers::{Timer, TimerKind};

/// Records read or removed at once when a batch is repaired or rolled back.
pub(in crate::store) const AT_ONCE: usize = 64;

/// A batch whose mark this PUSH opened, at the revision it wrote.
pub(in crate::store) struct OpenBatch {
    pub(in crate::store) id: String,
    revision: u64,
}

fn mark_bytes(mark: Mark) -> bytes::Bytes {
    serde_json::to_vec(&mark).expect("marks serialize").into()
}

impl Jobs {
    /// Stores the timer of batch `id` (due `batch_grace_ms` from now) and opens its mark,
    /// side by side: a mark without its timer has no records (they come after both) and
    /// goes with the bucket's max age; from here on a crash is finished or undone by the
    /// timer.
    pub(in crate::store) async fn open_batch(
        &self,
        id: &str,
        records: &[JobRecord],
    ) -> Result<OpenBatch, OjsError> {
        let timer = Timer {
            jobs: records.iter().map(|r| r.job.id.clone()).collect(),
            ..Timer::named(
                TimerKind::Batch,
                id,
                time::add(Utc::now(), self.conn.batch_grace),
            )
        };
        let stored = async {
            self.conn
                .stored(self.timers.send_timer(&timer).await?)
                .await
        };
        let doing = "opening a batch";
        let opened = cas::write(&self.own.batches, id, mark_bytes(Mark::Open), 0, doing);
        let (stored, opened) = tokio::join!(stored, opened);
        stored?;
        match opened? {
            Cas::Written(revision) => Ok(OpenBatch {
                id: id.to_owned(),
                revision,
            }),
            Cas::Refused(_) => Err(OjsError::backend("A new batch id was taken.")),
        }
    }

    /// Commits the batch: from here its jobs count. Refused when its timer or a retry of
    /// the batch aborted it first.
    pub(in crate::store) async fn commit_batch(&self, open: &OpenBatch) -> Result<(), OjsError> {
        let kv = &self.own.batches;
        let doing = "committing a batch";
        if let Cas::Written(_) = cas::write(
            kv,
            &open.id,
            mark_bytes(Mark::Committed),
            open.revision,
            doing,
        )
        .await?
        {
            return Ok(());
        }
        // Refused: aborted, or this very write still in flight (a stream leader change).
        match self.leave_open(&open.id, Mark::Committed).await? {
            Some(Mark::Committed) => Ok(()),
            _ => Err(OjsError::new(
                ErrorCode::BackendUnavailable,
                format!(
                    "The batch took longer than {} ms and was undone; retry it.",
                    self.conn.batch_grace.as_millis()
                ),
            )),
        }
    }

    /// Aborts batch `id` unless it committed: its mark as it is afterwards.
    pub(in crate::store) async fn abort_batch(&self, id: &str) -> Result<Option<Mark>, OjsError> {
        self.leave_open(id, Mark::Aborted).await
    }

    /// Moves batch `id`'s mark from `open` to `to` if it is still open: the mark as it is
    /// afterwards (`to`, or what another writer made it first).
    async fn leave_open(&self, id: &str, to: Mark) -> Result<Option<Mark>, OjsError> {
        let now = cas::change(&self.own.batches, id, "batch", id, |mark: Option<&Mark>| {
            (mark == Some(&Mark::Open)).then_some(to)
        })
        .await?;
        Ok(now.value)
    }

    /// The mark of batch `id`, read at the stream leader.
    pub(in crate::store) async fn batch_mark(&self, id: &str) -> Result<Option<Mark>, OjsError> {
        Ok(
            cas::read::<Mark>(&self.own.batches, id, Replica::Leader, "batch mark")
                .await?
                .value,
        )
    }

    /// Deletes a finished batch's mark, without waiting for it: one left behind is deleted
    /// by the batch's timer (which then finds every job published).
    pub(in crate::store) fn close_batch(&self, id: &str) {
        let (own, id) = (self.own.clone(), id.to_owned());
        tokio::spawn(async move {
            if let Err(err) = own.batches.delete(&id).await {
                warn!(batch_id = id, error = %err, "could not delete a batch mark");
            }
        });
    }

    /// Leader: a batch's grace has passed. A mark still there means its PUSH did not
    /// finish: an open batch is aborted and its records removed, a committed one gets the
    /// messages and timers its jobs still lack.
    ///
    /// # Errors
    /// When NATS fails; every step is repeatable, so the timer fires again.
    pub(in crate::store) async fn batch_timer_fired(&self, timer: &Timer) -> Result<(), OjsError> {
        let id = &timer.id;
        let mut repair = batch::repair(self.batch_mark(id).await?);
        if repair == Repair::Abort {
            repair = batch::repair(self.abort_batch(id).await?);
        }
        if repair == Repair::Nothing {
            return Ok(());
        }
        warn!(batch_id = %id, repair = ?repair, jobs = timer.jobs.len(), "a batch PUSH was cut short; repairing it");
        let mut untouched = Vec::new();
        for jobs in timer.jobs.chunks(AT_ONCE) {
            for read in join_all(jobs.iter().map(|job| self.read(job, Replica::Leader))).await {
                if let Some((rec, revision)) = read? {
                    if batch::untouched(&rec, id) {
                        untouched.push((rec, revision));
                    }
                }
            }
        }
        if repair == Repair::Publish {
            let records: Vec<JobRecord> = untouched.into_iter().map(|(rec, _)| rec).collect();
            self.publish_jobs(&records).await?;
        } else {
            let records: Vec<(&JobRecord, u64)> = untouched
                .iter()
                .map(|(rec, revision)| (rec, *revision))
                .collect();
            self.remove_untouched(&records).await?;
        }
        self.own
            .batches
            .delete(id)
            .await
            .map_err(backend("deleting a batch mark"))?;
        Ok(())
    }

    /// Removes records of an aborted batch, each at the revision it was read at: one
    /// written since (a client's cancel) stays.
    pub(in crate::store) async fn remove_untouched(
        &self,
        records: &[(&JobRecord, u64)],
    ) -> Result<(), OjsError> {
        for some in records.chunks(AT_ONCE) {
            let removals = some
                .iter()
                .map(|(rec, revision)| self.remove_record(rec, *revision));
            for removed in join_all(removals).await {
                removed?;
            }
        }
        Ok(())
    }

    /// A create of batch member `rec` found `found` (at `revision`) in its place: when
    /// that record is left over from another batch that never committed, aborts that
    /// batch, removes the record and says so, so the create can be made again.
    pub(in crate::store) async fn take_over(
        &self,
        found: &JobRecord,
        revision: u64,
    ) -> Result<bool, OjsError> {
        let Some(other) = found.batch.as_deref() else {
            return Ok(false);
        };
        let mut mark = self.batch_mark(other).await?;
        if mark == Some(Mark::Open) {
            mark = self.abort_batch(other).await?;
        }
        if !batch::left_over(found, mark) {
            return Ok(false);
        }
        self.remove_untouched(&[(found, revision)]).await?;
        Ok(true)
    }
}
