//! The ojs-jetstream benchmark (docs/performance.md). It drives a running gateway over HTTP
//! with keep-alive connections and, in the same run, the gateway's NATS server directly with
//! async-nats doing the minimum a job needs (the *floor*): every gateway figure is quoted as
//! a ratio to the floor measured minutes earlier on the same machine.
//!
//! ```text
//! cargo run --release --example bench -- [--url http://127.0.0.1:8080]
//!     [--nats nats://127.0.0.1:4222] [--namespace ojs] [--jobs 20000] [--producers 64]
//!     [--workers 64] [--batch-producers 8] [--rate 200] [--latency-secs 10]
//!     [--latency-workers 8] [--scenarios enqueue,drain,e2e,latency[,memory][,timers]]
//!     [--gateway-pid PID] [--nats-pid PID] [--memory-jobs 500000] [--timer-jobs 100000]
//! ```
//!
//! `scripts/bench.sh` starts a fresh nats-server and a release gateway and runs this against
//! them. Prints a table, then one JSON line per scenario. Failed requests are counted in
//! `errors`; jobs that never came back are counted in `missing`. With the pids given, each
//! scenario also reports the CPU seconds the gateway, nats-server and the benchmark used.
//! The `e2e` scenario ends with `e2e-http-only`: the same requests answered without NATS
//! work, which shows how much of the machine HTTP alone takes. `memory` and `timers` run
//! only when named.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::PullConsumer, kv, stream::StorageType};
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use ojs_jetstream::config::Config;
use ojs_jetstream::store::Topology;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Longest a drain waits for jobs that do not arrive before it counts them as missing.
const DRAIN_PATIENCE: Duration = Duration::from_secs(20);
/// How long a worker's fetch waits for a job when its queue is empty: a gateway FETCH with
/// `wait_ms`, a waiting pull on the floor. Workers block instead of polling.
const FETCH_WAIT: Duration = Duration::from_secs(1);
/// Pause of a worker whose fetch came back empty, before it fetches again.
const IDLE_PAUSE: Duration = Duration::from_millis(1);
/// `timers`: the first job is due this long after its enqueue starts, the last one
/// `TIMER_SPREAD` later, the others evenly between.
const TIMER_LEAD: Duration = Duration::from_secs(15);
const TIMER_SPREAD: Duration = Duration::from_secs(100);

#[derive(Clone)]
struct Settings {
    url: String,
    nats: String,
    namespace: String,
    jobs: usize,
    producers: usize,
    workers: usize,
    batch_producers: usize,
    rate: u64,
    latency_secs: u64,
    latency_workers: usize,
    scenarios: Vec<String>,
    gateway_pid: Option<u32>,
    nats_pid: Option<u32>,
    memory_jobs: usize,
    timer_jobs: usize,
}

/// `--name value` pairs from the command line; each is taken once, leftovers are errors.
struct Flags(HashMap<String, String>);

impl Flags {
    fn parse() -> Flags {
        let mut map = HashMap::new();
        let mut args = std::env::args().skip(1);
        while let Some(flag) = args.next() {
            let Some(name) = flag.strip_prefix("--") else {
                fail(&format!("unexpected argument {flag}"));
            };
            let Some(value) = args.next() else {
                fail(&format!("--{name} needs a value"));
            };
            map.insert(name.to_owned(), value);
        }
        Flags(map)
    }

    fn text(&mut self, name: &str, default: &str) -> String {
        self.0.remove(name).unwrap_or_else(|| default.into())
    }

    fn pid(&mut self, name: &str) -> Option<u32> {
        self.0
            .contains_key(name)
            .then(|| self.number(name, 0) as u32)
    }

    fn number(&mut self, name: &str, default: u64) -> u64 {
        self.0.remove(name).map_or(default, |v| {
            v.parse()
                .unwrap_or_else(|_| fail(&format!("--{name} takes a number, got {v}")))
        })
    }
}

impl Settings {
    fn from_args() -> Settings {
        let mut f = Flags::parse();
        let settings = Settings {
            url: f.text("url", "http://127.0.0.1:8080"),
            nats: f.text("nats", "nats://127.0.0.1:4222"),
            namespace: f.text("namespace", "ojs"),
            scenarios: f
                .text("scenarios", "enqueue,drain,e2e,latency")
                .split(',')
                .map(str::to_owned)
                .collect(),
            jobs: f.number("jobs", 20_000) as usize,
            producers: f.number("producers", 64) as usize,
            workers: f.number("workers", 64) as usize,
            batch_producers: f.number("batch-producers", 8) as usize,
            rate: f.number("rate", 200),
            latency_secs: f.number("latency-secs", 10),
            latency_workers: f.number("latency-workers", 8) as usize,
            gateway_pid: f.pid("gateway-pid"),
            nats_pid: f.pid("nats-pid"),
            memory_jobs: f.number("memory-jobs", 500_000) as usize,
            timer_jobs: f.number("timer-jobs", 100_000) as usize,
        };
        if let Some(unknown) = f.0.keys().next() {
            fail(&format!("unknown flag --{unknown}"));
        }
        settings
    }

