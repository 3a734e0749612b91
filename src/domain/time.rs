//! Timestamps as OJS writes and reads them: RFC 3339, UTC, millisecond precision on output
//! (HTTP binding §6.3); a zone designator is mandatory on input (core §5.5).

use chrono::{DateTime, SecondsFormat, Utc};

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
    fn rejects_timestamps_without_zone() {
        assert!(parse("2026-02-12T10:30:00").is_none());
        assert!(parse("yesterday").is_none());
        assert!(parse("2099-12-31T23:59:59Z").is_some());
    }
}
