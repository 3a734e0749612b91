//! Wiring: connect the store, start the coordinator, serve HTTP until the shutdown future
//! resolves, then stop the background work. `main` and the tests both start the gateway here.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::warn;
use uuid::Uuid;

use crate::config::Config;
use crate::coordinator::{Coordinator, Stalls};
use crate::domain::error::OjsError;
use crate::http::auth::Keys;
use crate::http::{serve, AppState};
use crate::store::Store;
use crate::telemetry::metrics::Metrics;
use crate::telemetry::otlp::SpanExporter;

/// Where a gateway listens: HTTP, and gRPC when it serves it.
pub struct Listeners {
    pub http: TcpListener,
    pub grpc: Option<TcpListener>,
}

impl Listeners {
    /// Binds the addresses of `config`.
    ///
    /// # Errors
    /// Says which address could not be bound.
    pub async fn bind(config: &Config) -> Result<Listeners, String> {
        let http = TcpListener::bind(config.listen)
            .await
            .map_err(|err| format!("cannot listen on {}: {err}", config.listen))?;
        let grpc = match config.grpc_addr() {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .map_err(|err| format!("cannot listen for gRPC on {addr}: {err}"))?,
            ),
            None => None,
        };
        Ok(Listeners { http, grpc })
    }
}

/// Runs a gateway on `listeners` until `shutdown` resolves.
///
/// Waits for NATS first, as long as it takes (or until `shutdown`).
///
/// # Errors
/// When the HTTP or gRPC server fails.
pub async fn run(
    config: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), OjsError> {
    let keys = Keys::from_config(&config).map_err(OjsError::backend)?;
    let shutdown = shutdown.shared();
    let store = tokio::select! {
        store = Store::connect(&config) => store?,
        _ = shutdown.clone() => return Ok(()),
    };
    let cancel = CancellationToken::new();
    let tasks = TaskTracker::new();
    let instance = format!("{}-{}", config.service_name, Uuid::now_v7());
    let metrics = Metrics::new();
    let stalls = Stalls::default();
    let spans = (!config.otlp_endpoint.is_empty())
        .then(|| SpanExporter::start(&config.otlp_endpoint, &config.service_name, metrics.clone()));
    tasks.spawn(
        Coordinator::new(
            store.clone(),
            metrics.clone(),
            instance,
            config.lease_ttl(),
            config.leader_stall(),
            stalls.clone(),
            spans,
        )
        .run(cancel.child_token()),
    );

    let state = Arc::new(AppState {
        store,
        config,
        metrics,
        started: Instant::now(),
        event_streams: Arc::new(tokio::sync::Semaphore::new(crate::http::MAX_EVENT_STREAMS)),
        stalls,
        grpc_addr: listeners.grpc.as_ref().and_then(|l| l.local_addr().ok()),
    });
    let store = state.store.clone();
    let stopping = async move {
        shutdown.await;
        // Before the servers wait for in-flight requests: long polls would hold them up to
        // 10 s, and job and event streams end as their waits do.
        store.jobs().stop_waiting();
    }
    .shared();
    let grpc = listeners.grpc.map(|listener| {
        tokio::spawn(crate::grpc::serve(
            listener,
            state.clone(),
            keys.clone(),
            stopping.clone(),
        ))
    });
    let served = serve(listeners.http, state, keys, stopping).await;
    if let Some(grpc) = grpc {
        grpc.await
            .map_err(|e| OjsError::backend("The gRPC server task failed.").with_source(e))??;
    }
    served?;

    cancel.cancel();
    tasks.close();
    if tokio::time::timeout(Duration::from_secs(10), tasks.wait())
        .await
        .is_err()
    {
        warn!("background services did not stop within 10 s");
    }
    Ok(())
}
