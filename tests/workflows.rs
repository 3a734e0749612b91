//! Workflows (workflows spec; architecture §3.16) through the HTTP API: chains pass results
//! on, groups and batches end when their members do, callbacks fire once, cancel withdraws
//! what has not started, and the events say so.

use crate::common;

use std::time::Duration;

use common::{eventually, spawn_app, NatsServer, TestApp};
use serde_json::{json, Value};

fn job(t: &str, queue: &str) -> Value {
    json!({"type": t, "args": [], "options": {"queue": queue}})
}

async fn create(app: &TestApp, body: Value) -> Value {
    let r = app.post("/ojs/v1/workflows", body).await;
    assert_eq!(r.status, 201, "{}", r.body);
    r.body["workflow"].clone()
}

async fn workflow(app: &TestApp, id: &str) -> Value {
    let r = app.get(&format!("/ojs/v1/workflows/{id}")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.body["workflow"].clone()
}

/// Fetches one job of `queue`, waiting up to 5 s for it.
async fn next(app: &TestApp, queue: &str) -> Value {
    let r = app
        .post(
            "/ojs/v1/workers/fetch",
            json!({"queues": [queue], "worker_id": "w", "wait_ms": 5000}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["jobs"].as_array().unwrap().len(), 1, "{}", r.body);
    r.body["jobs"][0].clone()
}

async fn none_in(app: &TestApp, queue: &str) {
    assert_eq!(app.fetch(&[queue], "w").await, Vec::<Value>::new());
}

async fn ack(app: &TestApp, job: &Value, result: Value) {
    let r = app
        .ack(json!({"job_id": job["id"], "worker_id": "w", "result": result}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
}

/// Sixteen workers, half through each gateway, fetch until `queue` stays empty: each job
/// for which `fails` holds is failed, every other ACKed with its first argument as result.
async fn work_off(apps: &[TestApp], queue: &str, fails: impl Fn(&Value) -> bool + Copy) {
    let work = (0..16).map(|n| {
        let app = &apps[n % apps.len()];
        async move {
            loop {
                let r = app
                    .post(
                        "/ojs/v1/workers/fetch",
                        json!({"queues": [queue], "worker_id": "w", "count": 50, "wait_ms": 300}),
                    )
                    .await;
                let batch = r.body["jobs"].as_array().cloned().unwrap_or_default();
                if batch.is_empty() {
                    return;
                }
                for j in batch {
                    if fails(&j) {
                        let r = app
                            .fail(json!({"job_id": j["id"], "worker_id": "w",
                                "error": {"code": "x", "message": "no"}}))
                            .await;
                        assert_eq!(r.status, 200, "{}", r.body);
                    } else {
                        ack(app, &j, j["args"][0].clone()).await;
                    }
                }
            }
        }
    });
    futures::future::join_all(work).await;
}

/// Waits for the workflow to reach `state`. The leader advances workflows behind the
/// workers (by as much as a loaded machine makes it), so the wait fails only when the record
/// stops changing for 5 s short of `state`: a lost member outcome still fails it.
async fn ends(app: &TestApp, id: &str, state: &str) -> Value {
    const STILL: Duration = Duration::from_secs(5);
    let mut last = workflow(app, id).await;
    let mut changed = std::time::Instant::now();
    while last["state"] != state {
        assert!(
            changed.elapsed() < STILL,
            "the workflow stopped short of {state}: {last}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = workflow(app, id).await;
        if now != last {
            changed = std::time::Instant::now();
            last = now;
        }
    }
    last
}

#[tokio::test]
async fn a_chain_passes_every_earlier_result_on_also_across_a_retry() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let w = create(
        &app,
        json!({"type": "chain", "name": "pipeline", "steps": [
            job("extract", "c"), job("transform", "c"), job("load", "c")]}),
    )
    .await;
    let id = w["id"].as_str().unwrap().to_owned();
    assert_eq!(w["state"], "running");
    assert_eq!(w["steps"][0]["state"], "pending");
    assert_eq!(w["steps"][1]["state"], "waiting");

    let first = next(&app, "c").await;
    assert_eq!(first["type"], "extract");
    assert_eq!(first["workflow_id"], id.as_str());
    none_in(&app, "c").await; // the next step waits for this one
    ack(&app, &first, json!({"rows": 3})).await;

    let second = next(&app, "c").await;
    assert_eq!(second["type"], "transform");
    assert_eq!(second["parent_results"], json!([{"rows": 3}]));
    let r = app
        .fail(json!({"job_id": second["id"], "worker_id": "w",
            "error": {"code": "flaky", "message": "try again"}}))
        .await;
    assert_eq!(r.body["state"], "retryable", "{}", r.body);
    let again = eventually(Duration::from_secs(10), "the retry", || async {
        let jobs = app.fetch(&["c"], "w").await;
        jobs.into_iter().next()
    })
    .await;
    assert_eq!(again["id"], second["id"]);
    assert_eq!(again["attempt"], 2);
    assert_eq!(again["parent_results"], json!([{"rows": 3}]));
    ack(&app, &again, json!("clean")).await;

    let third = next(&app, "c").await;
    assert_eq!(third["parent_results"], json!([{"rows": 3}, "clean"]));
    ack(&app, &third, json!(null)).await;

    let done = ends(&app, &id, "completed").await;
    assert_eq!(done["steps_completed"], 3);
    assert_eq!(done["metadata"]["completed_count"], 3);
    let states: Vec<&Value> = done["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["state"])
        .collect();
    assert_eq!(states, ["completed", "completed", "completed"]);

    let events = eventually(Duration::from_secs(5), "the workflow events", || async {
        let r = app
            .get("/ojs/v1/events?types=workflow.started,workflow.step_completed,workflow.completed")
            .await;
        let events = r.body["events"].as_array().cloned().unwrap_or_default();
        (events.len() == 5).then_some(events)
    })
    .await;
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        [
            "workflow.started",
            "workflow.step_completed",
            "workflow.step_completed",
            "workflow.step_completed",
            "workflow.completed"
        ]
    );
    assert!(events
        .iter()
        .all(|e| e["data"]["workflow_id"] == id.as_str()));
}

#[tokio::test]
async fn a_batch_of_ten_thousand_through_two_gateways_fires_each_callback_once() {
    const JOBS: usize = 10_000;
    let nats = NatsServer::start();
    let apps = [spawn_app(&nats.url).await, spawn_app(&nats.url).await];
    let jobs: Vec<Value> = (0..JOBS)
        .map(|i| json!({"type": "send", "args": [i], "options": {"queue": "b"}}))
        .collect();
    let w = create(
        &apps[0],
        json!({"type": "batch", "jobs": jobs, "callbacks": {
            "on_complete": job("report", "cb-complete"),
            "on_success": job("celebrate", "cb-success"),
            "on_failure": job("alert", "cb-failure")}}),
    )
    .await;
    let id = w["id"].as_str().unwrap().to_owned();
    assert_eq!(w["jobs_total"], JOBS);

    work_off(&apps, "b", |_| false).await;

    let report = next(&apps[1], "cb-complete").await;
    let celebrate = next(&apps[0], "cb-success").await;
    let expected: Vec<Value> = (0..JOBS).map(|i| json!(i)).collect();
    assert_eq!(report["parent_results"], Value::Array(expected.clone()));
    assert_eq!(celebrate["parent_results"], Value::Array(expected));
    for app in &apps {
        none_in(app, "cb-complete").await;
        none_in(app, "cb-success").await;
        none_in(app, "cb-failure").await;
    }
    let running = workflow(&apps[0], &id).await;
    assert_eq!(running["state"], "running"); // until its callbacks end
    assert_eq!(running["jobs_completed"], JOBS);
    assert_eq!(running["callbacks"]["on_failure"]["state"], "skipped");
    ack(&apps[0], &report, json!(null)).await;
    ack(&apps[1], &celebrate, json!(null)).await;
    let done = ends(&apps[1], &id, "completed").await;
    assert_eq!(
        (
            done["jobs_completed"].as_u64(),
            done["jobs_failed"].as_u64()
        ),
        (Some(JOBS as u64), Some(0))
    );
}

#[tokio::test]
async fn a_group_ends_with_its_last_member_and_a_nested_chain_counts_as_one() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let w = create(
        &app,
        json!({"type": "group", "jobs": [
            {"type": "fragile", "args": [], "options": {"queue": "g", "retry": {"max_attempts": 1}}},
            {"type": "chain", "steps": [job("s0", "g-chain"), job("s1", "g-chain")]}]}),
    )
    .await;
    let id = w["id"].as_str().unwrap().to_owned();
    assert_eq!(w["steps"][1]["type"], "chain");

    let fragile = next(&app, "g").await;
    let r = app
        .fail(json!({"job_id": fragile["id"], "worker_id": "w", "error": {"code": "x", "message": "gone"}}))
        .await;
    assert_eq!(r.body["state"], "discarded", "{}", r.body);
    let s0 = next(&app, "g-chain").await;
    ack(&app, &s0, json!("a")).await;
    assert_eq!(workflow(&app, &id).await["state"], "running");
    let s1 = next(&app, "g-chain").await;
    assert_eq!(s1["parent_results"], json!(["a"]));
    ack(&app, &s1, json!("b")).await;

    let done = ends(&app, &id, "failed").await;
    assert_eq!(done["jobs_completed"], 1);
    assert_eq!(done["jobs_failed"], 1);
    assert_eq!(done["steps"][0]["state"], "failed");
    assert_eq!(done["steps"][1]["state"], "completed");
    assert_eq!(done["error"]["failed_step_index"], 0);
}

#[tokio::test]
async fn cancel_withdraws_what_has_not_started_and_lets_a_running_step_finish() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let w = create(
        &app,
        json!({"type": "chain", "steps": [job("a", "x"), job("b", "x"), job("c", "x")]}),
    )
    .await;
    let id = w["id"].as_str().unwrap().to_owned();
    let running = next(&app, "x").await;

    let r = app.delete(&format!("/ojs/v1/workflows/{id}")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["workflow"]["state"], "cancelled");
    assert_eq!(r.body["workflow"]["steps_cancelled"], 2);
    app.delete(&format!("/ojs/v1/workflows/{id}"))
        .await
        .assert_error(409, "conflict");

    ack(&app, &running, json!("done anyway")).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    none_in(&app, "x").await;
    let w = eventually(
        Duration::from_secs(5),
        "the finished step recorded",
        || async {
            let w = workflow(&app, &id).await;
            (w["steps"][0]["state"] == "completed").then_some(w)
        },
    )
    .await;
    assert_eq!(w["state"], "cancelled");
    assert_eq!(w["steps"][1]["state"], "cancelled");
    assert_eq!(
        app.job(w["steps"][2]["job_id"].as_str().unwrap()).await["state"],
        "cancelled"
    );
}

#[tokio::test]
async fn bad_workflows_and_unknown_ids_get_the_spec_errors() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let r = app
        .post(
            "/ojs/v1/workflows",
            json!({"type": "batch", "jobs": [job("a", "q")]}),
        )
        .await;
    r.assert_error(400, "invalid_request");
    assert_eq!(
        r.body["error"]["details"]["validation_errors"][0]["path"],
        "$.callbacks"
    );
    let r = app
        .post(
            "/ojs/v1/workflows",
            json!({"type": "chain", "steps": [{"type": "a"}]}),
        )
        .await;
    r.assert_error(400, "invalid_request");
    assert!(
        r.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("$.steps[0]"),
        "{}",
        r.body
    );
    let unknown = "01967a3e-0000-7000-8000-000000000001";
    app.get(&format!("/ojs/v1/workflows/{unknown}"))
        .await
        .assert_error(404, "not_found");
    app.get("/ojs/v1/workflows/not-an-id")
        .await
        .assert_error(404, "not_found");
    app.delete(&format!("/ojs/v1/workflows/{unknown}"))
        .await
        .assert_error(404, "not_found");

    // A workflow starts its own jobs: a client cannot activate a waiting step.
    let w = create(
        &app,
        json!({"type": "chain", "steps": [job("a", "q"), job("b", "q")]}),
    )
    .await;
    let waiting = w["steps"][1]["job_id"].as_str().unwrap();
    assert_eq!(app.job(waiting).await["state"], "pending");
    app.post(&format!("/ojs/v1/jobs/{waiting}/activate"), json!({}))
        .await
        .assert_error(409, "conflict");
    // The step-graph form of the Python client, read as a chain; the answer carries the
    // workflow at the top level too, steps with both index and id.
    let r = app
        .post(
            "/ojs/v1/workflows",
            json!({"name": "py", "steps": [
                {"id": "step-0", "type": "a", "args": [], "depends_on": []},
                {"id": "step-1", "type": "b", "args": [], "depends_on": ["step-0"]}]}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["type"], "chain");
    assert_eq!(r.body["name"], "py");
    assert_eq!(r.body["steps"][1]["id"], "step-1");
    assert_eq!(r.body["steps"][1]["index"], 1);
}

#[tokio::test]
async fn a_group_of_ten_thousand_ends_with_exact_counters() {
    const JOBS: usize = 10_000;
    let nats = NatsServer::start();
    let apps = [spawn_app(&nats.url).await, spawn_app(&nats.url).await];
    let jobs: Vec<Value> = (0..JOBS)
        .map(|i| {
            let retry = if i % 1000 == 0 { 1 } else { 3 };
            json!({"type": "g", "args": [i], "options": {"queue": "big", "retry": {"max_attempts": retry}}})
        })
        .collect();
    let w = create(&apps[0], json!({"type": "group", "jobs": jobs})).await;
    let id = w["id"].as_str().unwrap().to_owned();
    // Every thousandth job fails for good; the rest complete.
    work_off(&apps, "big", |j| j["args"][0].as_u64().unwrap() % 1000 == 0).await;
    let done = ends(&apps[1], &id, "failed").await;
    assert_eq!(done["jobs_total"], JOBS);
    assert_eq!(done["jobs_completed"], JOBS - 10);
    assert_eq!(done["jobs_failed"], 10);
}

#[tokio::test]
async fn a_chain_of_a_thousand_steps_runs_them_in_order() {
    const STEPS: usize = 1_000;
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let steps: Vec<Value> = (0..STEPS)
        .map(|i| json!({"type": "step", "args": [i], "options": {"queue": "long"}}))
        .collect();
    let w = create(&app, json!({"type": "chain", "steps": steps})).await;
    let id = w["id"].as_str().unwrap().to_owned();
    for i in 0..STEPS {
        let step = next(&app, "long").await;
        assert_eq!(step["args"][0], i);
        assert_eq!(step["parent_results"].as_array().map_or(0, Vec::len), i);
        ack(&app, &step, json!(null)).await;
    }
    let done = ends(&app, &id, "completed").await;
    assert_eq!(done["steps_completed"], STEPS);
    none_in(&app, "long").await;
}

#[tokio::test]
async fn a_group_inside_a_chain_gets_the_results_before_it_and_passes_its_own_on() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let w = create(
        &app,
        json!({"type": "chain", "steps": [
            job("extract", "n"),
            {"type": "group", "jobs": [
                {"type": "part", "args": ["csv"], "options": {"queue": "n"}},
                {"type": "part", "args": ["pdf"], "options": {"queue": "n"}}]},
            job("load", "n")]}),
    )
    .await;
    let id = w["id"].as_str().unwrap().to_owned();
    let first = next(&app, "n").await;
    ack(&app, &first, json!("raw")).await;
    let mut parts = Vec::new();
    for _ in 0..2 {
        let part = next(&app, "n").await;
        assert_eq!(part["type"], "part");
        assert_eq!(part["parent_results"], json!(["raw"]));
        parts.push(part);
    }
    for part in &parts {
        ack(
            &app,
            part,
            json!(format!("{}-done", part["args"][0].as_str().unwrap())),
        )
        .await;
    }
    let last = next(&app, "n").await;
    assert_eq!(last["type"], "load");
    assert_eq!(
        last["parent_results"],
        json!(["raw", ["csv-done", "pdf-done"]])
    );
    ack(&app, &last, json!(null)).await;
    ends(&app, &id, "completed").await;
}

#[tokio::test]
async fn a_workflow_with_a_job_push_would_refuse_writes_nothing() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let huge = "x".repeat(2 * 1024 * 1024);
    let r = app
        .post(
            "/ojs/v1/workflows",
            json!({"type": "group", "jobs": [job("fine", "q"),
                {"type": "huge", "args": [huge], "options": {"queue": "q"}}]}),
        )
        .await;
    r.assert_error(413, "envelope_too_large");
    let js = async_nats::jetstream::new(async_nats::connect(&nats.url).await.unwrap());
    let mut workflows = js.get_stream("KV_ojs-workflows").await.unwrap();
    assert_eq!(workflows.info().await.unwrap().state.messages, 0);
    none_in(&app, "q").await;
}

