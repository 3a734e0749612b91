//! The events stream: publishing the events of job writes (by the coordinator's event
//! publisher), and paging through them for `GET /ojs/v1/events` (events seed §6.4).

use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy, PullConsumer};
use async_nats::jetstream::context::ConsumerInfoErrorKind;
use async_nats::jetstream::message::PublishMessage;
use futures::StreamExt;
use tracing::warn;

use super::error::backend;
use super::records::{REMOVED_QUEUE, REMOVED_STATE};
use super::topology::Topology;
use super::Store;
use crate::domain::error::OjsError;
use crate::domain::event::Event;
use crate::domain::job::JobRecord;
use crate::domain::state::JobState;

/// Events read at most per query, so a selective filter cannot make one request scan the
/// whole stream; the cursor continues where the scan stopped.
const SCAN_LIMIT: usize = 10_000;
const BATCH: usize = 256;

/// Filters of the events endpoint. Empty lists match everything.
#[derive(Debug, Clone, Default)]
pub struct EventQuery {
    pub types: Vec<String>,
    pub queues: Vec<String>,
    pub job_types: Vec<String>,
    /// Stream sequence to continue after (the previous page's cursor).
    pub after: Option<u64>,
    pub limit: usize,
}

impl EventQuery {
    fn matches(&self, e: &Event) -> bool {
        let has = |list: &[String], v: Option<&str>| {
            list.is_empty() || v.is_some_and(|v| list.iter().any(|x| x == v))
        };
        has(&self.types, Some(&e.event_type))
            && has(&self.queues, e.queue())
            && has(
                &self.job_types,
                e.data.get("job_type").and_then(|v| v.as_str()),
            )
    }
}

/// One page of events, oldest first.
#[derive(Debug, Clone)]
pub struct EventPage {
    pub events: Vec<Event>,
    /// Where the next page starts; absent when nothing was read.
    pub cursor: Option<u64>,
    pub has_more: bool,
}

impl Store {
    /// Event `source` of this gateway.
    pub fn event_source(&self) -> &str {
        &self.inner.source
    }

    /// Publishes events in order, waiting for every acknowledgement. Event ids are the
    /// `Nats-Msg-Id`s, so publishing the same event again within the duplicate window is
    /// dropped by the stream.
    ///
    /// # Errors
    /// When a publish is not acknowledged.
    pub async fn publish_events(&self, events: &[Event]) -> Result<(), OjsError> {
        let mut sent = Vec::with_capacity(events.len());
        for event in events {
            let body = serde_json::to_vec(event).expect("events serialize");
            let message = PublishMessage::build()
                .payload(body.into())
                .message_id(&event.id);
            let subject = self.inner.topology.event_subject(&event.event_type);
            sent.push(
                self.send(subject.into(), message, "publishing an event")
                    .await?,
            );
        }
        self.all_stored(sent).await
    }

