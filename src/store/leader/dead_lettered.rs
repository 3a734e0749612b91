//! The jobs dead-lettered before discarded jobs had entries in the leader's finished index
//! (a deployment upgraded from a version without them), indexed once per deployment so that
//! listings by state show every discarded job (architecture §3.26).

use futures::future::join_all;
use serde::{Deserialize, Serialize};

use super::Leader;
use crate::domain::error::OjsError;
use crate::domain::listing::IndexMove;
use crate::domain::state::JobState;
use crate::store::cas::{self, Replica};
use crate::store::dead_letter::entries::Entries;

/// Where the coordinator bucket keeps how far the indexing got.
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
            Some(mark) if mark.through >= mark.until => return Ok(true),
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
