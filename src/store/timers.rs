//! Durable timers: "make this job available at T". Each timer is a message in the timers
//! stream; the coordinator leader reads all of them into memory, fires each when due and
//! only then acknowledges it. A new leader starts the feed over and sees every timer that
//! was not fired, so no timer is lost when a leader dies.

use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy, PullConsumer};
use async_nats::jetstream::context::PublishAckFuture;
use async_nats::jetstream::message::PublishMessage;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::error::backend;
use super::Store;
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::job::JobRecord;
use crate::domain::lifecycle;
use crate::domain::time;

/// A due time for one dispatch of one job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timer {
    pub id: String,
    /// The dispatch the job had when the timer was set; a later one makes the timer stale.
    pub dispatch: u64,
    #[serde(with = "time::millis")]
    pub due: DateTime<Utc>,
}

/// The leader's feed of pending timers.
pub struct TimerFeed {
    messages: futures::stream::BoxStream<
        'static,
        Result<async_nats::jetstream::Message, pull::MessagesError>,
    >,
}

/// A timer read from the feed; acknowledge it once fired.
pub struct PendingTimer {
    pub timer: Timer,
    msg: async_nats::jetstream::Message,
}

impl Store {
    /// Publishes the timer that will make `rec` available at `due`; awaited before the
    /// record is written, so a waiting job always has a timer.
    pub(super) async fn send_timer(
        &self,
        rec: &JobRecord,
        due: DateTime<Utc>,
    ) -> Result<PublishAckFuture, OjsError> {
        let timer = Timer {
            id: rec.job.id.clone(),
            dispatch: rec.dispatch,
            due,
        };
        let body = serde_json::to_vec(&timer).expect("timers serialize");
        self.inner
            .js
            .send_publish(
                self.inner.topology.timers_subject(),
                // No Nats-Msg-Id: a spare timer is harmless (promotion checks dispatch, state
                // and due time), a dropped one would strand the job.
                PublishMessage::build().payload(body.into()),
            )
            .await
            .map_err(backend("publishing a timer"))
    }

    /// Opens the timer feed from the start: the consumer is recreated, so every timer not
    /// yet acknowledged — including ones a previous leader held — is delivered again.
    ///
    /// # Errors
    /// When the consumer cannot be created.
    pub async fn timer_feed(&self) -> Result<TimerFeed, OjsError> {
        let t = &self.inner.topology;
        let stream = self
            .inner
            .js
            .get_stream(t.timers_stream())
            .await
            .map_err(backend("opening the timers stream"))?;
        let _ = stream.delete_consumer(&t.scheduler_consumer()).await;
        let consumer: PullConsumer = stream
            .create_consumer(pull::Config {
                durable_name: Some(t.scheduler_consumer()),
                ack_policy: AckPolicy::Explicit,
                deliver_policy: DeliverPolicy::All,
                // Held until fired; a new leader recreates the consumer instead of waiting.
                ack_wait: Duration::from_secs(24 * 3600),
                max_ack_pending: 10_000_000,
                num_replicas: t.replicas,
                ..Default::default()
            })
            .await
            .map_err(backend("creating the timer consumer"))?;
        let messages = consumer
            .messages()
            .await
            .map_err(backend("reading timers"))?;
        Ok(TimerFeed {
            messages: messages.boxed(),
        })
    }

    /// Fires a due timer: a retryable or scheduled job becomes available. Stale timers do
    /// nothing.
    ///
    /// # Errors
    /// When NATS fails; the timer stays pending and is fired again later.
    pub async fn fire(&self, timer: &Timer) -> Result<(), OjsError> {
        let fired = self
            .transition(&timer.id, |rec, now| {
                Ok(lifecycle::promote(rec, now, timer.dispatch))
            })
            .await;
        match fired {
            Ok(_) => Ok(()),
            // The job is gone (an admin reset): nothing is left to fire.
            Err(err) if err.code == ErrorCode::NotFound => Ok(()),
            Err(err) => Err(err),
        }
    }
}

impl TimerFeed {
    /// The next pending timer; `None` when the feed ended.
    pub async fn next(&mut self) -> Option<PendingTimer> {
        loop {
            let msg = match self.messages.next().await? {
                Ok(msg) => msg,
                Err(err) => {
                    warn!(error = %err, "timer feed error");
                    continue;
                }
            };
            match serde_json::from_slice::<Timer>(&msg.payload) {
                Ok(timer) => return Some(PendingTimer { timer, msg }),
                Err(err) => {
                    warn!(error = %err, "dropping an unreadable timer");
                    let _ = msg.ack().await;
                }
            }
        }
    }
}

impl PendingTimer {
    /// Removes the fired timer.
    pub async fn done(self) {
        if let Err(err) = self.msg.ack().await {
            warn!(error = %err, "could not acknowledge a fired timer");
        }
    }
}
