//! Request metrics in a registry owned by the app (not a global one, so test apps do not
//! collide), labelled by route template to keep cardinality bounded.

use std::time::Duration;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    durations: HistogramVec,
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
        registry
            .register(Box::new(requests.clone()))
            .expect("unique metric");
        registry
            .register(Box::new(durations.clone()))
            .expect("unique metric");
        Metrics {
            registry,
            requests,
            durations,
        }
    }

    pub fn observe_request(&self, method: &str, route: &str, status: u16, elapsed: Duration) {
        self.requests
            .with_label_values(&[method, route, &status.to_string()])
            .inc();
        self.durations
            .with_label_values(&[route])
            .observe(elapsed.as_secs_f64());
    }

    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("metrics encode");
        String::from_utf8(out).expect("metrics are UTF-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
