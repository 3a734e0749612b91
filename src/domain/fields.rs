//! One reader for request fields, under every request rule (`envelope.rs` for PUSH,
//! `requests.rs` for FETCH, ACK, FAIL and BEAT): `null` is the same as absent, and a value of
//! the wrong type is a 400 naming the field, what it must be and what it got.

use std::ops::RangeInclusive;
use std::time::Duration;

use serde_json::{Map, Value};

use super::duration;
use super::error::OjsError;

/// The field's value, with `null` read as absent.
pub fn present(v: Option<&Value>) -> Option<&Value> {
    v.filter(|v| !v.is_null())
}

/// 400: `field` must be `expected`.
pub fn type_error(field: &str, expected: &str, got: &Value) -> OjsError {
    OjsError::invalid(
        field,
        format!("{field} must be {expected}, got {}.", json_kind(got)),
    )
    .with_detail("expected", expected)
    .with_detail("received", json_kind(got))
}

/// 400: `field` is required.
/// Longest URI a job or a schema registration may name (a job's `schema`, a schema's `uri`).
pub const MAX_URI_BYTES: usize = 512;

/// `value` as an absolute URI (core §3 `schema`: a valid URI), 1 to `MAX_URI_BYTES` long.
///
/// # Errors
/// 400 naming `field`.
pub fn absolute_uri(value: &str, field: &str) -> Result<(), OjsError> {
    if value.is_empty() || value.len() > MAX_URI_BYTES {
        return Err(OjsError::invalid(
            field,
            format!("{field} must be a URI of 1 to {MAX_URI_BYTES} bytes."),
        ));
    }
    url::Url::parse(value).map(drop).map_err(|err| {
        OjsError::invalid(
            field,
            format!(
                "{field} {:?} is not an absolute URI ({err}); for example urn:ojs:schema:email.send:v1.",
                truncated(value)
            ),
        )
    })
}

pub fn missing(field: &str, what: &str) -> OjsError {
    OjsError::invalid(field, format!("Missing required field '{field}' ({what})."))
}

pub fn string<'a>(v: Option<&'a Value>, field: &str) -> Result<Option<&'a str>, OjsError> {
    match present(v) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(type_error(field, "a string", other)),
    }
}

/// A string that, when given, is not empty.
pub fn non_empty_string<'a>(
    v: Option<&'a Value>,
    field: &str,
) -> Result<Option<&'a str>, OjsError> {
    match present(v) {
        Some(Value::String(s)) if s.is_empty() => Err(OjsError::invalid(
            field,
            format!("{field} must be a non-empty string."),
        )),
        v => string(v, field),
    }
}

pub fn boolean(v: Option<&Value>, field: &str) -> Result<Option<bool>, OjsError> {
    match present(v) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(type_error(field, "a boolean", other)),
    }
}

pub fn object<'a>(
    v: Option<&'a Value>,
    field: &str,
) -> Result<Option<&'a Map<String, Value>>, OjsError> {
    match present(v) {
        None => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m)),
        Some(other) => Err(type_error(field, "an object", other)),
    }
}

/// 400: `field` names `count` distinct items, more than the `max` the setting `setting`
/// allows. Each item costs NATS work, so the cap keeps one request's cost bounded.
pub fn too_many(field: &str, count: usize, max: usize, setting: &str) -> OjsError {
    OjsError::invalid(
        field,
        format!(
            "{field} names {count} distinct items, over the maximum of {max} (setting {setting})."
        ),
    )
    .with_detail("count", count)
    .with_detail("max", max)
    .with_detail("setting", setting)
}

/// An array; `expected` says of what, for the error.
pub fn array<'a>(
    v: Option<&'a Value>,
    field: &str,
    expected: &str,
) -> Result<Option<&'a [Value]>, OjsError> {
    match present(v) {
        None => Ok(None),
        Some(Value::Array(a)) => Ok(Some(a)),
        Some(other) => Err(type_error(field, expected, other)),
    }
}

/// An integer within `range`.
pub fn integer(
    v: Option<&Value>,
    field: &str,
    range: RangeInclusive<u64>,
) -> Result<Option<u64>, OjsError> {
    match present(v) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .filter(|n| range.contains(n))
            .map(Some)
            .ok_or_else(|| {
                OjsError::invalid(
                    field,
                    format!(
                        "{field} must be an integer from {} to {}, got {v}.",
                        range.start(),
                        range.end()
                    ),
                )
            }),
    }
}

