//! PUSH input validation (core §5, HTTP binding §9.1): turns a client's JSON into a
//! [`Job`], or an error naming the field. Option keys are read from `options` first, then
//! from the top level; system-managed fields sent by a client are ignored.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};
use uuid::Uuid;

use super::duration;
use super::error::{ErrorCode, OjsError};
use super::fields::{self, missing, type_error};
use super::job::{Job, SPEC_VERSION};
use super::rate_limit::Limits;
use super::retry::{self, OnExhaustion, RetryPolicy};
use super::state::JobState;
use super::time;
use super::unique::UniquePolicy;

/// Core §5.3: clients never set these; their values are dropped on input.
const SYSTEM_FIELDS: &[&str] = &[
    "state",
    "attempt",
    "max_attempts",
    "created_at",
    "enqueued_at",
    "started_at",
    "completed_at",
    "cancelled_at",
    "discarded_at",
    "error",
    "errors",
    "result",
    "retry_delay_ms",
    "next_attempt_at",
    "worker_id",
    "parent_results",
    "workflow_id",
    "progress",
    "progress_data",
    "progress_message",
    "progress_updated_at",
];

/// Option keys that may also stand at the top level (core §5.1–§5.2, JSON format §3.1).
pub const OPTION_KEYS: &[&str] = &[
    "queue",
    "priority",
    "timeout",
    "timeout_ms",
    "scheduled_at",
    "delay_until",
    "expires_at",
    "retry",
    "retry_policy",
    "unique",
    "visibility_timeout",
    "visibility_timeout_ms",
    "tags",
    "rate_limit",
    "pending",
];

pub const MAX_TYPE_LEN: usize = 255;
pub const MAX_QUEUE_LEN: usize = 128;
pub const PRIORITY_RANGE: std::ops::RangeInclusive<i64> = -100..=100;
/// Payload limits PL-002: `meta` serialized is at most 64 KiB.
pub const MAX_META_BYTES: usize = 64 * 1024;

/// Deepest nesting of arrays and objects in a request body. A job's record nests what a
/// client sent a few levels deeper (`{"job":{"errors":[{"details":…}]}}`), and the JSON
/// reader refuses anything past 128 levels: with this bound every record reads back.
pub const MAX_JSON_DEPTH: usize = 64;

/// Refuses a value nested deeper than [`MAX_JSON_DEPTH`].
///
/// # Errors
/// 400 `invalid_payload`.
pub fn check_depth(v: &Value) -> Result<(), OjsError> {
    let mut stack = vec![(v, 1usize)];
    while let Some((v, depth)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match v {
            Value::Array(a) => Box::new(a.iter()),
            Value::Object(m) => Box::new(m.values()),
            _ => continue,
        };
        if depth > MAX_JSON_DEPTH {
            return Err(OjsError::new(
                ErrorCode::InvalidPayload,
                format!("The request body nests arrays and objects deeper than {MAX_JSON_DEPTH} levels."),
            ));
        }
        stack.extend(children.map(|c| (c, depth + 1)));
    }
    Ok(())
}

/// 413 `envelope_too_large` for a field (or the whole job) over its limit, in the detail
/// shape of payload limits §9.
pub fn too_large(field: &str, actual: usize, max: usize) -> OjsError {
    OjsError::new(
        ErrorCode::EnvelopeTooLarge,
        format!("{field} is {actual} bytes, over the maximum of {max} bytes."),
    )
    .with_detail("field", field)
    .with_detail("actual_bytes", actual)
    .with_detail("max_bytes", max)
}

/// Validates one enqueue request. `new_id` is used when the client sent no `id`.
///
/// # Errors
/// 400 `invalid_payload` for a non-object, 400 `invalid_request` for a bad field,
/// 422 for a semantically invalid retry policy.
pub fn parse(body: Value, now: DateTime<Utc>, new_id: Uuid) -> Result<Job, OjsError> {
    parse_with_default_exhaustion(body, now, new_id, OnExhaustion::Discard)
}

