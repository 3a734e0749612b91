//! A demo worker: `cargo run --release --example worker -- --url URL --queues q1,q2
//! --concurrency N [--grace-period SECS]`. Handles `demo.echo` (result = its args),
//! `demo.sleep` (args[0] = milliseconds; heartbeats while it sleeps) and `demo.fail`
//! (always fails with type `DemoError`). Prints `worker state: <state>` on every lifecycle
//! change and `worker stopped: jobs_completed=N` on exit.

use std::time::Duration;

use ojs_jetstream::worker::{HandlerError, JobContext, Worker, WorkerConfig};
use serde_json::Value;

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let url = arg(&args, "--url").unwrap_or_else(|| "http://127.0.0.1:8080".into());
    let queues = arg(&args, "--queues").unwrap_or_else(|| "default".into());
    let queues: Vec<&str> = queues.split(',').collect();
    let mut cfg = WorkerConfig::new(&url, &queues);
    if let Some(n) = arg(&args, "--concurrency") {
        cfg.concurrency = n.parse().expect("--concurrency takes a number");
    }
    if let Some(s) = arg(&args, "--grace-period") {
        cfg.grace_period =
            Duration::from_secs_f64(s.parse().expect("--grace-period takes seconds"));
    }
    if let Some(s) = arg(&args, "--heartbeat-interval") {
        cfg.heartbeat_interval =
            Duration::from_secs_f64(s.parse().expect("--heartbeat-interval takes seconds"));
    }
    if let Some(id) = arg(&args, "--worker-id") {
        cfg.worker_id = id;
    }

    let mut worker = Worker::new(cfg);
    worker
        .register("demo.echo", |ctx: JobContext| async move { Ok(ctx.args) })
        .register("demo.sleep", |ctx: JobContext| async move {
            let ms = ctx.args[0].as_u64().unwrap_or(1000);
            let until = tokio::time::Instant::now() + Duration::from_millis(ms);
            while tokio::time::Instant::now() < until {
                tokio::select! {
                    _ = tokio::time::sleep_until(until.min(tokio::time::Instant::now() + Duration::from_secs(2))) => {}
                    _ = ctx.cancelled().cancelled() => return Err(HandlerError::new("Cancelled", "the job was cancelled")),
                }
                let _ = ctx.heartbeat().await;
            }
            Ok(Value::Null)
        })
        .register("demo.fail", |_ctx: JobContext| async move {
            Err::<Value, _>(HandlerError::new("DemoError", "demo.fail always fails"))
        });

    let mut states = worker.states();
    println!("worker state: {}", states.borrow().as_str());
    tokio::spawn(async move {
        while states.changed().await.is_ok() {
            println!("worker state: {}", states.borrow().as_str());
        }
    });
    let summary = worker.run().await;
    println!(
        "worker stopped: jobs_completed={} jobs_failed={} jobs_shutdown={}",
        summary.jobs_completed, summary.jobs_failed, summary.jobs_shutdown
    );
}
