//! The cron scheduler's firing of one tick: idempotent, so a tick repeated by a new leader
//! after a crash still makes one job.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use super::Leader;
use crate::domain::cron::{tick_job_id, CronEntry, OverlapPolicy};
use crate::domain::envelope;
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::event::Event;
use crate::domain::job::stable_uuid;
use crate::store::cas::Replica;
use crate::store::topology::encode_queue;

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

impl Leader {
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
        let Some((entry, revision)) = self.cron.read_cron(&key).await? else {
            return Ok(TickOutcome::Stale);
        };
        if !entry.enabled || entry.next_run_at != Some(tick) {
            return Ok(TickOutcome::Stale);
        }
        let previous = match &entry.last_job_id {
            Some(id) => self
                .jobs
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
                self.events.publish(&[cron_event(&self.conn.cron_source, &entry, tick, "cron.skipped", json!({
                    "job_type": job_type, "reason": "previous instance has not finished", "existing_job_id": running.id,
                }))])
                .await?;
                TickOutcome::Skipped(running.id)
            }
            (policy, previous) => {
                if let (OverlapPolicy::CancelPrevious, Some(running)) = (policy, previous) {
                    match self.jobs.cancel(&running.id).await {
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
                    self.conn.default_on_exhaustion,
                ) {
                    Ok(job) => self.jobs.enqueue(vec![job], Duration::ZERO).await.map(drop),
                    Err(err) => Err(err),
                };
                match enqueued {
                    Ok(()) => self.conn.failpoint("cron.enqueued").await,
                    // This tick was fired before (a leader died before advancing the entry).
                    Err(err) if err.code == ErrorCode::Duplicate => {}
                    // Refused for good (a limit reached since registration): the tick is
                    // skipped, not retried every second.
                    Err(err) if !err.code.retryable() => {
                        self.events
                            .publish(&[cron_event(
                                &self.conn.cron_source,
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
                self.events.publish(&[cron_event(&self.conn.cron_source, &entry, tick, "cron.triggered", json!({
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
            next.ran(id, tick);
        }
        next.next_run_at = entry.schedule()?.next_after(resume_from(tick, Utc::now()));
        match self.cron.write_cron(key, &next, revision).await? {
            Some(_) => Ok(outcome),
            None => Ok(TickOutcome::Stale), // re-registered meanwhile; the new entry rules
        }
    }
}
