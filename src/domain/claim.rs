//! What one delivered queue message does to its job (architecture §3.1–§3.2): the whole
//! decision of a claim, as `lifecycle.rs` decides each transition. `store/jobs/fetch.rs`
//! only reads the record, writes what this returns and settles the message.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::error::OjsError;
use super::job::JobRecord;
use super::lifecycle::{self, Delivery, LapseCause};
use super::state::JobState;

/// A queue message as delivered to a FETCH.
#[derive(Debug, Clone)]
pub struct Delivered<'a> {
    /// Which dispatch of the job the message was published for.
    pub dispatch: u64,
    /// The queue and priority of the consumer it came from.
    pub queue: &'a str,
    pub priority: i32,
    pub delivery: Delivery,
    /// Published so long ago that a record still missing or behind it will never come.
    pub orphan_age_passed: bool,
}

/// Who claims, and for how long.
#[derive(Debug, Clone, Copy)]
pub struct Claimant<'a> {
    pub worker_id: Option<&'a str>,
    /// The FETCH's reservation; else the job's own, else `default_visibility`.
    pub visibility: Option<Duration>,
    pub default_visibility: Duration,
}

/// What a delivered message does to its job's record.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimStep {
    /// Write this record (a claim, a redelivery, an expiry or a lapse).
    Write(Box<JobRecord>),
    /// Nothing to write and the message is spent: acknowledge it.
    Spent,
    /// The message was published for another job that reused this id (a refused
    /// duplicate): end its deliveries for good.
    Foreign,
    /// The record is at an older dispatch: the write that goes with this message has not
    /// landed yet (or never will).
    Behind,
}

