//! Load drivers shared by the gateway and the floor: producers that offer jobs and
//! workers that fetch and complete them, counting what happened.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;

/// Longest a drain waits for jobs that do not arrive before it counts them as missing.
pub const DRAIN_PATIENCE: Duration = Duration::from_secs(20);
/// How long a worker's fetch waits for a job when its queue is empty: a gateway FETCH with
/// `wait_ms`, a waiting pull on the floor. Workers block instead of polling.
pub const FETCH_WAIT: Duration = Duration::from_secs(1);
/// Pause of a worker whose fetch came back empty, before it fetches again.
pub const IDLE_PAUSE: Duration = Duration::from_millis(1);

/// Shared counters of a running scenario.
#[derive(Default)]
pub struct Tally {
    pub errors: AtomicU64,
    pub done: AtomicUsize,
    /// When the last job was completed: a scenario ends there, not when the last idle
    /// worker's fetch returns.
    pub last_done: std::sync::Mutex<Option<Instant>>,
}

impl Tally {
    pub fn seconds_since(&self, start: Instant) -> f64 {
        let end = self.last_done.lock().unwrap().unwrap_or_else(Instant::now);
        end.duration_since(start).as_secs_f64()
    }
}

/// Microseconds since the benchmark started: the clock carried inside latency jobs.
pub fn micros(origin: Instant) -> u64 {
    origin.elapsed().as_micros() as u64
}

pub fn record_error(tally: &Tally, error: &str) {
    if tally.errors.fetch_add(1, Ordering::Relaxed) < 3 {
        eprintln!("bench: request failed: {error}");
    }
}

/// Sends `jobs` jobs as requests of up to `batch` from `producers` tasks; with `pace`, the
/// i-th request is due `i × pace` after the start. `send(first, n)` enqueues jobs
/// `first..first + n`.
pub async fn produce<F>(
    jobs: usize,
    batch: usize,
    producers: usize,
    pace: Option<Duration>,
    tally: Arc<Tally>,
    send: F,
) where
    F: Fn(usize, usize) -> BoxFuture<'static, Result<(), String>> + Send + Sync + 'static,
{
    let send = Arc::new(send);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..producers)
        .map(|_| {
            let (send, next, tally) = (send.clone(), next.clone(), tally.clone());
            tokio::spawn(async move {
                loop {
                    let first = next.fetch_add(batch, Ordering::Relaxed);
                    if first >= jobs {
                        return;
                    }
                    if let Some(pace) = pace {
                        let due = started + pace * (first / batch) as u32;
                        tokio::time::sleep_until(due.into()).await;
                    }
                    let n = batch.min(jobs - first);
                    match send(first, n).await {
                        Ok(()) => {
                            tally.done.fetch_add(n, Ordering::Relaxed);
                        }
                        Err(e) => record_error(&tally, &e),
                    }
                }
            })
        })
        .collect();
    futures::future::join_all(tasks).await;
}

/// What one fetch-and-process round of a worker did.
#[derive(Default)]
pub struct Round {
    /// Jobs handed to the worker.
    pub fetched: usize,
    /// Jobs completed.
    completed: usize,
    /// When the round completed its last job.
    last_completed: Option<Instant>,
    pub errors: Vec<String>,
    /// Enqueue→fetch latencies in microseconds, for jobs that carried their enqueue time.
    pub latencies: Vec<u64>,
}

impl Round {
    pub fn complete(&mut self) {
        self.completed += 1;
        self.last_completed = Some(Instant::now());
    }
}

/// Runs `workers` tasks, each calling `round(worker)` until `target` jobs are completed or
/// nothing arrived for `DRAIN_PATIENCE`; returns the latencies the rounds reported.
pub async fn consume<F>(workers: usize, target: usize, tally: Arc<Tally>, round: F) -> Vec<u64>
where
    F: Fn(usize) -> BoxFuture<'static, Round> + Send + Sync + 'static,
{
    let round = Arc::new(round);
    let last_progress = Arc::new(std::sync::Mutex::new(Instant::now()));
    let latencies = Arc::new(std::sync::Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let (round, tally, last_progress, latencies) = (
                round.clone(),
                tally.clone(),
                last_progress.clone(),
                latencies.clone(),
            );
            tokio::spawn(async move {
                while tally.done.load(Ordering::Relaxed) < target {
                    let r = round(w).await;
                    for e in &r.errors {
                        record_error(&tally, e);
                    }
                    tally.done.fetch_add(r.completed, Ordering::Relaxed);
                    if let Some(at) = r.last_completed {
                        let mut last = tally.last_done.lock().unwrap();
                        *last = Some(last.map_or(at, |l| l.max(at)));
                    }
                    latencies.lock().unwrap().extend(r.latencies);
                    if r.fetched > 0 {
                        *last_progress.lock().unwrap() = Instant::now();
                    } else if last_progress.lock().unwrap().elapsed() > DRAIN_PATIENCE {
                        return;
                    } else {
                        tokio::time::sleep(IDLE_PAUSE).await;
                    }
                }
            })
        })
        .collect();
    futures::future::join_all(tasks).await;
    let latencies = std::mem::take(&mut *latencies.lock().unwrap());
    latencies
}
