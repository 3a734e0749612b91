//! A Rust client and worker for any OJS server over the HTTP binding — ojs-jetstream or
//! another. It speaks HTTP only: a service that enqueues or runs jobs compiles neither a
//! web framework nor a NATS client.
//!
//! - The client ([`Client`]): enqueue, batches, workflows, job and queue operations, with
//!   an enqueue middleware chain (middleware spec §3).
//! - The worker ([`worker`]): the OJS worker protocol.
//!
//! ```no_run
//! use ojs_client::{Client, JobSpec};
//! use serde_json::json;
//!
//! # async fn demo() -> Result<(), ojs_client::ClientError> {
//! let client = Client::new("http://127.0.0.1:8080");
//! let job = client.enqueue(JobSpec::new("email.send", json!(["ada@example.com"])).queue("email")).await?;
//! println!("enqueued {}", job["id"]);
//! # Ok(())
//! # }
//! ```

mod chain;
pub mod events;
pub mod trace;
pub mod worker;
pub mod workflow;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use serde_json::{json, Map, Value};

pub use chain::Chain;

/// A boxed, sendable future, the return type of middleware.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A job to enqueue: `type`, `args`, `meta` and `options` of the OJS envelope.
#[derive(Debug, Clone, PartialEq)]
pub struct JobSpec {
    pub job_type: String,
    pub args: Value,
    pub meta: Map<String, Value>,
    pub options: Map<String, Value>,
}

impl JobSpec {
    pub fn new(job_type: &str, args: Value) -> JobSpec {
        JobSpec {
            job_type: job_type.to_owned(),
            args,
            meta: Map::new(),
            options: Map::new(),
        }
    }

    #[must_use]
    pub fn queue(self, queue: &str) -> JobSpec {
        self.option("queue", json!(queue))
    }

    /// Carries `ctx` to the job's `meta` (`traceparent`, `tracestate`), so the worker that
    /// runs it and the server's spans and events join the producer's trace.
    #[must_use]
    pub fn trace_context(mut self, ctx: &trace::TraceContext) -> JobSpec {
        ctx.write_to(&mut self.meta);
        self
    }

    /// Any `options` key (`priority`, `retry`, `scheduled_at`, …).
    #[must_use]
    pub fn option(mut self, key: &str, value: Value) -> JobSpec {
        self.options.insert(key.to_owned(), value);
        self
    }

    #[must_use]
    pub fn meta(mut self, key: &str, value: Value) -> JobSpec {
        self.meta.insert(key.to_owned(), value);
        self
    }

    fn to_body(&self) -> Value {
        json!({"type": self.job_type, "args": self.args, "meta": self.meta, "options": self.options})
    }
}

/// What went wrong talking to the server.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with an OJS error body.
    #[error("{status} {code}: {message}")]
    Server {
        status: u16,
        code: String,
        message: String,
        body: Value,
    },
    /// No answer: the connection was refused, broke or timed out.
    #[error("transport: {0}")]
    Transport(#[source] reqwest::Error),
    /// An answer that is not the JSON the binding promises.
    #[error("unreadable answer: {0}")]
    Unreadable(#[source] serde_json::Error),
    /// An enqueue middleware refused the job.
    #[error("refused by middleware: {0}")]
    Refused(String),
    /// A live event stream sent more than this many bytes without ending an event: not an
    /// OJS event stream (a live event is one NATS message, far smaller).
    #[error("a live event of more than {0} bytes")]
    EventTooLarge(usize),
}

impl ClientError {
    /// The error of a non-2xx answer: its OJS error body's code and message, or, for a body
    /// that is not one (a proxy's page), `unknown` and the text.
    fn answered(status: u16, bytes: &[u8]) -> ClientError {
        let body: Value = serde_json::from_slice(bytes).unwrap_or(Value::Null);
        let error = &body["error"];
        ClientError::Server {
            status,
            code: error["code"].as_str().unwrap_or("unknown").to_owned(),
            message: error["message"].as_str().map_or_else(
                || String::from_utf8_lossy(bytes).into_owned(),
                str::to_owned,
            ),
            body,
        }
    }

    /// The OJS error code, when the server sent one.
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Server { code, .. } => Some(code),
            _ => None,
        }
    }

    /// The request timed out without an answer.
    pub fn is_timeout(&self) -> bool {
        matches!(self, ClientError::Transport(e) if e.is_timeout())
    }

    /// Whether the same request may succeed if sent again: as the server's error says, and
    /// always when no answer came.
    pub fn retryable(&self) -> bool {
        match self {
            ClientError::Server { body, .. } => body["error"]["retryable"] == true,
            ClientError::Transport(_) => true,
            ClientError::Unreadable(_)
            | ClientError::Refused(_)
            | ClientError::EventTooLarge(_) => false,
        }
    }
}

