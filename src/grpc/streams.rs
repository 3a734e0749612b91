//! The binding's server streams (§10): `StreamJobs` hands a worker jobs as its slots free
//! up, `StreamEvents` follows the lifecycle events as the HTTP event stream does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::join_all;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::convert;
use super::pb;
use crate::domain::envelope::{parse_job_id, validate_queue};
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::event::Event;
use crate::domain::job::Job;
use crate::domain::requests::{self, FetchRequest};
use crate::domain::state::JobState;
use crate::http::SharedState;
use crate::store::{deadline, FollowFrom};

pub type JobStream = ReceiverStream<Result<pb::Job, Status>>;
pub type EventStream = ReceiverStream<Result<pb::Event, Status>>;

/// Most unacknowledged jobs one stream holds, whatever the worker asks: as many as one
/// FETCH may claim.
const MAX_CONCURRENT: i32 = 1000;
/// How long one round of a stream waits for a job before it looks again.
const WAIT: Duration = Duration::from_secs(5);
/// How often a stream whose slots are all taken reads its jobs again, for the ones settled
/// elsewhere (an ACK through another gateway, a lapsed reservation, a cancel).
const RECHECK: Duration = Duration::from_secs(2);
/// An idle event stream's sign of life (§10.2.1: at least every 30 s).
const KEEPALIVE: Duration = Duration::from_secs(15);
/// Events waiting for a slow reader before the stream stops reading NATS for it.
const WAITING: usize = 64;

/// Jobs settled through this gateway (gRPC `Ack`, `Nack`, `CancelJob`), told to the job
/// stream that holds each: a worker's `Ack` travels on the HTTP/2 connection of its
/// stream, so it reaches the gateway that sent the job. Each held job's id names its
/// stream's channel, so a settlement wakes that stream alone. Settled elsewhere, a job
/// frees its slot at the stream's next `RECHECK`.
#[derive(Clone, Default)]
pub struct Settled(Arc<Mutex<HashMap<String, mpsc::UnboundedSender<String>>>>);

impl Settled {
    pub fn settle(&self, id: &str) {
        let stream = self.0.lock().expect("settled lock").remove(id);
        if let Some(stream) = stream {
            let _ = stream.send(id.to_owned());
        }
    }

    fn watch(&self, id: &str, stream: &mpsc::UnboundedSender<String>) {
        self.0
            .lock()
            .expect("settled lock")
            .insert(id.to_owned(), stream.clone());
    }

    fn forget<'a>(&self, ids: impl IntoIterator<Item = &'a String>) {
        let mut watched = self.0.lock().expect("settled lock");
        for id in ids {
            watched.remove(id);
        }
    }
}

/// Opens a job stream: checks the request as a FETCH's, then a task claims jobs while the
/// worker holds fewer than `max_concurrent` and hands them over. When the stream ends —
/// the worker goes, the gateway stops — every job it holds unsettled goes straight back
/// to its queue, its attempt not counted (§10.1.1).
///
/// # Errors
/// 400 for a missing `worker_id`, queues a FETCH would refuse, or a negative
/// `max_concurrent`.
pub async fn jobs(
    state: &SharedState,
    settled: &Settled,
    r: pb::StreamJobsRequest,
) -> Result<JobStream, OjsError> {
    if r.worker_id.is_empty() {
        return Err(OjsError::invalid(
            "worker_id",
            "Missing required field 'worker_id': the server hands back the jobs of a stream that ends by it.",
        ));
    }
    let max = match r.max_concurrent {
        0 => 1,
        n if (1..=MAX_CONCURRENT).contains(&n) => n as usize,
        n => {
            return Err(OjsError::invalid(
                "max_concurrent",
                format!("max_concurrent must be 1 to {MAX_CONCURRENT}, got {n}."),
            ))
        }
    };
    let body = json!({
        "queues": r.queues,
        "worker_id": r.worker_id,
        "count": max,
        "wait_ms": WAIT.as_millis() as u64,
    });
    let base = requests::fetch(
        body.as_object().expect("an object"),
        &state.config.request_limits(),
    )?;
    let (tx, rx) = mpsc::channel(max);
    let (notify, notices) = mpsc::unbounded_channel();
    let feed = JobFeed {
        state: state.clone(),
        base,
        max,
        held: HashMap::new(),
        settled: settled.clone(),
        notify,
        notices,
        tx,
    };
    tokio::spawn(feed.run());
    Ok(ReceiverStream::new(rx))
}

