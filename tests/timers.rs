//! The scheduler's memory bound (architecture §3.5): NAK-with-delay as JetStream does it,
//! far timers handed back yet firing on time, redelivered timers held once, and the cap on
//! timers clients can create. Run one at a time: they measure lateness.

use crate::common;

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull, AckKind};
use bytes::Bytes;
use chrono::Utc;
use common::{eventually, spawn_app, spawn_app_with, test_config, ts, NatsServer};
use futures::{StreamExt, TryStreamExt};
use ojs_jetstream::config::Config;
use serde_json::json;

fn at(from_now_ms: i64) -> String {
    (Utc::now() + chrono::Duration::milliseconds(from_now_ms))
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// A metric's value on the app's `/metrics` (0 when absent would hide a missing metric).
async fn metric(app: &common::TestApp, name: &str) -> i64 {
    let text = app.metrics().await;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no metric {name}"))
        .trim()
        .parse::<f64>()
        .unwrap() as i64
}

async fn timers_in_stream(nats: &NatsServer) -> u64 {
    let client = async_nats::connect(nats.url.as_str()).await.unwrap();
    let js = jetstream::new(client);
    let stream = js.get_stream("ojs-timers").await.unwrap();
    stream.cached_info().state.messages
}

/// The scheduler's mechanism, checked on the server itself: a NAK with a delay is confirmed
/// when sent as a request, and redelivers after the delay (not at the 24 h AckWait).
#[tokio::test]
async fn nak_with_a_delay_redelivers_after_the_delay_on_a_long_ack_wait() {
    let _measuring = common::measuring();
    let nats = NatsServer::start();
    let client = async_nats::connect(nats.url.as_str()).await.unwrap();
    let js = jetstream::new(client.clone());
    let stream = js
        .create_stream(jetstream::stream::Config {
            name: "naks".into(),
            subjects: vec!["naks".into()],
            retention: jetstream::stream::RetentionPolicy::WorkQueue,
            ..Default::default()
        })
        .await
        .unwrap();
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("c".into()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(24 * 3600),
            max_ack_pending: 10_000_000,
            ..Default::default()
        })
        .await
        .unwrap();
    let delays = [300u64, 1000, 3000];
    for d in delays {
        js.publish("naks", d.to_string().into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let mut messages = consumer.messages().await.unwrap();
    let mut naked = std::collections::HashMap::new();
    for _ in delays {
        let msg = messages.next().await.unwrap().unwrap();
        let d: u64 = std::str::from_utf8(&msg.payload).unwrap().parse().unwrap();
        let reply = msg.reply.clone().unwrap();
        client
            .request(
                reply,
                Bytes::from(AckKind::Nak(Some(Duration::from_millis(d)))),
            )
            .await
            .expect("the server confirms a NAK sent as a request");
        naked.insert(d, Instant::now());
    }
    let mut lateness = Vec::new();
    for _ in delays {
        let msg = tokio::time::timeout(Duration::from_secs(10), messages.next())
            .await
            .expect("redelivered within 10 s")
            .unwrap()
            .unwrap();
        let d: u64 = std::str::from_utf8(&msg.payload).unwrap().parse().unwrap();
        let late = naked[&d].elapsed().as_millis() as i64 - d as i64;
        assert_eq!(msg.info().unwrap().delivered, 2);
        lateness.push((d, late));
        msg.ack().await.unwrap();
    }
    println!("NAK delay → redelivery, lateness in ms by delay: {lateness:?}");
    for (d, late) in lateness {
        assert!(
            (-5..=100).contains(&late),
            "a {d} ms NAK delay redelivered {late} ms off"
        );
    }
}

/// A job scheduled beyond the horizon is not held by the leader, and still reaches a waiting
/// worker within 100 ms of its time.
#[tokio::test]
async fn jobs_due_beyond_the_horizon_are_not_held_yet_run_on_time() {
    let _measuring = common::measuring();
    let nats = NatsServer::start();
    let app = spawn_app_with(Config {
        timer_horizon_ms: 1000,
        ..test_config(&nats.url)
    })
    .await;
    for i in 0..10 {
        app.enqueue(json!({"type": "t.s", "args": [i], "options": {"queue": "far", "scheduled_at": at(4000 + 100 * i)}}))
            .await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        metric(&app, "ojs_timers_handed_back_total").await,
        10,
        "the leader handed the far timers back"
    );
    assert_eq!(metric(&app, "ojs_timers_held").await, 0, "nothing held yet");
    assert_eq!(timers_in_stream(&nats).await, 10, "all still in the stream");

    let lateness = common::lateness_to_a_waiting_worker(&app, "far", 10).await;
    println!("handed-back scheduled job → waiting worker: {lateness:?} ms");
    assert!(lateness[0] >= 0, "a job came before its time");
    assert!(lateness[9] <= 100, "{} ms late", lateness[9]);
    eventually(Duration::from_secs(5), "timers acknowledged", || async {
        (timers_in_stream(&nats).await == 0).then_some(())
    })
    .await;
}

/// A timer redelivered while held (AckWait, here shortened to 1 s on the leader's consumer)
/// stays one entry, fires once and is settled by the latest delivery's ack.
#[tokio::test]
async fn a_redelivered_timer_is_held_once() {
    let _measuring = common::measuring();
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let id = app
        .enqueue(json!({"type": "t.s", "args": [], "options": {"queue": "again", "scheduled_at": at(6000)}}))
        .await;
    eventually(Duration::from_secs(5), "the timer held", || async {
        (metric(&app, "ojs_timers_held").await == 1).then_some(())
    })
    .await;
    let client = async_nats::connect(nats.url.as_str()).await.unwrap();
    let js = jetstream::new(client);
    let stream = js.get_stream("ojs-timers").await.unwrap();
    // The leadership's consumer, `scheduler-<term>`: the only one.
    let names: Vec<String> = stream.consumer_names().try_collect().await.unwrap();
    let [name] = &names[..] else {
        panic!("one timer consumer: {names:?}")
    };
    assert!(name.starts_with("scheduler-"), "{name}");
    let mut config = stream.consumer_info(name).await.unwrap().config;
    config.ack_wait = Duration::from_secs(1);
    stream.update_consumer(config).await.unwrap();
    eventually(Duration::from_secs(5), "redeliveries", || async {
        let info = stream.consumer_info(name).await.unwrap();
        (info.delivered.consumer_sequence >= 3).then_some(())
    })
    .await;
    assert_eq!(metric(&app, "ojs_timers_held").await, 1, "held once");
    let job = eventually(Duration::from_secs(8), "the job promoted", || async {
        let job = app.job(&id).await;
        (job["state"] == "available").then_some(job)
    })
    .await;
    assert!(ts(&job["enqueued_at"]) >= ts(&job["scheduled_at"]));
    eventually(Duration::from_secs(5), "the timer acknowledged", || async {
        (timers_in_stream(&nats).await == 0).then_some(())
    })
    .await;
    assert_eq!(metric(&app, "ojs_timers_held").await, 0);
}

/// A timer delivery lost on the way (`timers.delivered=lose(1)`: the first delivery is
/// dropped, as one in flight on a connection or at a consumer leader that went down) is
/// not left for the AckWait of over two minutes: the next delivery's consumer sequence
/// shows the gap, and the scheduler reads every pending timer again. Both jobs are promoted
/// on time.
#[tokio::test]
async fn a_timer_delivery_lost_on_the_way_comes_again_once_the_next_one_shows_the_gap() {
    let _measuring = common::measuring();
    let nats = NatsServer::start();
    let app = spawn_app_with(Config {
        failpoints: "timers.delivered=lose(1)".into(),
        ..test_config(&nats.url)
    })
    .await;
    let lost = app
        .enqueue(json!({"type": "t.s", "args": [1], "options": {"queue": "lost", "scheduled_at": at(1500)}}))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let next = app
        .enqueue(json!({"type": "t.s", "args": [2], "options": {"queue": "lost", "scheduled_at": at(1500)}}))
        .await;
    for id in [lost, next] {
        let job = eventually(Duration::from_secs(5), "the job promoted", || async {
            let job = app.job(&id).await;
            (job["state"] == "available").then_some(job)
        })
        .await;
        let late = ts(&job["enqueued_at"]) - ts(&job["scheduled_at"]);
        assert!(
            (0..=1000).contains(&late.num_milliseconds()),
            "promoted {late:?} after its time"
        );
    }
}

/// The last timer delivery lost on the way (`timers.delivered=lose(1)` and one timer): no
/// later delivery shows the gap, so the consumer's count of deliveries, read while the
/// feed is quiet, does. The job is promoted within the two quiet probes (2 s apart), not
/// after the AckWait of over two minutes.
#[tokio::test]
async fn the_last_timer_delivery_lost_on_the_way_comes_again_once_the_feed_is_quiet() {
    let _measuring = common::measuring();
    let nats = NatsServer::start();
    let app = spawn_app_with(Config {
        failpoints: "timers.delivered=lose(1)".into(),
        ..test_config(&nats.url)
    })
    .await;
    let id = app
        .enqueue(json!({"type": "t.s", "args": [1], "options": {"queue": "lostlast", "scheduled_at": at(1000)}}))
        .await;
    let job = eventually(Duration::from_secs(10), "the job promoted", || async {
        let job = app.job(&id).await;
        (job["state"] == "available").then_some(job)
    })
    .await;
    let late = ts(&job["enqueued_at"]) - ts(&job["scheduled_at"]);
    assert!(
        (0..=5000).contains(&late.num_milliseconds()),
        "promoted {late:?} after its time"
    );
}

/// Past `max_pending_timers`, PUSH of a job needing a timer gets 429 `queue_full` and writes
/// nothing; jobs needing none, retries and worker timers still go through.
#[tokio::test]
async fn scheduling_past_the_cap_is_refused_and_system_timers_still_work() {
    let _measuring = common::measuring();
    let nats = NatsServer::start();
    let app = spawn_app_with(Config {
        max_pending_timers: 3,
        ..test_config(&nats.url)
    })
    .await;
    for i in 0..3 {
        app.enqueue(json!({"type": "t.s", "args": [i], "options": {"queue": "capped", "scheduled_at": at(3_600_000)}}))
            .await;
    }
    // The count PUSH checks is at most a second old.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let id = "019539a4-aaaa-7000-8000-222222222222";
    for body in [
        json!({"type": "t.s", "args": [], "id": id, "options": {"queue": "capped", "scheduled_at": at(3_600_000)}}),
        json!({"type": "t.s", "args": [], "id": id, "options": {"queue": "capped", "expires_at": at(3_600_000)}}),
    ] {
        let r = app.post("/ojs/v1/jobs", body).await;
        r.assert_error(429, "queue_full");
        assert_eq!(r.body["error"]["retryable"], true, "{}", r.body);
        assert_eq!(r.header("retry-after"), "1");
        assert_eq!(r.body["error"]["details"]["max_pending_timers"], 3);
    }
    let batch = json!({"jobs": [
        {"type": "t.s", "args": [], "options": {"queue": "capped"}},
        {"type": "t.s", "args": [], "id": id, "options": {"queue": "capped", "scheduled_at": at(3_600_000)}},
    ]});
    app.post("/ojs/v1/jobs/batch", batch)
        .await
        .assert_error(429, "queue_full");
    assert_eq!(app.get(&format!("/ojs/v1/jobs/{id}")).await.status, 404);
    assert_eq!(timers_in_stream(&nats).await, 3, "nothing written");

    // A job needing no timer is admitted; its retry timer and a worker's are not refused.
    let job = app
        .enqueue(json!({"type": "t.s", "args": [], "options": {"queue": "capped", "retry": {"max_attempts": 3, "initial_interval": "PT0.5S", "jitter": false}}}))
        .await;
    let got = app.fetch(&["capped"], "w").await;
    assert_eq!(got[0]["id"], job.as_str());
    let r = app
        .post(
            "/ojs/v1/workers/heartbeat",
            json!({"worker_id": "w", "active_jobs": [&job]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = app
        .nack(json!({"job_id": job, "error": {"code": "e", "message": "again"}}))
        .await;
    assert_eq!(r.body["state"], "retryable", "{}", r.body);
    assert!(
        timers_in_stream(&nats).await >= 5,
        "retry and worker timers stored past the cap"
    );
    eventually(Duration::from_secs(5), "the retry promoted", || async {
        (app.job(&job).await["state"] == "available").then_some(())
    })
    .await;
}

/// A failover hands every far timer back again: measures it for 100,000.
#[tokio::test]
async fn a_new_leader_hands_a_hundred_thousand_far_timers_back() {
    let _measuring = common::measuring();
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let client = async_nats::connect(nats.url.as_str()).await.unwrap();
    let js = jetstream::new(client);
    let due = at(3_600_000);
    let n = 100_000;
    let mut acks = Vec::with_capacity(1000);
    for i in 0..n {
        let body = json!({"id": format!("nobody-{i}"), "kind": "promote", "dispatch": 0, "attempt": 0, "due": due});
        acks.push(
            js.publish("ojs.timers", serde_json::to_vec(&body).unwrap().into())
                .await
                .unwrap(),
        );
        if acks.len() == 1000 {
            for ack in acks.drain(..) {
                ack.await.unwrap();
            }
        }
    }
    for ack in acks.drain(..) {
        ack.await.unwrap();
    }
    eventually(Duration::from_secs(60), "all handed back", || async {
        (metric(&app, "ojs_timers_handed_back_total").await >= n).then_some(())
    })
    .await;
    // The failover: a new leader recreates the consumer and sees them all again.
    let started = Instant::now();
    app.stop().await;
    let next = spawn_app(&nats.url).await;
    eventually(Duration::from_secs(60), "all handed back again", || async {
        (metric(&next, "ojs_timers_handed_back_total").await >= n).then_some(())
    })
    .await;
    println!(
        "failover with {n} far timers: all handed back again {} ms after the old leader stopped",
        started.elapsed().as_millis()
    );
    assert_eq!(metric(&next, "ojs_timers_held").await, 0);
    assert_eq!(timers_in_stream(&nats).await, n as u64);
}

/// A PUSH publishes a scheduled job's promote timer before it creates the record, and may
/// take longer than the schedule in between (here held 1.5 s, as waiting out a NATS
/// election does): the timer, due first, finds no record and must be fired again, not
/// dropped — else the job stays scheduled for good.
#[tokio::test]
async fn a_scheduled_job_whose_record_comes_after_its_due_time_is_still_promoted() {
    let nats = NatsServer::start();
    let app = spawn_app_with(Config {
        failpoints: "enqueue.published=delay(1500)".into(),
        ..test_config(&nats.url)
    })
    .await;
    let job = json!({"type": "t.late", "args": [], "options": {"queue": "slow-push", "scheduled_at": at(300)}});
    let id = app.enqueue(job).await;
    eventually(Duration::from_secs(5), "the job promoted", || async {
        (app.job(&id).await["state"] == "available").then_some(())
    })
    .await;
}

/// A FAIL stores its retry timer before it writes the job `retryable`, and that write may
/// land after the timer is due (here held 2.5 s, as waiting out a NATS election does; a
/// replica answering from before the write looks the same). The firing finds the job still
/// running the failed attempt: behind the timer, not moved on from it — it must fire again,
/// not be spent, else the job stays `retryable` for good.
#[tokio::test]
async fn a_retry_whose_failure_lands_after_its_timer_is_due_still_runs() {
    let nats = NatsServer::start();
    let app = spawn_app_with(Config {
        failpoints: "transition.prepared=delay(2500)".into(),
        ..test_config(&nats.url)
    })
    .await;
    let id = app
        .enqueue(
            json!({"type": "t.slowfail", "args": [], "options": {"queue": "slow-fail",
            "retry": {"max_attempts": 2, "initial_interval": "PT0.1S", "jitter": false}}}),
        )
        .await;
    assert_eq!(app.fetch(&["slow-fail"], "w").await.len(), 1);
    let failed = Instant::now();
    let r = app
        .fail(json!({"job_id": id, "error": {"type": "Boom", "message": "once"}}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        failed.elapsed() >= Duration::from_millis(2500),
        "the timer was due before the write"
    );
    assert_eq!(app.job(&id).await["state"], "retryable");
    let job = eventually(Duration::from_secs(8), "the retry promoted", || async {
        let job = app.job(&id).await;
        (job["state"] == "available").then_some(job)
    })
    .await;
    assert_eq!(job["attempt"], 1, "{job}");
}
