//! Protobuf messages to and from the JSON the HTTP binding carries (gRPC binding §12.2).
//! A request becomes the JSON object the HTTP binding would have received, so one parser
//! holds the rules and limits of both protocols; a stored job becomes a `Job` message.

use chrono::{DateTime, Utc};
use prost_types::value::Kind;
use serde_json::{json, Map, Number, Value};

use super::pb;
use crate::domain::duration;
use crate::domain::envelope::{check_depth, MAX_JSON_DEPTH};
use crate::domain::error::OjsError;
use crate::domain::job::{Job, JobError};
use crate::domain::state::JobState;
use crate::domain::time;

/// A `google.protobuf.Value` as JSON. A whole number within ±2^53 becomes a JSON integer,
/// as a JSON client would have sent it (`[1]`, not `[1.0]`): unique keys and echoed
/// arguments then read the same over both protocols.
///
/// # Errors
/// 400 for a value nested deeper than the HTTP binding allows, or a number that is not
/// finite (JSON has none).
pub fn json_of(value: prost_types::Value) -> Result<Value, OjsError> {
    let json = plain(value, 0)?;
    check_depth(&json)?;
    Ok(json)
}

fn plain(value: prost_types::Value, depth: usize) -> Result<Value, OjsError> {
    if depth > MAX_JSON_DEPTH {
        return Err(OjsError::invalid(
            "args",
            format!("Values nest arrays and objects deeper than {MAX_JSON_DEPTH} levels."),
        ));
    }
    Ok(match value.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => Value::Bool(b),
        Some(Kind::StringValue(s)) => Value::String(s),
        Some(Kind::NumberValue(n)) => number(n)?,
        Some(Kind::ListValue(list)) => Value::Array(
            list.values
                .into_iter()
                .map(|v| plain(v, depth + 1))
                .collect::<Result<_, _>>()?,
        ),
        Some(Kind::StructValue(s)) => Value::Object(fields_of(s, depth + 1)?),
    })
}

/// The largest whole number a double holds exactly.
const EXACT: f64 = 9_007_199_254_740_992.0;

fn number(n: f64) -> Result<Value, OjsError> {
    if n.fract() == 0.0 && n.abs() <= EXACT {
        return Ok(json!(n as i64));
    }
    Number::from_f64(n).map(Value::Number).ok_or_else(|| {
        OjsError::invalid(
            "args",
            "A number must be finite (JSON has no NaN or infinity).",
        )
    })
}

fn fields_of(s: prost_types::Struct, depth: usize) -> Result<Map<String, Value>, OjsError> {
    s.fields
        .into_iter()
        .map(|(k, v)| Ok((k, plain(v, depth)?)))
        .collect()
}

/// A `google.protobuf.Struct` as a JSON object.
///
/// # Errors
/// As [`json_of`].
pub fn object_of(s: prost_types::Struct) -> Result<Map<String, Value>, OjsError> {
    let object = fields_of(s, 1)?;
    check_depth(&Value::Object(object.clone()))?;
    Ok(object)
}

/// JSON as a `google.protobuf.Value`.
pub fn value(json: &Value) -> prost_types::Value {
    let kind = match json {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(items) => Kind::ListValue(prost_types::ListValue {
            values: items.iter().map(value).collect(),
        }),
        Value::Object(o) => Kind::StructValue(structure(o)),
    };
    prost_types::Value { kind: Some(kind) }
}

/// A JSON object as a `google.protobuf.Struct`.
pub fn structure(object: &Map<String, Value>) -> prost_types::Struct {
    prost_types::Struct {
        fields: object.iter().map(|(k, v)| (k.clone(), value(v))).collect(),
    }
}

/// A JSON value as a `Struct`: an object as itself, anything else under `value`.
fn structure_of(json: &Value) -> prost_types::Struct {
    match json {
        Value::Object(o) => structure(o),
        other => structure(&Map::from_iter([("value".to_owned(), other.clone())])),
    }
}

pub fn timestamp(at: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: at.timestamp(),
        nanos: at.timestamp_subsec_nanos() as i32,
    }
}

/// A `Timestamp` as RFC 3339 text, the form the JSON binding reads.
///
/// # Errors
/// 400 naming `field` for a time outside what a timestamp may hold.
pub fn rfc3339(at: &prost_types::Timestamp, field: &str) -> Result<String, OjsError> {
    DateTime::from_timestamp(at.seconds, u32::try_from(at.nanos).unwrap_or(u32::MAX))
        .map(time::format)
        .ok_or_else(|| OjsError::invalid(field, format!("{field} is not a valid timestamp.")))
}