/// Enqueue middleware: sees every job before it is sent, may change it (add `meta` such as
/// trace context) or refuse it by returning an error instead of calling `next`.
pub trait EnqueueMiddleware: Send + Sync {
    fn handle<'a>(
        &'a self,
        job: JobSpec,
        next: EnqueueNext<'a>,
    ) -> BoxFuture<'a, Result<Value, ClientError>>;
}

/// The rest of the enqueue chain, ending in the request to the server.
pub struct EnqueueNext<'a> {
    rest: &'a [(String, Arc<dyn EnqueueMiddleware>)],
    client: &'a Client,
}

impl<'a> EnqueueNext<'a> {
    /// Passes `job` on; returns the enqueued job as the server answered it.
    pub fn run(self, job: JobSpec) -> BoxFuture<'a, Result<Value, ClientError>> {
        match self.rest.split_first() {
            Some(((_, m), rest)) => m.handle(
                job,
                EnqueueNext {
                    rest,
                    client: self.client,
                },
            ),
            None => Box::pin(async move {
                let body = self
                    .client
                    .call(reqwest::Method::POST, "/ojs/v1/jobs", Some(job.to_body()))
                    .await?;
                Ok(body["job"].clone())
            }),
        }
    }
}

/// A client of one OJS server (or load balancer).
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    /// `Authorization: Bearer <key>` for a server that asks for API keys.
    authorization: Option<reqwest::header::HeaderValue>,
    enqueue_chain: Chain<dyn EnqueueMiddleware>,
}

impl Client {
    pub fn new(base_url: &str) -> Client {
        Client {
            http: reqwest::Client::new(),
            base: base_url.trim_end_matches('/').to_owned(),
            authorization: None,
            enqueue_chain: Chain::default(),
        }
    }

    /// Sends `key` with every request, for a server that asks for API keys.
    ///
    /// # Panics
    /// When `key` cannot be a header value (a control character in it).
    #[must_use]
    pub fn with_api_key(mut self, key: &str) -> Client {
        let mut value = reqwest::header::HeaderValue::try_from(format!("Bearer {key}"))
            .expect("an API key without control characters");
        value.set_sensitive(true);
        self.authorization = Some(value);
        self
    }

    /// The enqueue middleware chain, to add, remove or insert middleware.
    pub fn enqueue_middleware(&mut self) -> &mut Chain<dyn EnqueueMiddleware> {
        &mut self.enqueue_chain
    }

    /// PUSH one job through the enqueue chain.
    ///
    /// # Errors
    /// The server's error, a transport error, or a middleware's refusal.
    pub async fn enqueue(&self, job: JobSpec) -> Result<Value, ClientError> {
        EnqueueNext {
            rest: self.enqueue_chain.items(),
            client: self,
        }
        .run(job)
        .await
    }

