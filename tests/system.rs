//! Health, manifest, metrics, the admin reset, and jobs surviving restarts.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{
    dead_letter_a_job, eventually, job_on, spawn_app, spawn_app_with, test_config, GatewayProcess,
    NatsServer,
};
use ojs_jetstream::config::Config;
use serde_json::{json, Value};

#[tokio::test]
async fn health_reports_nats_and_degrades_when_it_is_gone() {
    let mut nats = NatsServer::start();
    // A request waits NATS out this long before it answers 503.
    let app = spawn_app_with(Config {
        request_deadline_ms: 1_000,
        ..test_config(&nats.url)
    })
    .await;
    let r = app.get("/ojs/v1/health").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["status"], "ok");
    assert_eq!(r.body["backend"]["status"], "connected");
    assert_eq!(
        r.body["queues"],
        json!({"total": 0, "active": 0, "paused": 0})
    );
    app.enqueue(job_on("h1")).await;
    app.enqueue(job_on("h2")).await;
    app.post("/ojs/v1/queues/h2/pause", json!({})).await;
    let r = app.get("/ojs/v1/health").await;
    assert_eq!(
        r.body["queues"],
        json!({"total": 2, "active": 1, "paused": 1}),
        "observability spec §10.1"
    );
    for probe in ["/ojs/v1/health/ready", "/readyz"] {
        let r = app.get(probe).await;
        assert_eq!(
            (r.status.as_u16(), r.body["status"].as_str()),
            (200, Some("ready"))
        );
    }
    nats.kill();
    eventually(Duration::from_secs(10), "a degraded health", || async {
        let r = app.get("/ojs/v1/health").await;
        (r.status == 503 && r.body["status"] == "degraded").then_some(())
    })
    .await;
    // Not ready for traffic, but alive: restarting the gateway would not bring NATS back.
    for probe in ["/ojs/v1/health/ready", "/readyz"] {
        let r = app.get(probe).await;
        assert_eq!(r.status, 503, "{probe}");
        assert_eq!(r.body["reason"], "nats");
    }
    for probe in ["/ojs/v1/health/live", "/healthz"] {
        assert_eq!(app.get(probe).await.status, 200, "{probe}");
    }
    // Operations fail with a backend error saying when to retry, not a hang or a panic,
    // once the request's deadline has passed.
    let started = std::time::Instant::now();
    let r = app.post("/ojs/v1/jobs", job_on("down")).await;
    assert!(
        started.elapsed() < Duration::from_millis(1_500),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(r.header("retry-after"), "1");
    assert_eq!(r.body["error"]["code"], "backend_error");
    assert_eq!(r.body["error"]["retryable"], true);
    // The body says what failed; NATS's own error text stays in the gateway's log.
    let message = r.body["error"]["message"].as_str().unwrap();
    assert!(
        (message.starts_with("NATS failed while")
            || message.starts_with("NATS did not answer in time while"))
            && !message.contains(": "),
        "{message}"
    );
    nats.restart();
    eventually(Duration::from_secs(15), "recovery", || async {
        (app.get("/ojs/v1/health").await.status == 200).then_some(())
    })
    .await;
    assert_eq!(app.get("/ojs/v1/health/ready").await.status, 200);
}

#[tokio::test]
async fn manifest_claims_level_four_and_metrics_count_requests() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let r = app.get("/ojs/manifest").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["conformance_level"], 4);
    assert_eq!(r.body["unique_job_strength"], "strong");
    assert_eq!(r.body["queue_strategies"], json!(["strict", "weighted"]));
    for capability in [
        "workflows",
        "unique_jobs",
        "rate_limiting",
        "pause_resume",
        "backpressure",
    ] {
        assert_eq!(r.body["capabilities"][capability], true, "{capability}");
    }
    assert_eq!(r.body["capabilities"]["cron_jobs"], true);
    // The admin UI shows its cron pages only for `cron`.
    assert_eq!(r.body["capabilities"]["cron"], true);
    assert_eq!(r.body["capabilities"]["dead_letter"], true);
    assert_eq!(r.body["capabilities"]["batch_enqueue"], true);
    app.get("/ojs/v1/health").await;
    let text = app.metrics().await;
    assert!(
        text.contains(
            r#"ojs_http_requests_total{method="GET",route="/ojs/v1/health",status="200"}"#
        ),
        "{text}"
    );
}

