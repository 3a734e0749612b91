//! The event publisher's reading of the jobs bucket's writes, from where the last
//! leadership left off, and its announcement of how far it handled them
//! (`events/handled.rs`).

use std::sync::Arc;

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::context::ConsumerInfoErrorKind;
use futures::StreamExt;
use tracing::warn;

use super::{taken_over, Leader};
use crate::domain::error::OjsError;
use crate::domain::job::JobRecord;
use crate::domain::state::JobState;
use crate::store::connection::Connection;
use crate::store::error::backend;
use crate::store::events::BATCH;
use crate::store::feed::{self, Deliveries};
use crate::store::jobs::records::{REMOVED_QUEUE, REMOVED_STATE};
use crate::store::topology::Topology;

/// The feed of job-record writes, in bucket order, for the event publisher. Each write is
/// acknowledged only after its events are stored, so none is skipped across a crash.
pub struct JobWrites {
    messages: futures::stream::BoxStream<
        'static,
        Vec<
            Result<
                async_nats::jetstream::Message,
                async_nats::jetstream::consumer::pull::MessagesError,
            >,
        >,
    >,
    /// The feed delivers the writes after this revision (the acknowledged floor when it
    /// opened); what came before, this publisher never saw.
    pub starts_after: u64,
    deliveries: Deliveries,
    conn: Arc<Connection>,
}

/// Deliveries of the job-write feed that never arrived, this many: in flight when the
/// leader's connection or the consumer's leader went down. Acknowledging a later write
/// would acknowledge them too (the feed's acknowledgements are cumulative), and their
/// events, counts and workflow steps would be lost with them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LostDeliveries(pub u64);

impl JobWrites {
    /// The writes that are ready now (at least one; waits for it). `None` when the feed
    /// ended; `LostDeliveries` when writes before these never arrived: then none of the
    /// batch may be handled or acknowledged, and the feed is read again from the last write
    /// acknowledged.
    pub async fn next_batch(&mut self) -> Option<Result<Vec<JobWrite>, LostDeliveries>> {
        let chunk = self.messages.next().await?;
        let mut delivered = Vec::with_capacity(chunk.len());
        for m in chunk {
            let msg = match m {
                Ok(msg) => msg,
                Err(err) => {
                    warn!(error = %err, "job-write feed error");
                    continue;
                }
            };
            let Ok(info) = msg.info() else { continue };
            let (revision, delivery) = (info.stream_sequence, info.consumer_sequence);
            if self.conn.loses("job_writes.delivered") {
                continue;
            }
            let lost = self.deliveries.lost_before(delivery);
            if lost > 0 {
                return Some(Err(LostDeliveries(lost)));
            }
            delivered.push((revision, msg));
        }
        Some(Ok(delivered
            .into_iter()
            .filter_map(|(revision, msg)| {
                // `$KV.<bucket>.<job id>`
                let id = msg.subject.splitn(3, '.').nth(2)?.to_string();
                let is_put = msg
                    .headers
                    .as_ref()
                    .and_then(|h| h.get("KV-Operation"))
                    .is_none();
                let record = is_put.then(|| serde_json::from_slice(&msg.payload).ok());
                let removed = msg.headers.as_ref().and_then(|h| {
                    let queue = h.get(REMOVED_QUEUE)?.as_str().to_owned();
                    Some((queue, JobState::parse(h.get(REMOVED_STATE)?.as_str())?))
                });
                Some(JobWrite {
                    id,
                    unreadable: record.as_ref().is_some_and(Option::is_none),
                    removed,
                    record: record.flatten(),
                    revision,
                    msg,
                })
            })
            .collect()))
    }
}

/// One write of a job record: the job id, the record (absent for deletions) and its
/// revision (the write's sequence in the jobs stream).
pub struct JobWrite {
    pub id: String,
    pub record: Option<JobRecord>,
    /// A put whose value is no job record (written by something else, or by a newer build).
    pub unreadable: bool,
    /// For a removal marker of `Jobs::remove_record`: the queue and state of the record it
    /// removed.
    pub removed: Option<(String, JobState)>,
    pub revision: u64,
    msg: async_nats::jetstream::Message,
}