/// Like [`parse`], with what a job whose retry policy does not say `on_exhaustion` does
/// when its attempts run out (the `default_on_exhaustion` setting: clients whose retry
/// policies cannot say it still reach the dead letter queue).
///
/// # Errors
/// As [`parse`].
pub fn parse_with_default_exhaustion(
    body: Value,
    now: DateTime<Utc>,
    new_id: Uuid,
    default_on_exhaustion: OnExhaustion,
) -> Result<Job, OjsError> {
    let Value::Object(mut obj) = body else {
        return Err(OjsError::new(
            ErrorCode::InvalidPayload,
            "The job must be a JSON object.",
        ));
    };
    for key in SYSTEM_FIELDS {
        obj.remove(*key);
    }
    let options = fields::take_object(&mut obj, "options")?;
    let mut top_options = Map::new();
    for key in OPTION_KEYS {
        if let Some(v) = obj.remove(*key) {
            top_options.insert((*key).to_string(), v);
        }
    }
    let opts = Options {
        primary: options,
        fallback: top_options,
    };

    let job_type = fields::take_string(&mut obj, "type")?
        .ok_or_else(|| missing("type", "the job's type, e.g. email.send"))?;
    validate_type(&job_type)?;

    let args = match obj.remove("args") {
        Some(Value::Array(a)) => a,
        other => {
            return Err(match fields::present(other.as_ref()) {
                None => missing("args", "a JSON array"),
                Some(v) => type_error("args", "a JSON array", v),
            })
        }
    };

    let id = match fields::take_string(&mut obj, "id")? {
        None => new_id.hyphenated().to_string(),
        Some(s) => parse_job_id(&s).ok_or_else(|| {
            OjsError::invalid("id", format!("id must be a lowercase UUIDv7, got {s:?}."))
        })?,
    };

    let mut meta = fields::take_object(&mut obj, "meta")?;
    for key in ["metadata", "meta"] {
        if let Some(m) = fields::object(opts.primary.get(key), &format!("options.{key}"))? {
            meta.extend(m.clone());
        }
    }

    let meta_bytes = serde_json::to_vec(&meta).map_or(0, |b| b.len());
    if meta_bytes > MAX_META_BYTES {
        return Err(too_large("meta", meta_bytes, MAX_META_BYTES));
    }

    match fields::present(obj.remove("specversion").as_ref()) {
        None => {}
        Some(Value::String(v)) if v == SPEC_VERSION || v == "1.0" => {}
        Some(other) => {
            return Err(OjsError::invalid(
                "specversion",
                format!("specversion must be \"{SPEC_VERSION}\" or \"1.0\", got {other}."),
            ))
        }
    }
    let schema = fields::take_string(&mut obj, "schema")?;
    if let Some(uri) = &schema {
        fields::absolute_uri(uri, "schema")?;
    }

    let queue = match opts.get("queue") {
        None => "default".to_string(),
        Some(Value::String(q)) => {
            validate_queue(q)?;
            q.clone()
        }
        Some(other) => return Err(type_error("queue", "a string", other)),
    };
    let priority = match opts.get("priority") {
        None => 0,
        Some(v) => parse_priority(v)?,
    };
    let timeout_ms = match (opts.get("timeout_ms"), opts.get("timeout")) {
        (Some(v), _) => duration::from_number(v, "timeout_ms", 1, false)?,
        (None, Some(v)) => duration::from_number(v, "timeout", 1000, false)?,
        (None, None) => Duration::ZERO,
    }
    .as_millis() as u64;
    let visibility_timeout_ms = match (
        opts.get("visibility_timeout_ms"),
        opts.get("visibility_timeout"),
    ) {
        (Some(v), _) => duration::from_number(v, "visibility_timeout_ms", 1, false)?,
        (None, Some(Value::String(s))) => duration::parse(s).ok_or_else(|| {
            OjsError::invalid(
                "visibility_timeout",
                format!(
                    "visibility_timeout must be a duration of at most {}, got {s:?}.",
                    duration::MAX_TEXT
                ),
            )
        })?,
        (None, Some(v)) => duration::from_number(v, "visibility_timeout", 1000, false)?,
        (None, None) => Duration::ZERO,
    }
    .as_millis() as u64;
    let scheduled = match (opts.get("scheduled_at"), opts.get("delay_until")) {
        (Some(v), _) => Some(parse_time(v, "scheduled_at", now)?),
        (None, Some(v)) => Some(parse_time(v, "delay_until", now)?),
        (None, None) => None,
    };
    let expires_at = match opts.get("expires_at") {
        None => None,
        Some(v) => Some(parse_time(v, "expires_at", now)?.0),
    };
    let base = RetryPolicy {
        on_exhaustion: default_on_exhaustion,
        ..RetryPolicy::default()
    };
    // `options.max_attempts` (the `ojs` command line's form; a top-level `max_attempts` is
    // a system field): checked as the policy's own, which wins when it names one.
    let base = match opts.primary.get("max_attempts").filter(|v| !v.is_null()) {
        None => base,
        Some(v) => RetryPolicy {
            max_attempts: retry::max_attempts(v, "options.max_attempts")?,
            ..base
        },
    };
    let retry = match opts.get("retry").or_else(|| opts.get("retry_policy")) {
        None => base,
        Some(v) => RetryPolicy::from_value_over(v, base)?,
    };
    // Kept as sent (echoed), `use_existing` under its spec name `ignore` (clients that read
    // the policy back know only the spec's names); PUSH reads it again to take the key's
    // lock (`unique.rs`).
    let unique = match opts.get("unique") {
        None => None,
        Some(v) => {
            UniquePolicy::parse(v, &args)?;
            let mut kept = v.clone();
            if kept.get("on_conflict").and_then(Value::as_str) == Some("use_existing") {
                kept["on_conflict"] = Value::from("ignore");
            }
            Some(kept)
        }
    };
    // Kept as sent (echoed); PUSH registers it as the queue's limit (`rate_limit.rs`).
    let rate_limit = match opts.get("rate_limit") {
        None => None,
        Some(v) => {
            Limits::parse(v, &queue)?;
            Some(v.clone())
        }
    };
    let tags = match opts.get("tags") {
        None => None,
        Some(Value::Array(a)) => Some(
            a.iter()
                .map(|t| t.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| OjsError::invalid("tags", "tags must be an array of strings."))?,
        ),
        Some(other) => return Err(type_error("tags", "an array of strings", other)),
    };
    let pending = match opts.get("pending") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => return Err(type_error("pending", "a boolean", other)),
    };

    let state = match &scheduled {
        _ if pending => JobState::Pending,
        Some((_, at)) if *at > now => JobState::Scheduled,
        _ => JobState::Available,
    };
    let unknown_options: Map<String, Value> = opts
        .primary
        .into_iter()
        .filter(|(k, _)| {
            !OPTION_KEYS.contains(&k.as_str())
                && !["metadata", "meta", "max_attempts"].contains(&k.as_str())
        })
        .collect();

    let job = Job {
        specversion: SPEC_VERSION.to_string(),
        id,
        job_type,
        queue,
        args,
        meta,
        priority,
        state,
        attempt: 0,
        max_attempts: retry.max_attempts,
        timeout_ms: (timeout_ms > 0).then_some(timeout_ms),
        visibility_timeout_ms: (visibility_timeout_ms > 0).then_some(visibility_timeout_ms),
        tags,
        retry,
        unique,
        rate_limit,
        schema,
        scheduled_at: scheduled.map(|(text, _)| text),
        expires_at,
        created_at: now,
        enqueued_at: (state == JobState::Available).then_some(now),
        started_at: None,
        completed_at: None,
        cancelled_at: None,
        discarded_at: None,
        result: None,
        error: None,
        errors: Vec::new(),
        retry_delay_ms: None,
        next_attempt_at: None,
        worker_id: None,
        workflow_id: None,
        parent_results: None,
        progress: None,
        progress_data: None,
        progress_message: None,
        progress_updated_at: None,
        options: (!unknown_options.is_empty()).then_some(unknown_options),
        extra: obj,
    };
    Ok(job)
}

