//! The trace span each job transition makes (distributed-tracing spec §4–§8), derived by
//! the leader from the same write steps as events and tallies, so one transition is one span
//! for the cluster. No I/O: the OTLP exporter (`telemetry/otlp.rs`) sends them.
//!
//! A job's spans share a trace: the one of its `meta.traceparent`, else the job id's 16
//! bytes. `ojs.enqueue` is the child of the producer's span; every later span is a child of
//! `ojs.enqueue`. Span ids are hashes (FNV-1a) of the job id and the write's revision, so a batch
//! replayed by the next leader exports the same ids, and no state is kept.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::job::{fnv1a, JobRecord, Step, Transition};
use super::totals::Tally;

/// OTLP span kinds (`SPAN_KIND_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    Internal = 1,
    Server = 2,
    Consumer = 5,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Attribute {
    Text(String),
    Int(i64),
}

/// One finished span. Ids are lowercase hex, as OTLP/JSON writes them.
#[derive(Debug, Clone, PartialEq)]
pub struct JobSpan {
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: Option<String>,
    /// The producer's span (`trace_id`, `span_id`), linked from a process span (§6.1).
    pub link: Option<(String, String)>,
    pub name: String,
    pub kind: SpanKind,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub attributes: Vec<(&'static str, Attribute)>,
    /// `(type, message)` of a failed attempt: status ERROR and an `exception` event (§8).
    pub error: Option<(String, String)>,
}

impl JobSpan {
    /// The span of write `step` of `rec`, `None` for writes that make none (heartbeats,
    /// progress, redeliveries). `tally` is the step's tally: its seconds are how long the
    /// period that the step ends lasted.
    pub fn of(rec: &JobRecord, step: &Step, tally: Option<&Tally>) -> Option<JobSpan> {
        let job = &rec.job;
        let process = format!("{} process", job.queue);
        let (name, kind, operation) = match step.transition {
            Transition::Created => ("ojs.enqueue", SpanKind::Server, Some("publish")),
            Transition::Started => ("ojs.fetch", SpanKind::Server, Some("receive")),
            Transition::Completed | Transition::Failed | Transition::Requeued => {
                (process.as_str(), SpanKind::Consumer, Some("process"))
            }
            Transition::Cancelled => ("ojs.cancel", SpanKind::Internal, None),
            Transition::Promoted => ("ojs.promote", SpanKind::Internal, None),
            Transition::Expired => ("ojs.expire", SpanKind::Internal, None),
            Transition::Dropped => ("ojs.drop", SpanKind::Internal, None),
            Transition::Activated => ("ojs.activate", SpanKind::Internal, None),
            Transition::Retried => ("ojs.dead_letter.retry", SpanKind::Internal, None),
            Transition::Redelivered
            | Transition::Heartbeat
            | Transition::Progressed
            | Transition::Reprioritized => return None,
        };
        let producer = job
            .meta
            .get("traceparent")
            .and_then(Value::as_str)
            .and_then(traceparent_ids);
        let trace_id = producer.map_or_else(|| job_trace_id(&job.id), |(t, _)| t.to_owned());
        let enqueue_span = span_id(&job.id, None);
        let (span_id, parent_span_id) = match step.transition {
            Transition::Created => (enqueue_span, producer.map(|(_, s)| s.to_owned())),
            _ => (span_id(&job.id, Some(step.revision)), Some(enqueue_span)),
        };
        let seconds = tally.and_then(|t| t.seconds).unwrap_or(0.0);
        let start = step.at - chrono::Duration::milliseconds((seconds * 1000.0) as i64);
        // An attempt that ended without an ACK: a FAIL, a lapse, a hand-back.
        let error = matches!(step.transition, Transition::Failed | Transition::Requeued)
            .then(|| job.error_at(step.attempt))
            .flatten()
            .map(|e| {
                let kind = e.error_type.clone().unwrap_or_else(|| e.code.clone());
                (kind, e.message.clone())
            });
        let mut attributes = vec![
            ("messaging.system", text("ojs")),
            ("messaging.destination.name", text(&job.queue)),
            ("messaging.message.id", text(&job.id)),
            ("ojs.job.id", text(&job.id)),
            ("ojs.job.type", text(&job.job_type)),
            ("ojs.job.queue", text(&job.queue)),
            ("ojs.job.state", text(step.state.as_str())),
            ("ojs.job.attempt", Attribute::Int(i64::from(step.attempt))),
            ("ojs.job.priority", Attribute::Int(i64::from(job.priority))),
            ("ojs.backend.type", text("nats")),
        ];
        let optional = [
            ("messaging.operation.type", operation),
            ("ojs.worker.id", step.worker_id.as_deref()),
            ("ojs.workflow.id", job.workflow_id.as_deref()),
        ];
        attributes.extend(
            optional
                .into_iter()
                .filter_map(|(key, value)| Some((key, text(value?)))),
        );
        if let Some((kind, message)) = &error {
            attributes.push(("error.type", text(kind)));
            attributes.push(("error.message", text(message)));
            attributes.push((
                "ojs.job.error.attempt",
                Attribute::Int(i64::from(step.attempt)),
            ));
        }
        Some(JobSpan {
            link: producer
                .filter(|_| kind == SpanKind::Consumer)
                .map(|(t, s)| (t.to_owned(), s.to_owned())),
            trace_id,
            span_id,
            parent_span_id,
            name: name.to_owned(),
            kind,
            start,
            end: step.at,
            attributes,
            error,
        })
    }
}

/// The trace id and parent span id of a version-00 W3C `traceparent`
/// (`00-{32 hex}-{16 hex}-{2 hex}`, ids not all zero); `None` for anything else.
pub fn traceparent_ids(traceparent: &str) -> Option<(&str, &str)> {
    let mut parts = traceparent.split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let id = |s: &str, len: usize| {
        s.len() == len
            && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            && s.bytes().any(|b| b != b'0')
    };
    let valid = version == "00"
        && parts.next().is_none()
        && id(trace, 32)
        && id(span, 16)
        && flags.len() == 2
        && flags.bytes().all(|b| b.is_ascii_hexdigit());
    valid.then_some((trace, span))
}

/// A job without trace context has a trace of its own: its UUID's 16 bytes (job ids are
/// lowercase UUIDs, so the fallback hash is for ids of older records only).
fn job_trace_id(job_id: &str) -> String {
    let digits: String = job_id.chars().filter(|c| *c != '-').collect();
    if digits.len() == 32 && digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        digits.to_ascii_lowercase()
    } else {
        format!("{}{}", span_id(job_id, Some(0)), span_id(job_id, Some(1)))
    }
}

