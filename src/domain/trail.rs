//! The trail: what a job record carries so that no event of its job is lost when the event
//! publisher falls behind. The publisher derives events from every write of a record in the
//! jobs bucket, but the bucket keeps only `job_history` writes per job: a publisher more
//! than that many writes of one job behind (a failover, a burst, frequent heartbeats) would
//! never see the older ones. So each write carries a [`Step`] for every earlier write of its
//! job the publisher may not have handled yet, enough to derive that write's events again
//! (`event::step_events`), and the publisher derives them from the trail for exactly the
//! writes it never saw (architecture §3.4).

use super::job::{JobRecord, Step, Transition};
use super::state::JobState;
use super::worker::MAX_WORKER_ID_BYTES;

/// Steps a record carries at most; beyond them the oldest are dropped (their events lost).
/// Reached only when one job makes this many event-bearing writes while the publisher has
/// not handled the first of them: 64 heartbeats a second apart with no leader.
pub const MAX_TRAIL_STEPS: usize = 64;
/// The most a full trail adds to a record, kept free below the record limit.
pub const MAX_TRAIL_BYTES: usize = MAX_TRAIL_STEPS * (MAX_WORKER_ID_BYTES + 160);

/// How a step is taken from a record, and whether a trail keeps it.
impl Step {
    /// The step of the write that stored `rec` at `revision`.
    pub fn of(rec: &JobRecord, revision: u64) -> Step {
        let job = &rec.job;
        let holder = rec.holder.as_ref();
        let (at, worker_id, until) = match rec.transition {
            Transition::Created if job.state == JobState::Scheduled => {
                (Some(job.created_at), None, None)
            }
            Transition::Created
            | Transition::Activated
            | Transition::Requeued
            | Transition::Promoted
            | Transition::Retried => (job.enqueued_at, None, None),
            Transition::Started => (job.started_at, job.worker_id.clone(), None),
            Transition::Completed => (job.completed_at, None, None),
            Transition::Failed => (
                job.error.as_ref().map(|e| e.occurred_at),
                None,
                job.next_attempt_at,
            ),
            Transition::Cancelled => (job.cancelled_at, None, None),
            Transition::Heartbeat => (
                holder.and_then(|h| h.last_beat),
                holder.and_then(|h| h.worker_id.clone()),
                holder.map(|h| h.visible_until),
            ),
            Transition::Progressed => (
                job.progress_updated_at,
                holder.and_then(|h| h.worker_id.clone()),
                holder.map(|h| h.visible_until),
            ),
            Transition::Expired | Transition::Dropped => (job.discarded_at, None, None),
            Transition::Redelivered | Transition::Reprioritized => (None, None, None),
        };
        Step {
            revision,
            transition: rec.transition,
            state: job.state,
            at: at.unwrap_or(job.created_at),
            attempt: job.attempt,
            worker_id,
            until,
            from: rec.from,
        }
    }

    /// Whether the write matters to the publisher: a redelivery has no event and changes
    /// no count (the creation of a pending job has no event, but counts), so it needs no
    /// place in a trail. Nor does a progress report: its event tells the progress of the
    /// moment, which a later report or the job's end supersedes, and frequent reports
    /// would push the steps that do matter out of a full trail. A new priority has no event
    /// and changes no count either.
    fn matters(&self) -> bool {
        !matches!(
            self.transition,
            Transition::Redelivered | Transition::Progressed | Transition::Reprioritized
        )
    }
}

/// The trail of the record that replaces `before` (stored at `revision`), given the highest
/// revision up to which the publisher is known to have handled every write (`handled`).
/// Once the publisher has handled `before` itself, it has also derived whatever `before`'s
/// trail held that it had not seen, so the trail starts empty again; until then it grows by
/// `before`'s step. Steps of earlier writes cannot be dropped one by one as the publisher
/// passes them: it may have passed a write because the bucket had already dropped it, and
/// then only a trail still holds its events.
pub fn carry(before: &JobRecord, revision: u64, handled: u64) -> Vec<Step> {
    if handled >= revision {
        return Vec::new();
    }
    let mut trail = before.trail.clone();
    let step = Step::of(before, revision);
    if step.matters() {
        trail.push(step);
    }
    let excess = trail.len().saturating_sub(MAX_TRAIL_STEPS);
    trail.drain(..excess);
    trail
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use serde_json::json;

    use super::*;
    use crate::domain::fixtures::record;

    fn created() -> JobRecord {
        record(json!({"queue": "q"}))
    }

    #[test]
    fn a_trail_grows_until_the_publisher_handled_the_write_before() {
        let mut rec = created();
        let first = carry(&rec, 10, 9);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].revision, 10);
        assert_eq!(first[0].transition, Transition::Created);
        rec.trail = first;
        rec.transition = Transition::Heartbeat;
        let second = carry(&rec, 12, 11);
        assert_eq!(
            second.iter().map(|s| s.revision).collect::<Vec<_>>(),
            [10, 12],
            "a publisher past 10 may have passed it unseen: its step stays"
        );
        rec.trail = second;
        assert!(carry(&rec, 12, 12).is_empty());
        assert!(carry(&rec, 12, 40).is_empty());
    }

    #[test]
    fn redeliveries_take_no_place_and_the_oldest_steps_go_first() {
        let mut rec = created();
        rec.transition = Transition::Redelivered;
        assert!(carry(&rec, 5, 0).is_empty());
        rec.transition = Transition::Heartbeat;
        for revision in 1..=(MAX_TRAIL_STEPS as u64 + 3) {
            rec.trail = carry(&rec, revision, 0);
        }
        assert_eq!(rec.trail.len(), MAX_TRAIL_STEPS);
        assert_eq!(rec.trail[0].revision, 4);
    }

    #[test]
    fn a_full_trail_fits_its_room() {
        let mut rec = created();
        rec.transition = Transition::Heartbeat;
        rec.job.attempt = u32::MAX;
        rec.holder = Some(crate::domain::job::Holder {
            worker_id: Some("w".repeat(MAX_WORKER_ID_BYTES)),
            ack_subject: String::new(),
            sequence: 0,
            visible_until: Utc::now(),
            last_beat: Some(Utc::now()),
            slot: None,
            visibility_ms: None,
        });
        for _ in 0..MAX_TRAIL_STEPS {
            rec.trail = carry(&rec, u64::MAX, 0);
        }
        let bytes = serde_json::to_vec(&rec.trail).unwrap().len();
        assert!(bytes <= MAX_TRAIL_BYTES, "{bytes} > {MAX_TRAIL_BYTES}");
    }
}
