//! How a member's outcome moves a workflow on (the leader's `apply`): the next chain step,
//! a batch's callbacks, the end of the workflow and its report to a parent, and cancel.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::record::{
    kind_name, Failure, Kind, ParentRef, Plan, Status, WorkflowRecord, WorkflowState,
};
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::job::{stable_uuid, Callback, JobRecord, Slot, Transition};
use crate::domain::state::JobState;

/// What the leader saw of a member: from a job write (its first start, its final state) or
/// from a nested workflow that ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Seen {
    Started,
    /// With what the next chain step receives: the results its predecessor received, then
    /// its own (`None` after a nested workflow, whose members' results are not gathered).
    Completed(Option<Vec<Value>>),
    Failed(Option<Value>),
    Cancelled,
}

/// What a write of a workflow's job (its `transition` into `state`) tells the workflow:
/// a start, or the end; `None` for everything else and for jobs outside workflows.
pub fn seen_in(
    rec: &JobRecord,
    transition: Transition,
    state: JobState,
) -> Option<(String, Slot, Seen)> {
    let (Some(workflow_id), Some(slot)) = (&rec.job.workflow_id, rec.slot) else {
        return None;
    };
    let seen = match (transition, state) {
        (Transition::Started, _) => Seen::Started,
        (_, JobState::Completed) => {
            let mut passed = match &rec.job.parent_results {
                Some(Value::Array(before)) => before.clone(),
                _ => Vec::new(),
            };
            passed.push(rec.job.result.clone().unwrap_or(Value::Null));
            Seen::Completed(Some(passed))
        }
        (_, JobState::Discarded) => Seen::Failed(
            rec.job
                .error
                .as_ref()
                .and_then(|e| serde_json::to_value(e).ok()),
        ),
        (_, JobState::Cancelled) => Seen::Cancelled,
        _ => return None,
    };
    Some((workflow_id.clone(), slot, seen))
}

/// Where a started job's `parent_results` come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Results {
    None,
    Given(Vec<Value>),
    /// The result of every member, in order (a batch callback): read from their records.
    OfMembers,
}

/// What must happen outside the record (each idempotent: repeating one after a crash
/// changes nothing).
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Make a waiting job available (ACTIVATE, with its `parent_results`).
    Activate { job_id: String, results: Results },
    /// Begin a waiting nested workflow: its first members become available, with the
    /// results of the chain steps before it.
    Begin {
        workflow_id: String,
        results: Option<Vec<Value>>,
    },
    /// Cancel a job unless it is running or final.
    Cancel { job_id: String },
    /// Cancel a nested workflow (and so its jobs).
    CancelWorkflow { workflow_id: String },
    /// Tell the parent how its member, this workflow, stands. A completion's results are
    /// gathered by the store: what this workflow was begun with, then its members' results.
    Report { parent: ParentRef, seen: Seen },
}

/// Workflow events (events seed §3.5), with what their data needs.
#[derive(Debug, Clone, PartialEq)]
pub enum Happened {
    Started,
    StepCompleted { index: usize },
    Completed,
    Failed { index: Option<usize> },
}

/// The outcome of [`apply`]: the record to write (when changed), and what to do first.
#[derive(Debug, Clone, PartialEq)]
pub struct Advance {
    pub record: WorkflowRecord,
    pub changed: bool,
    pub effects: Vec<Effect>,
    pub happened: Vec<Happened>,
}

impl Advance {
    /// Nothing to do: the record as it is.
    pub fn unchanged(rec: &WorkflowRecord) -> Advance {
        Advance {
            record: rec.clone(),
            changed: false,
            effects: Vec::new(),
            happened: Vec::new(),
        }
    }
}

