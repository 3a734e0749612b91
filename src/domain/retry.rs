//! Retry policy (retry spec §2–§7, JSON format §3.4): parsing with field-naming
//! validation errors, the backoff delay, and which errors may be retried. Jitter is an input,
//! so the math is deterministic under test.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::duration;
use super::error::OjsError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackoffStrategy {
    Exponential,
    Linear,
    Constant,
    Polynomial,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnExhaustion {
    Discard,
    DeadLetter,
}

/// The effective policy of a job: the client's fields merged over the defaults (retry §8.1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetryPolicy {
    pub max_attempts: u32,
    #[serde(with = "iso")]
    pub initial_interval: Duration,
    pub backoff_coefficient: f64,
    #[serde(with = "iso")]
    pub max_interval: Duration,
    pub jitter: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub non_retryable_errors: Vec<String>,
    pub on_exhaustion: OnExhaustion,
    pub backoff_strategy: BackoffStrategy,
}

impl Default for RetryPolicy {
    /// Core §5.2: three attempts, exponential backoff with jitter.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            initial_interval: Duration::from_secs(1),
            backoff_coefficient: 2.0,
            max_interval: Duration::from_secs(300),
            jitter: true,
            non_retryable_errors: Vec::new(),
            on_exhaustion: OnExhaustion::Discard,
            backoff_strategy: BackoffStrategy::Exponential,
        }
    }
}

/// The policy with camelCase names (`maxAttempts`, as the official JavaScript client sends
/// it, clients.md item 13) also under the spec's snake_case ones; a snake_case name given
/// beside its camelCase twin wins.
fn snake_cased(obj: &Map<String, Value>) -> Map<String, Value> {
    let mut out = obj.clone();
    for (key, value) in obj {
        let mut snake = String::with_capacity(key.len() + 4);
        for c in key.chars() {
            if c.is_ascii_uppercase() {
                snake.push('_');
                snake.push(c.to_ascii_lowercase());
            } else {
                snake.push(c);
            }
        }
        if snake != *key {
            out.entry(snake).or_insert_with(|| value.clone());
        }
    }
    out
}

impl RetryPolicy {
    /// Parses a client policy object. Every problem is a 422 naming the field (conformance
    /// case retry-validation-invalid-max-attempts.json).
    pub fn from_value(v: &Value) -> Result<RetryPolicy, OjsError> {
        RetryPolicy::from_value_over(v, RetryPolicy::default())
    }

    /// Like [`RetryPolicy::from_value`], with `base` for the fields the client left out.
    pub fn from_value_over(v: &Value, base: RetryPolicy) -> Result<RetryPolicy, OjsError> {
        let obj = &snake_cased(
            v.as_object()
                .ok_or_else(|| OjsError::unprocessable("retry", "retry must be an object"))?,
        );
        let mut p = base;
        if let Some(v) = present(obj, "max_attempts") {
            p.max_attempts = max_attempts(v, "retry.max_attempts")?;
        }
        if let Some(d) = interval(obj, "initial_interval")? {
            if d.is_zero() {
                return Err(OjsError::unprocessable(
                    "retry.initial_interval",
                    "retry.initial_interval must be greater than zero",
                ));
            }
            p.initial_interval = d;
        }
        if let Some(v) = present(obj, "backoff_coefficient") {
            p.backoff_coefficient = v
                .as_f64()
                .filter(|c| c.is_finite() && *c >= 1.0)
                .ok_or_else(|| field_error("backoff_coefficient", "must be a number >= 1.0", v))?;
        }
        match interval(obj, "max_interval")? {
            Some(d) => p.max_interval = d,
            None => p.max_interval = p.max_interval.max(p.initial_interval),
        }
        if p.max_interval < p.initial_interval {
            return Err(OjsError::unprocessable(
                "retry.max_interval",
                "retry.max_interval must not be shorter than retry.initial_interval",
            ));
        }
        if let Some(v) = present(obj, "jitter") {
            p.jitter = v
                .as_bool()
                .ok_or_else(|| field_error("jitter", "must be a boolean", v))?;
        }
        if let Some(v) = present(obj, "non_retryable_errors") {
            p.non_retryable_errors = v
                .as_array()
                .and_then(|a| {
                    a.iter()
                        .map(|e| e.as_str().map(str::to_owned))
                        .collect::<Option<Vec<_>>>()
                })
                .ok_or_else(|| {
                    field_error("non_retryable_errors", "must be an array of strings", v)
                })?;
        }
        if let Some(v) = present(obj, "on_exhaustion") {
            p.on_exhaustion = match v.as_str().map(str::to_ascii_lowercase).as_deref() {
                Some("discard") => OnExhaustion::Discard,
                Some("dead_letter") => OnExhaustion::DeadLetter,
                _ => {
                    return Err(field_error(
                        "on_exhaustion",
                        "must be discard or dead_letter",
                        v,
                    ))
                }
            };
        }
        for key in ["backoff_strategy", "backoff_type", "backoff"] {
            if let Some(v) = present(obj, key) {
                p.backoff_strategy = match v.as_str() {
                    Some("exponential") => BackoffStrategy::Exponential,
                    Some("linear") => BackoffStrategy::Linear,
                    Some("constant" | "none") => BackoffStrategy::Constant,
                    Some("polynomial") => BackoffStrategy::Polynomial,
                    _ => {
                        return Err(field_error(
                            key,
                            "must be exponential, linear, constant, none or polynomial",
                            v,
                        ))
                    }
                };
            }
        }
        Ok(p)
    }

