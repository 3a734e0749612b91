//! The scenarios, each run against the floor and the gateway, and their report.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use ojs_jetstream::store::Topology;
use serde_json::json;

use crate::bullmq::Reported;
use crate::drivers::Tally;
use crate::floor::Floor;
use crate::gateway::Gateway;
use crate::grpc::GrpcGateway;
use crate::process::{rss_mb, CpuMeter};
use crate::settings::Settings;

/// `timers`: the first job is due this long after its enqueue starts, the last one
/// `TIMER_SPREAD` later, the others evenly between.
pub const TIMER_LEAD: Duration = Duration::from_secs(15);
pub const TIMER_SPREAD: Duration = Duration::from_secs(100);

/// What one scenario measured.
#[derive(Default)]
pub struct Outcome {
    name: String,
    jobs: usize,
    seconds: f64,
    errors: u64,
    missing: usize,
    /// Enqueue→fetch latencies in microseconds (latency scenarios only).
    latencies: Vec<u64>,
    /// p50, p99 and max latency in ms as a driver reported them, instead of `latencies`
    /// (BullMQ rows).
    reported_ms: Option<[Option<f64>; 3]>,
    /// The floor scenario this one is compared with.
    floor: Option<String>,
    /// The BullMQ scenario this one is compared with, when BullMQ was measured.
    bullmq: Option<String>,
    /// Seconds the gateway's event publisher needed afterwards to catch up.
    events_catch_up: Option<f64>,
    rss_idle_mb: Option<f64>,
    rss_loaded_mb: Option<f64>,
    /// CPU seconds per process during the scenario.
    cpu: Vec<(&'static str, f64)>,
}

impl Outcome {
    fn rate(&self) -> f64 {
        if self.seconds > 0.0 {
            self.jobs as f64 / self.seconds
        } else {
            0.0
        }
    }

    fn percentile(&self, p: f64) -> Option<f64> {
        if self.latencies.is_empty() {
            return None;
        }
        let mut sorted = self.latencies.clone();
        sorted.sort_unstable();
        let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
        Some(sorted[index] as f64 / 1000.0)
    }

    /// p50, p99 and max latency in ms.
    fn latency(&self) -> [Option<f64>; 3] {
        self.reported_ms
            .unwrap_or_else(|| [0.5, 0.99, 1.0].map(|p| self.percentile(p)))
    }
}

/// Queue names the benchmark uses (prefixed per run).
pub const QUEUES: [&str; 10] = [
    "drain",
    "e2e",
    "latency",
    "memory",
    "timers",
    "workflow",
    "workflow-callback",
    "rate-limit",
    "stats",
    "leader",
];

/// How jobs are offered.
#[derive(Clone, Copy)]
pub struct Load {
    pub jobs: usize,
    pub batch: usize,
    pub producers: usize,
    pub pace: Option<Duration>,
}

/// Which system a scenario drives.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Floor,
    Http,
    /// The gateway's gRPC binding.
    Grpc,
}

impl Via {
    fn of(floor: bool) -> Via {
        if floor {
            Via::Floor
        } else {
            Via::Http
        }
    }

    /// The row of `scenario` run this way.
    fn name(self, scenario: &str) -> String {
        match self {
            Via::Floor => format!("floor-{scenario}"),
            Via::Http => scenario.to_owned(),
            Via::Grpc => format!("{scenario}-grpc"),
        }
    }
}

/// The system under measurement.
#[derive(Clone)]
pub enum Side {
    Gateway(Gateway, String),
    Grpc(GrpcGateway, String),
    Floor(Box<Floor>),
}

impl Side {
    fn queue(&self, name: &str) -> String {
        match self {
            Side::Gateway(_, prefix) => format!("{prefix}-{name}"),
            Side::Grpc(_, prefix) => format!("{prefix}-grpc-{name}"),
            Side::Floor(_) => name.to_owned(),
        }
    }

