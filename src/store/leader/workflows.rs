//! The leader's advancing of workflows: the job outcomes the event publisher sees, and the
//! workflow timers, decide each workflow's next steps.

use std::collections::HashMap;

use super::Leader;
use crate::domain::error::{ErrorCode, OjsError};
use crate::domain::job::Slot;
use crate::domain::workflow::{self, Seen, WorkflowRecord, WorkflowState};
use crate::store::cas::{self, Replica};

impl Leader {
    /// The workflow timer fired (leader): a root never marked ready was abandoned by its
    /// creation and is cancelled; a cancelled workflow has its cancellations repeated.
    pub(in crate::store) async fn workflow_timer_fired(&self, id: &str) -> Result<(), OjsError> {
        let kv = &self.workflows.own.kv;
        let Some(record) = cas::read::<WorkflowRecord>(kv, id, Replica::Leader, "workflow")
            .await?
            .value
        else {
            return Ok(());
        };
        if record.state == WorkflowState::Cancelled {
            self.workflows
                .carry_out(&record, &workflow::cancellations(&record))
                .await?;
        } else if !record.ready && record.state == WorkflowState::Running {
            tracing::warn!(
                workflow_id = id,
                "a workflow's creation was cut short; cancelling it"
            );
            self.workflows.cancel_nested(id).await?;
        }
        Ok(())
    }

    /// Leader: moves each workflow on by what its members' writes showed, in order, one
    /// read and one compare-and-set per workflow. A workflow that cannot be moved on for a
    /// reason other than NATS being unreachable is logged and passed over: held back, it
    /// would stop the events of every job after it.
    ///
    /// # Errors
    /// When NATS does not answer; everything done so far is idempotent, so the caller
    /// repeats it.
    pub async fn advance_workflows(&self, seen: &[(String, Slot, Seen)]) -> Result<(), OjsError> {
        let mut order: Vec<&str> = Vec::new();
        let mut by_workflow: HashMap<&str, Vec<(Slot, Seen)>> = HashMap::new();
        for (id, slot, what) in seen {
            by_workflow
                .entry(id.as_str())
                .or_insert_with(|| {
                    order.push(id.as_str());
                    Vec::new()
                })
                .push((*slot, what.clone()));
        }
        for id in order {
            match self.workflows.apply_seen(id, &by_workflow[id]).await {
                Err(err) if err.code == ErrorCode::BackendUnavailable => return Err(err),
                Err(err) => {
                    tracing::error!(workflow_id = id, error = %err.with_causes(), "passing over a workflow that cannot be moved on");
                }
                Ok(()) => {}
            }
        }
        Ok(())
    }
}
