//! Queue registry: which queues exist, which priorities are in use in each (one pull
//! consumer per priority) and whether a queue is paused. Kept in the queues bucket, mirrored
//! in memory by a watch so FETCH needs no lookup on its hot path.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{pull, PullConsumer};
use async_nats::jetstream::{self, kv};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use super::puller::Puller;
use crate::domain::backpressure::Bound;
use crate::domain::error::OjsError;
use crate::domain::lanes::{self, LaneLimits};
use crate::domain::rate_limit::{LimitOverride, Limits, RateLimit};
use crate::domain::time;
use crate::store::cas::{self, Replica};
use crate::store::deadline::{self, answered};
use crate::store::error::backend;
use crate::store::mirror::Mirror;
use crate::store::topology::{encode_queue, Topology};

/// How long a FETCH waits for a new lane's consumer before it passes the lane over (and
/// looks again after [`LANE_RETRY`]): an election of NATS's meta leader can outlast it.
pub const LANE_PATIENCE: Duration = Duration::from_secs(2);
/// When a FETCH that passed a lane over looks at it again.
pub const LANE_RETRY: Duration = Duration::from_millis(500);

/// A queue's entry in the queues bucket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueMeta {
    pub name: String,
    /// Priorities in use, highest first: each a lane whose consumer the first FETCH of it
    /// makes.
    pub priorities: Vec<i32>,
    #[serde(default)]
    pub paused: bool,
    /// When the pause in force began.
    #[serde(
        default,
        with = "time::opt_millis",
        skip_serializing_if = "Option::is_none"
    )]
    pub paused_at: Option<DateTime<Utc>>,
    /// When the last resume happened, while not paused.
    #[serde(
        default,
        with = "time::opt_millis",
        skip_serializing_if = "Option::is_none"
    )]
    pub resumed_at: Option<DateTime<Utc>>,
    /// Starts allowed per window, across every replica (`rate_limit.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimit>,
    /// Jobs allowed active at once, across every replica (`rate_limit.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u64>,
    /// Most unfinished jobs, across every replica (`backpressure.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound: Option<Bound>,
    /// An operator's limits in force instead of `rate_limit` and `concurrency` until it
    /// expires (`PUT /rate-limits/{key}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_override: Option<LimitOverride>,
    /// When an operator deleted the queue (`DELETE /queues/{name}`): no longer listed, its
    /// entry removed by the leader once no job can still be on its way; any other write
    /// of the entry (a PUSH, a pause) brings the queue back.
    #[serde(
        default,
        with = "time::opt_millis",
        skip_serializing_if = "Option::is_none"
    )]
    pub deleted_at: Option<DateTime<Utc>>,
    #[serde(with = "time::millis")]
    pub created_at: DateTime<Utc>,
}

impl QueueMeta {
    /// The queue's own limits, as jobs and its configuration set them.
    pub fn own_limits(&self) -> Limits {
        Limits {
            rate: self.rate_limit,
            concurrency: self.concurrency,
        }
    }

    /// The override in force at `now`, if any.
    pub fn override_at(&self, now: DateTime<Utc>) -> Option<LimitOverride> {
        self.limit_override.filter(|o| o.in_force(now))
    }

    /// The limits in force at `now`: the override's where it names them.
    pub fn limits(&self, now: DateTime<Utc>) -> Limits {
        let own = self.own_limits();
        self.override_at(now).map_or(own, |o| o.over(own))
    }

    /// Whether FETCH leaves the queue's jobs waiting at `now`: paused, or an override's
    /// zero.
    pub fn held(&self, now: DateTime<Utc>) -> bool {
        self.paused || self.limits(now).hold()
    }

    /// When the pause or resume in force happened (the creation for a queue never paused).
    pub fn status_since(&self) -> DateTime<Utc> {
        self.paused_at
            .or(self.resumed_at)
            .unwrap_or(self.created_at)
    }

