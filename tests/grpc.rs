//! The gRPC binding through its public surface: a tonic client generated from the same
//! `.proto`, against a gateway on a real nats-server, with HTTP beside it on the same store.

use crate::common;

use std::time::{Duration, Instant};

use common::{
    dead_letter_a_job, eventually, spawn_app, spawn_app_with, test_config, NatsServer, TestApp,
};
use futures::StreamExt;
use ojs_jetstream::config::{Config, KeyList};
use ojs_jetstream::grpc::pb;
use ojs_jetstream::grpc::pb::ojs_service_client::OjsServiceClient;
use serde_json::json;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};
use tonic_types::StatusExt;

async fn client(app: &TestApp) -> OjsServiceClient<Channel> {
    let addr = app.grpc_addr.expect("a gateway this test started");
    OjsServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("the gRPC listener answers")
}

fn text(s: &str) -> prost_types::Value {
    prost_types::Value {
        kind: Some(prost_types::value::Kind::StringValue(s.into())),
    }
}

fn enqueue_on(queue: &str) -> pb::EnqueueRequest {
    pb::EnqueueRequest {
        r#type: "grpc.job".into(),
        args: vec![
            text("a"),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::NumberValue(1.0)),
            },
        ],
        options: Some(pb::EnqueueOptions {
            queue: queue.into(),
            ..Default::default()
        }),
    }
}

/// The OJS code a status carries in its `ErrorInfo` (§8), after checking the domain.
fn reason(status: &Status) -> String {
    let info = status
        .get_details_error_info()
        .unwrap_or_else(|| panic!("no ErrorInfo in {status:?}"));
    assert_eq!(info.domain, "openjobspec.org");
    info.reason
}

