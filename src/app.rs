//! Wiring: connect the store, start the coordinator, serve HTTP until the shutdown future
//! resolves, then stop the background work. `main` and the tests both start the gateway here.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::serve::ListenerExt;
use futures::FutureExt;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};
use uuid::Uuid;

use crate::config::Config;
use crate::coordinator::{Coordinator, Stalls};
use crate::domain::error::OjsError;
use crate::http::auth::Keys;
use crate::http::{router, AppState};
use crate::store::{connection, Store};
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
    let options = connection::options(&config)
        .await
        .map_err(OjsError::backend)?;
    let shutdown = shutdown.shared();
    let store = tokio::select! {
        store = connect(&config, options) => store,
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
        keys,
        started: Instant::now(),
        event_streams: Arc::new(tokio::sync::Semaphore::new(crate::http::MAX_EVENT_STREAMS)),
        stalls,
    });
    let addr = listener
        .local_addr()
        .map_err(|e| OjsError::backend(e.to_string()))?;
    info!(%addr, "ojs-jetstream listening");
    // Small responses go out at once: without TCP_NODELAY a response can wait for the
    // client's delayed ACK of the previous one (tens of milliseconds).
    let listener = listener.tap_io(|tcp| {
        if let Err(err) = tcp.set_nodelay(true) {
            warn!(error = %err, "could not set TCP_NODELAY on a connection");
        }
    });
    let store = state.store.clone();
    let shutdown = async move {
        shutdown.await;
        // Before the server waits for in-flight requests: long polls would hold it up to 10 s.
        store.jobs().stop_waiting();
    };
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| OjsError::backend("The HTTP server failed.").with_source(e))?;

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

/// Connects and sets up the topology, retrying while NATS is not there yet (a cluster still
/// forming, a server restarting); every failed try is logged with its reason.
async fn connect(config: &Config, options: async_nats::ConnectOptions) -> Store {
    let mut delay = Duration::from_millis(250);
    loop {
        match Store::connect(config, options.clone()).await {
            Ok(store) => return store,
            Err(err) => {
                warn!(error = %err, retry_in_ms = delay.as_millis() as u64, "NATS is not ready");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    }
}