    /// The delay after failed attempt `attempt` (1-based), before jitter and the cap
    /// (retry §3).
    pub fn raw_delay_ms(&self, attempt: u32) -> f64 {
        let i = self.initial_interval.as_millis() as f64;
        let n = f64::from(attempt.max(1));
        match self.backoff_strategy {
            BackoffStrategy::Exponential => i * self.backoff_coefficient.powf(n - 1.0),
            BackoffStrategy::Linear => i * n,
            BackoffStrategy::Constant => i,
            BackoffStrategy::Polynomial => i * n.powf(self.backoff_coefficient),
        }
    }

    /// The delay to wait after failed attempt `attempt`. `jitter_factor` is a uniform draw
    /// from [0.5, 1.5), used only when the policy has jitter on.
    pub fn delay(&self, attempt: u32, jitter_factor: f64) -> Duration {
        let cap = self.max_interval.as_millis() as f64;
        let mut d = self.raw_delay_ms(attempt).min(cap);
        if self.jitter {
            d = (d * jitter_factor).min(cap);
        }
        Duration::from_millis(d.max(0.0).round() as u64)
    }

    /// Retry §6: an error type listed exactly, or matched by a `prefix.*` entry, is final.
    pub fn is_non_retryable(&self, error_type: &str) -> bool {
        self.non_retryable_errors
            .iter()
            .any(|pattern| match pattern.strip_suffix('*') {
                Some(prefix) => error_type.starts_with(prefix),
                None => pattern == error_type,
            })
    }
}

/// A key that is present and not `null` (a client `null` means "absent", JSON format §14.2).
fn present<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

/// A `max_attempts` value; `field` names it in the 422.
///
/// # Errors
/// 422 when it is no non-negative integer of 32 bits.
pub fn max_attempts(v: &Value, field: &str) -> Result<u32, OjsError> {
    v.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| {
            OjsError::unprocessable(
                field,
                format!("{field} must be a non-negative integer, got {v}"),
            )
        })
}

fn field_error(field: &str, rule: &str, got: &Value) -> OjsError {
    OjsError::unprocessable(
        &format!("retry.{field}"),
        format!("retry.{field} {rule}, got {got}"),
    )
}

/// An interval given as a duration string (`initial_interval`) or as `<name>_ms`.
fn interval(obj: &Map<String, Value>, name: &str) -> Result<Option<Duration>, OjsError> {
    if let Some(v) = present(obj, name) {
        return v
            .as_str()
            .and_then(duration::parse)
            .map(Some)
            .ok_or_else(|| {
                let rule = format!(
                    "must be an ISO 8601 duration such as PT1S, at most {}",
                    duration::MAX_TEXT
                );
                field_error(name, &rule, v)
            });
    }
    let ms_key = format!("{name}_ms");
    if let Some(v) = present(obj, &ms_key) {
        return duration::from_number(v, &ms_key, 1, false)
            .map(Some)
            .map_err(|e| OjsError::unprocessable(&format!("retry.{ms_key}"), e.message));
    }
    Ok(None)
}