/// Decides what `msg` does to the job whose record is `rec`.
///
/// # Errors
/// None in practice: a claim of an available job cannot be refused; the type follows
/// `lifecycle::claim`.
pub fn decide(
    rec: &JobRecord,
    msg: &Delivered,
    by: Claimant,
    now: DateTime<Utc>,
) -> Result<ClaimStep, OjsError> {
    if rec.job.queue != msg.queue || rec.job.priority != msg.priority {
        return Ok(ClaimStep::Foreign);
    }
    if rec.dispatch > msg.dispatch || (rec.dispatch < msg.dispatch && msg.orphan_age_passed) {
        // Superseded by a later dispatch, or its write never landed.
        return Ok(ClaimStep::Spent);
    }
    if rec.dispatch < msg.dispatch {
        return Ok(ClaimStep::Behind);
    }
    let visibility = by
        .visibility
        .or(rec.job.visibility_timeout_ms.map(Duration::from_millis))
        .unwrap_or(by.default_visibility);
    let worker = by.worker_id;
    Ok(ClaimStep::Write(Box::new(match rec.job.state {
        // Core §5.2: an expired job is never handed out.
        JobState::Available => match lifecycle::expire(rec, now) {
            Some(expired) => expired,
            None => lifecycle::claim(rec, now, worker, &msg.delivery, visibility)?,
        },
        JobState::Active => match &rec.holder {
            // A second message for this dispatch (a repeated publish).
            Some(h) if h.sequence != msg.delivery.sequence => return Ok(ClaimStep::Spent),
            Some(h) if h.visible_until > now => lifecycle::redelivered(rec, &msg.delivery),
            _ => match lifecycle::lapse(rec, now, LapseCause::Visibility) {
                lapsed if lapsed.job.state == JobState::Available => {
                    lifecycle::claim(&lapsed, now, worker, &msg.delivery, visibility)?
                }
                discarded => discarded,
            },
        },
        // Cancelled, finished or waiting for a later dispatch.
        _ => return Ok(ClaimStep::Spent),
    })))
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::domain::fixtures::{now, record};
    use crate::domain::job::Transition;

    const DEFAULT: Duration = Duration::from_secs(1800);

    fn delivered(dispatch: u64, sequence: u64) -> Delivered<'static> {
        Delivered {
            dispatch,
            queue: "default",
            priority: 0,
            delivery: Delivery {
                ack_subject: format!("ack.{sequence}"),
                sequence,
            },
            orphan_age_passed: false,
        }
    }

    fn by(visibility: Option<Duration>) -> Claimant<'static> {
        Claimant {
            worker_id: Some("w1"),
            visibility,
            default_visibility: DEFAULT,
        }
    }

    fn written(step: ClaimStep) -> JobRecord {
        match step {
            ClaimStep::Write(rec) => *rec,
            other => panic!("expected a write, got {other:?}"),
        }
    }

    /// The job claimed through message `sequence` with a 30 s reservation.
    fn active(options: Value, sequence: u64) -> JobRecord {
        let step = decide(
            &record(options),
            &delivered(1, sequence),
            by(Some(Duration::from_secs(30))),
            now(),
        );
        written(step.unwrap())
    }

    #[test]
    fn a_message_from_another_queue_or_priority_is_foreign() {
        let rec = record(json!({}));
        for msg in [
            Delivered {
                queue: "other",
                ..delivered(1, 1)
            },
            Delivered {
                priority: 5,
                ..delivered(1, 1)
            },
        ] {
            assert_eq!(
                decide(&rec, &msg, by(None), now()).unwrap(),
                ClaimStep::Foreign
            );
        }
    }

    #[test]
    fn an_older_dispatch_is_spent_and_a_newer_one_waits_for_its_record_until_orphaned() {
        let mut rec = record(json!({}));
        rec.dispatch = 2;
        let decide_for = |msg: Delivered| decide(&rec, &msg, by(None), now()).unwrap();
        assert_eq!(decide_for(delivered(1, 1)), ClaimStep::Spent);
        assert_eq!(decide_for(delivered(3, 1)), ClaimStep::Behind);
        let orphan = Delivered {
            orphan_age_passed: true,
            ..delivered(3, 1)
        };
        assert_eq!(decide_for(orphan), ClaimStep::Spent);
    }

    #[test]
    fn an_available_job_is_claimed_for_the_fetch_then_the_job_then_the_server_reservation() {
        let visible_for = |options: Value, fetch: Option<Duration>| {
            let rec =
                written(decide(&record(options), &delivered(1, 1), by(fetch), now()).unwrap());
            assert_eq!(rec.job.state, JobState::Active);
            assert_eq!(rec.job.attempt, 1);
            let holder = rec.holder.expect("a holder");
            assert_eq!(holder.worker_id.as_deref(), Some("w1"));
            assert_eq!(holder.sequence, 1);
            (holder.visible_until - now()).num_seconds()
        };
        let own = json!({"visibility_timeout_ms": 60_000});
        assert_eq!(visible_for(own.clone(), Some(Duration::from_secs(5))), 5);
        assert_eq!(visible_for(own, None), 60);
        assert_eq!(visible_for(json!({}), None), 1800);
    }

    #[test]
    fn an_expired_available_job_is_discarded_instead_of_claimed() {
        let rec = record(json!({"expires_at": "+PT1M"}));
        let later = now() + chrono::Duration::minutes(2);
        let next = written(decide(&rec, &delivered(1, 1), by(None), later).unwrap());
        assert_eq!(next.transition, Transition::Expired);
        assert_ne!(next.job.state, JobState::Active);
    }

    #[test]
    fn a_redelivery_of_the_held_message_keeps_the_job_with_its_worker() {
        let rec = active(json!({}), 7);
        let next = written(decide(&rec, &delivered(1, 7), by(None), now()).unwrap());
        assert_eq!(next.transition, Transition::Redelivered);
        assert_eq!(next.job.attempt, 1);
        assert_eq!(next.holder, rec.holder);
    }

    #[test]
    fn a_second_message_for_a_running_dispatch_is_spent() {
        let rec = active(json!({}), 7);
        assert_eq!(
            decide(&rec, &delivered(1, 8), by(None), now()).unwrap(),
            ClaimStep::Spent
        );
    }

    #[test]
    fn a_lapsed_reservation_is_claimed_again_or_discarded_when_attempts_are_spent() {
        let after = now() + chrono::Duration::minutes(1);
        let rec = active(json!({}), 7);
        let again = written(decide(&rec, &delivered(1, 7), by(None), after).unwrap());
        assert_eq!(again.job.state, JobState::Active);
        assert_eq!(again.job.attempt, 2);
        assert_eq!(again.job.started_at, Some(after));

        let last = active(json!({"retry": {"max_attempts": 1}}), 7);
        let gone = written(decide(&last, &delivered(1, 7), by(None), after).unwrap());
        assert_eq!(gone.job.state, JobState::Discarded);
    }

    #[test]
    fn a_finished_or_cancelled_job_spends_its_message() {
        let mut rec = record(json!({}));
        for state in [
            JobState::Completed,
            JobState::Cancelled,
            JobState::Discarded,
            JobState::Scheduled,
        ] {
            rec.job.state = state;
            assert_eq!(
                decide(&rec, &delivered(1, 1), by(None), now()).unwrap(),
                ClaimStep::Spent,
                "{state:?}"
            );
        }
    }
}
