//! Queue statistics (HTTP binding §11.2): how many jobs of a queue are in each state, kept
//! as counters that the leader moves from the job writes it reads for events
//! (docs/architecture.md §3.17) — never a scan of jobs — with the job totals by type behind
//! the job metrics (`totals.rs`). Pure: what one write changes, and the
//! completions-per-minute window behind `throughput`.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::state::JobState;
use super::totals::{self, Tally, TypeTotals};

/// Jobs of one queue per state. Terminal states count every job that reached them and was
/// not taken out again by an operator (a dead-letter retry or delete): pruning finished
/// jobs after their retention does not lower them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StateCounts {
    pub scheduled: i64,
    pub available: i64,
    pub pending: i64,
    pub active: i64,
    pub completed: i64,
    pub retryable: i64,
    pub cancelled: i64,
    pub discarded: i64,
}

impl StateCounts {
    /// The count of `state`, never below zero (jobs written before counting began, when a
    /// deployment is upgraded, leave their first move out of a state uncounted).
    pub fn of(&self, state: JobState) -> u64 {
        let n = match state {
            JobState::Scheduled => self.scheduled,
            JobState::Available => self.available,
            JobState::Pending => self.pending,
            JobState::Active => self.active,
            JobState::Completed => self.completed,
            JobState::Retryable => self.retryable,
            JobState::Cancelled => self.cancelled,
            JobState::Discarded => self.discarded,
        };
        n.max(0) as u64
    }

    /// Jobs not finished yet: waiting, scheduled, retrying, running or pending.
    pub fn unfinished(&self) -> u64 {
        JobState::ALL
            .into_iter()
            .filter(|s| !s.is_terminal())
            .map(|s| self.of(s))
            .sum()
    }

    fn slot(&mut self, state: JobState) -> &mut i64 {
        match state {
            JobState::Scheduled => &mut self.scheduled,
            JobState::Available => &mut self.available,
            JobState::Pending => &mut self.pending,
            JobState::Active => &mut self.active,
            JobState::Completed => &mut self.completed,
            JobState::Retryable => &mut self.retryable,
            JobState::Cancelled => &mut self.cancelled,
            JobState::Discarded => &mut self.discarded,
        }
    }
}

/// One write of a job record as the counters see it: the state it left and the one it
/// entered (`None`: the job did not exist before, or was removed by it).
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// The write's sequence in the jobs stream.
    pub sequence: u64,
    pub from: Option<JobState>,
    pub to: Option<JobState>,
    /// When the write's transition happened.
    pub at: DateTime<Utc>,
    /// What it adds to the totals of its job's type, if anything.
    pub tally: Option<Tally>,
}

/// The counters of one queue, as stored in the stats bucket.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct QueueCounts {
    /// The jobs-stream sequence up to which writes of this queue are counted here: a
    /// write at or before it was counted already, so replaying it (a new leader reads
    /// again what the last one had not acknowledged) changes nothing.
    pub through: u64,
    pub states: StateCounts,
    /// Completions in the minute `minute` (minutes since the Unix epoch) and in the one
    /// before it.
    pub minute: i64,
    pub completed_this_minute: u64,
    pub completed_last_minute: u64,
    /// Failed attempts (active → retryable or discarded) in the same two minutes.
    pub failed_this_minute: u64,
    pub failed_last_minute: u64,
    /// Job totals by type.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub types: BTreeMap<String, TypeTotals>,
}