    /// A page of events matching `q`, oldest first.
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn query_events(&self, q: &EventQuery) -> Result<EventPage, OjsError> {
        let filter_subject = match q.types.as_slice() {
            [only] => self.inner.topology.event_subject(only),
            _ => String::new(),
        };
        let consumer: PullConsumer = self
            .inner
            .events
            .create_consumer(pull::Config {
                deliver_policy: match q.after {
                    Some(seq) => DeliverPolicy::ByStartSequence {
                        start_sequence: seq.saturating_add(1),
                    },
                    None => DeliverPolicy::All,
                },
                filter_subject,
                ack_policy: AckPolicy::Explicit,
                max_ack_pending: 100_000,
                inactive_threshold: Duration::from_secs(10),
                memory_storage: true,
                ..Default::default()
            })
            .await
            .map_err(backend("opening the events stream"))?;
        let mut page = EventPage {
            events: Vec::new(),
            cursor: q.after,
            has_more: false,
        };
        let mut scanned = 0;
        'scan: while scanned < SCAN_LIMIT {
            let mut batch = consumer
                .fetch()
                .max_messages(BATCH)
                .messages()
                .await
                .map_err(backend("reading events"))?;
            let mut delivered = 0;
            while let Some(msg) = batch.next().await {
                let msg = msg.map_err(backend("reading events"))?;
                delivered += 1;
                scanned += 1;
                let Ok(info) = msg.info() else { continue };
                page.cursor = Some(info.stream_sequence);
                page.has_more = info.pending > 0;
                if let Ok(event) = serde_json::from_slice::<Event>(&msg.payload) {
                    if q.matches(&event) {
                        page.events.push(event);
                        if page.events.len() >= q.limit {
                            break 'scan;
                        }
                    }
                }
            }
            if delivered < BATCH {
                break;
            }
        }
        let name = consumer.cached_info().name.clone();
        let events = self.inner.events.clone();
        tokio::spawn(async move {
            let _ = events.delete_consumer(&name).await;
        });
        Ok(page)
    }

    /// Follows the events stream from `from`, for one live stream. Only one event type
    /// can be filtered by NATS (`only_type`); other filters are the caller's. The consumer
    /// is in memory, unacknowledged, and NATS removes it 10 s after its reader is gone.
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn follow_events(
        &self,
        from: FollowFrom,
        only_type: Option<&str>,
    ) -> Result<EventFeed, OjsError> {
        let mut stream = self.inner.events.clone();
        let state = stream
            .info()
            .await
            .map_err(backend("reading the events stream"))?
            .state
            .clone();
        let consumer: PullConsumer = stream
            .create_consumer(pull::Config {
                deliver_policy: match from {
                    // An id at or past the last event stored (or from another deployment)
                    // asks for nothing stored: start with the next one.
                    FollowFrom::After(seq) if seq < state.last_sequence => {
                        DeliverPolicy::ByStartSequence {
                            start_sequence: seq + 1,
                        }
                    }
                    FollowFrom::After(_) | FollowFrom::Now => DeliverPolicy::New,
                },
                filter_subject: only_type
                    .map(|t| self.inner.topology.event_subject(t))
                    .unwrap_or_default(),
                ack_policy: AckPolicy::None,
                inactive_threshold: Duration::from_secs(10),
                memory_storage: true,
                ..Default::default()
            })
            .await
            .map_err(backend("opening an event feed"))?;
        let messages = consumer
            .messages()
            .await
            .map_err(backend("opening an event feed"))?;
        let first_stored_at = (state.messages > 0).then(|| {
            let at = state.first_timestamp;
            chrono::DateTime::from_timestamp(at.unix_timestamp(), at.nanosecond())
                .unwrap_or_default()
        });
        Ok(EventFeed {
            messages,
            first_stored: if state.messages > 0 {
                state.first_sequence
            } else {
                0
            },
            first_stored_at,
        })
    }
}

/// Where a followed event feed starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FollowFrom {
    /// With the next event stored.
    Now,
    /// After this events-stream sequence (an SSE client's `Last-Event-ID`).
    After(u64),
}

/// Events as they are stored, for one live stream (`Store::follow_events`): a consumer of
/// this stream alone, so a slow reader holds up nobody but itself.
pub struct EventFeed {
    messages: pull::Stream,
    /// The first event still stored when the feed opened (0: none).
    pub first_stored: u64,
    /// When that event was stored.
    pub first_stored_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl EventFeed {
    /// The next event, its stream sequence and its JSON as stored (what a stream sends,
    /// without serializing it again); `None` when NATS ends the feed (the caller closes its
    /// stream, and the client reconnects with the last id it got).
    pub async fn next(&mut self) -> Option<(u64, Event, String)> {
        loop {
            let msg = match self.messages.next().await? {
                Ok(msg) => msg,
                Err(err) => {
                    warn!(error = %err, "an event feed failed");
                    return None;
                }
            };
            let Ok(info) = msg.info() else { continue };
            let sequence = info.stream_sequence;
            let Ok(stored) = std::str::from_utf8(&msg.payload) else {
                continue;
            };
            if let Ok(event) = serde_json::from_str::<Event>(stored) {
                return Some((sequence, event, stored.to_owned()));
            }
        }
    }
}

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
}

