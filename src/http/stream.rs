//! Live events over Server-Sent Events (realtime spec §2; the OJS client libraries'
//! `GET /ojs/v1/events/stream?channel=job:<id>|queue:<name>`). Each stream follows the
//! events stream in NATS from its own consumer, so any replica serves any stream, a slow
//! reader holds up only itself (nothing is buffered for it, nothing dropped), and a client
//! reconnecting with `Last-Event-ID` — the events-stream sequence — misses nothing the
//! stream still stores (architecture §3.23).

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::error::ApiError;
use super::extract::event_types;
use super::respond::job_id;
use super::state::SharedState;
use crate::domain::envelope::{parse_job_id, validate_queue};
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::event::{state_changed, Event};
use crate::domain::fields::truncated;
use crate::domain::state::JobState;
use crate::domain::time;
use crate::store::FollowFrom;

/// Live streams one gateway serves at once; each holds a NATS consumer.
pub const MAX_STREAMS: usize = 1000;
/// Comment lines keep idle connections open through proxies (spec §2.4).
const HEARTBEAT: Duration = Duration::from_secs(15);
/// The reconnection delay advised to clients (spec §2.3).
const RETRY: Duration = Duration::from_millis(3000);
/// Events waiting for a slow client before the stream stops reading NATS for it.
const WAITING: usize = 64;
/// The notice a client gets of a write that moved a job (spec §4.1).
const STATE_CHANGED: &str = "job.state_changed";

/// Which events a stream carries.
#[derive(Debug, Clone, PartialEq)]
enum Channel {
    All,
    Job(String),
    Queue(String),
}

impl Channel {
    /// `job:<id>`, `queue:<name>` or `*`.
    fn parse(raw: &str) -> Result<Channel, OjsError> {
        let bad = || {
            OjsError::invalid(
                "channel",
                format!(
                    "channel must be job:<id>, queue:<name> or *, got {:?}.",
                    truncated(raw)
                ),
            )
        };
        match raw.split_once(':') {
            _ if raw == "*" => Ok(Channel::All),
            Some(("job", id)) => parse_job_id(id).map(Channel::Job).ok_or_else(bad),
            Some(("queue", name)) => {
                validate_queue(name).map_err(|_| bad())?;
                Ok(Channel::Queue(name.to_owned()))
            }
            _ => Err(bad()),
        }
    }

    fn name(&self) -> String {
        match self {
            Channel::All => "*".into(),
            Channel::Job(id) => format!("job:{id}"),
            Channel::Queue(name) => format!("queue:{name}"),
        }
    }

    fn matches(&self, e: &Event) -> bool {
        let field = |key: &str| e.data.get(key).and_then(Value::as_str);
        match self {
            Channel::All => true,
            Channel::Job(id) => field("job_id") == Some(id),
            Channel::Queue(name) => e.queue() == Some(name),
        }
    }
}

/// A stream's filters: its channel and, when listed, the event types it wants.
#[derive(Debug, Clone)]
struct Filter {
    channel: Channel,
    types: Vec<String>,
}

impl Filter {
    fn from_query(channel: Channel, params: &HashMap<String, String>) -> Result<Filter, OjsError> {
        Ok(Filter {
            channel,
            types: event_types(params)?,
        })
    }

    fn wants(&self, event_type: &str) -> bool {
        self.types.is_empty() || self.types.iter().any(|t| t == event_type)
    }

    /// The one stored type to ask NATS for, when the filter names exactly one.
    fn only_stored_type(&self) -> Option<&str> {
        match self.types.as_slice() {
            [only] if only != STATE_CHANGED => Some(only),
            _ => None,
        }
    }
}

/// The sequence a client's `Last-Event-ID` names (`41`, or `41.1` for the state change
/// sent after event 41); `None` when absent or unreadable — then the stream starts now,
/// as the spec asks of ids a server cannot replay from.
fn last_event_id(headers: &HeaderMap, params: &HashMap<String, String>) -> Option<u64> {
    let raw = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .or_else(|| params.get("last_event_id").map(String::as_str))?;
    raw.split('.').next()?.trim().parse().ok()
}

/// `GET /ojs/v1/events/stream?channel=…&event_types=…`; `queue=<name>` instead of a
/// channel is `channel=queue:<name>` (the `ojs` command line's `events --queue`).
pub async fn events(
    State(state): State<SharedState>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let channel = match (params.get("channel"), params.get("queue")) {
        (Some(raw), None) => Channel::parse(raw)?,
        (None, Some(name)) => {
            validate_queue(name)?;
            Channel::Queue(name.clone())
        }
        (None, None) => Channel::All,
        (Some(_), Some(_)) => {
            return Err(OjsError::invalid("queue", "Give channel or queue, not both.").into())
        }
    };
    let filter = Filter::from_query(channel, &params)?;
    open(&state, filter, last_event_id(&headers, &params), false).await
}

/// `GET /ojs/v1/jobs/{id}/events`: 404 for an unknown job; a finished job gets one
/// `job.state_changed` with its state and the stream ends (spec §2.1), as it does after
/// the job's own end.
pub async fn job(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let id = job_id(&id)?;
    let job = state.store.jobs().info(&id).await?;
    let filter = Filter::from_query(Channel::Job(id), &params)?;
    if job.state.is_terminal() {
        let now = json!({
            "job_id": job.id, "queue": job.queue, "type": job.job_type,
            "to": job.state, "timestamp": time::format(Utc::now()),
        });
        let only = SseEvent::default()
            .event(STATE_CHANGED)
            .data(now.to_string())
            .retry(RETRY);
        let events = futures::stream::iter([Ok::<_, Infallible>(only)]);
        return Ok(Sse::new(events).into_response());
    }
    open(&state, filter, last_event_id(&headers, &params), true).await
}

