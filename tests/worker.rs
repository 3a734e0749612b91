//! The client and worker library, through real processes where the worker protocol is
//! about processes: the example worker is started against a gateway on a real nats-server
//! and sent POSIX signals.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{dead_letter_a_job, eventually, spawn_app, NatsServer, TestApp};
use ojs_client::trace::TraceContext;
use ojs_client::worker::{
    ExecutionMiddleware, ExecutionNext, HandlerError, JobContext, Worker, WorkerConfig,
};
use ojs_client::{BoxFuture, Client, ClientError, EnqueueMiddleware, EnqueueNext, JobSpec};
use serde_json::{json, Value};

/// An example binary, next to this test's own binary. Built here first, so that running
/// this file alone (`cargo test --test integration worker::`) never runs a stale or missing
/// one; after a whole `cargo test` the build has nothing to do.
fn example(name: &str) -> std::path::PathBuf {
    static BUILT: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    BUILT.get_or_init(|| {
        let mut build = Command::new(env!("CARGO"));
        build
            .args(["build", "--examples"])
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        // What cargo sets for a test process only: build scripts that see it differ from
        // the outer build's would rebuild their crates, and the next `cargo test` again.
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy();
            if key.starts_with("CARGO_PKG_")
                || key.starts_with("CARGO_MANIFEST_")
                || key.starts_with("CARGO_BIN_EXE_")
                || key == "LD_LIBRARY_PATH"
                // The package's build-script output, set for its tests: ring's build script
                // reads it, so inherited it rebuilt ring and all above it (130 s in CI).
                || key == "OUT_DIR"
            {
                build.env_remove(key.as_ref());
            }
        }
        if profile_dir.ends_with("release") {
            build.arg("--release");
        }
        assert!(
            build.status().expect("run cargo").success(),
            "building the examples failed"
        );
    });
    let path = profile_dir.join("examples").join(name);
    assert!(path.exists(), "{} is missing", path.display());
    path
}

/// The example worker as a child process, with its stdout lines collected.
struct WorkerProcess {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl WorkerProcess {
    fn start(
        url: &str,
        queues: &str,
        concurrency: usize,
        grace: &str,
        worker_id: &str,
    ) -> WorkerProcess {
        let mut child = Command::new(example("worker"))
            .args([
                "--url",
                url,
                "--queues",
                queues,
                "--concurrency",
                &concurrency.to_string(),
            ])
            .args([
                "--grace-period",
                grace,
                "--heartbeat-interval",
                "0.3",
                "--worker-id",
                worker_id,
            ])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the example worker");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let out = child.stdout.take().unwrap();
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        WorkerProcess { child, lines }
    }

    fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{name} failed");
    }

    fn printed(&self, line: &str) -> bool {
        self.lines.lock().unwrap().iter().any(|l| l == line)
    }

    async fn wait_printed(&self, line: &str) {
        eventually(Duration::from_secs(10), line, || async {
            self.printed(line).then_some(())
        })
        .await;
    }

    /// Waits for the process to exit; its exit code.
    async fn exit_code(&mut self, within: Duration) -> i32 {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            assert!(Instant::now() < deadline, "the worker did not exit");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn states(app: &TestApp, ids: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for id in ids {
        out.push(app.job(id).await["state"].as_str().unwrap().to_string());
    }
    out
}

async fn enqueue_n(
    app: &TestApp,
    queue: &str,
    job_type: &str,
    args: Value,
    n: usize,
) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..n {
        ids.push(
            app.enqueue(json!({"type": job_type, "args": args, "options": {"queue": queue}}))
                .await,
        );
    }
    ids
}

/// How many of `ids` the server held active at one instant: a forward pass over every job,
/// then a backward re-read of those seen active. A job active in both reads was active at
/// the end of the forward pass (these jobs are not fetched again within a pass), so the
/// count never exceeds the true one; a single pass would also count a job that finished
/// early in it together with one that started late in it. Jobs found completed are taken
/// out of `ids`: they are never active again.
async fn active_at_once(app: &TestApp, ids: &mut Vec<String>) -> usize {
    let mut seen = Vec::new();
    let mut completed = Vec::new();
    for id in ids.iter() {
        match app.job(id).await["state"].as_str() {
            Some("active") => seen.push(id),
            Some("completed") => completed.push(id.clone()),
            _ => {}
        }
    }
    let mut held = 0;
    for id in seen.into_iter().rev() {
        if app.job(id).await["state"] == "active" {
            held += 1;
        }
    }
    ids.retain(|id| !completed.contains(id));
    held
}

#[tokio::test]
async fn the_worker_never_runs_more_jobs_than_its_concurrency() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let ids = enqueue_n(&app, "burst", "demo.sleep", json!([300]), 12).await;
    let worker = WorkerProcess::start(&app.base, "burst", 3, "5", "w-burst");
    let mut most = 0;
    let started = Instant::now();
    loop {
        most = most.max(active_at_once(&app, &mut ids.clone()).await);
        let now = states(&app, &ids).await;
        if now.iter().all(|s| s == "completed") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "jobs did not finish: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    println!(
        "12 jobs of 300 ms at concurrency 3: at most {most} active at once, all done in {:?}",
        started.elapsed()
    );
    assert!(most <= 3, "{most} jobs ran at once");
    assert!(most >= 2, "the worker never ran jobs side by side");
    drop(worker);
}

