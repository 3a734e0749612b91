//! Which active jobs need a durable deadline timer, decided from the job-write feed
//! (docs/architecture.md §3.6). Most jobs finish long before their deadline; a timer per
//! claim would cost a JetStream write and a leader-memory entry until the deadline passes.
//! So a job is only watched after its claim, and gets a timer once it has run for `hold`,
//! or at once when its deadline is nearer than that. Until then its write is pinned: the
//! feed is not acknowledged past it, so a new leader replays it and watches the job again.
//! No I/O; the caller publishes the timers and acknowledges the feed.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::domain::job::JobRecord;
use crate::domain::lifecycle;
use crate::domain::state::JobState;
use crate::store::Timer;

/// How long a job may run before it gets a durable deadline timer.
pub const WATCH_HOLD: Duration = Duration::from_secs(2);

pub struct DeadlineWatch {
    hold: chrono::Duration,
    default_timeout: Duration,
    /// Jobs without a timer yet, by id.
    watched: HashMap<String, Watched>,
    /// Sequences of the writes that put the watched jobs under watch.
    pins: BTreeSet<u64>,
    /// Jobs whose current dispatch and attempt have a timer, with its due time.
    covered: HashMap<String, Timer>,
}

struct Watched {
    /// The feed sequence of the job's latest write.
    seq: u64,
    timer: Timer,
    /// When the timer must be published.
    arm_at: DateTime<Utc>,
}

impl DeadlineWatch {
    pub fn new(hold: Duration, default_timeout: Duration) -> DeadlineWatch {
        DeadlineWatch {
            hold: chrono::Duration::from_std(hold).expect("hold fits"),
            default_timeout,
            watched: HashMap::new(),
            pins: BTreeSet::new(),
            covered: HashMap::new(),
        }
    }

    /// Takes in the write at feed sequence `seq` of job `id` (`None`: deleted).
    pub fn observe(&mut self, id: &str, seq: u64, record: Option<&JobRecord>, now: DateTime<Utc>) {
        let due = record
            .filter(|r| r.job.state == JobState::Active)
            .and_then(|r| Some((r, lifecycle::deadline_of(r, self.default_timeout)?)));
        let Some((rec, due)) = due else {
            self.unwatch(id);
            self.covered.remove(id);
            return;
        };
        let timer = Timer::deadline(rec, due);
        let already = self.covered.get(id).is_some_and(|c| {
            c.dispatch == timer.dispatch && c.attempt == timer.attempt && c.due <= due
        });
        if already {
            // The covering timer fires first and re-arms at the later deadline.
            self.unwatch(id);
            return;
        }
        let arm_at = match self.watched.get(id) {
            Some(w) if w.timer.dispatch == timer.dispatch && w.timer.attempt == timer.attempt => {
                w.arm_at
            }
            _ => now + self.hold,
        }
        .min(due);
        self.unwatch(id);
        self.pins.insert(seq);
        self.watched
            .insert(id.to_string(), Watched { seq, timer, arm_at });
    }

    /// The timers to publish now.
    pub fn due(&self, now: DateTime<Utc>) -> Vec<Timer> {
        self.watched
            .values()
            .filter(|w| w.arm_at <= now)
            .map(|w| w.timer.clone())
            .collect()
    }

    /// `timer` is stored: its job is covered and no longer pins the feed.
    pub fn armed(&mut self, timer: &Timer) {
        let current = self
            .watched
            .get(&timer.id)
            .is_some_and(|w| w.timer == *timer);
        if current {
            self.unwatch(&timer.id);
            self.covered.insert(timer.id.clone(), timer.clone());
        }
    }

    /// The lowest feed sequence that must stay unacknowledged; `None`: all may be.
    pub fn pinned_from(&self) -> Option<u64> {
        self.pins.first().copied()
    }

    /// When the next timer is to be published.
    pub fn next_arm_at(&self) -> Option<DateTime<Utc>> {
        self.watched.values().map(|w| w.arm_at).min()
    }

