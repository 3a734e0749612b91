//! Long mixed load through two gateway processes (docs/performance.md §8): enqueues (some
//! scheduled), fetches, ACKs, failed first attempts and their retries, and a cron entry
//! every second, with retention short enough that finished jobs and old events are removed
//! while it runs. After the warm-up, gateway RSS, the JetStream consumers, the stream sizes
//! and the event publisher's lag must stay flat, and every accepted job must have run once.
//!
//! Long by design, so not part of `cargo test`: `.ci/run` runs it for 5 minutes,
//! `OJS_SOAK_SECS=3600 cargo test --test integration soak:: -- --ignored --nocapture` for an hour.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use common::load::{self, Seen};
use common::{GatewayProcess, NatsServer, TestApp};
use futures::future::join_all;
use futures::StreamExt;
use serde_json::json;

/// Finished jobs and events are kept this long, so the streams reach a steady size early.
const RETENTION_MS: u64 = 20_000;

/// Ephemeral consumers a sample may catch: the leader's two sweeps (running places and
/// depth tokens) and a listing or two, each deleted when done. Leaked ones would pile up.
const MAX_EPHEMERAL: usize = 4;

/// One reading of everything that must stay flat.
#[derive(Debug, Clone, Copy)]
struct Sample {
    secs: u64,
    rss_mb: [f64; 2],
    /// Standing consumers (durable ones and KV watches): a new one is a leak.
    consumers: usize,
    /// Ephemeral pull consumers: a sweep or listing in flight makes one and deletes it
    /// afterwards (NATS removes any left after 10 s unused), so a sample may catch a few.
    ephemeral: usize,
    jobs_stream: u64,
    events_stream: u64,
    timers_stream: u64,
    /// Job writes the event publisher has not acknowledged yet.
    publisher_lag: u64,
    acked: usize,
}