    /// The entry of a queue registered now, with no lane yet.
    fn new(name: &str, now: DateTime<Utc>) -> QueueMeta {
        QueueMeta {
            name: name.to_owned(),
            priorities: Vec::new(),
            paused: false,
            paused_at: None,
            resumed_at: None,
            rate_limit: None,
            concurrency: None,
            bound: None,
            limit_override: None,
            deleted_at: None,
            created_at: now,
        }
    }
}

#[derive(Clone)]
pub struct QueueRegistry {
    inner: Arc<Registry>,
}

struct Registry {
    js: jetstream::Context,
    topology: Topology,
    kv: kv::Store,
    /// The queues bucket, keyed by encoded queue name.
    queues: Arc<Mirror<QueueMeta>>,
    pullers: tokio::sync::Mutex<Pullers>,
    /// How many pull loops are open, readable without the lock (for `/metrics`).
    pullers_open: AtomicUsize,
    limits: LaneLimits,
}

/// This gateway's pull loops by lane, each with when a FETCH last asked for it. A loop
/// nobody asked for in `idle` is dropped: lanes are bounded by the lane limits, but a
/// gateway need not keep two subscriptions and a task for every lane it ever served.
struct Pullers {
    lanes: HashMap<(String, i32), (Puller, Instant)>,
    idle: Duration,
    swept: Instant,
}

impl Pullers {
    /// Drops the loops idle for `idle`, looking at most every quarter of it.
    fn evict_idle(&mut self, now: Instant) {
        if now.duration_since(self.swept) < self.idle / 4 {
            return;
        }
        self.swept = now;
        let idle = self.idle;
        self.lanes
            .retain(|_, (_, used)| now.duration_since(*used) < idle);
    }
}

impl QueueRegistry {
    /// Loads the registry and keeps it current with the bucket and the reset announcement.
    pub async fn start(
        client: async_nats::Client,
        js: jetstream::Context,
        topology: Topology,
        kv: kv::Store,
        limits: LaneLimits,
        idle_puller: Duration,
    ) -> Result<QueueRegistry, OjsError> {
        let queues = Mirror::start(&kv, &client, topology.reset_subject()).await?;
        Ok(QueueRegistry {
            inner: Arc::new(Registry {
                js,
                topology,
                kv,
                queues,
                pullers: tokio::sync::Mutex::new(Pullers {
                    lanes: HashMap::new(),
                    idle: idle_puller,
                    swept: Instant::now(),
                }),
                pullers_open: AtomicUsize::new(0),
                limits,
            }),
        })
    }

    /// Forgets everything cached (after a reset).
    pub fn clear(&self) {
        self.inner.queues.clear();
    }

