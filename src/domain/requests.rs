//! The worker side's requests (FETCH, ACK, FAIL, BEAT; core §7.2–§7.5, HTTP binding §10):
//! every rule for their fields, as `envelope.rs` holds PUSH's. Pure; the handlers in
//! `http/workers.rs` only call these and the store.

use std::time::Duration;

use serde_json::{Map, Value};

use super::envelope::{parse_job_id, too_large, validate_queue};
use super::error::OjsError;
use super::fields::{self, missing, present, too_many, truncated};
use super::lifecycle::{Failure, MAX_ERROR_BYTES};
use super::worker::validate_worker_id;

/// Most jobs one FETCH may claim.
pub const MAX_FETCH: u64 = 1000;
/// Longest an empty FETCH may wait for a job (`wait_ms`); short enough for load balancers'
/// idle timeouts and a graceful shutdown.
pub const MAX_FETCH_WAIT_MS: u64 = 10_000;
/// Fields of a heartbeat kept on the worker's entry as it sent them.
const WORKER_INFO: [&str; 6] = [
    "hostname",
    "pid",
    "queues",
    "concurrency",
    "labels",
    "started_at",
];

/// Highest weight of a queue in a weighted FETCH.
pub const MAX_QUEUE_WEIGHT: u64 = 1000;

/// What one worker request may name, each item being NATS work (settings
/// `max_fetch_queues`, `max_heartbeat_jobs`, `max_worker_info_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Distinct queues per FETCH: each unknown one may cost a registry read.
    pub fetch_queues: usize,
    /// Distinct job ids per heartbeat: each is a read and a compare-and-set.
    pub heartbeat_jobs: usize,
    /// The worker info a heartbeat keeps (hostname, queues, labels…) as JSON: it is
    /// written into the worker's entry, which must fit in one NATS message.
    pub worker_info_bytes: usize,
}

/// A FETCH (core §7.2).
#[derive(Debug, Clone, PartialEq)]
pub struct FetchRequest {
    /// Queues in the order to try them (`strict`, the default), or to draw that order from.
    pub queues: Vec<String>,
    /// `strategy: "weighted"` (priority spec §7.2): each queue's weight, in the order of
    /// `queues`; each FETCH tries them in an order drawn by weight.
    pub weights: Option<Vec<u64>>,
    pub count: usize,
    pub worker_id: Option<String>,
    /// Reservation for these jobs; else the job's own, else the server default.
    pub visibility: Option<Duration>,
    /// How long an empty FETCH may wait for a job to arrive (long polling).
    pub wait: Option<Duration>,
}

/// An ACK (core §7.3).
#[derive(Debug, Clone, PartialEq)]
pub struct AckRequest {
    pub job_id: String,
    pub worker_id: Option<String>,
    pub result: Option<Value>,
}

/// A FAIL (core §7.4); `requeue: true` puts the job straight back (conformance case
/// worker-graceful-shutdown.json).
#[derive(Debug, Clone, PartialEq)]
pub struct FailRequest {
    pub job_id: String,
    pub worker_id: Option<String>,
    pub failure: Failure,
    pub requeue: bool,
}

/// A BEAT (worker protocol §4).
#[derive(Debug, Clone, PartialEq)]
pub struct BeatRequest {
    pub worker_id: String,
    /// Valid job ids named in any of the accepted fields, sorted, once each.
    pub active_job_ids: Vec<String>,
    pub reported_state: Option<String>,
    /// New reservation for the listed jobs; else each job's own, else the server default.
    pub visibility: Option<Duration>,
    pub info: Map<String, Value>,
}

