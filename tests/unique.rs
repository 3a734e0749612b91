//! Unique jobs through the HTTP API on a real nats-server (unique-jobs spec): strong under
//! concurrent enqueues through two replicas, every conflict policy, batches all or none.

use crate::common;

use common::{spawn_app, NatsServer, TestApp};
use futures::future::join_all;
use serde_json::{json, Value};

fn unique_job(queue: &str, args: Value, unique: Value) -> Value {
    json!({"type": "u.x", "args": args, "options": {"queue": queue, "unique": unique}})
}

async fn available(app: &TestApp, queue: &str) -> u64 {
    let r = app.get(&format!("/ojs/v1/queues/{queue}/stats")).await;
    r.body["queue"]["available"].as_u64().unwrap()
}

/// 64 identical enqueues at once, half through each gateway: their statuses and job ids.
async fn race(a: &TestApp, b: &TestApp, body: Value) -> Vec<(u16, String)> {
    let posts = (0..64).map(|i| {
        let app = if i % 2 == 0 { a } else { b };
        let body = body.clone();
        async move {
            let r = app.post("/ojs/v1/jobs", body).await;
            let id = r.body["job"]["id"]
                .as_str()
                .or(r.body["error"]["details"]["existing_job_id"].as_str())
                .unwrap_or_else(|| panic!("no job named: {}", r.body))
                .to_owned();
            (r.status.as_u16(), id)
        }
    });
    join_all(posts).await
}

#[tokio::test]
async fn sixty_four_concurrent_enqueues_through_two_replicas_create_one_job() {
    let nats = NatsServer::start();
    let a = spawn_app(&nats.url).await;
    let b = spawn_app(&nats.url).await;

    let rejected = race(
        &a,
        &b,
        unique_job("race", json!([1]), json!({"keys": ["type", "args"]})),
    )
    .await;
    let created: Vec<_> = rejected.iter().filter(|(s, _)| *s == 201).collect();
    assert_eq!(created.len(), 1, "{rejected:?}");
    let winner = &created[0].1;
    assert!(rejected
        .iter()
        .all(|(s, id)| *s == 201 || (*s == 409 && id == winner)));
    assert_eq!(available(&a, "race").await, 1);

    // `ignore`: one creates, every other one gets that job back with 200.
    let ignored = race(
        &a,
        &b,
        unique_job(
            "race",
            json!([2]),
            json!({"keys": ["type", "args"], "on_conflict": "ignore"}),
        ),
    )
    .await;
    assert_eq!(ignored.iter().filter(|(s, _)| *s == 201).count(), 1);
    assert!(ignored.iter().all(|(s, _)| *s == 201 || *s == 200));
    assert!(ignored.iter().all(|(_, id)| *id == ignored[0].1));
    assert_eq!(available(&b, "race").await, 2);
    let r = a
        .post(
            "/ojs/v1/jobs",
            unique_job(
                "race",
                json!([2]),
                json!({"keys": ["type", "args"], "on_conflict": "use_existing"}),
            ),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["deduplicated"], true);
    assert_eq!(r.body["job"]["id"], ignored[0].1.as_str());
    assert_eq!(
        r.body["id"], r.body["job"]["id"],
        "the job's fields at the top level too"
    );
}

#[tokio::test]
async fn replace_cancels_the_holder_even_while_it_runs() {
    let nats = NatsServer::start();
    let a = spawn_app(&nats.url).await;
    let policy = json!({"on_conflict": "replace"});
    let first = a
        .enqueue(unique_job("rep", json!([1]), policy.clone()))
        .await;
    let second = a
        .enqueue(unique_job("rep", json!([2]), policy.clone()))
        .await;
    assert_eq!(a.job(&first).await["state"], "cancelled");
    assert_eq!(a.job(&second).await["state"], "available");

    // The holder is active: strong uniqueness cancels it too; its worker's ACK is refused.
    let running = a.fetch(&["rep"], "w").await;
    assert_eq!(running[0]["id"], second.as_str());
    let third = a.enqueue(unique_job("rep", json!([3]), policy)).await;
    assert_eq!(a.job(&second).await["state"], "cancelled");
    a.ack(json!({"job_id": second, "worker_id": "w"}))
        .await
        .assert_error(409, "conflict");
    assert_eq!(a.fetch(&["rep"], "w").await[0]["id"], third.as_str());

    // replace_except_schedule: the new job keeps the scheduled one's time.
    let keep = json!({"on_conflict": "replace_except_schedule"});
    let mut scheduled = unique_job("sched", json!([1]), keep.clone());
    scheduled["options"]["scheduled_at"] = json!("2099-01-01T00:00:00Z");
    let old = a.enqueue(scheduled).await;
    let new = a.enqueue(unique_job("sched", json!([2]), keep)).await;
    assert_eq!(a.job(&old).await["state"], "cancelled");
    let new = a.job(&new).await;
    assert_eq!(new["state"], "scheduled");
    assert_eq!(new["scheduled_at"], "2099-01-01T00:00:00Z");
    assert_eq!(new["args"], json!([2]));
}

