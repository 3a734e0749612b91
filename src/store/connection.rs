//! The connection to NATS that every resource handle shares: the client, the JetStream
//! context, the topology and the settings the handles read, with the helpers that create
//! streams and buckets. Its options come from the settings: a name, the request timeout, and
//! the credentials and TLS a production NATS asks for (user and password, token, nkey,
//! credentials file; a private CA, a client certificate).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv, stream::StorageType};
use async_nats::ConnectOptions;
use tokio_util::sync::CancellationToken;

use super::deadline;
use super::error::{self, backend};
use super::topology::Topology;
use crate::config::{Config, Storage};
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::lifecycle::RECORD_HEADROOM;
use crate::domain::retry::OnExhaustion;
use crate::failpoint::Failpoints;

/// Unacknowledged JetStream publishes allowed at once. async-nats makes a publish wait when
/// its cap is reached; a batch PUSH publishes all its queue messages before awaiting any
/// acknowledgement, so concurrent batches holding the cap between them would wait on each
/// other forever (and every other publish of the gateway with them). The cap is therefore
/// far above what requests can hold (batches ≤ 10,000 jobs, times the concurrent requests);
/// memory is bounded by the request size limits instead.
const MAX_ACKS_IN_FLIGHT: usize = 10_000_000;

/// The NATS connection and the settings the resource handles share.
pub(super) struct Connection {
    pub(super) client: async_nats::Client,
    pub(super) js: jetstream::Context,
    pub(super) topology: Topology,
    /// Event `source` URI of this gateway's API, and of its cron scheduler.
    pub(super) source: String,
    pub(super) cron_source: String,
    /// Default reservation of a fetched job.
    pub(super) visibility_timeout: Duration,
    /// Default execution timeout of a job.
    pub(super) execution_timeout: Duration,
    pub(super) finished_jobs_max_age: Option<Duration>,
    /// How long a worker may go without a heartbeat before its jobs are taken back.
    pub(super) heartbeat_timeout: Duration,
    /// How long a workflow's creation or cancel may take (`workflow_grace_ms`).
    pub(super) workflow_grace: Duration,
    /// What a job whose retry policy does not say does at exhaustion (`default_on_exhaustion`).
    pub(super) default_on_exhaustion: OnExhaustion,
    /// How long a batch PUSH may take (`batch_grace_ms`).
    pub(super) batch_grace: Duration,
    /// How long any request may take (`request_deadline_ms`).
    pub(super) request_deadline: Duration,
    /// Longest wait for one NATS answer (`nats_timeout_ms`).
    pub(super) nats_timeout: Duration,
    /// Largest job record this store will write.
    pub(super) max_record_bytes: usize,
    /// The scheduler's horizon (`timer_horizon_ms`).
    pub(super) timer_horizon_ms: u64,
    /// PUSH's cap on pending timers, and the count it is checked against.
    pub(super) max_pending_timers: u64,
    /// Most cron entries registered (`max_cron_entries`).
    pub(super) max_cron_entries: usize,
    /// Whether the leader logs each job transition (`log_job_transitions`).
    pub(super) log_job_transitions: bool,
    /// Cancelled at shutdown: long-polling FETCHes stop waiting.
    pub(super) stop_waiting: CancellationToken,
    failpoints: Failpoints,
}