impl QueueCounts {
    /// Counts `change` unless a write at or before `through` — one counted before. True
    /// when it was counted now. `through` itself moves only with [`counted_through`], once
    /// a whole batch is applied (its changes are not in sequence order: recovered trail
    /// steps come before the write that carried them).
    ///
    /// [`counted_through`]: QueueCounts::counted_through
    pub fn apply(&mut self, change: &Change) -> bool {
        if change.sequence <= self.through {
            return false;
        }
        if change.from != change.to {
            if let Some(from) = change.from {
                *self.states.slot(from) -= 1;
            }
            if let Some(to) = change.to {
                *self.states.slot(to) += 1;
            }
            let failed = change.from == Some(JobState::Active)
                && matches!(change.to, Some(JobState::Retryable | JobState::Discarded));
            if change.to == Some(JobState::Completed) || failed {
                match (self.roll_to(change.at), failed) {
                    (Some(true), false) => self.completed_this_minute += 1,
                    (Some(false), false) => self.completed_last_minute += 1,
                    (Some(true), true) => self.failed_this_minute += 1,
                    (Some(false), true) => self.failed_last_minute += 1,
                    // Older than the window: counted in its state, not in the rates.
                    (None, _) => {}
                }
            }
        }
        if let Some(tally) = &change.tally {
            totals::add(&mut self.types, tally);
        }
        true
    }

    /// Marks every write up to `sequence` counted.
    pub fn counted_through(&mut self, sequence: u64) {
        self.through = self.through.max(sequence);
    }

    /// Moves the two-minute window so that `at` falls in it if it can: `Some(true)` for
    /// the window's current minute, `Some(false)` for the one before, `None` when older.
    fn roll_to(&mut self, at: DateTime<Utc>) -> Option<bool> {
        let minute = at.timestamp().div_euclid(60);
        match minute - self.minute {
            0 => Some(true),
            -1 => Some(false),
            d if d > 0 => {
                (self.completed_last_minute, self.failed_last_minute) = if d == 1 {
                    (self.completed_this_minute, self.failed_this_minute)
                } else {
                    (0, 0)
                };
                (self.completed_this_minute, self.failed_this_minute) = (0, 0);
                self.minute = minute;
                Some(true)
            }
            _ => None,
        }
    }

    /// Of a counter pair, the count of the last whole minute before `now`.
    fn last_whole_minute(&self, now: DateTime<Utc>, this: u64, last: u64) -> u64 {
        match now.timestamp().div_euclid(60) - self.minute {
            0 => last,
            1 => this,
            _ => 0,
        }
    }

    /// Attempts that failed in the last whole minute before `now`.
    pub fn failed_per_minute(&self, now: DateTime<Utc>) -> u64 {
        self.last_whole_minute(now, self.failed_this_minute, self.failed_last_minute)
    }

