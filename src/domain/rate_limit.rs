//! Queue rate limits (rate-limiting spec §5.2–§5.3, §7.2): at most `limit` job starts of a
//! queue in each window of `window`, windows aligned to the Unix epoch, across every
//! replica (docs/architecture.md §3.19) — so the long-run rate is the limit, and no span of
//! one window's length holds more than twice the limit (one burst). Pure: reading a job's
//! `rate_limit` option into the queue's limits, and which window a start falls in. A queue
//! may also cap how many of its jobs are active at once (`concurrency`, spec §5.1).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::duration;
use super::error::{ErrorCode, OjsError};
use super::job::JobRecord;
use super::state::JobState;
use super::time;

/// Most starts one window may allow (a window's starts are messages NATS keeps).
pub const MAX_LIMIT: u64 = 100_000;
/// Most jobs of one queue a concurrency limit lets run at once (each holds a message in
/// NATS, and the leader looks at each now and then).
pub const MAX_CONCURRENCY: u64 = 10_000;
/// Shortest window (a window's starts are one NATS subject; each 10 ms a new one).
pub const MIN_WINDOW: Duration = Duration::from_millis(10);
/// The shortest time NATS keeps a window's starts: it refuses a `max_age` under 100 ms.
const MIN_TOKEN_AGE: Duration = Duration::from_secs(1);
/// Longest window.
pub const MAX_WINDOW: Duration = Duration::from_secs(86_400);

/// The limit of a queue: `limit` starts in each window of `window_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimit {
    pub limit: u64,
    pub window_ms: u64,
}

/// What a job's `rate_limit` asks of its queue: starts per window, jobs active at once, or
/// both (spec §14.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    pub rate: Option<RateLimit>,
    pub concurrency: Option<u64>,
}

impl Limits {
    /// Reads a job's `rate_limit` option for its queue: `{"concurrency": N}` (at most N of
    /// the queue's jobs active at once) and/or one of `{"max_per_second": N}` (OpenAPI),
    /// `{"rate": {"limit", "period"}}` (a window) or `{"throttle": {"limit", "period"}}`
    /// (even spacing: one start per period / limit). `key` may name the queue itself;
    /// `on_limit` may be `wait` (the default: the job stays available).
    ///
    /// # Errors
    /// 400 for a malformed limit; 422 `unsupported` for what this server does not enforce
    /// (another `key`, `on_limit` other than `wait`, `rate` with `throttle`).
    pub fn parse(value: &Value, queue: &str) -> Result<Limits, OjsError> {
        let Value::Object(o) = value else {
            return Err(OjsError::invalid(
                "rate_limit",
                "rate_limit must be an object.",
            ));
        };
        let unsupported = |field: &str, what: &str| {
            OjsError::new(
                ErrorCode::Unsupported,
                format!("rate_limit.{field}: {what} is not supported by this server; the job was not enqueued."),
            )
            .with_detail("field", format!("rate_limit.{field}"))
        };
        match o.get("key") {
            None | Some(Value::Null) => {}
            Some(Value::String(k)) if k == queue => {}
            Some(_) => {
                return Err(unsupported(
                    "key",
                    "a limit shared by another key than the job's queue",
                ))
            }
        }
        let concurrency = match o.get("concurrency").filter(|v| !v.is_null()) {
            Some(v) => Some(
                v.as_u64()
                    .filter(|n| (1..=MAX_CONCURRENCY).contains(n))
                    .ok_or_else(|| {
                        OjsError::invalid(
                            "rate_limit.concurrency",
                            format!(
                                "rate_limit.concurrency must be an integer from 1 to \
                                 {MAX_CONCURRENCY} (pause a queue to run none), got {v}."
                            ),
                        )
                    })?,
            ),
            None => None,
        };
        match o.get("on_limit") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s == "wait" => {}
            Some(_) => return Err(unsupported("on_limit", "an on_limit other than wait")),
        }
        let window_of = |field: &str| window(o, field);
        let per_second = o.get("max_per_second").filter(|v| !v.is_null());
        let rate = o.get("rate").filter(|v| !v.is_null());
        let throttle = o.get("throttle").filter(|v| !v.is_null());
        let limit = match (per_second, rate, throttle) {
            (Some(n), None, None) => RateLimit {
                limit: count(n, "rate_limit.max_per_second")?,
                window_ms: 1000,
            },
            (None, Some(_), None) => window_of("rate")?,
            (None, None, Some(_)) => {
                let t = window_of("throttle")?;
                RateLimit {
                    limit: 1,
                    window_ms: t.window_ms / t.limit,
                }
            }
            (None, None, None) if concurrency.is_some() => {
                return Ok(Limits {
                    rate: None,
                    concurrency,
                })
            }
            (None, None, None) => {
                return Err(OjsError::invalid(
                    "rate_limit",
                    "rate_limit needs concurrency, max_per_second, rate or throttle.",
                ))
            }
            _ => {
                return Err(unsupported(
                    "rate",
                    "more than one of max_per_second, rate and throttle",
                ))
            }
        };
        if limit.window() < MIN_WINDOW {
            return Err(OjsError::invalid(
                "rate_limit",
                format!(
                    "a rate limit allows at most one start per {} ms.",
                    MIN_WINDOW.as_millis()
                ),
            ));
        }
        Ok(Limits {
            rate: Some(limit),
            concurrency,
        })
    }

    /// Whether the queue's jobs start one at a time, each taking what its limits allow.
    pub fn any(&self) -> bool {
        self.rate.is_some() || self.concurrency.is_some()
    }

    /// Whether no job may start at all: an override's zero (a queue's own limits are
    /// never zero).
    pub fn hold(&self) -> bool {
        self.concurrency == Some(0) || self.rate.is_some_and(|r| r.limit == 0)
    }
}

