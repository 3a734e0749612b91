//! Workflows in JetStream (architecture §3.16): a record and a plan per workflow in the
//! workflows bucket, every member job an ordinary job record. A creation writes the
//! records, then the jobs, then marks the root ready; the leader moves workflows on from
//! the job writes it reads for events (`leader/workflows.rs`); a `workflow` timer repairs a
//! creation or a cancel cut short.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use chrono::Utc;
use futures::future::join_all;
use serde_json::Value;
use uuid::Uuid;

use super::cas::{self, pause_after, Cas, Replica, MAX_CAS_ATTEMPTS};
use super::connection::Connection;
use super::events::Events;
use super::jobs::Jobs;
use super::timers::{Timer, TimerKind, Timers};
use crate::domain::envelope::{parse_job_id, too_large};
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::job::{JobRecord, Slot};
use crate::domain::lifecycle;
use crate::domain::time;
use crate::domain::workflow::{
    self, Advance, Effect, Plan, Request, Results, Seen, WorkflowRecord, WorkflowState,
};

/// The workflows resource, as a caller holds it: the connection and what the resource owns.
#[derive(Clone)]
pub struct Workflows {
    pub(super) conn: Arc<Connection>,
    pub(super) own: Arc<Owned>,
    pub(super) jobs: Jobs,
    pub(super) events: Events,
    pub(super) timers: Timers,
}

/// What the workflows resource owns.
pub(super) struct Owned {
    /// Workflow records and plans.
    pub(super) kv: kv::Store,
}

/// When a decision's effects happen relative to its write.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Order {
    /// The leader moving a workflow on: effects first, then the write, so that a crash
    /// between leaves the decision to be made again, the same way.
    ActFirst,
    /// A cancel: the write first, so nothing new starts, then the withdrawals; a crash
    /// between is finished by the workflow timer.
    WriteFirst,
}

/// Workflows a listing shows at most.
pub const LISTED: usize = 5_000;

/// Member records read at once when a batch callback gathers its parents' results.
const READS_AT_ONCE: usize = 256;

/// A workflow as GET shows it: its record and what names its members.
#[derive(Debug, Clone)]
pub struct WorkflowView {
    pub record: WorkflowRecord,
    pub plan: Plan,
}

fn plan_key(id: &str) -> String {
    format!("{id}.plan")
}

impl Workflows {
    /// Creates a workflow (workflows spec §11.1): once the jobs passed PUSH's checks, the
    /// `workflow` timer, the records (root first) and plans, the jobs (those that start at
    /// once available), then the root marked ready.
    ///
    /// # Errors
    /// 400 for an invalid job, 413 for a workflow too large to store, 503 when NATS fails
    /// (the timer then cancels whatever was created).
    pub async fn create(&self, request: &Request) -> Result<WorkflowView, OjsError> {
        let now = Utc::now();
        let creation = workflow::plan(
            request,
            Uuid::now_v7(),
            now,
            self.conn.default_on_exhaustion,
        )?;
        let max = self.conn.max_record_bytes;
        let mut encoded = Vec::with_capacity(creation.workflows.len());
        for (rec, plan) in &creation.workflows {
            let (rec_bytes, plan_bytes) = (
                rec.to_bytes(),
                serde_json::to_vec(plan).expect("plans serialize"),
            );
            for (what, len) in [
                ("workflow", rec_bytes.len()),
                ("workflow plan", plan_bytes.len()),
            ] {
                if len > max {
                    return Err(too_large(what, len, max));
                }
            }
            encoded.push((rec.id.clone(), rec_bytes, plan_bytes));
        }
        let root = creation.workflows[0].clone();
        let kv = &self.own.kv;
        let records = creation
            .jobs
            .into_iter()
            .map(|(job, slot)| JobRecord::created(job, Some(slot)))
            .collect();
        let write_workflows = async {
            self.conn
                .stored(
                    self.timers
                        .send_timer(&self.workflow_timer(&root.0.id, now))
                        .await?,
                )
                .await?;
            for (id, rec_bytes, plan_bytes) in encoded {
                for (key, bytes) in [(plan_key(&id), plan_bytes), (id, rec_bytes)] {
                    if let Cas::Refused(_) =
                        cas::write(kv, &key, bytes.into(), 0, "creating a workflow").await?
                    {
                        return Err(OjsError::backend(format!(
                            "Workflow key {key} exists already."
                        )));
                    }
                }
            }
            Ok(())
        };
        self.jobs
            .create_jobs(records, write_workflows, Duration::ZERO)
            .await?;
        self.conn.failpoint("workflow.jobs_created").await;
        let root_id = root.0.id.clone();
        let ready = cas::change(
            kv,
            &root_id,
            "workflow",
            &root_id,
            |r: Option<&WorkflowRecord>| {
                r.filter(|r| !r.ready && r.state == WorkflowState::Running)
                    .map(|r| WorkflowRecord {
                        ready: true,
                        ..r.clone()
                    })
            },
        )
        .await?;
        match ready.value {
            Some(record) if record.ready => Ok(WorkflowView {
                record,
                plan: root.1,
            }),
            _ => Err(OjsError::new(
                ErrorCode::BackendUnavailable,
                format!(
                    "Creating workflow {root_id} took longer than {} ms and it was cancelled; retry.",
                    self.conn.workflow_grace.as_millis()
                ),
            )),
        }
    }

