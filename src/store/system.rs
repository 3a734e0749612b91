//! Cluster-wide switches an operator sets, in the system bucket and mirrored by every
//! replica (architecture §3.31): maintenance mode.

use std::sync::Arc;

use async_nats::jetstream::kv;
use chrono::{DateTime, Utc};

use super::error::backend;
use super::mirror::Mirror;
use crate::domain::error::OjsError;
use crate::domain::maintenance::Maintenance;

/// The key of the maintenance switch.
const MAINTENANCE: &str = "maintenance";

#[derive(Clone)]
pub struct System {
    pub(super) own: Arc<Owned>,
}

pub(super) struct Owned {
    pub(super) kv: kv::Store,
    pub(super) mirror: Arc<Mirror<Maintenance>>,
}

impl System {
    /// The maintenance switch as this replica knows it.
    pub fn maintenance(&self) -> Maintenance {
        self.own.mirror.get(MAINTENANCE).unwrap_or_default()
    }

    /// Whether work is held back now: FETCH, promotions and cron ticks wait.
    pub fn in_maintenance(&self, now: DateTime<Utc>) -> bool {
        self.own
            .mirror
            .get(MAINTENANCE)
            .is_some_and(|m| m.active(now))
    }

    /// Sets the switch for every replica: one put, remembered here at once.
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn set_maintenance(&self, m: &Maintenance) -> Result<(), OjsError> {
        let value = serde_json::to_vec(m).expect("maintenance serializes");
        let revision = self
            .own
            .kv
            .put(MAINTENANCE, value.into())
            .await
            .map_err(backend("setting maintenance mode"))?;
        self.own
            .mirror
            .remember(MAINTENANCE, revision, Some(m.clone()));
        Ok(())
    }
}
