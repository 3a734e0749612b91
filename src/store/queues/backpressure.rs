//! Bounded queues (docs/architecture.md §3.27). A bounded queue has a depth stream in NATS
//! holding one token per unfinished job; NATS refuses a token once the stream holds
//! `max_depth` (discard new), so the bound holds across every replica with one publish per
//! job and nothing to count. A PUSH takes its jobs' tokens before anything else is written;
//! the leader deletes a job's token when the job finishes, and frees tokens whose job never
//! came to be. Queues without a bound never touch it.

use std::time::{Duration, Instant};

use async_nats::jetstream::stream::DeleteMessageErrorKind;
use chrono::Utc;
use futures::future::join_all;
use tracing::warn;

use super::Queues;
use crate::domain::backpressure::{Bound, BoundChange};
use crate::domain::error::OjsError;
use crate::domain::event::backpressure_event;
use crate::domain::job::JobRecord;
use crate::store::connection::ensure_stream;
use crate::store::deadline::{answered, by_deadline, out_of_time};
use crate::store::error::{already_deleted, backend};

/// How long a PUSH's read of a queue's depth serves the next ones (the pressure headers).
const DEPTH_TTL: Duration = Duration::from_millis(250);
/// Pause between a blocked PUSH's tries for room.
const BLOCK_PAUSE: Duration = Duration::from_millis(100);

/// A depth token a PUSH took.
pub(in crate::store) struct Token {
    pub(in crate::store) queue: String,
    pub(in crate::store) sequence: u64,
    /// The job it was taken for.
    pub(in crate::store) id: String,
}

/// How full a bounded queue is.
#[derive(Debug, Clone)]
pub struct Pressure {
    pub queue: String,
    pub depth: u64,
    pub bound: Bound,
}

impl Queues {
    /// An operator's bound for `queue` (backpressure spec §6.2): its depth stream created or
    /// its limit changed first, then the registry entry every replica's PUSH follows.
    /// Unbounding keeps the stream: the tokens of jobs taken under the bound are still
    /// deleted as those jobs finish, so a bound set again counts them. A queue never seen
    /// is registered: a queue can be bounded before its first job.
    ///
    /// # Errors
    /// 400 past `max_queues`; `backend_error` when NATS fails.
    pub async fn configure_bound(&self, queue: &str, change: BoundChange) -> Result<(), OjsError> {
        self.own.registry.admit_new(queue)?;
        let bound = match change {
            BoundChange::Set(bound) => {
                let config = self
                    .conn
                    .topology
                    .depth_stream_config(queue, bound.max_depth);
                ensure_stream(&self.conn.js, config).await?;
                Some(bound)
            }
            BoundChange::Remove => None,
        };
        self.own.registry.set_bound(queue, bound, Utc::now()).await
    }

    /// The refusal of a PUSH by `queue`'s bound: its depth now, `backpressure.rejected`
    /// published (best effort), 429 `queue_full`.
    pub(in crate::store) async fn refuse(
        &self,
        queue: &str,
        bound: &Bound,
        records: &[JobRecord],
    ) -> OjsError {
        let depth = self.depth_now(queue).await.unwrap_or(bound.max_depth);
        let job_type = records
            .iter()
            .find(|r| r.job.queue == queue)
            .map(|r| r.job.job_type.as_str());
        let event = backpressure_event(
            "backpressure.rejected",
            bound.event_data(queue, depth, job_type),
            uuid::Uuid::now_v7(),
            Utc::now(),
            &self.conn.source,
        );
        if let Err(err) = self.events.publish(&[event]).await {
            warn!(queue, error = %err, "could not announce a refused PUSH");
        }
        bound.full(queue, depth)
    }

    /// `block`: waits until `queue` looks to have room for `needed` more jobs, by the depth
    /// this gateway reads at most every `DEPTH_TTL` whatever the number of PUSHes waiting;
    /// `false` when `until` passes first.
    ///
    /// # Errors
    /// When NATS fails.
    pub(in crate::store) async fn wait_for_room(
        &self,
        queue: &str,
        needed: usize,
        until: Instant,
    ) -> Result<bool, OjsError> {
        loop {
            if Instant::now() + BLOCK_PAUSE >= until {
                return Ok(false);
            }
            tokio::time::sleep(BLOCK_PAUSE).await;
            let Some(p) = self.pressure(queue).await? else {
                // Unbounded meanwhile.
                return Ok(true);
            };
            if p.depth + needed as u64 <= p.bound.max_depth {
                return Ok(true);
            }
        }
    }

