//! The admin API (`/ojs/v1/admin/…`) through HTTP on a real nats-server: listings of every
//! state a page at a time from the per-state sources (architecture §3.26), queue and worker
//! views, statistics, bulk operations by filter with confirmation, purges, and the
//! dashboard's files.

use crate::common;

use std::collections::HashSet;
use std::time::Duration;

use common::{
    dead_letter_a_job, eventually, spawn_app, spawn_app_with, test_config, NatsServer, TestApp,
};
use ojs_jetstream::config::KeyList;
use serde_json::{json, Value};

/// Keys are at least 32 characters.
const DATA_KEY: &str = "data-key-0123456789abcdef0123456789";
const ADMIN_KEY: &str = "admin-key-0123456789abcdef012345678";

fn typed(queue: &str, job_type: &str, options: Value) -> Value {
    let mut options = options;
    options["queue"] = json!(queue);
    json!({"type": job_type, "args": [], "options": options})
}

fn ids(page: &Value) -> Vec<String> {
    page["items"]
        .as_array()
        .unwrap_or_else(|| panic!("no items in {page}"))
        .iter()
        .map(|i| i["id"].as_str().unwrap().to_owned())
        .collect()
}

/// Every job a listing shows, page by page through `next_cursor`.
async fn all_pages(app: &TestApp, query: &str) -> Vec<String> {
    let mut seen = Vec::new();
    let mut cursor = String::new();
    loop {
        let r = app
            .get(&format!("/ojs/v1/admin/jobs?{query}&per_page=7{cursor}"))
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(r.body["items"].as_array().unwrap().len() <= 7);
        seen.extend(ids(&r.body));
        match r.body["pagination"]["next_cursor"].as_str() {
            Some(next) => cursor = format!("&cursor={next}"),
            None => return seen,
        }
    }
}