/// `options.*` wins over the same key at the top level; `null` means absent.
struct Options {
    primary: Map<String, Value>,
    fallback: Map<String, Value>,
}

impl Options {
    fn get(&self, key: &str) -> Option<&Value> {
        self.primary
            .get(key)
            .or_else(|| self.fallback.get(key))
            .filter(|v| !v.is_null())
    }
}

/// Core §5.1, plus the hyphens of conformance case retry-validation-invalid-max-attempts.json:
/// dot-separated lowercase segments; hyphens and underscores allowed.
pub fn validate_type(t: &str) -> Result<(), OjsError> {
    let ok = !t.is_empty()
        && t.len() <= MAX_TYPE_LEN
        && t.split('.').all(|seg| {
            let mut chars = seg.chars();
            chars.next().is_some_and(|c| c.is_ascii_lowercase())
                && chars
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
        });
    if ok {
        Ok(())
    } else {
        Err(OjsError::invalid(
            "type",
            format!("type {t:?} is invalid: use dot-separated lowercase segments such as \"email.send\" (at most {MAX_TYPE_LEN} characters)."),
        ))
    }
}

/// Reads an id a request names as a job id; anything else names no job (404) and never
/// reaches NATS, where it would become part of a subject.
///
/// # Errors
/// `not_found` for text that is no job id.
pub fn named_job_id(raw: &str) -> Result<String, OjsError> {
    parse_job_id(raw).ok_or_else(|| OjsError::not_found("job", &fields::truncated(raw)))
}

