//! Export of the job spans (`domain/spans.rs`) over OTLP/HTTP with JSON bodies
//! (`POST {otlp_endpoint}/v1/traces`), which every OpenTelemetry collector accepts. Only
//! when `otlp_endpoint` is set; nothing is buffered or sent otherwise.
//!
//! Telemetry must never hold jobs back: the event publisher hands spans over without
//! waiting; what the queue cannot take, or the collector does not accept after three tries,
//! is dropped and counted (`ojs_trace_spans_dropped_total`).

use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::mpsc;
use tracing::warn;

use super::metrics::Metrics;
use crate::domain::spans::{Attribute, JobSpan};

/// Spans waiting for the exporter at most.
const QUEUE: usize = 8_192;
/// Spans sent in one request at most.
const BATCH: usize = 512;
/// How long a span waits for more to fill its request.
const LINGER: Duration = Duration::from_secs(1);
/// Tries of one request, a second apart.
const TRIES: u32 = 3;

/// Where the leader's event publisher hands its spans over.
#[derive(Clone)]
pub struct SpanExporter {
    spans: mpsc::Sender<JobSpan>,
    metrics: Metrics,
}

impl SpanExporter {
    /// Starts the exporting task, which ends when every `SpanExporter` is dropped.
    pub fn start(endpoint: &str, service_name: &str, metrics: Metrics) -> SpanExporter {
        let (spans, queued) = mpsc::channel(QUEUE);
        let url = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
        let resource = json!({"attributes": [
            attribute("service.name", &Attribute::Text(service_name.to_owned())),
            attribute("service.version", &Attribute::Text(env!("CARGO_PKG_VERSION").to_owned())),
        ]});
        tokio::spawn(send_all(queued, url, resource, metrics.clone()));
        SpanExporter { spans, metrics }
    }

    /// Queues `spans` for export; those that do not fit are dropped.
    pub fn export(&self, spans: Vec<JobSpan>) {
        let dropped = spans
            .into_iter()
            .filter_map(|span| self.spans.try_send(span).err())
            .count();
        self.metrics.trace_spans_dropped(dropped);
    }
}

async fn send_all(
    mut queued: mpsc::Receiver<JobSpan>,
    url: String,
    resource: Value,
    metrics: Metrics,
) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("an HTTP client");
    let mut batch = Vec::with_capacity(BATCH);
    while let Some(first) = queued.recv().await {
        batch.push(first);
        let deadline = tokio::time::Instant::now() + LINGER;
        while batch.len() < BATCH {
            match tokio::time::timeout_at(deadline, queued.recv()).await {
                Ok(Some(span)) => batch.push(span),
                Ok(None) | Err(_) => break,
            }
        }
        let body = encode(&resource, &batch);
        let mut tries = 0;
        loop {
            tries += 1;
            let sent = http.post(&url).json(&body).send().await;
            match sent.map(|r| r.error_for_status()) {
                Ok(Ok(_)) => break,
                Ok(Err(err)) | Err(err) if tries >= TRIES => {
                    warn!(error = %err, spans = batch.len(), "the OTLP collector did not take the spans; dropped");
                    metrics.trace_spans_dropped(batch.len());
                    break;
                }
                _ => tokio::time::sleep(Duration::from_secs(1)).await,
            }
        }
        batch.clear();
    }
}

/// An OTLP/JSON `ExportTraceServiceRequest` (ids as hex, times as decimal nanoseconds).
pub fn encode(resource: &Value, spans: &[JobSpan]) -> Value {
    let spans: Vec<Value> = spans.iter().map(span).collect();
    json!({"resourceSpans": [{
        "resource": resource,
        "scopeSpans": [{"scope": {"name": "ojs-jetstream"}, "spans": spans}],
    }]})
}

fn span(s: &JobSpan) -> Value {
    let nanos =
        |t: chrono::DateTime<chrono::Utc>| t.timestamp_nanos_opt().unwrap_or_default().to_string();
    let mut out = json!({
        "traceId": s.trace_id,
        "spanId": s.span_id,
        "name": s.name,
        "kind": s.kind as i32,
        "startTimeUnixNano": nanos(s.start),
        "endTimeUnixNano": nanos(s.end),
        "attributes": s.attributes.iter().map(|(k, v)| attribute(k, v)).collect::<Vec<_>>(),
        "status": {"code": if s.error.is_some() { 2 } else { 1 }},
    });
    if let Some(parent) = &s.parent_span_id {
        out["parentSpanId"] = json!(parent);
    }
    if let Some((trace_id, span_id)) = &s.link {
        out["links"] = json!([{"traceId": trace_id, "spanId": span_id}]);
    }
    if let Some((kind, message)) = &s.error {
        out["status"]["message"] = json!(message);
        out["events"] = json!([{
            "name": "exception",
            "timeUnixNano": nanos(s.end),
            "attributes": [
                attribute("exception.type", &Attribute::Text(kind.clone())),
                attribute("exception.message", &Attribute::Text(message.clone())),
            ],
        }]);
    }
    out
}

fn attribute(key: &str, value: &Attribute) -> Value {
    let value = match value {
        Attribute::Text(s) => json!({"stringValue": s}),
        // OTLP/JSON writes 64-bit integers as strings.
        Attribute::Int(i) => json!({"intValue": i.to_string()}),
    };
    json!({"key": key, "value": value})
}
