//! Job records in the jobs bucket: the read, the one compare-and-set write every
//! transition goes through (with the size check), what must be stored before a write
//! (`prepare`), the queue message of a dispatch, and INFO. The operations built on them
//! live beside: `enqueue.rs`, `fetch.rs`, `transitions.rs`; docs/architecture.md §4 gives
//! the order of their NATS calls and what a crash between two of them leaves.

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::{message::PublishMessage, AckKind};
use chrono::Utc;
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::Jobs;
use crate::domain::envelope::too_large;
use crate::domain::error::OjsError;
use crate::domain::job::{Job, JobRecord, Transition};
use crate::domain::lifecycle;
use crate::domain::retry::OnExhaustion;
use crate::domain::state::JobState;
use crate::domain::trail;
use crate::store::cas::{self, Cas, Replica};
use crate::store::deadline::answered;
use crate::store::error::{nats_failed, refusal};
use crate::store::publish::Sent;
use crate::store::timers::Timer;

/// A queue message or timer whose job record does not show up within this time came from an
/// enqueue that died between its writes (or was rolled back); it is dropped. Younger ones
/// are looked at again: a PUSH publishes them before it creates the record, and may wait out
/// a NATS election in between (architecture §4, "NATS goes away").
pub(in crate::store) const ORPHAN_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

/// What the jobs bucket holds for an id.
pub(in crate::store) enum Lookup {
    Found(Box<JobRecord>, u64),
    /// Deleted or purged (a rolled-back batch): its queue messages are spent.
    Removed,
    Missing,
}

/// The body of a queue message: which job, and which dispatch of it.
#[derive(Debug, Serialize, Deserialize)]
pub(in crate::store) struct Dispatch {
    pub(in crate::store) id: String,
    pub(in crate::store) dispatch: u64,
}

/// The record before and after a settling operation (ACK, FAIL, CANCEL).
#[derive(Debug, Clone)]
pub struct Settled {
    pub before: JobRecord,
    pub after: JobRecord,
}

impl Jobs {
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
    pub(in crate::store) async fn send_dispatch(&self, rec: &JobRecord) -> Result<Sent, OjsError> {
        let t = &self.conn.topology;
        let body = serde_json::to_vec(&Dispatch {
            id: rec.job.id.clone(),
            dispatch: rec.dispatch,
        })
        .expect("dispatch serializes");
        self.conn
            .send(
                t.queue_subject(&rec.job.queue, rec.job.priority).into(),
                // No Nats-Msg-Id: a repeated publish must never be dropped (a client's retry
                // after an orphaned first attempt needs its message); FETCH drops the spare.
                PublishMessage::build().payload(body.into()),
                "publishing a job to its queue",
            )
            .await
    }

    /// What must be stored before a transition is written, so that no crash between the two
    /// can strand the job: the queue message of a new dispatch, the timer of a retry wait,
    /// the dead-letter entry of a discard into the dead letter queue (whose sequence the
    /// record then names).
    pub(in crate::store) async fn prepare(
        &self,
        before: &JobRecord,
        after: &mut JobRecord,
    ) -> Result<(), OjsError> {
        if after.job.state == JobState::Available && after.dispatch > before.dispatch {
            self.queues
                .own
                .registry
                .ensure(&after.job.queue, after.job.priority, Utc::now())
                .await?;
            self.conn.stored(self.send_dispatch(after).await?).await?;
        }
        if let (JobState::Retryable, Some(due)) = (after.job.state, lifecycle::due_at(after)) {
            if before.job.state != JobState::Retryable {
                self.conn
                    .stored(self.timers.send_timer(&Timer::promote(after, due)).await?)
                    .await?;
            }
        }
        let dead_lettered = after.job.state == JobState::Discarded
            && before.job.state != JobState::Discarded
            && after.transition == Transition::Failed
            && after.job.retry.on_exhaustion == OnExhaustion::DeadLetter;
        if dead_lettered {
            after.dead_letter = Some(self.dead_letter.add(after).await?);
        }
        Ok(())
    }

    /// The record and its revision; `None` for unknown or removed ids.
    pub(in crate::store) async fn read(
        &self,
        id: &str,
        from: Replica,
    ) -> Result<Option<(JobRecord, u64)>, OjsError> {
        Ok(match self.lookup(id, from).await? {
            Lookup::Found(rec, revision) => Some((*rec, revision)),
            Lookup::Removed | Lookup::Missing => None,
        })
    }

