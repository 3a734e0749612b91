//! What a creation request asks for (workflows spec §11.1, http-api §4.12): the typed form
//! (`chain`, `group`, `batch` with nested members) and the step-graph form, read into one
//! checked tree.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::record::{Kind, MAX_DEPTH, MAX_JOBS};
use crate::domain::envelope;
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::fields;
use crate::domain::job::Callback;

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

pub(super) fn invalid(path: &str, message: impl Into<String>) -> OjsError {
    let message = message.into();
    OjsError::new(ErrorCode::InvalidRequest, message.clone()).with_detail(
        "validation_errors",
        serde_json::json!([{"path": path, "message": message}]),
    )
}

/// Reads a creation request in either form clients send: typed (`{"type":"chain",
/// "steps":[…]}`, `{"type":"group"|"batch","jobs":[…],"callbacks":{…}}`, members that are
/// themselves typed workflows) or step-graph (`{"name","steps":[{"id","type","args",
/// "depends_on":[…],"options"}]}`, batch callbacks as steps with `options.callback_type` or
/// named `on-complete`, `on-success`, `on-failure` after every other step). A top-level
/// `options` holds defaults for every job's options (the Rust client's workflow options);
/// a job's own keys win.
///
/// # Errors
/// 400 naming the first problem (`details.validation_errors`).
pub fn parse(body: Value) -> Result<Request, OjsError> {
    let Value::Object(obj) = body else {
        return Err(invalid("$", "A workflow must be a JSON object."));
    };
    let defaults = match fields::present(obj.get("options")) {
        None => None,
        Some(Value::Object(defaults)) => Some(defaults),
        Some(_) => return Err(invalid("$.options", "options must be an object.")),
    };
    let mut request = if obj.contains_key("type") {
        parse_typed(&obj, "$", 1)?
    } else {
        parse_graph(&obj)?
    };
    let jobs = request.jobs();
    if jobs > MAX_JOBS {
        return Err(too_many(jobs));
    }
    if let Some(defaults) = defaults {
        // Copied into every job: bounded in all, so a request cannot grow by its job count.
        let copied = serde_json::to_vec(defaults).map_or(0, |b| b.len()) * request.envelopes();
        if copied > MAX_DEFAULTS_COPIED {
            return Err(invalid(
                "$.options",
                format!(
                    "options are copied into each of the workflow's {} jobs and callbacks: {copied} bytes in all, at most {MAX_DEFAULTS_COPIED}.",
                    request.envelopes()
                ),
            ));
        }
        request.default_options(defaults);
    }
    Ok(request)
}

/// Most bytes a workflow's top-level `options` may add to its jobs in all (the default
/// request body limit).
const MAX_DEFAULTS_COPIED: usize = 16 << 20;

/// Refused before anything of the workflow is looked at further (also as soon as one list
/// alone is too long).
fn too_many(jobs: usize) -> OjsError {
    invalid(
        "$",
        format!("A workflow may hold at most {MAX_JOBS} jobs; this one has {jobs}."),
    )
}

impl Request {
    /// Gives every job of the tree, callbacks too, the `defaults` its options lack.
    fn default_options(&mut self, defaults: &Map<String, Value>) {
        let jobs = self.members.iter_mut().filter_map(|m| match &mut m.what {
            Member::Job(job) => Some(job),
            Member::Workflow(inner) => {
                inner.default_options(defaults);
                None
            }
        });
        for job in jobs.chain(self.callbacks.iter_mut().map(|(_, job)| job)) {
            let Value::Object(job) = job else { continue };
            let options = job
                .entry("options")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(options) = options {
                for (key, value) in defaults {
                    options.entry(key.clone()).or_insert_with(|| value.clone());
                }
            }
        }
    }

    /// Job envelopes in the tree, callbacks included.
    fn envelopes(&self) -> usize {
        self.callbacks.len()
            + self
                .members
                .iter()
                .map(|m| match &m.what {
                    Member::Job(_) => 1,
                    Member::Workflow(w) => w.envelopes(),
                })
                .sum::<usize>()
    }

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
    // Steps named for a callback without `callback_type` (the Rust client's batch): a
    // callback if they depend on exactly every other step, else plain steps.
    let mut named: Vec<(Callback, Step)> = Vec::new();
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
            None => {
                let step = Step {
                    id,
                    depends_on,
                    spec: Value::Object(spec),
                };
                match Callback::parse(&step.id.replace('-', "_")) {
                    Some(callback) if !step.depends_on.is_empty() => {
                        named.push((callback, step));
                    }
                    _ => plain.push(step),
                }
            }
        }
    }
    let plain_ids: std::collections::HashSet<&str> = plain.iter().map(|s| s.id.as_str()).collect();
    let mut named_plain = Vec::new();
    for (callback, step) in named {
        let after: std::collections::HashSet<&str> =
            step.depends_on.iter().map(String::as_str).collect();
        if after == plain_ids {
            callbacks.push((callback, step.spec));
        } else {
            named_plain.push(step);
        }
    }
    plain.extend(named_plain);
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
