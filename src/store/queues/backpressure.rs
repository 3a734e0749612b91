//! Bounded queues (docs/architecture.md §3.27). A bounded queue has a depth stream in NATS
//! holding one token per unfinished job; NATS refuses a token once the stream holds
//! `max_depth` (discard new), so the bound holds across every replica with one publish per
//! job and nothing to count. A PUSH takes its jobs' tokens before anything else is written;
//! the leader deletes a job's token when the job finishes, and frees tokens whose job never
//! came to be. Queues without a bound never touch it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use chrono::Utc;
use futures::future::join_all;
use tracing::warn;

use super::Queues;
use crate::domain::backpressure::{self, Bound, BoundChange, Overflow};
use crate::domain::envelope::parse_job_id;
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::event::backpressure_event;
use crate::domain::job::JobRecord;
use crate::domain::lifecycle;
use crate::domain::listing::ListQuery;
use crate::domain::state::JobState;
use crate::store::cas::Replica;
use crate::store::deadline::{by_deadline, out_of_time};
use crate::store::ensure_stream;

/// How long a PUSH's read of a queue's depth serves the next ones (the pressure headers).
const DEPTH_TTL: Duration = Duration::from_millis(250);
/// Pause between a blocked PUSH's tries for room.
const BLOCK_PAUSE: Duration = Duration::from_millis(100);
/// Rounds of dropping a `drop_oldest` PUSH makes before it is refused (PUSHes racing for
/// the places it made).
const DROP_ROUNDS: usize = 3;
/// Records read at once by the sweep.
const SWEEP_AT_ONCE: usize = 64;

/// A depth token a PUSH took.
pub(in crate::store) struct Token {
    queue: String,
    sequence: u64,
    /// The job it was taken for.
    id: String,
}

/// How full a bounded queue is.
#[derive(Debug, Clone)]
pub struct Pressure {
    pub queue: String,
    pub depth: u64,
    pub bound: Bound,
}

/// Each queue's depth as this gateway last read it, and when.
#[derive(Default)]
pub(in crate::store) struct DepthCache(
    pub(in crate::store) std::sync::Mutex<HashMap<String, (Instant, u64)>>,
);

