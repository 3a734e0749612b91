//! Lifecycle events (events seed §2–§4): the envelope, and which events one job-record write
//! implies. Derived from the record alone, so replaying a write yields the same events with
//! the same ids — which is what makes republishing after a crash harmless.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::job::{stable_uuid, JobError, JobRecord, Step, Transition};
use super::spans::traceparent_ids;
use super::state::JobState;
use super::time;

/// Events seed §2.1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub specversion: String,
    pub id: String,
    #[serde(rename = "type")]
    pub event_type: String,
    pub source: String,
    #[serde(with = "time::millis")]
    pub time: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    pub datacontenttype: String,
    pub data: Value,
}

impl Event {
    /// The queue named in `data`, used by the events endpoint's `queues` filter.
    pub fn queue(&self) -> Option<&str> {
        self.data.get("queue").and_then(Value::as_str)
    }
}

/// `queue.paused` or `queue.resumed` (events seed §3.3) for the registry write `revision`
/// of `queue` at `at`: the id is fixed by the write, so announcing it again is a repeat the
/// events stream drops.
pub fn queue_event(
    queue: &str,
    paused: bool,
    revision: u64,
    at: DateTime<Utc>,
    source: &str,
) -> Event {
    let event_type = if paused {
        "queue.paused"
    } else {
        "queue.resumed"
    };
    Event {
        specversion: "1.0".into(),
        id: format!(
            "evt_{}",
            stable_uuid(&format!("queue/{queue}/{revision}/{event_type}"), at)
        ),
        event_type: event_type.into(),
        source: source.into(),
        time: at,
        subject: Some(queue.into()),
        datacontenttype: "application/json".into(),
        data: json!({ "queue": queue }),
    }
}

/// `backpressure.rejected`, `.warning` or `.cleared` (backpressure spec §10.1) with `data`
/// (`Bound::event_data`); each is an occurrence of its own, under a new `id`.
pub fn backpressure_event(
    event_type: &str,
    data: Value,
    id: uuid::Uuid,
    at: DateTime<Utc>,
    source: &str,
) -> Event {
    Event {
        specversion: "1.0".into(),
        id: format!("evt_{id}"),
        event_type: event_type.into(),
        source: source.into(),
        time: at,
        subject: data.get("queue").and_then(Value::as_str).map(str::to_owned),
        datacontenttype: "application/json".into(),
        data,
    }
}

/// The events implied by one write of a job record, in lifecycle order. `revision` is the
/// record's position in the jobs bucket; together with the job id it fixes the event ids.
pub fn job_events(rec: &JobRecord, revision: u64, source: &str) -> Vec<Event> {
    step_events(rec, &Step::of(rec, revision), source)
}

