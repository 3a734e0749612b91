//! Unique jobs (unique-jobs spec, docs/architecture.md §3.18): one lock per uniqueness key
//! in the unique bucket, naming the job that holds the key. PUSH takes the lock with a
//! compare-and-set before it writes anything else, so of concurrent enqueues of one key
//! exactly one gets it (strong uniqueness, spec §8.1); whether the named job still holds
//! the key is read from its record when the next enqueue meets the lock (`unique::decide`).
//! The leader drops locks whose jobs ended (`release_unique_locks`).

use std::collections::HashSet;
use std::time::Duration;

use chrono::Utc;
use serde_json::json;
use tracing::warn;

use super::Jobs;
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::job::{Job, JobRecord};
use crate::domain::state::JobState;
use crate::domain::unique::{self, Holder, Lock, LockStep, OnConflict, UniquePolicy};
use crate::store::cas::{self, Cas, Replica};
use crate::store::deadline::by_deadline;

/// How long a lock whose job does not exist yet holds its key: its enqueue may still be
/// writing the job (a PUSH makes a handful of NATS calls, each up to `nats_timeout_ms`).
/// A gateway killed mid-enqueue blocks the key this long at most, and never past the
/// policy's `period`.
pub(in crate::store) const LOCK_GRACE: Duration = Duration::from_secs(30);
/// Pauses while another enqueue of the key is on its way (1 + 2 + … + 256 ms).
const WAIT_ROUNDS: u32 = 9;

/// A lock this PUSH holds: its key and job, and whether this PUSH wrote it (a client's
/// retry finds its own lock in place: that one is not given back on a refusal).
pub(in crate::store) struct Taken {
    key: String,
    job_id: String,
    fresh: bool,
}

/// What taking a job's lock came to.
pub(in crate::store) enum Locked {
    Taken(Taken),
    /// `ignore` met a job holding the key: this is it, and nothing is enqueued.
    Existing(Box<Job>),
}

/// Locks a listing reads at most.
pub const LOCKS_LISTED: usize = 5_000;

/// A uniqueness lock as listed: its key (the hash the bucket keys it by) and its lock.
#[derive(Debug, Clone)]
pub struct HeldLock {
    pub key: String,
    pub lock: Lock,
}

impl Jobs {
    /// The uniqueness locks taken last, most recent first, at most `LOCKS_LISTED`: the
    /// unique bucket's stream read in order from its last `2 × LOCKS_LISTED` messages (a
    /// released lock leaves a delete marker, skipped) through one ephemeral consumer.
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn unique_locks(&self) -> Result<Vec<HeldLock>, OjsError> {
        let bucket = self.conn.topology.unique_bucket();
        let last = self
            .own
            .unique
            .stream
            .get_info()
            .await
            .map_err(crate::store::error::backend("reading the unique bucket"))?
            .state
            .last_sequence;
        let from = last.saturating_sub(2 * LOCKS_LISTED as u64) + 1;
        let stored = self
            .conn
            .read_stream_from(&format!("KV_{bucket}"), None, from, 2 * LOCKS_LISTED)
            .await?;
        Ok(stored
            .iter()
            .rev()
            .filter_map(|m| {
                let lock = serde_json::from_slice::<Lock>(&m.payload).ok()?;
                let key = m.subject.rsplit('.').next()?.to_owned();
                Some(HeldLock { key, lock })
            })
            .take(LOCKS_LISTED)
            .collect())
    }