    pub(in crate::store) async fn lookup(
        &self,
        id: &str,
        from: Replica,
    ) -> Result<Lookup, OjsError> {
        if crate::domain::envelope::parse_job_id(id).is_none() {
            return Ok(Lookup::Missing);
        }
        let doing = "reading a job";
        let mut last = cas::last(&self.own.kv, id, from, doing).await?;
        if last.is_none() && from == Replica::Nearest {
            // Only the leader may declare a job missing: a replica still catching up (a
            // node rejoining after a partition) does not have the jobs written meanwhile,
            // and a FETCH would drop their messages, an ACK answer 404.
            last = cas::last(&self.own.kv, id, Replica::Leader, doing).await?;
        }
        match last {
            Some(last) => found(id, last.value.as_deref(), last.revision),
            None => Ok(Lookup::Missing),
        }
    }

    /// Writes `rec` in place of `before` if the record is still at `revision`, with the
    /// trail of the writes before it whose events may not be stored yet.
    pub(in crate::store) async fn write(
        &self,
        id: &str,
        before: &JobRecord,
        rec: &mut JobRecord,
        revision: u64,
    ) -> Result<Cas, OjsError> {
        rec.trail = trail::carry(before, revision, self.events.own.handled.through());
        rec.from = Some(before.job.state);
        let bytes = rec.to_bytes();
        if bytes.len() > self.conn.max_record_bytes {
            let mut err = too_large("job", bytes.len(), self.conn.max_record_bytes);
            err.message = format!(
                "This would make job {id} {} bytes, over the maximum of {} bytes: send a smaller result or error.",
                bytes.len(),
                self.conn.max_record_bytes
            );
            return Err(err);
        }
        cas::write(&self.own.kv, id, bytes.into(), revision, "writing a job").await
    }
}

impl Jobs {
    /// Removes the record `rec` if the job is still at `revision`: a KV delete marker, with
    /// the queue and state it leaves in headers (`Ojs-Queue`, `Ojs-State`) so that the
    /// queue statistics count the removal from the marker alone (architecture §3.17). Not a
    /// purge: on nats-server 2.9 a purge of one subject moves every consumer of the stream
    /// past the writes of other jobs it has not delivered yet, the event publisher's among
    /// them. The job's earlier writes stay until the pruner removes the job (§3.13).
    ///
    /// Sent again while NATS does not answer; a marker refused after silence is looked up
    /// at the stream leader: a removal as the key's first write after `revision` means one
    /// landed.
    ///
    /// # Errors
    /// When NATS failed, or did not answer by the deadline.
    pub(in crate::store) async fn remove_record(
        &self,
        rec: &JobRecord,
        revision: u64,
    ) -> Result<Cas, OjsError> {
        let doing = "removing a job";
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("KV-Operation", "DEL");
        headers.insert(
            "Nats-Expected-Last-Subject-Sequence",
            revision.to_string().as_str(),
        );
        headers.insert(REMOVED_QUEUE, rec.job.queue.as_str());
        headers.insert(REMOVED_STATE, rec.job.state.as_str());
        let subject = format!("$KV.{}.{}", self.conn.topology.jobs_bucket(), rec.job.id);
        let js = &self.conn.js;
        let answer = answered(doing, || async {
            js.publish_with_headers(subject.clone(), headers.clone(), bytes::Bytes::new())
                .await?
                .await
        })
        .await?;
        let err = match answer.said {
            Ok(ack) => return Ok(Cas::Written(ack.sequence)),
            Err(err) => err,
        };
        match refusal(&err, PublishErrorKind::WrongLastSequence) {
            Some(_) if answer.after_silence => {
                cas::landed(&self.own.kv, &rec.job.id, revision, doing, |first| {
                    first.is_none()
                })
                .await
            }
            Some(why) => Ok(Cas::Refused(why)),
            None => Err(nats_failed(doing, err)),
        }
    }
}

/// Headers of a removal marker naming the queue and state of the record it removed.
pub(in crate::store) const REMOVED_QUEUE: &str = "Ojs-Queue";
pub(in crate::store) const REMOVED_STATE: &str = "Ojs-State";

/// A stored value of the jobs bucket as a [`Lookup`]: a record, or (`None`) a removal
/// marker.
pub(in crate::store) fn found(
    id: &str,
    value: Option<&[u8]>,
    revision: u64,
) -> Result<Lookup, OjsError> {
    let Some(value) = value else {
        return Ok(Lookup::Removed);
    };
    let rec = serde_json::from_slice(value).map_err(|err| {
        OjsError::backend(format!("Job record {id} is unreadable.")).with_source(err)
    })?;
    Ok(Lookup::Found(Box::new(rec), revision))
}

/// Acknowledges, extends or rejects a delivered message; a lost ack is repaired by redelivery.
pub(in crate::store) async fn settle(msg: &async_nats::jetstream::Message, kind: AckKind) {
    if let Err(err) = msg.ack_with(kind).await {
        warn!(error = %err, "could not settle a queue message");
    }
}
