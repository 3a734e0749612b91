//! Names and settings of every JetStream object ojs-jetstream owns (docs/architecture.md,
//! "Topology"). One function per name so the mapping is written down once.

use std::time::Duration;

use async_nats::jetstream::consumer::{self, AckPolicy, DeliverPolicy};
use async_nats::jetstream::stream::{self, DiscardPolicy, RetentionPolicy, StorageType};

use crate::domain::rate_limit::RateLimit;
use crate::domain::state::JobState;
use crate::domain::stats_history::Resolution;

/// Name (and name prefix) of the event publisher's consumers on the jobs stream.
const EVENT_PUBLISHER: &str = "event-publisher";
/// Prefix of the timer scheduler's consumers, one per leadership.
const SCHEDULER: &str = "scheduler";
/// How long the events stream drops a republished event (one with a known id).
const EVENT_DEDUP_WINDOW: Duration = Duration::from_secs(120);

/// Everything derived from the namespace and the storage settings.
#[derive(Debug, Clone)]
pub struct Topology {
    pub namespace: String,
    pub replicas: usize,
    pub storage: StorageType,
    pub ack_wait: Duration,
    pub job_history: i64,
    pub events_max_age: Duration,
    pub dead_letter_max_age: Duration,
    pub dead_letter_max_count: i64,
    pub lease_ttl: Duration,
    /// How long finished jobs stay readable; `None`: for ever.
    pub finished_jobs_max_age: Option<Duration>,
}

/// Stream names may not contain `.`, queue names may; queue names never contain `_`, so
/// swapping one for the other is injective.
pub fn encode_queue(queue: &str) -> String {
    queue.replace('.', "_")
}

/// The queue an encoded name stands for.
pub fn decode_queue(encoded: &str) -> String {
    encoded.replace('_', ".")
}

impl Topology {
    pub fn jobs_bucket(&self) -> String {
        format!("{}-jobs", self.namespace)
    }

    pub fn queues_bucket(&self) -> String {
        format!("{}-queues", self.namespace)
    }

    pub fn cron_bucket(&self) -> String {
        format!("{}-cron", self.namespace)
    }

    /// Schemas for job arguments (`schemas.rs`).
    pub fn schemas_bucket(&self) -> String {
        format!("{}-schemas", self.namespace)
    }

    pub fn workers_bucket(&self) -> String {
        format!("{}-workers", self.namespace)
    }

    pub fn workflows_bucket(&self) -> String {
        format!("{}-workflows", self.namespace)
    }

    /// Queue statistics: the counters of each queue and how far the leader counted.
    pub fn stats_bucket(&self) -> String {
        format!("{}-stats", self.namespace)
    }

    /// Unique-job locks, keyed by the hash of a job's unique key.
    pub fn unique_bucket(&self) -> String {
        format!("{}-unique", self.namespace)
    }

    pub fn batches_bucket(&self) -> String {
        format!("{}-batches", self.namespace)
    }

    pub fn leases_bucket(&self) -> String {
        format!("{}-leases", self.namespace)
    }

    /// Where leader services keep how far they got (the pruner's cursor).
    /// Cluster-wide switches (maintenance mode, architecture §3.31).
    pub fn system_bucket(&self) -> String {
        format!("{}-system", self.namespace)
    }

    pub fn coordinator_bucket(&self) -> String {
        format!("{}-coordinator", self.namespace)
    }

    pub fn events_stream(&self) -> String {
        format!("{}-events", self.namespace)
    }

    pub fn event_subject(&self, event_type: &str) -> String {
        format!("{}.events.{event_type}", self.namespace)
    }

    /// Dead-letter entries, one subject per queue.
    pub fn dead_letter_stream(&self) -> String {
        format!("{}-dead-letter", self.namespace)
    }

    pub fn dead_letter_subject(&self, queue: &str) -> String {
        format!("{}.dlq.{}", self.namespace, encode_queue(queue))
    }