    /// Gives back the tokens of a PUSH that was refused. Best effort, by the deadline: a
    /// token left behind is freed by the leader's sweep.
    pub(in crate::store) async fn give_back_depth_tokens(&self, taken: &[Token]) {
        let freed = taken.iter().map(|t| (t.queue.as_str(), t.sequence));
        let given = by_deadline(self.delete_depth_tokens(freed)).await;
        if let Err(err) = given.unwrap_or_else(|| Err(out_of_time("giving back places"))) {
            warn!(error = %err, "could not give back a refused PUSH's places; the leader's sweep will");
        }
    }

    /// How full `queue` is, when it is bounded: its depth read at most `DEPTH_TTL` ago, plus
    /// the tokens this gateway took since.
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn pressure(&self, queue: &str) -> Result<Option<Pressure>, OjsError> {
        let Some(bound) = self.own.registry.bound(queue) else {
            return Ok(None);
        };
        let cached = self
            .own
            .depths
            .0
            .lock()
            .expect("depth cache lock")
            .get(queue)
            .copied();
        let depth = match cached {
            Some((read, depth)) if read.elapsed() < DEPTH_TTL => depth,
            _ => self.depth_now(queue).await?,
        };
        Ok(Some(Pressure {
            queue: queue.to_owned(),
            depth,
            bound,
        }))
    }

    /// Adds a PUSH's own tokens to the depths this gateway read last, so its next answers'
    /// pressure headers count them before the next read.
    pub(in crate::store) fn count_taken(&self, taken: &[Token]) {
        let mut depths = self.own.depths.0.lock().expect("depth cache lock");
        for token in taken {
            if let Some((_, depth)) = depths.get_mut(&token.queue) {
                *depth += 1;
            }
        }
    }

    /// Deletes the tokens `(queue, sequence)`, concurrently; one deleted already (by the
    /// sweep, or an earlier try whose answer was lost) counts as deleted.
    ///
    /// # Errors
    /// When NATS fails; repeating it is harmless.
    pub async fn delete_depth_tokens<'a>(
        &self,
        tokens: impl IntoIterator<Item = (&'a str, u64)>,
    ) -> Result<(), OjsError> {
        let doing = "freeing a place in a bounded queue";
        let deletes = tokens.into_iter().map(|(queue, sequence)| async move {
            let stream = self.conn.js
                .get_stream_no_info(self.conn.topology.depth_stream(queue))
                .await
                .map_err(backend(doing))?;
            match stream.delete_message(sequence).await {
                Ok(_) => Ok(()),
                Err(err) if already_deleted(&err) => Ok(()),
                // Refused for another reason: repeating it would hold up the event
                // publisher for good; the token stays until a sweep of a later leadership.
                Err(err) if matches!(err.kind(), DeleteMessageErrorKind::JetStream(_)) => {
                    warn!(queue, sequence, error = %err, "NATS refused to free a place in a bounded queue");
                    Ok(())
                }
                Err(err) => Err(backend(doing)(err)),
            }
        });
        join_all(deletes).await.into_iter().collect()
    }

    /// `queue`'s depth now: the tokens in its depth stream (one stream info).
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn depth_now(&self, queue: &str) -> Result<u64, OjsError> {
        let doing = "reading the depth of a bounded queue";
        let name = self.conn.topology.depth_stream(queue);
        let stream = answered(doing, || self.conn.js.get_stream(&name))
            .await?
            .said
            .map_err(backend(doing))?;
        let depth = stream.cached_info().state.messages;
        self.own
            .depths
            .0
            .lock()
            .expect("depth cache lock")
            .insert(queue.to_owned(), (Instant::now(), depth));
        Ok(depth)
    }
}