/// Moves the workflow on by what was seen of its members, in order. A member already final
/// keeps its outcome, so seeing a write again (a replay after a failover) changes nothing;
/// after the workflow ended, outcomes are still recorded but start nothing.
pub fn apply(rec: &WorkflowRecord, seen: &[(Slot, Seen)], now: DateTime<Utc>) -> Advance {
    let mut a = Advance::unchanged(rec);
    for (slot, what) in seen {
        match *slot {
            Slot::Member(i) if i < a.record.members() => member(&mut a, i, what, now),
            Slot::Callback(c) => callback(&mut a, c, what, now),
            Slot::Member(_) => {}
        }
    }
    a.changed = a.record != *rec;
    a
}

fn member(a: &mut Advance, i: usize, what: &Seen, now: DateTime<Utc>) {
    let status = a.record.status_of(i);
    if status.is_final() {
        return;
    }
    let running = a.record.state == WorkflowState::Running;
    match what {
        Seen::Started => {
            a.record.set(i, Status::Started);
            started(a, now);
            return;
        }
        Seen::Completed(_) => a.record.set(i, Status::Completed),
        Seen::Failed(error) => {
            a.record.set(i, Status::Failed);
            failure(a, i, error.clone());
        }
        Seen::Cancelled => {
            a.record.set(i, Status::Cancelled);
            failure(a, i, None);
        }
    }
    if !running {
        return;
    }
    if let Seen::Completed(_) = what {
        a.happened.push(Happened::StepCompleted { index: i });
    }
    match a.record.kind {
        Kind::Chain => match what {
            Seen::Completed(passed) if i + 1 < a.record.members() => {
                a.record.set(i + 1, Status::Enqueued);
                a.effects.push(start(&a.record, i + 1, passed.clone()));
            }
            Seen::Completed(_) => finish(a, WorkflowState::Completed, now),
            _ => {
                for later in i + 1..a.record.members() {
                    cancel_member(a, later);
                }
                finish(a, WorkflowState::Failed, now);
            }
        },
        Kind::Group => {
            if open_members(&a.record) == 0 {
                let state = if a.record.failed() == 0 {
                    WorkflowState::Completed
                } else {
                    WorkflowState::Failed
                };
                finish(a, state, now);
            }
        }
        Kind::Batch => {
            if open_members(&a.record) == 0 {
                fire_callbacks(a, now);
            }
        }
    }
}

fn open_members(rec: &WorkflowRecord) -> usize {
    rec.status
        .chars()
        .filter(|l| !Status::from_letter(*l).is_final())
        .count()
}

/// The first start anywhere in the tree: `workflow.started`, passed up to the parent.
fn started(a: &mut Advance, now: DateTime<Utc>) {
    if a.record.started_at.is_some() {
        return;
    }
    a.record.started_at = Some(now);
    a.happened.push(Happened::Started);
    if let Some(parent) = &a.record.parent {
        a.effects.push(Effect::Report {
            parent: parent.clone(),
            seen: Seen::Started,
        });
    }
}

fn failure(a: &mut Advance, index: usize, error: Option<Value>) {
    if a.record.failure.is_none() {
        a.record.failure = Some(Failure {
            index,
            id: a.record.member_id(index),
            error,
        });
    }
}

/// What starts member `i`: its job becomes available, or its workflow begins; either with
/// the results of the chain steps before it.
fn start(rec: &WorkflowRecord, i: usize, results: Option<Vec<Value>>) -> Effect {
    let id = rec.member_id(i);
    if rec.is_nested(i) {
        Effect::Begin {
            workflow_id: id,
            results,
        }
    } else {
        Effect::Activate {
            job_id: id,
            results: results.map_or(Results::None, Results::Given),
        }
    }
}

fn cancel_member(a: &mut Advance, i: usize) {
    if a.record.status_of(i).is_final() {
        return;
    }
    if a.record.status_of(i) == Status::Waiting {
        a.record.set(i, Status::Cancelled);
    }
    let id = a.record.member_id(i);
    a.effects.push(if a.record.is_nested(i) {
        Effect::CancelWorkflow { workflow_id: id }
    } else {
        Effect::Cancel { job_id: id }
    });
}