    /// GET of a workflow: two reads whatever its size.
    ///
    /// # Errors
    /// 404 for an unknown id.
    pub async fn get(&self, id: &str) -> Result<WorkflowView, OjsError> {
        let missing = || OjsError::not_found("workflow", id);
        if parse_job_id(id).is_none() {
            return Err(missing());
        }
        let kv = &self.own.kv;
        let record = cas::read::<WorkflowRecord>(kv, id, Replica::Nearest, "workflow")
            .await?
            .value
            .ok_or_else(missing)?;
        let plan = cas::read::<Plan>(kv, &plan_key(id), Replica::Nearest, "workflow plan")
            .await?
            .value
            .ok_or_else(missing)?;
        Ok(WorkflowView { record, plan })
    }

    /// The workflows changed last, most recent first, at most `LISTED` of them, nested
    /// ones left out (they show within their parent): the records as the workflows
    /// bucket's stream holds them, one message per workflow at its latest revision, read
    /// in order from the last `2 × LISTED` messages (records and plans) through one
    /// ephemeral consumer on the records' subjects.
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn recent(&self) -> Result<Vec<WorkflowRecord>, OjsError> {
        let stream = format!("KV_{}", self.conn.topology.workflows_bucket());
        let last = self
            .own
            .kv
            .stream
            .get_info()
            .await
            .map_err(super::error::backend("reading the workflows bucket"))?
            .state
            .last_sequence;
        let records = format!("$KV.{}.*", self.conn.topology.workflows_bucket());
        let from = last.saturating_sub(2 * LISTED as u64) + 1;
        let stored = self
            .conn
            .read_stream_from(&stream, Some(&records), from, 2 * LISTED)
            .await?;
        let listed: Vec<WorkflowRecord> = stored
            .iter()
            .rev()
            .filter_map(|m| serde_json::from_slice::<WorkflowRecord>(&m.payload).ok())
            .filter(|rec| rec.parent.is_none())
            .take(LISTED)
            .collect();
        Ok(listed)
    }

    /// CANCEL of a workflow (workflows spec §11.3): the workflow timer first (it finishes a
    /// cancel cut short), the record `cancelled`, then every member that has not started.
    /// Gives the workflow and how many members were cancelled.
    ///
    /// # Errors
    /// 404 for an unknown id, 409 when the workflow already ended.
    pub async fn cancel(&self, id: &str) -> Result<(WorkflowView, usize), OjsError> {
        let view = self.get(id).await?;
        // A workflow that already ended gets its 409 before any timer is published.
        workflow::cancel(&view.record, Utc::now())?;
        self.conn
            .stored(
                self.timers
                    .send_timer(&self.workflow_timer(id, Utc::now()))
                    .await?,
            )
            .await?;
        let (record, cancelled) = self
            .decide(id, Order::WriteFirst, |rec| {
                workflow::cancel(rec, Utc::now())
            })
            .await?
            .ok_or_else(|| OjsError::not_found("workflow", id))?;
        Ok((
            WorkflowView {
                record,
                plan: view.plan,
            },
            cancelled,
        ))
    }

