//! Listing jobs for operators (admin spec §7.1, §11.1): what a listing may ask for, where
//! each state's jobs are listed from, the cursor that continues a page, and the summary a
//! listed job shows. Pure: `store/jobs/listing.rs` walks the streams (architecture §3.26).

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::envelope::validate_queue;
use super::error::OjsError;
use super::job::Job;
use super::state::JobState;

/// Jobs a page shows unless `per_page` says otherwise, and at most (admin spec §7.1).
pub const DEFAULT_PER_PAGE: usize = 20;
pub const MAX_PER_PAGE: usize = 100;

/// Jobs a listing by page number skips at most: deeper pages take the cursor. Skipping
/// walks `MAX_OFFSET / MAX_PER_PAGE` pages of 100 at most, each examining at most
/// `SCAN_LIMIT` sequences.
pub const MAX_OFFSET: usize = 2_000;

/// Stream sequences one listing examines at most, so entries of other queues or of jobs
/// that moved on cannot make one request long.
pub const SCAN_LIMIT: u64 = 5_000;

/// The states in the order a listing without a state goes through them.
pub const LISTING_ORDER: [JobState; 8] = [
    JobState::Available,
    JobState::Active,
    JobState::Scheduled,
    JobState::Retryable,
    JobState::Pending,
    JobState::Completed,
    JobState::Discarded,
    JobState::Cancelled,
];

/// Where the jobs of a state sit in time order (architecture §3.26).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The queue's own stream: one message per dispatch, until ACK or FAIL removes it.
    Queue,
    /// The timers stream: the promote timer of a waiting job.
    Timers,
    /// The dead-letter stream.
    DeadLetter,
    /// The leader's index stream of the state.
    Finished,
}

impl Source {
    /// The sources of a state's jobs, in the order a listing walks them: a discarded job is
    /// in the dead-letter stream when it has an entry there, in the leader's index when not.
    pub fn of(state: JobState) -> &'static [Source] {
        match state {
            JobState::Available | JobState::Active => &[Source::Queue],
            JobState::Scheduled | JobState::Retryable => &[Source::Timers],
            JobState::Discarded => &[Source::DeadLetter, Source::Finished],
            JobState::Completed | JobState::Cancelled | JobState::Pending => &[Source::Finished],
        }
    }

    /// How a cursor names a source other than its state's first.
    fn label(self) -> &'static str {
        match self {
            Source::Queue => "queue",
            Source::Timers => "timers",
            Source::DeadLetter => "dead-letter",
            Source::Finished => "index",
        }
    }
}

/// Whether the leader keeps an index entry for jobs in `state`.
pub fn indexed(state: JobState) -> bool {
    Source::of(state).contains(&Source::Finished)
}

/// What one job write changes in the leader's index: the job enters `enter` (an entry is
/// published) and leaves every state of `leave` (their entries are purged).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexMove {
    pub id: String,
    pub queue: String,
    pub enter: Option<JobState>,
    pub leave: Vec<JobState>,
}

