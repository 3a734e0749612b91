//! An in-memory copy of a key-value bucket (queues, cron entries, workers), kept current by a
//! watch, so request paths read it without a NATS round trip and nothing lists keys. Every
//! value carries the revision it was read at: a late watch update never replaces a newer
//! local write. A removed key is forgotten once the watch delivers its removal, so memory
//! follows the live entries, not every key ever written.

use std::collections::HashMap;
use std::sync::{Arc, RwLock, Weak};

use async_nats::jetstream::kv;
use futures::StreamExt;
use serde::de::DeserializeOwned;
use tracing::warn;

use super::error::backend;
use crate::domain::error::OjsError;

pub struct Mirror<T> {
    /// Values by key; `None` marks a local removal the watch has not delivered yet.
    entries: RwLock<Entries<T>>,
    /// Woken on every change, for requests waiting for an entry to appear.
    changed: tokio::sync::Notify,
}

struct Entries<T> {
    by_key: HashMap<String, (u64, Option<T>)>,
    /// The watch has delivered every change up to this revision.
    watched: u64,
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
            entries: RwLock::new(Entries {
                by_key: HashMap::new(),
                watched: 0,
            }),
            changed: tokio::sync::Notify::new(),
        });
        let weak: Weak<Mirror<T>> = Arc::downgrade(&mirror);
        tokio::spawn(async move {
            while let Some(entry) = watch.next().await {
                let Some(mirror) = weak.upgrade() else { break };
                match entry {
                    Ok(e) if e.operation == kv::Operation::Put => {
                        match serde_json::from_slice::<T>(&e.value) {
                            Ok(value) => mirror.watched(&e.key, e.revision, Some(value)),
                            Err(err) => {
                                warn!(key = %e.key, error = %err, "unreadable bucket entry")
                            }
                        }
                    }
                    Ok(e) => mirror.watched(&e.key, e.revision, None),
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
        self.read().by_key.get(key).and_then(|(_, v)| v.clone())
    }

    /// What `f` reads of the value under `key`, without copying the value: the lookups
    /// every FETCH and PUSH makes.
    pub fn with<R>(&self, key: &str, f: impl FnOnce(&T) -> R) -> Option<R> {
        self.read()
            .by_key
            .get(key)
            .and_then(|(_, v)| v.as_ref())
            .map(f)
    }

    pub fn values(&self) -> Vec<T> {
        self.read()
            .by_key
            .values()
            .filter_map(|(_, v)| v.clone())
            .collect()
    }

    /// How many values are held.
    pub fn len(&self) -> usize {
        self.read()
            .by_key
            .values()
            .filter(|(_, v)| v.is_some())
            .count()
    }

    pub fn contains(&self, key: &str) -> bool {
        self.read()
            .by_key
            .get(key)
            .is_some_and(|(_, v)| v.is_some())
    }

    /// Records this replica's own write of a value (or its removal, `None`) at `revision`,
    /// unless a newer one is known — also when the watch has passed `revision` already and
    /// so holds what came of the key since.
    pub fn remember(&self, key: &str, revision: u64, value: Option<T>) {
        let mut entries = self.entries.write().expect("mirror lock");
        let newer = match entries.by_key.get(key) {
            Some((seen, _)) => *seen < revision,
            None => entries.watched < revision,
        };
        if newer {
            entries.by_key.insert(key.to_owned(), (revision, value));
            drop(entries);
            self.changed.notify_waiters();
        }
    }

    /// A change the watch delivered (they come in revision order).
    fn watched(&self, key: &str, revision: u64, value: Option<T>) {
        let mut entries = self.entries.write().expect("mirror lock");
        entries.watched = entries.watched.max(revision);
        let held = entries.by_key.get(key).map(|(seen, _)| *seen);
        match value {
            Some(v) if held.is_none_or(|seen| seen < revision) => {
                entries.by_key.insert(key.to_owned(), (revision, Some(v)));
            }
            None if held.is_some_and(|seen| seen <= revision) => {
                entries.by_key.remove(key);
            }
            _ => return,
        }
        drop(entries);
        self.changed.notify_waiters();
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Entries<T>> {
        self.entries.read().expect("mirror lock")
    }

    pub fn clear(&self) {
        self.entries.write().expect("mirror lock").by_key.clear();
        self.changed.notify_waiters();
    }

    /// Completes at the next change after it was created (or enabled).
    pub fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
    }
}
