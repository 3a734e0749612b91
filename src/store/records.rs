//! Job records in the jobs bucket: the read, the one compare-and-set write every
//! transition goes through (with the size check), what must be stored before a write
//! (`prepare`), the queue message of a dispatch, and INFO. The operations built on them
//! live beside: `enqueue.rs`, `fetch.rs`, `transitions.rs`; docs/architecture.md §4 gives
//! the order of their NATS calls and what a crash between two of them leaves.

use async_nats::jetstream::stream::LastRawMessageErrorKind;
use async_nats::jetstream::{context::PublishAckFuture, kv, message::PublishMessage, AckKind};
use chrono::Utc;
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::error::{backend, nats_failed, refusal, Refused};
use super::timers::Timer;
use super::Store;
use crate::domain::envelope::too_large;
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::job::{Job, JobRecord, Transition};
use crate::domain::lifecycle;
use crate::domain::retry::OnExhaustion;
use crate::domain::state::JobState;
use crate::domain::trail;

/// Compare-and-set attempts before an operation gives up under contention.
pub(super) const MAX_CAS_ATTEMPTS: usize = 16;
/// What the jobs bucket holds for an id.
/// Which replica of the jobs stream answers a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Replica {
    /// Any (a direct get: the nearest answers).
    Nearest,
    /// The stream's leader. After a lost compare-and-set: a replica that lags (a node
    /// rejoining after a partition, answering the direct gets of the clients connected to
    /// it) would return the revision that just lost, round after round, until the
    /// operation gave up with 409.
    Leader,
}

impl Replica {
    /// The replica to read from after a compare-and-set was or was not refused.
    pub(super) fn after(lost_race: bool) -> Replica {
        if lost_race {
            Replica::Leader
        } else {
            Replica::Nearest
        }
    }
}

pub(super) enum Lookup {
    Found(Box<JobRecord>, u64),
    /// Deleted or purged (a rolled-back batch): its queue messages are spent.
    Removed,
    Missing,
}

/// The body of a queue message: which job, and which dispatch of it.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Dispatch {
    pub(super) id: String,
    pub(super) dispatch: u64,
}

/// The record before and after a settling operation (ACK, FAIL, CANCEL).
#[derive(Debug, Clone)]
pub struct Settled {
    pub before: JobRecord,
    pub after: JobRecord,
}

impl Store {
    /// INFO (core §7.7).
    ///
    /// # Errors
    /// 404 for an unknown id.
    pub async fn info(&self, id: &str) -> Result<Job, OjsError> {
        match self.read(id, Replica::Nearest).await? {
            Some((rec, _)) => Ok(rec.job),
            None => Err(OjsError::not_found("job", id)),
        }
    }

    /// Publishes the queue message of the record's current dispatch.
    pub(super) async fn send_dispatch(
        &self,
        rec: &JobRecord,
    ) -> Result<PublishAckFuture, OjsError> {
        let t = &self.inner.topology;
        let body = serde_json::to_vec(&Dispatch {
            id: rec.job.id.clone(),
            dispatch: rec.dispatch,
        })
        .expect("dispatch serializes");
        self.inner
            .js
            .send_publish(
                t.queue_subject(&rec.job.queue, rec.job.priority),
                // No Nats-Msg-Id: a repeated publish must never be dropped (a client's retry
                // after an orphaned first attempt needs its message); FETCH drops the spare.
                PublishMessage::build().payload(body.into()),
            )
            .await
            .map_err(backend("publishing a job to its queue"))
    }

    /// What must be stored before a transition is written, so that no crash between the two
    /// can strand the job: the queue message of a new dispatch, the timer of a retry wait,
    /// the dead-letter entry of a discard into the dead letter queue (whose sequence the
    /// record then names).
    pub(super) async fn prepare(
        &self,
        before: &JobRecord,
        after: &mut JobRecord,
    ) -> Result<(), OjsError> {
        if after.job.state == JobState::Available && after.dispatch > before.dispatch {
            self.inner
                .queues
                .ensure(&after.job.queue, after.job.priority, Utc::now())
                .await?;
            self.send_dispatch(after)
                .await?
                .await
                .map_err(backend("publishing a job to its queue"))?;
        }
        if let (JobState::Retryable, Some(due)) = (after.job.state, lifecycle::due_at(after)) {
            if before.job.state != JobState::Retryable {
                self.send_timer(&Timer::promote(after, due))
                    .await?
                    .await
                    .map_err(backend("publishing a timer"))?;
            }
        }
        let dead_lettered = after.job.state == JobState::Discarded
            && before.job.state != JobState::Discarded
            && after.transition == Transition::Failed
            && after.job.retry.on_exhaustion == OnExhaustion::DeadLetter;
        if dead_lettered {
            after.dead_letter = Some(self.add_dead_letter(after).await?);
        }
        Ok(())
    }

