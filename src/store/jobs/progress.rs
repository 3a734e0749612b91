//! Progress reports (progress spec §6): each is a heartbeat that also carries progress,
//! written to the job record by compare-and-set. The gateway's throttle spaces the writes
//! of one job a second apart; reports in between gather into the next write, which a
//! task of this gateway makes at the end of the second (architecture §3.22, §4 PROGRESS).

use tokio::time::Instant;
use tracing::debug;

use super::Jobs;
use crate::domain::error::OjsError;
use crate::domain::job::Job;
use crate::domain::lifecycle;
use crate::domain::progress::{self, Admit, Update};

/// What became of a progress report.
#[derive(Debug)]
pub enum Reported {
    /// Written: the job as it is now.
    Written(Job),
    /// Ignored (progress spec §6.1): the job as it is, not active or not the sender's.
    Ignored(Job),
    /// Within a second of the job's last progress write: it goes into the next one.
    Throttled,
}

impl Jobs {
    /// Reports `update` on job `id`.
    ///
    /// # Errors
    /// 404 for an unknown job; NATS failures.
    pub async fn report_progress(&self, id: &str, update: Update) -> Result<Reported, OjsError> {
        let admitted = self
            .own
            .progress
            .lock()
            .expect("progress throttle lock")
            .admit(id, update, Instant::now().into_std());
        match admitted {
            Admit::Now(update) => self.write_progress(id, &update).await,
            Admit::FlushAt(at) => {
                let jobs = self.clone();
                let id = id.to_owned();
                tokio::spawn(async move {
                    tokio::time::sleep_until(at.into()).await;
                    let gathered = jobs
                        .own
                        .progress
                        .lock()
                        .expect("progress throttle lock")
                        .flush(&id, Instant::now().into_std());
                    if let Some(update) = gathered {
                        // Best effort, like the report itself: the job may have ended.
                        if let Err(err) = jobs.write_progress(&id, &update).await {
                            debug!(job_id = %id, error = %err, "a gathered progress write failed");
                        }
                    }
                });
                Ok(Reported::Throttled)
            }
            Admit::Merged => Ok(Reported::Throttled),
        }
    }

    async fn write_progress(&self, id: &str, update: &Update) -> Result<Reported, OjsError> {
        let default = self.conn.visibility_timeout;
        let settled = self
            .transition(id, |rec, now| {
                let visibility = lifecycle::beat_visibility(rec, None, default);
                Ok(progress::apply(rec, now, update, visibility))
            })
            .await?;
        Ok(if settled.after == settled.before {
            Reported::Ignored(settled.after.job)
        } else {
            Reported::Written(settled.after.job)
        })
    }
}
