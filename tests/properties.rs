//! Property tests (proptest) over the pure OJS logic that reads client input: the envelope,
//! durations, retry policies, cron expressions, nesting, and the state machine driven by
//! arbitrary operation sequences. None may panic on any input, and whatever they accept
//! must stay within the documented bounds and read back. 256 cases per property with a
//! fixed seed; `OJS_SOAK=1` runs 20,000 with a random one.

use std::time::Duration;

use chrono::{DateTime, Utc};
use ojs_jetstream::domain::cron::CronSchedule;
use ojs_jetstream::domain::job::{JobRecord, Transition};
use ojs_jetstream::domain::lifecycle::{self, Delivery, Failure, LapseCause};
use ojs_jetstream::domain::retry::RetryPolicy;
use ojs_jetstream::domain::state::{self, JobState};
use ojs_jetstream::domain::{duration, envelope, time};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use serde_json::{json, Map, Value};
use uuid::Uuid;

/// CI runs a fixed seed, so a run is repeatable; the soak run (`OJS_SOAK=1`) draws a new one
/// each time (`PROPTEST_RNG_SEED` overrides both).
fn config() -> ProptestConfig {
    let soak = std::env::var_os("OJS_SOAK").is_some();
    let mut config = ProptestConfig::with_cases(if soak { 20_000 } else { 256 });
    if !soak && std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        config.rng_seed = RngSeed::Fixed(20_261_124);
    }
    config
}

fn now() -> DateTime<Utc> {
    time::parse("2026-11-24T10:30:00Z").unwrap()
}

/// Numbers where arithmetic breaks: zero, one, the bounds of each integer type, and the
/// documented maxima with their neighbours.
fn boundary_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(0)),
        Just(json!(1)),
        Just(json!(-1)),
        Just(json!(u64::MAX)),
        Just(json!(i64::MIN)),
        Just(json!(u32::MAX)),
        Just(json!(31_536_000_000u64)),
        Just(json!(31_536_000_001u64)),
        Just(json!(31_536_000)),
        Just(json!(1e300)),
        Just(json!(-0.5)),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
    ]
}

/// Duration and time texts, well-formed and not.
fn time_text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("+P100000000D".to_owned()),
        Just("+P365D".to_owned()),
        Just("9999-12-31T23:59:59.999Z".to_owned()),
        Just("+10000-01-01T00:00:00Z".to_owned()),
        (0u64..u64::MAX).prop_map(|n| format!("P{n}D")),
        (0u64..u64::MAX).prop_map(|n| format!("+PT{n}S")),
        (0u64..u64::MAX).prop_map(|n| format!("{n}h")),
        (0u32..20).prop_map(|n| format!(
            "PT{}.{}S",
            "9".repeat(n as usize),
            "9".repeat(n as usize)
        )),
        "[-+PTDHMSWhmsuµn0-9.,:Z ]{0,24}",
        ".{0,12}",
    ]
}

/// Any JSON, a few levels deep, leaning to the values that matter here.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        boundary_number(),
        time_text().prop_map(Value::String),
        ".{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(field_name(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Field names the parsers look for, and some they do not.
fn field_name() -> impl Strategy<Value = String> {
    let mut known: Vec<&str> = envelope::OPTION_KEYS.to_vec();
    known.extend([
        "type",
        "args",
        "id",
        "meta",
        "options",
        "max_attempts",
        "initial_interval",
        "max_interval",
        "initial_interval_ms",
        "max_interval_ms",
        "backoff_coefficient",
        "backoff_strategy",
        "jitter",
        "on_exhaustion",
        "non_retryable_errors",
        "specversion",
        "schema",
    ]);
    prop_oneof![
        prop::sample::select(known).prop_map(str::to_owned),
        "[a-z_]{1,6}",
    ]
}

/// An envelope-shaped request: a valid core with arbitrary options.
fn job_request() -> impl Strategy<Value = Value> {
    (
        prop::collection::btree_map(field_name(), json_value(), 0..8),
        prop::collection::btree_map(field_name(), json_value(), 0..4),
        any::<bool>(),
    )
        .prop_map(|(options, top, valid_core)| {
            let mut body: Map<String, Value> = top.into_iter().collect();
            if valid_core {
                body.insert("type".into(), json!("t.x"));
                body.insert("args".into(), json!([]));
            }
            body.insert(
                "options".into(),
                Value::Object(options.into_iter().collect()),
            );
            Value::Object(body)
        })
}

