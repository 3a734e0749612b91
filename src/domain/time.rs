//! Timestamps as OJS writes and reads them: RFC 3339, UTC, millisecond precision on output
//! (HTTP binding §6.3); a zone designator is mandatory on input (core §5.5).

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};

/// The latest instant this server writes: the end of year 9999. RFC 3339 has four-digit years,
/// so a later time would be written as `+10000-…` and could never be read back.
pub const LATEST: DateTime<Utc> = match DateTime::from_timestamp_millis(253_402_300_799_999) {
    Some(t) => t,
    None => panic!("year 9999 is representable"),
};

/// `t + d`, never past [`LATEST`]: time arithmetic that cannot panic or overflow, whatever
/// the inputs. Client durations are bounded far below this (`duration::MAX`); the clamp is
/// the backstop that keeps every stored time readable.
pub fn add(t: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(d)
        .ok()
        .and_then(|d| t.checked_add_signed(d))
        .map_or(LATEST, |at| at.min(LATEST))
}

/// Formats a server-generated timestamp: `2026-02-12T10:30:00.123Z`.
pub fn format(ts: DateTime<Utc>) -> String {
    ts.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Parses a client timestamp; `None` when it is not RFC 3339 with a zone.
pub fn parse(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// Serde adapter for optional server timestamps, so records and responses share one format.
pub mod opt_millis {
    use chrono::{DateTime, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(t) => s.serialize_str(&super::format(*t)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
        let s: Option<String> = Option::deserialize(d)?;
        match s {
            None => Ok(None),
            Some(s) => super::parse(&s)
                .map(Some)
                .ok_or_else(|| serde::de::Error::custom(format!("bad timestamp {s:?}"))),
        }
    }
}

/// Serde adapter for required server timestamps.
pub mod millis {
    use chrono::{DateTime, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format(*v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let s = String::deserialize(d)?;
        super::parse(&s).ok_or_else(|| serde::de::Error::custom(format!("bad timestamp {s:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_utc_with_millis() {
        let t = parse("2026-02-12T12:30:00.1234+02:00").unwrap();
        assert_eq!(format(t), "2026-02-12T10:30:00.123Z");
    }

    #[test]
    fn adding_never_passes_year_9999() {
        let t = parse("2026-02-12T10:30:00Z").unwrap();
        assert_eq!(
            format(add(t, Duration::from_secs(5))),
            "2026-02-12T10:30:05.000Z"
        );
        assert_eq!(add(t, Duration::MAX), LATEST);
        assert_eq!(add(LATEST, Duration::from_millis(1)), LATEST);
        assert_eq!(format(LATEST), "9999-12-31T23:59:59.999Z");
        assert_eq!(parse(&format(LATEST)), Some(LATEST));
    }

    #[test]
    fn rejects_timestamps_without_zone() {
        assert!(parse("2026-02-12T10:30:00").is_none());
        assert!(parse("yesterday").is_none());
        assert!(parse("2099-12-31T23:59:59Z").is_some());
    }
}
