//! A worker following the OJS worker protocol (worker-protocol seed), over the HTTP binding:
//! a handler registry by job type, an execution middleware chain, bounded concurrency,
//! heartbeats that carry server directives, and the running → quiet → terminate lifecycle
//! driven by directives and POSIX signals (SIGTERM, SIGTSTP, SIGCONT, SIGINT).
//!
//! ```no_run
//! use ojs_client::worker::{HandlerError, JobContext, Worker, WorkerConfig};
//! use serde_json::Value;
//!
//! # async fn demo() {
//! let mut worker = Worker::new(WorkerConfig::new("http://127.0.0.1:8080", &["email"]));
//! worker.register("email.send", |ctx: JobContext| async move {
//!     let to = ctx.args[0].as_str().unwrap_or_default().to_owned();
//!     if to.is_empty() {
//!         return Err(HandlerError::new("InvalidAddress", "no recipient"));
//!     }
//!     Ok(Value::String(format!("sent to {to}")))
//! });
//! let summary = worker.run().await; // until SIGTERM or a terminate directive
//! println!("completed {}", summary.jobs_completed);
//! # }
//! ```

mod health;

use std::collections::HashMap;
use std::future::Future;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::{watch, Semaphore};
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn, Instrument};

use crate::trace::TraceContext;
use crate::{BoxFuture, Chain, Client, ClientError};

/// Longest backtrace sent with a failure (worker protocol: ≤ 50 frames, ≤ 10,000 chars).
const MAX_BACKTRACE_FRAMES: usize = 50;
const MAX_BACKTRACE_CHARS: usize = 10_000;
/// How long an ACK or FAIL is sent again while the server cannot be reached, and how long
/// a stopping worker waits for those already under way.
const REPORT_PATIENCE: Duration = Duration::from_secs(3);

/// Settings of a worker; `new` fills the protocol's defaults.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub url: String,
    /// Queues in the order to fetch from.
    pub queues: Vec<String>,
    /// Jobs run at once, never more. Default 10.
    pub concurrency: usize,
    /// Default 5 s (worker protocol §4.2).
    pub heartbeat_interval: Duration,
    /// How long a terminating worker waits for its jobs. Default 25 s (§7.3).
    pub grace_period: Duration,
    /// Unique per process: `worker_<uuidv7>` by default.
    pub worker_id: String,
    /// Reservation asked for on each fetch; the job's or the server's otherwise.
    pub visibility_timeout: Option<Duration>,
    /// How long a fetch may wait at the server for a job while the queues are empty (long
    /// polling, the fetch's `wait_ms`): a job is picked up the moment it arrives, without
    /// polling. Default 2 s (core §7.2); zero asks for an immediate answer.
    pub fetch_wait: Duration,
    /// Pause after an empty fetch. Default 0: the fetch itself waited.
    pub poll_interval: Duration,
    pub labels: Vec<String>,
}

impl WorkerConfig {
    pub fn new(url: &str, queues: &[&str]) -> WorkerConfig {
        WorkerConfig {
            url: url.to_owned(),
            queues: queues.iter().map(|q| (*q).to_owned()).collect(),
            concurrency: 10,
            heartbeat_interval: Duration::from_secs(5),
            grace_period: Duration::from_secs(25),
            worker_id: format!("worker_{}", uuid::Uuid::now_v7()),
            visibility_timeout: None,
            fetch_wait: Duration::from_secs(2),
            poll_interval: Duration::ZERO,
            labels: Vec::new(),
        }
    }
}

/// A handler's failure: its type (matched against `non_retryable_errors`), a message and
/// a backtrace.
#[derive(Debug, Clone, PartialEq)]
pub struct HandlerError {
    pub error_type: String,
    pub message: String,
    pub backtrace: Option<String>,
    /// `false` makes the failure final whatever the retry policy says.
    pub retryable: bool,
}

impl HandlerError {
    /// A retryable error with the current backtrace.
    pub fn new(error_type: &str, message: impl Into<String>) -> HandlerError {
        let trace = std::backtrace::Backtrace::force_capture().to_string();
        HandlerError {
            error_type: error_type.to_owned(),
            message: message.into(),
            backtrace: Some(trace),
            retryable: true,
        }
    }

