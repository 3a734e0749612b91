//! Queue rate limits (docs/architecture.md §3.19). A rate-limited queue has a token stream
//! in NATS: every job start publishes one message to it, NATS refuses the message once the
//! window holds `limit` of them (discard new per subject) and drops each when its window
//! has passed (max age). So the limit holds across every replica with one publish per
//! start and nothing to coordinate; queues without a limit never touch it.

use std::collections::BTreeMap;

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

    /// FETCH: spends one start of `queue`'s window; `false` when the window has none left.
    ///
    /// # Errors
    /// `backend_error` when NATS does not answer.
    pub(super) async fn take_start(&self, queue: &str) -> Result<bool, OjsError> {
        let doing = "taking a start of a rate-limited queue";
        let ack = self
            .inner
            .js
            .publish(self.inner.topology.rate_subject(queue), bytes::Bytes::new())
            .await
            .map_err(backend(doing))?;
        match ack.await {
            Ok(_) => Ok(true),
            Err(err) if server_refused(&err) => Ok(false),
            Err(err) => Err(backend(doing)(err)),
        }
    }
}
