//! The job metrics in Prometheus form, built from the cluster's totals
//! (`store::ClusterTotals`), in two vocabularies: the events seed's (§7, `ojs_jobs_*` with
//! `job_type`, times in ms, `ojs_queue_depth` / `_active`, `ojs_dead_letter_depth`), which
//! the seed makes binding whenever metrics are exposed, and the observability spec's (§8,
//! `ojs_job_*` with `type`, times in seconds, jobs by state as `ojs_queue_jobs`). The leader
//! reports them and the other replicas do not, so summing a metric over every replica gives
//! the cluster's figure exactly once (docs/architecture.md §3.21). Pure: totals in, metric
//! families out.

use std::collections::BTreeMap;

use prometheus::proto::{
    Bucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType,
};

use crate::domain::state::JobState;
use crate::domain::totals::{
    self, TypeTotals, DURATION_BUCKETS, DURATION_MS_BUCKETS, QUEUE_TIME_BUCKETS, WAIT_MS_BUCKETS,
};
use crate::store::ClusterTotals;

/// A counter by queue and type: name, help, and how to read it from a type's totals.
type CounterSpec = (&'static str, &'static str, fn(&TypeTotals) -> u64);

/// The observability spec's counters (§8.1), labelled `queue` and `type`.
const COUNTERS: [CounterSpec; 10] = [
    (
        "ojs_job_enqueued_total",
        "Jobs enqueued (created available, scheduled or pending)",
        |t| t.enqueued,
    ),
    (
        "ojs_job_started_total",
        "Attempts started (jobs fetched by a worker)",
        |t| t.started,
    ),
    (
        "ojs_job_completed_total",
        "Jobs that reached completed",
        |t| t.completed,
    ),
    (
        "ojs_job_retried_total",
        "Failed attempts followed by a scheduled retry",
        |t| t.retried,
    ),
    (
        "ojs_job_failed_total",
        "Jobs that reached discarded by failing their last attempt",
        |t| t.failed,
    ),
    (
        "ojs_job_dead_lettered_total",
        "Failed jobs kept in the dead letter queue",
        |t| t.dead_lettered,
    ),
    ("ojs_job_cancelled_total", "Jobs cancelled", |t| t.cancelled),
    (
        "ojs_job_expired_total",
        "Jobs discarded because expires_at passed before they ran",
        |t| t.expired,
    ),
    (
        "ojs_job_dropped_total",
        "Jobs discarded by a full bounded queue's drop_oldest (backpressure.dropped)",
        |t| t.dropped,
    ),
    (
        "ojs_job_discarded_total",
        "Jobs that reached discarded (failed, expired or dropped)",
        TypeTotals::discarded,
    ),
];

/// The events seed's counters (§7.2), labelled `queue` and `job_type`; each counts the jobs
/// of one event type (§7.4).
const SEED_COUNTERS: [CounterSpec; 3] = [
    (
        "ojs_jobs_enqueued_total",
        "Jobs enqueued (job.enqueued)",
        |t| t.enqueued,
    ),
    (
        "ojs_jobs_completed_total",
        "Jobs completed (job.completed)",
        |t| t.completed,
    ),
    (
        "ojs_jobs_failed_total",
        "Jobs that reached terminal failure (job.discarded: last attempt failed, or dropped by a full bounded queue)",
        TypeTotals::discarded_events,
    ),
];

