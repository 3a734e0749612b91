//! The ojs-jetstream benchmark (docs/performance.md). It drives a running gateway over HTTP
//! with keep-alive connections and, in the same run, the gateway's NATS server directly with
//! async-nats doing the minimum a job needs (the *floor*): every gateway figure is quoted as
//! a ratio to the floor measured minutes earlier on the same machine. With `--bullmq`, BullMQ
//! on that Redis is measured first with the same shapes (`bullmq.rs`), and the gateway's
//! `enqueue-1`, `drain-*`, `e2e` and `latency` rows are quoted against it as well.
//!
//! ```text
//! cargo run --release --example bench -- [--url http://127.0.0.1:8080]
//!     [--nats nats://127.0.0.1:4222] [--namespace ojs] [--jobs 20000] [--producers 64]
//!     [--workers 64] [--batch-producers 8] [--rate 200] [--latency-secs 10]
//!     [--latency-workers 8]
//!     [--scenarios enqueue,drain,e2e,latency[,bounded][,memory][,timers][,workflow]
//!     [,rate-limit][,stats][,leader]]
//!     [--gateway-pid PID] [--nats-pid PID] [--bullmq redis://127.0.0.1:16379]
//!     [--memory-jobs 500000] [--timer-jobs 100000]
//!     [--workflow-steps 1000] [--workflow-members 10000] [--rate-limit 200]
//!     [--stats-jobs 1000000] [--leader-jobs 200000]
//! cargo run --release --example bench -- --delay-proxy 127.0.0.1:14223
//!     [--upstream 127.0.0.1:4222] [--delay-us 500]
//! ```
//!
//! `scripts/bench.sh` starts a fresh nats-server and a release gateway and runs this against
//! them. Prints a table, then one JSON line per scenario. Failed requests are counted in
//! `errors`; jobs that never came back are counted in `missing`. With the pids given, each
//! scenario also reports the CPU seconds the gateway, nats-server and the benchmark used.
//! The `e2e` scenario ends with `e2e-http-only`: the same requests answered without NATS
//! work, which shows how much of the machine HTTP alone takes. `memory`, `timers` and
//! `workflow` run only when named; `workflow` has no floor: `workflow-chain` gives the
//! step-to-step latency of a chain worked by `--latency-workers` long-polling workers (a
//! step's ACK answered → the next step handed out), `workflow-fan-in` the time from a
//! batch's last member ACK to its callback handed out. `rate-limit` drains ten seconds'
//! worth of jobs of a queue limited to `--rate-limit` starts a second (its jobs/s against
//! the limit); `bounded` is `e2e` through a queue bounded at twice its jobs (every PUSH
//! takes a place, none is refused), against the floor's `e2e` (run `e2e` with it); `stats`
//! stores `--stats-jobs` jobs and times 1000 reads each of the queue's statistics, the
//! admin listing's first page (newest and oldest first) and the aggregate admin
//! statistics. `leader` enqueues `--leader-jobs` jobs in batches of 1000, faster than the
//! leader follows, then times the leader working off the writes left (`leader-backlog`,
//! writes/s: one write per job here) with nothing else running: the leader's ceiling, to
//! set against the request path's `e2e`. With `--delay-proxy LISTEN` the program is instead
//! a TCP proxy to `--upstream` that holds every chunk `--delay-us` each way, for a gateway
//! whose NATS is across a network (`scripts/bench.sh`, `BENCH_LEADER_DELAY_US`).

mod bullmq;
mod delay_proxy;
mod drivers;
#[path = "../common/flags.rs"]
mod flags;
mod floor;
mod gateway;
mod grpc;
mod process;
mod scenarios;
mod settings;

use std::time::Duration;

use bytes::Bytes;
use hyper::Method;

use crate::flags::fail;
use crate::floor::Floor;
use crate::gateway::Gateway;
use crate::grpc::GrpcGateway;
use crate::scenarios::{Bench, Load, Via};
use crate::settings::Settings;

#[tokio::main]
async fn main() {
    let settings = Settings::from_args();
    if let Some(listen) = &settings.delay_proxy {
        let delay = Duration::from_micros(settings.delay_us);
        delay_proxy::run(listen, &settings.upstream, delay);
    }
    let prefix = format!("bench-{}", std::process::id());
    let gateway = Gateway::new(&settings.url);
    if gateway
        .send(Method::GET, "/ojs/v1/health", Bytes::new())
        .await
        .is_err()
    {
        fail(&format!("no gateway answers at {}", settings.url));
    }
    // BullMQ first, on its own: the gateway and NATS sit idle meanwhile.
    let bullmq = match &settings.bullmq {
        Some(url) => bullmq::run(url, &settings).await,
        None => Vec::new(),
    };
    let floor = Floor::connect(&settings.nats).await;
    let grpc = match &settings.grpc {
        Some(url) => Some(GrpcGateway::connect(url).await),
        None => None,
    };
    let mut bench = Bench::new(settings.clone(), gateway, grpc, prefix, floor.clone());
    bench.bullmq(bullmq);
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
        bench
            .run_through(Via::Floor, "e2e", single, s.workers)
            .await;
        bench.run_through(Via::Http, "e2e", single, s.workers).await;
        bench.http_only().await;
    }
    // 64 producers calling Enqueue, 64 workers on StreamJobs settling with Ack, quoted
    // against the same floor and BullMQ rows as `e2e`.
    if s.wants("e2e-grpc") {
        bench.run_through(Via::Grpc, "e2e", single, s.workers).await;
    }
    if s.wants("bounded") {
        bench.bounded(single, s.workers).await;
    }
    if s.wants("latency") {
        let paced = Load {
            jobs: (s.rate * s.latency_secs) as usize,
            batch: 1,
            producers: 4,
            pace: Some(Duration::from_secs_f64(1.0 / s.rate as f64)),
        };
        bench
            .run_through(Via::Floor, "latency", paced, s.latency_workers)
            .await;
        bench
            .run_through(Via::Http, "latency", paced, s.latency_workers)
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
    if s.wants("workflow") {
        bench.workflow().await;
    }
    if s.wants("rate-limit") {
        bench.rate_limit().await;
    }
    if s.wants("leader") {
        bench.leader().await;
    }
    if s.wants("stats") {
        bench.stats().await;
    }
    floor.clean_up().await;
    bench.report();
}
