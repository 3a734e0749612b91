//! `OJSService` (gRPC binding §5): each RPC admitted by the API keys, run within the
//! request deadline, and answered from the same store calls as its HTTP route.

use std::future::Future;
use std::time::Duration;

use chrono::Utc;
use serde_json::{json, Value};
use tokio::time::Instant;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Request, Response, Status};
use uuid::Uuid;

use super::convert::{self, envelope};
use super::pb::{self, ojs_service_server::OjsService};
use super::status::status;
use super::streams::{self, Settled};
use crate::domain::cron::CronEntry;
use crate::domain::envelope::{named_job_id, parse_with_default_exhaustion, validate_queue};
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::job::Job;
use crate::domain::requests;
use crate::domain::state::JobState;
use crate::domain::workflow::{self, Kind, Status as StepStatus, WorkflowState};
use crate::http::auth::{bearer_token, Access, Keys};
use crate::http::SharedState;
use crate::store::{deadline, Enqueued, WorkerState, WorkflowView};

/// Most jobs one `EnqueueBatch` may carry, as over HTTP.
const MAX_BATCH: usize = 10_000;
/// The conformance level this server claims (§15.1: every RPC of it and below).
pub const CONFORMANCE_LEVEL: i32 = 4;
/// How much sooner than the client's own deadline (`grpc-timeout`) an RPC gives up: the
/// answer then still reaches the client, as `DEADLINE_EXCEEDED`.
const CLIENT_DEADLINE_MARGIN: Duration = Duration::from_millis(20);

/// The service: the gateway's shared state and keys, and the jobs its streams hold.
pub struct Gateway {
    pub(super) state: SharedState,
    pub(super) keys: Keys,
    pub(super) settled: Settled,
}

type Answer<T> = Result<Response<T>, Status>;

impl Gateway {
    /// Runs one RPC: admits its caller for `access`, runs `work` within the request
    /// deadline (or the client's, when sooner), and answers with the binding's metadata
    /// (§9.2) or the error as a status (§7, §8).
    async fn call<T, R, F, Fut>(&self, req: Request<T>, access: Access, work: F) -> Answer<R>
    where
        F: FnOnce(T) -> Fut,
        Fut: Future<Output = Result<R, OjsError>>,
    {
        let request_id = text(req.metadata(), "x-ojs-request-id").map(str::to_owned);
        let answer = self.answer(req, access, work).await;
        let mut response = answer.map_err(|e| match e {
            Failure::Ojs(err) => status(&err, request_id.as_deref()),
            Failure::Late => {
                Status::deadline_exceeded("The call did not finish within the client's deadline.")
            }
        })?;
        let meta = response.metadata_mut();
        if let Some(id) = request_id.and_then(|id| MetadataValue::try_from(id).ok()) {
            meta.insert("x-ojs-request-id", id);
        }
        meta.insert(
            "x-ojs-server-version",
            MetadataValue::from_static(env!("CARGO_PKG_VERSION")),
        );
        meta.insert(
            "x-ojs-conformance-level",
            MetadataValue::from(CONFORMANCE_LEVEL),
        );
        Ok(response)
    }

    async fn answer<T, R, F, Fut>(
        &self,
        req: Request<T>,
        access: Access,
        work: F,
    ) -> Result<Response<R>, Failure>
    where
        F: FnOnce(T) -> Fut,
        Fut: Future<Output = Result<R, OjsError>>,
    {
        self.admit(req.metadata(), access).map_err(Failure::Ojs)?;
        let ours = Instant::now() + self.state.config.request_deadline();
        let theirs = client_deadline(req.metadata());
        let deadline = theirs.map_or(ours, |t| t.min(ours));
        // Boxed: the work's state is large, and unboxed it would be copied each time the
        // future around it moves (tonic boxes each call's future).
        let run = deadline::serve(deadline, Box::pin(work(req.into_inner())));
        let done = match theirs {
            Some(t) => tokio::time::timeout_at(t - CLIENT_DEADLINE_MARGIN, run)
                .await
                .map_err(|_| Failure::Late)?,
            None => run.await,
        };
        done.and_then(|r| r)
            .map(Response::new)
            .map_err(Failure::Ojs)
    }