    /// PUSH many jobs at once, all or none. Each job passes the enqueue chain first (the
    /// chain's own request is not sent; the batch is).
    ///
    /// # Errors
    /// As [`Client::enqueue`].
    pub async fn enqueue_batch(&self, jobs: Vec<JobSpec>) -> Result<Vec<Value>, ClientError> {
        let mut bodies = Vec::with_capacity(jobs.len());
        for job in jobs {
            bodies.push(self.prepared(job).await?.to_body());
        }
        let body = self
            .call(
                reqwest::Method::POST,
                "/ojs/v1/jobs/batch",
                Some(json!({"jobs": bodies})),
            )
            .await?;
        Ok(body["jobs"].as_array().cloned().unwrap_or_default())
    }

    /// Runs the enqueue chain with a final step that keeps the job instead of sending it.
    async fn prepared(&self, job: JobSpec) -> Result<JobSpec, ClientError> {
        let kept = Arc::new(Mutex::new(None));
        let mut chain = self.enqueue_chain.items().to_vec();
        chain.push(("batch".into(), Arc::new(Keep(kept.clone()))));
        EnqueueNext {
            rest: &chain,
            client: self,
        }
        .run(job)
        .await?;
        let job = kept.lock().expect("kept job lock").take();
        job.ok_or_else(|| ClientError::Refused("the enqueue chain did not pass the job on".into()))
    }

    /// INFO.
    ///
    /// # Errors
    /// 404 `not_found` for an unknown id, or a transport error.
    pub async fn get(&self, id: &str) -> Result<Value, ClientError> {
        Ok(self
            .call(
                reqwest::Method::GET,
                &format!("/ojs/v1/jobs/{}", segment(id)),
                None,
            )
            .await?["job"]
            .clone())
    }

    /// CANCEL.
    ///
    /// # Errors
    /// 404 or 409 from the server, or a transport error.
    pub async fn cancel(&self, id: &str) -> Result<Value, ClientError> {
        Ok(self
            .call(
                reqwest::Method::DELETE,
                &format!("/ojs/v1/jobs/{}", segment(id)),
                None,
            )
            .await?["job"]
            .clone())
    }

    /// Creates a workflow (`POST /ojs/v1/workflows`); each of its jobs passes the enqueue
    /// chain first. Gives the workflow as the server answers it (`id`, `state`, `steps`…).
    ///
    /// # Errors
    /// 400 for an invalid workflow, the server's other errors, a transport error, or a
    /// middleware's refusal.
    pub async fn workflow(&self, mut flow: workflow::Flow) -> Result<Value, ClientError> {
        for job in flow.jobs_mut() {
            *job = self.prepared(job.clone()).await?;
        }
        Ok(self
            .call(
                reqwest::Method::POST,
                "/ojs/v1/workflows",
                Some(flow.to_body()),
            )
            .await?["workflow"]
            .clone())
    }

    /// A workflow's state and steps.
    ///
    /// # Errors
    /// 404 for an unknown id, or a transport error.
    pub async fn get_workflow(&self, id: &str) -> Result<Value, ClientError> {
        Ok(self
            .call(
                reqwest::Method::GET,
                &format!("/ojs/v1/workflows/{}", segment(id)),
                None,
            )
            .await?["workflow"]
            .clone())
    }

    /// Cancels a workflow: members not started are cancelled, running ones finish.
    ///
    /// # Errors
    /// 404 for an unknown id, 409 for a workflow that already ended, or a transport error.
    pub async fn cancel_workflow(&self, id: &str) -> Result<Value, ClientError> {
        Ok(self
            .call(
                reqwest::Method::DELETE,
                &format!("/ojs/v1/workflows/{}", segment(id)),
                None,
            )
            .await?["workflow"]
            .clone())
    }

    /// One page of the dead letter queue, newest first.
    ///
    /// # Errors
    /// The server's error or a transport error.
    pub async fn dead_letters(
        &self,
        queue: Option<&str>,
        limit: usize,
        offset: usize,
    ) -> Result<Value, ClientError> {
        let mut path = format!("/ojs/v1/dead-letter?limit={limit}&offset={offset}");
        if let Some(q) = queue {
            path.push_str(&format!("&queue={}", segment(q)));
        }
        self.call(reqwest::Method::GET, &path, None).await
    }