#[tokio::test]
async fn sigtstp_quiets_the_worker_while_active_jobs_finish_and_sigcont_resumes() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let running = enqueue_n(&app, "quiet", "demo.sleep", json!([1200]), 2).await;
    let mut worker = WorkerProcess::start(&app.base, "quiet", 2, "5", "w-quiet");
    eventually(Duration::from_secs(5), "both jobs active", || async {
        (states(&app, &running).await == ["active", "active"]).then_some(())
    })
    .await;
    worker.signal("TSTP");
    worker.wait_printed("worker state: quiet").await;
    let waiting = enqueue_n(&app, "quiet", "demo.echo", json!(["later"]), 2).await;
    eventually(Duration::from_secs(5), "active jobs to finish", || async {
        (states(&app, &running).await == ["completed", "completed"]).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        states(&app, &waiting).await,
        ["available", "available"],
        "a quiet worker fetched"
    );
    worker.signal("CONT");
    worker.wait_printed("worker state: running").await;
    eventually(Duration::from_secs(5), "the waiting jobs", || async {
        (states(&app, &waiting).await == ["completed", "completed"]).then_some(())
    })
    .await;
    assert_eq!(app.job(&waiting[0]).await["result"], json!(["later"]));
    worker.signal("TERM");
    assert_eq!(worker.exit_code(Duration::from_secs(5)).await, 0);
    assert!(worker.printed("worker stopped: jobs_completed=4 jobs_failed=0 jobs_shutdown=0"));
}

#[tokio::test]
async fn sigterm_waits_the_grace_period_then_hands_unfinished_jobs_back() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let ids = enqueue_n(&app, "long", "demo.sleep", json!([30000]), 2).await;
    let mut worker = WorkerProcess::start(&app.base, "long", 2, "1", "w-term");
    eventually(Duration::from_secs(5), "both jobs active", || async {
        (states(&app, &ids).await == ["active", "active"]).then_some(())
    })
    .await;
    let sent = Instant::now();
    worker.signal("TERM");
    let code = worker.exit_code(Duration::from_secs(10)).await;
    let took = sent.elapsed();
    println!("SIGTERM with a 1 s grace period and 2 unfinished jobs: exit {code} after {took:?}");
    assert_eq!(code, 0);
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "{took:?}"
    );
    assert!(worker.printed("worker state: terminate"));
    assert!(worker.printed("worker stopped: jobs_completed=0 jobs_failed=0 jobs_shutdown=2"));
    for id in &ids {
        let job = app.job(id).await;
        assert_eq!(job["state"], "available", "{job}");
        assert_eq!(job["error"]["type"], "shutdown");
    }
}

