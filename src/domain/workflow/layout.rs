//! How a checked request becomes what the store writes: the records and plans, and every
//! member's job envelope under its derived id, the first ones available.

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::record::{
    derived_id, kind_name, Kind, ParentRef, Plan, Status, WorkflowRecord, WorkflowState,
};
use super::request::{invalid, Member, Request};
use crate::domain::envelope;
use crate::domain::error::OjsError;
use crate::domain::job::{Job, Slot};
use crate::domain::retry::OnExhaustion;
use crate::domain::state::JobState;

/// Everything a creation writes: the workflow records (root first, then each nested one
/// before its members) with their plans, and the jobs.
#[derive(Debug, Clone)]
pub struct Creation {
    pub workflows: Vec<(WorkflowRecord, Plan)>,
    /// Each job with its place in its workflow.
    pub jobs: Vec<(Job, Slot)>,
}

/// Lays out the tree under the root id `id`: records, plans and jobs with their derived
/// ids; the jobs that start at once `available`, later chain steps and callbacks `pending`.
///
/// `on_exhaustion` is what a member whose retry policy does not say does when its attempts
/// run out (the `default_on_exhaustion` setting).
///
/// # Errors
/// 400 for a member job that is not a valid job envelope, or that asks to be scheduled or
/// pending (a workflow decides when its jobs run).
pub fn plan(
    request: &Request,
    id: Uuid,
    now: DateTime<Utc>,
    on_exhaustion: OnExhaustion,
) -> Result<Creation, OjsError> {
    let mut creation = Creation {
        workflows: Vec::new(),
        jobs: Vec::new(),
    };
    lay_out(
        request,
        id.hyphenated().to_string(),
        None,
        true,
        (now, on_exhaustion),
        "$",
        &mut creation,
    )?;
    Ok(creation)
}

fn lay_out(
    request: &Request,
    id: String,
    parent: Option<ParentRef>,
    begins: bool,
    (now, on_exhaustion): (DateTime<Utc>, OnExhaustion),
    path: &str,
    out: &mut Creation,
) -> Result<(), OjsError> {
    let mut record = WorkflowRecord {
        id,
        kind: request.kind,
        name: request.name.clone(),
        state: WorkflowState::Running,
        ready: false,
        created_at: now,
        started_at: None,
        finished_at: None,
        parent,
        nested: Vec::new(),
        status: String::new(),
        callbacks: request
            .callbacks
            .iter()
            .map(|(c, _)| (*c, Status::Waiting.letter()))
            .collect(),
        failure: None,
        received: None,
    };
    let starts = |i: usize| begins && (request.kind != Kind::Chain || i == 0);
    let mut plan = Plan {
        types: Vec::new(),
        step_ids: Vec::new(),
        callback_types: Vec::new(),
    };
    for (i, m) in request.members.iter().enumerate() {
        let status = if starts(i) {
            Status::Enqueued
        } else {
            Status::Waiting
        };
        record.status.push(status.letter());
        if matches!(m.what, Member::Workflow(_)) {
            record.nested.push(i);
        }
        plan.step_ids.push(m.step_id.clone());
    }
    if plan.step_ids.iter().all(Option::is_none) {
        plan.step_ids.clear();
    }
    let key = if request.kind == Kind::Chain {
        "steps"
    } else {
        "jobs"
    };
    let at = out.workflows.len();
    let (wf_id, created) = (record.id.clone(), record.created_at);
    out.workflows.push((record, plan));
    let mut types = Vec::with_capacity(request.members.len());
    for (i, m) in request.members.iter().enumerate() {
        let member_path = format!("{path}.{key}[{i}]");
        let member_id = derived_id(&wf_id, &i.to_string(), created);
        match &m.what {
            Member::Job(spec) => {
                let job = member_job(
                    spec,
                    &member_id,
                    &wf_id,
                    starts(i),
                    (now, on_exhaustion),
                    &member_path,
                )?;
                types.push(job.job_type.clone());
                out.jobs.push((job, Slot::Member(i)));
            }
            Member::Workflow(w) => {
                types.push(kind_name(w.kind).to_owned());
                let parent = ParentRef {
                    workflow_id: wf_id.clone(),
                    index: i,
                };
                lay_out(
                    w,
                    member_id,
                    Some(parent),
                    starts(i),
                    (now, on_exhaustion),
                    &member_path,
                    out,
                )?;
            }
        }
    }
    let mut callback_types = Vec::new();
    for (c, spec) in &request.callbacks {
        let cb_path = format!("{path}.callbacks.{}", c.name());
        let job = member_job(
            spec,
            &derived_id(&wf_id, c.name(), created),
            &wf_id,
            false,
            (now, on_exhaustion),
            &cb_path,
        )?;
        callback_types.push(job.job_type.clone());
        out.jobs.push((job, Slot::Callback(*c)));
    }
    let plan = &mut out.workflows[at].1;
    plan.types = types;
    plan.callback_types = callback_types;
    Ok(())
}

/// One member's job envelope, by the PUSH rules, under its derived id.
fn member_job(
    spec: &Value,
    id: &str,
    workflow_id: &str,
    starts: bool,
    (now, on_exhaustion): (DateTime<Utc>, OnExhaustion),
    path: &str,
) -> Result<Job, OjsError> {
    let Value::Object(obj) = spec else {
        return Err(invalid(path, "Each job must be a JSON object."));
    };
    for option in ["scheduled_at", "delay_until", "pending", "unique"] {
        let given = obj.contains_key(option)
            || obj
                .get("options")
                .and_then(Value::as_object)
                .is_some_and(|o| o.contains_key(option));
        if given {
            return Err(invalid(
                &format!("{path}.options.{option}"),
                format!("A workflow's jobs cannot set {option}: the workflow starts each one when its turn comes."),
            ));
        }
    }
    let mut obj = obj.clone();
    obj.remove("id");
    let uuid = Uuid::parse_str(id).expect("derived ids are UUIDs");
    let parsed =
        envelope::parse_with_default_exhaustion(Value::Object(obj), now, uuid, on_exhaustion);
    let mut job = parsed.map_err(|mut err| {
        err.message = format!("{path}: {}", err.message);
        err
    })?;
    job.workflow_id = Some(workflow_id.to_owned());
    job.state = if starts {
        JobState::Available
    } else {
        JobState::Pending
    };
    if starts {
        job.enqueued_at = Some(now);
    }
    Ok(job)
}