    /// Moves a dead-lettered job back to `available` with fresh attempts; gives the job.
    ///
    /// # Errors
    /// 404 when the job is not in the dead letter queue, or a transport error.
    pub async fn retry_dead_letter(&self, id: &str) -> Result<Value, ClientError> {
        let path = format!("/ojs/v1/dead-letter/{}/retry", segment(id));
        Ok(self.call(reqwest::Method::POST, &path, None).await?["job"].clone())
    }

    /// Deletes a dead-lettered job for good.
    ///
    /// # Errors
    /// 404 when the job is not in the dead letter queue, or a transport error.
    pub async fn delete_dead_letter(&self, id: &str) -> Result<(), ClientError> {
        let path = format!("/ojs/v1/dead-letter/{}", segment(id));
        self.call(reqwest::Method::DELETE, &path, None).await?;
        Ok(())
    }

    /// One page of jobs from the admin API (`items`, summaries newest first, and
    /// `pagination` with `total` and `next_cursor`); pass `next_cursor` back as `cursor`.
    ///
    /// # Errors
    /// 400 for an unknown state or a bad cursor, 401/403 without an admin key, or a
    /// transport error.
    pub async fn list_jobs(&self, listing: &JobListing) -> Result<Value, ClientError> {
        let mut path = format!("/ojs/v1/admin/jobs?per_page={}", listing.per_page);
        for (key, value) in [
            ("queue", &listing.queue),
            ("state", &listing.state),
            ("type", &listing.job_type),
            ("cursor", &listing.cursor),
        ] {
            if let Some(v) = value {
                path.push_str(&format!("&{key}={}", segment(v)));
            }
        }
        self.call(reqwest::Method::GET, &path, None).await
    }

    /// Retries a discarded or retryable job now (admin API); gives the job.
    ///
    /// # Errors
    /// 404 unknown job, 409 for a job in another state, or a transport error.
    pub async fn retry_job(&self, id: &str) -> Result<Value, ClientError> {
        let path = format!("/ojs/v1/admin/jobs/{}/retry", segment(id));
        Ok(self.call(reqwest::Method::POST, &path, None).await?["job"].clone())
    }

    /// The workers the server knows (admin API): `items` (`id`, `state`, `hostname`,
    /// `active_jobs`, `last_heartbeat_at`, …) and a `summary` by state.
    ///
    /// # Errors
    /// The server's error or a transport error.
    pub async fn workers(&self) -> Result<Value, ClientError> {
        self.call(reqwest::Method::GET, "/ojs/v1/admin/workers", None)
            .await
    }

    /// One page of the queues (`name`, `status`, `paused`, `created_at` each) and its
    /// `pagination`.
    ///
    /// # Errors
    /// The server's error or a transport error.
    pub async fn queues(&self, limit: usize, offset: usize) -> Result<Value, ClientError> {
        let path = format!("/ojs/v1/queues?limit={limit}&offset={offset}");
        self.call(reqwest::Method::GET, &path, None).await
    }

    /// A queue's statistics: its jobs by state, throughput, whether it is paused.
    ///
    /// # Errors
    /// 404 for an unknown queue, or a transport error.
    pub async fn queue_stats(&self, queue: &str) -> Result<Value, ClientError> {
        let path = format!("/ojs/v1/queues/{}/stats", segment(queue));
        self.call(reqwest::Method::GET, &path, None).await
    }

    /// Pauses a queue (`true`) or resumes it (`false`): a paused queue keeps taking jobs
    /// but hands none out. Gives the queue's `name`, `status` and `paused`.
    ///
    /// # Errors
    /// 400 for an invalid queue name, or a transport error.
    pub async fn set_paused(&self, queue: &str, paused: bool) -> Result<Value, ClientError> {
        let verb = if paused { "pause" } else { "resume" };
        let path = format!("/ojs/v1/queues/{}/{verb}", segment(queue));
        Ok(self.call(reqwest::Method::POST, &path, None).await?["queue"].clone())
    }

