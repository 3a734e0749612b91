//! The worker lifecycle states (worker protocol §2) as the server keeps them: the directive
//! an operator gives a worker, answered on its heartbeats.

use serde::{Deserialize, Serialize};

use super::error::OjsError;

/// Longest worker id. It becomes a key of the workers bucket, where each byte outside
/// `[A-Za-z0-9_-]` is written as three, and so part of a NATS subject: this keeps every such
/// subject far below nats-server's 4,096-byte control line.
pub const MAX_WORKER_ID_BYTES: usize = 256;

/// A worker id as clients may send it: 1 to 256 bytes, no control characters.
///
/// # Errors
/// 400 naming `field`.
pub fn validate_worker_id(id: &str, field: &str) -> Result<(), OjsError> {
    if is_worker_id(id) {
        Ok(())
    } else {
        Err(OjsError::invalid(
            field,
            format!("{field} must be 1 to {MAX_WORKER_ID_BYTES} bytes without control characters."),
        ))
    }
}

/// See [`validate_worker_id`].
pub fn is_worker_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_WORKER_ID_BYTES && !id.chars().any(char::is_control)
}

/// A worker's lifecycle state (worker protocol §2); the order is running < quiet < terminate,
/// and a worker never goes back down it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerState {
    #[default]
    Running,
    Quiet,
    Terminate,
}

impl WorkerState {
    pub fn parse(s: &str) -> Option<WorkerState> {
        match s {
            "running" => Some(WorkerState::Running),
            "quiet" => Some(WorkerState::Quiet),
            "terminate" => Some(WorkerState::Terminate),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Running => "running",
            WorkerState::Quiet => "quiet",
            WorkerState::Terminate => "terminate",
        }
    }
}

/// Whether a worker that reports `state` in its heartbeats takes no new jobs (graceful
/// shutdown spec §5): quiet, draining its active ones, or terminating.
pub fn takes_no_jobs(state: &str) -> bool {
    matches!(state, "quiet" | "drain" | "terminate")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quiet_draining_or_terminating_worker_takes_no_jobs() {
        for state in ["quiet", "drain", "terminate"] {
            assert!(takes_no_jobs(state), "{state}");
        }
        for state in ["running", "busy", ""] {
            assert!(!takes_no_jobs(state), "{state}");
        }
    }

    #[test]
    fn worker_ids_are_bounded_and_printable() {
        assert!(is_worker_id("w-1.host/pid 42"));
        assert!(is_worker_id(&"é".repeat(128)));
        for bad in ["", "a\nb", "\u{0}", &"x".repeat(MAX_WORKER_ID_BYTES + 1)] {
            assert!(!is_worker_id(bad), "{bad:?}");
            assert!(validate_worker_id(bad, "worker_id").is_err());
        }
    }

    #[test]
    fn directives_only_move_forward() {
        assert!(
            WorkerState::Terminate > WorkerState::Quiet
                && WorkerState::Quiet > WorkerState::Running
        );
        assert_eq!(WorkerState::parse("quiet"), Some(WorkerState::Quiet));
        assert_eq!(WorkerState::parse("paused"), None);
    }
}