/// Every job metric of `totals`.
/// `dead_letter`: the dead-letter entries by the queue their jobs came from (queues with
/// none left out).
pub fn families(totals: &ClusterTotals, dead_letter: &BTreeMap<String, u64>) -> Vec<MetricFamily> {
    let by_type = || {
        totals.queues.iter().flat_map(|(queue, counts)| {
            counts
                .types
                .iter()
                .map(move |(job_type, t)| (queue.as_str(), job_type.as_str(), t))
        })
    };
    let counters = |specs: &'static [CounterSpec], type_label: &'static str| {
        specs.iter().map(move |(name, help, read)| {
            family(
                name,
                help,
                MetricType::COUNTER,
                by_type()
                    .map(|(queue, job_type, t)| {
                        counter(&[("queue", queue), (type_label, job_type)], read(t))
                    })
                    .collect(),
            )
        })
    };
    let mut out: Vec<MetricFamily> = counters(&COUNTERS, "type")
        .chain(counters(&SEED_COUNTERS, "job_type"))
        .collect();
    out.push(family(
        "ojs_job_duration_seconds",
        "Attempt durations (active until completed, retryable or discarded), by the state the attempt ended in",
        MetricType::HISTOGRAM,
        by_type()
            .flat_map(|(queue, job_type, t)| {
                t.durations.iter().map(move |(state, h)| {
                    histogram(
                        &[("queue", queue), ("type", job_type), ("state", state.as_str())],
                        h,
                        &DURATION_BUCKETS,
                        Unit::AS_STORED,
                    )
                })
            })
            .collect(),
    ));
    out.push(family(
        "ojs_jobs_duration_ms",
        "Attempt durations in ms, recorded on job.completed and job.failed",
        MetricType::HISTOGRAM,
        by_type()
            .filter(|(_, _, t)| !t.durations.is_empty())
            .map(|(queue, job_type, t)| {
                histogram(
                    &[("queue", queue), ("job_type", job_type)],
                    &t.all_durations(),
                    &DURATION_BUCKETS,
                    Unit::ms(&DURATION_MS_BUCKETS),
                )
            })
            .collect(),
    ));
    for (name, help, label, unit) in [
        (
            "ojs_job_queue_time_seconds",
            "Time from becoming available to the start of the first attempt",
            "type",
            Unit::AS_STORED,
        ),
        (
            "ojs_jobs_wait_ms",
            "Time in ms from enqueued_at to the first attempt's started_at, recorded on its job.started",
            "job_type",
            Unit::ms(&WAIT_MS_BUCKETS),
        ),
    ] {
        out.push(family(
            name,
            help,
            MetricType::HISTOGRAM,
            by_type()
                .filter(|(_, _, t)| t.queue_time.count() > 0)
                .map(|(queue, job_type, t)| {
                    histogram(
                        &[("queue", queue), (label, job_type)],
                        &t.queue_time,
                        &QUEUE_TIME_BUCKETS,
                        unit,
                    )
                })
                .collect(),
        ));
    }
    out.push(family(
        "ojs_queue_jobs",
        "Jobs per queue per state now",
        MetricType::GAUGE,
        totals
            .queues
            .iter()
            .flat_map(|(queue, counts)| {
                JobState::ALL.iter().map(move |state| {
                    gauge(
                        &[("queue", queue), ("state", state.as_str())],
                        counts.states.of(*state) as f64,
                    )
                })
            })
            .collect(),
    ));
    for (name, help, state) in [
        (
            "ojs_queue_depth",
            "Jobs available per queue now",
            JobState::Available,
        ),
        (
            "ojs_queue_active",
            "Jobs active per queue now",
            JobState::Active,
        ),
        (
            "ojs_workers_busy",
            "Jobs executing now (active), per queue",
            JobState::Active,
        ),
    ] {
        out.push(family(
            name,
            help,
            MetricType::GAUGE,
            totals
                .queues
                .iter()
                .map(|(queue, counts)| gauge(&[("queue", queue)], counts.states.of(state) as f64))
                .collect(),
        ));
    }
    let mut dead_queues: Vec<&str> = totals.queues.iter().map(|(q, _)| q.as_str()).collect();
    dead_queues.extend(dead_letter.keys().map(String::as_str));
    dead_queues.sort_unstable();
    dead_queues.dedup();
    out.push(family(
        "ojs_dead_letter_depth",
        "Jobs in the dead letter queue now, by the queue they came from",
        MetricType::GAUGE,
        dead_queues
            .into_iter()
            .map(|queue| {
                let entries = dead_letter.get(queue).copied().unwrap_or(0);
                gauge(&[("queue", queue)], entries as f64)
            })
            .collect(),
    ));
    for (name, help, value) in [
        ("ojs_workers_active", "Workers in the registry: heartbeating, or not yet declared dead", totals.workers),
        ("ojs_event_publisher_lag", "Job writes stored but not yet turned into events and counts by the leader", totals.unhandled_writes),
        ("ojs_timers_pending", "Timers stored and not yet fired (scheduled jobs, retries, deadlines, dead-worker checks)", totals.timers_pending),
    ] {
        out.push(family(name, help, MetricType::GAUGE, vec![gauge(&[], value as f64)]));
    }
    // The text format has no empty family (a histogram before any job finished).
    out.retain(|f| !f.get_metric().is_empty());
    out
}

fn family(name: &str, help: &str, kind: MetricType, metrics: Vec<Metric>) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(name.to_owned());
    f.set_help(help.to_owned());
    f.set_field_type(kind);
    f.set_metric(metrics);
    f
}

fn metric(labels: &[(&str, &str)]) -> Metric {
    let mut m = Metric::default();
    m.set_label(
        labels
            .iter()
            .map(|(name, value)| {
                let mut pair = LabelPair::default();
                pair.set_name((*name).to_owned());
                pair.set_value((*value).to_owned());
                pair
            })
            .collect(),
    );
    m
}

fn counter(labels: &[(&str, &str)], value: u64) -> Metric {
    let mut c = Counter::default();
    c.set_value(value as f64);
    let mut m = metric(labels);
    m.set_counter(c);
    m
}

fn gauge(labels: &[(&str, &str)], value: f64) -> Metric {
    let mut g = Gauge::default();
    g.set_value(value);
    let mut m = metric(labels);
    m.set_gauge(g);
    m
}

