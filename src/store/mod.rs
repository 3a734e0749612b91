//! The JetStream layer: the only module that talks to NATS. [`Store`] is a cheap-to-clone
//! connection shared by the HTTP handlers and the coordinator; it hands out one handle per
//! resource (`store.jobs()`, `store.cron()`, …), each owning that resource's buckets and
//! streams, so a call names what it touches. `store.leader()` holds what only the leader
//! services do.

mod cas;
pub mod connection;
mod cron;
mod dead_letter;
pub mod deadline;
mod error;
mod events;
mod jobs;
mod leader;
mod lease;
mod mirror;
mod publish;
mod queues;
mod stats;
mod stream_walk;
mod timers;
pub mod topology;
mod workers;
mod workflows;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv, stream::StorageType};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::config::{Config, Storage};
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::lanes::LaneLimits;
use crate::domain::lifecycle::RECORD_HEADROOM;
use crate::domain::retry::OnExhaustion;
use crate::failpoint::Failpoints;

pub use cron::Cron;
pub use dead_letter::{DeadLetter, DeadLetterPage, DeadLetterStats};
pub use error::backend;
pub use events::{EventFeed, EventPage, EventQuery, Events, FollowFrom};
pub use jobs::{ended_lock, Enqueued, JobPage, Jobs, Reported, Settled};
pub use leader::{
    JobWrite, JobWrites, Leader, PendingTimer, ReadAhead, StoredWrite, TickOutcome, TimerFeed,
    WriteBody,
};
pub use lease::{Lease, Leases};
pub use queues::{LimitUsage, Pressure, QueueMeta, QueueStats, Queues};
pub use stats::{ClusterTotals, Stats};
pub use timers::{Timer, TimerKind, Timers};
pub use topology::Topology;
pub use workers::{BeatReply, WorkerRecord, WorkerState, Workers};
pub use workflows::{WorkflowView, Workflows};

/// Unacknowledged JetStream publishes allowed at once. async-nats makes a publish wait when
/// its cap is reached; a batch PUSH publishes all its queue messages before awaiting any
/// acknowledgement, so concurrent batches holding the cap between them would wait on each
/// other forever (and every other publish of the gateway with them). The cap is therefore
/// far above what requests can hold (batches ≤ 10,000 jobs, times the concurrent requests);
/// memory is bounded by the request size limits instead.
const MAX_ACKS_IN_FLIGHT: usize = 10_000_000;

/// The connection to NATS (client, JetStream context, topology, settings) and the owner of
/// every resource, which it hands out as handles.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    client: async_nats::Client,
    js: jetstream::Context,
    topology: Topology,
    /// What each resource owns, lent to its handle.
    jobs: jobs::Owned,
    queues: queues::Owned,
    timers: timers::Owned,
    events: events::Owned,
    workflows: workflows::Owned,
    cron: cron::Owned,
    dead_letter: dead_letter::Owned,
    workers: workers::Owned,
    stats: stats::Owned,
    leases: lease::Owned,
    leader: leader::Owned,
    /// Event `source` URI of this gateway's API, and of its cron scheduler.
    source: String,
    cron_source: String,
    /// Default reservation of a fetched job.
    visibility_timeout: Duration,
    /// Default execution timeout of a job.
    execution_timeout: Duration,
    finished_jobs_max_age: Option<Duration>,
    /// How long a worker may go without a heartbeat before its jobs are taken back.
    heartbeat_timeout: Duration,
    /// How long a workflow's creation or cancel may take (`workflow_grace_ms`).
    workflow_grace: Duration,
    /// What a job whose retry policy does not say does at exhaustion (`default_on_exhaustion`).
    default_on_exhaustion: OnExhaustion,
    /// How long a batch PUSH may take (`batch_grace_ms`).
    batch_grace: Duration,
    /// Longest wait for one NATS answer (`nats_timeout_ms`).
    nats_timeout: Duration,
    /// Largest job record this store will write.
    max_record_bytes: usize,
    /// The scheduler's horizon (`timer_horizon_ms`).
    timer_horizon_ms: u64,
    /// PUSH's cap on pending timers, and the count it is checked against.
    max_pending_timers: u64,
    /// Most cron entries registered (`max_cron_entries`).
    max_cron_entries: usize,
    /// Whether the leader logs each job transition (`log_job_transitions`).
    log_job_transitions: bool,
    /// Cancelled at shutdown: long-polling FETCHes stop waiting.
    stop_waiting: CancellationToken,
    failpoints: Failpoints,
}

