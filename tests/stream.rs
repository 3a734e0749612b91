//! Live events over Server-Sent Events (realtime spec §2, the clients' `/events/stream`):
//! any replica serves any stream, `Last-Event-ID` replays what is still stored (and says
//! what is not), job streams end with their job, shutdown is announced.

use crate::common;

use std::time::Duration;

use common::{spawn_app, NatsServer, TestApp};
use serde_json::{json, Value};

/// One SSE event: `id`, `event`, and `data` as JSON.
#[derive(Debug, Clone)]
struct Sse {
    id: String,
    event: String,
    data: Value,
}

/// Reads events off an open SSE response.
struct SseReader {
    resp: reqwest::Response,
    buf: String,
}

impl SseReader {
    async fn open(app: &TestApp, path: &str, last_event_id: Option<&str>) -> SseReader {
        let mut req = app
            .http
            .get(app.url(path))
            .header("accept", "text/event-stream");
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        SseReader {
            resp,
            buf: String::new(),
        }
    }

    /// The next event with an `event` field; `None` when the stream ends. Panics when none
    /// comes within `within`.
    async fn next(&mut self, within: Duration) -> Option<Sse> {
        tokio::time::timeout(within, async {
            loop {
                if let Some(end) = self.buf.find("\n\n") {
                    let block: String = self.buf.drain(..end + 2).collect();
                    let field = |name: &str| {
                        block
                            .lines()
                            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
                            .map(str::to_owned)
                    };
                    if let Some(event) = field("event") {
                        return Some(Sse {
                            id: field("id").unwrap_or_default(),
                            event,
                            data: serde_json::from_str(&field("data").unwrap()).unwrap(),
                        });
                    }
                    continue;
                }
                match self.resp.chunk().await.unwrap() {
                    Some(bytes) => self.buf.push_str(&String::from_utf8_lossy(&bytes)),
                    None => return None,
                }
            }
        })
        .await
        .expect("an event in time")
    }

    /// Events until (and with) the first that `last` accepts.
    async fn until(&mut self, last: impl Fn(&Sse) -> bool) -> Vec<Sse> {
        let mut seen = Vec::new();
        loop {
            let e = self
                .next(Duration::from_secs(10))
                .await
                .unwrap_or_else(|| panic!("the stream ended after {seen:?}"));
            let done = last(&e);
            seen.push(e);
            if done {
                return seen;
            }
        }
    }
}

fn kinds(events: &[Sse]) -> Vec<&str> {
    events.iter().map(|e| e.event.as_str()).collect()
}

/// Enqueues, fetches and acks a job on `queue` through `app`; its id.
async fn run_one(app: &TestApp, queue: &str) -> String {
    let id = app
        .enqueue(json!({"type": "t.live", "args": [], "options": {"queue": queue}}))
        .await;
    let fetched = app.fetch(&[queue], "w1").await;
    assert_eq!(fetched[0]["id"], id.as_str(), "{fetched:?}");
    let r = app.ack(json!({"job_id": id})).await;
    assert_eq!(r.body["state"], "completed", "{}", r.body);
    id
}

fn is_completed(id: &str) -> impl Fn(&Sse) -> bool + '_ {
    move |e| e.event == "job.state_changed" && e.data["job_id"] == id && e.data["to"] == "completed"
}