    fn wants(&self, scenario: &str) -> bool {
        self.scenarios.iter().any(|s| s == scenario)
    }
}

fn fail(message: &str) -> ! {
    eprintln!("bench: {message}");
    std::process::exit(2);
}

/// What one scenario measured.
#[derive(Default)]
struct Outcome {
    name: String,
    jobs: usize,
    seconds: f64,
    errors: u64,
    missing: usize,
    /// Enqueue→fetch latencies in microseconds (latency scenarios only).
    latencies: Vec<u64>,
    /// The floor scenario this one is compared with.
    floor: Option<String>,
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
}

/// Shared counters of a running scenario.
#[derive(Default)]
struct Tally {
    errors: AtomicU64,
    done: AtomicUsize,
    /// When the last job was completed: a scenario ends there, not when the last idle
    /// worker's fetch returns.
    last_done: std::sync::Mutex<Option<Instant>>,
}

impl Tally {
    fn seconds_since(&self, start: Instant) -> f64 {
        let end = self.last_done.lock().unwrap().unwrap_or_else(Instant::now);
        end.duration_since(start).as_secs_f64()
    }
}

/// Microseconds since the benchmark started: the clock carried inside latency jobs.
fn micros(origin: Instant) -> u64 {
    origin.elapsed().as_micros() as u64
}

fn record_error(tally: &Tally, error: &str) {
    if tally.errors.fetch_add(1, Ordering::Relaxed) < 3 {
        eprintln!("bench: request failed: {error}");
    }
}

// ---------------------------------------------------------------------------------------
// Drivers shared by the gateway and the floor.

/// Sends `jobs` jobs as requests of up to `batch` from `producers` tasks; with `pace`, the
/// i-th request is due `i × pace` after the start. `send(first, n)` enqueues jobs
/// `first..first + n`.
async fn produce<F>(
    jobs: usize,
    batch: usize,
    producers: usize,
    pace: Option<Duration>,
    tally: Arc<Tally>,
    send: F,
) where
    F: Fn(usize, usize) -> BoxFuture<'static, Result<(), String>> + Send + Sync + 'static,
{
    let send = Arc::new(send);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..producers)
        .map(|_| {
            let (send, next, tally) = (send.clone(), next.clone(), tally.clone());
            tokio::spawn(async move {
                loop {
                    let first = next.fetch_add(batch, Ordering::Relaxed);
                    if first >= jobs {
                        return;
                    }
                    if let Some(pace) = pace {
                        let due = started + pace * (first / batch) as u32;
                        tokio::time::sleep_until(due.into()).await;
                    }
                    let n = batch.min(jobs - first);
                    match send(first, n).await {
                        Ok(()) => {
                            tally.done.fetch_add(n, Ordering::Relaxed);
                        }
                        Err(e) => record_error(&tally, &e),
                    }
                }
            })
        })
        .collect();
    futures::future::join_all(tasks).await;
}

/// What one fetch-and-process round of a worker did.
#[derive(Default)]
struct Round {
    /// Jobs handed to the worker.
    fetched: usize,
    /// Jobs completed.
    completed: usize,
    /// When the round completed its last job.
    last_completed: Option<Instant>,
    errors: Vec<String>,
    /// Enqueue→fetch latencies in microseconds, for jobs that carried their enqueue time.
    latencies: Vec<u64>,
}

impl Round {
    fn complete(&mut self) {
        self.completed += 1;
        self.last_completed = Some(Instant::now());
    }
}

