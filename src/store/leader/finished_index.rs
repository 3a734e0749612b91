//! The leader's index of the jobs in `pending`, `completed`, `cancelled` and `discarded`,
//! the states no other stream holds in time order (the dead-letter stream holds only the
//! discarded jobs dead-lettered): one entry per job on
//! `<ns>.finished.<state>.<queue>.<id>` (architecture §3.26). Written by the event publisher,
//! and once per deployment for the jobs dead-lettered before discarded jobs were indexed;
//! read by listings.

use std::future::IntoFuture;

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::{self, stream::Stream};
use futures::future::join_all;
use serde::{Deserialize, Serialize};

use super::Leader;
use crate::domain::error::OjsError;
use crate::domain::listing::IndexMove;
use crate::domain::state::JobState;
use crate::store::cas::{self, Replica};
use crate::store::connection::{ensure_stream, Connection};
use crate::store::dead_letter::entries::Entries;
use crate::store::error::backend;
use crate::store::topology::Topology;

/// Where the coordinator bucket keeps how far the jobs dead-lettered before discarded jobs
/// had index entries have been indexed (`Leader::index_dead_lettered`).
const DEAD_LETTERED_MARK: &str = "dead-lettered-indexed";

/// Dead-letter entries indexed at a time.
const DEAD_LETTERED_BATCH: usize = 256;

/// How far: the dead-letter stream's entries through `through` of those it held when the
/// indexing began (up to `until`); the event publisher indexes every later one.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct DeadLetteredMark {
    through: u64,
    until: u64,
}

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

impl Leader {
    /// Indexes the next batch of the jobs dead-lettered before discarded jobs had index
    /// entries of their own (an upgrade), so that listings show every discarded job; `true`
    /// once all of them are. Once per deployment: the mark in the coordinator bucket says how
    /// far it got, so a new leader goes on from there and, once done, reads the mark and
    /// stops. An entry indexed twice is still one entry (one per subject).
    ///
    /// # Errors
    /// When NATS fails; the batch is tried again.
    pub async fn index_dead_lettered(&self) -> Result<bool, OjsError> {
        let kv = &self.own.kv;
        let read = "index mark";
        let stored = cas::read::<DeadLetteredMark>(kv, DEAD_LETTERED_MARK, Replica::Leader, read)
            .await?
            .value;
        let mark = match stored {
            Some(mark) => mark,
            None => DeadLetteredMark {
                through: 0,
                until: self.jobs.dead_letter.last_sequence().await?,
            },
        };
        let through = if mark.through >= mark.until {
            mark.through
        } else {
            self.index_dead_lettered_from(&mark).await?
        };
        let next = DeadLetteredMark { through, ..mark };
        cas::change(kv, DEAD_LETTERED_MARK, read, DEAD_LETTERED_MARK, |_| {
            Some(next.clone())
        })
        .await?;
        Ok(next.through >= next.until)
    }

    /// Indexes the discarded jobs of the dead-letter entries after `mark.through` (a batch,
    /// up to `mark.until`) and returns the last sequence looked at.
    async fn index_dead_lettered_from(&self, mark: &DeadLetteredMark) -> Result<u64, OjsError> {
        let t = &self.conn.topology;
        let entries = self
            .conn
            .read_stream_from(
                &t.dead_letter_stream(),
                None,
                mark.through + 1,
                DEAD_LETTERED_BATCH,
            )
            .await?;
        let entries: Vec<_> = entries
            .into_iter()
            .filter(|e| e.sequence <= mark.until)
            .collect();
        let named = entries
            .iter()
            .filter_map(|e| Some((e.sequence, Entries::job_of(&e.payload)?)));
        let reads = join_all(named.map(|(sequence, id)| async move {
            let found = self.jobs.read(&id, Replica::Nearest).await?;
            Ok::<_, OjsError>(found.and_then(|(rec, _)| {
                (rec.job.state == JobState::Discarded && rec.dead_letter == Some(sequence)).then(
                    || IndexMove {
                        id,
                        queue: rec.job.queue,
                        enter: Some(JobState::Discarded),
                        leave: Vec::new(),
                    },
                )
            }))
        }))
        .await;
        let mut moves = Vec::with_capacity(reads.len());
        for read in reads {
            moves.extend(read?);
        }
        self.own.finished.index(&self.conn, &moves).await?;
        // Nothing left to read (the rest expired meanwhile): done.
        Ok(entries.last().map_or(mark.until, |e| e.sequence))
    }
}
