//! What the workflows bucket keeps: a workflow's record (kind, state, members' statuses,
//! counts, results) and its plan, and the ids derived from a workflow's id and a member's
//! place.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::domain::job::{stable_uuid, Callback};

/// Levels of nesting a workflow may have (workflows spec §10.2: at least 3).
pub const MAX_DEPTH: usize = 3;
/// Member jobs a workflow tree may hold (as many as a batch PUSH); a batch's up to three
/// callbacks come on top.
pub const MAX_JOBS: usize = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Chain,
    Group,
    Batch,
}

impl Kind {
    pub(super) fn parse(s: &str) -> Option<Kind> {
        match s {
            "chain" => Some(Kind::Chain),
            "group" => Some(Kind::Group),
            "batch" => Some(Kind::Batch),
            _ => None,
        }
    }
}

/// What a callback means to its workflow.
impl Callback {
    pub const ALL: [Callback; 3] = [
        Callback::OnComplete,
        Callback::OnSuccess,
        Callback::OnFailure,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Callback::OnComplete => "on_complete",
            Callback::OnSuccess => "on_success",
            Callback::OnFailure => "on_failure",
        }
    }

    pub(super) fn parse(s: &str) -> Option<Callback> {
        Callback::ALL.into_iter().find(|c| c.name() == s)
    }

    /// Whether it fires when the batch's members ended with `failed` failures.
    pub(super) fn fires(self, failed: usize) -> bool {
        match self {
            Callback::OnComplete => true,
            Callback::OnSuccess => failed == 0,
            Callback::OnFailure => failed > 0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkflowState {
    Running,
    Completed,
    Failed,
    Cancelled,
}

impl WorkflowState {
    pub fn is_terminal(self) -> bool {
        self != WorkflowState::Running
    }

    pub fn as_str(self) -> &'static str {
        match self {
            WorkflowState::Running => "running",
            WorkflowState::Completed => "completed",
            WorkflowState::Failed => "failed",
            WorkflowState::Cancelled => "cancelled",
        }
    }
}

/// Where a member stands, one letter per member in [`WorkflowRecord::status`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Not started: a `pending` job (a later chain step, a callback) or a workflow not begun.
    Waiting,
    /// Made available (or begun, for a workflow); not started yet.
    Enqueued,
    /// Started at least once; may be waiting for a retry.
    Started,
    Completed,
    /// Discarded or expired (retries exhausted), or a nested workflow that failed.
    Failed,
    Cancelled,
    /// A callback whose condition did not hold.
    Skipped,
}

impl Status {
    pub(super) fn letter(self) -> char {
        match self {
            Status::Waiting => 'w',
            Status::Enqueued => 'p',
            Status::Started => 'a',
            Status::Completed => 'c',
            Status::Failed => 'f',
            Status::Cancelled => 'x',
            Status::Skipped => 'n',
        }
    }

    pub fn from_letter(letter: char) -> Status {
        match letter {
            'p' => Status::Enqueued,
            'a' => Status::Started,
            'c' => Status::Completed,
            'f' => Status::Failed,
            'x' => Status::Cancelled,
            'n' => Status::Skipped,
            _ => Status::Waiting,
        }
    }

    pub fn is_final(self) -> bool {
        matches!(
            self,
            Status::Completed | Status::Failed | Status::Cancelled | Status::Skipped
        )
    }

    /// The state a response shows (workflows spec §4.4).
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Waiting => "waiting",
            Status::Enqueued => "pending",
            Status::Started => "active",
            Status::Completed => "completed",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
            Status::Skipped => "skipped",
        }
    }
}

/// A workflow's place in its parent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentRef {
    pub workflow_id: String,
    pub index: usize,
}

/// The first member failure, kept for GET (workflows spec §9.6).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    pub index: usize,
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
}

/// The value kept in the workflows bucket under the workflow id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkflowRecord {
    pub id: String,
    pub kind: Kind,
    pub name: String,
    pub state: WorkflowState,
    /// Set once everything the creation lists exists; a root still unready when its
    /// creation timer fires was abandoned by a crashed request.
    pub ready: bool,
    pub created_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentRef>,
    /// Indices of the members that are workflows; the others are jobs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nested: Vec<usize>,
    /// One [`Status`] letter per member.
    pub status: String,
    /// A batch's callbacks and where each stands (`Waiting` until the members end).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub callbacks: Vec<(Callback, char)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// A nested workflow begun as a later chain step: the results it was begun with,
    /// passed on before its own when it completes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub received: Option<Vec<Value>>,
}

impl WorkflowRecord {
    pub fn members(&self) -> usize {
        self.status.len()
    }

    pub fn status_of(&self, index: usize) -> Status {
        Status::from_letter(self.status.as_bytes()[index] as char)
    }

    pub(super) fn set(&mut self, index: usize, status: Status) {
        let mut letters = std::mem::take(&mut self.status).into_bytes();
        letters[index] = status.letter() as u8;
        self.status = String::from_utf8(letters).expect("status letters are ASCII");
    }

    fn count(&self, status: Status) -> usize {
        self.status
            .chars()
            .filter(|l| *l == status.letter())
            .count()
    }

    pub fn completed(&self) -> usize {
        self.count(Status::Completed)
    }

    /// Members that ended without completing.
    pub fn failed(&self) -> usize {
        self.count(Status::Failed) + self.count(Status::Cancelled)
    }

    pub fn is_nested(&self, index: usize) -> bool {
        self.nested.contains(&index)
    }

    /// The id of member `index`: its job's, or its workflow's.
    pub fn member_id(&self, index: usize) -> String {
        derived_id(&self.id, &index.to_string(), self.created_at)
    }

    pub fn callback_id(&self, callback: Callback) -> String {
        derived_id(&self.id, callback.name(), self.created_at)
    }

    pub(super) fn callback_status(&self, callback: Callback) -> Option<Status> {
        self.callbacks
            .iter()
            .find(|(c, _)| *c == callback)
            .map(|(_, l)| Status::from_letter(*l))
    }

    pub(super) fn set_callback(&mut self, callback: Callback, status: Status) {
        for (c, l) in &mut self.callbacks {
            if *c == callback {
                *l = status.letter();
            }
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a workflow record always serializes")
    }
}

/// Ids of the tree below a workflow: fixed by the workflow's id, creation time and the
/// member's place (`0`, `1`, … or a callback's name).
pub(super) fn derived_id(workflow_id: &str, place: &str, at: DateTime<Utc>) -> String {
    stable_uuid(&format!("{workflow_id}/{place}"), at)
        .hyphenated()
        .to_string()
}

/// What is shown of each member beside its state (the `.plan` of architecture §3.16): its
/// type (a job's, or `chain`/`group`/`batch`) and the step id the request gave it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub types: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub step_ids: Vec<Option<String>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub callback_types: Vec<String>,
}

pub fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Chain => "chain",
        Kind::Group => "group",
        Kind::Batch => "batch",
    }
}
