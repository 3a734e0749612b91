//! Logging and metrics.

pub mod metrics;

use tracing_subscriber::EnvFilter;

/// Logs to stderr; `RUST_LOG` overrides the default `info` level.
pub fn init_tracing() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .try_init();
}
