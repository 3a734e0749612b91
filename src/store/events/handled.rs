//! How far the event publisher has handled the jobs bucket's writes, as every replica
//! knows it: the leader announces its acknowledged floor on a core NATS subject after each
//! acknowledgement, and each replica keeps the latest value. A job write uses it to leave
//! out of its record's trail the steps whose events are already stored (`domain/trail.rs`).
//! A missed or late announcement only keeps a trail longer; a replica that has heard none
//! keeps every step.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use futures::StreamExt;

use crate::domain::error::OjsError;
use crate::store::error::backend;

pub struct HandledWrites {
    through: Arc<AtomicU64>,
}

impl HandledWrites {
    /// Follows the announcements on `subject` for as long as the value is in use.
    pub async fn follow(
        client: &async_nats::Client,
        subject: String,
    ) -> Result<HandledWrites, OjsError> {
        let mut announcements = client
            .subscribe(subject)
            .await
            .map_err(backend("subscribing to the event publisher's progress"))?;
        let through = Arc::new(AtomicU64::new(0));
        let weak: Weak<AtomicU64> = Arc::downgrade(&through);
        tokio::spawn(async move {
            while let Some(msg) = announcements.next().await {
                let Some(through) = weak.upgrade() else { break };
                if let Some(revision) = std::str::from_utf8(&msg.payload)
                    .ok()
                    .and_then(|s| s.parse().ok())
                {
                    through.store(revision, Ordering::Relaxed);
                }
            }
        });
        Ok(HandledWrites { through })
    }

    /// Every write up to this revision has its events stored.
    pub fn through(&self) -> u64 {
        self.through.load(Ordering::Relaxed)
    }
}
