//! Cron expressions (cron spec §3–§5): the standard 5-field form, 6 fields with seconds,
//! the `@` specials and `@every <duration>`, evaluated in an IANA time zone.
//!
//! The `cron` crate does the calendar matching. It wants seconds first, numbers days of the
//! week 1–7 from Sunday, and accepts a year field; so expressions are translated before it
//! sees them. Around DST changes (cron spec §5.2): a local time that does not exist (spring
//! forward) is skipped, and a local time that happens twice (fall back) fires once, at its
//! first occurrence — the crate would fire it twice, so the second is filtered out.

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, LocalResult, SubsecRound, TimeZone, Utc};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::duration;
use super::envelope;
use super::error::OjsError;
use super::job::stable_uuid;
use super::time;

/// Shortest `@every` interval: the scheduler fires at most once a second per entry.
pub const MIN_EVERY: Duration = Duration::from_secs(1);

/// A validated schedule in its time zone.
#[derive(Debug, Clone)]
pub struct CronSchedule {
    tz: Tz,
    kind: Kind,
}

#[derive(Debug, Clone)]
enum Kind {
    Calendar(Box<cron::Schedule>),
    /// Every `interval` from `anchor` (the registration time), so every replica agrees on
    /// the ticks (cron spec §4.1).
    Every {
        interval: Duration,
        anchor: DateTime<Utc>,
    },
}

impl CronSchedule {
    /// Parses `expression` for time zone `timezone` (an IANA name). `anchor` (the
    /// registration time) is where `@every` intervals count from.
    ///
    /// # Errors
    /// 400 `invalid_request` naming `expression` or `timezone`.
    pub fn parse(
        expression: &str,
        timezone: &str,
        anchor: DateTime<Utc>,
    ) -> Result<CronSchedule, OjsError> {
        let tz = parse_timezone(timezone)?;
        let bad = |why: &str| {
            OjsError::invalid(
                "expression",
                format!("Invalid cron expression {expression:?}: {why}."),
            )
        };
        let expr = expression.trim();
        if let Some(rest) = expr.strip_prefix("@every") {
            let interval = duration::parse(rest.trim())
                .ok_or_else(|| bad("@every needs a duration such as 30s, 5m or 1h30m"))?;
            if interval < MIN_EVERY {
                return Err(bad("@every intervals must be at least 1s"));
            }
            return Ok(CronSchedule {
                tz,
                kind: Kind::Every { interval, anchor },
            });
        }
        let with_seconds = to_crate_syntax(expr).map_err(|why| bad(&why))?;
        let schedule = cron::Schedule::from_str(&with_seconds)
            .map_err(|e| bad(&first_line(&e.to_string())))?;
        let parsed = CronSchedule {
            tz,
            kind: Kind::Calendar(Box::new(schedule)),
        };
        // An expression that matches no date at all (30 February) is a mistake, not a schedule.
        if parsed.next_after(anchor).is_none() {
            return Err(bad("it never matches a date"));
        }
        Ok(parsed)
    }

    /// The first tick strictly after `after`.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match &self.kind {
            Kind::Every { interval, anchor } => {
                let step = interval.as_millis() as i64;
                let since = (after - *anchor).num_milliseconds();
                let n = if since < 0 { 0 } else { since / step + 1 };
                n.checked_mul(step)
                    .and_then(|ms| anchor.checked_add_signed(chrono::Duration::milliseconds(ms)))
                    .filter(|t| *t <= time::LATEST)
            }
            Kind::Calendar(schedule) => {
                let local = after.with_timezone(&self.tz);
                schedule
                    .after(&local)
                    .take(1000)
                    .map(|t| t.with_timezone(&Utc))
                    .take_while(|t| *t <= time::LATEST)
                    .find(|t| *t > after && !self.second_of_a_repeated_time(*t))
            }
        }
    }

    /// During a fall-back hour a wall-clock time happens twice; only the first counts.
    fn second_of_a_repeated_time(&self, t: DateTime<Utc>) -> bool {
        let naive = t.with_timezone(&self.tz).naive_local();
        matches!(self.tz.from_local_datetime(&naive), LocalResult::Ambiguous(first, _) if first.with_timezone(&Utc) != t)
    }
}

