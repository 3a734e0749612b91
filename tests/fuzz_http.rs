//! An HTTP fuzzer: random and boundary-valued requests against a running gateway on a real
//! nats-server — every route, garbage paths and bodies, values at every documented limit —
//! then proof that the cluster is still live: no answer was a 5xx or a dropped connection,
//! a job scheduled 1 s ahead reaches a waiting worker within 100 ms of its time, events still
//! flow, and the streams stay within `max_queues`.
//!
//! `OJS_FUZZ_REQUESTS` sets the number of requests (default 2,000; the soak run uses
//! 100,000), `OJS_FUZZ_SEED` the seed (default 1, so CI is repeatable; printed, so any
//! failure can be replayed).

use crate::common;

use std::time::{Duration, Instant};

use common::{spawn_app_with, test_config, NatsServer, TestApp};
use futures::StreamExt;
use ojs_jetstream::config::Config;
use ojs_jetstream::domain::envelope;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use reqwest::Method;
use serde_json::{json, Value};

const MAX_QUEUES: usize = 40;

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Strings that have broken servers: empty, huge, control characters, NATS subject
/// wildcards, path tricks, non-ASCII.
fn nasty_string(rng: &mut StdRng) -> String {
    let choices = [
        String::new(),
        " ".into(),
        "a.*".into(),
        "a.>".into(),
        "..".into(),
        "q.".into(),
        "\u{0}".into(),
        "a\nb".into(),
        "é€😀".into(),
        "%FF".into(),
        "default".into(),
        "x".repeat(rng.random_range(100..5000)),
        "01945c3a-0000-7000-8000-000000000000".into(),
        "01945C3A-0000-7000-8000-000000000000".into(),
        "+P100000000D".into(),
        "+PT0.2S".into(),
        "P20000000D".into(),
        "9999-12-31T23:59:59.999Z".into(),
        "@every 87600000h".into(),
        "* * * * *".into(),
    ];
    choices.choose(rng).unwrap().clone()
}

fn nasty_number(rng: &mut StdRng) -> Value {
    let choices = [
        json!(0),
        json!(-1),
        json!(1),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(31_536_000_000u64),
        json!(31_536_000_001u64),
        json!(1e308),
        json!(0.5),
        json!(101),
        json!(-100),
        json!(1000),
        json!(1001),
    ];
    choices.choose(rng).unwrap().clone()
}

fn nested(depth: usize) -> Value {
    let mut v = json!(1);
    for _ in 0..depth {
        v = json!([v]);
    }
    v
}

fn any_value(rng: &mut StdRng, depth: u32) -> Value {
    match rng.random_range(0..10) {
        0 => Value::Null,
        1 => json!(rng.random_bool(0.5)),
        2 | 3 => nasty_number(rng),
        4 | 5 => json!(nasty_string(rng)),
        6 => nested(rng.random_range(60..130)),
        7 if depth < 3 => Value::Array(
            (0..rng.random_range(0..4))
                .map(|_| any_value(rng, depth + 1))
                .collect(),
        ),
        8 if depth < 3 => object(rng, depth + 1),
        _ => json!("v"),
    }
}

/// Every option key, and the fields of the worker, cron and batch requests.
fn field(rng: &mut StdRng) -> &'static str {
    const OTHERS: &[&str] = &[
        "type",
        "args",
        "id",
        "meta",
        "options",
        "queues",
        "count",
        "wait_ms",
        "worker_id",
        "job_id",
        "result",
        "error",
        "requeue",
        "active_jobs",
        "active_job_ids",
        "state",
        "name",
        "expression",
        "timezone",
        "job_template",
        "overlap_policy",
        "jobs",
        "initial_interval",
        "max_interval",
        "max_attempts",
        "on_exhaustion",
        "backtrace",
    ];
    let known = envelope::OPTION_KEYS.len();
    let n = rng.random_range(0..known + OTHERS.len());
    envelope::OPTION_KEYS
        .get(n)
        .unwrap_or_else(|| &OTHERS[n - known])
}

fn object(rng: &mut StdRng, depth: u32) -> Value {
    let mut m = serde_json::Map::new();
    for _ in 0..rng.random_range(0..6) {
        m.insert(field(rng).to_owned(), any_value(rng, depth));
    }
    Value::Object(m)
}

