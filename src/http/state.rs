//! What every handler shares.

use std::sync::Arc;
use std::time::Instant;

use crate::config::Config;
use crate::store::Store;
use crate::telemetry::metrics::Metrics;

/// Shared by every handler.
pub struct AppState {
    pub store: Store,
    pub config: Config,
    pub metrics: Metrics,
    pub started: Instant,
    /// Live event streams this gateway may still open (`stream.rs`).
    pub event_streams: Arc<tokio::sync::Semaphore>,
    /// This replica's last leadership given up for a stalled service, for the health check.
    pub stalls: crate::coordinator::Stalls,
    /// Where this gateway serves the gRPC binding, when it does (the manifest names it).
    pub grpc_addr: Option<std::net::SocketAddr>,
}

pub type SharedState = Arc<AppState>;

impl AppState {
    /// The manifest's `protocols`: `grpc` whenever this gateway serves it.
    pub fn protocols(&self) -> Vec<&'static str> {
        let mut protocols = vec!["http"];
        if self.grpc_addr.is_some() {
            protocols.push("grpc");
        }
        protocols
    }
}