    async fn enqueue(&self, queue: &str, load: Load, clock: Instant, tally: Arc<Tally>) {
        match self {
            Side::Gateway(gw, _) => gw.enqueue(queue, load, clock, tally).await,
            Side::Grpc(gw, _) => gw.enqueue(queue, load, clock, tally).await,
            Side::Floor(floor) => {
                floor.queue(queue).await;
                floor.enqueue(queue, load, clock, tally).await;
            }
        }
    }

    async fn work(
        &self,
        queue: &str,
        count: usize,
        workers: usize,
        target: usize,
        clock: Instant,
        tally: Arc<Tally>,
    ) -> Vec<u64> {
        match self {
            Side::Gateway(gw, _) => gw.work(queue, count, workers, target, clock, tally).await,
            // One job at a time per stream: `count` is a FETCH's.
            Side::Grpc(gw, _) => gw.work(queue, workers, target, clock, tally).await,
            Side::Floor(floor) => {
                floor
                    .work(queue, count, workers, target, clock, tally)
                    .await
            }
        }
    }
}

pub struct Bench {
    settings: Settings,
    gateway: Side,
    /// The gateway's gRPC binding, when the benchmark was given its address.
    grpc: Option<Side>,
    floor: Side,
    /// The gateway's jobs bucket stream, to wait for its event publisher.
    js: jetstream::Context,
    clock: Instant,
    outcomes: Vec<Outcome>,
    /// Jobs waiting in the drain queue: floor, gateway.
    queued: [usize; 2],
}

impl Bench {
    /// A benchmark of the gateway, its queues named with `prefix`, against `floor`.
    pub fn new(
        settings: Settings,
        gateway: Gateway,
        grpc: Option<GrpcGateway>,
        prefix: String,
        floor: Floor,
    ) -> Bench {
        Bench {
            settings,
            grpc: grpc.map(|g| Side::Grpc(g, prefix.clone())),
            gateway: Side::Gateway(gateway, prefix),
            js: floor.js.clone(),
            floor: Side::Floor(Box::new(floor)),
            clock: Instant::now(),
            outcomes: Vec::new(),
            queued: [0, 0],
        }
    }

    fn side(&self, via: Via) -> Side {
        match via {
            Via::Floor => self.floor.clone(),
            Via::Http => self.gateway.clone(),
            Via::Grpc => self
                .grpc
                .clone()
                .unwrap_or_else(|| crate::flags::fail("a gRPC scenario needs --grpc")),
        }
    }

    fn meter(&self) -> CpuMeter {
        CpuMeter::start(vec![
            ("gateway", self.settings.gateway_pid),
            ("nats", self.settings.nats_pid),
            ("bench", Some(std::process::id())),
        ])
    }

    /// The rows of BullMQ's scenarios (`bullmq::run`), named `bullmq-<scenario>`.
    pub fn bullmq(&mut self, reported: Vec<Reported>) {
        for r in reported {
            let outcome = Outcome {
                name: format!("bullmq-{}", r.scenario),
                jobs: r.jobs,
                seconds: r.secs,
                errors: r.errors,
                missing: r.missing,
                reported_ms: Some([r.p50_ms, r.p99_ms, r.max_ms]),
                cpu: ["redis", "node"]
                    .into_iter()
                    .filter_map(|n| Some((n, *r.cpu_secs.get(n)?)))
                    .collect(),
                ..Default::default()
            };
            self.outcomes.push(outcome);
        }
    }

    /// Times an enqueue of `load` into `queue`.
    pub async fn enqueue(
        &mut self,
        floor: bool,
        name: &str,
        queue: &str,
        load: Load,
        report: bool,
    ) {
        let side = self.side(Via::of(floor));
        let queue = side.queue(queue);
        let tally = Arc::new(Tally::default());
        let start = Instant::now();
        let meter = self.meter();
        side.enqueue(&queue, load, self.clock, tally.clone()).await;
        self.queued[usize::from(!floor)] += tally.done.load(Ordering::Relaxed);
        let mut outcome = Outcome {
            name: Via::of(floor).name(name),
            jobs: tally.done.load(Ordering::Relaxed),
            seconds: start.elapsed().as_secs_f64(),
            errors: tally.errors.load(Ordering::Relaxed),
            missing: load.jobs - tally.done.load(Ordering::Relaxed),
            floor: (!floor).then(|| "floor-enqueue".to_owned()),
            bullmq: (!floor).then(|| format!("bullmq-{name}")),
            ..Default::default()
        };
        outcome.cpu = meter.finish();
        self.settle(floor, &mut outcome).await;
        progress(&outcome);
        if report {
            self.outcomes.push(outcome);
        }
    }

