//! Unique jobs (unique-jobs spec): the policy, the uniqueness key of a job, and what an
//! enqueue does when it finds the key's lock (docs/architecture.md §3.18). Pure: the store
//! reads the lock and the job it names and writes what [`decide`] says.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use unicode_normalization::UnicodeNormalization;

use super::duration;
use super::error::OjsError;
use super::job::Job;
use super::state::JobState;
use super::time;

/// The dimensions a policy may name (spec §3).
const DIMENSIONS: [&str; 4] = ["type", "queue", "args", "meta"];
/// Most entries in one of the policy's lists: the key is hashed from what they select.
const MAX_NAMES: usize = 64;
/// Longest key a caller chooses itself (`key` as a string).
const MAX_CHOSEN_KEY: usize = 1024;

/// What an enqueue does with a job whose key is held by another (spec §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnConflict {
    Reject,
    Replace,
    /// Replace, keeping the existing job's `scheduled_at` while it waits for it.
    ReplaceExceptSchedule,
    /// `ignore` and `use_existing` (OpenAPI's name): 200 with the existing job.
    Ignore,
}

/// A job's `unique` option, validated (spec §2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UniquePolicy {
    /// `queue`, `args`, `meta` as named; `type` is always part of the key.
    pub queue: bool,
    pub args: bool,
    pub meta: bool,
    pub args_keys: Option<Vec<String>>,
    pub meta_keys: Vec<String>,
    /// A key the caller chose itself (`key` as a string, the `ojs` command line's
    /// `--unique-key`), hashed with the selected dimensions.
    pub chosen_key: Option<String>,
    pub period: Option<Duration>,
    pub states: Vec<JobState>,
    pub on_conflict: OnConflict,
}

impl UniquePolicy {
    /// Reads and checks a `unique` option against the job's `args` (spec §2.2). `key` is
    /// read as the dimension list when every entry names a dimension (the Python client
    /// sends `key: ["type", "args"]`), as a key of the caller's own when it is a string
    /// (the `ojs` command line), else as `args_keys` (JSON format §3.5). `within` is the
    /// command line's name for `period`.
    ///
    /// # Errors
    /// 400 `invalid_request` naming the field.
    pub fn parse(value: &Value, args: &[Value]) -> Result<UniquePolicy, OjsError> {
        let Value::Object(o) = value else {
            return Err(OjsError::invalid("unique", "unique must be an object."));
        };
        let chosen_key = match o.get("key") {
            Some(Value::String(k)) if k.is_empty() || k.len() > MAX_CHOSEN_KEY => {
                return Err(OjsError::invalid(
                    "unique.key",
                    format!(
                        "unique.key as a string must have 1 to {MAX_CHOSEN_KEY} bytes, got {}.",
                        k.len()
                    ),
                ))
            }
            Some(Value::String(k)) => Some(k.clone()),
            _ => None,
        };
        let keys_field = o.get("keys").or_else(|| {
            o.get("key").filter(|k| {
                names(k).is_some_and(|n| n.iter().all(|d| DIMENSIONS.contains(&d.as_str())))
            })
        });
        let keys = match keys_field {
            None | Some(Value::Null) => vec!["type".to_owned()],
            Some(v) => names(v).ok_or_else(|| list_error("unique.keys"))?,
        };
        if let Some(bad) = keys.iter().find(|k| !DIMENSIONS.contains(&k.as_str())) {
            return Err(OjsError::invalid(
                "unique.keys",
                format!(
                    "unique.keys names {bad:?}; the dimensions are type, queue, args and meta."
                ),
            ));
        }
        let has = |d: &str| keys.iter().any(|k| k == d);
        let args_field = o.get("args_keys").or_else(|| {
            o.get("key")
                .filter(|_| keys_field.is_none() && chosen_key.is_none())
        });
        let args_keys = match args_field {
            None | Some(Value::Null) => None,
            Some(v) => Some(names(v).ok_or_else(|| list_error("unique.args_keys"))?),
        };
        let args_selected = has("args") || (args_keys.is_some() && keys_field.is_none());
        if let Some(wanted) = &args_keys {
            let present = |k: &String| {
                args.iter()
                    .any(|a| a.as_object().is_some_and(|m| m.contains_key(k)))
            };
            if let Some(missing) = wanted.iter().find(|k| !present(k)) {
                return Err(OjsError::invalid(
                    "unique.args_keys",
                    format!("unique.args_keys names {missing:?}, which no object in args has."),
                ));
            }
        }
        let meta_keys = match o.get("meta_keys") {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => names(v).ok_or_else(|| list_error("unique.meta_keys"))?,
        };
        if has("meta") && meta_keys.is_empty() {
            return Err(OjsError::invalid(
                "unique.meta_keys",
                "unique.meta_keys must name the meta keys when unique.keys includes meta.",
            ));
        }
        let (period_name, period_field) = match o.get("period") {
            None | Some(Value::Null) => ("unique.within", o.get("within")),
            given => ("unique.period", given),
        };
        let period = match period_field {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(duration::parse(s).ok_or_else(|| {
                OjsError::invalid(
                    period_name,
                    format!(
                        "{period_name} must be an ISO 8601 duration of at most {}, got {s:?}.",
                        duration::MAX_TEXT
                    ),
                )
            })?),
            Some(_) => {
                return Err(OjsError::invalid(
                    period_name,
                    format!("{period_name} must be an ISO 8601 duration such as \"PT1H\"."),
                ))
            }
        };
        let states = match o.get("states") {
            None | Some(Value::Null) => vec![
                JobState::Available,
                JobState::Active,
                JobState::Scheduled,
                JobState::Retryable,
                JobState::Pending,
            ],
            Some(v) => names(v)
                .ok_or_else(|| list_error("unique.states"))?
                .iter()
                .map(|s| {
                    JobState::parse(s).ok_or_else(|| {
                        OjsError::invalid(
                            "unique.states",
                            format!("unique.states names {s:?}, which is no job state."),
                        )
                    })
                })
                .collect::<Result<_, _>>()?,
        };
        let on_conflict = match o.get("on_conflict").and_then(Value::as_str) {
            None if o.get("on_conflict").is_none_or(Value::is_null) => OnConflict::Reject,
            Some("reject") => OnConflict::Reject,
            Some("replace") => OnConflict::Replace,
            Some("replace_except_schedule") => OnConflict::ReplaceExceptSchedule,
            Some("ignore" | "use_existing") => OnConflict::Ignore,
            _ => {
                return Err(OjsError::invalid(
                    "unique.on_conflict",
                    "unique.on_conflict must be reject, replace, replace_except_schedule, ignore or use_existing.",
                ))
            }
        };
        Ok(UniquePolicy {
            queue: has("queue"),
            args: args_selected,
            meta: has("meta"),
            args_keys,
            meta_keys,
            chosen_key,
            period,
            states,
            on_conflict,
        })
    }

