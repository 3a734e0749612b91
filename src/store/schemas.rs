//! The schema registry (HTTP binding §15): registrations in the schemas bucket, mirrored in
//! every replica. A key is the SHA-256 of the URI, which may hold characters a key cannot.
//! Each replica compiles a schema once, when a job first names it, and PUSH checks the
//! args of every job that names one (core §7.1 step 7); a job naming none pays nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_nats::jetstream::kv;
use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

use super::cas::{self, Replica};
use super::error::backend;
use super::mirror::Mirror;
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::fields;
use crate::domain::job::JobRecord;
use crate::domain::schema::{Compiled, SchemaEntry, MAX_SCHEMAS};

/// The schemas resource, as a caller holds it: what the resource owns.
#[derive(Clone)]
pub struct Schemas {
    pub(super) own: Arc<Owned>,
}

/// What the schemas resource owns.
pub(super) struct Owned {
    pub(super) kv: kv::Store,
    pub(super) mirror: Arc<Mirror<SchemaEntry>>,
    pub(super) compiled: Mutex<CompiledByUri>,
}

/// Compiled schemas by URI, with the creation time of the entry each was compiled from (a
/// URI deleted and registered again is compiled again).
pub(super) type CompiledByUri = HashMap<String, (DateTime<Utc>, Arc<Compiled>)>;

fn key_of(uri: &str) -> String {
    Sha256::digest(uri.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Schemas {
    /// Registers a schema. A URI names one schema for good: registering it again with the
    /// same content answers the entry already there (`false`); other content is refused —
    /// a changed schema is a new version under a new URI.
    ///
    /// # Errors
    /// 409 `duplicate` for a URI registered with other content; 400 past `MAX_SCHEMAS`
    /// (counted in this replica's mirror); when NATS fails.
    pub async fn register(&self, entry: SchemaEntry) -> Result<(SchemaEntry, bool), OjsError> {
        let key = key_of(&entry.uri);
        let mirror = &self.own.mirror;
        if !mirror.contains(&key) && mirror.len() >= MAX_SCHEMAS {
            return Err(OjsError::invalid(
                "uri",
                format!("{MAX_SCHEMAS} schemas are registered, the most this server keeps; delete one first."),
            )
            .with_detail("max", MAX_SCHEMAS));
        }
        let written = cas::change(&self.own.kv, &key, "schema", &entry.uri, |old| {
            old.is_none().then(|| entry.clone())
        })
        .await?;
        let stored: SchemaEntry = written.value.expect("a registration writes or finds one");
        mirror.remember(&key, written.revision, Some(stored.clone()));
        if stored == entry {
            return Ok((stored, true));
        }
        let same = stored.job_type == entry.job_type
            && stored.version == entry.version
            && stored.schema == entry.schema;
        if same {
            return Ok((stored, false));
        }
        Err(OjsError::new(
            ErrorCode::Duplicate,
            format!(
                "Schema {} is registered with other content; register a changed schema under a new URI (a new version).",
                entry.uri
            ),
        )
        .with_detail("uri", entry.uri.as_str()))
    }

    /// Every registered schema, from this replica's mirror, by URI.
    pub fn list(&self) -> Vec<SchemaEntry> {
        let mut entries = self.own.mirror.values();
        entries.sort_by(|a, b| a.uri.cmp(&b.uri));
        entries
    }

    /// # Errors
    /// 404 for a URI not registered.
    pub async fn get(&self, uri: &str) -> Result<SchemaEntry, OjsError> {
        self.read(uri)
            .await?
            .map(|(entry, _)| entry)
            .ok_or_else(|| OjsError::not_found("schema", uri))
    }

    /// Removes a registration; jobs already enqueued naming it are unaffected, new ones
    /// naming it are refused.
    ///
    /// # Errors
    /// 404 for a URI not registered.
    pub async fn delete(&self, uri: &str) -> Result<SchemaEntry, OjsError> {
        let Some((entry, revision)) = self.read(uri).await? else {
            return Err(OjsError::not_found("schema", uri));
        };
        let key = key_of(uri);
        self.own
            .kv
            .purge(&key)
            .await
            .map_err(backend("deleting a schema"))?;
        self.own.mirror.remember(&key, revision + 1, None);
        Ok(entry)
    }

    /// Checks the args of every job that names a schema against it.
    ///
    /// # Errors
    /// 400 `schema_validation` for args that do not match, 400 for a schema not registered.
    pub(super) async fn check(&self, records: &[JobRecord]) -> Result<(), OjsError> {
        for (index, rec) in records.iter().enumerate() {
            if let Some(uri) = &rec.job.schema {
                self.compiled(uri)
                    .await
                    .and_then(|compiled| compiled.check(&rec.job.id, &rec.job.args))
                    .map_err(|err| err.with_detail("index", index))?;
            }
        }
        Ok(())
    }

    /// The compiled schema `uri` names: from this replica's memory, or compiled from the
    /// mirror's entry (read through when the mirror has not seen a registration yet).
    async fn compiled(&self, uri: &str) -> Result<Arc<Compiled>, OjsError> {
        let entry = match self.own.mirror.get(&key_of(uri)) {
            Some(entry) => entry,
            None => self.read(uri).await?.map(|(e, _)| e).ok_or_else(|| {
                OjsError::invalid(
                    "schema",
                    format!("Schema {uri} is not registered; register it with POST /ojs/v1/schemas first."),
                )
            })?,
        };
        let mut compiled = self.own.compiled.lock().expect("schemas lock");
        if let Some((at, done)) = compiled.get(uri) {
            if *at == entry.created_at {
                return Ok(done.clone());
            }
        }
        let done = Arc::new(Compiled::new(&entry)?);
        if compiled.len() >= MAX_SCHEMAS {
            compiled.clear();
        }
        compiled.insert(uri.to_owned(), (entry.created_at, done.clone()));
        Ok(done)
    }

    async fn read(&self, uri: &str) -> Result<Option<(SchemaEntry, u64)>, OjsError> {
        fields::absolute_uri(uri, "uri")?;
        let current = cas::read(&self.own.kv, &key_of(uri), Replica::Nearest, "schema").await?;
        Ok(current.value.map(|entry| (entry, current.revision)))
    }
}
