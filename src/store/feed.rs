//! A durable consumer read for as long as its reader wants, whatever NATS does to the pull
//! requests meanwhile: the leader's timer and job-write feeds.
//!
//! async-nats asks for more messages only as messages or expiries come in. A pull request
//! nobody received (no responders: the consumer's Raft group electing a leader) or one a
//! new consumer leader never heard of leaves the reader with nothing until async-nats's
//! safety net asks again, after the expiry plus 5 s — 35 s by default, which held a retry's
//! timer that long after a partition healed (`cluster::a_gateway_cut_off…`). Here pull
//! requests expire after `EXPIRES`, one lost without a word is noticed when two `HEARTBEAT`s
//! pass in silence, and either loss renews the pull subscription at once. `Deliveries`
//! tells its reader when deliveries themselves were lost on the way.

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

/// The deliveries read so far from a consumer with one reader. The consumer numbers its
/// deliveries one by one, so a jump says the ones between were lost on the way: in flight
/// when the reader's connection or the consumer's leader went down, or to a subscription
/// `renewed` dropped. They count as delivered and pending until the AckWait.
pub(super) struct Deliveries {
    last: u64,
    /// The consumer's deliveries so far as the last quiet probe read them, when more than
    /// had arrived: still on the way then, or lost.
    suspect: Option<u64>,
}

impl Deliveries {
    /// Counting on from `delivered`, the consumer's deliveries so far (0 for a new one).
    pub(super) fn after(delivered: u64) -> Deliveries {
        Deliveries {
            last: delivered,
            suspect: None,
        }
    }

    /// How many deliveries were lost with none after them to show the gap, at a probe of
    /// a quiet feed that read `delivered`, the consumer's deliveries so far. One not
    /// arrived yet may still be on the way at the probe that reads it; not arrived by the
    /// next probe, a feed quiet all the while, it was lost.
    pub(super) fn quiet(&mut self, delivered: u64) -> u64 {
        let lost = self
            .suspect
            .map_or(0, |suspect| suspect.saturating_sub(self.last));
        self.suspect = (delivered > self.last).then_some(delivered);
        lost
    }

    /// How many deliveries before `delivery` (its consumer sequence) never arrived. A number
    /// that comes again (a consumer leader change before the last delivery was stored) is no
    /// gap.
    pub(super) fn lost_before(&mut self, delivery: u64) -> u64 {
        let lost = delivery.saturating_sub(self.last + 1);
        self.last = self.last.max(delivery);
        lost
    }
}

/// Whether `err` says a pull request reached nobody or went silent.
fn pull_lost(err: &MessagesError) -> bool {
    matches!(
        err.kind(),
        MessagesErrorKind::NoResponders | MessagesErrorKind::MissingHeartbeat
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jump_in_the_numbering_counts_the_deliveries_lost_and_a_repeat_does_not() {
        let mut deliveries = Deliveries::after(0);
        assert_eq!(deliveries.lost_before(1), 0);
        assert_eq!(deliveries.lost_before(2), 0);
        assert_eq!(deliveries.lost_before(5), 2);
        assert_eq!(deliveries.lost_before(4), 0, "numbered again");
        assert_eq!(deliveries.lost_before(6), 0);
        assert_eq!(Deliveries::after(10).lost_before(11), 0);
        assert_eq!(Deliveries::after(10).lost_before(13), 2);
    }

    #[test]
    fn a_delivery_missing_at_two_quiet_probes_in_a_row_is_lost() {
        let mut deliveries = Deliveries::after(3);
        assert_eq!(deliveries.quiet(3), 0, "all arrived");
        assert_eq!(deliveries.quiet(5), 0, "two may still be on the way");
        assert_eq!(deliveries.quiet(5), 2, "still missing at the next probe");

        let mut deliveries = Deliveries::after(3);
        assert_eq!(deliveries.quiet(5), 0);
        assert_eq!(deliveries.lost_before(4), 0);
        assert_eq!(deliveries.lost_before(5), 0);
        assert_eq!(deliveries.quiet(5), 0, "arrived between the probes");

        let mut deliveries = Deliveries::after(3);
        assert_eq!(deliveries.quiet(6), 0);
        assert_eq!(deliveries.lost_before(4), 0);
        assert_eq!(deliveries.quiet(6), 2, "the last two of three never came");

        let mut deliveries = Deliveries::after(5);
        assert_eq!(deliveries.quiet(3), 0, "numbered again: nothing missing");
        assert_eq!(deliveries.quiet(3), 0);
    }
}