#[tokio::test]
async fn reset_exists_only_when_enabled_and_wipes_everything() {
    let nats = NatsServer::start();
    let off = spawn_app_with(Config {
        allow_reset: false,
        ..test_config(&nats.url)
    })
    .await;
    off.post("/ojs/v1/admin/reset", json!({}))
        .await
        .assert_error(404, "not_found");

    let app = spawn_app(&nats.url).await;
    let id = app.enqueue(job_on("wipe")).await;
    let r = app.post("/ojs/v1/admin/reset", json!({})).await;
    assert_eq!(r.status, 200);
    app.get(&format!("/ojs/v1/jobs/{id}"))
        .await
        .assert_error(404, "not_found");
    assert!(app.fetch(&["wipe"], "w").await.is_empty());
    let after = app.enqueue(job_on("wipe")).await;
    assert_eq!(app.fetch(&["wipe"], "w").await[0]["id"], after.as_str());
}

#[tokio::test]
async fn jobs_survive_gateway_and_nats_restarts() {
    let mut nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let id = app.enqueue(job_on("durable")).await;
    app.stop().await;
    nats.restart();
    let app = spawn_app_with(test_config(&nats.url)).await;
    assert_eq!(app.job(&id).await["state"], "available");
    assert_eq!(app.fetch(&["durable"], "w").await[0]["id"], id.as_str());
}

#[tokio::test]
async fn the_openapi_document_lists_exactly_the_routes_the_router_serves() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let doc = app.get("/ojs/v1/openapi.json").await.body;
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"));
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.len() > 40, "{}", paths.len());
    let mut ids = std::collections::HashSet::new();
    let mut tried = 0;
    for (path, ops) in paths {
        let concrete = path
            .replace("{id}", "019539a4-b68c-7def-8000-1a2b3c4d5e6f")
            .replace("{name}", "some-queue");
        for method in ["get", "post", "put", "delete", "patch"] {
            let documented = ops.get(method);
            if let Some(op) = documented {
                assert!(ids.insert(op["operationId"].to_string()), "{op}");
                assert!(op["summary"].as_str().is_some_and(|s| !s.is_empty()));
            }
            let mut req = app
                .http
                .request(method.to_uppercase().parse().unwrap(), app.url(&concrete));
            if method == "post" || method == "put" {
                req = req.header("content-type", "application/json").body("{}");
            }
            // Headers are enough: a live event stream is answered 200 and then dropped.
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            let body: serde_json::Value = if resp.headers()["content-type"] == "text/event-stream" {
                serde_json::Value::Null
            } else {
                resp.json().await.unwrap_or_default()
            };
            let no_route = status == 404 && body["error"]["details"]["resource_type"] == "route";
            if documented.is_some() {
                assert!(
                    status != 405 && !no_route,
                    "{method} {path}: {status} {body}"
                );
                tried += 1;
            } else {
                assert_eq!(
                    status, 405,
                    "{method} {path} is served but not documented: {body}"
                );
            }
        }
    }
    assert_eq!(tried, ids.len());
    // Nothing else is served.
    let r = app.get("/ojs/v1/not-a-route").await;
    assert_eq!(r.body["error"]["details"]["resource_type"], "route");
    // Who may call what comes from the API key rules.
    assert_eq!(
        paths["/ojs/v1/queues/{name}/pause"]["post"]["x-ojs-admin"],
        true
    );
    assert_eq!(
        paths["/ojs/v1/jobs"]["post"]["security"],
        json!([{"apiKey": []}])
    );
    assert_eq!(
        paths["/ojs/v1/jobs/{id}"]["get"]["parameters"][0]["name"],
        "id"
    );
}