impl Store {
    /// Connects to NATS and creates or updates every stream, consumer and bucket. Idempotent:
    /// several replicas may start at once.
    ///
    /// # Errors
    /// When NATS is unreachable or refuses the topology.
    pub async fn connect(
        cfg: &Config,
        options: async_nats::ConnectOptions,
    ) -> Result<Store, OjsError> {
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
        let started = Instant::now();
        let jobs = ensure_bucket(
            &js,
            &topology,
            &topology.jobs_bucket(),
            topology.job_history,
            Duration::ZERO,
        )
        .await?;
        let queues_kv =
            ensure_bucket(&js, &topology, &topology.queues_bucket(), 1, Duration::ZERO).await?;
        let workers = ensure_bucket(
            &js,
            &topology,
            &topology.workers_bucket(),
            1,
            Duration::ZERO,
        )
        .await?;
        let cron_kv =
            ensure_bucket(&js, &topology, &topology.cron_bucket(), 1, Duration::ZERO).await?;
        let workflows = ensure_bucket(
            &js,
            &topology,
            &topology.workflows_bucket(),
            1,
            Duration::ZERO,
        )
        .await?;
        let stats =
            ensure_bucket(&js, &topology, &topology.stats_bucket(), 1, Duration::ZERO).await?;
        let unique =
            ensure_bucket(&js, &topology, &topology.unique_bucket(), 1, Duration::ZERO).await?;
        // A mark outlives its batch's timer only when no leader ran for a day.
        let batches = ensure_bucket(
            &js,
            &topology,
            &topology.batches_bucket(),
            1,
            Duration::from_secs(24 * 3600),
        )
        .await?;
        let cron = mirror::Mirror::start(&cron_kv, &client, topology.reset_subject()).await?;
        let worker_list =
            mirror::Mirror::start(&workers, &client, topology.reset_subject()).await?;
        let handled =
            events::HandledWrites::follow(&client, topology.events_handled_subject()).await?;
        let leases = ensure_bucket(
            &js,
            &topology,
            &topology.leases_bucket(),
            1,
            topology.lease_ttl,
        )
        .await?;
        let coordinator = ensure_bucket(
            &js,
            &topology,
            &topology.coordinator_bucket(),
            1,
            Duration::ZERO,
        )
        .await?;
        let events = ensure_stream(&js, topology.events_stream_config()).await?;
        ensure_stream(&js, topology.timers_stream_config()).await?;
        let dead_letter = ensure_stream(&js, topology.dead_letter_stream_config()).await?;
        let finished = leader::FinishedIndex::ensure(&js, &topology).await?;
        let server_max = client.server_info().max_payload;
        let queues = queues::QueueRegistry::start(
            client.clone(),
            js.clone(),
            topology.clone(),
            queues_kv,
            LaneLimits {
                max_queues: cfg.max_queues,
                max_priorities_per_queue: cfg.max_priorities_per_queue,
            },
            Duration::from_millis(cfg.idle_puller_ms),
        )
        .await?;
        info!(elapsed_ms = started.elapsed().as_millis() as u64, namespace = %topology.namespace, "JetStream topology ready");
        Ok(Store {
            inner: Arc::new(Inner {
                client,
                js,
                topology,
                jobs: jobs::Owned::new(jobs, unique, batches),
                queues: queues::Owned {
                    registry: queues,
                    depths: queues::DepthCache::default(),
                },
                timers: timers::Owned {
                    count: timers::TimerCount::default(),
                },
                events: events::Owned {
                    stream: events,
                    handled,
                },
                workflows: workflows::Owned { kv: workflows },
                cron: cron::Owned {
                    kv: cron_kv,
                    mirror: cron,
                },
                dead_letter: dead_letter::Owned {
                    stream: dead_letter,
                },
                workers: workers::Owned {
                    kv: workers,
                    mirror: worker_list,
                },
                stats: stats::Owned { kv: stats },
                leases: lease::Owned { kv: leases },
                leader: leader::Owned {
                    kv: coordinator,
                    finished,
                },
                source: format!("ojs://{}/api", cfg.service_name),
                cron_source: format!("ojs://{}/cron", cfg.service_name),
                visibility_timeout: cfg.visibility_timeout(),
                execution_timeout: Duration::from_millis(cfg.execution_timeout_ms),
                finished_jobs_max_age: cfg.finished_jobs_max_age(),
                heartbeat_timeout: Duration::from_millis(cfg.heartbeat_timeout_ms),
                workflow_grace: Duration::from_millis(cfg.workflow_grace_ms),
                default_on_exhaustion: cfg.default_on_exhaustion,
                batch_grace: Duration::from_millis(cfg.batch_grace_ms),
                nats_timeout: Duration::from_millis(cfg.nats_timeout_ms),
                // A job of `max_job_bytes` plus the room it may grow by, within what the
                // NATS server accepts in one message (less its own headers).
                max_record_bytes: (cfg.max_job_bytes + RECORD_HEADROOM)
                    .min(server_max.saturating_sub(4096)),
                timer_horizon_ms: cfg.timer_horizon_ms,
                max_pending_timers: cfg.max_pending_timers,
                max_cron_entries: cfg.max_cron_entries,
                log_job_transitions: cfg.log_job_transitions,
                stop_waiting: CancellationToken::new(),
                failpoints: cfg.failpoints(),
            }),
        })
    }

