//! A gateway killed (`exit`, as `kill -9`) at each named point between two NATS calls
//! (docs/architecture.md §3.15, §4), with a second gateway on the same NATS: afterwards no
//! accepted job is lost, none is handed out twice, and each job's state is the one its
//! history explains — within the repair bound architecture.md states for that point.
//!
//! Each point runs once; `OJS_FAULT_RUNS=20 cargo test --test integration failpoints::` is the soak mode.

use crate::common;

use std::time::{Duration, Instant};

use common::{spawn_app_with, test_config, GatewayProcess, NatsServer, Reply, TestApp};
use ojs_jetstream::config::Config;
use serde_json::{json, Value};

/// AckWait, visibility timeout, workflow and batch grace of both gateways: how long a
/// message or a claim held by the dead gateway stays with it, and a workflow or batch it
/// was creating.
const HOLD_MS: u64 = 2000;
/// The exit code of a failpoint's `exit`.
const FAILPOINT_EXIT: i32 = 86;

/// How many times each point runs (`OJS_FAULT_RUNS`, default 1).
fn runs() -> usize {
    std::env::var("OJS_FAULT_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}

/// A gateway process armed to exit at one point, a healthy in-process gateway, one NATS.
struct Pair {
    armed: GatewayProcess,
    healthy: TestApp,
    _nats: NatsServer,
}

/// Which gateway holds the coordinator lease while the armed one is alive.
#[derive(PartialEq)]
enum Leader {
    Armed,
    Healthy,
}

impl Pair {
    async fn start(point: &str, leader: Leader) -> Pair {
        Pair::armed_with(&format!("{point}=exit"), leader).await
    }

    /// A pair whose "armed" gateway has no failpoint: a test kills it by signal.
    async fn unarmed(leader: Leader) -> Pair {
        Pair::armed_with("", leader).await
    }

    async fn armed_with(failpoints: &str, leader: Leader) -> Pair {
        let nats = NatsServer::start();
        let hold = HOLD_MS.to_string();
        let env = [
            ("OJS_FAILPOINTS", failpoints),
            ("OJS_ACK_WAIT_MS", hold.as_str()),
            ("OJS_VISIBILITY_TIMEOUT_MS", hold.as_str()),
            ("OJS_WORKFLOW_GRACE_MS", hold.as_str()),
            ("OJS_BATCH_GRACE_MS", hold.as_str()),
        ];
        let config = Config {
            ack_wait_ms: HOLD_MS,
            visibility_timeout_ms: HOLD_MS,
            workflow_grace_ms: HOLD_MS,
            batch_grace_ms: HOLD_MS,
            ..test_config(&nats.url)
        };
        // The first to start takes the lease; the other waits for it to expire.
        let (armed, healthy) = if leader == Leader::Armed {
            let armed = GatewayProcess::start(&nats.url, &env).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            (armed, spawn_app_with(config).await)
        } else {
            let healthy = spawn_app_with(config).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            (GatewayProcess::start(&nats.url, &env).await, healthy)
        };
        Pair {
            armed,
            healthy,
            _nats: nats,
        }
    }

    /// Asserts that the armed gateway died at its point (so the test reached it).
    async fn died(&mut self) {
        let code = self.armed.exit_code(Duration::from_secs(10)).await;
        assert_eq!(code, Some(FAILPOINT_EXIT), "the failpoint was not reached");
    }

    /// Sends `body` to `path` on the armed gateway, which must die at its point before
    /// answering.
    async fn dies_on(&mut self, path: &str, body: Value) {
        no_answer(self.armed.try_post(path, body).await);
        self.died().await;
    }

    /// DELETEs `path` on the armed gateway, which must die at its point before answering.
    async fn dies_on_delete(&mut self, path: &str) {
        no_answer(self.armed.try_delete(path).await);
        self.died().await;
    }

    /// Enqueues a job through the healthy gateway and claims it through the armed one.
    async fn claimed_by_armed(&self, job: Value) -> String {
        let id = self.healthy.enqueue(job).await;
        let r = self
            .armed
            .try_post("/ojs/v1/workers/fetch", fetch_body("w1", 5000))
            .await
            .expect("the armed gateway answers a FETCH");
        assert_eq!(
            common::job_ids(&r.body["jobs"]),
            [id.as_str()],
            "{}",
            r.body
        );
        id
    }

    /// Runs `id` to completion through the healthy gateway: it is handed out once, at
    /// `attempt`, within `within`; its ACK succeeds; nothing is handed out after that.
    async fn completes_once(&self, id: &str, attempt: u64, within: Duration) {
        let started = Instant::now();
        let job = loop {
            let r = self
                .healthy
                .post("/ojs/v1/workers/fetch", fetch_body("w2", 1000))
                .await;
            assert_eq!(r.status, 200, "{}", r.body);
            if let Some(job) = r.body["jobs"].as_array().unwrap().first() {
                break job.clone();
            }
            assert!(started.elapsed() < within, "{id} was not handed out again");
        };
        assert_eq!(job["id"], id);
        assert_eq!(job["attempt"], attempt, "{job}");
        let r = self
            .healthy
            .ack(json!({"job_id": id, "worker_id": "w2"}))
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
        self.nothing_more().await;
        assert_eq!(self.healthy.job(id).await["state"], "completed");
    }

    /// No job is handed out for longer than a redelivery takes.
    async fn nothing_more(&self) {
        let r = self
            .healthy
            .post("/ojs/v1/workers/fetch", fetch_body("w3", HOLD_MS + 1500))
            .await;
        assert_eq!(r.body["jobs"], json!([]), "handed out again: {}", r.body);
    }
}

fn fetch_body(worker: &str, wait_ms: u64) -> Value {
    json!({"queues": ["fp"], "count": 1, "wait_ms": wait_ms, "worker_id": worker})
}

fn job() -> Value {
    common::job_on("fp")
}

/// The answer the armed gateway gave before dying: none.
fn no_answer(reply: Option<Reply>) {
    if let Some(r) = reply {
        panic!("answered {} before its failpoint: {}", r.status, r.body);
    }
}

/// PUSH died between its queue message and its record: nothing was accepted; the client's
/// retry with the same id through the other gateway is, and the job runs once.
#[tokio::test]
async fn push_killed_after_its_message_runs_once_when_the_client_retries() {
    for _ in 0..runs() {
        let mut p = Pair::start("enqueue.published", Leader::Healthy).await;
        let id = uuid::Uuid::now_v7().to_string();
        let mut body = job();
        body["id"] = json!(id);
        p.dies_on("/ojs/v1/jobs", body.clone()).await;
        p.healthy
            .get(&format!("/ojs/v1/jobs/{id}"))
            .await
            .assert_error(404, "not_found");
        let r = p.healthy.post("/ojs/v1/jobs", body).await;
        assert_eq!(r.status, 201, "{}", r.body);
        p.completes_once(&id, 1, Duration::from_secs(5)).await;
    }
}

/// PUSH of a unique job died holding the key's lock, before its job existed: nothing was
/// accepted, and the key blocks other enqueues no longer than the policy's period.
#[tokio::test]
async fn push_killed_holding_a_unique_lock_blocks_the_key_no_longer_than_its_period() {
    for _ in 0..runs() {
        let mut p = Pair::start("unique.locked", Leader::Healthy).await;
        let mut body = job();
        body["options"]["unique"] = json!({"period": "PT3S"});
        p.dies_on("/ojs/v1/jobs", body.clone()).await;
        let killed = Instant::now();
        // The lock's enqueue may still be on its way: the key is held meanwhile.
        p.healthy
            .post("/ojs/v1/jobs", body.clone())
            .await
            .assert_error(409, "duplicate");
        let id = loop {
            let r = p.healthy.post("/ojs/v1/jobs", body.clone()).await;
            if r.status == 201 {
                break r.body["job"]["id"].as_str().unwrap().to_owned();
            }
            r.assert_error(409, "duplicate");
            assert!(
                killed.elapsed() < Duration::from_secs(5),
                "the key stayed blocked"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(killed.elapsed() >= Duration::from_millis(2500));
        p.completes_once(&id, 1, Duration::from_secs(5)).await;
    }
}

/// A batch of `n` jobs on the failpoint queue, with ids the client chose: the ids and the
/// request body.
fn batch_of(n: usize) -> (Vec<String>, Value) {
    let ids: Vec<String> = (0..n).map(|_| uuid::Uuid::now_v7().to_string()).collect();
    let jobs: Vec<Value> = ids
        .iter()
        .map(|id| json!({"id": id, "type": "t.batch", "args": [], "options": {"queue": "fp"}}))
        .collect();
    (ids, json!({"jobs": jobs}))
}

/// Fetches and ACKs, through the healthy gateway, every job that comes within `within`,
/// until no job came for `quiet`: the ids handed out, in order, repeats included. The jobs
/// of one FETCH are ACKed side by side, well inside their 2 s reservation.
async fn drain(p: &Pair, within: Duration, quiet: Duration) -> Vec<String> {
    let mut done = Vec::new();
    let until = Instant::now() + within;
    let mut last = Instant::now();
    while Instant::now() < until && last.elapsed() < quiet {
        let r = p
            .healthy
            .post(
                "/ojs/v1/workers/fetch",
                json!({"queues": ["fp"], "count": 100, "wait_ms": 200, "worker_id": "w2"}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
        let ids = common::job_ids(&r.body["jobs"]);
        let acks = ids
            .iter()
            .map(|id| p.healthy.ack(json!({"job_id": id, "worker_id": "w2"})));
        for (id, r) in ids.iter().zip(futures::future::join_all(acks).await) {
            assert_eq!(r.status, 200, "ACK of {id}: {}", r.body);
            done.push((*id).to_owned());
            last = Instant::now();
        }
    }
    done
}

/// Every id of `ids` reads 404 (removed, or never created) within a few seconds.
async fn all_gone(app: &TestApp, ids: &[String]) {
    use futures::StreamExt;
    futures::stream::iter(ids)
        .for_each_concurrent(32, |id| async move {
            common::eventually(Duration::from_secs(10), "the job removed", || async {
                let r = app.get(&format!("/ojs/v1/jobs/{id}")).await;
                (r.status == 404).then_some(())
            })
            .await;
        })
        .await;
}

fn sorted(mut ids: Vec<String>) -> Vec<String> {
    ids.sort();
    ids
}

/// A batch PUSH of 1,000 died with its records created, before its commit: nothing was
/// accepted and no job of it is handed out. The client's retry of the same batch through
/// the other gateway takes the records over and every job runs once; the dead batch's
/// timer then removes nothing of the retry's.
#[tokio::test]
async fn a_batch_killed_before_its_commit_is_taken_over_by_the_clients_retry() {
    for _ in 0..runs() {
        let mut p = Pair::start("batch.created", Leader::Healthy).await;
        let (ids, body) = batch_of(1000);
        p.dies_on("/ojs/v1/jobs/batch", body.clone()).await;
        assert_eq!(p.healthy.job(&ids[0]).await["state"], "available");
        assert!(
            drain(&p, Duration::from_millis(500), Duration::from_millis(500))
                .await
                .is_empty()
        );
        // As a client does: a retryable 503 (a retry slower than this test's 2 s grace is
        // undone by its own timer) is sent again.
        let mut tries = 0;
        let r = loop {
            let r = p.healthy.post("/ojs/v1/jobs/batch", body.clone()).await;
            tries += 1;
            if r.status != 503 || tries == 5 {
                break r;
            }
        };
        assert_eq!(r.status, 201, "{}", r.body);
        let done = drain(&p, Duration::from_secs(20), Duration::from_millis(500)).await;
        assert_eq!(sorted(done), sorted(ids.clone()), "each job once");
        tokio::time::sleep(Duration::from_millis(HOLD_MS + 1000)).await;
        assert_eq!(p.healthy.job(&ids[999]).await["state"], "completed");
        p.nothing_more().await;
    }
}

/// The same death without a retry: once the grace passed, the leader removes the batch's
/// records; none of its jobs ever ran.
#[tokio::test]
async fn a_batch_killed_before_its_commit_is_removed_by_the_leader() {
    for _ in 0..runs() {
        let mut p = Pair::start("batch.created", Leader::Healthy).await;
        let (ids, body) = batch_of(1000);
        p.dies_on("/ojs/v1/jobs/batch", body).await;
        all_gone(&p.healthy, &ids).await;
        p.nothing_more().await;
    }
}

/// A batch PUSH of 1,000 died after its commit, before publishing its messages: once the
/// grace passed, the leader publishes them and every job runs once.
#[tokio::test]
async fn a_batch_killed_after_its_commit_runs_every_job_once() {
    for _ in 0..runs() {
        let mut p = Pair::start("batch.committed", Leader::Healthy).await;
        let (ids, body) = batch_of(1000);
        p.dies_on("/ojs/v1/jobs/batch", body).await;
        let done = drain(
            &p,
            Duration::from_millis(HOLD_MS + 20_000),
            Duration::from_millis(HOLD_MS + 1000),
        )
        .await;
        assert_eq!(sorted(done), sorted(ids), "each job once");
    }
}

/// A gateway killed with SIGKILL while it creates the records of a batch of 10,000, at
/// whatever point that is: the batch is all or none — every job runs once, or none is
/// handed out and every record is removed.
#[tokio::test]
async fn a_batch_killed_mid_create_is_all_or_none() {
    for _ in 0..runs() {
        let mut p = Pair::unarmed(Leader::Healthy).await;
        let (ids, body) = batch_of(10_000);
        let push = reqwest::Client::new()
            .post(p.armed.client().url("/ojs/v1/jobs/batch"))
            .header("content-type", "application/openjobspec+json")
            .body(body.to_string())
            .send();
        let push = tokio::spawn(push);
        // Kill once the first records exist (a look at one job every few ms).
        let probe = ids[ids.len() / 2].clone();
        common::eventually(Duration::from_secs(20), "the batch's records", || async {
            let r = p.healthy.get(&format!("/ojs/v1/jobs/{probe}")).await;
            (r.status == 200).then_some(())
        })
        .await;
        p.armed.kill();
        let answered = matches!(push.await, Ok(Ok(r)) if r.status() == 201);
        let done = drain(
            &p,
            Duration::from_millis(HOLD_MS + 30_000),
            Duration::from_millis(HOLD_MS + 1500),
        )
        .await;
        eprintln!(
            "killed mid-batch: {} of {} jobs ran (answered 201: {answered})",
            done.len(),
            ids.len()
        );
        if done.is_empty() {
            assert!(!answered, "an accepted batch never ran");
            all_gone(&p.healthy, &ids).await;
        } else {
            assert_eq!(sorted(done), sorted(ids), "all or none, each once");
        }
    }
}

/// A FETCH through the armed gateway dies at `point`; the job then reads `state` and runs
/// once, at `attempt`, through the other gateway within AckWait or the reservation.
async fn fetch_dies_at(point: &str, state: &str, attempt: u64) {
    for _ in 0..runs() {
        let mut p = Pair::start(point, Leader::Healthy).await;
        let id = p.healthy.enqueue(job()).await;
        p.dies_on("/ojs/v1/workers/fetch", fetch_body("w1", 1000))
            .await;
        assert_eq!(p.healthy.job(&id).await["state"], state);
        p.completes_once(&id, attempt, Duration::from_millis(HOLD_MS + 3000))
            .await;
    }
}

/// A claim died before its first NATS step: the message comes back after AckWait and the
/// job is claimed at its first attempt.
#[tokio::test]
async fn fetch_killed_before_its_claim_hands_the_job_out_after_ack_wait() {
    fetch_dies_at("fetch.claiming", "available", 1).await;
}

/// A claim died after its write, before the worker heard of it: the job is active with
/// nobody holding it until its reservation lapses, then runs at attempt 2.
#[tokio::test]
async fn fetch_killed_after_its_claim_lapses_and_runs_again() {
    fetch_dies_at("fetch.claimed", "active", 2).await;
}

/// An ACK died before its write: the job is still active; the worker's retry through the
/// other gateway completes it and its message is not handed out again.
#[tokio::test]
async fn ack_killed_before_its_write_succeeds_when_retried() {
    for _ in 0..runs() {
        let mut p = Pair::start("transition.prepared", Leader::Healthy).await;
        let id = p.claimed_by_armed(job()).await;
        p.dies_on(
            "/ojs/v1/workers/ack",
            json!({"job_id": id, "worker_id": "w1"}),
        )
        .await;
        assert_eq!(p.healthy.job(&id).await["state"], "active");
        let r = p
            .healthy
            .ack(json!({"job_id": id, "worker_id": "w1"}))
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
        p.nothing_more().await;
        assert_eq!(p.healthy.job(&id).await["state"], "completed");
    }
}

/// An ACK died after its write, before releasing the message: the job is completed, the
/// retried ACK says so (409), and the message's redelivery is dropped, not handed out.
#[tokio::test]
async fn ack_killed_after_its_write_leaves_a_completed_job_and_no_redelivery() {
    for _ in 0..runs() {
        let mut p = Pair::start("transition.written", Leader::Healthy).await;
        let id = p.claimed_by_armed(job()).await;
        p.dies_on(
            "/ojs/v1/workers/ack",
            json!({"job_id": id, "worker_id": "w1"}),
        )
        .await;
        assert_eq!(p.healthy.job(&id).await["state"], "completed");
        let r = p
            .healthy
            .ack(json!({"job_id": id, "worker_id": "w1"}))
            .await;
        r.assert_error(409, "conflict");
        p.nothing_more().await;
    }
}

/// A FAIL died after its retry timer, before its write: the retried FAIL schedules the
/// retry once; the spare timer fires stale; attempt 2 runs once.
#[tokio::test]
async fn fail_killed_before_its_write_retries_the_job_once() {
    for _ in 0..runs() {
        let mut p = Pair::start("transition.prepared", Leader::Healthy).await;
        let id = p.claimed_by_armed(job()).await;
        let fail = json!({"job_id": id, "worker_id": "w1",
            "error": {"code": "flaky", "message": "try again"}});
        p.dies_on("/ojs/v1/workers/fail", fail.clone()).await;
        assert_eq!(p.healthy.job(&id).await["state"], "active");
        let r = p.healthy.fail(fail).await;
        assert_eq!(r.status, 200, "{}", r.body);
        p.completes_once(&id, 2, Duration::from_secs(10)).await;
    }
}

/// A FAIL died after its write: the job is retryable and runs at attempt 2, once.
#[tokio::test]
async fn fail_killed_after_its_write_retries_the_job_once() {
    for _ in 0..runs() {
        let mut p = Pair::start("transition.written", Leader::Healthy).await;
        let id = p.claimed_by_armed(job()).await;
        let fail = json!({"job_id": id, "worker_id": "w1",
            "error": {"code": "flaky", "message": "try again"}});
        p.dies_on("/ojs/v1/workers/fail", fail).await;
        assert_eq!(p.healthy.job(&id).await["state"], "retryable");
        p.completes_once(&id, 2, Duration::from_secs(10)).await;
    }
}

/// A CANCEL died after its write: the job is cancelled and never handed out.
#[tokio::test]
async fn cancel_killed_after_its_write_leaves_a_cancelled_job() {
    for _ in 0..runs() {
        let mut p = Pair::start("transition.written", Leader::Healthy).await;
        let id = p.healthy.enqueue(job()).await;
        p.dies_on_delete(&format!("/ojs/v1/jobs/{id}")).await;
        assert_eq!(p.healthy.job(&id).await["state"], "cancelled");
        p.nothing_more().await;
    }
}

/// The leader died after firing a scheduled job's timer, before acknowledging it: the next
/// leader fires it again, harmlessly, and the job runs once.
#[tokio::test]
async fn leader_killed_after_firing_a_timer_runs_the_job_once() {
    for _ in 0..runs() {
        let mut p = Pair::start("scheduler.timer_fired", Leader::Armed).await;
        let mut scheduled = job();
        scheduled["options"]["scheduled_at"] = json!("+PT1S");
        let id = p.healthy.enqueue(scheduled).await;
        p.died().await;
        p.completes_once(&id, 1, Duration::from_secs(5)).await;
    }
}

/// The leader died after a cron tick's job, before moving the entry on: the next leader
/// fires the same tick again, which finds its job there; no tick runs twice.
#[tokio::test]
async fn leader_killed_after_a_cron_tick_fires_no_tick_twice() {
    for _ in 0..runs() {
        let mut p = Pair::start("cron.enqueued", Leader::Armed).await;
        let r = p
            .healthy
            .post(
                "/ojs/v1/cron",
                json!({"name": "fp-tick", "expression": "@every 1s", "overlap_policy": "allow",
                    "job_template": {"type": "cron.tick", "args": [], "options": {"queue": "fp"}}}),
            )
            .await;
        assert!(r.status.is_success(), "{}", r.body);
        p.died().await;
        // The healthy gateway leads within a lease TTL and catches up.
        tokio::time::sleep(Duration::from_secs(3)).await;
        p.healthy.delete("/ojs/v1/cron/fp-tick").await;
        let r = p
            .healthy
            .post(
                "/ojs/v1/workers/fetch",
                json!({"queues": ["fp"], "count": 100}),
            )
            .await;
        let mut ticks: Vec<&str> = r.body["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["meta"]["cron_triggered_at"].as_str().unwrap())
            .collect();
        assert!(ticks.len() >= 2, "{}", r.body);
        let all = ticks.len();
        ticks.sort_unstable();
        ticks.dedup();
        assert_eq!(ticks.len(), all, "a tick ran twice: {}", r.body);
    }
}

/// A dead-letter delete died after purging the record, before removing the entry: the job
/// is gone, and the stale entry is not listed.
#[tokio::test]
async fn dead_letter_delete_killed_after_its_purge_leaves_the_job_gone() {
    for _ in 0..runs() {
        let mut p = Pair::start("dead_letter.purged", Leader::Healthy).await;
        let id = common::dead_letter_a_job(&p.healthy, "fp").await;
        p.dies_on_delete(&format!("/ojs/v1/dead-letter/{id}")).await;
        p.healthy
            .get(&format!("/ojs/v1/jobs/{id}"))
            .await
            .assert_error(404, "not_found");
        let r = p.healthy.get("/ojs/v1/dead-letter").await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.body["jobs"], json!([]), "{}", r.body);
    }
}

/// Fetches and ACKs, through the healthy gateway, every job of `queue` that comes within
/// `within`, in order; gives their types.
async fn work_through(p: &Pair, within: Duration) -> Vec<String> {
    let mut done = Vec::new();
    let until = Instant::now() + within;
    while Instant::now() < until {
        let r = p
            .healthy
            .post("/ojs/v1/workers/fetch", fetch_body("w2", 500))
            .await;
        for j in r.body["jobs"].as_array().cloned().unwrap_or_default() {
            let r = p
                .healthy
                .ack(json!({"job_id": j["id"], "worker_id": "w2", "result": j["type"]}))
                .await;
            assert_eq!(r.status, 200, "{}", r.body);
            done.push(j["type"].as_str().unwrap().to_owned());
        }
    }
    done
}

/// The leader died after a workflow decision's effects (the next chain step made
/// available), before writing the workflow: the next leader replays the step's completion,
/// makes the same decision — the step is already available, nothing is created twice —
/// and the chain runs every step once, in order.
#[tokio::test]
async fn leader_killed_between_a_workflow_step_and_its_record_runs_every_step_once() {
    for _ in 0..runs() {
        let mut p = Pair::start("workflow.effects_done", Leader::Armed).await;
        let steps: Vec<Value> = ["s0", "s1", "s2"]
            .iter()
            .map(|t| json!({"type": t, "args": [], "options": {"queue": "fp"}}))
            .collect();
        let r = p
            .healthy
            .post(
                "/ojs/v1/workflows",
                json!({"type": "chain", "steps": steps}),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.body);
        let id = r.body["workflow"]["id"].as_str().unwrap().to_owned();
        let r = p
            .healthy
            .post("/ojs/v1/workers/fetch", fetch_body("w2", 5000))
            .await;
        let first = r.body["jobs"][0].clone();
        assert_eq!(first["type"], "s0", "{}", r.body);
        let r = p
            .healthy
            .ack(json!({"job_id": first["id"], "worker_id": "w2", "result": "s0"}))
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
        p.died().await;
        assert_eq!(work_through(&p, Duration::from_secs(6)).await, ["s1", "s2"]);
        let w = p.healthy.get(&format!("/ojs/v1/workflows/{id}")).await;
        assert_eq!(w.body["workflow"]["state"], "completed", "{}", w.body);
        assert_eq!(w.body["workflow"]["steps_completed"], 3);
    }
}

/// A workflow creation died after its jobs, before marking the workflow ready: no 2xx, and
/// once the grace passed the leader cancels the jobs nobody took (here: all of them).
#[tokio::test]
async fn workflow_creation_killed_before_it_is_ready_is_cancelled() {
    for _ in 0..runs() {
        let mut p = Pair::start("workflow.jobs_created", Leader::Healthy).await;
        let body = json!({"type": "group", "name": "cut-short", "jobs": [job(), job()]});
        p.dies_on("/ojs/v1/workflows", body).await;
        let cancelled = common::eventually(
            Duration::from_millis(HOLD_MS + 5000),
            "both jobs cancelled",
            || async {
                let r = p.healthy.get("/ojs/v1/events?types=job.cancelled").await;
                let events = r.body["events"].as_array().cloned().unwrap_or_default();
                (events.len() == 2).then_some(events)
            },
        )
        .await;
        assert!(cancelled.iter().all(|e| e["data"]["queue"] == "fp"));
        assert!(work_through(&p, Duration::from_secs(1)).await.is_empty());
    }
}