    /// Times fetching and acknowledging `target` of the jobs waiting in the drain queue.
    pub async fn drain(&mut self, floor: bool, count: usize, target: usize) {
        let target = target.min(self.queued[usize::from(!floor)]);
        let side = self.side(Via::of(floor));
        let queue = side.queue("drain");
        let tally = Arc::new(Tally::default());
        let start = Instant::now();
        let meter = self.meter();
        let workers = self.settings.workers;
        side.work(&queue, count, workers, target, self.clock, tally.clone())
            .await;
        let done = tally.done.load(Ordering::Relaxed);
        self.queued[usize::from(!floor)] -= done.min(self.queued[usize::from(!floor)]);
        let mut outcome = Outcome {
            name: Via::of(floor).name(&format!("drain-{count}")),
            jobs: done,
            seconds: tally.seconds_since(start),
            errors: tally.errors.load(Ordering::Relaxed),
            missing: target.saturating_sub(done),
            floor: (!floor).then(|| format!("floor-drain-{count}")),
            bullmq: (!floor).then(|| "bullmq-drain".to_owned()),
            ..Default::default()
        };
        outcome.cpu = meter.finish();
        self.settle(floor, &mut outcome).await;
        progress(&outcome);
        self.outcomes.push(outcome);
    }

    /// Producers and workers at once; from the first enqueue to the last ack. `pace` turns
    /// it into the latency scenario. Quoted against the floor's and BullMQ's rows of `name`.
    pub async fn run_through(&mut self, via: Via, name: &str, load: Load, workers: usize) {
        let side = self.side(via);
        let queue = side.queue(name);
        let produced = Arc::new(Tally::default());
        let consumed = Arc::new(Tally::default());
        let start = Instant::now();
        let meter = self.meter();
        let producers = {
            let (side, queue, produced, clock) =
                (side.clone(), queue.clone(), produced.clone(), self.clock);
            tokio::spawn(async move { side.enqueue(&queue, load, clock, produced).await })
        };
        let latencies = side
            .work(&queue, 1, workers, load.jobs, self.clock, consumed.clone())
            .await;
        let _ = producers.await;
        let done = consumed.done.load(Ordering::Relaxed);
        let gateway = via != Via::Floor;
        let mut outcome = Outcome {
            name: via.name(name),
            jobs: done,
            seconds: consumed.seconds_since(start),
            errors: produced.errors.load(Ordering::Relaxed)
                + consumed.errors.load(Ordering::Relaxed),
            missing: load.jobs.saturating_sub(done),
            floor: gateway.then(|| format!("floor-{name}")),
            bullmq: gateway.then(|| format!("bullmq-{name}")),
            latencies: if load.pace.is_some() {
                latencies
            } else {
                Vec::new()
            },
            ..Default::default()
        };
        outcome.cpu = meter.finish();
        self.settle(!gateway, &mut outcome).await;
        progress(&outcome);
        self.outcomes.push(outcome);
    }

    /// `e2e` through a bounded queue whose bound is never reached: what taking and freeing
    /// a place costs a job (architecture §3.27), quoted against the floor's `e2e`.
    pub async fn bounded(&mut self, load: Load, workers: usize) {
        let Side::Gateway(gw, _) = &self.gateway else {
            unreachable!("the gateway side talks HTTP")
        };
        gw.bound(&self.gateway.queue("bounded"), 2 * load.jobs)
            .await;
        self.run_through(Via::Http, "bounded", load, workers).await;
        if let Some(outcome) = self.outcomes.last_mut() {
            outcome.floor = Some("floor-e2e".into());
        }
    }

