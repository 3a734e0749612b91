//! A PUSH's places in bounded queues (docs/architecture.md §3.27): one depth token per job,
//! taken before anything else is written, and given back when the PUSH fails; by the
//! queue's strategy a full queue refuses, blocks, or drops its oldest available jobs. The
//! depth streams and their tokens belong to the queues resource (`queues/backpressure.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use futures::future::join_all;
use tracing::warn;

use super::Jobs;
use crate::domain::backpressure::{self, Bound, Overflow};
use crate::domain::envelope::parse_job_id;
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::job::JobRecord;
use crate::domain::lifecycle;
use crate::domain::listing::ListQuery;
use crate::domain::state::JobState;
use crate::store::cas::Replica;
use crate::store::deadline::by_deadline;
use crate::store::queues::backpressure::Token;

/// Rounds of dropping a `drop_oldest` PUSH makes before it is refused (PUSHes racing for
/// the places it made).
const DROP_ROUNDS: usize = 3;
/// Records read at once by the sweep.
const SWEEP_AT_ONCE: usize = 64;

impl Jobs {
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
        &self,
        records: &mut [JobRecord],
        block: Duration,
    ) -> Result<Vec<Token>, OjsError> {
        let queues: BTreeSet<&str> = records.iter().map(|r| r.job.queue.as_str()).collect();
        let bounds: BTreeMap<String, Bound> = queues
            .into_iter()
            .filter_map(|q| Some((q.to_owned(), self.queues.own.registry.bound(q)?)))
            .collect();
        if bounds.is_empty() {
            return Ok(Vec::new());
        }
        // More jobs than the bound: no strategy can make room for them.
        for (queue, bound) in &bounds {
            let jobs = records.iter().filter(|r| &r.job.queue == queue).count();
            if jobs as u64 > bound.max_depth {
                return Err(self.queues.refuse(queue, bound, records).await);
            }
        }
        let until = Instant::now() + block;
        let mut round = 0;
        loop {
            let topology = &self.conn.topology;
            let (indices, tokens): (Vec<usize>, Vec<_>) = records
                .iter()
                .enumerate()
                .filter_map(|(index, rec)| {
                    let queue = rec.job.queue.as_str();
                    let max_depth = bounds.get(queue)?.max_depth;
                    let token = self.conn.take_token(
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
                self.queues.count_taken(&taken);
                return Ok(taken);
            }
            self.queues.give_back_depth_tokens(&taken).await;
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
                return Err(self.queues.refuse(queue, &bounds[queue], records).await);
            }
            for (queue, &needed) in &full {
                if bounds[queue].strategy == Overflow::Block
                    && !self.queues.wait_for_room(queue, needed, until).await?
                {
                    return Err(self.queues.refuse(queue, &bounds[queue], records).await);
                }
            }
            for (queue, &needed) in &full {
                if bounds[queue].strategy == Overflow::DropOldest
                    && self.drop_oldest(queue, needed).await? == 0
                {
                    return Err(self.queues.refuse(queue, &bounds[queue], records).await);
                }
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
    async fn drop_oldest(&self, queue: &str, wanted: usize) -> Result<usize, OjsError> {
        let mut query = ListQuery::of(Some(queue.to_owned()), Some(JobState::Available), None);
        let mut oldest = Vec::with_capacity(wanted);
        while oldest.len() < wanted {
            let page = self.list(&query).await?;
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
        self.queues.delete_depth_tokens(freed).await?;
        Ok(dropped)
    }

    /// Gives back the tokens of a PUSH that failed after taking them, except those whose
    /// job exists after all (a write that landed though its answer was lost, a committed
    /// batch whose messages the repair will publish). Best effort by the deadline, like the
    /// give-back.
    pub(in crate::store) async fn give_back_unheld(&self, taken: &[Token]) {
        let giving = async {
            let tokens = taken.iter().map(|t| (t.id.as_str(), t.sequence));
            match self.unheld(tokens).await {
                Ok(unheld) => {
                    let freed = unheld
                        .into_iter()
                        .map(|i| (taken[i].queue.as_str(), taken[i].sequence));
                    if let Err(err) = self.queues.delete_depth_tokens(freed).await {
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
        &self,
        tokens: impl Iterator<Item = (&'a str, u64)>,
    ) -> Result<Vec<usize>, OjsError> {
        let tokens: Vec<(&str, u64)> = tokens.collect();
        let mut unheld = Vec::new();
        for (chunk, some) in tokens.chunks(SWEEP_AT_ONCE).enumerate() {
            // A body that is no job id (not written by a PUSH) names no job.
            let reads = some.iter().map(|(id, _)| async move {
                match parse_job_id(id) {
                    Some(id) => self.read(&id, Replica::Leader).await,
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
}