    /// Retention is the stream's limits: NATS drops entries past either one, oldest first.
    pub fn dead_letter_stream_config(&self) -> stream::Config {
        stream::Config {
            name: self.dead_letter_stream(),
            subjects: vec![format!("{}.dlq.*", self.namespace)],
            retention: RetentionPolicy::Limits,
            max_age: self.dead_letter_max_age,
            max_messages: self.dead_letter_max_count,
            discard: DiscardPolicy::Old,
            storage: self.storage,
            num_replicas: self.replicas,
            allow_direct: true,
            ..Default::default()
        }
    }

    /// The statistics history of one resolution (architecture §3.30): a sample of each
    /// queue's running totals per minute or per hour, on `<ns>.stats.<resolution>.<queue>`.
    pub fn stats_history_stream(&self, resolution: Resolution) -> String {
        format!("{}-stats-{}", self.namespace, resolution.as_str())
    }

    pub fn stats_history_subject(&self, resolution: Resolution, queue: &str) -> String {
        format!(
            "{}.stats.{}.{}",
            self.namespace,
            resolution.as_str(),
            encode_queue(queue)
        )
    }

    pub fn stats_history_stream_config(&self, resolution: Resolution) -> stream::Config {
        stream::Config {
            name: self.stats_history_stream(resolution),
            subjects: vec![format!(
                "{}.stats.{}.*",
                self.namespace,
                resolution.as_str()
            )],
            retention: RetentionPolicy::Limits,
            max_age: resolution.kept().to_std().unwrap_or_default(),
            // Two leaders sampling one minute write one sample (its id names the minute).
            duplicate_window: Duration::from_secs(120),
            storage: self.storage,
            num_replicas: self.replicas,
            ..Default::default()
        }
    }

    /// The leader's index of the jobs in `state` (`completed`, `cancelled`, `pending`),
    /// one subject per job (architecture §3.26).
    pub fn finished_stream(&self, state: JobState) -> String {
        format!("{}-finished-{state}", self.namespace)
    }

    /// The subjects of one queue's entries in the index of `state`, up to the job id.
    pub fn finished_queue_prefix(&self, state: JobState, queue: &str) -> String {
        format!(
            "{}.finished.{state}.{}.",
            self.namespace,
            encode_queue(queue)
        )
    }

    pub fn finished_subject(&self, state: JobState, queue: &str, id: &str) -> String {
        format!("{}{id}", self.finished_queue_prefix(state, queue))
    }

    /// One entry per job (a repeated publish replaces it). Entries of terminal states
    /// outlive the records they name by an hour, then NATS drops them, so pruning a job
    /// needs no removal here; `pending` entries are removed when the job is released.
    pub fn finished_stream_config(&self, state: JobState) -> stream::Config {
        let max_age = match (state, self.finished_jobs_max_age) {
            (JobState::Completed | JobState::Cancelled | JobState::Discarded, Some(age)) => {
                age + Duration::from_secs(3600)
            }
            _ => Duration::ZERO,
        };
        stream::Config {
            name: self.finished_stream(state),
            subjects: vec![format!("{}.finished.{state}.>", self.namespace)],
            retention: RetentionPolicy::Limits,
            max_messages_per_subject: 1,
            max_age,
            storage: self.storage,
            num_replicas: self.replicas,
            allow_direct: true,
            ..Default::default()
        }
    }

    /// Pending timers: retry backoff, scheduled jobs, expiry, job deadlines, worker silence.
    pub fn timers_stream(&self) -> String {
        format!("{}-timers", self.namespace)
    }

    pub fn timers_subject(&self) -> String {
        format!("{}.timers", self.namespace)
    }

    /// The timer scheduler's consumer of the timers stream for the leadership `term`.
    pub fn scheduler_consumer(term: u64) -> String {
        format!("{SCHEDULER}-{term}")
    }

    /// The term of a timer-scheduler consumer, from its name; 0 for the single consumer of
    /// earlier versions.
    pub fn scheduler_term(name: &str) -> Option<u64> {
        term_of(SCHEDULER, name)
    }

    pub fn timers_stream_config(&self) -> stream::Config {
        stream::Config {
            name: self.timers_stream(),
            subjects: vec![self.timers_subject()],
            retention: RetentionPolicy::WorkQueue,
            storage: self.storage,
            num_replicas: self.replicas,
            duplicate_window: Duration::from_secs(120),
            // Admin listings read pending timers by sequence (architecture §3.26).
            allow_direct: true,
            ..Default::default()
        }
    }

