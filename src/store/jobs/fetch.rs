//! FETCH (core §7.2) and the claim of each delivered message: queues in order, priorities
//! highest first, long polling through the lanes' pull loops (`puller.rs`); what a message
//! does to its job is decided in `domain::claim` (docs/architecture.md §3.1–§3.3, §4.2).

use std::time::Duration;

use async_nats::jetstream::AckKind;
use chrono::Utc;
use futures::future::join_all;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::records::{settle, Dispatch, Lookup, ORPHAN_GRACE};
use super::Jobs;
use crate::domain::claim::{self, ClaimStep, Claimant, Delivered};
use crate::domain::error::OjsError;
use crate::domain::job::{Job, JobRecord, Transition};
use crate::domain::lifecycle::{self, Delivery};
use crate::domain::rate_limit::Limits;
use crate::domain::requests::FetchRequest;
use crate::domain::state::JobState;
use crate::store::cas::{pause_after, Cas, Replica, MAX_CAS_ATTEMPTS};
use crate::store::deadline;
use crate::store::queues::puller::{release_confirmed, Puller};
use crate::store::queues::registry::LANE_RETRY;

/// Longest a claim waits for the record a PUSH through this gateway is still creating.
const RECORD_ON_ITS_WAY: Duration = Duration::from_secs(1);

/// How long from its start a FETCH that found nothing waits on its lanes even when it asked
/// for a shorter wait or none.
/// nats-server acknowledges a publish before it tells the stream's consumers of the message
/// (on another goroutine, milliseconds later on a busy server), so a pull right after a
/// PUSH's answer can find its lane empty; a waiting pull is served the moment the consumer
/// is told, so a job whose PUSH was answered is in the next FETCH (architecture §3.3).
const PUBLISH_SETTLE: Duration = Duration::from_millis(20);

/// What a FETCH has claimed so far, and the first failure.
#[derive(Default)]
struct Claims {
    jobs: Vec<Job>,
    failure: Option<OjsError>,
}

/// The failure of a FETCH whose deadline passed while NATS had not answered a step.
fn out_of_time() -> OjsError {
    deadline::out_of_time("fetching")
}

impl Claims {
    fn is_empty(&self) -> bool {
        self.jobs.is_empty() && self.failure.is_none()
    }
}

