//! Which job records may be pruned once they are older than the retention of finished jobs
//! (architecture §3.13; results spec §7: the clock starts when the job finishes).

use super::job::JobRecord;
use super::state::JobState;

/// What becomes of a stored write of a job record that has reached the retention age.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aged {
    /// The job finished with this write: remove it and every earlier write of the job.
    Prune,
    /// Still waiting or running: its last write comes later.
    Keep,
    /// Discarded into the dead letter queue: kept while its entry (this sequence of the
    /// dead-letter stream) is there (dead-letter spec §4), pruned once retention removed it.
    PruneUnlessInDeadLetter(u64),
}

pub fn aged(rec: &JobRecord) -> Aged {
    match (rec.job.state, rec.dead_letter) {
        (JobState::Discarded, Some(entry)) => Aged::PruneUnlessInDeadLetter(entry),
        (state, _) if state.is_terminal() => Aged::Prune,
        _ => Aged::Keep,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::fixtures::record;

    #[test]
    fn finished_jobs_are_pruned_and_others_kept() {
        for (state, expected) in [
            (JobState::Completed, Aged::Prune),
            (JobState::Cancelled, Aged::Prune),
            (JobState::Discarded, Aged::Prune),
            (JobState::Available, Aged::Keep),
            (JobState::Scheduled, Aged::Keep),
            (JobState::Pending, Aged::Keep),
            (JobState::Active, Aged::Keep),
            (JobState::Retryable, Aged::Keep),
        ] {
            let mut rec = record(json!({}));
            rec.job.state = state;
            assert_eq!(aged(&rec), expected, "{state}");
        }
    }

    #[test]
    fn a_dead_lettered_job_waits_for_its_entry() {
        let mut rec = record(json!({}));
        rec.job.state = JobState::Discarded;
        rec.dead_letter = Some(7);
        assert_eq!(aged(&rec), Aged::PruneUnlessInDeadLetter(7));
    }
}
