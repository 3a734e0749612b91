//! Retention of finished jobs (architecture §3.13): the leader prunes completed, cancelled
//! and discarded jobs `finished_jobs_max_age_ms` after they finished, and nothing else.

use crate::common;

use std::time::Duration;

use common::{dead_letter_a_job, eventually, job_on, spawn_app_with, test_config, NatsServer};
use ojs_jetstream::config::Config;
use serde_json::json;

/// Messages of job `id` left in the jobs stream.
async fn stored_messages(nats: &NatsServer, id: &str) -> usize {
    let js = async_nats::jetstream::new(async_nats::connect(&nats.url).await.unwrap());
    let stream = js.get_stream("KV_ojs-jobs").await.unwrap();
    let subject = format!("$KV.ojs-jobs.{id}");
    let mut info = stream.info_with_subjects(&subject).await.unwrap();
    let mut count = 0;
    while let Some(Ok((name, n))) = futures::StreamExt::next(&mut info).await {
        if name == subject {
            count = n;
        }
    }
    count
}

#[tokio::test]
async fn finished_jobs_are_pruned_after_their_max_age_and_nothing_else_is() {
    let nats = NatsServer::start();
    let app = spawn_app_with(Config {
        finished_jobs_max_age_ms: 1000,
        dead_letter_max_count: 1,
        ..test_config(&nats.url)
    })
    .await;

    let completed = app.enqueue(job_on("r-done")).await;
    app.fetch(&["r-done"], "w").await;
    let r = app.ack(json!({"job_id": completed})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let cancelled = app.enqueue(job_on("r-cancel")).await;
    app.delete(&format!("/ojs/v1/jobs/{cancelled}")).await;
    let discard = |queue: &str| json!({"type": "t.x", "args": [], "options": {"queue": queue, "retry": {"max_attempts": 1}}});
    let discarded = app.enqueue(discard("r-discard")).await;
    app.fetch(&["r-discard"], "w").await;
    app.nack(json!({"job_id": discarded, "error": {"message": "no"}}))
        .await;
    // Retried after it was discarded: its discarded write ages, the job must not go.
    let revived = app.enqueue(discard("r-revive")).await;
    app.fetch(&["r-revive"], "w").await;
    app.nack(json!({"job_id": revived, "error": {"message": "no"}}))
        .await;
    let r = app
        .post(&format!("/ojs/v1/dead-letter/{revived}/retry"), json!({}))
        .await;
    assert_eq!(r.body["job"]["state"], "available", "{}", r.body);
    // The first leaves the dead letter queue when the second enters it (max count 1).
    let left_dlq = dead_letter_a_job(&app, "r-dlq").await;
    let in_dlq = dead_letter_a_job(&app, "r-dlq").await;
    let waiting = app.enqueue(job_on("r-wait")).await;
    let scheduled = app
        .enqueue(json!({"type": "t.x", "args": [], "options": {"queue": "r-later", "scheduled_at": (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339()}}))
        .await;
    let active = app.enqueue(job_on("r-active")).await;
    app.fetch(&["r-active"], "w").await;

    let gone = [&completed, &cancelled, &discarded, &left_dlq];
    eventually(Duration::from_secs(10), "finished jobs pruned", || async {
        for id in gone {
            if app.get(&format!("/ojs/v1/jobs/{id}")).await.status != 404 {
                return None;
            }
        }
        Some(())
    })
    .await;
    for id in gone {
        assert_eq!(stored_messages(&nats, id).await, 0, "{id} left messages");
    }
    // Events are stored before their writes can be pruned.
    let events = app
        .get("/ojs/v1/events?types=job.completed&limit=100")
        .await;
    assert!(
        events.body["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["data"]["job_id"] == completed.as_str()),
        "{}",
        events.body
    );

    // Well past their writes' max age, the rest are all still there.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for (id, state) in [
        (&revived, "available"),
        (&in_dlq, "discarded"),
        (&waiting, "available"),
        (&scheduled, "scheduled"),
        (&active, "active"),
    ] {
        assert_eq!(app.job(id).await["state"], state, "{id}");
    }
    assert_eq!(
        app.get(&format!("/ojs/v1/dead-letter/{in_dlq}"))
            .await
            .status,
        200
    );
    assert_eq!(
        app.fetch(&["r-revive"], "w").await[0]["id"],
        revived.as_str()
    );
    let r = app.ack(json!({"job_id": active})).await;
    assert_eq!(r.body["state"], "completed", "{}", r.body);
    eventually(
        Duration::from_secs(10),
        "the late finisher pruned",
        || async { (app.get(&format!("/ojs/v1/jobs/{active}")).await.status == 404).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn with_max_age_zero_finished_jobs_are_kept() {
    let nats = NatsServer::start();
    let app = spawn_app_with(Config {
        finished_jobs_max_age_ms: 0,
        ..test_config(&nats.url)
    })
    .await;
    let id = app.enqueue(job_on("keep")).await;
    app.fetch(&["keep"], "w").await;
    app.ack(json!({"job_id": id})).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(app.job(&id).await["state"], "completed");
}

/// A finished job is pruned only after its events are stored: while the events stream is
/// gone (the event publisher cannot publish, so it acknowledges nothing), the job stays.
#[tokio::test]
async fn a_job_is_not_pruned_before_its_events_are_stored() {
    let nats = NatsServer::start();
    let app = spawn_app_with(Config {
        finished_jobs_max_age_ms: 1000,
        ..test_config(&nats.url)
    })
    .await;
    let js = async_nats::jetstream::new(async_nats::connect(&nats.url).await.unwrap());
    let events_config = js
        .get_stream("ojs-events")
        .await
        .unwrap()
        .cached_info()
        .config
        .clone();
    js.delete_stream("ojs-events").await.unwrap();

    let id = app.enqueue(job_on("r-events")).await;
    app.fetch(&["r-events"], "w").await;
    app.ack(json!({"job_id": id})).await;
    tokio::time::sleep(Duration::from_millis(3000)).await;
    assert_eq!(
        app.job(&id).await["state"],
        "completed",
        "pruned before its events were stored"
    );

    js.create_stream(events_config).await.unwrap();
    eventually(Duration::from_secs(10), "the job pruned", || async {
        (app.get(&format!("/ojs/v1/jobs/{id}")).await.status == 404).then_some(())
    })
    .await;
    let events = app
        .get("/ojs/v1/events?types=job.completed&limit=100")
        .await;
    assert!(
        events.body["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["data"]["job_id"] == id.as_str()),
        "{}",
        events.body
    );
}
