//! Bulk CANCEL, RETRY and DELETE by job id (bulk-operations spec §6–§9): what a request may
//! ask for and the shape of the answer. Pure: `store/jobs/bulk.rs` runs the operation on
//! each id.

use std::collections::HashMap;

use chrono::{DateTime, TimeDelta, Utc};
use serde_json::{json, Map, Value};

use super::duration;
use super::error::{ErrorCode, OjsError};
use super::fields;
use super::job::Job;
use super::listing::ListQuery;
use super::state::JobState;
use super::time;

/// Most job ids one bulk request may name (the spec asks for at least 100, 1,000 advised).
pub const MAX_BULK_IDS: usize = 1_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BulkOp {
    Cancel,
    Retry,
    Delete,
}

impl BulkOp {
    /// The admin spec's name of the operation.
    pub fn action(self) -> &'static str {
        match self {
            BulkOp::Cancel => "cancel",
            BulkOp::Retry => "retry",
            BulkOp::Delete => "delete",
        }
    }

    /// What a job that went through became: the item's `status` and the summary's count.
    pub fn done(self) -> &'static str {
        match self {
            BulkOp::Cancel => "cancelled",
            BulkOp::Retry => "retried",
            BulkOp::Delete => "deleted",
        }
    }
}

/// The job ids a bulk request names, in order.
///
/// # Errors
/// 400 for a missing, empty or ill-typed `job_ids`, one beside a `filter`, or a bad
/// `atomicity`; 413 past `MAX_BULK_IDS`; 422 `unsupported` for `atomicity: "atomic"` (each
/// job is its own compare-and-set: no all-or-none across jobs).
pub fn job_ids(body: &Map<String, Value>) -> Result<Vec<String>, OjsError> {
    let ids = fields::array(body.get("job_ids"), "job_ids", "an array of job ids")?;
    if ids.is_some() && fields::present(body.get("filter")).is_some() {
        return Err(OjsError::invalid(
            "filter",
            "Give either job_ids or filter, not both.",
        ));
    }
    partial(body)?;
    let ids = ids.ok_or_else(|| fields::missing("job_ids", "an array of job ids"))?;
    if ids.is_empty() {
        return Err(OjsError::invalid(
            "job_ids",
            "job_ids must name at least one job.",
        ));
    }
    if ids.len() > MAX_BULK_IDS {
        return Err(OjsError::new(
            ErrorCode::EnvelopeTooLarge,
            format!(
                "Batch size {} exceeds the maximum of {MAX_BULK_IDS} job ids.",
                ids.len()
            ),
        )
        .with_detail("max_batch_size", MAX_BULK_IDS));
    }
    ids.iter()
        .map(|id| match id {
            Value::String(s) => Ok(s.clone()),
            other => Err(fields::type_error("job_ids", "an array of job ids", other)),
        })
        .collect()
}

/// `atomicity`: only `"partial"` is served.
fn partial(body: &Map<String, Value>) -> Result<(), OjsError> {
    match fields::string(body.get("atomicity"), "atomicity")? {
        None | Some("partial") => Ok(()),
        Some("atomic") => Err(OjsError::new(
            ErrorCode::Unsupported,
            "Atomic bulk cancel, retry and delete are not supported: each job changes on its own. Use \"partial\" and read the result of each item.",
        )
        .with_detail("field", "atomicity")),
        Some(other) => Err(OjsError::invalid(
            "atomicity",
            format!("atomicity must be \"partial\" or \"atomic\", got \"{}\".", fields::truncated(other)),
        )),
    }
}

/// What a bulk request of the data plane selects (bulk-operations spec §6–§8): job ids, or
/// a filter walked through the listings, at most `MAX_BULK_IDS` jobs a request.
#[derive(Debug, Clone, PartialEq)]
pub enum DataSelection {
    Ids(Vec<String>),
    Filter(Filter),
}

/// A bulk filter: one listing per state, and what a listed job must also match.
#[derive(Debug, Clone, PartialEq)]
pub struct Filter {
    pub queries: Vec<ListQuery>,
    pub enqueued_before: Option<DateTime<Utc>>,
    pub enqueued_after: Option<DateTime<Utc>>,
    /// Only jobs that finished before this: the `ojs` command line's `older_than`.
    pub finished_before: Option<DateTime<Utc>>,
}

