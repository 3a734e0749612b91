//! The leader's index of the jobs in `pending`, `completed`, `cancelled` and `discarded`
//! (without a dead-letter entry), which no other stream holds in time order: one entry per
//! job on `<ns>.finished.<state>.<queue>.<id>` (architecture §3.26). Written only by the
//! event publisher, read by listings.

use std::future::IntoFuture;

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::{self, stream::Stream};
use futures::future::join_all;

use crate::domain::error::OjsError;
use crate::domain::listing::IndexMove;
use crate::domain::state::JobState;
use crate::store::connection::{ensure_stream, Connection};
use crate::store::error::backend;
use crate::store::topology::Topology;

/// The states indexed here (`domain::listing::indexed`).
pub(in crate::store) const FINISHED_STATES: [JobState; 4] = [
    JobState::Pending,
    JobState::Completed,
    JobState::Cancelled,
    JobState::Discarded,
];

pub(in crate::store) struct FinishedIndex {
    streams: Vec<(JobState, Stream)>,
}

impl FinishedIndex {
    pub(in crate::store) async fn ensure(
        js: &jetstream::Context,
        topology: &Topology,
    ) -> Result<FinishedIndex, OjsError> {
        let mut streams = Vec::with_capacity(FINISHED_STATES.len());
        for state in FINISHED_STATES {
            streams.push((
                state,
                ensure_stream(js, topology.finished_stream_config(state)).await?,
            ));
        }
        Ok(FinishedIndex { streams })
    }

    fn stream(&self, state: JobState) -> Option<&Stream> {
        self.streams
            .iter()
            .find_map(|(s, stream)| (*s == state).then_some(stream))
    }

    /// Applies a batch's index moves: every entry published (acknowledgements awaited
    /// together), then every left entry purged, all at once. Idempotent, so a replayed
    /// batch repeats it harmlessly.
    ///
    /// # Errors
    /// When NATS fails; the batch is then retried.
    pub(super) async fn index(
        &self,
        conn: &Connection,
        moves: &[IndexMove],
    ) -> Result<(), OjsError> {
        let t = &conn.topology;
        let mut acks = Vec::new();
        for m in moves {
            if let Some(state) = m.enter {
                let subject = t.finished_subject(state, &m.queue, &m.id);
                acks.push(
                    conn.js
                        .publish(subject, bytes::Bytes::new())
                        .await
                        .map_err(backend("indexing a job"))?,
                );
            }
        }
        for ack in join_all(acks.into_iter().map(IntoFuture::into_future)).await {
            match ack {
                Ok(_) => {}
                // An index stream deleted by hand: made again, and the batch tried again, so
                // that the event publisher never waits for an operator.
                Err(err) if err.kind() == PublishErrorKind::StreamNotFound => {
                    for state in FINISHED_STATES {
                        ensure_stream(&conn.js, t.finished_stream_config(state)).await?;
                    }
                    return Err(backend("indexing a job")(err));
                }
                Err(err) => return Err(backend("indexing a job")(err)),
            }
        }
        let purges = moves.iter().flat_map(|m| {
            m.leave.iter().filter_map(|state| {
                let stream = self.stream(*state)?;
                Some(
                    stream
                        .purge()
                        .filter(t.finished_subject(*state, &m.queue, &m.id)),
                )
            })
        });
        for purged in join_all(purges.map(|p| async move { p.await })).await {
            purged.map_err(backend("removing a job from the index"))?;
        }
        Ok(())
    }
}