/// Cron spec §5.1: IANA names only; offsets and abbreviations are refused.
pub fn parse_timezone(name: &str) -> Result<Tz, OjsError> {
    let iana = name == "UTC" || name.contains('/');
    match name.parse::<Tz>() {
        Ok(tz) if iana => Ok(tz),
        _ => Err(OjsError::invalid(
            "timezone",
            format!("timezone {name:?} is not an IANA time zone name such as \"UTC\" or \"America/New_York\"."),
        )),
    }
}

/// Translates a standard expression (5 fields, or 6 with seconds first) or an `@` special
/// into the crate's seconds-first form with Sunday-based day names.
fn to_crate_syntax(expr: &str) -> Result<String, String> {
    let standard = match expr.to_ascii_lowercase().as_str() {
        "@yearly" | "@annually" => "0 0 1 1 *".to_string(),
        "@monthly" => "0 0 1 * *".to_string(),
        "@weekly" => "0 0 * * 0".to_string(),
        "@daily" | "@midnight" => "0 0 * * *".to_string(),
        "@hourly" => "0 * * * *".to_string(),
        other if other.starts_with('@') => {
            return Err(format!("unknown special expression {other}"))
        }
        _ => expr.to_string(),
    };
    let mut fields: Vec<String> = standard
        .split_whitespace()
        .map(str::to_ascii_uppercase)
        .collect();
    match fields.len() {
        5 => fields.insert(0, "0".into()),
        6 => {}
        n => return Err(format!("expected 5 fields (or 6 with seconds), found {n}")),
    }
    for f in &fields {
        if f.chars().any(|c| matches!(c, 'L' | 'W' | '#'))
            && !f
                .chars()
                .all(|c| c.is_ascii_alphabetic() || ",-/".contains(c))
        {
            return Err("L, W and # are not supported".into());
        }
    }
    fields[5] = day_of_week(&fields[5])?;
    Ok(fields.join(" "))
}

const DAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

/// POSIX numbers days 0–7 from Sunday (both 0 and 7 are Sunday); the crate counts 1–7.
/// Numbers become names, which mean the same to both; a range ending on 7 is split.
fn day_of_week(field: &str) -> Result<String, String> {
    let name = |n: &str| -> Result<String, String> {
        match n.parse::<usize>() {
            Ok(d) if d <= 7 => Ok(DAYS[d % 7].to_string()),
            Ok(d) => Err(format!("day of week {d} is out of range 0-7")),
            Err(_) => Ok(n.to_string()),
        }
    };
    let mut items = Vec::new();
    for item in field.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((r, s)) => (r, Some(s)),
            None => (item, None),
        };
        let translated = match range.split_once('-') {
            Some((a, "7")) if step.is_none() && a != "0" => {
                items.push("SUN".to_string());
                format!("{}-SAT", name(a)?)
            }
            Some((a, b)) => format!("{}-{}", name(a)?, name(b)?),
            None => name(range)?,
        };
        items.push(match step {
            Some(s) => format!("{translated}/{s}"),
            None => translated,
        });
    }
    Ok(items.join(","))
}

fn first_line(s: &str) -> String {
    s.lines().last().unwrap_or(s).trim().to_string()
}

/// Cron spec §6: what to do when a tick comes while the previous instance is not finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OverlapPolicy {
    /// Skip the tick while the previous job is in any non-terminal state (cron spec §6.1;
    /// conformance case cron-overlap-prevention.json).
    Skip,
    /// Enqueue regardless.
    Allow,
    /// Cancel the previous job, then enqueue.
    CancelPrevious,
    /// Enqueue regardless; the new job waits in its queue behind the previous one.
    Enqueue,
}

/// A cron registration (cron spec §2), as stored and returned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CronEntry {
    pub name: String,
    /// As the client wrote it (`@daily` stays `@daily`).
    pub expression: String,
    pub timezone: String,
    pub overlap_policy: OverlapPolicy,
    pub enabled: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// `{type, args, options}` of every job a tick enqueues.
    pub job_template: Value,
    #[serde(with = "time::millis")]
    pub created_at: DateTime<Utc>,
    #[serde(
        default,
        with = "time::opt_millis",
        skip_serializing_if = "Option::is_none"
    )]
    pub next_run_at: Option<DateTime<Utc>>,
    #[serde(
        default,
        with = "time::opt_millis",
        skip_serializing_if = "Option::is_none"
    )]
    pub last_run_at: Option<DateTime<Utc>>,
    pub run_count: u64,
    /// The job the last tick enqueued; overlap is judged by its state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_job_id: Option<String>,
    /// The jobs of the last `HISTORY` ticks, oldest first: the entry's run history.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent_job_ids: Vec<String>,
}

