//! Settings: defaults, then `config/ojs-jetstream.toml` (or the file in `OJS_CONFIG`), then
//! `OJS_*` environment variables (`OJS_NATS_URL`, `OJS_LISTEN`, …). Validated once at start.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

use crate::domain::retry::OnExhaustion;
use crate::failpoint::Failpoints;
pub use crate::telemetry::logs::LogFormat;
use sha2::{Digest, Sha256};

/// Every setting, with its default. `config/ojs-jetstream.toml` documents each one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Config {
    /// HTTP listen address.
    pub listen: SocketAddr,
    /// gRPC listen address (gRPC binding); empty: no gRPC.
    pub grpc_listen: String,
    /// Certificate and key (PEM) of the gRPC listener: TLS when set.
    pub grpc_tls_cert_file: String,
    pub grpc_tls_key_file: String,
    /// CA (PEM) whose certificates gRPC clients must present (mutual TLS); empty: none asked.
    pub grpc_tls_client_ca_file: String,
    /// NATS server URL(s), comma-separated.
    pub nats_url: String,
    /// Prefix of every stream, bucket and subject, so several deployments (or tests) can
    /// share one NATS account. Events go to `<namespace>.events.<type>`.
    pub namespace: String,
    /// Name used in event `source` URIs (`ojs://<service_name>/api`).
    pub service_name: String,
    /// Enables `POST /ojs/v1/admin/reset`, which wipes all OJS data. For conformance runs only.
    pub allow_reset: bool,
    /// Largest request body accepted, in bytes (batches carry many jobs).
    pub max_body_bytes: usize,
    /// Largest single job envelope accepted, in bytes.
    pub max_job_bytes: usize,
    /// Replicas of every stream and bucket (3 on a three-node cluster).
    pub replicas: usize,
    /// Where streams and buckets keep their data.
    pub storage: Storage,
    /// Default reservation of a fetched job, in milliseconds (worker protocol §5.2).
    pub visibility_timeout_ms: u64,
    /// Default execution timeout of a job, in milliseconds (core §5.2); a job may set its own.
    pub execution_timeout_ms: u64,
    /// A worker that has heartbeated and then stays silent this long is declared dead and
    /// its jobs go back to their queues, in milliseconds (worker protocol §10).
    pub heartbeat_timeout_ms: u64,
    /// How long a workflow's creation or cancel may take before the leader repairs it, in
    /// milliseconds: a creation cut short is cancelled, a cancel finished (architecture
    /// §3.16).
    pub workflow_grace_ms: u64,
    /// How long a batch PUSH may take before the leader repairs it, in milliseconds: one
    /// cut short before its commit is undone, one cut short after it is finished
    /// (architecture §4 PUSH).
    pub batch_grace_ms: u64,
    /// JetStream's redelivery backstop for fetched messages nobody settled, in milliseconds:
    /// how long a delivery stranded by a dead gateway waits; a job running longer than this
    /// costs one record write per period (architecture §3.2).
    pub ack_wait_ms: u64,
    /// Revisions kept per job record; the event publisher can lag this many writes per job.
    pub job_history: i64,
    /// How long lifecycle events are kept in the events stream, in milliseconds.
    pub events_max_age_ms: u64,
    /// How long a finished (completed, cancelled, discarded) job stays readable before the
    /// leader prunes it, in milliseconds; 0 keeps every job (architecture §3.13).
    pub finished_jobs_max_age_ms: u64,
    /// Dead-letter retention (dead-letter spec §5): entries older than this are pruned, in
    /// milliseconds.
    pub dead_letter_max_age_ms: u64,
    /// Dead-letter retention: beyond this many entries the oldest are pruned.
    pub dead_letter_max_count: i64,
    /// Coordinator lease time-to-live, in milliseconds; renewed every third of it.
    pub lease_ttl_ms: u64,
    /// A leader whose service worked this long on one piece of work without finishing it
    /// gives the lease up, so another replica leads (architecture §3.10, stalls), in
    /// milliseconds. Well above a NATS stream leader election (4–8 s).
    pub leader_stall_ms: u64,
    /// Timeout of one NATS request, in milliseconds.
    pub nats_timeout_ms: u64,
    /// How long a request may take, in milliseconds (a FETCH's `wait_ms` comes on top):
    /// within it, NATS steps that fail for a reason NATS heals by itself (a stream leader
    /// election, a reconnect) are tried again; past it the answer is 503 with
    /// `Retry-After` (architecture §4, "NATS goes away").
    pub request_deadline_ms: u64,
    /// Most queues (each a stream and its consumers) the gateways create; a job for a new
    /// queue beyond it is refused with 400.
    pub max_queues: usize,
    /// Most distinct priorities in use per queue (each a consumer); a job with a new one
    /// beyond it is refused with 400.
    pub max_priorities_per_queue: usize,
    /// Most distinct queues one FETCH may name (each unknown one may cost a NATS read);
    /// beyond it 400.
    pub max_fetch_queues: usize,
    /// Most distinct job ids one heartbeat may name (each is a read and a compare-and-set);
    /// beyond it 400. At least a worker's concurrency (worker protocol §4.2: every job it
    /// runs is listed).
    pub max_heartbeat_jobs: usize,
    /// Largest worker info (hostname, pid, queues, concurrency, labels, started_at) a
    /// heartbeat may carry, in bytes of JSON; beyond it 413.
    pub max_worker_info_bytes: usize,
    /// Most cron entries registered; a registration of a new name beyond it is refused with
    /// 400. Every replica keeps all of them in memory.
    pub max_cron_entries: usize,
    /// A gateway closes its pull loop for a queue lane (two subscriptions and a task) when no
    /// FETCH has asked for it in this many milliseconds; the next FETCH opens it again.
    pub idle_puller_ms: u64,
    /// The leader holds in memory only timers due within this many milliseconds; later ones
    /// are handed back to JetStream with a NAK delay (architecture §3.5). 100 to 3,600,000.
    pub timer_horizon_ms: u64,
    /// Most pending timers (scheduled, retrying, expiring jobs; deadline and worker timers
    /// included) at which PUSH still admits jobs needing a timer; beyond it 429 `queue_full`.
    /// At most 9,000,000, so system timers keep 1,000,000 below the scheduler consumer's
    /// `max_ack_pending`.
    pub max_pending_timers: u64,
    /// What a job whose retry policy does not say `on_exhaustion` does when its attempts run
    /// out: `discard` (core §5.2) or `dead_letter` — for clients whose retry policies cannot
    /// say it.
    pub default_on_exhaustion: OnExhaustion,
    /// `text` (for people) or `json` (one OJS logging-spec record a line, for collectors).
    pub log_format: LogFormat,
    /// The leader logs every job transition once for the cluster (enqueued, completed,
    /// retried, discarded…, logging spec §6.1). Off by default: at thousands of jobs a
    /// second these are most of the log.
    pub log_job_transitions: bool,
    /// An OpenTelemetry collector's OTLP/HTTP base URL (`http://collector:4318`): the leader
    /// then exports a span per job transition to `{otlp_endpoint}/v1/traces`. Empty: off.
    pub otlp_endpoint: String,
    /// API keys a client sends as `Authorization: Bearer <key>`; when any is set, every route
    /// but the open ones needs one (401 otherwise). Each is the key itself (at least 32
    /// characters, e.g. `openssl rand -hex 32`) or `sha256:<64 hex digits>`, its SHA-256, so
    /// the file need not hold the key. A list, or comma-separated (`OJS_API_KEYS`); several
    /// keys at once let a key be rotated without downtime.
    pub api_keys: KeyList,
    /// Keys for the admin routes (`/ojs/v1/admin/…`, queue pause and resume, dead-letter
    /// delete, bulk operations); the `api_keys` then get 403 there. Empty: the admin routes
    /// take the `api_keys`.
    pub admin_api_keys: KeyList,
    /// `/ojs/v1/health` and `/metrics` answer without a key (load balancers, Prometheus).
    pub open_health_and_metrics: bool,
    /// Web origins (`https://ops.example.com`) whose pages may call the API from a browser
    /// (HTTP binding §20: CORS). A list, or comma-separated (`OJS_CORS_ALLOWED_ORIGINS`);
    /// `*` allows any, only while no API key is set. Empty: no cross-origin call.
    pub cors_allowed_origins: TextList,
    /// NATS user name, with `nats_password` (the server's `authorization { user, password }`).
    pub nats_user: String,
    pub nats_password: Secret,
    /// NATS token (`authorization { token }`).
    pub nats_token: Secret,
    /// NATS nkey seed (`SU…`) of a user the server lists by its public key.
    pub nats_nkey_seed: Secret,
    /// NATS credentials file (a user JWT and its seed, from `nsc` or a NATS provider); read
    /// once at start.
    pub nats_credentials_file: String,
    /// CA certificate (PEM) that signed the NATS server's certificate, when not a public CA.
    pub nats_tls_ca_file: String,
    /// Client certificate and key (PEM) for a NATS server that verifies clients (mutual TLS).
    pub nats_tls_cert_file: String,
    pub nats_tls_key_file: String,
    /// Connect with TLS even to `nats://` URLs (`tls://` URLs always do).
    pub nats_tls_required: bool,
    /// Fault-injection points for tests (`name=panic|exit`, comma-separated); empty in
    /// production. See `failpoint.rs`.
    pub failpoints: String,
}