    #[must_use]
    pub fn final_error(mut self) -> HandlerError {
        self.retryable = false;
        self
    }
}

/// What a handler gets: the job, and ways to talk about it while it runs.
#[derive(Clone)]
pub struct JobContext {
    /// The whole job as fetched.
    pub job: Value,
    pub id: String,
    pub job_type: String,
    pub args: Value,
    pub attempt: u64,
    /// The workflow the job belongs to, if any.
    pub workflow_id: Option<String>,
    /// In a workflow, the results of the members before it (a chain step: those of the
    /// earlier steps, in order; a batch callback: every member's), workflows spec §7.
    pub parent_results: Option<Value>,
    cancel: CancellationToken,
    client: Client,
    worker_id: String,
}

impl JobContext {
    /// The trace context the job was enqueued with (`meta.traceparent`, `meta.tracestate`).
    /// A job the handler enqueues carries it on as
    /// `JobSpec::trace_context(&ctx.trace_context()?.child())`.
    pub fn trace_context(&self) -> Option<TraceContext> {
        self.job["meta"]
            .as_object()
            .and_then(TraceContext::from_meta)
    }

    /// The span the handler runs in (tracing spec §4.1: `{queue} process`, CONSUMER), with
    /// the job's ids and, when it came with trace context, the trace id and the producer's
    /// span id (`link.span_id`) for a subscriber to link it to.
    fn span(&self) -> tracing::Span {
        let queue = self.job["queue"].as_str().unwrap_or_default();
        let span = tracing::info_span!(
            "process",
            otel.name = %format_args!("{queue} process"),
            otel.kind = "consumer",
            messaging.system = "ojs",
            ojs.job.id = %self.id,
            ojs.job.type = %self.job_type,
            ojs.job.queue = queue,
            ojs.job.attempt = self.attempt,
            trace_id = tracing::field::Empty,
            link.span_id = tracing::field::Empty,
        );
        if let Some(trace) = self.trace_context() {
            span.record("trace_id", trace.trace_id.as_str());
            span.record("link.span_id", trace.span_id.as_str());
        }
        span
    }

    /// Extends this job's reservation now (worker protocol §5.4), for long steps between
    /// the worker's regular heartbeats. Learns of a cancellation too.
    ///
    /// # Errors
    /// When the server cannot be reached.
    pub async fn heartbeat(&self) -> Result<(), ClientError> {
        let body = json!({"worker_id": self.worker_id, "active_jobs": [self.id]});
        let answer = self
            .client
            .call(
                reqwest::Method::POST,
                "/ojs/v1/workers/heartbeat",
                Some(body),
            )
            .await?;
        if answer["jobs_cancelled"]
            .as_array()
            .is_some_and(|c| c.iter().any(|id| id == self.id.as_str()))
        {
            self.cancel.cancel();
        }
        Ok(())
    }

    /// Reports this job's progress (progress spec §6): `fraction` of the work done, 0 to 1
    /// (clamped; a lower value than before is ignored), with an optional message. It also
    /// extends the reservation like [`JobContext::heartbeat`]. The server stores at most
    /// one report a second per job, always the latest.
    ///
    /// # Errors
    /// When the server cannot be reached or refuses the report.
    pub async fn progress(&self, fraction: f64, message: Option<&str>) -> Result<(), ClientError> {
        let mut body = json!({"progress": fraction, "worker_id": self.worker_id});
        if let Some(message) = message {
            body["message"] = json!(message);
        }
        let path = format!("/ojs/v1/jobs/{}/progress", crate::segment(&self.id));
        self.client
            .call(reqwest::Method::PUT, &path, Some(body))
            .await?;
        Ok(())
    }

    /// Fires when the server reports the job cancelled (or the worker is going down hard).
    pub fn cancelled(&self) -> &CancellationToken {
        &self.cancel
    }
}

/// Runs jobs of one type.
pub trait Handler: Send + Sync {
    fn call(&self, ctx: JobContext) -> BoxFuture<'static, Result<Value, HandlerError>>;
}

impl<F, Fut> Handler for F
where
    F: Fn(JobContext) -> Fut + Send + Sync,
    Fut: Future<Output = Result<Value, HandlerError>> + Send + 'static,
{
    fn call(&self, ctx: JobContext) -> BoxFuture<'static, Result<Value, HandlerError>> {
        Box::pin(self(ctx))
    }
}

