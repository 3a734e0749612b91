//! What only the coordinator's leader does: pruning finished jobs, the finished index, and
//! the other writes of the leader services. `store.leader()`.

pub(super) mod counts;
pub(super) mod cron;
mod depth_tokens;
pub(super) mod finished_index;
pub(super) mod job_writes;
pub(super) mod pruner;
mod registry;
mod slots;
pub(super) mod timers;
mod unique;
mod workflows;

use std::sync::Arc;

use async_nats::jetstream::kv;
use async_nats::jetstream::stream::Stream;
use futures::StreamExt;

use crate::domain::error::OjsError;
use crate::domain::listing::IndexMove;
use crate::store::connection::Connection;
use crate::store::cron::Cron;
use crate::store::error::backend;
use crate::store::events::Events;
use crate::store::jobs::Jobs;
use crate::store::queues::Queues;
use crate::store::stats::{CountsWritten, Stats};
use crate::store::timers::Timers;
use crate::store::workers::Workers;
use crate::store::workflows::Workflows;
use finished_index::FinishedIndex;

/// The leader's handle: calls only the lease holder's services make, over every resource.
#[derive(Clone)]
pub struct Leader {
    pub(super) conn: Arc<Connection>,
    pub(super) own: Arc<Owned>,
    pub(super) jobs: Jobs,
    pub(super) queues: Queues,
    pub(super) events: Events,
    pub(super) timers: Timers,
    pub(super) workers: Workers,
    pub(super) workflows: Workflows,
    pub(super) cron: Cron,
    pub(super) stats: Stats,
}

/// What the leader's handle owns.
pub(super) struct Owned {
    /// The pruner's cursor (`pruner.rs`).
    pub(super) kv: kv::Store,
    /// The leader's index of completed, cancelled and pending jobs (`finished_index.rs`).
    pub(super) finished: FinishedIndex,
    /// The statistics entries this process last wrote as leader (`counts.rs`).
    pub(super) counts_written: std::sync::Mutex<CountsWritten>,
}

impl Leader {
    /// Applies a batch's index moves to the finished index (`finished_index.rs`).
    ///
    /// # Errors
    /// When NATS fails; the batch is then retried.
    pub async fn index_jobs(&self, moves: &[IndexMove]) -> Result<(), OjsError> {
        self.own.finished.index(&self.conn, moves).await
    }
}

/// The consumers of `stream` that leaderships up to `term` made (`term_of` reads the term
/// from a name; other consumers are left out), with their terms: what a leadership takes
/// over. Consumers are named by term so that a leader that lost its lease unawares reads
/// and acknowledges only through its own, which its successor deletes (architecture §3.4,
/// §3.5).
///
/// # Errors
/// When NATS fails, or a consumer of a later leadership exists: `stands_down` says what
/// that leadership does instead of this one.
async fn taken_over(
    stream: &Stream,
    term: u64,
    term_of: fn(&str) -> Option<u64>,
    stands_down: &str,
) -> Result<Vec<(u64, String)>, OjsError> {
    let mut earlier = Vec::new();
    let mut names = stream.consumer_names();
    while let Some(name) = names.next().await {
        let name = name.map_err(backend("listing the consumers of a leader service"))?;
        match term_of(&name) {
            Some(t) if t > term => {
                return Err(OjsError::backend(format!(
                    "A later leadership {stands_down}; this one stands down."
                )))
            }
            Some(t) => earlier.push((t, name)),
            None => {}
        }
    }
    Ok(earlier)
}