/// Where streams and buckets keep their data (`storage` setting): `file` survives a NATS
/// restart, `memory` is faster and does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Storage {
    File,
    Memory,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            grpc_listen: "127.0.0.1:9090".into(),
            grpc_tls_cert_file: String::new(),
            grpc_tls_key_file: String::new(),
            grpc_tls_client_ca_file: String::new(),
            nats_url: "nats://127.0.0.1:4222".into(),
            namespace: "ojs".into(),
            service_name: "ojs-jetstream".into(),
            allow_reset: false,
            max_body_bytes: 16 * 1024 * 1024,
            max_job_bytes: 1024 * 1024,
            replicas: 1,
            storage: Storage::File,
            visibility_timeout_ms: 1_800_000,
            execution_timeout_ms: 1_800_000,
            heartbeat_timeout_ms: 30_000,
            workflow_grace_ms: 30_000,
            batch_grace_ms: 30_000,
            ack_wait_ms: 60_000,
            job_history: 5,
            events_max_age_ms: DAY_MS,
            finished_jobs_max_age_ms: 7 * DAY_MS,
            dead_letter_max_age_ms: 180 * DAY_MS,
            dead_letter_max_count: 10_000,
            lease_ttl_ms: 3_000,
            leader_stall_ms: 60_000,
            nats_timeout_ms: 5_000,
            request_deadline_ms: 10_000,
            max_queues: 1_000,
            max_priorities_per_queue: 16,
            max_fetch_queues: 100,
            max_heartbeat_jobs: 1_000,
            max_worker_info_bytes: 64 * 1024,
            max_cron_entries: 1_000,
            idle_puller_ms: 300_000,
            timer_horizon_ms: 60_000,
            max_pending_timers: 5_000_000,
            default_on_exhaustion: OnExhaustion::Discard,
            log_format: LogFormat::Text,
            log_job_transitions: false,
            otlp_endpoint: String::new(),
            api_keys: KeyList::default(),
            admin_api_keys: KeyList::default(),
            open_health_and_metrics: true,
            cors_allowed_origins: TextList::default(),
            nats_user: String::new(),
            nats_password: Secret::default(),
            nats_token: Secret::default(),
            nats_nkey_seed: Secret::default(),
            nats_credentials_file: String::new(),
            nats_tls_ca_file: String::new(),
            nats_tls_cert_file: String::new(),
            nats_tls_key_file: String::new(),
            nats_tls_required: false,
            failpoints: String::new(),
        }
    }
}

