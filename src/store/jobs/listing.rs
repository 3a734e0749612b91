//! Job listings for operators without a scan of the jobs bucket: each state's jobs are read
//! from a stream where they already sit in time order (the queue's stream, the timers, the
//! dead-letter stream, the leader's index of finished jobs), a window of sequences at a
//! time, and each candidate is checked against its record (architecture §3.26).

use std::collections::HashSet;

use async_nats::jetstream::context::GetStreamErrorKind;
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::{DirectGetErrorKind, LastRawMessageErrorKind, Stream};
use async_nats::jetstream::ErrorCode;
use futures::future::join_all;
use serde::Deserialize;

use super::Jobs;
use crate::domain::error::OjsError;
use crate::domain::job::{Job, JobRecord};
use crate::domain::listing::{
    next_window, window, Cursor, ListQuery, Order, Source, MAX_OFFSET, MAX_PER_PAGE, SCAN_LIMIT,
};
use crate::domain::state::JobState;
use crate::store::cas::Replica;
use crate::store::deadline::answered;
use crate::store::error::backend;
use crate::store::timers::TimerKind;

/// One page of a listing.
#[derive(Debug)]
pub struct JobPage {
    pub jobs: Vec<Job>,
    /// Where the next page starts; `None` when nothing is left.
    pub next: Option<Cursor>,
    /// Jobs the listing matches, from the queue counters; `None` with a type filter.
    pub total: Option<u64>,
}

/// Which stream to walk for one source of one state, of one queue or of all.
struct LaneSpec {
    source: Source,
    stream: String,
    queue: Option<String>,
    subject_prefix: Option<String>,
}

/// A lane's stream, opened.
struct Lane {
    source: Source,
    stream: Stream,
    /// Through the stream leader (`STREAM.MSG.GET`): a stream created before direct gets
    /// were allowed on it.
    leader_only: bool,
    /// The queue of a per-queue stream, for the cursor.
    queue: Option<String>,
    /// Only entries whose subject starts with this (one queue's entries in a shared stream).
    subject_prefix: Option<String>,
}

/// What an entry of any source names; fields a source does not write stay absent.
#[derive(Debug, Default, Deserialize)]
struct Entry {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    dispatch: Option<u64>,
    #[serde(default)]
    kind: Option<TimerKind>,
}

/// A job an entry names, before its record is read.
struct Candidate {
    sequence: u64,
    id: String,
    dispatch: Option<u64>,
}

impl Jobs {
    /// One page of jobs matching `q` (admin spec §7.1).
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn list(&self, q: &ListQuery) -> Result<JobPage, OjsError> {
        let ((jobs, next), total) = tokio::try_join!(self.walk_to_page(q), self.listing_total(q))?;
        Ok(JobPage { jobs, next, total })
    }

    /// The page `q.page` asks for: the jobs of the pages before it walked and skipped, in
    /// at most `MAX_OFFSET / MAX_PER_PAGE` walks (a filter matching few of the entries it
    /// examines needs more: that page is refused, the cursor reaches it).
    async fn walk_to_page(&self, q: &ListQuery) -> Result<(Vec<Job>, Option<Cursor>), OjsError> {
        let mut skip = (q.page - 1) * q.per_page;
        let mut at = q.clone();
        let mut walks = 0;
        while skip > 0 {
            walks += 1;
            if walks > MAX_OFFSET / MAX_PER_PAGE {
                return Err(OjsError::invalid(
                    "page",
                    "This page lies too deep for a listing by page number with this filter; page with next_cursor.",
                ));
            }
            at.per_page = skip.min(MAX_PER_PAGE);
            let (skipped, next) = self.walk(&at).await?;
            skip -= skipped.len();
            match next {
                Some(next) => at.cursor = Some(next),
                None => return Ok((Vec::new(), None)),
            }
        }
        at.per_page = q.per_page;
        self.walk(&at).await
    }