/// Fields `PUT /rate-limits/{key}` takes.
const OVERRIDE_FIELDS: [&str; 5] = ["concurrency", "rate", "limit", "period", "expires_at"];

/// An operator's limits for a queue in force instead of its own (rate-limiting spec
/// §10.2) until `expires_at`, or until removed: incident response. A zero holds the
/// queue's jobs back (none starts while it is in force), as when the API they call is down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitOverride {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<RateLimit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u64>,
    #[serde(
        default,
        with = "time::opt_millis",
        skip_serializing_if = "Option::is_none"
    )]
    pub expires_at: Option<DateTime<Utc>>,
    /// When it was set: which override a removal or its expiry ends.
    #[serde(with = "time::millis")]
    pub set_at: DateTime<Utc>,
}

impl LimitOverride {
    /// Reads `PUT /rate-limits/{key}` in the spec's form (`{"concurrency": N, "rate":
    /// {"limit", "period"}, "expires_at"}`), the admin UI's (`{"limit", "period",
    /// "expires_at"}`) and the `ojs` command line's (`{"concurrency": N}`). Zero is allowed,
    /// `expires_at` must lie ahead.
    ///
    /// # Errors
    /// 400 naming the field.
    pub fn parse(o: &Map<String, Value>, now: DateTime<Utc>) -> Result<LimitOverride, OjsError> {
        if let Some(other) = o.keys().find(|k| !OVERRIDE_FIELDS.contains(&k.as_str())) {
            return Err(OjsError::invalid(
                other,
                format!(
                    "{other} is not part of a rate-limit override: give concurrency, rate \
                     ({{limit, period}}) or limit and period, and optionally expires_at."
                ),
            ));
        }
        let given = |field: &str| o.get(field).filter(|v| !v.is_null());
        let concurrency = given("concurrency")
            .map(|v| whole(v, "concurrency", 0, MAX_CONCURRENCY))
            .transpose()?;
        let rate = match (given("rate"), given("limit").or(given("period"))) {
            (Some(_), Some(_)) => {
                return Err(OjsError::invalid(
                    "rate",
                    "Give the rate as rate: {limit, period} or as limit and period, not both.",
                ))
            }
            (Some(Value::Object(r)), None) => Some(limit_per_period(r, "rate", 0)?),
            (Some(_), None) => {
                return Err(OjsError::invalid(
                    "rate",
                    "rate must be an object with limit and period.",
                ))
            }
            (None, Some(_)) => Some(limit_per_period(o, "", 0)?),
            (None, None) => None,
        };
        if rate.is_some_and(|r| r.window() < MIN_WINDOW) {
            return Err(OjsError::invalid(
                "period",
                format!("A rate's period is at least {} ms.", MIN_WINDOW.as_millis()),
            ));
        }
        if rate.is_none() && concurrency.is_none() {
            return Err(OjsError::invalid(
                "concurrency",
                "A rate-limit override names concurrency, a rate, or both.",
            ));
        }
        let expires_at = match given("expires_at") {
            None => None,
            Some(v) => Some(
                v.as_str()
                    .and_then(time::parse)
                    .filter(|t| *t > now)
                    .ok_or_else(|| {
                        OjsError::invalid(
                            "expires_at",
                            format!("expires_at must be an RFC 3339 time after now, got {v}."),
                        )
                    })?,
            ),
        };
        // To the millisecond, as the registry stores them: `set_at` names the override a
        // removal ends, compared with the stored copy.
        Ok(LimitOverride {
            rate,
            concurrency,
            expires_at: expires_at.map(time::to_millis),
            set_at: time::to_millis(now),
        })
    }