async fn sample(
    js: &jetstream::Context,
    gateways: &[GatewayProcess; 2],
    secs: u64,
    acked: usize,
) -> Sample {
    let mut s = Sample {
        secs,
        rss_mb: [gateways[0].rss_mb(), gateways[1].rss_mb()],
        consumers: 0,
        ephemeral: 0,
        jobs_stream: 0,
        events_stream: 0,
        timers_stream: 0,
        publisher_lag: 0,
        acked,
    };
    let mut streams = js.streams();
    let mut names = Vec::new();
    while let Some(Ok(info)) = streams.next().await {
        names.push(info.config.name.clone());
        let messages = info.state.messages;
        match info.config.name.as_str() {
            "KV_ojs-jobs" => s.jobs_stream = messages,
            "ojs-events" => s.events_stream = messages,
            "ojs-timers" => s.timers_stream = messages,
            _ => {}
        }
    }
    for name in names {
        let stream = js.get_stream_no_info(&name).await.expect("a stream");
        let mut consumers = stream.consumers();
        while let Some(Ok(info)) = consumers.next().await {
            // Durable consumers and the gateways' KV watches (push) stand; a pull
            // consumer without a name is a sweep or listing in flight.
            if info.config.durable_name.is_some() || info.config.deliver_subject.is_some() {
                s.consumers += 1;
            } else {
                s.ephemeral += 1;
            }
        }
    }
    let jobs = js.get_stream("KV_ojs-jobs").await.expect("the jobs stream");
    let mut names = jobs.consumer_names();
    while let Some(Ok(name)) = names.next().await {
        if name.starts_with("event-publisher") {
            let info = jobs
                .consumer_info(&name)
                .await
                .expect("the publisher's consumer");
            s.publisher_lag = s
                .publisher_lag
                .max(info.num_pending + info.num_ack_pending as u64);
        }
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: .ci/run runs it; OJS_SOAK_SECS sets the length"]
async fn mixed_load_for_a_long_time_stays_flat() {
    let length = Duration::from_secs(
        std::env::var("OJS_SOAK_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(300),
    );
    let warm_up = (length / 4).max(Duration::from_millis(2 * RETENTION_MS));
    let nats = NatsServer::start();
    let retention = RETENTION_MS.to_string();
    let env = [
        ("OJS_FINISHED_JOBS_MAX_AGE_MS", retention.as_str()),
        ("OJS_EVENTS_MAX_AGE_MS", retention.as_str()),
    ];
    let gateways = [
        GatewayProcess::start(&nats.url, &env).await,
        GatewayProcess::start(&nats.url, &env).await,
    ];
    let apps: Vec<TestApp> = gateways.iter().map(GatewayProcess::client).collect();
    let (a, b) = (&apps[0], &apps[1]);
    let r = a
        .post(
            "/ojs/v1/cron",
            json!({"name": "soak", "expression": "@every 1s", "overlap_policy": "allow",
                "job_template": {"type": "cron.tick", "args": [], "options": {"queue": "busy"}}}),
        )
        .await;
    assert!(r.status.is_success(), "{}", r.body);
    let js = jetstream::new(async_nats::connect(&nats.url).await.unwrap());

    let seen = Mutex::new(Seen::default());
    let stop_producing = AtomicBool::new(false);
    let stop_working = AtomicBool::new(false);
    load::limit(a).await;
    let (producers, workers) = ([a, b], [b, a]);
    let started = Instant::now();
    let watch = async {
        let mut samples = Vec::new();
        println!("secs  rss_a_mb  rss_b_mb  consumers  ephemeral  jobs_stream  events_stream  timers_stream  publisher_lag  acked");
        while started.elapsed() < length {
            tokio::time::sleep((length / 60).max(Duration::from_secs(5))).await;
            let acked = seen.lock().unwrap().acked.len();
            let s = sample(&js, &gateways, started.elapsed().as_secs(), acked).await;
            println!(
                "{:>4}  {:>8.1}  {:>8.1}  {:>9}  {:>9}  {:>11}  {:>13}  {:>13}  {:>13}  {:>5}",
                s.secs,
                s.rss_mb[0],
                s.rss_mb[1],
                s.consumers,
                s.ephemeral,
                s.jobs_stream,
                s.events_stream,
                s.timers_stream,
                s.publisher_lag,
                s.acked
            );
            samples.push(s);
        }
        stop_producing.store(true, Ordering::Relaxed);
        samples
    };
    let produce = join_all((0..4).map(|_| load::produce(&producers, &seen, &stop_producing)));
    // Drained once the producers are done: an enqueue still in flight may yet be accepted.
    let producing = async {
        let (samples, _) = tokio::join!(watch, produce);
        load::drained(&seen, Duration::from_secs(60)).await;
        stop_working.store(true, Ordering::Relaxed);
        samples
    };
    let work = join_all((0..4).map(|_| load::work(&workers, &seen, &stop_working)));
    let (samples, _) = tokio::join!(producing, work);

    let seen = seen.lock().unwrap();
    seen.report(&[], Duration::ZERO);
    seen.check(Duration::from_secs(5));

    let steady: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.secs >= warm_up.as_secs())
        .collect();
    assert!(steady.len() >= 3, "too few samples after the warm-up");
    let first = steady[0];
    for s in &steady {
        for g in 0..2 {
            assert!(
                s.rss_mb[g] <= first.rss_mb[g] * 1.5 + 16.0,
                "gateway {g} grew from {:.1} to {:.1} MiB",
                first.rss_mb[g],
                s.rss_mb[g]
            );
        }
        assert_eq!(s.consumers, first.consumers, "consumers at {} s", s.secs);
        assert!(
            s.ephemeral <= MAX_EPHEMERAL,
            "{} ephemeral consumers at {} s",
            s.ephemeral,
            s.secs
        );
        for (what, now, then) in [
            ("jobs stream", s.jobs_stream, first.jobs_stream),
            ("events stream", s.events_stream, first.events_stream),
            ("timers stream", s.timers_stream, first.timers_stream),
        ] {
            assert!(
                now <= then * 3 / 2 + 2_000,
                "the {what} grew from {then} to {now} messages"
            );
        }
        assert!(
            s.publisher_lag <= 5_000,
            "the event publisher lagged {} writes at {} s",
            s.publisher_lag,
            s.secs
        );
    }
}