/// Every member ended: each callback whose condition holds starts with all results, the
/// others are cancelled; with none to wait for, the batch ends now.
fn fire_callbacks(a: &mut Advance, now: DateTime<Utc>) {
    let failed = a.record.failed();
    let callbacks: Vec<Callback> = a.record.callbacks.iter().map(|(c, _)| *c).collect();
    for c in callbacks {
        let id = a.record.callback_id(c);
        if c.fires(failed) {
            a.record.set_callback(c, Status::Enqueued);
            a.effects.push(Effect::Activate {
                job_id: id,
                results: Results::OfMembers,
            });
        } else {
            a.record.set_callback(c, Status::Skipped);
            a.effects.push(Effect::Cancel { job_id: id });
        }
    }
    batch_ends_when_callbacks_do(a, now);
}

fn callback(a: &mut Advance, c: Callback, what: &Seen, now: DateTime<Utc>) {
    let Some(status) = a.record.callback_status(c) else {
        return;
    };
    if status.is_final() {
        return;
    }
    let next = match what {
        Seen::Started => {
            a.record.set_callback(c, Status::Started);
            return;
        }
        Seen::Completed(_) => Status::Completed,
        Seen::Failed(_) => Status::Failed,
        Seen::Cancelled => Status::Cancelled,
    };
    a.record.set_callback(c, next);
    if a.record.state == WorkflowState::Running && open_members(&a.record) == 0 {
        batch_ends_when_callbacks_do(a, now);
    }
}

/// A batch ends once every fired callback is final: completed if all of them completed
/// (workflows spec §8.3), failed if one failed or none fired (a member failed and only
/// `on_success` was given).
fn batch_ends_when_callbacks_do(a: &mut Advance, now: DateTime<Utc>) {
    let fired: Vec<Status> = a
        .record
        .callbacks
        .iter()
        .map(|(_, l)| Status::from_letter(*l))
        .filter(|s| *s != Status::Skipped)
        .collect();
    if fired.iter().any(|s| !s.is_final()) {
        return;
    }
    let state = if !fired.is_empty() && fired.iter().all(|s| *s == Status::Completed) {
        WorkflowState::Completed
    } else {
        WorkflowState::Failed
    };
    finish(a, state, now);
}

fn finish(a: &mut Advance, state: WorkflowState, now: DateTime<Utc>) {
    a.record.state = state;
    a.record.finished_at = Some(now);
    match state {
        WorkflowState::Completed => a.happened.push(Happened::Completed),
        WorkflowState::Failed => a.happened.push(Happened::Failed {
            index: a.record.failure.as_ref().map(|f| f.index),
        }),
        WorkflowState::Running | WorkflowState::Cancelled => {}
    }
    if let Some(parent) = &a.record.parent {
        let seen = match state {
            WorkflowState::Completed => Seen::Completed(None),
            WorkflowState::Failed => Seen::Failed(None),
            _ => Seen::Cancelled,
        };
        a.effects.push(Effect::Report {
            parent: parent.clone(),
            seen,
        });
    }
}

/// A nested workflow waiting as a later chain step begins: its first members start, with
/// the results of the steps before it (kept, to be passed on before its own).
pub fn begin(rec: &WorkflowRecord, results: Option<Vec<Value>>) -> Advance {
    let mut a = Advance::unchanged(rec);
    if rec.state == WorkflowState::Running {
        let first: Vec<usize> = match rec.kind {
            Kind::Chain => vec![0],
            Kind::Group | Kind::Batch => (0..rec.members()).collect(),
        };
        for i in first {
            if a.record.status_of(i) == Status::Waiting {
                a.record.set(i, Status::Enqueued);
                a.effects.push(start(&a.record, i, results.clone()));
            }
        }
        if a.record.received.is_none() {
            a.record.received = results;
        }
    }
    a.changed = a.record != *rec;
    a
}

