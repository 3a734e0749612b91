//! One long-lived pull loop per queue consumer per gateway. FETCH requests for the same
//! consumer are merged into one `no_wait` pull, and every reply lands on one subscription
//! that lives as long as the consumer is in use. Long-polling FETCHes park a waiter here;
//! the loop keeps one waiting pull per consumer open for all of them, so JetStream itself
//! wakes them the moment a job arrives.
//!
//! When the last handle is dropped (the registry evicts an idle lane), the loop ends once the
//! pulls it has open are answered or expired, releasing whatever they still bring: the
//! server skips a waiting pull whose reply subject lost interest, but a message can be on
//! its way before the unsubscribe arrives.
//!
//! Why not a fresh inbox per fetch: when two `no_wait` pulls race for the last message, the
//! server can park the loser as a waiting request that is never answered; a message it
//! later delivers to that request would go to an inbox nobody reads and stay stuck until
//! ack-wait. Here such a late message still arrives on our subscription and is handed to
//! the next fetch, or released at once with a NAK.

use std::collections::VecDeque;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use async_nats::StatusCode;
use futures::StreamExt;
use serde_json::json;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::{info, warn};

/// Longest wait for a pull's answer before it is treated as empty (the parked-request
/// case: rare, and it costs the FETCHes of that round this long). Not shorter: on a
/// machine short of CPU an answer takes over 100 ms now and then, and a FETCH that gave up
/// on it would answer "no jobs" right after a PUSH was acknowledged.
const PULL_ANSWER_TIMEOUT: Duration = Duration::from_millis(500);
/// Most messages asked for in one pull.
const MAX_BATCH: usize = 256;
/// Pause before opening another waiting pull after the server ended one early (a refusal).
const REFUSED_PAUSE: Duration = Duration::from_millis(100);

/// Handle to a consumer's pull loop; cheap to clone.
#[derive(Clone)]
pub struct Puller {
    requests: mpsc::Sender<Request>,
}

/// Where a woken waiter's message goes: the waiter's tag and the message. Whoever closes
/// the receiving end must drain it, so that no message is dropped unsettled.
pub type WaitSink = mpsc::UnboundedSender<(usize, jetstream::Message)>;

enum Request {
    /// Up to `want` messages that are there now.
    Now {
        want: usize,
        reply: oneshot::Sender<Vec<jetstream::Message>>,
    },
    /// One message, as soon as there is one, until `until`.
    Wait(Waiter),
}

struct Waiter {
    tag: usize,
    until: Instant,
    sink: WaitSink,
}

/// A `no_wait` pull in flight and the fetches it answers.
struct Round {
    reply: String,
    want: usize,
    deadline: Instant,
    fetches: Vec<(usize, oneshot::Sender<Vec<jetstream::Message>>)>,
    got: Vec<jetstream::Message>,
}

/// A waiting pull in flight: its reply subject, how many messages it may still bring, and
/// when the server ends it.
struct WaitPull {
    reply: String,
    remaining: usize,
    expires: Instant,
}

impl Puller {
    /// Starts the loop for consumer `consumer` of stream `stream`.
    pub async fn start(
        js: jetstream::Context,
        stream: &str,
        consumer: &str,
    ) -> Result<Puller, async_nats::SubscribeError> {
        let client = js.client();
        let inbox = client.new_inbox();
        let now = client.subscribe(format!("{inbox}.n.*")).await?;
        let waits = client.subscribe(format!("{inbox}.w.*")).await?;
        let (requests, rx) = mpsc::channel(1024);
        let pulls = Pulls {
            js,
            api: format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"),
            inbox,
            id: 0,
        };
        tokio::spawn(run(pulls, now, waits, rx));
        Ok(Puller { requests })
    }

    /// Up to `want` delivered messages, in stream order; empty when the consumer has none.
    pub async fn pull(&self, want: usize) -> Vec<jetstream::Message> {
        let (reply, rx) = oneshot::channel();
        if self
            .requests
            .send(Request::Now { want, reply })
            .await
            .is_err()
        {
            return Vec::new();
        }
        rx.await.unwrap_or_default()
    }

    /// Sends the next message this consumer delivers, if one comes before `until`, to
    /// `sink` with `tag`. Closing the sink withdraws the wait.
    pub async fn wait(&self, tag: usize, until: Instant, sink: WaitSink) {
        let _ = self
            .requests
            .send(Request::Wait(Waiter { tag, until, sink }))
            .await;
    }
}

/// Sends pull requests for one consumer.
struct Pulls {
    js: jetstream::Context,
    api: String,
    inbox: String,
    id: u64,
}