/// A queue named twice is tried once, at its first place (with its first weight).
///
/// # Errors
/// 400 naming the first field that breaks a rule; more distinct queues than
/// `limits.fetch_queues`.
pub fn fetch(body: &Map<String, Value>, limits: &Limits) -> Result<FetchRequest, OjsError> {
    const SHAPE: &str = "an array of queue names (or {\"name\", \"weight\"} objects)";
    let listed = fields::array(body.get("queues"), "queues", SHAPE)?;
    let queues = match listed {
        Some(list) if !list.is_empty() => list
            .iter()
            .map(|q| {
                let (name, weight) = match q {
                    Value::String(name) => (name.as_str(), 1),
                    Value::Object(o) => {
                        let name = o.get("name").and_then(Value::as_str).ok_or_else(|| {
                            OjsError::invalid("queues", format!("queues must be {SHAPE}."))
                        })?;
                        let weight = fields::integer(
                            o.get("weight"),
                            "queues.weight",
                            1..=MAX_QUEUE_WEIGHT,
                        )?;
                        (name, weight.unwrap_or(1))
                    }
                    _ => {
                        return Err(OjsError::invalid(
                            "queues",
                            format!("queues must be {SHAPE}."),
                        ))
                    }
                };
                validate_queue(name)?;
                Ok((name.to_owned(), weight))
            })
            .collect::<Result<Vec<_>, OjsError>>()?,
        _ => return Err(missing("queues", "a non-empty array of queue names")),
    };
    let weighted = match body.get("strategy") {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) if s == "strict" => false,
        Some(Value::String(s)) if s == "weighted" => true,
        Some(_) => {
            return Err(OjsError::invalid(
                "strategy",
                "strategy must be \"strict\" (the default) or \"weighted\".",
            ))
        }
    };
    let count = fields::integer(body.get("count"), "count", 1..=MAX_FETCH)?.unwrap_or(1);
    let wait = fields::integer(body.get("wait_ms"), "wait_ms", 0..=MAX_FETCH_WAIT_MS)?;
    let mut seen = std::collections::HashSet::new();
    let (queues, weights): (Vec<String>, Vec<u64>) = queues
        .into_iter()
        .filter(|(name, _)| seen.insert(name.clone()))
        .unzip();
    if queues.len() > limits.fetch_queues {
        return Err(too_many(
            "queues",
            queues.len(),
            limits.fetch_queues,
            "max_fetch_queues",
        ));
    }
    Ok(FetchRequest {
        queues,
        weights: weighted.then_some(weights),
        count: count as usize,
        worker_id: worker_id(body)?,
        visibility: fields::millis(body.get("visibility_timeout_ms"), "visibility_timeout_ms")?,
        wait: wait.map(Duration::from_millis),
    })
}

impl FetchRequest {
    /// The order to try the queues in: as listed (strict), or drawn by weight, so that
    /// each queue comes first in a share of FETCHes equal to its share of the weights and
    /// every queue is tried by every FETCH (weighted random order: each queue's key is
    /// `-ln(u) / weight` for a uniform draw `u` in (0, 1], smallest first). `draw` gives
    /// the uniform draws.
    pub fn order(&self, mut draw: impl FnMut() -> f64) -> Vec<&str> {
        let Some(weights) = &self.weights else {
            return self.queues.iter().map(String::as_str).collect();
        };
        let mut keyed: Vec<(f64, &str)> = self
            .queues
            .iter()
            .zip(weights)
            .map(|(q, w)| (-draw().max(f64::MIN_POSITIVE).ln() / *w as f64, q.as_str()))
            .collect();
        keyed.sort_by(|a, b| a.0.total_cmp(&b.0));
        keyed.into_iter().map(|(_, q)| q).collect()
    }
}

/// # Errors
/// 400 for a missing or mistyped field, 404 for a `job_id` that is no job id.
pub fn ack(body: &Map<String, Value>) -> Result<AckRequest, OjsError> {
    Ok(AckRequest {
        job_id: job_id(body)?,
        worker_id: worker_id(body)?,
        result: body.get("result").cloned(),
    })
}

/// # Errors
/// 400 for a missing or mistyped field, 404 for a `job_id` that is no job id, 413 for an
/// `error` over `MAX_ERROR_BYTES`.
pub fn fail(body: &Map<String, Value>) -> Result<FailRequest, OjsError> {
    Ok(FailRequest {
        job_id: job_id(body)?,
        worker_id: worker_id(body)?,
        failure: failure(body)?,
        requeue: fields::boolean(body.get("requeue"), "requeue")?.unwrap_or(false),
    })
}

