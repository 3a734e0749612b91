//! Queues: the registry of queues and their lanes, their settings (pause, rate and
//! concurrency limits, bounds) and the streams that enforce them. `store.queues()`.

pub(super) mod backpressure;
mod ops;
pub(super) mod puller;
pub(super) mod rate_limit;
pub(super) mod registry;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::store::connection::Connection;
use crate::store::events::Events;
use registry::QueueRegistry;

/// The queues resource, as a caller holds it: what it owns, and the events it publishes
/// (pause, resume, a refused PUSH).
#[derive(Clone)]
pub struct Queues {
    pub(super) conn: Arc<Connection>,
    pub(super) own: Arc<Owned>,
    pub(super) events: Events,
}

/// What the queues resource owns.
pub(super) struct Owned {
    pub(super) registry: QueueRegistry,
    /// Bounded queues' depths as last read, for the pressure headers (`backpressure.rs`).
    pub(super) depths: DepthCache,
}

/// Each queue's depth as this gateway last read it, and when.
#[derive(Default)]
pub(super) struct DepthCache(pub(super) std::sync::Mutex<HashMap<String, (Instant, u64)>>);
