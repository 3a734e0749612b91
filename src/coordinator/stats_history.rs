//! Leader service: samples every queue's running totals once a minute (and once an hour
//! for the month-long history) into the statistics history streams (architecture §3.30),
//! for `GET /admin/stats/history` and the dashboard's graphs.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, DurationRound, TimeDelta, Timelike, Utc};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::progress::Pulse;
use crate::domain::error::OjsError;
use crate::domain::stats_history::{Resolution, Sample, ALL_QUEUES};
use crate::store::Store;

/// How long a queue's totals may go unsampled while unchanged: a history read starts this
/// far (with a margin, `Resolution::lookback`) before its first period to find them.
const RESAMPLE: TimeDelta = TimeDelta::minutes(10);

pub struct StatsHistory {
    store: Store,
    /// The last sample stored of each queue this leadership: a queue unchanged since is
    /// sampled again only `RESAMPLE` later (its history carries the last totals on).
    last: HashMap<String, Sample>,
}

impl StatsHistory {
    pub fn new(store: Store) -> StatsHistory {
        StatsHistory {
            store,
            last: HashMap::new(),
        }
    }

    /// Works (`pulse`) through one round a minute, just after the minute begins.
    pub async fn run(mut self, cancel: CancellationToken, pulse: Pulse) {
        loop {
            let now = Utc::now();
            let minute = now.duration_trunc(TimeDelta::minutes(1)).unwrap_or(now);
            let next = minute + TimeDelta::minutes(1);
            let wait = (next - now).to_std().unwrap_or_default() + Duration::from_millis(200);
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            pulse.working();
            if let Err(err) = self.run_once(next).await {
                warn!(error = %err, "could not sample the statistics history; the next minute's sample covers this one");
            }
            pulse.idle();
        }
    }

    /// Samples every queue at `at` (a minute's start): each one changed since its last
    /// sample or unsampled for `RESAMPLE`, and the sum of all, always; at an hour's start the hourly history too.
    ///
    /// # Errors
    /// When NATS fails.
    pub async fn run_once(&mut self, at: DateTime<Utc>) -> Result<(), OjsError> {
        let counts = self.store.stats().all_queue_counts().await?;
        let samples: Vec<(String, Sample)> = counts
            .iter()
            .map(|(queue, c)| (queue.clone(), Sample::of(c, at)))
            .collect();
        let all = Sample::total(samples.iter().map(|(_, s)| s), at);
        let mut minute: Vec<(String, Sample)> = samples
            .iter()
            .filter(|(queue, s)| {
                self.last
                    .get(queue)
                    .is_none_or(|l| s.changed_from(l) || s.at - l.at >= RESAMPLE)
            })
            .cloned()
            .collect();
        minute.push((ALL_QUEUES.to_owned(), all.clone()));
        self.store
            .stats()
            .record_samples(Resolution::Minutes, &minute)
            .await?;
        if at.minute() == 0 {
            let mut hour = samples.clone();
            hour.push((ALL_QUEUES.to_owned(), all));
            self.store
                .stats()
                .record_samples(Resolution::Hours, &hour)
                .await?;
        }
        for (queue, sample) in minute {
            self.last.insert(queue, sample);
        }
        Ok(())
    }
}