    /// The job's uniqueness key (spec §4): the SHA-256 of the canonical JSON of the
    /// selected dimensions (keys sorted at every level, strings in NFC), lowercase hex.
    pub fn key(&self, job: &Job) -> String {
        let mut dims = Map::new();
        dims.insert("type".into(), Value::String(job.job_type.clone()));
        if self.queue {
            dims.insert("queue".into(), Value::String(job.queue.clone()));
        }
        if self.args {
            let args = match &self.args_keys {
                None => Value::Array(job.args.clone()),
                // `args` is an array (core §5.1): the named keys of its objects, in order.
                Some(keys) => Value::Array(
                    job.args
                        .iter()
                        .filter_map(Value::as_object)
                        .map(|o| Value::Object(select(o, keys)))
                        .collect(),
                ),
            };
            dims.insert("args".into(), args);
        }
        if self.meta {
            dims.insert(
                "meta".into(),
                Value::Object(select(&job.meta, &self.meta_keys)),
            );
        }
        if let Some(chosen) = &self.chosen_key {
            dims.insert("key".into(), Value::String(chosen.clone()));
        }
        let canonical =
            serde_json::to_string(&normalized(Value::Object(dims))).expect("JSON values serialize");
        let digest = Sha256::digest(canonical.as_bytes());
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Whether an existing job in `state`, created at `created_at`, holds the key against
    /// this policy at `now` (spec §7.4: in `states` AND within `period`).
    pub fn blocks(&self, state: JobState, created_at: DateTime<Utc>, now: DateTime<Utc>) -> bool {
        self.states.contains(&state) && self.period.is_none_or(|p| time::add(created_at, p) > now)
    }
}

fn names(v: &Value) -> Option<Vec<String>> {
    let a = v.as_array()?;
    if a.len() > MAX_NAMES {
        return None;
    }
    a.iter().map(|x| x.as_str().map(str::to_owned)).collect()
}

fn list_error(field: &str) -> OjsError {
    OjsError::invalid(
        field,
        format!("{field} must be an array of at most {MAX_NAMES} strings."),
    )
}

fn select(o: &Map<String, Value>, keys: &[String]) -> Map<String, Value> {
    keys.iter()
        .filter_map(|k| o.get(k).map(|v| (k.clone(), v.clone())))
        .collect()
}

/// Every string (object keys too) in Unicode NFC; serde_json's maps keep keys sorted.
fn normalized(v: Value) -> Value {
    match v {
        Value::String(s) => Value::String(s.nfc().collect()),
        Value::Array(a) => Value::Array(a.into_iter().map(normalized).collect()),
        Value::Object(o) => Value::Object(
            o.into_iter()
                .map(|(k, v)| (k.nfc().collect(), normalized(v)))
                .collect(),
        ),
        other => other,
    }
}

/// The lock of a uniqueness key in the unique bucket: which job holds it, since when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lock {
    pub job_id: String,
    #[serde(with = "time::millis")]
    pub at: DateTime<Utc>,
}