    /// Takes the uniqueness lock of each job that has a `unique` policy, in order, before
    /// anything of the PUSH is written. A job whose key is held is refused with 409
    /// `duplicate` naming the holder (`reject`; also `ignore` in a batch), cancels the
    /// holder (`replace`; `replace_except_schedule` also keeps its `scheduled_at`), or —
    /// alone in its PUSH under `ignore` — gives the holder back. On any refusal the locks
    /// taken so far are released.
    ///
    /// # Errors
    /// 409 `duplicate`; `backend_error` when NATS fails.
    pub(in crate::store) async fn take_unique_locks(
        &self,
        records: &mut [JobRecord],
    ) -> Result<Result<Vec<Taken>, Box<Job>>, OjsError> {
        let single = records.len() == 1;
        let mut keys = HashSet::new();
        let mut taken = Vec::new();
        for (index, rec) in records.iter_mut().enumerate() {
            let Some(raw) = &rec.job.unique else { continue };
            let policy = UniquePolicy::parse(raw, &rec.job.args)?;
            let key = policy.key(&rec.job);
            let outcome = if keys.insert(key.clone()) {
                self.take_lock(&policy, key, rec, single).await
            } else {
                Err(OjsError::new(
                    ErrorCode::Duplicate,
                    format!("The job at index {index} has the unique key of an earlier job of the batch."),
                )
                .with_detail("index", index)
                .with_detail("unique_key", key))
            };
            match outcome {
                Ok(Locked::Taken(t)) => taken.push(t),
                Ok(Locked::Existing(job)) => return Ok(Err(job)),
                Err(err) => {
                    self.release_taken(&taken).await;
                    return Err(err);
                }
            }
        }
        Ok(Ok(taken))
    }

    async fn take_lock(
        &self,
        policy: &UniquePolicy,
        key: String,
        rec: &mut JobRecord,
        single: bool,
    ) -> Result<Locked, OjsError> {
        let kv = &self.own.unique;
        let mine = serde_json::to_vec(&Lock {
            job_id: rec.job.id.clone(),
            at: Utc::now(),
        })
        .expect("locks serialize");
        let mut raced = None;
        let mut waited = 0;
        for round in 0..cas::MAX_CAS_ATTEMPTS + WAIT_ROUNDS as usize {
            let current =
                cas::read::<Lock>(kv, &key, Replica::after(raced.is_some()), "unique lock").await?;
            let step = match &current.value {
                None => LockStep::TakeOver,
                Some(lock) if lock.job_id == rec.job.id => LockStep::Ours,
                Some(lock) => {
                    let found = self.read(&lock.job_id, Replica::Nearest).await?;
                    let holder = found
                        .as_ref()
                        .map_or(Holder::Missing, |(h, _)| Holder::Found {
                            state: h.job.state,
                            created_at: h.job.created_at,
                        });
                    let step =
                        unique::decide(policy, &rec.job.id, lock, holder, LOCK_GRACE, Utc::now());
                    if step == LockStep::Held {
                        let (held, _) = found.expect("a held lock names a job that exists");
                        match self.on_conflict(policy, &key, held, rec, single).await? {
                            Some(existing) => return Ok(Locked::Existing(Box::new(existing))),
                            None => LockStep::TakeOver,
                        }
                    } else {
                        step
                    }
                }
            };
            match step {
                LockStep::Ours => {
                    return Ok(Locked::Taken(Taken {
                        key,
                        job_id: rec.job.id.clone(),
                        fresh: false,
                    }))
                }
                LockStep::TakeOver => {
                    match cas::write(
                        kv,
                        &key,
                        mine.clone().into(),
                        current.revision,
                        "writing a unique lock",
                    )
                    .await?
                    {
                        Cas::Written(_) => {
                            return Ok(Locked::Taken(Taken {
                                key,
                                job_id: rec.job.id.clone(),
                                fresh: true,
                            }))
                        }
                        Cas::Refused(why) => {
                            raced = Some(why);
                            cas::pause_after(why, round).await;
                        }
                    }
                }
                LockStep::Wait if waited < WAIT_ROUNDS => {
                    tokio::time::sleep(Duration::from_millis(1 << waited)).await;
                    waited += 1;
                }
                LockStep::Wait | LockStep::Held => {
                    let holder = current.value.map(|l| l.job_id).unwrap_or_default();
                    return Err(duplicate(&key, &holder, None).with_detail(
                        "reason",
                        "another enqueue of this unique key is still on its way",
                    ));
                }
            }
        }
        Err(cas::gave_up("unique lock", &key, raced))
    }

