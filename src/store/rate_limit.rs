//! Queue rate limits (docs/architecture.md §3.19). A rate-limited queue has a token stream
//! in NATS: every job start publishes one message to the subject of its window, and NATS
//! refuses the message once that subject holds `limit` of them (discard new per subject).
//! So the limit holds across every replica with one publish per start and nothing to
//! coordinate; queues without a limit never touch it.

use std::collections::BTreeMap;

use async_nats::jetstream::context::PublishErrorKind;
use chrono::{DateTime, Utc};

use super::error::{backend, server_refused};
use super::{ensure_stream, Store};
use crate::domain::error::OjsError;
use crate::domain::job::JobRecord;
use crate::domain::rate_limit::RateLimit;

impl Store {
    /// PUSH: makes each job's `rate_limit` its queue's before any of its messages exist —
    /// the token stream first, then the registry entry every replica's FETCH follows. A
    /// limit already in force costs a map lookup.
    ///
    /// # Errors
    /// As the checks of `RateLimit::parse`; `backend_error` when NATS fails.
    pub(super) async fn ensure_rate_limits(
        &self,
        records: &[JobRecord],
        now: DateTime<Utc>,
    ) -> Result<(), OjsError> {
        let mut wanted: BTreeMap<&str, RateLimit> = BTreeMap::new();
        for rec in records {
            if let Some(raw) = &rec.job.rate_limit {
                wanted.insert(&rec.job.queue, RateLimit::parse(raw, &rec.job.queue)?);
            }
        }
        for (queue, limit) in wanted {
            if self.inner.queues.rate_limit(queue) == Some(limit) {
                continue;
            }
            ensure_stream(
                &self.inner.js,
                self.inner.topology.rate_stream_config(queue, limit),
            )
            .await?;
            self.inner.queues.set_rate_limit(queue, limit, now).await?;
        }
        Ok(())
    }

    /// FETCH: spends one start of `queue`'s current window; `false` when the window has
    /// none left.
    ///
    /// # Errors
    /// `backend_error` when NATS does not answer.
    pub(super) async fn take_start(&self, queue: &str, limit: RateLimit) -> Result<bool, OjsError> {
        let doing = "taking a start of a rate-limited queue";
        let window = limit.window_index(Utc::now().timestamp_millis());
        let subject = self.inner.topology.rate_subject(queue, window);
        for first in [true, false] {
            let ack = self
                .inner
                .js
                .publish(subject.clone(), bytes::Bytes::new())
                .await
                .map_err(backend(doing))?;
            match ack.await {
                Ok(_) => return Ok(true),
                Err(err) if server_refused(&err) => return Ok(false),
                // A token stream of an earlier version (one subject per queue): made over.
                Err(err) if first && err.kind() == PublishErrorKind::StreamNotFound => {
                    let config = self.inner.topology.rate_stream_config(queue, limit);
                    ensure_stream(&self.inner.js, config).await?;
                }
                Err(err) => return Err(backend(doing)(err)),
            }
        }
        unreachable!("the second round returns")
    }
}
