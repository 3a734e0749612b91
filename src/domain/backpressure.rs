//! Bounded queues (backpressure spec §5–§7, queue-config spec §6.1): a queue may hold at most
//! `max_depth` jobs that have not finished (every state but completed, cancelled and
//! discarded), across every replica (docs/architecture.md §3.27). Pure: reading a bound from
//! a queue configuration, the block timeout of a PUSH, the refusal, and when the pressure on
//! a queue is worth announcing.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::error::{ErrorCode, OjsError};
use super::fields;
use super::job::JobRecord;

/// Deepest bound: each job under a bound holds a message in NATS, and the leader looks at
/// each once after it was taken.
pub const MAX_DEPTH: u64 = 1_000_000;
/// Longest a PUSH may wait for room (`OJS-Block-Timeout`).
pub const MAX_BLOCK: Duration = Duration::from_secs(30);
/// The spec's default `warning_threshold`.
const DEFAULT_WARNING: f64 = 0.8;

/// What a PUSH to a full queue gets (backpressure spec §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overflow {
    /// Refused at once with 429 `queue_full`.
    Reject,
    /// Held until there is room or its `OJS-Block-Timeout` passes, then refused.
    Block,
    /// Accepted: the queue's oldest available jobs are discarded to make room.
    DropOldest,
}

impl Overflow {
    pub fn as_str(self) -> &'static str {
        match self {
            Overflow::Reject => "reject",
            Overflow::Block => "block",
            Overflow::DropOldest => "drop_oldest",
        }
    }
}

/// A queue's bound.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Bound {
    pub max_depth: u64,
    pub strategy: Overflow,
    /// Fraction of `max_depth` from which PUSH answers carry the pressure headers and the
    /// leader announces `backpressure.warning`.
    pub warning_threshold: f64,
}

/// What a queue configuration does to the queue's bound.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BoundChange {
    Set(Bound),
    /// `max_depth: 0`: unbounded again.
    Remove,
}

impl Bound {
    /// Reads the spec's `backpressure` object (`max_depth`, `max_size_bytes`, `strategy`,
    /// `warning_threshold`; backpressure spec §6.2), or the queue-config spec's fields
    /// (`max_size`, `max_size_bytes`, `overflow_policy`; §6.1) when `spec_fields` is the
    /// configuration itself. What is not given takes the spec's default; `max_depth` 0 or
    /// absent leaves the queue unbounded.
    ///
    /// # Errors
    /// 400 for a malformed or unknown field (a misspelt `max_depth` must not unbound the
    /// queue); 422 `unsupported` for a size bound.
    pub fn parse(o: &Map<String, Value>, spec_fields: bool) -> Result<BoundChange, OjsError> {
        // The field as the client named it, for error messages.
        let named = |spec: &str, ours: &str| {
            if spec_fields {
                spec.to_owned()
            } else {
                format!("backpressure.{ours}")
            }
        };
        let known: &[&str] = if spec_fields {
            &["max_size", "max_size_bytes", "overflow_policy"]
        } else {
            &[
                "max_depth",
                "max_size_bytes",
                "strategy",
                "warning_threshold",
            ]
        };
        if let Some(other) = o.keys().find(|k| !known.contains(&k.as_str())) {
            let field = named(other, other);
            return Err(OjsError::invalid(
                &field,
                format!(
                    "{} is not a bound setting: give {}.",
                    fields::truncated(&field),
                    known.join(", ")
                ),
            ));
        }
        let (depth_key, strategy_key) = if spec_fields {
            ("max_size", "overflow_policy")
        } else {
            ("max_depth", "strategy")
        };
        let depth_field = named("max_size", "max_depth");
        let max_depth =
            fields::integer(o.get(depth_key), &depth_field, 0..=MAX_DEPTH)?.unwrap_or(0);
        let size_field = named("max_size_bytes", "max_size_bytes");
        if fields::integer(o.get("max_size_bytes"), &size_field, 0..=u64::MAX)?.unwrap_or(0) > 0 {
            return Err(unsupported(
                &size_field,
                "bounds by size are not supported by this server; bound the queue by max_depth.",
            ));
        }
        let strategy_field = named("overflow_policy", "strategy");
        let strategy = match fields::string(o.get(strategy_key), &strategy_field)? {
            None | Some("reject") => Overflow::Reject,
            Some("block") => Overflow::Block,
            Some("drop_oldest") => Overflow::DropOldest,
            Some(other) => {
                return Err(OjsError::invalid(
                    &strategy_field,
                    format!(
                        "{strategy_field} must be reject, block or drop_oldest, got '{}'.",
                        fields::truncated(other)
                    ),
                ))
            }
        };
        let warning_field = named("warning_threshold", "warning_threshold");
        let warning_threshold = match fields::present(o.get("warning_threshold")) {
            None => DEFAULT_WARNING,
            Some(v) => v
                .as_f64()
                .filter(|t| *t > 0.0 && *t <= 1.0)
                .ok_or_else(|| {
                    OjsError::invalid(
                        &warning_field,
                        format!("{warning_field} must be a number above 0 and at most 1, got {v}."),
                    )
                })?,
        };
        if max_depth == 0 {
            return Ok(BoundChange::Remove);
        }
        Ok(BoundChange::Set(Bound {
            max_depth,
            strategy,
            warning_threshold,
        }))
    }

