//! `ojs-jetstream serve`: load the configuration, start the gateway, stop on SIGINT/SIGTERM.
//! The other commands are clients of any OJS server (`cli`).

mod cli;

use std::cell::Cell;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use cli::{Cli, Command};
use ojs_jetstream::{app, config::Config, telemetry};
use tokio::signal::unix::{signal, SignalKind};

/// The gateway allocates many short-lived buffers from several threads at once (JSON bodies,
/// NATS messages); mimalloc's per-thread heaps avoid glibc malloc's arena lock contention,
/// which took a fifth of the gateway's CPU under load (docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // `--help`, `--version` and usage errors end here (exit 0 or 2), before anything starts.
    let args = Cli::parse();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_park(release_idle_memory)
        .build()
        .expect("tokio runtime")
        .block_on(async {
            match &args.command {
                None | Some(Command::Serve) => serve().await,
                Some(command) => match cli::run(&args, command).await {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(failure) => failure.exit(),
                },
            }
        })
}

/// mimalloc keeps the pages freed after a burst (eight concurrent 1000-job batches: tens of
/// MB) until their thread allocates again, so a worker that goes idle after one would hold
/// them. A worker about to park hands freed memory back, at most once a second: RSS with
/// 500,000 queued jobs +37–46 MB → +27–33 MB over the idle gateway (docs/performance.md).
fn release_idle_memory() {
    thread_local! {
        static LAST: Cell<Option<Instant>> = const { Cell::new(None) };
    }
    LAST.with(|last| {
        let now = Instant::now();
        if last.get().is_none_or(|t| now - t >= Duration::from_secs(1)) {
            last.set(Some(now));
            // SAFETY: mi_collect works on the calling thread's own heap.
            unsafe { libmimalloc_sys::mi_collect(true) };
        }
    });
}

async fn serve() -> ExitCode {
    let config = match Config::load() {
        Ok(c) => c,
        Err(err) => {
            eprintln!("{err}");
            return ExitCode::from(2);
        }
    };
    telemetry::init_tracing(config.log_format);
    let listeners = match app::Listeners::bind(&config).await {
        Ok(l) => l,
        Err(err) => {
            eprintln!("{err}");
            return ExitCode::FAILURE;
        }
    };
    match app::run(config, listeners, shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("{}", err.with_causes());
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