struct JobFeed {
    state: SharedState,
    base: FetchRequest,
    max: usize,
    /// The jobs sent and not yet seen settled, by id.
    held: HashMap<String, Job>,
    settled: Settled,
    /// Where `settled` tells this stream of its jobs settled here.
    notify: mpsc::UnboundedSender<String>,
    notices: mpsc::UnboundedReceiver<String>,
    tx: mpsc::Sender<Result<pb::Job, Status>>,
}

impl JobFeed {
    async fn run(mut self) {
        let stop = self.state.store.shutting_down();
        let mut recheck = tokio::time::interval(RECHECK);
        recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        'stream: loop {
            while let Ok(id) = self.notices.try_recv() {
                self.held.remove(&id);
            }
            if stop.is_cancelled() {
                let _ = self
                    .tx
                    .send(Err(Status::unavailable("The gateway is shutting down.")))
                    .await;
                break;
            }
            if self.held.len() >= self.max {
                tokio::select! {
                    () = self.tx.closed() => break,
                    () = stop.cancelled() => {}
                    Some(id) = self.notices.recv() => { self.held.remove(&id); }
                    _ = recheck.tick() => self.recheck().await,
                }
                continue;
            }
            let mut req = self.base.clone();
            req.count = self.max - self.held.len();
            let fetch = self.state.store.workers().fetch(req);
            let until = Instant::now() + self.state.config.request_deadline();
            let claimed = tokio::select! {
                () = self.tx.closed() => break,
                claimed = deadline::within(until, fetch) => claimed,
            };
            match claimed {
                Ok(jobs) => {
                    for job in jobs {
                        let message = convert::job(&job);
                        self.settled.watch(&job.id, &self.notify);
                        self.held.insert(job.id.clone(), job);
                        if self.tx.send(Ok(message)).await.is_err() {
                            break 'stream;
                        }
                    }
                }
                // NATS failing: the worker keeps its stream; try again shortly.
                Err(err) => {
                    tracing::warn!(error = %err, "a job stream could not claim jobs");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
        self.settled.forget(self.held.keys());
        let unsettled: Vec<Job> = self.held.into_values().collect();
        if !unsettled.is_empty() {
            self.state.store.jobs().hand_back_unsent(&unsettled).await;
        }
    }

    /// Reads every held job again and drops those no longer active in the attempt that was
    /// sent: settled through another gateway, lapsed, or cancelled.
    async fn recheck(&mut self) {
        let jobs = self.state.store.jobs();
        let reads = self.held.values().map(|sent| async move {
            let now = jobs.info(&sent.id).await;
            let moved_on = match now {
                Ok(job) => job.state != JobState::Active || job.attempt != sent.attempt,
                Err(err) => err.code == ErrorCode::NotFound,
            };
            moved_on.then(|| sent.id.clone())
        });
        let moved_on: Vec<String> = join_all(reads).await.into_iter().flatten().collect();
        self.settled.forget(&moved_on);
        for id in moved_on {
            self.held.remove(&id);
        }
    }
}

/// Which events a stream carries (§10.2.3): every filter given must hold.
struct Filter {
    queues: Vec<String>,
    types: Vec<String>,
    job_id: Option<String>,
    workflow_id: Option<String>,
}

impl Filter {
    fn of(r: pb::StreamEventsRequest) -> Result<Filter, OjsError> {
        for q in &r.queues {
            validate_queue(q)?;
        }
        let job_id =
            match r.job_id.as_str() {
                "" => None,
                id => Some(parse_job_id(id).ok_or_else(|| {
                    OjsError::invalid("job_id", "job_id must be a job id (a UUID).")
                })?),
            };
        Ok(Filter {
            queues: r.queues,
            types: r.event_types,
            job_id,
            workflow_id: (!r.workflow_id.is_empty()).then_some(r.workflow_id),
        })
    }

    fn matches(&self, e: &Event) -> bool {
        let field = |key: &str| e.data.get(key).and_then(Value::as_str);
        (self.queues.is_empty()
            || e.queue()
                .is_some_and(|q| self.queues.iter().any(|w| w == q)))
            && (self.types.is_empty() || self.types.contains(&e.event_type))
            && self
                .job_id
                .as_deref()
                .is_none_or(|id| field("job_id") == Some(id))
            && self
                .workflow_id
                .as_deref()
                .is_none_or(|id| field("workflow_id") == Some(id))
    }

    /// The one type to ask NATS for, when the filter names exactly one.
    fn only_type(&self) -> Option<&str> {
        match self.types.as_slice() {
            [only] => Some(only),
            _ => None,
        }
    }
}

/// Opens an event stream: from now, or after the events-stream position `last` (the
/// `last-event-id` metadata, as `Last-Event-ID` over HTTP). Each event's `data` carries its
/// position as `stream_sequence`; an idle stream sends `stream.keepalive`.
///
/// # Errors
/// 400 for a bad filter; 503 when this gateway serves its most streams already.
pub async fn events(
    state: &SharedState,
    r: pb::StreamEventsRequest,
    last: Option<u64>,
) -> Result<EventStream, OjsError> {
    let filter = Filter::of(r)?;
    let permit = state.event_streams.clone().try_acquire_owned().map_err(|_| {
        OjsError::new(
            ErrorCode::BackendUnavailable,
            "This gateway serves its most event streams already; retry later or through another replica.",
        )
    })?;
    let from = last.map_or(FollowFrom::Now, FollowFrom::After);
    let mut feed = state
        .store
        .events()
        .follow(from, filter.only_type())
        .await?;
    let stop = state.store.shutting_down();
    let (tx, rx) = mpsc::channel(WAITING);
    // Asked to resume from before the oldest event stored: say how many are missing, as
    // the HTTP stream's `system.gap` does.
    let gap = last
        .filter(|l| feed.first_stored > l.saturating_add(1))
        .map(|l| gap(feed.first_stored - l - 1));
    tokio::spawn(async move {
        let _permit = permit;
        if let Some(gap) = gap {
            if tx.send(Ok(gap)).await.is_err() {
                return;
            }
        }
        loop {
            let next = tokio::select! {
                () = tx.closed() => return,
                () = stop.cancelled() => {
                    let _ = tx.send(Err(Status::unavailable("The gateway is shutting down."))).await;
                    return;
                }
                () = tokio::time::sleep(KEEPALIVE) => {
                    if tx.send(Ok(keepalive())).await.is_err() {
                        return;
                    }
                    continue;
                }
                next = feed.next() => next,
            };
            let Some((sequence, event, _)) = next else {
                let _ = tx
                    .send(Err(Status::unavailable(
                        "The event feed ended; open the stream again with last-event-id.",
                    )))
                    .await;
                return;
            };
            if filter.matches(&event) && tx.send(Ok(message(sequence, event))).await.is_err() {
                return;
            }
        }
    });
    Ok(ReceiverStream::new(rx))
}

fn gap(missed: u64) -> pb::Event {
    let data = json!({"estimated_missed_count": missed});
    pb::Event {
        r#type: "system.gap".into(),
        timestamp: Some(convert::timestamp(chrono::Utc::now())),
        data: data.as_object().map(convert::structure),
        ..Default::default()
    }
}

fn keepalive() -> pb::Event {
    pb::Event {
        r#type: "stream.keepalive".into(),
        timestamp: Some(convert::timestamp(chrono::Utc::now())),
        ..Default::default()
    }
}

fn message(sequence: u64, event: Event) -> pb::Event {
    let field = |key: &str| {
        event
            .data
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let mut data = match &event.data {
        Value::Object(o) => o.clone(),
        _ => Default::default(),
    };
    data.insert("stream_sequence".into(), json!(sequence));
    pb::Event {
        job_id: field("job_id"),
        job_type: field("job_type"),
        queue: event.queue().unwrap_or_default().to_owned(),
        workflow_id: field("workflow_id"),
        timestamp: Some(convert::timestamp(event.time)),
        data: Some(convert::structure(&data)),
        id: event.id,
        r#type: event.event_type,
    }
}
