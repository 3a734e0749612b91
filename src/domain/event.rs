//! Lifecycle events (events seed §2–§4): the envelope, and which events one job-record write
//! implies. Derived from the record alone, so replaying a write yields the same events with
//! the same ids — which is what makes republishing after a crash harmless.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::job::{stable_uuid, JobError, JobRecord, Transition};
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

/// The events implied by one write of a job record, in lifecycle order. `revision` is the
/// record's position in the jobs bucket; together with the job id it fixes the event ids.
pub fn job_events(rec: &JobRecord, revision: u64, source: &str) -> Vec<Event> {
    let job = &rec.job;
    let mut base = Map::new();
    base.insert("job_id".into(), json!(job.id));
    base.insert("job_type".into(), json!(job.job_type));
    base.insert("queue".into(), json!(job.queue));
    base.insert("state".into(), json!(job.state));
    let with = |extra: Value| {
        let mut data = base.clone();
        if let Value::Object(m) = extra {
            data.extend(m);
        }
        Value::Object(data)
    };
    let last_error = job.error.as_ref();
    let (at, items): (Option<DateTime<Utc>>, Vec<(&str, Value)>) = match rec.transition {
        Transition::Created if job.state == JobState::Scheduled => (
            Some(job.created_at),
            vec![(
                "job.scheduled",
                with(json!({"scheduled_at": job.scheduled_at})),
            )],
        ),
        Transition::Created if job.state == JobState::Pending => (Some(job.created_at), vec![]),
        Transition::Created
        | Transition::Activated
        | Transition::Requeued
        | Transition::Promoted
        | Transition::Retried => (
            job.enqueued_at,
            vec![("job.enqueued", with(enqueued_data(rec)))],
        ),
        Transition::Started => (
            job.started_at,
            vec![(
                "job.started",
                with(json!({"worker_id": job.worker_id, "attempt": job.attempt})),
            )],
        ),
        Transition::Completed => {
            let duration_ms = match (job.started_at, job.completed_at) {
                (Some(s), Some(c)) => (c - s).num_milliseconds().max(0),
                _ => 0,
            };
            let mut data = json!({"attempt": job.attempt, "duration_ms": duration_ms});
            if let Some(result) = &job.result {
                data["result"] = result.clone();
            }
            (job.completed_at, vec![("job.completed", with(data))])
        }
        Transition::Failed => {
            let failed = (
                "job.failed",
                with(json!({"attempt": job.attempt, "error": error_data(last_error)})),
            );
            let follow = if job.state == JobState::Retryable {
                (
                    "job.retrying",
                    with(json!({
                        "attempt": job.attempt,
                        "max_attempts": job.max_attempts,
                        "next_retry_at": job.next_attempt_at.map(time::format),
                        "error": error_data(last_error),
                    })),
                )
            } else {
                (
                    "job.discarded",
                    with(
                        json!({"total_attempts": job.attempt, "last_error": error_data(last_error)}),
                    ),
                )
            };
            (last_error.map(|e| e.occurred_at), vec![failed, follow])
        }
        Transition::Cancelled => (
            job.cancelled_at,
            vec![("job.cancelled", with(json!({"cancelled_by": "api"})))],
        ),
        Transition::Heartbeat => {
            let holder = rec.holder.as_ref();
            (
                holder.and_then(|h| h.last_beat),
                vec![(
                    "job.heartbeat",
                    with(json!({
                        "worker_id": holder.and_then(|h| h.worker_id.clone()),
                        "attempt": job.attempt,
                        "visible_until": holder.map(|h| time::format(h.visible_until)),
                    })),
                )],
            )
        }
        Transition::Expired => {
            let ttl_ms = job
                .expires_at
                .as_deref()
                .and_then(time::parse)
                .map(|at| (at - job.created_at).num_milliseconds().max(0));
            (
                job.discarded_at,
                vec![(
                    "job.expired",
                    with(json!({
                        "created_at": time::format(job.created_at),
                        "expired_at": job.discarded_at.map(time::format),
                        "ttl_ms": ttl_ms,
                    })),
                )],
            )
        }
        Transition::Redelivered => (None, vec![]),
    };
    let at = at.unwrap_or(job.created_at);
    items
        .into_iter()
        .enumerate()
        .map(|(i, (event_type, data))| Event {
            specversion: "1.0".into(),
            id: format!(
                "evt_{}",
                stable_uuid(&format!("{}/{revision}/{i}", job.id), at)
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
    }
}