#[tokio::test]
async fn json_logs_are_ojs_logging_records_and_the_leader_logs_each_transition() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("gateway.log");
    let env = [
        ("OJS_LOG_FORMAT", "json"),
        ("OJS_LOG_JOB_TRANSITIONS", "true"),
        ("RUST_LOG", "info"),
    ];
    let gw = GatewayProcess::start_logging_to(&nats.url, &env, Some(&log)).await;
    let app = gw.client();
    let done = app.enqueue(job_on("logged")).await;
    app.fetch(&["logged"], "w1").await;
    app.ack(json!({"job_id": done})).await;
    let gone = dead_letter_a_job(&app, "logged").await;
    let records = eventually(
        Duration::from_secs(10),
        "the transitions in the log",
        || async {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let records: Vec<serde_json::Value> = text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
                .collect();
            let has = |message: &str, id: &str| {
                records
                    .iter()
                    .any(|r| r["message"] == message && r["ojs"]["job_id"] == id)
            };
            (has("Job completed successfully", &done)
                && has("Job discarded after 1 attempts", &gone))
            .then_some(records)
        },
    )
    .await;
    for r in &records {
        for field in ["timestamp", "severity", "message", "component"] {
            assert!(r[field].is_string(), "{field} in {r}");
        }
        assert!(r["severity_number"].is_u64(), "{r}");
    }
    let completed = records
        .iter()
        .find(|r| r["message"] == "Job completed successfully")
        .unwrap();
    assert_eq!(completed["severity"], "INFO");
    assert_eq!(completed["category"], "lifecycle");
    assert_eq!(completed["ojs"]["queue"], "logged");
    assert_eq!(completed["ojs"]["state"], "completed");
    let discarded = records
        .iter()
        .find(|r| {
            r["ojs"]["job_id"] == gone.as_str()
                && r["category"] == "lifecycle"
                && r["severity"] == "ERROR"
        })
        .unwrap();
    assert_eq!(discarded["severity_number"], 17);
    assert!(records
        .iter()
        .any(|r| r["message"] == "ojs-jetstream listening" && r["attributes"]["addr"].is_string()));

    // An unknown format stops the gateway at start, naming the setting.
    let mut bad = std::process::Command::new(env!("CARGO_BIN_EXE_ojs-jetstream"))
        .arg("serve")
        .env("OJS_CONFIG", "/nonexistent/ojs-jetstream.toml")
        .env("OJS_LOG_FORMAT", "xml")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = bad.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(bad.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.to_lowercase().contains("log_format"), "{err}");
}

/// An OpenTelemetry collector's OTLP/HTTP trace endpoint that keeps every span it is sent.
async fn collector() -> (String, Arc<Mutex<Vec<Value>>>) {
    let spans: Arc<Mutex<Vec<Value>>> = Arc::default();
    let kept = spans.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
            let kept = kept.clone();
            async move {
                for resource in body["resourceSpans"].as_array().into_iter().flatten() {
                    assert_eq!(
                        resource["resource"]["attributes"][0],
                        json!({"key": "service.name", "value": {"stringValue": "ojs-jetstream"}})
                    );
                    for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
                        kept.lock()
                            .unwrap()
                            .extend(scope["spans"].as_array().into_iter().flatten().cloned());
                    }
                }
                axum::Json(json!({}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, spans)
}

fn attr<'v>(span: &'v Value, key: &str) -> &'v Value {
    span["attributes"]
        .as_array()
        .and_then(|a| a.iter().find(|kv| kv["key"] == key))
        .map_or(&Value::Null, |kv| &kv["value"])
}

