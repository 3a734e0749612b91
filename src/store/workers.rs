//! The worker side of the worker protocol (seed §3–§6, §10): heartbeats that extend the jobs
//! a worker holds, the worker registry with last-seen times and operator directives, and
//! dead-worker recovery for workers that stop heartbeating.

use std::sync::Arc;

use async_nats::jetstream::kv;
use chrono::{DateTime, Utc};
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tracing::warn;

use super::cas::{self, Replica};
use super::connection::Connection;
use super::jobs::batches::AT_ONCE;
use super::jobs::Jobs;
use super::mirror::Mirror;
use super::timers::{Timer, TimerKind, Timers};
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::job::Job;
use crate::domain::job::Transition;
use crate::domain::lifecycle;
use crate::domain::requests::{BeatRequest, FetchRequest};
use crate::domain::state::JobState;
use crate::domain::time;

use crate::domain::worker::takes_no_jobs;
pub use crate::domain::worker::WorkerState;

/// The workers resource, as a caller holds it: the connection and what the resource owns.
#[derive(Clone)]
pub struct Workers {
    pub(super) conn: Arc<Connection>,
    pub(super) own: Arc<Owned>,
    pub(super) jobs: Jobs,
    pub(super) timers: Timers,
}

/// What the workers resource owns.
pub(super) struct Owned {
    pub(super) kv: kv::Store,
    /// Every worker in brief, for listings and counts without a key listing.
    pub(super) mirror: WorkerMirror,
}

/// A worker's entry in the workers bucket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerRecord {
    pub worker_id: String,
    /// The state an operator asked for; answered on every heartbeat.
    pub directive: WorkerState,
    /// The state the worker reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reported_state: Option<String>,
    pub active_job_ids: Vec<String>,
    #[serde(with = "time::millis")]
    pub first_seen: DateTime<Utc>,
    #[serde(with = "time::millis")]
    pub last_seen: DateTime<Utc>,
    /// What else the worker said about itself (hostname, pid, queues, concurrency, labels).
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub info: Map<String, Value>,
}

/// What every replica keeps of a worker (a watch of the workers bucket): enough to count
/// and page the workers without listing keys, and small whatever the worker sent.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct WorkerSummary {
    worker_id: String,
    directive: WorkerState,
    #[serde(with = "time::millis")]
    last_seen: DateTime<Utc>,
    /// Whether its last heartbeat reported it quiet, draining or terminating: FETCH hands
    /// it no job. Kept as a flag, so the summary stays small whatever state text the
    /// worker sent.
    #[serde(default, rename = "reported_state", deserialize_with = "winding_down")]
    winding_down: bool,
}

/// The summary's `winding_down` from the entry's `reported_state`.
fn winding_down<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    let state = Option::<String>::deserialize(d)?;
    Ok(state.as_deref().is_some_and(takes_no_jobs))
}

pub(super) type WorkerMirror = Arc<Mirror<WorkerSummary>>;

/// How many workers the registry holds, by the state operators see (admin spec §9.1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerCensus {
    pub total: usize,
    pub running: usize,
    pub quiet: usize,
    pub terminate: usize,
    /// Silent past the heartbeat timeout, not yet declared dead.
    pub stale: usize,
}

/// What the server answers a heartbeat.
#[derive(Debug, Clone)]
pub struct BeatReply {
    pub state: WorkerState,
    pub jobs_extended: Vec<String>,
    /// Listed jobs that were cancelled: the worker should stop them.
    pub jobs_cancelled: Vec<String>,
}

/// Worker ids are free text; bucket keys are not. Bytes outside `[A-Za-z0-9_-]` become
/// `=XX`, which keeps the mapping one-to-one.
fn worker_key(worker_id: &str) -> String {
    worker_id
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' => (b as char).to_string(),
            _ => format!("={b:02X}"),
        })
        .collect()
}

