//! Test fixtures shared by the domain's unit tests.

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use uuid::Uuid;

use super::job::{JobRecord, Transition};
use super::{envelope, time};

/// The fixed "now" of the domain tests.
pub fn now() -> DateTime<Utc> {
    time::parse("2026-02-12T10:30:00Z").unwrap()
}

/// A freshly enqueued job of type `t.x` with these options, as a record on dispatch 1.
pub fn record(options: Value) -> JobRecord {
    let job = envelope::parse(
        json!({"type": "t.x", "args": [], "options": options}),
        now(),
        Uuid::now_v7(),
    )
    .unwrap();
    JobRecord {
        job,
        dispatch: 1,
        holder: None,
        transition: Transition::Created,
        dead_letter: None,
        trail: Vec::new(),
        slot: None,
        from: None,
        batch: None,
        depth_token: None,
    }
}
