//! Log output (`log_format`): plain text for people, or the JSON records of the OJS logging
//! spec (§5): `timestamp` (milliseconds), `severity` and its OpenTelemetry number,
//! `message`, `component: "server"`, `category`, the job's fields under `ojs`, trace ids
//! under `trace`, everything else under `attributes`. The fields of the spans an event
//! happens in count as its own, so with `RUST_LOG=debug` (which turns the per-request span
//! on) a log inside a request carries its `request_id`.
//! With `log_job_transitions`, the leader logs each job transition once for the cluster
//! (spec §6.1, [`job_transition`]).

use std::fmt;

use serde::Deserialize;
use serde_json::{json, Map, Value};
use tracing::field::{Field, Visit};
use tracing::{debug, error, info, warn, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

use crate::domain::event::Event;
use crate::domain::time;

/// How the gateway writes its log lines to stderr.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Fields that describe the job a record is about (spec §5.3, `ojs.*`).
const JOB_FIELDS: [&str; 7] = [
    "job_id",
    "job_type",
    "queue",
    "attempt",
    "state",
    "worker_id",
    "workflow_id",
];
/// W3C trace context fields (`trace.*`).
const TRACE_FIELDS: [&str; 2] = ["trace_id", "span_id"];

/// Span fields, kept as a JSON object so that events inside the span can take them.
pub struct JsonFields;

impl<'w> FormatFields<'w> for JsonFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        mut writer: Writer<'w>,
        fields: R,
    ) -> fmt::Result {
        let mut map = Map::new();
        fields.record(&mut Fields(&mut map));
        write!(writer, "{}", Value::Object(map))
    }

    fn add_fields(
        &self,
        current: &'w mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        let mut map = match serde_json::from_str(&current.fields) {
            Ok(Value::Object(map)) => map,
            _ => Map::new(),
        };
        fields.record(&mut Fields(&mut map));
        current.fields = Value::Object(map).to_string();
        Ok(())
    }
}

/// Collects an event's or a span's fields as JSON values.
struct Fields<'a>(&'a mut Map<String, Value>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), json!(value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), json!(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), json!(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), json!(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), json!(value));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().into(), json!(format!("{value:?}")));
    }
}

/// The OJS logging spec's JSON record, one per line.
pub struct OjsJson;

impl<S> FormatEvent<S, JsonFields> for OjsJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> fmt::Result {
        let mut fields = Map::new();
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                if let Some(f) = span.extensions().get::<FormattedFields<JsonFields>>() {
                    if let Ok(Value::Object(map)) = serde_json::from_str(&f.fields) {
                        fields.extend(map);
                    }
                }
            }
        }
        event.record(&mut Fields(&mut fields));
        writeln!(
            writer,
            "{}",
            record(*event.metadata().level(), event.metadata().target(), fields)
        )
    }
}

/// The record of an event at `level` from `target` with `fields`, at the present time.
fn record(level: Level, target: &str, mut fields: Map<String, Value>) -> Value {
    let (severity, number) = match level {
        Level::TRACE => ("TRACE", 1),
        Level::DEBUG => ("DEBUG", 5),
        Level::INFO => ("INFO", 9),
        Level::WARN => ("WARN", 13),
        Level::ERROR => ("ERROR", 17),
    };
    let mut take = |names: &[&str]| -> Map<String, Value> {
        names
            .iter()
            .filter_map(|n| fields.remove(*n).map(|v| ((*n).to_owned(), v)))
            .collect()
    };
    let job = take(&JOB_FIELDS);
    let trace = take(&TRACE_FIELDS);
    let mut out = json!({
        "timestamp": time::format(chrono::Utc::now()),
        "severity": severity,
        "severity_number": number,
        "message": fields.remove("message").unwrap_or_else(|| json!("")),
        "component": "server",
    });
    match fields.remove("category") {
        Some(category) => out["category"] = category,
        None if level == Level::ERROR => out["category"] = json!("error"),
        None => {}
    }
    if !job.is_empty() {
        out["ojs"] = Value::Object(job);
    }
    if !trace.is_empty() {
        out["trace"] = Value::Object(trace);
    }
    fields.insert("target".into(), json!(target));
    out["attributes"] = Value::Object(fields);
    out
}