/// A secret setting (a NATS password, token or seed): `Debug` never shows it.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl Secret {
    pub fn is_set(&self) -> bool {
        !self.0.is_empty()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_set() { "<secret>" } else { "<unset>" })
    }
}

/// API keys as set: a list, or one comma-separated string (as `OJS_API_KEYS` gives them).
/// `Debug` shows how many, never a key.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(from = "ListOrText", into = "Vec<String>")]
pub struct KeyList(pub Vec<String>);

/// A list setting: a list, or one comma-separated string (as a variable gives it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(from = "ListOrText", into = "Vec<String>")]
pub struct TextList(pub Vec<String>);

#[derive(Deserialize)]
#[serde(untagged)]
enum ListOrText {
    List(Vec<String>),
    Text(String),
}

impl ListOrText {
    /// The items, trimmed, without empty ones.
    fn items(self) -> Vec<String> {
        let items = match self {
            ListOrText::List(items) => items,
            ListOrText::Text(text) => text.split(',').map(str::to_owned).collect(),
        };
        items
            .iter()
            .map(|k| k.trim().to_owned())
            .filter(|k| !k.is_empty())
            .collect()
    }
}

impl From<ListOrText> for KeyList {
    fn from(value: ListOrText) -> Self {
        KeyList(value.items())
    }
}

impl From<ListOrText> for TextList {
    fn from(value: ListOrText) -> Self {
        TextList(value.items())
    }
}

impl From<TextList> for Vec<String> {
    fn from(list: TextList) -> Self {
        list.0
    }
}

impl From<KeyList> for Vec<String> {
    fn from(keys: KeyList) -> Self {
        keys.0
    }
}

/// Shortest key accepted as given: 32 characters, so a random key carries the spec's 256
/// bits when it is hex of 32 random bytes or longer (`openssl rand -hex 32`).
const MIN_KEY_CHARS: usize = 32;

/// A key's SHA-256: how the gateway holds and compares keys (`http/auth.rs`), so neither a
/// memory dump nor the settings need hold a key itself.
pub type KeyDigest = [u8; 32];

pub fn key_digest(key: &str) -> KeyDigest {
    Sha256::digest(key.as_bytes()).into()
}

impl KeyList {
    /// The keys as digests: each the key itself, hashed, or `sha256:<64 hex digits>`.
    ///
    /// # Errors
    /// The first key that is too short or a digest that is not 64 hex digits (the message
    /// names its position, never the key).
    pub fn digests(&self) -> Result<Vec<KeyDigest>, String> {
        self.0
            .iter()
            .enumerate()
            .map(|(i, key)| match key.strip_prefix("sha256:") {
                Some(hex) => digest_from_hex(hex)
                    .ok_or_else(|| format!("key {}: sha256: needs 64 hex digits", i + 1)),
                None if key.chars().count() < MIN_KEY_CHARS => Err(format!(
                    "key {} is shorter than {MIN_KEY_CHARS} characters",
                    i + 1
                )),
                None => Ok(key_digest(key)),
            })
            .collect()
    }
}

fn digest_from_hex(hex: &str) -> Option<KeyDigest> {
    // `from_str_radix` alone would take a sign ("+f") as a digit pair.
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut digest = KeyDigest::default();
    for (i, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(digest)
}

impl std::fmt::Debug for KeyList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{} keys>", self.0.len())
    }
}

const DAY_MS: u64 = 86_400_000;
/// Longest retention accepted: 100 years, far inside what NATS and the clock arithmetic hold.
const MAX_AGE_LIMIT_MS: u64 = 100 * 365 * DAY_MS;

/// Where a setting lives in `Config`.
type Setting = fn(&mut Config) -> &mut u64;

/// Settings named in seconds before every duration setting took milliseconds: still read,
/// converted, and warned about.
const LEGACY_SECONDS: [(&str, &str, Setting); 4] = [
    ("ack_wait_secs", "ack_wait_ms", |c| &mut c.ack_wait_ms),
    ("events_max_age_secs", "events_max_age_ms", |c| {
        &mut c.events_max_age_ms
    }),
    (
        "finished_jobs_max_age_secs",
        "finished_jobs_max_age_ms",
        |c| &mut c.finished_jobs_max_age_ms,
    ),
    ("dead_letter_max_age_secs", "dead_letter_max_age_ms", |c| {
        &mut c.dead_letter_max_age_ms
    }),
];

