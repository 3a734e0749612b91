//! The leader's services stepped one round at a time (`run_once`), by a test that holds the
//! coordinator lease itself: the gateway beside it serves requests but never leads, so every
//! round the test sees is one the test ran, with no service timer waited on.

use crate::common;

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use common::{eventually, job_on, spawn_app_with, test_config, NatsServer, TestApp};
use futures::StreamExt;
use ojs_jetstream::config::Config;
use ojs_jetstream::coordinator::{
    CronScheduler, EventPublisher, Pruner, Pulse, QueueBounds, Round, SlotSweeper, TimerScheduler,
};
use ojs_jetstream::store::Store;
use ojs_jetstream::telemetry::metrics::Metrics;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

/// A store of its own on `config` and the coordinator lease held by the test (its term),
/// then a gateway that therefore never leads while the test runs.
async fn without_a_leader(config: Config) -> (Store, TestApp, u64) {
    let config = Config {
        // Longer than any test here: the lease is taken once and not renewed.
        lease_ttl_ms: 60_000,
        ..config
    };
    let store = Store::connect(&config).await.unwrap();
    let mut lease = store.leases().contender("coordinator", "the test");
    let term = lease.try_hold().await.expect("the test holds the lease");
    let app = spawn_app_with(config).await;
    (store, app, term)
}