    /// `depth / max_depth`, at most 1 (`X-OJS-Queue-Pressure`, the pressure gauge).
    pub fn pressure(&self, depth: u64) -> f64 {
        (depth as f64 / self.max_depth as f64).min(1.0)
    }

    /// Whether `depth` is at or past the warning threshold.
    pub fn warns(&self, depth: u64) -> bool {
        depth as f64 >= self.warning_threshold * self.max_depth as f64
    }

    /// What the leader announces when it finds the queue at `depth`, having last found it
    /// warning (`warned`) or not (spec §10.1): `Some(true)` `backpressure.warning`,
    /// `Some(false)` `backpressure.cleared`, `None` nothing new.
    pub fn crossing(&self, warned: bool, depth: u64) -> Option<bool> {
        let warns = self.warns(depth);
        (warns != warned).then_some(warns)
    }

    /// The data of a backpressure event (spec §10.1): the queue, its depth and bound, and for
    /// a refusal the refused job's type.
    pub fn event_data(&self, queue: &str, depth: u64, job_type: Option<&str>) -> Value {
        let mut data = serde_json::json!({"queue": queue, "depth": depth, "bound": self.max_depth});
        if let Some(job_type) = job_type {
            data["job_type"] = Value::from(job_type);
        }
        data
    }

    /// The refusal of a PUSH to `queue` at `depth` (spec §7.1): 429 `queue_full`, whose
    /// details become the `X-OJS-Queue-Depth` and `X-OJS-Queue-Bound` headers.
    pub fn full(&self, queue: &str, depth: u64) -> OjsError {
        OjsError::new(
            ErrorCode::QueueFull,
            format!(
                "Queue '{queue}' has reached its depth bound ({}); the job was not enqueued.",
                self.max_depth
            ),
        )
        .with_detail("queue", queue)
        .with_detail("depth", depth)
        .with_detail("bound", self.max_depth)
        .with_detail("strategy", self.strategy.as_str())
    }
}

/// The `OJS-Block-Timeout` header of a PUSH (spec §5.2): whole seconds to wait for room in a
/// queue whose strategy is `block`; absent is 0 (refuse at once).
///
/// # Errors
/// 400 for anything but an integer from 0 to `MAX_BLOCK`.
pub fn block_timeout(header: Option<&str>) -> Result<Duration, OjsError> {
    let Some(raw) = header else {
        return Ok(Duration::ZERO);
    };
    raw.trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
        .filter(|d| *d <= MAX_BLOCK)
        .ok_or_else(|| {
            OjsError::invalid(
                "OJS-Block-Timeout",
                format!(
                    "OJS-Block-Timeout must be whole seconds from 0 to {}, got '{}'.",
                    MAX_BLOCK.as_secs(),
                    fields::truncated(raw)
                ),
            )
        })
}

/// Whether `rec` holds the depth token at `sequence`: it has not finished, and the token is
/// the one its PUSH (or dead-letter retry) took.
pub fn holds(rec: &JobRecord, sequence: u64) -> bool {
    !rec.job.state.is_terminal() && rec.depth_token == Some(sequence)
}

/// The depth token the write of `rec` frees: the job's, when this write finished it.
pub fn ended_token(rec: &JobRecord) -> Option<u64> {
    let finished = rec.job.state.is_terminal() && rec.from.is_none_or(|f| !f.is_terminal());
    rec.depth_token.filter(|_| finished)
}

