//! Leader service: turns every job-record write into the events it implies (events seed §3)
//! and publishes them on `<namespace>.events.<type>`, moves the workflows of the jobs
//! written on (architecture §3.16), counts the writes in the queue statistics (§3.17), and
//! feeds them to the deadline watch. Reading the writes from the jobs bucket's own stream
//! means neither an event nor a deadline nor a count can be lost between a state write and
//! its handling: a write stays unacknowledged until its events are stored, it is counted
//! (job totals for the metrics included) and the watch no longer needs it.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use chrono::Utc;
use tokio_util::sync::CancellationToken;
use tracing::{error, warn};

use super::deadline_watch::{DeadlineWatch, WATCH_HOLD};
use super::progress::{Pulse, Round};
use super::unseen_writes::UnseenWrites;
use crate::domain::backpressure;
use crate::domain::error::OjsError;
use crate::domain::event::{step_events, Event};
use crate::domain::job::Step;
use crate::domain::listing::IndexMove;
use crate::domain::spans::JobSpan;
use crate::domain::stats::Change;
use crate::domain::totals::Tally;
use crate::domain::workflow;
use crate::store::{ended_lock, JobWrite, JobWrites, LostDeliveries, Store};
use crate::telemetry::logs;
use crate::telemetry::metrics::Metrics;
use crate::telemetry::otlp::SpanExporter;

/// Pause before publishing again what NATS refused.
const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// Runs `step` until it succeeds, `RETRY_PAUSE` after each failure (logged as `failed`):
/// a batch's steps are repeated, never skipped. `false` when cancelled first.
async fn until_done<F: Future<Output = Result<(), OjsError>>>(
    cancel: &CancellationToken,
    failed: &str,
    mut step: impl FnMut() -> F,
) -> bool {
    while let Err(err) = step().await {
        warn!(error = %err, "{failed}; retrying");
        tokio::select! {
            _ = cancel.cancelled() => return false,
            _ = tokio::time::sleep(RETRY_PAUSE) => {}
        }
    }
    true
}

/// The round's end when job writes were lost on the way: said once, here.
fn deliveries_lost(lost: LostDeliveries) -> Round {
    warn!(
        lost = lost.0,
        "job-write deliveries were lost on the way; this leadership ends so that the next reads them again"
    );
    Round::Lost
}

pub struct EventPublisher {
    store: Store,
    metrics: Metrics,
    /// Where the span of each transition goes, when OTLP export is on.
    spans: Option<SpanExporter>,
    /// The leadership it publishes for; it reads the writes through that term's consumer.
    term: u64,
    /// The writes never delivered here, over every feed this publisher opens.
    unseen: UnseenWrites,
}

/// The job-write feed of one opening, with what the publisher keeps between rounds.
pub struct Feed {
    writes: JobWrites,
    watch: DeadlineWatch,
    /// A batch whose events went out during the previous batch's bookkeeping; its own
    /// bookkeeping comes first in the next round.
    ahead: Option<Published>,
    /// The last write of every batch not yet acknowledged, oldest first.
    unacked: VecDeque<JobWrite>,
}

/// A batch whose events are stored and whose workflows moved on: its bookkeeping comes
/// next, then its acknowledgement.
struct Published {
    books: Books,
    /// The batch's last write (ack only): acknowledging it acknowledges the batch.
    last: Option<JobWrite>,
}

/// A batch's bookkeeping, done after its events and before its acknowledgement.
struct Books {
    /// Moves in the index of finished jobs (architecture §3.26).
    indexed: Vec<IndexMove>,
    /// The places in bounded queues of the jobs that finished (§3.27): queue and token.
    freed: Vec<(String, u64)>,
    /// The queue statistics' changes (§3.17), per queue.
    counted: BTreeMap<String, Vec<Change>>,
    /// The revision of the batch's last write: the statistics' mark.
    through: u64,
    /// The unique locks of the jobs that ended: key and job id.
    released: Vec<(String, String)>,
}