/// A positive number of milliseconds of at most `duration::MAX`.
pub fn millis(v: Option<&Value>, field: &str) -> Result<Option<Duration>, OjsError> {
    present(v)
        .map(|v| duration::from_number(v, field, 1, true))
        .transpose()
}

/// Takes an object field out of `body`; absent or `null` is an empty object.
pub fn take_object(
    body: &mut Map<String, Value>,
    field: &str,
) -> Result<Map<String, Value>, OjsError> {
    match body.remove(field) {
        Some(Value::Object(m)) => Ok(m),
        v => object(v.as_ref(), field).map(|_| Map::new()),
    }
}

/// Takes a string field out of `body`.
pub fn take_string(body: &mut Map<String, Value>, field: &str) -> Result<Option<String>, OjsError> {
    match body.remove(field) {
        Some(Value::String(s)) => Ok(Some(s)),
        v => string(v.as_ref(), field).map(|_| None),
    }
}

/// At most 64 characters of a client's text, for an error message.
pub fn truncated(s: &str) -> String {
    match s.char_indices().nth(64) {
        Some((end, _)) => format!("{}…", &s[..end]),
        None => s.to_owned(),
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn null_is_absent_for_every_reader() {
        let null = Some(&Value::Null);
        assert_eq!(string(null, "f").unwrap(), None);
        assert_eq!(boolean(null, "f").unwrap(), None);
        assert_eq!(object(null, "f").unwrap(), None);
        assert_eq!(array(null, "f", "a list").unwrap(), None);
        assert_eq!(integer(null, "f", 1..=3).unwrap(), None);
        assert_eq!(millis(null, "f").unwrap(), None);
        assert_eq!(string(None, "f").unwrap(), None);
    }

    #[test]
    fn a_wrong_type_names_the_field_what_it_must_be_and_what_it_got() {
        let err = boolean(Some(&json!("yes")), "requeue").unwrap_err();
        assert_eq!(err.message, "requeue must be a boolean, got string.");
        assert_eq!(err.details["field"], "requeue");
        assert_eq!(err.details["received"], "string");
        assert!(object(Some(&json!([])), "error").is_err());
        assert!(array(Some(&json!({})), "queues", "an array").is_err());
        assert!(string(Some(&json!(1)), "id").is_err());
    }

    #[test]
    fn integers_and_millis_keep_to_their_bounds() {
        assert_eq!(integer(Some(&json!(3)), "count", 1..=3).unwrap(), Some(3));
        for bad in [json!(0), json!(4), json!(-1), json!(1.5), json!("2")] {
            assert!(integer(Some(&bad), "count", 1..=3).is_err(), "{bad}");
        }
        assert_eq!(
            millis(Some(&json!(1500)), "visibility_timeout_ms").unwrap(),
            Some(Duration::from_millis(1500))
        );
        assert!(millis(Some(&json!(0)), "visibility_timeout_ms").is_err());
        assert!(millis(Some(&json!(u64::MAX)), "visibility_timeout_ms").is_err());
    }

    #[test]
    fn non_empty_strings_refuse_the_empty_one() {
        assert!(non_empty_string(Some(&json!("")), "worker_id").is_err());
        assert_eq!(
            non_empty_string(Some(&json!("w")), "worker_id").unwrap(),
            Some("w")
        );
    }

    #[test]
    fn taken_fields_leave_the_body_and_null_is_empty() {
        let mut body = json!({"meta": {"a": 1}, "options": null, "type": "t", "bad": 1})
            .as_object()
            .unwrap()
            .clone();
        assert_eq!(take_object(&mut body, "meta").unwrap()["a"], 1);
        assert!(take_object(&mut body, "options").unwrap().is_empty());
        assert_eq!(
            take_string(&mut body, "type").unwrap().as_deref(),
            Some("t")
        );
        assert_eq!(take_string(&mut body, "type").unwrap(), None);
        assert!(take_object(&mut body, "bad").is_err());
        assert!(body.is_empty());
    }

    #[test]
    fn long_text_is_truncated_for_messages() {
        assert_eq!(truncated("abc"), "abc");
        assert_eq!(truncated(&"x".repeat(100)).chars().count(), 65);
    }
}