    /// `e2e`'s requests answered without NATS work (`Gateway::http_only`), compared with the
    /// floor's `e2e`: the share of the machine HTTP alone takes.
    pub async fn http_only(&mut self) {
        let Side::Gateway(gw, _) = &self.gateway else {
            unreachable!("the gateway side talks HTTP")
        };
        let queue = self.gateway.queue("e2e-http-only");
        let tally = Arc::new(Tally::default());
        let jobs = self.settings.jobs;
        let start = Instant::now();
        let meter = self.meter();
        gw.http_only(
            &queue,
            jobs,
            self.settings.producers + self.settings.workers,
            tally.clone(),
        )
        .await;
        let mut outcome = Outcome {
            name: "e2e-http-only".into(),
            jobs: tally.done.load(Ordering::Relaxed),
            seconds: start.elapsed().as_secs_f64(),
            errors: tally.errors.load(Ordering::Relaxed),
            missing: jobs - tally.done.load(Ordering::Relaxed),
            floor: Some("floor-e2e".into()),
            ..Default::default()
        };
        outcome.cpu = meter.finish();
        progress(&outcome);
        self.outcomes.push(outcome);
    }

    /// 500,000 (by default) jobs queued in batches of 1000: the gateway's RSS before and after.
    pub async fn memory(&mut self, pid: u32) {
        let idle = rss_mb(pid);
        let load = Load {
            jobs: self.settings.memory_jobs,
            batch: 1000,
            producers: self.settings.batch_producers,
            pace: None,
        };
        let side = self.gateway.clone();
        let queue = side.queue("memory");
        let tally = Arc::new(Tally::default());
        let start = Instant::now();
        let meter = self.meter();
        side.enqueue(&queue, load, self.clock, tally.clone()).await;
        let mut outcome = Outcome {
            name: "memory".into(),
            jobs: tally.done.load(Ordering::Relaxed),
            seconds: start.elapsed().as_secs_f64(),
            errors: tally.errors.load(Ordering::Relaxed),
            missing: load.jobs - tally.done.load(Ordering::Relaxed),
            rss_idle_mb: idle,
            ..Default::default()
        };
        outcome.cpu = meter.finish();
        self.settle(false, &mut outcome).await;
        outcome.rss_loaded_mb = rss_mb(pid);
        progress(&outcome);
        self.outcomes.push(outcome);
    }

    /// `timer_jobs` (100,000 by default) jobs scheduled over `TIMER_SPREAD`: the leader's RSS
    /// once it holds all their timers, and how late each one became fetchable.
    pub async fn timers(&mut self) {
        let Side::Gateway(gw, _) = &self.gateway else {
            unreachable!("the gateway side talks HTTP")
        };
        let gw = gw.clone();
        let pid = self.settings.gateway_pid;
        let idle = pid.and_then(rss_mb);
        let queue = self.gateway.queue("timers");
        let jobs = self.settings.timer_jobs;
        let produced = Arc::new(Tally::default());
        let meter = self.meter();
        let first_due = Instant::now() + TIMER_LEAD;
        gw.schedule(
            &queue,
            jobs,
            self.settings.batch_producers,
            self.clock,
            produced.clone(),
        )
        .await;
        let scheduled = produced.done.load(Ordering::Relaxed);
        // RSS once the leader holds every timer and the gateway is quiet again: the event
        // publisher has caught up and the idle-memory hook has run.
        let loaded = match pid {
            Some(pid) if self.timers_loaded().await => {
                self.settle(false, &mut Outcome::default()).await;
                tokio::time::sleep(Duration::from_secs(2)).await;
                rss_mb(pid)
            }
            _ => None,
        };
        eprintln!(
            "bench: timers — {scheduled} jobs scheduled, RSS {} MB with their timers loaded, \
             the first due in {:.1} s",
            loaded.map_or_else(|| "-".to_owned(), |mb| format!("{mb:.1}")),
            first_due
                .saturating_duration_since(Instant::now())
                .as_secs_f64()
        );
        let consumed = Arc::new(Tally::default());
        let latencies = gw
            .work(
                &queue,
                1,
                self.settings.workers,
                scheduled,
                self.clock,
                consumed.clone(),
            )
            .await;
        let done = consumed.done.load(Ordering::Relaxed);
        let mut outcome = Outcome {
            name: "timers".into(),
            jobs: done,
            seconds: consumed.seconds_since(first_due),
            errors: produced.errors.load(Ordering::Relaxed)
                + consumed.errors.load(Ordering::Relaxed),
            missing: jobs.saturating_sub(done),
            latencies,
            rss_idle_mb: idle,
            rss_loaded_mb: loaded,
            ..Default::default()
        };
        outcome.cpu = meter.finish();
        self.settle(false, &mut outcome).await;
        progress(&outcome);
        self.outcomes.push(outcome);
    }

