//! Job metrics (events seed §7 and observability spec §8) at `/metrics`: cluster totals
//! reported by the leader alone, so that summing over every replica counts each job once — across a failover too.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{dead_letter_a_job, eventually, spawn_app, NatsServer, TestApp};
use serde_json::json;

/// One scrape: `name{labels}` (labels sorted by name) → value.
type Scrape = BTreeMap<String, f64>;

fn parse(text: &str) -> Scrape {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("a sample line");
            let key = match series.split_once('{') {
                Some((name, labels)) => {
                    let mut labels: Vec<&str> = labels.trim_end_matches('}').split(',').collect();
                    labels.sort_unstable();
                    format!("{name}{{{}}}", labels.join(","))
                }
                None => series.to_owned(),
            };
            (key, value.parse().expect("a number"))
        })
        .collect()
}

/// The sum of `series` over every gateway's scrape (absent counts as 0).
fn total(scrapes: &[Scrape], series: &str) -> f64 {
    scrapes.iter().filter_map(|s| s.get(series)).sum()
}

async fn scrape(gateways: &[&TestApp]) -> Vec<Scrape> {
    let mut out = Vec::new();
    for g in gateways {
        out.push(parse(&g.metrics().await));
    }
    out
}

/// What the workload below must show, summed over the replicas.
const EXPECTED: [(&str, f64); 29] = [
    (
        r#"ojs_job_enqueued_total{queue="mail",type="mail.send"}"#,
        10.0,
    ),
    (
        r#"ojs_job_started_total{queue="mail",type="mail.send"}"#,
        9.0,
    ),
    (
        r#"ojs_job_completed_total{queue="mail",type="mail.send"}"#,
        6.0,
    ),
    (
        r#"ojs_job_retried_total{queue="mail",type="mail.send"}"#,
        2.0,
    ),
    (
        r#"ojs_job_cancelled_total{queue="mail",type="mail.send"}"#,
        1.0,
    ),
    (
        r#"ojs_job_failed_total{queue="mail",type="mail.send"}"#,
        0.0,
    ),
    (r#"ojs_job_enqueued_total{queue="bounces",type="t.d"}"#, 1.0),
    (r#"ojs_job_failed_total{queue="bounces",type="t.d"}"#, 1.0),
    (
        r#"ojs_job_dead_lettered_total{queue="bounces",type="t.d"}"#,
        1.0,
    ),
    (
        r#"ojs_job_discarded_total{queue="bounces",type="t.d"}"#,
        1.0,
    ),
    (
        r#"ojs_job_duration_seconds_count{queue="mail",state="completed",type="mail.send"}"#,
        6.0,
    ),
    (
        r#"ojs_job_duration_seconds_count{queue="mail",state="retryable",type="mail.send"}"#,
        2.0,
    ),
    (
        r#"ojs_job_queue_time_seconds_count{queue="mail",type="mail.send"}"#,
        9.0,
    ),
    (r#"ojs_queue_jobs{queue="mail",state="completed"}"#, 6.0),
    (r#"ojs_queue_jobs{queue="mail",state="retryable"}"#, 2.0),
    (r#"ojs_queue_jobs{queue="mail",state="active"}"#, 1.0),
    (r#"ojs_queue_jobs{queue="mail",state="cancelled"}"#, 1.0),
    (r#"ojs_queue_jobs{queue="mail",state="available"}"#, 0.0),
    (r#"ojs_workers_busy{queue="mail"}"#, 1.0),
    // The events seed's names: `job_type`, one duration histogram over every attempt.
    (
        r#"ojs_jobs_enqueued_total{job_type="mail.send",queue="mail"}"#,
        10.0,
    ),
    (
        r#"ojs_jobs_completed_total{job_type="mail.send",queue="mail"}"#,
        6.0,
    ),
    (
        r#"ojs_jobs_failed_total{job_type="mail.send",queue="mail"}"#,
        0.0,
    ),
    (
        r#"ojs_jobs_failed_total{job_type="t.d",queue="bounces"}"#,
        1.0,
    ),
    (
        r#"ojs_jobs_duration_ms_count{job_type="mail.send",queue="mail"}"#,
        8.0,
    ),
    (
        r#"ojs_jobs_wait_ms_count{job_type="mail.send",queue="mail"}"#,
        9.0,
    ),
    (r#"ojs_queue_depth{queue="mail"}"#, 0.0),
    (r#"ojs_queue_active{queue="mail"}"#, 1.0),
    (r#"ojs_dead_letter_depth{queue="bounces"}"#, 1.0),
    (r#"ojs_dead_letter_depth{queue="mail"}"#, 0.0),
];

fn mismatches(scrapes: &[Scrape]) -> Vec<String> {
    EXPECTED
        .iter()
        .filter(|(series, want)| total(scrapes, series) != *want)
        .map(|(series, want)| format!("{series}: {} (want {want})", total(scrapes, series)))
        .collect()
}

#[tokio::test]
async fn job_totals_through_two_gateways_are_exact_and_survive_a_failover() {
    let nats = NatsServer::start();
    let a = spawn_app(&nats.url).await;
    let b = spawn_app(&nats.url).await;
    let gateways = [&a, &b];
    // Before any job: a leader is elected and its scrape has the gauges only.
    let empty = eventually(Duration::from_secs(10), "a leader", || async {
        let s = scrape(&gateways).await;
        (total(&s, "ojs_leader") == 1.0).then_some(s)
    })
    .await;
    assert_eq!(total(&empty, "ojs_workers_active"), 0.0);
    assert_eq!(total(&empty, "ojs_event_publisher_lag"), 0.0);

    // mail.send: 10 enqueued (alternating gateways), 9 fetched, 6 acked, 2 failed with
    // retries left (an hour away), 1 left active, the last one cancelled.
    let mut ids = Vec::new();
    for i in 0..10 {
        let job = json!({"type": "mail.send", "args": [i], "options": {
            "queue": "mail", "retry": {"max_attempts": 3, "initial_interval": "PT1H"}}});
        ids.push(gateways[i % 2].enqueue(job).await);
    }
    let mut fetched = Vec::new();
    for i in 0..9 {
        let jobs = gateways[i % 2].fetch(&["mail"], "w-1").await;
        fetched.push(jobs[0]["id"].as_str().unwrap().to_owned());
    }
    for (i, id) in fetched.iter().enumerate().take(6) {
        let r = gateways[i % 2].ack(json!({"job_id": id})).await;
        assert_eq!(r.body["state"], "completed", "{}", r.body);
    }
    for (i, id) in fetched[6..8].iter().enumerate() {
        let r = gateways[i % 2]
            .fail(json!({"job_id": id, "error": {"code": "smtp", "message": "busy"}}))
            .await;
        assert_eq!(r.body["state"], "retryable", "{}", r.body);
    }
    let last = ids.iter().find(|id| !fetched.contains(id)).unwrap();
    let r = b.delete(&format!("/ojs/v1/jobs/{last}")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    // t.d on bounces: fails its only attempt into the dead letter queue.
    dead_letter_a_job(&a, "bounces").await;

    let scrapes = eventually(Duration::from_secs(10), "exact job totals", || async {
        let scrapes = scrape(&gateways).await;
        mismatches(&scrapes).is_empty().then_some(scrapes)
    })
    .await;
    let leaders: Vec<_> = scrapes
        .iter()
        .map(|s| s.get("ojs_leader").copied())
        .collect();
    assert!(
        leaders == [Some(1.0), Some(0.0)] || leaders == [Some(0.0), Some(1.0)],
        "one leader: {leaders:?}"
    );
    let follower = &scrapes[usize::from(leaders[0] == Some(1.0))];
    assert!(
        !follower
            .keys()
            .any(|k| EXPECTED.iter().any(|(series, _)| k == series)),
        "only the leader reports job metrics"
    );
    let busy = &scrapes[usize::from(leaders[1] == Some(1.0))];
    assert_eq!(busy["ojs_event_publisher_lag"], 0.0);
    assert!(
        busy["ojs_timers_pending"] >= 2.0,
        "two retries wait on timers"
    );
    // The bucket bounds are cumulative and end at the count.
    let completed = |le: &str| {
        busy[&format!(
            r#"ojs_job_duration_seconds_bucket{{le="{le}",queue="mail",state="completed",type="mail.send"}}"#
        )]
    };
    assert!(completed("0.005") <= completed("300"));
    assert_eq!(completed("300"), 6.0, "every ack came within seconds");
    let attempt_ms = |le: &str| {
        busy[&format!(
            r#"ojs_jobs_duration_ms_bucket{{job_type="mail.send",le="{le}",queue="mail"}}"#
        )]
    };
    assert!(attempt_ms("5") <= attempt_ms("300000"));
    assert_eq!(
        attempt_ms("300000"),
        8.0,
        "every attempt ended within seconds"
    );

    // The leader stops: the other replica takes over and reports the same totals, not
    // counted again and not starting from zero.
    let (leader, other) = if leaders[0] == Some(1.0) {
        (a, b)
    } else {
        (b, a)
    };
    leader.stop().await;
    let after = eventually(
        Duration::from_secs(15),
        "totals after the failover",
        || async {
            let s = scrape(&[&other]).await;
            (s[0].get("ojs_leader") == Some(&1.0)).then_some(s)
        },
    )
    .await;
    assert_eq!(mismatches(&after), Vec::<String>::new());
}
