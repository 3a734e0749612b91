//! The events stream: publishing the events of job writes (by the coordinator's event
//! publisher), and paging through them for `GET /ojs/v1/events` (events seed §6.4).

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy, PullConsumer};
use async_nats::jetstream::message::PublishMessage;
use futures::StreamExt;
use tracing::warn;

mod handled;

pub(super) use handled::HandledWrites;

use crate::domain::error::OjsError;
use crate::domain::event::Event;
use crate::store::connection::Connection;
use crate::store::error::backend;

/// The events resource, as a caller holds it: the connection and what the resource owns.
#[derive(Clone)]
pub struct Events {
    pub(super) conn: Arc<Connection>,
    pub(super) own: Arc<Owned>,
}

/// What the events resource owns.
pub(super) struct Owned {
    /// The events stream, for queries.
    pub(super) stream: async_nats::jetstream::stream::Stream,
    /// How far the event publisher has handled job writes, for the trails of new writes.
    pub(super) handled: handled::HandledWrites,
}

/// Events read at most per query, so a selective filter cannot make one request scan the
/// whole stream; the cursor continues where the scan stopped.
const SCAN_LIMIT: usize = 10_000;
/// Newest events a filtered page of the newest looks at.
const NEWEST_WINDOW: usize = 2_000;
pub(super) const BATCH: usize = 256;

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
/// A page of the newest events (`Events::newest`).
pub struct NewestPage {
    pub events: Vec<Event>,
    /// Events matching: all of them, or those among the newest looked at.
    pub total: usize,
    /// Whether `total` counts every match stored.
    pub complete: bool,
}

pub struct EventPage {
    pub events: Vec<Event>,
    /// Where the next page starts; absent when nothing was read.
    pub cursor: Option<u64>,
    pub has_more: bool,
}

impl Events {
    /// Event `source` of this gateway.
    pub fn source(&self) -> &str {
        &self.conn.source
    }

    /// Publishes events in order, waiting for every acknowledgement. Event ids are the
    /// `Nats-Msg-Id`s, so publishing the same event again within the duplicate window is
    /// dropped by the stream.
    ///
    /// # Errors
    /// When a publish is not acknowledged.
    pub async fn publish(&self, events: &[Event]) -> Result<(), OjsError> {
        let mut sent = Vec::with_capacity(events.len());
        for event in events {
            let body = serde_json::to_vec(event).expect("events serialize");
            let message = PublishMessage::build()
                .payload(body.into())
                .message_id(&event.id);
            let subject = self.conn.topology.event_subject(&event.event_type);
            sent.push(
                self.conn
                    .send(subject.into(), message, "publishing an event")
                    .await?,
            );
        }
        self.conn.all_stored(sent).await
    }

    /// A page of events matching `q`, oldest first.
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn query(&self, q: &EventQuery) -> Result<EventPage, OjsError> {
        let filter_subject = match q.types.as_slice() {
            [only] => self.conn.topology.event_subject(only),
            _ => String::new(),
        };
        let consumer: PullConsumer = self
            .own
            .stream
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
        let events = self.own.stream.clone();
        tokio::spawn(async move {
            let _ = events.delete_consumer(&name).await;
        });
        Ok(page)
    }

    /// Page `page` (from 1) of `per_page` events matching `q`, newest first, and how many
    /// match in all. Unfiltered, the page is read by its sequences; filtered, the newest
    /// `NEWEST_WINDOW` events are looked at (`complete` says whether that is all of
    /// them).
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn newest(
        &self,
        q: &EventQuery,
        page: usize,
        per_page: usize,
    ) -> Result<NewestPage, OjsError> {
        let state = self
            .own
            .stream
            .clone()
            .info()
            .await
            .map_err(backend("reading the events stream"))?
            .state
            .clone();
        let unfiltered = q.types.is_empty() && q.queues.is_empty() && q.job_types.is_empty();
        let reach = if unfiltered {
            page.saturating_mul(per_page).max(1)
        } else {
            NEWEST_WINDOW
        };
        let start = state
            .last_sequence
            .saturating_sub(reach as u64)
            .saturating_add(1)
            .max(state.first_sequence);
        let mut events = if state.messages == 0 {
            Vec::new()
        } else {
            let read = EventQuery {
                after: Some(start.saturating_sub(1)),
                limit: reach,
                ..q.clone()
            };
            self.query(&read).await?.events
        };
        let total = if unfiltered {
            state.messages as usize
        } else {
            events.len()
        };
        events.reverse();
        let skip = (page - 1).saturating_mul(per_page);
        Ok(NewestPage {
            events: events.into_iter().skip(skip).take(per_page).collect(),
            total,
            complete: unfiltered || start <= state.first_sequence,
        })
    }

    /// Follows the events stream from `from`, for one live stream. Only one event type
    /// can be filtered by NATS (`only_type`); other filters are the caller's. The consumer
    /// is in memory, unacknowledged, and NATS removes it 10 s after its reader is gone.
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn follow(
        &self,
        from: FollowFrom,
        only_type: Option<&str>,
    ) -> Result<EventFeed, OjsError> {
        let mut stream = self.own.stream.clone();
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
                    .map(|t| self.conn.topology.event_subject(t))
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

/// Events as they are stored, for one live stream (`Events::follow`): a consumer of
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