    fn unwatch(&mut self, id: &str) {
        if let Some(w) = self.watched.remove(id) {
            self.pins.remove(&w.seq);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::fixtures;
    use crate::domain::job::Holder;

    const TIMEOUT: Duration = Duration::from_secs(1800);

    fn at(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(1_800_000_000_000 + ms).unwrap()
    }

    /// Job "a", active since 0 in `attempt`, its reservation ending at `visible_ms`.
    fn active(visible_ms: i64, attempt: u32) -> JobRecord {
        let mut rec = fixtures::record(serde_json::json!({}));
        rec.job.id = "a".into();
        rec.job.state = JobState::Active;
        rec.job.attempt = attempt;
        rec.job.started_at = Some(at(0));
        rec.holder = Some(Holder {
            worker_id: None,
            ack_subject: "ack".into(),
            sequence: 1,
            visible_until: at(visible_ms),
            last_beat: None,
            slot: None,
            visibility_ms: None,
        });
        rec
    }

    fn watch() -> DeadlineWatch {
        DeadlineWatch::new(Duration::from_secs(2), TIMEOUT)
    }

    #[test]
    fn a_job_finishing_within_the_hold_never_needs_a_timer() {
        let mut w = watch();
        let rec = active(60_000, 1);
        w.observe(&rec.job.id, 10, Some(&rec), at(0));
        assert_eq!(w.pinned_from(), Some(10));
        assert!(w.due(at(1_999)).is_empty());
        let mut done = rec.clone();
        done.job.state = JobState::Completed;
        w.observe(&rec.job.id, 11, Some(&done), at(500));
        assert_eq!(w.pinned_from(), None);
        assert!(w.due(at(10_000)).is_empty());
    }

    #[test]
    fn a_job_still_running_after_the_hold_gets_its_deadline_timer_and_unpins() {
        let mut w = watch();
        let rec = active(60_000, 1);
        w.observe(&rec.job.id, 10, Some(&rec), at(0));
        assert_eq!(w.next_arm_at(), Some(at(2_000)));
        let due = w.due(at(2_000));
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].due, at(60_000));
        assert_eq!(due[0].attempt, 1);
        w.armed(&due[0]);
        assert_eq!(w.pinned_from(), None);
        assert!(w.due(at(3_000)).is_empty());
    }

    #[test]
    fn a_deadline_nearer_than_the_hold_is_armed_at_once() {
        let mut w = watch();
        let rec = active(1_500, 1);
        w.observe(&rec.job.id, 10, Some(&rec), at(0));
        assert_eq!(w.next_arm_at(), Some(at(1_500)));
        assert_eq!(w.due(at(1_500)).len(), 1);
    }

    #[test]
    fn heartbeats_of_a_covered_job_need_no_new_timer_unless_they_shorten_it() {
        let mut w = watch();
        let rec = active(60_000, 1);
        w.observe(&rec.job.id, 10, Some(&rec), at(0));
        let t = w.due(at(2_000)).remove(0);
        w.armed(&t);
        w.observe(&rec.job.id, 20, Some(&active(90_000, 1)), at(30_000));
        assert_eq!(
            w.pinned_from(),
            None,
            "a later deadline is re-armed by the timer"
        );
        w.observe(&rec.job.id, 21, Some(&active(40_000, 1)), at(31_000));
        assert_eq!(
            w.pinned_from(),
            Some(21),
            "an earlier deadline needs its own timer"
        );
    }

    #[test]
    fn a_new_attempt_is_watched_afresh_and_a_heartbeat_keeps_the_first_arm_time() {
        let mut w = watch();
        let rec = active(60_000, 1);
        w.observe(&rec.job.id, 10, Some(&rec), at(0));
        w.observe(&rec.job.id, 12, Some(&active(70_000, 1)), at(1_000));
        assert_eq!(w.pinned_from(), Some(12), "only the latest write is pinned");
        assert_eq!(w.next_arm_at(), Some(at(2_000)));
        w.observe(&rec.job.id, 14, Some(&active(70_000, 2)), at(1_500));
        assert_eq!(w.next_arm_at(), Some(at(3_500)));
        // A timer published for the earlier attempt does not cover the new one.
        w.armed(&Timer::deadline(&rec, at(60_000)));
        assert_eq!(w.pinned_from(), Some(14));
    }

    #[test]
    fn the_oldest_watched_write_pins_the_feed() {
        let mut w = watch();
        let a = active(60_000, 1);
        let mut b = active(60_000, 1);
        b.job.id = "b".into();
        w.observe(&a.job.id, 5, Some(&a), at(0));
        w.observe(&b.job.id, 9, Some(&b), at(100));
        assert_eq!(w.pinned_from(), Some(5));
        w.observe(&a.job.id, 12, None, at(200));
        assert_eq!(w.pinned_from(), Some(9));
    }
}