/// The enqueue span's id (`revision` `None`) or that of the write at `revision`.
fn span_id(job_id: &str, revision: Option<u64>) -> String {
    let seed = fnv1a(job_id.as_bytes(), 0xcbf2_9ce4_8422_2325);
    let id = revision.map_or(seed, |r| fnv1a(&r.to_be_bytes(), seed));
    format!("{:016x}", id.max(1))
}

fn text(s: &str) -> Attribute {
    Attribute::Text(s.to_owned())
}

#[cfg(test)]
mod tests {
    use chrono::Duration;
    use serde_json::json;

    use super::*;
    use crate::domain::fixtures;
    use crate::domain::job::JobError;
    use crate::domain::state::JobState;

    fn span(rec: &JobRecord, revision: u64) -> Option<JobSpan> {
        let step = Step::of(rec, revision);
        JobSpan::of(rec, &step, Tally::of(rec, &step).as_ref())
    }

    fn attribute<'s>(span: &'s JobSpan, key: &str) -> Option<&'s Attribute> {
        span.attributes
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v)
    }

    #[test]
    fn a_traced_jobs_spans_hang_below_the_producers_span() {
        let mut rec = fixtures::record(json!({"queue": "email"}));
        rec.job.meta.insert("traceparent".into(), json!(PARENT));
        let t0 = rec.job.created_at;
        rec.job.enqueued_at = Some(t0);
        let enqueue = span(&rec, 1).unwrap();
        assert_eq!(
            (
                enqueue.name.as_str(),
                enqueue.kind,
                enqueue.start,
                enqueue.end
            ),
            ("ojs.enqueue", SpanKind::Server, t0, t0)
        );
        assert_eq!(enqueue.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(enqueue.parent_span_id.as_deref(), Some("00f067aa0ba902b7"));
        assert_eq!(attribute(&enqueue, "ojs.job.queue"), Some(&text("email")));
        assert_eq!(
            attribute(&enqueue, "messaging.operation.type"),
            Some(&text("publish"))
        );

        rec.job.state = JobState::Active;
        rec.job.attempt = 1;
        rec.job.worker_id = Some("w-1".into());
        rec.job.started_at = Some(t0 + Duration::milliseconds(250));
        rec.transition = Transition::Started;
        let fetch = span(&rec, 2).unwrap();
        assert_eq!(fetch.name, "ojs.fetch");
        assert_eq!(fetch.parent_span_id.as_ref(), Some(&enqueue.span_id));
        assert_eq!(fetch.trace_id, enqueue.trace_id);
        assert_eq!(
            (fetch.start, fetch.end),
            (t0, t0 + Duration::milliseconds(250)),
            "the queue time"
        );
        assert_eq!(attribute(&fetch, "ojs.worker.id"), Some(&text("w-1")));
        assert_eq!(fetch.link, None);

        let failed_at = t0 + Duration::milliseconds(1250);
        rec.job.state = JobState::Retryable;
        rec.job.error = Some(JobError {
            code: "handler_error".into(),
            message: "smtp down".into(),
            error_type: Some("SmtpError".into()),
            retryable: true,
            details: None,
            backtrace: None,
            attempt: 1,
            occurred_at: failed_at,
        });
        rec.transition = Transition::Failed;
        let process = span(&rec, 3).unwrap();
        assert_eq!(
            (process.name.as_str(), process.kind),
            ("email process", SpanKind::Consumer)
        );
        assert_eq!(
            (process.start, process.end),
            (t0 + Duration::milliseconds(250), failed_at)
        );
        assert_eq!(
            process.error,
            Some(("SmtpError".into(), "smtp down".into()))
        );
        assert_eq!(attribute(&process, "error.type"), Some(&text("SmtpError")));
        assert_eq!(
            attribute(&process, "ojs.job.error.attempt"),
            Some(&Attribute::Int(1))
        );
        assert_eq!(
            process.link,
            Some((
                "4bf92f3577b34da6a3ce929d0e0e4736".into(),
                "00f067aa0ba902b7".into()
            )),
            "the process span links to the producer's span"
        );
        assert_eq!(process.parent_span_id.as_ref(), Some(&enqueue.span_id));
        assert_ne!(process.span_id, fetch.span_id);
        assert_eq!(
            span(&rec, 3).unwrap().span_id,
            process.span_id,
            "ids are stable"
        );

        rec.transition = Transition::Heartbeat;
        assert_eq!(span(&rec, 4), None);
    }

    #[test]
    fn a_job_without_trace_context_has_a_trace_of_its_own() {
        let rec = fixtures::record(json!({}));
        let enqueue = span(&rec, 1).unwrap();
        assert_eq!(enqueue.trace_id, rec.job.id.replace('-', ""));
        assert_eq!((enqueue.parent_span_id, enqueue.link), (None, None));
        let mut malformed = rec.clone();
        malformed
            .job
            .meta
            .insert("traceparent".into(), json!("00-nonsense"));
        assert_eq!(span(&malformed, 1).unwrap().trace_id, enqueue.trace_id);
    }

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn traceparents_are_read_strictly() {
        assert_eq!(
            traceparent_ids(PARENT),
            Some(("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"))
        );
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(traceparent_ids(bad), None, "{bad:?}");
        }
    }
}