    /// What `on_conflict` does with `held`, the job holding the key: `Some(job)` to answer
    /// with it (`ignore`), `None` once the key may be taken over (`replace`).
    async fn on_conflict(
        &self,
        policy: &UniquePolicy,
        key: &str,
        held: JobRecord,
        rec: &mut JobRecord,
        single: bool,
    ) -> Result<Option<Job>, OjsError> {
        match policy.on_conflict {
            OnConflict::Ignore if single => Ok(Some(held.job)),
            OnConflict::Reject | OnConflict::Ignore => {
                Err(duplicate(key, &held.job.id, Some(held.job.state)))
            }
            OnConflict::Replace | OnConflict::ReplaceExceptSchedule => {
                match self.cancel(&held.job.id).await {
                    Ok(_) => {}
                    // Ended meanwhile: it no longer holds the key either way.
                    Err(err) if err.code == ErrorCode::Conflict => {}
                    Err(err) => return Err(err),
                }
                if policy.on_conflict == OnConflict::ReplaceExceptSchedule
                    && held.job.state == JobState::Scheduled
                {
                    keep_schedule(&mut rec.job, &held.job);
                    rec.dispatch = 0;
                }
                Ok(None)
            }
        }
    }

    /// Gives back the locks a refused PUSH wrote (each only while it still names its
    /// job), but those of `kept` jobs, which run. By the deadline: a lock left behind is
    /// taken over by the next enqueue of its key, which finds no job holding it.
    pub(in crate::store) async fn release_taken(&self, taken: &[Taken]) {
        let releasing = async {
            for t in taken.iter().filter(|t| t.fresh) {
                self.release_lock(&t.key, &t.job_id).await;
            }
        };
        if by_deadline(releasing).await.is_none() {
            warn!("could not release a refused PUSH's unique locks by its deadline");
        }
    }

    pub(in crate::store) async fn release_lock(&self, key: &str, job_id: &str) {
        let kv = &self.own.unique;
        let current = match cas::read::<Lock>(kv, key, Replica::Nearest, "unique lock").await {
            Ok(c) => c,
            Err(err) => {
                warn!(key, error = %err, "could not read a unique lock to release it");
                return;
            }
        };
        if current.value.is_some_and(|l| l.job_id == job_id) {
            if let Err(err) = kv.purge_expect_revision(key, Some(current.revision)).await {
                warn!(key, error = %err, "could not release a unique lock");
            }
        }
    }
}

/// The `unique` key and job id of a write that ends a unique job's hold on its key: a
/// final state its policy does not list.
pub fn ended_lock(rec: &JobRecord) -> Option<(String, String)> {
    let raw = rec.job.unique.as_ref()?;
    if !rec.job.state.is_terminal() {
        return None;
    }
    let policy = UniquePolicy::parse(raw, &rec.job.args).ok()?;
    (!policy.states.contains(&rec.job.state)).then(|| (policy.key(&rec.job), rec.job.id.clone()))
}

/// The new job waits for the replaced one's time (`replace_except_schedule`, spec §5.3).
fn keep_schedule(job: &mut Job, held: &Job) {
    job.scheduled_at.clone_from(&held.scheduled_at);
    job.state = JobState::Scheduled;
    job.enqueued_at = None;
}

fn duplicate(key: &str, holder: &str, state: Option<JobState>) -> OjsError {
    let mut err = OjsError::new(
        ErrorCode::Duplicate,
        format!("A job with the same unique key already exists: {holder}."),
    )
    .with_detail("existing_job_id", holder)
    .with_detail("unique_key", key);
    if let Some(state) = state {
        err = err.with_detail("existing_job_state", json!(state));
    }
    err
}