impl IndexMove {
    /// From the state changes of one write (its own and the trail steps it recovers, in
    /// order): the job enters its final state if that is indexed and some change moved it,
    /// and leaves every other indexed state it passed through. A job discarded into the
    /// dead letter queue (`dead_lettered`: the record names an entry) is listed from that
    /// stream and enters nothing. `None` when the index is untouched, as for every write of
    /// a plain job but its completion.
    pub fn of(
        id: &str,
        queue: &str,
        changes: impl IntoIterator<Item = (Option<JobState>, Option<JobState>)>,
        dead_lettered: bool,
    ) -> Option<IndexMove> {
        let changes: Vec<_> = changes.into_iter().collect();
        let last = changes.last()?.1;
        let moved = changes.iter().any(|(from, to)| from != to);
        let enter =
            last.filter(|s| indexed(*s) && moved && !(dead_lettered && *s == JobState::Discarded));
        let mut leave: Vec<JobState> = changes
            .iter()
            .flat_map(|(from, to)| [*from, *to])
            .flatten()
            .filter(|s| indexed(*s) && Some(*s) != last)
            .collect();
        leave.sort();
        leave.dedup();
        (enter.is_some() || !leave.is_empty()).then(|| IndexMove {
            id: id.to_owned(),
            queue: queue.to_owned(),
            enter,
            leave,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Newest first (the default).
    Desc,
    Asc,
}

/// Where the next page starts: the state, which of its sources, the queue (only when the
/// state's jobs are listed queue by queue), and the sequence of the last job the previous
/// page showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub state: JobState,
    pub source: Source,
    pub queue: Option<String>,
    pub sequence: u64,
}

impl Cursor {
    /// `state:sequence` or `state:queue:sequence`, the state as `state.source` in a source
    /// other than its first (`discarded.index:9`); queue names hold no `:`.
    pub fn encode(&self) -> String {
        let mut state = self.state.as_str().to_owned();
        if Source::of(self.state)[0] != self.source {
            state = format!("{state}.{}", self.source.label());
        }
        match &self.queue {
            Some(q) => format!("{state}:{q}:{}", self.sequence),
            None => format!("{state}:{}", self.sequence),
        }
    }

    pub fn decode(text: &str) -> Option<Cursor> {
        let mut parts = text.split(':');
        let head = parts.next()?;
        let (state, source) = match head.split_once('.') {
            None => {
                let state = JobState::parse(head)?;
                (state, Source::of(state)[0])
            }
            Some((state, label)) => {
                let state = JobState::parse(state)?;
                let source = *Source::of(state)[1..].iter().find(|s| s.label() == label)?;
                (state, source)
            }
        };
        let (queue, sequence) = match (parts.next()?, parts.next(), parts.next()) {
            (seq, None, None) => (None, seq),
            (q, Some(seq), None) => (Some(q.to_owned()), seq),
            _ => return None,
        };
        if queue.as_deref().is_some_and(|q| validate_queue(q).is_err()) {
            return None;
        }
        let sequence = sequence.parse().ok().filter(|s| *s > 0)?;
        Some(Cursor {
            state,
            source,
            queue,
            sequence,
        })
    }
}

/// A listing request: `GET /admin/jobs?queue&state&type&per_page&cursor&order`.
#[derive(Debug, Clone, PartialEq)]
pub struct ListQuery {
    pub queue: Option<String>,
    pub state: Option<JobState>,
    pub job_type: Option<String>,
    pub per_page: usize,
    pub order: Order,
    pub cursor: Option<Cursor>,
    /// The page by number (from 1), as tools that page by number ask; the jobs of the pages
    /// before it are walked and skipped, so it is bounded by `MAX_OFFSET`.
    pub page: usize,
    /// Only discarded jobs in the dead letter queue (the dead-letter routes), not those
    /// discarded without an entry there.
    pub dead_letter_only: bool,
}

impl ListQuery {
    /// A listing of one state of one queue, for the server's own use (bulk by filter).
    pub fn of(queue: Option<String>, state: Option<JobState>, job_type: Option<String>) -> Self {
        ListQuery {
            queue,
            state,
            job_type,
            per_page: MAX_PER_PAGE,
            order: Order::Asc,
            cursor: None,
            page: 1,
            dead_letter_only: false,
        }
    }

    /// # Errors
    /// 400 naming the parameter: an unknown state or order, a bad queue name, a `per_page`
    /// outside 1–100, a cursor this server did not hand out or of another state, a type
    /// prefix (`email.*`: no index by type prefix).
    pub fn parse(params: &HashMap<String, String>) -> Result<ListQuery, OjsError> {
        let queue = params.get("queue").filter(|q| !q.is_empty()).cloned();
        if let Some(q) = &queue {
            validate_queue(q)?;
        }
        let state = match params.get("state").filter(|s| !s.is_empty()) {
            None => None,
            Some(s) => Some(
                JobState::parse(s)
                    .ok_or_else(|| OjsError::invalid("state", format!("Unknown state {s:?}.")))?,
            ),
        };
        let job_type = params.get("type").filter(|t| !t.is_empty()).cloned();
        if job_type.as_deref().is_some_and(|t| t.ends_with('*')) {
            return Err(OjsError::invalid(
                "type",
                "Filtering by a type prefix is not supported; give the whole type.",
            ));
        }
        let per_page = match params.get("per_page").or_else(|| params.get("limit")) {
            None => DEFAULT_PER_PAGE,
            Some(n) => n
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=MAX_PER_PAGE).contains(n))
                .ok_or_else(|| {
                    OjsError::invalid(
                        "per_page",
                        format!("per_page must be a whole number from 1 to {MAX_PER_PAGE}."),
                    )
                })?,
        };
        let order = match params.get("order").map(String::as_str) {
            None | Some("desc") => Order::Desc,
            Some("asc") => Order::Asc,
            Some(other) => {
                return Err(OjsError::invalid(
                    "order",
                    format!("order must be asc or desc, not {other:?}."),
                ))
            }
        };
        let cursor = match params.get("cursor").filter(|c| !c.is_empty()) {
            None => None,
            Some(c) => {
                let cursor = Cursor::decode(c)
                    .filter(|c| state.is_none_or(|s| s == c.state))
                    .ok_or_else(|| {
                        OjsError::invalid(
                            "cursor",
                            "Not a cursor of this listing: pass next_cursor back unchanged.",
                        )
                    })?;
                Some(cursor)
            }
        };
        let page = match params.get("page").filter(|p| !p.is_empty()) {
            None => 1,
            Some(_) if cursor.is_some() => {
                return Err(OjsError::invalid(
                    "page",
                    "Give either page or cursor, not both.",
                ))
            }
            Some(p) => p
                .parse::<usize>()
                .ok()
                .filter(|p| *p >= 1 && (p - 1).saturating_mul(per_page) <= MAX_OFFSET)
                .ok_or_else(|| {
                    OjsError::invalid(
                        "page",
                        format!("page must be a whole number from 1 that skips at most {MAX_OFFSET} jobs; page further with next_cursor."),
                    )
                })?,
        };
        Ok(ListQuery {
            queue,
            state,
            job_type,
            per_page,
            order,
            cursor,
            page,
            dead_letter_only: false,
        })
    }

