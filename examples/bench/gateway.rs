//! The gateway over HTTP.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::drivers::{consume, micros, produce, Round, Tally, FETCH_WAIT};
use crate::flags::fail;
use crate::scenarios::{Load, TIMER_LEAD, TIMER_SPREAD};

/// What a worker reads of a FETCH response; every other field is skipped unparsed.
#[derive(Deserialize)]
pub struct Fetched {
    jobs: Vec<FetchedJob>,
}

#[derive(Deserialize)]
pub struct FetchedJob {
    id: String,
    /// `[index, enqueue time]` (`[index, due time]` for scheduled jobs) on the benchmark's
    /// clock, as the benchmark enqueues them.
    args: (u64, u64),
}

/// The gateway's HTTP/1.1 API over keep-alive connections. A bare hyper client rather than
/// the reqwest client the worker library uses: the load generator shares the machine with
/// the gateway and NATS, so every CPU second it spends is one they cannot use, and this one
/// spends about half of what reqwest did for the same requests (docs/performance.md §5).
#[derive(Clone)]
pub struct Gateway {
    /// `host:port` to connect to.
    authority: String,
    /// The URL's path prefix (empty, or `/prefix` without a trailing `/`).
    base: String,
    /// Connections not in use; a request takes one (or opens one) and puts it back.
    idle: Arc<std::sync::Mutex<Vec<SendRequest<Full<Bytes>>>>>,
    /// `Bearer <key>` when `OJS_API_KEY` is set (a gateway with API keys).
    authorization: Option<HeaderValue>,
}