    /// Jobs completed per second over the last whole minute before `now`.
    pub fn throughput(&self, now: DateTime<Utc>) -> f64 {
        let completed =
            self.last_whole_minute(now, self.completed_this_minute, self.completed_last_minute);
        completed as f64 / 60.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn unfinished_jobs_are_those_in_no_terminal_state() {
        let counts = StateCounts {
            scheduled: 1,
            available: 2,
            pending: 3,
            active: 4,
            completed: 100,
            retryable: 5,
            cancelled: 100,
            discarded: 100,
        };
        assert_eq!(counts.unfinished(), 15);
        assert_eq!(StateCounts::default().unfinished(), 0);
    }

    fn at(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(secs, 0).unwrap()
    }

    fn change(sequence: u64, from: Option<JobState>, to: Option<JobState>) -> Change {
        Change {
            sequence,
            from,
            to,
            at: at(600),
            tally: None,
        }
    }

    #[test]
    fn a_job_moves_from_state_to_state() {
        use JobState::*;
        let mut c = QueueCounts::default();
        for (seq, from, to) in [
            (1, None, Some(Available)),
            (2, None, Some(Available)),
            (3, Some(Available), Some(Active)),
            (4, Some(Active), Some(Active)), // a heartbeat
            (5, Some(Active), Some(Completed)),
            (6, Some(Available), None), // a rolled-back batch member
        ] {
            assert!(c.apply(&change(seq, from, to)));
        }
        assert_eq!(c.states.of(Available), 0);
        assert_eq!(c.states.of(Active), 0);
        assert_eq!(c.states.of(Completed), 1);
    }

    #[test]
    fn a_write_counted_before_is_not_counted_again() {
        use JobState::*;
        let mut c = QueueCounts::default();
        assert!(c.apply(&change(7, None, Some(Available))));
        c.counted_through(7);
        assert!(!c.apply(&change(7, None, Some(Available))));
        assert!(!c.apply(&change(3, None, Some(Available))));
        assert!(c.apply(&change(8, Some(Available), Some(Active))));
        c.counted_through(5);
        assert_eq!(c.through, 7, "the mark never goes back");
        assert_eq!(c.states.of(Available), 0);
        assert_eq!(c.states.of(Active), 1);
    }

    #[test]
    fn a_replayed_write_adds_nothing_to_the_job_totals() {
        use crate::domain::totals::Outcome;
        let mut c = QueueCounts::default();
        let mut enqueued = change(3, None, Some(JobState::Available));
        enqueued.tally = Some(Tally {
            job_type: "t.x".into(),
            outcome: Outcome::Enqueued,
            seconds: None,
        });
        assert!(c.apply(&enqueued));
        c.counted_through(3);
        assert!(!c.apply(&enqueued));
        assert_eq!(c.types["t.x"].enqueued, 1);
    }

    #[test]
    fn counts_never_show_below_zero() {
        let mut c = QueueCounts::default();
        c.apply(&change(
            1,
            Some(JobState::Active),
            Some(JobState::Completed),
        ));
        assert_eq!(c.states.active, -1);
        assert_eq!(c.states.of(JobState::Active), 0);
    }

    #[test]
    fn throughput_is_the_last_whole_minute() {
        let mut c = QueueCounts::default();
        let done = |c: &mut QueueCounts, seq, secs| {
            c.apply(&Change {
                sequence: seq,
                from: Some(JobState::Active),
                to: Some(JobState::Completed),
                at: at(secs),
                tally: None,
            });
        };
        for (i, secs) in [600, 610, 650].into_iter().enumerate() {
            done(&mut c, i as u64 + 1, secs);
        }
        // Minute 10 ran three; during minute 11 the rate is that minute's.
        assert_eq!(c.throughput(at(665)), 3.0 / 60.0);
        done(&mut c, 4, 670);
        done(&mut c, 5, 599); // late, from minute 9: not in the window
        assert_eq!(c.throughput(at(700)), 3.0 / 60.0);
        assert_eq!(c.throughput(at(725)), 1.0 / 60.0);
        assert_eq!(c.throughput(at(900)), 0.0);
        assert_eq!(c.states.of(JobState::Completed), 5);
    }

    #[test]
    fn failures_per_minute_count_failed_attempts_in_the_same_window() {
        let mut c = QueueCounts::default();
        let to = |c: &mut QueueCounts, seq, from, to, secs| {
            c.apply(&Change {
                sequence: seq,
                from: Some(from),
                to: Some(to),
                at: at(secs),
                tally: None,
            });
        };
        use JobState::*;
        to(&mut c, 1, Active, Retryable, 600);
        to(&mut c, 2, Active, Discarded, 610);
        to(&mut c, 3, Active, Completed, 620);
        // Not failed attempts: a promotion, a cancel, a requeue.
        to(&mut c, 4, Retryable, Available, 630);
        to(&mut c, 5, Available, Cancelled, 640);
        to(&mut c, 6, Active, Available, 650);
        assert_eq!(c.failed_per_minute(at(665)), 2);
        assert_eq!(c.throughput(at(665)), 1.0 / 60.0);
        // A failure in the next minute rolls both counters alike.
        to(&mut c, 7, Active, Retryable, 670);
        assert_eq!(c.failed_per_minute(at(700)), 2);
        assert_eq!(c.failed_per_minute(at(725)), 1);
        assert_eq!(c.throughput(at(725)), 0.0);
        assert_eq!(c.failed_per_minute(at(900)), 0);
    }
}