    pub fn jobs(&self) -> Jobs<'_> {
        Jobs {
            store: self,
            own: &self.inner.jobs,
        }
    }

    pub fn queues(&self) -> Queues<'_> {
        Queues {
            store: self,
            own: &self.inner.queues,
        }
    }

    pub fn timers(&self) -> Timers<'_> {
        Timers {
            store: self,
            own: &self.inner.timers,
        }
    }

    pub fn events(&self) -> Events<'_> {
        Events {
            store: self,
            own: &self.inner.events,
        }
    }

    pub fn workflows(&self) -> Workflows<'_> {
        Workflows {
            store: self,
            own: &self.inner.workflows,
        }
    }

    pub fn cron(&self) -> Cron<'_> {
        Cron {
            store: self,
            own: &self.inner.cron,
        }
    }

    pub fn dead_letter(&self) -> DeadLetter<'_> {
        DeadLetter {
            store: self,
            own: &self.inner.dead_letter,
        }
    }

    pub fn workers(&self) -> Workers<'_> {
        Workers {
            store: self,
            own: &self.inner.workers,
        }
    }

    pub fn stats(&self) -> Stats<'_> {
        Stats {
            store: self,
            own: &self.inner.stats,
        }
    }

    pub fn leases(&self) -> Leases<'_> {
        Leases {
            store: self,
            own: &self.inner.leases,
        }
    }

    pub fn leader(&self) -> Leader<'_> {
        Leader {
            store: self,
            own: &self.inner.leader,
        }
    }

    /// Whether the leader logs each job transition.
    pub fn log_job_transitions(&self) -> bool {
        self.inner.log_job_transitions
    }

    /// Cancelled when the gateway begins to shut down: live event streams end with it.
    pub fn shutting_down(&self) -> CancellationToken {
        self.inner.stop_waiting.clone()
    }

    pub fn topology(&self) -> &Topology {
        &self.inner.topology
    }

    /// The execution timeout of jobs that set none.
    pub fn execution_timeout(&self) -> Duration {
        self.inner.execution_timeout
    }

    /// The version the NATS server announced, e.g. `2.10.22`.
    pub fn nats_version(&self) -> String {
        self.inner.client.server_info().version
    }

    /// How many queue lanes this gateway keeps a pull loop open for.
    pub fn pullers_open(&self) -> usize {
        self.inner.queues.registry.pullers_open()
    }

    /// How long finished jobs are kept; `None`: for good.
    pub fn finished_jobs_max_age(&self) -> Option<Duration> {
        self.inner.finished_jobs_max_age
    }

    /// Fails or waits here if the test set the failpoint `name` (`failpoint.rs`).
    pub async fn failpoint(&self, name: &str) {
        self.inner.failpoints.hit(name).await;
    }

    /// The largest job PUSH accepts: the record limit less the room a record may grow by
    /// after PUSH (`lifecycle::RECORD_HEADROOM`).
    pub fn max_job_bytes(&self) -> usize {
        self.inner.max_record_bytes.saturating_sub(RECORD_HEADROOM)
    }

    /// Round trip to the NATS server, for health checks.
    ///
    /// # Errors
    /// When the connection is down or the server does not answer in time.
    pub async fn ping(&self) -> Result<Duration, OjsError> {
        if self.inner.client.connection_state() != async_nats::connection::State::Connected {
            return Err(OjsError::new(
                ErrorCode::BackendUnavailable,
                "Not connected to NATS.",
            ));
        }
        let started = Instant::now();
        tokio::time::timeout(Duration::from_secs(2), self.inner.client.flush())
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

    /// Wipes all OJS data of this namespace (conformance runs) and tells every replica.
    ///
    /// # Errors
    /// When a purge fails.
    pub async fn reset(&self) -> Result<(), OjsError> {
        let t = &self.inner.topology;
        let mut names = self.inner.js.stream_names();
        let mut streams = vec![
            format!("KV_{}", t.jobs_bucket()),
            format!("KV_{}", t.queues_bucket()),
            format!("KV_{}", t.workers_bucket()),
            format!("KV_{}", t.cron_bucket()),
            format!("KV_{}", t.workflows_bucket()),
            format!("KV_{}", t.stats_bucket()),
            format!("KV_{}", t.unique_bucket()),
            format!("KV_{}", t.batches_bucket()),
            format!("KV_{}", t.coordinator_bucket()),
            t.events_stream(),
            t.timers_stream(),
            t.dead_letter_stream(),
        ];
        streams.extend(leader::FINISHED_STATES.map(|state| t.finished_stream(state)));
        while let Some(name) = names.next().await {
            let name = name.map_err(backend("listing streams"))?;
            if name.starts_with(&t.queue_stream_prefix())
                || name.starts_with(&t.rate_stream_prefix())
                || name.starts_with(&t.slot_stream_prefix())
                || name.starts_with(&t.depth_stream_prefix())
            {
                streams.push(name);
            }
        }
        for name in streams {
            let stream = self
                .inner
                .js
                .get_stream(&name)
                .await
                .map_err(backend("finding a stream to purge"))?;
            stream.purge().await.map_err(backend("purging a stream"))?;
        }
        self.stats().restart_counting().await?;
        self.inner.queues.registry.clear();
        self.inner.cron.mirror.clear();
        self.inner.workers.mirror.clear();
        self.inner
            .client
            .publish(t.reset_subject(), bytes::Bytes::new())
            .await
            .map_err(backend("announcing the reset"))?;
        info!(namespace = %t.namespace, "all OJS data was reset");
        Ok(())
    }
}

/// Creates a stream, or updates it to `config` if it exists.
pub(crate) async fn ensure_stream(
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

async fn ensure_bucket(
    js: &jetstream::Context,
    topology: &Topology,
    bucket: &str,
    history: i64,
    max_age: Duration,
) -> Result<kv::Store, OjsError> {
    ensure_stream(js, topology.bucket_stream(bucket, history, max_age)).await?;
    js.get_key_value(bucket)
        .await
        .map_err(backend("opening a bucket"))
}