/// Execution middleware (middleware spec §4): wraps every handler call; may act before and
/// after `next`, change the context, or fail the job without running the handler.
pub trait ExecutionMiddleware: Send + Sync {
    fn handle<'a>(
        &'a self,
        ctx: JobContext,
        next: ExecutionNext<'a>,
    ) -> BoxFuture<'a, Result<Value, HandlerError>>;
}

/// The rest of the execution chain, ending in the handler.
pub struct ExecutionNext<'a> {
    rest: &'a [(String, Arc<dyn ExecutionMiddleware>)],
    handler: &'a Arc<dyn Handler>,
}

impl<'a> ExecutionNext<'a> {
    pub fn run(self, ctx: JobContext) -> BoxFuture<'a, Result<Value, HandlerError>> {
        match self.rest.split_first() {
            Some(((_, m), rest)) => m.handle(
                ctx,
                ExecutionNext {
                    rest,
                    handler: self.handler,
                },
            ),
            None => self.handler.call(ctx),
        }
    }
}

/// Counts of a finished run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    pub jobs_completed: u64,
    pub jobs_failed: u64,
    /// Handed back with a failure of type `shutdown` (requeued at once): unfinished at the
    /// end of the grace period, or delivered by a fetch in flight as the worker quieted or
    /// stopped.
    pub jobs_shutdown: u64,
}

/// A worker's lifecycle state (worker protocol §2), in the order it moves: a worker never
/// goes back down it, but for SIGCONT taking a quiet worker back to running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum WorkerState {
    Running,
    Quiet,
    Terminate,
}

impl WorkerState {
    /// The protocol's name, as heartbeats report the state and directives name it.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Running => "running",
            WorkerState::Quiet => "quiet",
            WorkerState::Terminate => "terminate",
        }
    }

    /// The state a heartbeat answer's `state` directive names.
    fn from_directive(name: &str) -> Option<WorkerState> {
        [
            WorkerState::Running,
            WorkerState::Quiet,
            WorkerState::Terminate,
        ]
        .into_iter()
        .find(|state| state.as_str() == name)
    }
}

/// Moves a running worker through its lifecycle from outside (signals, tests).
#[derive(Clone)]
pub struct WorkerControl {
    state: watch::Sender<WorkerState>,
    immediate: CancellationToken,
}

impl WorkerControl {
    /// Stop fetching; finish active jobs.
    pub fn quiet(&self) {
        self.state
            .send_if_modified(|s| advance(s, WorkerState::Quiet));
    }

    /// Back to running from quiet; ignored once terminating (§2.3).
    pub fn resume(&self) {
        self.state.send_if_modified(|s| {
            let back = *s == WorkerState::Quiet;
            if back {
                *s = WorkerState::Running;
            }
            back
        });
    }

    /// Graceful shutdown (§7).
    pub fn terminate(&self) {
        self.state
            .send_if_modified(|s| advance(s, WorkerState::Terminate));
    }

    /// SIGINT: shut down without waiting for active jobs.
    pub fn interrupt(&self) {
        self.immediate.cancel();
        self.terminate();
    }
}

/// Forward only: running < quiet < terminate.
fn advance(current: &mut WorkerState, to: WorkerState) -> bool {
    let moved = to > *current;
    if moved {
        *current = to;
    }
    moved
}

struct Active {
    cancel: CancellationToken,
    abort: Option<AbortHandle>,
}

/// A worker process's engine.
pub struct Worker {
    cfg: WorkerConfig,
    client: Client,
    handlers: HashMap<String, Arc<dyn Handler>>,
    chain: Chain<dyn ExecutionMiddleware>,
    control: WorkerControl,
    /// Where the liveness and readiness probes are served, if anywhere.
    health: Option<TcpListener>,
}

impl Worker {
    pub fn new(cfg: WorkerConfig) -> Worker {
        let (state, _) = watch::channel(WorkerState::Running);
        Worker {
            client: Client::new(&cfg.url),
            cfg,
            handlers: HashMap::new(),
            chain: Chain::default(),
            control: WorkerControl {
                state,
                immediate: CancellationToken::new(),
            },
            health: None,
        }
    }