    /// The page's jobs and where the next page starts.
    async fn walk(&self, q: &ListQuery) -> Result<(Vec<Job>, Option<Cursor>), OjsError> {
        let want = q.per_page;
        let mut jobs: Vec<(Job, Cursor)> = Vec::with_capacity(want + 1);
        let mut seen = HashSet::new();
        let mut examined = 0u64;
        let mut resume: Option<Cursor> = None;
        'states: for state in q.states() {
            let from = q.cursor.as_ref().filter(|c| c.state == state);
            for spec in self.lanes(state, q, from) {
                let Some(lane) = self.open(spec).await? else {
                    continue;
                };
                let info = lane.stream.cached_info();
                let (first, last) = (info.state.first_sequence, info.state.last_sequence);
                let mut next =
                    match from.filter(|c| c.source == lane.source && c.queue == lane.queue) {
                        Some(c) if q.order == Order::Desc => c.sequence.saturating_sub(1),
                        Some(c) => c.sequence.saturating_add(1),
                        None if q.order == Order::Desc => last,
                        None => first.max(1),
                    };
                let mut round = 0;
                loop {
                    if examined >= SCAN_LIMIT {
                        resume = Some(Cursor {
                            state,
                            source: lane.source,
                            queue: lane.queue.clone(),
                            sequence: match q.order {
                                Order::Desc => next + 1,
                                Order::Asc => next.saturating_sub(1),
                            },
                        });
                        break 'states;
                    }
                    round = window(want - jobs.len(), round);
                    let sequences = next_window(first, last, next, round, q.order);
                    let Some(&end) = sequences.last() else { break };
                    examined += sequences.len() as u64;
                    next = match q.order {
                        Order::Desc => end.saturating_sub(1),
                        Order::Asc => end + 1,
                    };
                    for (job, sequence) in self.read_window(&lane, state, q, &sequences).await? {
                        if !seen.insert(job.id.clone()) {
                            continue;
                        }
                        let at = Cursor {
                            state,
                            source: lane.source,
                            queue: lane.queue.clone(),
                            sequence,
                        };
                        jobs.push((job, at));
                        if jobs.len() > want {
                            break 'states;
                        }
                    }
                }
            }
        }
        let more = jobs.len() > want;
        jobs.truncate(want);
        let next = if more {
            jobs.last().map(|(_, at)| at.clone())
        } else {
            resume
        };
        Ok((jobs.into_iter().map(|(job, _)| job).collect(), next))
    }

    /// The streams `state` is listed from, in order, those before the cursor's left out
    /// (all of them for a cursor of a source this listing does not walk); each opened only
    /// when the walk gets to it.
    fn lanes(&self, state: JobState, q: &ListQuery, from: Option<&Cursor>) -> Vec<LaneSpec> {
        let sources = q.sources(state);
        let skip = match from {
            Some(c) => sources
                .iter()
                .position(|s| *s == c.source)
                .unwrap_or(sources.len()),
            None => 0,
        };
        sources[skip..]
            .iter()
            .flat_map(|source| self.source_lanes(*source, state, q, from))
            .collect()
    }

    /// The streams of one source of `state`: one per queue for queue streams.
    fn source_lanes(
        &self,
        source: Source,
        state: JobState,
        q: &ListQuery,
        from: Option<&Cursor>,
    ) -> Vec<LaneSpec> {
        let t = &self.conn.topology;
        let shared = |stream: String, subject_prefix: Option<String>| LaneSpec {
            source,
            stream,
            queue: None,
            subject_prefix,
        };
        match source {
            Source::Queue => {
                let mut names: Vec<String> = match &q.queue {
                    Some(queue) => vec![queue.clone()],
                    None => self.queues.list().into_iter().map(|m| m.name).collect(),
                };
                names.sort();
                if let Some(after) = from.and_then(|c| c.queue.as_deref()) {
                    names.retain(|n| n.as_str() >= after);
                }
                names
                    .into_iter()
                    .map(|name| LaneSpec {
                        source,
                        stream: t.queue_stream(&name),
                        queue: Some(name),
                        subject_prefix: None,
                    })
                    .collect()
            }
            Source::Timers => vec![shared(t.timers_stream(), None)],
            Source::DeadLetter => vec![shared(
                t.dead_letter_stream(),
                q.queue.as_deref().map(|q| t.dead_letter_subject(q)),
            )],
            Source::Finished => vec![shared(
                t.finished_stream(state),
                q.queue
                    .as_deref()
                    .map(|queue| t.finished_queue_prefix(state, queue)),
            )],
        }
    }

    /// The lane's stream with its state now; `None` for a queue never written to, or an
    /// index no job has entered yet.
    async fn open(&self, spec: LaneSpec) -> Result<Option<Lane>, OjsError> {
        let doing = "opening a stream to list";
        let opened = answered(doing, || self.conn.js.get_stream(&spec.stream)).await?;
        match opened.said {
            Ok(stream) => Ok(Some(Lane {
                source: spec.source,
                leader_only: !stream.cached_info().config.allow_direct,
                stream,
                queue: spec.queue,
                subject_prefix: spec.subject_prefix,
            })),
            Err(err)
                if matches!(err.kind(), GetStreamErrorKind::JetStream(e)
                    if e.error_code() == ErrorCode::STREAM_NOT_FOUND) =>
            {
                Ok(None)
            }
            Err(err) => Err(backend(doing)(err)),
        }
    }

    /// The jobs of one window of `lane` that are listed: entries read at once, then their
    /// records at once; kept in the window's order with the sequence of their entry.
    async fn read_window(
        &self,
        lane: &Lane,
        state: JobState,
        q: &ListQuery,
        sequences: &[u64],
    ) -> Result<Vec<(Job, u64)>, OjsError> {
        let reads = join_all(sequences.iter().map(|&seq| read_entry(lane, seq))).await;
        let mut candidates = Vec::new();
        for read in reads {
            let Some(msg) = read? else { continue };
            if lane
                .subject_prefix
                .as_deref()
                .is_some_and(|p| !msg.subject.as_str().starts_with(p))
            {
                continue;
            }
            if let Some(c) = candidate(&msg, lane.source) {
                candidates.push(c);
            }
        }
        let records = join_all(
            candidates
                .iter()
                .map(|c| self.read(&c.id, Replica::Nearest)),
        )
        .await;
        let mut listed = Vec::new();
        for (c, read) in candidates.into_iter().zip(records) {
            let Some((rec, _)) = read? else { continue };
            if current(&rec, state, lane.source, &c) && q.matches(&rec.job) {
                listed.push((rec.job, c.sequence));
            }
        }
        Ok(listed)
    }

    /// The jobs a listing matches: from the queue counters (architecture §3.17), but for
    /// the dead letter queue alone its own count.
    async fn listing_total(&self, q: &ListQuery) -> Result<Option<u64>, OjsError> {
        if q.job_type.is_some() {
            return Ok(None);
        }
        let states = match q.state {
            Some(s) => vec![s],
            None => JobState::ALL.to_vec(),
        };
        let counts = match &q.queue {
            Some(queue) => self
                .stats
                .queue_counts(queue)
                .await?
                .into_iter()
                .map(|c| (queue.clone(), c))
                .collect(),
            None => self.stats.current_queue_counts().await?,
        };
        let dead_letter_only = |s: &JobState| q.sources(*s) == [Source::DeadLetter];
        let mut total: u64 = counts
            .iter()
            .flat_map(|(_, c)| {
                states
                    .iter()
                    .filter(|s| !dead_letter_only(s))
                    .map(|s| c.states.of(*s))
            })
            .sum();
        if states.iter().any(dead_letter_only) {
            total += match &q.queue {
                Some(queue) => self.dead_letter.count(queue).await?,
                None => self.dead_letter.total().await?,
            };
        }
        Ok(Some(total))
    }
}