/// Logs `event` as the job transition it reports (logging spec §6.1), at the spec's
/// severity; events that report no transition of their own (heartbeats, the `job.failed`
/// that a `job.retrying` or `job.discarded` follows) are not logged.
pub fn job_transition(event: &Event) {
    let data = &event.data;
    let text = |key: &str| data.get(key).and_then(Value::as_str).unwrap_or_default();
    let (job_id, job_type, queue, state) = (
        text("job_id"),
        text("job_type"),
        text("queue"),
        text("state"),
    );
    let attempt = data.get("attempt").and_then(Value::as_u64);
    macro_rules! log_at {
        ($level:ident, $($message:tt)+) => {
            $level!(category = "lifecycle", job_id, job_type, queue, state, attempt, $($message)+)
        };
    }
    match event.event_type.as_str() {
        "job.enqueued" => log_at!(info, "Job enqueued"),
        "job.scheduled" => log_at!(info, "Job scheduled"),
        "job.started" => log_at!(debug, "Job fetched by worker"),
        "job.completed" => log_at!(info, "Job completed successfully"),
        "job.retrying" => log_at!(warn, "Job failed, will retry"),
        "job.discarded" => {
            let attempts = data
                .get("total_attempts")
                .and_then(Value::as_u64)
                .unwrap_or(0);
            log_at!(error, "Job discarded after {attempts} attempts");
        }
        "job.cancelled" => log_at!(info, "Job cancelled"),
        "job.expired" => log_at!(warn, "Job expired before it ran"),
        "job.progress" => log_at!(debug, "Job reported progress"),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A log destination the test can read back.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn lines(run: impl FnOnce()) -> Vec<Value> {
        let out = Captured::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(Level::DEBUG)
            .with_writer(move || writer.clone())
            .fmt_fields(JsonFields)
            .event_format(OjsJson)
            .finish();
        tracing::subscriber::with_default(subscriber, run);
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).expect("one JSON record a line"))
            .collect()
    }

    #[test]
    fn records_have_the_spec_fields_and_take_their_spans_fields() {
        let records = lines(|| {
            let span = tracing::info_span!("request", request_id = "req_1");
            let _in = span.enter();
            tracing::info!(
                job_id = "j1",
                queue = "mail",
                attempt = 2,
                trace_id = "4bf9",
                extra = true,
                "Job enqueued"
            );
            tracing::error!(reason = "nats", "publishing failed");
        });
        let r = &records[0];
        assert_eq!(r["severity"], "INFO");
        assert_eq!(r["severity_number"], 9);
        assert_eq!(r["message"], "Job enqueued");
        assert_eq!(r["component"], "server");
        assert_eq!(
            r["ojs"],
            json!({"job_id": "j1", "queue": "mail", "attempt": 2})
        );
        assert_eq!(r["trace"]["trace_id"], "4bf9");
        assert_eq!(r["attributes"]["extra"], true);
        assert_eq!(r["attributes"]["request_id"], "req_1", "from the span");
        let ts = r["timestamp"].as_str().unwrap();
        assert!(time::parse(ts).is_some() && ts.contains('.'), "{ts}");
        assert_eq!(records[1]["severity_number"], 17);
        assert_eq!(records[1]["category"], "error");
    }

    #[test]
    fn job_transitions_log_at_the_spec_severities() {
        let event = |event_type: &str, data: Value| Event {
            specversion: "1.0".into(),
            id: "evt_1".into(),
            event_type: event_type.into(),
            source: "s".into(),
            time: chrono::Utc::now(),
            subject: None,
            datacontenttype: "application/json".into(),
            data,
        };
        let base = json!({"job_id": "j1", "job_type": "t.x", "queue": "q", "state": "discarded", "attempt": 3, "total_attempts": 3});
        let records = lines(|| {
            job_transition(&event("job.failed", base.clone()));
            job_transition(&event("job.discarded", base.clone()));
            job_transition(&event("job.heartbeat", base.clone()));
        });
        assert_eq!(records.len(), 1, "{records:?}");
        assert_eq!(records[0]["severity"], "ERROR");
        assert_eq!(records[0]["message"], "Job discarded after 3 attempts");
        assert_eq!(records[0]["category"], "lifecycle");
        assert_eq!(records[0]["ojs"]["job_id"], "j1");
    }
}
