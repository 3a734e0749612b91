//! Where a pending timer lives (architecture §3.5): in the leader's memory when it comes due
//! within the horizon, otherwise back in JetStream until shortly before it does; when the
//! job record a held timer will change is read ahead; and how many timers clients may have
//! pending. Pure: the caller passes the clock.

use std::time::Duration;

use super::error::{ErrorCode, OjsError};

/// What the leader does with a timer delivered to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Due now or earlier.
    Fire,
    /// Due within the horizon: keep it in memory until then.
    Hold,
    /// Due beyond the horizon: hand it back (NAK) to be delivered again after this delay,
    /// which lands half a horizon before it is due.
    HandBack(Duration),
}

/// The placement of a timer due at `due_ms` (Unix ms) at `now_ms`, for a horizon of
/// `horizon_ms`. A timer handed back comes back half a horizon early, so a redelivery up to
/// that late still finds it held in time, and one early (the leader's clock behind the
/// server's has no effect: the delay is relative) is handed back again, for less.
pub fn place(due_ms: i64, now_ms: i64, horizon_ms: u64) -> Placement {
    let until = i128::from(due_ms) - i128::from(now_ms);
    if until <= 0 {
        return Placement::Fire;
    }
    let horizon = i128::from(horizon_ms);
    if until <= horizon {
        return Placement::Hold;
    }
    let delay = (until - horizon / 2).min(i128::from(MAX_HAND_BACK_MS));
    Placement::HandBack(Duration::from_millis(
        u64::try_from(delay).unwrap_or(MAX_HAND_BACK_MS),
    ))
}

/// Longest NAK delay: a timer due later comes back once a day and is handed back again.
/// Keeps the delay, sent in nanoseconds, far inside what the server parses (an i64).
pub const MAX_HAND_BACK_MS: u64 = 86_400_000;

/// How long before a promote or expire timer is due the leader reads the job record it will
/// change, so that the firing itself is a publish and a compare-and-set: 10,000 jobs due at
/// one instant are read over the two seconds before it, not at it (architecture §3.5).
pub const READ_AHEAD_MS: i64 = 2_000;

/// A timer due sooner than this after it is held is not read ahead: the firing would come
/// before the read is back.
pub const MIN_READ_AHEAD_MS: i64 = 50;

/// When to read ahead for a timer due at `due_ms` (Unix ms), held at `now_ms`:
/// `READ_AHEAD_MS` before it is due, at once if that has passed, never when it is due within
/// `MIN_READ_AHEAD_MS`.
pub fn read_ahead_at(due_ms: i64, now_ms: i64) -> Option<i64> {
    (due_ms.saturating_sub(now_ms) >= MIN_READ_AHEAD_MS)
        .then(|| due_ms.saturating_sub(READ_AHEAD_MS).max(now_ms))
}

/// Admits `adding` client timers (promote and expire timers of a PUSH) when `pending` timers
/// are in the stream: the total must stay within `max_pending`.
///
/// # Errors
/// 429 `queue_full` (retryable) otherwise; nothing of the request may be written then.
pub fn admit(pending: u64, adding: u64, max_pending: u64) -> Result<(), OjsError> {
    if adding == 0 || pending.saturating_add(adding) <= max_pending {
        return Ok(());
    }
    Err(OjsError::new(
        ErrorCode::QueueFull,
        format!(
            "Too many pending timers: {pending} scheduled, retrying or expiring jobs are waiting and this request adds {adding}, past the limit of {max_pending} (max_pending_timers)."
        ),
    )
    .with_detail("pending_timers", pending)
    .with_detail("adding", adding)
    .with_detail("max_pending_timers", max_pending))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 60_000;

    #[test]
    fn due_timers_fire() {
        assert_eq!(place(1_000, 1_000, MIN), Placement::Fire);
        assert_eq!(place(999, 1_000, MIN), Placement::Fire);
        assert_eq!(place(i64::MIN, i64::MAX, MIN), Placement::Fire);
    }

    #[test]
    fn timers_within_the_horizon_are_held_up_to_its_edge() {
        assert_eq!(place(1_001, 1_000, MIN), Placement::Hold);
        assert_eq!(place(1_000 + 60_000, 1_000, MIN), Placement::Hold);
    }

    #[test]
    fn later_timers_come_back_half_a_horizon_early() {
        assert_eq!(
            place(1_000 + 60_001, 1_000, MIN),
            Placement::HandBack(Duration::from_millis(30_001))
        );
        let day = 86_400_000;
        assert_eq!(
            place(day, 0, MIN),
            Placement::HandBack(Duration::from_millis(day as u64 - 30_000))
        );
        // A year out: back in a day, to be handed back again.
        assert_eq!(
            place(365 * day, 0, MIN),
            Placement::HandBack(Duration::from_millis(MAX_HAND_BACK_MS))
        );
    }

    #[test]
    fn a_handed_back_timer_is_held_when_it_comes_back_on_time_or_up_to_half_a_horizon_late() {
        let (due, now) = (10_000_000, 0);
        let Placement::HandBack(delay) = place(due, now, MIN) else {
            panic!("far timers are handed back")
        };
        let back = now + delay.as_millis() as i64;
        assert_eq!(place(due, back, MIN), Placement::Hold);
        assert_eq!(place(due, back + 29_999, MIN), Placement::Hold);
        // Early (a clock behind): handed back again, for less.
        let Placement::HandBack(again) = place(due, back - 40_000, MIN) else {
            panic!("still beyond the horizon")
        };
        assert!(again < delay);
    }

    #[test]
    fn extreme_due_times_do_not_overflow() {
        assert!(matches!(
            place(i64::MAX, i64::MIN, MIN),
            Placement::HandBack(_)
        ));
        assert!(matches!(place(i64::MAX, 0, 1), Placement::HandBack(_)));
    }

    #[test]
    fn records_are_read_two_seconds_ahead_or_at_once_but_not_for_timers_due_at_once() {
        assert_eq!(read_ahead_at(10_000, 0), Some(8_000));
        assert_eq!(
            read_ahead_at(1_000, 0),
            Some(0),
            "less than two seconds ahead: now"
        );
        assert_eq!(read_ahead_at(50, 0), Some(0));
        assert_eq!(read_ahead_at(49, 0), None, "due too soon");
        assert_eq!(read_ahead_at(0, 1_000), None, "already due");
        assert_eq!(
            read_ahead_at(i64::MAX, i64::MIN),
            Some(i64::MAX - READ_AHEAD_MS)
        );
        assert_eq!(read_ahead_at(i64::MIN, i64::MAX), None);
    }

    #[test]
    fn client_timers_are_admitted_up_to_the_cap() {
        assert!(admit(0, 0, 0).is_ok());
        assert!(admit(99, 1, 100).is_ok());
        assert!(admit(100, 0, 100).is_ok());
        let err = admit(100, 1, 100).unwrap_err();
        assert_eq!(err.code, ErrorCode::QueueFull);
        assert!(err.code.retryable());
        assert_eq!(err.details["max_pending_timers"], 100);
        assert!(admit(u64::MAX, 1, 10).is_err(), "no overflow");
    }
}
