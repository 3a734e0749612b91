//! A batch PUSH is all or none, also across a crash (architecture §4 PUSH): its records are
//! written under a mark that decides whether they count, and only a committed batch gets
//! the messages that let workers have its jobs. The decisions here; the NATS calls in
//! `store/jobs/batches.rs`.

use serde::{Deserialize, Serialize};

use super::job::{JobRecord, Transition};

/// A batch's mark: whether its records count. `Open` becomes `Committed` (by its PUSH) or
/// `Aborted` (by its timer or a retry of it), each by compare-and-set, so never both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mark {
    Open,
    Committed,
    Aborted,
}

/// What the leader does when a batch's timer fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repair {
    /// No mark: the PUSH finished (or never wrote one).
    Nothing,
    /// Still open once the grace passed: the PUSH died or is too slow; abort it, then
    /// remove its records.
    Abort,
    /// Aborted: remove the records still as created.
    Remove,
    /// Committed but not finished: publish again what makes each job still as created
    /// fetchable or due.
    Publish,
}

/// The repair a batch's mark asks for when its timer fires.
pub fn repair(mark: Option<Mark>) -> Repair {
    match mark {
        None => Repair::Nothing,
        Some(Mark::Open) => Repair::Abort,
        Some(Mark::Aborted) => Repair::Remove,
        Some(Mark::Committed) => Repair::Publish,
    }
}

/// Whether `rec` is still as batch `batch` created it: nothing has written it since (no
/// worker could have it before the commit, but a client may have cancelled it by id).
pub fn untouched(rec: &JobRecord, batch: &str) -> bool {
    rec.batch.as_deref() == Some(batch) && rec.transition == Transition::Created
}

/// Whether a record found where a batch PUSH wants to create one is left over from
/// another batch that never committed, so that the PUSH may take its id over: a
/// client's retry after a crash, or a concurrent PUSH of the same ids. `mark` is that
/// other batch's mark.
pub fn left_over(found: &JobRecord, mark: Option<Mark>) -> bool {
    found.batch.is_some() && matches!(mark, Some(Mark::Open | Mark::Aborted))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(batch: Option<&str>) -> JobRecord {
        let mut rec = crate::domain::fixtures::record(json!({}));
        rec.batch = batch.map(str::to_owned);
        rec
    }

    #[test]
    fn each_mark_has_its_repair() {
        assert_eq!(repair(None), Repair::Nothing);
        assert_eq!(repair(Some(Mark::Open)), Repair::Abort);
        assert_eq!(repair(Some(Mark::Aborted)), Repair::Remove);
        assert_eq!(repair(Some(Mark::Committed)), Repair::Publish);
    }

    #[test]
    fn a_record_is_untouched_only_as_its_own_batch_created_it() {
        assert!(untouched(&record(Some("b1")), "b1"));
        assert!(!untouched(&record(Some("b2")), "b1"));
        assert!(!untouched(&record(None), "b1"));
        let mut cancelled = record(Some("b1"));
        cancelled.transition = Transition::Cancelled;
        assert!(!untouched(&cancelled, "b1"));
    }

    #[test]
    fn only_a_record_of_an_uncommitted_batch_is_left_over() {
        assert!(left_over(&record(Some("b")), Some(Mark::Open)));
        assert!(left_over(&record(Some("b")), Some(Mark::Aborted)));
        assert!(!left_over(&record(Some("b")), Some(Mark::Committed)));
        // The mark is deleted once its batch finished.
        assert!(!left_over(&record(Some("b")), None));
        // A job of a single PUSH is never taken over.
        assert!(!left_over(&record(None), Some(Mark::Open)));
    }

    #[test]
    fn marks_are_stored_as_their_names() {
        assert_eq!(
            serde_json::to_string(&Mark::Committed).unwrap(),
            "\"committed\""
        );
    }
}
