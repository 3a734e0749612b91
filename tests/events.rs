//! Lifecycle events: derived from job writes, published on `<namespace>.events.<type>`,
//! kept in the events stream and paged through `GET /ojs/v1/events` (events seed).

use crate::common;

use std::time::Duration;

use common::{eventually, job_on, spawn_app, spawn_app_with, test_config, NatsServer};
use futures::StreamExt;
use ojs_jetstream::config::Config;
use serde_json::{json, Value};

async fn events_of(app: &common::TestApp, query: &str, want: usize) -> Vec<Value> {
    eventually(Duration::from_secs(5), "events", || async {
        let r = app.get(&format!("/ojs/v1/events?{query}")).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let events = r.body["events"].as_array().unwrap().clone();
        (events.len() >= want).then_some(events)
    })
    .await
}

#[tokio::test]
async fn a_job_emits_its_lifecycle_in_order() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let id = app
        .enqueue(json!({"type": "t.e", "args": [], "options": {"queue": "ev"}}))
        .await;
    app.fetch(&["ev"], "w1").await;
    app.ack(json!({"job_id": id, "result": {"ok": true}})).await;
    let events = events_of(&app, "queues=ev", 3).await;
    let types: Vec<_> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["job.enqueued", "job.started", "job.completed"]);
    for e in &events {
        assert_eq!(e["specversion"], "1.0");
        assert!(e["id"].as_str().unwrap().starts_with("evt_"));
        assert_eq!(e["subject"], id.as_str());
        assert_eq!(e["data"]["job_id"], id.as_str());
        assert_eq!(e["data"]["job_type"], "t.e");
        assert_eq!(e["data"]["queue"], "ev");
        assert!(e["time"].is_string() && e["source"].is_string());
    }
    assert_eq!(events[1]["data"]["worker_id"], "w1");
    assert_eq!(events[2]["data"]["attempt"], 1);
    assert!(events[2]["data"]["duration_ms"].is_number());
    assert_eq!(events[2]["data"]["result"], json!({"ok": true}));
}

#[tokio::test]
async fn every_event_of_a_traced_job_carries_its_trace_id_and_the_context_is_kept() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = format!("00-{trace}-00f067aa0ba902b7-01");
    let meta = json!({"traceparent": parent, "tracestate": "congo=t61rcWkgMzE"});
    let id = app
        .enqueue(json!({"type": "t.e", "args": [], "meta": meta, "options": {"queue": "tr"}}))
        .await;
    let fetched = app.fetch(&["tr"], "w1").await;
    assert_eq!(
        fetched[0]["meta"], meta,
        "the worker gets the context unchanged"
    );
    app.ack(json!({"job_id": id})).await;
    let events = events_of(&app, "queues=tr", 3).await;
    for e in &events {
        assert_eq!(e["data"]["trace_id"], trace, "{}", e["type"]);
    }
}

#[tokio::test]
async fn failures_and_cancellations_emit_their_events() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let id = app.enqueue(json!({"type": "t.e", "args": [], "options": {"queue": "fl", "retry": {"max_attempts": 1}}})).await;
    app.fetch(&["fl"], "w").await;
    app.nack(json!({"job_id": id, "error": {"code": "handler_error", "message": "boom"}}))
        .await;
    let events = events_of(&app, "queues=fl&types=job.failed,job.discarded", 2).await;
    assert_eq!(events[0]["type"], "job.failed");
    assert_eq!(events[0]["data"]["error"]["code"], "handler_error");
    assert_eq!(events[1]["type"], "job.discarded");
    assert_eq!(events[1]["data"]["total_attempts"], 1);

    let cancelled = app.enqueue(job_on("fl")).await;
    app.delete(&format!("/ojs/v1/jobs/{cancelled}")).await;
    let events = events_of(&app, "types=job.cancelled", 1).await;
    assert_eq!(events[0]["subject"], cancelled.as_str());
}

#[tokio::test]
async fn filters_limits_and_cursors_page_through_events() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    for _ in 0..5 {
        app.enqueue(job_on("page-a")).await;
        app.enqueue(json!({"type": "t.other", "args": [], "options": {"queue": "page-b"}}))
            .await;
    }
    let all_a = events_of(&app, "types=job.enqueued&queues=page-a", 5).await;
    assert_eq!(all_a.len(), 5);
    let by_type = events_of(&app, "job_types=t.other", 5).await;
    assert!(by_type.iter().all(|e| e["data"]["queue"] == "page-b"));

    let first = app.get("/ojs/v1/events?queues=page-a&limit=2").await;
    assert_eq!(first.body["events"].as_array().unwrap().len(), 2);
    assert_eq!(first.body["has_more"], true);
    let cursor = first.body["cursor"].as_str().unwrap().to_string();
    let second = app
        .get(&format!(
            "/ojs/v1/events?queues=page-a&limit=10&after={cursor}"
        ))
        .await;
    let rest = second.body["events"].as_array().unwrap();
    assert_eq!(rest.len(), 3);
    assert_eq!(rest[0]["id"], all_a[2]["id"]);

    app.get("/ojs/v1/events?limit=0")
        .await
        .assert_error(400, "invalid_request");
    app.get("/ojs/v1/events?limit=5000")
        .await
        .assert_error(400, "invalid_request");
    app.get("/ojs/v1/events?after=yesterday")
        .await
        .assert_error(400, "invalid_request");
}

