//! Live events over Server-Sent Events (`GET /ojs/v1/events/stream`, realtime spec §2):
//! a stream of one queue's, one job's or every event, as the server stores them.

use serde_json::Value;

use crate::{Client, ClientError};

/// One event of a live stream.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveEvent {
    /// The SSE id (the server's events-stream position), to resume after with
    /// `Last-Event-ID`.
    pub id: Option<String>,
    /// `job.completed`, `job.state_changed`, `system.gap`, …
    pub event_type: String,
    pub data: Value,
}

/// An open stream; [`EventStream::next`] waits for each event.
pub struct EventStream {
    response: reqwest::Response,
    /// Bytes received and not yet parsed into events.
    pending: Vec<u8>,
    /// How far `pending` is known to hold no blank line.
    searched: usize,
}

/// Most bytes one live event may take: more than a NATS message can carry (64 MiB at most).
pub const MAX_EVENT_BYTES: usize = 64 << 20;

impl Client {
    /// Follows live events: `channel` is `queue:<name>`, `job:<id>` or `*` (every event);
    /// a non-empty `types` keeps only those event types.
    ///
    /// # Errors
    /// 400 for a malformed channel, 404 for an unknown queue or job, or a transport error.
    pub async fn follow_events(
        &self,
        channel: &str,
        types: &[&str],
    ) -> Result<EventStream, ClientError> {
        let mut query = vec![("channel", channel.to_owned())];
        if !types.is_empty() {
            query.push(("event_types", types.join(",")));
        }
        let response = self
            .request(reqwest::Method::GET, "/ojs/v1/events/stream")
            .query(&query)
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .send()
            .await
            .map_err(ClientError::Transport)?;
        if !response.status().is_success() {
            let status = response.status().as_u16();
            let bytes = response.bytes().await.map_err(ClientError::Transport)?;
            return Err(ClientError::answered(status, &bytes));
        }
        Ok(EventStream {
            response,
            pending: Vec::new(),
            searched: 0,
        })
    }
}

impl EventStream {
    /// The next event; `None` once the server ended the stream. Heartbeat comments are
    /// skipped.
    pub async fn next(&mut self) -> Option<Result<LiveEvent, ClientError>> {
        loop {
            // A blank line may straddle the end of what was searched: look from 3 before.
            let from = self.searched.saturating_sub(3);
            if let Some((length, with_blank)) = find_blank_line(&self.pending[from..]) {
                let block: Vec<u8> = self.pending.drain(..from + with_blank).collect();
                self.searched = 0;
                if let Some(event) = parse_block(&String::from_utf8_lossy(&block[..from + length]))
                {
                    return Some(Ok(event));
                }
                continue;
            }
            self.searched = self.pending.len();
            if self.pending.len() > MAX_EVENT_BYTES {
                return Some(Err(ClientError::EventTooLarge(MAX_EVENT_BYTES)));
            }
            match self.response.chunk().await {
                Ok(Some(bytes)) => self.pending.extend_from_slice(&bytes),
                Ok(None) => return None,
                Err(err) => return Some(Err(ClientError::Transport(err))),
            }
        }
    }
}

/// Where the first event block ends: (its length, the length with the blank line).
fn find_blank_line(bytes: &[u8]) -> Option<(usize, usize)> {
    let lf = bytes
        .windows(2)
        .position(|w| w == b"\n\n")
        .map(|i| (i, i + 2));
    let crlf = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, i + 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// One SSE event block (`id:`, `event:`, `data:` lines; `:` comments); `None` for a block
/// without data, such as a heartbeat.
fn parse_block(block: &str) -> Option<LiveEvent> {
    let (mut id, mut event_type, mut data) = (None, None, Vec::new());
    for line in block.lines() {
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "id" => id = Some(value.to_owned()),
            "event" => event_type = Some(value.to_owned()),
            "data" => data.push(value),
            _ => {}
        }
    }
    if data.is_empty() {
        return None;
    }
    let data = data.join("\n");
    Some(LiveEvent {
        id,
        event_type: event_type.unwrap_or_else(|| "message".into()),
        data: serde_json::from_str(&data).unwrap_or(Value::String(data)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_blocks_are_read_and_heartbeats_skipped() {
        let event = parse_block("id: 42\nevent: job.completed\ndata: {\"job_id\":\"j\"}").unwrap();
        assert_eq!(event.id.as_deref(), Some("42"));
        assert_eq!(event.event_type, "job.completed");
        assert_eq!(event.data["job_id"], "j");
        assert_eq!(parse_block(":heartbeat"), None);
        assert_eq!(parse_block("retry: 3000"), None);
        let text = parse_block("data: a\ndata: b").unwrap();
        assert_eq!(
            (text.event_type.as_str(), text.data),
            ("message", Value::String("a\nb".into()))
        );
        assert_eq!(find_blank_line(b"data: x\n\ndata: y"), Some((7, 9)));
        assert_eq!(find_blank_line(b"data: x\r\n\r\n"), Some((7, 11)));
        assert_eq!(find_blank_line(b"data: x\n"), None);
    }
}