/// `GET /ojs/v1/queues/{name}/events`: 404 for a queue no job or operator ever named.
pub async fn queue(
    State(state): State<SharedState>,
    Path(name): Path<String>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    validate_queue(&name)?;
    if !state.store.queues().list().iter().any(|q| q.name == name) {
        return Err(OjsError::not_found("queue", &name).into());
    }
    let filter = Filter::from_query(Channel::Queue(name), &params)?;
    open(&state, filter, last_event_id(&headers, &params), false).await
}

/// Starts the stream: a task follows the events from NATS and hands the matching ones to
/// the response body through a short channel, so a client that does not read stops the
/// reading. It ends when the client goes, NATS ends the feed, the gateway shuts down
/// (after a `server.shutdown` event, spec §5.1) or, with `until_ended`, after the write
/// that finished the job.
async fn open(
    state: &SharedState,
    filter: Filter,
    last: Option<u64>,
    until_ended: bool,
) -> Result<Response, ApiError> {
    let permit = state.event_streams.clone().try_acquire_owned().map_err(|_| {
        OjsError::new(
            ErrorCode::BackendUnavailable,
            format!("This gateway serves {MAX_STREAMS} event streams already; retry later or through another replica."),
        )
    })?;
    let from = last.map_or(FollowFrom::Now, FollowFrom::After);
    let mut feed = state
        .store
        .events()
        .follow(from, filter.only_stored_type())
        .await?;
    let stop = state.store.shutting_down();
    let (tx, rx) = mpsc::channel::<SseEvent>(WAITING);
    tokio::spawn(async move {
        let _permit = permit;
        let _ = tx
            .send(SseEvent::default().retry(RETRY).comment("ojs"))
            .await;
        // Asked to replay from before the oldest stored event: say what is missing (§5.5.1).
        if let Some(last) = last.filter(|l| feed.first_stored > l.saturating_add(1)) {
            let gap_end = feed.first_stored_at.map(time::format);
            let gap = json!({
                "channel": filter.channel.name(),
                "gap_start": gap_end, "gap_end": gap_end,
                "estimated_missed_count": feed.first_stored - last - 1,
            });
            let id = (feed.first_stored - 1).to_string();
            let _ = tx.send(sse(&id, "system.gap", &gap.to_string())).await;
        }
        loop {
            let (sequence, event, stored) = tokio::select! {
                () = stop.cancelled() => {
                    let notice = json!({"reason": "shutdown", "grace_period_ms": 0});
                    let _ = tx.send(SseEvent::default().event("server.shutdown").data(notice.to_string())).await;
                    return;
                }
                () = tx.closed() => return,
                next = feed.next() => match next {
                    Some(next) => next,
                    None => return,
                },
            };
            if !filter.channel.matches(&event) {
                continue;
            }
            if filter.wants(&event.event_type)
                && tx
                    .send(sse(&sequence.to_string(), &event.event_type, &stored))
                    .await
                    .is_err()
            {
                return;
            }
            let Some(changed) = state_changed(&event) else {
                continue;
            };
            if filter.wants(STATE_CHANGED)
                && tx
                    .send(sse(
                        &format!("{sequence}.1"),
                        STATE_CHANGED,
                        &changed.to_string(),
                    ))
                    .await
                    .is_err()
            {
                return;
            }
            let finished = changed["to"]
                .as_str()
                .and_then(JobState::parse)
                .is_some_and(JobState::is_terminal);
            if until_ended && finished {
                return;
            }
        }
    });
    let events = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|e| (Ok::<_, Infallible>(e), rx))
    });
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::new().interval(HEARTBEAT).text("heartbeat"))
        .into_response())
}

fn sse(id: &str, event_type: &str, data: &str) -> SseEvent {
    SseEvent::default().id(id).event(event_type).data(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_are_a_job_a_queue_or_everything() {
        let id = "019539a4-b68c-7def-8000-1a2b3c4d5e6f";
        assert_eq!(
            Channel::parse(&format!("job:{id}")).unwrap(),
            Channel::Job(id.into())
        );
        assert_eq!(
            Channel::parse("queue:mail").unwrap(),
            Channel::Queue("mail".into())
        );
        assert_eq!(Channel::parse("*").unwrap(), Channel::All);
        for bad in ["job:nope", "queue:", "queue:a b", "worker:w1", "mail", ""] {
            let err = Channel::parse(bad).unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidRequest, "{bad}");
        }
    }

    #[test]
    fn a_last_event_id_names_a_sequence_or_nothing() {
        let mut headers = HeaderMap::new();
        let none = HashMap::new();
        assert_eq!(last_event_id(&headers, &none), None);
        headers.insert("last-event-id", "41.1".parse().unwrap());
        assert_eq!(last_event_id(&headers, &none), Some(41));
        headers.insert("last-event-id", "evt_x".parse().unwrap());
        assert_eq!(last_event_id(&headers, &none), None);
        let query = HashMap::from([("last_event_id".to_owned(), "7".to_owned())]);
        assert_eq!(last_event_id(&HeaderMap::new(), &query), Some(7));
    }
}
