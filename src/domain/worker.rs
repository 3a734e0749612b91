//! The worker lifecycle states (worker protocol §2), shared by the server (directives in
//! heartbeat answers) and the worker library.

use serde::{Deserialize, Serialize};

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

#[cfg(test)]
mod tests {
    use super::*;

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