/// The message at `seq`, or `None` when it is no longer stored.
async fn read_entry(lane: &Lane, seq: u64) -> Result<Option<StreamMessage>, OjsError> {
    if lane.leader_only {
        match lane.stream.get_raw_message(seq).await {
            Ok(msg) => Ok(Some(msg)),
            Err(err) if err.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(err) => Err(backend("reading a stream to list")(err)),
        }
    } else {
        match lane.stream.direct_get(seq).await {
            Ok(msg) => Ok(Some(msg)),
            Err(err) if err.kind() == DirectGetErrorKind::NotFound => Ok(None),
            Err(err) => Err(backend("reading a stream to list")(err)),
        }
    }
}

/// The job an entry names: from its body, or for the finished index from its subject
/// (`<ns>.finished.<state>.<queue>.<id>`). Timers other than promotions name no listing.
fn candidate(msg: &StreamMessage, source: Source) -> Option<Candidate> {
    let entry: Entry = match source {
        Source::Finished => Entry::default(),
        _ => serde_json::from_slice(&msg.payload).ok()?,
    };
    if source == Source::Timers && entry.kind.unwrap_or_default() != TimerKind::Promote {
        return None;
    }
    let id = match source {
        Source::Finished => msg.subject.as_str().rsplit('.').next()?.to_owned(),
        _ => entry.id?,
    };
    Some(Candidate {
        sequence: msg.sequence,
        id,
        dispatch: entry.dispatch,
    })
}

/// Whether the entry still stands for the job as it is: in the listed state, and for a
/// queue message or timer of the job's current dispatch, for a dead-letter entry the one
/// its record names.
fn current(rec: &JobRecord, state: JobState, source: Source, c: &Candidate) -> bool {
    rec.job.state == state
        && match source {
            Source::Queue | Source::Timers => c.dispatch == Some(rec.dispatch),
            Source::DeadLetter => rec.dead_letter == Some(c.sequence),
            Source::Finished => true,
        }
}