impl Filter {
    pub fn matches(&self, job: &Job) -> bool {
        let enqueued = job.enqueued_at.unwrap_or(job.created_at);
        self.enqueued_before.is_none_or(|t| enqueued < t)
            && self.enqueued_after.is_none_or(|t| enqueued > t)
            && self
                .finished_before
                .is_none_or(|t| job.finished_at().is_some_and(|at| at < t))
    }
}

impl BulkOp {
    /// The states a filter without `state` selects: those the operation applies to.
    fn default_states(self) -> &'static [JobState] {
        match self {
            BulkOp::Cancel => &[JobState::Available, JobState::Scheduled],
            BulkOp::Retry => &[JobState::Discarded, JobState::Retryable],
            BulkOp::Delete => &[
                JobState::Completed,
                JobState::Cancelled,
                JobState::Discarded,
            ],
        }
    }
}

/// # Errors
/// What `job_ids` refuses; for a filter, 400 naming a field that is ill-typed, unknown or
/// beside `job_ids`, and 422 `unsupported` for `priority` and `meta` (no index to select by).
pub fn data_selection(
    body: &Map<String, Value>,
    op: BulkOp,
    now: DateTime<Utc>,
) -> Result<DataSelection, OjsError> {
    let Some(filter) = fields::present(body.get("filter")) else {
        return job_ids(body).map(DataSelection::Ids);
    };
    if fields::present(body.get("job_ids")).is_some() {
        return Err(OjsError::invalid(
            "filter",
            "Give either job_ids or filter, not both.",
        ));
    }
    partial(body)?;
    let Value::Object(filter) = filter else {
        return Err(fields::type_error("filter", "an object", filter));
    };
    let mut params = HashMap::new();
    let mut states = Vec::new();
    let mut selected = Filter {
        queries: Vec::new(),
        enqueued_before: None,
        enqueued_after: None,
        finished_before: None,
    };
    for (key, value) in filter {
        match (key.as_str(), value) {
            (_, Value::Null) => {}
            ("queue" | "type", Value::String(v)) => {
                params.insert(key.clone(), v.clone());
            }
            ("state", Value::String(v)) => states.push(v.as_str()),
            ("state", Value::Array(vs)) => {
                for v in vs {
                    states.push(v.as_str().ok_or_else(|| {
                        fields::type_error("state", "a state or an array of states", v)
                    })?);
                }
            }
            ("enqueued_before" | "enqueued_after", Value::String(v)) => {
                let at = time::parse(v).ok_or_else(|| {
                    OjsError::invalid(
                        key,
                        format!("{key} must be an RFC 3339 time, got {:?}.", fields::truncated(v)),
                    )
                })?;
                if key == "enqueued_before" {
                    selected.enqueued_before = Some(at);
                } else {
                    selected.enqueued_after = Some(at);
                }
            }
            ("older_than", Value::String(v)) => {
                selected.finished_before = Some(finished_before(v, now)?);
            }
            ("priority" | "meta", _) => {
                return Err(OjsError::new(
                    ErrorCode::Unsupported,
                    format!("Selecting jobs by {key} is not supported: filter by queue, type, state and times."),
                )
                .with_detail("field", format!("filter.{key}")))
            }
            ("queue" | "type" | "state" | "enqueued_before" | "enqueued_after" | "older_than", other) => {
                return Err(fields::type_error(key, "a string", other))
            }
            (other, _) => {
                return Err(OjsError::invalid(
                    "filter",
                    format!("Unknown filter field {:?}: filter by queue, type, state, enqueued_before, enqueued_after and older_than.", fields::truncated(other)),
                ))
            }
        }
    }
    let states: Vec<JobState> = if states.is_empty() {
        op.default_states().to_vec()
    } else {
        states
            .into_iter()
            .map(|s| {
                JobState::parse(s).ok_or_else(|| {
                    OjsError::invalid(
                        "state",
                        format!("Unknown state {:?}.", fields::truncated(s)),
                    )
                })
            })
            .collect::<Result<_, _>>()?
    };
    let q = ListQuery::parse(&params)?;
    selected.queries = states
        .into_iter()
        .map(|state| ListQuery::of(q.queue.clone(), Some(state), q.job_type.clone()))
        .collect();
    Ok(DataSelection::Filter(selected))
}