#[tokio::test]
async fn a_key_is_free_again_once_its_job_leaves_the_states_or_the_period() {
    let nats = NatsServer::start();
    let a = spawn_app(&nats.url).await;
    let policy = json!({"keys": ["type", "queue"], "states": ["available"]});
    let first = a
        .enqueue(unique_job("free", json!([]), policy.clone()))
        .await;
    let r = a
        .post(
            "/ojs/v1/jobs",
            unique_job("free", json!([]), policy.clone()),
        )
        .await;
    r.assert_error(409, "duplicate");
    assert_eq!(
        r.body["error"]["details"]["existing_job_id"],
        first.as_str()
    );
    assert_eq!(
        r.body["error"]["details"]["existing_job_state"],
        "available"
    );
    assert_eq!(
        r.body["error"]["details"]["unique_key"]
            .as_str()
            .unwrap()
            .len(),
        64
    );
    // Active is not among the states: the key is free.
    a.fetch(&["free"], "w").await;
    a.enqueue(unique_job("free", json!([]), policy.clone()))
        .await;
    // Another queue is another key when the queue is a dimension.
    a.enqueue(unique_job("elsewhere", json!([]), policy)).await;

    let period = json!({"period": "PT1S"});
    a.enqueue(unique_job("period", json!([]), period.clone()))
        .await;
    a.post(
        "/ojs/v1/jobs",
        unique_job("period", json!([]), period.clone()),
    )
    .await
    .assert_error(409, "duplicate");
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    a.enqueue(unique_job("period", json!([]), period)).await;

    // args_keys: only the named fields of the args' objects count.
    let by_user = json!({"keys": ["args"], "args_keys": ["user"]});
    a.enqueue(unique_job(
        "user",
        json!([{"user": 1, "n": 1}]),
        by_user.clone(),
    ))
    .await;
    a.post(
        "/ojs/v1/jobs",
        unique_job("user", json!([{"user": 1, "n": 2}]), by_user.clone()),
    )
    .await
    .assert_error(409, "duplicate");
    a.enqueue(unique_job("user", json!([{"user": 2, "n": 1}]), by_user))
        .await;
}

#[tokio::test]
async fn a_batch_with_a_held_or_repeated_key_writes_nothing() {
    let nats = NatsServer::start();
    let a = spawn_app(&nats.url).await;
    let policy = json!({"keys": ["type", "args"]});
    a.enqueue(unique_job("batch", json!([1]), policy.clone()))
        .await;
    let plain = json!({"type": "u.x", "args": [9], "options": {"queue": "batch"}});
    let held = json!({"jobs": [plain.clone(), unique_job("batch", json!([2]), policy.clone()), unique_job("batch", json!([1]), policy.clone())]});
    a.post("/ojs/v1/jobs/batch", held)
        .await
        .assert_error(409, "duplicate");
    let repeated = json!({"jobs": [unique_job("batch", json!([3]), policy.clone()), unique_job("batch", json!([3]), policy.clone())]});
    let r = a.post("/ojs/v1/jobs/batch", repeated).await;
    r.assert_error(409, "duplicate");
    assert_eq!(r.body["error"]["details"]["index"], 1);
    assert_eq!(available(&a, "batch").await, 1);
    // The locks the refused batch took are given back.
    a.enqueue(unique_job("batch", json!([2]), policy.clone()))
        .await;
    a.enqueue(unique_job("batch", json!([3]), policy)).await;
}

#[tokio::test]
async fn malformed_policies_are_refused_naming_the_field() {
    let nats = NatsServer::start();
    let a = spawn_app(&nats.url).await;
    for (unique, field) in [
        (json!({"keys": ["argz"]}), "unique.keys"),
        (json!({"keys": ["meta"]}), "unique.meta_keys"),
        (json!({"states": ["finished"]}), "unique.states"),
        (json!({"period": "1 hour"}), "unique.period"),
        (json!({"on_conflict": "merge"}), "unique.on_conflict"),
        (json!({"args_keys": ["missing"]}), "unique.args_keys"),
        (json!([1]), "unique"),
    ] {
        let r = a
            .post("/ojs/v1/jobs", unique_job("bad", json!([{"a": 1}]), unique))
            .await;
        r.assert_error(400, "invalid_request");
        assert_eq!(r.body["error"]["details"]["field"], field);
    }
}

/// The admin UI's unique-jobs page: each lock held, newest first, with its job; a lock
/// released when its job ends leaves the list.
#[tokio::test]
async fn the_locks_held_are_listed_with_their_jobs() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let mut ids = Vec::new();
    for n in 0..3 {
        let r = app
            .post(
                "/ojs/v1/jobs",
                unique_job("uq-list", json!([n]), json!({"keys": ["args"]})),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.body);
        ids.push(r.body["job"]["id"].as_str().unwrap().to_owned());
    }
    let r = app.get("/ojs/v1/unique-jobs?page=1&per_page=2").await;
    assert_eq!(r.status, 200, "{}", r.body);
    let items = r.body["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "{}", r.body);
    assert_eq!(r.body["pagination"]["total"], 3);
    assert_eq!(items[0]["job_id"], ids[2].as_str());
    assert_eq!(
        (&items[0]["queue"], &items[0]["state"], &items[0]["type"]),
        (&json!("uq-list"), &json!("available"), &json!("u.x"))
    );
    assert_eq!(items[0]["key"].as_str().unwrap().len(), 64, "{}", r.body);
    // A job runs and completes: the leader releases its lock.
    let jobs = app.fetch(&["uq-list"], "w").await;
    let done = jobs[0]["id"].as_str().unwrap().to_owned();
    app.ack(json!({"job_id": done})).await;
    common::eventually(
        std::time::Duration::from_secs(5),
        "the lock released",
        || async {
            let r = app.get("/ojs/v1/unique-jobs").await;
            let held: Vec<&str> = r.body["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["job_id"].as_str().unwrap())
                .collect();
            (held.len() == 2 && !held.contains(&done.as_str())).then_some(())
        },
    )
    .await;
    app.stop().await;
}
