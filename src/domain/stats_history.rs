//! Statistics history (admin spec §10.2): what the leader samples each minute and each
//! hour, and how a request's points are made from the samples. Pure:
//! `coordinator/stats_history.rs` takes the samples, `store/stats.rs` keeps and reads them
//! (architecture §3.30).
//!
//! A sample holds a queue's *running totals* (jobs enqueued, completed and failed since the
//! queue's counters began) and its depth, not the activity of its minute: a minute no
//! leader sampled (a leadership change) or a queue left unsampled (nothing changed) merges
//! into the next point instead of showing as a gap, and two leaders sampling one minute
//! write the same totals.

use std::collections::HashMap;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::envelope::validate_queue;
use super::error::OjsError;
use super::fields;
use super::state::JobState;
use super::stats::QueueCounts;
use super::time;

/// The name samples of every queue together are kept under; queue names cannot start
/// with `_`.
pub const ALL_QUEUES: &str = "_all";

/// Points one request may ask for at most.
pub const MAX_POINTS: i64 = 1_440;

/// One queue's running totals at a sampling time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    #[serde(with = "time::millis")]
    pub at: DateTime<Utc>,
    pub enqueued: u64,
    pub completed: u64,
    pub failed: u64,
    /// Jobs available at the sampling time.
    pub depth: u64,
}

impl Sample {
    pub fn of(counts: &QueueCounts, at: DateTime<Utc>) -> Sample {
        let types = counts.types.values();
        let (mut enqueued, mut completed, mut failed) = (0, 0, 0);
        for t in types {
            enqueued += t.enqueued;
            completed += t.completed;
            failed += t.discarded();
        }
        Sample {
            at,
            enqueued,
            completed,
            failed,
            depth: counts.states.of(JobState::Available),
        }
    }

    /// The sum of several queues' samples taken at `at`.
    pub fn total<'a>(samples: impl IntoIterator<Item = &'a Sample>, at: DateTime<Utc>) -> Sample {
        samples.into_iter().fold(
            Sample {
                at,
                enqueued: 0,
                completed: 0,
                failed: 0,
                depth: 0,
            },
            |mut sum, s| {
                sum.enqueued += s.enqueued;
                sum.completed += s.completed;
                sum.failed += s.failed;
                sum.depth += s.depth;
                sum
            },
        )
    }

    /// Whether the totals differ from `other`'s (the time aside).
    pub fn changed_from(&self, other: &Sample) -> bool {
        (self.enqueued, self.completed, self.failed, self.depth)
            != (other.enqueued, other.completed, other.failed, other.depth)
    }
}

/// Where samples are kept: every minute's for a day, every hour's for a month.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resolution {
    Minutes,
    Hours,
}

impl Resolution {
    pub fn as_str(self) -> &'static str {
        match self {
            Resolution::Minutes => "minutes",
            Resolution::Hours => "hours",
        }
    }

    /// How far before a read's first period its starting totals are looked for: a queue
    /// unchanged is sampled every ten minutes, and every hour in the hourly history.
    pub fn lookback(self) -> TimeDelta {
        match self {
            Resolution::Minutes => TimeDelta::minutes(15),
            Resolution::Hours => TimeDelta::hours(2),
        }
    }

    /// How long samples are kept.
    pub fn kept(self) -> TimeDelta {
        match self {
            Resolution::Minutes => TimeDelta::hours(25),
            Resolution::Hours => TimeDelta::days(31),
        }
    }
}

/// A history request: `GET /admin/stats/history?period&since&until&queue`.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryQuery {
    /// `1m`, `5m`, `1h` or `1d`, as asked.
    pub period: &'static str,
    pub step: TimeDelta,
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
    /// `ALL_QUEUES` when no queue is named.
    pub queue: String,
}

impl HistoryQuery {
    /// # Errors
    /// 400 naming the parameter: an unknown period, a time that is not RFC 3339, `since`
    /// after `until`, a bad queue name, or more than `MAX_POINTS` points.
    pub fn parse(
        params: &HashMap<String, String>,
        now: DateTime<Utc>,
    ) -> Result<HistoryQuery, OjsError> {
        let (period, step) = match params.get("period").map(String::as_str) {
            None | Some("" | "5m") => ("5m", TimeDelta::minutes(5)),
            Some("1m") => ("1m", TimeDelta::minutes(1)),
            Some("1h") => ("1h", TimeDelta::hours(1)),
            Some("1d") => ("1d", TimeDelta::days(1)),
            Some(other) => {
                return Err(OjsError::invalid(
                    "period",
                    format!(
                        "period must be 1m, 5m, 1h or 1d, not {:?}.",
                        fields::truncated(other)
                    ),
                ))
            }
        };
        let at = |key: &str, default: DateTime<Utc>| match params.get(key).filter(|v| !v.is_empty())
        {
            None => Ok(default),
            Some(text) => time::parse(text).ok_or_else(|| {
                OjsError::invalid(
                    key,
                    format!(
                        "{key} must be an RFC 3339 time, got {:?}.",
                        fields::truncated(text)
                    ),
                )
            }),
        };
        let until = at("until", now)?;
        let default_span = if step >= TimeDelta::hours(1) {
            TimeDelta::days(7)
        } else {
            TimeDelta::hours(1)
        };
        let since = at("since", until - default_span)?;
        if since >= until {
            return Err(OjsError::invalid("since", "since must be before until."));
        }
        if (until - since).num_seconds() / step.num_seconds() > MAX_POINTS {
            return Err(OjsError::invalid(
                "since",
                format!(
                    "At most {MAX_POINTS} points a request: a longer period, or a shorter span."
                ),
            ));
        }
        let queue = match params.get("queue").filter(|q| !q.is_empty()) {
            None => ALL_QUEUES.to_owned(),
            Some(q) => {
                validate_queue(q)?;
                q.clone()
            }
        };
        Ok(HistoryQuery {
            period,
            step,
            since,
            until,
            queue,
        })
    }

