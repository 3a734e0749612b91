//! A three-node NATS cluster with every stream at three replicas under steady load through
//! two gateways: nodes killed with SIGKILL (the stream leader of the jobs bucket, then of
//! the busiest queue), and a node cut off from the other two with a gateway that only
//! reaches it.

use crate::common;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::load::{self, Seen};
use common::{spawn_app_with, test_config, NatsCluster, TestApp};
use ojs_jetstream::config::Config;

/// Kills the leader of `stream` with SIGKILL, keeps the load on for `down`, restarts it.
async fn kill_leader(cluster: &Mutex<NatsCluster>, stream: &str, down: Duration) -> Instant {
    let url = cluster.lock().unwrap().url();
    let leader = common::stream_leader(&url, stream).await;
    let killed = Instant::now();
    cluster.lock().unwrap().node(&leader).kill();
    println!("killed {leader}, the leader of {stream}");
    tokio::time::sleep(down).await;
    tokio::task::block_in_place(|| cluster.lock().unwrap().node(&leader).restart());
    killed
}

/// A started three-node cluster, or `None` (the test skips itself) on nats-server 2.9:
/// there a write's expected revision is checked only before it is proposed, so across a
/// stream leader change two claims of one revision can both land (architecture §6, "NATS
/// clusters before 2.10"). Also shows the gateways' warnings when a test fails.
async fn cluster_keeping_claims_exclusive() -> Option<NatsCluster> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("warn")
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_a_node_of_three_loses_no_accepted_job_and_runs_none_twice() {
    let Some(cluster) = cluster_keeping_claims_exclusive().await else {
        return;
    };
    let a = gateway(cluster.url()).await;
    let b = gateway(cluster.url()).await;
    let cluster = Mutex::new(cluster);
    let seen = Mutex::new(Seen::default());

    let kills = load::through_faults(&a, &b, &seen, async {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let first = kill_leader(&cluster, "KV_ojs-jobs", Duration::from_secs(5)).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let second = kill_leader(&cluster, "ojs-q-busy", Duration::from_secs(5)).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        [first, second]
    })
    .await;

    load::describe_unfinished(&seen, &a).await;
    let seen = seen.lock().unwrap();
    seen.report(&kills, Duration::from_secs(8));
    seen.check(Duration::from_secs(12));
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

    load::describe_unfinished(&seen, &b).await;
    let seen = seen.lock().unwrap();
    seen.report(&[cut], Duration::from_secs(12));
    seen.check(Duration::from_secs(12));
}