/// Highest `max_pending_timers`: 1,000,000 below the scheduler consumer's `max_ack_pending`
/// (`store::timers`), the headroom of the timers PUSH does not set (retry, deadline, worker).
pub const MAX_PENDING_TIMERS_LIMIT: u64 = 9_000_000;

/// A setting that cannot work.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration could not be read: {0}")]
    Load(#[from] Box<figment::Error>),
    #[error("invalid setting {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
}

impl Config {
    /// The settings as `GET /admin/system/config` shows them (admin spec §12.2): every one,
    /// except that API keys are counted, NATS secrets say only whether they are set, and
    /// a user and password in `nats_url` are masked.
    pub fn public(&self) -> serde_json::Value {
        let mut view = serde_json::to_value(self).expect("settings serialize");
        let set =
            |secret: &Secret| serde_json::Value::from(if secret.is_set() { "(set)" } else { "" });
        view["api_keys"] = serde_json::json!({"count": self.api_keys.0.len()});
        view["admin_api_keys"] = serde_json::json!({"count": self.admin_api_keys.0.len()});
        view["nats_password"] = set(&self.nats_password);
        view["nats_token"] = set(&self.nats_token);
        view["nats_nkey_seed"] = set(&self.nats_nkey_seed);
        view["nats_url"] = serde_json::Value::from(
            self.nats_url
                .split(',')
                .map(|server| match server.split_once('@') {
                    Some((before, host)) => match before.split_once("://") {
                        Some((scheme, _)) => format!("{scheme}://***@{host}"),
                        None => format!("***@{host}"),
                    },
                    None => server.to_owned(),
                })
                .collect::<Vec<_>>()
                .join(","),
        );
        view
    }

    /// Loads defaults ← TOML file ← `OJS_*` variables, then validates.
    ///
    /// # Errors
    /// When the file or a variable does not parse, or a value is out of range.
    pub fn load() -> Result<Config, ConfigError> {
        let path =
            std::env::var("OJS_CONFIG").unwrap_or_else(|_| "config/ojs-jetstream.toml".into());
        Config::load_from(Path::new(&path))
    }

