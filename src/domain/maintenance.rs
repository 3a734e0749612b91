//! Maintenance mode (admin spec §12.1): what an operator sets and what it answers. Pure:
//! `store/system.rs` keeps it, FETCH, the timer scheduler and cron obey it (architecture
//! §3.31).

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::duration;
use super::error::OjsError;
use super::fields;
use super::time;

/// The longest reason kept.
const MAX_REASON_BYTES: usize = 1_024;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Maintenance {
    pub enabled: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(
        default,
        with = "time::opt_millis",
        skip_serializing_if = "Option::is_none"
    )]
    pub enabled_at: Option<DateTime<Utc>>,
    /// When it ends by itself; `None`: when an operator ends it.
    #[serde(
        default,
        with = "time::opt_millis",
        skip_serializing_if = "Option::is_none"
    )]
    pub ends_at: Option<DateTime<Utc>>,
}

impl Maintenance {
    /// Whether work is held back at `now`.
    pub fn active(&self, now: DateTime<Utc>) -> bool {
        self.enabled && self.ends_at.is_none_or(|end| now < end)
    }

    /// A request `{enabled, reason?, duration? | estimated_duration?}`: the admin UI sends
    /// `duration` (`15m`), the spec `estimated_duration` (`PT30M`).
    ///
    /// # Errors
    /// 400 naming the field: `enabled` missing or not a boolean, a reason that is not a
    /// string or too long, a duration that is not one.
    pub fn parse(body: &Map<String, Value>, now: DateTime<Utc>) -> Result<Maintenance, OjsError> {
        let enabled = match body.get("enabled") {
            Some(Value::Bool(b)) => *b,
            Some(other) => return Err(fields::type_error("enabled", "a boolean", other)),
            None => return Err(fields::missing("enabled", "a boolean")),
        };
        if !enabled {
            return Ok(Maintenance::default());
        }
        let reason = fields::string(body.get("reason"), "reason")?.map(str::to_owned);
        if reason.as_ref().is_some_and(|r| r.len() > MAX_REASON_BYTES) {
            return Err(OjsError::invalid(
                "reason",
                format!("reason is at most {MAX_REASON_BYTES} bytes."),
            ));
        }
        let mut ends_at = None;
        for key in ["duration", "estimated_duration"] {
            if let Some(text) = fields::string(body.get(key), key)? {
                let length = duration::parse(text)
                    .and_then(|d| TimeDelta::from_std(d).ok())
                    .filter(|d| *d > TimeDelta::zero())
                    .ok_or_else(|| {
                        OjsError::invalid(
                            key,
                            format!(
                                "{key} must be a duration such as 30m or PT30M, got {:?}.",
                                fields::truncated(text)
                            ),
                        )
                    })?;
                ends_at = Some(now + length);
            }
        }
        Ok(Maintenance {
            enabled,
            reason,
            enabled_at: Some(now),
            ends_at,
        })
    }

    /// The answer in the spec's names (`maintenance`, `enabled_at`, `estimated_end`) and
    /// the tools' (`enabled`, `started_at`, `ends_at`), as it stands at `now`.
    pub fn answer(&self, now: DateTime<Utc>) -> Value {
        let on = self.active(now);
        let (since, end) = if on {
            (
                self.enabled_at.map(time::format),
                self.ends_at.map(time::format),
            )
        } else {
            (None, None)
        };
        json!({
            "enabled": on,
            "maintenance": on,
            "reason": if on { self.reason.clone() } else { None },
            "enabled_at": since,
            "started_at": since,
            "estimated_end": end,
            "ends_at": end,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn maintenance_holds_until_switched_off_or_its_time_is_up() {
        let now = time::parse("2026-11-29T12:00:00Z").unwrap();
        let m = Maintenance::parse(
            &body(json!({"enabled": true, "reason": "upgrade", "duration": "15m"})),
            now,
        )
        .unwrap();
        assert!(m.active(now));
        assert!(m.active(now + TimeDelta::minutes(14)));
        assert!(!m.active(now + TimeDelta::minutes(15)));
        let a = m.answer(now);
        assert_eq!(
            (&a["enabled"], &a["maintenance"], &a["reason"]),
            (&json!(true), &json!(true), &json!("upgrade"))
        );
        assert_eq!(a["ends_at"], "2026-11-29T12:15:00.000Z");
        assert_eq!(a["estimated_end"], a["ends_at"]);
        assert_eq!(m.answer(now + TimeDelta::hours(1))["enabled"], false);
        let spec = Maintenance::parse(
            &body(json!({"enabled": true, "estimated_duration": "PT30M"})),
            now,
        )
        .unwrap();
        assert_eq!(spec.ends_at, Some(now + TimeDelta::minutes(30)));
        let open = Maintenance::parse(&body(json!({"enabled": true})), now).unwrap();
        assert!(open.active(now + TimeDelta::days(30)));
        let off =
            Maintenance::parse(&body(json!({"enabled": false, "reason": "done"})), now).unwrap();
        assert!(!off.active(now));
        assert_eq!(off, Maintenance::default());
    }

    #[test]
    fn bad_requests_name_the_field() {
        let now = Utc::now();
        for (bad, field) in [
            (json!({}), "enabled"),
            (json!({"enabled": "yes"}), "enabled"),
            (json!({"enabled": true, "reason": 3}), "reason"),
            (
                json!({"enabled": true, "reason": "x".repeat(1025)}),
                "reason",
            ),
            (json!({"enabled": true, "duration": "soon"}), "duration"),
            (
                json!({"enabled": true, "estimated_duration": "PT0S"}),
                "estimated_duration",
            ),
        ] {
            let err = Maintenance::parse(&body(bad.clone()), now).unwrap_err();
            assert_eq!(err.details["field"], field, "{bad}");
        }
    }
}
