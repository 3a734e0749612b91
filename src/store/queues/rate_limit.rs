//! Queue rate limits (docs/architecture.md §3.19). A rate-limited queue has a token stream
//! in NATS: every job start publishes one message to the subject of its window, and NATS
//! refuses the message once that subject holds `limit` of them (discard new per subject).
//! So the limit holds across every replica with one publish per start and nothing to
//! coordinate; queues without a limit never touch it. A concurrency limit works alike: a
//! job's start stores a message (NATS refuses it once the queue holds `concurrency`), and
//! the job's end deletes it; the leader frees places whose job died with them.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::Queues;
use crate::domain::error::OjsError;
use crate::domain::job::JobRecord;
use crate::domain::rate_limit::{LimitOverride, Limits, RateLimit};
use crate::store::connection::ensure_stream;
use crate::store::deadline::{answered, by_deadline};
use crate::store::error::{already_deleted, backend};

/// A running place of a concurrency-limited queue: the job and dispatch that took it.
#[derive(Serialize, Deserialize)]
pub(in crate::store) struct Slot {
    pub(in crate::store) id: String,
    pub(in crate::store) dispatch: u64,
}

/// A queue's limits and how much of them is in use now.
#[derive(Debug, Clone, Copy)]
pub struct LimitUsage {
    /// The limits in force.
    pub limits: Limits,
    /// The operator's override among them, if any.
    pub overridden: Option<LimitOverride>,
    /// Running places taken (of `limits.concurrency`).
    pub active: u64,
    /// Starts spent in the current window (of `limits.rate`).
    pub started: u64,
    /// When the current window ends, Unix milliseconds.
    pub window_ends_ms: i64,
}

impl Queues {
    /// PUSH: makes each job's `rate_limit` its queue's before any of its messages exist —
    /// the token streams first, then the registry entry every replica's FETCH follows. A
    /// limit already in force costs a map lookup.
    ///
    /// # Errors
    /// As the checks of `Limits::parse`; `backend_error` when NATS fails.
    pub(in crate::store) async fn ensure_rate_limits(
        &self,
        records: &[JobRecord],
        now: DateTime<Utc>,
    ) -> Result<(), OjsError> {
        let mut wanted: BTreeMap<&str, Limits> = BTreeMap::new();
        for rec in records {
            if let Some(raw) = &rec.job.rate_limit {
                wanted.insert(&rec.job.queue, Limits::parse(raw, &rec.job.queue)?);
            }
        }
        for (queue, limits) in wanted {
            self.apply_limits(queue, limits, now).await?;
        }
        Ok(())
    }

    /// An operator's queue configuration (admin spec §6.6): the limits become the queue's
    /// as a job's `rate_limit` makes them. A queue never seen is registered, so a queue can
    /// be configured before its first job.
    ///
    /// # Errors
    /// 400 past `max_queues`; `backend_error` when NATS fails.
    pub async fn configure_queue(&self, queue: &str, limits: Limits) -> Result<(), OjsError> {
        self.own.registry.admit_new(queue)?;
        self.apply_limits(queue, limits, Utc::now()).await
    }

    /// The token streams of the limits that change first, then the registry entry every
    /// replica's FETCH follows; a limit already in force costs a map lookup. A stream whose
    /// limit an override rules keeps the override's until it ends (`end_override`).
    async fn apply_limits(
        &self,
        queue: &str,
        limits: Limits,
        now: DateTime<Utc>,
    ) -> Result<(), OjsError> {
        let registry = &self.own.registry;
        let current = registry.own_limits(queue);
        let rate = limits.rate.filter(|r| current.rate != Some(*r));
        let concurrency = limits
            .concurrency
            .filter(|c| current.concurrency != Some(*c));
        if rate.is_none() && concurrency.is_none() {
            return Ok(());
        }
        let overridden = registry
            .lookup(queue)
            .await?
            .and_then(|m| m.override_at(now));
        self.size_streams(
            queue,
            Limits {
                rate: rate.filter(|_| overridden.is_none_or(|o| o.rate.is_none())),
                concurrency: concurrency
                    .filter(|_| overridden.is_none_or(|o| o.concurrency.is_none())),
            },
        )
        .await?;
        registry.set_limits(queue, limits, now).await
    }