impl Gateway {
    pub fn new(url: &str) -> Gateway {
        let rest = url
            .strip_prefix("http://")
            .unwrap_or_else(|| fail(&format!("--url {url}: only http:// URLs are supported")));
        let (authority, base) = rest.split_once('/').unwrap_or((rest, ""));
        let base = match base.trim_end_matches('/') {
            "" => String::new(),
            path => format!("/{path}"),
        };
        Gateway {
            authority: authority.to_owned(),
            base,
            idle: Arc::default(),
            authorization: std::env::var("OJS_API_KEY").ok().map(|key| {
                HeaderValue::try_from(format!("Bearer {key}"))
                    .unwrap_or_else(|_| fail("OJS_API_KEY cannot be a header value"))
            }),
        }
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, String> {
        let stream = tokio::net::TcpStream::connect(&self.authority)
            .await
            .map_err(|e| format!("connecting to {}: {e}", self.authority))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let (sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(connection);
        Ok(sender)
    }

    /// Sends one request; its status and body. A connection that failed is not reused.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
    ) -> Result<(StatusCode, Bytes), String> {
        let pooled = self.idle.lock().unwrap().pop();
        let mut sender = match pooled {
            Some(s) if !s.is_closed() => s,
            _ => self.connect().await?,
        };
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header(HOST, &self.authority)
            .header(CONTENT_TYPE, "application/json");
        if let Some(authorization) = &self.authorization {
            request = request.header(AUTHORIZATION, authorization);
        }
        let request = request.body(Full::new(body)).map_err(|e| e.to_string())?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        self.idle.lock().unwrap().push(sender);
        Ok((status, body))
    }

    /// POSTs `body`; the response body when `accept` takes its status, else an error.
    async fn call(
        &self,
        path: &str,
        body: &Value,
        accept: fn(StatusCode) -> bool,
    ) -> Result<Bytes, String> {
        let body = serde_json::to_vec(body).map_err(|e| e.to_string())?;
        let (status, body) = self.send(Method::POST, path, body.into()).await?;
        if accept(status) {
            Ok(body)
        } else {
            Err(format!("{status}: {}", String::from_utf8_lossy(&body)))
        }
    }

    pub async fn post(&self, path: &str, body: &Value) -> Result<Bytes, String> {
        self.call(path, body, |s| s.is_success()).await
    }

    /// One FETCH of a worker: the jobs handed out, or what went wrong.
    async fn fetch(&self, request: &Value) -> Result<Vec<FetchedJob>, String> {
        let body = self.post("/ojs/v1/workers/fetch", request).await?;
        serde_json::from_slice::<Fetched>(&body)
            .map(|f| f.jobs)
            .map_err(|e| e.to_string())
    }

    /// `workflow`: a chain of `steps` worked by `workers` long-polling workers. Per step after
    /// the first: from the moment its predecessor's ACK was answered to the moment a FETCH
    /// handed it out (µs).
    pub async fn chain_steps(
        &self,
        queue: &str,
        steps: usize,
        workers: usize,
        tally: Arc<Tally>,
    ) -> Vec<u64> {
        let jobs: Vec<Value> = (0..steps)
            .map(|i| json!({"type": "bench.step", "args": [i, 0], "options": {"queue": queue}}))
            .collect();
        if let Err(e) = self
            .post(
                "/ojs/v1/workflows",
                &json!({"type": "chain", "steps": jobs}),
            )
            .await
        {
            crate::drivers::record_error(&tally, &e);
            return Vec::new();
        }
        let clock = Instant::now();
        let acked: Arc<std::sync::Mutex<Vec<Option<u64>>>> =
            Arc::new(std::sync::Mutex::new(vec![None; steps]));
        let gw = self.clone();
        let queue = queue.to_owned();
        consume(workers, steps, tally, move |w| {
            let (gw, acked) = (gw.clone(), acked.clone());
            let worker_id = format!("bench-worker-{w}");
            let request = json!({"queues": [queue], "count": 1, "worker_id": worker_id,
                "wait_ms": FETCH_WAIT.as_millis() as u64});
            Box::pin(async move {
                let mut round = Round::default();
                let jobs = match gw.fetch(&request).await {
                    Ok(jobs) => jobs,
                    Err(e) => {
                        round.errors.push(e);
                        return round;
                    }
                };
                let now = micros(clock);
                round.fetched = jobs.len();
                for job in &jobs {
                    let step = job.args.0 as usize;
                    let before = step.checked_sub(1).and_then(|p| acked.lock().unwrap()[p]);
                    if let Some(before) = before {
                        round.latencies.push(now.saturating_sub(before));
                    }
                    let ack = json!({"job_id": job.id, "worker_id": worker_id});
                    match gw.post("/ojs/v1/workers/ack", &ack).await {
                        Ok(_) => {
                            acked.lock().unwrap()[step] = Some(micros(clock));
                            round.complete();
                        }
                        Err(e) => round.errors.push(e),
                    }
                }
                round
            })
        })
        .await
    }

    /// `workflow`: a batch of `members` jobs with an `on_complete` callback in
    /// `callback_queue`, worked by `workers`; from the last member's ACK answered to the
    /// callback handed to a waiting FETCH (µs), `None` if it never came.
    pub async fn fan_in(
        &self,
        queue: &str,
        callback_queue: &str,
        members: usize,
        workers: usize,
        tally: Arc<Tally>,
    ) -> Option<u64> {
        let jobs: Vec<Value> = (0..members)
            .map(|i| json!({"type": "bench.member", "args": [i, 0], "options": {"queue": queue}}))
            .collect();
        let callback =
            json!({"type": "bench.callback", "args": [0, 0], "options": {"queue": callback_queue}});
        let body = json!({"type": "batch", "jobs": jobs, "callbacks": {"on_complete": callback}});
        if let Err(e) = self.post("/ojs/v1/workflows", &body).await {
            crate::drivers::record_error(&tally, &e);
            return None;
        }
        let waiter = {
            let gw = self.clone();
            let request = json!({"queues": [callback_queue], "count": 1, "worker_id": "bench-callback",
                "wait_ms": FETCH_WAIT.as_millis() as u64});
            tokio::spawn(async move {
                let give_up = Instant::now() + Duration::from_secs(120);
                while Instant::now() < give_up {
                    if let Some(job) = gw.fetch(&request).await.ok()?.first() {
                        let at = Instant::now();
                        let ack = json!({"job_id": job.id, "worker_id": "bench-callback"});
                        gw.post("/ojs/v1/workers/ack", &ack).await.ok()?;
                        return Some(at);
                    }
                }
                None
            })
        };
        self.work(queue, 50, workers, members, Instant::now(), tally.clone())
            .await;
        let last_ack = *tally.last_done.lock().unwrap();
        let callback_at = waiter.await.ok().flatten()?;
        Some(callback_at.saturating_duration_since(last_ack?).as_micros() as u64)
    }

    /// The HTTP traffic of `e2e` without its JetStream work: per job a PUSH, a FETCH and an
    /// ACK from `tasks` concurrent clients, each invalid in one field so the gateway answers
    /// 400 before touching NATS. What the requests alone cost both processes.
    pub async fn http_only(&self, queue: &str, jobs: usize, tasks: usize, tally: Arc<Tally>) {
        let gw = self.clone();
        let queue = queue.to_owned();
        produce(jobs, 1, tasks, None, tally, move |i, _| {
            let (gw, queue) = (gw.clone(), queue.clone());
            Box::pin(async move {
                let rejected = |s| s == StatusCode::BAD_REQUEST;
                let push =
                    json!({"type": "bench.job", "queue": queue.to_uppercase(), "args": [i, 0]});
                gw.call("/ojs/v1/jobs", &push, rejected).await?;
                let fetch = json!({"queues": [queue], "count": 1, "worker_id": "bench-http",
                    "wait_ms": -1});
                gw.call("/ojs/v1/workers/fetch", &fetch, rejected).await?;
                let ack = json!({"job_id": i, "worker_id": "bench-http"});
                gw.call("/ojs/v1/workers/ack", &ack, rejected).await?;
                Ok(())
            })
        })
        .await;
    }

    /// PUSH (`batch` 1) or batch PUSH; jobs carry `[index, enqueue time]` as args.
    pub async fn enqueue(&self, queue: &str, load: Load, clock: Instant, tally: Arc<Tally>) {
        let gw = self.clone();
        let queue = queue.to_owned();
        produce(
            load.jobs,
            load.batch,
            load.producers,
            load.pace,
            tally,
            move |first, n| {
                let (gw, queue) = (gw.clone(), queue.clone());
                Box::pin(async move {
                    let sent = micros(clock);
                    let job =
                        |i: usize| json!({"type": "bench.job", "queue": queue, "args": [i, sent]});
                    if load.batch == 1 {
                        gw.post("/ojs/v1/jobs", &job(first)).await?;
                    } else {
                        let list: Vec<Value> = (first..first + n).map(job).collect();
                        gw.post("/ojs/v1/jobs/batch", &json!({ "jobs": list }))
                            .await?;
                    }
                    Ok(())
                })
            },
        )
        .await;
    }

    /// Batch PUSH of `jobs` jobs whose queue allows `limit` starts a second; each carries
    /// `[index, enqueue time]` as args.
    /// Bounds `queue` at `max_depth` unfinished jobs (admin API).
    pub async fn bound(&self, queue: &str, max_depth: usize) {
        let body = json!({"backpressure": {"max_depth": max_depth}});
        let path = format!("/ojs/v1/admin/queues/{queue}/config");
        match self
            .send(Method::PUT, &path, Bytes::from(body.to_string()))
            .await
        {
            Ok((status, _)) if status.is_success() => {}
            other => fail(&format!("cannot bound the queue {queue}: {other:?}")),
        }
    }

    pub async fn enqueue_limited(
        &self,
        queue: &str,
        jobs: usize,
        limit: u64,
        clock: Instant,
        tally: Arc<Tally>,
    ) {
        let gw = self.clone();
        let queue = queue.to_owned();
        produce(jobs, 1000, 1, None, tally, move |first, n| {
            let (gw, queue) = (gw.clone(), queue.clone());
            Box::pin(async move {
                let sent = micros(clock);
                let list: Vec<Value> = (first..first + n)
                    .map(|i| {
                        json!({"type": "bench.job", "args": [i, sent],
                        "options": {"queue": queue, "rate_limit": {"max_per_second": limit}}})
                    })
                    .collect();
                gw.post("/ojs/v1/jobs/batch", &json!({ "jobs": list }))
                    .await?;
                Ok(())
            })
        })
        .await;
    }

    /// `reads` GETs of `path` one after another: each one's latency in µs, and the last
    /// answer's body.
    pub async fn time_reads(&self, path: &str, reads: usize) -> Result<(Vec<u64>, Value), String> {
        let mut latencies = Vec::with_capacity(reads);
        let mut last = Value::Null;
        for _ in 0..reads {
            let started = Instant::now();
            let (status, body) = match self.send(Method::GET, path, Bytes::new()).await {
                Ok(answer) => answer,
                // A pooled connection the gateway closed meanwhile: once more, on a new one.
                Err(e) => {
                    eprintln!("bench: a read of {path} failed ({e}); again");
                    self.send(Method::GET, path, Bytes::new()).await?
                }
            };
            latencies.push(started.elapsed().as_micros() as u64);
            if !status.is_success() {
                return Err(format!("{status}: {}", String::from_utf8_lossy(&body)));
            }
            last = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
        }
        Ok((latencies, last))
    }

    /// Batch PUSH of `jobs` jobs scheduled evenly from `TIMER_LEAD` to `TIMER_LEAD` +
    /// `TIMER_SPREAD` after now; each carries its due time, so a worker's latency for it is
    /// how late it became fetchable.
    pub async fn schedule(
        &self,
        queue: &str,
        jobs: usize,
        producers: usize,
        clock: Instant,
        tally: Arc<Tally>,
    ) {
        let gw = self.clone();
        let queue = queue.to_owned();
        // Due times in whole milliseconds, as `scheduled_at` carries them: `start` is the
        // benchmark's clock at the whole millisecond `wall`.
        let (now, start) = (chrono::Utc::now(), micros(clock));
        let start = start - u64::from(now.timestamp_subsec_micros() % 1000);
        let wall = chrono::DateTime::from_timestamp_millis(now.timestamp_millis())
            .expect("a current time");
        produce(jobs, 1000, producers, None, tally, move |first, n| {
            let (gw, queue) = (gw.clone(), queue.clone());
            Box::pin(async move {
                let list: Vec<Value> = (first..first + n)
                    .map(|i| {
                        let spread = TIMER_SPREAD.as_millis() as usize * i / jobs;
                        let due = TIMER_LEAD + Duration::from_millis(spread as u64);
                        let at = wall + chrono::Duration::from_std(due).expect("a short offset");
                        json!({"type": "bench.job", "args": [i, start + due.as_micros() as u64],
                            "options": {"queue": queue, "scheduled_at":
                                at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)}})
                    })
                    .collect();
                gw.post("/ojs/v1/jobs/batch", &json!({ "jobs": list }))
                    .await?;
                Ok(())
            })
        })
        .await;
    }