async fn listed(app: &TestApp, query: &str) -> Vec<String> {
    let r = app.get(&format!("/ojs/v1/admin/jobs?{query}")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    ids(&r.body)
}

#[tokio::test]
async fn jobs_of_every_state_are_listed_by_queue_and_type_a_page_at_a_time() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let mut waiting = Vec::new();
    for i in 0..30 {
        let t = if i % 3 == 0 { "adm.a" } else { "adm.b" };
        waiting.push(app.enqueue(typed("adm", t, json!({}))).await);
    }
    let other = app.enqueue(typed("adm-other", "adm.a", json!({}))).await;

    // Newest first by default, oldest first on request; every job once across pages.
    let desc = all_pages(&app, "queue=adm&state=available").await;
    let mut newest_first = waiting.clone();
    newest_first.reverse();
    assert_eq!(desc, newest_first);
    assert_eq!(
        all_pages(&app, "queue=adm&state=available&order=asc").await,
        waiting
    );
    // By page number, as the admin UI pages: the same jobs as the cursor's pages.
    for (n, expected) in [(1, &desc[..7]), (2, &desc[7..14]), (5, &desc[28..])] {
        let r = app
            .get(&format!(
                "/ojs/v1/admin/jobs?queue=adm&state=available&per_page=7&page={n}"
            ))
            .await;
        assert_eq!(ids(&r.body), expected, "page {n}");
        assert_eq!(r.body["pagination"]["page"], n);
        assert_eq!(r.body["pagination"]["total"], 30);
    }
    let r = app
        .get("/ojs/v1/admin/jobs?queue=adm&state=available&per_page=7&page=6")
        .await;
    assert!(ids(&r.body).is_empty(), "{}", r.body);
    let page = app
        .get("/ojs/v1/admin/jobs?queue=adm&state=available&per_page=5")
        .await;
    assert_eq!(page.body["pagination"]["total"], 30);
    assert_eq!(page.body["pagination"]["per_page"], 5);
    let item = &page.body["items"][0];
    assert_eq!(item["id"], waiting[29].as_str());
    assert_eq!(
        (item["queue"].as_str(), item["state"].as_str()),
        (Some("adm"), Some("available"))
    );
    assert!(
        item.get("args").is_none(),
        "a listed job is a summary: {item}"
    );
    // A type filter, and a state across queues.
    let a_type: Vec<String> = waiting.iter().step_by(3).rev().cloned().collect();
    assert_eq!(
        all_pages(&app, "queue=adm&state=available&type=adm.a").await,
        a_type
    );
    let everywhere = all_pages(&app, "state=available").await;
    assert_eq!(everywhere.len(), 31);
    assert!(everywhere.contains(&other));

    // Fetched jobs are active, no longer available; acknowledged ones completed (the
    // leader indexes them once it has handled their writes).
    let fetched: Vec<String> = app
        .fetch(&["adm"], "w1")
        .await
        .iter()
        .map(|j| j["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(fetched, vec![waiting[0].clone()]);
    assert_eq!(listed(&app, "queue=adm&state=active").await, fetched);
    assert!(!listed(&app, "queue=adm&state=available&per_page=100")
        .await
        .contains(&fetched[0]));
    let r = app
        .ack(json!({"job_id": fetched[0], "worker_id": "w1"}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    eventually(
        Duration::from_secs(5),
        "the completed job listed",
        || async { (listed(&app, "queue=adm&state=completed").await == fetched).then_some(()) },
    )
    .await;
    assert!(listed(&app, "queue=adm&state=active").await.is_empty());

    // Scheduled, cancelled, dead-lettered.
    let later = app
        .enqueue(typed("adm", "adm.a", json!({"scheduled_at": "+PT1H"})))
        .await;
    assert_eq!(
        listed(&app, "queue=adm&state=scheduled").await,
        vec![later.clone()]
    );
    let r = app.delete(&format!("/ojs/v1/jobs/{later}")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(listed(&app, "queue=adm&state=scheduled").await.is_empty());
    eventually(
        Duration::from_secs(5),
        "the cancelled job listed",
        || async {
            (listed(&app, "queue=adm&state=cancelled").await == vec![later.clone()]).then_some(())
        },
    )
    .await;
    let dead = dead_letter_a_job(&app, "adm-dlq").await;
    assert_eq!(listed(&app, "state=discarded").await, vec![dead.clone()]);
    let r = app.get("/ojs/v1/admin/dead-letter?queue=adm-dlq").await;
    assert_eq!(ids(&r.body), vec![dead.clone()]);

    // Without a state, the listing goes through every state.
    let everything: HashSet<String> = all_pages(&app, "queue=adm").await.into_iter().collect();
    assert_eq!(everything.len(), 31, "30 enqueued and the scheduled one");

    // Bad queries are refused before anything is read.
    for (query, field) in [
        ("state=done", "state"),
        ("per_page=0", "per_page"),
        ("per_page=101", "per_page"),
        ("order=up", "order"),
        ("cursor=nonsense", "cursor"),
        ("state=active&cursor=completed:3", "cursor"),
        ("type=adm.*", "type"),
        ("page=0", "page"),
        ("page=102&per_page=100", "page"),
        ("page=2&cursor=completed:3", "page"),
        ("queue=Bad%20Queue", "queue"),
    ] {
        let r = app.get(&format!("/ojs/v1/admin/jobs?{query}")).await;
        r.assert_error(400, "invalid_request");
        assert_eq!(
            r.body["error"]["details"]["field"], field,
            "{query}: {}",
            r.body
        );
    }

    // A cursor past any stream's end, either way, lists nothing and ends the listing.
    for order in ["asc", "desc"] {
        let r = app
            .get(&format!("/ojs/v1/admin/jobs?state=completed&order={order}&cursor=completed:18446744073709551615"))
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(r.body["pagination"]["next_cursor"].is_null(), "{}", r.body);
    }

    // The whole envelope of one job.
    let r = app.get(&format!("/ojs/v1/admin/jobs/{}", waiting[1])).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        (r.body["id"].as_str(), r.body["type"].as_str()),
        (Some(waiting[1].as_str()), Some("adm.b"))
    );
    assert!(r.body["args"].is_array());
    app.stop().await;
}

#[tokio::test]
async fn jobs_discarded_without_a_dead_letter_entry_are_listed_purged_and_retried() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let dead = dead_letter_a_job(&app, "adm-disc").await;
    // The default exhaustion policy discards without a dead-letter entry.
    let mut discarded = Vec::new();
    for _ in 0..9 {
        let id = app
            .enqueue(typed(
                "adm-disc",
                "d.t",
                json!({"retry": {"max_attempts": 1}}),
            ))
            .await;
        app.fetch(&["adm-disc"], "w").await;
        let r = app
            .nack(json!({"job_id": id, "error": {"code": "handler_error", "message": "no"}}))
            .await;
        assert_eq!(r.body["state"], "discarded", "{}", r.body);
        discarded.push(id);
    }
    let mut all: Vec<String> = discarded.iter().rev().cloned().collect();
    all.insert(0, dead.clone());
    // Dead-lettered first, then the others newest first; every one once, pages of 7
    // crossing from one source to the other.
    eventually(
        Duration::from_secs(5),
        "every discarded job listed",
        || async { (all_pages(&app, "queue=adm-disc&state=discarded").await == all).then_some(()) },
    )
    .await;
    let mut oldest_first: Vec<String> = discarded.clone();
    oldest_first.insert(0, dead.clone());
    assert_eq!(
        all_pages(&app, "queue=adm-disc&state=discarded&order=asc").await,
        oldest_first
    );
    let r = app
        .get("/ojs/v1/admin/jobs?queue=adm-disc&state=discarded&per_page=1")
        .await;
    assert_eq!(r.body["pagination"]["total"], 10, "{}", r.body);
    // The dead letter queue is only the dead-lettered one.
    let r = app.get("/ojs/v1/admin/dead-letter?queue=adm-disc").await;
    assert_eq!(ids(&r.body), vec![dead.clone()]);
    assert_eq!(r.body["pagination"]["total"], 1, "{}", r.body);
    // A cursor of a source the dead-letter listing does not walk ends it.
    let r = app
        .get("/ojs/v1/admin/dead-letter?queue=adm-disc&cursor=discarded.index:1")
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(ids(&r.body).is_empty(), "{}", r.body);

    // Bulk retry by filter reaches them, and they leave the listing.
    let r = app
        .post(
            "/ojs/v1/admin/jobs/bulk/retry",
            json!({"filter": {"queue": "adm-disc", "state": "discarded"}, "confirm": true}),
        )
        .await;
    assert_eq!(r.body["succeeded"], 10, "{}", r.body);
    for id in &all {
        assert_eq!(app.job(id).await["state"], "available");
    }
    eventually(Duration::from_secs(5), "retried jobs unlisted", || async {
        listed(&app, "queue=adm-disc&state=discarded")
            .await
            .is_empty()
            .then_some(())
    })
    .await;

    // Discarded again, then purged through the queue's purge.
    for _ in 0..10 {
        let job = app.fetch(&["adm-disc"], "w").await;
        let id = job[0]["id"].as_str().unwrap().to_owned();
        app.nack(json!({"job_id": id, "error": {"code": "handler_error", "message": "no"}}))
            .await;
    }
    eventually(Duration::from_secs(5), "discarded again", || async {
        (all_pages(&app, "queue=adm-disc&state=discarded")
            .await
            .len()
            == 10)
            .then_some(())
    })
    .await;
    let r = app
        .delete_json(
            "/ojs/v1/admin/queues/adm-disc/jobs",
            json!({"states": ["discarded"], "confirm": true}),
        )
        .await;
    assert_eq!(r.body["purged_count"], 10, "{}", r.body);
    assert!(listed(&app, "queue=adm-disc&state=discarded")
        .await
        .is_empty());
    app.stop().await;
}

#[tokio::test]
async fn stats_queues_and_workers_read_the_counters_and_the_registry() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    for _ in 0..3 {
        app.enqueue(typed("adm-stats", "s.t", json!({}))).await;
    }
    let held = app.fetch(&["adm-stats"], "worker-1").await;
    assert_eq!(held.len(), 1);
    let beat = app
        .post(
            "/ojs/v1/workers/heartbeat",
            json!({"worker_id": "worker-1", "active_jobs": [held[0]["id"]], "hostname": "host-a"}),
        )
        .await;
    assert_eq!(beat.status, 200, "{}", beat.body);

    let stats = app.get("/ojs/v1/admin/stats").await;
    assert_eq!(stats.status, 200, "{}", stats.body);
    assert_eq!(stats.body["jobs"]["available"], 2);
    assert_eq!(stats.body["jobs"]["active"], 1);
    assert_eq!(stats.body["workers"], 1);
    assert!(stats.body["queues"].as_u64().unwrap() >= 1);
    assert!(stats.body["uptime_seconds"].is_u64());
    // Rates of the last whole minute: nothing finished or failed in it yet.
    assert_eq!(stats.body["throughput"]["failed_per_minute"], 0);

    let queues = app.get("/ojs/v1/admin/queues").await;
    let q = queues.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["name"] == "adm-stats")
        .unwrap_or_else(|| panic!("adm-stats not in {}", queues.body));
    assert_eq!(
        (q["state"].as_str(), q["counts"]["available"].as_u64()),
        (Some("active"), Some(2))
    );

    let r = app
        .post("/ojs/v1/admin/queues/adm-stats/pause", json!({}))
        .await;
    assert_eq!(
        (r.status.as_u16(), r.body["paused"].as_bool()),
        (200, Some(true))
    );
    let detail = app.get("/ojs/v1/admin/queues/adm-stats").await;
    assert_eq!(detail.body["state"], "paused", "{}", detail.body);
    assert!(detail.body["paused_at"].is_string());
    assert_eq!(detail.body["counts"]["active"], 1);
    assert_eq!(detail.body["dead_letter"], 0);
    app.get("/ojs/v1/admin/queues/nope-never")
        .await
        .assert_error(404, "not_found");

    let workers = app.get("/ojs/v1/admin/workers").await;
    assert_eq!(workers.body["summary"]["total"], 1, "{}", workers.body);
    let w = &workers.body["items"][0];
    assert_eq!(
        (
            w["id"].as_str(),
            w["state"].as_str(),
            w["active_jobs"].as_u64()
        ),
        (Some("worker-1"), Some("running"), Some(1))
    );
    // A worker still heartbeating is not deregistered; an unknown one is not found.
    app.delete("/ojs/v1/admin/workers/worker-1")
        .await
        .assert_error(409, "conflict");
    app.delete("/ojs/v1/admin/workers/nobody")
        .await
        .assert_error(404, "not_found");
    let r = app
        .post("/ojs/v1/admin/workers/worker-1/quiet", json!({}))
        .await;
    assert_eq!(r.status, 200);
    let workers = app.get("/ojs/v1/admin/workers").await;
    assert_eq!(workers.body["summary"]["quiet"], 1, "{}", workers.body);
    app.stop().await;
}

#[tokio::test]
async fn bulk_operations_by_filter_need_confirmation_and_report_each_failure() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let mut dead = Vec::new();
    for _ in 0..3 {
        dead.push(dead_letter_a_job(&app, "adm-bulk").await);
    }
    let filter = json!({"queue": "adm-bulk", "state": "discarded"});
    app.post("/ojs/v1/admin/jobs/bulk/retry", json!({"filter": filter}))
        .await
        .assert_error(400, "invalid_request");
    let r = app
        .post(
            "/ojs/v1/admin/jobs/bulk/retry",
            json!({"filter": filter, "confirm": true}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        (
            r.body["action"].as_str(),
            r.body["matched"].as_u64(),
            r.body["succeeded"].as_u64()
        ),
        (Some("retry"), Some(3), Some(3))
    );
    for id in &dead {
        assert_eq!(app.job(id).await["state"], "available");
    }
    assert!(listed(&app, "state=discarded&queue=adm-bulk")
        .await
        .is_empty());

    // By ids: a job that cannot be cancelled is a failure with its reason.
    let done = {
        let id = app.enqueue(typed("adm-bulk2", "b.t", json!({}))).await;
        app.fetch(&["adm-bulk2"], "w").await;
        app.ack(json!({"job_id": id, "worker_id": "w"})).await;
        id
    };
    let waiting = app.enqueue(typed("adm-bulk2", "b.t", json!({}))).await;
    let r = app
        .post(
            "/ojs/v1/admin/jobs/bulk/cancel",
            json!({"job_ids": [waiting, done], "confirm": true}),
        )
        .await;
    assert_eq!(
        (r.body["succeeded"].as_u64(), r.body["failed"].as_u64()),
        (Some(1), Some(1)),
        "{}",
        r.body
    );
    assert_eq!(r.body["errors"][0]["job_id"], done.as_str());

    // Purge the queue's finished jobs: confirmation, finished states only.
    eventually(
        Duration::from_secs(5),
        "both finished jobs listed",
        || async {
            (listed(&app, "queue=adm-bulk2&state=completed").await.len() == 1
                && listed(&app, "queue=adm-bulk2&state=cancelled").await.len() == 1)
                .then_some(())
        },
    )
    .await;
    app.delete_json(
        "/ojs/v1/admin/queues/adm-bulk2/jobs",
        json!({"states": ["completed"]}),
    )
    .await
    .assert_error(400, "invalid_request");
    app.delete_json(
        "/ojs/v1/admin/queues/adm-bulk2/jobs",
        json!({"states": ["available"], "confirm": true}),
    )
    .await
    .assert_error(400, "invalid_request");
    let r = app
        .delete_json(
            "/ojs/v1/admin/queues/adm-bulk2/jobs",
            json!({"states": ["completed", "cancelled"], "confirm": true}),
        )
        .await;
    assert_eq!(
        (r.status.as_u16(), r.body["purged_count"].as_u64()),
        (200, Some(2)),
        "{}",
        r.body
    );
    app.get(&format!("/ojs/v1/jobs/{done}"))
        .await
        .assert_error(404, "not_found");
    app.get(&format!("/ojs/v1/jobs/{waiting}"))
        .await
        .assert_error(404, "not_found");

    // The dead letter queue purged by age: nothing is older than an hour ago.
    let again = dead_letter_a_job(&app, "adm-bulk3").await;
    let r = app
        .delete_json(
            "/ojs/v1/admin/dead-letter",
            json!({"confirm": true, "older_than": "2000-01-01T00:00:00Z"}),
        )
        .await;
    assert_eq!(r.body["purged_count"], 0, "{}", r.body);
    let r = app
        .delete_json(
            "/ojs/v1/admin/dead-letter",
            json!({"confirm": true, "queue": "adm-bulk3"}),
        )
        .await;
    assert_eq!(r.body["purged_count"], 1, "{}", r.body);
    app.get(&format!("/ojs/v1/jobs/{again}"))
        .await
        .assert_error(404, "not_found");
    app.stop().await;
}

#[tokio::test]
async fn the_dashboard_is_served_to_anyone_and_its_api_calls_need_the_admin_key() {
    let nats = NatsServer::start();
    let mut cfg = test_config(&nats.url);
    cfg.api_keys = KeyList(vec![DATA_KEY.into()]);
    cfg.admin_api_keys = KeyList(vec![ADMIN_KEY.into()]);
    let app = spawn_app_with(cfg).await;
    let page = reqwest::get(app.url("/ojs/admin/")).await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    assert!(page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .contains("script-src 'self'"));
    let html = page.text().await.unwrap();
    assert!(
        html.contains("app.js") && html.contains("app.css"),
        "{html}"
    );
    for (path, kind) in [
        ("/ojs/admin/app.js", "text/javascript"),
        ("/ojs/admin/app.css", "text/css"),
    ] {
        let r = reqwest::get(app.url(path)).await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        assert!(r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with(kind));
    }
    app.get("/ojs/v1/admin/stats")
        .await
        .assert_error(401, "unauthenticated");
    app.keyed(DATA_KEY)
        .get("/ojs/v1/admin/stats")
        .await
        .assert_error(403, "permission_denied");
    assert_eq!(
        app.keyed(ADMIN_KEY).get("/ojs/v1/admin/stats").await.status,
        200
    );
    // The settings in force, for the admin keys only, with no key in them.
    app.keyed(DATA_KEY)
        .get("/ojs/v1/admin/system/config")
        .await
        .assert_error(403, "permission_denied");
    let config = app
        .keyed(ADMIN_KEY)
        .get("/ojs/v1/admin/system/config")
        .await;
    assert_eq!(config.status, 200, "{}", config.body);
    assert_eq!(config.body["admin_api_keys"]["count"], 1);
    assert_eq!(config.body["namespace"], "ojs");
    let text = config.body.to_string();
    assert!(
        !text.contains(ADMIN_KEY) && !text.contains(DATA_KEY),
        "{text}"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_queue_configured_through_the_admin_api_limits_every_replica() {
    let nats = NatsServer::start();
    let a = spawn_app(&nats.url).await;
    let b = spawn_app(&nats.url).await;
    for _ in 0..3 {
        a.enqueue(typed("adm-config", "c.t", json!({}))).await;
    }
    let r = a
        .put(
            "/ojs/v1/admin/queues/adm-config/config",
            json!({"concurrency": 1, "rate_limit": {"limit": 100, "period": "PT1M"}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["configuration"]["concurrency"], 1);
    assert_eq!(
        r.body["configuration"]["rate_limit"],
        json!({"limit": 100, "window_ms": 60000})
    );
    // One job active at once across both replicas.
    assert_eq!(a.fetch(&["adm-config"], "w-a").await.len(), 1);
    eventually(
        Duration::from_secs(5),
        "the other replica to follow the limit",
        || async {
            let detail = b.get("/ojs/v1/admin/queues/adm-config").await;
            (detail.body["configuration"]["concurrency"] == 1).then_some(())
        },
    )
    .await;
    let r = b
        .post(
            "/ojs/v1/workers/fetch",
            json!({"queues": ["adm-config"], "worker_id": "w-b", "wait_ms": 0}),
        )
        .await;
    assert_eq!(
        r.body["jobs"].as_array().map(Vec::len),
        Some(0),
        "{}",
        r.body
    );

    // A queue can be configured before its first job.
    let r = a
        .put(
            "/ojs/v1/admin/queues/never-seen/config",
            json!({"concurrency": 2}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["configuration"]["concurrency"], 2);
    a.put(
        "/ojs/v1/admin/queues/adm-config/config",
        json!({"retention": {"completed": "P1D"}}),
    )
    .await
    .assert_error(422, "unsupported");
    a.put(
        "/ojs/v1/admin/queues/adm-config/config",
        json!({"colour": "blue"}),
    )
    .await
    .assert_error(400, "invalid_request");
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn dead_letter_stats_and_rate_limits_show_what_is_held_without_reading_every_job() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let empty = app.get("/ojs/v1/dead-letter/stats").await;
    assert_eq!(empty.status, 200, "{}", empty.body);
    assert_eq!(
        (
            empty.body["total"].as_u64(),
            empty.body["oldest_at"].is_null()
        ),
        (Some(0), true)
    );
    for queue in ["adm-dl-a", "adm-dl-a", "adm-dl-b"] {
        dead_letter_a_job(&app, queue).await;
    }
    let stats = app.get("/ojs/v1/dead-letter/stats").await.body;
    assert_eq!(stats["total"], 3, "{stats}");
    assert_eq!(stats["by_queue"], json!({"adm-dl-a": 2, "adm-dl-b": 1}));
    assert!(stats["oldest_at"].as_str().unwrap() <= stats["newest_at"].as_str().unwrap());
    assert_eq!(stats["retention"]["max_count"], 10_000);

    // A queue limited to 2 running at once and 5 starts a minute: one job running.
    for _ in 0..3 {
        app.enqueue(typed(
            "adm-limited",
            "l.t",
            json!({"rate_limit": {"concurrency": 2, "rate": {"limit": 5, "period": "PT1M"}}}),
        ))
        .await;
    }
    assert_eq!(app.fetch(&["adm-limited"], "w").await.len(), 1);
    let r = app.get("/ojs/v1/rate-limits/adm-limited").await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.body["concurrency"],
        json!({"limit": 2, "active": 1, "available": 1})
    );
    assert_eq!(
        (
            r.body["rate"]["limit"].as_u64(),
            r.body["rate"]["current_count"].as_u64()
        ),
        (Some(5), Some(1))
    );
    assert!(r.body["rate"]["window_resets_at"].is_string());
    assert_eq!(r.body["waiting_count"], 2);
    assert_eq!(r.body["rate"]["period"], "PT1M");
    // Flat, as the admin UI's columns read them.
    assert_eq!(
        (
            &r.body["limit"],
            &r.body["period"],
            &r.body["waiting"],
            &r.body["active"]
        ),
        (&json!(5), &json!("1m"), &json!(2), &json!(1))
    );
    let all = app.get("/ojs/v1/rate-limits").await;
    assert_eq!(ids_of_keys(&all.body), vec!["adm-limited"]);
    assert_eq!(
        (
            &all.body["pagination"]["page"],
            &all.body["pagination"]["per_page"]
        ),
        (&json!(1), &json!(50))
    );
    let past = app.get("/ojs/v1/rate-limits?page=2&per_page=25").await;
    assert!(ids_of_keys(&past.body).is_empty(), "{}", past.body);
    assert_eq!(past.body["pagination"]["total"], 1);
    app.get("/ojs/v1/rate-limits/adm-dl-a")
        .await
        .assert_error(404, "not_found");
    app.stop().await;
}

fn ids_of_keys(body: &Value) -> Vec<&str> {
    body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["key"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn an_index_stream_deleted_by_hand_is_made_again_and_no_event_waits_for_it() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let js = async_nats::jetstream::new(async_nats::connect(&nats.url).await.unwrap());
    js.delete_stream("ojs-finished-completed").await.unwrap();
    let id = app.enqueue(typed("adm-index", "i.t", json!({}))).await;
    app.fetch(&["adm-index"], "w").await;
    let r = app.ack(json!({"job_id": id, "worker_id": "w"})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    eventually(Duration::from_secs(10), "the completion listed", || async {
        (listed(&app, "queue=adm-index&state=completed").await == vec![id.clone()]).then_some(())
    })
    .await;
    // Counting comes after indexing in the event publisher: it went on too.
    let stats = app.get("/ojs/v1/admin/stats").await;
    assert_eq!(stats.body["jobs"]["completed"], 1, "{}", stats.body);
    app.stop().await;
}

#[tokio::test]
async fn workers_are_listed_a_page_at_a_time_and_counted_without_a_key_listing() {
    let nats = NatsServer::start();
    let config = ojs_jetstream::config::Config {
        heartbeat_timeout_ms: 1_500,
        ..test_config(&nats.url)
    };
    let app = spawn_app_with(config.clone()).await;
    // A second replica, whose counts come from its own copy of the registry.
    let other = spawn_app_with(config).await;
    for i in 0..150 {
        let r = app
            .post(
                "/ojs/v1/workers/heartbeat",
                json!({"worker_id": format!("w-{i:03}"), "active_job_ids": [], "hostname": "h"}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    app.post("/ojs/v1/admin/workers/w-007/quiet", json!({}))
        .await;
    let first = app.get("/ojs/v1/admin/workers").await;
    assert_eq!(
        first.body["summary"]["total"], 150,
        "{}",
        first.body["summary"]
    );
    assert_eq!(
        first.body["summary"]["quiet"], 1,
        "written through this replica"
    );
    let items = first.body["items"].as_array().unwrap();
    assert_eq!(items.len(), 100);
    assert_eq!(
        (items[0]["id"].as_str(), items[7]["state"].as_str()),
        (Some("w-000"), Some("quiet"))
    );
    assert_eq!(first.body["pagination"]["has_more"], true);
    let second = app.get("/ojs/v1/admin/workers?page=2&per_page=100").await;
    let ids: Vec<&str> = second.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["id"].as_str().unwrap())
        .collect();
    assert_eq!((ids.len(), ids[0], ids[49]), (50, "w-100", "w-149"));
    assert_eq!(second.body["pagination"]["has_more"], false);
    eventually(
        Duration::from_secs(5),
        "the other replica to see every worker",
        || async { (other.get("/ojs/v1/admin/stats").await.body["workers"] == 150).then_some(()) },
    )
    .await;
    // Silent workers are declared dead and leave every count.
    eventually(
        Duration::from_secs(10),
        "the silent workers to be removed",
        || async {
            let stats = other.get("/ojs/v1/admin/stats").await.body["workers"].clone();
            let listed = app.get("/ojs/v1/admin/workers").await.body["summary"]["total"].clone();
            (stats == 0 && listed == 0).then_some(())
        },
    )
    .await;
}
