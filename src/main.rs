//! `ojs-jetstream serve`: load the configuration, start the gateway, stop on SIGINT/SIGTERM.

use std::process::ExitCode;

use ojs_jetstream::{app, config::Config, telemetry};
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};

const USAGE: &str = "usage: ojs-jetstream serve\n\nSettings come from config/ojs-jetstream.toml (or $OJS_CONFIG) and OJS_* variables,\ne.g. OJS_NATS_URL=nats://127.0.0.1:4222 OJS_LISTEN=127.0.0.1:8080.";

/// The gateway allocates many short-lived buffers from several threads at once (JSON bodies,
/// NATS messages); mimalloc's per-thread heaps avoid glibc malloc's arena lock contention,
/// which took a fifth of the gateway's CPU under load (docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        None | Some("serve") => {}
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Some(other) => {
            eprintln!("unknown command {other:?}\n{USAGE}");
            return ExitCode::from(2);
        }
    }
    telemetry::init_tracing();
    let config = match Config::load() {
        Ok(c) => c,
        Err(err) => {
            eprintln!("{err}");
            return ExitCode::from(2);
        }
    };
    let listener = match TcpListener::bind(config.listen).await {
        Ok(l) => l,
        Err(err) => {
            eprintln!("cannot listen on {}: {err}", config.listen);
            return ExitCode::FAILURE;
        }
    };
    match app::run(config, listener, shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("{err}");
            ExitCode::FAILURE
        }
    }
}

async fn shutdown_signal() {
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