    /// Whether it is in force at `now`.
    pub fn in_force(&self, now: DateTime<Utc>) -> bool {
        self.expires_at.is_none_or(|end| now < end)
    }

    /// The limits in force over a queue's `own`: what the override names, the rest as they
    /// are.
    pub fn over(&self, own: Limits) -> Limits {
        Limits {
            rate: self.rate.or(own.rate),
            concurrency: self.concurrency.or(own.concurrency),
        }
    }
}

impl RateLimit {
    pub fn window(&self) -> Duration {
        Duration::from_millis(self.window_ms)
    }

    /// The window a start at `now_ms` (Unix milliseconds) falls in.
    pub fn window_index(&self, now_ms: i64) -> i64 {
        now_ms.div_euclid(self.window_ms as i64)
    }

    /// How long NATS keeps a window's starts: past the window they only count for the
    /// window's own subject, nobody publishes there again, so keeping them two windows
    /// is cleanup, never the limit.
    pub fn token_max_age(&self) -> Duration {
        (2 * self.window()).max(MIN_TOKEN_AGE)
    }

    /// How long a FETCH on this queue waits before it looks again: when it found the
    /// window spent, until the next window begins (plus `jitter`, so the FETCHes that
    /// waited do not all arrive at one instant); else the spacing of starts, within 20 ms
    /// to 250 ms, to see jobs enqueued meanwhile.
    pub fn recheck(&self, now_ms: i64, spent: bool, jitter: Duration) -> Duration {
        if spent {
            let next = (self.window_index(now_ms) + 1) * self.window_ms as i64;
            return Duration::from_millis((next - now_ms) as u64) + jitter;
        }
        Duration::from_millis(self.window_ms / self.limit)
            .clamp(Duration::from_millis(20), Duration::from_millis(250))
    }
}

/// Whether `rec` still runs under the concurrency place (message `sequence`) that dispatch
/// `dispatch` of it took: else the place is left over and may be freed.
pub fn holds_slot(rec: &JobRecord, dispatch: u64, sequence: u64) -> bool {
    rec.job.state == JobState::Active
        && rec.dispatch == dispatch
        && rec.holder.as_ref().and_then(|h| h.slot) == Some(sequence)
}

/// A whole number from `min` to `max` under `field`.
fn whole(v: &Value, field: &str, min: u64, max: u64) -> Result<u64, OjsError> {
    v.as_u64()
        .filter(|n| (min..=max).contains(n))
        .ok_or_else(|| {
            OjsError::invalid(
                field,
                format!("{field} must be an integer from {min} to {max}, got {v}."),
            )
        })
}

fn count(v: &Value, field: &str) -> Result<u64, OjsError> {
    whole(v, field, 1, MAX_LIMIT)
}

/// `{"limit": N, "period": "<ISO duration>"}` under `field`.
fn window(o: &Map<String, Value>, field: &str) -> Result<RateLimit, OjsError> {
    let path = format!("rate_limit.{field}");
    let Some(Value::Object(w)) = o.get(field) else {
        return Err(OjsError::invalid(
            &path,
            format!("{path} must be an object with limit and period."),
        ));
    };
    limit_per_period(w, &path, 1)
}