/// A `Duration` in whole milliseconds.
///
/// # Errors
/// 400 naming `field` for a negative or unrepresentable duration.
pub fn millis(d: &prost_types::Duration, field: &str) -> Result<u64, OjsError> {
    let valid = d.seconds >= 0 && d.nanos >= 0 && d.nanos < 1_000_000_000;
    let ms = u64::try_from(d.seconds)
        .ok()
        .filter(|_| valid)
        .and_then(|s| s.checked_mul(1000))
        .and_then(|ms| ms.checked_add(d.nanos as u64 / 1_000_000));
    ms.ok_or_else(|| OjsError::invalid(field, format!("{field} must be a non-negative duration.")))
}

pub fn duration_of_millis(ms: u64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: (ms / 1000) as i64,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

fn iso(d: &prost_types::Duration, field: &str) -> Result<Value, OjsError> {
    let ms = millis(d, field)?;
    Ok(json!(duration::format_iso(
        std::time::Duration::from_millis(ms)
    )))
}

/// A job's `type`, `args` and `options` as the JSON envelope PUSH reads. Proto3 cannot
/// tell a zero from an absent scalar, so zeros and empty strings are left out (the
/// defaults apply): a priority of 0 is the default anyway.
///
/// # Errors
/// 400 for arguments or metadata the JSON binding would refuse to read.
pub fn envelope(
    job_type: String,
    args: Vec<prost_types::Value>,
    options: Option<pb::EnqueueOptions>,
    now: DateTime<Utc>,
) -> Result<Map<String, Value>, OjsError> {
    let args = args
        .into_iter()
        .map(json_of)
        .collect::<Result<Vec<_>, _>>()?;
    let mut job = Map::from_iter([
        ("type".to_owned(), json!(job_type)),
        ("args".to_owned(), Value::Array(args)),
    ]);
    if let Some(o) = options {
        let mut meta = match o.meta.clone() {
            Some(meta) => object_of(meta)?,
            None => Map::new(),
        };
        if !o.trace_id.is_empty() {
            meta.insert("trace_id".into(), json!(o.trace_id));
        }
        if !meta.is_empty() {
            job.insert("meta".into(), Value::Object(meta));
        }
        job.insert("options".into(), Value::Object(options_of(o, now)?));
    }
    Ok(job)
}

/// `EnqueueOptions` as the JSON options object (without `meta`, which is the job's).
///
/// # Errors
/// 400 for a field that cannot be a valid option.
pub fn options_of(
    o: pb::EnqueueOptions,
    now: DateTime<Utc>,
) -> Result<Map<String, Value>, OjsError> {
    let mut out = Map::new();
    if !o.queue.is_empty() {
        out.insert("queue".into(), json!(o.queue));
    }
    if o.priority != 0 {
        out.insert("priority".into(), json!(o.priority));
    }
    if let Some(at) = &o.delay_until {
        out.insert(
            "scheduled_at".into(),
            json!(rfc3339(at, "options.delay_until")?),
        );
    }
    if let Some(t) = &o.timeout {
        out.insert("timeout_ms".into(), json!(millis(t, "options.timeout")?));
    }
    if let Some(v) = &o.visibility_timeout {
        out.insert(
            "visibility_timeout_ms".into(),
            json!(millis(v, "options.visibility_timeout")?),
        );
    }
    if let Some(ttl) = &o.ttl {
        let ms = millis(ttl, "options.ttl")?;
        let at = time::add(now, std::time::Duration::from_millis(ms));
        out.insert("expires_at".into(), json!(time::format(at)));
    }
    if let Some(retry) = &o.retry {
        out.insert("retry".into(), retry_of(retry)?);
    }
    if o.max_attempts != 0 {
        out.insert("max_attempts".into(), json!(o.max_attempts));
    }
    if let Some(unique) = &o.unique {
        out.insert("unique".into(), unique_of(unique)?);
    }
    if !o.tags.is_empty() {
        out.insert("tags".into(), json!(o.tags));
    }
    if o.pending {
        out.insert("pending".into(), json!(true));
    }
    Ok(out)
}

fn retry_of(r: &pb::RetryPolicy) -> Result<Value, OjsError> {
    let mut out = Map::new();
    if r.max_attempts != 0 {
        out.insert("max_attempts".into(), json!(r.max_attempts));
    }
    if let Some(d) = &r.initial_interval {
        out.insert("initial_interval".into(), iso(d, "retry.initial_interval")?);
    }
    if r.backoff_coefficient != 0.0 {
        out.insert("backoff_coefficient".into(), number(r.backoff_coefficient)?);
    }
    if let Some(d) = &r.max_interval {
        out.insert("max_interval".into(), iso(d, "retry.max_interval")?);
    }
    out.insert("jitter".into(), json!(r.jitter));
    if !r.non_retryable_errors.is_empty() {
        out.insert("non_retryable_errors".into(), json!(r.non_retryable_errors));
    }
    Ok(Value::Object(out))
}

fn unique_of(u: &pb::UniquePolicy) -> Result<Value, OjsError> {
    let mut out = Map::new();
    if !u.key.is_empty() {
        out.insert("keys".into(), json!(u.key));
    }
    if let Some(d) = &u.period {
        out.insert("period".into(), iso(d, "unique.period")?);
    }
    let on_conflict = match pb::UniqueConflictAction::try_from(u.on_conflict) {
        Ok(pb::UniqueConflictAction::Unspecified) => None,
        Ok(pb::UniqueConflictAction::Reject) => Some("reject"),
        Ok(pb::UniqueConflictAction::Replace) => Some("replace"),
        Ok(pb::UniqueConflictAction::Ignore) => Some("ignore"),
        Err(_) => {
            return Err(OjsError::invalid(
                "unique.on_conflict",
                format!(
                    "unique.on_conflict {} is no conflict action.",
                    u.on_conflict
                ),
            ))
        }
    };
    if let Some(action) = on_conflict {
        out.insert("on_conflict".into(), json!(action));
    }
    if !u.states.is_empty() {
        let states = u
            .states
            .iter()
            .map(|s| state_of(*s, "unique.states"))
            .collect::<Result<Vec<_>, _>>()?;
        out.insert(
            "states".into(),
            json!(states.iter().map(|s| s.as_str()).collect::<Vec<_>>()),
        );
    }
    Ok(Value::Object(out))
}

/// A `JobState` number as a state.
///
/// # Errors
/// 400 naming `field` for 0 or a number no state has.
pub fn state_of(n: i32, field: &str) -> Result<JobState, OjsError> {
    let state = match pb::JobState::try_from(n) {
        Ok(pb::JobState::Scheduled) => JobState::Scheduled,
        Ok(pb::JobState::Available) => JobState::Available,
        Ok(pb::JobState::Pending) => JobState::Pending,
        Ok(pb::JobState::Active) => JobState::Active,
        Ok(pb::JobState::Completed) => JobState::Completed,
        Ok(pb::JobState::Retryable) => JobState::Retryable,
        Ok(pb::JobState::Cancelled) => JobState::Cancelled,
        Ok(pb::JobState::Discarded) => JobState::Discarded,
        Ok(pb::JobState::Unspecified) | Err(_) => {
            return Err(OjsError::invalid(
                field,
                format!("{field}: {n} is no job state."),
            ))
        }
    };
    Ok(state)
}

pub fn state(s: JobState) -> pb::JobState {
    match s {
        JobState::Scheduled => pb::JobState::Scheduled,
        JobState::Available => pb::JobState::Available,
        JobState::Pending => pb::JobState::Pending,
        JobState::Active => pb::JobState::Active,
        JobState::Completed => pb::JobState::Completed,
        JobState::Retryable => pb::JobState::Retryable,
        JobState::Cancelled => pb::JobState::Cancelled,
        JobState::Discarded => pb::JobState::Discarded,
    }
}

/// A stored job as the binding's `Job` message. What the message has no field for (a
/// rate limit, progress, the trace context) stays readable through `GetJob` over HTTP.
pub fn job(j: &Job) -> pb::Job {
    let at = |t: Option<DateTime<Utc>>| t.map(timestamp);
    let text_time = |t: Option<&String>| t.and_then(|s| time::parse(s)).map(timestamp);
    let finished = j.completed_at.or(j.cancelled_at).or(j.discarded_at);
    pb::Job {
        id: j.id.clone(),
        r#type: j.job_type.clone(),
        queue: j.queue.clone(),
        args: j.args.iter().map(value).collect(),
        meta: Some(structure(&j.meta)),
        state: state(j.state) as i32,
        priority: j.priority,
        attempt: j.attempt as i32,
        max_attempts: j.max_attempts as i32,
        retry_policy: Some(pb::RetryPolicy {
            max_attempts: j.retry.max_attempts as i32,
            initial_interval: Some(duration_of_millis(
                j.retry.initial_interval.as_millis() as u64
            )),
            backoff_coefficient: j.retry.backoff_coefficient,
            max_interval: Some(duration_of_millis(j.retry.max_interval.as_millis() as u64)),
            jitter: j.retry.jitter,
            non_retryable_errors: j.retry.non_retryable_errors.clone(),
        }),
        unique_policy: None,
        result: j.result.as_ref().map(structure_of),
        errors: errors(j),
        created_at: Some(timestamp(j.created_at)),
        enqueued_at: at(j.enqueued_at),
        scheduled_at: text_time(j.scheduled_at.as_ref()),
        started_at: at(j.started_at),
        completed_at: at(finished),
        expires_at: text_time(j.expires_at.as_ref()),
        timeout: j.timeout_ms.map(duration_of_millis),
        visibility_timeout: j.visibility_timeout_ms.map(duration_of_millis),
        tags: j.tags.clone().unwrap_or_default(),
        trace_id: j
            .meta
            .get("trace_id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        workflow_id: j.workflow_id.clone().unwrap_or_default(),
    }
}

/// Every failed attempt's error, oldest first, the latest included once.
fn errors(j: &Job) -> Vec<pb::JobError> {
    let mut all: Vec<&JobError> = j.errors.iter().collect();
    if let Some(last) = &j.error {
        if !all.iter().any(|e| e.attempt == last.attempt) {
            all.push(last);
        }
    }
    all.into_iter().map(job_error).collect()
}

fn job_error(e: &JobError) -> pb::JobError {
    let backtrace = match &e.backtrace {
        Some(Value::Array(lines)) => lines
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join("\n"),
        Some(Value::String(s)) => s.clone(),
        _ => String::new(),
    };
    pb::JobError {
        code: e.code.clone(),
        message: e.message.clone(),
        retryable: e.retryable,
        attempt: e.attempt as i32,
        occurred_at: Some(timestamp(e.occurred_at)),
        backtrace,
        details: e.details.as_ref().map(structure_of),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn number_value(n: f64) -> prost_types::Value {
        prost_types::Value {
            kind: Some(Kind::NumberValue(n)),
        }
    }

    #[test]
    fn whole_numbers_come_back_as_json_integers_and_others_as_they_are() {
        assert_eq!(json_of(number_value(1.0)).unwrap(), json!(1));
        assert_eq!(json_of(number_value(-3.0)).unwrap(), json!(-3));
        assert_eq!(json_of(number_value(2.5)).unwrap(), json!(2.5));
        assert_eq!(json_of(number_value(1e300)).unwrap(), json!(1e300));
        assert!(json_of(number_value(f64::NAN)).is_err());
        assert!(json_of(number_value(f64::INFINITY)).is_err());
    }

    #[test]
    fn json_survives_the_round_trip_through_protobuf_values() {
        let json = json!({"to": "a@b.c", "n": [1, 2.5, null, true, {"x": "y"}]});
        assert_eq!(json_of(value(&json)).unwrap(), json);
    }

    #[test]
    fn values_nested_past_the_limit_are_refused() {
        let mut v = json!(1);
        for _ in 0..MAX_JSON_DEPTH + 2 {
            v = json!([v]);
        }
        assert!(json_of(value(&v)).is_err());
    }

    #[test]
    fn durations_are_whole_non_negative_milliseconds() {
        let d = |seconds, nanos| prost_types::Duration { seconds, nanos };
        assert_eq!(millis(&d(1, 500_000_000), "t").unwrap(), 1500);
        assert!(millis(&d(-1, 0), "t").is_err());
        assert!(millis(&d(0, -5), "t").is_err());
        assert!(millis(&d(i64::MAX, 0), "t").is_err());
        assert_eq!(duration_of_millis(1500), d(1, 500_000_000));
    }

    #[test]
    fn options_become_the_json_options_push_reads() {
        let now = Utc::now();
        let o = pb::EnqueueOptions {
            queue: "mail".into(),
            priority: 5,
            max_attempts: 4,
            visibility_timeout: Some(duration_of_millis(30_000)),
            pending: true,
            ..Default::default()
        };
        let json = options_of(o, now).unwrap();
        assert_eq!(
            Value::Object(json),
            json!({"queue": "mail", "priority": 5, "max_attempts": 4,
                   "visibility_timeout_ms": 30000, "pending": true})
        );
        let bad = pb::EnqueueOptions {
            unique: Some(pb::UniquePolicy {
                on_conflict: 9,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(options_of(bad, now).is_err());
    }
}
