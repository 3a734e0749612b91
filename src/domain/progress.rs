//! Job progress (progress spec §5–§6; the clients' `POST /workers/progress`): the update a
//! worker sends, what it does to an active job's record — numeric progress clamped to
//! [0, 1] and never decreasing within an attempt, every update also a heartbeat — and the
//! throttle that lets at most one progress write a second per job reach the jobs bucket
//! from one gateway. Pure: callers pass the time.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};

use super::envelope::too_large;
use super::error::OjsError;
use super::fields::{self, present, type_error};
use super::job::{JobRecord, Transition};
use super::lifecycle::{self, MAX_PROGRESS_DATA_BYTES, MAX_PROGRESS_MESSAGE_BYTES};
use super::requests::{job_id, worker_id};

/// Shortest time between two progress writes of one job by one gateway (spec §6.2).
pub const WRITE_INTERVAL: Duration = Duration::from_secs(1);
/// Jobs the throttle tracks before it forgets those idle for a whole interval.
const TRACKED: usize = 4096;

/// One progress update, validated.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Update {
    /// Clamped to [0, 1].
    pub value: Option<f64>,
    pub data: Option<Map<String, Value>>,
    pub message: Option<String>,
    /// The worker that sent it: the job must be that worker's.
    pub worker_id: Option<String>,
}

impl Update {
    /// `PUT /jobs/{id}/progress`: `{progress: 0..1, data?, message?, worker_id?}`.
    ///
    /// # Errors
    /// 400 for a mistyped field or an update that says nothing, 413 for `data` or
    /// `message` over their limits.
    pub fn from_put(body: &Map<String, Value>) -> Result<Update, OjsError> {
        parse(body, "progress", 1.0)
    }

    /// `POST /workers/progress`: `{job_id, percentage: 0..100, message?, data?}`; the id
    /// and the update.
    ///
    /// # Errors
    /// As [`Update::from_put`], and 400/404 for a missing or malformed `job_id`.
    pub fn from_worker(body: &Map<String, Value>) -> Result<(String, Update), OjsError> {
        Ok((job_id(body)?, parse(body, "percentage", 100.0)?))
    }

    /// This update followed by `later`: the higher value, the latest data and message.
    pub fn merge(self, later: Update) -> Update {
        Update {
            value: match (self.value, later.value) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            },
            data: later.data.or(self.data),
            message: later.message.or(self.message),
            worker_id: later.worker_id.or(self.worker_id),
        }
    }
}

fn parse(body: &Map<String, Value>, value_field: &str, scale: f64) -> Result<Update, OjsError> {
    let value = match present(body.get(value_field)) {
        None => None,
        Some(Value::Number(n)) => n.as_f64().map(|v| (v / scale).clamp(0.0, 1.0)),
        Some(other) => return Err(type_error(value_field, "a number", other)),
    };
    let data = fields::object(body.get("data"), "data")?.cloned();
    if let Some(d) = &data {
        let bytes = serde_json::to_vec(d).map_or(usize::MAX, |b| b.len());
        if bytes > MAX_PROGRESS_DATA_BYTES {
            return Err(too_large("data", bytes, MAX_PROGRESS_DATA_BYTES));
        }
    }
    let message = fields::string(body.get("message"), "message")?.map(str::to_owned);
    if let Some(m) = &message {
        if m.len() > MAX_PROGRESS_MESSAGE_BYTES {
            return Err(too_large("message", m.len(), MAX_PROGRESS_MESSAGE_BYTES));
        }
    }
    if value.is_none() && data.is_none() && message.is_none() {
        return Err(OjsError::invalid(
            value_field,
            format!("A progress update needs {value_field}, data or message."),
        ));
    }
    Ok(Update {
        value,
        data,
        message,
        worker_id: worker_id(body)?,
    })
}