    /// Serves the worker's liveness (`GET /healthz`) and readiness (`GET /readyz`) probes
    /// on `addr` while it runs; readiness fails once it is quiet or terminating. Binds now,
    /// so a taken port is an error here, and port 0 picks a free one.
    ///
    /// # Errors
    /// When `addr` cannot be bound.
    pub fn serve_health(&mut self, addr: impl ToSocketAddrs) -> std::io::Result<SocketAddr> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let bound = listener.local_addr()?;
        self.health = Some(listener);
        Ok(bound)
    }

    /// Sends `key` with every request, for a server that asks for API keys.
    pub fn api_key(&mut self, key: &str) -> &mut Self {
        self.client = self.client.clone().with_api_key(key);
        self
    }

    /// Registers the handler of `job_type`.
    pub fn register<H: Handler + 'static>(&mut self, job_type: &str, handler: H) -> &mut Self {
        self.handlers.insert(job_type.to_owned(), Arc::new(handler));
        self
    }

    /// The execution middleware chain, outermost first.
    pub fn middleware(&mut self) -> &mut Chain<dyn ExecutionMiddleware> {
        &mut self.chain
    }

    /// Lifecycle changes, for logging or tests.
    pub fn states(&self) -> watch::Receiver<WorkerState> {
        self.control.state.subscribe()
    }

    pub fn control(&self) -> WorkerControl {
        self.control.clone()
    }

    /// Runs until terminated by a directive, `control()`, or a signal: SIGTERM (graceful),
    /// SIGTSTP (quiet), SIGCONT (running again), SIGINT (immediate).
    pub async fn run(self) -> Summary {
        listen_for_signals(self.control.clone());
        self.run_until_terminated().await
    }

    /// Like [`Worker::run`] without installing signal handlers.
    pub async fn run_until_terminated(self) -> Summary {
        let engine = Arc::new(Engine {
            client: self.client,
            slots: Arc::new(Semaphore::new(self.cfg.concurrency)),
            cfg: self.cfg,
            handlers: self.handlers,
            chain: self.chain,
            control: self.control,
            active: Mutex::new(HashMap::new()),
            completed: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            handed_back: AtomicU64::new(0),
        });
        let beats = tokio::spawn(engine.clone().heartbeat_loop());
        let probes = self.health.map(|listener| {
            let listener =
                tokio::net::TcpListener::from_std(listener).expect("a bound, non-blocking socket");
            tokio::spawn(health::serve(listener, engine.clone()))
        });
        engine.clone().fetch_loop().await;
        engine.drain().await;
        beats.abort();
        if let Some(probes) = probes {
            probes.abort();
        }
        info!(worker_id = %engine.cfg.worker_id, "worker stopped");
        Summary {
            jobs_completed: engine.completed.load(Ordering::Relaxed),
            jobs_failed: engine.failed.load(Ordering::Relaxed),
            jobs_shutdown: engine.handed_back.load(Ordering::Relaxed),
        }
    }
}

struct Engine {
    client: Client,
    /// One permit per job the server may see this worker hold: taken before the FETCH
    /// that asks for the job, given back once the server has answered its ACK or FAIL.
    slots: Arc<Semaphore>,
    cfg: WorkerConfig,
    handlers: HashMap<String, Arc<dyn Handler>>,
    chain: Chain<dyn ExecutionMiddleware>,
    control: WorkerControl,
    active: Mutex<HashMap<String, Active>>,
    completed: AtomicU64,
    failed: AtomicU64,
    handed_back: AtomicU64,
}

impl Engine {
    fn state(&self) -> WorkerState {
        *self.control.state.borrow()
    }

