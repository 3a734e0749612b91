//! The JetStream layer: the only module that talks to NATS. [`Store`] is a cheap-to-clone
//! connection shared by the HTTP handlers and the coordinator; it hands out one handle per
//! resource (`store.jobs()`, `store.cron()`, …), each owning that resource's buckets and
//! streams, so a call names what it touches. `store.leader()` holds what only the leader
//! services do.

mod cas;
mod connection;
mod cron;
mod dead_letter;
pub mod deadline;
mod error;
mod events;
mod feed;
mod jobs;
mod leader;
mod lease;
mod mirror;
mod publish;
mod queues;
mod schemas;
mod stats;
mod stream_walk;
mod system;
mod timers;
pub mod topology;
mod workers;
mod workflows;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::Config;
use crate::domain::error::OjsError;
use crate::domain::lanes::LaneLimits;
use crate::domain::stats_history::Resolution;
use connection::Connection;

pub use cron::Cron;
pub use dead_letter::{DeadLetter, DeadLetterPage, DeadLetterStats, Entries};
pub use error::backend;
pub use events::{EventFeed, EventPage, EventQuery, Events, FollowFrom, NewestPage};
pub use jobs::enqueue::Enqueued;
pub use jobs::listing::JobPage;
pub use jobs::progress::Reported;
pub use jobs::records::Settled;
pub use jobs::unique::{ended_lock, HeldLock};
pub use jobs::Jobs;
pub use leader::counts::ClusterTotals;
pub use leader::cron::TickOutcome;
pub use leader::job_writes::{JobWrite, JobWrites, LostDeliveries};
pub use leader::pruner::{StoredWrite, WriteBody};
pub use leader::timers::{Firing, PendingTimer, ReadAhead, TimerFeed};
pub use leader::Leader;
pub use lease::{Lease, Leases};
pub use queues::backpressure::Pressure;
pub use queues::rate_limit::LimitUsage;
pub use queues::registry::QueueMeta;
pub use queues::Queues;
pub use schemas::Schemas;
pub use stats::{QueueStats, Stats};
pub use system::System;
pub use timers::{Timer, TimerKind, Timers};
pub use topology::Topology;
pub use workers::{BeatReply, WorkerRecord, WorkerState, Workers};
pub use workflows::{WorkflowView, Workflows};

/// The connection to NATS and every resource's handle, made once at connect; each handle
/// holds the handles of the resources below it that it writes through, so the resources
/// import one way: events, timers, cron, leases, the dead-letter entries; queues; stats;
/// jobs; the dead letter queue, workers and workflows; the leader.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Arc<Connection>,
    jobs: Jobs,
    queues: Queues,
    timers: Timers,
    events: Events,
    workflows: Workflows,
    cron: Cron,
    schemas: Schemas,
    system: System,
    dead_letter: DeadLetter,
    workers: Workers,
    stats: Stats,
    leases: Leases,
    leader: Leader,
}

