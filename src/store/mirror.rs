//! An in-memory copy of a small key-value bucket (queues, cron entries), kept current by a
//! watch, so request paths read it without a NATS round trip and nothing lists keys. Every
//! value carries the revision it was read at: a late watch update never replaces a newer
//! local write.

use std::collections::HashMap;
use std::sync::{Arc, RwLock, Weak};

use async_nats::jetstream::kv;
use futures::StreamExt;
use serde::de::DeserializeOwned;
use tracing::warn;

use super::error::backend;
use crate::domain::error::OjsError;

pub struct Mirror<T> {
    entries: RwLock<HashMap<String, (u64, Option<T>)>>,
    /// Woken on every change, for requests waiting for an entry to appear.
    changed: tokio::sync::Notify,
}

impl<T: DeserializeOwned + Clone + Send + Sync + 'static> Mirror<T> {
    /// Loads the bucket and follows it; the admin reset's announcement on `reset_subject`
    /// empties the copy.
    pub async fn start(
        kv: &kv::Store,
        client: &async_nats::Client,
        reset_subject: String,
    ) -> Result<Arc<Mirror<T>>, OjsError> {
        let mut watch = kv
            .watch_with_history(">")
            .await
            .map_err(backend("watching a bucket"))?;
        let mut resets = client
            .subscribe(reset_subject)
            .await
            .map_err(backend("subscribing to resets"))?;
        let mirror = Arc::new(Mirror {
            entries: RwLock::new(HashMap::new()),
            changed: tokio::sync::Notify::new(),
        });
        let weak: Weak<Mirror<T>> = Arc::downgrade(&mirror);
        tokio::spawn(async move {
            while let Some(entry) = watch.next().await {
                let Some(mirror) = weak.upgrade() else { break };
                match entry {
                    Ok(e) if e.operation == kv::Operation::Put => {
                        match serde_json::from_slice::<T>(&e.value) {
                            Ok(value) => mirror.remember(&e.key, e.revision, Some(value)),
                            Err(err) => {
                                warn!(key = %e.key, error = %err, "unreadable bucket entry")
                            }
                        }
                    }
                    Ok(e) => mirror.remember(&e.key, e.revision, None),
                    Err(err) => warn!(error = %err, "bucket watch failed"),
                }
            }
        });
        let weak = Arc::downgrade(&mirror);
        tokio::spawn(async move {
            while resets.next().await.is_some() {
                let Some(mirror) = weak.upgrade() else { break };
                mirror.clear();
            }
        });
        Ok(mirror)
    }

    pub fn get(&self, key: &str) -> Option<T> {
        self.entries
            .read()
            .expect("mirror lock")
            .get(key)
            .and_then(|(_, v)| v.clone())
    }

    pub fn values(&self) -> Vec<T> {
        self.entries
            .read()
            .expect("mirror lock")
            .values()
            .filter_map(|(_, v)| v.clone())
            .collect()
    }

    /// Records a value (or its removal, `None`) seen at `revision`, unless a newer one is known.
    pub fn remember(&self, key: &str, revision: u64, value: Option<T>) {
        let mut entries = self.entries.write().expect("mirror lock");
        if entries.get(key).is_none_or(|(seen, _)| *seen < revision) {
            entries.insert(key.to_owned(), (revision, value));
            drop(entries);
            self.changed.notify_waiters();
        }
    }

    pub fn clear(&self) {
        self.entries.write().expect("mirror lock").clear();
        self.changed.notify_waiters();
    }

    /// Completes at the next change after it was created (or enabled).
    pub fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
    }
}