/// `limit` (from `min`) starts per `period` (ISO 8601 or Go-style, at most a day), the
/// fields of `o`, reported under `path` (none: at the top level).
fn limit_per_period(o: &Map<String, Value>, path: &str, min: u64) -> Result<RateLimit, OjsError> {
    let name = |field: &str| {
        if path.is_empty() {
            field.to_owned()
        } else {
            format!("{path}.{field}")
        }
    };
    let limit = whole(
        o.get("limit").unwrap_or(&Value::Null),
        &name("limit"),
        min,
        MAX_LIMIT,
    )?;
    let period = o
        .get("period")
        .and_then(Value::as_str)
        .and_then(duration::parse)
        .filter(|d| *d <= MAX_WINDOW && !d.is_zero())
        .ok_or_else(|| {
            let field = name("period");
            OjsError::invalid(
                &field,
                format!("{field} must be an ISO 8601 duration from 1 ms to 1 day."),
            )
        })?;
    Ok(RateLimit {
        limit,
        window_ms: period.as_millis() as u64,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse(v: Value) -> Result<RateLimit, OjsError> {
        Ok(Limits::parse(&v, "q")?.rate.expect("a rate"))
    }

    #[test]
    fn a_place_is_held_only_by_the_dispatch_running_under_it() {
        let mut rec = crate::domain::fixtures::record(json!({}));
        assert!(!holds_slot(&rec, 1, 7), "available");
        rec.job.state = JobState::Active;
        rec.holder = Some(crate::domain::job::Holder {
            worker_id: None,
            ack_subject: "ack".into(),
            sequence: 1,
            visible_until: crate::domain::fixtures::now(),
            last_beat: None,
            slot: Some(7),
            visibility_ms: None,
        });
        assert!(holds_slot(&rec, 1, 7));
        assert!(!holds_slot(&rec, 1, 8), "another place");
        assert!(!holds_slot(&rec, 2, 7), "another dispatch");
    }

    #[test]
    fn a_concurrency_limit_stands_alone_or_beside_a_rate() {
        let alone = Limits::parse(&json!({"concurrency": 5}), "q").unwrap();
        assert_eq!(
            alone,
            Limits {
                rate: None,
                concurrency: Some(5)
            }
        );
        assert!(alone.any());
        let both = Limits::parse(
            &json!({"key": "q", "concurrency": 3, "max_per_second": 2}),
            "q",
        )
        .unwrap();
        assert_eq!(both.concurrency, Some(3));
        assert_eq!(both.rate.unwrap().limit, 2);
        assert!(!Limits::default().any());
        for bad in [
            json!({"concurrency": 0}),
            json!({"concurrency": 10_001}),
            json!({"concurrency": "5"}),
        ] {
            let err = Limits::parse(&bad, "q").unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidRequest, "{bad}");
            assert_eq!(err.details["field"], "rate_limit.concurrency");
        }
    }

    #[test]
    fn every_form_reads_as_starts_per_window() {
        let per_second = parse(json!({"max_per_second": 5})).unwrap();
        assert_eq!((per_second.limit, per_second.window_ms), (5, 1000));
        let rate = parse(json!({"key": "q", "rate": {"limit": 100, "period": "PT1M"}})).unwrap();
        assert_eq!((rate.limit, rate.window_ms), (100, 60_000));
        let throttle = parse(json!({"throttle": {"limit": 10, "period": "PT1S"}})).unwrap();
        assert_eq!((throttle.limit, throttle.window_ms), (1, 100));
    }

    #[test]
    fn starts_fall_in_windows_aligned_to_the_epoch() {
        let per_second = parse(json!({"max_per_second": 5})).unwrap();
        assert_eq!(per_second.window_index(0), 0);
        assert_eq!(per_second.window_index(999), 0);
        assert_eq!(per_second.window_index(1000), 1);
        assert_eq!(per_second.window_index(1_764_000_123_456), 1_764_000_123);
        // NATS keeps starts for two windows, never under a second.
        assert_eq!(per_second.token_max_age(), Duration::from_secs(2));
        let fast = parse(json!({"throttle": {"limit": 100, "period": "PT1S"}})).unwrap();
        assert_eq!(fast.token_max_age(), Duration::from_secs(1));
        let daily = parse(json!({"rate": {"limit": 3, "period": "P1D"}})).unwrap();
        assert_eq!(daily.token_max_age(), Duration::from_secs(2 * 86_400));
    }

    #[test]
    fn a_spent_window_is_looked_at_again_when_the_next_begins() {
        let per_second = parse(json!({"max_per_second": 5})).unwrap();
        let jitter = Duration::from_millis(3);
        assert_eq!(
            per_second.recheck(10_250, true, jitter),
            Duration::from_millis(753)
        );
        // Not spent: the spacing of starts, to see jobs enqueued meanwhile.
        assert_eq!(
            per_second.recheck(10_250, false, jitter),
            Duration::from_millis(200)
        );
        let throttle = parse(json!({"throttle": {"limit": 10, "period": "PT1S"}})).unwrap();
        assert_eq!(
            throttle.recheck(0, false, jitter),
            Duration::from_millis(100)
        );
        let daily = parse(json!({"rate": {"limit": 3, "period": "P1D"}})).unwrap();
        assert_eq!(daily.recheck(0, false, jitter), Duration::from_millis(250));
    }

    #[test]
    fn malformed_limits_are_400_and_unenforced_ones_422() {
        for bad in [
            json!("fast"),
            json!({}),
            json!({"max_per_second": 0}),
            json!({"max_per_second": -1}),
            json!({"max_per_second": 1.5}),
            json!({"rate": {"limit": 1}}),
            json!({"rate": {"limit": 1, "period": "P2D"}}),
            json!({"throttle": {"limit": 1000, "period": "PT1S"}}),
        ] {
            assert_eq!(
                Limits::parse(&bad, "q").unwrap_err().code,
                ErrorCode::InvalidRequest,
                "{bad}"
            );
        }
        for unsupported in [
            json!({"key": "stripe", "max_per_second": 1}),
            json!({"on_limit": "drop", "max_per_second": 1}),
            json!({"max_per_second": 1, "rate": {"limit": 1, "period": "PT1S"}}),
        ] {
            assert_eq!(
                Limits::parse(&unsupported, "q").unwrap_err().code,
                ErrorCode::Unsupported,
                "{unsupported}"
            );
        }
    }

    fn read_override(v: &Value, now: DateTime<Utc>) -> Result<LimitOverride, OjsError> {
        LimitOverride::parse(v.as_object().expect("an object"), now)
    }

    #[test]
    fn an_override_takes_the_specs_the_admin_uis_and_the_command_lines_forms() {
        let now = crate::domain::fixtures::now();
        let later = time::format(now + chrono::Duration::hours(1));
        let spec = read_override(
            &json!({"concurrency": 0, "rate": {"limit": 5, "period": "PT1M"}, "expires_at": later}),
            now,
        )
        .unwrap();
        assert_eq!(spec.concurrency, Some(0));
        assert_eq!(
            spec.rate,
            Some(RateLimit {
                limit: 5,
                window_ms: 60_000
            })
        );
        assert_eq!(spec.expires_at.map(time::format), Some(later));
        assert_eq!(spec.set_at, now);
        let ui = read_override(&json!({"limit": 100, "period": "1m"}), now).unwrap();
        assert_eq!(
            (ui.rate, ui.concurrency, ui.expires_at),
            (
                Some(RateLimit {
                    limit: 100,
                    window_ms: 60_000
                }),
                None,
                None
            )
        );
        let cli = read_override(&json!({"concurrency": 20}), now).unwrap();
        assert_eq!((cli.rate, cli.concurrency), (None, Some(20)));
        // Stored and read back, it is the same override (a removal names it by `set_at`).
        let precise = now + chrono::Duration::nanoseconds(123_456_789);
        let set = read_override(&json!({"concurrency": 1}), precise).unwrap();
        let stored: LimitOverride =
            serde_json::from_value(serde_json::to_value(set).unwrap()).unwrap();
        assert_eq!(stored, set);
        for (bad, field) in [
            (json!({}), "concurrency"),
            (json!({"concurrency": -1}), "concurrency"),
            (json!({"concurrency": 10_001}), "concurrency"),
            (json!({"limit": 5}), "period"),
            (json!({"limit": 5, "period": "PT0.001S"}), "period"),
            (json!({"rate": {"limit": 5}}), "rate.period"),
            (json!({"rate": 5}), "rate"),
            (
                json!({"rate": {"limit": 1, "period": "PT1S"}, "limit": 2}),
                "rate",
            ),
            (
                json!({"concurrency": 1, "expires_at": "2020-01-01T00:00:00Z"}),
                "expires_at",
            ),
            (
                json!({"concurrency": 1, "expires_at": "soon"}),
                "expires_at",
            ),
            (json!({"concurrency": 1, "key": "other"}), "key"),
        ] {
            let err = read_override(&bad, now).unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidRequest, "{bad}");
            assert_eq!(err.details["field"], field, "{bad}");
        }
    }

    #[test]
    fn an_override_rules_what_it_names_until_it_expires_and_a_zero_holds_all() {
        let now = crate::domain::fixtures::now();
        let own = Limits {
            rate: Some(RateLimit {
                limit: 10,
                window_ms: 1000,
            }),
            concurrency: Some(5),
        };
        let lower = LimitOverride {
            rate: None,
            concurrency: Some(2),
            expires_at: Some(now + chrono::Duration::seconds(1)),
            set_at: now,
        };
        assert_eq!(
            lower.over(own),
            Limits {
                concurrency: Some(2),
                ..own
            }
        );
        assert!(lower.in_force(now));
        assert!(!lower.in_force(now + chrono::Duration::seconds(1)));
        assert!(!lower.over(own).hold());
        let zero = LimitOverride {
            concurrency: Some(0),
            expires_at: None,
            ..lower
        };
        assert!(zero.in_force(now + chrono::Duration::days(999)));
        assert!(zero.over(own).hold());
        let no_starts = LimitOverride {
            rate: Some(RateLimit {
                limit: 0,
                window_ms: 1000,
            }),
            concurrency: None,
            ..zero
        };
        assert!(no_starts.over(Limits::default()).hold());
        assert!(!own.hold());
    }
}