/// The events of the write `step` of the job whose latest known record is `rec`: the write
/// of `rec` itself, or an earlier one from its trail (`trail.rs`). Either way the same
/// events with the same ids.
pub fn step_events(rec: &JobRecord, step: &Step, source: &str) -> Vec<Event> {
    let job = &rec.job;
    let mut base = Map::new();
    base.insert("job_id".into(), json!(job.id));
    base.insert("job_type".into(), json!(job.job_type));
    base.insert("queue".into(), json!(job.queue));
    base.insert("state".into(), json!(step.state));
    if let Some(trace_id) = trace_id(&job.meta) {
        base.insert("trace_id".into(), json!(trace_id));
    }
    let with = |extra: Value| {
        let mut data = base.clone();
        if let Value::Object(m) = extra {
            data.extend(m);
        }
        Value::Object(data)
    };
    let at = step.at;
    let items: Vec<(&str, Value)> = match step.transition {
        Transition::Created if step.state == JobState::Scheduled => vec![(
            "job.scheduled",
            with(json!({"scheduled_at": job.scheduled_at})),
        )],
        Transition::Created if step.state == JobState::Pending => vec![],
        Transition::Created
        | Transition::Activated
        | Transition::Requeued
        | Transition::Promoted
        | Transition::Retried => vec![("job.enqueued", with(enqueued_data(rec)))],
        Transition::Started => vec![(
            "job.started",
            with(json!({"worker_id": step.worker_id, "attempt": step.attempt})),
        )],
        Transition::Completed => {
            let duration_ms = job
                .started_at
                .map_or(0, |s| (at - s).num_milliseconds().max(0));
            let mut data = json!({"attempt": step.attempt, "duration_ms": duration_ms});
            if let Some(result) = &job.result {
                data["result"] = result.clone();
            }
            vec![("job.completed", with(data))]
        }
        Transition::Failed => {
            let error = error_data(job.error_at(step.attempt));
            let failed = (
                "job.failed",
                with(json!({"attempt": step.attempt, "error": error})),
            );
            let follow = if step.state == JobState::Retryable {
                (
                    "job.retrying",
                    with(json!({
                        "attempt": step.attempt,
                        "max_attempts": job.max_attempts,
                        "next_retry_at": step.until.map(time::format),
                        "error": error,
                    })),
                )
            } else {
                (
                    "job.discarded",
                    with(json!({"total_attempts": step.attempt, "last_error": error})),
                )
            };
            vec![failed, follow]
        }
        Transition::Cancelled => vec![("job.cancelled", with(json!({"cancelled_by": "api"})))],
        Transition::Heartbeat => vec![(
            "job.heartbeat",
            with(json!({
                "worker_id": step.worker_id,
                "attempt": step.attempt,
                "visible_until": step.until.map(time::format),
            })),
        )],
        Transition::Progressed => {
            let mut data = json!({
                "worker_id": step.worker_id,
                "attempt": step.attempt,
                "progress_percent": job.progress.unwrap_or(0.0) * 100.0,
            });
            if let Some(message) = &job.progress_message {
                data["progress_message"] = json!(message);
            }
            vec![("job.progress", with(data))]
        }
        Transition::Expired => {
            let ttl_ms = job
                .expires_at
                .as_deref()
                .and_then(time::parse)
                .map(|expires| (expires - job.created_at).num_milliseconds().max(0));
            vec![(
                "job.expired",
                with(json!({
                    "created_at": time::format(job.created_at),
                    "expired_at": time::format(at),
                    "ttl_ms": ttl_ms,
                })),
            )]
        }
        Transition::Dropped => {
            let error = error_data(job.error_at(step.attempt));
            vec![
                (
                    "job.discarded",
                    with(json!({"total_attempts": step.attempt, "last_error": error})),
                ),
                ("backpressure.dropped", with(json!({}))),
            ]
        }
        Transition::Redelivered | Transition::Reprioritized => vec![],
    };
    let mut items = items;
    // The write's move from one state to another, on its last event (realtime spec §4.1).
    if let (Some(from), Some((_, Value::Object(data)))) = (
        step.from.filter(|from| *from != step.state),
        items.last_mut(),
    ) {
        data.insert("previous_state".into(), json!(from));
    }
    items
        .into_iter()
        .enumerate()
        .map(|(i, (event_type, data))| Event {
            specversion: "1.0".into(),
            id: format!(
                "evt_{}",
                stable_uuid(&format!("{}/{}/{i}", job.id, step.revision), at)
            ),
            event_type: event_type.into(),
            source: source.into(),
            time: at,
            subject: Some(job.id.clone()),
            datacontenttype: "application/json".into(),
            data,
        })
        .collect()
}

/// The `job.state_changed` notice (realtime spec §4.1) of an event that ends a write
/// moving its job from one state to another (its data names `previous_state`).
pub fn state_changed(e: &Event) -> Option<Value> {
    let data = &e.data;
    let from = data.get("previous_state")?;
    Some(json!({
        "job_id": data.get("job_id")?,
        "queue": data.get("queue")?,
        "type": data.get("job_type")?,
        "from": from,
        "to": data.get("state")?,
        "timestamp": time::format(e.time),
    }))
}

