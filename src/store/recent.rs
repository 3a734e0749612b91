//! The job records this gateway wrote last, with their revisions: a guess that lets the next
//! operation on a job (usually a FETCH after a PUSH, an ACK after a FETCH) go straight to its
//! compare-and-set instead of reading the record first.
//!
//! A guess is only ever used for a write: if the revision is stale, the bucket refuses the
//! write and the operation reads the record as usual. Every other outcome (nothing to claim,
//! a refusal) is decided on a fresh read, never on a remembered record. Bounded, oldest
//! forgotten first, so memory does not grow with queue depth.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use crate::domain::job::JobRecord;

pub struct RecentRecords {
    capacity: usize,
    inner: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    records: HashMap<String, (JobRecord, u64)>,
    /// Ids in the order they were remembered; may hold ids already taken.
    order: VecDeque<String>,
}

impl RecentRecords {
    pub fn new(capacity: usize) -> RecentRecords {
        RecentRecords {
            capacity,
            inner: Mutex::new(Entries::default()),
        }
    }

    /// How many records are remembered at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Remembers `rec` as written at `revision`.
    pub fn remember(&self, id: &str, rec: JobRecord, revision: u64) {
        let mut e = self.inner.lock().expect("recent records lock");
        if e.records.insert(id.to_owned(), (rec, revision)).is_none() {
            e.order.push_back(id.to_owned());
        }
        while e.records.len() > self.capacity || e.order.len() > 2 * self.capacity {
            let Some(oldest) = e.order.pop_front() else {
                break;
            };
            e.records.remove(&oldest);
        }
    }

    /// The remembered record of `id`, forgetting it.
    pub fn take(&self, id: &str) -> Option<(JobRecord, u64)> {
        self.inner
            .lock()
            .expect("recent records lock")
            .records
            .remove(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::fixtures;

    #[test]
    fn remembers_until_taken_and_forgets_the_oldest_beyond_capacity() {
        let recent = RecentRecords::new(2);
        let rec = fixtures::record(serde_json::json!({}));
        recent.remember("a", rec.clone(), 1);
        recent.remember("b", rec.clone(), 2);
        recent.remember("c", rec.clone(), 3);
        assert!(recent.take("a").is_none(), "the oldest is forgotten");
        assert_eq!(recent.take("b").map(|(_, r)| r), Some(2));
        assert!(recent.take("b").is_none(), "taken once");
        recent.remember("c", rec, 4);
        assert_eq!(
            recent.take("c").map(|(_, r)| r),
            Some(4),
            "the newest write wins"
        );
    }
}