/// Core §5.1: `[a-z0-9][a-z0-9\-\.]*`, at most 128 characters.
pub fn validate_queue(q: &str) -> Result<(), OjsError> {
    if is_name(q, MAX_QUEUE_LEN) {
        Ok(())
    } else {
        Err(OjsError::invalid(
            "queue",
            format!("queue {q:?} is invalid: use lowercase letters, digits, '-' and '.', starting with a letter or digit (at most {MAX_QUEUE_LEN} characters)."),
        ))
    }
}

/// The naming rule queues and cron entries share: `[a-z0-9][a-z0-9\-\.]*`, at most `max`
/// characters.
pub fn is_name(s: &str, max: usize) -> bool {
    let mut chars = s.chars();
    s.len() <= max
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
}

/// A job id as HTTP binding §6.4 defines it: a UUIDv7 in lowercase hyphenated form
/// (`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`). Anything else is
/// refused before it can become part of a NATS subject.
pub fn parse_job_id(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let shape = b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_digit() || (b'a'..=b'f').contains(c),
        });
    (shape && b[14] == b'7' && matches!(b[19], b'8' | b'9' | b'a' | b'b')).then(|| s.to_owned())
}

/// The body of `PATCH /ojs/v1/jobs/{id}` (priority spec §8.1): `{"priority": …}` in the
/// forms an enqueue takes, and nothing else — no other field of a job changes after enqueue.
pub fn priority_update(body: &Map<String, Value>) -> Result<i32, OjsError> {
    if let Some(other) = body.keys().find(|k| *k != "priority") {
        return Err(OjsError::invalid(
            other,
            format!("Only priority can be changed after enqueue, not {other}."),
        ));
    }
    match body.get("priority") {
        Some(v) if !v.is_null() => parse_priority(v),
        _ => Err(missing("priority", "the job's new priority")),
    }
}

fn parse_priority(v: &Value) -> Result<i32, OjsError> {
    let n = match v {
        Value::String(name) => match name.to_ascii_uppercase().as_str() {
            "HIGH" => 10,
            "NORMAL" => 0,
            "LOW" => -10,
            _ => return Err(priority_error(v)),
        },
        other => other.as_i64().ok_or_else(|| priority_error(v))?,
    };
    if PRIORITY_RANGE.contains(&n) {
        Ok(n as i32)
    } else {
        Err(priority_error(v))
    }
}

fn priority_error(v: &Value) -> OjsError {
    OjsError::invalid(
        "priority",
        format!("priority must be an integer from -100 to 100 (or HIGH, NORMAL, LOW), got {v}."),
    )
}