    /// `workflow-chain`: step-to-step latency of a chain worked by long-polling workers
    /// (a step's ACK answered → the next step handed out). `workflow-fan-in`: a batch's
    /// last member ACK answered → its callback handed out.
    pub async fn workflow(&mut self) {
        let Side::Gateway(gw, _) = &self.gateway else {
            unreachable!("the gateway side talks HTTP")
        };
        let gw = gw.clone();
        let (queue, callback_queue) = (
            self.gateway.queue("workflow"),
            self.gateway.queue("workflow-callback"),
        );
        let steps = self.settings.workflow_steps;
        let tally = Arc::new(Tally::default());
        let meter = self.meter();
        let started = Instant::now();
        let latencies = gw
            .chain_steps(&queue, steps, self.settings.latency_workers, tally.clone())
            .await;
        let done = tally.done.load(Ordering::Relaxed);
        let mut chain = Outcome {
            name: "workflow-chain".into(),
            jobs: done,
            seconds: tally.seconds_since(started),
            errors: tally.errors.load(Ordering::Relaxed),
            missing: steps.saturating_sub(done),
            latencies,
            ..Default::default()
        };
        chain.cpu = meter.finish();
        self.settle(false, &mut chain).await;
        progress(&chain);
        self.outcomes.push(chain);

        let members = self.settings.workflow_members;
        let tally = Arc::new(Tally::default());
        let meter = self.meter();
        let started = Instant::now();
        let fan_in = gw
            .fan_in(
                &queue,
                &callback_queue,
                members,
                self.settings.workers,
                tally.clone(),
            )
            .await;
        let done = tally.done.load(Ordering::Relaxed);
        let mut outcome = Outcome {
            name: "workflow-fan-in".into(),
            jobs: done,
            seconds: started.elapsed().as_secs_f64(),
            errors: tally.errors.load(Ordering::Relaxed) + u64::from(fan_in.is_none()),
            missing: members.saturating_sub(done),
            latencies: fan_in.into_iter().collect(),
            ..Default::default()
        };
        outcome.cpu = meter.finish();
        self.settle(false, &mut outcome).await;
        progress(&outcome);
        self.outcomes.push(outcome);
    }

    /// `rate-limit`: ten seconds' worth of jobs of a queue limited to `rate_limit` starts a
    /// second, drained by `workers` workers from the start of a second (the limit's windows
    /// are whole seconds). The first window starts its whole allowance at once; the starts
    /// after it, per second, are the limiter's accuracy (the table's jobs/s counts all).
    pub async fn rate_limit(&mut self) {
        let Side::Gateway(gw, _) = &self.gateway else {
            unreachable!("the gateway side talks HTTP")
        };
        let gw = gw.clone();
        let queue = self.gateway.queue("rate-limit");
        let limit = self.settings.rate_limit;
        let jobs = (limit * 10) as usize;
        let tally = Arc::new(Tally::default());
        gw.enqueue_limited(&queue, jobs, limit, self.clock, tally.clone())
            .await;
        let tally = Arc::new(Tally::default());
        let meter = self.meter();
        let past = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("the clock is past 1970")
            .subsec_nanos();
        tokio::time::sleep(Duration::from_nanos(u64::from(1_000_000_000 - past))).await;
        let started = Instant::now();
        gw.work(
            &queue,
            1,
            self.settings.workers,
            jobs,
            self.clock,
            tally.clone(),
        )
        .await;
        let done = tally.done.load(Ordering::Relaxed);
        let mut outcome = Outcome {
            name: "rate-limit".into(),
            jobs: done,
            seconds: tally.seconds_since(started),
            errors: tally.errors.load(Ordering::Relaxed),
            missing: jobs.saturating_sub(done),
            ..Default::default()
        };
        outcome.cpu = meter.finish();
        let steady = done.saturating_sub(limit as usize) as f64 / outcome.seconds;
        eprintln!(
            "bench: rate-limit — {steady:.1} starts/s after the first window's burst, against \
             a limit of {limit}/s ({:.3}); {:.1} starts/s with it",
            steady / limit as f64,
            outcome.rate()
        );
        self.settle(false, &mut outcome).await;
        progress(&outcome);
        self.outcomes.push(outcome);
    }