impl Workers {
    /// BEAT (core §7.5, HTTP binding §10.4): extends the listed jobs the worker holds,
    /// records the worker, and (re)arms its dead-worker timer.
    ///
    /// # Errors
    /// When NATS fails.
    /// `test_directives` honours `meta.test_directive` of listed jobs (conformance switch
    /// only).
    pub async fn heartbeat(
        &self,
        beat: &BeatRequest,
        test_directives: bool,
    ) -> Result<BeatReply, OjsError> {
        let visibility = beat.visibility;
        let default_visibility = self.conn.visibility_timeout;
        let extended = beat.active_job_ids.iter().cloned().map(|id| async move {
            let settled = self
                .jobs
                .transition(&id, |rec, now| {
                    let vis = lifecycle::beat_visibility(rec, visibility, default_visibility);
                    Ok(lifecycle::heartbeat(rec, now, &beat.worker_id, vis))
                })
                .await;
            (id, settled)
        });
        let mut reply = BeatReply {
            state: WorkerState::Running,
            jobs_extended: Vec::new(),
            jobs_cancelled: Vec::new(),
        };
        let mut directive = WorkerState::Running;
        // In order, a few at a time: a beat naming many jobs must not flood NATS.
        let settled: Vec<_> = futures::stream::iter(extended)
            .buffered(AT_ONCE)
            .collect()
            .await;
        for (id, settled) in settled {
            match settled {
                Ok(s) => {
                    if s.after.transition == Transition::Heartbeat && s.after != s.before {
                        reply.jobs_extended.push(id.clone());
                    }
                    if s.after.job.state == JobState::Cancelled {
                        reply.jobs_cancelled.push(id.clone());
                    }
                    if test_directives {
                        let hook = s
                            .after
                            .job
                            .meta
                            .get("test_directive")
                            .and_then(Value::as_str);
                        directive =
                            directive.max(hook.and_then(WorkerState::parse).unwrap_or_default());
                    }
                }
                Err(err) if err.code == ErrorCode::NotFound => {}
                Err(err) => return Err(err),
            }
        }
        let record = self.record_beat(beat).await?;
        reply.state = directive.max(record.directive);
        let due = time::add(Utc::now(), self.conn.heartbeat_timeout);
        let timer = Timer::named(TimerKind::Worker, &beat.worker_id, due);
        self.conn
            .stored(self.timers.send_timer(&timer).await?)
            .await?;
        Ok(reply)
    }

    /// Updates the worker's entry, keeping the operator's directive.
    async fn record_beat(&self, beat: &BeatRequest) -> Result<WorkerRecord, OjsError> {
        let now = Utc::now();
        self.update_worker(&beat.worker_id, |current| {
            let mut rec = current.cloned().unwrap_or_else(|| WorkerRecord {
                worker_id: beat.worker_id.clone(),
                directive: WorkerState::Running,
                reported_state: None,
                active_job_ids: Vec::new(),
                first_seen: now,
                last_seen: now,
                info: Map::new(),
            });
            rec.last_seen = now;
            rec.active_job_ids = beat.active_job_ids.clone();
            rec.reported_state = beat.reported_state.clone();
            rec.info = beat.info.clone();
            Some(rec)
        })
        .await?
        .ok_or_else(|| OjsError::backend("the worker entry vanished while being written"))
    }

    /// An operator asks a worker to go quiet or terminate (admin spec §9.3); the worker hears
    /// it on its next heartbeat. Directives only move forward.
    ///
    /// # Errors
    /// 404 for a worker that never heartbeated.
    pub async fn direct(
        &self,
        worker_id: &str,
        state: WorkerState,
    ) -> Result<WorkerRecord, OjsError> {
        self.update_worker(worker_id, |current| {
            current.map(|rec| WorkerRecord {
                directive: rec.directive.max(state),
                ..rec.clone()
            })
        })
        .await?
        .ok_or_else(|| OjsError::not_found("worker", worker_id))
    }

    /// The worker's entry.
    ///
    /// # Errors
    /// 404 for a worker that never heartbeated (or was declared dead).
    pub async fn get(&self, worker_id: &str) -> Result<WorkerRecord, OjsError> {
        self.read_worker(worker_id)
            .await?
            .map(|(rec, _)| rec)
            .ok_or_else(|| OjsError::not_found("worker", worker_id))
    }

    /// The registry's workers counted from this replica's mirror, and the page of them
    /// from `offset` (by worker id) with whether each is stale (silent past the heartbeat
    /// timeout, not yet declared dead). One get per worker of the page, 32 at a time.
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn list(
        &self,
        offset: usize,
        limit: usize,
    ) -> Result<(WorkerCensus, Vec<(WorkerRecord, bool)>), OjsError> {
        let now = Utc::now();
        let stale = |last_seen: DateTime<Utc>| self.is_stale(last_seen, now);
        let mut census = WorkerCensus::default();
        let mut ids = Vec::new();
        for w in self.own.mirror.values() {
            census.total += 1;
            *match (stale(w.last_seen), w.directive) {
                (true, _) => &mut census.stale,
                (false, WorkerState::Running) => &mut census.running,
                (false, WorkerState::Quiet) => &mut census.quiet,
                (false, WorkerState::Terminate) => &mut census.terminate,
            } += 1;
            ids.push(w.worker_id);
        }
        ids.sort_unstable();
        let reads = futures::stream::iter(ids.into_iter().skip(offset).take(limit))
            .map(|id| async move { self.read_worker(&id).await })
            .buffered(32)
            .try_collect::<Vec<_>>()
            .await?;
        let page = reads
            .into_iter()
            .flatten()
            .map(|(rec, _)| {
                let stale = stale(rec.last_seen);
                (rec, stale)
            })
            .collect();
        Ok((census, page))
    }

    /// Whether a worker last heard from at `last_seen` is silent past the heartbeat timeout
    /// at `now` (stale, and not yet declared dead while it is in the registry).
    pub fn is_stale(&self, last_seen: DateTime<Utc>, now: DateTime<Utc>) -> bool {
        (now - last_seen).to_std().unwrap_or_default() >= self.conn.heartbeat_timeout
    }