#[tokio::test]
async fn the_leader_exports_a_span_per_job_transition_to_an_otlp_collector() {
    let nats = NatsServer::start();
    let (endpoint, spans) = collector().await;
    let app = spawn_app_with(Config {
        otlp_endpoint: endpoint,
        ..test_config(&nats.url)
    })
    .await;
    let traced = app
        .enqueue(
            json!({"type": "mail.send", "args": [], "options": {"queue": "traced"},
            "meta": {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}),
        )
        .await;
    let jobs = app.fetch(&["traced"], "w-1").await;
    assert_eq!(jobs.len(), 1);
    assert_eq!(
        app.ack(json!({"job_id": traced, "result": 1})).await.status,
        200
    );
    let untraced = app
        .enqueue(json!({"type": "mail.send", "args": [], "options": {"queue": "traced", "retry": {"max_attempts": 1}}}))
        .await;
    app.fetch(&["traced"], "w-1").await;
    let failed = app
        .nack(json!({"job_id": untraced, "error": {"type": "SmtpError", "message": "smtp down"}}))
        .await;
    assert_eq!(failed.status, 200);
    let of = |id: &str| -> Vec<Value> {
        let mut of_job: Vec<Value> = spans
            .lock()
            .unwrap()
            .iter()
            .filter(|s| attr(s, "ojs.job.id")["stringValue"] == id)
            .cloned()
            .collect();
        of_job.sort_by_key(|s| {
            s["startTimeUnixNano"]
                .as_str()
                .unwrap()
                .parse::<u128>()
                .unwrap()
        });
        of_job
    };
    eventually(
        Duration::from_secs(10),
        "the spans of both jobs",
        || async { (of(&traced).len() == 3 && of(&untraced).len() == 3).then_some(()) },
    )
    .await;
    let [enqueue, fetch, process] = <[Value; 3]>::try_from(of(&traced)).unwrap();
    let names = |s: &[&Value]| s.iter().map(|s| s["name"].clone()).collect::<Vec<_>>();
    assert_eq!(
        names(&[&enqueue, &fetch, &process]),
        ["ojs.enqueue", "ojs.fetch", "traced process"]
    );
    for span in [&enqueue, &fetch, &process] {
        assert_eq!(span["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(attr(span, "messaging.system")["stringValue"], "ojs");
        assert_eq!(attr(span, "ojs.job.type")["stringValue"], "mail.send");
        assert_eq!(attr(span, "ojs.job.queue")["stringValue"], "traced");
    }
    assert_eq!(
        enqueue["parentSpanId"], "00f067aa0ba902b7",
        "a child of the producer's span"
    );
    assert_eq!(
        (enqueue["kind"].as_i64(), fetch["kind"].as_i64()),
        (Some(2), Some(2))
    );
    assert_eq!(fetch["parentSpanId"], enqueue["spanId"]);
    assert_eq!(process["parentSpanId"], enqueue["spanId"]);
    assert_eq!(process["kind"], 5);
    assert_eq!(process["status"]["code"], 1);
    // The record no longer names the worker once the attempt ended: the fetch span does.
    assert_eq!(attr(&process, "ojs.worker.id"), &Value::Null);
    assert_eq!(attr(&fetch, "ojs.worker.id")["stringValue"], "w-1");
    assert_eq!(
        process["links"],
        json!([{"traceId": "4bf92f3577b34da6a3ce929d0e0e4736", "spanId": "00f067aa0ba902b7"}])
    );
    let [enqueue, _, process] = <[Value; 3]>::try_from(of(&untraced)).unwrap();
    assert_eq!(
        enqueue["traceId"],
        untraced.replace('-', ""),
        "a trace of its own"
    );
    assert_eq!(enqueue.get("parentSpanId"), None);
    assert_eq!(process["status"]["code"], 2);
    assert_eq!(attr(&process, "error.type")["stringValue"], "SmtpError");
    assert_eq!(attr(&process, "ojs.job.state")["stringValue"], "discarded");
    assert_eq!(process["events"][0]["name"], "exception");
    let ids: std::collections::HashSet<&str> = [&enqueue, &process]
        .iter()
        .map(|s| s["spanId"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 2);
}

#[tokio::test]
async fn spans_a_collector_does_not_take_are_dropped_and_counted() {
    let nats = NatsServer::start();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let app = spawn_app_with(Config {
        otlp_endpoint: endpoint,
        ..test_config(&nats.url)
    })
    .await;
    let id = app.enqueue(job_on("nowhere")).await;
    assert_eq!(app.job(&id).await["state"], "available", "jobs go on");
    eventually(
        Duration::from_secs(15),
        "the dropped span counted",
        || async {
            app.metrics()
                .await
                .lines()
                .any(|l| l == "ojs_trace_spans_dropped_total 1")
                .then_some(())
        },
    )
    .await;
}

/// Maintenance mode (admin spec §12.1): on every replica no FETCH gets a job, no scheduled
/// job is promoted and no cron tick fires, while enqueues go on; switched off, or its time
/// up, everything held back moves on.
#[tokio::test]
async fn maintenance_mode_holds_work_back_everywhere_and_lets_enqueues_in() {
    let nats = NatsServer::start();
    let a = spawn_app(&nats.url).await;
    let b = spawn_app(&nats.url).await;
    let waiting = a
        .enqueue(json!({"type": "m.t", "args": [], "options": {"queue": "maint"}}))
        .await;
    let r = a
        .post(
            "/ojs/v1/cron",
            json!({"name": "maint-tick", "expression": "@every 1s", "overlap_policy": "allow",
                "job_template": {"type": "m.tick", "args": [], "options": {"queue": "maint-cron"}}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let r = a
        .post(
            "/ojs/v1/admin/system/maintenance",
            json!({"enabled": true, "reason": "upgrade"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        (&r.body["enabled"], &r.body["maintenance"]),
        (&json!(true), &json!(true))
    );
    assert!(r.body["enabled_at"].is_string(), "{}", r.body);
    // The other replica's view, by the command line's path.
    eventually(
        Duration::from_secs(5),
        "the other replica in maintenance",
        || async {
            let r = b.get("/ojs/v1/admin/maintenance").await;
            (r.body["enabled"] == true && r.body["reason"] == "upgrade").then_some(())
        },
    )
    .await;
    let runs = || async {
        a.get("/ojs/v1/cron/maint-tick").await.body["run_count"]
            .as_u64()
            .unwrap()
    };
    let ticks = runs().await;
    let later = b
        .enqueue(json!({"type": "m.t", "args": [], "options": {"queue": "maint", "scheduled_at": "+PT1S"}}))
        .await;
    for app in [&a, &b] {
        let r = app
            .post(
                "/ojs/v1/workers/fetch",
                json!({"queues": ["maint", "maint-cron"], "worker_id": "w", "wait_ms": 300}),
            )
            .await;
        assert_eq!(r.body["jobs"], json!([]), "{}", r.body);
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(a.job(&later).await["state"], "scheduled", "no promotion");
    assert!(
        runs().await <= ticks + 1,
        "no tick (one may have been under way)"
    );

    let r = b
        .post(
            "/ojs/v1/admin/system/maintenance",
            json!({"enabled": false}),
        )
        .await;
    assert_eq!(r.body["enabled"], false, "{}", r.body);
    eventually(Duration::from_secs(5), "work handed out again", || async {
        let jobs = a.fetch(&["maint"], "w").await;
        jobs.iter()
            .any(|j| j["id"] == waiting.as_str())
            .then_some(())
    })
    .await;
    eventually(
        Duration::from_secs(5),
        "the scheduled job promoted",
        || async { (a.job(&later).await["state"] == "available").then_some(()) },
    )
    .await;
    eventually(Duration::from_secs(5), "ticks again", || async {
        (runs().await > ticks + 1).then_some(())
    })
    .await;

    // A maintenance with a duration ends by itself.
    let r = a
        .post(
            "/ojs/v1/admin/maintenance",
            json!({"enabled": true, "duration": "1s"}),
        )
        .await;
    assert!(r.body["ends_at"].is_string(), "{}", r.body);
    eventually(Duration::from_secs(5), "over by itself", || async {
        (a.get("/ojs/v1/admin/system/maintenance").await.body["enabled"] == false).then_some(())
    })
    .await;
    a.post("/ojs/v1/admin/maintenance", json!({"enabled": "yes"}))
        .await
        .assert_error(400, "invalid_request");
    a.stop().await;
    b.stop().await;
}
