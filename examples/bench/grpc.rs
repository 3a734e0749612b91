//! The gateway over its gRPC binding: producers calling `Enqueue`, workers on
//! `StreamJobs` settling each job with `Ack`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use ojs_jetstream::grpc::pb;
use ojs_jetstream::grpc::pb::ojs_service_client::OjsServiceClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::Channel;
use tonic::Request;

use crate::drivers::{micros, produce, record_error, Tally};
use crate::flags::fail;
use crate::scenarios::Load;

/// HTTP/2 connections the producers and workers share, round robin: one connection is
/// one task on each side, which would cap the rate.
const CONNECTIONS: usize = 8;
/// How long a stream may bring nothing before its worker stops.
const IDLE: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub struct GrpcGateway {
    clients: Vec<OjsServiceClient<Channel>>,
    /// `x-ojs-api-key` when `OJS_API_KEY` is set (a gateway with API keys).
    key: Option<MetadataValue<Ascii>>,
}

impl GrpcGateway {
    pub async fn connect(url: &str) -> GrpcGateway {
        let mut clients = Vec::with_capacity(CONNECTIONS);
        for _ in 0..CONNECTIONS {
            let channel = Channel::from_shared(url.to_owned())
                .unwrap_or_else(|e| fail(&format!("--grpc {url}: {e}")))
                .connect()
                .await
                .unwrap_or_else(|e| fail(&format!("no gRPC gateway answers at {url}: {e}")));
            clients.push(OjsServiceClient::new(channel));
        }
        let key = std::env::var("OJS_API_KEY")
            .ok()
            .filter(|k| !k.is_empty())
            .map(|k| {
                k.parse()
                    .unwrap_or_else(|_| fail("OJS_API_KEY is no header value"))
            });
        GrpcGateway { clients, key }
    }

    /// `message` as a call, with the API key when there is one.
    fn call<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        if let Some(key) = &self.key {
            request.metadata_mut().insert("x-ojs-api-key", key.clone());
        }
        request
    }

    fn client(&self, n: usize) -> OjsServiceClient<Channel> {
        self.clients[n % self.clients.len()].clone()
    }

    /// `Enqueue` of `load.jobs` jobs, each carrying `[index, enqueue time]` as args.
    pub async fn enqueue(&self, queue: &str, load: Load, clock: Instant, tally: Arc<Tally>) {
        let gw = self.clone();
        let queue = queue.to_owned();
        produce(
            load.jobs,
            1,
            load.producers,
            load.pace,
            tally,
            move |first, _| {
                let (mut client, queue, gw) = (gw.client(first), queue.clone(), gw.clone());
                Box::pin(async move {
                    let number = |n: u64| prost_types::Value {
                        kind: Some(prost_types::value::Kind::NumberValue(n as f64)),
                    };
                    let request = pb::EnqueueRequest {
                        r#type: "bench.job".into(),
                        args: vec![number(first as u64), number(micros(clock))],
                        options: Some(pb::EnqueueOptions {
                            queue,
                            ..Default::default()
                        }),
                    };
                    client
                        .enqueue(gw.call(request))
                        .await
                        .map(drop)
                        .map_err(|e| e.to_string())
                })
            },
        )
        .await;
    }

    /// `workers` streams of one job at a time, each job acknowledged when it arrives,
    /// until `target` jobs are done or the streams stay idle; the enqueue → start latencies.
    pub async fn work(
        &self,
        queue: &str,
        workers: usize,
        target: usize,
        clock: Instant,
        tally: Arc<Tally>,
    ) -> Vec<u64> {
        let tasks: Vec<_> = (0..workers)
            .map(|w| {
                let (mut client, tally, queue) = (self.client(w), tally.clone(), queue.to_owned());
                let gw = self.clone();
                tokio::spawn(async move {
                    let mut latencies = Vec::new();
                    let request = pb::StreamJobsRequest {
                        queues: vec![queue],
                        worker_id: format!("bench-stream-{w}"),
                        max_concurrent: 1,
                    };
                    let mut stream = match client.stream_jobs(gw.call(request)).await {
                        Ok(stream) => stream.into_inner(),
                        Err(e) => {
                            record_error(&tally, &e.to_string());
                            return latencies;
                        }
                    };
                    while tally.done.load(Ordering::Relaxed) < target {
                        let job = match tokio::time::timeout(IDLE, stream.next()).await {
                            Ok(Some(Ok(job))) => job,
                            Ok(Some(Err(e))) => {
                                record_error(&tally, &e.to_string());
                                break;
                            }
                            Ok(None) | Err(_) => break,
                        };
                        let now = micros(clock);
                        if let Some(prost_types::value::Kind::NumberValue(sent)) =
                            job.args.get(1).and_then(|v| v.kind.clone())
                        {
                            latencies.push(now.saturating_sub(sent as u64));
                        }
                        let ack = pb::AckRequest {
                            job_id: job.id,
                            result: None,
                        };
                        match client.ack(gw.call(ack)).await {
                            Ok(_) => {
                                tally.done.fetch_add(1, Ordering::Relaxed);
                                let mut last = tally.last_done.lock().unwrap();
                                *last = Some(Instant::now());
                            }
                            Err(e) => record_error(&tally, &e.to_string()),
                        }
                    }
                    latencies
                })
            })
            .collect();
        futures::future::join_all(tasks)
            .await
            .into_iter()
            .flat_map(Result::unwrap_or_default)
            .collect()
    }
}