    /// Fetches while running, never more jobs than free slots, never while full. A FETCH in
    /// flight is never abandoned (the server may be claiming jobs for it); what it brings
    /// after the worker quieted or began to stop goes straight back.
    async fn fetch_loop(self: Arc<Self>) {
        let slots = &self.slots;
        let mut states = self.control.state.subscribe();
        loop {
            match self.state() {
                WorkerState::Terminate => return,
                WorkerState::Quiet => {
                    let _ = states.changed().await;
                    continue;
                }
                WorkerState::Running => {}
            }
            let first = tokio::select! {
                permit = slots.clone().acquire_owned() => permit.expect("slots stay open"),
                _ = states.changed() => continue,
            };
            let mut permits = vec![first];
            while let Ok(p) = slots.clone().try_acquire_owned() {
                permits.push(p);
            }
            let mut body = json!({"queues": self.cfg.queues, "count": permits.len(), "worker_id": self.cfg.worker_id,
                "wait_ms": self.cfg.fetch_wait.as_millis() as u64});
            if let Some(v) = self.cfg.visibility_timeout {
                body["visibility_timeout_ms"] = json!(v.as_millis() as u64);
            }
            let jobs = match self
                .client
                .call(reqwest::Method::POST, "/ojs/v1/workers/fetch", Some(body))
                .await
            {
                Ok(answer) => answer["jobs"].as_array().cloned().unwrap_or_default(),
                Err(err) => {
                    warn!(error = %err, "fetch failed; retrying");
                    drop(permits);
                    self.pause(&mut states, Duration::from_secs(1)).await;
                    continue;
                }
            };
            let empty = jobs.is_empty();
            let running = self.state() == WorkerState::Running;
            for job in jobs {
                match permits.pop() {
                    Some(permit) if running => {
                        let (engine, ctx) = (self.clone(), self.start(job));
                        tokio::spawn(async move {
                            engine.execute(ctx).await;
                            drop(permit);
                        });
                    }
                    // Quiet or stopping by now, or more jobs than asked for.
                    _ => self.hand_back(job["id"].as_str().unwrap_or_default()).await,
                }
            }
            drop(permits);
            if empty {
                self.pause(&mut states, self.cfg.poll_interval).await;
            }
        }
    }

