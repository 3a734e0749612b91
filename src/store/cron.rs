//! Cron registrations in the cron bucket (key = encoded name), mirrored in every replica for
//! listing, and the firing of one tick by the coordinator leader: idempotent, so a tick
//! repeated by a new leader after a crash still makes one job.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use super::cas::{self, Cas, Replica};
use super::error::backend;
use super::mirror::Mirror;
use super::topology::encode_queue;
use super::Store;
use crate::domain::cron::{self, tick_job_id, CronEntry, OverlapPolicy};
use crate::domain::envelope;
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::event::Event;
use crate::domain::job::stable_uuid;

/// What firing a tick did.
#[derive(Debug, Clone, PartialEq)]
pub enum TickOutcome {
    Enqueued(String),
    /// Skipped because the previous job is still running (overlap policy `skip`).
    Skipped(String),
    /// The entry changed or vanished meanwhile; nothing was done.
    Stale,
    /// PUSH refused the tick's job for good (a limit reached since the entry was
    /// registered); the tick was skipped with this reason.
    Refused(String),
}

pub(super) type CronMirror = Arc<Mirror<CronEntry>>;

impl Store {
    /// Registers or replaces a cron entry (cron spec §8.1 upsert). Run statistics of an
    /// existing entry are kept; the next run is computed now. `true` when it is new.
    ///
    /// # Errors
    /// 413 for an entry over `max_job_bytes`, 400 for a new one past `max_cron_entries`
    /// (counted in this replica's mirror); when NATS fails.
    pub async fn register_cron(&self, mut entry: CronEntry) -> Result<(CronEntry, bool), OjsError> {
        let key = encode_queue(&entry.name);
        entry.next_run_at = if entry.enabled {
            entry.schedule()?.next_after(entry.created_at)
        } else {
            None
        };
        let mirror = &self.inner.cron;
        cron::admit(
            &entry,
            !mirror.contains(&key),
            mirror.len(),
            (self.max_job_bytes(), self.inner.max_cron_entries),
        )?;
        let mut is_new = false;
        let written = cas::change(
            &self.inner.cron_kv,
            &key,
            "cron entry",
            &entry.name,
            |old: Option<&CronEntry>| {
                is_new = old.is_none();
                let mut next = entry.clone();
                if let Some(old) = old {
                    next.created_at = old.created_at;
                    next.run_count = old.run_count;
                    next.last_run_at = old.last_run_at;
                    next.last_job_id.clone_from(&old.last_job_id);
                }
                Some(next)
            },
        )
        .await?;
        let entry = written.value.expect("a cron registration always writes");
        self.inner
            .cron
            .remember(&key, written.revision, Some(entry.clone()));
        Ok((entry, is_new))
    }

    /// Every registered entry, from this replica's mirror.
    pub fn cron_entries(&self) -> Vec<CronEntry> {
        let mut entries = self.inner.cron.values();
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        entries
    }

    /// # Errors
    /// 404 for an unknown name.
    pub async fn cron_entry(&self, name: &str) -> Result<CronEntry, OjsError> {
        self.read_cron(&encode_queue(name))
            .await?
            .map(|(e, _)| e)
            .ok_or_else(|| OjsError::not_found("cron entry", name))
    }

    /// Removes an entry; jobs it already enqueued are unaffected.
    ///
    /// # Errors
    /// 404 for an unknown name.
    pub async fn delete_cron(&self, name: &str) -> Result<CronEntry, OjsError> {
        let key = encode_queue(name);
        let Some((entry, revision)) = self.read_cron(&key).await? else {
            return Err(OjsError::not_found("cron entry", name));
        };
        self.inner
            .cron_kv
            .purge(&key)
            .await
            .map_err(backend("deleting a cron entry"))?;
        self.inner.cron.remember(&key, revision + 1, None);
        Ok(entry)
    }