    /// Workers FETCH `count` at a time and ACK each job.
    pub async fn work(
        &self,
        queue: &str,
        count: usize,
        workers: usize,
        target: usize,
        clock: Instant,
        tally: Arc<Tally>,
    ) -> Vec<u64> {
        let gw = self.clone();
        let queue = queue.to_owned();
        consume(workers, target, tally, move |w| {
            let gw = gw.clone();
            let worker_id = format!("bench-worker-{w}");
            let request = json!({"queues": [queue], "count": count, "worker_id": worker_id,
                "wait_ms": FETCH_WAIT.as_millis() as u64});
            Box::pin(async move {
                let mut round = Round::default();
                let jobs = match gw.fetch(&request).await {
                    Ok(jobs) => jobs,
                    Err(e) => {
                        round.errors.push(e);
                        return round;
                    }
                };
                let now = micros(clock);
                round.fetched = jobs.len();
                for job in &jobs {
                    if now < job.args.1 {
                        let early = job.args.1 - now;
                        round
                            .errors
                            .push(format!("job {} fetched {early} µs early", job.id));
                    }
                    round.latencies.push(now.saturating_sub(job.args.1));
                    let ack = json!({"job_id": job.id, "worker_id": worker_id});
                    match gw.post("/ojs/v1/workers/ack", &ack).await {
                        Ok(_) => round.complete(),
                        Err(e) => round.errors.push(e),
                    }
                }
                round
            })
        })
        .await
    }
}