    /// `stats`: `stats_jobs` (1,000,000 by default) jobs queued in batches of 1000, then
    /// 1000 reads one after another of each: the queue's statistics, the admin listing's
    /// first page newest first and oldest first, and the aggregate statistics.
    pub async fn stats(&mut self) {
        let Side::Gateway(gw, _) = &self.gateway else {
            unreachable!("the gateway side talks HTTP")
        };
        let gw = gw.clone();
        let load = Load {
            jobs: self.settings.stats_jobs,
            batch: 1000,
            producers: self.settings.batch_producers,
            pace: None,
        };
        let queue = self.gateway.queue("stats");
        let tally = Arc::new(Tally::default());
        let started = Instant::now();
        self.gateway
            .enqueue(&queue, load, self.clock, tally.clone())
            .await;
        let mut stored = Outcome {
            name: "stats-enqueue".into(),
            jobs: tally.done.load(Ordering::Relaxed),
            seconds: started.elapsed().as_secs_f64(),
            errors: tally.errors.load(Ordering::Relaxed),
            missing: load.jobs - tally.done.load(Ordering::Relaxed),
            ..Default::default()
        };
        self.settle(false, &mut stored).await;
        progress(&stored);
        self.outcomes.push(stored);
        let reads = [
            ("stats-read", format!("/ojs/v1/queues/{queue}/stats")),
            (
                "admin-page-newest",
                format!("/ojs/v1/admin/jobs?queue={queue}&state=available&per_page=20"),
            ),
            (
                "admin-page-oldest",
                format!("/ojs/v1/admin/jobs?queue={queue}&state=available&per_page=20&order=asc"),
            ),
            ("admin-stats", "/ojs/v1/admin/stats".to_owned()),
        ];
        for (name, path) in reads {
            let meter = self.meter();
            let started = Instant::now();
            let timed = gw.time_reads(&path, 1000).await;
            let mut outcome = Outcome {
                name: name.into(),
                seconds: started.elapsed().as_secs_f64(),
                errors: u64::from(timed.is_err()),
                ..Default::default()
            };
            match timed {
                Ok((latencies, last)) => {
                    let shown = match name {
                        "stats-read" => last["queue"]["available"].clone(),
                        "admin-stats" => last["jobs"]["available"].clone(),
                        _ => json!([
                            last["items"].as_array().map_or(0, Vec::len),
                            last["pagination"]["total"]
                        ]),
                    };
                    eprintln!("bench: {name} — the last answer: {shown}");
                    outcome.jobs = latencies.len();
                    outcome.latencies = latencies;
                }
                Err(e) => eprintln!("bench: {name} — a read failed: {e}"),
            }
            outcome.cpu = meter.finish();
            progress(&outcome);
            self.outcomes.push(outcome);
        }
    }