    /// Sleeps, waking early on a lifecycle change.
    async fn pause(&self, states: &mut watch::Receiver<WorkerState>, d: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = states.changed() => {}
        }
    }

    /// Registers a fetched job as active before its task exists, so the drain always sees it.
    fn start(&self, job: Value) -> JobContext {
        let ctx = JobContext {
            id: job["id"].as_str().unwrap_or_default().to_owned(),
            job_type: job["type"].as_str().unwrap_or_default().to_owned(),
            args: job["args"].clone(),
            attempt: job["attempt"].as_u64().unwrap_or(0),
            workflow_id: job["workflow_id"].as_str().map(str::to_owned),
            parent_results: job.get("parent_results").cloned(),
            job,
            cancel: CancellationToken::new(),
            client: self.client.clone(),
            worker_id: self.cfg.worker_id.clone(),
        };
        self.active.lock().expect("active jobs lock").insert(
            ctx.id.clone(),
            Active {
                cancel: ctx.cancel.clone(),
                abort: None,
            },
        );
        ctx
    }

    /// Runs one job through the middleware chain and its handler, then ACK or FAIL. A panic
    /// in the handler is caught and reported as a failure. Whoever takes the job out of
    /// `active` reports it: this task, or the drain that hands it back.
    async fn execute(self: Arc<Self>, ctx: JobContext) {
        let id = ctx.id.clone();
        let run = {
            let engine = self.clone();
            tokio::spawn(async move {
                let Some(handler) = engine.handlers.get(&ctx.job_type).cloned() else {
                    return Err(HandlerError::new(
                        "unknown_job_type",
                        format!("no handler for job type {:?}", ctx.job_type),
                    )
                    .final_error());
                };
                let span = ctx.span();
                ExecutionNext {
                    rest: engine.chain.items(),
                    handler: &handler,
                }
                .run(ctx)
                .instrument(span)
                .await
            })
        };
        if let Some(a) = self.active.lock().expect("active jobs lock").get_mut(&id) {
            a.abort = Some(run.abort_handle());
        }
        let outcome = match run.await {
            Ok(result) => Some(result),
            Err(e) if e.is_panic() => Some(Err(panic_error(e.into_panic()))),
            Err(_) => None, // aborted at shutdown; the drain reports it
        };
        let Some(outcome) = outcome else { return };
        if self
            .active
            .lock()
            .expect("active jobs lock")
            .remove(&id)
            .is_none()
        {
            return;
        }
        let reported = match outcome {
            Ok(result) => {
                self.completed.fetch_add(1, Ordering::Relaxed);
                let body = json!({"job_id": id, "worker_id": self.cfg.worker_id, "result": result});
                self.report("/ojs/v1/workers/ack", body).await
            }
            Err(err) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                self.fail(&id, &err, false).await
            }
        };
        if let Err(err) = reported {
            warn!(job_id = %id, error = %err, "could not report a job's outcome");
        }
    }

    /// Requeues a job at once with a failure of type `shutdown`.
    async fn hand_back(&self, id: &str) {
        let err = HandlerError {
            error_type: "shutdown".into(),
            message: "The worker shut down before the job finished.".into(),
            backtrace: None,
            retryable: true,
        };
        self.handed_back.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.fail(id, &err, true).await {
            warn!(job_id = %id, error = %e, "could not hand a job back");
        }
    }

    async fn fail(
        &self,
        id: &str,
        err: &HandlerError,
        requeue: bool,
    ) -> Result<Value, ClientError> {
        let body = json!({
            "job_id": id,
            "worker_id": self.cfg.worker_id,
            "requeue": requeue,
            "error": {
                "code": if requeue { "shutdown" } else { "handler_error" },
                "type": err.error_type,
                "message": err.message,
                "retryable": err.retryable,
                "backtrace": err.backtrace.as_deref().map(frames),
            },
        });
        self.report("/ojs/v1/workers/nack", body).await
    }

    /// An ACK or FAIL, sent again while the server cannot be reached (for a few seconds):
    /// the job's slot stays taken until the server has the outcome, so the server never
    /// sees this worker hold more jobs than its concurrency.
    async fn report(&self, path: &str, body: Value) -> Result<Value, ClientError> {
        let give_up = tokio::time::Instant::now() + REPORT_PATIENCE;
        let mut delay = Duration::from_millis(100);
        loop {
            match self
                .client
                .call(reqwest::Method::POST, path, Some(body.clone()))
                .await
            {
                Err(ClientError::Transport(err))
                    if tokio::time::Instant::now() + delay < give_up =>
                {
                    warn!(path, error = %err, "the server did not answer; sending again");
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                answer => return answer,
            }
        }
    }

    /// Waits up to the grace period (none after SIGINT) for every slot, that is for every
    /// job to run and be reported, then hands back what is still running, so the server
    /// gives those jobs out again at once, and waits for the reports already under way.
    async fn drain(&self) {
        let all = u32::try_from(self.cfg.concurrency).unwrap_or(u32::MAX);
        tokio::select! {
            _ = self.slots.acquire_many(all) => return,
            () = tokio::time::sleep(self.cfg.grace_period) => {}
            () = self.control.immediate.cancelled() => {}
        }
        let left: Vec<(String, Active)> = self
            .active
            .lock()
            .expect("active jobs lock")
            .drain()
            .collect();
        for (id, active) in &left {
            active.cancel.cancel();
            if let Some(abort) = &active.abort {
                abort.abort();
            }
            self.hand_back(id).await;
        }
        let _ = tokio::time::timeout(REPORT_PATIENCE, self.slots.acquire_many(all)).await;
    }

    /// Reports state and active jobs every interval and on each change of state; follows
    /// the answer's directive and cancels jobs the server reports cancelled. Failures are
    /// logged and retried next time, never a reason to change state.
    async fn heartbeat_loop(self: Arc<Self>) {
        let hostname = std::fs::read_to_string("/etc/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "unknown".into());
        let mut tick = tokio::time::interval(self.cfg.heartbeat_interval);
        let mut changes = self.control.state.subscribe();
        loop {
            // Each interval, and at once when the state changes: the server hands a quiet
            // or draining worker no job, and one running again its jobs from this beat on.
            tokio::select! {
                _ = tick.tick() => {}
                Ok(()) = changes.changed() => {}
            }
            let ids: Vec<String> = self
                .active
                .lock()
                .expect("active jobs lock")
                .keys()
                .cloned()
                .collect();
            // Terminating with jobs still running is the grace period: `drain` tells the
            // server (and operators) that this worker finishes what it holds and takes
            // nothing new.
            let reported = match self.state() {
                WorkerState::Terminate if !ids.is_empty() => "drain",
                state => state.as_str(),
            };
            let body = json!({
                "worker_id": self.cfg.worker_id,
                "state": reported,
                "active_jobs": ids.len(),
                "active_job_ids": ids,
                "hostname": hostname,
                "pid": std::process::id(),
                "queues": self.cfg.queues,
                "concurrency": self.cfg.concurrency,
                "labels": self.cfg.labels,
            });
            match self
                .client
                .call(
                    reqwest::Method::POST,
                    "/ojs/v1/workers/heartbeat",
                    Some(body),
                )
                .await
            {
                Ok(answer) => {
                    match answer["state"]
                        .as_str()
                        .and_then(WorkerState::from_directive)
                    {
                        Some(WorkerState::Quiet) => self.control.quiet(),
                        Some(WorkerState::Terminate) => self.control.terminate(),
                        _ => {}
                    }
                    for id in answer["jobs_cancelled"].as_array().into_iter().flatten() {
                        if let Some(a) = id.as_str().and_then(|id| {
                            self.active
                                .lock()
                                .expect("active jobs lock")
                                .get(id)
                                .map(|a| a.cancel.clone())
                        }) {
                            a.cancel();
                        }
                    }
                }
                Err(err) => warn!(error = %err, "heartbeat failed; retrying at the next interval"),
            }
        }
    }
}

/// A caught panic as a failure of type `panic`.
fn panic_error(payload: Box<dyn std::any::Any + Send>) -> HandlerError {
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "the handler panicked".into());
    HandlerError {
        error_type: "panic".into(),
        message,
        backtrace: None,
        retryable: true,
    }
}