    /// The states this listing still goes through, the cursor's first.
    pub fn states(&self) -> Vec<JobState> {
        match (self.state, &self.cursor) {
            (Some(s), _) => vec![s],
            (None, None) => LISTING_ORDER.to_vec(),
            (None, Some(c)) => LISTING_ORDER
                .iter()
                .copied()
                .skip_while(|s| *s != c.state)
                .collect(),
        }
    }

    /// The sources `state`'s jobs are listed from, in order.
    pub fn sources(&self, state: JobState) -> &'static [Source] {
        if self.dead_letter_only && state == JobState::Discarded {
            &[Source::DeadLetter]
        } else {
            Source::of(state)
        }
    }

    /// Whether a listed job matches the queue and type asked for.
    pub fn matches(&self, job: &Job) -> bool {
        self.queue.as_deref().is_none_or(|q| q == job.queue)
            && self.job_type.as_deref().is_none_or(|t| t == job.job_type)
    }
}

/// Sequences the next round of a walk reads at once: what the page still needs (and one
/// more, to know whether a next page exists) in the first round, twice the last round's
/// after it (entries skipped mean more are likely), at most `MAX_WINDOW`.
pub fn window(still_needed: usize, last_round: u64) -> u64 {
    if last_round == 0 {
        still_needed as u64 + 1
    } else {
        (last_round * 2).min(MAX_WINDOW)
    }
}

/// Reads one round of a walk sends at once, at most.
const MAX_WINDOW: u64 = 256;

/// The next `window` sequences of a walk over `first..=last` from `next` (inclusive), in
/// `order`; empty when the walk is past either end.
pub fn next_window(first: u64, last: u64, next: u64, window: u64, order: Order) -> Vec<u64> {
    let first = first.max(1);
    if next < first || next > last || window == 0 {
        return Vec::new();
    }
    match order {
        Order::Asc => (next..=last.min(next.saturating_add(window - 1))).collect(),
        Order::Desc => (next.saturating_sub(window - 1).max(first)..=next)
            .rev()
            .collect(),
    }
}

/// Fields a listed job shows (admin spec §7.1); the detail route has the whole envelope.
const SUMMARY_FIELDS: [&str; 15] = [
    "id",
    "type",
    "queue",
    "state",
    "priority",
    "attempt",
    "max_attempts",
    "tags",
    "created_at",
    "enqueued_at",
    "scheduled_at",
    "started_at",
    "completed_at",
    "cancelled_at",
    "discarded_at",
];