    /// Where the samples are read from: minutes while they cover the span, else hours.
    pub fn resolution(&self, now: DateTime<Utc>) -> Resolution {
        if self.step < TimeDelta::hours(1) && now - self.since < Resolution::Minutes.kept() {
            Resolution::Minutes
        } else {
            Resolution::Hours
        }
    }

    /// The points, oldest first, from `samples` of the query's queue in time order (those
    /// before `since` serve as the starting totals): for each period from `since` (aligned
    /// to the period) the growth of each running total over it, and the depth last
    /// sampled in it. A total that fell (the counters were reset) counts from zero; a queue
    /// with no sample before a period (its first) counts from its first sample in it.
    pub fn points(&self, samples: &[Sample]) -> Vec<Value> {
        let first = self.since.duration_trunc(self.step).unwrap_or(self.since);
        let mut points = Vec::new();
        let mut before: Option<&Sample> = samples.iter().take_while(|s| s.at < first).last();
        let mut start = first;
        while start < self.until {
            let end = start + self.step;
            let within: Vec<&Sample> = samples
                .iter()
                .filter(|s| s.at >= start && s.at < end)
                .collect();
            let last = within.last().copied();
            let grown = |f: fn(&Sample) -> u64| match (before, last) {
                (_, None) => 0,
                (None, Some(l)) => within.first().map_or(0, |f0| f(l).saturating_sub(f(f0))),
                (Some(b), Some(l)) if f(l) >= f(b) => f(l) - f(b),
                (Some(_), Some(l)) => f(l),
            };
            points.push(json!({
                "timestamp": time::format(start),
                "enqueued": grown(|s| s.enqueued),
                "processed": grown(|s| s.completed),
                "completed": grown(|s| s.completed),
                "failed": grown(|s| s.failed),
                "depth": last.or(before).map_or(0, |s| s.depth),
            }));
            if last.is_some() {
                before = last;
            }
            start = end;
        }
        points
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(m: i64) -> DateTime<Utc> {
        time::parse("2026-11-29T10:00:00Z").unwrap() + TimeDelta::minutes(m)
    }

    fn sample(m: i64, completed: u64) -> Sample {
        Sample {
            at: at(m),
            enqueued: completed + 10,
            completed,
            failed: 0,
            depth: m as u64,
        }
    }

    fn query(pairs: &[(&str, &str)], now: DateTime<Utc>) -> Result<HistoryQuery, OjsError> {
        let params = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        HistoryQuery::parse(&params, now)
    }

    #[test]
    fn points_are_the_growth_of_the_running_totals_in_each_period() {
        let q = query(
            &[
                ("period", "5m"),
                ("since", "2026-11-29T10:00:00Z"),
                ("until", "2026-11-29T10:20:00Z"),
            ],
            at(30),
        )
        .unwrap();
        // A sample before the span gives the starting totals; minute 7 was not sampled
        // (a leadership change): its work shows in the next sample's period.
        let samples = [
            sample(-1, 100),
            sample(1, 103),
            sample(4, 110),
            sample(6, 112),
            sample(8, 120),
            sample(16, 125),
        ];
        let points = q.points(&samples);
        let completed: Vec<u64> = points
            .iter()
            .map(|p| p["processed"].as_u64().unwrap())
            .collect();
        assert_eq!(completed, [10, 10, 0, 5]);
        assert_eq!(points[0]["timestamp"], "2026-11-29T10:00:00.000Z");
        assert_eq!(points[2]["depth"], 8, "the depth last sampled carries on");
        // Counters reset (an admin reset): counted from zero.
        let points = q.points(&[sample(-1, 100), sample(2, 4)]);
        assert_eq!(points[0]["completed"], 4);
    }

    #[test]
    fn a_query_is_bounded_and_read_from_the_finest_samples_kept() {
        let now = at(0);
        let q = query(&[], now).unwrap();
        assert_eq!((q.period, q.queue.as_str()), ("5m", ALL_QUEUES));
        assert_eq!(q.until - q.since, TimeDelta::hours(1));
        assert_eq!(q.resolution(now), Resolution::Minutes);
        let q = query(&[("period", "1h")], now).unwrap();
        assert_eq!(q.resolution(now), Resolution::Hours);
        let q = query(&[("period", "5m"), ("since", "2026-11-27T10:00:00Z")], now).unwrap();
        assert_eq!(
            q.resolution(now),
            Resolution::Hours,
            "minutes are kept a day"
        );
        for (k, v) in [
            ("period", "2m"),
            ("since", "yesterday"),
            ("since", "2026-11-29T11:00:00Z"),
            ("queue", "Bad Queue"),
        ] {
            let err = query(&[(k, v)], now).unwrap_err();
            assert_eq!(err.details["field"], k, "{k}={v}");
        }
        let err = query(&[("period", "1m"), ("since", "2026-11-01T00:00:00Z")], now).unwrap_err();
        assert_eq!(err.details["field"], "since");
    }
}