/// The record after `update`, which is also a heartbeat extending the reservation by
/// `visibility`; `None` when it is to be ignored (spec §6.1): the job is not active, or is
/// held by another worker than the one the update names.
pub fn apply(
    rec: &JobRecord,
    now: DateTime<Utc>,
    update: &Update,
    visibility: Duration,
) -> Option<JobRecord> {
    let holder = rec.holder.as_ref()?.worker_id.as_deref();
    let worker = update.worker_id.as_deref().or(holder).unwrap_or_default();
    let mut next = lifecycle::heartbeat(rec, now, worker, visibility)?;
    let job = &mut next.job;
    if let Some(value) = update.value {
        job.progress = Some(job.progress.map_or(value, |was| was.max(value)));
    }
    if update.data.is_some() {
        job.progress_data.clone_from(&update.data);
    }
    if update.message.is_some() {
        job.progress_message.clone_from(&update.message);
    }
    job.progress_updated_at = Some(now);
    next.transition = Transition::Progressed;
    Some(next)
}

/// What the throttle says of an update.
#[derive(Debug, Clone, PartialEq)]
pub enum Admit {
    /// Write it now.
    Now(Update),
    /// Kept; write what has gathered at this instant (no flush is waiting yet).
    FlushAt(Instant),
    /// Merged into what a waiting flush will write.
    Merged,
}

#[derive(Debug)]
struct Slot {
    last_write: Instant,
    waiting: Option<Update>,
}

/// Per-job spacing of progress writes: the first update of a job is written at once, later
/// ones within [`WRITE_INTERVAL`] of the last write gather into one write at the interval's
/// end, which carries the latest of them (spec §6.2: the most recent value is stored).
#[derive(Debug, Default)]
pub struct Throttle {
    jobs: HashMap<String, Slot>,
}

impl Throttle {
    pub fn admit(&mut self, id: &str, update: Update, now: Instant) -> Admit {
        if self.jobs.len() >= TRACKED {
            self.jobs.retain(|_, s| {
                s.waiting.is_some() || now.duration_since(s.last_write) < WRITE_INTERVAL
            });
        }
        let Some(slot) = self.jobs.get_mut(id) else {
            self.jobs.insert(
                id.to_owned(),
                Slot {
                    last_write: now,
                    waiting: None,
                },
            );
            return Admit::Now(update);
        };
        match slot.waiting.take() {
            Some(waiting) => {
                slot.waiting = Some(waiting.merge(update));
                Admit::Merged
            }
            None if now.duration_since(slot.last_write) >= WRITE_INTERVAL => {
                slot.last_write = now;
                Admit::Now(update)
            }
            None => {
                slot.waiting = Some(update);
                Admit::FlushAt(slot.last_write + WRITE_INTERVAL)
            }
        }
    }