/// A backtrace as core §8 sends it, an array of frame strings: its non-empty lines, at most
/// `MAX_BACKTRACE_FRAMES` of them and `MAX_BACKTRACE_CHARS` in all.
fn frames(trace: &str) -> Vec<&str> {
    let mut chars = 0;
    trace
        .lines()
        .filter(|line| !line.trim().is_empty())
        .take(MAX_BACKTRACE_FRAMES)
        .take_while(|line| {
            chars += line.len();
            chars <= MAX_BACKTRACE_CHARS
        })
        .collect()
}

/// SIGTERM → terminate, SIGTSTP → quiet, SIGCONT → running, SIGINT → immediate (§9).
fn listen_for_signals(control: WorkerControl) {
    use tokio::signal::unix::{signal, SignalKind};
    let kinds = [
        (SignalKind::terminate(), "SIGTERM"),
        (SignalKind::from_raw(libc::SIGTSTP), "SIGTSTP"),
        (SignalKind::from_raw(libc::SIGCONT), "SIGCONT"),
        (SignalKind::interrupt(), "SIGINT"),
    ];
    for (kind, name) in kinds {
        let Ok(mut stream) = signal(kind) else {
            warn!(signal = name, "cannot listen for this signal");
            continue;
        };
        let control = control.clone();
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                info!(signal = name, "signal received");
                match name {
                    "SIGTERM" => control.terminate(),
                    "SIGTSTP" => control.quiet(),
                    "SIGCONT" => control.resume(),
                    _ => control.interrupt(),
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifecycle_only_moves_forward_but_quiet_can_resume() {
        let (state, _) = watch::channel(WorkerState::Running);
        let c = WorkerControl {
            state,
            immediate: CancellationToken::new(),
        };
        c.quiet();
        assert_eq!(*c.state.borrow(), WorkerState::Quiet);
        c.resume();
        assert_eq!(*c.state.borrow(), WorkerState::Running);
        c.terminate();
        c.resume();
        c.quiet();
        assert_eq!(*c.state.borrow(), WorkerState::Terminate);
    }

    #[test]
    fn backtraces_are_bounded() {
        let long: String = (0..500)
            .map(|i| format!("frame {i} {}\n", "x".repeat(80)))
            .collect();
        let t = frames(&long);
        assert_eq!(t.len(), MAX_BACKTRACE_FRAMES);
        assert!(t.iter().map(|f| f.len()).sum::<usize>() <= MAX_BACKTRACE_CHARS);
        let wide: String = (0..20)
            .map(|_| format!("{}\n", "y".repeat(2_000)))
            .collect();
        assert_eq!(frames(&wide).len(), 5, "cut at the character bound");
        assert_eq!(frames("a\n\n  \nb\n"), ["a", "b"]);
    }
}