fn unsupported(field: &str, why: &str) -> OjsError {
    OjsError::new(ErrorCode::Unsupported, format!("{field}: {why}")).with_detail("field", field)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse(v: Value, spec_fields: bool) -> Result<BoundChange, OjsError> {
        Bound::parse(v.as_object().unwrap(), spec_fields)
    }

    #[test]
    fn a_bound_reads_from_either_specs_fields_with_the_specs_defaults() {
        let set = |max_depth, strategy, warning_threshold| {
            BoundChange::Set(Bound {
                max_depth,
                strategy,
                warning_threshold,
            })
        };
        assert_eq!(
            parse(
                json!({"max_depth": 50, "strategy": "block", "warning_threshold": 0.5}),
                false
            )
            .unwrap(),
            set(50, Overflow::Block, 0.5)
        );
        assert_eq!(
            parse(json!({"max_depth": 50}), false).unwrap(),
            set(50, Overflow::Reject, 0.8)
        );
        assert_eq!(
            parse(json!({"max_size": 7, "overflow_policy": "reject"}), true).unwrap(),
            set(7, Overflow::Reject, 0.8)
        );
        assert_eq!(
            parse(
                json!({"max_size": 7, "overflow_policy": "drop_oldest"}),
                true
            )
            .unwrap(),
            set(7, Overflow::DropOldest, 0.8)
        );
        assert_eq!(
            parse(json!({"max_depth": 0}), false).unwrap(),
            BoundChange::Remove
        );
        assert_eq!(parse(json!({}), false).unwrap(), BoundChange::Remove);
    }

    #[test]
    fn a_bound_refuses_what_it_cannot_enforce_and_names_the_field() {
        for (body, spec_fields, code, field) in [
            (
                json!({"max_depth": -1}),
                false,
                ErrorCode::InvalidRequest,
                "backpressure.max_depth",
            ),
            (
                json!({"max_depth": 1_000_001}),
                false,
                ErrorCode::InvalidRequest,
                "backpressure.max_depth",
            ),
            (
                json!({"max_depth": "10"}),
                false,
                ErrorCode::InvalidRequest,
                "backpressure.max_depth",
            ),
            (
                json!({"max_size": 1.5}),
                true,
                ErrorCode::InvalidRequest,
                "max_size",
            ),
            (
                json!({"max_depth": 5, "strategy": "shout"}),
                false,
                ErrorCode::InvalidRequest,
                "backpressure.strategy",
            ),
            (
                json!({"max_depth": 5, "warning_threshold": 0}),
                false,
                ErrorCode::InvalidRequest,
                "backpressure.warning_threshold",
            ),
            (
                json!({"max_depth": 5, "warning_threshold": 1.5}),
                false,
                ErrorCode::InvalidRequest,
                "backpressure.warning_threshold",
            ),
            (
                json!({"max_depth": 5, "max_size_bytes": 1024}),
                false,
                ErrorCode::Unsupported,
                "backpressure.max_size_bytes",
            ),
            (
                json!({"maxdepth": 5}),
                false,
                ErrorCode::InvalidRequest,
                "backpressure.maxdepth",
            ),
            (
                json!({"max_size": 5, "overflow_policy": "newest"}),
                true,
                ErrorCode::InvalidRequest,
                "overflow_policy",
            ),
        ] {
            let err = parse(body.clone(), spec_fields).unwrap_err();
            assert_eq!(err.code, code, "{body}");
            let named = err.details.get("field").and_then(Value::as_str);
            assert_eq!(named, Some(field), "{body}: {}", err.message);
        }
    }

    #[test]
    fn pressure_warns_from_the_threshold_and_announces_only_crossings() {
        let bound = Bound {
            max_depth: 10,
            strategy: Overflow::Reject,
            warning_threshold: 0.8,
        };
        assert_eq!(bound.pressure(4), 0.4);
        assert_eq!(bound.pressure(12), 1.0);
        assert!(!bound.warns(7));
        assert!(bound.warns(8));
        assert_eq!(bound.crossing(false, 7), None);
        assert_eq!(bound.crossing(false, 8), Some(true));
        assert_eq!(bound.crossing(true, 9), None);
        assert_eq!(bound.crossing(true, 3), Some(false));
    }

    #[test]
    fn a_full_queue_is_a_retryable_429_naming_depth_and_bound() {
        let bound = Bound {
            max_depth: 3,
            strategy: Overflow::Block,
            warning_threshold: 0.8,
        };
        let err = bound.full("mail", 3);
        assert_eq!(err.code, ErrorCode::QueueFull);
        assert!(err.code.retryable());
        assert_eq!(err.details["depth"], json!(3));
        assert_eq!(err.details["bound"], json!(3));
        assert_eq!(err.details["strategy"], json!("block"));
        assert_eq!(err.details["queue"], json!("mail"));
    }

    #[test]
    fn a_token_is_held_until_the_write_that_finishes_its_job_frees_it() {
        use crate::domain::state::JobState;
        let mut rec = crate::domain::fixtures::record(json!({}));
        assert!(!holds(&rec, 4), "no token");
        rec.depth_token = Some(4);
        assert!(holds(&rec, 4));
        assert!(!holds(&rec, 5), "another token of the queue");
        assert_eq!(ended_token(&rec), None, "available");
        rec.from = Some(JobState::Active);
        rec.job.state = JobState::Completed;
        assert!(!holds(&rec, 4));
        assert_eq!(ended_token(&rec), Some(4));
        rec.from = Some(JobState::Completed);
        assert_eq!(ended_token(&rec), None, "a later write of a finished job");
    }

    #[test]
    fn the_block_timeout_is_whole_seconds_up_to_thirty() {
        assert_eq!(block_timeout(None).unwrap(), Duration::ZERO);
        assert_eq!(block_timeout(Some("5")).unwrap(), Duration::from_secs(5));
        for bad in ["-1", "1.5", "31", "soon", ""] {
            let err = block_timeout(Some(bad)).unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidRequest, "{bad}");
        }
    }
}
