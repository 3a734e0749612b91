//! Steady mixed load through several gateways, and what it saw: for the tests that take
//! NATS away under it (`cluster.rs`, `nats_restart.rs`). Every tenth job is scheduled a
//! second ahead, and the first attempt of every seventh fails, so timers and retries cross
//! the fault too. Every third job is unique and goes to a queue with a bound, a
//! concurrency limit and a rate limit (so its PUSH takes a lock and a depth token, its
//! FETCH a running place and a start), and every hundredth job opens a new priority lane,
//! so each kind of NATS step meets the fault.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::future::join_all;
use futures::StreamExt;
use serde_json::{json, Value};

use super::{Reply, TestApp};

/// The reservation the gateways under this load give a fetched job (`visibility_timeout_ms`):
/// longer than a FETCH and a settlement that each wait out a fault up to the request
/// deadline (10 s), so no job lapses while it is worked. A claim whose write timed out
/// during an election but landed holds its job, with nobody working it, until this lapses
/// (architecture §4, FETCH 4→6): still well within the drain.
pub const VISIBILITY_MS: u64 = 25_000;

/// What the load saw: accepted jobs, claims, and every failed request.
#[derive(Default)]
pub struct Seen {
    pub accepted: BTreeSet<String>,
    /// The attempt numbers each job was handed out with.
    pub claims: BTreeMap<String, Vec<u64>>,
    pub acked: BTreeSet<String>,
    /// Jobs handed out again after their ACK, or twice with one attempt number.
    pub twice: Vec<(String, Vec<u64>)>,
    /// (when, what, status, body) of each failed request.
    pub failures: Vec<(Instant, &'static str, u16, Value)>,
    /// The longest request: how long, what, and its status.
    pub slowest: (Duration, &'static str, u16),
    /// How long each request took, by what it was.
    pub latencies: BTreeMap<&'static str, Vec<Duration>>,
    /// Jobs still unfinished `LATE` into the drain.
    pub late: Vec<String>,
}

impl Seen {
    /// Notes a request's duration, and the request if it failed: an answer that says
    /// neither 503 nor when to retry counts as a failure of another kind (599).
    pub fn request(&mut self, what: &'static str, started: Instant, reply: &Reply) {
        let status = reply.status.as_u16();
        self.timed(what, started, status);
        if !(200..300).contains(&status) {
            let status = if reply.header("retry-after").is_empty() {
                599
            } else {
                status
            };
            self.failures
                .push((Instant::now(), what, status, reply.body.clone()));
        }
    }

    /// Notes only a request's duration.
    fn timed(&mut self, what: &'static str, started: Instant, status: u16) {
        self.latencies
            .entry(what)
            .or_default()
            .push(started.elapsed());
        self.slowest = self.slowest.max((started.elapsed(), what, status));
    }

    /// Notes a job handed to the worker.
    fn claimed(&mut self, id: &str, attempt: u64) {
        let attempts = self.claims.entry(id.to_owned()).or_default();
        attempts.push(attempt);
        if self.acked.contains(id) || attempts.iter().filter(|a| **a == attempt).count() > 1 {
            let attempts = attempts.clone();
            self.twice.push((id.to_owned(), attempts));
        }
    }

    /// Asserts what the tests of faults NATS heals by itself promise on top of `check`:
    /// no request failed at all (each waited the fault out within its deadline).
    pub fn check_none_failed(&self) {
        assert!(
            self.failures.is_empty(),
            "{} requests failed, the first: {:?}",
            self.failures.len(),
            self.failures
                .first()
                .map(|(_, what, status, body)| (what, status, body))
        );
    }

    /// Asserts what every fault test promises: each accepted job ran to its ACK, none was
    /// handed out twice, every failed request was a retryable 503 and none took
    /// `slowest_bound`.
    pub fn check(&self, slowest_bound: Duration) {
        let lost: Vec<(&String, Option<&Vec<u64>>)> = self
            .accepted
            .difference(&self.acked)
            .map(|id| (id, self.claims.get(id)))
            .collect();
        assert!(
            lost.is_empty(),
            "{} of {} accepted jobs never ran (id, attempts handed out): {lost:?}",
            lost.len(),
            self.accepted.len()
        );
        assert!(self.twice.is_empty(), "handed out twice: {:?}", self.twice);
        for (_, what, status, body) in &self.failures {
            assert!(
                *status == 503 && body["error"]["retryable"] == true,
                "{what} failed with {status} (599: no Retry-After), not as a retryable 503: {body}"
            );
        }
        assert!(
            self.slowest.0 < slowest_bound,
            "a request hung: {:?}",
            self.slowest
        );
    }

    /// Prints each kind of request's latency: count, p50, p99 and max.
    pub fn report_latencies(&self) {
        for (what, took) in &self.latencies {
            let mut took = took.clone();
            took.sort();
            let at = |q: usize| took[(took.len() - 1) * q / 100];
            println!(
                "{what}: {} requests, p50 {:?}, p99 {:?}, max {:?}",
                took.len(),
                at(50),
                at(99),
                at(100)
            );
        }
    }

    /// Prints the failed requests by kind, and those in the window after each fault.
    pub fn report(&self, faults: &[Instant], window: Duration) {
        for (n, at) in faults.iter().enumerate() {
            let after: Vec<Duration> = self
                .failures
                .iter()
                .filter(|(t, ..)| *t >= *at && *t < *at + window)
                .map(|(t, ..)| *t - *at)
                .collect();
            println!(
                "fault {}: {} failed requests, the last {:?} after it",
                n + 1,
                after.len(),
                after.iter().max()
            );
        }
        let mut kinds: BTreeMap<(&str, u16, &str), u32> = BTreeMap::new();
        for (_, what, status, body) in &self.failures {
            let message = body["error"]["message"].as_str().unwrap_or("");
            *kinds.entry((what, *status, message)).or_default() += 1;
        }
        println!("failed requests by kind: {kinds:#?}");
        let retried = self.claims.values().filter(|a| a.len() > 1).count();
        println!(
            "{} jobs accepted and run once each ({retried} after a failed first attempt); slowest request {:?}",
            self.accepted.len(),
            self.slowest,
        );
    }
}

/// How long after the faults every accepted job must be done: a queue message that a
/// gateway cut off from its consumer's leader handed back (the hand-back lost with the
/// partition) is delivered again only after the queue's AckWait, 60 s from its delivery.
const DRAIN: Duration = Duration::from_secs(60);

/// Puts the load on through `a` and `b` (each enqueues; `b` fetches first) while `faults`
/// runs; once it is done, stops enqueueing, lets the enqueue in flight finish (it may be
/// waiting out an election) and waits up to `DRAIN` for every accepted job, scheduled
/// jobs and retries too, to be acked. What `faults` returned.
pub async fn through_faults<T>(
    a: &TestApp,
    b: &TestApp,
    seen: &Mutex<Seen>,
    faults: impl std::future::Future<Output = T>,
) -> T {
    limit(a).await;
    let stop_producing = AtomicBool::new(false);
    let stop_working = AtomicBool::new(false);
    let (producers, workers) = ([a, b], [b, a]);
    let faults = async {
        let outcome = faults.await;
        stop_producing.store(true, Ordering::Relaxed);
        outcome
    };
    let producing = async {
        let (outcome, ()) = tokio::join!(faults, produce(&producers, seen, &stop_producing));
        drained(seen, DRAIN).await;
        stop_working.store(true, Ordering::Relaxed);
        outcome
    };
    let (outcome, ()) = tokio::join!(producing, work(&workers, seen, &stop_working));
    outcome
}

/// The queues the load enqueues to and fetches from.
const QUEUES: [&str; 2] = ["busy", "limited"];

/// Gives the load's `limited` queue limits it never reaches: each of its jobs then takes
/// tokens, and none waits for them.
pub async fn limit(gateway: &TestApp) {
    let config = json!({
        "concurrency": 10_000,
        "rate_limit": {"limit": 100_000, "period": "PT1M"},
        "backpressure": {"max_depth": 1_000_000},
    });
    let r = gateway
        .put("/ojs/v1/admin/queues/limited/config", config)
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
}

/// Enqueues through the gateways in turn until told to stop.
pub async fn produce(gateways: &[&TestApp], seen: &Mutex<Seen>, stop: &AtomicBool) {
    // Tells this producer's jobs from those of others beside it (their unique keys).
    let producer: u64 = rand::random();
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let priority = (i / 100).min(15);
        let mut job = json!({"type": "c.work", "args": [i, producer],
            "options": {"queue": QUEUES[0], "priority": priority}});
        if i % 3 == 1 {
            job["options"]["queue"] = json!(QUEUES[1]);
            job["options"]["unique"] = json!({"keys": ["type", "args"]});
        }
        if i % 10 == 0 {
            job["options"]["scheduled_at"] = json!("+PT1S");
        }
        let started = Instant::now();
        let r = gateways[i as usize % gateways.len()]
            .post("/ojs/v1/jobs", job)
            .await;
        {
            let mut seen = seen.lock().unwrap();
            seen.request("enqueue", started, &r);
            if r.status.is_success() {
                seen.accepted
                    .insert(r.body["job"]["id"].as_str().unwrap().to_owned());
            }
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Fetches through the gateways in turn, long polling, and settles each job as a worker
/// would (retrying a settlement that failed with a 5xx), until told to stop.
pub async fn work(gateways: &[&TestApp], seen: &Mutex<Seen>, stop: &AtomicBool) {
    let mut turn = 0usize;
    while !stop.load(Ordering::Relaxed) {
        turn += 1;
        let started = Instant::now();
        let r = gateways[turn % gateways.len()]
            .post(
                "/ojs/v1/workers/fetch",
                json!({"queues": QUEUES, "count": 20, "wait_ms": 300, "worker_id": "w"}),
            )
            .await;
        seen.lock().unwrap().request("fetch", started, &r);
        if !r.status.is_success() {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        // Each job of the batch is settled at once, as a worker with a slot per job would:
        // its hold is then one FETCH and one settlement, however many others wait out a fault.
        join_all(
            r.body["jobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|job| async move {
                    // Its own turn through the gateways when a settlement is retried.
                    let mut turn = turn;
                    let id = job["id"].as_str().unwrap();
                    let attempt = job["attempt"].as_u64().unwrap();
                    seen.lock().unwrap().claimed(id, attempt);
                    let fails = job["args"][0].as_u64().unwrap_or(0) % 7 == 3 && attempt == 1;
                    let settled = settle(gateways, &mut turn, seen, id, fails).await;
                    if !fails && settled {
                        seen.lock().unwrap().acked.insert(id.to_owned());
                    }
                }),
        )
        .await;
    }
}

/// ACKs (or FAILs) a job until an answer is not a 5xx; whether the job got there. A 409
/// after a 5xx is no failure when the job explains it: the earlier try landed, or — the 5xx
/// having outlasted the reservation — the job lapsed back into line, to be handed out and
/// settled again. The state the refusal names is one witness, a read through each gateway
/// another: any of them may come from a replica still catching up (a follower a few writes
/// behind, a node just back from a partition).
async fn settle(
    gateways: &[&TestApp],
    turn: &mut usize,
    seen: &Mutex<Seen>,
    id: &str,
    fail: bool,
) -> bool {
    let what = if fail { "fail" } else { "ack" };
    let mut retried = false;
    loop {
        let gateway = gateways[*turn % gateways.len()];
        let started = Instant::now();
        let r = if fail {
            let error = json!({"code": "flaky", "message": "the first try fails"});
            gateway.fail(json!({"job_id": id, "error": error})).await
        } else {
            gateway.ack(json!({"job_id": id})).await
        };
        if r.status.is_server_error() {
            seen.lock().unwrap().request(what, started, &r);
            retried = true;
            *turn += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let (mut landed, mut lapsed) = (false, false);
        if retried && !r.status.is_success() {
            let mut states = vec![r.body["error"]["details"]["current_state"].clone()];
            for g in gateways {
                states.push(state_of(g, id).await);
            }
            for state in states.into_iter().filter(Value::is_string) {
                landed |= if fail {
                    state != "active"
                } else {
                    state == "completed"
                };
                lapsed |= !fail && matches!(state.as_str(), Some("available" | "retryable"));
            }
        }
        let mut seen = seen.lock().unwrap();
        if landed || lapsed {
            seen.timed(what, started, r.status.as_u16());
        } else {
            seen.request(what, started, &r);
        }
        return r.status.is_success() || landed;
    }
}

/// The job's state, read again while NATS answers 5xx.
async fn state_of(gateway: &TestApp, id: &str) -> Value {
    for _ in 0..100 {
        let r = gateway.get(&format!("/ojs/v1/jobs/{id}")).await;
        if r.status.is_success() {
            return r.body["job"]["state"].clone();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("job {id} could not be read");
}

/// Prints what `gateway` says of each job late in the drain and of each accepted job that
/// was never acked (then also the timers), for a slow or failing run.
pub async fn describe_unfinished(seen: &Mutex<Seen>, gateway: &TestApp, nats_url: &str) {
    let (unfinished, late): (Vec<String>, Vec<String>) = {
        let seen = seen.lock().unwrap();
        let unfinished = seen.accepted.difference(&seen.acked).cloned().collect();
        (unfinished, seen.late.clone())
    };
    for (what, ids) in [("late", &late), ("unfinished", &unfinished)] {
        for id in ids {
            let r = gateway.get(&format!("/ojs/v1/jobs/{id}")).await;
            println!("{what} {id}: {} {}", r.status, r.body);
        }
    }
    if !unfinished.is_empty() {
        describe_timers(nats_url).await;
    }
}

/// Prints the timers stream and its consumers: whether a job waiting for its retry or
/// promotion has its timer stored, and whether the leader's consumer delivered it and
/// waits for its acknowledgement.
async fn describe_timers(nats_url: &str) {
    let js = async_nats::jetstream::new(super::connect(nats_url).await);
    let mut names = js.stream_names();
    while let Some(Ok(name)) = names.next().await {
        if !name.ends_with("-timers") {
            continue;
        }
        let Ok(stream) = js.get_stream(&name).await else {
            continue;
        };
        println!("{name}: {:?}", stream.cached_info().state);
        let mut consumers = stream.consumers();
        while let Some(Ok(c)) = consumers.next().await {
            println!(
                "  consumer {}: delivered {:?}, ack floor {:?}, ack pending {}, redelivered {}, \
                 pending {}, waiting pulls {}, cluster {:?}",
                c.name,
                c.delivered,
                c.ack_floor,
                c.num_ack_pending,
                c.num_redelivered,
                c.num_pending,
                c.num_waiting,
                c.cluster
            );
        }
    }
}

/// How long into the drain a job still unfinished is worth a look (`describe_unfinished`).
const LATE: Duration = Duration::from_secs(15);

/// Waits until every accepted job is acked, at most `within`, and says how long it took;
/// notes the jobs still unfinished `LATE` into it.
pub async fn drained(seen: &Mutex<Seen>, within: Duration) {
    let started = Instant::now();
    loop {
        let unfinished = {
            let mut seen = seen.lock().unwrap();
            let unfinished: Vec<String> = seen.accepted.difference(&seen.acked).cloned().collect();
            if seen.late.is_empty() && started.elapsed() > LATE {
                seen.late = unfinished.clone();
            }
            unfinished.len()
        };
        if unfinished == 0 || started.elapsed() > within {
            println!(
                "drained in {:?}: {unfinished} unfinished",
                started.elapsed()
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
