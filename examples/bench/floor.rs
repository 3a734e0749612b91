//! The floor: the same NATS server, the gateway's own stream and bucket settings, and only
//! the calls a job cannot do without.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::PullConsumer, kv, stream::StorageType};
use futures::StreamExt;
use ojs_jetstream::config::Config;
use ojs_jetstream::store::Topology;
use serde::{Deserialize, Serialize};

use crate::drivers::{consume, micros, produce, Round, Tally, FETCH_WAIT};
use crate::flags::fail;
use crate::scenarios::{Load, QUEUES};

#[derive(Clone)]
pub struct Floor {
    pub js: jetstream::Context,
    kv: kv::Store,
    topology: Topology,
}

impl Floor {
    pub async fn connect(nats: &str) -> Floor {
        let client = async_nats::connect(nats)
            .await
            .unwrap_or_else(|e| fail(&format!("cannot reach NATS at {nats}: {e}")));
        let js = jetstream::new(client);
        let topology = Topology {
            namespace: format!("benchfloor{}", std::process::id()),
            replicas: 1,
            storage: StorageType::File,
            ack_wait: Config::default().ack_wait(),
            job_history: 5,
            events_max_age: Duration::from_secs(60),
            dead_letter_max_age: Config::default().dead_letter_max_age(),
            dead_letter_max_count: Config::default().dead_letter_max_count,
            lease_ttl: Duration::from_secs(3),
            finished_jobs_max_age: Config::default().finished_jobs_max_age(),
        };
        let bucket = topology.jobs_bucket();
        js.create_stream(topology.bucket_stream(&bucket, topology.job_history, Duration::ZERO))
            .await
            .unwrap_or_else(|e| fail(&format!("cannot create the floor bucket: {e}")));
        let kv = js
            .get_key_value(&bucket)
            .await
            .unwrap_or_else(|e| fail(&format!("cannot open the floor bucket: {e}")));
        Floor { js, kv, topology }
    }

    /// A work-queue stream with the gateway's queue settings, and its consumer.
    pub async fn queue(&self, name: &str) -> PullConsumer {
        let stream = self
            .js
            .create_stream(self.topology.queue_stream_config(name))
            .await
            .unwrap_or_else(|e| fail(&format!("cannot create a floor queue: {e}")));
        stream
            .create_consumer(self.topology.priority_consumer_config(name, 0))
            .await
            .unwrap_or_else(|e| fail(&format!("cannot create a floor consumer: {e}")))
    }

    /// KV create of the record, then an acknowledged publish that names its revision.
    pub async fn enqueue(&self, queue: &str, load: Load, clock: Instant, tally: Arc<Tally>) {
        let floor = self.clone();
        let queue = queue.to_owned();
        produce(
            load.jobs,
            load.batch,
            load.producers,
            load.pace,
            tally,
            move |first, n| {
                let (floor, queue) = (floor.clone(), queue.clone());
                Box::pin(async move {
                    for i in first..first + n {
                        let sent = micros(clock);
                        let id = uuid::Uuid::now_v7().to_string();
                        let record = floor_record(&id, &queue, i, sent, "available");
                        let revision = floor
                            .kv
                            .create(&id, record.into())
                            .await
                            .map_err(|e| e.to_string())?;
                        let body = serde_json::to_vec(&FloorMessage { id, revision, sent })
                            .map_err(|e| e.to_string())?;
                        floor
                            .js
                            .publish(floor.topology.queue_subject(&queue, 0), body.into())
                            .await
                            .map_err(|e| e.to_string())?
                            .await
                            .map_err(|e| e.to_string())?;
                    }
                    Ok(())
                })
            },
        )
        .await;
    }

    /// Fetch (one pull request for `count`), then per job: CAS the record to active, ack
    /// the message, CAS the record to completed.
    pub async fn work(
        &self,
        queue: &str,
        count: usize,
        workers: usize,
        target: usize,
        clock: Instant,
        tally: Arc<Tally>,
    ) -> Vec<u64> {
        let consumer = self.queue(queue).await;
        let floor = self.clone();
        let queue = queue.to_owned();
        consume(workers, target, tally, move |_| {
            let (floor, consumer, queue) = (floor.clone(), consumer.clone(), queue.clone());
            Box::pin(async move {
                let mut round = Round::default();
                // A waiting pull: each message is processed as it arrives; the pull ends
                // when `count` came or after `FETCH_WAIT`.
                let pull = consumer.batch().max_messages(count).expires(FETCH_WAIT);
                let mut messages = match pull.messages().await {
                    Ok(batch) => batch,
                    Err(e) => {
                        round.errors.push(e.to_string());
                        return round;
                    }
                };
                while let Some(msg) = messages.next().await {
                    let now = micros(clock);
                    let msg = match msg {
                        Ok(msg) => msg,
                        Err(e) => {
                            round.errors.push(e.to_string());
                            continue;
                        }
                    };
                    round.fetched += 1;
                    match floor.process(&queue, &msg).await {
                        Ok(sent) => {
                            round.latencies.push(now.saturating_sub(sent));
                            round.complete();
                        }
                        Err(e) => round.errors.push(e),
                    }
                }
                round
            })
        })
        .await
    }

    /// Returns the job's enqueue time.
    async fn process(&self, queue: &str, msg: &jetstream::Message) -> Result<u64, String> {
        let FloorMessage { id, revision, sent } =
            serde_json::from_slice(&msg.payload).map_err(|e| e.to_string())?;
        let id = id.as_str();
        let active = floor_record(id, queue, 0, 0, "active");
        let revision = self
            .kv
            .update(id, active.into(), revision)
            .await
            .map_err(|e| e.to_string())?;
        msg.ack().await.map_err(|e| e.to_string())?;
        let done = floor_record(id, queue, 0, 0, "completed");
        self.kv
            .update(id, done.into(), revision)
            .await
            .map_err(|e| e.to_string())?;
        Ok(sent)
    }

    pub async fn clean_up(&self) {
        let mut names = vec![format!("KV_{}", self.topology.jobs_bucket())];
        names.extend(QUEUES.iter().map(|q| self.topology.queue_stream(q)));
        for name in names {
            let _ = self.js.delete_stream(name).await;
        }
    }
}

/// A record of the size and shape the gateway stores for a bench job. Written out directly
/// (ids, queue names and states need no escaping), so the floor's client does no more work
/// than a job needs, as the benchmark's HTTP client does for the gateway.
pub fn floor_record(id: &str, queue: &str, i: usize, sent: u64, state: &str) -> Vec<u8> {
    format!(
        r#"{{"job":{{"specversion":"1.0","id":"{id}","type":"bench.job","queue":"{queue}","args":[{i},{sent}],"state":"{state}","priority":0,"attempt":0,"max_attempts":3,"created_at":"2026-01-01T00:00:00.000Z","enqueued_at":"2026-01-01T00:00:00.000Z","retry":{{"max_attempts":3,"initial_interval":"PT1S","backoff_coefficient":2.0,"max_interval":"PT5M","jitter":true,"non_retryable_errors":[]}}}},"dispatch":1,"transition":"created"}}"#
    )
    .into_bytes()
}

/// The floor's queue message: the job, its record's revision and its enqueue time.
#[derive(Serialize, Deserialize)]
pub struct FloorMessage {
    id: String,
    revision: u64,
    sent: u64,
}
