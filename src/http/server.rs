//! Serving the router on a listener until shutdown.

use std::future::Future;

use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tracing::{info, warn};

use super::auth::Keys;
use super::routes::router;
use super::state::SharedState;
use crate::domain::error::OjsError;

/// Serves the API on `listener` until `shutdown` resolves, then waits for the requests in
/// flight.
///
/// # Errors
/// When the listener has no address or the server fails.
pub async fn serve(
    listener: TcpListener,
    state: SharedState,
    keys: Keys,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), OjsError> {
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
    axum::serve(listener, router(state, keys))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| OjsError::backend("The HTTP server failed.").with_source(e))
}