/// Accepts both request shapes: `active_jobs` as the id list, or as a count with
/// `active_job_ids` beside it (and a single `job_id`). An id that is no job id cannot name
/// a job this worker holds, so it is left out rather than refused.
///
/// # Errors
/// 400 for a missing `worker_id`, a mistyped field or more distinct job ids than
/// `limits.heartbeat_jobs`; 413 for worker info over `limits.worker_info_bytes`.
pub fn heartbeat(body: &Map<String, Value>, limits: &Limits) -> Result<BeatRequest, OjsError> {
    let worker_id = worker_id(body)?.ok_or_else(|| missing("worker_id", "the worker's id"))?;
    let mut ids = Vec::new();
    for key in ["active_jobs", "active_job_ids"] {
        if let Some(Value::Number(_)) = body.get(key) {
            continue; // a count; the ids come in `active_job_ids`
        }
        for v in fields::array(body.get(key), key, "an array of job ids")?.unwrap_or_default() {
            let id = v.as_str().ok_or_else(|| {
                OjsError::invalid(key, format!("{key} must list job ids as strings."))
            })?;
            ids.extend(parse_job_id(id));
        }
    }
    if let Some(id) = fields::non_empty_string(body.get("job_id"), "job_id")? {
        ids.extend(parse_job_id(id));
    }
    ids.sort();
    ids.dedup();
    if ids.len() > limits.heartbeat_jobs {
        return Err(too_many(
            "active_job_ids",
            ids.len(),
            limits.heartbeat_jobs,
            "max_heartbeat_jobs",
        ));
    }
    let info: Map<String, Value> = WORKER_INFO
        .into_iter()
        .filter_map(|k| body.get(k).map(|v| (k.to_owned(), v.clone())))
        .collect();
    let info_bytes = serde_json::to_vec(&info).map_or(0, |b| b.len());
    if info_bytes > limits.worker_info_bytes {
        return Err(
            too_large("worker info", info_bytes, limits.worker_info_bytes)
                .with_detail("setting", "max_worker_info_bytes"),
        );
    }
    Ok(BeatRequest {
        worker_id,
        active_job_ids: ids,
        reported_state: fields::non_empty_string(body.get("state"), "state")?.map(str::to_owned),
        visibility: fields::millis(body.get("visibility_timeout_ms"), "visibility_timeout_ms")?,
        info,
    })
}

/// The `error` object of a FAIL (core §8): `message` required, `code` defaults to
/// `handler_error`, `retryable` to true.
fn failure(body: &Map<String, Value>) -> Result<Failure, OjsError> {
    let Some(e) = fields::object(body.get("error"), "error")? else {
        return Err(missing("error", "an object with code and message"));
    };
    let bytes = serde_json::to_vec(e).map_or(0, |b| b.len());
    if bytes > MAX_ERROR_BYTES {
        return Err(too_large("error", bytes, MAX_ERROR_BYTES));
    }
    let text = |key: &str| -> Result<Option<String>, OjsError> {
        Ok(fields::string(e.get(key), &format!("error.{key}"))?.map(str::to_owned))
    };
    Ok(Failure {
        code: text("code")?.unwrap_or_else(|| "handler_error".into()),
        message: text("message")?.ok_or_else(|| missing("error.message", "what went wrong"))?,
        retryable: fields::boolean(e.get("retryable"), "error.retryable")?.unwrap_or(true),
        error_type: text("type")?,
        details: fields::object(e.get("details"), "error.details")?
            .map(|d| Value::Object(d.clone())),
        backtrace: backtrace(e.get("backtrace"))?,
    })
}

/// Frames of a FAIL's backtrace kept (core §8.1 recommends at most 50); the rest are cut.
const MAX_BACKTRACE_FRAMES: usize = 50;

/// A FAIL's `error.backtrace` as core §8.1 has it, an array of frame strings: one string
/// (a language's formatted trace) becomes its lines, and past `MAX_BACKTRACE_FRAMES`
/// frames are cut, so every client reading the job finds the type it expects.
fn backtrace(v: Option<&Value>) -> Result<Option<Value>, OjsError> {
    let frames: Vec<Value> = match present(v) {
        None => return Ok(None),
        Some(Value::String(text)) => text
            .lines()
            .filter(|line| !line.trim().is_empty())
            .map(|line| Value::String(line.to_owned()))
            .collect(),
        Some(Value::Array(frames)) if frames.iter().all(Value::is_string) => frames.clone(),
        Some(_) => {
            return Err(OjsError::invalid(
                "error.backtrace",
                "error.backtrace must be an array of strings (one per frame) or a string.",
            ))
        }
    };
    Ok(Some(Value::Array(
        frames.into_iter().take(MAX_BACKTRACE_FRAMES).collect(),
    )))
}