    /// Read, decide, and when anything changed publish the events, write with a revision
    /// check and carry out the effects in `order`; again after a refused write. Gives the
    /// record as it now stands and how many jobs the effects cancelled; `None` for a
    /// workflow that does not exist.
    pub(super) async fn decide<F>(
        &self,
        id: &str,
        order: Order,
        decide: F,
    ) -> Result<Option<(WorkflowRecord, usize)>, OjsError>
    where
        F: Fn(&WorkflowRecord) -> Result<Advance, OjsError>,
    {
        let kv = &self.own.kv;
        let mut raced = None;
        for round in 0..MAX_CAS_ATTEMPTS {
            let current =
                cas::read::<WorkflowRecord>(kv, id, Replica::after(raced.is_some()), "workflow")
                    .await?;
            let Some(record) = current.value else {
                return Ok(None); // never created, or removed: nothing to move on
            };
            let advance = decide(&record)?;
            if !advance.changed {
                return Ok(Some((record, 0)));
            }
            if !advance.happened.is_empty() {
                let plan = cas::read::<Plan>(kv, &plan_key(id), Replica::Nearest, "workflow plan")
                    .await?
                    .value;
                let now = Utc::now();
                let events: Vec<_> = advance
                    .happened
                    .iter()
                    .map(|h| {
                        workflow::event(
                            &advance.record,
                            plan.as_ref(),
                            h,
                            self.events.source(),
                            now,
                        )
                    })
                    .collect();
                self.events.publish(&events).await?;
            }
            let mut cancelled = 0;
            if order == Order::ActFirst && !advance.effects.is_empty() {
                cancelled = self.carry_out(&advance.record, &advance.effects).await?;
                self.conn.failpoint("workflow.effects_done").await;
            }
            match cas::write(
                kv,
                id,
                advance.record.to_bytes().into(),
                current.revision,
                "writing a workflow",
            )
            .await?
            {
                Cas::Written(_) => {
                    if order == Order::WriteFirst {
                        cancelled = self.carry_out(&advance.record, &advance.effects).await?;
                    }
                    return Ok(Some((advance.record, cancelled)));
                }
                Cas::Refused(why) => {
                    raced = Some(why);
                    pause_after(why, round).await;
                }
            }
        }
        Err(cas::gave_up("workflow", id, raced))
    }

