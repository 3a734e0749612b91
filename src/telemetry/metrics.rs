//! Request and replica metrics in a registry owned by the app (not a global one, so test
//! apps do not collide), labelled by route template to keep cardinality bounded. The job
//! metrics are the leader's (`job_metrics.rs`).

use std::time::Duration;

use prometheus::proto::MetricFamily;
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

/// Cheap to clone: every clone records into the same registry.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    durations: HistogramVec,
    /// Leader services that ended or panicked while leading, by service.
    leader_service_failures: IntCounterVec,
    /// Leaderships this replica gave up because a service made no progress, by service.
    leader_stalls: IntCounterVec,
    /// Job-record writes the event publisher could not read or derive events from.
    job_writes_skipped: IntCounter,
    /// Events derived from a later write's trail because the publisher never saw their own
    /// write (the bucket's history had dropped it).
    events_recovered: IntCounter,
    /// Timers the leader holds in memory (due within its horizon).
    timers_held: IntGauge,
    /// Timers handed back to JetStream with a NAK delay (due beyond the horizon).
    timers_handed_back: IntCounter,
    /// Queue lanes this gateway keeps a pull loop open for (set when scraped).
    pullers_open: IntGauge,
    /// 1 while this replica leads the coordinator (and reports the job metrics).
    leader: IntGauge,
    /// Job spans the OTLP exporter dropped (queue full, collector unreachable).
    trace_spans_dropped: IntCounter,
    /// PUSHes refused by a queue's bound, by queue (backpressure spec §10.2).
    backpressure_rejected: IntCounterVec,
    /// Depth / bound of each bounded queue, as the leader last read it.
    backpressure_pressure: GaugeVec,
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "ojs_http_requests_total",
                "HTTP requests by method, route and status",
            ),
            &["method", "route", "status"],
        )
        .expect("valid metric");
        let durations = HistogramVec::new(
            HistogramOpts::new(
                "ojs_http_request_duration_seconds",
                "HTTP request latency by route",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
            ]),
            &["route"],
        )
        .expect("valid metric");
        let leader_service_failures = IntCounterVec::new(
            Opts::new(
                "ojs_leader_service_failures_total",
                "Leader services of this replica that stopped or panicked while leading",
            ),
            &["service"],
        )
        .expect("valid metric");
        let leader_stalls = IntCounterVec::new(
            Opts::new(
                "ojs_leader_stalls_total",
                "Leaderships this replica gave up because a leader service made no progress for leader_stall_ms",
            ),
            &["service"],
        )
        .expect("valid metric");
        let job_writes_skipped = IntCounter::new(
            "ojs_job_writes_skipped_total",
            "Job-record writes the event publisher skipped because it could not process them",
        )
        .expect("valid metric");
        let events_recovered = IntCounter::new(
            "ojs_events_recovered_total",
            "Events published from a later write's trail because this leadership's publisher never saw their own write (dropped from the bucket's history, or from before it began: those are usually duplicates the events stream drops)",
        )
        .expect("valid metric");
        let timers_held = IntGauge::new(
            "ojs_timers_held",
            "Timers this replica's scheduler holds in memory, due within its horizon",
        )
        .expect("valid metric");
        let timers_handed_back = IntCounter::new(
            "ojs_timers_handed_back_total",
            "Timers due beyond the horizon handed back to JetStream with a NAK delay",
        )
        .expect("valid metric");
        let pullers_open = IntGauge::new(
            "ojs_queue_pullers_open",
            "Queue lanes this gateway keeps a pull loop open for; idle ones are closed",
        )
        .expect("valid metric");
        let leader = IntGauge::new(
            "ojs_leader",
            "1 while this replica leads the coordinator: it then reports the cluster's job metrics",
        )
        .expect("valid metric");
        let trace_spans_dropped = IntCounter::new(
            "ojs_trace_spans_dropped_total",
            "Job spans not exported: the exporter's queue was full or the OTLP collector did not take them",
        )
        .expect("valid metric");
        let backpressure_rejected = IntCounterVec::new(
            Opts::new(
                "ojs_backpressure_rejected_total",
                "PUSHes this gateway refused with queue_full because the queue was at its bound",
            ),
            &["queue"],
        )
        .expect("valid metric");
        let backpressure_pressure = GaugeVec::new(
            Opts::new(
                "ojs_backpressure_pressure",
                "Unfinished jobs of a bounded queue divided by its bound (0 to 1), read by the leader each second",
            ),
            &["queue"],
        )
        .expect("valid metric");
        for metric in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(durations.clone()),
            Box::new(leader_service_failures.clone()),
            Box::new(leader_stalls.clone()),
            Box::new(job_writes_skipped.clone()),
            Box::new(events_recovered.clone()),
            Box::new(timers_held.clone()),
            Box::new(timers_handed_back.clone()),
            Box::new(pullers_open.clone()),
            Box::new(leader.clone()),
            Box::new(trace_spans_dropped.clone()),
            Box::new(backpressure_rejected.clone()),
            Box::new(backpressure_pressure.clone()),
        ] {
            registry.register(metric).expect("unique metric");
        }
        Metrics {
            registry,
            requests,
            durations,
            leader_service_failures,
            leader_stalls,
            job_writes_skipped,
            events_recovered,
            timers_held,
            timers_handed_back,
            pullers_open,
            leader,
            trace_spans_dropped,
            backpressure_rejected,
            backpressure_pressure,
        }
    }

    pub fn backpressure_rejected(&self, queue: &str) {
        self.backpressure_rejected.with_label_values(&[queue]).inc();
    }

    /// The pressure on each bounded queue; queues no longer bounded (or led) are dropped.
    pub fn set_backpressure(&self, pressures: &[(String, f64)]) {
        self.backpressure_pressure.reset();
        for (queue, pressure) in pressures {
            self.backpressure_pressure
                .with_label_values(&[queue])
                .set(*pressure);
        }
    }

    pub fn set_leading(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    pub fn leading(&self) -> bool {
        self.leader.get() == 1
    }

    pub fn set_pullers_open(&self, open: usize) {
        self.pullers_open
            .set(i64::try_from(open).unwrap_or(i64::MAX));
    }

    pub fn set_timers_held(&self, held: usize) {
        self.timers_held
            .set(i64::try_from(held).unwrap_or(i64::MAX));
    }

    pub fn timer_handed_back(&self) {
        self.timers_handed_back.inc();
    }

    pub fn leader_service_failed(&self, service: &str) {
        self.leader_service_failures
            .with_label_values(&[service])
            .inc();
    }

    pub fn leader_stalled(&self, service: &str) {
        self.leader_stalls.with_label_values(&[service]).inc();
    }

    pub fn job_write_skipped(&self) {
        self.job_writes_skipped.inc();
    }

    pub fn trace_spans_dropped(&self, count: usize) {
        self.trace_spans_dropped.inc_by(count as u64);
    }

    pub fn events_recovered(&self, count: usize) {
        self.events_recovered.inc_by(count as u64);
    }

    pub fn observe_request(&self, method: &str, route: &str, status: u16, elapsed: Duration) {
        // Clients choose the method token: only the standard ones become label values, so no
        // client can create series without bound (routes are bounded by the router).
        let method = match method {
            "GET" | "POST" | "PUT" | "PATCH" | "DELETE" | "HEAD" | "OPTIONS" => method,
            _ => "other",
        };
        // A status is three digits (`http::StatusCode`); written without allocating.
        let digits = [
            b'0' + (status / 100 % 10) as u8,
            b'0' + (status / 10 % 10) as u8,
            b'0' + (status % 10) as u8,
        ];
        let status = std::str::from_utf8(&digits).unwrap_or("000");
        self.requests
            .with_label_values(&[method, route, status])
            .inc();
        self.durations
            .with_label_values(&[route])
            .observe(elapsed.as_secs_f64());
    }

    /// This registry's metrics, then `more` (the leader's job metrics).
    pub fn render(&self, more: Vec<MetricFamily>) -> String {
        let mut families = self.registry.gather();
        families.extend(more);
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&families, &mut out)
            .expect("metrics encode");
        String::from_utf8(out).expect("metrics are UTF-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