    /// The update gathered for `id`, to write now.
    pub fn flush(&mut self, id: &str, now: Instant) -> Option<Update> {
        let slot = self.jobs.get_mut(id)?;
        slot.last_write = now;
        slot.waiting.take()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::error::ErrorCode;
    use crate::domain::fixtures;
    use crate::domain::job::Holder;
    use crate::domain::state::JobState;

    fn body(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    fn active(worker: &str) -> JobRecord {
        let mut rec = fixtures::record(json!({}));
        rec.job.state = JobState::Active;
        rec.job.attempt = 1;
        rec.holder = Some(Holder {
            worker_id: Some(worker.into()),
            ack_subject: String::new(),
            sequence: 1,
            visible_until: fixtures::now(),
            last_beat: None,
            slot: None,
            visibility_ms: None,
        });
        rec
    }

    #[test]
    fn values_are_clamped_and_both_request_shapes_read() {
        let u = Update::from_put(&body(json!({"progress": 1.3}))).unwrap();
        assert_eq!(u.value, Some(1.0));
        let u = Update::from_put(&body(json!({"progress": -2}))).unwrap();
        assert_eq!(u.value, Some(0.0));
        let id = "019539a4-b68c-7def-8000-1a2b3c4d5e6f";
        let (job, u) = Update::from_worker(&body(json!({
            "job_id": id, "percentage": 47, "message": "rows", "data": {"n": 1}
        })))
        .unwrap();
        assert_eq!(job, id);
        assert_eq!(u.value, Some(0.47));
        assert_eq!(u.message.as_deref(), Some("rows"));
    }

    #[test]
    fn an_update_must_say_something_within_bounds() {
        let e = Update::from_put(&body(json!({}))).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidRequest);
        let e = Update::from_put(&body(json!({"progress": "half"}))).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidRequest);
        let e = Update::from_put(&body(json!({"data": [1]}))).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidRequest);
        let big = "x".repeat(MAX_PROGRESS_DATA_BYTES);
        let e = Update::from_put(&body(json!({"data": {"s": big}}))).unwrap_err();
        assert_eq!(e.code, ErrorCode::EnvelopeTooLarge);
        let e = Update::from_worker(&body(json!({"percentage": 5}))).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidRequest, "job_id is required");
    }

    #[test]
    fn progress_never_decreases_and_beats() {
        let rec = active("w1");
        let now = fixtures::now();
        let up = |v: f64| Update {
            value: Some(v),
            ..Update::default()
        };
        let a = apply(&rec, now, &up(0.6), Duration::from_secs(30)).unwrap();
        assert_eq!(a.job.progress, Some(0.6));
        assert_eq!(a.transition, Transition::Progressed);
        let holder = a.holder.as_ref().unwrap();
        assert_eq!(holder.visible_until, now + chrono::Duration::seconds(30));
        let b = apply(&a, now, &up(0.2), Duration::from_secs(30)).unwrap();
        assert_eq!(b.job.progress, Some(0.6), "a lower value is ignored");
        let message = Update {
            message: Some("step 2".into()),
            ..Update::default()
        };
        let c = apply(&b, now, &message, Duration::from_secs(30)).unwrap();
        assert_eq!(c.job.progress, Some(0.6));
        assert_eq!(c.job.progress_message.as_deref(), Some("step 2"));
    }

    #[test]
    fn updates_for_jobs_not_running_or_not_the_senders_are_ignored() {
        let now = fixtures::now();
        let mut rec = active("w1");
        let other = Update {
            value: Some(0.5),
            worker_id: Some("w2".into()),
            ..Update::default()
        };
        assert!(apply(&rec, now, &other, Duration::from_secs(1)).is_none());
        rec.job.state = JobState::Completed;
        let mine = Update {
            value: Some(0.5),
            ..Update::default()
        };
        assert!(apply(&rec, now, &mine, Duration::from_secs(1)).is_none());
    }

    #[test]
    fn the_throttle_writes_once_a_second_and_keeps_the_latest() {
        let mut t = Throttle::default();
        let t0 = Instant::now();
        let up = |v: f64, m: &str| Update {
            value: Some(v),
            message: Some(m.into()),
            ..Update::default()
        };
        assert!(matches!(t.admit("j", up(0.1, "a"), t0), Admit::Now(_)));
        let at = t0 + Duration::from_millis(200);
        assert_eq!(
            t.admit("j", up(0.3, "b"), at),
            Admit::FlushAt(t0 + WRITE_INTERVAL)
        );
        assert_eq!(t.admit("j", up(0.2, "c"), at), Admit::Merged);
        assert!(
            matches!(t.admit("k", up(0.9, "z"), at), Admit::Now(_)),
            "jobs are spaced apart independently"
        );
        let flushed = t.flush("j", t0 + WRITE_INTERVAL).unwrap();
        assert_eq!(flushed.value, Some(0.3), "the highest value");
        assert_eq!(flushed.message.as_deref(), Some("c"), "the latest message");
        assert_eq!(t.flush("j", t0 + WRITE_INTERVAL), None);
        let next = t0 + WRITE_INTERVAL + Duration::from_millis(10);
        assert!(matches!(
            t.admit("j", up(0.4, "d"), next),
            Admit::FlushAt(_)
        ));
        let later = t0 + WRITE_INTERVAL * 3;
        t.flush("j", t0 + WRITE_INTERVAL * 2);
        assert!(matches!(t.admit("j", up(0.5, "e"), later), Admit::Now(_)));
    }
}
