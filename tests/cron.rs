//! Cron through the HTTP API and across replicas (cron spec §6–§8, HTTP binding §13).

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{eventually, spawn_app, spawn_app_with, test_config, GatewayProcess, NatsServer};
use ojs_jetstream::config::Config;
use serde_json::{json, Value};

fn entry(name: &str, expression: &str, queue: &str) -> Value {
    json!({"name": name, "expression": expression, "job_template": {"type": "cron.tick", "args": [name], "options": {"queue": queue}}})
}

#[tokio::test]
async fn entries_are_registered_listed_replaced_and_deleted() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let r = app
        .post("/ojs/v1/cron", entry("nightly", "@daily", "c"))
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let cron = &r.body["cron"];
    assert_eq!(
        (
            cron["expression"].as_str(),
            cron["enabled"].as_bool(),
            cron["overlap_policy"].as_str()
        ),
        (Some("@daily"), Some(true), Some("skip"))
    );
    assert!(cron["next_run_at"]
        .as_str()
        .unwrap()
        .ends_with("T00:00:00.000Z"));
    assert!(cron["created_at"].is_string());
    // The HTTP binding's own shape, as an update of the same name.
    let r = app
        .post("/ojs/v1/cron", json!({"name": "nightly", "cron": "0 9 * * 1-5", "timezone": "America/New_York", "type": "cron.tick", "args": []}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    // Its answer is the binding's `cron_job`, and the entry bare (`cron` the expression).
    assert_eq!(r.body["cron_job"]["created_at"], cron["created_at"]);
    assert_eq!(r.body["cron"], "0 9 * * 1-5");
    app.post("/ojs/v1/cron", entry("hourly", "0 * * * *", "c"))
        .await;
    let names: Vec<Value> = app.get("/ojs/v1/cron").await.body["crons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].clone())
        .collect();
    assert_eq!(names, [json!("hourly"), json!("nightly")]);
    assert_eq!(
        app.get("/ojs/v1/cron/nightly").await.body["cron"]["timezone"],
        "America/New_York"
    );
    let r = app.delete("/ojs/v1/cron/nightly").await;
    assert_eq!(
        (r.body["cron"]["name"].clone(), r.body["deleted"].clone()),
        (json!("nightly"), json!(true))
    );
    app.get("/ojs/v1/cron/nightly")
        .await
        .assert_error(404, "not_found");
    app.delete("/ojs/v1/cron/nightly")
        .await
        .assert_error(404, "not_found");
    assert_eq!(app.get("/ojs/v1/cron").await.body["count"], 1);
    for (bad, field) in [
        (entry("x", "not a valid cron", "c"), "expression"),
        (entry("x", "0 0 0 0 0 0 0", "c"), "expression"),
        (entry("x", "99 25 32 13 8", "c"), "expression"),
        (
            json!({"name": "x", "expression": "@daily", "timezone": "+05:00", "job_template": {"type": "a.b"}}),
            "timezone",
        ),
        (
            json!({"name": "x", "expression": "@daily", "job_template": {"args": []}}),
            "type",
        ),
    ] {
        let r = app.post("/ojs/v1/cron", bad).await;
        r.assert_error(400, "invalid_request");
        assert_eq!(r.body["error"]["details"]["field"], field);
    }
}

#[tokio::test]
async fn ticks_enqueue_jobs_and_overlap_is_skipped_while_one_is_unfinished() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    app.post("/ojs/v1/cron", entry("pulse", "@every 1s", "pulse"))
        .await;
    let job = eventually(Duration::from_secs(4), "a cron job", || async {
        app.fetch(&["pulse"], "w").await.into_iter().next()
    })
    .await;
    assert_eq!(job["type"], "cron.tick");
    assert_eq!(job["meta"]["cron_name"], "pulse");
    assert!(job["meta"]["cron_triggered_at"].is_string());
    // While that job is active, further ticks are skipped.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        app.fetch(&["pulse"], "w").await.is_empty(),
        "a tick ran while the previous job was active"
    );
    let skipped = app.get("/ojs/v1/events?types=cron.skipped").await;
    assert!(!skipped.body["events"].as_array().unwrap().is_empty());
    assert_eq!(
        skipped.body["events"][0]["data"]["existing_job_id"],
        job["id"]
    );
    // Once it finishes, the next tick runs.
    app.ack(json!({"job_id": job["id"]})).await;
    eventually(Duration::from_secs(3), "the next tick", || async {
        app.fetch(&["pulse"], "w").await.into_iter().next()
    })
    .await;
    // The tick creates its job first and moves the entry on after (architecture §3.9), and
    // every replica reads the entry from its watched copy: the count follows a moment later.
    eventually(Duration::from_secs(3), "the entry's second run", || async {
        let entry = app.get("/ojs/v1/cron/pulse").await.body["cron"].clone();
        (entry["run_count"] == 2).then_some(())
    })
    .await;
    let triggered = app.get("/ojs/v1/events?types=cron.triggered").await;
    assert_eq!(triggered.body["events"][0]["data"]["cron_name"], "pulse");
}

