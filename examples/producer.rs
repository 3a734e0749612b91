//! Enqueues demo jobs: `cargo run --release --example producer -- --url URL --queue Q
//! --type T --count N [--args JSON]`. Uses batches when N > 1 and prints each job id on
//! its own line. `OJS_API_KEY`, when set, is sent as the API key.

#[path = "common/flags.rs"]
mod flags;

use ojs_client::{Client, JobSpec};
use serde_json::Value;

#[tokio::main]
async fn main() {
    let mut flags = flags::Flags::parse();
    let url = flags.text("url", "http://127.0.0.1:8080");
    let queue = flags.text("queue", "default");
    let job_type = flags.text("type", "demo.echo");
    let count: usize = flags.number("count", 1);
    let job_args: Value = flags.get("args").unwrap_or(Value::Array(vec![]));
    flags.finish();

    let mut client = Client::new(&url);
    if let Ok(key) = std::env::var("OJS_API_KEY") {
        client = client.with_api_key(&key);
    }
    let spec = || JobSpec::new(&job_type, job_args.clone()).queue(&queue);
    let result = if count == 1 {
        client.enqueue(spec()).await.map(|job| vec![job])
    } else {
        let mut all = Vec::with_capacity(count);
        let mut left = count;
        let mut failure = None;
        while left > 0 && failure.is_none() {
            let n = left.min(1000);
            match client.enqueue_batch((0..n).map(|_| spec()).collect()).await {
                Ok(jobs) => all.extend(jobs),
                Err(e) => failure = Some(e),
            }
            left -= n;
        }
        failure.map_or(Ok(all), Err)
    };
    match result {
        Ok(jobs) => {
            for job in jobs {
                println!("{}", job["id"].as_str().unwrap_or_default());
            }
        }
        Err(err) => {
            eprintln!("enqueue failed: {err}");
            std::process::exit(1);
        }
    }
}