/// The job a lock names, as the enqueue found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// Its record, in `state`, created at `created_at`.
    Found {
        state: JobState,
        created_at: DateTime<Utc>,
    },
    /// No record: its enqueue is still on its way, or died before creating it.
    Missing,
}

/// What an enqueue of a job under `policy` does with the key's lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockStep {
    /// The lock names this very job (a client's retry): go on creating it.
    Ours,
    /// The lock no longer holds the key: take it over (compare-and-set on its revision).
    TakeOver,
    /// Another enqueue of the key is on its way: look at its job again shortly.
    Wait,
    /// The named job holds the key: `on_conflict` decides.
    Held,
}

/// Decides on a lock found for a new job `job_id` (spec §5–§7). A lock whose job does not
/// exist holds the key while its enqueue may still be writing it — for `grace`, and never
/// past the policy's `period` — and is stale after that (a gateway died mid-enqueue).
pub fn decide(
    policy: &UniquePolicy,
    job_id: &str,
    lock: &Lock,
    holder: Holder,
    grace: Duration,
    now: DateTime<Utc>,
) -> LockStep {
    if lock.job_id == job_id {
        return LockStep::Ours;
    }
    match holder {
        Holder::Found { state, created_at } if policy.blocks(state, created_at, now) => {
            LockStep::Held
        }
        Holder::Found { .. } => LockStep::TakeOver,
        Holder::Missing => {
            let limit = policy.period.map_or(grace, |p| p.min(grace));
            if time::add(lock.at, limit) > now {
                LockStep::Wait
            } else {
                LockStep::TakeOver
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::fixtures::record;

    fn policy(v: Value) -> UniquePolicy {
        UniquePolicy::parse(&v, &[json!({"user_id": 1, "x": 2})]).unwrap()
    }

    fn job(args: Value, queue: &str) -> Job {
        let mut j = record(json!({"queue": queue})).job;
        j.args = args.as_array().unwrap().clone();
        j
    }

    #[test]
    fn the_key_covers_the_named_dimensions_only() {
        let by_type = policy(json!({}));
        let by_args = policy(json!({"keys": ["type", "args"]}));
        let a = job(json!([{"user_id": 1, "x": 2}]), "q1");
        let b = job(json!([{"x": 2, "user_id": 1}]), "q2");
        let c = job(json!([{"user_id": 1, "x": 3}]), "q1");
        assert_eq!(by_type.key(&a), by_type.key(&c));
        assert_eq!(
            by_args.key(&a),
            by_args.key(&b),
            "key order does not matter"
        );
        assert_ne!(by_args.key(&a), by_args.key(&c));
        let by_queue = policy(json!({"keys": ["queue"]}));
        assert_ne!(by_queue.key(&a), by_queue.key(&b));
        let by_user = policy(json!({"keys": ["args"], "args_keys": ["user_id"]}));
        assert_eq!(by_user.key(&a), by_user.key(&c));
        assert_eq!(by_args.key(&a).len(), 64);
    }

    #[test]
    fn the_key_reads_strings_in_nfc() {
        let p = policy(json!({"keys": ["args"]}));
        let composed = job(json!(["caf\u{e9}"]), "q");
        let decomposed = job(json!(["cafe\u{301}"]), "q");
        assert_eq!(p.key(&composed), p.key(&decomposed));
    }

    #[test]
    fn clients_key_field_is_a_dimension_list_or_args_keys() {
        let dims = policy(json!({"key": ["type", "args"]}));
        assert!(dims.args && dims.args_keys.is_none());
        let args = policy(json!({"key": ["user_id"]}));
        assert!(args.args);
        assert_eq!(args.args_keys, Some(vec!["user_id".to_owned()]));
    }

    #[test]
    fn a_string_key_is_the_callers_own_and_within_is_the_period() {
        let chosen = policy(json!({"key": "invoice-42", "within": "1h"}));
        assert_eq!(chosen.chosen_key.as_deref(), Some("invoice-42"));
        assert!(!chosen.args && chosen.args_keys.is_none());
        assert_eq!(chosen.period, Some(Duration::from_secs(3600)));
        let a = job(json!([1]), "q");
        let b = job(json!([2]), "q");
        assert_eq!(
            chosen.key(&a),
            chosen.key(&b),
            "the args are not in the key"
        );
        let other = policy(json!({"key": "invoice-43"}));
        assert_ne!(chosen.key(&a), other.key(&a));
        assert_ne!(chosen.key(&a), policy(json!({})).key(&a));
        assert_eq!(
            policy(json!({"period": "PT1M", "within": "1h"})).period,
            Some(Duration::from_secs(60)),
            "period wins"
        );
    }

    #[test]
    fn bad_policies_are_refused_naming_the_field() {
        let args = [json!({"user_id": 1})];
        for (v, field) in [
            (json!({"keys": ["argz"]}), "unique.keys"),
            (json!({"keys": ["meta"]}), "unique.meta_keys"),
            (json!({"args_keys": ["nope"]}), "unique.args_keys"),
            (json!({"states": ["done"]}), "unique.states"),
            (json!({"period": "soon"}), "unique.period"),
            (json!({"period": 5}), "unique.period"),
            (json!({"within": "soon"}), "unique.within"),
            (json!({"key": ""}), "unique.key"),
            (json!({"key": "k".repeat(1025)}), "unique.key"),
            (json!({"on_conflict": "merge"}), "unique.on_conflict"),
            (json!({"keys": "type"}), "unique.keys"),
            (json!("yes"), "unique"),
        ] {
            let e = UniquePolicy::parse(&v, &args).unwrap_err();
            assert_eq!(e.details["field"], field, "{v}");
        }
        assert_eq!(
            policy(json!({"on_conflict": "use_existing"})).on_conflict,
            OnConflict::Ignore
        );
    }

    #[test]
    fn a_lock_holds_while_its_job_is_in_the_states_and_the_period() {
        let now = Utc::now();
        let p = policy(json!({"states": ["available"], "period": "PT2S"}));
        let lock = Lock {
            job_id: "old".into(),
            at: now,
        };
        let found = |state, age_ms| Holder::Found {
            state,
            created_at: now - chrono::Duration::milliseconds(age_ms),
        };
        let grace = Duration::from_secs(10);
        let d = |h| decide(&p, "new", &lock, h, grace, now);
        assert_eq!(d(found(JobState::Available, 1000)), LockStep::Held);
        assert_eq!(d(found(JobState::Available, 2000)), LockStep::TakeOver);
        assert_eq!(d(found(JobState::Completed, 10)), LockStep::TakeOver);
        assert_eq!(
            decide(&p, "old", &lock, found(JobState::Available, 1), grace, now),
            LockStep::Ours
        );
    }

    #[test]
    fn a_lock_without_its_job_waits_for_the_grace_and_never_past_the_period() {
        let now = Utc::now();
        let grace = Duration::from_secs(10);
        let lock = |age_s| Lock {
            job_id: "old".into(),
            at: now - chrono::Duration::seconds(age_s),
        };
        let forever = policy(json!({}));
        assert_eq!(
            decide(&forever, "new", &lock(1), Holder::Missing, grace, now),
            LockStep::Wait
        );
        assert_eq!(
            decide(&forever, "new", &lock(10), Holder::Missing, grace, now),
            LockStep::TakeOver
        );
        let short = policy(json!({"period": "PT2S"}));
        assert_eq!(
            decide(&short, "new", &lock(3), Holder::Missing, grace, now),
            LockStep::TakeOver
        );
    }
}