/// The signal sequence of a worker's life arriving while FETCHes are in flight: a steady
/// trickle of short jobs, a varying number (0 to 5) of long ones at a higher priority, then
/// SIGTSTP, SIGCONT and SIGTERM at varying moments. Sampled every 20 ms, the server never
/// sees the worker hold more jobs than its concurrency, and once it has exited no job is
/// left reserved. 5 rounds; 50 with OJS_SOAK=1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_around_fetches_in_flight_neither_exceed_the_concurrency_nor_strand_a_job() {
    const CONCURRENCY: usize = 5;
    let rounds = if std::env::var_os("OJS_SOAK").is_some() {
        50
    } else {
        5
    };
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let (mut over_limit, mut stranded, mut handed_back, mut most) = (0, 0, 0, 0);
    for round in 0..rounds {
        let queue = format!("signals-{round}");
        let short = json!({"type": "demo.sleep", "args": [200], "options": {"queue": queue}});
        let long = json!({"type": "demo.sleep", "args": [15000],
            "options": {"queue": queue, "priority": 100}});
        let ids = Mutex::new(Vec::new());
        let mut worker = WorkerProcess::start(&app.base, &queue, CONCURRENCY, "2", &queue);
        let exited = AtomicBool::new(false);
        let sampler = async {
            let (mut watched, mut taken, mut most, mut over) = (Vec::new(), 0, 0, 0);
            while !exited.load(Ordering::Relaxed) {
                let ids = ids.lock().unwrap().clone();
                watched.extend(ids.iter().skip(taken).cloned());
                taken = ids.len();
                let held = active_at_once(&app, &mut watched).await;
                most = most.max(held);
                over += usize::from(held > CONCURRENCY);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (most, over)
        };
        let feeder = async {
            while !exited.load(Ordering::Relaxed) {
                let id = app.enqueue(short.clone()).await;
                ids.lock().unwrap().push(id);
                tokio::time::sleep(Duration::from_millis(rand::random_range(20..300))).await;
            }
        };
        let signals = async {
            let pause = || Duration::from_millis(rand::random_range(100..1500));
            tokio::time::sleep(pause()).await;
            for _ in 0..round % 6 {
                let id = app.enqueue(long.clone()).await;
                ids.lock().unwrap().push(id);
            }
            for signal in ["TSTP", "CONT", "TERM"] {
                tokio::time::sleep(pause()).await;
                worker.signal(signal);
            }
            assert_eq!(worker.exit_code(Duration::from_secs(15)).await, 0);
            exited.store(true, Ordering::Relaxed);
        };
        let ((round_most, over), (), ()) = tokio::join!(sampler, feeder, signals);
        most = most.max(round_most);
        over_limit += over;
        let ids = ids.into_inner().unwrap();
        for id in &ids {
            let job = app.job(id).await;
            stranded += usize::from(job["state"] == "active");
            handed_back += usize::from(job["error"]["type"] == "shutdown");
        }
    }
    println!(
        "{rounds} rounds of TSTP/CONT/TERM at concurrency {CONCURRENCY}: at most {most} active \
         at once, {over_limit} over-limit samples, {stranded} jobs left reserved, \
         {handed_back} handed back"
    );
    assert_eq!(
        over_limit, 0,
        "the worker held more jobs than its concurrency"
    );
    assert_eq!(
        stranded, 0,
        "jobs stayed reserved by a worker that had exited"
    );
}

#[tokio::test]
async fn a_terminate_directive_from_the_server_shuts_the_worker_down() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let ids = enqueue_n(&app, "directed", "demo.sleep", json!([30000]), 1).await;
    let mut worker = WorkerProcess::start(&app.base, "directed", 1, "0.5", "w-directed");
    eventually(Duration::from_secs(5), "the job active", || async {
        (states(&app, &ids).await == ["active"]).then_some(())
    })
    .await;
    eventually(
        Duration::from_secs(5),
        "the worker's first heartbeat",
        || async {
            (app.get("/ojs/v1/admin/workers/w-directed").await.status == 200).then_some(())
        },
    )
    .await;
    let sent = Instant::now();
    assert_eq!(
        app.post("/ojs/v1/admin/workers/w-directed/terminate", json!({}))
            .await
            .status,
        200
    );
    assert_eq!(worker.exit_code(Duration::from_secs(10)).await, 0);
    println!(
        "terminate directive → worker exit in {:?} (heartbeat 0.3 s, grace 0.5 s)",
        sent.elapsed()
    );
    assert!(worker.printed("worker state: terminate"));
    assert_eq!(app.job(&ids[0]).await["error"]["type"], "shutdown");
}