#[tokio::test]
async fn a_queue_stream_on_one_replica_carries_live_events_of_jobs_run_through_another() {
    let nats = NatsServer::start();
    let a = spawn_app(&nats.url).await;
    let b = spawn_app(&nats.url).await;
    let mut stream = SseReader::open(&b, "/ojs/v1/events/stream?channel=queue:live", None).await;
    // Another queue's job first: it must not show.
    run_one(&a, "elsewhere").await;
    let id = run_one(&a, "live").await;
    let events = stream.until(is_completed(&id)).await;
    let ours: Vec<&Sse> = events
        .iter()
        .filter(|e| e.data["job_id"] == id.as_str() || e.data["data"]["job_id"] == id.as_str())
        .collect();
    assert_eq!(
        ours.iter().map(|e| e.event.as_str()).collect::<Vec<_>>(),
        [
            "job.enqueued",
            "job.started",
            "job.state_changed",
            "job.completed",
            "job.state_changed"
        ]
    );
    assert!(events
        .iter()
        .all(|e| e.data["queue"] == "live" || e.data["data"]["queue"] == "live"));
    let started = ours[1];
    assert_eq!(
        started.data["type"], "job.started",
        "the stored event, whole"
    );
    assert_eq!(started.data["data"]["worker_id"], "w1");
    assert_eq!(ours[2].data["from"], "available");
    assert_eq!(ours[2].data["to"], "active");
    let ids: Vec<f64> = events.iter().map(|e| e.id.parse().unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids increase: {ids:?}");

    // Filters: one event type, one job.
    let mut only = SseReader::open(
        &a,
        "/ojs/v1/events/stream?channel=queue:live&event_types=job.completed",
        None,
    )
    .await;
    let next = run_one(&b, "live").await;
    let got = only.next(Duration::from_secs(10)).await.unwrap();
    assert_eq!(
        (got.event.as_str(), &got.data["data"]["job_id"]),
        ("job.completed", &json!(next))
    );

    // The `ojs` command line's `events --queue live`: `queue=` is that queue's channel.
    let mut by_queue = SseReader::open(
        &a,
        "/ojs/v1/events/stream?queue=live&event_types=job.completed",
        None,
    )
    .await;
    run_one(&b, "elsewhere").await;
    let mine = run_one(&b, "live").await;
    let got = by_queue.next(Duration::from_secs(10)).await.unwrap();
    assert_eq!(got.data["data"]["job_id"], json!(mine));

    // Bad filters are refused before any stream opens; unknown queues and jobs are 404.
    a.get("/ojs/v1/events/stream?channel=worker:w1")
        .await
        .assert_error(400, "invalid_request");
    a.get("/ojs/v1/events/stream?channel=queue:live&queue=live")
        .await
        .assert_error(400, "invalid_request");
    a.get("/ojs/v1/events/stream?event_types=Not%20A%20Type")
        .await
        .assert_error(400, "invalid_request");
    a.get("/ojs/v1/queues/never-seen/events")
        .await
        .assert_error(404, "not_found");
    // An id from the future (another deployment, a reset) starts the stream now.
    let mut future = SseReader::open(
        &a,
        "/ojs/v1/events/stream?channel=queue:live",
        Some(&u64::MAX.to_string()),
    )
    .await;
    let later = run_one(&b, "live").await;
    let seen = future.until(is_completed(&later)).await;
    assert_eq!(seen[0].event, "job.enqueued");
    a.get("/ojs/v1/jobs/019539a4-b68c-7def-8000-1a2b3c4d5e6f/events")
        .await
        .assert_error(404, "not_found");
}

#[tokio::test]
async fn a_client_reconnecting_with_last_event_id_misses_nothing_still_stored() {
    let nats = NatsServer::start();
    let a = spawn_app(&nats.url).await;
    let b = spawn_app(&nats.url).await;
    let first = run_one(&a, "r").await;
    let mut stream = SseReader::open(&a, "/ojs/v1/events/stream?channel=queue:r", Some("0")).await;
    let seen = stream.until(is_completed(&first)).await;
    assert_eq!(
        seen[0].event, "job.enqueued",
        "from the start: Last-Event-ID 0"
    );
    let last_id = seen.last().unwrap().id.clone();
    drop(stream);

    // While the client is away: a whole job runs.
    let missed = run_one(&a, "r").await;
    // Back, through the other replica: everything after the last id, in order.
    let mut again =
        SseReader::open(&b, "/ojs/v1/events/stream?channel=queue:r", Some(&last_id)).await;
    let replayed = again.until(is_completed(&missed)).await;
    assert_eq!(
        kinds(&replayed),
        [
            "job.enqueued",
            "job.started",
            "job.state_changed",
            "job.completed",
            "job.state_changed"
        ]
    );
    assert!(
        replayed
            .iter()
            .all(|e| e.data["subject"] != first.as_str() && e.data["job_id"] != first.as_str()),
        "nothing twice"
    );

    // Events gone from the stream (retention): the client is told how many it missed,
    // then gets what is still stored.
    let js = async_nats::jetstream::new(async_nats::connect(&nats.url).await.unwrap());
    let mut events = js.get_stream("ojs-events").await.unwrap();
    let last_stored = events.info().await.unwrap().state.last_sequence;
    events.purge().sequence(last_stored).await.unwrap();
    let kept = run_one(&a, "r").await;
    let mut after_gap =
        SseReader::open(&b, "/ojs/v1/events/stream?channel=queue:r", Some(&last_id)).await;
    let gap = after_gap.next(Duration::from_secs(10)).await.unwrap();
    assert_eq!(gap.event, "system.gap");
    assert_eq!(gap.data["channel"], "queue:r");
    let from: u64 = last_id.split('.').next().unwrap().parse().unwrap();
    assert_eq!(
        gap.data["estimated_missed_count"],
        json!(last_stored - from - 1),
        "the purge kept only the last event"
    );
    let rest = after_gap.until(is_completed(&kept)).await;
    assert_eq!(
        rest[0].id,
        last_stored.to_string(),
        "from the oldest event still stored"
    );
    assert!(rest
        .iter()
        .any(|e| e.event == "job.enqueued" && e.data["subject"] == kept.as_str()));
}

#[tokio::test]
async fn a_job_stream_ends_with_its_job_and_shutdown_is_announced() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let id = app
        .enqueue(json!({"type": "t.x", "args": [], "options": {"queue": "j"}}))
        .await;
    let mut stream = SseReader::open(&app, &format!("/ojs/v1/jobs/{id}/events"), None).await;
    app.fetch(&["j"], "w1").await;
    app.put(
        &format!("/ojs/v1/jobs/{id}/progress"),
        json!({"progress": 0.5}),
    )
    .await;
    app.ack(json!({"job_id": id})).await;
    let mut events = stream.until(is_completed(&id)).await;
    // The leader may store the job's first event after the stream opened.
    if events[0].event == "job.enqueued" {
        events.remove(0);
    }
    assert_eq!(
        kinds(&events),
        [
            "job.started",
            "job.state_changed",
            "job.progress",
            "job.completed",
            "job.state_changed"
        ]
    );
    assert_eq!(events[2].data["data"]["progress_percent"], 50.0);
    assert!(
        stream.next(Duration::from_secs(5)).await.is_none(),
        "the stream ends with the job"
    );

    // A finished job: its state, then the end.
    let mut done = SseReader::open(&app, &format!("/ojs/v1/jobs/{id}/events"), None).await;
    let only = done.next(Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        (only.event.as_str(), &only.data["to"]),
        ("job.state_changed", &json!("completed"))
    );
    assert!(done.next(Duration::from_secs(5)).await.is_none());

    // Shutdown: an open stream hears of it and does not hold the gateway up.
    let mut open = SseReader::open(&app, "/ojs/v1/events/stream", None).await;
    let started = std::time::Instant::now();
    let stopping = tokio::spawn(app.stop());
    let notice = open.next(Duration::from_secs(5)).await.unwrap();
    assert_eq!(notice.event, "server.shutdown");
    assert!(open.next(Duration::from_secs(5)).await.is_none());
    stopping.await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn the_client_reads_events_split_anywhere_and_refuses_one_without_end() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // Not an OJS server: one event in pieces, one ended by CRLFs across two writes, then
    // bytes that never end an event.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut request = [0u8; 4096];
        let _ = socket.read(&mut request).await;
        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n";
        let pieces = [
            head,
            "id: 1\nevent: job.completed\nda",
            "ta: {\"job_id\":\"a\"}\n",
            "\n",
            "data: 2\r\n\r",
            "\n",
        ];
        for piece in pieces {
            socket.write_all(piece.as_bytes()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let endless = vec![b'x'; 1 << 20];
        while socket.write_all(&endless).await.is_ok() {}
    });
    let client = ojs_client::Client::new(&format!("http://{addr}"));
    let mut events = client.follow_events("*", &[]).await.unwrap();
    let first = events.next().await.unwrap().unwrap();
    assert_eq!(
        (first.id.as_deref(), first.event_type.as_str()),
        (Some("1"), "job.completed")
    );
    assert_eq!(first.data["job_id"], "a");
    assert_eq!(events.next().await.unwrap().unwrap().data, json!(2));
    let err = events.next().await.unwrap().unwrap_err();
    assert!(
        matches!(err, ojs_client::ClientError::EventTooLarge(_)),
        "{err}"
    );
}