/// A request that mostly passes validation, with one field made hostile.
fn job(rng: &mut StdRng, ids: &[String]) -> Value {
    let mut j = json!({"type": "fuzz.job", "args": [rng.random_range(0..9)],
        "options": {"queue": format!("fz{}", rng.random_range(0..60))}});
    if rng.random_bool(0.7) {
        let field = field(rng);
        let v = any_value(rng, 0);
        if rng.random_bool(0.5) {
            j["options"][field] = v;
        } else {
            j[field] = v;
        }
    }
    if rng.random_bool(0.1) {
        j["id"] = json!(ids.choose(rng).cloned().unwrap_or_default());
    }
    j
}

fn segment(rng: &mut StdRng, ids: &[String]) -> String {
    match rng.random_range(0..4) {
        0 => ids.choose(rng).cloned().unwrap_or_default(),
        1 => "%FF%FE%00".into(),
        2 => format!("{}%2F..%2F{}", nasty_string(rng).len(), rng.random::<u32>()),
        _ => nasty_string(rng)
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_string()
                } else {
                    format!("%{:02X}", c as u32 & 0xff)
                }
            })
            .collect(),
    }
}

/// One random request: method, path and body bytes.
fn request(rng: &mut StdRng, ids: &[String]) -> (Method, String, Vec<u8>) {
    let id = segment(rng, ids);
    let known_id = ids.choose(rng).cloned().unwrap_or_default();
    let (method, path, body) = match rng.random_range(0..18) {
        0 | 1 => (Method::POST, "/ojs/v1/jobs".to_owned(), job(rng, ids)),
        2 => (
            Method::POST,
            "/ojs/v1/jobs/batch".into(),
            json!({"jobs": (0..rng.random_range(0..5)).map(|_| job(rng, ids)).collect::<Vec<_>>()}),
        ),
        3 => (Method::GET, format!("/ojs/v1/jobs/{id}"), Value::Null),
        4 => (Method::DELETE, format!("/ojs/v1/jobs/{id}"), Value::Null),
        5 => (
            Method::POST,
            format!("/ojs/v1/jobs/{id}/activate"),
            json!({}),
        ),
        6 | 7 => {
            let mut b = object(rng, 0);
            b["queues"] = json!([format!("fz{}", rng.random_range(0..60))]);
            // Long polls would only slow the battery down.
            if b.get("wait_ms")
                .and_then(Value::as_u64)
                .is_some_and(|w| w > 20)
            {
                b["wait_ms"] = json!(20);
            }
            (Method::POST, "/ojs/v1/workers/fetch".into(), b)
        }
        8 | 9 => {
            let mut b = object(rng, 0);
            b["job_id"] = json!(known_id);
            let path = *[
                "/ojs/v1/workers/ack",
                "/ojs/v1/workers/fail",
                "/ojs/v1/workers/nack",
            ]
            .choose(rng)
            .unwrap();
            (Method::POST, path.into(), b)
        }
        10 => (
            Method::POST,
            "/ojs/v1/workers/heartbeat".into(),
            object(rng, 0),
        ),
        11 => (
            Method::GET,
            format!(
                "/ojs/v1/dead-letter?limit={}&offset={}&queue={}",
                nasty_number(rng),
                nasty_number(rng),
                segment(rng, ids)
            ),
            Value::Null,
        ),
        12 => {
            let path = *["", "/retry"].choose(rng).unwrap();
            let method = [Method::GET, Method::POST, Method::DELETE]
                .choose(rng)
                .unwrap()
                .clone();
            (method, format!("/ojs/v1/dead-letter/{id}{path}"), json!({}))
        }
        13 => {
            let path = *["", "/quiet", "/terminate"].choose(rng).unwrap();
            (
                Method::POST,
                format!("/ojs/v1/admin/workers/{id}{path}"),
                json!({}),
            )
        }
        14 => (
            Method::GET,
            format!(
                "/ojs/v1/events?types={}&after={}&limit={}",
                segment(rng, ids),
                nasty_number(rng),
                nasty_number(rng)
            ),
            Value::Null,
        ),
        15 => {
            let mut b = object(rng, 0);
            b["name"] = json!(nasty_string(rng));
            b["expression"] = json!(nasty_string(rng));
            (Method::POST, "/ojs/v1/cron".into(), b)
        }
        16 => (Method::GET, format!("/ojs/v1/cron/{id}"), Value::Null),
        _ => {
            let method = [
                Method::PUT,
                Method::PATCH,
                Method::GET,
                Method::from_bytes(b"FUZZ").unwrap(),
            ]
            .choose(rng)
            .unwrap()
            .clone();
            (
                method,
                format!("/ojs/v1/{}", segment(rng, ids)),
                any_value(rng, 0),
            )
        }
    };
    let bytes = match rng.random_range(0..20) {
        0 => b"{ not json".to_vec(),
        1 => (0..rng.random_range(0..64))
            .map(|_| rng.random::<u8>())
            .collect(),
        _ if body.is_null() => Vec::new(),
        _ => body.to_string().into_bytes(),
    };
    (method, path, bytes)
}