    /// FETCH for a worker (HTTP, gRPC, `StreamJobs`): a worker whose last heartbeat
    /// reported it quiet, draining or terminating (graceful-shutdown spec §5, as this
    /// replica's mirror knows it) gets no job — its FETCH waits out its wait empty, as
    /// when no job comes; any other FETCH is [`Jobs::fetch_for_caller`].
    ///
    /// # Errors
    /// As [`Jobs::fetch_for_caller`].
    pub async fn fetch(&self, req: FetchRequest) -> Result<Vec<Job>, OjsError> {
        let winding_down = req.worker_id.as_deref().is_some_and(|id| {
            self.own
                .mirror
                .with(&worker_key(id), |w| w.winding_down)
                .unwrap_or(false)
        });
        if winding_down {
            tokio::time::sleep(req.wait.unwrap_or_default()).await;
            return Ok(Vec::new());
        }
        self.jobs.fetch_for_caller(req).await
    }

    /// How many workers the registry holds, from this replica's mirror.
    pub fn count(&self) -> usize {
        self.own.mirror.len()
    }

    /// An operator removes a stale worker (admin spec §9.4): its jobs go back to their
    /// queues as when its timer fires. A worker still heartbeating is left alone.
    ///
    /// # Errors
    /// 404 unknown worker; 409 for a worker heard from within the heartbeat timeout.
    pub async fn deregister(&self, worker_id: &str) -> Result<(), OjsError> {
        let rec = self.get(worker_id).await?;
        let silent = (Utc::now() - rec.last_seen).to_std().unwrap_or_default();
        if silent < self.conn.heartbeat_timeout {
            return Err(OjsError::new(
                ErrorCode::Conflict,
                format!(
                    "Worker '{worker_id}' heartbeated {} ms ago; only a stale worker (silent for {} ms) can be deregistered. Quiet or terminate it instead.",
                    silent.as_millis(),
                    self.conn.heartbeat_timeout.as_millis()
                ),
            ));
        }
        self.worker_expired(worker_id).await
    }

    /// A worker's timer fired: if it has not heartbeated within the timeout, its jobs go
    /// back to their queues (error `worker_death`) and its entry is removed.
    pub(super) async fn worker_expired(&self, worker_id: &str) -> Result<(), OjsError> {
        let Some((rec, revision)) = self.read_worker(worker_id).await? else {
            return Ok(());
        };
        let silent_for = (Utc::now() - rec.last_seen).to_std().unwrap_or_default();
        if silent_for < self.conn.heartbeat_timeout {
            return Ok(()); // a newer heartbeat armed a newer timer
        }
        warn!(worker_id, last_seen = %time::format(rec.last_seen), "worker stopped heartbeating; taking its jobs back");
        for id in &rec.active_job_ids {
            match self
                .jobs
                .transition(id, |job, now| {
                    Ok(lifecycle::worker_died(job, now, worker_id))
                })
                .await
            {
                Ok(settled) => self.jobs.release(&settled).await,
                Err(err) if err.code == ErrorCode::NotFound => {}
                Err(err) => return Err(err),
            }
        }
        // Only if it stayed silent meanwhile; a worker that came back keeps its entry. A
        // delete marker, not a purge: on nats-server 2.9 a purge makes the replicas'
        // watches skip other workers' changes (architecture §2, removal markers).
        let _ = self
            .own
            .kv
            .delete_expect_revision(worker_key(worker_id), Some(revision))
            .await;
        Ok(())
    }

    async fn read_worker(&self, worker_id: &str) -> Result<Option<(WorkerRecord, u64)>, OjsError> {
        let key = worker_key(worker_id);
        let current = cas::read(&self.own.kv, &key, Replica::Nearest, "worker").await?;
        Ok(current.value.map(|rec| (rec, current.revision)))
    }

    /// Read, change, write with a revision check, again on a lost race. `change` returning
    /// `None` writes nothing (and gives the entry as found).
    async fn update_worker<F>(
        &self,
        worker_id: &str,
        change: F,
    ) -> Result<Option<WorkerRecord>, OjsError>
    where
        F: FnMut(Option<&WorkerRecord>) -> Option<WorkerRecord>,
    {
        let key = worker_key(worker_id);
        let written = cas::change(&self.own.kv, &key, "worker", worker_id, change).await?;
        let summary = written.value.as_ref().map(|rec| WorkerSummary {
            worker_id: rec.worker_id.clone(),
            directive: rec.directive,
            last_seen: rec.last_seen,
            winding_down: rec.reported_state.as_deref().is_some_and(takes_no_jobs),
        });
        self.own.mirror.remember(&key, written.revision, summary);
        Ok(written.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_keys_are_safe_and_one_to_one() {
        assert_eq!(worker_key("worker-1_a"), "worker-1_a");
        assert_eq!(worker_key("host.local/7"), "host=2Elocal=2F7");
        assert_ne!(worker_key("a=2E"), worker_key("a."));
    }
}
