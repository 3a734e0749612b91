//! The benchmark's command line.

use crate::flags::Flags;

#[derive(Clone)]
pub struct Settings {
    pub url: String,
    /// `--grpc URL` of the gateway's gRPC binding, for `e2e-grpc`.
    pub grpc: Option<String>,
    pub nats: String,
    pub namespace: String,
    pub jobs: usize,
    pub producers: usize,
    pub workers: usize,
    pub batch_producers: usize,
    pub rate: u64,
    pub latency_secs: u64,
    pub latency_workers: usize,
    scenarios: Vec<String>,
    pub gateway_pid: Option<u32>,
    pub nats_pid: Option<u32>,
    /// Redis URL of the BullMQ scenarios; none without it.
    pub bullmq: Option<String>,
    pub memory_jobs: usize,
    pub timer_jobs: usize,
    pub workflow_steps: usize,
    pub workflow_members: usize,
    pub rate_limit: u64,
    pub stats_jobs: usize,
    pub leader_jobs: usize,
    /// `--delay-proxy LISTEN`: run the delay proxy instead of the benchmark.
    pub delay_proxy: Option<String>,
    pub upstream: String,
    pub delay_us: u64,
}

impl Settings {
    pub fn from_args() -> Settings {
        let mut f = Flags::parse();
        let settings = Settings {
            url: f.text("url", "http://127.0.0.1:8080"),
            grpc: f.get("grpc"),
            nats: f.text("nats", "nats://127.0.0.1:4222"),
            namespace: f.text("namespace", "ojs"),
            scenarios: f
                .text("scenarios", "enqueue,drain,e2e,latency")
                .split(',')
                .map(str::to_owned)
                .collect(),
            jobs: f.number("jobs", 20_000),
            producers: f.number("producers", 64),
            workers: f.number("workers", 64),
            batch_producers: f.number("batch-producers", 8),
            rate: f.number("rate", 200),
            latency_secs: f.number("latency-secs", 10),
            latency_workers: f.number("latency-workers", 8),
            gateway_pid: f.get("gateway-pid"),
            nats_pid: f.get("nats-pid"),
            bullmq: f.get("bullmq"),
            memory_jobs: f.number("memory-jobs", 500_000),
            timer_jobs: f.number("timer-jobs", 100_000),
            workflow_steps: f.number("workflow-steps", 1_000),
            workflow_members: f.number("workflow-members", 10_000),
            rate_limit: f.number("rate-limit", 200),
            stats_jobs: f.number("stats-jobs", 1_000_000),
            leader_jobs: f.number("leader-jobs", 200_000),
            delay_proxy: f.get("delay-proxy"),
            upstream: f.text("upstream", "127.0.0.1:4222"),
            delay_us: f.number("delay-us", 500),
        };
        f.finish();
        settings
    }

    pub fn wants(&self, scenario: &str) -> bool {
        self.scenarios.iter().any(|s| s == scenario)
    }
}
