//! Bulk CANCEL, RETRY and DELETE by job id (`domain/bulk.rs`, architecture §4 "Bulk
//! operations"): each id goes through the single operation's own compare-and-set, 64 at a
//! time, and each outcome is reported. No job waits for another, so a crash mid-request
//! leaves each job either changed or not, never half.

use futures::{stream, StreamExt};

use super::Jobs;
use crate::domain::bulk::BulkOp;
use crate::domain::error::OjsError;
use crate::domain::lifecycle;

/// Jobs one bulk request changes at once.
const CONCURRENCY: usize = 64;

impl Jobs<'_> {
    /// Runs `op` on each of `ids`; the outcomes in the order of `ids`.
    pub async fn bulk(self, op: BulkOp, ids: &[String]) -> Vec<Result<(), OjsError>> {
        stream::iter(ids.iter().cloned())
            .map(|id| async move {
                match op {
                    BulkOp::Cancel => self.cancel(&id).await.map(drop),
                    BulkOp::Retry => self
                        .store
                        .dead_letter()
                        .retry(&id, lifecycle::retry_now)
                        .await
                        .map(drop),
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
    async fn delete_finished(self, id: &str) -> Result<(), OjsError> {
        self.store
            .dead_letter()
            .remove_job(id, |from| async move {
                let (record, revision) = self
                    .read(id, from)
                    .await?
                    .ok_or_else(|| OjsError::not_found("job", id))?;
                lifecycle::check_deletable(&record)?;
                Ok((record, revision))
            })
            .await
    }
}