    /// The record and its revision; `None` for unknown or removed ids.
    pub(super) async fn read(
        &self,
        id: &str,
        from: Replica,
    ) -> Result<Option<(JobRecord, u64)>, OjsError> {
        Ok(match self.lookup(id, from).await? {
            Lookup::Found(rec, revision) => Some((*rec, revision)),
            Lookup::Removed | Lookup::Missing => None,
        })
    }

    pub(super) async fn lookup(&self, id: &str, from: Replica) -> Result<Lookup, OjsError> {
        if crate::domain::envelope::parse_job_id(id).is_none() {
            return Ok(Lookup::Missing);
        }
        if from == Replica::Leader {
            return self.lookup_at_leader(id).await;
        }
        let entry = self
            .inner
            .jobs
            .entry(id)
            .await
            .map_err(backend("reading a job"))?;
        match entry {
            Some(e) => found(id, e.operation == kv::Operation::Put, &e.value, e.revision),
            // Only the leader may declare a job missing: a replica still catching up (a
            // node rejoining after a partition) does not have the jobs written meanwhile,
            // and a FETCH would drop their messages, an ACK answer 404.
            None => self.lookup_at_leader(id).await,
        }
    }

    async fn lookup_at_leader(&self, id: &str) -> Result<Lookup, OjsError> {
        let subject = format!("$KV.{}.{id}", self.inner.topology.jobs_bucket());
        match self
            .inner
            .jobs
            .stream
            .get_last_raw_message_by_subject(&subject)
            .await
        {
            Ok(m) => {
                let put = m.headers.get("KV-Operation").is_none();
                found(id, put, &m.payload, m.sequence)
            }
            Err(err) if err.kind() == LastRawMessageErrorKind::NoMessageFound => {
                Ok(Lookup::Missing)
            }
            Err(err) => Err(backend("reading a job")(err)),
        }
    }

    /// Writes `rec` in place of `before` if the record is still at `revision`, with the
    /// trail of the writes before it whose events may not be stored yet.
    pub(super) async fn write(
        &self,
        id: &str,
        before: &JobRecord,
        rec: &mut JobRecord,
        revision: u64,
    ) -> Result<Cas, OjsError> {
        rec.trail = trail::carry(before, revision, self.inner.handled.through());
        let bytes = rec.to_bytes();
        if bytes.len() > self.inner.max_record_bytes {
            let mut err = too_large("job", bytes.len(), self.inner.max_record_bytes);
            err.message = format!(
                "This would make job {id} {} bytes, over the maximum of {} bytes: send a smaller result or error.",
                bytes.len(),
                self.inner.max_record_bytes
            );
            return Err(err);
        }
        match self.inner.jobs.update(id, bytes.into(), revision).await {
            Ok(rev) => Ok(Cas::Written(rev)),
            Err(err) => match refusal(&err, kv::UpdateErrorKind::WrongLastRevision) {
                Some(why) => Ok(Cas::Refused(why)),
                None => Err(nats_failed("writing a job", err)),
            },
        }
    }
}

/// A stored value of the jobs bucket as a [`Lookup`]: a record, or a removal marker.
fn found(id: &str, put: bool, value: &[u8], revision: u64) -> Result<Lookup, OjsError> {
    if !put {
        return Ok(Lookup::Removed);
    }
    let rec = serde_json::from_slice(value).map_err(|err| {
        OjsError::backend(format!("Job record {id} is unreadable.")).with_source(err)
    })?;
    Ok(Lookup::Found(Box::new(rec), revision))
}

/// What a compare-and-set write of a job record came to.
pub(super) enum Cas {
    Written(u64),
    Refused(Refused),
}

/// Before the next round after a refused write: none after an outdated revision (read
/// again at once, from the leader), a pause growing from 10 ms to 320 ms while another
/// write of the job is in flight (16 rounds wait 3.8 s at most).
pub(super) async fn pause_after(refused: Refused, round: usize) {
    if refused == Refused::InFlight {
        tokio::time::sleep(std::time::Duration::from_millis(10 << round.min(5))).await;
    }
}

/// The answer when every compare-and-set round on the job's record was refused: 409 when
/// other writers kept winning, 503 (retry shortly) when NATS kept holding another write of
/// it in flight — a stream leader change, not a conflict.
pub(super) fn gave_up(id: &str, last: Option<Refused>) -> OjsError {
    match last {
        Some(Refused::InFlight) => OjsError::new(
            ErrorCode::BackendUnavailable,
            format!("NATS kept another write of job '{id}' in flight; retry shortly."),
        ),
        _ => OjsError::new(
            ErrorCode::Conflict,
            format!("Job '{id}' is changing too fast; retry."),
        ),
    }
}

/// Acknowledges, extends or rejects a delivered message; a lost ack is repaired by redelivery.
pub(super) async fn settle(msg: &async_nats::jetstream::Message, kind: AckKind) {
    if let Err(err) = msg.ack_with(kind).await {
        warn!(error = %err, "could not settle a queue message");
    }
}