impl Store {
    /// Connects and sets up the topology, retrying while NATS is not there yet (a cluster
    /// still forming, a server restarting); every failed try is logged with its reason.
    ///
    /// # Errors
    /// When the connection options cannot be made (`connection::options`): a setting to
    /// fix, not worth waiting.
    pub async fn connect(config: &Config) -> Result<Store, OjsError> {
        let options = connection::options(config)
            .await
            .map_err(OjsError::backend)?;
        let mut delay = Duration::from_millis(250);
        loop {
            let opened = match Connection::open(config, options.clone()).await {
                Ok(conn) => Store::open(config, conn).await,
                Err(err) => Err(err),
            };
            match opened {
                Ok(store) => return Ok(store),
                Err(err) => {
                    warn!(error = %err, retry_in_ms = delay.as_millis() as u64, "NATS is not ready");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// Creates or updates every stream, consumer and bucket, and makes the handles.
    /// Idempotent: several replicas may start at once.
    async fn open(cfg: &Config, conn: Connection) -> Result<Store, OjsError> {
        let started = std::time::Instant::now();
        let t = &conn.topology;
        let bucket = |name: String, history, max_age| {
            let conn = &conn;
            async move { conn.ensure_bucket(&name, history, max_age).await }
        };
        let jobs_kv = bucket(t.jobs_bucket(), t.job_history, Duration::ZERO).await?;
        let queues_kv = bucket(t.queues_bucket(), 1, Duration::ZERO).await?;
        let workers_kv = bucket(t.workers_bucket(), 1, Duration::ZERO).await?;
        let cron_kv = bucket(t.cron_bucket(), 1, Duration::ZERO).await?;
        let workflows_kv = bucket(t.workflows_bucket(), 1, Duration::ZERO).await?;
        let stats_kv = bucket(t.stats_bucket(), 1, Duration::ZERO).await?;
        let unique_kv = bucket(t.unique_bucket(), 1, Duration::ZERO).await?;
        // A mark outlives its batch's timer only when no leader ran for a day.
        let batches_kv = bucket(t.batches_bucket(), 1, Duration::from_secs(24 * 3600)).await?;
        let schemas_kv = bucket(t.schemas_bucket(), 1, Duration::ZERO).await?;
        let system_kv = bucket(t.system_bucket(), 1, Duration::ZERO).await?;
        let cron_mirror = mirror::Mirror::start(&cron_kv, &conn.client, t.reset_subject()).await?;
        let system = System {
            own: Arc::new(system::Owned {
                mirror: mirror::Mirror::start(&system_kv, &conn.client, t.reset_subject()).await?,
                kv: system_kv,
            }),
        };
        let schemas_mirror =
            mirror::Mirror::start(&schemas_kv, &conn.client, t.reset_subject()).await?;
        let worker_list =
            mirror::Mirror::start(&workers_kv, &conn.client, t.reset_subject()).await?;
        let handled =
            events::HandledWrites::follow(&conn.client, t.events_handled_subject()).await?;
        let leases_kv = bucket(t.leases_bucket(), 1, t.lease_ttl).await?;
        let coordinator_kv = bucket(t.coordinator_bucket(), 1, Duration::ZERO).await?;
        let events_stream = connection::ensure_stream(&conn.js, t.events_stream_config()).await?;
        connection::ensure_stream(&conn.js, t.timers_stream_config()).await?;
        let dead_letter_stream =
            connection::ensure_stream(&conn.js, t.dead_letter_stream_config()).await?;
        for resolution in [Resolution::Minutes, Resolution::Hours] {
            connection::ensure_stream(&conn.js, t.stats_history_stream_config(resolution)).await?;
        }
        let finished = leader::finished_index::FinishedIndex::ensure(&conn.js, t).await?;
        let registry = queues::registry::QueueRegistry::start(
            conn.client.clone(),
            conn.js.clone(),
            t.clone(),
            queues_kv,
            LaneLimits {
                max_queues: cfg.max_queues,
                max_priorities_per_queue: cfg.max_priorities_per_queue,
            },
            Duration::from_millis(cfg.idle_puller_ms),
        )
        .await?;
        info!(elapsed_ms = started.elapsed().as_millis() as u64, namespace = %t.namespace, "JetStream topology ready");

        // The handles, bottom up: each is given the ones below it that it uses.
        let conn = Arc::new(conn);
        let events = Events {
            conn: conn.clone(),
            own: Arc::new(events::Owned {
                stream: events_stream,
                handled,
            }),
        };
        let timers = Timers {
            conn: conn.clone(),
            own: Arc::new(timers::Owned {
                count: timers::TimerCount::default(),
            }),
        };
        let cron = Cron {
            conn: conn.clone(),
            own: Arc::new(cron::Owned {
                kv: cron_kv,
                mirror: cron_mirror,
            }),
        };
        let schemas = Schemas {
            own: Arc::new(schemas::Owned {
                kv: schemas_kv,
                mirror: schemas_mirror,
                compiled: Default::default(),
            }),
        };
        let leases = Leases {
            conn: conn.clone(),
            own: Arc::new(lease::Owned { kv: leases_kv }),
        };
        let entries = Entries {
            conn: conn.clone(),
            own: Arc::new(dead_letter::Owned {
                stream: dead_letter_stream,
            }),
        };
        let queues = Queues {
            conn: conn.clone(),
            own: Arc::new(queues::Owned {
                registry,
                depths: queues::DepthCache::default(),
            }),
            events: events.clone(),
        };
        let stats = Stats {
            conn: conn.clone(),
            own: Arc::new(stats::Owned {
                kv: stats_kv,
                jobs_stream: jobs_kv.stream.clone(),
            }),
            queues: queues.clone(),
            dead_letter: entries.clone(),
        };
        let jobs = Jobs {
            conn: conn.clone(),
            own: Arc::new(jobs::Owned::new(jobs_kv, unique_kv, batches_kv)),
            queues: queues.clone(),
            timers: timers.clone(),
            events: events.clone(),
            dead_letter: entries.clone(),
            stats: stats.clone(),
            schemas: schemas.clone(),
            system: system.clone(),
        };
        let dead_letter = DeadLetter {
            conn: conn.clone(),
            entries,
            jobs: jobs.clone(),
        };
        let workers = Workers {
            conn: conn.clone(),
            own: Arc::new(workers::Owned {
                kv: workers_kv,
                mirror: worker_list,
            }),
            jobs: jobs.clone(),
            timers: timers.clone(),
        };
        let workflows = Workflows {
            conn: conn.clone(),
            own: Arc::new(workflows::Owned { kv: workflows_kv }),
            jobs: jobs.clone(),
            events: events.clone(),
            timers: timers.clone(),
        };
        let leader = Leader {
            conn: conn.clone(),
            own: Arc::new(leader::Owned {
                kv: coordinator_kv,
                finished,
                counts_written: Default::default(),
            }),
            jobs: jobs.clone(),
            queues: queues.clone(),
            events: events.clone(),
            timers: timers.clone(),
            workers: workers.clone(),
            workflows: workflows.clone(),
            cron: cron.clone(),
            stats: stats.clone(),
        };
        Ok(Store {
            inner: Arc::new(Inner {
                conn,
                jobs,
                queues,
                timers,
                events,
                workflows,
                cron,
                schemas,
                system,
                dead_letter,
                workers,
                stats,
                leases,
                leader,
            }),
        })
    }

    pub fn jobs(&self) -> &Jobs {
        &self.inner.jobs
    }

    pub fn queues(&self) -> &Queues {
        &self.inner.queues
    }

    pub fn timers(&self) -> &Timers {
        &self.inner.timers
    }

    pub fn events(&self) -> &Events {
        &self.inner.events
    }

    pub fn workflows(&self) -> &Workflows {
        &self.inner.workflows
    }

    pub fn cron(&self) -> &Cron {
        &self.inner.cron
    }

    pub fn schemas(&self) -> &Schemas {
        &self.inner.schemas
    }

    pub fn system(&self) -> &System {
        &self.inner.system
    }

    pub fn dead_letter(&self) -> &DeadLetter {
        &self.inner.dead_letter
    }

    pub fn workers(&self) -> &Workers {
        &self.inner.workers
    }

    pub fn stats(&self) -> &Stats {
        &self.inner.stats
    }

    pub fn leases(&self) -> &Leases {
        &self.inner.leases
    }

    pub fn leader(&self) -> &Leader {
        &self.inner.leader
    }

    /// Whether the leader logs each job transition.
    pub fn log_job_transitions(&self) -> bool {
        self.inner.conn.log_job_transitions
    }

    /// Cancelled when the gateway begins to shut down: live event streams end with it.
    pub fn shutting_down(&self) -> CancellationToken {
        self.inner.conn.stop_waiting.clone()
    }

    pub fn topology(&self) -> &Topology {
        &self.inner.conn.topology
    }

    /// The execution timeout of jobs that set none.
    pub fn execution_timeout(&self) -> Duration {
        self.inner.conn.execution_timeout
    }

    /// The version the NATS server announced, e.g. `2.10.22`.
    pub fn nats_version(&self) -> String {
        self.inner.conn.client.server_info().version
    }

    /// How many queue lanes this gateway keeps a pull loop open for.
    pub fn pullers_open(&self) -> usize {
        self.inner.queues.own.registry.pullers_open()
    }

    /// How long finished jobs are kept; `None`: for good.
    pub fn finished_jobs_max_age(&self) -> Option<Duration> {
        self.inner.conn.finished_jobs_max_age
    }

    /// Fails or waits here if the test set the failpoint `name` (`failpoint.rs`).
    pub async fn failpoint(&self, name: &str) {
        self.inner.conn.failpoint(name).await;
    }

    /// The largest job PUSH accepts: the record limit less the room a record may grow by
    /// after PUSH (`lifecycle::RECORD_HEADROOM`).
    pub fn max_job_bytes(&self) -> usize {
        self.inner.conn.max_job_bytes()
    }

    /// Round trip to the NATS server, for health checks.
    ///
    /// # Errors
    /// When the connection is down or the server does not answer in time.
    pub async fn ping(&self) -> Result<Duration, OjsError> {
        self.inner.conn.ping().await
    }

    /// Wipes all OJS data of this namespace (conformance runs) and tells every replica.
    ///
    /// # Errors
    /// When a purge fails.
    pub async fn reset(&self) -> Result<(), OjsError> {
        let conn = &self.inner.conn;
        let t = &conn.topology;
        let mut names = conn.js.stream_names();
        let mut streams = vec![
            format!("KV_{}", t.jobs_bucket()),
            format!("KV_{}", t.queues_bucket()),
            format!("KV_{}", t.workers_bucket()),
            format!("KV_{}", t.cron_bucket()),
            format!("KV_{}", t.schemas_bucket()),
            format!("KV_{}", t.system_bucket()),
            format!("KV_{}", t.workflows_bucket()),
            format!("KV_{}", t.stats_bucket()),
            format!("KV_{}", t.unique_bucket()),
            format!("KV_{}", t.batches_bucket()),
            format!("KV_{}", t.coordinator_bucket()),
            t.events_stream(),
            t.timers_stream(),
            t.dead_letter_stream(),
            t.stats_history_stream(Resolution::Minutes),
            t.stats_history_stream(Resolution::Hours),
        ];
        streams
            .extend(leader::finished_index::FINISHED_STATES.map(|state| t.finished_stream(state)));
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
            let stream = conn
                .js
                .get_stream(&name)
                .await
                .map_err(backend("finding a stream to purge"))?;
            stream.purge().await.map_err(backend("purging a stream"))?;
        }
        self.leader().restart_counting().await?;
        self.inner.queues.own.registry.clear();
        self.inner.cron.own.mirror.clear();
        self.inner.workers.own.mirror.clear();
        conn.client
            .publish(t.reset_subject(), bytes::Bytes::new())
            .await
            .map_err(backend("announcing the reset"))?;
        info!(namespace = %t.namespace, "all OJS data was reset");
        Ok(())
    }
}