    /// `Ok` when the call's key may call an RPC that asks `access`: `x-ojs-api-key` or
    /// `authorization: Bearer` (§11.2, §11.3), checked as the HTTP routes check theirs.
    pub(super) fn admit(&self, meta: &MetadataMap, access: Access) -> Result<(), OjsError> {
        if self.keys.no_keys() {
            return Ok(());
        }
        let bearer = text(meta, "authorization").and_then(bearer_token);
        let key = text(meta, "x-ojs-api-key").or(bearer);
        self.keys.check(access, key).map_or(Ok(()), Err)
    }
}

enum Failure {
    Ojs(OjsError),
    /// The client's deadline passed.
    Late,
}

fn text<'a>(meta: &'a MetadataMap, key: &str) -> Option<&'a str> {
    meta.get(key).and_then(|v| v.to_str().ok())
}

/// The client's deadline from `grpc-timeout` (an integer and a unit: H, M, S, m, u, n).
fn client_deadline(meta: &MetadataMap) -> Option<Instant> {
    let raw = text(meta, "grpc-timeout")?;
    let (digits, unit) = raw.split_at(raw.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    let timeout = match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    };
    Instant::now().checked_add(timeout)
}

fn job_answer(job: &Job) -> Option<pb::Job> {
    Some(convert::job(job))
}

fn queue_name(queue: &str) -> Result<&str, OjsError> {
    if queue.is_empty() {
        return Err(OjsError::invalid(
            "queue",
            "Missing required field 'queue'.",
        ));
    }
    validate_queue(queue)?;
    Ok(queue)
}

/// A page's start from a cursor this server handed out (an offset), or the first page.
fn offset_of(cursor: &str) -> Result<usize, OjsError> {
    if cursor.is_empty() {
        return Ok(0);
    }
    cursor
        .parse()
        .map_err(|_| OjsError::invalid("cursor", "cursor is not one this server handed out."))
}

/// A page size: `default` for 0, at most `max`.
fn limit_of(limit: i32, default: usize, max: usize) -> Result<usize, OjsError> {
    match limit {
        0 => Ok(default),
        n if n < 0 => Err(OjsError::invalid("limit", "limit must not be negative.")),
        n => Ok((n as usize).min(max)),
    }
}

fn next_cursor(offset: usize, shown: usize, total: usize) -> String {
    if offset + shown < total {
        (offset + shown).to_string()
    } else {
        String::new()
    }
}

#[tonic::async_trait]
impl OjsService for Gateway {
    async fn manifest(&self, req: Request<pb::ManifestRequest>) -> Answer<pb::ManifestResponse> {
        self.call(req, Access::Key, |_| async {
            Ok(pb::ManifestResponse {
                ojs_version: "1.0".into(),
                implementation: Some(pb::Implementation {
                    name: "ojs-jetstream".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    language: "rust".into(),
                }),
                conformance_level: CONFORMANCE_LEVEL,
                protocols: self
                    .state
                    .protocols()
                    .into_iter()
                    .map(str::to_owned)
                    .collect(),
                backend: "nats-jetstream".into(),
                extensions: Vec::new(),
                schema_validation: false,
            })
        })
        .await
    }

    async fn health(&self, req: Request<pb::HealthRequest>) -> Answer<pb::HealthResponse> {
        self.call(req, Access::Probe, |_| async {
            let stalled = self.state.stalls.last();
            let (status, details) = match self.state.store.ping().await {
                Ok(latency) if stalled.is_some() => (
                    pb::HealthStatus::Degraded,
                    json!({"backend": "nats", "latency_ms": latency.as_millis() as u64, "stalled": stalled}),
                ),
                Ok(latency) => (
                    pb::HealthStatus::Ok,
                    json!({"backend": "nats", "latency_ms": latency.as_millis() as u64}),
                ),
                Err(err) => (
                    pb::HealthStatus::Unhealthy,
                    json!({"backend": "nats", "error": err.message}),
                ),
            };
            Ok(pb::HealthResponse {
                status: status as i32,
                timestamp: Some(convert::timestamp(Utc::now())),
                details: details.as_object().map(convert::structure),
            })
        })
        .await
    }