pub fn summary(job: &Job) -> Value {
    let Ok(Value::Object(all)) = serde_json::to_value(job) else {
        return Value::Null;
    };
    let picked: Map<String, Value> = all
        .into_iter()
        .filter(|(k, _)| SUMMARY_FIELDS.contains(&k.as_str()))
        .collect();
    Value::Object(picked)
}

/// A job's times the admin detail gathers under `metadata`, null when not reached.
const METADATA_FIELDS: [&str; 7] = [
    "created_at",
    "enqueued_at",
    "started_at",
    "scheduled_at",
    "completed_at",
    "cancelled_at",
    "discarded_at",
];

/// The admin detail of a job (admin spec §7.2): the whole envelope, `errors` always (empty
/// before any failure) and its times again under `metadata`.
pub fn detail(job: &Job) -> Value {
    let Ok(Value::Object(mut all)) = serde_json::to_value(job) else {
        return Value::Null;
    };
    all.entry("errors")
        .or_insert_with(|| Value::Array(Vec::new()));
    let metadata: Map<String, Value> = METADATA_FIELDS
        .iter()
        .map(|&k| (k.to_owned(), all.get(k).cloned().unwrap_or(Value::Null)))
        .collect();
    all.insert("metadata".to_owned(), Value::Object(metadata));
    Value::Object(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn cursors_round_trip_and_refuse_what_no_listing_handed_out() {
        for cursor in [
            Cursor {
                state: JobState::Completed,
                source: Source::Finished,
                queue: None,
                sequence: 42,
            },
            Cursor {
                state: JobState::Available,
                source: Source::Queue,
                queue: Some("email.v2".into()),
                sequence: 7,
            },
            Cursor {
                state: JobState::Discarded,
                source: Source::DeadLetter,
                queue: None,
                sequence: 3,
            },
            Cursor {
                state: JobState::Discarded,
                source: Source::Finished,
                queue: None,
                sequence: 5,
            },
        ] {
            assert_eq!(Cursor::decode(&cursor.encode()), Some(cursor));
        }
        assert_eq!(
            Cursor::decode("discarded.index:5").map(|c| c.source),
            Some(Source::Finished)
        );
        for bad in [
            "",
            "done:1",
            "completed:",
            "completed:0",
            "completed:-1",
            "available:Bad Queue:3",
            "available:a:b:3",
            "discarded.dead-letter:3",
            "discarded.queue:3",
            "completed.index:3",
            "completed.:3",
        ] {
            assert_eq!(Cursor::decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_query_is_checked_before_any_stream_is_read() {
        let q = ListQuery::parse(&params(&[])).unwrap();
        assert_eq!((q.per_page, q.order, q.state), (20, Order::Desc, None));
        assert_eq!(q.states(), LISTING_ORDER.to_vec());
        let q = ListQuery::parse(&params(&[
            ("queue", "email"),
            ("state", "discarded"),
            ("per_page", "100"),
            ("order", "asc"),
            ("cursor", "discarded:9"),
        ]))
        .unwrap();
        assert_eq!(q.states(), vec![JobState::Discarded]);
        assert_eq!(q.cursor.unwrap().sequence, 9);
        for (k, v) in [
            ("state", "done"),
            ("queue", "Email"),
            ("per_page", "0"),
            ("per_page", "101"),
            ("order", "sideways"),
            ("type", "email.*"),
            ("cursor", "x"),
        ] {
            let err = ListQuery::parse(&params(&[(k, v)])).unwrap_err();
            assert_eq!(err.details.get("field").and_then(Value::as_str), Some(k));
        }
        // A cursor of another state than the one asked for is not this listing's.
        assert!(
            ListQuery::parse(&params(&[("state", "active"), ("cursor", "completed:3")])).is_err()
        );
    }

    #[test]
    fn a_listing_without_a_state_continues_from_the_cursors_state() {
        let q = ListQuery::parse(&params(&[("cursor", "pending:3")])).unwrap();
        assert_eq!(
            q.states(),
            vec![
                JobState::Pending,
                JobState::Completed,
                JobState::Discarded,
                JobState::Cancelled
            ]
        );
    }

    #[test]
    fn windows_stay_inside_the_stream_in_either_order() {
        assert_eq!(next_window(5, 100, 10, 3, Order::Asc), vec![10, 11, 12]);
        assert_eq!(next_window(5, 100, 99, 3, Order::Asc), vec![99, 100]);
        assert_eq!(next_window(5, 100, 7, 3, Order::Desc), vec![7, 6, 5]);
        assert_eq!(next_window(5, 100, 6, 3, Order::Desc), vec![6, 5]);
        assert!(next_window(5, 100, 4, 3, Order::Desc).is_empty());
        assert!(next_window(5, 100, 101, 3, Order::Asc).is_empty());
        // An empty stream reports first 0 (or first past last).
        assert!(next_window(0, 0, 0, 3, Order::Desc).is_empty());
        assert!(next_window(11, 10, 10, 3, Order::Desc).is_empty());
        assert_eq!(window(20, 0), 21);
        assert_eq!(window(3, 21), 42);
        assert_eq!(window(3, 200), 256);
    }

    #[test]
    fn only_indexed_states_are_entered_or_left() {
        use JobState::*;
        let of = |changes: &[(Option<JobState>, Option<JobState>)]| {
            IndexMove::of("j", "q", changes.iter().copied(), false)
        };
        // A plain job: nothing until it completes; a heartbeat never.
        assert_eq!(of(&[(None, Some(Available))]), None);
        assert_eq!(of(&[(Some(Available), Some(Active))]), None);
        assert_eq!(of(&[(Some(Active), Some(Active))]), None);
        let done = of(&[(Some(Active), Some(Completed))]).unwrap();
        assert_eq!((done.enter, done.leave.clone()), (Some(Completed), vec![]));
        // A replayed completion (progress written after it) enters nothing new.
        assert_eq!(of(&[(Some(Completed), Some(Completed))]), None);
        // A workflow job released, and one whose release and run the trail recovers.
        let released = of(&[(Some(Pending), Some(Available))]).unwrap();
        assert_eq!((released.enter, released.leave), (None, vec![Pending]));
        let recovered = of(&[
            (Some(Pending), Some(Available)),
            (Some(Available), Some(Active)),
            (Some(Active), Some(Completed)),
        ])
        .unwrap();
        assert_eq!(
            (recovered.enter, recovered.leave),
            (Some(Completed), vec![Pending])
        );
        // A removal marker of a cancelled job.
        let removed = of(&[(Some(Cancelled), None)]).unwrap();
        assert_eq!((removed.enter, removed.leave), (None, vec![Cancelled]));
        assert_eq!(of(&[]), None);
        // Discarded: indexed unless the dead letter queue lists it; left on a retry.
        let discarded = of(&[(Some(Active), Some(Discarded))]).unwrap();
        assert_eq!(discarded.enter, Some(Discarded));
        let changes = [(Some(Active), Some(Discarded))];
        assert_eq!(IndexMove::of("j", "q", changes, true), None);
        let retried = of(&[(Some(Discarded), Some(Available))]).unwrap();
        assert_eq!((retried.enter, retried.leave), (None, vec![Discarded]));
    }

    #[test]
    fn every_state_has_a_source_and_only_the_unstreamed_ones_an_index() {
        let indexed_states: Vec<_> = JobState::ALL.into_iter().filter(|s| indexed(*s)).collect();
        assert_eq!(
            indexed_states,
            vec![
                JobState::Pending,
                JobState::Completed,
                JobState::Cancelled,
                JobState::Discarded
            ]
        );
        let dead_letter = ListQuery {
            dead_letter_only: true,
            ..ListQuery::of(None, None, None)
        };
        assert_eq!(
            dead_letter.sources(JobState::Discarded),
            &[Source::DeadLetter]
        );
        assert_eq!(
            ListQuery::of(None, None, None).sources(JobState::Discarded),
            &[Source::DeadLetter, Source::Finished]
        );
        let mut listed = LISTING_ORDER.to_vec();
        listed.sort();
        assert_eq!(listed, JobState::ALL.to_vec());
    }

    #[test]
    fn a_detail_always_has_errors_and_its_times_under_metadata() {
        let job = crate::domain::fixtures::record(serde_json::json!({})).job;
        let d = detail(&job);
        assert_eq!(d["errors"], serde_json::json!([]));
        assert_eq!(d["id"], serde_json::json!(job.id));
        assert_eq!(d["metadata"]["created_at"], d["created_at"]);
        assert!(d["metadata"]["completed_at"].is_null());
        assert_eq!(d["metadata"].as_object().unwrap().len(), 7);
    }
}