    /// Prefix shared by every queue stream, used only by the admin reset.
    pub fn queue_stream_prefix(&self) -> String {
        format!("{}-q-", self.namespace)
    }

    pub fn queue_stream(&self, queue: &str) -> String {
        format!("{}{}", self.queue_stream_prefix(), encode_queue(queue))
    }

    pub fn queue_subject(&self, queue: &str, priority: i32) -> String {
        format!("{}.q.{}.{priority}", self.namespace, encode_queue(queue))
    }

    /// Every priority's subject of `queue`: its stream's subjects.
    pub fn queue_subject_filter(&self, queue: &str) -> String {
        format!("{}.q.{}.*", self.namespace, encode_queue(queue))
    }

    /// Prefix of the queues' rate-limit streams, used only by the admin reset.
    pub fn rate_stream_prefix(&self) -> String {
        format!("{}-rate-", self.namespace)
    }

    /// A rate-limited queue's starts of the current window (`rate_limit.rs`).
    pub fn rate_stream(&self, queue: &str) -> String {
        format!("{}{}", self.rate_stream_prefix(), encode_queue(queue))
    }

    /// The subject of a queue's starts in window `window` (`RateLimit::window_index`).
    pub fn rate_subject(&self, queue: &str, window: i64) -> String {
        format!("{}.rate.{}.{window}", self.namespace, encode_queue(queue))
    }

    /// One message per start on the subject of its window: NATS refuses a start past the
    /// limit (discard new per subject). A window's subject is never published to once it
    /// has passed, so NATS forgetting its starts (max age) is only cleanup — its expiry runs
    /// up to 250 ms late on nats-server 2.10+, which would hold back the next starts if the
    /// age decided the limit. In memory: starts are worth nothing after their window.
    pub fn rate_stream_config(&self, queue: &str, limit: RateLimit) -> stream::Config {
        stream::Config {
            name: self.rate_stream(queue),
            subjects: vec![format!("{}.rate.{}.*", self.namespace, encode_queue(queue))],
            retention: RetentionPolicy::Limits,
            max_messages_per_subject: limit.limit as i64,
            max_age: limit.token_max_age(),
            discard: DiscardPolicy::New,
            discard_new_per_subject: true,
            storage: StorageType::Memory,
            num_replicas: self.replicas,
            ..Default::default()
        }
    }

    /// Prefix of the queues' concurrency streams, used only by the admin reset.
    pub fn slot_stream_prefix(&self) -> String {
        format!("{}-slots-", self.namespace)
    }

    /// A concurrency-limited queue's running jobs, one message each (`rate_limit.rs`).
    pub fn slot_stream(&self, queue: &str) -> String {
        format!("{}{}", self.slot_stream_prefix(), encode_queue(queue))
    }

    pub fn slot_subject(&self, queue: &str) -> String {
        format!("{}.slot.{}", self.namespace, encode_queue(queue))
    }

    /// One message per job running: NATS refuses a start past the limit (discard new per
    /// subject); a job's end deletes its message. Stored like the jobs (a NATS restart
    /// must not forget which jobs run).
    pub fn slot_stream_config(&self, queue: &str, concurrency: u64) -> stream::Config {
        stream::Config {
            name: self.slot_stream(queue),
            subjects: vec![self.slot_subject(queue)],
            retention: RetentionPolicy::Limits,
            max_messages_per_subject: concurrency as i64,
            discard: DiscardPolicy::New,
            discard_new_per_subject: true,
            storage: self.storage,
            num_replicas: self.replicas,
            ..Default::default()
        }
    }

    /// Prefix of the bounded queues' depth streams, used only by the admin reset.
    pub fn depth_stream_prefix(&self) -> String {
        format!("{}-depth-", self.namespace)
    }

    /// A bounded queue's unfinished jobs, one token each (`store/queues/backpressure.rs`).
    pub fn depth_stream(&self, queue: &str) -> String {
        format!("{}{}", self.depth_stream_prefix(), encode_queue(queue))
    }

    pub fn depth_subject(&self, queue: &str) -> String {
        format!("{}.depth.{}", self.namespace, encode_queue(queue))
    }

