//! Job totals by type (observability spec §8): what each counted job write adds to its
//! queue's statistics — enqueued, started, completed, retried, failed, dead-lettered,
//! cancelled and expired jobs, attempt durations and queue times. The leader counts them in
//! the same compare-and-set as the state counts (`stats.rs`), so a write replayed after a
//! failover is never counted twice and `/metrics` can report cluster totals. Pure.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::job::{JobRecord, Step, Transition};
use super::state::JobState;

/// Upper bounds (seconds) of the attempt-duration buckets, observability spec §8.2.
pub const DURATION_BUCKETS: [f64; 15] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];
/// Upper bounds (seconds) of the queue-time buckets, observability spec §8.2.
pub const QUEUE_TIME_BUCKETS: [f64; 13] = [
    0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0,
];
/// Upper bounds (ms) of the events seed's `ojs.jobs.duration_ms` buckets (§7.2). Each is
/// one of [`DURATION_BUCKETS`] in ms, so both histograms are read from the same counts.
pub const DURATION_MS_BUCKETS: [f64; 14] = [
    5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0, 60000.0,
    300000.0,
];
/// Upper bounds (ms) of the events seed's `ojs.jobs.wait_ms` buckets (§7.2), each one of
/// [`QUEUE_TIME_BUCKETS`] in ms.
pub const WAIT_MS_BUCKETS: [f64; 11] = [
    10.0, 50.0, 100.0, 500.0, 1000.0, 5000.0, 10000.0, 30000.0, 60000.0, 300000.0, 600000.0,
];
/// Job types a queue keeps totals of. Types are chosen by clients: past this many, a
/// queue's further types count under [`OTHER_TYPE`], so neither the stats record nor the
/// metric series grow without bound (spec §8.4).
pub const MAX_TYPES: usize = 100;
/// The type label of the totals of types past [`MAX_TYPES`] (no job type has parentheses).
pub const OTHER_TYPE: &str = "(other)";

/// What a write did to its job, as the totals count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Created (available, scheduled or pending).
    Enqueued,
    Started,
    Completed,
    /// An attempt failed and a retry is scheduled.
    Retried,
    /// The last attempt failed: the job is discarded, kept in the dead letter queue or not.
    Failed {
        dead_lettered: bool,
    },
    Cancelled,
    Expired,
    /// Discarded by a full queue's `drop_oldest`.
    Dropped,
}

/// What one write adds to the totals of its job's type.
#[derive(Debug, Clone, PartialEq)]
pub struct Tally {
    pub job_type: String,
    pub outcome: Outcome,
    /// For an attempt's end, how long it ran; for the start of the first attempt, how long
    /// the job waited since it became available. `None` when the record no longer tells
    /// (a step recovered from a later attempt's trail).
    pub seconds: Option<f64>,
}

impl Tally {
    /// The tally of the write `step` of `rec` (its own write or one from its trail); `None`
    /// for writes that count nothing (heartbeats, promotions, requeues).
    pub fn of(rec: &JobRecord, step: &Step) -> Option<Tally> {
        let job = &rec.job;
        // Times in the record describe its current attempt only.
        let same_attempt = step.attempt == job.attempt;
        let since = |from: Option<chrono::DateTime<chrono::Utc>>| {
            from.filter(|_| same_attempt)
                .map(|from| (step.at - from).num_milliseconds().max(0) as f64 / 1000.0)
        };
        let (outcome, seconds) = match step.transition {
            Transition::Created => (Outcome::Enqueued, None),
            Transition::Started => (
                Outcome::Started,
                since(job.enqueued_at).filter(|_| step.attempt == 1),
            ),
            Transition::Completed => (Outcome::Completed, since(job.started_at)),
            Transition::Failed if step.state == JobState::Retryable => {
                (Outcome::Retried, since(job.started_at))
            }
            Transition::Failed => (
                Outcome::Failed {
                    dead_lettered: rec.dead_letter.is_some()
                        && job.state == JobState::Discarded
                        && same_attempt,
                },
                since(job.started_at),
            ),
            Transition::Cancelled => (Outcome::Cancelled, None),
            Transition::Expired => (Outcome::Expired, None),
            Transition::Dropped => (Outcome::Dropped, None),
            Transition::Activated
            | Transition::Requeued
            | Transition::Promoted
            | Transition::Redelivered
            | Transition::Heartbeat
            | Transition::Progressed
            | Transition::Retried
            | Transition::Reprioritized => return None,
        };
        Some(Tally {
            job_type: job.job_type.clone(),
            outcome,
            seconds,
        })
    }
}

/// Observations in fixed buckets: per-bucket counts (the last one above every bound) and
/// their sum, cumulated only when rendered.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Histogram {
    pub counts: Vec<u64>,
    pub sum: f64,
}

