//! Queues: the registry of queues and their lanes, their settings (pause, rate and
//! concurrency limits, bounds) and the streams that enforce them. `store.queues()`.

pub(super) mod backpressure;
mod ops;
pub(super) mod puller;
pub(super) mod rate_limit;
pub(super) mod registry;

pub(super) use backpressure::DepthCache;
pub use backpressure::Pressure;
pub use ops::QueueStats;
pub use rate_limit::LimitUsage;
pub use registry::QueueMeta;
pub(super) use registry::QueueRegistry;

use super::Store;

/// The queues resource, as a caller holds it: the store and what the resource owns.
#[derive(Clone, Copy)]
pub struct Queues<'a> {
    pub(super) store: &'a Store,
    pub(super) own: &'a Owned,
}

/// What the queues resource owns.
pub(super) struct Owned {
    pub(super) registry: QueueRegistry,
    /// Bounded queues' depths as last read, for the pressure headers (`backpressure.rs`).
    pub(super) depths: DepthCache,
}