#[tokio::test]
async fn failures_and_panics_become_fails_and_the_worker_goes_on() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let failing = app.enqueue(json!({"type": "demo.fail", "args": [], "options": {"queue": "bad", "retry": {"max_attempts": 1}}})).await;
    let panicking = app.enqueue(json!({"type": "t.panic", "args": [], "options": {"queue": "bad", "retry": {"max_attempts": 1}}})).await;
    let fine = app
        .enqueue(json!({"type": "demo.echo", "args": [1], "options": {"queue": "bad"}}))
        .await;
    let mut cfg = WorkerConfig::new(&app.base, &["bad"]);
    cfg.heartbeat_interval = Duration::from_millis(300);
    let mut worker = Worker::new(cfg);
    worker
        .register("demo.fail", |_ctx: JobContext| async {
            Err::<Value, _>(HandlerError::new("DemoError", "always"))
        })
        .register("t.panic", |_ctx: JobContext| async {
            panic!("handler exploded")
        })
        .register("demo.echo", |ctx: JobContext| async move { Ok(ctx.args) });
    let control = worker.control();
    let run = tokio::spawn(worker.run_until_terminated());
    eventually(Duration::from_secs(5), "all three settled", || async {
        let states = states(&app, &[failing.clone(), panicking.clone(), fine.clone()]).await;
        (states == ["discarded", "discarded", "completed"]).then_some(())
    })
    .await;
    let failed = app.job(&failing).await;
    assert_eq!(failed["error"]["type"], "DemoError");
    // Frame strings (core §8), within the worker protocol's bounds.
    let frames = failed["error"]["backtrace"].as_array().unwrap();
    assert!(!frames.is_empty() && frames.len() <= 50, "{frames:?}");
    let chars: usize = frames.iter().map(|f| f.as_str().unwrap().len()).sum();
    assert!(chars <= 10_000);
    let panicked = app.job(&panicking).await;
    assert_eq!(panicked["error"]["type"], "panic");
    assert_eq!(panicked["error"]["message"], "handler exploded");
    control.terminate();
    let summary = run.await.unwrap();
    assert_eq!((summary.jobs_completed, summary.jobs_failed), (1, 2));
}

/// Enqueue middleware that records its name in `meta.trail`, or refuses.
struct Tag(&'static str, bool);

impl EnqueueMiddleware for Tag {
    fn handle<'a>(
        &'a self,
        mut job: JobSpec,
        next: EnqueueNext<'a>,
    ) -> BoxFuture<'a, Result<Value, ClientError>> {
        if self.1 {
            return Box::pin(
                async move { Err(ClientError::Refused(format!("{} says no", self.0))) },
            );
        }
        let mut trail = job
            .meta
            .get("trail")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        trail.push(json!(self.0));
        job.meta.insert("trail".into(), Value::Array(trail));
        next.run(job)
    }
}

/// Execution middleware that records "<name>:before" / "<name>:after", or fails the job.
struct Around(&'static str, Arc<Mutex<Vec<String>>>, bool);

impl ExecutionMiddleware for Around {
    fn handle<'a>(
        &'a self,
        ctx: JobContext,
        next: ExecutionNext<'a>,
    ) -> BoxFuture<'a, Result<Value, HandlerError>> {
        Box::pin(async move {
            self.1.lock().unwrap().push(format!("{}:before", self.0));
            if self.2 {
                return Err(
                    HandlerError::new("Refused", format!("{} refused", self.0)).final_error()
                );
            }
            let out = next.run(ctx).await;
            self.1.lock().unwrap().push(format!("{}:after", self.0));
            out
        })
    }
}