impl Histogram {
    fn observe(&mut self, bounds: &[f64], value: f64) {
        if self.counts.len() != bounds.len() + 1 {
            self.counts.resize(bounds.len() + 1, 0);
        }
        let bucket = bounds.partition_point(|bound| *bound < value);
        self.counts[bucket] += 1;
        self.sum += value;
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// `(upper bound, observations at or below it)` for each bound.
    pub fn cumulative<'a>(&'a self, bounds: &'a [f64]) -> impl Iterator<Item = (f64, u64)> + 'a {
        bounds.iter().enumerate().scan(0, |seen, (i, bound)| {
            *seen += self.counts.get(i).copied().unwrap_or(0);
            Some((*bound, *seen))
        })
    }

    /// [`cumulative`](Self::cumulative) at the `wanted` bounds only, in a unit `scale` times
    /// the stored `bounds`' (1000 for ms from seconds); a wanted bound that is no stored
    /// bound so scaled is left out.
    pub fn cumulative_at<'a>(
        &'a self,
        bounds: &'a [f64],
        scale: f64,
        wanted: &'a [f64],
    ) -> impl Iterator<Item = (f64, u64)> + 'a {
        self.cumulative(bounds).filter_map(move |(bound, seen)| {
            let scaled = bound * scale;
            wanted
                .iter()
                .find(|w| (*w - scaled).abs() <= 1e-9 * w.abs())
                .map(|w| (*w, seen))
        })
    }

    /// Adds the observations of `other` (kept in the same buckets).
    pub fn merge(&mut self, other: &Histogram) {
        if self.counts.len() < other.counts.len() {
            self.counts.resize(other.counts.len(), 0);
        }
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine += theirs;
        }
        self.sum += other.sum;
    }
}

/// The totals of one job type in one queue.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TypeTotals {
    pub enqueued: u64,
    pub started: u64,
    pub completed: u64,
    pub retried: u64,
    pub failed: u64,
    pub dead_lettered: u64,
    pub cancelled: u64,
    pub expired: u64,
    /// Discarded by a full queue's `drop_oldest`.
    pub dropped: u64,
    /// Attempt durations by the state the attempt left the job in (`completed`,
    /// `retryable`, `discarded`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub durations: BTreeMap<JobState, Histogram>,
    /// Waits from becoming available to the first attempt's start.
    pub queue_time: Histogram,
}

impl TypeTotals {
    /// Jobs discarded, by their last failure, by expiry or dropped by a full queue.
    pub fn discarded(&self) -> u64 {
        self.failed + self.expired + self.dropped
    }

    /// Jobs with a `job.discarded` event: discarded by their last failure or dropped by a
    /// full queue (an expired job's event is `job.expired`).
    pub fn discarded_events(&self) -> u64 {
        self.failed + self.dropped
    }

    /// Every attempt's duration, however it ended.
    pub fn all_durations(&self) -> Histogram {
        let mut all = Histogram::default();
        for h in self.durations.values() {
            all.merge(h);
        }
        all
    }
}