/// PUSHes a job on `queue` scheduled a second ahead (its promote timer); its id.
async fn enqueue_due_in_a_second(app: &TestApp, queue: &str) -> String {
    let r = app
        .post(
            "/ojs/v1/jobs",
            json!({"type": "later.t", "args": [1], "options": {"queue": queue, "scheduled_at": "+PT1S"}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["job"]["state"], "scheduled");
    r.body["job"]["id"].as_str().unwrap().to_owned()
}

/// Awaits a service's round, which must handle something (`what`) within 5 s.
async fn handled_within_5s(round: impl std::future::Future<Output = Round>, what: &str) {
    let round = tokio::time::timeout(Duration::from_secs(5), round)
        .await
        .unwrap_or_else(|_| panic!("no round within 5 s: {what}"));
    assert_eq!(round, Round::Handled, "{what}");
}

/// Every job `queue` holds now, claimed at once (no long poll).
async fn claim_all(app: &TestApp, queue: &str) -> Vec<Value> {
    let r = app
        .post(
            "/ojs/v1/workers/fetch",
            json!({"queues": [queue], "worker_id": "w", "count": 10, "wait_ms": 0}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.body["jobs"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn a_cron_round_fires_what_is_due_once_and_nothing_early() {
    let nats = NatsServer::start();
    let (store, app, _) = without_a_leader(test_config(&nats.url)).await;
    let r = app
        .post(
            "/ojs/v1/cron",
            json!({"name": "every-second", "expression": "* * * * * *",
                   "job_template": {"type": "tick", "args": [], "options": {"queue": "ticks"}}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let cron = CronScheduler::new(store.clone());
    // The test's store learns of the entry through its mirror of the cron bucket.
    let due: DateTime<Utc> = eventually(Duration::from_secs(5), "the entry", || async {
        store.cron().list().first().and_then(|e| e.next_run_at)
    })
    .await;
    // A leader would fire the tick as it comes due; there is none.
    let until_due = (due - Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(until_due + Duration::from_millis(300)).await;
    assert!(
        claim_all(&app, "ticks").await.is_empty(),
        "a leader fired it"
    );

    // Two rounds at once: the first fires the tick that came due, the second finds the
    // entry's next tick a second away and fires nothing.
    let wait = cron.run_once().await;
    cron.run_once().await;
    assert!(wait <= Duration::from_secs(1), "{wait:?}");
    let fired = claim_all(&app, "ticks").await;
    assert_eq!(fired.len(), 1, "{fired:?}");
    assert_eq!(fired[0]["type"], "tick");
}

#[tokio::test]
async fn a_queue_bounds_round_announces_a_queue_past_its_warning_level_once() {
    let nats = NatsServer::start();
    let (store, app, _) = without_a_leader(test_config(&nats.url)).await;
    let r = app
        .put(
            "/ojs/v1/admin/queues/bp/config",
            json!({"backpressure": {"max_depth": 4, "warning_threshold": 0.5}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    for i in 0..3 {
        let r = app
            .post(
                "/ojs/v1/jobs",
                json!({"type": "bp.t", "args": [i], "options": {"queue": "bp"}}),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.body);
    }
    let warnings = || async {
        app.get("/ojs/v1/events?types=backpressure.warning&queues=bp")
            .await
            .body["events"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    assert!(warnings().await.is_empty(), "no leader announced it");

    // Rounds until the test's store has learnt of the bound through its queue registry.
    let mut bounds = QueueBounds::new(store.clone(), Metrics::new());
    let deadline = Instant::now() + Duration::from_secs(5);
    let announced = loop {
        bounds.run_once().await;
        let found = warnings().await;
        if !found.is_empty() {
            break found;
        }
        assert!(Instant::now() < deadline, "no warning after 5 s of rounds");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(announced.len(), 1, "{announced:?}");
    assert_eq!(announced[0]["data"]["depth"], 3, "{announced:?}");
    // A crossing is announced once: another round says nothing new.
    bounds.run_once().await;
    assert_eq!(warnings().await.len(), 1);
}

#[tokio::test]
async fn an_event_publisher_round_publishes_and_counts_the_writes_it_reads() {
    let nats = NatsServer::start();
    let (store, app, term) = without_a_leader(test_config(&nats.url)).await;
    let r = app
        .post(
            "/ojs/v1/jobs",
            json!({"type": "ev.t", "args": [1], "options": {"queue": "ev"}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let id = r.body["job"]["id"].as_str().unwrap().to_owned();
    let events = || async {
        app.get("/ojs/v1/events?queues=ev").await.body["events"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    assert!(events().await.is_empty(), "no leader published it");

    let mut publisher = EventPublisher::new(store.clone(), Metrics::new(), None, term);
    let mut feed = publisher.open().await.unwrap();
    let (cancel, pulse) = (CancellationToken::new(), Pulse::default());
    handled_within_5s(
        publisher.run_once(&mut feed, &cancel, &pulse),
        "the write of the PUSH makes a round",
    )
    .await;
    let published = events().await;
    assert_eq!(published.len(), 1, "{published:?}");
    assert_eq!(published[0]["type"], "job.enqueued");
    assert_eq!(published[0]["subject"], id.as_str());
    // The round counted the write: the queue's statistics answer without waiting.
    let stats = app.get("/ojs/v1/queues/ev/stats").await;
    assert_eq!(stats.status, 200, "{}", stats.body);
    assert_eq!(stats.body["stats"]["available"], 1, "{}", stats.body);

    // The leadership ends: a waiting round says so instead of waiting on.
    cancel.cancel();
    let round = publisher.run_once(&mut feed, &cancel, &pulse).await;
    assert_eq!(round, Round::Cancelled);
}

#[tokio::test]
async fn timer_scheduler_rounds_take_a_schedule_in_and_fire_it_when_due() {
    let nats = NatsServer::start();
    let (store, app, term) = without_a_leader(test_config(&nats.url)).await;
    let id = enqueue_due_in_a_second(&app, "later").await;

    let scheduler = TimerScheduler::new(store.clone(), Metrics::new(), term, Pulse::default());
    let (cancel, pulse) = (CancellationToken::new(), Pulse::default());
    let mut feed = scheduler.open(&cancel).await.unwrap();
    // The first round takes the job's timer in and holds it: not due yet, nothing fired.
    handled_within_5s(
        scheduler.run_once(&mut feed, &cancel, &pulse),
        "the PUSH's timer is delivered",
    )
    .await;
    assert_eq!(
        app.get(&format!("/ojs/v1/jobs/{id}")).await.body["job"]["state"],
        "scheduled"
    );
    // Rounds until it is due and fired (each waits for the next thing to do, no longer).
    let started = Instant::now();
    while app.get(&format!("/ojs/v1/jobs/{id}")).await.body["job"]["state"] != "available" {
        assert!(started.elapsed() < Duration::from_secs(5), "never fired");
        let round = tokio::time::timeout(
            Duration::from_millis(200),
            scheduler.run_once(&mut feed, &cancel, &pulse),
        )
        .await;
        assert!(round.is_err() || round == Ok(Round::Handled), "{round:?}");
    }
    assert_eq!(claim_all(&app, "later").await.len(), 1);
    cancel.cancel();
    assert_eq!(
        scheduler.run_once(&mut feed, &cancel, &pulse).await,
        Round::Cancelled
    );
}

/// Each leadership reads the timers through a consumer of its own term. A later one's
/// opening removes the earlier one's: a pull the earlier feed still has open cannot take a
/// timer from its successor, and the earlier leadership can open no feed again (the
/// timers stream, a work queue, allows one consumer).
#[tokio::test]
async fn timer_feeds_are_fenced_by_the_leadership_term() {
    let nats = NatsServer::start();
    let (store, app, term) = without_a_leader(test_config(&nats.url)).await;
    let (cancel, pulse) = (CancellationToken::new(), Pulse::default());
    let earlier = TimerScheduler::new(store.clone(), Metrics::new(), term, Pulse::default());
    let mut earlier_feed = earlier.open(&cancel).await.unwrap();
    let later = TimerScheduler::new(store.clone(), Metrics::new(), term + 1, Pulse::default());
    let mut later_feed = later.open(&cancel).await.unwrap();
    assert!(
        earlier.open(&cancel).await.is_err(),
        "an earlier leadership opened its feed again"
    );

    enqueue_due_in_a_second(&app, "fenced").await;
    handled_within_5s(
        later.run_once(&mut later_feed, &cancel, &pulse),
        "the later leadership gets the timer",
    )
    .await;
    let stale = tokio::time::timeout(
        Duration::from_secs(2),
        earlier.run_once(&mut earlier_feed, &cancel, &pulse),
    )
    .await;
    assert!(stale.is_err() || stale == Ok(Round::Closed), "{stale:?}");
}

/// A timer delivered to a scheduler that stopped without firing it (a leader stepping down
/// holding it, or a pull request of its feed that outlived it and met the consumer its
/// successor made) is delivered again to whoever reads the timer consumer after the
/// consumer's AckWait — twice the horizon plus 5 s — not after a day.
#[tokio::test]
async fn a_timer_delivered_to_a_scheduler_that_stopped_comes_back_within_the_ack_wait() {
    let nats = NatsServer::start();
    let horizon = Duration::from_millis(1000);
    let (store, app, term) = without_a_leader(Config {
        timer_horizon_ms: horizon.as_millis() as u64,
        ..test_config(&nats.url)
    })
    .await;
    let scheduler = TimerScheduler::new(store.clone(), Metrics::new(), term, Pulse::default());
    let (cancel, pulse) = (CancellationToken::new(), Pulse::default());
    let mut feed = scheduler.open(&cancel).await.unwrap();
    let id = enqueue_due_in_a_second(&app, "held").await;
    // The scheduler takes the timer in and holds it, then stops before it is due.
    handled_within_5s(
        scheduler.run_once(&mut feed, &cancel, &pulse),
        "the PUSH's timer is delivered",
    )
    .await;
    let delivered = Instant::now();
    drop(feed);
    drop(scheduler);

    // A reader of the same consumer, as the successor's feed is, gets it again.
    let js = async_nats::jetstream::new(async_nats::connect(&nats.url).await.unwrap());
    let consumer: async_nats::jetstream::consumer::PullConsumer = js
        .get_consumer_from_stream(format!("scheduler-{term}"), "ojs-timers")
        .await
        .unwrap();
    let ack_wait = 2 * horizon + Duration::from_secs(5);
    let mut again = consumer
        .fetch()
        .max_messages(1)
        .expires(ack_wait + Duration::from_secs(5))
        .messages()
        .await
        .unwrap();
    let msg = again.next().await.expect("delivered again").unwrap();
    let timer: Value = serde_json::from_slice(&msg.payload).unwrap();
    assert_eq!(timer["id"], id.as_str());
    assert!(
        delivered.elapsed() < ack_wait + Duration::from_secs(2),
        "after {:?}",
        delivered.elapsed()
    );
}

#[tokio::test]
async fn pruner_rounds_prune_a_finished_job_once_aged_and_only_behind_the_publisher() {
    let nats = NatsServer::start();
    let (store, app, term) = without_a_leader(test_config(&nats.url)).await;
    let finish = |queue: &'static str| {
        let app = &app;
        async move {
            let id = app.enqueue(job_on(queue)).await;
            assert_eq!(app.fetch(&[queue], "w").await.len(), 1);
            let r = app.ack(json!({"job_id": id})).await;
            assert_eq!(r.status, 200, "{}", r.body);
            id
        }
    };
    let exists = |id: String| {
        let app = &app;
        async move { app.get(&format!("/ojs/v1/jobs/{id}")).await.status == 200 }
    };
    let max_age = Duration::from_secs(2);
    let mut pruner = Pruner::new(store.clone(), max_age, term);

    // Aged, but no event of it is stored yet: a round keeps it.
    let old = finish("pr-old").await;
    tokio::time::sleep(max_age).await;
    pruner.run_once().await;
    assert!(
        exists(old.clone()).await,
        "pruned before its events were stored"
    );

    // Another job finishes; the publisher's rounds store the events of both, until it has
    // nothing in hand (a round can publish the next batch ahead of that batch's books).
    let young = finish("pr-young").await;
    let young_finished = Instant::now();
    let mut publisher = EventPublisher::new(store.clone(), Metrics::new(), None, term);
    let mut feed = publisher.open().await.unwrap();
    let (cancel, pulse) = (CancellationToken::new(), Pulse::default());
    let started = Instant::now();
    loop {
        let _ = tokio::time::timeout(
            Duration::from_millis(100),
            publisher.run_once(&mut feed, &cancel, &pulse),
        )
        .await;
        let events = app.get("/ojs/v1/events?queues=pr-old,pr-young").await.body["events"].clone();
        if events.as_array().map_or(0, Vec::len) == 6 && pulse.working_for().is_none() {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "{events}");
    }

    // Rounds prune the aged job and stop at the young one, asking to wait for it.
    let mut rounds = 0;
    let pause = loop {
        rounds += 1;
        assert!(rounds <= 10, "not pruned after {rounds} rounds");
        let pause = pruner.run_once().await;
        if !exists(old.clone()).await {
            break pause;
        }
        tokio::time::sleep(pause.min(Duration::from_millis(100))).await;
    };
    assert!(
        young_finished.elapsed() < max_age,
        "the young job aged meanwhile"
    );
    assert!(exists(young.clone()).await, "pruned before it aged");
    assert!(
        pause > Duration::ZERO && pause <= max_age,
        "{pause:?} until the young job is due"
    );
}

#[tokio::test]
async fn slot_sweeper_rounds_free_only_a_place_no_job_holds_once_past_the_grace() {
    let nats = NatsServer::start();
    let (store, app, _) = without_a_leader(Config {
        // The grace is a FETCH's longest wait and two of these.
        nats_timeout_ms: 1000,
        ..test_config(&nats.url)
    })
    .await;
    let limited = json!({"type": "t.x", "args": [], "options": {"queue": "two", "rate_limit": {"concurrency": 2}}});
    let (first, second) = (
        app.enqueue(limited.clone()).await,
        app.enqueue(limited).await,
    );
    // The running place of a claim that died before its record write, and a real claim.
    let js = async_nats::jetstream::new(async_nats::connect(&nats.url).await.unwrap());
    let orphan = json!({"id": "019539a4-0000-7000-8000-000000000000", "dispatch": 1});
    js.publish("ojs.slot.two", orphan.to_string().into())
        .await
        .unwrap()
        .await
        .unwrap();
    let taken = Instant::now();
    let claimed = claim_all(&app, "two").await;
    assert_eq!(claimed.len(), 1, "the orphan holds one of the two places");
    assert_eq!(claimed[0]["id"], first.as_str());

    let sweeper = SlotSweeper::new(store.clone());
    // The test's store learns of the limit through its mirror of the queue registry.
    eventually(Duration::from_secs(5), "the limit", || async {
        store.leader().concurrency_limited_queues().first().cloned()
    })
    .await;
    assert_eq!(sweeper.run_once().await, 0, "freed within the grace");
    let grace = store.leader().slot_grace();
    tokio::time::sleep(grace.saturating_sub(taken.elapsed())).await;
    // Past the grace: the orphan's place is freed, the running job's is not.
    assert_eq!(sweeper.run_once().await, 1);
    assert_eq!(sweeper.run_once().await, 0);
    let claimed = claim_all(&app, "two").await;
    assert_eq!(claimed.len(), 1, "{claimed:?}");
    assert_eq!(claimed[0]["id"], second.as_str());
}

/// The statistics history: samples taken a minute apart (by the leader's service, here
/// called for past minutes) become per-period points of jobs enqueued, completed and
/// failed, overall and per queue.
#[tokio::test]
async fn stats_history_points_count_what_happened_between_samples() {
    use chrono::{DurationRound, TimeDelta};
    use ojs_jetstream::coordinator::StatsHistory;
    let nats = NatsServer::start();
    let config = test_config(&nats.url);
    let app = spawn_app_with(config.clone()).await;
    let store = Store::connect(&config).await.unwrap();
    let mut history = StatsHistory::new(store.clone());
    let t0 = Utc::now().duration_trunc(TimeDelta::minutes(1)).unwrap() - TimeDelta::minutes(5);
    // A first job, counted, then the first sample.
    let one = || json!({"type": "h.t", "args": [], "options": {"queue": "hist", "retry": {"max_attempts": 1}}});
    let first = app.enqueue(one()).await;
    let r = app.get("/ojs/v1/queues/hist/stats").await;
    assert_eq!(r.status, 200, "{}", r.body);
    history.run_once(t0).await.unwrap();
    // Three more; two of the four complete, one is discarded.
    let mut ids = vec![first];
    for _ in 0..3 {
        ids.push(app.enqueue(one()).await);
    }
    for n in 0..3 {
        let jobs = app.fetch(&["hist"], "w").await;
        let id = jobs[0]["id"].as_str().unwrap();
        let r = if n < 2 {
            app.ack(json!({"job_id": id})).await
        } else {
            app.nack(json!({"job_id": id, "error": {"code": "e", "message": "no"}}))
                .await
        };
        assert_eq!(r.status, 200, "{}", r.body);
    }
    app.get("/ojs/v1/queues/hist/stats").await;
    history.run_once(t0 + TimeDelta::minutes(1)).await.unwrap();

    let since = ojs_jetstream::domain::time::format(t0);
    let until = ojs_jetstream::domain::time::format(t0 + TimeDelta::minutes(3));
    for queue in ["", "&queue=hist"] {
        let r = app
            .get(&format!(
                "/ojs/v1/admin/stats/history?period=1m&since={since}&until={until}{queue}"
            ))
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.body["period"], "1m");
        let points = r.body["data"].as_array().unwrap();
        assert_eq!(points.len(), 3, "{}", r.body);
        assert_eq!(r.body["data_points"], r.body["data"]);
        let p = &points[1];
        assert_eq!(
            p["timestamp"],
            ojs_jetstream::domain::time::format(t0 + TimeDelta::minutes(1))
        );
        let (enqueued, completed, failed) = (&p["enqueued"], &p["processed"], &p["failed"]);
        assert_eq!(
            (enqueued, completed, failed),
            (&json!(3), &json!(2), &json!(1)),
            "{queue}: {}",
            r.body
        );
        assert_eq!(p["completed"], p["processed"]);
        assert_eq!(p["depth"], 1, "{}", r.body);
        assert_eq!(points[2]["processed"], 0);
        assert_eq!(points[2]["depth"], 1, "the last depth carries on");
    }
    app.get("/ojs/v1/admin/stats/history?period=7m")
        .await
        .assert_error(400, "invalid_request");
    app.stop().await;
}