/// Every time a job carries is readable: at most the end of year 9999.
fn times_are_readable(rec: &JobRecord) {
    let j = &rec.job;
    for t in [
        j.started_at,
        j.completed_at,
        j.next_attempt_at,
        j.enqueued_at,
    ]
    .into_iter()
    .flatten()
    .chain(rec.holder.as_ref().map(|h| h.visible_until))
    {
        assert!(t <= time::LATEST, "{t}");
    }
    let back: JobRecord = serde_json::from_slice(&rec.to_bytes()).expect("a record reads back");
    // Field by field: a client's extreme floats may come back one unit in the last place off.
    assert_eq!(
        (
            &back.job.id,
            back.job.state,
            back.job.attempt,
            back.dispatch,
            back.holder.is_some()
        ),
        (
            &rec.job.id,
            rec.job.state,
            rec.job.attempt,
            rec.dispatch,
            rec.holder.is_some()
        )
    );
    assert_eq!(back.job.errors.len(), rec.job.errors.len());
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn durations_parse_without_panic_and_within_the_maximum(text in time_text()) {
        if let Some(d) = duration::parse(&text) {
            prop_assert!(d <= duration::MAX);
        }
    }

    #[test]
    fn numbers_read_as_durations_stay_within_the_maximum(v in boundary_number(), unit in prop::sample::select(vec![1u64, 1000])) {
        if let Ok(d) = duration::from_number(&v, "f", unit, false) {
            prop_assert!(d <= duration::MAX);
        }
    }

    #[test]
    fn envelopes_parse_without_panic_and_accepted_jobs_read_back(body in job_request()) {
        if let Ok(job) = envelope::parse(body, now(), Uuid::now_v7()) {
            prop_assert!(job.timeout_ms.unwrap_or(0) <= duration::MAX.as_millis() as u64);
            prop_assert!(job.visibility_timeout_ms.unwrap_or(0) <= duration::MAX.as_millis() as u64);
            prop_assert!(job.retry.max_interval <= duration::MAX);
            let rec = JobRecord { job, dispatch: 1, holder: None, transition: Transition::Created, dead_letter: None, trail: Vec::new(), slot: None, from: None, batch: None, depth_token: None };
            times_are_readable(&rec);
        }
    }

    #[test]
    fn retry_policies_parse_without_panic_and_delays_stay_capped(
        policy in json_value(), attempt in any::<u32>(), jitter in 0.0f64..2.0,
    ) {
        if let Ok(p) = RetryPolicy::from_value(&policy) {
            prop_assert!(p.delay(attempt.max(1), jitter) <= p.max_interval);
        }
    }

    #[test]
    fn cron_expressions_parse_and_tick_without_panic(
        expr in prop_oneof![
            "@every [0-9]{1,20}[smhd]{1,2}",
            "[0-9*/,-]{1,6} [0-9*/,-]{1,6} [0-9*/,-LW?]{1,4} [0-9*/,-]{1,4} [0-9*/,-]{1,4}",
            "@(yearly|monthly|weekly|daily|hourly|every|reboot)",
            ".{0,20}",
        ],
        tz in prop::sample::select(vec!["UTC", "America/New_York", "Asia/Kolkata", "Nope/Zone"]),
        offset_days in 0i64..2_932_000,
    ) {
        if let Ok(schedule) = CronSchedule::parse(&expr, tz, now()) {
            let after = time::add(now(), Duration::from_secs(offset_days as u64 * 86_400));
            if let Some(next) = schedule.next_after(after) {
                prop_assert!(next > after && next <= time::LATEST);
            }
            schedule.next_after(time::LATEST);
        }
    }

    #[test]
    fn nesting_is_checked_without_panic(v in json_value()) {
        let _ = envelope::check_depth(&v);
    }

    /// Any sequence of operations on a job keeps it in a state its history explains: every
    /// write is an allowed transition and every record reads back.
    #[test]
    fn the_state_machine_stays_consistent_under_any_operations(
        options in prop::collection::btree_map(field_name(), json_value(), 0..4),
        ops in prop::collection::vec((0u8..11, 0u64..100_000_000_000, boundary_number()), 1..40),
    ) {
        let body = json!({"type": "t.x", "args": [], "options": Value::Object(options.into_iter().collect())});
        let Ok(job) = envelope::parse(body, now(), Uuid::now_v7()) else { return Ok(()) };
        let mut rec = JobRecord::created(job, None);
        let mut t = now();
        for (n, (op, ms, value)) in ops.into_iter().enumerate() {
            t = time::add(t, Duration::from_millis(ms % 10_000_000));
            let visibility = Duration::from_millis(value.as_u64().unwrap_or(1) % (duration::MAX.as_millis() as u64 + 1));
            let delivery = Delivery { ack_subject: format!("ack.{n}"), sequence: n as u64 };
            let failure = Failure { code: "e".into(), message: "m".into(), retryable: value.is_number(), backtrace: Some(value.clone()), ..Failure::default() };
            let next = match op {
                0 => lifecycle::claim(&rec, t, Some("w"), &delivery, visibility).ok(),
                1 => lifecycle::complete(&rec, t, Some("w"), Some(value)).ok(),
                2 => lifecycle::fail(&rec, t, Some("w"), &failure, false, 1.0).ok(),
                3 => lifecycle::fail(&rec, t, None, &failure, true, 0.5).ok(),
                4 => lifecycle::cancel(&rec, t).ok().flatten(),
                5 => lifecycle::heartbeat(&rec, t, "w", visibility),
                6 => lifecycle::promote(&rec, t, rec.dispatch + 1),
                7 => (rec.job.state == JobState::Active).then(|| lifecycle::lapse(&rec, t, LapseCause::Visibility)),
                8 => lifecycle::worker_died(&rec, t, "w"),
                9 => lifecycle::retry_discarded(&rec, t).ok(),
                _ => lifecycle::expire(&rec, time::add(t, duration::MAX)),
            };
            if let Some(next) = next {
                prop_assert!(
                    next.job.state == rec.job.state || state::is_allowed(rec.job.state, next.job.state),
                    "{:?} → {:?} by op {op}", rec.job.state, next.job.state
                );
                times_are_readable(&next);
                if next.job.state == JobState::Active {
                    prop_assert!(lifecycle::deadline_of(&next, duration::MAX).is_some());
                }
                rec = next;
            }
        }
    }
}
