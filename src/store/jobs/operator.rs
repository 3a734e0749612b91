//! An operator's retry and removal of finished jobs, one at a time (the dead letter queue's
//! retry and delete) or in bulk: CANCEL, RETRY and DELETE by job id (`domain/bulk.rs`,
//! architecture §4 "Bulk operations"), where each id goes through the single operation's
//! own compare-and-set, 64 at a time, and each outcome is reported. No job waits for
//! another, so a crash mid-request leaves each job either changed or not, never half.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::{stream, StreamExt};

use super::Jobs;
use crate::domain::bulk::BulkOp;
use crate::domain::error::OjsError;
use crate::domain::job::{Job, JobRecord};
use crate::domain::lifecycle;
use crate::store::cas::{gave_up, pause_after, Cas, Replica, MAX_CAS_ATTEMPTS};

/// Jobs one bulk request changes at once.
const CONCURRENCY: usize = 64;

impl Jobs {
    /// Runs `op` on each of `ids`; the outcomes in the order of `ids`.
    pub async fn bulk(&self, op: BulkOp, ids: &[String]) -> Vec<Result<(), OjsError>> {
        stream::iter(ids.iter().cloned())
            .map(|id| async move {
                match op {
                    BulkOp::Cancel => self.cancel(&id).await.map(drop),
                    BulkOp::Retry => self.retry(&id, lifecycle::retry_now).await.map(drop),
                    BulkOp::Delete => self.delete_finished(&id).await,
                }
            })
            .buffered(CONCURRENCY)
            .collect()
            .await
    }

    /// Removes a finished job for good: its record, and its dead-letter entry if it has one.
    ///
    /// # Errors
    /// 404 unknown job; 409 for a job not finished or in a workflow (`check_deletable`).
    async fn delete_finished(&self, id: &str) -> Result<(), OjsError> {
        self.remove_job(id, |from| async move {
            let (record, revision) = self
                .read(id, from)
                .await?
                .ok_or_else(|| OjsError::not_found("job", id))?;
            lifecycle::check_deletable(&record)?;
            Ok((record, revision))
        })
        .await
    }

    /// A retry decided by `decide`; a job that was in the dead letter queue leaves it. A
    /// finished job of a bounded queue takes a place in it first (429 `queue_full` when
    /// there is none), given back when the retry is refused.
    pub(in crate::store) async fn retry(
        &self,
        id: &str,
        decide: fn(&JobRecord, DateTime<Utc>) -> Result<JobRecord, OjsError>,
    ) -> Result<Job, OjsError> {
        let (found, revision) = self
            .read(id, Replica::Nearest)
            .await?
            .ok_or_else(|| OjsError::not_found("job", id))?;
        let mut tokens = Vec::new();
        let mut token = None;
        if found.job.state.is_terminal() {
            let mut taking = [found.clone()];
            tokens = self.take_depth_tokens(&mut taking, Duration::ZERO).await?;
            token = taking[0].depth_token;
        }
        let settled = self
            .transition_from(id, Some((found, revision)), |rec, now| {
                let mut next = decide(rec, now)?;
                if rec.job.state.is_terminal() {
                    next.depth_token = token;
                }
                Ok(Some(next))
            })
            .await;
        let settled = match settled {
            Ok(settled) => settled,
            Err(err) => {
                self.give_back_unheld(&tokens).await;
                return Err(err);
            }
        };
        if let Some(seq) = settled.before.dead_letter {
            self.dead_letter.drop_entry(seq).await;
        }
        Ok(settled.after.job)
    }

    /// Removes the record `find` reads and accepts, then its dead-letter entry if it has one.
    /// The removal names the revision `find` decided on, so a job changed meanwhile (retried,
    /// say) is decided again, never lost.
    ///
    /// # Errors
    /// What `find` refuses with; 409 when the job keeps changing.
    pub(in crate::store) async fn remove_job<F, Fut>(
        &self,
        id: &str,
        find: F,
    ) -> Result<(), OjsError>
    where
        F: Fn(Replica) -> Fut,
        Fut: Future<Output = Result<(JobRecord, u64), OjsError>>,
    {
        let mut raced = None;
        for round in 0..MAX_CAS_ATTEMPTS {
            let (record, revision) = find(Replica::after(raced.is_some())).await?;
            match self.remove_record(&record, revision).await? {
                Cas::Written(_) => {
                    self.conn.failpoint("dead_letter.purged").await;
                    if let Some(entry) = record.dead_letter {
                        self.dead_letter.drop_entry(entry).await;
                    }
                    return Ok(());
                }
                Cas::Refused(why) => {
                    raced = Some(why);
                    pause_after(why, round).await;
                }
            }
        }
        Err(gave_up("job", id, raced))
    }
}
