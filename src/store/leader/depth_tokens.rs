//! The leader's upkeep of bounded queues' depth tokens: deleting those of jobs that left
//! their queue, and sweeping those no job holds.

use std::time::{Duration, Instant};

use async_nats::jetstream::stream::DeleteMessageErrorKind;
use chrono::Utc;
use futures::future::join_all;
use tracing::warn;

use super::Leader;
use crate::domain::backpressure::Bound;
use crate::domain::error::OjsError;
use crate::store::error::{already_deleted, backend};

impl Leader<'_> {
    /// Deletes the tokens `(queue, sequence)`, concurrently; one deleted already (by the
    /// sweep, or an earlier try whose answer was lost) counts as deleted.
    ///
    /// # Errors
    /// When NATS fails; repeating it is harmless.
    pub async fn delete_depth_tokens<'a>(
        self,
        tokens: impl IntoIterator<Item = (&'a str, u64)>,
    ) -> Result<(), OjsError> {
        let doing = "freeing a place in a bounded queue";
        let deletes = tokens.into_iter().map(|(queue, sequence)| async move {
            let stream = self
                .store.inner
                .js
                .get_stream_no_info(self.store.inner.topology.depth_stream(queue))
                .await
                .map_err(backend(doing))?;
            match stream.delete_message(sequence).await {
                Ok(_) => Ok(()),
                Err(err) if already_deleted(&err) => Ok(()),
                // Refused for another reason: repeating it would hold up the event
                // publisher for good; the token stays until a sweep of a later leadership.
                Err(err) if matches!(err.kind(), DeleteMessageErrorKind::JetStream(_)) => {
                    warn!(queue, sequence, error = %err, "NATS refused to free a place in a bounded queue");
                    Ok(())
                }
                Err(err) => Err(backend(doing)(err)),
            }
        });
        join_all(deletes).await.into_iter().collect()
    }

    /// `queue`'s depth now: the tokens in its depth stream (one stream info).
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn depth_now(self, queue: &str) -> Result<u64, OjsError> {
        let stream = self
            .store
            .inner
            .js
            .get_stream(self.store.inner.topology.depth_stream(queue))
            .await
            .map_err(backend("reading the depth of a bounded queue"))?;
        let depth = stream.cached_info().state.messages;
        self.store
            .queues()
            .own
            .depths
            .0
            .lock()
            .expect("depth cache lock")
            .insert(queue.to_owned(), (Instant::now(), depth));
        Ok(depth)
    }

    /// Every bounded queue with its bound, as this replica knows them.
    pub fn bounded_queues(self) -> Vec<(String, Bound)> {
        self.store.queues().own.registry.bounded()
    }

    /// How old a token must be before the sweep may free it: older than any PUSH still
    /// between its tokens and its records (a batch may take `batch_grace_ms`).
    pub fn token_grace(self) -> Duration {
        self.store.inner.batch_grace + 2 * self.store.inner.nats_timeout
    }

    /// Leader: looks at `queue`'s tokens from sequence `from` on, at most `max` of them and
    /// only those older than `grace`, and deletes each whose job does not hold it (a PUSH
    /// that died between its tokens and its records, a refused one whose give-back was
    /// lost). A token held when looked at stays held until its job finishes, so each is
    /// looked at once: the answer is where the next look starts, and how many were freed.
    ///
    /// # Errors
    /// When NATS fails; the next sweep repeats it.
    pub async fn sweep_depth_tokens(
        self,
        queue: &str,
        from: u64,
        grace: Duration,
        max: usize,
    ) -> Result<(u64, usize), OjsError> {
        let stream = self.store.inner.topology.depth_stream(queue);
        let tokens = self
            .store
            .read_stream_from(&stream, None, from, max)
            .await?;
        let now_ms = Utc::now().timestamp_millis();
        let old: Vec<_> = tokens
            .into_iter()
            .take_while(|t| now_ms - t.published_ms >= grace.as_millis() as i64)
            .collect();
        let next = old.last().map_or(from, |t| t.sequence + 1);
        let ids = old.iter().map(|t| {
            (
                std::str::from_utf8(&t.payload).unwrap_or_default(),
                t.sequence,
            )
        });
        let leaked: Vec<(&str, u64)> = self
            .store
            .queues()
            .unheld(ids)
            .await?
            .into_iter()
            .map(|i| (queue, old[i].sequence))
            .collect();
        let freed = leaked.len();
        self.delete_depth_tokens(leaked).await?;
        Ok((next, freed))
    }
}