    /// `leader`: how fast one leader works off a backlog of job writes. `leader_jobs` jobs
    /// are enqueued in batches of 1000 (one job write each), faster than the leader follows
    /// (`leader-enqueue`); from the end of the enqueue until the event publisher has handled
    /// every write, only the leader works: `leader-backlog` is the writes left at that moment
    /// over that time, each turned into its event, counted and indexed.
    pub async fn leader(&mut self) {
        let load = Load {
            jobs: self.settings.leader_jobs,
            batch: 1000,
            producers: self.settings.batch_producers,
            pace: None,
        };
        let queue = self.gateway.queue("leader");
        let tally = Arc::new(Tally::default());
        let meter = self.meter();
        let started = Instant::now();
        self.gateway
            .enqueue(&queue, load, self.clock, tally.clone())
            .await;
        let done = tally.done.load(Ordering::Relaxed);
        let enqueued = Outcome {
            name: "leader-enqueue".into(),
            jobs: done,
            seconds: started.elapsed().as_secs_f64(),
            errors: tally.errors.load(Ordering::Relaxed),
            missing: load.jobs - done,
            cpu: meter.finish(),
            ..Default::default()
        };
        progress(&enqueued);
        self.outcomes.push(enqueued);

        let stream = format!("KV_{}-jobs", self.settings.namespace);
        let publisher = self.current_event_publisher(&stream).await;
        let meter = self.meter();
        let started = Instant::now();
        let backlog = self.consumer_backlog(&stream, &publisher).await;
        let caught_up = self
            .wait_for_consumer(&stream, &publisher, Duration::from_secs(300), |info| {
                info.num_pending == 0 && info.num_ack_pending == 0
            })
            .await;
        let drained = Outcome {
            name: "leader-backlog".into(),
            jobs: backlog,
            seconds: started.elapsed().as_secs_f64(),
            errors: u64::from(!caught_up),
            cpu: meter.finish(),
            ..Default::default()
        };
        progress(&drained);
        self.outcomes.push(drained);
    }

    /// The writes the consumer `name` on `stream` has not handled yet (pending, and
    /// delivered but not acknowledged); 0 when it cannot be read (said on stderr).
    async fn consumer_backlog(&self, stream: &str, name: &str) -> usize {
        let consumer = self
            .js
            .get_consumer_from_stream::<jetstream::consumer::pull::Config, _, _>(name, stream)
            .await;
        match consumer {
            Ok(mut consumer) => match consumer.info().await {
                Ok(info) => (info.num_pending + info.num_ack_pending as u64) as usize,
                Err(e) => {
                    eprintln!("bench: cannot read {name} on {stream}: {e}");
                    0
                }
            },
            Err(e) => {
                eprintln!("bench: no consumer {name} on {stream}: {e}");
                0
            }
        }
    }

    /// Waits (up to 30 s) until the leader has been handed every stored timer; false if it
    /// was not, or the timers stream could not be read.
    async fn timers_loaded(&self) -> bool {
        let stream = format!("{}-timers", self.settings.namespace);
        let limit = Duration::from_secs(30);
        self.wait_for_consumer(&stream, "scheduler", limit, |info| info.num_pending == 0)
            .await
    }

    /// After a gateway scenario, waits until its event publisher has caught up, so the next
    /// scenario starts from a quiet system; the wait is reported, not hidden.
    async fn settle(&self, floor: bool, outcome: &mut Outcome) {
        if floor {
            return;
        }
        let start = Instant::now();
        let stream = format!("KV_{}-jobs", self.settings.namespace);
        let limit = Duration::from_secs(60);
        let publisher = self.current_event_publisher(&stream).await;
        self.wait_for_consumer(&stream, &publisher, limit, |info| {
            info.num_pending == 0 && info.num_ack_pending == 0
        })
        .await;
        outcome.events_catch_up = Some(start.elapsed().as_secs_f64());
    }

    /// The event publisher consumer of the latest leadership on the jobs stream.
    async fn current_event_publisher(&self, stream: &str) -> String {
        use futures::StreamExt;
        let mut latest = (0, "event-publisher".to_owned());
        if let Ok(stream) = self.js.get_stream(stream).await {
            let mut names = stream.consumer_names();
            while let Some(Ok(name)) = names.next().await {
                if let Some(term) = Topology::event_publisher_term(&name) {
                    latest = latest.max((term, name));
                }
            }
        }
        latest.1
    }

