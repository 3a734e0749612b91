//! A demo worker: `cargo run --release --example worker -- --url URL --queues q1,q2
//! --concurrency N [--grace-period SECS]`. Handles `demo.echo` (result = its args),
//! `demo.sleep` (args[0] = milliseconds; heartbeats while it sleeps) and `demo.fail`
//! (always fails with type `DemoError`). Prints `worker state: <state>` on every lifecycle
//! change and `worker stopped: jobs_completed=N` on exit. `OJS_API_KEY`, when set, is sent
//! as the API key.

#[path = "common/flags.rs"]
mod flags;

use std::time::Duration;

use ojs_client::worker::{HandlerError, JobContext, Worker, WorkerConfig};
use serde_json::Value;

#[tokio::main]
async fn main() {
    let mut flags = flags::Flags::parse();
    let url = flags.text("url", "http://127.0.0.1:8080");
    let queues = flags.text("queues", "default");
    let queues: Vec<&str> = queues.split(',').collect();
    let mut cfg = WorkerConfig::new(&url, &queues);
    cfg.concurrency = flags.number("concurrency", cfg.concurrency);
    let seconds = |flags: &mut flags::Flags, name, default: Duration| {
        Duration::from_secs_f64(flags.number(name, default.as_secs_f64()))
    };
    cfg.grace_period = seconds(&mut flags, "grace-period", cfg.grace_period);
    cfg.heartbeat_interval = seconds(&mut flags, "heartbeat-interval", cfg.heartbeat_interval);
    if let Some(id) = flags.get("worker-id") {
        cfg.worker_id = id;
    }
    flags.finish();

    let mut worker = Worker::new(cfg);
    if let Ok(key) = std::env::var("OJS_API_KEY") {
        worker.api_key(&key);
    }
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