/// The time before which `older_than`, an age (`7d`, `12h`, `P1D`; the `ojs` command
/// line's form), selects finished jobs.
///
/// # Errors
/// 400 naming `older_than` for text that is not an age of at most a century.
pub fn finished_before(older_than: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, OjsError> {
    duration::age(older_than)
        .and_then(|age| TimeDelta::from_std(age).ok())
        .and_then(|age| now.checked_sub_signed(age))
        .ok_or_else(|| {
            OjsError::invalid(
                "older_than",
                format!(
                    "older_than must be a duration such as 7d, 12h or P1D, got {:?}.",
                    fields::truncated(older_than)
                ),
            )
        })
}

/// The answer to a bulk request: 200 when every job went through, 422 when none did, 207
/// otherwise; a job whose state does not allow the operation (409) is `skipped` with the
/// reason, any other error `failed` with the error.
pub fn answer(op: BulkOp, ids: &[String], results: &[Result<(), OjsError>]) -> (u16, Value) {
    let (mut done, mut skipped, mut failed) = (0, 0, 0);
    let items: Vec<Value> = ids
        .iter()
        .zip(results)
        .enumerate()
        .map(|(index, (id, result))| match result {
            Ok(()) => {
                done += 1;
                json!({"index": index, "job_id": id, "status": op.done()})
            }
            Err(err) if err.code == ErrorCode::Conflict => {
                skipped += 1;
                json!({"index": index, "job_id": id, "status": "skipped", "reason": err.message})
            }
            Err(err) => {
                failed += 1;
                json!({"index": index, "job_id": id, "status": "failed",
                    "error": {"code": err.code.as_str(), "message": err.message, "retryable": err.code.retryable()}})
            }
        })
        .collect();
    let status = match done {
        d if d == ids.len() => 200,
        0 => 422,
        _ => 207,
    };
    let mut body = json!({
        "total": ids.len(),
        "total_matched": ids.len(),
        "skipped": skipped,
        "failed": failed,
        "items": items,
    });
    body[op.done()] = json!(done);
    if let (422, Some(Err(first))) = (status, results.first()) {
        // Clients read a failed request's reason under `error` (errors spec §3).
        body["error"] = json!({
            "code": first.code.as_str(),
            "message": format!("No job was {}: each item says why (the first: {}).", op.done(), first.message),
        });
    }
    (status, body)
}

/// Admin spec §4: a destructive admin request must carry `confirm: true`.
///
/// # Errors
/// 400 naming `confirm` otherwise.
pub fn confirmed(body: &Map<String, Value>) -> Result<(), OjsError> {
    match body.get("confirm") {
        Some(Value::Bool(true)) => Ok(()),
        _ => Err(OjsError::invalid(
            "confirm",
            "This request changes or removes jobs for good: send \"confirm\": true.",
        )),
    }
}

/// What an admin bulk request selects (admin spec §8): job ids, or a `filter` of queue,
/// state and type, run over at most `MAX_BULK_IDS` jobs a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Selection {
    Ids(Vec<String>),
    Filter(ListQuery),
}

/// # Errors
/// 400 for a missing `confirm: true`, for both or neither of `job_ids` and `filter`, or for
/// a filter field the listing refuses; 413 past `MAX_BULK_IDS` ids.
pub fn selection(body: &Map<String, Value>) -> Result<Selection, OjsError> {
    confirmed(body)?;
    let Some(filter) = fields::present(body.get("filter")) else {
        return job_ids(body).map(Selection::Ids);
    };
    if fields::present(body.get("job_ids")).is_some() {
        return Err(OjsError::invalid(
            "filter",
            "Give either job_ids or filter, not both.",
        ));
    }
    let Value::Object(filter) = filter else {
        return Err(fields::type_error("filter", "an object", filter));
    };
    let mut params = HashMap::new();
    for key in ["queue", "state", "type"] {
        match filter.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::String(v)) => {
                params.insert(key.to_owned(), v.clone());
            }
            Some(other) => return Err(fields::type_error(key, "a string", other)),
        }
    }
    if params.is_empty() {
        return Err(OjsError::invalid(
            "filter",
            "A filter names at least one of queue, state and type.",
        ));
    }
    let q = ListQuery::parse(&params)?;
    Ok(Selection::Filter(ListQuery::of(
        q.queue, q.state, q.job_type,
    )))
}

