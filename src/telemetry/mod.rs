//! Logging (text or OJS JSON records), metrics and trace spans (OTLP).

pub mod job_metrics;
pub mod logs;
pub mod metrics;
pub mod otlp;

use tracing_subscriber::EnvFilter;

use logs::{JsonFields, LogFormat, OjsJson};

/// Logs to stderr in `format`; `RUST_LOG` overrides the default `info` level.
pub fn init_tracing(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder
            .with_target(false)
            // Colour only on a terminal, so log files stay plain text.
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
        LogFormat::Json => builder
            .fmt_fields(JsonFields)
            .event_format(OjsJson)
            .try_init(),
    };
}