mod iso {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::duration::format_iso(*d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        super::duration::parse(&text)
            .ok_or_else(|| serde::de::Error::custom(format!("bad duration {text:?}")))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn policy(v: Value) -> RetryPolicy {
        RetryPolicy::from_value(&v).unwrap()
    }

    #[test]
    fn partial_policy_merges_over_defaults() {
        let p = policy(json!({"max_attempts": 5}));
        assert_eq!(p.max_attempts, 5);
        assert_eq!(p.initial_interval, Duration::from_secs(1));
        assert!(p.jitter);
    }

    #[test]
    fn camel_case_names_read_as_the_spec_names() {
        let p = policy(
            json!({"maxAttempts": 2, "initialInterval": "PT2S", "onExhaustion": "dead_letter"}),
        );
        assert_eq!(p.max_attempts, 2);
        assert_eq!(p.initial_interval, Duration::from_secs(2));
        assert_eq!(p.on_exhaustion, OnExhaustion::DeadLetter);
        let both = policy(json!({"maxAttempts": 2, "max_attempts": 7}));
        assert_eq!(both.max_attempts, 7);
    }

    #[test]
    fn invalid_max_attempts_names_the_field() {
        let err = RetryPolicy::from_value(&json!({"max_attempts": -1})).unwrap_err();
        assert_eq!(err.category, crate::domain::error::Category::Semantic);
        assert!(err.message.contains("max_attempts"));
    }

    #[test]
    fn rejects_bad_fields() {
        for bad in [
            json!({"initial_interval": "soon"}),
            json!({"initial_interval": "PT0S"}),
            json!({"backoff_coefficient": 0.5}),
            json!({"max_interval": "PT1S", "initial_interval": "PT2S"}),
            json!({"jitter": "yes"}),
            json!({"non_retryable_errors": [1]}),
            json!({"on_exhaustion": "explode"}),
            json!({"backoff_strategy": "random"}),
            json!([]),
        ] {
            assert!(RetryPolicy::from_value(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn strategies_give_the_retry_spec_delays() {
        let exp = policy(json!({"jitter": false}));
        assert_eq!(exp.delay(1, 1.0).as_millis(), 1000);
        assert_eq!(exp.delay(2, 1.0).as_millis(), 2000);
        assert_eq!(exp.delay(3, 1.0).as_millis(), 4000);
        let lin = policy(json!({"jitter": false, "backoff_strategy": "linear"}));
        assert_eq!(
            (1..=3)
                .map(|n| lin.delay(n, 1.0).as_millis())
                .collect::<Vec<_>>(),
            [1000, 2000, 3000]
        );
        let capped =
            policy(json!({"jitter": false, "backoff_coefficient": 10.0, "max_interval": "PT2S"}));
        assert_eq!(
            (1..=3)
                .map(|n| capped.delay(n, 1.0).as_millis())
                .collect::<Vec<_>>(),
            [1000, 2000, 2000]
        );
        let poly = policy(
            json!({"jitter": false, "backoff_strategy": "polynomial", "backoff_coefficient": 2.0}),
        );
        assert_eq!(poly.delay(3, 1.0).as_millis(), 9000);
    }

    #[test]
    fn jitter_stays_within_half_and_cap() {
        let p = policy(json!({"initial_interval": "PT2S", "backoff_coefficient": 1.0}));
        assert_eq!(p.delay(1, 0.5).as_millis(), 1000);
        assert_eq!(p.delay(1, 1.499).as_millis(), 2998);
        let tight = policy(json!({"initial_interval": "PT2S", "max_interval": "PT2S"}));
        assert_eq!(tight.delay(1, 1.49).as_millis(), 2000);
    }

    #[test]
    fn non_retryable_matches_exactly_or_by_prefix() {
        let p = policy(json!({"non_retryable_errors": ["ValidationError", "auth.*"]}));
        assert!(p.is_non_retryable("ValidationError"));
        assert!(p.is_non_retryable("auth.expired"));
        assert!(!p.is_non_retryable("ValidationErrorX"));
        assert!(!p.is_non_retryable("network.reset"));
    }

    #[test]
    fn serializes_durations_as_iso() {
        let v = serde_json::to_value(policy(json!({"initial_interval_ms": 500}))).unwrap();
        assert_eq!(v["initial_interval"], "PT0.5S");
        assert_eq!(v["max_interval"], "PT5M");
        let back: RetryPolicy = serde_json::from_value(v).unwrap();
        assert_eq!(back.initial_interval, Duration::from_millis(500));
    }
}
