//! What only the coordinator's leader does: pruning finished jobs, the finished index, and
//! the other writes of the leader services. `store.leader()`.

mod counts;
mod cron;
mod depth_tokens;
mod finished_index;
mod job_writes;
mod pruner;
mod slots;
mod timers;
mod unique;
mod workflows;

use async_nats::jetstream::kv;

pub use cron::TickOutcome;
pub(super) use finished_index::{FinishedIndex, FINISHED_STATES};
pub use job_writes::{JobWrite, JobWrites};
pub use pruner::{StoredWrite, WriteBody};
pub use timers::{PendingTimer, ReadAhead, TimerFeed};

use super::Store;

/// The leader's handle: calls only the lease holder's services make.
#[derive(Clone, Copy)]
pub struct Leader<'a> {
    pub(super) store: &'a Store,
    pub(super) own: &'a Owned,
}

/// What the leader's handle owns.
pub(super) struct Owned {
    /// The pruner's cursor (`pruner.rs`).
    pub(super) kv: kv::Store,
    /// The leader's index of completed, cancelled and pending jobs (`finished_index.rs`).
    pub(super) finished: FinishedIndex,
}