/// Parks one waiter on every lane and returns the first message delivered, with any that
/// arrived at the same moment, tagged with their lane; empty at `until`, or when `stop`
/// completes first.
async fn wait_for_delivery(
    lanes: &[(String, i32, Puller)],
    until: Instant,
    stop: impl std::future::Future<Output = ()>,
) -> Vec<(usize, async_nats::jetstream::Message)> {
    let (sink, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for (lane, (_, _, puller)) in lanes.iter().enumerate() {
        puller.wait(lane, until, sink.clone()).await;
    }
    drop(sink);
    let first = tokio::select! {
        first = rx.recv(), if !lanes.is_empty() => first,
        () = tokio::time::sleep_until(until) => None,
        () = stop => None,
    };
    // Withdraw from every lane, then take what was sent before that: nothing is dropped.
    rx.close();
    let mut got: Vec<_> = first.into_iter().collect();
    while let Ok(more) = rx.try_recv() {
        got.push(more);
    }
    got
}

/// What a delivered message came to.
enum Claimed {
    Job(Box<Job>),
    /// Stale, spent or put back: nothing for the worker.
    Nothing,
    /// Its queue's limits allow no start now (the window is spent, or every running place
    /// taken): put back, first in line.
    Limited,
}

/// How soon a FETCH looks again at a queue whose running places were all taken.
const SLOT_RECHECK: Duration = Duration::from_millis(50);

/// Adds a claim's outcome to `got`; a message whose claim failed is released for another
/// fetch (confirmed: claims fail when NATS does, and a plain NAK is lost then), and the
/// failure reported only if nothing was claimed.
fn record_claim(
    msg: &async_nats::jetstream::Message,
    claim: Result<Claimed, OjsError>,
    got: &mut Claims,
) {
    match claim {
        Ok(Claimed::Job(job)) => got.jobs.push(*job),
        Ok(Claimed::Nothing | Claimed::Limited) => {}
        Err(err) => {
            release_confirmed(msg, Some(Duration::from_secs(1)));
            got.failure.get_or_insert(err);
        }
    }
}

impl Jobs {
    /// FETCH (core §7.2): queues in the given order, priorities highest first, FIFO within a
    /// priority; each job claimed by one compare-and-set on its record. An empty answer
    /// waits up to `wait` for the first job to arrive, and on its lanes for at least 20 ms
    /// (`PUBLISH_SETTLE`).
    ///
    /// No NATS step starts or outlasts the request's deadline (`deadline.rs`: the caller
    /// gives `wait` + `request_deadline_ms`), so a FETCH answers by then even while NATS
    /// elects a leader (architecture §3.3). It stops waiting when `gone` is cancelled (its
    /// client went away; the caller then hands back what it claimed, `hand_back_unsent`).
    ///
    /// # Errors
    /// `backend_error` when NATS fails before anything was claimed.
    pub async fn fetch(
        &self,
        req: &FetchRequest,
        gone: &CancellationToken,
    ) -> Result<Vec<Job>, OjsError> {
        let started = Instant::now();
        let until = started + req.wait.unwrap_or_default();
        let deadline = deadline::current();
        let stop_waiting = &self.conn.stop_waiting;
        let mut got = Claims::default();
        loop {
            // Armed before looking, so a queue (or priority) created meanwhile is not missed.
            let registry_changed = self.queues.own.registry.changed();
            tokio::pin!(registry_changed);
            registry_changed.as_mut().enable();
            let (lanes, recheck) = self.fetch_now(req, deadline, &mut got).await;
            if !got.is_empty() || stop_waiting.is_cancelled() || gone.is_cancelled() {
                break;
            }
            let now = Instant::now();
            let settling = started + PUBLISH_SETTLE;
            let wait_until = if until > now {
                // Rate-limited queues are not waited on (a delivery would skip their
                // limit): they are looked at again when their next start may be free.
                recheck.map_or(until, |r| until.min(now + r))
            } else if now < settling && !lanes.is_empty() {
                // Asked for (almost) no wait: the lanes only, once, and no second look at
                // the queues (a rate-limited queue's next window is not this FETCH's).
                settling
            } else {
                break;
            };
            let stop = async {
                tokio::select! {
                    () = registry_changed => {}
                    () = stop_waiting.cancelled() => {}
                    () = gone.cancelled() => {}
                }
            };
            let delivered = wait_for_delivery(&lanes, wait_until, stop).await;
            for (lane, msg) in delivered {
                let (queue, priority, _) = &lanes[lane];
                // Paused (or maintenance began) while this FETCH waited: the message goes
                // back, first in line.
                let now = Utc::now();
                if got.jobs.len() < req.count
                    && !self.queues.own.registry.is_held(queue, now)
                    && !self.system.in_maintenance(now)
                {
                    let limits = self.queues.own.registry.limits(queue, now);
                    let claim = self
                        .claim(&msg, queue, *priority, req, deadline, limits)
                        .await;
                    record_claim(&msg, claim, &mut got);
                } else {
                    settle(&msg, AckKind::Nak(None)).await;
                }
            }
            if wait_until > until {
                break;
            }
        }
        match got.failure {
            Some(err) if got.jobs.is_empty() => Err(err),
            _ => Ok(got.jobs),
        }
    }

    /// FETCH for a caller that may go away mid-request (HTTP and gRPC): the claims run in
    /// a task of their own within the current deadline (moved `req.wait` later), so no
    /// delivered message is left unsettled if this future is dropped; the caller's going
    /// ends the wait, and what was claimed by then goes straight back to the queue.
    ///
    /// # Errors
    /// As [`Jobs::fetch`].
    pub async fn fetch_for_caller(&self, req: FetchRequest) -> Result<Vec<Job>, OjsError> {
        let deadline = deadline::wait_on_top(req.wait.unwrap_or_default());
        let gone = CancellationToken::new();
        let _gone_when_dropped = gone.clone().drop_guard();
        let jobs = self.clone();
        let task = deadline::within(deadline, async move {
            let claimed = jobs.fetch(&req, &gone).await?;
            if gone.is_cancelled() && !claimed.is_empty() {
                jobs.hand_back_unsent(&claimed).await;
            }
            Ok::<_, OjsError>(claimed)
        });
        tokio::spawn(task)
            .await
            .map_err(|e| OjsError::backend("The fetch task failed.").with_source(e))?
    }

    /// Hands back the jobs a FETCH claimed for a client that went away before they were
    /// sent (`lifecycle::hand_back`): each available again at once, its attempt not
    /// counted, its queue message delivered again first in line. One that cannot be
    /// handed back now lapses at the end of its reservation, as before.
    pub async fn hand_back_unsent(&self, jobs: &[Job]) {
        let handed = jobs.iter().map(|job| async move {
            let back = self
                .transition(&job.id, |rec, _| Ok(lifecycle::hand_back(rec, job.attempt)))
                .await;
            match back {
                Ok(settled) => self.let_go(&settled, "-NAK").await,
                Err(err) => {
                    warn!(job_id = %job.id, error = %err, "could not hand back a job whose FETCH went away");
                }
            }
        });
        join_all(handed).await;
    }

    /// Ends every long-polling FETCH now, with what it holds, and lets no later one wait:
    /// a shutting-down gateway answers its workers at once (architecture §3.3).
    pub fn stop_waiting(&self) {
        self.conn.stop_waiting.cancel();
    }

    /// Claims what the named queues hold now, up to the request's count; returns every
    /// queue lane it looked at that a waiting FETCH may wait on, and when to look again at
    /// the rate-limited queues it met (those are never waited on). A failure, or the
    /// deadline, stops it and is kept in `got`, so jobs already claimed are still handed
    /// out.
    async fn fetch_now(
        &self,
        req: &FetchRequest,
        deadline: Instant,
        got: &mut Claims,
    ) -> (Vec<(String, i32, Puller)>, Option<Duration>) {
        let mut lanes = Vec::new();
        let mut recheck: Option<Duration> = None;
        // Maintenance mode (architecture §3.31): no queue hands out work.
        if self.system.in_maintenance(Utc::now()) {
            return (lanes, recheck);
        }
        for queue in req.order(rand::random::<f64>) {
            if Instant::now() >= deadline {
                got.failure.get_or_insert_with(out_of_time);
                return (lanes, recheck);
            }
            let now = Utc::now();
            let meta = match self.queues.own.registry.lookup(queue).await {
                Ok(Some(meta)) if !meta.held(now) => meta,
                Ok(_) => continue,
                Err(err) => {
                    got.failure.get_or_insert(err);
                    return (lanes, recheck);
                }
            };
            let mut spent = false;
            let limits = meta.limits(now);
            'lanes: for priority in meta.priorities {
                let puller = match self.queues.own.registry.puller(queue, priority).await {
                    Ok(Some(puller)) => puller,
                    // Its jobs wait in the stream; the lane is looked at again soon.
                    Ok(None) => {
                        recheck = Some(recheck.map_or(LANE_RETRY, |r| r.min(LANE_RETRY)));
                        continue;
                    }
                    Err(err) => {
                        got.failure.get_or_insert(err);
                        return (lanes, recheck);
                    }
                };
                loop {
                    let need = req.count.saturating_sub(got.jobs.len());
                    if need == 0 || got.failure.is_some() {
                        return (lanes, recheck);
                    }
                    // A limited queue's jobs one at a time: each start takes a token.
                    let want = if limits.any() { 1 } else { need };
                    // A message the loop hands out after this gives up is released there.
                    let Ok(delivered) = tokio::time::timeout_at(deadline, puller.pull(want)).await
                    else {
                        got.failure.get_or_insert_with(out_of_time);
                        return (lanes, recheck);
                    };
                    if delivered.is_empty() {
                        break;
                    }
                    // Each message is its own job: claimed side by side, so the reads and
                    // writes of a FETCH of many go to NATS together; kept in delivery order.
                    let claims = delivered
                        .iter()
                        .map(|msg| self.claim(msg, queue, priority, req, deadline, limits));
                    for (msg, claim) in delivered.iter().zip(join_all(claims).await) {
                        spent |= matches!(claim, Ok(Claimed::Limited));
                        record_claim(msg, claim, got);
                    }
                    if spent {
                        break 'lanes;
                    }
                }
                if !limits.any() {
                    lanes.push((queue.to_owned(), priority, puller));
                }
            }
            let again = match (limits.rate, limits.concurrency) {
                (Some(limit), _) => {
                    let jitter = Duration::from_micros(rand::random_range(0..4000));
                    Some(limit.recheck(Utc::now().timestamp_millis(), spent, jitter))
                }
                // A place frees when a job ends: look again soon.
                (None, Some(_)) => Some(SLOT_RECHECK),
                (None, None) => None,
            };
            if let Some(again) = again {
                recheck = Some(recheck.map_or(again, |r| r.min(again)));
            }
        }
        (lanes, recheck)
    }

    /// Claims the job a delivered queue message points to, or settles the message when it
    /// is stale. A job of a limited queue (`limits`) starts only with a start of its
    /// window and a free running place. Past `deadline` it starts no read or write, and
    /// fails (`record_claim` hands the message back).
    async fn claim(
        &self,
        msg: &async_nats::jetstream::Message,
        queue: &str,
        priority: i32,
        req: &FetchRequest,
        deadline: Instant,
        limits: Limits,
    ) -> Result<Claimed, OjsError> {
        let mut slot = None;
        let claimed = self
            .claim_rounds(msg, queue, priority, req, deadline, limits, &mut slot)
            .await;
        // A place taken for a start that did not happen is freed at once.
        if let (Some(sequence), false) = (slot, matches!(claimed, Ok(Claimed::Job(_)))) {
            self.queues.give_back_slot(queue, sequence).await;
        }
        claimed
    }

    /// The rounds of `claim`; `slot` keeps the running place taken, if any.
    #[allow(clippy::too_many_arguments)]
    async fn claim_rounds(
        &self,
        msg: &async_nats::jetstream::Message,
        queue: &str,
        priority: i32,
        req: &FetchRequest,
        deadline: Instant,
        limits: Limits,
        slot: &mut Option<u64>,
    ) -> Result<Claimed, OjsError> {
        let Ok(d) = serde_json::from_slice::<Dispatch>(&msg.payload) else {
            warn!(subject = %msg.subject, "dropping an unreadable queue message");
            settle(msg, AckKind::Term).await;
            return Ok(Claimed::Nothing);
        };
        let (Some(reply), Ok(info)) = (msg.reply.as_ref(), msg.info()) else {
            return Ok(Claimed::Nothing);
        };
        let delivery = Delivery {
            ack_subject: reply.to_string(),
            sequence: info.stream_sequence,
        };
        let age = Utc::now().timestamp_millis() as i128
            - info.published.unix_timestamp_nanos() / 1_000_000;
        let delivered = Delivered {
            dispatch: d.dispatch,
            queue,
            priority,
            delivery,
            orphan_age_passed: age > ORPHAN_GRACE.as_millis() as i128,
        };

        self.conn.failpoint("fetch.claiming").await;
        let mut raced = None;
        let mut started = false;
        for attempt in 0..MAX_CAS_ATTEMPTS {
            if Instant::now() >= deadline {
                return Err(out_of_time());
            }
            // The first try may use the record this gateway wrote last, or is writing now
            // (`recent.rs`).
            let guess = if attempt == 0 {
                self.own
                    .recent
                    .take_when_written(&d.id, RECORD_ON_ITS_WAY)
                    .await
            } else {
                None
            };
            let guessed = guess.is_some();
            let (rec, revision) = match guess {
                Some(found) => found,
                None => match self.lookup(&d.id, Replica::after(raced.is_some())).await? {
                    Lookup::Found(rec, revision) => (*rec, revision),
                    Lookup::Removed => {
                        settle(msg, AckKind::Term).await;
                        return Ok(Claimed::Nothing);
                    }
                    Lookup::Missing => {
                        // The enqueue that published this message may still be creating the
                        // record.
                        if look_again(attempt, &delivered).await {
                            continue;
                        }
                        let kind = if delivered.orphan_age_passed {
                            AckKind::Term
                        } else {
                            AckKind::Nak(Some(Duration::from_secs(1)))
                        };
                        settle(msg, kind).await;
                        return Ok(Claimed::Nothing);
                    }
                },
            };
            let claimant = Claimant {
                worker_id: req.worker_id.as_deref(),
                visibility: req.visibility,
                default_visibility: self.conn.visibility_timeout,
            };
            let step = claim::decide(&rec, &delivered, claimant, Utc::now());
            let mut next = match step {
                Ok(ClaimStep::Write(next)) => *next,
                // A remembered record only ever decides a write; anything else is decided on
                // a fresh read.
                _ if guessed => continue,
                Ok(ClaimStep::Behind) => {
                    if look_again(attempt, &delivered).await {
                        continue;
                    }
                    settle(msg, AckKind::Nak(Some(Duration::from_millis(200)))).await;
                    return Ok(Claimed::Nothing);
                }
                Ok(ClaimStep::Spent) => {
                    settle(msg, AckKind::Ack).await;
                    return Ok(Claimed::Nothing);
                }
                Ok(ClaimStep::Foreign) => {
                    settle(msg, AckKind::Term).await;
                    return Ok(Claimed::Nothing);
                }
                Err(err) => return Err(err),
            };
            if Instant::now() >= deadline {
                return Err(out_of_time());
            }
            // One running place and one start of the window per job started (a lost race
            // keeps them: the next round writes the same start).
            if let (true, Transition::Started, false) = (limits.any(), next.transition, started) {
                if let Some(concurrency) = limits.concurrency {
                    *slot = self
                        .queues
                        .take_slot(queue, concurrency, &d.id, d.dispatch)
                        .await?;
                    if slot.is_none() {
                        settle(msg, AckKind::Nak(None)).await;
                        return Ok(Claimed::Limited);
                    }
                }
                if let Some(limit) = limits.rate {
                    if !self.queues.take_start(queue, limit).await? {
                        settle(msg, AckKind::Nak(None)).await;
                        return Ok(Claimed::Limited);
                    }
                }
                started = true;
            }
            if let (Some(sequence), Some(holder)) = (*slot, next.holder.as_mut()) {
                holder.slot = Some(sequence);
            }
            self.prepare(&rec, &mut next).await?;
            // No deadline timer here: the leader watches the job from this write (§3.6).
            let written = match self.write(&d.id, &rec, &mut next, revision).await? {
                Cas::Written(written) => written,
                Cas::Refused(why) => {
                    raced = Some(why);
                    pause_after(why, attempt).await;
                    continue;
                }
            };
            self.conn.failpoint("fetch.claimed").await;
            // A lapse taken over frees the place of the attempt that lapsed.
            let held = |r: &JobRecord| r.holder.as_ref().and_then(|h| h.slot);
            if let Some(old) = held(&rec).filter(|old| held(&next) != Some(*old)) {
                self.queues.give_back_slot(queue, old).await;
            }
            if next.job.state == JobState::Active {
                self.own.recent.remember(&d.id, next.clone(), written);
            }
            return Ok(match next.job.state {
                JobState::Active if next.transition == Transition::Redelivered => {
                    settle(msg, AckKind::Progress).await;
                    Claimed::Nothing
                }
                JobState::Active => Claimed::Job(Box::new(next.job)),
                _ => {
                    settle(msg, AckKind::Ack).await;
                    Claimed::Nothing
                }
            });
        }
        debug!(job_id = %d.id, "claim lost every compare-and-set; leaving the message for later");
        settle(msg, AckKind::Nak(Some(Duration::from_millis(100)))).await;
        Ok(Claimed::Nothing)
    }
}

/// Pauses before looking again for the record a young message points to that is missing or
/// `Behind`: its writer publishes the message first and writes the record a moment later,
/// and a waiting FETCH gets the message that fast. Looks after 0.5, 1, 2, 4 and 8 ms; false
/// once they are spent.
async fn look_again(attempt: usize, delivered: &Delivered<'_>) -> bool {
    let again = attempt < 5 && !delivered.orphan_age_passed;
    if again {
        tokio::time::sleep(Duration::from_micros(500 << attempt)).await;
    }
    again
}