#[tokio::test]
async fn middleware_runs_in_chain_order_and_can_refuse() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let mut client = Client::new(&app.base);
    client
        .enqueue_middleware()
        .add("a", Arc::new(Tag("a", false)))
        .add("c", Arc::new(Tag("c", false)));
    assert!(client
        .enqueue_middleware()
        .insert_before("c", "b", Arc::new(Tag("b", false))));
    let job = client
        .enqueue(JobSpec::new("t.mw", json!([])).queue("mw"))
        .await
        .unwrap();
    assert_eq!(job["meta"]["trail"], json!(["a", "b", "c"]));
    let batch = client
        .enqueue_batch(vec![JobSpec::new("t.mw", json!([1])).queue("mw")])
        .await
        .unwrap();
    assert_eq!(batch[0]["meta"]["trail"], json!(["a", "b", "c"]));
    client
        .enqueue_middleware()
        .insert_after("a", "no", Arc::new(Tag("no", true)));
    let refused = client
        .enqueue(JobSpec::new("t.mw", json!([])).queue("mw-refused"))
        .await;
    assert!(
        matches!(refused, Err(ClientError::Refused(_))),
        "{refused:?}"
    );
    assert!(
        app.fetch(&["mw-refused"], "w").await.is_empty(),
        "a refused job was sent"
    );
    const ID: &str = "019539a4-0000-7000-8000-000000000000";
    let err = client.get(ID).await.unwrap_err();
    assert_eq!(err.code(), Some("not_found"));
    assert!(!err.retryable() && !err.is_timeout());
    let unreachable = Client::new("http://127.0.0.1:9").get(ID).await.unwrap_err();
    assert!(
        matches!(unreachable, ClientError::Transport(_)),
        "{unreachable:?}"
    );
    assert!(unreachable.retryable() && !unreachable.is_timeout());

    let trail = Arc::new(Mutex::new(Vec::new()));
    let ok = app
        .enqueue(json!({"type": "t.run", "args": [], "options": {"queue": "exec"}}))
        .await;
    let mut worker = Worker::new(WorkerConfig::new(&app.base, &["exec"]));
    let seen = trail.clone();
    worker.register("t.run", move |_ctx: JobContext| {
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().push("handler".into());
            Ok(Value::Null)
        }
    });
    worker
        .middleware()
        .add("outer", Arc::new(Around("outer", trail.clone(), false)))
        .add("inner", Arc::new(Around("inner", trail.clone(), false)));
    let control = worker.control();
    let run = tokio::spawn(worker.run_until_terminated());
    eventually(Duration::from_secs(5), "the job", || async {
        (app.job(&ok).await["state"] == "completed").then_some(())
    })
    .await;
    control.terminate();
    run.await.unwrap();
    assert_eq!(
        *trail.lock().unwrap(),
        [
            "outer:before",
            "inner:before",
            "handler",
            "inner:after",
            "outer:after"
        ]
    );

    let refused = app
        .enqueue(json!({"type": "t.run", "args": [], "options": {"queue": "exec2"}}))
        .await;
    let mut worker = Worker::new(WorkerConfig::new(&app.base, &["exec2"]));
    worker.register("t.run", |_ctx: JobContext| async { panic!("must not run") });
    worker.middleware().add(
        "gate",
        Arc::new(Around("gate", Arc::new(Mutex::new(Vec::new())), true)),
    );
    let control = worker.control();
    let run = tokio::spawn(worker.run_until_terminated());
    eventually(Duration::from_secs(5), "the refused job", || async {
        (app.job(&refused).await["state"] == "discarded").then_some(())
    })
    .await;
    assert_eq!(app.job(&refused).await["error"]["type"], "Refused");
    control.terminate();
    run.await.unwrap();
}

#[tokio::test]
async fn the_producer_example_enqueues_in_batches_and_prints_ids() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let out = tokio::process::Command::new(example("producer"))
        .args([
            "--url",
            &app.base,
            "--queue",
            "made",
            "--type",
            "demo.echo",
            "--count",
            "5",
            "--args",
            "[7]",
        ])
        .output()
        .await
        .unwrap();
    assert!(out.status.success());
    let ids: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(ids.len(), 5);
    for id in &ids {
        assert_eq!(app.job(id).await["args"], json!([7]));
    }
}