impl JobWrite {
    /// Only what acknowledging it needs, for holding it while later writes are handled.
    pub fn into_ack_only(mut self) -> JobWrite {
        self.record = None;
        self.msg.message.payload = Default::default();
        self.msg.message.headers = None;
        self
    }

    /// Marks this write and every earlier one as handled.
    pub async fn done_through(&self) {
        if let Err(err) = self.msg.ack().await {
            warn!(error = %err, "could not acknowledge a job write");
        }
    }
}

impl Leader {
    /// Opens the job-write feed of the leadership `term`; reopened within the term, it
    /// continues where it was.
    ///
    /// # Errors
    /// When NATS fails, or a later leadership has taken over.
    pub async fn job_writes(&self, term: u64) -> Result<JobWrites, OjsError> {
        let stream = &self.jobs.own.kv.stream;
        let name = self.conn.topology.event_publisher_consumer(term);
        // With the consumer's deliveries so far, from which the next is numbered.
        let (consumer, starts_after, delivered): (PullConsumer, u64, u64) =
            match stream.consumer_info(&name).await {
                Ok(info) => (
                    stream
                        .get_consumer(&name)
                        .await
                        .map_err(backend("opening the job-write feed"))?,
                    info.ack_floor.stream_sequence,
                    info.delivered.consumer_sequence,
                ),
                Err(err) if err.kind() == ConsumerInfoErrorKind::NotFound => {
                    let (consumer, floor) = self.take_over_job_writes(term).await?;
                    (consumer, floor, 0)
                }
                Err(err) => return Err(backend("opening the job-write feed")(err)),
            };
        let messages = feed::renewed(consumer, "job writes")
            .await
            .map_err(backend("reading the job-write feed"))?;
        Ok(JobWrites {
            messages: messages.ready_chunks(BATCH).boxed(),
            starts_after,
            deliveries: Deliveries::after(delivered),
            conn: self.conn.clone(),
        })
    }

    /// Creates the consumer of leadership `term`, starting after the last write the latest
    /// earlier leadership acknowledged (returned with it), then deletes the earlier leaderships' consumers: a
    /// replica still acting as leader after losing the lease (a long pause) can then no
    /// longer read on, nor acknowledge writes this leadership has not handled (architecture
    /// §3.4). What that replica acknowledges between the floor read here and the delete is
    /// read again here: events twice (dropped as duplicates), never none.
    async fn take_over_job_writes(&self, term: u64) -> Result<(PullConsumer, u64), OjsError> {
        let stream = &self.jobs.own.kv.stream;
        let mut earlier = taken_over(
            stream,
            term,
            Topology::event_publisher_term,
            "publishes the events",
        )
        .await?;
        earlier.retain(|(t, _)| *t < term);
        let floor = match earlier.iter().max() {
            Some((_, latest)) => {
                stream
                    .consumer_info(latest)
                    .await
                    .map_err(backend("reading the event publisher's progress"))?
                    .ack_floor
                    .stream_sequence
            }
            None => 0,
        };
        let consumer = stream
            .create_consumer(self.conn.topology.event_publisher_config(term, floor))
            .await
            .map_err(backend("creating the job-write feed"))?;
        for (_, name) in earlier {
            if let Err(err) = stream.delete_consumer(&name).await {
                warn!(consumer = %name, error = %err, "could not delete an earlier leadership's job-write feed");
            }
        }
        Ok((consumer, floor))
    }

    /// Tells every replica that the events of every job write up to `revision` are stored.
    /// Fire and forget: a lost announcement only keeps trails longer.
    pub async fn announce_handled(&self, revision: u64) {
        let subject = self.conn.topology.events_handled_subject();
        let _ = self
            .conn
            .client
            .publish(subject, revision.to_string().into())
            .await;
    }
}