impl Pulls {
    /// Asks for `batch` messages to `<inbox>.<kind>.<id>`; the reply subject, or `None`
    /// when the request could not be sent.
    async fn send(&mut self, kind: &str, body: serde_json::Value) -> Option<String> {
        self.id += 1;
        let reply = format!("{}.{kind}.{}", self.inbox, self.id);
        match self
            .js
            .client()
            .publish_with_reply(self.api.clone(), reply.clone(), body.to_string().into())
            .await
        {
            Ok(()) => Some(reply),
            Err(err) => {
                warn!(error = %err, "pull request failed");
                None
            }
        }
    }

    fn message(&self, message: async_nats::Message) -> jetstream::Message {
        jetstream::Message {
            message,
            context: self.js.clone(),
        }
    }
}

async fn run(
    mut pulls: Pulls,
    mut now_sub: async_nats::Subscriber,
    mut wait_sub: async_nats::Subscriber,
    mut requests: mpsc::Receiver<Request>,
) {
    let mut fresh: Vec<(usize, oneshot::Sender<Vec<jetstream::Message>>)> = Vec::new();
    let mut round: Option<Round> = None;
    let mut waiters: VecDeque<Waiter> = VecDeque::new();
    let mut wait_pulls: VecDeque<WaitPull> = VecDeque::new();
    let mut refused_until: Option<Instant> = None;
    // Waiting pulls refused in a row: one warning for a run of them (an election refuses
    // one every REFUSED_PAUSE for seconds), and a line when they are accepted again.
    let mut refusals: u32 = 0;
    // Set once every handle is gone: when the last open pull can no longer deliver.
    let mut close_by: Option<Instant> = None;
    loop {
        if let Some(by) = close_by {
            if (round.is_none() && wait_pulls.is_empty()) || Instant::now() >= by {
                return;
            }
        }
        // Fetches that came in while a pull was in flight make up the next one.
        if round.is_none() && !fresh.is_empty() {
            let fetches = std::mem::take(&mut fresh);
            let want = fetches.iter().map(|f| f.0).sum::<usize>().min(MAX_BATCH);
            let body = json!({"batch": want, "no_wait": true});
            match pulls.send("n", body).await {
                Some(reply) => {
                    round = Some(Round {
                        reply,
                        want,
                        deadline: Instant::now() + PULL_ANSWER_TIMEOUT,
                        fetches,
                        got: Vec::new(),
                    });
                }
                None => fetches
                    .into_iter()
                    .for_each(|(_, r)| drop(r.send(Vec::new()))),
            }
        }
        // Enough waiting pulls for the live waiters, each open until the earliest of them
        // gives up (so a pull rarely outlives its waiters).
        let now = Instant::now();
        waiters.retain(|w| w.until > now && !w.sink.is_closed());
        let open: usize = wait_pulls.iter().map(|p| p.remaining).sum();
        let earliest = waiters.iter().map(|w| w.until).min();
        if let Some(earliest) = earliest.filter(|_| waiters.len() > open) {
            if refused_until.is_none_or(|t| t <= now) {
                let batch = waiters.len() - open;
                let expires = earliest.saturating_duration_since(now).as_nanos() as u64;
                let body = json!({"batch": batch, "expires": expires});
                if let Some(reply) = pulls.send("w", body).await {
                    wait_pulls.push_back(WaitPull {
                        reply,
                        remaining: batch,
                        expires: earliest,
                    });
                }
            }
        }
        let round_deadline = round.as_ref().map(|r| r.deadline);
        let wake = earliest
            .into_iter()
            .chain(refused_until)
            .chain(close_by)
            .min();
        tokio::select! {
            req = requests.recv(), if close_by.is_none() => match req {
                Some(Request::Now { want, reply }) => fresh.push((want, reply)),
                Some(Request::Wait(w)) => waiters.push_back(w),
                None => {
                    fresh.clear(); // their requesters held handles: they are gone too
                    let last = wait_pulls.iter().map(|p| p.expires);
                    let last = last.chain(round.as_ref().map(|r| r.deadline)).max();
                    close_by = Some(last.unwrap_or_else(Instant::now) + PULL_ANSWER_TIMEOUT);
                }
            },
            msg = now_sub.next() => {
                let Some(msg) = msg else { return };
                match msg.status {
                    None | Some(StatusCode::OK) => {
                        let msg = pulls.message(msg);
                        match round.as_mut() {
                            Some(r) => {
                                r.got.push(msg);
                                if r.got.len() >= r.want {
                                    finish(round.take(), &mut waiters);
                                }
                            }
                            // A late delivery to an old pull.
                            None => wake_one(msg, &mut waiters),
                        }
                    }
                    // The end of this pull (no messages, expired, or refused); other pulls'
                    // statuses are not ours to act on.
                    Some(_) => {
                        if round.as_ref().is_some_and(|r| r.reply == msg.subject.as_str()) {
                            finish(round.take(), &mut waiters);
                        }
                    }
                }
            }
            msg = wait_sub.next() => {
                let Some(msg) = msg else { return };
                match msg.status {
                    None | Some(StatusCode::OK) => {
                        accepted_again(&mut refusals);
                        // JetStream serves waiting pulls oldest first.
                        if let Some(p) = wait_pulls.front_mut() {
                            p.remaining -= 1;
                            if p.remaining == 0 {
                                wait_pulls.pop_front();
                            }
                        }
                        wake_one(pulls.message(msg), &mut waiters);
                    }
                    Some(status) => {
                        let before = wait_pulls.len();
                        wait_pulls.retain(|p| p.reply != msg.subject.as_str());
                        if wait_pulls.len() < before && status != StatusCode::TIMEOUT {
                            let reason = msg.description.as_deref().unwrap_or("");
                            if refusals == 0 {
                                warn!(%status, reason, "a waiting pull was refused; trying again every 100 ms");
                            }
                            refusals += 1;
                            refused_until = Some(Instant::now() + REFUSED_PAUSE);
                        } else if status == StatusCode::TIMEOUT {
                            accepted_again(&mut refusals);
                        }
                    }
                }
            }
            _ = sleep_until(round_deadline), if round_deadline.is_some() => {
                finish(round.take(), &mut waiters);
            }
            _ = sleep_until(wake), if wake.is_some() => {
                refused_until = refused_until.filter(|t| *t > Instant::now());
            }
        }
    }
}