/// Keeps a batch's books: the index of finished jobs, the places in bounded queues and the
/// queue statistics side by side, as none needs another, each until done (a crash before
/// the acknowledgement repeats each); then, best effort, the unique locks (one left behind
/// is taken over by the next enqueue of its key). `false` when cancelled first.
async fn keep_books(store: &Store, cancel: &CancellationToken, books: Books) -> bool {
    let leader = store.leader();
    let done = tokio::join!(
        until_done(cancel, "indexing jobs failed", || leader
            .index_jobs(&books.indexed)),
        until_done(cancel, "freeing places in bounded queues failed", || {
            store
                .queues()
                .delete_depth_tokens(books.freed.iter().map(|(q, seq)| (q.as_str(), *seq)))
        }),
        until_done(cancel, "counting job writes failed", || {
            leader.count_writes(&books.counted, books.through)
        }),
    );
    if done != (true, true, true) {
        return false;
    }
    leader.release_unique_locks(&books.released).await;
    true
}

impl EventPublisher {
    pub fn new(
        store: Store,
        metrics: Metrics,
        spans: Option<SpanExporter>,
        term: u64,
    ) -> EventPublisher {
        EventPublisher {
            store,
            metrics,
            spans,
            term,
            unseen: UnseenWrites::default(),
        }
    }