/// The admin answer (admin spec §8.1): how many jobs were matched, went through or not,
/// and why each one did not.
pub fn admin_answer(op: BulkOp, ids: &[String], results: &[Result<(), OjsError>]) -> Value {
    let errors: Vec<Value> = ids
        .iter()
        .zip(results)
        .filter_map(|(id, r)| {
            r.as_ref()
                .err()
                .map(|err| json!({"job_id": id, "error": err.message, "code": err.code.as_str()}))
        })
        .collect();
    json!({
        "action": op.action(),
        "matched": ids.len(),
        "succeeded": ids.len() - errors.len(),
        "failed": errors.len(),
        "errors": errors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn admin_selections_need_confirmation_and_one_of_ids_or_a_filter() {
        use crate::domain::state::JobState;
        let field = |v: Value| {
            let err = selection(&body(v)).unwrap_err();
            err.details
                .get("field")
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        assert_eq!(field(json!({"job_ids": ["a"]})).as_deref(), Some("confirm"));
        assert_eq!(
            field(json!({"job_ids": ["a"], "confirm": "yes"})).as_deref(),
            Some("confirm")
        );
        assert_eq!(
            field(json!({"confirm": true, "filter": {}})).as_deref(),
            Some("filter")
        );
        assert_eq!(
            field(json!({"confirm": true, "filter": {"state": "done"}})).as_deref(),
            Some("state")
        );
        assert_eq!(
            field(json!({"confirm": true, "filter": {"queue": 3}})).as_deref(),
            Some("queue")
        );
        assert_eq!(
            field(json!({"confirm": true, "filter": {"state": "discarded"}, "job_ids": ["a"]}))
                .as_deref(),
            Some("filter")
        );
        assert_eq!(
            selection(&body(json!({"confirm": true, "job_ids": ["a", "b"]}))).unwrap(),
            Selection::Ids(vec!["a".into(), "b".into()])
        );
        let Selection::Filter(q) = selection(&body(
            json!({"confirm": true, "filter": {"queue": "email", "state": "discarded", "type": "email.send"}}),
        ))
        .unwrap() else {
            panic!("a filter selects by filter")
        };
        assert_eq!(q.queue.as_deref(), Some("email"));
        assert_eq!(q.state, Some(JobState::Discarded));
        assert_eq!(q.job_type.as_deref(), Some("email.send"));
    }

    #[test]
    fn the_admin_answer_counts_and_explains_each_failure() {
        let ids = vec!["a".to_owned(), "b".to_owned()];
        let results = vec![Ok(()), Err(OjsError::not_found("job", "b"))];
        let answer = admin_answer(BulkOp::Retry, &ids, &results);
        assert_eq!(answer["action"], "retry");
        assert_eq!(
            (
                answer["matched"].as_u64(),
                answer["succeeded"].as_u64(),
                answer["failed"].as_u64()
            ),
            (Some(2), Some(1), Some(1))
        );
        assert_eq!(answer["errors"][0]["job_id"], "b");
        assert_eq!(answer["errors"][0]["code"], "not_found");
    }

    fn body(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn job_ids_are_read_in_order_within_the_cap() {
        let ids = job_ids(&body(json!({"job_ids": ["a", "b", "a"]}))).unwrap();
        assert_eq!(ids, ["a", "b", "a"]);
        assert!(job_ids(&body(json!({"job_ids": ["a"], "atomicity": "partial"}))).is_ok());
        let many: Vec<String> = (0..MAX_BULK_IDS).map(|i| i.to_string()).collect();
        assert!(job_ids(&body(json!({ "job_ids": many }))).is_ok());
    }

    #[test]
    fn bad_requests_are_refused_with_the_field_named() {
        let code = |v: Value| job_ids(&body(v)).unwrap_err().code;
        assert_eq!(code(json!({})), ErrorCode::InvalidRequest);
        assert_eq!(code(json!({"job_ids": []})), ErrorCode::InvalidRequest);
        assert_eq!(code(json!({"job_ids": "a"})), ErrorCode::InvalidRequest);
        assert_eq!(
            code(json!({"job_ids": ["a", 1]})),
            ErrorCode::InvalidRequest
        );
        assert_eq!(
            code(json!({"job_ids": ["a"], "atomicity": "some"})),
            ErrorCode::InvalidRequest
        );
        assert_eq!(
            code(json!({"job_ids": ["a"], "filter": {"queue": "q"}})),
            ErrorCode::InvalidRequest
        );
        let over: Vec<String> = (0..=MAX_BULK_IDS).map(|i| i.to_string()).collect();
        let err = job_ids(&body(json!({ "job_ids": over }))).unwrap_err();
        assert_eq!(err.code, ErrorCode::EnvelopeTooLarge);
        assert_eq!(err.details["max_batch_size"], MAX_BULK_IDS);
    }

    #[test]
    fn atomic_mode_and_filters_by_priority_or_meta_are_refused_as_unsupported() {
        let now = Utc::now();
        let code = |v: Value| {
            data_selection(&body(v), BulkOp::Cancel, now)
                .unwrap_err()
                .code
        };
        assert_eq!(
            code(json!({"job_ids": ["a"], "atomicity": "atomic"})),
            ErrorCode::Unsupported
        );
        assert_eq!(
            code(json!({"filter": {"queue": "q"}, "atomicity": "atomic"})),
            ErrorCode::Unsupported
        );
        assert_eq!(
            code(json!({"filter": {"priority": 3}})),
            ErrorCode::Unsupported
        );
        assert_eq!(
            code(json!({"filter": {"meta": {}}})),
            ErrorCode::Unsupported
        );
        for bad in [
            json!({"filter": {"queue": 1}}),
            json!({"filter": {"state": "done"}}),
            json!({"filter": {"state": [1]}}),
            json!({"filter": {"colour": "red"}}),
            json!({"filter": {"older_than": "soon"}}),
            json!({"filter": {"enqueued_before": "yesterday"}}),
            json!({"filter": "q"}),
            json!({"filter": {}, "job_ids": ["a"]}),
        ] {
            assert_eq!(code(bad.clone()), ErrorCode::InvalidRequest, "{bad}");
        }
    }

    #[test]
    fn a_filter_walks_each_state_and_matches_times() {
        use crate::domain::fixtures::record;
        let now = Utc::now();
        let DataSelection::Filter(f) = data_selection(
            &body(json!({"filter": {"queue": "q", "older_than": "7d"}})),
            BulkOp::Delete,
            now,
        )
        .unwrap() else {
            panic!("a filter");
        };
        let states: Vec<_> = f.queries.iter().map(|q| q.state).collect();
        assert_eq!(
            states,
            [
                JobState::Completed,
                JobState::Cancelled,
                JobState::Discarded
            ]
            .map(Some)
        );
        assert!(f.queries.iter().all(|q| q.queue.as_deref() == Some("q")));
        let mut job = record(json!({})).job;
        job.state = JobState::Completed;
        job.completed_at = Some(now - TimeDelta::days(8));
        assert!(f.matches(&job));
        job.completed_at = Some(now - TimeDelta::days(6));
        assert!(!f.matches(&job));
        let DataSelection::Filter(f) = data_selection(
            &body(json!({"filter": {"state": "retryable"}})),
            BulkOp::Retry,
            now,
        )
        .unwrap() else {
            panic!("a filter");
        };
        assert_eq!(f.queries.len(), 1);
        assert_eq!(f.queries[0].state, Some(JobState::Retryable));
    }

    #[test]
    fn the_answer_names_each_item_and_its_status_follows_the_outcomes() {
        let ids = vec!["a".to_string(), "b".to_string(), "c".to_string()];
        let conflict = OjsError::new(ErrorCode::Conflict, "Job 'b' is active.");
        let missing = OjsError::not_found("job", "c");
        let (status, body) = answer(BulkOp::Cancel, &ids, &[Ok(()), Err(conflict), Err(missing)]);
        assert_eq!(status, 207);
        assert_eq!(body["total"], 3);
        assert_eq!(body["cancelled"], 1);
        assert_eq!(body["skipped"], 1);
        assert_eq!(body["failed"], 1);
        assert_eq!(
            body["items"][0],
            json!({"index": 0, "job_id": "a", "status": "cancelled"})
        );
        assert_eq!(body["items"][1]["status"], "skipped");
        assert_eq!(body["items"][1]["reason"], "Job 'b' is active.");
        assert_eq!(body["items"][2]["status"], "failed");
        assert_eq!(body["items"][2]["error"]["code"], "not_found");

        let two = &ids[..2];
        assert_eq!(answer(BulkOp::Retry, two, &[Ok(()), Ok(())]).0, 200);
        assert_eq!(
            answer(BulkOp::Retry, two, &[Ok(()), Ok(())]).1["retried"],
            2
        );
        let refused = || Err(OjsError::new(ErrorCode::Conflict, "no"));
        assert_eq!(answer(BulkOp::Delete, two, &[refused(), refused()]).0, 422);
    }
}
