//! Queue registry: which queues exist, which priorities are in use in each (one pull
//! consumer per priority) and whether a queue is paused. Kept in the queues bucket, mirrored
//! in memory by a watch so FETCH needs no lookup on its hot path.

use std::collections::HashMap;
use std::sync::{Arc, RwLock, Weak};

use async_nats::jetstream::{self, consumer::PullConsumer, kv};

use super::puller::Puller;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::error::backend;
use super::topology::{encode_queue, Topology};
use crate::domain::error::OjsError;
use crate::domain::time;

/// A queue's entry in the queues bucket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueMeta {
    pub name: String,
    /// Priorities with a consumer, highest first.
    pub priorities: Vec<i32>,
    #[serde(default)]
    pub paused: bool,
    #[serde(with = "time::millis")]
    pub created_at: DateTime<Utc>,
}

#[derive(Clone)]
pub struct QueueRegistry {
    inner: Arc<Registry>,
}

struct Registry {
    js: jetstream::Context,
    topology: Topology,
    kv: kv::Store,
    /// Each entry with the bucket revision it was read at, so a late watch update never
    /// replaces a newer local write.
    queues: RwLock<HashMap<String, (u64, QueueMeta)>>,
    pullers: tokio::sync::Mutex<HashMap<(String, i32), Puller>>,
}

impl QueueRegistry {
    /// Loads the registry and keeps it current: a watch on the bucket for changes made by any
    /// replica, and the reset announcement.
    pub async fn start(
        client: async_nats::Client,
        js: jetstream::Context,
        topology: Topology,
        kv: kv::Store,
    ) -> Result<QueueRegistry, OjsError> {
        let mut watch = kv
            .watch_with_history(">")
            .await
            .map_err(backend("watching the queues bucket"))?;
        let mut resets = client
            .subscribe(topology.reset_subject())
            .await
            .map_err(backend("subscribing to resets"))?;
        let inner = Arc::new(Registry {
            js,
            topology,
            kv,
            queues: RwLock::new(HashMap::new()),
            pullers: tokio::sync::Mutex::new(HashMap::new()),
        });
        let weak: Weak<Registry> = Arc::downgrade(&inner);
        tokio::spawn(async move {
            while let Some(entry) = watch.next().await {
                let Some(reg) = weak.upgrade() else { break };
                match entry {
                    Ok(entry) if entry.operation == kv::Operation::Put => {
                        match serde_json::from_slice::<QueueMeta>(&entry.value) {
                            Ok(meta) => reg.remember(meta, entry.revision),
                            Err(err) => {
                                warn!(key = %entry.key, error = %err, "unreadable queue entry")
                            }
                        }
                    }
                    Ok(_) => {}
                    Err(err) => warn!(error = %err, "queue watch failed"),
                }
            }
        });
        let weak = Arc::downgrade(&inner);
        tokio::spawn(async move {
            while resets.next().await.is_some() {
                let Some(reg) = weak.upgrade() else { break };
                reg.clear();
            }
        });
        Ok(QueueRegistry { inner })
    }

    /// Forgets everything cached (after a reset).
    pub fn clear(&self) {
        self.inner.clear();
    }

    /// The queue's entry: from memory, else from the bucket.
    pub async fn lookup(&self, queue: &str) -> Result<Option<QueueMeta>, OjsError> {
        if let Some(meta) = self.inner.cached(queue) {
            return Ok(Some(meta));
        }
        let entry = self
            .inner
            .kv
            .entry(encode_queue(queue))
            .await
            .map_err(backend("reading a queue entry"))?;
        let Some(entry) = entry.filter(|e| e.operation == kv::Operation::Put) else {
            return Ok(None);
        };
        let meta = serde_json::from_slice::<QueueMeta>(&entry.value).ok();
        if let Some(meta) = &meta {
            self.inner.remember(meta.clone(), entry.revision);
        }
        Ok(meta)
    }

    /// Makes sure the queue's stream and the consumer for `priority` exist and that the
    /// registry lists the priority, before any message with that priority is published.
    pub async fn ensure(
        &self,
        queue: &str,
        priority: i32,
        now: DateTime<Utc>,
    ) -> Result<(), OjsError> {
        if self
            .inner
            .cached(queue)
            .is_some_and(|m| m.priorities.contains(&priority))
        {
            return Ok(());
        }
        let reg = &self.inner;
        let stream = super::ensure_stream(&reg.js, reg.topology.queue_stream_config(queue)).await?;
        let _: PullConsumer = stream
            .get_or_create_consumer(
                &Topology::priority_consumer(priority),
                reg.topology.priority_consumer_config(queue, priority),
            )
            .await
            .map_err(backend("creating a priority consumer"))?;
        let key = encode_queue(queue);
        loop {
            let entry = reg
                .kv
                .entry(&key)
                .await
                .map_err(backend("reading a queue entry"))?;
            let current = entry
                .as_ref()
                .filter(|e| e.operation == kv::Operation::Put)
                .and_then(|e| serde_json::from_slice::<QueueMeta>(&e.value).ok());
            let mut meta = current.clone().unwrap_or(QueueMeta {
                name: queue.to_owned(),
                priorities: Vec::new(),
                paused: false,
                created_at: now,
            });
            if !meta.priorities.contains(&priority) {
                meta.priorities.push(priority);
                meta.priorities.sort_unstable_by(|a, b| b.cmp(a));
            }
            let value = serde_json::to_vec(&meta)
                .expect("queue meta serializes")
                .into();
            let written = match (&current, &entry) {
                (Some(m), Some(e)) if m.priorities.contains(&priority) => Ok(e.revision),
                (Some(_), Some(e)) => reg
                    .kv
                    .update(&key, value, e.revision)
                    .await
                    .map_err(|e| e.kind() == kv::UpdateErrorKind::WrongLastRevision),
                _ => reg
                    .kv
                    .create(&key, value)
                    .await
                    .map_err(|e| e.kind() == kv::CreateErrorKind::AlreadyExists),
            };
            match written {
                Ok(revision) => {
                    reg.remember(meta, revision);
                    return Ok(());
                }
                Err(true) => continue, // another replica changed it; read again
                Err(false) => {
                    return Err(OjsError::backend(
                        "NATS failed while registering a queue priority",
                    ))
                }
            }
        }
    }

    /// The pull loop of one priority of a queue, started on first use.
    pub async fn puller(&self, queue: &str, priority: i32) -> Result<Puller, OjsError> {
        let mut pullers = self.inner.pullers.lock().await;
        let key = (queue.to_owned(), priority);
        if let Some(p) = pullers.get(&key) {
            return Ok(p.clone());
        }
        let puller = Puller::start(
            self.inner.js.clone(),
            &self.inner.topology.queue_stream(queue),
            &Topology::priority_consumer(priority),
        )
        .await
        .map_err(backend("subscribing for a queue"))?;
        pullers.insert(key, puller.clone());
        Ok(puller)
    }
}

impl Registry {
    fn cached(&self, queue: &str) -> Option<QueueMeta> {
        self.queues
            .read()
            .expect("queue cache lock")
            .get(queue)
            .map(|(_, meta)| meta.clone())
    }

    fn remember(&self, meta: QueueMeta, revision: u64) {
        let mut queues = self.queues.write().expect("queue cache lock");
        if queues
            .get(&meta.name)
            .is_none_or(|(seen, _)| *seen < revision)
        {
            queues.insert(meta.name.clone(), (revision, meta));
        }
    }

    fn clear(&self) {
        self.queues.write().expect("queue cache lock").clear();
    }
}