    /// One token (body: the job id) per unfinished job: NATS refuses a token past
    /// `max_depth` (discard new); a job's end deletes its token. In memory: deleting from a
    /// file stream is too slow on nats-server 2.11+ for the leader to keep up (architecture
    /// §3.27); a restart of every NATS node forgets the tokens, and the queue counts from 0.
    pub fn depth_stream_config(&self, queue: &str, max_depth: u64) -> stream::Config {
        stream::Config {
            name: self.depth_stream(queue),
            subjects: vec![self.depth_subject(queue)],
            retention: RetentionPolicy::Limits,
            max_messages: max_depth as i64,
            discard: DiscardPolicy::New,
            storage: StorageType::Memory,
            num_replicas: self.replicas,
            ..Default::default()
        }
    }

    /// One pull consumer per priority in use; FETCH asks them highest first.
    pub fn priority_consumer(priority: i32) -> String {
        format!("p{priority}")
    }

    /// Core NATS subject on which replicas learn that the admin reset wiped the data.
    pub fn reset_subject(&self) -> String {
        format!("{}.control.reset", self.namespace)
    }

    /// Core NATS subject on which the leader announces how far its event publisher has
    /// handled job writes (`store/events/handled.rs`).
    pub fn events_handled_subject(&self) -> String {
        format!("{}.control.events-handled", self.namespace)
    }

    /// The durable consumer through which the leadership of `term` turns job-record writes
    /// into events: one per leadership, so a replica that leads no longer cannot acknowledge
    /// writes for the one that does (architecture §3.4).
    pub fn event_publisher_consumer(&self, term: u64) -> String {
        format!("{EVENT_PUBLISHER}-{term}")
    }

    /// The term of an event-publisher consumer, from its name; 0 for the single consumer
    /// of earlier versions.
    pub fn event_publisher_term(name: &str) -> Option<u64> {
        term_of(EVENT_PUBLISHER, name)
    }

    /// A key-value bucket's backing stream, created directly: async-nats'
    /// `create_key_value` cannot parse nats-server 2.9's account info.
    pub fn bucket_stream(&self, bucket: &str, history: i64, max_age: Duration) -> stream::Config {
        stream::Config {
            name: format!("KV_{bucket}"),
            subjects: vec![format!("$KV.{bucket}.>")],
            max_messages_per_subject: history,
            max_age,
            storage: self.storage,
            num_replicas: self.replicas,
            allow_rollup: true,
            deny_delete: true,
            allow_direct: true,
            discard: DiscardPolicy::New,
            ..Default::default()
        }
    }

    /// A queue: work-queue retention, so a settled message is gone.
    pub fn queue_stream_config(&self, queue: &str) -> stream::Config {
        stream::Config {
            name: self.queue_stream(queue),
            subjects: vec![self.queue_subject_filter(queue)],
            retention: RetentionPolicy::WorkQueue,
            storage: self.storage,
            num_replicas: self.replicas,
            duplicate_window: Duration::from_secs(120),
            // Admin listings read waiting jobs by sequence (architecture §3.26).
            allow_direct: true,
            ..Default::default()
        }
    }

    pub fn priority_consumer_config(&self, queue: &str, priority: i32) -> consumer::pull::Config {
        consumer::pull::Config {
            durable_name: Some(Topology::priority_consumer(priority)),
            filter_subject: self.queue_subject(queue, priority),
            ack_policy: AckPolicy::Explicit,
            ack_wait: self.ack_wait,
            deliver_policy: DeliverPolicy::All,
            // Every active job holds one unacknowledged message; never let that stall a queue.
            max_ack_pending: 1_000_000,
            num_replicas: self.replicas,
            ..Default::default()
        }
    }

    pub fn events_stream_config(&self) -> stream::Config {
        stream::Config {
            name: self.events_stream(),
            subjects: vec![format!("{}.events.>", self.namespace)],
            retention: RetentionPolicy::Limits,
            max_age: self.events_max_age,
            storage: self.storage,
            num_replicas: self.replicas,
            // Republished events (same id) are dropped within this window; NATS refuses a
            // window longer than the stream's max age, so a shorter retention shortens it.
            duplicate_window: match self.events_max_age {
                Duration::ZERO => EVENT_DEDUP_WINDOW,
                max_age => max_age.min(EVENT_DEDUP_WINDOW),
            },
            allow_direct: true,
            ..Default::default()
        }
    }