#[tokio::test]
async fn a_workflow_built_by_the_client_hands_each_step_its_parents_results() {
    use ojs_client::workflow::{chain, group};
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let client = Client::new(&app.base);
    let flow = chain([
        JobSpec::new("wf.first", json!([1])).queue("wfq").into(),
        JobSpec::new("wf.second", json!([2])).queue("wfq").into(),
        group([JobSpec::new("wf.side", json!([3])).queue("wfq")]),
    ])
    .named("built");
    let created = client.workflow(flow).await.unwrap();
    assert_eq!(created["name"], "built");
    assert_eq!(created["steps"][2]["type"], "group");
    let id = created["id"].as_str().unwrap().to_owned();

    // Per step run: its type, parent_results and workflow_id.
    type Seen = Vec<(String, Option<Value>, Option<String>)>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let mut worker = Worker::new(WorkerConfig::new(&app.base, &["wfq"]));
    for job_type in ["wf.first", "wf.second", "wf.side"] {
        let seen = seen.clone();
        worker.register(job_type, move |ctx: JobContext| {
            let seen = seen.clone();
            async move {
                let me = ctx.job_type.clone();
                seen.lock()
                    .unwrap()
                    .push((me.clone(), ctx.parent_results, ctx.workflow_id));
                Ok(json!({"by": me}))
            }
        });
    }
    let control = worker.control();
    let run = tokio::spawn(worker.run_until_terminated());
    let done = eventually(Duration::from_secs(10), "the workflow done", || async {
        let w = client.get_workflow(&id).await.unwrap();
        (w["state"] == "completed").then_some(w)
    })
    .await;
    control.terminate();
    run.await.unwrap();
    assert_eq!(done["steps_completed"], 3);
    let seen = seen.lock().unwrap().clone();
    let order: Vec<&str> = seen.iter().map(|(t, _, _)| t.as_str()).collect();
    assert_eq!(order, ["wf.first", "wf.second", "wf.side"]);
    assert_eq!(seen[0].1, None);
    assert_eq!(seen[0].2.as_deref(), Some(id.as_str()));
    assert_eq!(seen[1].1, Some(json!([{"by": "wf.first"}])));
    // The group's job runs under the nested workflow, begun with the chain's results.
    let nested = done["steps"][2]["job_id"].as_str().unwrap();
    assert_eq!(seen[2].2.as_deref(), Some(nested));
    assert_eq!(
        seen[2].1,
        Some(json!([{"by": "wf.first"}, {"by": "wf.second"}]))
    );
    let r = client.cancel_workflow(&id).await.unwrap_err();
    assert!(
        matches!(r, ClientError::Server { status: 409, .. }),
        "{r:?}"
    );
}

#[tokio::test]
async fn trace_context_travels_from_the_producer_through_the_worker_to_the_jobs_it_enqueues() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let client = Client::new(&app.base);
    let origin = TraceContext::parse(
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        Some("congo=t61rcWkgMzE"),
    )
    .unwrap();
    let first = client
        .enqueue(
            JobSpec::new("order.place", json!([1]))
                .queue("traced")
                .trace_context(&origin),
        )
        .await
        .unwrap();
    let seen = Arc::new(Mutex::new(None));
    let mut worker = Worker::new(WorkerConfig::new(&app.base, &["traced"]));
    let (handler_client, handler_seen) = (client.clone(), seen.clone());
    worker.register("order.place", move |ctx: JobContext| {
        let (client, seen) = (handler_client.clone(), handler_seen.clone());
        async move {
            let trace = ctx.trace_context().expect("the producer's trace context");
            *seen.lock().unwrap() = Some(trace.clone());
            let next = JobSpec::new("order.ship", json!([1]))
                .queue("after")
                .trace_context(&trace.child());
            let job = client
                .enqueue(next)
                .await
                .map_err(|e| HandlerError::new("Enqueue", e.to_string()))?;
            Ok(job["id"].clone())
        }
    });
    let control = worker.control();
    let run = tokio::spawn(worker.run_until_terminated());
    let first_id = first["id"].as_str().unwrap().to_owned();
    let shipped = eventually(Duration::from_secs(5), "the first job done", || async {
        let job = app.job(&first_id).await;
        (job["state"] == "completed").then(|| job["result"].as_str().unwrap().to_owned())
    })
    .await;
    control.terminate();
    run.await.unwrap();
    assert_eq!(seen.lock().unwrap().as_ref(), Some(&origin));
    let meta = app.job(&shipped).await["meta"].clone();
    let carried = TraceContext::from_meta(meta.as_object().unwrap()).unwrap();
    assert_eq!(carried.trace_id, origin.trace_id);
    assert_eq!(carried.state, origin.state);
    assert_ne!(carried.span_id, origin.span_id);
    // The server's events of both jobs name the one trace (events seed §8.1).
    for id in [&first_id, &shipped] {
        let events = app.get(&format!("/ojs/v1/events?job_id={id}")).await.body;
        let events = events["events"].as_array().unwrap();
        assert!(!events.is_empty());
        assert!(events
            .iter()
            .all(|e| e["data"]["trace_id"] == origin.trace_id.as_str()));
    }
}

