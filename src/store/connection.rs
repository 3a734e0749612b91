//! The NATS connection's options from the settings: a name, the request timeout, and the
//! credentials and TLS a production NATS asks for (user and password, token, nkey,
//! credentials file; a private CA, a client certificate).

use std::path::PathBuf;
use std::time::Duration;

use async_nats::ConnectOptions;

use crate::config::Config;

/// The options every connection of this gateway uses.
///
/// # Errors
/// When the credentials file cannot be read or does not parse (a setting to fix, not a
/// NATS outage to wait out).
pub async fn options(cfg: &Config) -> Result<ConnectOptions, String> {
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