/// Runs `workers` tasks, each calling `round(worker)` until `target` jobs are completed or
/// nothing arrived for `DRAIN_PATIENCE`; returns the latencies the rounds reported.
async fn consume<F>(workers: usize, target: usize, tally: Arc<Tally>, round: F) -> Vec<u64>
where
    F: Fn(usize) -> BoxFuture<'static, Round> + Send + Sync + 'static,
{
    let round = Arc::new(round);
    let last_progress = Arc::new(std::sync::Mutex::new(Instant::now()));
    let latencies = Arc::new(std::sync::Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let (round, tally, last_progress, latencies) = (
                round.clone(),
                tally.clone(),
                last_progress.clone(),
                latencies.clone(),
            );
            tokio::spawn(async move {
                while tally.done.load(Ordering::Relaxed) < target {
                    let r = round(w).await;
                    for e in &r.errors {
                        record_error(&tally, e);
                    }
                    tally.done.fetch_add(r.completed, Ordering::Relaxed);
                    if let Some(at) = r.last_completed {
                        let mut last = tally.last_done.lock().unwrap();
                        *last = Some(last.map_or(at, |l| l.max(at)));
                    }
                    latencies.lock().unwrap().extend(r.latencies);
                    if r.fetched > 0 {
                        *last_progress.lock().unwrap() = Instant::now();
                    } else if last_progress.lock().unwrap().elapsed() > DRAIN_PATIENCE {
                        return;
                    } else {
                        tokio::time::sleep(IDLE_PAUSE).await;
                    }
                }
            })
        })
        .collect();
    futures::future::join_all(tasks).await;
    let latencies = std::mem::take(&mut *latencies.lock().unwrap());
    latencies
}

// ---------------------------------------------------------------------------------------
// The gateway over HTTP.

/// What a worker reads of a FETCH response; every other field is skipped unparsed.
#[derive(Deserialize)]
struct Fetched {
    jobs: Vec<FetchedJob>,
}

#[derive(Deserialize)]
struct FetchedJob {
    id: String,
    /// `[index, enqueue time]` (`[index, due time]` for scheduled jobs) on the benchmark's
    /// clock, as the benchmark enqueues them.
    args: (u64, u64),
}

/// The gateway's HTTP/1.1 API over keep-alive connections. A bare hyper client rather than
/// the reqwest client the worker library uses: the load generator shares the machine with
/// the gateway and NATS, so every CPU second it spends is one they cannot use, and this one
/// spends about half of what reqwest did for the same requests (docs/performance.md §5).
#[derive(Clone)]
struct Gateway {
    /// `host:port` to connect to.
    authority: String,
    /// The URL's path prefix (empty, or `/prefix` without a trailing `/`).
    base: String,
    /// Connections not in use; a request takes one (or opens one) and puts it back.
    idle: Arc<std::sync::Mutex<Vec<SendRequest<Full<Bytes>>>>>,
}

