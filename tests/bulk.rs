//! Bulk cancel, retry and delete by job id through the HTTP API on a real nats-server, two
//! gateways: each job's outcome in request order, the jobs changed as their single operation
//! would, and the request bounds.

use crate::common;

use common::{dead_letter_a_job, spawn_app, NatsServer, TestApp};
use serde_json::{json, Value};

fn job(queue: &str, options: Value) -> Value {
    let mut options = options;
    options["queue"] = json!(queue);
    json!({"type": "t.b", "args": [], "options": options})
}

fn statuses(body: &Value) -> Vec<&str> {
    body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["status"].as_str().unwrap())
        .collect()
}

async fn state(app: &TestApp, id: &str) -> String {
    app.job(id).await["state"].as_str().unwrap().to_string()
}

/// A job in `queue` that was fetched and acknowledged.
async fn completed(app: &TestApp, queue: &str) -> String {
    let id = app.enqueue(job(queue, json!({}))).await;
    assert_eq!(app.fetch(&[queue], "w").await[0]["id"], id.as_str());
    assert_eq!(
        app.ack(json!({"job_id": id, "worker_id": "w"}))
            .await
            .status,
        200
    );
    id
}

#[tokio::test]
async fn bulk_cancel_retry_and_delete_report_each_job_and_change_it_as_its_own_operation() {
    let nats = NatsServer::start();
    let a = spawn_app(&nats.url).await;
    let b = spawn_app(&nats.url).await;
    let unknown = uuid::Uuid::now_v7().to_string();

    // Cancel: waiting jobs are cancelled, a finished one is skipped, unknown ids fail.
    let waiting = a.enqueue(job("bulk", json!({}))).await;
    let scheduled = a
        .enqueue(job("bulk", json!({"scheduled_at": "+PT1H"})))
        .await;
    let done = completed(&a, "bulk-done").await;
    let ids = json!([waiting, scheduled, done, unknown, "not-an-id"]);
    let r = b
        .post("/ojs/v1/jobs/bulk/cancel", json!({ "job_ids": ids }))
        .await;
    assert_eq!(r.status, 207, "{}", r.body);
    assert_eq!(
        statuses(&r.body),
        ["cancelled", "cancelled", "skipped", "failed", "failed"]
    );
    assert_eq!(
        (r.body["total"].clone(), r.body["cancelled"].clone()),
        (json!(5), json!(2))
    );
    assert_eq!(
        (r.body["skipped"].clone(), r.body["failed"].clone()),
        (json!(1), json!(2))
    );
    assert_eq!(r.body["items"][2]["job_id"], done.as_str());
    assert!(r.body["items"][2]["reason"]
        .as_str()
        .unwrap()
        .contains("completed"));
    assert_eq!(r.body["items"][3]["error"]["code"], "not_found");
    assert_eq!(state(&a, &waiting).await, "cancelled");
    assert_eq!(state(&a, &scheduled).await, "cancelled");
    assert_eq!(state(&a, &done).await, "completed");
    assert!(
        a.fetch(&["bulk"], "w").await.is_empty(),
        "nothing left to run"
    );

    // Retry: a dead-lettered job and one waiting out a long backoff run now; others are skipped.
    let dead = dead_letter_a_job(&a, "bulk-retry").await;
    let backing_off = a
        .enqueue(job(
            "bulk-retry",
            json!({"retry": {"max_attempts": 3, "initial_interval": "PT1H"}}),
        ))
        .await;
    assert_eq!(
        a.fetch(&["bulk-retry"], "w").await[0]["id"],
        backing_off.as_str()
    );
    let r = a
        .nack(json!({"job_id": backing_off, "error": {"code": "e", "message": "later"}}))
        .await;
    assert_eq!(r.body["state"], "retryable", "{}", r.body);
    let r = b
        .post(
            "/ojs/v1/jobs/bulk/retry",
            json!({"job_ids": [dead, backing_off, done]}),
        )
        .await;
    assert_eq!(r.status, 207, "{}", r.body);
    assert_eq!(statuses(&r.body), ["retried", "retried", "skipped"]);
    assert_eq!(r.body["retried"], 2);
    let dlq = a.get("/ojs/v1/dead-letter?queue=bulk-retry").await;
    assert_eq!(
        dlq.body["jobs"].as_array().unwrap().len(),
        0,
        "{}",
        dlq.body
    );
    let mut fetched: Vec<(String, u64)> = Vec::new();
    for _ in 0..2 {
        let got = a.fetch(&["bulk-retry"], "w").await;
        fetched.extend(got.iter().map(|j| {
            (
                j["id"].as_str().unwrap().to_string(),
                j["attempt"].as_u64().unwrap(),
            )
        }));
    }
    fetched.sort();
    let mut expected = vec![(dead.clone(), 1), (backing_off.clone(), 2)];
    expected.sort();
    assert_eq!(
        fetched, expected,
        "both run now; the retryable one keeps its attempt count"
    );

    // Delete: finished jobs are gone for good (and from the counts), others are skipped.
    let finished = completed(&a, "bulk-delete").await;
    let cancelled = a
        .enqueue(job("bulk-delete", json!({"scheduled_at": "+PT1H"})))
        .await;
    assert_eq!(
        a.delete(&format!("/ojs/v1/jobs/{cancelled}")).await.status,
        200
    );
    let running = a.enqueue(job("bulk-delete", json!({}))).await;
    assert_eq!(
        a.fetch(&["bulk-delete"], "w").await[0]["id"],
        running.as_str()
    );
    let before = a.get("/ojs/v1/queues/bulk-delete/stats").await.body;
    assert_eq!(before["stats"]["completed"], 1, "{before}");
    assert_eq!(before["stats"]["cancelled"], 1, "{before}");
    let r = b
        .post(
            "/ojs/v1/jobs/bulk/delete",
            json!({"job_ids": [finished, cancelled, running]}),
        )
        .await;
    assert_eq!(r.status, 207, "{}", r.body);
    assert_eq!(statuses(&r.body), ["deleted", "deleted", "skipped"]);
    assert_eq!(r.body["deleted"], 2);
    for id in [&finished, &cancelled] {
        let r = a.get(&format!("/ojs/v1/jobs/{id}")).await;
        assert_eq!(r.status, 404, "{id}: {}", r.body);
    }
    assert_eq!(state(&a, &running).await, "active");
    let after = a.get("/ojs/v1/queues/bulk-delete/stats").await.body;
    assert_eq!(after["stats"]["completed"], 0, "{after}");
    assert_eq!(after["stats"]["cancelled"], 0, "{after}");
    assert_eq!(after["stats"]["active"], 1, "{after}");

    // All done answers 200; none done 422, still item by item.
    let other = a.enqueue(job("bulk", json!({}))).await;
    let r = a
        .post("/ojs/v1/jobs/bulk/cancel", json!({"job_ids": [other]}))
        .await;
    assert_eq!(
        (r.status.as_u16(), statuses(&r.body)),
        (200, vec!["cancelled"])
    );
    let r = a
        .post("/ojs/v1/jobs/bulk/delete", json!({"job_ids": [running]}))
        .await;
    assert_eq!(
        (r.status.as_u16(), statuses(&r.body)),
        (422, vec!["skipped"])
    );
}

