//! The event publisher's release of the unique locks of jobs that ended.

use futures::StreamExt;

use super::Leader;

/// Locks the leader releases side by side (a batch of writes may end many unique jobs).
const RELEASES_AT_ONCE: usize = 64;

impl Leader {
    /// Leader: removes the locks of unique jobs whose last write ended them (a final state
    /// outside their policy's `states`), each only while it still names its job. A lock
    /// left behind is harmless: the next enqueue of its key reads the job and takes it over.
    pub async fn release_unique_locks(&self, ended: &[(String, String)]) {
        futures::stream::iter(ended)
            .for_each_concurrent(RELEASES_AT_ONCE, |(key, job_id)| {
                self.jobs.release_lock(key, job_id)
            })
            .await;
    }
}