impl Gateway {
    fn new(url: &str) -> Gateway {
        let rest = url
            .strip_prefix("http://")
            .unwrap_or_else(|| fail(&format!("--url {url}: only http:// URLs are supported")));
        let (authority, base) = rest.split_once('/').unwrap_or((rest, ""));
        let base = match base.trim_end_matches('/') {
            "" => String::new(),
            path => format!("/{path}"),
        };
        Gateway {
            authority: authority.to_owned(),
            base,
            idle: Arc::default(),
        }
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, String> {
        let stream = tokio::net::TcpStream::connect(&self.authority)
            .await
            .map_err(|e| format!("connecting to {}: {e}", self.authority))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let (sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(connection);
        Ok(sender)
    }

    /// Sends one request; its status and body. A connection that failed is not reused.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
    ) -> Result<(StatusCode, Bytes), String> {
        let pooled = self.idle.lock().unwrap().pop();
        let mut sender = match pooled {
            Some(s) if !s.is_closed() => s,
            _ => self.connect().await?,
        };
        let request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header(HOST, &self.authority)
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .map_err(|e| e.to_string())?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        self.idle.lock().unwrap().push(sender);
        Ok((status, body))
    }

    /// POSTs `body`; the response body when `accept` takes its status, else an error.
    async fn call(
        &self,
        path: &str,
        body: &Value,
        accept: fn(StatusCode) -> bool,
    ) -> Result<Bytes, String> {
        let body = serde_json::to_vec(body).map_err(|e| e.to_string())?;
        let (status, body) = self.send(Method::POST, path, body.into()).await?;
        if accept(status) {
            Ok(body)
        } else {
            Err(format!("{status}: {}", String::from_utf8_lossy(&body)))
        }
    }

    async fn post(&self, path: &str, body: &Value) -> Result<Bytes, String> {
        self.call(path, body, |s| s.is_success()).await
    }

    /// The HTTP traffic of `e2e` without its JetStream work: per job a PUSH, a FETCH and an
    /// ACK from `tasks` concurrent clients, each invalid in one field so the gateway answers
    /// 400 before touching NATS. What the requests alone cost both processes.
    async fn http_only(&self, queue: &str, jobs: usize, tasks: usize, tally: Arc<Tally>) {
        let gw = self.clone();
        let queue = queue.to_owned();
        produce(jobs, 1, tasks, None, tally, move |i, _| {
            let (gw, queue) = (gw.clone(), queue.clone());
            Box::pin(async move {
                let rejected = |s| s == StatusCode::BAD_REQUEST;
                let push =
                    json!({"type": "bench.job", "queue": queue.to_uppercase(), "args": [i, 0]});
                gw.call("/ojs/v1/jobs", &push, rejected).await?;
                let fetch = json!({"queues": [queue], "count": 1, "worker_id": "bench-http",
                    "wait_ms": -1});
                gw.call("/ojs/v1/workers/fetch", &fetch, rejected).await?;
                let ack = json!({"job_id": i, "worker_id": "bench-http"});
                gw.call("/ojs/v1/workers/ack", &ack, rejected).await?;
                Ok(())
            })
        })
        .await;
    }

    /// PUSH (`batch` 1) or batch PUSH; jobs carry `[index, enqueue time]` as args.
    async fn enqueue(&self, queue: &str, load: Load, clock: Instant, tally: Arc<Tally>) {
        let gw = self.clone();
        let queue = queue.to_owned();
        produce(
            load.jobs,
            load.batch,
            load.producers,
            load.pace,
            tally,
            move |first, n| {
                let (gw, queue) = (gw.clone(), queue.clone());
                Box::pin(async move {
                    let sent = micros(clock);
                    let job =
                        |i: usize| json!({"type": "bench.job", "queue": queue, "args": [i, sent]});
                    if load.batch == 1 {
                        gw.post("/ojs/v1/jobs", &job(first)).await?;
                    } else {
                        let list: Vec<Value> = (first..first + n).map(job).collect();
                        gw.post("/ojs/v1/jobs/batch", &json!({ "jobs": list }))
                            .await?;
                    }
                    Ok(())
                })
            },
        )
        .await;
    }

    /// Batch PUSH of `jobs` jobs scheduled evenly from `TIMER_LEAD` to `TIMER_LEAD` +
    /// `TIMER_SPREAD` after now; each carries its due time, so a worker's latency for it is
    /// how late it became fetchable.
    async fn schedule(
        &self,
        queue: &str,
        jobs: usize,
        producers: usize,
        clock: Instant,
        tally: Arc<Tally>,
    ) {
        let gw = self.clone();
        let queue = queue.to_owned();
        // Due times in whole milliseconds, as `scheduled_at` carries them: `start` is the
        // benchmark's clock at the whole millisecond `wall`.
        let (now, start) = (chrono::Utc::now(), micros(clock));
        let start = start - u64::from(now.timestamp_subsec_micros() % 1000);
        let wall = chrono::DateTime::from_timestamp_millis(now.timestamp_millis())
            .expect("a current time");
        produce(jobs, 1000, producers, None, tally, move |first, n| {
            let (gw, queue) = (gw.clone(), queue.clone());
            Box::pin(async move {
                let list: Vec<Value> = (first..first + n)
                    .map(|i| {
                        let spread = TIMER_SPREAD.as_millis() as usize * i / jobs;
                        let due = TIMER_LEAD + Duration::from_millis(spread as u64);
                        let at = wall + chrono::Duration::from_std(due).expect("a short offset");
                        json!({"type": "bench.job", "args": [i, start + due.as_micros() as u64],
                            "options": {"queue": queue, "scheduled_at":
                                at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)}})
                    })
                    .collect();
                gw.post("/ojs/v1/jobs/batch", &json!({ "jobs": list }))
                    .await?;
                Ok(())
            })
        })
        .await;
    }

    /// Workers FETCH `count` at a time and ACK each job.
    async fn work(
        &self,
        queue: &str,
        count: usize,
        workers: usize,
        target: usize,
        clock: Instant,
        tally: Arc<Tally>,
    ) -> Vec<u64> {
        let gw = self.clone();
        let queue = queue.to_owned();
        consume(workers, target, tally, move |w| {
            let gw = gw.clone();
            let worker_id = format!("bench-worker-{w}");
            let request = json!({"queues": [queue], "count": count, "worker_id": worker_id,
                "wait_ms": FETCH_WAIT.as_millis() as u64});
            Box::pin(async move {
                let mut round = Round::default();
                let fetched = gw
                    .post("/ojs/v1/workers/fetch", &request)
                    .await
                    .and_then(|body| {
                        serde_json::from_slice::<Fetched>(&body).map_err(|e| e.to_string())
                    });
                let jobs = match fetched {
                    Ok(f) => f.jobs,
                    Err(e) => {
                        round.errors.push(e);
                        return round;
                    }
                };
                let now = micros(clock);
                round.fetched = jobs.len();
                for job in &jobs {
                    if now < job.args.1 {
                        let early = job.args.1 - now;
                        round
                            .errors
                            .push(format!("job {} fetched {early} µs early", job.id));
                    }
                    round.latencies.push(now.saturating_sub(job.args.1));
                    let ack = json!({"job_id": job.id, "worker_id": worker_id});
                    match gw.post("/ojs/v1/workers/ack", &ack).await {
                        Ok(_) => round.complete(),
                        Err(e) => round.errors.push(e),
                    }
                }
                round
            })
        })
        .await
    }
}