/// The unit a histogram is rendered in: its bounds, and the factor from the stored unit.
#[derive(Clone, Copy)]
struct Unit {
    /// `None`: the stored bounds.
    bounds: Option<&'static [f64]>,
    scale: f64,
}

impl Unit {
    const AS_STORED: Unit = Unit {
        bounds: None,
        scale: 1.0,
    };

    /// Milliseconds from stored seconds, in `bounds`.
    fn ms(bounds: &'static [f64]) -> Unit {
        Unit {
            bounds: Some(bounds),
            scale: 1000.0,
        }
    }
}

fn histogram(labels: &[(&str, &str)], h: &totals::Histogram, stored: &[f64], unit: Unit) -> Metric {
    let mut out = Histogram::default();
    out.set_sample_count(h.count());
    out.set_sample_sum(h.sum * unit.scale);
    out.set_bucket(
        h.cumulative_at(stored, unit.scale, unit.bounds.unwrap_or(stored))
            .map(|(bound, seen)| {
                let mut b = Bucket::default();
                b.set_upper_bound(bound);
                b.set_cumulative_count(seen);
                b
            })
            .collect(),
    );
    let mut m = metric(labels);
    m.set_histogram(out);
    m
}

#[cfg(test)]
mod tests {
    use prometheus::{Encoder, TextEncoder};

    use super::*;
    use crate::domain::stats::QueueCounts;
    use crate::domain::totals::{add, Outcome, Tally};

    fn text(totals: &ClusterTotals, dead_letter: &BTreeMap<String, u64>) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&families(totals, dead_letter), &mut out)
            .expect("encodes");
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_cluster_with_no_jobs_yet_has_only_its_gauges() {
        let text = text(&ClusterTotals::default(), &BTreeMap::new());
        assert!(text.contains("ojs_workers_active 0"), "{text}");
        assert!(!text.contains("ojs_job_duration_seconds"), "{text}");
    }

    #[test]
    fn totals_become_labelled_series() {
        let mut counts = QueueCounts::default();
        let tally = |outcome, seconds| Tally {
            job_type: "mail.send".into(),
            outcome,
            seconds,
        };
        add(&mut counts.types, &tally(Outcome::Enqueued, None));
        add(&mut counts.types, &tally(Outcome::Completed, Some(0.07)));
        add(&mut counts.types, &tally(Outcome::Retried, Some(0.3)));
        counts.states.completed = 1;
        counts.states.available = 4;
        let text = text(
            &ClusterTotals {
                queues: vec![("mail".into(), counts)],
                ..ClusterTotals::default()
            },
            &[("bounces".to_owned(), 2)].into(),
        );
        for line in [
            r#"ojs_job_enqueued_total{queue="mail",type="mail.send"} 1"#,
            r#"ojs_job_duration_seconds_bucket{queue="mail",type="mail.send",state="completed",le="0.05"} 0"#,
            r#"ojs_job_duration_seconds_bucket{queue="mail",type="mail.send",state="completed",le="0.1"} 1"#,
            r#"ojs_job_duration_seconds_bucket{queue="mail",type="mail.send",state="completed",le="+Inf"} 1"#,
            r#"ojs_queue_jobs{queue="mail",state="completed"} 1"#,
            // The events seed's vocabulary: one duration histogram over every attempt, in ms.
            r#"ojs_jobs_enqueued_total{queue="mail",job_type="mail.send"} 1"#,
            r#"ojs_jobs_completed_total{queue="mail",job_type="mail.send"} 1"#,
            r#"ojs_jobs_failed_total{queue="mail",job_type="mail.send"} 0"#,
            r#"ojs_jobs_duration_ms_bucket{queue="mail",job_type="mail.send",le="50"} 0"#,
            r#"ojs_jobs_duration_ms_bucket{queue="mail",job_type="mail.send",le="100"} 1"#,
            r#"ojs_jobs_duration_ms_bucket{queue="mail",job_type="mail.send",le="250"} 1"#,
            r#"ojs_jobs_duration_ms_bucket{queue="mail",job_type="mail.send",le="500"} 2"#,
            r#"ojs_jobs_duration_ms_bucket{queue="mail",job_type="mail.send",le="300000"} 2"#,
            r#"ojs_jobs_duration_ms_sum{queue="mail",job_type="mail.send"} 370"#,
            r#"ojs_jobs_duration_ms_count{queue="mail",job_type="mail.send"} 2"#,
            r#"ojs_queue_depth{queue="mail"} 4"#,
            r#"ojs_queue_active{queue="mail"} 0"#,
            r#"ojs_dead_letter_depth{queue="bounces"} 2"#,
            r#"ojs_dead_letter_depth{queue="mail"} 0"#,
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        assert!(
            !text.contains(r#"le="120000""#),
            "only the seed's buckets: {text}"
        );
    }
}
