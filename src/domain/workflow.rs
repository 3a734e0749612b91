//! Workflows (workflows spec; http-api §3.7, §4.12): what a creation request asks for, the
//! record that holds a workflow's progress, and how a member's outcome moves it on. No I/O:
//! the store creates what [`plan`] lists and the leader stores what [`apply`] decides
//! (architecture §3.16).
//!
//! A workflow is a tree: a chain, group or batch whose members are jobs or further
//! workflows. Every id in the tree is derived from the root's id and the member's place,
//! so doing the same step again after a crash names the same job.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use uuid::Uuid;

use super::envelope;
use super::error::{ErrorCode, OjsError};
use super::fields;
use super::job::{stable_uuid, Job, JobRecord, Transition};
use super::retry::OnExhaustion;
use super::state::JobState;

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
    fn parse(s: &str) -> Option<Kind> {
        match s {
            "chain" => Some(Kind::Chain),
            "group" => Some(Kind::Group),
            "batch" => Some(Kind::Batch),
            _ => None,
        }
    }
}

/// A batch's callbacks, in the order they are listed and fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Callback {
    OnComplete,
    OnSuccess,
    OnFailure,
}

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

    fn parse(s: &str) -> Option<Callback> {
        Callback::ALL.into_iter().find(|c| c.name() == s)
    }

    /// Whether it fires when the batch's members ended with `failed` failures.
    fn fires(self, failed: usize) -> bool {
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
    fn letter(self) -> char {
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

/// A job's or nested workflow's place in its workflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Slot {
    Member(usize),
    Callback(Callback),
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

    fn set(&mut self, index: usize, status: Status) {
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

    fn callback_status(&self, callback: Callback) -> Option<Status> {
        self.callbacks
            .iter()
            .find(|(c, _)| *c == callback)
            .map(|(_, l)| Status::from_letter(*l))
    }

    fn set_callback(&mut self, callback: Callback, status: Status) {
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
fn derived_id(workflow_id: &str, place: &str, at: DateTime<Utc>) -> String {
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

/// A creation request, checked: a tree of workflows with job envelopes (as JSON) at its
/// leaves.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub kind: Kind,
    pub name: String,
    pub members: Vec<MemberRequest>,
    pub callbacks: Vec<(Callback, Value)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MemberRequest {
    /// The id a step-graph request gave the step.
    pub step_id: Option<String>,
    pub what: Member,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Member {
    Job(Value),
    Workflow(Request),
}

fn invalid(path: &str, message: impl Into<String>) -> OjsError {
    let message = message.into();
    OjsError::new(ErrorCode::InvalidRequest, message.clone()).with_detail(
        "validation_errors",
        serde_json::json!([{"path": path, "message": message}]),
    )
}

/// Reads a creation request in either form clients send: typed (`{"type":"chain",
/// "steps":[…]}`, `{"type":"group"|"batch","jobs":[…],"callbacks":{…}}`, members that are
/// themselves typed workflows) or step-graph (`{"name","steps":[{"id","type","args",
/// "depends_on":[…],"options"}]}`, batch callbacks as steps with `options.callback_type`).
///
/// # Errors
/// 400 naming the first problem (`details.validation_errors`).
pub fn parse(body: Value) -> Result<Request, OjsError> {
    let Value::Object(obj) = body else {
        return Err(invalid("$", "A workflow must be a JSON object."));
    };
    let request = if obj.contains_key("type") {
        parse_typed(&obj, "$", 1)?
    } else {
        parse_graph(&obj)?
    };
    let jobs = request.jobs();
    if jobs > MAX_JOBS {
        return Err(too_many(jobs));
    }
    Ok(request)
}

/// Refused before anything of the workflow is looked at further (also as soon as one list
/// alone is too long).
fn too_many(jobs: usize) -> OjsError {
    invalid(
        "$",
        format!("A workflow may hold at most {MAX_JOBS} jobs; this one has {jobs}."),
    )
}

impl Request {
    /// Member jobs in the tree (callbacks aside).
    pub fn jobs(&self) -> usize {
        self.members
            .iter()
            .map(|m| match &m.what {
                Member::Job(_) => 1,
                Member::Workflow(w) => w.jobs(),
            })
            .sum()
    }
}

fn name_of(obj: &Map<String, Value>, path: &str) -> Result<String, OjsError> {
    match fields::present(obj.get("name")) {
        None => Ok(String::new()),
        Some(Value::String(s)) if s.len() <= envelope::MAX_TYPE_LEN => Ok(s.clone()),
        Some(Value::String(_)) => Err(invalid(
            &format!("{path}.name"),
            format!(
                "A workflow name may be at most {} bytes.",
                envelope::MAX_TYPE_LEN
            ),
        )),
        Some(_) => Err(invalid(&format!("{path}.name"), "name must be a string.")),
    }
}

fn parse_typed(obj: &Map<String, Value>, path: &str, depth: usize) -> Result<Request, OjsError> {
    if depth > MAX_DEPTH {
        return Err(invalid(
            path,
            format!("Workflows may nest at most {MAX_DEPTH} levels deep."),
        ));
    }
    let kind = match obj.get("type") {
        Some(Value::String(t)) => Kind::parse(t).ok_or_else(|| {
            invalid(
                &format!("{path}.type"),
                format!("type must be \"chain\", \"group\" or \"batch\", got {t:?}."),
            )
        })?,
        _ => {
            return Err(invalid(
                &format!("{path}.type"),
                "type must be \"chain\", \"group\" or \"batch\".",
            ))
        }
    };
    // Chains list `steps`, groups and batches `jobs`; either is read for any kind.
    let (key, list) = match (obj.get("steps"), obj.get("jobs")) {
        (Some(Value::Array(a)), _) => ("steps", a),
        (_, Some(Value::Array(a))) => ("jobs", a),
        _ => {
            let key = if kind == Kind::Chain { "steps" } else { "jobs" };
            return Err(invalid(
                &format!("{path}.{key}"),
                format!("{key} must be an array of at least one job."),
            ));
        }
    };
    if list.is_empty() {
        return Err(invalid(
            &format!("{path}.{key}"),
            format!("{key} must contain at least one job."),
        ));
    }
    if list.len() > MAX_JOBS {
        return Err(too_many(list.len()));
    }
    let mut members = Vec::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        let item_path = format!("{path}.{key}[{i}]");
        members.push(MemberRequest {
            step_id: None,
            what: typed_member(item, &item_path, depth)?,
        });
    }
    let callbacks = callbacks_of(obj.get("callbacks"), &format!("{path}.callbacks"))?;
    check_callbacks(kind, &callbacks, path)?;
    Ok(Request {
        kind,
        name: name_of(obj, path)?,
        members,
        callbacks,
    })
}

/// A member is a workflow when its `type` names a workflow kind and it lists members.
fn typed_member(item: &Value, path: &str, depth: usize) -> Result<Member, OjsError> {
    let Value::Object(obj) = item else {
        return Err(invalid(path, "Each member must be a JSON object."));
    };
    let is_workflow = obj
        .get("type")
        .and_then(Value::as_str)
        .is_some_and(|t| Kind::parse(t).is_some())
        && (obj.get("steps").is_some_and(Value::is_array)
            || obj.get("jobs").is_some_and(Value::is_array));
    if is_workflow {
        Ok(Member::Workflow(parse_typed(obj, path, depth + 1)?))
    } else {
        Ok(Member::Job(item.clone()))
    }
}

fn callbacks_of(v: Option<&Value>, path: &str) -> Result<Vec<(Callback, Value)>, OjsError> {
    let Some(callbacks) = fields::present(v) else {
        return Ok(Vec::new());
    };
    let Value::Object(map) = callbacks else {
        return Err(invalid(path, "callbacks must be an object."));
    };
    let mut out = Vec::new();
    for (name, spec) in map {
        let callback = Callback::parse(name).ok_or_else(|| {
            invalid(
                &format!("{path}.{name}"),
                format!("Unknown callback {name:?}: use on_complete, on_success or on_failure."),
            )
        })?;
        if fields::present(Some(spec)).is_some() {
            out.push((callback, spec.clone()));
        }
    }
    out.sort_by_key(|(c, _)| *c);
    Ok(out)
}

fn check_callbacks(
    kind: Kind,
    callbacks: &[(Callback, Value)],
    path: &str,
) -> Result<(), OjsError> {
    match kind {
        Kind::Batch if callbacks.is_empty() => Err(invalid(
            &format!("{path}.callbacks"),
            "A batch needs at least one callback (on_complete, on_success or on_failure); without, use a group.",
        )),
        Kind::Chain | Kind::Group if !callbacks.is_empty() => Err(invalid(
            &format!("{path}.callbacks"),
            "Only a batch has callbacks.",
        )),
        _ => Ok(()),
    }
}

/// The step-graph form: a chain when the steps form one path (each depends on the one
/// before), a group when none depends on another, a batch when callback steps are added to
/// a group. Other graphs are refused: general dependency graphs are not an OJS primitive.
fn parse_graph(obj: &Map<String, Value>) -> Result<Request, OjsError> {
    let steps =
        match obj.get("steps") {
            Some(Value::Array(a)) if !a.is_empty() => a,
            Some(Value::Array(_)) => {
                return Err(invalid("$.steps", "steps must contain at least one job."))
            }
            _ => return Err(invalid(
                "$.type",
                "type must be \"chain\", \"group\" or \"batch\" (or give steps with depends_on).",
            )),
        };
    if steps.len() > MAX_JOBS + Callback::ALL.len() {
        return Err(too_many(steps.len()));
    }
    struct Step {
        id: String,
        depends_on: Vec<String>,
        spec: Value,
    }
    let mut plain: Vec<Step> = Vec::new();
    let mut callbacks: Vec<(Callback, Value)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (i, item) in steps.iter().enumerate() {
        let path = format!("$.steps[{i}]");
        let Value::Object(step) = item else {
            return Err(invalid(&path, "Each step must be a JSON object."));
        };
        let id = match step.get("id") {
            Some(Value::String(s)) if !s.is_empty() && s.len() <= 256 => s.clone(),
            _ => {
                return Err(invalid(
                    &format!("{path}.id"),
                    "Each step needs an id: a string of 1 to 256 bytes.",
                ))
            }
        };
        if !seen.insert(id.clone()) {
            return Err(invalid(
                &format!("{path}.id"),
                format!("Step id {id:?} is used twice."),
            ));
        }
        let depends_on = match fields::present(step.get("depends_on")) {
            None => Vec::new(),
            Some(Value::Array(ids)) => ids
                .iter()
                .map(|d| d.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    invalid(
                        &format!("{path}.depends_on"),
                        "depends_on must list step ids.",
                    )
                })?,
            Some(_) => {
                return Err(invalid(
                    &format!("{path}.depends_on"),
                    "depends_on must be an array of step ids.",
                ))
            }
        };
        let callback = step
            .get("options")
            .and_then(|o| o.get("callback_type"))
            .and_then(Value::as_str);
        let mut spec = step.clone();
        spec.remove("id");
        spec.remove("depends_on");
        if let Some(Value::Object(options)) = spec.get_mut("options") {
            options.remove("callback_type");
        }
        match callback {
            Some(name) => {
                let callback = Callback::parse(name).ok_or_else(|| {
                    invalid(
                        &format!("{path}.options.callback_type"),
                        format!("Unknown callback type {name:?}: use on_complete, on_success or on_failure."),
                    )
                })?;
                callbacks.push((callback, Value::Object(spec)));
            }
            None => plain.push(Step {
                id,
                depends_on,
                spec: Value::Object(spec),
            }),
        }
    }
    if plain.is_empty() {
        return Err(invalid("$.steps", "steps must contain at least one job."));
    }
    for step in &plain {
        if let Some(unknown) = step.depends_on.iter().find(|d| !seen.contains(*d)) {
            return Err(invalid(
                "$.steps",
                format!(
                    "Step {:?} depends on {unknown:?}, which is not a step.",
                    step.id
                ),
            ));
        }
    }
    let independent = plain.iter().all(|s| s.depends_on.is_empty());
    let ordered: Vec<Step> = if independent {
        plain
    } else {
        // One path: a single first step, each later one depending on exactly the one
        // before. Followed from the first through a map from each step to the one after
        // it, so a long chain listed in any order costs linear time.
        let not_a_chain = || {
            invalid(
                "$.steps",
                "The steps must form a chain (each depending on the one before) or a group (none depending on another); other dependency graphs are not supported.",
            )
        };
        let mut first = None;
        let mut after: HashMap<&str, usize> = HashMap::with_capacity(plain.len());
        for (i, step) in plain.iter().enumerate() {
            let alone = match step.depends_on.as_slice() {
                [] => first.replace(i).is_none(),
                [before] => after.insert(before.as_str(), i).is_none(),
                _ => false,
            };
            if !alone {
                return Err(not_a_chain());
            }
        }
        let mut order = Vec::with_capacity(plain.len());
        let mut at = first;
        while let Some(i) = at.filter(|_| order.len() < plain.len()) {
            order.push(i);
            at = after.get(plain[i].id.as_str()).copied();
        }
        if order.len() != plain.len() {
            return Err(not_a_chain()); // a step hangs off a callback, or off nothing
        }
        let mut steps: Vec<Option<Step>> = plain.into_iter().map(Some).collect();
        order
            .into_iter()
            .map(|i| steps[i].take().expect("each step is on the path once"))
            .collect()
    };
    let kind = match (independent && ordered.len() > 1, callbacks.is_empty()) {
        (_, false) => Kind::Batch,
        (true, true) => Kind::Group,
        (false, true) => Kind::Chain,
    };
    if kind == Kind::Batch && !independent {
        return Err(invalid(
            "$.steps",
            "Callback steps belong to a batch, whose other steps depend on none.",
        ));
    }
    callbacks.sort_by_key(|(c, _)| *c);
    if callbacks.windows(2).any(|w| w[0].0 == w[1].0) {
        return Err(invalid("$.steps", "Each callback type may be given once."));
    }
    Ok(Request {
        kind,
        name: name_of(obj, "$")?,
        members: ordered
            .into_iter()
            .map(|s| MemberRequest {
                step_id: Some(s.id),
                what: Member::Job(s.spec),
            })
            .collect(),
        callbacks,
    })
}

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

pub fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Chain => "chain",
        Kind::Group => "group",
        Kind::Batch => "batch",
    }
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
) -> super::event::Event {
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
    super::event::Event {
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn now() -> DateTime<Utc> {
        "2026-11-25T10:00:00Z".parse().unwrap()
    }

    fn job(t: &str) -> Value {
        json!({"type": t, "args": [], "options": {"queue": "wf"}})
    }

    fn laid_out(body: Value) -> Creation {
        let id = Uuid::parse_str("01967a3e-0000-7000-8000-000000000001").unwrap();
        plan(&parse(body).unwrap(), id, now(), OnExhaustion::Discard).unwrap()
    }

    fn states(c: &Creation) -> Vec<(String, JobState)> {
        c.jobs
            .iter()
            .map(|(j, _)| (j.job_type.clone(), j.state))
            .collect()
    }

    fn refused(body: Value) -> String {
        let err = parse(body.clone())
            .and_then(|r| plan(&r, Uuid::now_v7(), now(), OnExhaustion::Discard))
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidRequest, "{body}");
        err.message
    }

    #[test]
    fn a_chain_starts_its_first_step_and_holds_the_others() {
        let c = laid_out(
            json!({"type": "chain", "name": "c", "steps": [job("a"), job("b"), job("c")]}),
        );
        assert_eq!(
            states(&c),
            [
                ("a".into(), JobState::Available),
                ("b".into(), JobState::Pending),
                ("c".into(), JobState::Pending)
            ]
        );
        let (rec, plan) = &c.workflows[0];
        assert_eq!(
            (rec.kind, rec.status.as_str(), rec.ready),
            (Kind::Chain, "pww", false)
        );
        assert_eq!(plan.types, ["a", "b", "c"]);
        for (i, (j, slot)) in c.jobs.iter().enumerate() {
            assert_eq!(j.id, rec.member_id(i));
            assert_eq!(j.workflow_id.as_deref(), Some(rec.id.as_str()));
            assert_eq!(*slot, Slot::Member(i));
        }
        // The same request under the same id lays out the same ids.
        let again = laid_out(
            json!({"type": "chain", "name": "c", "steps": [job("a"), job("b"), job("c")]}),
        );
        assert_eq!(c.jobs[2].0.id, again.jobs[2].0.id);
    }

    #[test]
    fn groups_and_batches_start_every_member_and_hold_the_callbacks() {
        let c = laid_out(json!({"type": "batch", "jobs": [job("a"), job("b")],
            "callbacks": {"on_failure": job("f"), "on_complete": job("done")}}));
        assert_eq!(
            states(&c),
            [
                ("a".into(), JobState::Available),
                ("b".into(), JobState::Available),
                ("done".into(), JobState::Pending),
                ("f".into(), JobState::Pending)
            ]
        );
        assert_eq!(c.jobs[3].1, Slot::Callback(Callback::OnFailure));
        assert_eq!(
            c.workflows[0].0.callbacks,
            [(Callback::OnComplete, 'w'), (Callback::OnFailure, 'w')]
        );
        // Either list name is read for any kind.
        let g = laid_out(json!({"type": "group", "steps": [job("a")]}));
        assert_eq!(g.workflows[0].0.status, "p");
    }

    #[test]
    fn a_nested_chain_starts_with_its_group_and_holds_its_later_steps() {
        let c = laid_out(json!({"type": "group", "jobs": [
            job("solo"),
            {"type": "chain", "steps": [job("s0"), job("s1")]}
        ]}));
        assert_eq!(c.workflows.len(), 2);
        let (root, child) = (&c.workflows[0].0, &c.workflows[1].0);
        assert_eq!(root.nested, [1]);
        assert_eq!(child.id, root.member_id(1));
        assert_eq!(
            child.parent,
            Some(ParentRef {
                workflow_id: root.id.clone(),
                index: 1
            })
        );
        assert_eq!(c.workflows[0].1.types, ["solo", "chain"]);
        assert_eq!(
            states(&c),
            [
                ("solo".into(), JobState::Available),
                ("s0".into(), JobState::Available),
                ("s1".into(), JobState::Pending)
            ]
        );
        assert_eq!(c.jobs[1].0.workflow_id.as_deref(), Some(child.id.as_str()));
        // A group that is a later chain step waits with all of its jobs.
        let c = laid_out(json!({"type": "chain", "steps": [
            job("first"), {"type": "group", "jobs": [job("g0"), job("g1")]}]}));
        assert_eq!(c.workflows[1].0.status, "ww");
        assert!(c.jobs[1..]
            .iter()
            .all(|(j, _)| j.state == JobState::Pending));
    }

    #[test]
    fn the_step_graph_form_reads_as_a_chain_a_group_or_a_batch() {
        let step = |id: &str, deps: &[&str]| json!({"id": id, "type": format!("t.{id}"), "args": [], "depends_on": deps});
        let chain = parse(json!({"name": "g", "steps": [step("step-1", &["step-0"]), step("step-0", &[]), step("step-2", &["step-1"])]})).unwrap();
        assert_eq!(chain.kind, Kind::Chain);
        let order: Vec<_> = chain
            .members
            .iter()
            .map(|m| m.step_id.clone().unwrap())
            .collect();
        assert_eq!(order, ["step-0", "step-1", "step-2"]);
        let group = parse(json!({"steps": [step("job-0", &[]), step("job-1", &[])]})).unwrap();
        assert_eq!(group.kind, Kind::Group);
        let batch = parse(json!({"steps": [step("job-0", &[]), step("job-1", &[]),
            {"id": "cb", "type": "t.cb", "args": [], "depends_on": ["job-0", "job-1"],
             "options": {"callback_type": "on_complete", "queue": "cbq"}}]}))
        .unwrap();
        assert_eq!(batch.kind, Kind::Batch);
        assert_eq!(batch.callbacks[0].0, Callback::OnComplete);
        assert_eq!(batch.callbacks[0].1["options"], json!({"queue": "cbq"}));
        let diamond = json!({"steps": [step("a", &[]), step("b", &["a"]), step("c", &["a"]), step("d", &["b", "c"])]});
        assert!(refused(diamond).contains("chain"));
        assert!(refused(json!({"steps": [step("a", &["x"])]})).contains("\"x\""));
        assert!(refused(json!({"steps": [step("a", &[]), step("a", &[])]})).contains("twice"));
        let fork = json!({"steps": [step("a", &[]), step("b", &["a"]), step("c", &["a"])]});
        assert!(refused(fork).contains("chain"));
        let cycle = json!({"steps": [step("a", &[]), step("b", &["c"]), step("c", &["b"])]});
        assert!(refused(cycle).contains("chain"));
        // A long chain listed backwards is ordered (in linear time); one step too many is
        // refused before any of it is read.
        let backwards: Vec<Value> = (0..MAX_JOBS)
            .rev()
            .map(|i| {
                let before = if i == 0 {
                    vec![]
                } else {
                    vec![format!("s{}", i - 1)]
                };
                json!({"id": format!("s{i}"), "type": "t", "args": [], "depends_on": before})
            })
            .collect();
        let long = parse(json!({"steps": backwards})).unwrap();
        assert_eq!(long.kind, Kind::Chain);
        assert_eq!(
            long.members[MAX_JOBS - 1].step_id.as_deref(),
            Some(format!("s{}", MAX_JOBS - 1).as_str())
        );
        let many: Vec<Value> = (0..MAX_JOBS + 4)
            .map(|i| json!({"id": i.to_string()}))
            .collect();
        assert!(refused(json!({"steps": many})).contains("at most"));
    }

    #[test]
    fn bad_workflows_are_refused_with_the_place_named() {
        assert!(refused(json!({"type": "chain", "steps": []})).contains("at least one"));
        assert!(refused(json!({"type": "batch", "jobs": [job("a")]})).contains("callback"));
        assert!(refused(
            json!({"type": "group", "jobs": [job("a")], "callbacks": {"on_complete": job("c")}})
        )
        .contains("Only a batch"));
        assert!(refused(json!({"type": "dag", "steps": [job("a")]})).contains("\"dag\""));
        assert!(refused(json!({"type": "chain", "steps": [{"type": "a"}]})).contains("args"));
        assert!(refused(json!({"type": "chain", "steps": [{"type": "a", "args": [], "options": {"scheduled_at": "+PT1S"}}]})).contains("scheduled_at"));
        let deep = json!({"type": "chain", "steps": [{"type": "group", "jobs": [{"type": "chain", "steps": [{"type": "group", "jobs": [job("a")]}]}]}]});
        assert!(refused(deep).contains("3 levels"));
        let many: Vec<Value> = (0..=MAX_JOBS).map(|_| job("a")).collect();
        assert!(refused(json!({"type": "group", "jobs": many})).contains("at most"));
        let err = parse(json!({"type": "chain", "steps": []})).unwrap_err();
        assert_eq!(err.details["validation_errors"][0]["path"], "$.steps");
    }

    fn record(body: Value) -> WorkflowRecord {
        laid_out(body).workflows[0].0.clone()
    }

    #[test]
    fn a_chain_moves_on_once_per_completed_step_and_passes_results() {
        let rec = record(json!({"type": "chain", "steps": [job("a"), job("b")]}));
        let started = apply(&rec, &[(Slot::Member(0), Seen::Started)], now());
        assert_eq!(started.happened, [Happened::Started]);
        assert_eq!(started.record.status, "aw");
        let done = vec![(
            Slot::Member(0),
            Seen::Completed(Some(vec![json!({"r": 1})])),
        )];
        let first = apply(&started.record, &done, now());
        assert_eq!(first.record.status, "cp");
        assert_eq!(
            first.effects,
            [Effect::Activate {
                job_id: rec.member_id(1),
                results: Results::Given(vec![json!({"r": 1})])
            }]
        );
        assert_eq!(first.happened, [Happened::StepCompleted { index: 0 }]);
        // Seen again (a replay after a failover): nothing changes, nothing is started twice.
        let replay = apply(&first.record, &done, now());
        assert!(!replay.changed && replay.effects.is_empty() && replay.happened.is_empty());
        let last = apply(
            &first.record,
            &[(Slot::Member(1), Seen::Completed(None))],
            now(),
        );
        assert_eq!(last.record.state, WorkflowState::Completed);
        assert_eq!(last.record.completed(), 2);
        assert_eq!(
            last.happened,
            [Happened::StepCompleted { index: 1 }, Happened::Completed]
        );
    }

    #[test]
    fn a_failed_chain_step_cancels_the_rest() {
        let rec = record(json!({"type": "chain", "steps": [job("a"), job("b"), job("c")]}));
        let a = apply(
            &rec,
            &[(Slot::Member(0), Seen::Failed(Some(json!({"code": "x"}))))],
            now(),
        );
        assert_eq!(a.record.state, WorkflowState::Failed);
        assert_eq!(a.record.status, "fxx");
        assert_eq!(a.record.failure.as_ref().unwrap().index, 0);
        assert_eq!(
            a.effects,
            [
                Effect::Cancel {
                    job_id: rec.member_id(1)
                },
                Effect::Cancel {
                    job_id: rec.member_id(2)
                }
            ]
        );
        assert_eq!(a.happened, [Happened::Failed { index: Some(0) }]);
    }

    #[test]
    fn a_group_ends_when_its_last_member_does() {
        let rec = record(json!({"type": "group", "jobs": [job("a"), job("b"), job("c")]}));
        let a = apply(
            &rec,
            &[
                (Slot::Member(1), Seen::Failed(None)),
                (Slot::Member(0), Seen::Completed(None)),
            ],
            now(),
        );
        assert_eq!(a.record.state, WorkflowState::Running);
        let b = apply(
            &a.record,
            &[(Slot::Member(2), Seen::Completed(None))],
            now(),
        );
        assert_eq!(b.record.state, WorkflowState::Failed);
        assert_eq!((b.record.completed(), b.record.failed()), (2, 1));
    }

    #[test]
    fn a_batch_fires_the_callbacks_its_outcome_calls_for_once() {
        let body = json!({"type": "batch", "jobs": [job("a"), job("b")],
            "callbacks": {"on_complete": job("c"), "on_success": job("s"), "on_failure": job("f")}});
        let rec = record(body);
        let all = [
            (Slot::Member(0), Seen::Completed(None)),
            (Slot::Member(1), Seen::Failed(None)),
        ];
        let a = apply(&rec, &all, now());
        let id = |c| rec.callback_id(c);
        assert_eq!(
            a.effects,
            [
                Effect::Activate {
                    job_id: id(Callback::OnComplete),
                    results: Results::OfMembers
                },
                Effect::Cancel {
                    job_id: id(Callback::OnSuccess)
                },
                Effect::Activate {
                    job_id: id(Callback::OnFailure),
                    results: Results::OfMembers
                },
            ]
        );
        assert!(apply(&a.record, &all, now()).effects.is_empty());
        let one = apply(
            &a.record,
            &[(Slot::Callback(Callback::OnComplete), Seen::Completed(None))],
            now(),
        );
        assert_eq!(one.record.state, WorkflowState::Running);
        let both = apply(
            &one.record,
            &[(Slot::Callback(Callback::OnFailure), Seen::Completed(None))],
            now(),
        );
        assert_eq!(both.record.state, WorkflowState::Completed);
        // Only on_success, and a member failed: nothing to wait for, the batch failed.
        let only = record(
            json!({"type": "batch", "jobs": [job("a")], "callbacks": {"on_success": job("s")}}),
        );
        let a = apply(&only, &[(Slot::Member(0), Seen::Failed(None))], now());
        assert_eq!(a.record.state, WorkflowState::Failed);
    }

    #[test]
    fn a_nested_workflow_reports_to_its_parent_which_starts_what_follows() {
        let c = laid_out(json!({"type": "chain", "steps": [
            {"type": "group", "jobs": [job("g0")]}, job("after")]}));
        let (root, child) = (&c.workflows[0].0, &c.workflows[1].0);
        let a = apply(child, &[(Slot::Member(0), Seen::Completed(None))], now());
        assert_eq!(
            a.effects,
            [Effect::Report {
                parent: ParentRef {
                    workflow_id: root.id.clone(),
                    index: 0
                },
                seen: Seen::Completed(None)
            }]
        );
        let up = apply(root, &[(Slot::Member(0), Seen::Completed(None))], now());
        assert_eq!(
            up.effects,
            [Effect::Activate {
                job_id: root.member_id(1),
                results: Results::None
            }]
        );
        // A nested workflow waiting as a later step is begun, not activated.
        let c = laid_out(
            json!({"type": "chain", "steps": [job("first"), {"type": "group", "jobs": [job("g")]}]}),
        );
        let root = &c.workflows[0].0;
        let a = apply(
            root,
            &[(Slot::Member(0), Seen::Completed(Some(vec![json!("r0")])))],
            now(),
        );
        assert_eq!(
            a.effects,
            [Effect::Begin {
                workflow_id: root.member_id(1),
                results: Some(vec![json!("r0")])
            }]
        );
        let child = &c.workflows[1].0;
        let begun = begin(child, Some(vec![json!("r0")]));
        assert_eq!(begun.record.status, "p");
        assert_eq!(begun.record.received, Some(vec![json!("r0")]));
        assert_eq!(
            begun.effects,
            [Effect::Activate {
                job_id: child.member_id(0),
                results: Results::Given(vec![json!("r0")])
            }]
        );
    }

    #[test]
    fn cancel_stops_a_running_workflow_once() {
        let rec = record(json!({"type": "chain", "steps": [job("a"), job("b")]}));
        let a = cancel(&rec, now()).unwrap();
        assert_eq!(a.record.state, WorkflowState::Cancelled);
        assert_eq!(a.record.status, "px");
        assert_eq!(a.effects.len(), 2);
        // The timer's repair after a cancel cut short repeats both cancellations.
        assert_eq!(cancellations(&a.record), a.effects);
        assert_eq!(
            cancel(&a.record, now()).unwrap_err().code,
            ErrorCode::Conflict
        );
        // A member finishing afterwards is recorded and starts nothing.
        let after = apply(
            &a.record,
            &[(Slot::Member(0), Seen::Completed(Some(vec![])))],
            now(),
        );
        assert_eq!(after.record.status, "cx");
        assert!(after.effects.is_empty());
    }
}
