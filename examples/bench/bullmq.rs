//! BullMQ on Redis, measured in the same run (`--bullmq URL`): the Node.js driver
//! `examples/bench/bullmq/bench.mjs` runs the shapes of `enqueue-1`, `drain`, `e2e` and
//! `latency` as a child process, and its JSON lines become the report's `bullmq-*` rows.

use std::collections::HashMap;
use std::process::Stdio;

use serde::Deserialize;

use crate::flags::fail;
use crate::settings::Settings;

/// The driver, found from the source tree whatever the working directory.
const DRIVER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/bench/bullmq/bench.mjs"
);

/// The scenarios the driver knows.
const SCENARIOS: [&str; 4] = ["enqueue", "drain", "e2e", "latency"];

/// One scenario as the driver reports it.
#[derive(Deserialize)]
pub struct Reported {
    pub scenario: String,
    pub jobs: usize,
    pub secs: f64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
    pub errors: u64,
    pub missing: usize,
    /// CPU seconds of `redis` and `node` during the scenario.
    #[serde(default)]
    pub cpu_secs: HashMap<String, f64>,
}

/// Runs the driver against the Redis at `url` with the benchmark's shape settings and the
/// scenarios asked for among those it knows, and reads its rows; its progress and errors go
/// to stderr as it runs. Stops the benchmark if the driver cannot run or fails.
pub async fn run(url: &str, s: &Settings) -> Vec<Reported> {
    let scenarios: Vec<&str> = SCENARIOS.into_iter().filter(|n| s.wants(n)).collect();
    if scenarios.is_empty() {
        return Vec::new();
    }
    eprintln!("bench: BullMQ at {url} ({})", scenarios.join(","));
    let output = tokio::process::Command::new("node")
        .arg(DRIVER)
        .args(["--redis", url, "--scenarios", &scenarios.join(",")])
        .args(["--jobs", &s.jobs.to_string()])
        .args(["--producers", &s.producers.to_string()])
        .args(["--workers", &s.workers.to_string()])
        .args(["--rate", &s.rate.to_string()])
        .args(["--latency-secs", &s.latency_secs.to_string()])
        .args(["--latency-workers", &s.latency_workers.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| fail(&format!("cannot run node {DRIVER}: {e}")))
        .wait_with_output()
        .await
        .unwrap_or_else(|e| fail(&format!("the BullMQ driver: {e}")));
    if !output.status.success() {
        fail(&format!(
            "the BullMQ driver failed ({}); its messages are above",
            output.status
        ));
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| {
                fail(&format!(
                    "the BullMQ driver printed {line:?}, not a scenario: {e}"
                ))
            })
        })
        .collect()
}