/// Sends the battery; each answer must be below 500 and, if an error, an OJS error body.
async fn battery(app: &TestApp, requests: u64, seed: u64) -> Vec<String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut ids: Vec<String> = Vec::new();
    let mut statuses = std::collections::BTreeMap::<u16, u64>::new();
    for n in 0..requests {
        let (method, path, body) = request(&mut rng, &ids);
        let resp = app
            .http
            .request(method.clone(), app.url(&path))
            .header("content-type", "application/openjobspec+json")
            .body(body.clone())
            .timeout(Duration::from_secs(15))
            .send()
            .await
            .unwrap_or_else(|e| {
                panic!("request {n} {method} {path}: no answer: {e} (seed {seed})")
            });
        let status = resp.status().as_u16();
        *statuses.entry(status).or_default() += 1;
        let content_type = resp
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap_or("").to_owned());
        let text = resp.bytes().await.expect("a whole body");
        let sent = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
        assert!(
            status < 500,
            "request {n} {method} {path} {sent} → {status} {} (seed {seed})",
            String::from_utf8_lossy(&text)
        );
        if status >= 400 {
            assert_eq!(
                content_type.as_deref(),
                Some("application/openjobspec+json"),
                "request {n} {method} {path} (seed {seed})"
            );
            let v: Value = serde_json::from_slice(&text).expect("an error body is JSON");
            assert!(
                v["error"]["code"].is_string(),
                "request {n} {method} {path}: {v} (seed {seed})"
            );
        } else if let Ok(v) = serde_json::from_slice::<Value>(&text) {
            for id in [&v["job"]["id"], &v["id"]] {
                if let Some(id) = id.as_str() {
                    ids.push(id.to_owned());
                }
            }
        }
    }
    eprintln!("fuzz: {requests} requests, seed {seed}, statuses {statuses:?}");
    ids
}

#[tokio::test]
async fn the_gateway_stays_live_after_a_battery_of_hostile_requests() {
    let nats = NatsServer::start();
    let app = spawn_app_with(Config {
        max_queues: MAX_QUEUES,
        ..test_config(&nats.url)
    })
    .await;
    // The queue the liveness check uses exists before the battery can fill the queue cap.
    let first = app.enqueue(common::job_on("live")).await;
    assert_eq!(
        common::job_ids(&json!(app.fetch(&["live"], "live").await)),
        [first.as_str()]
    );
    let requests = env_number("OJS_FUZZ_REQUESTS", 2000);
    let seed = env_number("OJS_FUZZ_SEED", 1);
    battery(&app, requests, seed).await;

    // Still healthy, and the leader still fires a timer on time for a waiting worker.
    assert_eq!(app.get("/ojs/v1/health").await.status, 200);
    let due_in = Duration::from_secs(1);
    let scheduled = Instant::now();
    let id = app
        .enqueue(json!({"type": "live.check", "args": [], "options": {"queue": "live", "scheduled_at": "+PT1S"}}))
        .await;
    let r = app
        .post(
            "/ojs/v1/workers/fetch",
            json!({"queues": ["live"], "worker_id": "live", "wait_ms": 5000}),
        )
        .await;
    assert_eq!(
        common::job_ids(&r.body["jobs"]),
        [id.as_str()],
        "{}",
        r.body
    );
    let late = scheduled.elapsed().saturating_sub(due_in);
    assert!(
        late < Duration::from_millis(100),
        "available {late:?} after its time"
    );

    // Events still flow: its completion is published.
    let r = app.ack(json!({"job_id": id, "result": 1})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    common::eventually(
        Duration::from_secs(5),
        "the job.completed event",
        || async {
            let events = app
                .get("/ojs/v1/events?types=job.completed&limit=1000")
                .await
                .body;
            events["events"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["subject"] == id.as_str())
                .then_some(())
        },
    )
    .await;

    // Streams: the queues within the cap, plus the gateway's own four.
    let js = async_nats::jetstream::new(async_nats::connect(&nats.url).await.unwrap());
    let names: Vec<String> = js.stream_names().map(|n| n.unwrap()).collect().await;
    let queues = names.iter().filter(|n| n.starts_with("ojs-q-")).count();
    assert!(queues <= MAX_QUEUES, "{queues} queue streams: {names:?}");
}