/// The event a workflow's progress implies, its id fixed by workflow, kind and member so a
/// repeat after a crash is dropped as a duplicate. `plan` names the members.
pub fn event(
    rec: &WorkflowRecord,
    plan: Option<&Plan>,
    happened: &Happened,
    source: &str,
    now: DateTime<Utc>,
) -> crate::domain::event::Event {
    let type_of = |i: usize| plan.and_then(|p| p.types.get(i)).cloned();
    let total = rec.members();
    let mut data = serde_json::json!({
        "workflow_id": rec.id,
        "workflow_name": rec.name,
        "workflow_type": kind_name(rec.kind),
    });
    let (event_type, place) = match happened {
        Happened::Started => {
            data["total_steps"] = total.into();
            ("workflow.started", String::new())
        }
        Happened::StepCompleted { index } => {
            data["step_id"] = rec.member_id(*index).into();
            data["step_index"] = (*index).into();
            data["step_type"] = type_of(*index).into();
            data["steps_remaining"] = (total - rec.completed().min(total)).into();
            ("workflow.step_completed", index.to_string())
        }
        Happened::Completed => {
            data["total_steps"] = total.into();
            data["duration_ms"] = rec
                .finished_at
                .map_or(0, |f| (f - rec.created_at).num_milliseconds().max(0))
                .into();
            ("workflow.completed", String::new())
        }
        Happened::Failed { index } => {
            if let Some(i) = index {
                data["failed_step_id"] = rec.member_id(*i).into();
                data["failed_step_type"] = type_of(*i).into();
            }
            data["error"] = rec
                .failure
                .as_ref()
                .and_then(|f| f.error.clone())
                .unwrap_or(Value::Null);
            ("workflow.failed", String::new())
        }
    };
    crate::domain::event::Event {
        specversion: "1.0".into(),
        id: format!(
            "evt_{}",
            stable_uuid(&format!("{}/{event_type}/{place}", rec.id), rec.created_at)
        ),
        event_type: event_type.into(),
        source: source.into(),
        time: now,
        subject: Some(rec.id.clone()),
        datacontenttype: "application/json".into(),
        data,
    }
}

/// CANCEL of a running workflow (workflows spec §11.3): it ends `cancelled`, and every
/// member that has not started is cancelled; started ones finish and start nothing.
///
/// # Errors
/// 409 when the workflow already ended.
pub fn cancel(rec: &WorkflowRecord, now: DateTime<Utc>) -> Result<Advance, OjsError> {
    if rec.state.is_terminal() {
        return Err(OjsError::new(
            ErrorCode::Conflict,
            format!(
                "Workflow {} is already in terminal state '{}'.",
                rec.id,
                rec.state.as_str()
            ),
        )
        .with_detail("current_state", rec.state.as_str()));
    }
    let mut a = Advance::unchanged(rec);
    a.changed = true;
    a.record.state = WorkflowState::Cancelled;
    a.record.finished_at = Some(now);
    a.effects = cancellations(&a.record);
    for i in 0..a.record.members() {
        if a.record.status_of(i) == Status::Waiting {
            a.record.set(i, Status::Cancelled);
        }
    }
    for (_, l) in &mut a.record.callbacks {
        if Status::from_letter(*l) == Status::Waiting {
            *l = Status::Cancelled.letter();
        }
    }
    Ok(a)
}

/// The cancellations a cancelled (or abandoned) workflow needs: every member and callback
/// not final. Repeated by the workflow's timer after a cancel cut short by a crash; each
/// is a no-op for what already ended or runs.
pub fn cancellations(rec: &WorkflowRecord) -> Vec<Effect> {
    let undone = |s: Status| !matches!(s, Status::Completed | Status::Failed | Status::Skipped);
    let members = (0..rec.members())
        .filter(|i| undone(rec.status_of(*i)))
        .map(|i| {
            let id = rec.member_id(i);
            if rec.is_nested(i) {
                Effect::CancelWorkflow { workflow_id: id }
            } else {
                Effect::Cancel { job_id: id }
            }
        });
    let callbacks = rec
        .callbacks
        .iter()
        .filter(|(_, l)| undone(Status::from_letter(*l)))
        .map(|(c, _)| Effect::Cancel {
            job_id: rec.callback_id(*c),
        });
    members.chain(callbacks).collect()
}