#[tokio::test]
async fn a_worker_is_ready_while_running_and_unready_once_quiet_but_alive_until_it_exits() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let mut cfg = WorkerConfig::new(&app.base, &["probed"]);
    cfg.heartbeat_interval = Duration::from_millis(200);
    cfg.worker_id = "w-probed".into();
    let mut worker = Worker::new(cfg);
    let addr = worker.serve_health("127.0.0.1:0").unwrap();
    assert!(
        Worker::new(WorkerConfig::new(&app.base, &["probed"]))
            .serve_health(addr)
            .is_err(),
        "a taken port is refused when the probes are set up"
    );
    let control = worker.control();
    let run = tokio::spawn(worker.run_until_terminated());
    let probes = TestApp::at(&format!("http://{addr}"));
    let ready = probes.get("/readyz").await;
    assert_eq!(ready.status, 200);
    assert_eq!(
        (
            &ready.body["status"],
            &ready.body["state"],
            &ready.body["worker_id"]
        ),
        (&json!("ready"), &json!("running"), &json!("w-probed"))
    );
    assert_eq!(probes.get("/healthz").await.status, 200);
    assert_eq!(probes.get("/elsewhere").await.status, 404);
    // An operator quiets it through the server; the next heartbeat brings the directive.
    eventually(Duration::from_secs(5), "the first heartbeat", || async {
        (app.get("/ojs/v1/admin/workers/w-probed").await.status == 200).then_some(())
    })
    .await;
    assert_eq!(
        app.post("/ojs/v1/admin/workers/w-probed/quiet", json!({}))
            .await
            .status,
        200
    );
    let unready = eventually(Duration::from_secs(5), "readiness failing", || async {
        let reply = probes.get("/readyz").await;
        (reply.status == 503).then_some(reply.body)
    })
    .await;
    assert_eq!(
        (&unready["status"], &unready["state"]),
        (&json!("unready"), &json!("quiet"))
    );
    let live = probes.get("/health/live").await;
    assert_eq!(
        (live.status.as_u16(), &live.body["state"]),
        (200, &json!("quiet"))
    );
    // A connection that never finishes its request is closed, not held open for good.
    let mut stalled = tokio::net::TcpStream::connect(addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stalled, b"GET /readyz HTTP/1.1\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::io::AsyncReadExt::read(&mut stalled, &mut buf),
    )
    .await
    .expect("the probe server closes a stalled connection");
    assert_eq!(read.unwrap(), 0, "closed without an answer");
    control.terminate();
    run.await.unwrap();
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "the probes stop with the worker"
    );
}