/// Ticks an entry remembers the jobs of.
pub const HISTORY: usize = 20;

/// Fields a change of an entry (`PATCH`) may set; the rest are the server's.
const PATCHABLE: [&str; 6] = [
    "expression",
    "timezone",
    "overlap_policy",
    "enabled",
    "description",
    "job_template",
];

impl CronEntry {
    /// Validates a registration (HTTP binding §13.2 / cron spec §8.1): the `expression` +
    /// `job_template` form and the `cron` + top-level `type`/`args`/`options` form.
    ///
    /// # Errors
    /// 400 `invalid_request` naming the field.
    pub fn parse(body: &Map<String, Value>, now: DateTime<Utc>) -> Result<CronEntry, OjsError> {
        let text = |key: &str| body.get(key).filter(|v| !v.is_null());
        let name = match text("name") {
            Some(Value::String(n)) => n.clone(),
            _ => {
                return Err(OjsError::invalid(
                    "name",
                    "Missing required field 'name' (a string).",
                ))
            }
        };
        validate_name(&name)?;
        let expression = match text("expression").or_else(|| text("cron")) {
            Some(Value::String(e)) => e.clone(),
            _ => {
                return Err(OjsError::invalid(
                    "expression",
                    "Missing required field 'expression' (a cron expression).",
                ))
            }
        };
        let timezone = match text("timezone") {
            None => "UTC".to_string(),
            Some(Value::String(tz)) => tz.clone(),
            Some(v) => {
                return Err(OjsError::invalid(
                    "timezone",
                    format!("timezone must be a string, got {v}."),
                ))
            }
        };
        CronSchedule::parse(&expression, &timezone, now)?;
        let overlap_policy = match text("overlap_policy").and_then(Value::as_str) {
            None => OverlapPolicy::Skip,
            Some("skip") => OverlapPolicy::Skip,
            Some("allow") => OverlapPolicy::Allow,
            Some("cancel_previous" | "cancel") => OverlapPolicy::CancelPrevious,
            Some("enqueue") => OverlapPolicy::Enqueue,
            Some(other) => {
                return Err(OjsError::invalid(
                    "overlap_policy",
                    format!("overlap_policy must be skip, allow, cancel_previous or enqueue, got {other:?}."),
                ))
            }
        };
        let enabled = match text("enabled") {
            None => true,
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                return Err(OjsError::invalid(
                    "enabled",
                    format!("enabled must be a boolean, got {v}."),
                ))
            }
        };
        let description = text("description")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let job_template = match text("job_template") {
            Some(Value::Object(t)) => Value::Object(t.clone()),
            Some(v) => {
                return Err(OjsError::invalid(
                    "job_template",
                    format!("job_template must be an object, got {v}."),
                ))
            }
            None => {
                let mut t = Map::new();
                for key in ["type", "args", "options", "meta"] {
                    if let Some(v) = text(key) {
                        t.insert(key.into(), v.clone());
                    }
                }
                Value::Object(t)
            }
        };
        // The template must make a valid job: the same rules as PUSH.
        let mut probe = job_template.clone();
        if probe.get("args").is_none() {
            probe["args"] = Value::Array(Vec::new());
        }
        envelope::parse(probe, now, uuid::Uuid::nil()).map_err(|mut e| {
            e.message = format!("job_template: {}", e.message);
            e
        })?;
        Ok(CronEntry {
            name,
            expression,
            timezone,
            overlap_policy,
            enabled,
            description,
            job_template,
            // Stored with millisecond precision; the in-memory copy must compare equal to it.
            created_at: now.trunc_subsecs(3),
            next_run_at: None,
            last_run_at: None,
            run_count: 0,
            last_job_id: None,
            recent_job_ids: Vec::new(),
        })
    }

    /// A tick at `tick` enqueued job `id`.
    pub fn ran(&mut self, id: &str, tick: DateTime<Utc>) {
        self.last_job_id = Some(id.to_owned());
        self.run_count += 1;
        self.last_run_at = Some(tick);
        self.recent_job_ids.push(id.to_owned());
        let over = self.recent_job_ids.len().saturating_sub(HISTORY);
        self.recent_job_ids.drain(..over);
    }

    /// The entry with `patch` applied (the `ojs` command line's `cron --update`, the admin
    /// UI's enable switch): the fields it names replace the entry's, `job_template`'s
    /// fields one by one; validated as a registration is.
    ///
    /// # Errors
    /// 400 naming a field the patch may not set, or one the registration refuses.
    pub fn patched(
        &self,
        patch: &Map<String, Value>,
        now: DateTime<Utc>,
    ) -> Result<CronEntry, OjsError> {
        let Value::Object(mut body) = serde_json::to_value(self).expect("cron entries serialize")
        else {
            unreachable!("an entry serializes as an object")
        };
        body.retain(|k, _| k == "name" || PATCHABLE.contains(&k.as_str()));
        for (key, value) in patch {
            match (key.as_str(), value) {
                ("name", Value::String(n)) if *n == self.name => {}
                ("job_template", Value::Object(fields)) => {
                    let template = body
                        .entry("job_template")
                        .or_insert_with(|| Value::Object(Map::new()));
                    if let Value::Object(template) = template {
                        for (k, v) in fields {
                            template.insert(k.clone(), v.clone());
                        }
                    }
                }
                (key, value) if PATCHABLE.contains(&key) => {
                    body.insert(key.to_owned(), value.clone());
                }
                (key, _) => {
                    return Err(OjsError::invalid(
                        key,
                        format!(
                            "{:?} cannot be changed; a change may set {}.",
                            super::fields::truncated(key),
                            PATCHABLE.join(", ")
                        ),
                    ))
                }
            }
        }
        CronEntry::parse(&body, now)
    }

    /// The entry's schedule. Stored entries were validated when registered.
    pub fn schedule(&self) -> Result<CronSchedule, OjsError> {
        CronSchedule::parse(&self.expression, &self.timezone, self.created_at)
    }

    /// The PUSH body of the job for the tick at `tick`: the template with the tick's stable
    /// id and `meta.cron_name` / `meta.cron_triggered_at` (cron spec §6.3).
    pub fn job_for_tick(&self, tick: DateTime<Utc>) -> Value {
        let mut job = self.job_template.clone();
        if job.get("args").is_none() {
            job["args"] = Value::Array(Vec::new());
        }
        job["id"] = Value::String(tick_job_id(&self.name, tick));
        let mut meta = job
            .get("meta")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        meta.insert("cron_name".into(), Value::String(self.name.clone()));
        meta.insert(
            "cron_triggered_at".into(),
            Value::String(time::format(tick)),
        );
        job["meta"] = Value::Object(meta);
        job
    }
}

