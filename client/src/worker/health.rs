//! Liveness and readiness probes of a worker process (graceful-shutdown spec §8.1), for
//! orchestrators: `GET /healthz` answers 200 while the worker runs, whatever its state;
//! `GET /readyz` answers 200 only while it is `running` and 503 once it is quiet or
//! terminating (GS-R004), so traffic and new work go elsewhere while it drains.
//!
//! A minimal HTTP/1.1 responder: one request per connection, the request line read and the
//! rest ignored, so the crate needs no server framework.

use std::sync::Arc;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{Engine, WorkerState};

/// Longest request head read; probes send a few hundred bytes.
const MAX_HEAD: usize = 8 * 1024;
/// How long a connection may take to send its request head; one that never finishes is
/// closed instead of holding a task for good.
const HEAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Answers probes on `listener` until the task is aborted.
pub(super) async fn serve(listener: TcpListener, engine: Arc<Engine>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let engine = engine.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(HEAD_TIMEOUT, answer(stream, &engine)).await;
        });
    }
}

async fn answer(mut stream: TcpStream, engine: &Engine) {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_HEAD {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let line = String::from_utf8_lossy(&head);
    let mut words = line.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let state = engine.state();
    let (status, body) = match (method, path.split('?').next().unwrap_or("")) {
        ("GET", "/healthz" | "/health/live") => ("200 OK", probe(engine, "ok", state)),
        ("GET", "/readyz" | "/health/ready") if state == WorkerState::Running => {
            ("200 OK", probe(engine, "ready", state))
        }
        ("GET", "/readyz" | "/health/ready") => {
            ("503 Service Unavailable", probe(engine, "unready", state))
        }
        _ => ("404 Not Found", json!({"status": "not_found"}).to_string()),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

fn probe(engine: &Engine, status: &str, state: WorkerState) -> String {
    json!({
        "status": status,
        "state": state.as_str(),
        "worker_id": engine.cfg.worker_id,
        "active_jobs": engine.active.lock().expect("active jobs lock").len(),
    })
    .to_string()
}
