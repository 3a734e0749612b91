//! The NATS connection's options from the settings: a name, the request timeout, and the
//! credentials and TLS a production NATS asks for (user and password, token, nkey,
//! credentials file; a private CA, a client certificate).

use std::path::PathBuf;
use std::time::Duration;

use async_nats::ConnectOptions;
use tracing::warn;

use super::Store;
use crate::config::Config;
use crate::domain::error::OjsError;

/// Connects and sets up the topology, retrying while NATS is not there yet (a cluster still
/// forming, a server restarting); every failed try is logged with its reason.
///
/// # Errors
/// When the options cannot be made (see `options`): a setting to fix, not worth waiting.
pub async fn connect(config: &Config) -> Result<Store, OjsError> {
    let options = options(config).await.map_err(OjsError::backend)?;
    let mut delay = Duration::from_millis(250);
    loop {
        match Store::connect(config, options.clone()).await {
            Ok(store) => return Ok(store),
            Err(err) => {
                warn!(error = %err, retry_in_ms = delay.as_millis() as u64, "NATS is not ready");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// The options every connection of this gateway uses.
///
/// # Errors
/// When the credentials file cannot be read or does not parse (a setting to fix, not a
/// NATS outage to wait out).
async fn options(cfg: &Config) -> Result<ConnectOptions, String> {
    let mut options = ConnectOptions::new()
        .name(format!("{} gateway", cfg.service_name))
        .request_timeout(Some(Duration::from_millis(cfg.nats_timeout_ms)));
    // `Config::validate` allows one way to authenticate at most.
    if !cfg.nats_user.is_empty() {
        options = options.user_and_password(cfg.nats_user.clone(), cfg.nats_password.0.clone());
    } else if cfg.nats_token.is_set() {
        options = options.token(cfg.nats_token.0.clone());
    } else if cfg.nats_nkey_seed.is_set() {
        options = options.nkey(cfg.nats_nkey_seed.0.clone());
    } else if !cfg.nats_credentials_file.is_empty() {
        options = options
            .credentials_file(&cfg.nats_credentials_file)
            .await
            .map_err(|e| {
                format!(
                    "nats_credentials_file {:?} cannot be used: {e}",
                    cfg.nats_credentials_file
                )
            })?;
    }
    if !cfg.nats_tls_ca_file.is_empty() {
        options = options.add_root_certificates(PathBuf::from(&cfg.nats_tls_ca_file));
    }
    if !cfg.nats_tls_cert_file.is_empty() {
        options = options.add_client_certificate(
            PathBuf::from(&cfg.nats_tls_cert_file),
            PathBuf::from(&cfg.nats_tls_key_file),
        );
    }
    Ok(options.require_tls(cfg.nats_tls_required))
}