/// Refuses a registration that would outgrow what every replica keeps in memory: an entry
/// larger as stored than `max_bytes` (`max_job_bytes`: its template becomes each tick's
/// job, and the entry must fit in one NATS message), or a new name once `registered`
/// entries reach `max_entries` (`max_cron_entries`).
///
/// # Errors
/// 413 for the size, 400 for the count.
pub fn admit(
    entry: &CronEntry,
    is_new: bool,
    registered: usize,
    limits: (usize, usize),
) -> Result<(), OjsError> {
    let (max_bytes, max_entries) = limits;
    let bytes = serde_json::to_vec(entry).map_or(0, |b| b.len());
    if bytes > max_bytes {
        return Err(envelope::too_large("cron entry", bytes, max_bytes)
            .with_detail("setting", "max_job_bytes"));
    }
    if is_new && registered >= max_entries {
        return Err(OjsError::invalid(
            "name",
            format!("{registered} cron entries are registered, the maximum (setting max_cron_entries); delete one first."),
        )
        .with_detail("count", registered)
        .with_detail("max", max_entries)
        .with_detail("setting", "max_cron_entries"));
    }
    Ok(())
}

/// The id of the job a tick enqueues: the same for every leader that fires the tick, so a
/// tick fired twice (a leader dying halfway) creates one job.
pub fn tick_job_id(name: &str, tick: DateTime<Utc>) -> String {
    stable_uuid(&format!("cron/{name}/{}", tick.timestamp_millis()), tick)
        .hyphenated()
        .to_string()
}

/// Cron spec §2.2: `[a-z0-9][a-z0-9\-\.]*`, at most 255 characters.
/// A cron entry name: the queue naming rule, at most 255 characters.
pub fn is_entry_name(name: &str) -> bool {
    envelope::is_name(name, 255)
}