/// A job write whose delivery to the event publisher was lost on the way
/// (`job_writes.delivered=lose(1)`: the first is dropped, as one in flight on a connection
/// or at a consumer leader that went down) is not acknowledged with the next: the next
/// delivery shows the gap, the leadership ends, and the next one reads from the last write
/// acknowledged. The only write of the first job still has its event.
#[tokio::test]
async fn a_job_write_lost_on_the_way_to_the_publisher_is_read_again_by_the_next_leadership() {
    let nats = NatsServer::start();
    let app = spawn_app_with(Config {
        failpoints: "job_writes.delivered=lose(1)".into(),
        ..test_config(&nats.url)
    })
    .await;
    let first = app.enqueue(job_on("lostw")).await;
    let second = app.enqueue(job_on("lostw")).await;
    let events = eventually(Duration::from_secs(15), "both enqueued events", || async {
        let r = app.get("/ojs/v1/events?queues=lostw").await;
        let events = r.body["events"].as_array().cloned().unwrap_or_default();
        (events.len() >= 2).then_some(events)
    })
    .await;
    let subjects: Vec<_> = events
        .iter()
        .map(|e| e["subject"].as_str().unwrap())
        .collect();
    assert_eq!(subjects, [first.as_str(), second.as_str()]);
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("ojs_leader_service_failures_total{service=\"event_publisher\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn events_are_published_on_nats_subjects() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let client = async_nats::connect(&nats.url).await.unwrap();
    let mut sub = client.subscribe("ojs.events.>").await.unwrap();
    client.flush().await.unwrap();
    let id = app.enqueue(job_on("subj")).await;
    let msg = tokio::time::timeout(Duration::from_secs(5), sub.next())
        .await
        .expect("an event")
        .unwrap();
    assert_eq!(msg.subject.as_str(), "ojs.events.job.enqueued");
    let event: Value = serde_json::from_slice(&msg.payload).unwrap();
    assert_eq!(event["subject"], id.as_str());
}

/// The event publisher's consumers on the jobs stream: (name, consumer).
async fn feeds(
    stream: &async_nats::jetstream::stream::Stream,
) -> Vec<(String, async_nats::jetstream::consumer::PullConsumer)> {
    use futures::TryStreamExt;
    let names: Vec<String> = stream.consumer_names().try_collect().await.unwrap();
    let mut feeds = Vec::new();
    for name in names
        .into_iter()
        .filter(|n| n.starts_with("event-publisher"))
    {
        feeds.push((name.clone(), stream.get_consumer(&name).await.unwrap()));
    }
    feeds
}

/// The one feed consumer's name and acknowledged floor, once that floor is past `after`:
/// the publisher acknowledges a batch only after its events are stored (and counted), so
/// the events of a write are seen a moment before its acknowledgement.
async fn feed_past(stream: &async_nats::jetstream::stream::Stream, after: u64) -> (String, u64) {
    eventually(
        Duration::from_secs(5),
        "the feed's acknowledgement",
        || async {
            let mut current = feeds(stream).await;
            if current.len() != 1 {
                return None; // one feed consumer per leadership, once an earlier one is removed
            }
            let (name, mut feed) = current.pop().unwrap();
            assert!(name.starts_with("event-publisher-"), "{name}");
            let info = feed.info().await.unwrap();
            assert_eq!(
                info.config.ack_policy,
                async_nats::jetstream::consumer::AckPolicy::All
            );
            let floor = info.ack_floor.stream_sequence;
            (floor > after).then_some((name, floor))
        },
    )
    .await
}

/// The single job-write feed consumer of earlier versions (`event-publisher`, here one
/// that acknowledged every write) is taken over where it stopped by the leadership's own
/// consumer, and then removed.
#[tokio::test]
async fn an_earlier_versions_feed_consumer_is_taken_over_where_it_stopped() {
    use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};

    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let first = app.enqueue(job_on("feed")).await;
    events_of(&app, "type=job.enqueued", 1).await;
    let js = async_nats::jetstream::new(async_nats::connect(&nats.url).await.unwrap());
    let stream = js.get_stream("KV_ojs-jobs").await.unwrap();
    // The first job's write handled and acknowledged.
    let (name, floor) = feed_past(&stream, 0).await;
    app.stop().await;

    stream.delete_consumer(&name).await.unwrap();
    stream
        .create_consumer(pull::Config {
            durable_name: Some("event-publisher".into()),
            ack_policy: AckPolicy::Explicit,
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: floor + 1,
            },
            ..Default::default()
        })
        .await
        .unwrap();

    let app = spawn_app(&nats.url).await;
    let second = app.enqueue(job_on("feed")).await;
    let events = events_of(&app, "type=job.enqueued", 2).await;
    let ids: Vec<_> = events.iter().map(|e| e["data"]["job_id"].clone()).collect();
    assert_eq!(ids, [json!(first), json!(second)]);
    // The earlier consumer is removed, and the leadership's own one went on after its floor.
    feed_past(&stream, floor).await;
}
