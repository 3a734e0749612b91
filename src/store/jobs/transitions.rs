//! ACK, FAIL, CANCEL and ACTIVATE (core §7.3–§7.5), and the read-decide-write loop every
//! transition goes through, also those of the timers and dead workers: the decision is a
//! `domain::lifecycle` function, the write a compare-and-set (docs/architecture.md §4).

use chrono::{DateTime, Utc};
use serde_json::Value;
use tracing::warn;

use super::records::Settled;
use super::Jobs;
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::job::{Job, JobRecord};
use crate::domain::lifecycle::{self, Failure};
use crate::domain::state::JobState;
use crate::store::cas::{gave_up, pause_after, Cas, Replica, MAX_CAS_ATTEMPTS};

impl Jobs {
    /// ACK (core §7.3).
    ///
    /// # Errors
    /// 404 unknown job; 409 when it is not active or held by another worker.
    pub async fn ack(
        &self,
        id: &str,
        worker_id: Option<&str>,
        result: Option<Value>,
    ) -> Result<Settled, OjsError> {
        let settled = self
            .transition(id, |rec, now| {
                lifecycle::complete(rec, now, worker_id, result.clone()).map(Some)
            })
            .await?;
        self.release(&settled).await;
        Ok(settled)
    }

    /// FAIL (core §7.4).
    ///
    /// # Errors
    /// 404 unknown job; 409 when it is not active or held by another worker.
    pub async fn fail(
        &self,
        id: &str,
        worker_id: Option<&str>,
        failure: &Failure,
        requeue: bool,
    ) -> Result<Settled, OjsError> {
        let jitter = rand::random_range(0.5..1.5);
        let settled = self
            .transition(id, |rec, now| {
                lifecycle::fail(rec, now, worker_id, failure, requeue, jitter).map(Some)
            })
            .await?;
        self.release(&settled).await;
        Ok(settled)
    }

    /// CANCEL (core §7.6). Cancelling a cancelled job changes nothing.
    ///
    /// # Errors
    /// 404 unknown job; 409 for a completed or discarded job.
    pub async fn cancel(&self, id: &str) -> Result<Settled, OjsError> {
        let settled = self.transition(id, lifecycle::cancel).await?;
        self.release(&settled).await;
        Ok(settled)
    }

    /// ACTIVATE (HTTP binding §9.5): a pending job becomes available.
    ///
    /// # Errors
    /// 404 unknown job; 409 when it is not pending.
    pub async fn activate(&self, id: &str) -> Result<Job, OjsError> {
        let settled = self
            .transition(id, |rec, now| {
                if rec.job.workflow_id.is_some() {
                    return Err(OjsError::new(
                        ErrorCode::Conflict,
                        format!(
                            "Job {id} belongs to a workflow, which starts it when its turn comes."
                        ),
                    ));
                }
                lifecycle::activate(rec, now).map(Some)
            })
            .await?;
        Ok(settled.after.job)
    }

    /// A waiting job's new priority (priority spec §8.1): an available one is dispatched
    /// again in its new priority's lane (`prepare` publishes that message before the write;
    /// the old message is spent once the write lands, and orphaned if it does not).
    ///
    /// # Errors
    /// 404 unknown job; 409 when it is not available, scheduled or pending.
    pub async fn reprioritize(&self, id: &str, priority: i32) -> Result<Settled, OjsError> {
        self.transition(id, |rec, _| lifecycle::reprioritize(rec, priority))
            .await
    }

    /// Reads, decides with `decide`, stores what the decision needs first (`prepare`),
    /// writes with a revision check, and retries the whole decision when another writer came
    /// first.
    pub(in crate::store) async fn transition<F>(
        &self,
        id: &str,
        decide: F,
    ) -> Result<Settled, OjsError>
    where
        F: Fn(&JobRecord, DateTime<Utc>) -> Result<Option<JobRecord>, OjsError>,
    {
        self.transition_from(id, None, decide).await
    }

    /// `transition`, whose first try uses `ahead` (a record and its revision read earlier)
    /// if given, else the record this gateway wrote last (`recent.rs`), instead of a read.
    pub(in crate::store) async fn transition_from<F>(
        &self,
        id: &str,
        mut ahead: Option<(JobRecord, u64)>,
        decide: F,
    ) -> Result<Settled, OjsError>
    where
        F: Fn(&JobRecord, DateTime<Utc>) -> Result<Option<JobRecord>, OjsError>,
    {
        let mut raced = None;
        let mut confirming = false;
        for attempt in 0..MAX_CAS_ATTEMPTS {
            let guess = (attempt == 0)
                .then(|| ahead.take().or_else(|| self.own.recent.take(id)))
                .flatten();
            let guessed = guess.is_some();
            let from = Replica::after(raced.is_some() || confirming);
            let (before, revision) = match guess {
                Some(found) => found,
                None => self
                    .read(id, from)
                    .await?
                    .ok_or_else(|| OjsError::not_found("job", id))?,
            };
            let mut after = match decide(&before, Utc::now()) {
                Ok(Some(after)) => after,
                // A remembered record only ever decides a write; a refusal or "nothing to
                // do" is decided on a fresh read, and one from the nearest replica is
                // confirmed on the stream leader's copy: a replica catching up (a node
                // rejoining a cluster) may still show an earlier state.
                _ if guessed => continue,
                _ if from == Replica::Nearest => {
                    confirming = true;
                    continue;
                }
                Ok(None) => {
                    return Ok(Settled {
                        after: before.clone(),
                        before,
                    })
                }
                Err(err) => return Err(err),
            };
            self.prepare(&before, &mut after).await?;
            self.conn.failpoint("transition.prepared").await;
            match self.write(id, &before, &mut after, revision).await? {
                Cas::Written(written) => {
                    self.conn.failpoint("transition.written").await;
                    if after.job.state == JobState::Active {
                        self.own.recent.remember(id, after.clone(), written);
                    }
                    return Ok(Settled { before, after });
                }
                Cas::Refused(why) => {
                    raced = Some(why);
                    pause_after(why, attempt).await;
                }
            }
        }
        Err(gave_up("job", id, raced))
    }

    /// After a job leaves `active`, its running place (under a concurrency limit) is freed
    /// and its queue message acknowledged through the subject stored at claim time — from
    /// whichever replica runs this. Best effort: a lost ack only means JetStream redelivers
    /// the message later, and FETCH drops it as spent; a place left taken is freed by the
    /// leader's sweep.
    pub(in crate::store) async fn release(&self, settled: &Settled) {
        self.let_go(settled, "+ACK").await;
    }

    /// `release`, settling the message with `reply` (`+ACK`: spent; `-NAK`: deliver it
    /// again, for a job available again under the same dispatch).
    pub(in crate::store) async fn let_go(&self, settled: &Settled, reply: &'static str) {
        let Some(holder) = &settled.before.holder else {
            return;
        };
        if settled.after.holder.is_some() {
            return;
        }
        if let Some(sequence) = holder.slot {
            self.queues
                .give_back_slot(&settled.after.job.queue, sequence)
                .await;
        }
        if let Err(err) = self
            .conn
            .client
            .publish(holder.ack_subject.clone(), reply.into())
            .await
        {
            warn!(job_id = %settled.after.job.id, error = %err, "could not settle a job's queue message");
        }
    }
}