impl Connection {
    /// Connects to NATS with `options` and reads the settings; creates nothing yet.
    ///
    /// # Errors
    /// When NATS is unreachable or `nats_url` does not parse.
    pub(super) async fn open(
        cfg: &Config,
        options: ConnectOptions,
    ) -> Result<Connection, OjsError> {
        let servers = cfg
            .nats_servers()
            .and_then(|urls| {
                urls.into_iter()
                    .map(|url| async_nats::ServerAddr::from_url(url).map_err(|e| e.to_string()))
                    .collect::<Result<Vec<_>, _>>()
            })
            .map_err(|reason| {
                OjsError::new(ErrorCode::BackendUnavailable, format!("nats_url: {reason}"))
            })?;
        let client = options.connect(servers).await.map_err(|e| {
            OjsError::new(
                ErrorCode::BackendUnavailable,
                format!("cannot connect to NATS at {}: {e}", cfg.nats_url),
            )
        })?;
        let js = jetstream::ContextBuilder::new()
            .timeout(Duration::from_millis(cfg.nats_timeout_ms))
            .max_ack_inflight(MAX_ACKS_IN_FLIGHT)
            .build(client.clone());
        let topology = Topology {
            namespace: cfg.namespace.clone(),
            replicas: cfg.replicas,
            storage: match cfg.storage {
                Storage::File => StorageType::File,
                Storage::Memory => StorageType::Memory,
            },
            ack_wait: cfg.ack_wait(),
            job_history: cfg.job_history,
            events_max_age: cfg.events_max_age(),
            dead_letter_max_age: cfg.dead_letter_max_age(),
            dead_letter_max_count: cfg.dead_letter_max_count,
            lease_ttl: cfg.lease_ttl(),
            finished_jobs_max_age: cfg.finished_jobs_max_age(),
        };
        let server_max = client.server_info().max_payload;
        Ok(Connection {
            client,
            js,
            topology,
            source: format!("ojs://{}/api", cfg.service_name),
            cron_source: format!("ojs://{}/cron", cfg.service_name),
            visibility_timeout: cfg.visibility_timeout(),
            execution_timeout: Duration::from_millis(cfg.execution_timeout_ms),
            finished_jobs_max_age: cfg.finished_jobs_max_age(),
            heartbeat_timeout: Duration::from_millis(cfg.heartbeat_timeout_ms),
            workflow_grace: Duration::from_millis(cfg.workflow_grace_ms),
            default_on_exhaustion: cfg.default_on_exhaustion,
            batch_grace: Duration::from_millis(cfg.batch_grace_ms),
            request_deadline: cfg.request_deadline(),
            nats_timeout: Duration::from_millis(cfg.nats_timeout_ms),
            // A job of `max_job_bytes` plus the room it may grow by, within what the NATS
            // server accepts in one message (less its own headers).
            max_record_bytes: (cfg.max_job_bytes + RECORD_HEADROOM)
                .min(server_max.saturating_sub(4096)),
            timer_horizon_ms: cfg.timer_horizon_ms,
            max_pending_timers: cfg.max_pending_timers,
            max_cron_entries: cfg.max_cron_entries,
            log_job_transitions: cfg.log_job_transitions,
            stop_waiting: CancellationToken::new(),
            failpoints: cfg.failpoints(),
        })
    }

    /// Fails or waits here if the test set the failpoint `name` (`failpoint.rs`).
    pub(super) async fn failpoint(&self, name: &str) {
        self.failpoints.hit(name).await;
    }

    /// Whether the test set the failpoint `name` to lose the message just received here.
    pub(super) fn loses(&self, name: &str) -> bool {
        self.failpoints.loses(name)
    }

    /// The largest job PUSH accepts: the record limit less the room a record may grow by
    /// after PUSH (`lifecycle::RECORD_HEADROOM`).
    pub(super) fn max_job_bytes(&self) -> usize {
        self.max_record_bytes.saturating_sub(RECORD_HEADROOM)
    }

    /// Creates or updates `bucket` (keeping `history` values per key, each `max_age` at
    /// most) and opens it.
    pub(super) async fn ensure_bucket(
        &self,
        bucket: &str,
        history: i64,
        max_age: Duration,
    ) -> Result<kv::Store, OjsError> {
        ensure_stream(
            &self.js,
            self.topology.bucket_stream(bucket, history, max_age),
        )
        .await?;
        self.js
            .get_key_value(bucket)
            .await
            .map_err(backend("opening a bucket"))
    }

    /// Round trip to the NATS server, for health checks.
    ///
    /// # Errors
    /// When the connection is down or the server does not answer in time.
    pub(super) async fn ping(&self) -> Result<Duration, OjsError> {
        if self.client.connection_state() != async_nats::connection::State::Connected {
            return Err(OjsError::new(
                ErrorCode::BackendUnavailable,
                "Not connected to NATS.",
            ));
        }
        let started = Instant::now();
        tokio::time::timeout(Duration::from_secs(2), self.client.flush())
            .await
            .map_err(|_| {
                OjsError::new(
                    ErrorCode::BackendUnavailable,
                    "NATS did not answer in time.",
                )
            })?
            .map_err(backend("pinging"))?;
        Ok(started.elapsed())
    }
}

/// Creates a stream, or updates it to `config` if it exists.
pub(super) async fn ensure_stream(
    js: &jetstream::Context,
    config: jetstream::stream::Config,
) -> Result<jetstream::stream::Stream, OjsError> {
    let name = config.name.clone();
    let creating = format!("creating stream {name}");
    let opening = format!("opening stream {name}");
    let created = deadline::answered(&creating, || js.create_or_update_stream(config.clone()))
        .await?
        .said;
    // Another replica may have created it a moment ago; then opening it is enough.
    match deadline::answered(&opening, || js.get_stream(&name))
        .await?
        .said
    {
        Ok(stream) => Ok(stream),
        Err(open_err) => Err(match created {
            Err(err) => error::nats_failed(&creating, err),
            Ok(_) => error::nats_failed(&opening, open_err),
        }),
    }
}

/// The options every connection of this gateway uses.
///
/// # Errors
/// When the credentials file cannot be read or does not parse (a setting to fix, not a
/// NATS outage to wait out).
pub(super) async fn options(cfg: &Config) -> Result<ConnectOptions, String> {
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
