//! `PUT /admin/queues/{name}/config` (admin spec §6.6, queue-config spec §6): what an
//! operator may change of a queue — its rate and concurrency limits (`rate_limit.rs`) and
//! its bound (`backpressure.rs`). A setting not named stays as it is.

use serde_json::{Map, Value};

use super::backpressure::{Bound, BoundChange};
use super::error::{ErrorCode, OjsError};
use super::rate_limit::Limits;

/// The changes one configuration asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueConfig {
    pub limits: Option<Limits>,
    pub bound: Option<BoundChange>,
}

/// Reads a queue configuration: `concurrency` and `rate_limit` as the admin spec shows
/// them (`rate_limit: {limit, period}`) or with a job's `rate_limit` shape; the bound as
/// the backpressure spec's `backpressure` object or the queue-config spec's `max_size`,
/// `max_size_bytes` and `overflow_policy`.
///
/// # Errors
/// 400 for an unknown field, nothing to change, or a malformed setting; 422 `unsupported`
/// for what this server does not enforce (`retention` is server-wide here, size bounds,
/// `drop_oldest`).
pub fn parse(body: &Map<String, Value>, queue: &str) -> Result<QueueConfig, OjsError> {
    let mut limit = Map::new();
    let mut bound = None;
    let mut spec_fields = Map::new();
    for (key, value) in body {
        match (key.as_str(), value) {
            (_, Value::Null) => {}
            ("concurrency", v) => {
                limit.insert("concurrency".into(), v.clone());
            }
            ("rate_limit", Value::Object(r)) if r.contains_key("limit") => {
                limit.insert("rate".into(), Value::Object(r.clone()));
            }
            ("rate_limit", Value::Object(r)) => limit.extend(r.clone()),
            ("rate_limit", _) => {
                return Err(OjsError::invalid(
                    "rate_limit",
                    "rate_limit must be an object.",
                ))
            }
            ("backpressure", Value::Object(b)) => bound = Some(Bound::parse(b, false)?),
            ("backpressure", _) => {
                return Err(OjsError::invalid(
                    "backpressure",
                    "backpressure must be an object.",
                ))
            }
            ("max_size" | "max_size_bytes" | "overflow_policy", v) => {
                spec_fields.insert(key.clone(), v.clone());
            }
            ("retention", _) => return Err(OjsError::new(
                ErrorCode::Unsupported,
                "retention: retention is the server's finished_jobs_max_age_ms, for every queue.",
            )
            .with_detail("field", "retention")),
            (other, _) => {
                return Err(OjsError::invalid(
                    other,
                    format!(
                    "{other} is not a queue setting: give concurrency, rate_limit or backpressure."
                ),
                ))
            }
        }
    }
    if !spec_fields.is_empty() {
        if bound.is_some() {
            return Err(OjsError::invalid(
                "max_size",
                "Give the bound once: as backpressure or as max_size, not both.",
            ));
        }
        bound = Some(Bound::parse(&spec_fields, true)?);
    }
    let limits = if limit.is_empty() {
        None
    } else {
        Some(Limits::parse(&Value::Object(limit), queue)?)
    };
    if limits.is_none() && bound.is_none() {
        return Err(OjsError::invalid(
            "rate_limit",
            "Name a setting to change: concurrency, rate_limit or backpressure.",
        ));
    }
    Ok(QueueConfig { limits, bound })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::backpressure::Overflow;
    use crate::domain::rate_limit::RateLimit;

    fn config(v: Value) -> Result<QueueConfig, OjsError> {
        parse(v.as_object().unwrap(), "q")
    }

    #[test]
    fn a_configuration_takes_the_specs_shapes_and_a_jobs_rate_limit() {
        let spec = config(json!({"concurrency": 3, "rate_limit": {"limit": 10, "period": "PT1M"}}))
            .unwrap();
        let limits = spec.limits.unwrap();
        assert_eq!(limits.concurrency, Some(3));
        assert_eq!(
            limits.rate,
            Some(RateLimit {
                limit: 10,
                window_ms: 60_000
            })
        );
        assert_eq!(spec.bound, None);
        let job_shaped = config(json!({"rate_limit": {"max_per_second": 5}})).unwrap();
        let limits = job_shaped.limits.unwrap();
        assert_eq!(
            limits.rate,
            Some(RateLimit {
                limit: 5,
                window_ms: 1_000
            })
        );
        assert_eq!(limits.concurrency, None);
        let bounded = config(json!({"backpressure": {"max_depth": 10}})).unwrap();
        assert_eq!(bounded.limits, None);
        assert_eq!(
            bounded.bound,
            Some(BoundChange::Set(Bound {
                max_depth: 10,
                strategy: Overflow::Reject,
                warning_threshold: 0.8
            }))
        );
        let queue_config_spec = config(json!({"max_size": 0, "concurrency": 2})).unwrap();
        assert_eq!(queue_config_spec.bound, Some(BoundChange::Remove));
        assert_eq!(queue_config_spec.limits.unwrap().concurrency, Some(2));
    }

    #[test]
    fn a_configuration_refuses_what_is_not_a_setting_and_names_the_field() {
        for (body, code, field) in [
            (json!({}), ErrorCode::InvalidRequest, "rate_limit"),
            (json!({"workers": 2}), ErrorCode::InvalidRequest, "workers"),
            (
                json!({"rate_limit": 3}),
                ErrorCode::InvalidRequest,
                "rate_limit",
            ),
            (
                json!({"backpressure": 3}),
                ErrorCode::InvalidRequest,
                "backpressure",
            ),
            (
                json!({"backpressure": {"max_depth": 3}, "max_size": 3}),
                ErrorCode::InvalidRequest,
                "max_size",
            ),
            (
                json!({"concurrency": 0}),
                ErrorCode::InvalidRequest,
                "rate_limit.concurrency",
            ),
            (
                json!({"retention": {"completed": "P1D"}}),
                ErrorCode::Unsupported,
                "retention",
            ),
        ] {
            let err = config(body.clone()).unwrap_err();
            assert_eq!(err.code, code, "{body}");
            assert_eq!(
                err.details.get("field").and_then(Value::as_str),
                Some(field),
                "{body}"
            );
        }
    }
}