fn validate_name(name: &str) -> Result<(), OjsError> {
    if is_entry_name(name) {
        Ok(())
    } else {
        Err(OjsError::invalid("name", format!("name {name:?} is invalid: use lowercase letters, digits, '-' and '.', starting with a letter or digit.")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn ticks(expr: &str, tz: &str, from: &str, n: usize) -> Vec<String> {
        let s = CronSchedule::parse(expr, tz, utc("2026-01-01T00:00:00Z")).unwrap();
        let mut t = utc(from);
        (0..n)
            .map(|_| {
                t = s.next_after(t).unwrap();
                t.to_rfc3339()
            })
            .collect()
    }

    #[test]
    fn translation_prepends_seconds_and_names_days() {
        assert_eq!(to_crate_syntax("*/5 * * * *").unwrap(), "0 */5 * * * *");
        assert_eq!(to_crate_syntax("0 9 * * 1-5").unwrap(), "0 0 9 * * MON-FRI");
        assert_eq!(to_crate_syntax("0 0 * * 0,7").unwrap(), "0 0 0 * * SUN,SUN");
        assert_eq!(
            to_crate_syntax("0 0 * * 5-7").unwrap(),
            "0 0 0 * * SUN,FRI-SAT"
        );
        assert_eq!(to_crate_syntax("30 0 9 * * mon").unwrap(), "30 0 9 * * MON");
        assert_eq!(to_crate_syntax("@weekly").unwrap(), "0 0 0 * * SUN");
    }

    #[test]
    fn every_special_expression_has_its_meaning() {
        let from = "2026-02-12T10:30:00Z";
        assert_eq!(
            ticks("@hourly", "UTC", from, 1),
            ["2026-02-12T11:00:00+00:00"]
        );
        assert_eq!(
            ticks("@daily", "UTC", from, 1),
            ["2026-02-13T00:00:00+00:00"]
        );
        assert_eq!(
            ticks("@midnight", "UTC", from, 1),
            ["2026-02-13T00:00:00+00:00"]
        );
        assert_eq!(
            ticks("@weekly", "UTC", from, 1),
            ["2026-02-15T00:00:00+00:00"]
        ); // a Sunday
        assert_eq!(
            ticks("@monthly", "UTC", from, 1),
            ["2026-03-01T00:00:00+00:00"]
        );
        assert_eq!(
            ticks("@yearly", "UTC", from, 1),
            ["2027-01-01T00:00:00+00:00"]
        );
        assert_eq!(
            ticks("@annually", "UTC", from, 1),
            ["2027-01-01T00:00:00+00:00"]
        );
        assert_eq!(
            ticks("@every 90s", "UTC", "2026-01-01T00:00:00Z", 2),
            ["2026-01-01T00:01:30+00:00", "2026-01-01T00:03:00+00:00"]
        );
    }

    #[test]
    fn seconds_field_and_posix_weekdays() {
        assert_eq!(
            ticks("*/20 * * * * *", "UTC", "2026-02-12T10:30:05Z", 2),
            ["2026-02-12T10:30:20+00:00", "2026-02-12T10:30:40+00:00"]
        );
        // 2026-02-15 is a Sunday: 0 and 7 both mean it.
        assert_eq!(
            ticks("0 0 * * 7", "UTC", "2026-02-12T00:00:00Z", 1),
            ["2026-02-15T00:00:00+00:00"]
        );
        assert_eq!(
            ticks("0 0 * * 1", "UTC", "2026-02-12T00:00:00Z", 1),
            ["2026-02-16T00:00:00+00:00"]
        );
    }

    #[test]
    fn spring_forward_skips_the_missing_time_in_new_york() {
        // 2026-03-08 02:00 EST → 03:00 EDT: 02:30 does not exist that day.
        assert_eq!(
            ticks("30 2 * * *", "America/New_York", "2026-03-07T12:00:00Z", 2),
            ["2026-03-09T06:30:00+00:00", "2026-03-10T06:30:00+00:00"]
        );
        assert_eq!(
            ticks("30 2 * * *", "America/New_York", "2026-03-06T12:00:00Z", 1),
            ["2026-03-07T07:30:00+00:00"]
        );
    }

    #[test]
    fn fall_back_fires_the_repeated_time_once_in_new_york() {
        // 2026-11-01 02:00 EDT → 01:00 EST: 01:30 happens twice; it fires at the first (EDT).
        assert_eq!(
            ticks("30 1 * * *", "America/New_York", "2026-10-31T12:00:00Z", 2),
            ["2026-11-01T05:30:00+00:00", "2026-11-02T06:30:00+00:00"]
        );
        assert_eq!(
            ticks(
                "*/30 * * * *",
                "America/New_York",
                "2026-11-01T04:00:00Z",
                5
            ),
            [
                "2026-11-01T04:30:00+00:00",
                "2026-11-01T05:00:00+00:00",
                "2026-11-01T05:30:00+00:00",
                "2026-11-01T07:00:00+00:00",
                "2026-11-01T07:30:00+00:00"
            ]
        );
    }

    #[test]
    fn dst_in_london_both_ways() {
        // 2026-03-29 01:00 GMT → 02:00 BST: 01:30 does not exist.
        assert_eq!(
            ticks("30 1 * * *", "Europe/London", "2026-03-28T12:00:00Z", 2),
            ["2026-03-30T00:30:00+00:00", "2026-03-31T00:30:00+00:00"]
        );
        // 2026-10-25 02:00 BST → 01:00 GMT: 01:30 happens twice; the first is 00:30 UTC.
        assert_eq!(
            ticks("30 1 * * *", "Europe/London", "2026-10-24T12:00:00Z", 2),
            ["2026-10-25T00:30:00+00:00", "2026-10-26T01:30:00+00:00"]
        );
        // A daily 09:00 stays at 09:00 local across the change.
        assert_eq!(
            ticks("0 9 * * *", "Europe/London", "2026-10-24T12:00:00Z", 2),
            ["2026-10-25T09:00:00+00:00", "2026-10-26T09:00:00+00:00"]
        );
    }

    #[test]
    fn an_entry_is_admitted_within_its_size_and_a_new_name_within_the_count() {
        let body = serde_json::json!({"name": "n", "expression": "@daily",
            "job_template": {"type": "a.b", "args": ["x".repeat(100)]}});
        let entry =
            CronEntry::parse(body.as_object().unwrap(), utc("2026-02-12T10:30:00Z")).unwrap();
        let bytes = serde_json::to_vec(&entry).unwrap().len();
        assert!(admit(&entry, true, 9, (bytes, 10)).is_ok());
        let err = admit(&entry, true, 9, (bytes - 1, 10)).unwrap_err();
        assert_eq!(err.code, crate::domain::error::ErrorCode::EnvelopeTooLarge);
        assert_eq!(
            (&err.details["actual_bytes"], &err.details["max_bytes"]),
            (&serde_json::json!(bytes), &serde_json::json!(bytes - 1))
        );
        let err = admit(&entry, true, 10, (bytes, 10)).unwrap_err();
        assert_eq!(
            (&err.details["count"], &err.details["max"]),
            (&serde_json::json!(10), &serde_json::json!(10))
        );
        assert!(
            admit(&entry, false, 10, (bytes, 10)).is_ok(),
            "a replacement"
        );
    }

    #[test]
    fn registrations_accept_both_shapes_and_validate_the_template() {
        let now = utc("2026-02-12T10:30:00Z");
        let suite: Map<String, Value> = serde_json::from_value(serde_json::json!({"name": "nightly", "expression": "@daily",
            "job_template": {"type": "report.build", "args": [1], "options": {"queue": "reports"}}})).unwrap();
        let e = CronEntry::parse(&suite, now).unwrap();
        assert_eq!(
            (
                e.expression.as_str(),
                e.timezone.as_str(),
                e.overlap_policy,
                e.enabled
            ),
            ("@daily", "UTC", OverlapPolicy::Skip, true)
        );
        let spec: Map<String, Value> =
            serde_json::from_value(serde_json::json!({"name": "nightly", "cron": "0 9 * * *",
            "timezone": "America/New_York", "type": "report.build", "overlap_policy": "cancel"}))
            .unwrap();
        let e = CronEntry::parse(&spec, now).unwrap();
        assert_eq!(e.job_template["type"], "report.build");
        assert_eq!(e.overlap_policy, OverlapPolicy::CancelPrevious);
        for (bad, field) in [
            (
                serde_json::json!({"expression": "@daily", "job_template": {"type": "a.b"}}),
                "name",
            ),
            (
                serde_json::json!({"name": "Bad Name", "expression": "@daily", "job_template": {"type": "a.b"}}),
                "name",
            ),
            (
                serde_json::json!({"name": "n", "job_template": {"type": "a.b"}}),
                "expression",
            ),
            (
                serde_json::json!({"name": "n", "expression": "@daily", "job_template": {"type": "A"}}),
                "type",
            ),
            (
                serde_json::json!({"name": "n", "expression": "@daily", "overlap_policy": "maybe", "job_template": {"type": "a.b"}}),
                "overlap_policy",
            ),
        ] {
            let body: Map<String, Value> = serde_json::from_value(bad.clone()).unwrap();
            assert_eq!(
                CronEntry::parse(&body, now).unwrap_err().details["field"],
                field,
                "{bad}"
            );
        }
    }

    #[test]
    fn a_change_replaces_what_it_names_and_keeps_the_rest() {
        let now = utc("2026-02-12T10:30:00Z");
        let body: Map<String, Value> = serde_json::from_value(serde_json::json!({"name": "nightly", "expression": "@daily",
            "timezone": "Europe/Paris", "job_template": {"type": "report.build", "args": [1], "options": {"queue": "reports"}}})).unwrap();
        let mut e = CronEntry::parse(&body, now).unwrap();
        for i in 0..HISTORY + 2 {
            e.ran(&format!("job-{i}"), now);
        }
        assert_eq!(e.run_count, HISTORY as u64 + 2);
        assert_eq!(e.recent_job_ids.len(), HISTORY);
        assert_eq!(e.recent_job_ids[0], "job-2");
        assert_eq!(
            e.last_job_id.as_deref(),
            Some(&*format!("job-{}", HISTORY + 1))
        );
        let patch = |v: Value| -> Map<String, Value> { serde_json::from_value(v).unwrap() };
        let changed = e
            .patched(&patch(serde_json::json!({"expression": "*/5 * * * *", "job_template": {"type": "report.fast"}})), now)
            .unwrap();
        assert_eq!(changed.expression, "*/5 * * * *");
        assert_eq!(changed.timezone, "Europe/Paris");
        assert_eq!(changed.job_template["type"], "report.fast");
        assert_eq!(changed.job_template["args"], serde_json::json!([1]));
        assert_eq!(changed.job_template["options"]["queue"], "reports");
        let off = e
            .patched(&patch(serde_json::json!({"enabled": false})), now)
            .unwrap();
        assert!(!off.enabled);
        for (bad, field) in [
            (serde_json::json!({"run_count": 0}), "run_count"),
            (serde_json::json!({"name": "other"}), "name"),
            (serde_json::json!({"expression": "nope"}), "expression"),
            (serde_json::json!({"job_template": {"type": 1}}), "type"),
        ] {
            let err = e.patched(&patch(bad.clone()), now).unwrap_err();
            assert_eq!(err.details["field"], field, "{bad}: {err:?}");
        }
    }

    #[test]
    fn a_tick_makes_the_same_job_id_wherever_it_fires() {
        let tick = utc("2026-02-12T10:31:00Z");
        assert_eq!(tick_job_id("a", tick), tick_job_id("a", tick));
        assert_ne!(tick_job_id("a", tick), tick_job_id("b", tick));
        assert_ne!(
            tick_job_id("a", tick),
            tick_job_id("a", tick + chrono::Duration::minutes(1))
        );
        assert!(
            envelope::parse_job_id(&tick_job_id("a", tick)).is_some(),
            "a UUIDv7"
        );
    }

    #[test]
    fn invalid_expressions_and_zones_are_refused() {
        let at = utc("2026-01-01T00:00:00Z");
        for bad in [
            "not a valid cron",
            "0 0 0 0 0 0 0",
            "99 25 32 13 8",
            "",
            "*/0 * * * *",
            "60 * * * *",
            "0 0 30 2 *",
            "@sometimes",
            "@every",
            "@every 10ms",
            "0 0 * * 8",
            "0 0 L * *",
        ] {
            let err = CronSchedule::parse(bad, "UTC", at).unwrap_err();
            assert_eq!(err.details["field"], "expression", "{bad:?}");
        }
        for tz in ["+05:00", "EST", "Mars/Base", "UTC+5"] {
            assert_eq!(
                CronSchedule::parse("* * * * *", tz, at)
                    .unwrap_err()
                    .details["field"],
                "timezone",
                "{tz}"
            );
        }
        CronSchedule::parse("* * * * *", "Asia/Tokyo", at).unwrap();
    }
}