#[tokio::test]
async fn each_tick_fires_once_across_three_gateways_while_the_leader_dies() {
    let nats = NatsServer::start();
    let env = [("OJS_LEASE_TTL_MS", "3000")];
    let mut leader = GatewayProcess::start(&nats.url, &env).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut others = vec![
        GatewayProcess::start(&nats.url, &env).await,
        GatewayProcess::start(&nats.url, &env).await,
    ];
    let http = reqwest::Client::new();
    let post = |base: &str, path: &str, body: Value| {
        let req = http
            .post(format!("{base}{path}"))
            .header("content-type", "application/json")
            .body(body.to_string());
        async move { req.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let body = json!({"name": "every-second", "expression": "@every 1s", "overlap_policy": "allow",
        "job_template": {"type": "cron.tick", "args": [], "options": {"queue": "ticks"}}});
    post(&others[0].base, "/ojs/v1/cron", body).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    leader.kill();
    tokio::time::sleep(Duration::from_secs(10)).await;
    http.delete(format!("{}/ojs/v1/cron/every-second", others[1].base))
        .send()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut ticks = Vec::new();
    loop {
        let r = post(
            &others[1].base,
            "/ojs/v1/workers/fetch",
            json!({"queues": ["ticks"], "count": 1000}),
        )
        .await;
        let jobs = r["jobs"].as_array().unwrap().clone();
        if jobs.is_empty() {
            break;
        }
        ticks.extend(
            jobs.iter()
                .map(|j| j["meta"]["cron_triggered_at"].as_str().unwrap().to_string()),
        );
    }
    let distinct: BTreeSet<_> = ticks.iter().cloned().collect();
    assert_eq!(distinct.len(), ticks.len(), "a tick fired twice: {ticks:?}");
    let seconds: Vec<i64> = distinct
        .iter()
        .map(|t| {
            chrono::DateTime::parse_from_rfc3339(t)
                .unwrap()
                .timestamp_millis()
                / 1000
        })
        .collect();
    let missing: Vec<i64> = seconds
        .windows(2)
        .filter(|w| w[1] - w[0] != 1)
        .map(|w| w[0] + 1)
        .collect();
    println!("cron @every 1s over ~20 s with the leader killed at 10 s: {} ticks, {} duplicates, missing after {missing:?}", ticks.len(), ticks.len() - distinct.len());
    assert!(missing.is_empty(), "ticks were lost: {missing:?}");
    assert!(ticks.len() >= 18, "only {} ticks", ticks.len());
    for g in &mut others {
        g.kill();
    }
}

#[tokio::test]
async fn entries_are_held_to_the_job_size_limit_and_their_number_is_capped() {
    let nats = NatsServer::start();
    let app = spawn_app_with(Config {
        max_cron_entries: 2,
        ..test_config(&nats.url)
    })
    .await;
    // A template of 3 MB of args: every replica would keep it, and no tick's job fits.
    let big = json!({"name": "big", "expression": "@daily",
        "job_template": {"type": "cron.tick", "args": ["x".repeat(3 << 20)]}});
    let started = std::time::Instant::now();
    let r = app.post("/ojs/v1/cron", big).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    r.assert_error(413, "envelope_too_large");
    let details = &r.body["error"]["details"];
    assert!(
        details["actual_bytes"].as_u64().unwrap() > 3 << 20,
        "{}",
        r.body
    );
    // The same limit as PUSH's.
    let job = json!({"type": "cron.tick", "args": ["x".repeat(3 << 20)]});
    let push = app.post("/ojs/v1/jobs", job).await;
    push.assert_error(413, "envelope_too_large");
    assert_eq!(
        details["max_bytes"],
        push.body["error"]["details"]["max_bytes"]
    );
    assert_eq!(app.get("/ojs/v1/cron/big").await.status, 404);

    for name in ["one", "two"] {
        let r = app.post("/ojs/v1/cron", entry(name, "@daily", "c")).await;
        assert_eq!(r.status, 201, "{}", r.body);
    }
    let r = app
        .post("/ojs/v1/cron", entry("three", "@daily", "c"))
        .await;
    r.assert_error(400, "invalid_request");
    let details = &r.body["error"]["details"];
    assert_eq!((&details["count"], &details["max"]), (&json!(2), &json!(2)));
    assert_eq!(details["setting"], "max_cron_entries");
    // Replacing one is no new entry; deleting one makes room.
    let r = app.post("/ojs/v1/cron", entry("two", "@hourly", "c")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(app.delete("/ojs/v1/cron/one").await.status, 200);
    let r = app
        .post("/ojs/v1/cron", entry("three", "@daily", "c"))
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(app.get("/ojs/v1/cron").await.body["count"], 2);
}
