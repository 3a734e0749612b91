//! Pure OJS: the envelope, its validation, the state machine, retry math, events,
//! retention, queue statistics, batches and bulk requests.
//! Nothing here does I/O or reads the clock; callers pass `now` and randomness in.

pub mod backpressure;
pub mod batch;
pub mod bulk;
pub mod claim;
pub mod cron;
pub mod duration;
pub mod envelope;
pub mod error;
pub mod event;
pub mod fields;
#[cfg(test)]
pub(crate) mod fixtures;
pub mod horizon;
pub mod job;
pub mod lanes;
pub mod lifecycle;
pub mod listing;
pub mod maintenance;
pub mod progress;
pub mod queue_config;
pub mod rate_limit;
pub mod requests;
pub mod retention;
pub mod retry;
pub mod schema;
pub mod spans;
pub mod state;
pub mod stats;
pub mod stats_history;
pub mod time;
pub mod totals;
pub mod trail;
pub mod unique;
pub mod worker;
pub mod workflow;
