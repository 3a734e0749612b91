//! W3C trace context carried in a job's `meta` (tracing spec §6.1): a producer puts the
//! context it works in on the jobs it enqueues ([`JobSpec::trace_context`]), the server keeps
//! it unchanged, and a worker reads it back ([`JobContext::trace_context`]) to link its
//! processing to the producer and to carry it on to the jobs its handler enqueues.
//!
//! [`JobSpec::trace_context`]: crate::JobSpec::trace_context
//! [`JobContext::trace_context`]: crate::worker::JobContext::trace_context

use serde_json::{Map, Value};

/// A `traceparent` (`00-{trace_id}-{span_id}-{flags}`) and its `tracestate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// 32 lowercase hex digits, not all zero.
    pub trace_id: String,
    /// 16 lowercase hex digits, not all zero: the span the context was taken in.
    pub span_id: String,
    /// Trace flags; bit 0 is `sampled`.
    pub flags: u8,
    /// Vendor data (`tracestate`), carried along untouched.
    pub state: Option<String>,
}

impl TraceContext {
    /// A new sampled trace, for a producer that has none of its own.
    pub fn new_root() -> TraceContext {
        TraceContext {
            trace_id: hex(uuid::Uuid::now_v7().as_bytes()),
            span_id: new_span_id(),
            flags: 1,
            state: None,
        }
    }

    /// Parses a version-00 `traceparent`; `None` when it is not one (W3C trace context §3.2:
    /// a malformed header is ignored, never repaired).
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<TraceContext> {
        let mut parts = traceparent.trim().split('-');
        let (version, trace_id, span_id, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let valid = version == "00"
            && parts.next().is_none()
            && is_hex_id(trace_id, 32)
            && is_hex_id(span_id, 16)
            && flags.len() == 2;
        if !valid {
            return None;
        }
        Some(TraceContext {
            trace_id: trace_id.to_owned(),
            span_id: span_id.to_owned(),
            flags: u8::from_str_radix(flags, 16).ok()?,
            state: tracestate.map(str::to_owned),
        })
    }

    /// The context stored in a job's `meta`, if it holds a valid one.
    pub fn from_meta(meta: &Map<String, Value>) -> Option<TraceContext> {
        TraceContext::parse(
            meta.get("traceparent")?.as_str()?,
            meta.get("tracestate").and_then(Value::as_str),
        )
    }

    /// The `traceparent` value.
    pub fn traceparent(&self) -> String {
        format!("00-{}-{}-{:02x}", self.trace_id, self.span_id, self.flags)
    }

    /// The same trace from a new span: what a job enqueued while handling another carries.
    #[must_use]
    pub fn child(&self) -> TraceContext {
        TraceContext {
            span_id: new_span_id(),
            ..self.clone()
        }
    }

    /// Writes `traceparent` (and `tracestate`, when there is one) into `meta`.
    pub(crate) fn write_to(&self, meta: &mut Map<String, Value>) {
        meta.insert("traceparent".into(), Value::String(self.traceparent()));
        match &self.state {
            Some(state) => meta.insert("tracestate".into(), Value::String(state.clone())),
            None => meta.remove("tracestate"),
        };
    }
}

/// Eight bytes from the random part of a fresh UUIDv7.
fn new_span_id() -> String {
    hex(&uuid::Uuid::now_v7().as_bytes()[8..])
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn is_hex_id(s: &str, len: usize) -> bool {
    s.len() == len
        && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        && s.bytes().any(|b| b != b'0')
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traceparent_round_trips_and_a_child_keeps_the_trace() {
        let ctx = TraceContext::parse(PARENT, Some("congo=t61rcWkgMzE")).unwrap();
        assert_eq!(ctx.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(ctx.span_id, "00f067aa0ba902b7");
        assert_eq!(ctx.flags, 1);
        assert_eq!(ctx.traceparent(), PARENT);
        let child = ctx.child();
        assert_eq!(
            (&child.trace_id, child.flags, &child.state),
            (&ctx.trace_id, 1, &ctx.state)
        );
        assert_ne!(child.span_id, ctx.span_id);
        assert!(TraceContext::parse(&child.traceparent(), None).is_some());
        let root = TraceContext::new_root();
        assert!(TraceContext::parse(&root.traceparent(), None).is_some());
        assert_ne!(root.trace_id, TraceContext::new_root().trace_id);
    }

    #[test]
    fn malformed_traceparents_are_ignored() {
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e47-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-zz",
        ] {
            assert_eq!(TraceContext::parse(bad, None), None, "{bad:?}");
        }
    }

    #[test]
    fn a_context_is_written_into_meta_and_read_back() {
        let ctx = TraceContext::parse(PARENT, Some("congo=t61rcWkgMzE")).unwrap();
        let mut meta = Map::new();
        ctx.write_to(&mut meta);
        assert_eq!(meta["traceparent"], PARENT);
        assert_eq!(meta["tracestate"], "congo=t61rcWkgMzE");
        assert_eq!(TraceContext::from_meta(&meta), Some(ctx));
    }
}