    /// Completes when the registry learns of a queue or priority (or forgets them): what a
    /// FETCH waiting for a queue that does not exist yet waits for.
    pub fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.inner.queues.changed()
    }

    /// The queue's entry: from memory, else from the bucket.
    pub async fn lookup(&self, queue: &str) -> Result<Option<QueueMeta>, OjsError> {
        let key = encode_queue(queue);
        if let Some(meta) = self.inner.queues.get(&key) {
            return Ok(Some(meta));
        }
        let current =
            cas::read::<QueueMeta>(&self.inner.kv, &key, Replica::Nearest, "queue").await?;
        let meta = current.value;
        if let Some(meta) = &meta {
            self.inner
                .queues
                .remember(&key, current.revision, Some(meta.clone()));
        }
        Ok(meta)
    }

    /// Refuses lanes that would take the registry past its limits (`lanes::admit`), before
    /// anything is created. Lanes already known cost one map lookup each. The count is this
    /// replica's view of the bucket: PUSHes creating queues through several replicas at the
    /// same instant can pass it by at most their number.
    ///
    /// # Errors
    /// 400 naming the limit.
    pub fn admit<'a>(
        &self,
        lanes: impl Iterator<Item = (&'a str, i32)> + Clone,
    ) -> Result<(), OjsError> {
        let mirror = &self.inner.queues;
        let known = |(queue, priority): (&str, i32)| {
            mirror
                .with(&encode_queue(queue), |m| m.priorities.contains(&priority))
                .unwrap_or(false)
        };
        if lanes.clone().all(known) {
            return Ok(());
        }
        let in_use = |queue: &str| mirror.get(&encode_queue(queue)).map(|m| m.priorities);
        lanes::admit(lanes, in_use, mirror.values().len(), self.inner.limits)
    }

    /// Every registered queue, by name (this replica's copy of the bucket, at most
    /// `max_queues` entries).
    pub fn list(&self) -> Vec<QueueMeta> {
        let mut queues = self.inner.queues.values();
        queues.retain(|m| m.deleted_at.is_none());
        queues.sort_by(|a, b| a.name.cmp(&b.name));
        queues
    }

    /// Every deleted queue whose entry is still kept, with when it was deleted.
    pub fn deleted(&self) -> Vec<(String, DateTime<Utc>)> {
        self.inner
            .queues
            .values()
            .into_iter()
            .filter_map(|m| Some((m.name, m.deleted_at?)))
            .collect()
    }

    /// Deletes `queue` (the caller found it holding no job): its entry is marked, so it is
    /// no longer listed, while a FETCH still serves a job that a PUSH which read the entry
    /// before may yet publish.
    ///
    /// # Errors
    /// 404 for a queue not registered; 409/503 when the entry kept changing.
    pub async fn delete(&self, queue: &str, now: DateTime<Utc>) -> Result<(), OjsError> {
        if self
            .lookup(queue)
            .await?
            .is_none_or(|m| m.deleted_at.is_some())
        {
            return Err(OjsError::not_found("queue", queue));
        }
        let reg = &self.inner;
        let key = encode_queue(queue);
        let written = cas::change(
            &reg.kv,
            &key,
            "queue",
            queue,
            |current: Option<&QueueMeta>| {
                let mut meta = current?.clone();
                meta.deleted_at.get_or_insert(now);
                Some(meta)
            },
        )
        .await?;
        reg.queues.remember(&key, written.revision, written.value);
        Ok(())
    }

    /// Leader: removes the entry of `queue`, deleted before `before`, when its stream holds
    /// no message; one that received a job after all is brought back. Whether the entry
    /// is gone. A write of the entry meanwhile (a PUSH reviving it) makes the removal a
    /// no-op by its revision check.
    ///
    /// # Errors
    /// When NATS fails; the next round repeats it.
    pub async fn remove_deleted(
        &self,
        queue: &str,
        before: DateTime<Utc>,
    ) -> Result<bool, OjsError> {
        let reg = &self.inner;
        let key = encode_queue(queue);
        let current = cas::read::<QueueMeta>(&reg.kv, &key, Replica::Leader, "queue").await?;
        let Some(meta) = current.value else {
            return Ok(true);
        };
        if meta.deleted_at.is_none_or(|at| at >= before) {
            return Ok(false);
        }
        // A queue that never had a lane has no stream (registered by a pause).
        let waiting = if meta.priorities.is_empty() {
            0
        } else {
            let doing = "reading a deleted queue's stream";
            let name = reg.topology.queue_stream(queue);
            answered(doing, || reg.js.get_stream(&name))
                .await?
                .said
                .map_err(backend(doing))?
                .cached_info()
                .state
                .messages
        };
        if waiting > 0 {
            self.change_entry(queue, Utc::now(), |_| true).await?;
            return Ok(false);
        }
        // A delete marker, not a purge: the replicas' watches see it (architecture §2).
        Ok(reg
            .kv
            .delete_expect_revision(&key, Some(current.revision))
            .await
            .is_ok())
    }

    /// Whether this replica's copy of the registry has `queue` held at `now` (paused, or
    /// an override's zero). A message a long-polling FETCH receives is checked against it,
    /// so a pause stops FETCHes that were already waiting too.
    pub fn is_held(&self, queue: &str, now: DateTime<Utc>) -> bool {
        self.inner
            .queues
            .with(&encode_queue(queue), |m| m.held(now))
            .unwrap_or(false)
    }

    /// The limits in force for `queue` at `now` as this replica knows them.
    pub fn limits(&self, queue: &str, now: DateTime<Utc>) -> Limits {
        self.inner
            .queues
            .with(&encode_queue(queue), |m| m.limits(now))
            .unwrap_or_default()
    }

    /// The queue's own limits (without an override) as this replica knows them.
    pub fn own_limits(&self, queue: &str) -> Limits {
        self.inner
            .queues
            .with(&encode_queue(queue), QueueMeta::own_limits)
            .unwrap_or_default()
    }

    /// Makes the limits `wanted` names the queue's (their token streams must exist
    /// already); a limit it does not name stays. The queue is registered (PUSH admitted
    /// it) before.
    ///
    /// # Errors
    /// 409/503 when the entry kept changing; `backend_error`.
    pub async fn set_limits(
        &self,
        queue: &str,
        wanted: Limits,
        now: DateTime<Utc>,
    ) -> Result<(), OjsError> {
        self.change_entry(queue, now, |meta| {
            let before = meta.own_limits();
            meta.rate_limit = wanted.rate.or(meta.rate_limit);
            meta.concurrency = wanted.concurrency.or(meta.concurrency);
            meta.own_limits() != before
        })
        .await
        .map(drop)
    }

    /// Makes `set` the queue's override (`None` removes it). Removing ends only the
    /// override set at `set_at` when one is named: a newer one stays. The queue must be
    /// registered.
    ///
    /// # Errors
    /// 404 for a queue not registered; 409/503 when the entry kept changing;
    /// `backend_error`.
    pub async fn set_override(
        &self,
        queue: &str,
        set: Option<LimitOverride>,
        set_at: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> Result<QueueMeta, OjsError> {
        if self.lookup(queue).await?.is_none() {
            return Err(OjsError::not_found("queue", queue));
        }
        self.change_entry(queue, now, |meta| {
            let before = meta.limit_override;
            let ends_another =
                set.is_none() && set_at.is_some_and(|at| before.is_some_and(|o| o.set_at != at));
            if !ends_another {
                meta.limit_override = set;
            }
            meta.limit_override != before
        })
        .await
        .map(|(meta, _)| meta)
    }

    /// Every queue with an override, expired or not, as this replica knows them.
    pub fn overridden(&self) -> Vec<(String, LimitOverride)> {
        self.list()
            .into_iter()
            .filter_map(|m| Some((m.name, m.limit_override?)))
            .collect()
    }

    /// Refuses to register `queue` when it is new and `max_queues` are registered (pause,
    /// resume and configuration register a queue never seen). This replica's view, as for
    /// PUSH (`admit`).
    ///
    /// # Errors
    /// 400 naming the limit.
    pub fn admit_new(&self, queue: &str) -> Result<(), OjsError> {
        let reg = &self.inner;
        if !reg.queues.contains(&encode_queue(queue)) {
            lanes::admit_queues(reg.queues.values().len() + 1, reg.limits)?;
        }
        Ok(())
    }

    /// The queue's bound, from memory.
    pub fn bound(&self, queue: &str) -> Option<Bound> {
        self.inner
            .queues
            .with(&encode_queue(queue), |m| m.bound)
            .flatten()
    }

    /// Makes `bound` the queue's (its depth stream must exist already), or unbounds it.
    ///
    /// # Errors
    /// 409/503 when the entry kept changing; `backend_error`.
    pub async fn set_bound(
        &self,
        queue: &str,
        bound: Option<Bound>,
        now: DateTime<Utc>,
    ) -> Result<(), OjsError> {
        self.change_entry(queue, now, |meta| {
            let changed = meta.bound != bound;
            meta.bound = bound;
            changed
        })
        .await
        .map(drop)
    }

    /// Every bounded queue with its bound, as this replica knows them, by name.
    pub fn bounded(&self) -> Vec<(String, Bound)> {
        let mut bounded: Vec<(String, Bound)> = self
            .list()
            .into_iter()
            .filter_map(|m| Some((m.name, m.bound?)))
            .collect();
        bounded.sort_by(|a, b| a.0.cmp(&b.0));
        bounded
    }

    /// Every queue with a concurrency limit, its own or an override's, as this replica
    /// knows them.
    pub fn concurrency_limited(&self) -> Vec<String> {
        self.list()
            .into_iter()
            .filter(|m| {
                m.concurrency.is_some() || m.limit_override.is_some_and(|o| o.concurrency.is_some())
            })
            .map(|m| m.name)
            .collect()
    }

    /// Pauses or resumes `queue` (queue-ops: a queue never seen is registered, within
    /// `max_queues`). Gives the entry in force and its revision; every replica's FETCH
    /// follows the entry through its watch.
    ///
    /// # Errors
    /// 400 past `max_queues`; 409/503 when the entry kept changing; `backend_error`.
    pub async fn set_paused(
        &self,
        queue: &str,
        paused: bool,
        now: DateTime<Utc>,
    ) -> Result<(QueueMeta, u64), OjsError> {
        self.admit_new(queue)?;
        self.change_entry(queue, now, |meta| {
            if meta.paused == paused {
                return false;
            }
            meta.paused = paused;
            meta.paused_at = paused.then_some(now);
            meta.resumed_at = (!paused).then_some(now);
            true
        })
        .await
    }

    /// Read, change, write of the queue's entry (one created for a queue never seen):
    /// `change` edits it and says whether it changed anything; nothing is written when it
    /// did not. Gives the entry in force and its revision, and this replica's copy has it
    /// at once.
    async fn change_entry(
        &self,
        queue: &str,
        now: DateTime<Utc>,
        mut change: impl FnMut(&mut QueueMeta) -> bool,
    ) -> Result<(QueueMeta, u64), OjsError> {
        let reg = &self.inner;
        let key = encode_queue(queue);
        let written = cas::change(
            &reg.kv,
            &key,
            "queue",
            queue,
            |current: Option<&QueueMeta>| {
                let mut meta = current
                    .cloned()
                    .unwrap_or_else(|| QueueMeta::new(queue, now));
                // Any write brings a deleted queue back: it is in use again.
                let revived = meta.deleted_at.take().is_some();
                (change(&mut meta) || revived || current.is_none()).then_some(meta)
            },
        )
        .await?;
        reg.queues
            .remember(&key, written.revision, written.value.clone());
        let meta = written
            .value
            .ok_or_else(|| OjsError::backend(format!("Queue {queue} vanished while written.")))?;
        Ok((meta, written.revision))
    }

    /// Makes sure the queue's stream exists and that the registry lists `priority`, before
    /// any message with that priority is published. A queue listing any priority has its
    /// stream (made sure of before the first one was listed; streams are never removed). The
    /// lane's consumer is made by the first FETCH of it ([`Self::puller`]): the work-queue
    /// stream keeps a message until a consumer acknowledges it, so a PUSH never waits for
    /// NATS's meta leader to create one.
    pub async fn ensure(
        &self,
        queue: &str,
        priority: i32,
        now: DateTime<Utc>,
    ) -> Result<(), OjsError> {
        let key = encode_queue(queue);
        let known = self.inner.queues.with(&key, |m| {
            (
                m.priorities.contains(&priority) && m.deleted_at.is_none(),
                !m.priorities.is_empty(),
            )
        });
        if known.is_some_and(|(registered, _)| registered) {
            return Ok(());
        }
        if known.is_none_or(|(_, has_lanes)| !has_lanes) {
            let config = self.inner.topology.queue_stream_config(queue);
            crate::store::connection::ensure_stream(&self.inner.js, config).await?;
        }
        self.change_entry(queue, now, |meta| {
            if meta.priorities.contains(&priority) {
                return false; // another replica registered it meanwhile
            }
            meta.priorities.push(priority);
            meta.priorities.sort_unstable_by(|a, b| b.cmp(a));
            true
        })
        .await
        .map(drop)
    }

    /// The pull loop of one priority of a queue, started on first use, with the lane's
    /// consumer ([`Self::open_lane`]); loops idle for `idle_puller_ms` are dropped on the
    /// way. The lock is not held while NATS is asked anything, so a slow start of one lane
    /// never holds up FETCHes of the others. `None` while the lane cannot be opened: its
    /// jobs wait in the stream for a later FETCH.
    pub async fn puller(&self, queue: &str, priority: i32) -> Result<Option<Puller>, OjsError> {
        let key = (queue.to_owned(), priority);
        {
            let mut pullers = self.inner.pullers.lock().await;
            let now = Instant::now();
            pullers.evict_idle(now);
            self.inner
                .pullers_open
                .store(pullers.lanes.len(), Ordering::Relaxed);
            if let Some((p, used)) = pullers.lanes.get_mut(&key) {
                *used = now;
                return Ok(Some(p.clone()));
            }
        }
        if !self.open_lane(queue, priority).await {
            return Ok(None);
        }
        let started = Puller::start(
            self.inner.js.clone(),
            &self.inner.topology.queue_stream(queue),
            &Topology::priority_consumer(priority),
        )
        .await
        .map_err(backend("subscribing for a queue"))?;
        let mut pullers = self.inner.pullers.lock().await;
        // Another FETCH may have started the lane meanwhile: theirs is kept, ours ends.
        let (puller, _) = pullers
            .lanes
            .entry(key)
            .or_insert_with(|| (started, Instant::now()));
        let puller = puller.clone();
        self.inner
            .pullers_open
            .store(pullers.lanes.len(), Ordering::Relaxed);
        Ok(Some(puller))
    }

    /// How many pull loops this gateway keeps open.
    pub fn pullers_open(&self) -> usize {
        self.inner.pullers_open.load(Ordering::Relaxed)
    }

    /// Opens the lane's consumer, creating it if no FETCH did before, within
    /// [`LANE_PATIENCE`] (creating one needs NATS's meta leader, which a cluster may be
    /// electing); `false` when NATS did not make it by then (logged at debug: every FETCH
    /// of the lane meets it until the election ends). A consumer made under
    /// another `ack_wait_ms` gets the current one, so a changed setting reaches existing
    /// queues (architecture §2); best effort: the consumer works either way.
    async fn open_lane(&self, queue: &str, priority: i32) -> bool {
        let reg = &self.inner;
        let stream_name = reg.topology.queue_stream(queue);
        let config = reg.topology.priority_consumer_config(queue, priority);
        let name = Topology::priority_consumer(priority);
        let doing = "opening a queue lane";
        let opened = deadline::patient(LANE_PATIENCE, async {
            let stream = reg
                .js
                .get_stream_no_info(&stream_name)
                .await
                .map_err(backend(doing))?;
            answered(doing, || {
                stream.get_or_create_consumer::<pull::Config>(&name, config.clone())
            })
            .await?
            .said
            .map_err(backend(doing))
        })
        .await;
        let consumer: PullConsumer = match opened {
            Ok(consumer) => consumer,
            Err(err) => {
                debug!(queue, priority, error = %err, "a queue lane cannot be opened yet; its jobs wait in the stream");
                return false;
            }
        };
        if consumer.cached_info().config.ack_wait != config.ack_wait {
            if let Err(error) = reg.js.create_consumer_on_stream(config, &stream_name).await {
                warn!(queue, priority, %error, "could not align a priority consumer's ack wait");
            }
        }
        true
    }
}