    /// Acknowledging a write acknowledges every earlier one too: the publisher handles the
    /// writes in order and acknowledges once per batch. Starts after `floor`, the last write
    /// the leadership before acknowledged (0: from the first).
    pub fn event_publisher_config(&self, term: u64, floor: u64) -> consumer::pull::Config {
        consumer::pull::Config {
            durable_name: Some(self.event_publisher_consumer(term)),
            ack_policy: AckPolicy::All,
            // Redelivered after this long to the same leadership (a failed pull).
            ack_wait: Duration::from_secs(5),
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: floor + 1,
            },
            // Writes stay unacknowledged while the deadline watch needs them (§3.6): a
            // couple of seconds of writes at full speed.
            max_ack_pending: 1_000_000,
            num_replicas: self.replicas,
            ..Default::default()
        }
    }
}

/// The term in the name of a consumer made per leadership (`<prefix>-<term>`); 0 for the
/// unnumbered `<prefix>` of earlier versions; `None` for other names.
fn term_of(prefix: &str, name: &str) -> Option<u64> {
    match name.strip_prefix(prefix)? {
        "" => Some(0),
        rest => rest.strip_prefix('-')?.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topo() -> Topology {
        Topology {
            namespace: "ojs".into(),
            replicas: 1,
            storage: StorageType::File,
            ack_wait: Duration::from_secs(60),
            job_history: 5,
            events_max_age: Duration::from_secs(60),
            dead_letter_max_age: Duration::from_secs(60),
            dead_letter_max_count: 10,
            lease_ttl: Duration::from_secs(3),
            finished_jobs_max_age: Some(Duration::from_secs(7 * 24 * 3600)),
        }
    }

    #[test]
    fn queue_names_map_to_distinct_stream_names_and_subjects() {
        assert_eq!(decode_queue(&encode_queue("email.v2")), "email.v2");
        let t = topo();
        assert_eq!(t.queue_stream("reports.eu"), "ojs-q-reports_eu");
        assert_ne!(t.queue_stream("a.b"), t.queue_stream("a-b"));
        assert_eq!(t.queue_subject("reports.eu", -10), "ojs.q.reports_eu.-10");
        assert_eq!(t.event_subject("job.completed"), "ojs.events.job.completed");
    }

    #[test]
    fn the_event_dedup_window_fits_in_the_events_retention() {
        let mut t = topo();
        t.events_max_age = Duration::from_secs(20);
        assert_eq!(
            t.events_stream_config().duplicate_window,
            Duration::from_secs(20)
        );
        t.events_max_age = Duration::from_secs(86_400);
        assert_eq!(
            t.events_stream_config().duplicate_window,
            Duration::from_secs(120)
        );
        t.events_max_age = Duration::ZERO; // no limit
        assert_eq!(
            t.events_stream_config().duplicate_window,
            Duration::from_secs(120)
        );
    }

    #[test]
    fn event_publisher_consumers_are_named_by_term() {
        let t = topo();
        assert_eq!(t.event_publisher_consumer(42), "event-publisher-42");
        assert_eq!(
            Topology::event_publisher_term("event-publisher-42"),
            Some(42)
        );
        assert_eq!(Topology::event_publisher_term("event-publisher"), Some(0));
        for other in [
            "event-publisherx",
            "event-publisher-",
            "event-publisher-x",
            "p1",
        ] {
            assert_eq!(Topology::event_publisher_term(other), None, "{other}");
        }
    }

    #[test]
    fn scheduler_consumers_are_named_by_term() {
        assert_eq!(Topology::scheduler_consumer(7), "scheduler-7");
        assert_eq!(Topology::scheduler_term("scheduler-7"), Some(7));
        assert_eq!(Topology::scheduler_term("scheduler"), Some(0));
        for other in ["schedulerx", "scheduler-", "event-publisher-7"] {
            assert_eq!(Topology::scheduler_term(other), None, "{other}");
        }
    }
}