    /// Makes the token streams of the limits `limits` names hold those limits; a zero
    /// needs no stream (FETCH starts none).
    async fn size_streams(&self, queue: &str, limits: Limits) -> Result<(), OjsError> {
        let t = &self.conn.topology;
        if let Some(rate) = limits.rate.filter(|r| r.limit > 0) {
            ensure_stream(&self.conn.js, t.rate_stream_config(queue, rate)).await?;
        }
        if let Some(concurrency) = limits.concurrency.filter(|c| *c > 0) {
            ensure_stream(&self.conn.js, t.slot_stream_config(queue, concurrency)).await?;
        }
        Ok(())
    }

    /// An operator's override of `queue`'s limits (rate-limiting spec §10.2): the registry
    /// entry first, which every replica's FETCH follows from then, then the token streams
    /// at the override's limits. A crash between leaves the streams to the leader's upkeep
    /// (`keep_override`).
    ///
    /// # Errors
    /// 404 for a queue never seen; `backend_error` when NATS fails.
    pub async fn override_limits(&self, queue: &str, set: LimitOverride) -> Result<(), OjsError> {
        self.own
            .registry
            .set_override(queue, Some(set), None, set.set_at)
            .await?;
        self.keep_override(queue, set).await
    }

    /// The token streams of an override in force, at its limits (idempotent).
    ///
    /// # Errors
    /// `backend_error` when NATS fails.
    pub(in crate::store) async fn keep_override(
        &self,
        queue: &str,
        set: LimitOverride,
    ) -> Result<(), OjsError> {
        self.size_streams(queue, set.over(Limits::default())).await
    }

    /// Ends `queue`'s override — only the one set at `set_at` when that is named (its
    /// expiry): the token streams back at the queue's own limits first, then the registry
    /// entry without it. A crash between leaves the override in the entry: removing it
    /// again, or its expiry, ends it. Whether it ended one.
    ///
    /// # Errors
    /// 404 for a queue never seen; `backend_error` when NATS fails.
    pub async fn end_override(
        &self,
        queue: &str,
        set_at: Option<DateTime<Utc>>,
    ) -> Result<bool, OjsError> {
        let registry = &self.own.registry;
        let meta = registry
            .lookup(queue)
            .await?
            .ok_or_else(|| OjsError::not_found("queue", queue))?;
        let Some(set) = meta
            .limit_override
            .filter(|o| set_at.is_none_or(|at| o.set_at == at))
        else {
            return Ok(false);
        };
        let own = meta.own_limits();
        self.size_streams(
            queue,
            Limits {
                rate: own.rate.filter(|_| set.rate.is_some()),
                concurrency: own.concurrency.filter(|_| set.concurrency.is_some()),
            },
        )
        .await?;
        let now = registry
            .set_override(queue, None, Some(set.set_at), Utc::now())
            .await?;
        // A newer override set meanwhile stays (and shows in the answer).
        Ok(now.limit_override.is_none_or(|o| o.set_at != set.set_at))
    }

