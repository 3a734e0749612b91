//! The eight job states and the transitions between them (core §6.4). [`check`] refuses a
//! transition outside the table with the current state; the claim and the cancel ask it. The
//! other transitions of `lifecycle.rs` test the state they start from themselves: [`expect`]
//! (a 409 naming the state needed), or a match that returns no next record.

use serde::{Deserialize, Serialize};

use super::error::{ErrorCode, OjsError};

/// Core §5.3 / §6.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    Scheduled,
    Available,
    Pending,
    Active,
    Completed,
    Retryable,
    Cancelled,
    Discarded,
}

impl JobState {
    pub const ALL: [JobState; 8] = [
        JobState::Scheduled,
        JobState::Available,
        JobState::Pending,
        JobState::Active,
        JobState::Completed,
        JobState::Retryable,
        JobState::Cancelled,
        JobState::Discarded,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Scheduled => "scheduled",
            JobState::Available => "available",
            JobState::Pending => "pending",
            JobState::Active => "active",
            JobState::Completed => "completed",
            JobState::Retryable => "retryable",
            JobState::Cancelled => "cancelled",
            JobState::Discarded => "discarded",
        }
    }

    pub fn parse(s: &str) -> Option<JobState> {
        JobState::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Core §6.5(3): terminal states have no automatic way out.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Completed | JobState::Cancelled | JobState::Discarded
        )
    }
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether `from → to` is in the core §6.4 table, plus `active → available` (visibility
/// timeout, requeue; core §6.3), `scheduled/available/retryable → discarded` (expiry) and the
/// operator's `discarded → available` retry.
pub fn is_allowed(from: JobState, to: JobState) -> bool {
    use JobState::*;
    matches!(
        (from, to),
        (Scheduled, Available)
            | (Pending, Available)
            | (Available, Active)
            | (Active, Completed)
            | (Active, Retryable)
            | (Active, Discarded)
            | (Active, Available)
            | (Active, Cancelled)
            | (Retryable, Available)
            | (Scheduled | Available | Pending | Retryable, Cancelled)
            | (Scheduled | Available | Retryable, Discarded)
            | (Discarded, Available)
    )
}

/// Refuses a transition outside the table with 409 `conflict`, naming both states.
pub fn check(job_id: &str, from: JobState, to: JobState) -> Result<(), OjsError> {
    if is_allowed(from, to) {
        return Ok(());
    }
    Err(OjsError::new(
        ErrorCode::Conflict,
        format!("Job '{job_id}' is {from}; it cannot become {to}."),
    )
    .with_detail("job_id", job_id)
    .with_detail("current_state", from.as_str())
    .with_detail("target_state", to.as_str()))
}

/// Refuses an operation that needs the job in `expected` state.
pub fn expect(job_id: &str, current: JobState, expected: JobState) -> Result<(), OjsError> {
    if current == expected {
        return Ok(());
    }
    Err(OjsError::new(
        ErrorCode::Conflict,
        format!("Job '{job_id}' is {current}, not {expected}."),
    )
    .with_detail("job_id", job_id)
    .with_detail("current_state", current.as_str())
    .with_detail("expected_state", expected.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use JobState::*;

    #[test]
    fn terminal_states_have_no_way_out_but_manual_retry() {
        for from in [Completed, Cancelled, Discarded] {
            for to in JobState::ALL {
                let allowed = is_allowed(from, to);
                assert_eq!(
                    allowed,
                    from == Discarded && to == Available,
                    "{from}->{to}"
                );
            }
        }
    }

    #[test]
    fn core_invalid_examples_are_refused() {
        for (from, to) in [
            (Available, Completed),
            (Scheduled, Active),
            (Retryable, Active),
            (Discarded, Active),
        ] {
            let err = check("j", from, to).unwrap_err();
            assert_eq!(err.code, ErrorCode::Conflict);
            assert_eq!(err.details["current_state"], from.as_str());
        }
    }

    #[test]
    fn names_round_trip() {
        for s in JobState::ALL {
            assert_eq!(JobState::parse(s.as_str()), Some(s));
        }
        assert_eq!(JobState::parse("running"), None);
    }
}
