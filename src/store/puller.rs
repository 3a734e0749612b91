//! One long-lived pull loop per queue consumer per gateway. FETCH requests for the same
//! consumer are merged into one `no_wait` pull, and every reply lands on one subscription
//! that lives as long as the consumer is in use.
//!
//! Why not a fresh inbox per fetch: when two `no_wait` pulls race for the last message, the
//! server can park the loser as a waiting request that is never answered; a message it
//! later delivers to that request would go to an inbox nobody reads and stay stuck until
//! ack-wait. Here such a late message still arrives on our subscription and is handed to
//! the next fetch, or released at once with a NAK.

use std::time::Duration;

use async_nats::jetstream;
use async_nats::StatusCode;
use futures::StreamExt;
use serde_json::json;
use tokio::sync::{mpsc, oneshot};
use tracing::warn;

/// Longest wait for a pull's answer before it is treated as empty (the parked-request case).
const PULL_ANSWER_TIMEOUT: Duration = Duration::from_millis(100);
/// Most messages asked for in one pull.
const MAX_BATCH: usize = 256;

/// Handle to a consumer's pull loop; cheap to clone.
#[derive(Clone)]
pub struct Puller {
    requests: mpsc::Sender<Request>,
}

struct Request {
    want: usize,
    reply: oneshot::Sender<Vec<jetstream::Message>>,
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
        let subscription = client.subscribe(format!("{inbox}.*")).await?;
        let (requests, rx) = mpsc::channel(1024);
        let api = format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}");
        tokio::spawn(run(js, api, inbox, subscription, rx));
        Ok(Puller { requests })
    }

    /// Up to `want` delivered messages, in stream order; empty when the consumer has none.
    pub async fn pull(&self, want: usize) -> Vec<jetstream::Message> {
        let (reply, rx) = oneshot::channel();
        if self.requests.send(Request { want, reply }).await.is_err() {
            return Vec::new();
        }
        rx.await.unwrap_or_default()
    }
}

async fn run(
    js: jetstream::Context,
    api: String,
    inbox: String,
    mut subscription: async_nats::Subscriber,
    mut requests: mpsc::Receiver<Request>,
) {
    let client = js.client();
    let mut pull_id: u64 = 0;
    loop {
        // Idle: wait for a fetch, and release anything a parked pull still delivers.
        let first = tokio::select! {
            req = requests.recv() => match req {
                Some(r) => r,
                None => return,
            },
            msg = subscription.next() => {
                match msg {
                    Some(msg) => release(&js, msg).await,
                    None => return,
                }
                continue;
            }
        };
        let mut waiting = vec![first];
        while let Ok(more) = requests.try_recv() {
            waiting.push(more);
        }
        let want: usize = waiting.iter().map(|r| r.want).sum::<usize>().min(MAX_BATCH);
        pull_id += 1;
        let reply = format!("{inbox}.{pull_id}");
        let body = json!({"batch": want, "no_wait": true}).to_string();
        let mut got = Vec::new();
        if let Err(err) = client
            .publish_with_reply(api.clone(), reply.clone(), body.into())
            .await
        {
            warn!(error = %err, "pull request failed");
        } else {
            let deadline = tokio::time::Instant::now() + PULL_ANSWER_TIMEOUT;
            while got.len() < want {
                let Ok(Some(msg)) = tokio::time::timeout_at(deadline, subscription.next()).await
                else {
                    break;
                };
                match msg.status {
                    None | Some(StatusCode::OK) => got.push(jetstream::Message {
                        message: msg,
                        context: js.clone(),
                    }),
                    // The end of this pull (no messages, expired, or refused); other pulls'
                    // statuses and heartbeats are not ours to act on.
                    Some(_) if msg.subject.as_str() == reply => break,
                    Some(_) => {}
                }
            }
        }
        // Hand the messages out in arrival order, to fetches in arrival order.
        let mut messages = got.into_iter();
        for req in waiting {
            let share: Vec<_> = messages.by_ref().take(req.want).collect();
            if let Err(unwanted) = req.reply.send(share) {
                for msg in unwanted {
                    let _ = msg.ack_with(jetstream::AckKind::Nak(None)).await;
                }
            }
        }
    }
}

/// A message nobody asked for any more goes straight back to the stream.
async fn release(js: &jetstream::Context, msg: async_nats::Message) {
    if msg.status.is_some() && msg.status != Some(StatusCode::OK) {
        return;
    }
    let msg = jetstream::Message {
        message: msg,
        context: js.clone(),
    };
    if let Err(err) = msg.ack_with(jetstream::AckKind::Nak(None)).await {
        warn!(error = %err, "could not release a late queue message");
    }
}