// ---------------------------------------------------------------------------------------
// The floor: the same NATS server, the gateway's own stream and bucket settings, and only
// the calls a job cannot do without.

#[derive(Clone)]
struct Floor {
    js: jetstream::Context,
    kv: kv::Store,
    topology: Topology,
}

impl Floor {
    async fn connect(nats: &str) -> Floor {
        let client = async_nats::connect(nats)
            .await
            .unwrap_or_else(|e| fail(&format!("cannot reach NATS at {nats}: {e}")));
        let js = jetstream::new(client);
        let topology = Topology {
            namespace: format!("benchfloor{}", std::process::id()),
            replicas: 1,
            storage: StorageType::File,
            ack_wait: Config::default().ack_wait(),
            job_history: 5,
            events_max_age: Duration::from_secs(60),
            dead_letter_max_age: Config::default().dead_letter_max_age(),
            dead_letter_max_count: Config::default().dead_letter_max_count,
            lease_ttl: Duration::from_secs(3),
        };
        let bucket = topology.jobs_bucket();
        js.create_stream(topology.bucket_stream(&bucket, topology.job_history, Duration::ZERO))
            .await
            .unwrap_or_else(|e| fail(&format!("cannot create the floor bucket: {e}")));
        let kv = js
            .get_key_value(&bucket)
            .await
            .unwrap_or_else(|e| fail(&format!("cannot open the floor bucket: {e}")));
        Floor { js, kv, topology }
    }

    /// A work-queue stream with the gateway's queue settings, and its consumer.
    async fn queue(&self, name: &str) -> PullConsumer {
        let stream = self
            .js
            .create_stream(self.topology.queue_stream_config(name))
            .await
            .unwrap_or_else(|e| fail(&format!("cannot create a floor queue: {e}")));
        stream
            .create_consumer(self.topology.priority_consumer_config(name, 0))
            .await
            .unwrap_or_else(|e| fail(&format!("cannot create a floor consumer: {e}")))
    }

    /// KV create of the record, then an acknowledged publish that names its revision.
    async fn enqueue(&self, queue: &str, load: Load, clock: Instant, tally: Arc<Tally>) {
        let floor = self.clone();
        let queue = queue.to_owned();
        produce(
            load.jobs,
            load.batch,
            load.producers,
            load.pace,
            tally,
            move |first, n| {
                let (floor, queue) = (floor.clone(), queue.clone());
                Box::pin(async move {
                    for i in first..first + n {
                        let sent = micros(clock);
                        let id = uuid::Uuid::now_v7().to_string();
                        let record = floor_record(&id, &queue, i, sent, "available");
                        let revision = floor
                            .kv
                            .create(&id, record.into())
                            .await
                            .map_err(|e| e.to_string())?;
                        let body = serde_json::to_vec(&FloorMessage { id, revision, sent })
                            .map_err(|e| e.to_string())?;
                        floor
                            .js
                            .publish(floor.topology.queue_subject(&queue, 0), body.into())
                            .await
                            .map_err(|e| e.to_string())?
                            .await
                            .map_err(|e| e.to_string())?;
                    }
                    Ok(())
                })
            },
        )
        .await;
    }

