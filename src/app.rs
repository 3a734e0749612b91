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

/// Runs a gateway on `listener` until `shutdown` resolves.
///
/// Waits for NATS first, as long as it takes (or until `shutdown`).
///
/// # Errors
/// When the HTTP server fails.
pub async fn run(
    config: Config,
    listener: TcpListener,
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
    });
    let store = state.store.clone();
    let shutdown = async move {
        shutdown.await;
        // Before the server waits for in-flight requests: long polls would hold it up to 10 s.
        store.jobs().stop_waiting();
    };
    serve(listener, state, keys, shutdown).await?;

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