    /// Polls the gateway's consumer `name` on `stream` until `done` holds for it, at most
    /// `limit`; false when it did not, or the consumer could not be read (said on stderr).
    async fn wait_for_consumer(
        &self,
        stream: &str,
        name: &str,
        limit: Duration,
        done: impl Fn(&jetstream::consumer::Info) -> bool,
    ) -> bool {
        let Ok(mut consumer) = self
            .js
            .get_consumer_from_stream::<jetstream::consumer::pull::Config, _, _>(name, stream)
            .await
        else {
            eprintln!("bench: no consumer {name} on {stream}; not waiting for it");
            return false;
        };
        let start = Instant::now();
        while start.elapsed() < limit {
            match consumer.info().await {
                Ok(info) if done(info) => return true,
                Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(_) => return false,
            }
        }
        false
    }

    pub fn report(&self) {
        println!(
            "{:<20} {:>8} {:>8} {:>10} {:>10} {:>6} {:>7} {:>8} {:>8} {:>8} {:>7} {:>7}  cpu s (gateway/nats/bench; bullmq rows: redis/node)",
            "scenario",
            "jobs",
            "secs",
            "jobs/s",
            "floor/s",
            "ratio",
            "÷bullmq",
            "p50 ms",
            "p99 ms",
            "max ms",
            "errors",
            "missing",
        );
        let fmt = |v: Option<f64>, digits: usize| {
            v.map_or_else(|| "-".to_owned(), |v| format!("{v:.digits$}"))
        };
        let find = |name: &Option<String>| {
            name.as_ref()
                .and_then(|n| self.outcomes.iter().find(|x| &x.name == n))
        };
        for o in &self.outcomes {
            let floor = find(&o.floor);
            let floor_rate = floor.map(Outcome::rate);
            let ratio = floor_rate.map(|f| o.rate() / f);
            let [p50, p99, max] = o.latency();
            let floor_p99 = floor.and_then(|f| f.latency()[1]);
            let bullmq = find(&o.bullmq);
            let bullmq_rate = bullmq.map(Outcome::rate);
            let bullmq_ratio = bullmq_rate.map(|b| o.rate() / b);
            let bullmq_p99 = bullmq.and_then(|b| b.latency()[1]);
            let bullmq_p99_ratio = p99.zip(bullmq_p99).map(|(g, b)| g / b);
            println!(
                "{:<20} {:>8} {:>8.2} {:>10.0} {:>10} {:>6} {:>7} {:>8} {:>8} {:>8} {:>7} {:>7}  {}",
                o.name,
                o.jobs,
                o.seconds,
                o.rate(),
                fmt(floor_rate, 0),
                fmt(ratio, 2),
                // Latency rows: p99 against BullMQ's p99 (lower is better); the others, jobs/s.
                fmt(bullmq_p99_ratio.or(bullmq_ratio), 2),
                fmt(p50, 2),
                fmt(p99, 2),
                fmt(max, 2),
                o.errors,
                o.missing,
                o.cpu
                    .iter()
                    .map(|(_, v)| format!("{v:.1}"))
                    .collect::<Vec<_>>()
                    .join("/")
            );
            let line = json!({
                "scenario": o.name,
                "jobs": o.jobs,
                "seconds": o.seconds,
                "jobs_per_sec": o.rate(),
                "floor": o.floor,
                "floor_jobs_per_sec": floor_rate,
                "ratio_to_floor": ratio,
                "p50_ms": p50,
                "p99_ms": p99,
                "max_ms": max,
                "floor_p99_ms": floor_p99,
                "bullmq": bullmq.map(|b| &b.name),
                "bullmq_jobs_per_sec": bullmq_rate,
                "ratio_to_bullmq": bullmq_ratio,
                "bullmq_p99_ms": bullmq_p99,
                "p99_ratio_to_bullmq": bullmq_p99_ratio,
                "errors": o.errors,
                "missing": o.missing,
                "events_catch_up_secs": o.events_catch_up,
                "rss_idle_mb": o.rss_idle_mb,
                "rss_loaded_mb": o.rss_loaded_mb,
                "cpu_secs": o.cpu.iter().map(|(n, v)| (n.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
            });
            eprintln!("{line}");
        }
    }
}

pub fn progress(o: &Outcome) {
    eprintln!(
        "bench: {} — {} jobs in {:.2} s, {} errors, {} missing",
        o.name, o.jobs, o.seconds, o.errors, o.missing
    );
}
