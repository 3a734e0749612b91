//! A three-node NATS cluster with every stream at three replicas under steady load through
//! two gateways: each node killed with SIGKILL in turn, each stopped and started in turn
//! (a rolling restart), and a node cut off from the other two with a gateway that only
//! reaches it.

use crate::common;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::load::{self, Seen};
use common::{spawn_app_with, test_config, NatsCluster, TestApp};
use ojs_jetstream::config::Config;

/// A started three-node cluster, or `None` (the test skips itself) on nats-server 2.9:
/// there a write's expected revision is checked only before it is proposed, so across a
/// stream leader change two claims of one revision can both land (architecture §6, "NATS
/// clusters before 2.10"). Also shows the gateways' warnings (`RUST_LOG`, default warn)
/// when a test fails.
async fn cluster_keeping_claims_exclusive() -> Option<NatsCluster> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
    let cluster = NatsCluster::start().await;
    if common::nats_version(&cluster.url()).await < (2, 10) {
        println!("skipped: a cluster of nats-server 2.9 cannot keep claims exclusive");
        return None;
    }
    Some(cluster)
}

/// A gateway on `nats_url` with every stream at three replicas, under the load's
/// reservation.
async fn gateway(nats_url: String) -> TestApp {
    spawn_app_with(Config {
        nats_url,
        replicas: 3,
        visibility_timeout_ms: load::VISIBILITY_MS,
        ..test_config("")
    })
    .await
}

/// The longest a request under the load may take: the request deadline (10 s by default)
/// plus a FETCH's wait (0.3 s) and a little.
const SLOWEST: Duration = Duration::from_millis(10_800);

/// How a node leaves the cluster.
#[derive(Clone, Copy, Debug)]
enum Leaving {
    /// SIGKILL, 5 s down: a crash.
    Killed,
    /// SIGTERM, started again at once: a rolling restart.
    Stopped,
}

/// Takes each node out and back in turn under the load through two gateways, the next
/// once every replica is current again (as a rolling operation does): every accepted job
/// runs once, and every request waits out the stream leader elections within its deadline
/// (none fails). Skipped on nats-server 2.9, whose clusters keep neither
/// claims exclusive nor their elections within the deadline (architecture §6 item 18).
async fn each_node_in_turn(leaving: Leaving) {
    let Some(cluster) = cluster_keeping_claims_exclusive().await else {
        return;
    };
    let a = gateway(cluster.url()).await;
    let b = gateway(cluster.url()).await;
    let cluster = Mutex::new(cluster);
    let seen = Mutex::new(Seen::default());

    let faults = load::through_faults(&a, &b, &seen, async {
        let mut at = Vec::new();
        for node in ["n1", "n2", "n3"] {
            tokio::time::sleep(Duration::from_secs(3)).await;
            at.push(Instant::now());
            match leaving {
                Leaving::Killed => {
                    cluster.lock().unwrap().node(node).kill();
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
                Leaving::Stopped => {
                    tokio::task::block_in_place(|| cluster.lock().unwrap().node(node).stop());
                }
            }
            tokio::task::block_in_place(|| cluster.lock().unwrap().node(node).restart());
            println!(
                "{node} {leaving:?} and back after {:?}",
                at.last().unwrap().elapsed()
            );
            let current = wait_current(&cluster).await;
            println!("every replica current {current:?} after {node} was back");
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        at
    })
    .await;

    let url = cluster.lock().unwrap().url();
    load::describe_unfinished(&seen, &a, &url).await;
    let seen = seen.lock().unwrap();
    seen.report(&faults, Duration::from_secs(10));
    seen.report_latencies();
    seen.check_none_failed();
    seen.check(SLOWEST);
}

/// How long after a node's return every replica was current again.
async fn wait_current(cluster: &Mutex<NatsCluster>) -> Duration {
    let started = Instant::now();
    let url = cluster.lock().unwrap().url();
    NatsCluster::wait_current_at(&url).await;
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_killed_in_turn_fails_no_request_and_loses_no_job() {
    each_node_in_turn(Leaving::Killed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_fails_no_request_and_loses_no_job() {
    each_node_in_turn(Leaving::Stopped).await;
}

/// A network partition: node n1 is cut off from n2 and n3 for 8 s while gateway `a` can
/// reach only n1 and gateway `b` only the other two. Whatever `a` answers meanwhile is a
/// retryable 503 in time, `b` goes on serving (it takes the lead if `a` had it), and once
/// the partition heals nothing accepted is lost or was run twice at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_cut_off_with_a_minority_node_fails_only_retryably_and_loses_nothing() {
    let Some(mut cluster) = cluster_keeping_claims_exclusive().await else {
        return;
    };
    let minority = cluster.node("n1").url.clone();
    let majority = format!(
        "{},{}",
        cluster.node("n2").url.clone(),
        cluster.node("n3").url.clone()
    );
    let a = gateway(minority).await;
    let b = gateway(majority).await;
    let seen = Mutex::new(Seen::default());

    let cut = load::through_faults(&a, &b, &seen, async {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let cut = Instant::now();
        cluster.isolate("n1");
        println!("cut n1 off from n2 and n3");
        tokio::time::sleep(Duration::from_secs(8)).await;
        cluster.heal("n1");
        println!("healed after {:?}", cut.elapsed());
        tokio::time::sleep(Duration::from_secs(3)).await;
        cut
    })
    .await;

    load::describe_unfinished(&seen, &b, &cluster.url()).await;
    let seen = seen.lock().unwrap();
    seen.report(&[cut], Duration::from_secs(12));
    seen.check(Duration::from_secs(12));
}
