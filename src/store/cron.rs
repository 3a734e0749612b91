//! Cron registrations in the cron bucket (key = encoded name), mirrored in every replica for
//! listing. The leader fires their ticks (`leader/cron.rs`).

use std::sync::Arc;

use async_nats::jetstream::kv;

use super::cas::{self, Cas, Replica};
use super::connection::Connection;
use super::error::backend;
use super::mirror::Mirror;
use super::topology::encode_queue;
use crate::domain::cron::{self, CronEntry};
use crate::domain::error::OjsError;

/// The cron entries resource, as a caller holds it: the connection and what the resource owns.
#[derive(Clone)]
pub struct Cron {
    pub(super) conn: Arc<Connection>,
    pub(super) own: Arc<Owned>,
}

/// What the cron entries resource owns.
pub(super) struct Owned {
    pub(super) kv: kv::Store,
    /// Every replica's copy of the cron bucket, for listings and the leader's schedule.
    pub(super) mirror: CronMirror,
}

pub(super) type CronMirror = Arc<Mirror<CronEntry>>;

impl Cron {
    /// Registers or replaces a cron entry (cron spec §8.1 upsert). Run statistics of an
    /// existing entry are kept; the next run is computed now. `true` when it is new.
    ///
    /// # Errors
    /// 413 for an entry over `max_job_bytes`, 400 for a new one past `max_cron_entries`
    /// (counted in this replica's mirror); when NATS fails.
    pub async fn register(&self, mut entry: CronEntry) -> Result<(CronEntry, bool), OjsError> {
        let key = encode_queue(&entry.name);
        entry.next_run_at = if entry.enabled {
            entry.schedule()?.next_after(entry.created_at)
        } else {
            None
        };
        let mirror = &self.own.mirror;
        cron::admit(
            &entry,
            !mirror.contains(&key),
            mirror.len(),
            (self.conn.max_job_bytes(), self.conn.max_cron_entries),
        )?;
        let mut is_new = false;
        let written = cas::change(
            &self.own.kv,
            &key,
            "cron entry",
            &entry.name,
            |old: Option<&CronEntry>| {
                is_new = old.is_none();
                let mut next = entry.clone();
                if let Some(old) = old {
                    next.created_at = old.created_at;
                    next.run_count = old.run_count;
                    next.last_run_at = old.last_run_at;
                    next.last_job_id.clone_from(&old.last_job_id);
                    next.recent_job_ids.clone_from(&old.recent_job_ids);
                }
                Some(next)
            },
        )
        .await?;
        let entry = written.value.expect("a cron registration always writes");
        self.own
            .mirror
            .remember(&key, written.revision, Some(entry.clone()));
        Ok((entry, is_new))
    }

    /// Every registered entry, from this replica's mirror.
    pub fn list(&self) -> Vec<CronEntry> {
        let mut entries = self.own.mirror.values();
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        entries
    }

    /// # Errors
    /// 404 for an unknown name.
    pub async fn get(&self, name: &str) -> Result<CronEntry, OjsError> {
        self.read_cron(&encode_queue(name))
            .await?
            .map(|(e, _)| e)
            .ok_or_else(|| OjsError::not_found("cron entry", name))
    }

    /// Removes an entry; jobs it already enqueued are unaffected.
    ///
    /// # Errors
    /// 404 for an unknown name.
    pub async fn delete(&self, name: &str) -> Result<CronEntry, OjsError> {
        let key = encode_queue(name);
        let Some((entry, revision)) = self.read_cron(&key).await? else {
            return Err(OjsError::not_found("cron entry", name));
        };
        self.own
            .kv
            .purge(&key)
            .await
            .map_err(backend("deleting a cron entry"))?;
        self.own.mirror.remember(&key, revision + 1, None);
        Ok(entry)
    }

    pub(super) async fn read_cron(&self, key: &str) -> Result<Option<(CronEntry, u64)>, OjsError> {
        let current = cas::read(&self.own.kv, key, Replica::Nearest, "cron entry").await?;
        Ok(current.value.map(|entry| (entry, current.revision)))
    }

    /// Writes with a revision check; `None` back when another writer won.
    pub(super) async fn write_cron(
        &self,
        key: &str,
        entry: &CronEntry,
        revision: u64,
    ) -> Result<Option<u64>, OjsError> {
        let value = serde_json::to_vec(entry).expect("cron entries serialize");
        let doing = "writing a cron entry";
        match cas::write(&self.own.kv, key, value.into(), revision, doing).await? {
            Cas::Written(rev) => {
                self.own.mirror.remember(key, rev, Some(entry.clone()));
                Ok(Some(rev))
            }
            Cas::Refused(_) => Ok(None),
        }
    }
}