    /// Fetch (one pull request for `count`), then per job: CAS the record to active, ack
    /// the message, CAS the record to completed.
    async fn work(
        &self,
        queue: &str,
        count: usize,
        workers: usize,
        target: usize,
        clock: Instant,
        tally: Arc<Tally>,
    ) -> Vec<u64> {
        let consumer = self.queue(queue).await;
        let floor = self.clone();
        let queue = queue.to_owned();
        consume(workers, target, tally, move |_| {
            let (floor, consumer, queue) = (floor.clone(), consumer.clone(), queue.clone());
            Box::pin(async move {
                let mut round = Round::default();
                // A waiting pull: each message is processed as it arrives; the pull ends
                // when `count` came or after `FETCH_WAIT`.
                let pull = consumer.batch().max_messages(count).expires(FETCH_WAIT);
                let mut messages = match pull.messages().await {
                    Ok(batch) => batch,
                    Err(e) => {
                        round.errors.push(e.to_string());
                        return round;
                    }
                };
                while let Some(msg) = messages.next().await {
                    let now = micros(clock);
                    let msg = match msg {
                        Ok(msg) => msg,
                        Err(e) => {
                            round.errors.push(e.to_string());
                            continue;
                        }
                    };
                    round.fetched += 1;
                    match floor.process(&queue, &msg).await {
                        Ok(sent) => {
                            round.latencies.push(now.saturating_sub(sent));
                            round.complete();
                        }
                        Err(e) => round.errors.push(e),
                    }
                }
                round
            })
        })
        .await
    }

    /// Returns the job's enqueue time.
    async fn process(&self, queue: &str, msg: &jetstream::Message) -> Result<u64, String> {
        let FloorMessage { id, revision, sent } =
            serde_json::from_slice(&msg.payload).map_err(|e| e.to_string())?;
        let id = id.as_str();
        let active = floor_record(id, queue, 0, 0, "active");
        let revision = self
            .kv
            .update(id, active.into(), revision)
            .await
            .map_err(|e| e.to_string())?;
        msg.ack().await.map_err(|e| e.to_string())?;
        let done = floor_record(id, queue, 0, 0, "completed");
        self.kv
            .update(id, done.into(), revision)
            .await
            .map_err(|e| e.to_string())?;
        Ok(sent)
    }

    async fn clean_up(&self) {
        let mut names = vec![format!("KV_{}", self.topology.jobs_bucket())];
        names.extend(QUEUES.iter().map(|q| self.topology.queue_stream(q)));
        for name in names {
            let _ = self.js.delete_stream(name).await;
        }
    }
}

/// A record of the size and shape the gateway stores for a bench job. Written out directly
/// (ids, queue names and states need no escaping), so the floor's client does no more work
/// than a job needs, as the benchmark's HTTP client does for the gateway.
fn floor_record(id: &str, queue: &str, i: usize, sent: u64, state: &str) -> Vec<u8> {
    format!(
        r#"{{"job":{{"specversion":"1.0","id":"{id}","type":"bench.job","queue":"{queue}","args":[{i},{sent}],"state":"{state}","priority":0,"attempt":0,"max_attempts":3,"created_at":"2026-01-01T00:00:00.000Z","enqueued_at":"2026-01-01T00:00:00.000Z","retry":{{"max_attempts":3,"initial_interval":"PT1S","backoff_coefficient":2.0,"max_interval":"PT5M","jitter":true,"non_retryable_errors":[]}}}},"dispatch":1,"transition":"created"}}"#
    )
    .into_bytes()
}

/// The floor's queue message: the job, its record's revision and its enqueue time.
#[derive(Serialize, Deserialize)]
struct FloorMessage {
    id: String,
    revision: u64,
    sent: u64,
}

// ---------------------------------------------------------------------------------------
// Scenarios.

/// Queue names the benchmark uses (prefixed per run).
const QUEUES: [&str; 5] = ["drain", "e2e", "latency", "memory", "timers"];

/// How jobs are offered.
#[derive(Clone, Copy)]
struct Load {
    jobs: usize,
    batch: usize,
    producers: usize,
    pace: Option<Duration>,
}

/// The system under measurement.
#[derive(Clone)]
enum Side {
    Gateway(Gateway, String),
    Floor(Box<Floor>),
}

impl Side {
    fn queue(&self, name: &str) -> String {
        match self {
            Side::Gateway(_, prefix) => format!("{prefix}-{name}"),
            Side::Floor(_) => name.to_owned(),
        }
    }

    async fn enqueue(&self, queue: &str, load: Load, clock: Instant, tally: Arc<Tally>) {
        match self {
            Side::Gateway(gw, _) => gw.enqueue(queue, load, clock, tally).await,
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
            Side::Floor(floor) => {
                floor
                    .work(queue, count, workers, target, clock, tally)
                    .await
            }
        }
    }
}

struct Bench {
    settings: Settings,
    gateway: Side,
    floor: Side,
    /// The gateway's jobs bucket stream, to wait for its event publisher.
    js: jetstream::Context,
    clock: Instant,
    outcomes: Vec<Outcome>,
    /// Jobs waiting in the drain queue: floor, gateway.
    queued: [usize; 2],
}