#[tokio::test]
async fn bulk_requests_outside_the_bounds_are_refused_before_any_job_changes() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let id = app.enqueue(job("bounds", json!({}))).await;

    let over: Vec<String> = (0..1001).map(|_| id.clone()).collect();
    let r = app
        .post("/ojs/v1/jobs/bulk/cancel", json!({ "job_ids": over }))
        .await;
    r.assert_error(413, "envelope_too_large");
    assert_eq!(r.body["error"]["details"]["max_batch_size"], 1000);

    let r = app
        .post(
            "/ojs/v1/jobs/bulk/cancel",
            json!({"filter": {"queue": "bounds", "priority": 1}}),
        )
        .await;
    r.assert_error(422, "unsupported");
    let r = app
        .post(
            "/ojs/v1/jobs/bulk/retry",
            json!({"job_ids": [id], "atomicity": "atomic"}),
        )
        .await;
    r.assert_error(422, "unsupported");
    for body in [
        json!({}),
        json!({"job_ids": []}),
        json!({"job_ids": [1]}),
        json!({"job_ids": [id], "filter": {"queue": "bounds"}}),
    ] {
        let r = app.post("/ojs/v1/jobs/bulk/delete", body).await;
        r.assert_error(400, "invalid_request");
    }
    assert_eq!(state(&app, &id).await, "available");
}