    /// Works (`pulse`) from opening the feed until it is open, and from each batch, or each
    /// deadline come due, until it is handled and acknowledged; waiting for writes is idle.
    pub async fn run(mut self, cancel: CancellationToken, pulse: Pulse) {
        while !cancel.is_cancelled() {
            pulse.working();
            let mut feed = match self.open().await {
                Ok(feed) => feed,
                Err(err) => {
                    warn!(error = %err, "event publisher cannot open the job-write feed");
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    }
                }
            };
            pulse.idle();
            loop {
                match self.run_once(&mut feed, &cancel, &pulse).await {
                    Round::Handled => {}
                    Round::Closed => break,
                    // The coordinator steps down; the next leadership reads on from the
                    // last write acknowledged (`take_over_job_writes`).
                    Round::Cancelled | Round::Lost => return,
                }
            }
        }
    }

    /// Opens the job-write feed of this leadership where the last one left off.
    ///
    /// # Errors
    /// When NATS fails, or a later leadership has taken over.
    pub async fn open(&mut self) -> Result<Feed, OjsError> {
        let writes = self.store.leader().job_writes(self.term).await?;
        self.unseen.begins_after(writes.starts_after);
        // Writes before the feed were counted by earlier leaderships, or never will be.
        if let Err(err) = self.store.leader().mark_counted(writes.starts_after).await {
            warn!(error = %err, "could not mark the writes before the feed counted");
        }
        Ok(Feed {
            writes,
            watch: DeadlineWatch::new(WATCH_HOLD, self.store.execution_timeout()),
            ahead: None,
            unacked: VecDeque::new(),
        })
    }

    /// One round: takes the batch published ahead, or waits for the next batch of writes
    /// (published: events, workflows) or the next deadline to arm; keeps the batch's books
    /// (index, places, counts), publishing the next batch meanwhile if it comes first; arms
    /// the deadlines come due (timers); then acknowledges every batch whose books are kept
    /// and the deadline watch no longer needs. Each step takes the batches in order.
    pub async fn run_once(
        &mut self,
        feed: &mut Feed,
        cancel: &CancellationToken,
        pulse: &Pulse,
    ) -> Round {
        let arm_at = feed.watch.next_arm_at();
        let until_arm = arm_at.map_or(Duration::ZERO, |at| {
            (at - Utc::now()).to_std().unwrap_or(Duration::ZERO)
        });
        let published = match feed.ahead.take() {
            Some(published) => Some(published),
            None => tokio::select! {
                _ = cancel.cancelled() => return Round::Cancelled,
                batch = feed.writes.next_batch() => {
                    pulse.working();
                    let batch = match batch {
                        Some(Ok(batch)) => batch,
                        Some(Err(lost)) => return deliveries_lost(lost),
                        None => return Round::Closed,
                    };
                    match self.publish(batch, &mut feed.watch, cancel).await {
                        Some(published) => {
                            pulse.progressed();
                            Some(published)
                        }
                        None => return Round::Cancelled,
                    }
                }
                _ = tokio::time::sleep(until_arm), if arm_at.is_some() => None,
            },
        };
        let mut closed = false;
        let mut lost = None;
        if let Some(Published { books, last }) = published {
            let store = self.store.clone();
            let kept = keep_books(&store, cancel, books);
            tokio::pin!(kept);
            let kept = tokio::select! {
                biased;
                kept = &mut kept => kept,
                batch = feed.writes.next_batch() => match batch {
                    Some(Ok(batch)) => {
                        let (kept, ahead) =
                            tokio::join!(&mut kept, self.publish(batch, &mut feed.watch, cancel));
                        feed.ahead = ahead;
                        kept && feed.ahead.is_some()
                    }
                    // This batch came before the lost deliveries: its books are kept and
                    // it is acknowledged below; nothing after it is.
                    Some(Err(deliveries)) => {
                        lost = Some(deliveries);
                        (&mut kept).await
                    }
                    None => {
                        closed = true;
                        (&mut kept).await
                    }
                },
            };
            if !kept {
                return Round::Cancelled;
            }
            feed.unacked.extend(last);
        }
        let due = feed.watch.due(Utc::now());
        let mut armed = true;
        if !due.is_empty() {
            pulse.working();
            match self.store.leader().arm_deadlines(&due).await {
                Ok(()) => due.iter().for_each(|t| feed.watch.armed(t)),
                Err(err) => {
                    armed = false;
                    warn!(error = %err, "storing deadline timers failed; retrying");
                    tokio::select! {
                        _ = cancel.cancelled() => return Round::Cancelled,
                        _ = tokio::time::sleep(RETRY_PAUSE) => {}
                    }
                }
            }
        }
        // Acknowledge up to just before the oldest write the watch still needs.
        let pinned = feed.watch.pinned_from();
        let mut through = None;
        while feed
            .unacked
            .front()
            .is_some_and(|w| pinned.is_none_or(|p| w.revision < p))
        {
            through = feed.unacked.pop_front();
        }
        if let Some(w) = through {
            w.done_through().await;
            self.store.leader().announce_handled(w.revision).await;
        }
        if let Some(lost) = lost {
            return deliveries_lost(lost);
        }
        if closed {
            return Round::Closed;
        }
        if armed {
            match feed.ahead {
                // Its books are left: they count from here.
                Some(_) => pulse.progressed(),
                None => pulse.idle(),
            }
        }
        Round::Handled
    }

    /// Publishes the batch's events until they are stored, moves on the workflows of its
    /// writes and shows them to the deadline watch; `None` when cancelled first. The same
    /// batch again until it is stored: later writes wait, so each job's events keep their
    /// order. Before a write's own events come those of the earlier writes of its job that
    /// this publisher never saw, from the write's trail.
    async fn publish(
        &mut self,
        batch: Vec<JobWrite>,
        watch: &mut DeadlineWatch,
        cancel: &CancellationToken,
    ) -> Option<Published> {
        self.store.failpoint("events.pulled").await;
        let source = self.store.events().source();
        let mut events: Vec<Event> = Vec::new();
        let mut workflows = Vec::new();
        let mut counted: BTreeMap<String, Vec<Change>> = BTreeMap::new();
        let mut indexed = Vec::new();
        let mut released = Vec::new();
        let mut freed = Vec::new();
        let mut spans = Vec::new();
        for w in &batch {
            self.unseen.delivered(w.revision);
            if w.unreadable {
                self.skip(w, "its record does not read as a job");
                continue;
            }
            if let Some((queue, state)) = &w.removed {
                indexed.extend(IndexMove::of(&w.id, queue, [(Some(*state), None)], false));
                counted.entry(queue.clone()).or_default().push(Change {
                    sequence: w.revision,
                    from: Some(*state),
                    to: None,
                    at: Utc::now(),
                    tally: None,
                });
            }
            let Some(rec) = &w.record else { continue };
            let derived = catch_unwind(AssertUnwindSafe(|| {
                let steps: Vec<&Step> = rec
                    .trail
                    .iter()
                    .filter(|step| self.unseen.take(step.revision))
                    .collect();
                let recovered: Vec<Event> = steps
                    .iter()
                    .flat_map(|step| step_events(rec, step, source))
                    .collect();
                let seen: Vec<_> = steps
                    .iter()
                    .map(|step| (step.transition, step.state))
                    .chain([(rec.transition, rec.job.state)])
                    .filter_map(|(transition, state)| workflow::seen_in(rec, transition, state))
                    .collect();
                let own = Step::of(rec, w.revision);
                let all: Vec<&Step> = steps.into_iter().chain([&own]).collect();
                let changes: Vec<Change> = all
                    .iter()
                    .map(|step| Change {
                        sequence: step.revision,
                        from: step.from,
                        to: Some(step.state),
                        at: step.at,
                        tally: Tally::of(rec, step),
                    })
                    .collect();
                let traced: Vec<JobSpan> = match self.spans {
                    Some(_) => all
                        .iter()
                        .zip(&changes)
                        .filter_map(|(step, change)| JobSpan::of(rec, step, change.tally.as_ref()))
                        .collect(),
                    None => Vec::new(),
                };
                (
                    recovered,
                    step_events(rec, &own, source),
                    seen,
                    changes,
                    traced,
                )
            }));
            match derived {
                Ok((recovered, own, seen, changes, traced)) => {
                    spans.extend(traced);
                    if !recovered.is_empty() {
                        self.metrics.events_recovered(recovered.len());
                    }
                    events.extend(recovered);
                    events.extend(own);
                    workflows.extend(seen);
                    indexed.extend(IndexMove::of(
                        &rec.job.id,
                        &rec.job.queue,
                        changes.iter().map(|c| (c.from, c.to)),
                        rec.dead_letter.is_some(),
                    ));
                    counted
                        .entry(rec.job.queue.clone())
                        .or_default()
                        .extend(changes);
                    released.extend(ended_lock(rec));
                    freed.extend(
                        backpressure::ended_token(rec).map(|seq| (rec.job.queue.clone(), seq)),
                    );
                }
                Err(_) => self.skip(w, "deriving its events failed"),
            }
        }
        if !until_done(cancel, "publishing events failed", || {
            self.store.events().publish(&events)
        })
        .await
        {
            return None;
        }
        if self.store.log_job_transitions() {
            events.iter().for_each(logs::job_transition);
        }
        if let Some(exporter) = &self.spans {
            exporter.export(spans);
        }
        // Workflows move on after the events of the writes that moved them.
        if !until_done(cancel, "moving workflows on failed", || {
            self.store.leader().advance_workflows(&workflows)
        })
        .await
        {
            return None;
        }
        let now = Utc::now();
        for w in &batch {
            let observed = catch_unwind(AssertUnwindSafe(|| {
                watch.observe(&w.id, w.revision, w.record.as_ref(), now)
            }));
            if observed.is_err() {
                self.skip(w, "the deadline watch failed on it");
            }
        }
        let last = batch.into_iter().last().map(JobWrite::into_ack_only);
        Some(Published {
            books: Books {
                indexed,
                freed,
                counted,
                through: last.as_ref().map_or(0, |w| w.revision),
                released,
            },
            last,
        })
    }

    /// A write that cannot be processed is logged, counted and passed over: held back, it
    /// would stop every event after it, and be replayed into every future leader.
    fn skip(&self, w: &JobWrite, why: &str) {
        error!(job_id = %w.id, revision = w.revision, why, "skipping a job write the event publisher cannot process");
        self.metrics.job_write_skipped();
    }
}