#[tokio::test]
async fn the_client_pauses_queues_reads_stats_and_progress_and_works_the_dead_letter_queue() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let client = Client::new(&app.base);
    let job = client
        .enqueue(JobSpec::new("t.x", json!([])).queue("ops"))
        .await
        .unwrap();
    let id = job["id"].as_str().unwrap();
    let paused = client.set_paused("ops", true).await.unwrap();
    assert_eq!(
        (&paused["name"], &paused["paused"]),
        (&json!("ops"), &json!(true))
    );
    assert!(
        app.fetch(&["ops"], "w-ops").await.is_empty(),
        "a paused queue hands nothing out"
    );
    let stats = client.queue_stats("ops").await.unwrap();
    assert_eq!(stats["paused"], true);
    assert_eq!(
        client.set_paused("ops", false).await.unwrap()["paused"],
        false
    );
    let listed = client.queues(100, 0).await.unwrap();
    assert!(listed["queues"]
        .as_array()
        .unwrap()
        .iter()
        .any(|q| q["name"] == "ops" && q["paused"] == false));
    assert_eq!(app.fetch(&["ops"], "w-ops").await.len(), 1);
    let reported = app
        .put(
            &format!("/ojs/v1/jobs/{id}/progress"),
            json!({"progress": 0.5, "message": "half", "worker_id": "w-ops"}),
        )
        .await;
    assert_eq!(reported.status, 200);
    let progress = client.progress(id).await.unwrap();
    assert_eq!(
        (&progress["progress"], &progress["message"]),
        (&json!(0.5), &json!("half"))
    );

    let dead = dead_letter_a_job(&app, "ops-dlq").await;
    let retried = client.retry_dead_letter(&dead).await.unwrap();
    assert_eq!(
        (&retried["id"], &retried["state"]),
        (&json!(dead), &json!("available"))
    );
    let dead = dead_letter_a_job(&app, "ops-dlq-2").await;
    client.delete_dead_letter(&dead).await.unwrap();
    let gone = client.retry_dead_letter(&dead).await.unwrap_err();
    assert_eq!(gone.code(), Some("not_found"));
    // An id is one path segment: it cannot steer the request to another route.
    let other = client
        .enqueue(JobSpec::new("t.x", json!([])).queue("ops-other"))
        .await
        .unwrap();
    let other = other["id"].as_str().unwrap();
    let steered = client
        .delete_dead_letter(&format!("../jobs/{other}"))
        .await
        .unwrap_err();
    assert_eq!(steered.code(), Some("not_found"), "{steered}");
    assert_eq!(app.job(other).await["state"], "available", "not cancelled");
}

/// A worker that reports `drain` (the Rust worker does, terminating with jobs still
/// running) gets no new job from a FETCH through any gateway, settles the ones it holds,
/// and is listed as draining; another worker takes the waiting jobs.
#[tokio::test]
async fn a_draining_worker_gets_no_new_job_anywhere_and_finishes_its_own() {
    let nats = NatsServer::start();
    let a = spawn_app(&nats.url).await;
    let b = spawn_app(&nats.url).await;
    let held = a
        .enqueue(json!({"type": "t.long", "args": [], "options": {"queue": "drain"}}))
        .await;
    let release = Arc::new(tokio::sync::Notify::new());
    let mut config = WorkerConfig::new(&a.base, &["drain"]);
    config.worker_id = "w-draining".into();
    config.concurrency = 1;
    config.grace_period = Duration::from_secs(30);
    let mut worker = Worker::new(config);
    let gate = release.clone();
    worker.register("t.long", move |_ctx: JobContext| {
        let gate = gate.clone();
        async move {
            gate.notified().await;
            Ok(Value::Null)
        }
    });
    let control = worker.control();
    let run = tokio::spawn(worker.run_until_terminated());
    eventually(Duration::from_secs(5), "the job running", || async {
        (a.job(&held).await["state"] == "active").then_some(())
    })
    .await;
    control.terminate();
    // Its heartbeat on the change of state says `drain`, seen through the other gateway.
    eventually(
        Duration::from_secs(5),
        "the worker listed as draining",
        || async {
            let r = b.get("/ojs/v1/admin/workers").await;
            let listed = r.body["items"]
                .as_array()?
                .iter()
                .find(|w| w["id"] == "w-draining")?
                .clone();
            (listed["state"] == "drain").then_some(())
        },
    )
    .await;
    let waiting = a
        .enqueue(json!({"type": "t.long", "args": [], "options": {"queue": "drain"}}))
        .await;
    for app in [&a, &b] {
        let started = Instant::now();
        let r = app
            .post(
                "/ojs/v1/workers/fetch",
                json!({"queues": ["drain"], "worker_id": "w-draining", "wait_ms": 300}),
            )
            .await;
        assert_eq!(r.body["jobs"], json!([]), "{}", r.body);
        assert!(
            started.elapsed() >= Duration::from_millis(300),
            "it waits out its wait"
        );
    }
    assert_eq!(a.job(&waiting).await["state"], "available");
    // It settles what it holds, then stops; another worker takes the waiting job.
    release.notify_one();
    run.await.unwrap();
    assert_eq!(a.job(&held).await["state"], "completed");
    let jobs = b.fetch(&["drain"], "w-other").await;
    assert_eq!(jobs[0]["id"], waiting);
}