impl Queues<'_> {
    /// An operator's bound for `queue` (backpressure spec §6.2): its depth stream created or
    /// its limit changed first, then the registry entry every replica's PUSH follows.
    /// Unbounding keeps the stream: the tokens of jobs taken under the bound are still
    /// deleted as those jobs finish, so a bound set again counts them. A queue never seen
    /// is registered: a queue can be bounded before its first job.
    ///
    /// # Errors
    /// 400 past `max_queues`; `backend_error` when NATS fails.
    pub async fn configure_bound(self, queue: &str, change: BoundChange) -> Result<(), OjsError> {
        self.own.registry.admit_new(queue)?;
        let bound = match change {
            BoundChange::Set(bound) => {
                let config = self
                    .store
                    .inner
                    .topology
                    .depth_stream_config(queue, bound.max_depth);
                ensure_stream(&self.store.inner.js, config).await?;
                Some(bound)
            }
            BoundChange::Remove => None,
        };
        self.own.registry.set_bound(queue, bound, Utc::now()).await
    }

    /// PUSH: one token per job of a bounded queue, each record naming its token, all or
    /// none. Where a queue is full, every token taken is given back, then by the queue's
    /// strategy the PUSH is refused at once (`reject`), waits up to `block` for room
    /// (`block`), or drops as many of the queue's oldest available jobs (`drop_oldest`), and
    /// tries again; a PUSH refused for good gets 429 `queue_full`, announced by
    /// `backpressure.rejected`.
    ///
    /// # Errors
    /// 429 `queue_full`; `backend_error` when NATS fails.
    pub(in crate::store) async fn take_depth_tokens(
        self,
        records: &mut [JobRecord],
        block: Duration,
    ) -> Result<Vec<Token>, OjsError> {
        let queues: BTreeSet<&str> = records.iter().map(|r| r.job.queue.as_str()).collect();
        let bounds: BTreeMap<String, Bound> = queues
            .into_iter()
            .filter_map(|q| Some((q.to_owned(), self.own.registry.bound(q)?)))
            .collect();
        if bounds.is_empty() {
            return Ok(Vec::new());
        }
        // More jobs than the bound: no strategy can make room for them.
        for (queue, bound) in &bounds {
            let jobs = records.iter().filter(|r| &r.job.queue == queue).count();
            if jobs as u64 > bound.max_depth {
                return Err(self.refuse(queue, bound, records).await);
            }
        }
        let until = Instant::now() + block;
        let mut round = 0;
        loop {
            let topology = &self.store.inner.topology;
            let (indices, tokens): (Vec<usize>, Vec<_>) = records
                .iter()
                .enumerate()
                .filter_map(|(index, rec)| {
                    let queue = rec.job.queue.as_str();
                    let max_depth = bounds.get(queue)?.max_depth;
                    let token = self.store.take_token(
                        topology.depth_subject(queue),
                        bytes::Bytes::from(rec.job.id.clone()),
                        move || topology.depth_stream_config(queue, max_depth),
                        "taking a place in a bounded queue",
                    );
                    Some((index, token))
                })
                .unzip();
            let mut taken = Vec::new();
            // Tokens refused, by queue.
            let mut full: BTreeMap<String, usize> = BTreeMap::new();
            let mut failed = None;
            for (index, token) in indices.into_iter().zip(join_all(tokens).await) {
                let queue = &records[index].job.queue;
                match token {
                    Ok(Some(ack)) => {
                        records[index].depth_token = Some(ack.sequence);
                        taken.push(Token {
                            queue: queue.clone(),
                            sequence: ack.sequence,
                            id: records[index].job.id.clone(),
                        });
                    }
                    Ok(None) => *full.entry(queue.clone()).or_default() += 1,
                    Err(err) => failed = Some(err),
                }
            }
            if full.is_empty() && failed.is_none() {
                self.count_taken(&taken);
                return Ok(taken);
            }
            self.give_back_depth_tokens(&taken).await;
            records.iter_mut().for_each(|r| r.depth_token = None);
            if let Some(err) = failed {
                return Err(err);
            }
            round += 1;
            // A queue that refuses for good, decided before any job is dropped.
            let refusing = full.keys().find(|q| match bounds[*q].strategy {
                Overflow::Reject => true,
                Overflow::Block => false,
                Overflow::DropOldest => round > DROP_ROUNDS,
            });
            if let Some(queue) = refusing {
                return Err(self.refuse(queue, &bounds[queue], records).await);
            }
            for (queue, &needed) in &full {
                if bounds[queue].strategy == Overflow::Block
                    && !self.wait_for_room(queue, needed, until).await?
                {
                    return Err(self.refuse(queue, &bounds[queue], records).await);
                }
            }
            for (queue, &needed) in &full {
                if bounds[queue].strategy == Overflow::DropOldest
                    && self.drop_oldest(queue, needed).await? == 0
                {
                    return Err(self.refuse(queue, &bounds[queue], records).await);
                }
            }
        }
    }

    /// The refusal of a PUSH by `queue`'s bound: its depth now, `backpressure.rejected`
    /// published (best effort), 429 `queue_full`.
    async fn refuse(self, queue: &str, bound: &Bound, records: &[JobRecord]) -> OjsError {
        let depth = self
            .store
            .leader()
            .depth_now(queue)
            .await
            .unwrap_or(bound.max_depth);
        let job_type = records
            .iter()
            .find(|r| r.job.queue == queue)
            .map(|r| r.job.job_type.as_str());
        let event = backpressure_event(
            "backpressure.rejected",
            bound.event_data(queue, depth, job_type),
            uuid::Uuid::now_v7(),
            Utc::now(),
            &self.store.inner.source,
        );
        if let Err(err) = self.store.events().publish(&[event]).await {
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
    async fn wait_for_room(
        self,
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

    /// `drop_oldest`: discards `wanted` of `queue`'s oldest available jobs (a listing,
    /// oldest first) and deletes their tokens — none when fewer are available, so a PUSH
    /// that is refused anyway drops nothing; a job claimed or changed meanwhile is passed
    /// over (the PUSH tries again, up to `DROP_ROUNDS`). Answers how many were dropped.
    ///
    /// # Errors
    /// When NATS fails.
    async fn drop_oldest(self, queue: &str, wanted: usize) -> Result<usize, OjsError> {
        let mut query = ListQuery::of(Some(queue.to_owned()), Some(JobState::Available), None);
        let mut oldest = Vec::with_capacity(wanted);
        while oldest.len() < wanted {
            let page = self.store.jobs().list(&query).await?;
            oldest.extend(
                page.jobs
                    .into_iter()
                    .map(|j| j.id)
                    .take(wanted - oldest.len()),
            );
            match page.next {
                Some(next) => query.cursor = Some(next),
                None => break,
            }
        }
        if oldest.len() < wanted {
            return Ok(0);
        }
        let mut dropped = 0;
        let mut freed = Vec::new();
        for id in &oldest {
            let settled = self
                .store
                .jobs()
                .transition(id, |rec, now| lifecycle::drop_overflow(rec, now).map(Some))
                .await;
            match settled {
                Ok(settled) => {
                    dropped += 1;
                    freed.extend(settled.after.depth_token.map(|seq| (queue, seq)));
                }
                Err(err) if err.code == ErrorCode::Conflict => {}
                Err(err) => return Err(err),
            }
        }
        self.store.leader().delete_depth_tokens(freed).await?;
        Ok(dropped)
    }

    /// Gives back the tokens of a PUSH that was refused. Best effort, by the deadline: a
    /// token left behind is freed by the leader's sweep.
    pub(in crate::store) async fn give_back_depth_tokens(self, taken: &[Token]) {
        let freed = taken.iter().map(|t| (t.queue.as_str(), t.sequence));
        let given = by_deadline(self.store.leader().delete_depth_tokens(freed)).await;
        if let Err(err) = given.unwrap_or_else(|| Err(out_of_time("giving back places"))) {
            warn!(error = %err, "could not give back a refused PUSH's places; the leader's sweep will");
        }
    }

    /// Gives back the tokens of a PUSH that failed after taking them, except those whose
    /// job exists after all (a write that landed though its answer was lost, a committed
    /// batch whose messages the repair will publish). Best effort by the deadline, like the
    /// give-back.
    pub(in crate::store) async fn give_back_unheld(self, taken: &[Token]) {
        let giving = async {
            let tokens = taken.iter().map(|t| (t.id.as_str(), t.sequence));
            match self.unheld(tokens).await {
                Ok(unheld) => {
                    let freed = unheld
                        .into_iter()
                        .map(|i| (taken[i].queue.as_str(), taken[i].sequence));
                    if let Err(err) = self.store.leader().delete_depth_tokens(freed).await {
                        warn!(error = %err, "could not give back a failed PUSH's places; the leader's sweep will");
                    }
                }
                Err(err) => {
                    warn!(error = %err, "could not check a failed PUSH's places; the leader's sweep will")
                }
            }
        };
        if by_deadline(giving).await.is_none() {
            warn!("could not give back a failed PUSH's places by its deadline; the leader's sweep will");
        }
    }

    /// Of the tokens `(job id, sequence)`, the positions of those whose job does not hold
    /// them, its record read on the stream leader.
    ///
    /// # Errors
    /// When NATS fails.
    pub(in crate::store) async fn unheld<'a>(
        self,
        tokens: impl Iterator<Item = (&'a str, u64)>,
    ) -> Result<Vec<usize>, OjsError> {
        let tokens: Vec<(&str, u64)> = tokens.collect();
        let mut unheld = Vec::new();
        for (chunk, some) in tokens.chunks(SWEEP_AT_ONCE).enumerate() {
            // A body that is no job id (not written by a PUSH) names no job.
            let reads = some.iter().map(|(id, _)| async move {
                match parse_job_id(id) {
                    Some(id) => self.store.jobs().read(&id, Replica::Leader).await,
                    None => Ok(None),
                }
            });
            for (i, read) in join_all(reads).await.into_iter().enumerate() {
                let sequence = some[i].1;
                if !read?.is_some_and(|(rec, _)| backpressure::holds(&rec, sequence)) {
                    unheld.push(chunk * SWEEP_AT_ONCE + i);
                }
            }
        }
        Ok(unheld)
    }

    /// How full `queue` is, when it is bounded: its depth read at most `DEPTH_TTL` ago, plus
    /// the tokens this gateway took since.
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn pressure(self, queue: &str) -> Result<Option<Pressure>, OjsError> {
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
            _ => self.store.leader().depth_now(queue).await?,
        };
        Ok(Some(Pressure {
            queue: queue.to_owned(),
            depth,
            bound,
        }))
    }

    /// Adds a PUSH's own tokens to the depths this gateway read last, so its next answers'
    /// pressure headers count them before the next read.
    fn count_taken(self, taken: &[Token]) {
        let mut depths = self.own.depths.0.lock().expect("depth cache lock");
        for token in taken {
            if let Some((_, depth)) = depths.get_mut(&token.queue) {
                *depth += 1;
            }
        }
    }
}