/// The required `job_id`; one that is no job id names no job (404).
pub(super) fn job_id(body: &Map<String, Value>) -> Result<String, OjsError> {
    let id = fields::string(body.get("job_id"), "job_id")?
        .ok_or_else(|| missing("job_id", "the job's id"))?;
    parse_job_id(id).ok_or_else(|| OjsError::not_found("job", &truncated(id)))
}

/// `worker_id`, if given, within the bounds of `validate_worker_id`.
pub(super) fn worker_id(body: &Map<String, Value>) -> Result<Option<String>, OjsError> {
    let id = fields::non_empty_string(body.get("worker_id"), "worker_id")?;
    if let Some(id) = id {
        validate_worker_id(id, "worker_id")?;
    }
    Ok(id.map(str::to_owned))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::error::ErrorCode;

    const ID: &str = "019539a4-0000-7000-8000-000000000000";
    const LIMITS: Limits = Limits {
        fetch_queues: 3,
        heartbeat_jobs: 2,
        worker_info_bytes: 64,
    };

    fn fetch(body: &Map<String, Value>) -> Result<FetchRequest, OjsError> {
        super::fetch(body, &LIMITS)
    }

    fn heartbeat(body: &Map<String, Value>) -> Result<BeatRequest, OjsError> {
        super::heartbeat(body, &LIMITS)
    }

    #[test]
    fn fetch_tries_a_repeated_queue_once_and_caps_the_distinct_ones() {
        let req = fetch(&body(json!({
            "queues": [{"name": "a", "weight": 3}, "b", "a", "b", "c", "c"],
            "strategy": "weighted",
        })))
        .unwrap();
        assert_eq!(req.queues, ["a", "b", "c"]);
        assert_eq!(req.weights, Some(vec![3, 1, 1]));
        let err = fetch(&body(json!({"queues": ["a", "b", "c", "d", "a"]}))).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidRequest);
        assert_eq!(
            (
                &err.details["field"],
                &err.details["count"],
                &err.details["max"]
            ),
            (&json!("queues"), &json!(4), &json!(3))
        );
        assert_eq!(err.details["setting"], "max_fetch_queues");
    }

    #[test]
    fn heartbeat_caps_its_distinct_job_ids_and_its_worker_info() {
        let third = "019539a4-0000-7000-8000-000000000002";
        let other = "019539a4-0000-7000-8000-000000000001";
        let twice = json!({"worker_id": "w", "active_job_ids": [ID, other, ID, other]});
        assert_eq!(heartbeat(&body(twice)).unwrap().active_job_ids.len(), 2);
        let err = heartbeat(&body(
            json!({"worker_id": "w", "active_job_ids": [ID, other], "job_id": third}),
        ))
        .unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidRequest);
        assert_eq!(
            (
                &err.details["count"],
                &err.details["max"],
                &err.details["setting"]
            ),
            (&json!(3), &json!(2), &json!("max_heartbeat_jobs"))
        );
        let info =
            json!({"worker_id": "w", "hostname": "h".repeat(40), "labels": ["l".repeat(20)]});
        let err = heartbeat(&body(info)).unwrap_err();
        assert_eq!(err.code, ErrorCode::EnvelopeTooLarge);
        assert_eq!(err.details["max_bytes"], 64);
        assert_eq!(err.details["actual_bytes"], 89);
    }

    #[test]
    fn a_strict_fetch_tries_queues_as_listed_and_a_weighted_one_draws_by_weight() {
        let strict = fetch(&body(json!({"queues": ["a", "b"]}))).unwrap();
        assert_eq!(strict.weights, None);
        assert_eq!(strict.order(|| 0.5), ["a", "b"]);

        let weighted = fetch(&body(json!({
            "queues": [{"name": "critical", "weight": 5}, {"name": "default", "weight": 2}, "low"],
            "strategy": "weighted",
        })))
        .unwrap();
        assert_eq!(weighted.queues, ["critical", "default", "low"]);
        assert_eq!(weighted.weights, Some(vec![5, 2, 1]));
        // Equal draws: the heaviest first.
        assert_eq!(weighted.order(|| 0.5), ["critical", "default", "low"]);
        // A lucky draw puts a light queue first: none starves.
        let mut draws = [0.9, 0.5, 0.999].into_iter();
        assert_eq!(
            weighted.order(|| draws.next().unwrap()),
            ["low", "critical", "default"]
        );
        // Over many FETCHes each queue leads in its share of the weights (draws from a
        // fixed xorshift sequence).
        let mut leads = std::collections::HashMap::new();
        let mut x = 0x9E37_79B9_7F4A_7C15_u64;
        for _ in 0..8000 {
            let first = weighted.order(|| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 11) as f64 / (1u64 << 53) as f64
            })[0];
            *leads.entry(first).or_insert(0u32) += 1;
        }
        for (queue, share) in [("critical", 5000), ("default", 2000), ("low", 1000)] {
            let got = leads[queue];
            assert!(got.abs_diff(share) < 250, "{queue} led {got} of 8000");
        }
    }

    #[test]
    fn malformed_strategies_and_weights_are_refused_naming_the_field() {
        for (bad, field) in [
            (json!({"queues": ["a"], "strategy": "random"}), "strategy"),
            (
                json!({"queues": [{"name": "a", "weight": 0}]}),
                "queues.weight",
            ),
            (
                json!({"queues": [{"name": "a", "weight": 1001}]}),
                "queues.weight",
            ),
            (json!({"queues": [{"weight": 2}]}), "queues"),
            (json!({"queues": [7]}), "queues"),
            (json!({"queues": [{"name": "A B", "weight": 2}]}), "queue"),
        ] {
            let err = fetch(&body(bad.clone())).unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidRequest, "{bad}");
            assert_eq!(err.details["field"], field, "{bad}");
        }
    }

    fn body(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn fetch_defaults_to_one_job_without_waiting() {
        let req = fetch(&body(json!({"queues": ["a", "b"], "count": null}))).unwrap();
        assert_eq!(req.queues, ["a", "b"]);
        assert_eq!((req.count, req.wait, req.visibility), (1, None, None));
        assert_eq!(req.worker_id, None);
    }

    #[test]
    fn fetch_reads_count_wait_visibility_and_worker() {
        let req = fetch(&body(json!({"queues": ["a"], "count": 1000, "wait_ms": 0,
            "visibility_timeout_ms": 5000, "worker_id": "w1"})))
        .unwrap();
        assert_eq!(req.count, 1000);
        assert_eq!(req.wait, Some(Duration::ZERO));
        assert_eq!(req.visibility, Some(Duration::from_secs(5)));
        assert_eq!(req.worker_id.as_deref(), Some("w1"));
    }

    #[test]
    fn fetch_refuses_what_breaks_a_bound() {
        for (bad, field) in [
            (json!({}), "queues"),
            (json!({"queues": []}), "queues"),
            (json!({"queues": "a"}), "queues"),
            (json!({"queues": [1]}), "queues"),
            (json!({"queues": ["A"]}), "queue"),
            (json!({"queues": ["a"], "count": 0}), "count"),
            (json!({"queues": ["a"], "count": 1001}), "count"),
            (json!({"queues": ["a"], "wait_ms": 10_001}), "wait_ms"),
            (
                json!({"queues": ["a"], "visibility_timeout_ms": 0}),
                "visibility_timeout_ms",
            ),
            (json!({"queues": ["a"], "worker_id": ""}), "worker_id"),
        ] {
            let err = fetch(&body(bad.clone())).unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidRequest, "{bad}");
            assert_eq!(err.details["field"], field, "{bad}");
        }
    }

    #[test]
    fn ack_needs_a_job_id_and_a_foreign_one_names_no_job() {
        let req = ack(&body(json!({"job_id": ID, "result": {"n": 1}}))).unwrap();
        assert_eq!(req.job_id, ID);
        assert_eq!(req.result, Some(json!({"n": 1})));
        assert_eq!(
            ack(&body(json!({}))).unwrap_err().code,
            ErrorCode::InvalidRequest
        );
        assert_eq!(
            ack(&body(json!({"job_id": "nope"}))).unwrap_err().code,
            ErrorCode::NotFound
        );
    }

    #[test]
    fn fail_reads_the_error_with_its_defaults() {
        let req = fail(&body(json!({"job_id": ID, "error": {"message": "boom"}}))).unwrap();
        assert_eq!(req.failure.code, "handler_error");
        assert!(req.failure.retryable);
        assert!(!req.requeue);
        let req = fail(&body(
            json!({"job_id": ID, "requeue": true, "error": {"message": "m",
            "code": "c", "type": "T", "retryable": false, "details": {"k": 1},
            "backtrace": ["f1"]}}),
        ))
        .unwrap();
        assert!(req.requeue);
        assert_eq!(req.failure.code, "c");
        assert_eq!(req.failure.error_type.as_deref(), Some("T"));
        assert!(!req.failure.retryable);
        assert_eq!(req.failure.details, Some(json!({"k": 1})));
        assert_eq!(req.failure.backtrace, Some(json!(["f1"])));
    }

    #[test]
    fn a_backtrace_becomes_an_array_of_at_most_fifty_frames() {
        let trace = |v: Value| {
            fail(&body(
                json!({"job_id": ID, "error": {"message": "m", "backtrace": v}}),
            ))
            .map(|r| r.failure.backtrace)
        };
        assert_eq!(
            trace(json!("Traceback:\n  at a\n\n  at b\n")).unwrap(),
            Some(json!(["Traceback:", "  at a", "  at b"]))
        );
        let long: Vec<String> = (0..80).map(|i| format!("f{i}")).collect();
        let kept = trace(json!(long)).unwrap().unwrap();
        assert_eq!(kept.as_array().unwrap().len(), 50);
        assert_eq!(kept[49], "f49");
        assert_eq!(trace(Value::Null).unwrap(), None);
        for bad in [json!([1, 2]), json!({"frame": "a"}), json!(7)] {
            let e = trace(bad).unwrap_err();
            assert_eq!(e.details["field"], "error.backtrace");
        }
    }

    #[test]
    fn fail_refuses_a_missing_mistyped_or_oversized_error() {
        for (bad, field) in [
            (json!({"job_id": ID}), "error"),
            (json!({"job_id": ID, "error": "boom"}), "error"),
            (json!({"job_id": ID, "error": {}}), "error.message"),
            (
                json!({"job_id": ID, "error": {"message": 1}}),
                "error.message",
            ),
            (
                json!({"job_id": ID, "error": {"message": "m", "retryable": "no"}}),
                "error.retryable",
            ),
            (
                json!({"job_id": ID, "error": {"message": "m", "details": []}}),
                "error.details",
            ),
            (
                json!({"job_id": ID, "error": {"message": "m"}, "requeue": 1}),
                "requeue",
            ),
        ] {
            let err = fail(&body(bad.clone())).unwrap_err();
            assert_eq!(err.details["field"], field, "{bad}");
        }
        let big = "x".repeat(MAX_ERROR_BYTES);
        let err = fail(&body(json!({"job_id": ID, "error": {"message": big}}))).unwrap_err();
        assert_eq!(err.code, ErrorCode::EnvelopeTooLarge);
    }

    #[test]
    fn heartbeat_takes_both_shapes_and_keeps_only_job_ids() {
        let other = "019539a4-0000-7000-8000-000000000001";
        let a = heartbeat(&body(
            json!({"worker_id": "w", "active_jobs": [ID, "junk", ID]}),
        ))
        .unwrap();
        let b = heartbeat(&body(json!({"worker_id": "w", "active_jobs": 2,
            "active_job_ids": [other], "job_id": ID, "hostname": "h", "other": 1})))
        .unwrap();
        assert_eq!(a.active_job_ids, [ID]);
        assert_eq!(b.active_job_ids, [ID, other]);
        assert_eq!(b.info, body(json!({"hostname": "h"})));
        assert!(heartbeat(&body(json!({"active_jobs": []}))).is_err());
        assert!(heartbeat(&body(json!({"worker_id": "w", "active_jobs": [1]}))).is_err());
        assert!(heartbeat(&body(json!({"worker_id": "w", "active_jobs": "x"}))).is_err());
    }
}