/// Adds `tally` to the totals by type of one queue.
pub fn add(types: &mut BTreeMap<String, TypeTotals>, tally: &Tally) {
    let key = if types.contains_key(&tally.job_type) || types.len() < MAX_TYPES {
        tally.job_type.as_str()
    } else {
        OTHER_TYPE
    };
    let totals = types.entry(key.to_owned()).or_default();
    let ended_in = match tally.outcome {
        Outcome::Enqueued => {
            totals.enqueued += 1;
            None
        }
        Outcome::Started => {
            totals.started += 1;
            if let Some(waited) = tally.seconds {
                totals.queue_time.observe(&QUEUE_TIME_BUCKETS, waited);
            }
            None
        }
        Outcome::Completed => {
            totals.completed += 1;
            Some(JobState::Completed)
        }
        Outcome::Retried => {
            totals.retried += 1;
            Some(JobState::Retryable)
        }
        Outcome::Failed { dead_lettered } => {
            totals.failed += 1;
            totals.dead_lettered += u64::from(dead_lettered);
            Some(JobState::Discarded)
        }
        Outcome::Cancelled => {
            totals.cancelled += 1;
            None
        }
        Outcome::Expired => {
            totals.expired += 1;
            None
        }
        Outcome::Dropped => {
            totals.dropped += 1;
            None
        }
    };
    if let (Some(state), Some(ran)) = (ended_in, tally.seconds) {
        totals
            .durations
            .entry(state)
            .or_default()
            .observe(&DURATION_BUCKETS, ran);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::fixtures;

    fn tally(job_type: &str, outcome: Outcome, seconds: Option<f64>) -> Tally {
        Tally {
            job_type: job_type.into(),
            outcome,
            seconds,
        }
    }

    #[test]
    fn the_seeds_ms_buckets_are_read_from_the_stored_seconds() {
        let mut h = Histogram::default();
        for seconds in [0.004, 0.005, 0.7, 100.0, 1000.0] {
            h.observe(&DURATION_BUCKETS, seconds);
        }
        let ms: Vec<_> = h
            .cumulative_at(&DURATION_BUCKETS, 1000.0, &DURATION_MS_BUCKETS)
            .collect();
        assert_eq!(
            ms.len(),
            DURATION_MS_BUCKETS.len(),
            "every seed bound is stored"
        );
        assert_eq!(ms[0], (5.0, 2));
        assert_eq!(ms[7], (1000.0, 3));
        assert_eq!(ms[13], (300000.0, 4));
        let waits = Histogram::default()
            .cumulative_at(&QUEUE_TIME_BUCKETS, 1000.0, &WAIT_MS_BUCKETS)
            .count();
        assert_eq!(waits, WAIT_MS_BUCKETS.len(), "every seed bound is stored");

        let mut merged = h.clone();
        merged.merge(&h);
        assert_eq!((merged.count(), merged.sum), (10, 2.0 * h.sum));
    }

    #[test]
    fn each_outcome_counts_in_its_total() {
        let mut types = BTreeMap::new();
        for (outcome, seconds) in [
            (Outcome::Enqueued, None),
            (Outcome::Started, Some(0.2)),
            (Outcome::Retried, Some(0.003)),
            (Outcome::Started, None),
            (Outcome::Completed, Some(1.5)),
            (
                Outcome::Failed {
                    dead_lettered: true,
                },
                Some(400.0),
            ),
            (Outcome::Cancelled, None),
            (Outcome::Expired, None),
        ] {
            add(&mut types, &tally("email.send", outcome, seconds));
        }
        let t = &types["email.send"];
        assert_eq!(
            (t.enqueued, t.started, t.completed, t.retried, t.failed),
            (1, 2, 1, 1, 1)
        );
        assert_eq!(
            (t.dead_lettered, t.cancelled, t.expired, t.discarded()),
            (1, 1, 1, 2)
        );
        assert_eq!(t.queue_time.count(), 1);
        let completed = &t.durations[&JobState::Completed];
        assert_eq!(completed.sum, 1.5);
        let le = |h: &Histogram, bound: f64| {
            h.cumulative(&DURATION_BUCKETS)
                .find(|(b, _)| *b == bound)
                .unwrap()
                .1
        };
        assert_eq!(le(completed, 1.0), 0);
        assert_eq!(le(completed, 2.5), 1);
        let retried = &t.durations[&JobState::Retryable];
        assert_eq!(
            le(retried, 0.005),
            1,
            "a bound includes its own value and below"
        );
        let failed = &t.durations[&JobState::Discarded];
        assert_eq!(le(failed, 300.0), 0, "above every bound: only in the count");
        assert_eq!(failed.count(), 1);
    }

    #[test]
    fn types_past_the_cap_count_together() {
        let mut types = BTreeMap::new();
        for i in 0..MAX_TYPES + 5 {
            add(
                &mut types,
                &tally(&format!("t{i}"), Outcome::Enqueued, None),
            );
        }
        add(&mut types, &tally("t0", Outcome::Enqueued, None));
        assert_eq!(types.len(), MAX_TYPES + 1);
        assert_eq!(types[OTHER_TYPE].enqueued, 5);
        assert_eq!(types["t0"].enqueued, 2, "a known type keeps its own totals");
    }

    #[test]
    fn a_write_tallies_what_its_transition_did() {
        let mut rec = fixtures::record(serde_json::json!({}));
        let t0 = rec.job.created_at;
        rec.job.enqueued_at = Some(t0);
        rec.job.attempt = 1;
        rec.job.started_at = Some(t0 + chrono::Duration::milliseconds(250));
        rec.transition = Transition::Started;
        let started = Tally::of(&rec, &Step::of(&rec, 2)).unwrap();
        assert_eq!(started.outcome, Outcome::Started);
        assert_eq!(
            started.seconds,
            Some(0.25),
            "queue time of the first attempt"
        );

        rec.job.state = JobState::Completed;
        rec.job.completed_at = Some(t0 + chrono::Duration::milliseconds(1250));
        rec.transition = Transition::Completed;
        let done = Tally::of(&rec, &Step::of(&rec, 3)).unwrap();
        assert_eq!(
            (done.outcome, done.seconds),
            (Outcome::Completed, Some(1.0))
        );

        rec.transition = Transition::Heartbeat;
        assert_eq!(Tally::of(&rec, &Step::of(&rec, 4)), None);

        // A step of an earlier attempt, recovered from the trail: counted, but the record's
        // times are the later attempt's, so no duration.
        rec.transition = Transition::Completed;
        let mut earlier = Step::of(&rec, 3);
        earlier.attempt = 0;
        assert_eq!(Tally::of(&rec, &earlier).unwrap().seconds, None);
    }
}
