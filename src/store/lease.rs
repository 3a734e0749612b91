//! A leader lease in the leases bucket: written with create / update-by-revision, expired by
//! the bucket's max age when its holder stops renewing it. No clocks are compared.

use std::sync::Arc;

use async_nats::jetstream::kv;
use tracing::debug;

use super::connection::Connection;

/// The leases resource, as a caller holds it: the connection and what the resource owns.
#[derive(Clone)]
pub struct Leases {
    pub(super) conn: Arc<Connection>,
    pub(super) own: Arc<Owned>,
}

/// What the leases resource owns.
pub(super) struct Owned {
    pub(super) kv: kv::Store,
}

/// One named lease, as seen by one contender.
pub struct Lease {
    kv: kv::Store,
    key: String,
    holder: String,
    /// The revision of our last successful write, while we hold the lease.
    revision: Option<u64>,
    /// The revision that acquired the lease, while we hold it: the leadership's term.
    term: Option<u64>,
    /// Longest wait for a write's answer: a third of the lease's time-to-live.
    answer_within: std::time::Duration,
}

impl Leases {
    /// A contender for the lease `name`, identifying itself as `holder`.
    pub fn contender(&self, name: &str, holder: &str) -> Lease {
        Lease {
            kv: self.own.kv.clone(),
            key: name.to_owned(),
            holder: holder.to_owned(),
            revision: None,
            term: None,
            answer_within: self.conn.topology.lease_ttl / 3,
        }
    }
}

impl Lease {
    /// Acquires the lease if it is free, or renews it if we hold it. While we hold it, the
    /// leadership's term: the lease's revision when we acquired it, higher than that of
    /// every leadership before (revisions only grow). Any failure counts as not holding: a
    /// holder that cannot renew must step down.
    pub async fn try_hold(&mut self) -> Option<u64> {
        let value = self.holder.clone().into_bytes().into();
        let write = async {
            match self.revision {
                Some(rev) => self
                    .kv
                    .update(&self.key, value, rev)
                    .await
                    .map_err(|e| e.to_string()),
                None => self
                    .kv
                    .create(&self.key, value)
                    .await
                    .map_err(|e| e.to_string()),
            }
        };
        // An answer later than this could come after the lease expired and another replica
        // took it; treat it as lost.
        let result = tokio::time::timeout(self.answer_within, write)
            .await
            .unwrap_or_else(|_| Err("no answer in time".into()));
        match result {
            Ok(rev) => {
                self.revision = Some(rev);
                Some(*self.term.get_or_insert(rev))
            }
            Err(err) => {
                self.term = None;
                if self.revision.take().is_some() {
                    debug!(lease = %self.key, error = %err, "lost the lease");
                }
                None
            }
        }
    }

    /// Gives the lease up at once, so another replica need not wait for it to expire.
    pub async fn release(&mut self) {
        self.term = None;
        if let Some(rev) = self.revision.take() {
            let _ = self.kv.purge_expect_revision(&self.key, Some(rev)).await;
        }
    }
}
