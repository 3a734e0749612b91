//! A durable consumer read for as long as its reader wants, whatever NATS does to the pull
//! requests meanwhile: the leader's timer and job-write feeds.
//!
//! async-nats asks for more messages only as messages or expiries come in. A pull request
//! nobody received (no responders: the consumer's Raft group electing a leader) or one a
//! new consumer leader never heard of leaves the reader with nothing until async-nats's
//! safety net asks again, after the expiry plus 5 s — 35 s by default, which held a retry's
//! timer that long after a partition healed (`cluster::a_gateway_cut_off…`). Here pull
//! requests expire after `EXPIRES`, one lost without a word is noticed when two `HEARTBEAT`s
//! pass in silence, and either loss renews the pull subscription at once.

use std::time::Duration;

use async_nats::jetstream::consumer::pull::{self, MessagesError, MessagesErrorKind};
use async_nats::jetstream::consumer::{PullConsumer, StreamError};
use async_nats::jetstream::Message;
use futures::stream::BoxStream;
use futures::StreamExt;
use tracing::warn;

/// How long a pull request waits at the server for messages before it is renewed.
const EXPIRES: Duration = Duration::from_secs(10);
/// The server's sign of life for a waiting pull request.
const HEARTBEAT: Duration = Duration::from_secs(2);
/// The pause before asking again after a loss: an election takes a moment.
const RENEW_PAUSE: Duration = Duration::from_millis(100);

/// The messages of `consumer`, asked for again whenever a pull request is lost; `feed`
/// names it in the logs. Other errors are passed on.
///
/// # Errors
/// When the first pull subscription cannot be made.
pub(super) async fn renewed(
    consumer: PullConsumer,
    feed: &'static str,
) -> Result<BoxStream<'static, Result<Message, MessagesError>>, StreamError> {
    let first = subscribe(&consumer).await?;
    let state = (consumer, Some(first), false);
    Ok(futures::stream::unfold(
        state,
        move |(consumer, mut messages, mut lost)| async move {
            loop {
                let current = match messages.as_mut() {
                    Some(current) => current,
                    None => match subscribe(&consumer).await {
                        Ok(renewed) => messages.insert(renewed),
                        Err(err) => {
                            warn!(feed, error = %err, "could not ask for messages again");
                            tokio::time::sleep(RENEW_PAUSE).await;
                            continue;
                        }
                    },
                };
                match current.next().await? {
                    Err(err) if pull_lost(&err) => {
                        if !lost {
                            warn!(feed, error = %err, "a pull request was lost; asking again");
                        }
                        lost = true;
                        messages = None;
                        tokio::time::sleep(RENEW_PAUSE).await;
                    }
                    item => {
                        lost &= item.is_err();
                        return Some((item, (consumer, messages, lost)));
                    }
                }
            }
        },
    )
    .boxed())
}

async fn subscribe(consumer: &PullConsumer) -> Result<pull::Stream, StreamError> {
    consumer
        .stream()
        .expires(EXPIRES)
        .heartbeat(HEARTBEAT)
        .messages()
        .await
}

/// Whether `err` says a pull request reached nobody or went silent.
fn pull_lost(err: &MessagesError) -> bool {
    matches!(
        err.kind(),
        MessagesErrorKind::NoResponders | MessagesErrorKind::MissingHeartbeat
    )
}