impl Bench {
    fn side(&self, floor: bool) -> Side {
        if floor {
            self.floor.clone()
        } else {
            self.gateway.clone()
        }
    }

    fn meter(&self) -> CpuMeter {
        CpuMeter::start(vec![
            ("gateway", self.settings.gateway_pid),
            ("nats", self.settings.nats_pid),
            ("bench", Some(std::process::id())),
        ])
    }

    fn name(floor: bool, name: &str) -> String {
        if floor {
            format!("floor-{name}")
        } else {
            name.to_owned()
        }
    }

    /// Times an enqueue of `load` into `queue`.
    async fn enqueue(&mut self, floor: bool, name: &str, queue: &str, load: Load, report: bool) {
        let side = self.side(floor);
        let queue = side.queue(queue);
        let tally = Arc::new(Tally::default());
        let start = Instant::now();
        let meter = self.meter();
        side.enqueue(&queue, load, self.clock, tally.clone()).await;
        self.queued[usize::from(!floor)] += tally.done.load(Ordering::Relaxed);
        let mut outcome = Outcome {
            name: Bench::name(floor, name),
            jobs: tally.done.load(Ordering::Relaxed),
            seconds: start.elapsed().as_secs_f64(),
            errors: tally.errors.load(Ordering::Relaxed),
            missing: load.jobs - tally.done.load(Ordering::Relaxed),
            floor: (!floor).then(|| "floor-enqueue".to_owned()),
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
    async fn drain(&mut self, floor: bool, count: usize, target: usize) {
        let target = target.min(self.queued[usize::from(!floor)]);
        let side = self.side(floor);
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
            name: Bench::name(floor, &format!("drain-{count}")),
            jobs: done,
            seconds: tally.seconds_since(start),
            errors: tally.errors.load(Ordering::Relaxed),
            missing: target.saturating_sub(done),
            floor: (!floor).then(|| format!("floor-drain-{count}")),
            ..Default::default()
        };
        outcome.cpu = meter.finish();
        self.settle(floor, &mut outcome).await;
        progress(&outcome);
        self.outcomes.push(outcome);
    }

    /// Producers and workers at once; from the first enqueue to the last ack. `pace` turns
    /// it into the latency scenario.
    async fn run_through(&mut self, floor: bool, name: &str, load: Load, workers: usize) {
        let side = self.side(floor);
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
        let mut outcome = Outcome {
            name: Bench::name(floor, name),
            jobs: done,
            seconds: consumed.seconds_since(start),
            errors: produced.errors.load(Ordering::Relaxed)
                + consumed.errors.load(Ordering::Relaxed),
            missing: load.jobs.saturating_sub(done),
            floor: (!floor).then(|| format!("floor-{name}")),
            latencies: if load.pace.is_some() {
                latencies
            } else {
                Vec::new()
            },
            ..Default::default()
        };
        outcome.cpu = meter.finish();
        self.settle(floor, &mut outcome).await;
        progress(&outcome);
        self.outcomes.push(outcome);
    }

    /// `e2e`'s requests answered without NATS work (`Gateway::http_only`), compared with the
    /// floor's `e2e`: the share of the machine HTTP alone takes.
    async fn http_only(&mut self) {
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
    async fn memory(&mut self, pid: u32) {
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
    async fn timers(&mut self) {
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
        self.wait_for_consumer(&stream, "event-publisher", limit, |info| {
            info.num_pending == 0 && info.num_ack_pending == 0
        })
        .await;
        outcome.events_catch_up = Some(start.elapsed().as_secs_f64());
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

    fn report(&self) {
        println!(
            "{:<20} {:>8} {:>8} {:>10} {:>10} {:>6} {:>8} {:>8} {:>8} {:>7} {:>7}  cpu s (gateway/nats/bench)",
            "scenario",
            "jobs",
            "secs",
            "jobs/s",
            "floor/s",
            "ratio",
            "p50 ms",
            "p99 ms",
            "max ms",
            "errors",
            "missing",
        );
        let fmt = |v: Option<f64>, digits: usize| {
            v.map_or_else(|| "-".to_owned(), |v| format!("{v:.digits$}"))
        };
        for o in &self.outcomes {
            let floor = o
                .floor
                .as_ref()
                .and_then(|f| self.outcomes.iter().find(|x| &x.name == f));
            let floor_rate = floor.map(Outcome::rate);
            let ratio = floor_rate.map(|f| o.rate() / f);
            let (p50, p99, max) = (o.percentile(0.5), o.percentile(0.99), o.percentile(1.0));
            let floor_p99 = floor.and_then(|f| f.percentile(0.99));
            println!(
                "{:<20} {:>8} {:>8.2} {:>10.0} {:>10} {:>6} {:>8} {:>8} {:>8} {:>7} {:>7}  {}",
                o.name,
                o.jobs,
                o.seconds,
                o.rate(),
                fmt(floor_rate, 0),
                fmt(ratio, 2),
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

fn progress(o: &Outcome) {
    eprintln!(
        "bench: {} — {} jobs in {:.2} s, {} errors, {} missing",
        o.name, o.jobs, o.seconds, o.errors, o.missing
    );
}

/// CPU time of processes over a scenario.
struct CpuMeter {
    pids: Vec<(&'static str, u32, f64)>,
}

impl CpuMeter {
    fn start(pids: Vec<(&'static str, Option<u32>)>) -> CpuMeter {
        CpuMeter {
            pids: pids
                .into_iter()
                .filter_map(|(name, pid)| {
                    let pid = pid?;
                    Some((name, pid, cpu_seconds(pid)?))
                })
                .collect(),
        }
    }

    fn finish(&self) -> Vec<(&'static str, f64)> {
        self.pids
            .iter()
            .filter_map(|(name, pid, start)| Some((*name, cpu_seconds(*pid)? - start)))
            .collect()
    }
}

/// User plus system CPU seconds of a process, from /proc (clock ticks of 10 ms).
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesized command name; utime and stime are the 12th and 13th.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// Resident set size of a process, from /proc.
fn rss_mb(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

#[tokio::main]
async fn main() {
    let settings = Settings::from_args();
    let floor = Floor::connect(&settings.nats).await;
    let js = floor.js.clone();
    let prefix = format!("bench-{}", std::process::id());
    let gateway = Gateway::new(&settings.url);
    if gateway
        .send(Method::GET, "/ojs/v1/health", Bytes::new())
        .await
        .is_err()
    {
        fail(&format!("no gateway answers at {}", settings.url));
    }
    let mut bench = Bench {
        settings: settings.clone(),
        gateway: Side::Gateway(gateway, prefix),
        floor: Side::Floor(Box::new(floor.clone())),
        js,
        clock: Instant::now(),
        outcomes: Vec::new(),
        queued: [0, 0],
    };
    let s = &settings;
    let single = Load {
        jobs: s.jobs,
        batch: 1,
        producers: s.producers,
        pace: None,
    };
    let batched = |batch| Load {
        batch,
        producers: s.batch_producers,
        ..single
    };

    if s.wants("enqueue") || s.wants("drain") {
        let report = s.wants("enqueue");
        // The floor's queue gets the jobs of both of its drains; the gateway's, those of all
        // three enqueue scenarios (drained by drain-1 and drain-16).
        bench
            .enqueue(
                true,
                "enqueue",
                "drain",
                Load {
                    jobs: 2 * s.jobs,
                    ..single
                },
                report,
            )
            .await;
        bench
            .enqueue(false, "enqueue-1", "drain", single, report)
            .await;
        bench
            .enqueue(false, "enqueue-batch-100", "drain", batched(100), report)
            .await;
        bench
            .enqueue(false, "enqueue-batch-1000", "drain", batched(1000), report)
            .await;
    }
    if s.wants("drain") {
        bench.drain(true, 1, s.jobs).await;
        bench.drain(false, 1, s.jobs).await;
        // The rest of each queue.
        bench.drain(true, 16, usize::MAX).await;
        bench.drain(false, 16, usize::MAX).await;
    }
    if s.wants("e2e") {
        bench.run_through(true, "e2e", single, s.workers).await;
        bench.run_through(false, "e2e", single, s.workers).await;
        bench.http_only().await;
    }
    if s.wants("latency") {
        let paced = Load {
            jobs: (s.rate * s.latency_secs) as usize,
            batch: 1,
            producers: 4,
            pace: Some(Duration::from_secs_f64(1.0 / s.rate as f64)),
        };
        bench
            .run_through(true, "latency", paced, s.latency_workers)
            .await;
        bench
            .run_through(false, "latency", paced, s.latency_workers)
            .await;
    }
    if s.wants("memory") {
        match s.gateway_pid {
            Some(pid) => bench.memory(pid).await,
            None => eprintln!("bench: the memory scenario needs --gateway-pid; skipped"),
        }
    }
    if s.wants("timers") {
        bench.timers().await;
    }
    floor.clean_up().await;
    bench.report();
}