    /// Like [`Config::load`], with an explicit file (missing files are skipped).
    ///
    /// # Errors
    /// As [`Config::load`].
    pub fn load_from(path: &Path) -> Result<Config, ConfigError> {
        let file = Figment::from(Toml::file(path));
        let env = Figment::from(Env::prefixed("OJS_").ignore(&["config"]));
        let mut cfg: Config = Figment::from(Serialized::defaults(Config::default()))
            .merge(file.clone())
            .merge(env.clone())
            .extract()
            .map_err(Box::new)?;
        for warning in cfg.read_legacy_seconds(&[env, file])? {
            tracing::warn!("{warning}");
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Takes the settings still given under their old names in seconds (`LEGACY_SECONDS`).
    /// `layers` go from the one that wins (the environment) to the file; within a layer the
    /// new name wins. One warning for each old name found.
    fn read_legacy_seconds(&mut self, layers: &[Figment]) -> Result<Vec<String>, ConfigError> {
        let mut warnings = Vec::new();
        for (old, new, slot) in LEGACY_SECONDS {
            let Some(layer) = layers
                .iter()
                .find(|l| l.find_value(new).is_ok() || l.find_value(old).is_ok())
            else {
                continue;
            };
            let Ok(secs) = layer.extract_inner::<u64>(old) else {
                continue;
            };
            if layer.find_value(new).is_ok() {
                warnings.push(format!(
                    "{old} is deprecated and ignored: {new} is set beside it"
                ));
                continue;
            }
            let ms = secs.checked_mul(1000).ok_or_else(|| ConfigError::Invalid {
                field: new,
                reason: format!("{old} = {secs} is too large"),
            })?;
            *slot(self) = ms;
            warnings.push(format!("{old} is deprecated: use {new} = {ms}"));
        }
        Ok(warnings)
    }

    /// # Errors
    /// The first setting that is out of range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field, reason: &str| {
            Err(ConfigError::Invalid {
                field,
                reason: reason.to_string(),
            })
        };
        let ns_ok = self
            .namespace
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase())
            && self
                .namespace
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !ns_ok || self.namespace.len() > 32 {
            return invalid(
                "namespace",
                "lowercase letters, digits and '-', starting with a letter, at most 32",
            );
        }
        let otlp = &self.otlp_endpoint;
        if !(otlp.is_empty() || otlp.starts_with("http://") || otlp.starts_with("https://")) {
            return invalid("otlp_endpoint", "an http:// or https:// URL, or empty");
        }
        if !(1..=5).contains(&self.replicas) {
            return invalid("replicas", "must be 1 to 5");
        }
        if !(1..=64).contains(&self.job_history) {
            return invalid("job_history", "must be 1 to 64");
        }
        if self.lease_ttl_ms < 300 {
            return invalid("lease_ttl_ms", "must be at least 300");
        }
        // One slow NATS answer is no stall.
        if self.leader_stall_ms <= self.nats_timeout_ms || self.leader_stall_ms > DAY_MS {
            return invalid(
                "leader_stall_ms",
                "must exceed nats_timeout_ms and be at most 86400000 (one day)",
            );
        }
        if self.max_job_bytes > self.max_body_bytes {
            return invalid("max_job_bytes", "must not exceed max_body_bytes");
        }
        for (field, value) in [
            ("events_max_age_ms", self.events_max_age_ms),
            ("finished_jobs_max_age_ms", self.finished_jobs_max_age_ms),
            ("dead_letter_max_age_ms", self.dead_letter_max_age_ms),
        ] {
            if value > MAX_AGE_LIMIT_MS {
                return invalid(field, "must be at most 3153600000000 (100 years)");
            }
        }
        // A batch's mark must outlive its grace by far (the batches bucket keeps marks 24 h).
        if self.batch_grace_ms > 3_600_000 {
            return invalid("batch_grace_ms", "must be at most 3600000 (1 hour)");
        }
        // The dead-letter spec requires a retention policy; NATS reads 0 as "no limit".
        if self.dead_letter_max_count < 1 {
            return invalid("dead_letter_max_count", "must be positive");
        }
        for (field, value) in [
            ("dead_letter_max_age_ms", self.dead_letter_max_age_ms),
            ("visibility_timeout_ms", self.visibility_timeout_ms),
            ("execution_timeout_ms", self.execution_timeout_ms),
            ("heartbeat_timeout_ms", self.heartbeat_timeout_ms),
            ("workflow_grace_ms", self.workflow_grace_ms),
            ("batch_grace_ms", self.batch_grace_ms),
            ("ack_wait_ms", self.ack_wait_ms),
            ("nats_timeout_ms", self.nats_timeout_ms),
            ("request_deadline_ms", self.request_deadline_ms),
        ] {
            if value == 0 {
                return invalid(field, "must be positive");
            }
        }
        for (field, ms) in [
            ("visibility_timeout_ms", self.visibility_timeout_ms),
            ("execution_timeout_ms", self.execution_timeout_ms),
            ("heartbeat_timeout_ms", self.heartbeat_timeout_ms),
            ("workflow_grace_ms", self.workflow_grace_ms),
            ("batch_grace_ms", self.batch_grace_ms),
            ("ack_wait_ms", self.ack_wait_ms),
            ("request_deadline_ms", self.request_deadline_ms),
        ] {
            if ms > crate::domain::duration::MAX.as_millis() as u64 {
                return invalid(field, "must be at most 31536000000 (365 days)");
            }
        }
        if self.max_queues == 0 {
            return invalid("max_queues", "must be positive");
        }
        if !(1..=201).contains(&self.max_priorities_per_queue) {
            return invalid("max_priorities_per_queue", "must be 1 to 201");
        }
        for (field, value, max) in [
            ("max_fetch_queues", self.max_fetch_queues, 10_000),
            // With the two below, a worker's entry (ids of 39 bytes, its info) stays far
            // inside NATS's default 1 MiB message.
            ("max_heartbeat_jobs", self.max_heartbeat_jobs, 10_000),
            (
                "max_worker_info_bytes",
                self.max_worker_info_bytes,
                256 * 1024,
            ),
            ("max_cron_entries", self.max_cron_entries, 100_000),
        ] {
            if !(1..=max).contains(&value) {
                return invalid(field, &format!("must be 1 to {max}"));
            }
        }
        if !(100..=86_400_000).contains(&self.idle_puller_ms) {
            return invalid("idle_puller_ms", "must be 100 to 86400000 (one day)");
        }
        if !(100..=3_600_000).contains(&self.timer_horizon_ms) {
            return invalid("timer_horizon_ms", "must be 100 to 3600000 (one hour)");
        }
        if !(1..=MAX_PENDING_TIMERS_LIMIT).contains(&self.max_pending_timers) {
            return invalid(
                "max_pending_timers",
                "must be 1 to 9000000, below the scheduler's 10000000 max_ack_pending",
            );
        }
        if let Err(reason) = Failpoints::parse(&self.failpoints) {
            return invalid("failpoints", &reason);
        }
        if let Err(reason) = self.nats_servers() {
            return invalid("nats_url", &reason);
        }
        for (field, keys) in [
            ("api_keys", &self.api_keys),
            ("admin_api_keys", &self.admin_api_keys),
        ] {
            if let Err(reason) = keys.digests() {
                return invalid(field, &reason);
            }
        }
        if let Err(reason) = self.cors_origins() {
            return invalid("cors_allowed_origins", &reason);
        }
        let ways = [
            !self.nats_user.is_empty(),
            self.nats_token.is_set(),
            self.nats_nkey_seed.is_set(),
            !self.nats_credentials_file.is_empty(),
        ];
        if ways.iter().filter(|set| **set).count() > 1 {
            return invalid(
                "nats_user",
                "set one of nats_user, nats_token, nats_nkey_seed and nats_credentials_file",
            );
        }
        if self.nats_password.is_set() && self.nats_user.is_empty() {
            return invalid("nats_password", "needs nats_user");
        }
        if !self.grpc_listen.is_empty() && self.grpc_listen.parse::<SocketAddr>().is_err() {
            return invalid(
                "grpc_listen",
                "must be an address and port, or empty for no gRPC",
            );
        }
        if self.grpc_tls_cert_file.is_empty() != self.grpc_tls_key_file.is_empty() {
            return invalid(
                "grpc_tls_cert_file",
                "grpc_tls_cert_file and grpc_tls_key_file go together",
            );
        }
        if !self.grpc_tls_client_ca_file.is_empty() && self.grpc_tls_cert_file.is_empty() {
            return invalid(
                "grpc_tls_client_ca_file",
                "mutual TLS needs the server's own certificate (grpc_tls_cert_file)",
            );
        }
        if self.nats_tls_cert_file.is_empty() != self.nats_tls_key_file.is_empty() {
            return invalid(
                "nats_tls_cert_file",
                "nats_tls_cert_file and nats_tls_key_file go together",
            );
        }
        Ok(())
    }

    /// The servers `nats_url` lists, comma-separated: the client connects to any one of
    /// them and reconnects to the others when it goes away. A URL without a scheme is
    /// `nats://`, as NATS clients read it.
    ///
    /// # Errors
    /// The first URL that does not read, or a list without any.
    pub fn nats_servers(&self) -> Result<Vec<url::Url>, String> {
        let servers = self
            .nats_url
            .split(',')
            .map(str::trim)
            .filter(|url| !url.is_empty())
            .map(|raw| {
                let full = if raw.contains("://") {
                    raw.to_owned()
                } else {
                    format!("nats://{raw}")
                };
                let url = url::Url::parse(&full)
                    .map_err(|e| format!("{raw:?} is not a NATS server URL: {e}"))?;
                match url.scheme() {
                    "nats" | "tls" | "ws" | "wss" if url.host().is_some() => Ok(url),
                    _ => Err(format!(
                        "{raw:?} is not a NATS server URL: it needs a host and one of the schemes nats, tls, ws, wss"
                    )),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        if servers.is_empty() {
            return Err("names no NATS server".into());
        }
        Ok(servers)
    }

    /// The origins `cors_allowed_origins` names, each as a browser sends it in `Origin`
    /// (`https://host[:port]`), or `["*"]` for any.
    ///
    /// # Errors
    /// An entry that is not an origin; `*` beside others, or while API keys are set (a
    /// page of any site could then use a key its browser holds; HTTP binding §20.3).
    pub fn cors_origins(&self) -> Result<Vec<String>, String> {
        let origins = &self.cors_allowed_origins.0;
        if origins.iter().any(|o| o == "*") {
            if origins.len() > 1 {
                return Err("* allows any origin: list origins or give * alone".into());
            }
            if !self.api_keys.0.is_empty() || !self.admin_api_keys.0.is_empty() {
                return Err(
                    "* cannot be used while API keys are set: list the origins of your pages"
                        .into(),
                );
            }
            return Ok(origins.clone());
        }
        origins
            .iter()
            .map(|raw| {
                let origin = url::Url::parse(raw)
                    .ok()
                    .filter(|u| matches!(u.scheme(), "http" | "https"))
                    .map(|u| u.origin().ascii_serialization())
                    .filter(|o| o == raw.trim_end_matches('/'));
                origin.ok_or_else(|| {
                    format!("{raw:?} is not a web origin such as https://ops.example.com (a scheme and host, a port at most)")
                })
            })
            .collect()
    }

    pub fn failpoints(&self) -> Failpoints {
        Failpoints::parse(&self.failpoints).unwrap_or_default()
    }

    /// What one worker request may name.
    /// The gRPC listen address, `None` when gRPC is off. `validate` refused a bad one.
    pub fn grpc_addr(&self) -> Option<SocketAddr> {
        self.grpc_listen.parse().ok()
    }

    pub fn request_limits(&self) -> crate::domain::requests::Limits {
        crate::domain::requests::Limits {
            fetch_queues: self.max_fetch_queues,
            heartbeat_jobs: self.max_heartbeat_jobs,
            worker_info_bytes: self.max_worker_info_bytes,
        }
    }

    pub fn visibility_timeout(&self) -> Duration {
        Duration::from_millis(self.visibility_timeout_ms)
    }

    pub fn request_deadline(&self) -> Duration {
        Duration::from_millis(self.request_deadline_ms)
    }

    pub fn lease_ttl(&self) -> Duration {
        Duration::from_millis(self.lease_ttl_ms)
    }

    pub fn leader_stall(&self) -> Duration {
        Duration::from_millis(self.leader_stall_ms)
    }

    pub fn ack_wait(&self) -> Duration {
        Duration::from_millis(self.ack_wait_ms)
    }

    pub fn events_max_age(&self) -> Duration {
        Duration::from_millis(self.events_max_age_ms)
    }

    pub fn dead_letter_max_age(&self) -> Duration {
        Duration::from_millis(self.dead_letter_max_age_ms)
    }

    /// `None`: finished jobs are kept for good.
    pub fn finished_jobs_max_age(&self) -> Option<Duration> {
        (self.finished_jobs_max_age_ms > 0)
            .then(|| Duration::from_millis(self.finished_jobs_max_age_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        Config::default().validate().unwrap();
    }

    #[test]
    fn an_otlp_endpoint_is_an_http_url() {
        for (endpoint, ok) in [
            ("", true),
            ("http://collector:4318", true),
            ("https://otel.example.com", true),
            ("collector:4318", false),
            ("grpc://collector:4317", false),
        ] {
            let cfg = Config {
                otlp_endpoint: endpoint.into(),
                ..Config::default()
            };
            assert_eq!(cfg.validate().is_ok(), ok, "{endpoint:?}");
        }
    }

    #[test]
    fn retention_is_at_most_a_century() {
        let bad = Config {
            finished_jobs_max_age_ms: MAX_AGE_LIMIT_MS + 1,
            ..Config::default()
        };
        assert!(bad.validate().is_err());
        let longest = Config {
            finished_jobs_max_age_ms: MAX_AGE_LIMIT_MS,
            dead_letter_max_age_ms: MAX_AGE_LIMIT_MS,
            ..Config::default()
        };
        longest.validate().unwrap();
    }

    #[test]
    fn dead_letter_retention_cannot_be_switched_off() {
        for bad in [
            Config {
                dead_letter_max_count: 0,
                ..Config::default()
            },
            Config {
                dead_letter_max_age_ms: 0,
                ..Config::default()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn timer_settings_are_bounded() {
        for bad in [
            Config {
                timer_horizon_ms: 99,
                ..Config::default()
            },
            Config {
                timer_horizon_ms: 3_600_001,
                ..Config::default()
            },
            Config {
                max_pending_timers: 0,
                ..Config::default()
            },
            Config {
                max_pending_timers: MAX_PENDING_TIMERS_LIMIT + 1,
                ..Config::default()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn ack_wait_is_at_most_a_year() {
        let longest = crate::domain::duration::MAX.as_millis() as u64;
        for (ack_wait_ms, ok) in [(longest, true), (longest + 1, false), (u64::MAX, false)] {
            let cfg = Config {
                ack_wait_ms,
                ..Config::default()
            };
            assert_eq!(cfg.validate().is_ok(), ok, "{ack_wait_ms}");
        }
    }

    #[test]
    fn a_stall_is_longer_than_one_nats_call_and_at_most_a_day() {
        for (leader_stall_ms, nats_timeout_ms, ok) in [
            (5_000, 5_000, false),
            (5_001, 5_000, true),
            (1_500, 1_000, true),
            (DAY_MS, 5_000, true),
            (DAY_MS + 1, 5_000, false),
        ] {
            let cfg = Config {
                leader_stall_ms,
                nats_timeout_ms,
                ..Config::default()
            };
            assert_eq!(cfg.validate().is_ok(), ok, "{leader_stall_ms}");
        }
    }

    #[test]
    fn idle_puller_time_is_bounded() {
        for (idle_puller_ms, ok) in [
            (99, false),
            (100, true),
            (86_400_000, true),
            (86_400_001, false),
        ] {
            let cfg = Config {
                idle_puller_ms,
                ..Config::default()
            };
            assert_eq!(cfg.validate().is_ok(), ok, "{idle_puller_ms}");
        }
    }

    // figment's Jail API fixes the closure's error type; its size is not ours to choose.
    #[allow(clippy::result_large_err)]
    #[test]
    fn old_settings_in_seconds_are_still_read_unless_the_new_one_is_given() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "c.toml",
                "ack_wait_secs = 2\nevents_max_age_secs = 60\ndead_letter_max_age_ms = 7000",
            )?;
            jail.set_env("OJS_EVENTS_MAX_AGE_MS", "5000");
            jail.set_env("OJS_DEAD_LETTER_MAX_AGE_SECS", "3");
            let cfg = Config::load_from(Path::new("c.toml")).unwrap();
            assert_eq!(cfg.ack_wait_ms, 2000);
            assert_eq!(
                cfg.events_max_age_ms, 5000,
                "the environment wins over the file"
            );
            assert_eq!(cfg.dead_letter_max_age_ms, 3000, "also under its old name");
            assert_eq!(
                cfg.finished_jobs_max_age_ms,
                Config::default().finished_jobs_max_age_ms
            );
            Ok(())
        });
    }

    #[test]
    fn the_public_settings_show_no_secret() {
        let config = Config {
            nats_url: "nats://ops:hunter2@a:4222,nats://b:4222,tls://tok3n@c:4222".into(),
            api_keys: KeyList(vec!["k".repeat(32), "j".repeat(32)]),
            nats_password: Secret("pw-value".into()),
            nats_token: Secret(String::new()),
            ..Config::default()
        };
        let view = config.public();
        let text = view.to_string();
        for secret in ["hunter2", "tok3n", "kkkk", "jjjj", "pw-value"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert_eq!(
            view["nats_url"],
            "nats://***@a:4222,nats://b:4222,tls://***@c:4222"
        );
        assert_eq!(view["api_keys"]["count"], 2);
        assert_eq!(view["nats_password"], "(set)");
        assert_eq!(view["nats_token"], "");
        assert_eq!(view["max_queues"], config.max_queues);
    }

    #[test]
    fn nats_url_lists_servers_separated_by_commas() {
        let cfg = Config {
            nats_url: "nats://a:4222, nats://b:4223,,tls://c:4224 ".into(),
            ..Config::default()
        };
        let servers: Vec<String> = cfg
            .nats_servers()
            .unwrap()
            .iter()
            .map(|s| format!("{}:{}", s.host_str().unwrap(), s.port().unwrap()))
            .collect();
        assert_eq!(servers, ["a:4222", "b:4223", "c:4224"]);
        cfg.validate().unwrap();
        for bad in [
            "",
            " , ",
            "nats://a:4222,nats://b:port",
            "nats://a:99999",
            "http://a:4222",
        ] {
            let cfg = Config {
                nats_url: bad.into(),
                ..Config::default()
            };
            assert!(cfg.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn rejects_a_bad_namespace() {
        let bad = Config {
            namespace: "OJS.x".into(),
            ..Config::default()
        };
        assert!(bad.validate().is_err());
    }

    // figment's Jail API fixes the closure's error type; its size is not ours to choose.
    #[allow(clippy::result_large_err)]
    #[test]
    fn storage_is_file_or_memory() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("OJS_STORAGE", "memory");
            assert_eq!(
                Config::load_from(Path::new("none.toml")).unwrap().storage,
                Storage::Memory
            );
            jail.set_env("OJS_STORAGE", "disk");
            let err = Config::load_from(Path::new("none.toml")).unwrap_err();
            assert!(err.to_string().contains("disk"), "{err}");
            Ok(())
        });
    }

    // figment's Jail API fixes the closure's error type; its size is not ours to choose.
    #[allow(clippy::result_large_err)]
    #[test]
    fn env_overrides_file() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "c.toml",
                "listen = \"127.0.0.1:9999\"\nnamespace = \"filens\"",
            )?;
            jail.set_env("OJS_NAMESPACE", "envns");
            let cfg = Config::load_from(Path::new("c.toml")).map_err(|e| e.to_string())?;
            assert_eq!(cfg.listen.port(), 9999);
            assert_eq!(cfg.namespace, "envns");
            Ok(())
        });
    }

    // figment's Jail API fixes the closure's error type; its size is not ours to choose.
    #[allow(clippy::result_large_err)]
    #[test]
    fn api_keys_come_as_a_list_or_comma_separated_and_short_ones_are_refused() {
        const A: &str = "0123456789abcdef0123456789abcdef";
        const B: &str = "fedcba9876543210fedcba9876543210";
        figment::Jail::expect_with(|jail| {
            jail.create_file("c.toml", &format!("api_keys = [\"{A}\", \"{B}\"]"))?;
            let cfg = Config::load_from(Path::new("c.toml")).map_err(|e| e.to_string())?;
            assert_eq!(cfg.api_keys.0, [A, B]);
            jail.set_env("OJS_ADMIN_API_KEYS", format!("{A}, {B},"));
            let cfg = Config::load_from(Path::new("c.toml")).map_err(|e| e.to_string())?;
            assert_eq!(cfg.admin_api_keys.0, [A, B]);
            assert!(!format!("{cfg:?}").contains(A), "Debug shows no key");
            jail.set_env("OJS_API_KEYS", "too-short");
            let err = Config::load_from(Path::new("c.toml")).unwrap_err();
            assert!(err.to_string().contains("api_keys"), "{err}");
            assert!(!err.to_string().contains("too-short"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn cors_origins_are_web_origins_and_any_only_without_keys() {
        let with = |origins: &[&str], keys: &[&str]| Config {
            cors_allowed_origins: TextList(origins.iter().map(|o| o.to_string()).collect()),
            api_keys: KeyList(keys.iter().map(|k| k.to_string()).collect()),
            ..Config::default()
        };
        let key = "0123456789abcdef0123456789abcdef";
        assert_eq!(
            with(&["https://ops.example.com", "http://localhost:5173/"], &[])
                .cors_origins()
                .unwrap(),
            ["https://ops.example.com", "http://localhost:5173"]
        );
        assert_eq!(with(&["*"], &[]).cors_origins().unwrap(), ["*"]);
        assert!(
            with(&["*"], &[key]).validate().is_err(),
            "any origin with keys"
        );
        assert!(with(&["*", "https://a.example"], &[])
            .cors_origins()
            .is_err());
        for bad in [
            "ops.example.com",
            "https://a.example/path",
            "ftp://a.example",
            "https://a.example?x=1",
        ] {
            let err = with(&[bad], &[]).validate().unwrap_err();
            assert!(
                err.to_string().contains("cors_allowed_origins"),
                "{bad}: {err}"
            );
        }
        assert!(with(&[], &[key]).validate().is_ok());
    }

    #[test]
    fn a_key_is_read_as_itself_or_its_digest_and_nothing_shorter_is_accepted() {
        const KEY: &str = "0123456789abcdef0123456789abcdef-producer";
        let hex: String = key_digest(KEY).iter().map(|b| format!("{b:02x}")).collect();
        let list = |keys: &[&str]| KeyList(keys.iter().map(|k| k.to_string()).collect());
        assert_eq!(list(&[KEY]).digests().unwrap(), [key_digest(KEY)]);
        let by_digest = format!("sha256:{hex}");
        assert_eq!(list(&[&by_digest]).digests().unwrap(), [key_digest(KEY)]);
        assert!(list(&["short"]).digests().unwrap_err().contains("key 1"));
        assert!(list(&["sha256:abc"]).digests().is_err());
        assert!(list(&[&format!("sha256:{}", "zz".repeat(32))])
            .digests()
            .is_err());
        assert!(list(&[&format!("sha256:{}", "+f".repeat(32))])
            .digests()
            .is_err());
    }

    #[test]
    fn one_way_to_authenticate_to_nats_and_tls_files_in_pairs() {
        let both = Config {
            nats_user: "ojs".into(),
            nats_token: Secret("t".into()),
            ..Config::default()
        };
        assert!(both.validate().is_err());
        let password_alone = Config {
            nats_password: Secret("p".into()),
            ..Config::default()
        };
        assert!(password_alone.validate().is_err());
        let cert_alone = Config {
            nats_tls_cert_file: "client.pem".into(),
            ..Config::default()
        };
        assert!(cert_alone.validate().is_err());
        let secret = Config {
            nats_user: "ojs".into(),
            nats_password: Secret("hunter2-hunter2".into()),
            ..Config::default()
        };
        secret.validate().unwrap();
        assert!(!format!("{secret:?}").contains("hunter2"));
    }

    #[test]
    fn the_shipped_settings_file_reads_and_holds_the_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/ojs-jetstream.toml");
        let file: Config = Figment::from(Serialized::defaults(Config::default()))
            .merge(Toml::file_exact(path))
            .extract()
            .unwrap();
        assert_eq!(file, Config::default());
    }
}