#[tokio::test]
async fn a_job_enqueued_over_one_protocol_is_worked_over_the_other() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let mut grpc = client(&app).await;

    // gRPC in, HTTP out.
    let job = grpc
        .enqueue(enqueue_on("cross"))
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    assert_eq!(job.state, pb::JobState::Available as i32);
    let over_http = app.job(&job.id).await;
    assert_eq!(
        over_http["args"],
        json!(["a", 1]),
        "a whole number stays an integer"
    );
    let fetched = app.fetch(&["cross"], "w-http").await;
    assert_eq!(fetched[0]["id"], job.id.as_str());
    let acked = grpc
        .ack(pb::AckRequest {
            job_id: job.id.clone(),
            result: Some(prost_types::Struct::default()),
        })
        .await
        .unwrap();
    assert!(acked.into_inner().acknowledged);
    assert_eq!(app.job(&job.id).await["state"], "completed");

    // HTTP in, gRPC out, and a failure reported over gRPC.
    let id = app.enqueue(common::job_on("cross")).await;
    let jobs = grpc
        .fetch(pb::FetchRequest {
            queues: vec!["cross".into()],
            count: 5,
            worker_id: "w-grpc".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .jobs;
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].id, id);
    assert_eq!(jobs[0].state, pb::JobState::Active as i32);
    assert_eq!(jobs[0].attempt, 1);
    let nacked = grpc
        .nack(pb::NackRequest {
            job_id: id.clone(),
            error: Some(pb::JobError {
                code: "boom".into(),
                message: "it broke".into(),
                retryable: true,
                backtrace: "at a\nat b".into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(nacked.state, pb::JobState::Retryable as i32);
    assert!(nacked.next_attempt_at.is_some());
    let after = app.job(&id).await;
    assert_eq!(after["error"]["code"], "boom");
    assert_eq!(after["error"]["backtrace"], json!(["at a", "at b"]));
    let info = grpc
        .get_job(pb::GetJobRequest { job_id: id.clone() })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    assert_eq!(info.errors.len(), 1);
    assert_eq!(info.errors[0].message, "it broke");
}

#[tokio::test]
async fn errors_carry_the_bindings_status_and_the_ojs_code_and_answers_the_metadata() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let mut grpc = client(&app).await;

    let mut req = Request::new(pb::EnqueueRequest::default());
    req.metadata_mut()
        .insert("x-ojs-request-id", "req-42".parse().unwrap());
    let err = grpc.enqueue(req).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert_eq!(reason(&err), "invalid_request");
    let info = err.get_details_error_info().unwrap();
    assert_eq!(info.metadata["request_id"], "req-42");
    assert_eq!(info.metadata["retryable"], "false");
    assert_eq!(
        err.get_details_bad_request().unwrap().field_violations[0].field,
        "type"
    );

    let missing = "019539a4-b68c-7def-8000-1a2b3c4d5e6f";
    let err = grpc
        .get_job(pb::GetJobRequest {
            job_id: missing.into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(reason(&err), "not_found");
    let err = grpc
        .get_job(pb::GetJobRequest {
            job_id: "../x".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    let available = grpc
        .enqueue(enqueue_on("errs"))
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    let err = grpc
        .activate_job(pb::ActivateJobRequest {
            job_id: available.id,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");

    let mut req = Request::new(enqueue_on("errs"));
    req.metadata_mut()
        .insert("x-ojs-request-id", "req-43".parse().unwrap());
    let ok = grpc.enqueue(req).await.unwrap();
    assert_eq!(ok.metadata().get("x-ojs-request-id").unwrap(), "req-43");
    assert_eq!(ok.metadata().get("x-ojs-conformance-level").unwrap(), "4");
    assert!(ok.metadata().get("x-ojs-server-version").is_some());
}

#[tokio::test]
async fn hostile_messages_get_invalid_argument_or_resource_exhausted_never_internal() {
    let nats = NatsServer::start();
    let app = spawn_app_with(Config {
        max_body_bytes: 64 * 1024,
        max_job_bytes: 64 * 1024,
        ..test_config(&nats.url)
    })
    .await;
    let mut grpc = client(&app).await;

    let mut big = enqueue_on("hostile");
    big.args = vec![text(&"x".repeat(100 * 1024))];
    let err = grpc.enqueue(big).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert_eq!(reason(&err), "envelope_too_large");

    let mut nested = prost_types::Value {
        kind: Some(prost_types::value::Kind::NumberValue(1.0)),
    };
    for _ in 0..80 {
        nested = prost_types::Value {
            kind: Some(prost_types::value::Kind::ListValue(
                prost_types::ListValue {
                    values: vec![nested],
                },
            )),
        };
    }
    let mut deep = enqueue_on("hostile");
    deep.args = vec![nested];
    let err = grpc.enqueue(deep).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");

    let mut nan = enqueue_on("hostile");
    nan.args = vec![prost_types::Value {
        kind: Some(prost_types::value::Kind::NumberValue(f64::NAN)),
    }];
    assert_eq!(
        grpc.enqueue(nan).await.unwrap_err().code(),
        Code::InvalidArgument
    );

    let negative = pb::EnqueueRequest {
        options: Some(pb::EnqueueOptions {
            timeout: Some(prost_types::Duration {
                seconds: -5,
                nanos: 0,
            }),
            ..Default::default()
        }),
        ..enqueue_on("hostile")
    };
    assert_eq!(
        grpc.enqueue(negative).await.unwrap_err().code(),
        Code::InvalidArgument
    );

    // Bytes that are no `EnqueueRequest` at all (field 1 claims more bytes than follow).
    let err = raw_unary(
        &app,
        "/ojs.v1.OJSService/Enqueue",
        vec![0x0a, 0xff, 0x01, 0x41],
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert_eq!(reason(&err), "invalid_payload");

    let err = grpc
        .stream_jobs(pb::StreamJobsRequest {
            queues: vec!["hostile".into()],
            worker_id: "w".into(),
            max_concurrent: -1,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    // The gateway still serves.
    grpc.enqueue(enqueue_on("hostile")).await.unwrap();
}

/// Sends `body` as the message of `path` with no schema behind it.
async fn raw_unary(app: &TestApp, path: &'static str, body: Vec<u8>) -> Result<(), Status> {
    let channel = Channel::from_shared(format!("http://{}", app.grpc_addr.unwrap()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    grpc.unary::<_, (), _>(
        Request::new(body),
        tonic::codegen::http::uri::PathAndQuery::from_static(path),
        raw::Bytes,
    )
    .await
    .map(drop)
}

/// A codec that sends bytes as they are and reads any answer as nothing.
mod raw {
    use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
    use tonic::Status;

    pub struct Bytes;

    impl Codec for Bytes {
        type Encode = Vec<u8>;
        type Decode = ();
        type Encoder = Bytes;
        type Decoder = Bytes;
        fn encoder(&mut self) -> Bytes {
            Bytes
        }
        fn decoder(&mut self) -> Bytes {
            Bytes
        }
    }

    impl Encoder for Bytes {
        type Item = Vec<u8>;
        type Error = Status;
        fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
            use bytes::BufMut;
            dst.put_slice(&item);
            Ok(())
        }
    }

    impl Decoder for Bytes {
        type Item = ();
        type Error = Status;
        fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<()>, Status> {
            use bytes::Buf;
            src.advance(src.remaining());
            Ok(Some(()))
        }
    }
}

const API_KEY: &str = "0123456789abcdef0123456789abcdef-grpc-producer";
const ADMIN_KEY: &str = "0123456789abcdef0123456789abcdef-grpc-operator";

#[tokio::test]
async fn api_keys_guard_every_rpc_in_either_header() {
    let nats = NatsServer::start();
    let app = spawn_app_with(Config {
        api_keys: KeyList(vec![API_KEY.into()]),
        admin_api_keys: KeyList(vec![ADMIN_KEY.into()]),
        ..test_config(&nats.url)
    })
    .await;
    let mut grpc = client(&app).await;
    let keyed = |header: &str, value: String| {
        let mut req = Request::new(enqueue_on("keys"));
        req.metadata_mut().insert(
            tonic::metadata::MetadataKey::from_bytes(header.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
        req
    };
    let err = grpc.enqueue(enqueue_on("keys")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert_eq!(reason(&err), "unauthenticated");
    let err = grpc
        .enqueue(keyed("x-ojs-api-key", "not-a-key".into()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    grpc.enqueue(keyed("x-ojs-api-key", API_KEY.into()))
        .await
        .unwrap();
    grpc.enqueue(keyed("authorization", format!("Bearer {API_KEY}")))
        .await
        .unwrap();

    let pause = |key: &str| {
        let mut req = Request::new(pb::PauseQueueRequest {
            queue: "keys".into(),
        });
        req.metadata_mut()
            .insert("x-ojs-api-key", key.parse().unwrap());
        req
    };
    let err = grpc.pause_queue(pause(API_KEY)).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    grpc.pause_queue(pause(ADMIN_KEY)).await.unwrap();
}

#[tokio::test]
async fn a_job_stream_holds_at_most_max_concurrent_and_hands_back_what_it_held_when_it_ends() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let mut grpc = client(&app).await;
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(app.enqueue(common::job_on("streamed")).await);
    }
    let mut stream = grpc
        .stream_jobs(pb::StreamJobsRequest {
            queues: vec!["streamed".into()],
            worker_id: "w-stream".into(),
            max_concurrent: 2,
        })
        .await
        .unwrap()
        .into_inner();
    let first = next_job(&mut stream).await;
    let second = next_job(&mut stream).await;
    assert_eq!(first.state, pb::JobState::Active as i32);
    assert!(
        tokio::time::timeout(Duration::from_millis(800), stream.next())
            .await
            .is_err(),
        "a third job while two are unacknowledged"
    );
    grpc.ack(pb::AckRequest {
        job_id: first.id.clone(),
        result: None,
    })
    .await
    .unwrap();
    let third = next_job(&mut stream).await;
    assert!(![&first.id, &second.id].contains(&&third.id));

    // The worker goes: what it held goes straight back, its attempt not counted.
    let gone = Instant::now();
    drop(stream);
    for id in [&second.id, &third.id] {
        let job = eventually(
            Duration::from_secs(5),
            "the held job back in its queue",
            || async {
                let job = app.job(id).await;
                (job["state"] == "available").then_some(job)
            },
        )
        .await;
        assert_eq!(job["attempt"], 0, "{job}");
    }
    assert!(
        gone.elapsed() < Duration::from_secs(5),
        "took {:?}",
        gone.elapsed()
    );
    assert_eq!(app.job(&first.id).await["state"], "completed");
    let fetched = app.fetch(&["streamed"], "w-next").await;
    assert_eq!(fetched.len(), 1, "the next worker gets one at once");
}

async fn next_job(stream: &mut tonic::Streaming<pb::Job>) -> pb::Job {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("a job within 10 s")
        .expect("the stream open")
        .expect("a job, not an error")
}

#[tokio::test]
async fn a_job_stream_stops_sending_from_a_paused_queue_and_goes_on_when_it_resumes() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let mut grpc = client(&app).await;
    grpc.pause_queue(pb::PauseQueueRequest {
        queue: "paused-stream".into(),
    })
    .await
    .unwrap();
    let id = app.enqueue(common::job_on("paused-stream")).await;
    let mut stream = grpc
        .stream_jobs(pb::StreamJobsRequest {
            queues: vec!["paused-stream".into()],
            worker_id: "w-paused".into(),
            max_concurrent: 1,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        tokio::time::timeout(Duration::from_millis(1500), stream.next())
            .await
            .is_err(),
        "a job from a paused queue"
    );
    grpc.resume_queue(pb::ResumeQueueRequest {
        queue: "paused-stream".into(),
    })
    .await
    .unwrap();
    assert_eq!(next_job(&mut stream).await.id, id);
}

#[tokio::test]
async fn an_event_stream_keeps_to_its_filters_and_resumes_after_the_last_event_seen() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let mut grpc = client(&app).await;
    let mut stream = grpc
        .stream_events(pb::StreamEventsRequest {
            queues: vec!["watched".into()],
            event_types: vec!["job.enqueued".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    app.enqueue(common::job_on("unwatched")).await;
    let first = app.enqueue(common::job_on("watched")).await;
    let second = app.enqueue(common::job_on("watched")).await;
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let event = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("an event within 10 s")
            .unwrap()
            .unwrap();
        if event.r#type == "stream.keepalive" {
            continue;
        }
        assert_eq!(event.r#type, "job.enqueued");
        assert_eq!(event.queue, "watched");
        seen.push(event);
    }
    assert_eq!(seen[0].job_id, first);
    assert_eq!(seen[1].job_id, second);

    let position = seen[0].data.as_ref().unwrap().fields["stream_sequence"].clone();
    let Some(prost_types::value::Kind::NumberValue(position)) = position.kind else {
        panic!("no position in {:?}", seen[0]);
    };
    let mut req = Request::new(pb::StreamEventsRequest {
        queues: vec!["watched".into()],
        event_types: vec!["job.enqueued".into()],
        ..Default::default()
    });
    req.metadata_mut().insert(
        "last-event-id",
        (position as u64).to_string().parse().unwrap(),
    );
    let mut resumed = grpc.stream_events(req).await.unwrap().into_inner();
    let replayed = tokio::time::timeout(Duration::from_secs(10), resumed.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(replayed.job_id, second, "the event after the last one seen");
}

#[tokio::test]
async fn queues_dead_letter_cron_and_workflows_answer_over_grpc() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let mut grpc = client(&app).await;

    let manifest = grpc
        .manifest(pb::ManifestRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(manifest.conformance_level, 4);
    assert!(manifest.protocols.contains(&"grpc".to_string()));
    let health = grpc
        .health(pb::HealthRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(health.status, pb::HealthStatus::Ok as i32);

    // Queues.
    grpc.enqueue(enqueue_on("stats")).await.unwrap();
    let queues = grpc
        .list_queues(pb::ListQueuesRequest::default())
        .await
        .unwrap()
        .into_inner();
    let stats_queue = queues.queues.iter().find(|q| q.name == "stats").unwrap();
    assert!(!stats_queue.paused);
    let stats = eventually(Duration::from_secs(10), "the queue's count", || async {
        let mut grpc = client(&app).await;
        let stats = grpc
            .queue_stats(pb::QueueStatsRequest {
                queue: "stats".into(),
            })
            .await
            .unwrap()
            .into_inner();
        (stats.stats.as_ref()?.available == 1).then_some(stats)
    })
    .await;
    assert_eq!(stats.queue, "stats");

    // Dead letter.
    let dead = dead_letter_a_job(&app, "dlq").await;
    let listed = grpc
        .list_dead_letter(pb::ListDeadLetterRequest {
            queue: "dlq".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.total_count, 1);
    assert_eq!(listed.jobs[0].id, dead);
    let retried = grpc
        .retry_dead_letter(pb::RetryDeadLetterRequest {
            job_id: dead.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    assert_eq!(retried.state, pb::JobState::Available as i32);
    let other = dead_letter_a_job(&app, "dlq2").await;
    grpc.delete_dead_letter(pb::DeleteDeadLetterRequest {
        job_id: other.clone(),
    })
    .await
    .unwrap();
    let err = grpc
        .delete_dead_letter(pb::DeleteDeadLetterRequest { job_id: other })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    // Cron.
    let registered = grpc
        .register_cron(pb::RegisterCronRequest {
            name: "nightly".into(),
            cron: "0 3 * * *".into(),
            timezone: "Europe/Berlin".into(),
            r#type: "report.build".into(),
            args: vec![text("all")],
            options: Some(pb::EnqueueOptions {
                queue: "reports".into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(registered.name, "nightly");
    assert!(registered.next_run_at.is_some());
    let entries = grpc
        .list_cron(pb::ListCronRequest {})
        .await
        .unwrap()
        .into_inner()
        .entries;
    let entry = entries.iter().find(|e| e.name == "nightly").unwrap();
    assert_eq!(entry.r#type, "report.build");
    assert_eq!(entry.timezone, "Europe/Berlin");
    assert_eq!(entry.options.as_ref().unwrap().queue, "reports");
    let err = grpc
        .register_cron(pb::RegisterCronRequest {
            name: "bad".into(),
            cron: "not a schedule".into(),
            r#type: "x".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    grpc.unregister_cron(pb::UnregisterCronRequest {
        name: "nightly".into(),
    })
    .await
    .unwrap();
    let err = grpc
        .unregister_cron(pb::UnregisterCronRequest {
            name: "nightly".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    // Workflows: a chain, read, cancelled.
    let step = |id: &str, after: &[&str]| pb::WorkflowStep {
        id: id.into(),
        r#type: "wf.step".into(),
        args: vec![text(id)],
        depends_on: after.iter().map(|s| s.to_string()).collect(),
        options: Some(pb::EnqueueOptions {
            queue: "wf".into(),
            ..Default::default()
        }),
    };
    let created = grpc
        .create_workflow(pb::CreateWorkflowRequest {
            name: "etl".into(),
            steps: vec![step("extract", &[]), step("load", &["extract"])],
        })
        .await
        .unwrap()
        .into_inner()
        .workflow
        .unwrap();
    assert_eq!(created.state, pb::WorkflowState::Running as i32);
    assert_eq!(created.steps.len(), 2);
    assert_eq!(created.steps[1].depends_on, ["extract"]);
    let fetched = app.fetch(&["wf"], "w").await;
    assert_eq!(fetched.len(), 1, "only the chain's first step runs");
    assert_eq!(fetched[0]["id"], created.steps[0].job_id.as_str());
    let got = grpc
        .get_workflow(pb::GetWorkflowRequest {
            workflow_id: created.id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .workflow
        .unwrap();
    assert_eq!(got.name, "etl");
    let cancelled = grpc
        .cancel_workflow(pb::CancelWorkflowRequest {
            workflow_id: created.id,
            reason: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .workflow
        .unwrap();
    assert_eq!(cancelled.state, pb::WorkflowState::Cancelled as i32);

    // Batch with defaults, all or none.
    let batch = grpc
        .enqueue_batch(pb::EnqueueBatchRequest {
            jobs: vec![
                pb::BatchJobEntry {
                    r#type: "b.one".into(),
                    args: vec![],
                    options: None,
                },
                pb::BatchJobEntry {
                    r#type: "b.two".into(),
                    args: vec![],
                    options: Some(pb::EnqueueOptions {
                        priority: 7,
                        ..Default::default()
                    }),
                },
            ],
            default_options: Some(pb::EnqueueOptions {
                queue: "batched".into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(batch.count, 2);
    assert!(batch.jobs.iter().all(|j| j.queue == "batched"));
    assert_eq!(batch.jobs[1].priority, 7);
    let err = grpc
        .enqueue_batch(pb::EnqueueBatchRequest {
            jobs: vec![
                pb::BatchJobEntry {
                    r#type: "b.ok".into(),
                    ..Default::default()
                },
                pb::BatchJobEntry::default(),
            ],
            default_options: None,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("index 1"), "{}", err.message());
}

#[tokio::test]
async fn a_call_past_the_clients_deadline_answers_deadline_exceeded() {
    let nats = NatsServer::start();
    let app = spawn_app_with(Config {
        failpoints: "enqueue.published=delay(3000)".into(),
        ..test_config(&nats.url)
    })
    .await;
    let mut grpc = client(&app).await;
    let mut req = Request::new(enqueue_on("late"));
    req.set_timeout(Duration::from_millis(500));
    let started = Instant::now();
    let err = grpc.enqueue(req).await.unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    assert!(started.elapsed() < Duration::from_millis(1500));
}

#[tokio::test]
async fn the_standard_health_service_answers_serving() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let channel = Channel::from_shared(format!("http://{}", app.grpc_addr.unwrap()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let answer = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "ojs.v1.OJSService".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        answer.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
}

#[tokio::test]
async fn two_streaming_workers_on_one_queue_share_its_jobs_and_each_holds_at_most_its_share() {
    const JOBS: usize = 200;
    const MAX: usize = 8;
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let batch: Vec<_> = (0..JOBS).map(|_| common::job_on("shared")).collect();
    let r = app
        .post("/ojs/v1/jobs/batch", json!({ "jobs": batch }))
        .await;
    assert_eq!(r.status, 201, "{}", r.body);

    let seen = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let mut workers = Vec::new();
    for w in 0..2 {
        let mut grpc = client(&app).await;
        let seen = seen.clone();
        workers.push(tokio::spawn(async move {
            let mut stream = grpc
                .stream_jobs(pb::StreamJobsRequest {
                    queues: vec!["shared".into()],
                    worker_id: format!("w-{w}"),
                    max_concurrent: MAX as i32,
                })
                .await
                .unwrap()
                .into_inner();
            // Jobs held: acknowledged a moment after they arrive, several at a time.
            let held = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let mut most = 0;
            let mut acks = Vec::new();
            loop {
                let next = tokio::time::timeout(Duration::from_secs(3), stream.next()).await;
                let Ok(Some(Ok(job))) = next else { break };
                let now = held.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                most = most.max(now);
                assert!(
                    seen.lock().unwrap().insert(job.id.clone()),
                    "{} sent twice",
                    job.id
                );
                let mut acker = grpc.clone();
                let held = held.clone();
                acks.push(tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    // Counted free before the ACK is sent: the server may fill the slot
                    // as soon as the ACK lands.
                    held.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    acker
                        .ack(pb::AckRequest {
                            job_id: job.id,
                            result: None,
                        })
                        .await
                        .unwrap();
                }));
            }
            futures::future::join_all(acks).await;
            most
        }));
    }
    for worker in workers {
        let most = worker.await.unwrap();
        assert!(
            most <= MAX,
            "a worker held {most} jobs at once, more than {MAX}"
        );
        assert!(most > 1, "the worker never held several jobs at once");
    }
    assert_eq!(seen.lock().unwrap().len(), JOBS);
    eventually(Duration::from_secs(10), "every job completed", || async {
        let stats = app.get("/ojs/v1/queues/shared/stats").await;
        (stats.body["completed"] == JOBS).then_some(())
    })
    .await;
}

/// A job sent on a stream and acknowledged over HTTP frees its slot too: the stream
/// reads its held jobs again while its slots are full.
#[tokio::test]
async fn a_streamed_job_acknowledged_over_http_frees_its_slot() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let mut grpc = client(&app).await;
    let first = app.enqueue(common::job_on("mixed")).await;
    let second = app.enqueue(common::job_on("mixed")).await;
    let mut stream = grpc
        .stream_jobs(pb::StreamJobsRequest {
            queues: vec!["mixed".into()],
            worker_id: "w-mixed".into(),
            max_concurrent: 1,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next_job(&mut stream).await.id, first);
    let r = app
        .ack(json!({"job_id": first, "result": {"via": "http"}}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(next_job(&mut stream).await.id, second);
}

#[tokio::test]
async fn a_stopping_gateway_ends_its_streams_with_unavailable_and_hands_back_their_jobs() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let mut grpc = client(&app).await;
    let id = app.enqueue(common::job_on("stopping")).await;
    let mut stream = grpc
        .stream_jobs(pb::StreamJobsRequest {
            queues: vec!["stopping".into()],
            worker_id: "w-stopping".into(),
            max_concurrent: 1,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next_job(&mut stream).await.id, id);
    let stopping = tokio::spawn(app.stop());
    let end = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("the stream ends within 10 s");
    match end {
        Some(Err(status)) => assert_eq!(status.code(), Code::Unavailable, "{status:?}"),
        other => panic!("the stream ended with {other:?}"),
    }
    stopping.await.unwrap();
    let other = spawn_app(&nats.url).await;
    let job = other.job(&id).await;
    assert_eq!(job["state"], "available", "{job}");
    assert_eq!(job["attempt"], 0);
}

#[tokio::test]
async fn the_trace_context_of_an_enqueue_is_kept_in_the_jobs_meta_and_the_manifest_names_grpc() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let mut grpc = client(&app).await;
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut req = Request::new(enqueue_on("traced"));
    req.metadata_mut()
        .insert("traceparent", parent.parse().unwrap());
    let job = grpc.enqueue(req).await.unwrap().into_inner().job.unwrap();
    assert_eq!(app.job(&job.id).await["meta"]["traceparent"], parent);

    let manifest = app.get("/ojs/manifest").await;
    assert_eq!(manifest.body["protocols"], json!(["http", "grpc"]));
    assert_eq!(
        manifest.body["endpoints"]["grpc"],
        app.grpc_addr.unwrap().to_string()
    );
}

#[tokio::test]
async fn reflection_lists_the_ojs_service() {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let channel = Channel::from_shared(format!("http://{}", app.grpc_addr.unwrap()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut reflection = ServerReflectionClient::new(channel);
    let ask = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = reflection
        .server_reflection_info(futures::stream::iter([ask]))
        .await
        .unwrap()
        .into_inner();
    let answer = answers.next().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("no service list: {answer:?}");
    };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    assert!(names.contains(&"ojs.v1.OJSService"), "{names:?}");
}

#[tokio::test]
async fn mutual_tls_admits_a_client_with_a_certificate_of_the_ca_and_refuses_one_without() {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};

    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "ojs-jetstream gRPC test CA");
    let ca_key = KeyPair::generate().unwrap();
    let ca_pem = ca_params.self_signed(&ca_key).unwrap().pem();
    let ca = Issuer::new(ca_params, ca_key);
    let signed = |names: Vec<String>| {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = signed(vec!["localhost".into()]);
    let (client_cert, client_key) = signed(vec!["ojs-worker".into()]);
    let files = tempfile::tempdir().unwrap();
    let write = |name: &str, pem: &str| {
        let path = files.path().join(name);
        std::fs::write(&path, pem).unwrap();
        path.display().to_string()
    };
    let nats = NatsServer::start();
    let app = spawn_app_with(Config {
        grpc_tls_cert_file: write("server.pem", &server_cert),
        grpc_tls_key_file: write("server.key", &server_key),
        grpc_tls_client_ca_file: write("ca.pem", &ca_pem),
        ..test_config(&nats.url)
    })
    .await;
    let url = format!("https://{}", app.grpc_addr.unwrap());
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&ca_pem))
        .domain_name("localhost");

    let with_cert = Channel::from_shared(url.clone())
        .unwrap()
        .tls_config(
            tls.clone()
                .identity(Identity::from_pem(&client_cert, &client_key)),
        )
        .unwrap()
        .connect()
        .await
        .unwrap();
    let job = OjsServiceClient::new(with_cert)
        .enqueue(enqueue_on("tls"))
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    assert_eq!(job.queue, "tls");

    let refused = match Channel::from_shared(url.clone())
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
    {
        Err(_) => true,
        Ok(channel) => OjsServiceClient::new(channel)
            .enqueue(enqueue_on("tls"))
            .await
            .is_err(),
    };
    assert!(refused, "a client without a certificate was served");
    let plain = Channel::from_shared(url.replace("https", "http"))
        .unwrap()
        .connect()
        .await;
    let refused = match plain {
        Err(_) => true,
        Ok(channel) => OjsServiceClient::new(channel)
            .enqueue(enqueue_on("tls"))
            .await
            .is_err(),
    };
    assert!(refused, "a plaintext client was served");
}

/// A stream's worker takes its next job about as soon as it acknowledges the last: 100
/// jobs one at a time well within a second (each job waited 40 ms for the client's delayed
/// ACK when the listener left Nagle's algorithm on).
#[tokio::test]
async fn a_streaming_worker_gets_its_next_job_as_soon_as_it_acknowledges_the_last() {
    let _measuring = common::measuring();
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let batch: Vec<_> = (0..100).map(|_| common::job_on("quick")).collect();
    let r = app
        .post("/ojs/v1/jobs/batch", json!({ "jobs": batch }))
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let mut grpc = client(&app).await;
    let mut stream = grpc
        .stream_jobs(pb::StreamJobsRequest {
            queues: vec!["quick".into()],
            worker_id: "w-quick".into(),
            max_concurrent: 1,
        })
        .await
        .unwrap()
        .into_inner();
    let started = Instant::now();
    for _ in 0..100 {
        let job = next_job(&mut stream).await;
        grpc.ack(pb::AckRequest {
            job_id: job.id,
            result: None,
        })
        .await
        .unwrap();
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(1), "100 jobs took {took:?}");
}
