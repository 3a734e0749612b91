//! Enqueues demo jobs: `cargo run --release --example producer -- --url URL --queue Q
//! --type T --count N [--args JSON]`. Uses batches when N > 1 and prints each job id on
//! its own line.

use ojs_jetstream::client::{Client, JobSpec};
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
    let queue = arg(&args, "--queue").unwrap_or_else(|| "default".into());
    let job_type = arg(&args, "--type").unwrap_or_else(|| "demo.echo".into());
    let count: usize =
        arg(&args, "--count").map_or(1, |n| n.parse().expect("--count takes a number"));
    let job_args: Value = arg(&args, "--args").map_or(Value::Array(vec![]), |a| {
        serde_json::from_str(&a).expect("--args takes JSON")
    });

    let client = Client::new(&url);
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
