//! The job records this gateway wrote last, with their revisions: a guess that lets the next
//! operation on a job (usually a FETCH after a PUSH, an ACK after a FETCH) go straight to its
//! compare-and-set instead of reading the record first.
//!
//! A guess is only ever used for a write: if the revision is stale, the bucket refuses the
//! write and the operation reads the record as usual. Every other outcome (nothing to claim,
//! a refusal) is decided on a fresh read, never on a remembered record. Bounded, oldest
//! forgotten first, so memory does not grow with queue depth.
//!
//! Records still on their way are *expected*: a waiting FETCH can get a job's message before
//! the PUSH through this gateway has created its record, and then waits for that PUSH
//! instead of re-reading (architecture §3.12).

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::domain::job::JobRecord;

pub struct RecentRecords {
    capacity: usize,
    inner: Mutex<Entries>,
    /// Woken whenever a PUSH withdraws its expected records.
    settled: Notify,
}

#[derive(Default)]
struct Entries {
    records: HashMap<String, (JobRecord, u64)>,
    /// Ids in the order they were remembered; may hold ids already taken.
    order: VecDeque<String>,
    /// Ids whose records PUSHes through this gateway are creating, with how many expect each.
    expected: HashMap<String, usize>,
}

/// The records one PUSH is creating; withdrawn when dropped, however the PUSH ends.
pub struct Expected<'a> {
    recent: &'a RecentRecords,
    ids: Vec<String>,
}

impl RecentRecords {
    pub fn new(capacity: usize) -> RecentRecords {
        RecentRecords {
            capacity,
            inner: Mutex::new(Entries::default()),
            settled: Notify::new(),
        }
    }

    /// How many records are remembered at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.inner.lock().expect("recent records lock")
    }

    /// Remembers `rec` as written at `revision`.
    pub fn remember(&self, id: &str, rec: JobRecord, revision: u64) {
        let mut e = self.lock();
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
        self.lock().records.remove(id)
    }

    /// Marks `ids` as being created by a PUSH until the returned guard is dropped.
    pub fn expect(&self, ids: Vec<String>) -> Expected<'_> {
        let mut e = self.lock();
        for id in &ids {
            *e.expected.entry(id.clone()).or_default() += 1;
        }
        Expected { recent: self, ids }
    }

    /// Like `take`, but while a PUSH through this gateway is still creating the record, waits
    /// for it (at most `patience`).
    pub async fn take_when_written(
        &self,
        id: &str,
        patience: Duration,
    ) -> Option<(JobRecord, u64)> {
        let until = Instant::now() + patience;
        loop {
            let settled = self.settled.notified();
            tokio::pin!(settled);
            // Registered before looking, so a withdrawal in between is not missed.
            settled.as_mut().enable();
            {
                let mut e = self.lock();
                if let Some(found) = e.records.remove(id) {
                    return Some(found);
                }
                if !e.expected.contains_key(id) {
                    return None;
                }
            }
            if tokio::time::timeout_at(until, settled).await.is_err() {
                return None;
            }
        }
    }
}

impl Drop for Expected<'_> {
    fn drop(&mut self) {
        {
            let mut e = self.recent.lock();
            for id in self.ids.drain(..) {
                if let Entry::Occupied(mut n) = e.expected.entry(id) {
                    *n.get_mut() -= 1;
                    if *n.get() == 0 {
                        n.remove();
                    }
                }
            }
        }
        self.recent.settled.notify_waiters();
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

    #[tokio::test]
    async fn a_claim_waits_for_the_record_its_push_is_creating() {
        let recent = std::sync::Arc::new(RecentRecords::new(4));
        let patience = Duration::from_secs(5);
        let rec = fixtures::record(serde_json::json!({}));
        assert!(
            recent.take_when_written("none", patience).await.is_none(),
            "nothing expected: no wait"
        );

        let push = recent.expect(vec!["a".into(), "b".into()]);
        let waiting = |id: &'static str| {
            let recent = recent.clone();
            tokio::spawn(async move { recent.take_when_written(id, patience).await })
        };
        let (a, b) = (waiting("a"), waiting("b"));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !a.is_finished() && !b.is_finished(),
            "both wait for the PUSH"
        );
        recent.remember("a", rec, 7);
        drop(push);
        let started = Instant::now();
        assert_eq!(a.await.unwrap().map(|(_, r)| r), Some(7));
        assert!(b.await.unwrap().is_none(), "b was never written");
        assert!(started.elapsed() < Duration::from_secs(1));
        assert!(
            recent.lock().expected.is_empty(),
            "the PUSH withdrew its ids"
        );
    }

    #[tokio::test]
    async fn a_claim_waits_no_longer_than_its_patience() {
        let recent = RecentRecords::new(4);
        let _push = recent.expect(vec!["slow".into()]);
        let started = Instant::now();
        let got = recent
            .take_when_written("slow", Duration::from_millis(30))
            .await;
        assert!(got.is_none());
        assert!(started.elapsed() >= Duration::from_millis(30));
    }
}