    async fn enqueue(&self, req: Request<pb::EnqueueRequest>) -> Answer<pb::EnqueueResponse> {
        let trace = trace_context(req.metadata());
        self.call(req, Access::Key, |r| async move {
            let now = Utc::now();
            let mut body = envelope(r.r#type, r.args, r.options, now)?;
            with_trace_context(&mut body, trace);
            let job = self.parse_job(Value::Object(body), now)?;
            let job = match self.push(vec![job]).await? {
                Enqueued::Created(mut jobs) => jobs.remove(0),
                Enqueued::Existing(job) => *job,
            };
            Ok(pb::EnqueueResponse {
                job: job_answer(&job),
            })
        })
        .await
    }

    async fn enqueue_batch(
        &self,
        req: Request<pb::EnqueueBatchRequest>,
    ) -> Answer<pb::EnqueueBatchResponse> {
        self.call(req, Access::Key, |r| async move {
            if r.jobs.is_empty() {
                return Err(OjsError::invalid(
                    "jobs",
                    "jobs must contain at least one job.",
                ));
            }
            if r.jobs.len() > MAX_BATCH {
                return Err(OjsError::invalid(
                    "jobs",
                    format!(
                        "A batch may carry at most {MAX_BATCH} jobs, got {}.",
                        r.jobs.len()
                    ),
                ));
            }
            let now = Utc::now();
            let jobs = r
                .jobs
                .into_iter()
                .enumerate()
                .map(|(index, entry)| {
                    let options = merged(r.default_options.clone(), entry.options);
                    envelope(entry.r#type, entry.args, options, now)
                        .and_then(|body| self.parse_job(Value::Object(body), now))
                        .map_err(|mut e| {
                            e.message = format!(
                                "Batch validation failed: job at index {index}: {}",
                                e.message
                            );
                            e.details.insert("index".into(), json!(index));
                            e
                        })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let jobs = match self.push(jobs).await? {
                Enqueued::Created(jobs) => jobs,
                Enqueued::Existing(job) => vec![*job],
            };
            Ok(pb::EnqueueBatchResponse {
                count: jobs.len() as i32,
                jobs: jobs.iter().map(convert::job).collect(),
                errors: Default::default(),
            })
        })
        .await
    }

    async fn get_job(&self, req: Request<pb::GetJobRequest>) -> Answer<pb::GetJobResponse> {
        self.call(req, Access::Key, |r| async move {
            let job = self
                .state
                .store
                .jobs()
                .info(&named_job_id(&r.job_id)?)
                .await?;
            Ok(pb::GetJobResponse {
                job: job_answer(&job),
            })
        })
        .await
    }

    async fn cancel_job(
        &self,
        req: Request<pb::CancelJobRequest>,
    ) -> Answer<pb::CancelJobResponse> {
        self.call(req, Access::Key, |r| async move {
            let settled = self
                .state
                .store
                .jobs()
                .cancel(&named_job_id(&r.job_id)?)
                .await?;
            self.settled.settle(&settled.after.job.id);
            Ok(pb::CancelJobResponse {
                job: job_answer(&settled.after.job),
            })
        })
        .await
    }

    async fn activate_job(
        &self,
        req: Request<pb::ActivateJobRequest>,
    ) -> Answer<pb::ActivateJobResponse> {
        self.call(req, Access::Key, |r| async move {
            let job = self
                .state
                .store
                .jobs()
                .activate(&named_job_id(&r.job_id)?)
                .await?;
            Ok(pb::ActivateJobResponse {
                job: job_answer(&job),
            })
        })
        .await
    }

    async fn fetch(&self, req: Request<pb::FetchRequest>) -> Answer<pb::FetchResponse> {
        self.call(req, Access::Key, |r| async move {
            let mut body = json!({"queues": r.queues, "count": r.count.max(1)});
            if !r.worker_id.is_empty() {
                body["worker_id"] = json!(r.worker_id);
            }
            let req = requests::fetch(
                body.as_object().expect("an object"),
                &self.state.config.request_limits(),
            )?;
            let jobs = self.state.store.workers().fetch(req).await?;
            Ok(pb::FetchResponse {
                jobs: jobs.iter().map(convert::job).collect(),
            })
        })
        .await
    }

    async fn ack(&self, req: Request<pb::AckRequest>) -> Answer<pb::AckResponse> {
        self.call(req, Access::Key, |r| async move {
            let mut body = json!({"job_id": r.job_id});
            if let Some(result) = r.result {
                body["result"] = Value::Object(convert::object_of(result)?);
            }
            let req = requests::ack(body.as_object().expect("an object"))?;
            let settled = self
                .state
                .store
                .jobs()
                .ack(&req.job_id, req.worker_id.as_deref(), req.result)
                .await?;
            self.settled.settle(&settled.after.job.id);
            Ok(pb::AckResponse { acknowledged: true })
        })
        .await
    }

    async fn nack(&self, req: Request<pb::NackRequest>) -> Answer<pb::NackResponse> {
        self.call(req, Access::Key, |r| async move {
            let mut body = json!({"job_id": r.job_id});
            if let Some(e) = r.error {
                let mut error =
                    json!({"code": e.code, "message": e.message, "retryable": e.retryable});
                if e.code.is_empty() {
                    error["code"] = json!("handler_error");
                }
                if !e.backtrace.is_empty() {
                    error["backtrace"] = json!(e.backtrace);
                }
                if let Some(details) = e.details {
                    error["details"] = Value::Object(convert::object_of(details)?);
                }
                body["error"] = error;
            }
            let req = requests::fail(body.as_object().expect("an object"))?;
            let settled = self
                .state
                .store
                .jobs()
                .fail(
                    &req.job_id,
                    req.worker_id.as_deref(),
                    &req.failure,
                    req.requeue,
                )
                .await?;
            let job = settled.after.job;
            self.settled.settle(&job.id);
            Ok(pb::NackResponse {
                state: convert::state(job.state) as i32,
                next_attempt_at: job.next_attempt_at.map(convert::timestamp),
            })
        })
        .await
    }

    async fn heartbeat(&self, req: Request<pb::HeartbeatRequest>) -> Answer<pb::HeartbeatResponse> {
        self.call(req, Access::Key, |r| async move {
            // `id` names a job for a per-job heartbeat, else the worker itself.
            let job_id = crate::domain::envelope::parse_job_id(&r.id);
            let worker_id = if r.worker_id.is_empty() {
                r.id.clone()
            } else {
                r.worker_id
            };
            let mut body = json!({"worker_id": worker_id});
            if let Some(id) = &job_id {
                body["job_id"] = json!(id);
            }
            let extend_ms = r
                .extend_by
                .as_ref()
                .map(|d| convert::millis(d, "extend_by"))
                .transpose()?;
            if let Some(ms) = extend_ms {
                body["visibility_timeout_ms"] = json!(ms);
            }
            let reported = match pb::WorkerState::try_from(r.current_state) {
                Ok(pb::WorkerState::Running) => Some("running"),
                Ok(pb::WorkerState::Quiet) => Some("quiet"),
                Ok(pb::WorkerState::Terminate) => Some("terminate"),
                Ok(pb::WorkerState::Unspecified) => None,
                Err(_) => {
                    return Err(OjsError::invalid(
                        "current_state",
                        format!("current_state {} is no worker state.", r.current_state),
                    ))
                }
            };
            if let Some(s) = reported {
                body["state"] = json!(s);
            }
            let beat = requests::heartbeat(
                body.as_object().expect("an object"),
                &self.state.config.request_limits(),
            )?;
            let reply = self
                .state
                .store
                .workers()
                .heartbeat(&beat, self.state.config.allow_reset)
                .await?;
            let directed = match reply.state {
                WorkerState::Running => pb::WorkerState::Running,
                WorkerState::Quiet => pb::WorkerState::Quiet,
                WorkerState::Terminate => pb::WorkerState::Terminate,
            };
            let new_deadline = match &job_id {
                Some(id) if reply.jobs_extended.contains(id) => {
                    self.deadline_of(id, extend_ms).await
                }
                _ => None,
            };
            Ok(pb::HeartbeatResponse {
                directed_state: directed as i32,
                new_deadline,
            })
        })
        .await
    }

    type StreamJobsStream = streams::JobStream;

    async fn stream_jobs(
        &self,
        req: Request<pb::StreamJobsRequest>,
    ) -> Answer<Self::StreamJobsStream> {
        self.call(req, Access::Key, |r| async move {
            streams::jobs(&self.state, &self.settled, r).await
        })
        .await
    }

    type StreamEventsStream = streams::EventStream;

    async fn stream_events(
        &self,
        req: Request<pb::StreamEventsRequest>,
    ) -> Answer<Self::StreamEventsStream> {
        let last = text(req.metadata(), "last-event-id").and_then(|v| v.trim().parse().ok());
        self.call(req, Access::Key, |r| async move {
            streams::events(&self.state, r, last).await
        })
        .await
    }

    async fn list_queues(
        &self,
        req: Request<pb::ListQueuesRequest>,
    ) -> Answer<pb::ListQueuesResponse> {
        self.call(req, Access::Key, |r| async move {
            let limit = limit_of(r.limit, 100, 1000)?;
            let offset = offset_of(&r.cursor)?;
            let all = self.state.store.queues().list();
            let page: Vec<_> = all.iter().skip(offset).take(limit).collect();
            let mut queues = Vec::with_capacity(page.len());
            for q in &page {
                let stats = self.state.store.stats().queue(&q.name).await?;
                queues.push(pb::QueueInfo {
                    name: q.name.clone(),
                    paused: q.paused,
                    available_count: stats.counts.states.of(JobState::Available) as i64,
                    created_at: Some(convert::timestamp(q.created_at)),
                });
            }
            Ok(pb::ListQueuesResponse {
                next_cursor: next_cursor(offset, page.len(), all.len()),
                queues,
            })
        })
        .await
    }

    async fn queue_stats(
        &self,
        req: Request<pb::QueueStatsRequest>,
    ) -> Answer<pb::QueueStatsResponse> {
        self.call(req, Access::Key, |r| async move {
            let name = queue_name(&r.queue)?;
            let stats = self.state.store.stats().queue(name).await?;
            let of = |s| stats.counts.states.of(s) as i64;
            Ok(pb::QueueStatsResponse {
                queue: name.to_owned(),
                stats: Some(pb::QueueStatistics {
                    available: of(JobState::Available),
                    active: of(JobState::Active),
                    scheduled: of(JobState::Scheduled),
                    retryable: of(JobState::Retryable),
                    dead: stats.dead as i64,
                    throughput_per_second: stats.counts.throughput(stats.computed_at),
                    paused: stats.meta.as_ref().is_some_and(|m| m.paused),
                    ..Default::default()
                }),
            })
        })
        .await
    }

    async fn pause_queue(
        &self,
        req: Request<pb::PauseQueueRequest>,
    ) -> Answer<pb::PauseQueueResponse> {
        self.call(req, Access::Admin, |r| async move {
            self.state
                .store
                .queues()
                .pause(queue_name(&r.queue)?, true)
                .await?;
            Ok(pb::PauseQueueResponse {})
        })
        .await
    }

    async fn resume_queue(
        &self,
        req: Request<pb::ResumeQueueRequest>,
    ) -> Answer<pb::ResumeQueueResponse> {
        self.call(req, Access::Admin, |r| async move {
            self.state
                .store
                .queues()
                .pause(queue_name(&r.queue)?, false)
                .await?;
            Ok(pb::ResumeQueueResponse {})
        })
        .await
    }

    async fn list_dead_letter(
        &self,
        req: Request<pb::ListDeadLetterRequest>,
    ) -> Answer<pb::ListDeadLetterResponse> {
        self.call(req, Access::Key, |r| async move {
            let limit = limit_of(r.limit, 50, 1000)?;
            let offset = offset_of(&r.cursor)?;
            let queue = (!r.queue.is_empty()).then_some(r.queue.as_str());
            if let Some(q) = queue {
                validate_queue(q)?;
            }
            let page = self
                .state
                .store
                .dead_letter()
                .list(queue, limit, offset)
                .await?;
            Ok(pb::ListDeadLetterResponse {
                jobs: page.jobs.iter().map(convert::job).collect(),
                total_count: page.total as i64,
                // Positions, not jobs: a stale entry takes one and shows nothing.
                next_cursor: next_cursor(offset, limit, page.total as usize),
            })
        })
        .await
    }

    async fn retry_dead_letter(
        &self,
        req: Request<pb::RetryDeadLetterRequest>,
    ) -> Answer<pb::RetryDeadLetterResponse> {
        self.call(req, Access::Key, |r| async move {
            let job = self
                .state
                .store
                .dead_letter()
                .retry(&named_job_id(&r.job_id)?)
                .await?;
            Ok(pb::RetryDeadLetterResponse {
                job: job_answer(&job),
            })
        })
        .await
    }

    async fn delete_dead_letter(
        &self,
        req: Request<pb::DeleteDeadLetterRequest>,
    ) -> Answer<pb::DeleteDeadLetterResponse> {
        self.call(req, Access::Admin, |r| async move {
            self.state
                .store
                .dead_letter()
                .delete(&named_job_id(&r.job_id)?)
                .await?;
            Ok(pb::DeleteDeadLetterResponse {})
        })
        .await
    }

    async fn register_cron(
        &self,
        req: Request<pb::RegisterCronRequest>,
    ) -> Answer<pb::RegisterCronResponse> {
        self.call(req, Access::Key, |r| async move {
            let now = Utc::now();
            let mut body = envelope(r.r#type, r.args, r.options, now)?;
            body.insert("name".into(), json!(r.name));
            body.insert("cron".into(), json!(r.cron));
            if !r.timezone.is_empty() {
                body.insert("timezone".into(), json!(r.timezone));
            }
            let entry = CronEntry::parse(&body, now)?;
            let (entry, _) = self.state.store.cron().register(entry).await?;
            Ok(pb::RegisterCronResponse {
                name: entry.name,
                next_run_at: entry.next_run_at.map(convert::timestamp),
            })
        })
        .await
    }

    async fn unregister_cron(
        &self,
        req: Request<pb::UnregisterCronRequest>,
    ) -> Answer<pb::UnregisterCronResponse> {
        self.call(req, Access::Key, |r| async move {
            if !crate::domain::cron::is_entry_name(&r.name) {
                return Err(OjsError::not_found("cron entry", &r.name));
            }
            self.state.store.cron().delete(&r.name).await?;
            Ok(pb::UnregisterCronResponse {})
        })
        .await
    }

    async fn list_cron(&self, req: Request<pb::ListCronRequest>) -> Answer<pb::ListCronResponse> {
        self.call(req, Access::Key, |_| async move {
            let entries = self.state.store.cron().list();
            Ok(pb::ListCronResponse {
                entries: entries.iter().map(cron_entry).collect(),
            })
        })
        .await
    }

    async fn create_workflow(
        &self,
        req: Request<pb::CreateWorkflowRequest>,
    ) -> Answer<pb::CreateWorkflowResponse> {
        self.call(req, Access::Key, |r| async move {
            let now = Utc::now();
            let steps = r
                .steps
                .into_iter()
                .map(|s| {
                    let mut step = envelope(s.r#type, s.args, s.options, now)?;
                    step.insert("id".into(), json!(s.id));
                    step.insert("depends_on".into(), json!(s.depends_on));
                    Ok(Value::Object(step))
                })
                .collect::<Result<Vec<_>, OjsError>>()?;
            let request = workflow::parse(json!({"name": r.name, "steps": steps}))?;
            let view = self.state.store.workflows().create(&request).await?;
            Ok(pb::CreateWorkflowResponse {
                workflow: Some(workflow_message(&view)),
            })
        })
        .await
    }

    async fn get_workflow(
        &self,
        req: Request<pb::GetWorkflowRequest>,
    ) -> Answer<pb::GetWorkflowResponse> {
        self.call(req, Access::Key, |r| async move {
            let view = self.state.store.workflows().get(&r.workflow_id).await?;
            Ok(pb::GetWorkflowResponse {
                workflow: Some(workflow_message(&view)),
            })
        })
        .await
    }

    async fn cancel_workflow(
        &self,
        req: Request<pb::CancelWorkflowRequest>,
    ) -> Answer<pb::CancelWorkflowResponse> {
        self.call(req, Access::Key, |r| async move {
            let (view, _) = self.state.store.workflows().cancel(&r.workflow_id).await?;
            Ok(pb::CancelWorkflowResponse {
                workflow: Some(workflow_message(&view)),
            })
        })
        .await
    }
}

impl Gateway {
    fn parse_job(&self, body: Value, now: chrono::DateTime<Utc>) -> Result<Job, OjsError> {
        parse_with_default_exhaustion(
            body,
            now,
            Uuid::now_v7(),
            self.state.config.default_on_exhaustion,
        )
    }

    /// PUSH without waiting for room in a bounded queue; a refusal by a queue's bound is
    /// counted as over HTTP.
    async fn push(&self, jobs: Vec<Job>) -> Result<Enqueued, OjsError> {
        match self.state.store.jobs().enqueue(jobs, Duration::ZERO).await {
            Err(err) if err.code == ErrorCode::QueueFull => {
                if let Some(queue) = err.details.get("queue").and_then(Value::as_str) {
                    self.state.metrics.backpressure_rejected(queue);
                }
                Err(err)
            }
            other => other,
        }
    }

    /// When the reservation of the job `id`, just extended, now ends: a heartbeat renews
    /// it from now, for `extend_by` or the job's own reservation.
    async fn deadline_of(
        &self,
        id: &str,
        extend_ms: Option<u64>,
    ) -> Option<prost_types::Timestamp> {
        let reservation = match extend_ms {
            Some(ms) => ms,
            None => {
                let job = self.state.store.jobs().info(id).await.ok()?;
                job.visibility_timeout_ms
                    .unwrap_or(self.state.config.visibility_timeout_ms)
            }
        };
        Some(convert::timestamp(
            Utc::now() + chrono::Duration::milliseconds(reservation as i64),
        ))
    }
}

/// The W3C trace context a call carries (§9.4): `traceparent` and `tracestate`.
fn trace_context(meta: &MetadataMap) -> Vec<(&'static str, String)> {
    ["traceparent", "tracestate"]
        .into_iter()
        .filter_map(|key| Some((key, text(meta, key)?.to_owned())))
        .collect()
}

/// Keeps the call's trace context in the job's `meta`, where workers continue the trace
/// (§9.4); a `meta.traceparent` the client set itself wins.
fn with_trace_context(body: &mut serde_json::Map<String, Value>, trace: Vec<(&str, String)>) {
    if trace.is_empty() {
        return;
    }
    let meta = body.entry("meta").or_insert_with(|| json!({}));
    if let Some(meta) = meta.as_object_mut() {
        if !meta.contains_key("traceparent") {
            for (key, value) in trace {
                meta.insert(key.to_owned(), json!(value));
            }
        }
    }
}

/// A batch entry's options over the batch's defaults, field by field: a field the entry
/// sets (non-zero, non-empty) wins.
fn merged(
    defaults: Option<pb::EnqueueOptions>,
    own: Option<pb::EnqueueOptions>,
) -> Option<pb::EnqueueOptions> {
    let (Some(d), Some(o)) = (defaults.clone(), own.clone()) else {
        return own.or(defaults);
    };
    Some(pb::EnqueueOptions {
        queue: if o.queue.is_empty() { d.queue } else { o.queue },
        priority: if o.priority == 0 {
            d.priority
        } else {
            o.priority
        },
        delay_until: o.delay_until.or(d.delay_until),
        timeout: o.timeout.or(d.timeout),
        retry: o.retry.or(d.retry),
        unique: o.unique.or(d.unique),
        ttl: o.ttl.or(d.ttl),
        tags: if o.tags.is_empty() { d.tags } else { o.tags },
        trace_id: if o.trace_id.is_empty() {
            d.trace_id
        } else {
            o.trace_id
        },
        meta: o.meta.or(d.meta),
        max_attempts: if o.max_attempts == 0 {
            d.max_attempts
        } else {
            o.max_attempts
        },
        visibility_timeout: o.visibility_timeout.or(d.visibility_timeout),
        pending: o.pending || d.pending,
    })
}

fn cron_entry(entry: &CronEntry) -> pb::CronEntry {
    let template = &entry.job_template;
    let options = template.get("options").and_then(Value::as_object);
    let option = |key: &str| options.and_then(|o| o.get(key));
    pb::CronEntry {
        name: entry.name.clone(),
        cron: entry.expression.clone(),
        timezone: entry.timezone.clone(),
        r#type: template["type"].as_str().unwrap_or_default().to_owned(),
        args: template["args"]
            .as_array()
            .map(|a| a.iter().map(convert::value).collect())
            .unwrap_or_default(),
        options: options.map(|_| pb::EnqueueOptions {
            queue: option("queue")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            priority: option("priority")
                .and_then(Value::as_i64)
                .unwrap_or_default() as i32,
            timeout: option("timeout_ms")
                .and_then(Value::as_u64)
                .map(convert::duration_of_millis),
            tags: option("tags")
                .and_then(Value::as_array)
                .map(|t| {
                    t.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default(),
            max_attempts: option("max_attempts")
                .and_then(Value::as_i64)
                .unwrap_or_default() as i32,
            ..Default::default()
        }),
        next_run_at: entry.next_run_at.map(convert::timestamp),
        last_run_at: entry.last_run_at.map(convert::timestamp),
    }
}

fn workflow_message(view: &WorkflowView) -> pb::Workflow {
    let (rec, plan) = (&view.record, &view.plan);
    let state = match rec.state {
        WorkflowState::Running => pb::WorkflowState::Running,
        WorkflowState::Completed => pb::WorkflowState::Completed,
        WorkflowState::Failed => pb::WorkflowState::Failed,
        WorkflowState::Cancelled => pb::WorkflowState::Cancelled,
    };
    let step_id = |i: usize| {
        plan.step_ids
            .get(i)
            .cloned()
            .flatten()
            .unwrap_or_else(|| rec.member_id(i))
    };
    let steps = (0..rec.members())
        .map(|i| {
            let job_id = rec.member_id(i);
            let step_state = match rec.status_of(i) {
                StepStatus::Waiting => pb::WorkflowStepState::Waiting,
                StepStatus::Enqueued => pb::WorkflowStepState::Pending,
                StepStatus::Started => pb::WorkflowStepState::Active,
                StepStatus::Completed => pb::WorkflowStepState::Completed,
                StepStatus::Failed => pb::WorkflowStepState::Failed,
                StepStatus::Cancelled | StepStatus::Skipped => pb::WorkflowStepState::Cancelled,
            };
            pb::WorkflowStepStatus {
                id: step_id(i),
                r#type: plan.types.get(i).cloned().unwrap_or_default(),
                state: step_state as i32,
                job_id,
                // A chain's step waits for the one before it; a group's and a batch's
                // members wait for nothing.
                depends_on: match rec.kind {
                    Kind::Chain if i > 0 => vec![step_id(i - 1)],
                    _ => Vec::new(),
                },
            }
        })
        .collect();
    pb::Workflow {
        id: rec.id.clone(),
        name: rec.name.clone(),
        state: state as i32,
        steps,
        created_at: Some(convert::timestamp(rec.created_at)),
        completed_at: rec.finished_at.map(convert::timestamp),
    }
}