/// Says that waiting pulls are accepted again after a run of refusals.
fn accepted_again(refusals: &mut u32) {
    if *refusals > 0 {
        info!(refused = *refusals, "waiting pulls are accepted again");
        *refusals = 0;
    }
}

async fn sleep_until(at: Option<Instant>) {
    tokio::time::sleep_until(at.unwrap_or_else(Instant::now)).await;
}

/// Hands a round's messages out in arrival order, to its fetches in arrival order; what
/// nobody takes goes to a waiter or back to the stream.
fn finish(round: Option<Round>, waiters: &mut VecDeque<Waiter>) {
    let Some(round) = round else { return };
    let mut messages = round.got.into_iter();
    for (want, reply) in round.fetches {
        let share: Vec<_> = messages.by_ref().take(want).collect();
        if let Err(unwanted) = reply.send(share) {
            for msg in unwanted {
                wake_one(msg, waiters);
            }
        }
    }
    for msg in messages {
        wake_one(msg, waiters);
    }
}

/// Gives the message to the oldest live waiter, or releases it.
fn wake_one(msg: jetstream::Message, waiters: &mut VecDeque<Waiter>) {
    let mut msg = msg;
    while let Some(w) = waiters.pop_front() {
        match w.sink.send((w.tag, msg)) {
            Ok(()) => return,
            Err(mpsc::error::SendError((_, back))) => msg = back,
        }
    }
    release(msg);
}

/// A message nobody asked for any more goes straight back to the stream.
fn release(msg: jetstream::Message) {
    release_confirmed(&msg, None);
}

/// How long `release_confirmed` asks before leaving the message to its AckWait.
const RELEASE_PATIENCE: Duration = Duration::from_secs(30);
/// How long one ask waits for the consumer's confirmation.
const RELEASE_ANSWER: Duration = Duration::from_secs(1);

/// Puts a delivered queue message back, to be delivered again after `delay` (at once when
/// `None`), asking in the background until the consumer's leader confirms, for up to
/// `RELEASE_PATIENCE`. A plain NAK sent while the consumer elects a leader (a node restart,
/// a partition healing) reaches nobody, and its message waits out the queue's AckWait
/// (60 s): after a partition healed, a job so released waited that long. A NAK that lands
/// after the message went to another FETCH only sends it out once more, which that claim
/// meets as a redelivery of a started job.
pub(in crate::store) fn release_confirmed(msg: &jetstream::Message, delay: Option<Duration>) {
    let Some(reply) = msg.reply.clone() else {
        return;
    };
    let client = msg.context.client();
    tokio::spawn(async move {
        let give_up = Instant::now() + RELEASE_PATIENCE;
        let mut pause = Duration::from_millis(50);
        loop {
            let nak = bytes::Bytes::from(AckKind::Nak(delay));
            let asked = tokio::time::timeout(RELEASE_ANSWER, client.request(reply.clone(), nak));
            let error = match asked.await {
                Ok(Ok(_)) => return,
                Ok(Err(err)) => err.to_string(),
                Err(_) => "no confirmation in time".to_owned(),
            };
            if Instant::now() + pause >= give_up {
                warn!(
                    error,
                    "could not release a queue message; it comes back after its AckWait"
                );
                return;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    });
}