/// An absolute RFC 3339 time (kept verbatim) or `+<ISO duration>` relative to `now`, the
/// forms every timestamp option takes (core §5.2; conformance case
/// delayed-job-available-at-time.json).
fn parse_time(
    v: &Value,
    field: &str,
    now: DateTime<Utc>,
) -> Result<(String, DateTime<Utc>), OjsError> {
    let bad = || {
        OjsError::invalid(
            field,
            format!(
                "{field} must be an RFC 3339 timestamp with a zone or +<ISO 8601 duration> of at most {}, got {v}.",
                duration::MAX_TEXT
            ),
        )
    };
    let text = v.as_str().ok_or_else(bad)?;
    if let Some(rel) = text.strip_prefix('+') {
        let at = time::add(now, duration::parse(rel).ok_or_else(bad)?);
        return Ok((time::format(at), at));
    }
    let at = time::parse(text).ok_or_else(bad)?;
    Ok((text.to_string(), at))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn now() -> DateTime<Utc> {
        time::parse("2026-02-12T10:30:00Z").unwrap()
    }

    fn ok(v: Value) -> Job {
        parse(v, now(), Uuid::now_v7()).unwrap()
    }

    fn err(v: Value) -> OjsError {
        parse(v, now(), Uuid::now_v7()).unwrap_err()
    }

    #[test]
    fn a_priority_update_names_the_priority_and_nothing_else() {
        let update = |v: Value| priority_update(v.as_object().unwrap());
        assert_eq!(update(json!({"priority": 5})).unwrap(), 5);
        assert_eq!(update(json!({"priority": "HIGH"})).unwrap(), 10);
        for (body, field) in [
            (json!({}), "priority"),
            (json!({"priority": null}), "priority"),
            (json!({"priority": 101}), "priority"),
            (json!({"priority": 1.5}), "priority"),
            (json!({"priority": 1, "queue": "other"}), "queue"),
        ] {
            let e = update(body.clone()).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidRequest, "{body}");
            assert_eq!(e.details["field"], field, "{body}");
        }
    }

    #[test]
    fn minimal_job_gets_defaults() {
        let j = ok(json!({"type": "email.send", "args": ["a"]}));
        assert_eq!(j.queue, "default");
        assert_eq!(j.state, JobState::Available);
        assert_eq!(j.priority, 0);
        assert_eq!(j.attempt, 0);
        assert_eq!(j.max_attempts, 3);
        assert_eq!(j.enqueued_at, Some(now()));
        assert!(parse_job_id(&j.id).is_some());
    }

    #[test]
    fn system_fields_are_ignored_and_unknown_fields_kept() {
        let j = ok(
            json!({"type": "a.b", "args": [], "state": "completed", "attempt": 9,
            "result": 1, "x_custom": {"n": true}}),
        );
        assert_eq!(j.state, JobState::Available);
        assert_eq!(j.attempt, 0);
        assert_eq!(j.result, None);
        assert_eq!(j.extra["x_custom"], json!({"n": true}));
        let out = serde_json::to_value(&j).unwrap();
        assert_eq!(out["x_custom"]["n"], true);
        assert!(out.get("started_at").is_none() && out.get("error").is_none());
    }

    #[test]
    fn options_win_over_top_level() {
        let j = ok(
            json!({"type": "a", "args": [], "queue": "top", "priority": 1,
            "options": {"queue": "opt"}}),
        );
        assert_eq!(j.queue, "opt");
        assert_eq!(j.priority, 1);
    }

    #[test]
    fn type_rules() {
        for good in [
            "email.send",
            "a",
            "retry.test.attempt-counter",
            "cleanup.old_data",
        ] {
            ok(json!({"type": good, "args": []}));
        }
        for bad in [
            "Email.Send",
            "email send",
            "1email.send",
            "",
            "email@send!",
            "a..b",
            "a.",
        ] {
            assert_eq!(
                err(json!({"type": bad, "args": []})).code,
                ErrorCode::InvalidRequest,
                "{bad}"
            );
        }
        assert_eq!(err(json!({"args": []})).details["field"], "type");
    }

    #[test]
    fn args_must_be_an_array() {
        for bad in [
            json!({"a": 1}),
            json!("s"),
            json!(42),
            json!(true),
            json!(null),
        ] {
            let e = err(json!({"type": "a", "args": bad}));
            assert_eq!(e.details["field"], "args");
        }
    }

    #[test]
    fn queue_and_priority_rules() {
        for bad in ["Default", "my_queue!", "-invalid", "my queue", ""] {
            err(json!({"type": "a", "args": [], "options": {"queue": bad}}));
        }
        for p in [101, -101, 999_999] {
            err(json!({"type": "a", "args": [], "options": {"priority": p}}));
        }
        assert_eq!(
            ok(json!({"type": "a", "args": [], "options": {"priority": "HIGH"}})).priority,
            10
        );
        assert_eq!(
            ok(json!({"type": "a", "args": [], "options": {"priority": -100}})).priority,
            -100
        );
    }

    #[test]
    fn client_id_must_be_a_lowercase_uuidv7() {
        let j = ok(json!({"type": "a", "args": [], "id": "019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f"}));
        assert_eq!(j.id, "019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f");
        for bad in [
            "019461A8-1A2B-7C3D-8E4F-5A6B7C8D9E0F",
            "550e8400-e29b-41d4-a716-446655440000",
            "019461a8-1a2b-7c3d-4e4f-5a6b7c8d9e0f",
            "019461a81a2b7c3d8e4f5a6b7c8d9e0f",
            "{019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f}",
            "",
            "nope",
        ] {
            assert_eq!(
                err(json!({"type": "a", "args": [], "id": bad})).details["field"],
                "id"
            );
        }
    }

    #[test]
    fn durations_and_times_are_bounded() {
        for (field, v) in [
            ("timeout_ms", json!(18_446_744_073_709_551_615u64)),
            ("timeout_ms", json!(31_536_000_001u64)),
            ("timeout", json!(31_536_001)),
            ("visibility_timeout_ms", json!(u64::MAX)),
            ("visibility_timeout", json!("P366D")),
            ("scheduled_at", json!("+P100000000D")),
            ("expires_at", json!("+P20000000D")),
            ("expires_at", json!("+11532-01-01T00:00:00Z")),
        ] {
            let e = err(json!({"type": "a", "args": [], "options": {field: v}}));
            assert_eq!(e.details["field"], field, "{field} {v}");
            assert!(e.message.contains("P365D"), "{}", e.message);
        }
        let longest = ok(json!({"type": "a", "args": [], "options": {
            "timeout_ms": 31_536_000_000u64, "scheduled_at": "+P365D", "expires_at": "+P365D"}}));
        assert_eq!(longest.timeout_ms, Some(31_536_000_000));
        assert_eq!(
            longest.scheduled_at.as_deref(),
            Some("2027-02-12T10:30:00.000Z")
        );
        assert_eq!(
            longest.expires_at.as_deref(),
            Some("2027-02-12T10:30:00.000Z")
        );
        let far = ok(
            json!({"type": "a", "args": [], "options": {"scheduled_at": "9999-12-31T23:59:59Z"}}),
        );
        assert_eq!(far.state, JobState::Scheduled);
    }

    #[test]
    fn nesting_and_meta_are_bounded() {
        let mut deep = json!(1);
        for _ in 0..MAX_JSON_DEPTH {
            deep = json!([deep]);
        }
        check_depth(&deep).unwrap();
        let too_deep = json!([deep]);
        assert_eq!(
            check_depth(&too_deep).unwrap_err().code,
            ErrorCode::InvalidPayload
        );
        let meta = json!({"blob": "x".repeat(MAX_META_BYTES)});
        let e = err(json!({"type": "a", "args": [], "meta": meta}));
        assert_eq!(e.code, ErrorCode::EnvelopeTooLarge);
        assert_eq!(e.details["field"], "meta");
        assert_eq!(e.details["max_bytes"], MAX_META_BYTES);
    }

    #[test]
    fn rate_limits_and_unique_policies_are_checked_and_kept() {
        let j =
            ok(json!({"type": "a", "args": [], "options": {"rate_limit": {"max_per_second": 1}}}));
        assert_eq!(j.rate_limit, Some(json!({"max_per_second": 1})));
        let e = err(
            json!({"type": "a", "args": [], "options": {"rate_limit": {"on_limit": "drop", "max_per_second": 1}}}),
        );
        assert_eq!(e.code, ErrorCode::Unsupported);
        let j = ok(json!({"type": "a", "args": [], "options": {"unique": {"period": "PT1H"}}}));
        assert_eq!(j.unique, Some(json!({"period": "PT1H"})));
        err(json!({"type": "a", "args": [], "options": {"unique": "yes"}}));
    }

    #[test]
    fn schedules_future_past_and_relative() {
        let future = ok(
            json!({"type": "a", "args": [], "options": {"delay_until": "2099-12-31T23:59:59Z"}}),
        );
        assert_eq!(future.state, JobState::Scheduled);
        assert_eq!(future.scheduled_at.as_deref(), Some("2099-12-31T23:59:59Z"));
        assert_eq!(future.enqueued_at, None);
        let past = ok(
            json!({"type": "a", "args": [], "options": {"scheduled_at": "2020-01-01T00:00:00Z"}}),
        );
        assert_eq!(past.state, JobState::Available);
        let rel = ok(json!({"type": "a", "args": [], "options": {"scheduled_at": "+PT5S"}}));
        assert_eq!(
            rel.scheduled_at.as_deref(),
            Some("2026-02-12T10:30:05.000Z")
        );
        err(json!({"type": "a", "args": [], "options": {"scheduled_at": "2026-02-12T10:30:00"}}));
    }

    #[test]
    fn timeouts_accept_both_units() {
        let j = ok(
            json!({"type": "a", "args": [], "options": {"timeout": 60, "visibility_timeout": "PT30S"}}),
        );
        assert_eq!(j.timeout_ms, Some(60_000));
        assert_eq!(j.visibility_timeout_ms, Some(30_000));
        err(json!({"type": "a", "args": [], "options": {"timeout_ms": -5}}));
    }

    #[test]
    fn bad_retry_policy_is_unprocessable() {
        let e = err(json!({"type": "a", "args": [], "options": {"retry": {"max_attempts": -1}}}));
        assert_eq!(e.category, crate::domain::error::Category::Semantic);
        assert!(e.message.contains("max_attempts"));
    }

    #[test]
    fn options_max_attempts_sets_the_attempts_unless_the_retry_policy_does() {
        let j = ok(json!({"type": "a", "args": [], "options": {"max_attempts": 7}}));
        assert_eq!((j.max_attempts, j.retry.max_attempts), (7, 7));
        assert!(j.options.is_none(), "not kept as an unknown option");
        let j = ok(json!({"type": "a", "args": [], "options": {
            "max_attempts": 7, "retry": {"max_attempts": 2}}}));
        assert_eq!(j.max_attempts, 2);
        let j = ok(json!({"type": "a", "args": [], "max_attempts": 7}));
        assert_eq!(
            j.max_attempts, 3,
            "a top-level max_attempts is a system field"
        );
        let e = err(json!({"type": "a", "args": [], "options": {"max_attempts": "x"}}));
        assert_eq!(e.details["field"], "options.max_attempts");
        assert_eq!(e.category, crate::domain::error::Category::Semantic);
    }

    #[test]
    fn use_existing_is_kept_under_its_spec_name() {
        let j = ok(json!({"type": "a", "args": [], "options": {
            "unique": {"keys": ["type"], "on_conflict": "use_existing"}}}));
        assert_eq!(j.unique.unwrap()["on_conflict"], "ignore");
    }

    #[test]
    fn non_object_is_invalid_payload() {
        assert_eq!(err(json!([1])).code, ErrorCode::InvalidPayload);
    }
}