    /// A job's latest progress (`progress` 0..1, `data`, `message`, `updated_at`).
    ///
    /// # Errors
    /// 404 for an unknown job, or a transport error.
    pub async fn progress(&self, id: &str) -> Result<Value, ClientError> {
        let path = format!("/ojs/v1/jobs/{}/progress", segment(id));
        self.call(reqwest::Method::GET, &path, None).await
    }

    /// Registers (or replaces) a cron entry; `entry` is the registration body.
    ///
    /// # Errors
    /// The server's error or a transport error.
    pub async fn register_cron(&self, entry: Value) -> Result<Value, ClientError> {
        Ok(self
            .call(reqwest::Method::POST, "/ojs/v1/cron", Some(entry))
            .await?["cron"]
            .clone())
    }

    /// # Errors
    /// The server's error or a transport error.
    pub async fn list_cron(&self) -> Result<Vec<Value>, ClientError> {
        Ok(self
            .call(reqwest::Method::GET, "/ojs/v1/cron", None)
            .await?["crons"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    /// # Errors
    /// 404 for an unknown name, or a transport error.
    pub async fn delete_cron(&self, name: &str) -> Result<Value, ClientError> {
        Ok(self
            .call(
                reqwest::Method::DELETE,
                &format!("/ojs/v1/cron/{}", segment(name)),
                None,
            )
            .await?["cron"]
            .clone())
    }

    /// A request to the binding; an OJS error body becomes [`ClientError::Server`].
    ///
    /// # Errors
    /// The server's error or a transport error.
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, ClientError> {
        let mut req = self.request(method, path);
        if let Some(body) = body {
            req = req
                .header("content-type", "application/openjobspec+json")
                .body(body.to_string());
        }
        let resp = req.send().await.map_err(ClientError::Transport)?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.map_err(ClientError::Transport)?;
        if !(200..300).contains(&status) {
            return Err(ClientError::answered(status, &bytes));
        }
        if bytes.is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&bytes).map_err(ClientError::Unreadable)
    }

    /// A request to `path` with the API key, if any.
    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let req = self.http.request(method, format!("{}{path}", self.base));
        match &self.authorization {
            Some(authorization) => {
                req.header(reqwest::header::AUTHORIZATION, authorization.clone())
            }
            None => req,
        }
    }
}

/// Which jobs [`Client::list_jobs`] shows: every filter optional.
#[derive(Debug, Clone)]
pub struct JobListing {
    pub queue: Option<String>,
    pub state: Option<String>,
    pub job_type: Option<String>,
    /// Jobs a page, 1 to 100.
    pub per_page: usize,
    /// The `next_cursor` of the page before.
    pub cursor: Option<String>,
}

impl Default for JobListing {
    fn default() -> Self {
        JobListing {
            queue: None,
            state: None,
            job_type: None,
            per_page: 20,
            cursor: None,
        }
    }
}

/// `raw` as one path segment or query value: every byte outside RFC 3986's unreserved set
/// is percent-encoded, so an id such as `../jobs/<id>` names nothing rather than another
/// route. (A bare `.` or `..` still resolves to a parent path, none of which is a route
/// that acts.)
pub(crate) fn segment(raw: &str) -> String {
    raw.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The last step of the chain for a batch: keeps the job instead of sending it.
struct Keep(Arc<Mutex<Option<JobSpec>>>);

impl EnqueueMiddleware for Keep {
    fn handle<'a>(
        &'a self,
        job: JobSpec,
        _next: EnqueueNext<'a>,
    ) -> BoxFuture<'a, Result<Value, ClientError>> {
        *self.0.lock().expect("kept job lock") = Some(job);
        Box::pin(async { Ok(Value::Null) })
    }
}