/// The trace id of a job with trace context (events seed §8.2-8.3): `meta.trace_id`, else
/// the one in `meta.traceparent` (W3C `version-traceid-parentid-flags`).
fn trace_id(meta: &Map<String, Value>) -> Option<&str> {
    if let Some(id) = meta.get("trace_id").and_then(Value::as_str) {
        return Some(id);
    }
    let parent = meta.get("traceparent").and_then(Value::as_str)?;
    traceparent_ids(parent).map(|(trace_id, _)| trace_id)
}

fn enqueued_data(rec: &JobRecord) -> Value {
    let mut data = json!({"priority": rec.job.priority});
    if let Some(at) = &rec.job.scheduled_at {
        data["scheduled_at"] = json!(at);
    }
    data
}

fn error_data(e: Option<&JobError>) -> Value {
    match e {
        Some(e) => {
            json!({"code": e.code, "message": e.message, "retryable": e.retryable, "type": e.error_type})
        }
        None => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::domain::fixtures::record;
    use crate::domain::lifecycle;

    fn created() -> JobRecord {
        record(json!({"queue": "q"}))
    }

    fn delivery() -> lifecycle::Delivery {
        lifecycle::Delivery {
            ack_subject: "ack".into(),
            sequence: 1,
        }
    }

    #[test]
    fn created_job_emits_enqueued_with_required_fields() {
        let events = job_events(&created(), 7, "ojs://test/api");
        assert_eq!(events.len(), 1);
        let e = &events[0];
        assert_eq!(e.event_type, "job.enqueued");
        assert_eq!(e.data["job_type"], "t.x");
        assert_eq!(e.data["queue"], "q");
        assert_eq!(e.data["state"], "available");
        assert!(e.id.starts_with("evt_"));
    }

    #[test]
    fn every_event_of_a_job_with_trace_context_carries_its_trace_id() {
        const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
        let parent = format!("00-{TRACE}-00f067aa0ba902b7-01");
        for meta in [
            json!({"trace_id": TRACE}),
            json!({"traceparent": parent, "tracestate": "congo=t61rcWkgMzE"}),
        ] {
            let mut rec = created();
            rec.job.meta = meta.as_object().unwrap().clone();
            let now = rec.job.created_at;
            let started =
                lifecycle::claim(&rec, now, Some("w"), &delivery(), Duration::from_secs(30))
                    .unwrap();
            let failure = lifecycle::Failure {
                code: "e".into(),
                message: "no".into(),
                retryable: true,
                ..Default::default()
            };
            let failed = lifecycle::fail(&started, now, None, &failure, false, 1.0).unwrap();
            for write in [&rec, &started, &failed] {
                for event in job_events(write, 1, "s") {
                    assert_eq!(event.data["trace_id"], TRACE, "{}", event.event_type);
                }
            }
        }
        let mut rec = created();
        rec.job.meta = json!({"traceparent": "garbage"})
            .as_object()
            .unwrap()
            .clone();
        assert!(job_events(&rec, 1, "s")[0].data.get("trace_id").is_none());
        assert!(job_events(&created(), 1, "s")[0]
            .data
            .get("trace_id")
            .is_none());
    }

    #[test]
    fn ids_are_stable_per_write_and_distinct_across_writes() {
        let rec = created();
        assert_eq!(
            job_events(&rec, 7, "s")[0].id,
            job_events(&rec, 7, "s")[0].id
        );
        assert_ne!(
            job_events(&rec, 7, "s")[0].id,
            job_events(&rec, 8, "s")[0].id
        );
    }

    #[test]
    fn completion_reports_duration_and_attempt() {
        let start = time::parse("2026-02-12T10:30:01Z").unwrap();
        let active = lifecycle::claim(
            &created(),
            start,
            Some("w"),
            &delivery(),
            Duration::from_secs(9),
        )
        .unwrap();
        let done = lifecycle::complete(
            &active,
            start + chrono::Duration::milliseconds(250),
            None,
            None,
        )
        .unwrap();
        let events = job_events(&done, 9, "s");
        assert_eq!(events[0].event_type, "job.completed");
        assert_eq!(events[0].data["duration_ms"], 250);
        assert_eq!(events[0].data["attempt"], 1);
    }

    #[test]
    fn a_write_derived_later_from_a_trail_gives_the_same_events() {
        let t0 = time::parse("2026-02-12T10:30:00Z").unwrap();
        let at = |ms: i64| t0 + chrono::Duration::milliseconds(ms);
        let failure = lifecycle::Failure {
            code: "e".into(),
            message: "first".into(),
            retryable: true,
            ..Default::default()
        };
        let visibility = Duration::from_secs(9);
        let mut life = vec![created()];
        let last = |life: &Vec<JobRecord>| life.last().unwrap().clone();
        life.push(
            lifecycle::claim(&last(&life), at(10), Some("w1"), &delivery(), visibility).unwrap(),
        );
        life.push(lifecycle::heartbeat(&last(&life), at(20), "w1", visibility).unwrap());
        life.push(lifecycle::fail(&last(&life), at(30), None, &failure, false, 1.0).unwrap());
        let due = last(&life).job.next_attempt_at.unwrap();
        life.push(lifecycle::promote(&last(&life), due, last(&life).dispatch).unwrap());
        life.push(
            lifecycle::claim(&last(&life), due, Some("w2"), &delivery(), visibility).unwrap(),
        );
        let failure = lifecycle::Failure {
            message: "second".into(),
            retryable: false,
            ..failure
        };
        life.push(lifecycle::fail(&last(&life), due, None, &failure, false, 1.0).unwrap());
        life.push(lifecycle::retry_discarded(&last(&life), due).unwrap());
        life.push(
            lifecycle::claim(&last(&life), due, Some("w3"), &delivery(), visibility).unwrap(),
        );
        life.push(lifecycle::complete(&last(&life), due, None, None).unwrap());

        let latest = last(&life);
        for (revision, rec) in life.iter().enumerate() {
            let revision = revision as u64 + 1;
            let step = crate::domain::job::Step::of(rec, revision);
            assert_eq!(
                step_events(&latest, &step, "s"),
                job_events(rec, revision, "s"),
                "{:?} at {revision}",
                rec.transition
            );
        }
    }

    #[test]
    fn failure_emits_failed_then_retrying_or_discarded() {
        let now = time::parse("2026-02-12T10:30:01Z").unwrap();
        let active =
            lifecycle::claim(&created(), now, None, &delivery(), Duration::from_secs(9)).unwrap();
        let f = lifecycle::Failure {
            code: "e".into(),
            message: "m".into(),
            retryable: true,
            ..Default::default()
        };
        let retry = lifecycle::fail(&active, now, None, &f, false, 1.0).unwrap();
        let types: Vec<_> = job_events(&retry, 3, "s")
            .into_iter()
            .map(|e| e.event_type)
            .collect();
        assert_eq!(types, ["job.failed", "job.retrying"]);
        let f = lifecycle::Failure {
            retryable: false,
            ..f
        };
        let gone = lifecycle::fail(&active, now, None, &f, false, 1.0).unwrap();
        let types: Vec<_> = job_events(&gone, 3, "s")
            .into_iter()
            .map(|e| e.event_type)
            .collect();
        assert_eq!(types, ["job.failed", "job.discarded"]);

        // The write's move is on its last event only, for realtime's job.state_changed.
        let mut gone = gone;
        gone.from = Some(JobState::Active);
        let events = job_events(&gone, 3, "s");
        assert_eq!(state_changed(&events[0]), None);
        let moved = state_changed(&events[1]).unwrap();
        assert_eq!(
            (moved["from"].as_str(), moved["to"].as_str()),
            (Some("active"), Some("discarded"))
        );
        assert_eq!(moved["type"], "t.x");
    }
}
