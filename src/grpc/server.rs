//! Serving the binding on a listener until shutdown, with TLS when set and the standard
//! health and reflection services beside it.

use std::future::Future;

use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tracing::info;

use super::pb;
use super::service::Gateway;
use super::status;
use super::streams;
use crate::config::Config;
use crate::domain::error::OjsError;
use crate::http::auth::Keys;
use crate::http::SharedState;

/// Serves the binding on `listener` until `shutdown` resolves; open streams then end with
/// `UNAVAILABLE` (§15.5) as the store stops its waits.
///
/// # Errors
/// When the TLS files cannot be read or the server fails.
pub async fn serve(
    listener: TcpListener,
    state: SharedState,
    keys: Keys,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), OjsError> {
    let addr = listener
        .local_addr()
        .map_err(|e| OjsError::backend(e.to_string()))?;
    let max_message = state.config.max_body_bytes;
    let tls = tls(&state.config)?;
    let tls_on = tls.is_some();
    let service = pb::ojs_service_server::OjsServiceServer::new(Gateway {
        state,
        keys,
        settled: streams::Settled::default(),
    })
    .max_decoding_message_size(max_message);
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<pb::ojs_service_server::OjsServiceServer<Gateway>>()
        .await;
    // Both versions of reflection: tools that predate v1 (and grpcurl's fallback) ask
    // v1alpha.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::DESCRIPTOR)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let failed = |e| OjsError::backend("The gRPC reflection service failed.").with_source(e);
    let reflection_v1 = reflection().build_v1().map_err(failed)?;
    let reflection_v1alpha = reflection().build_v1alpha().map_err(failed)?;
    let mut server = Server::builder();
    if let Some(tls) = tls {
        server = server
            .tls_config(tls)
            .map_err(|e| OjsError::backend("The gRPC TLS settings failed.").with_source(e))?;
    }
    info!(%addr, tls = tls_on, "ojs-jetstream serving gRPC");
    // Small messages go out at once: without TCP_NODELAY a job sent on a stream waits for
    // the client's delayed ACK of the message before (40 ms a job, measured). The server's
    // own setting applies only to listeners it binds itself.
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    server
        .layer(tower::util::MapResponseLayer::new(
            status::readable_transport_errors,
        ))
        .add_service(service)
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(|e| OjsError::backend("The gRPC server failed.").with_source(e))
}

/// The server's TLS, and mutual TLS when a client CA is set (§11.1): a client without a
/// certificate that CA signed is refused at the handshake.
fn tls(config: &Config) -> Result<Option<ServerTlsConfig>, OjsError> {
    if config.grpc_tls_cert_file.is_empty() {
        return Ok(None);
    }
    let read = |path: &str| {
        std::fs::read(path).map_err(|e| {
            OjsError::backend(format!("Cannot read the gRPC TLS file {path}.")).with_source(e)
        })
    };
    let identity = Identity::from_pem(
        read(&config.grpc_tls_cert_file)?,
        read(&config.grpc_tls_key_file)?,
    );
    let mut tls = ServerTlsConfig::new().identity(identity);
    if !config.grpc_tls_client_ca_file.is_empty() {
        tls = tls.client_ca_root(Certificate::from_pem(read(
            &config.grpc_tls_client_ca_file,
        )?));
    }
    Ok(Some(tls))
}