    /// Where a queue's limits stand (rate-limiting spec §10.1): places taken of its
    /// concurrency limit, starts spent in the current window. `None` for a queue without
    /// limits. One stream info per limit.
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn limit_usage(&self, queue: &str) -> Result<Option<LimitUsage>, OjsError> {
        let now = Utc::now();
        let Some(meta) = self.own.registry.lookup(queue).await? else {
            return Ok(None);
        };
        let limits = meta.limits(now);
        if !limits.any() {
            return Ok(None);
        }
        let t = &self.conn.topology;
        let doing = "reading a queue's limits";
        let mut usage = LimitUsage {
            limits,
            overridden: meta.override_at(now),
            active: 0,
            started: 0,
            window_ends_ms: 0,
        };
        // An override's zero needs no stream: read one only where it exists.
        let own = meta.own_limits();
        if limits
            .concurrency
            .is_some_and(|c| c > 0 || own.concurrency.is_some())
        {
            let name = t.slot_stream(queue);
            let stream = answered(doing, || self.conn.js.get_stream(&name))
                .await?
                .said
                .map_err(backend(doing))?;
            usage.active = stream.cached_info().state.messages;
        }
        if let Some(rate) = limits.rate.filter(|r| r.limit > 0 || own.rate.is_some()) {
            let window = rate.window_index(now.timestamp_millis());
            let subject = t.rate_subject(queue, window);
            let name = t.rate_stream(queue);
            let stream = answered(doing, || self.conn.js.get_stream(&name))
                .await?
                .said
                .map_err(backend(doing))?;
            let mut info = stream
                .info_with_subjects(&subject)
                .await
                .map_err(backend(doing))?;
            while let Some(counted) = info.next().await {
                let (name, n) = counted.map_err(backend(doing))?;
                if name == subject {
                    usage.started = n as u64;
                }
            }
            usage.window_ends_ms = (window + 1) * rate.window_ms as i64;
        }
        Ok(Some(usage))
    }

    /// Every queue with a limit, as this replica knows them.
    pub fn limited_queues(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .list()
            .into_iter()
            .filter(|m| m.own_limits().any() || m.limit_override.is_some())
            .map(|m| m.name)
            .collect();
        names.sort();
        names
    }

    /// FETCH: takes one of `queue`'s `concurrency` running places for dispatch `dispatch`
    /// of job `id`: the sequence of its message in the concurrency stream, `None` when
    /// every place is taken.
    ///
    /// # Errors
    /// `backend_error` when NATS fails, `backend_unavailable` when it does not answer in time.
    pub(in crate::store) async fn take_slot(
        &self,
        queue: &str,
        concurrency: u64,
        id: &str,
        dispatch: u64,
    ) -> Result<Option<u64>, OjsError> {
        let body = serde_json::to_vec(&Slot {
            id: id.to_owned(),
            dispatch,
        })
        .expect("slots serialize");
        let topology = &self.conn.topology;
        let taken = self
            .conn
            .take_token(
                topology.slot_subject(queue),
                body.into(),
                || topology.slot_stream_config(queue, concurrency),
                "taking a place of a concurrency-limited queue",
            )
            .await?;
        Ok(taken.map(|ack| ack.sequence))
    }

    /// Frees a running place of `queue` (its message `sequence`). Best effort, by the
    /// deadline: a place left taken is freed by the leader's sweep (`sweep_slots`).
    pub(in crate::store) async fn give_back_slot(&self, queue: &str, sequence: u64) {
        let stream = self.conn.topology.slot_stream(queue);
        let freeing = async {
            match self.conn.js.get_stream_no_info(&stream).await {
                Ok(stream) => match stream.delete_message(sequence).await {
                    Ok(_) => Ok(()),
                    // Freed already (by the sweep, or an earlier try whose answer was lost).
                    Err(err) if already_deleted(&err) => Ok(()),
                    Err(err) => Err(err.to_string()),
                },
                Err(err) => Err(err.to_string()),
            }
        };
        let freed = by_deadline(freeing)
            .await
            .unwrap_or_else(|| Err("the request's deadline passed".to_owned()));
        if let Err(err) = freed {
            warn!(queue, sequence, error = %err, "could not free a running place; the leader's sweep will");
        }
    }

    /// FETCH: spends one start of `queue`'s current window; `false` when the window has
    /// none left.
    ///
    /// # Errors
    /// `backend_error` when NATS fails, `backend_unavailable` when it does not answer in time.
    pub(in crate::store) async fn take_start(
        &self,
        queue: &str,
        limit: RateLimit,
    ) -> Result<bool, OjsError> {
        let window = limit.window_index(Utc::now().timestamp_millis());
        let topology = &self.conn.topology;
        let taken = self
            .conn
            .take_token(
                topology.rate_subject(queue, window),
                bytes::Bytes::new(),
                || topology.rate_stream_config(queue, limit),
                "taking a start of a rate-limited queue",
            )
            .await?;
        Ok(taken.is_some())
    }
}
