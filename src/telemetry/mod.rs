//! Logging and metrics.

pub mod job_metrics;
pub mod metrics;

use tracing_subscriber::EnvFilter;

/// Logs to stderr; `RUST_LOG` overrides the default `info` level.
pub fn init_tracing() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_writer(std::io::stderr)
        // Colour only on a terminal, so log files stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}