/// One write of a job record: the job id, the record (absent for deletions) and its
/// revision (the write's sequence in the jobs stream).
pub struct JobWrite {
    pub id: String,
    pub record: Option<JobRecord>,
    /// A put whose value is no job record (written by something else, or by a newer build).
    pub unreadable: bool,
    /// For a removal marker of `Store::remove_record`: the queue and state of the record it
    /// removed.
    pub removed: Option<(String, JobState)>,
    pub revision: u64,
    msg: async_nats::jetstream::Message,
}

impl Store {
    /// Opens the job-write feed of the leadership `term`; reopened within the term, it
    /// continues where it was.
    ///
    /// # Errors
    /// When NATS fails, or a later leadership has taken over.
    pub async fn job_writes(&self, term: u64) -> Result<JobWrites, OjsError> {
        let stream = &self.inner.jobs.stream;
        let name = self.inner.topology.event_publisher_consumer(term);
        let (consumer, starts_after): (PullConsumer, u64) = match stream.consumer_info(&name).await
        {
            Ok(info) => (
                stream
                    .get_consumer(&name)
                    .await
                    .map_err(backend("opening the job-write feed"))?,
                info.ack_floor.stream_sequence,
            ),
            Err(err) if err.kind() == ConsumerInfoErrorKind::NotFound => {
                self.take_over_job_writes(term).await?
            }
            Err(err) => return Err(backend("opening the job-write feed")(err)),
        };
        let messages = consumer
            .messages()
            .await
            .map_err(backend("reading the job-write feed"))?;
        Ok(JobWrites {
            messages: messages.ready_chunks(BATCH).boxed(),
            starts_after,
        })
    }

    /// Creates the consumer of leadership `term`, starting after the last write the latest
    /// earlier leadership acknowledged (returned with it), then deletes the earlier leaderships' consumers: a
    /// replica still acting as leader after losing the lease (a long pause) can then no
    /// longer read on, nor acknowledge writes this leadership has not handled (architecture
    /// §3.4). What that replica acknowledges between the floor read here and the delete is
    /// read again here: events twice (dropped as duplicates), never none.
    async fn take_over_job_writes(&self, term: u64) -> Result<(PullConsumer, u64), OjsError> {
        let stream = &self.inner.jobs.stream;
        let mut earlier = Vec::new();
        let mut names = stream.consumer_names();
        while let Some(name) = names.next().await {
            let name = name.map_err(backend("listing the job-write feeds"))?;
            match Topology::event_publisher_term(&name) {
                Some(t) if t > term => {
                    return Err(OjsError::backend(
                        "A later leadership publishes the events; this one stands down.",
                    ))
                }
                Some(t) if t < term => earlier.push((t, name)),
                _ => {}
            }
        }
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
            .create_consumer(self.inner.topology.event_publisher_config(term, floor))
            .await
            .map_err(backend("creating the job-write feed"))?;
        for (_, name) in earlier {
            if let Err(err) = stream.delete_consumer(&name).await {
                warn!(consumer = %name, error = %err, "could not delete an earlier leadership's job-write feed");
            }
        }
        Ok((consumer, floor))
    }
}

impl JobWrites {
    /// The writes that are ready now (at least one; waits for it). `None` when the feed ended.
    pub async fn next_batch(&mut self) -> Option<Vec<JobWrite>> {
        let chunk = self.messages.next().await?;
        Some(
            chunk
                .into_iter()
                .filter_map(|m| match m {
                    Ok(msg) => Some(msg),
                    Err(err) => {
                        warn!(error = %err, "job-write feed error");
                        None
                    }
                })
                .filter_map(|msg| {
                    let revision = msg.info().ok()?.stream_sequence;
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
                .collect(),
        )
    }
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
