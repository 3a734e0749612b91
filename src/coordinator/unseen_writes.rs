//! The job writes the event publisher never saw: revisions its feed skipped because the
//! bucket had already dropped them (a job written more than `job_history` times past the
//! publisher), and everything before its feed began. A later write's trail names such a
//! revision; its events are then derived from the trail, once (architecture §3.4).

use std::collections::BTreeMap;

/// Gaps kept at most; beyond them the oldest are forgotten. Gaps come from writes dropped
/// unseen and from purges ahead of the publisher (a dead-letter delete), a handful each
/// time the publisher falls far behind.
const MAX_GAPS: usize = 65_536;

#[derive(Debug, Default)]
pub struct UnseenWrites {
    /// Highest revision delivered, or before which the feed began.
    high: u64,
    /// Unseen revision ranges, `first → last` inclusive, disjoint.
    gaps: BTreeMap<u64, u64>,
}

impl UnseenWrites {
    /// The feed (re)opened delivering the writes after `revision`: those before were never
    /// seen here, unless delivered earlier in this run.
    pub fn begins_after(&mut self, revision: u64) {
        if revision > self.high {
            self.note_gap(self.high + 1, revision);
            self.high = revision;
        }
    }

    /// The feed delivered `revision`; any revision it skipped to get there is unseen. An
    /// older one delivered again (a redelivery) changes nothing.
    pub fn delivered(&mut self, revision: u64) {
        if revision > self.high {
            if revision > self.high + 1 {
                self.note_gap(self.high + 1, revision - 1);
            }
            self.high = revision;
        }
    }

    /// Whether `revision` was never seen here and its events not yet derived from a trail;
    /// from now on it counts as handled.
    pub fn take(&mut self, revision: u64) -> bool {
        let Some((&first, &last)) = self.gaps.range(..=revision).next_back() else {
            return false;
        };
        if last < revision {
            return false;
        }
        self.gaps.remove(&first);
        if first < revision {
            self.gaps.insert(first, revision - 1);
        }
        if revision < last {
            self.gaps.insert(revision + 1, last);
        }
        self.forget_oldest();
        true
    }

    fn note_gap(&mut self, first: u64, last: u64) {
        if first <= last {
            self.gaps.insert(first, last);
            self.forget_oldest();
        }
    }

    fn forget_oldest(&mut self) {
        while self.gaps.len() > MAX_GAPS {
            self.gaps.pop_first();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skipped_revisions_are_unseen_once() {
        let mut unseen = UnseenWrites::default();
        unseen.begins_after(10);
        for r in [11, 12, 15, 16, 20] {
            unseen.delivered(r);
        }
        unseen.delivered(12); // redelivered
        assert!(!unseen.take(11) && !unseen.take(12) && !unseen.take(16));
        assert!(unseen.take(13));
        assert!(!unseen.take(13), "once");
        assert!(unseen.take(14) && unseen.take(17) && unseen.take(19));
        assert!(unseen.take(18));
        assert!(!unseen.take(21), "not delivered yet is not unseen");
    }

    #[test]
    fn what_came_before_the_feed_is_unseen() {
        let mut unseen = UnseenWrites::default();
        unseen.begins_after(5);
        unseen.delivered(6);
        assert!(unseen.take(1) && unseen.take(5) && unseen.take(3));
        assert!(!unseen.take(6));
        // Reopened within the run at an older floor: what it delivered stays seen.
        unseen.begins_after(4);
        assert!(!unseen.take(6));
        assert!(unseen.take(2) && unseen.take(4));
    }

    #[test]
    fn the_oldest_gaps_go_first() {
        let mut unseen = UnseenWrites::default();
        for i in 0..(MAX_GAPS as u64 + 2) {
            unseen.delivered(2 * i + 2);
        }
        assert!(!unseen.take(1) && !unseen.take(3));
        assert!(unseen.take(5));
    }
}