    /// Carries out effects in order; gives how many jobs were cancelled.
    pub(super) async fn carry_out(
        &self,
        rec: &WorkflowRecord,
        effects: &[Effect],
    ) -> Result<usize, OjsError> {
        let mut cancelled = 0;
        for effect in effects {
            match effect {
                Effect::Activate { job_id, results } => {
                    let parent_results = match results {
                        Results::None => None,
                        Results::Given(list) => Some(Value::Array(list.clone())),
                        Results::OfMembers => Some(self.member_results(rec).await?),
                    };
                    let activated = self
                        .jobs
                        .transition(job_id, |job, now| {
                            Ok(lifecycle::activate_member(job, now, parent_results.clone()))
                        })
                        .await;
                    match activated {
                        // Results too large to pass: the job starts without them.
                        Err(err) if err.code == ErrorCode::EnvelopeTooLarge => {
                            self.jobs
                                .transition(job_id, |job, now| {
                                    Ok(lifecycle::activate_member(job, now, None))
                                })
                                .await
                                .map(drop)
                                .or_else(missing_is_done)?;
                        }
                        other => other.map(drop).or_else(missing_is_done)?,
                    }
                }
                Effect::Cancel { job_id } => {
                    let settled = self
                        .jobs
                        .transition(job_id, |job, now| Ok(lifecycle::withdraw(job, now)))
                        .await;
                    match settled {
                        Ok(s) if s.after.job.state != s.before.job.state => {
                            cancelled += 1;
                            self.jobs.release(&s).await;
                        }
                        other => other.map(drop).or_else(missing_is_done)?,
                    }
                }
                Effect::Begin {
                    workflow_id,
                    results,
                } => Box::pin(self.begin_nested(workflow_id, results.clone())).await?,
                Effect::CancelWorkflow { workflow_id } => {
                    Box::pin(self.cancel_nested(workflow_id)).await?;
                }
                Effect::Report { parent, seen } => {
                    // A nested workflow's result: its members' results, in order, after
                    // what it was begun with (workflows spec §7.3).
                    let seen = match seen {
                        Seen::Completed(_) => {
                            let mut passed = rec.received.clone().unwrap_or_default();
                            passed.push(self.member_results(rec).await?);
                            Seen::Completed(Some(passed))
                        }
                        other => other.clone(),
                    };
                    let seen = [(Slot::Member(parent.index), seen)];
                    Box::pin(self.apply_seen(&parent.workflow_id, &seen)).await?;
                }
            }
        }
        Ok(cancelled)
    }

    /// Every member's result in order (`null` for a nested workflow or a member without
    /// one): what a batch callback receives.
    async fn member_results(&self, rec: &WorkflowRecord) -> Result<Value, OjsError> {
        let mut results = Vec::with_capacity(rec.members());
        let ids: Vec<(usize, String)> = (0..rec.members()).map(|i| (i, rec.member_id(i))).collect();
        for chunk in ids.chunks(READS_AT_ONCE) {
            let reads = chunk.iter().map(|(i, id)| async move {
                if rec.is_nested(*i) {
                    return Ok(Value::Null);
                }
                Ok::<_, OjsError>(
                    self.jobs
                        .read(id, Replica::Nearest)
                        .await?
                        .and_then(|(r, _)| r.job.result)
                        .unwrap_or(Value::Null),
                )
            });
            for r in join_all(reads).await {
                results.push(r?);
            }
        }
        Ok(Value::Array(results))
    }

    pub(super) async fn apply_seen(&self, id: &str, seen: &[(Slot, Seen)]) -> Result<(), OjsError> {
        self.decide(id, Order::ActFirst, |rec| {
            Ok(workflow::apply(rec, seen, Utc::now()))
        })
        .await
        .map(drop)
    }

    /// Begins a nested workflow that waited as a later chain step.
    pub(super) async fn begin_nested(
        &self,
        id: &str,
        results: Option<Vec<Value>>,
    ) -> Result<(), OjsError> {
        self.decide(id, Order::ActFirst, |rec| {
            Ok(workflow::begin(rec, results.clone()))
        })
        .await
        .map(drop)
    }

    /// Cancels a nested (or abandoned) workflow, unless it already ended.
    pub(super) async fn cancel_nested(&self, id: &str) -> Result<(), OjsError> {
        self.decide(id, Order::ActFirst, |rec| {
            Ok(workflow::cancel(rec, Utc::now()).unwrap_or_else(|_| Advance::unchanged(rec)))
        })
        .await
        .map(drop)
    }
}

impl Workflows {
    /// The timer that checks a workflow's creation or cancel once it should be done.
    fn workflow_timer(&self, id: &str, now: chrono::DateTime<Utc>) -> Timer {
        Timer::named(
            TimerKind::Workflow,
            id,
            time::add(now, self.conn.workflow_grace),
        )
    }
}

/// A member job that no longer exists (pruned) needs nothing more.
fn missing_is_done(err: OjsError) -> Result<(), OjsError> {
    if err.code == ErrorCode::NotFound {
        Ok(())
    } else {
        Err(err)
    }
}