/// The workflow list (the admin UI's page, the `ojs` command line's `workflow list`): the
/// workflows changed last first, by state, a page at a time, nested ones inside their
/// parent only; cancel also by `POST …/cancel`.
#[tokio::test]
async fn workflows_are_listed_most_recently_changed_first_by_state() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let chain = |name: &str| {
        json!({"type": "chain", "name": name, "steps": [
            {"type": "wl.a", "args": [], "options": {"queue": "wl"}},
            {"type": "wl.b", "args": [], "options": {"queue": "wl"}}]})
    };
    let first = create(&app, chain("first")).await;
    let second = create(&app, chain("second")).await;
    let nested = create(
        &app,
        json!({"type": "group", "name": "outer", "jobs": [
            {"type": "wl.c", "args": [], "options": {"queue": "wl-other"}},
            {"type": "chain", "name": "inner", "steps": [{"type": "wl.d", "args": [], "options": {"queue": "wl-other"}}]}]}),
    )
    .await;
    let r = app
        .post(
            &format!("/ojs/v1/workflows/{}/cancel", first["id"].as_str().unwrap()),
            json!({}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["state"], "cancelled");

    let names = |body: &Value| -> Vec<String> {
        body["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let r = app.get("/ojs/v1/workflows").await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(names(&r.body), ["first", "outer", "second"], "{}", r.body);
    assert_eq!(r.body["workflows"], r.body["items"]);
    assert_eq!(r.body["total"], 3);
    let item = &r.body["items"][2];
    assert_eq!(
        (
            &item["id"],
            &item["state"],
            &item["step_count"],
            &item["steps_total"],
            &item["steps_completed"]
        ),
        (
            &second["id"],
            &json!("running"),
            &json!(2),
            &json!(2),
            &json!(0)
        )
    );
    assert!(
        item.get("steps").is_none(),
        "a listed workflow is a summary"
    );
    assert!(item["created_at"].is_string());
    let r = app.get("/ojs/v1/workflows?state=cancelled").await;
    assert_eq!(names(&r.body), ["first"]);
    let r = app
        .get("/ojs/v1/workflows?state=active&page=2&per_page=1")
        .await;
    assert_eq!(names(&r.body), ["second"], "{}", r.body);
    assert_eq!(
        (
            &r.body["pagination"]["page"],
            &r.body["pagination"]["total"]
        ),
        (&json!(2), &json!(2))
    );
    let r = app.get("/ojs/v1/workflows?limit=1").await;
    assert_eq!(names(&r.body), ["first"]);
    // The admin UI's progress of a workflow: its first step run, the second waiting.
    let job = next(&app, "wl").await;
    ack(&app, &job, json!(null)).await;
    let id = second["id"].as_str().unwrap();
    eventually(Duration::from_secs(5), "half of the chain done", || async {
        let r = app.get(&format!("/ojs/v1/workflows/{id}/progress")).await;
        assert_eq!(r.status, 200, "{}", r.body);
        (r.body["progress"] == 0.5).then_some(r.body)
    })
    .await;
    let r = app.get(&format!("/ojs/v1/workflows/{id}/progress")).await;
    assert_eq!(r.body["workflow_id"], id);
    assert_eq!(
        (
            &r.body["steps"][0]["progress"],
            &r.body["steps"][1]["progress"]
        ),
        (&json!(1.0), &json!(0.0))
    );
    assert!(r.body["updated_at"].is_string());
    assert_eq!(nested["name"], "outer");
    app.get("/ojs/v1/workflows?state=sleeping")
        .await
        .assert_error(400, "invalid_request");
    app.stop().await;
}