    /// Fires the tick `tick` of `name` (leader only): the overlap check, the job (its id
    /// fixed by name and tick, so a repeat is refused as a duplicate), the event, then the
    /// entry's next run — written last, so a crash before it makes the next leader redo
    /// the same tick, harmlessly.
    ///
    /// # Errors
    /// When NATS fails; the tick stays due and is fired again.
    pub async fn fire_cron(
        &self,
        name: &str,
        tick: DateTime<Utc>,
    ) -> Result<TickOutcome, OjsError> {
        let key = encode_queue(name);
        let Some((entry, revision)) = self.read_cron(&key).await? else {
            return Ok(TickOutcome::Stale);
        };
        if !entry.enabled || entry.next_run_at != Some(tick) {
            return Ok(TickOutcome::Stale);
        }
        let previous = match &entry.last_job_id {
            Some(id) => self
                .read(id, Replica::Nearest)
                .await?
                .map(|(rec, _)| rec.job)
                .filter(|j| !j.state.is_terminal()),
            None => None,
        };
        let job_type = entry
            .job_template
            .get("type")
            .cloned()
            .unwrap_or(Value::Null);
        let outcome = match (entry.overlap_policy, previous) {
            (OverlapPolicy::Skip, Some(running)) => {
                self.publish_events(&[cron_event(&self.inner.cron_source, &entry, tick, "cron.skipped", json!({
                    "job_type": job_type, "reason": "previous instance has not finished", "existing_job_id": running.id,
                }))])
                .await?;
                TickOutcome::Skipped(running.id)
            }
            (policy, previous) => {
                if let (OverlapPolicy::CancelPrevious, Some(running)) = (policy, previous) {
                    match self.cancel(&running.id).await {
                        Ok(_) => {}
                        Err(err) if err.code == ErrorCode::Conflict => {} // it finished meanwhile
                        Err(err) => return Err(err),
                    }
                }
                let id = tick_job_id(&entry.name, tick);
                let enqueued = match envelope::parse_with_default_exhaustion(
                    entry.job_for_tick(tick),
                    Utc::now(),
                    uuid::Uuid::nil(),
                    self.inner.default_on_exhaustion,
                ) {
                    Ok(job) => self.enqueue(vec![job], Duration::ZERO).await.map(drop),
                    Err(err) => Err(err),
                };
                match enqueued {
                    Ok(()) => self.failpoint("cron.enqueued").await,
                    // This tick was fired before (a leader died before advancing the entry).
                    Err(err) if err.code == ErrorCode::Duplicate => {}
                    // Refused for good (a limit reached since registration): the tick is
                    // skipped, not retried every second.
                    Err(err) if !err.code.retryable() => {
                        self.publish_events(&[cron_event(
                            &self.inner.cron_source,
                            &entry,
                            tick,
                            "cron.skipped",
                            json!({
                                "job_type": job_type, "reason": err.message,
                            }),
                        )])
                        .await?;
                        return self
                            .advance_cron(
                                &key,
                                entry,
                                revision,
                                tick,
                                TickOutcome::Refused(err.message),
                            )
                            .await;
                    }
                    Err(err) => return Err(err),
                }
                self.publish_events(&[cron_event(&self.inner.cron_source, &entry, tick, "cron.triggered", json!({
                    "job_type": job_type, "job_id": id, "scheduled_at": crate::domain::time::format(tick),
                }))])
                .await?;
                TickOutcome::Enqueued(id)
            }
        };
        self.advance_cron(&key, entry, revision, tick, outcome)
            .await
    }

    /// Moves the entry past `tick`, by CAS: the last step of a tick.
    async fn advance_cron(
        &self,
        key: &str,
        entry: CronEntry,
        revision: u64,
        tick: DateTime<Utc>,
        outcome: TickOutcome,
    ) -> Result<TickOutcome, OjsError> {
        let mut next = entry.clone();
        if let TickOutcome::Enqueued(id) = &outcome {
            next.last_job_id = Some(id.clone());
            next.run_count += 1;
            next.last_run_at = Some(tick);
        }
        next.next_run_at = entry.schedule()?.next_after(resume_from(tick, Utc::now()));
        match self.write_cron(key, &next, revision).await? {
            Some(_) => Ok(outcome),
            None => Ok(TickOutcome::Stale), // re-registered meanwhile; the new entry rules
        }
    }

    async fn read_cron(&self, key: &str) -> Result<Option<(CronEntry, u64)>, OjsError> {
        let current = cas::read(&self.inner.cron_kv, key, Replica::Nearest, "cron entry").await?;
        Ok(current.value.map(|entry| (entry, current.revision)))
    }

    /// Writes with a revision check; `None` back when another writer won.
    async fn write_cron(
        &self,
        key: &str,
        entry: &CronEntry,
        revision: u64,
    ) -> Result<Option<u64>, OjsError> {
        let value = serde_json::to_vec(entry).expect("cron entries serialize");
        let doing = "writing a cron entry";
        match cas::write(&self.inner.cron_kv, key, value.into(), revision, doing).await? {
            Cas::Written(rev) => {
                self.inner.cron.remember(key, rev, Some(entry.clone()));
                Ok(Some(rev))
            }
            Cas::Refused(_) => Ok(None),
        }
    }
}

/// Ticks missed for less than this (a leader failover) are all fired, one after another;
/// after a longer outage only the one tick already due is (cron spec §7.3: at most one
/// catch-up after downtime).
const CATCH_UP_WINDOW: chrono::TimeDelta = chrono::TimeDelta::seconds(60);

/// Where the schedule continues after firing `tick` at `now`.
fn resume_from(tick: DateTime<Utc>, now: DateTime<Utc>) -> DateTime<Utc> {
    if now - tick < CATCH_UP_WINDOW {
        tick
    } else {
        now
    }
}

/// A cron event (events seed §4.5) with an id fixed by entry, tick and type.
fn cron_event(
    source: &str,
    entry: &CronEntry,
    tick: DateTime<Utc>,
    event_type: &str,
    data: Value,
) -> Event {
    let mut data = data;
    data["cron_name"] = json!(entry.name);
    data["cron_expr"] = json!(entry.expression);
    data["queue"] = entry
        .job_template
        .pointer("/options/queue")
        .cloned()
        .unwrap_or(json!("default"));
    Event {
        specversion: "1.0".into(),
        id: format!(
            "evt_{}",
            stable_uuid(
                &format!(
                    "cron/{}/{}/{event_type}",
                    entry.name,
                    tick.timestamp_millis()
                ),
                tick
            )
        ),
        event_type: event_type.into(),
        source: source.into(),
        time: tick,
        subject: Some(entry.name.clone()),
        datacontenttype: "application/json".into(),
        data,
    }
}
