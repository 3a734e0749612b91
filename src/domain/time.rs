//! Timestamps as OJS writes and reads them: RFC 3339, UTC, millisecond precision on output
//! (HTTP binding §6.3); a zone designator is mandatory on input (core §5.5).

use std::time::Duration;

use chrono::{DateTime, Datelike, NaiveDate, SecondsFormat, Timelike, Utc};

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

/// `t` to the millisecond, as records store it: a time kept in memory then compares equal
/// to its copy read back.
pub fn to_millis(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(t.timestamp_millis()).unwrap_or(t)
}

/// Length of a timestamp as this server writes it: `2026-02-12T10:30:00.123Z`.
const WRITTEN_LEN: usize = 24;

/// Formats a server-generated timestamp: `2026-02-12T10:30:00.123Z`.
pub fn format(ts: DateTime<Utc>) -> String {
    let mut buf = [0; WRITTEN_LEN];
    match write(ts, &mut buf) {
        Some(text) => text.to_owned(),
        None => ts.to_rfc3339_opts(SecondsFormat::Millis, true),
    }
}

/// Writes `ts` as [`format`] does into `buf`, without allocating: every record and response
/// carries several timestamps. `None` for a year outside 0–9999, which this server never
/// writes ([`LATEST`]).
fn write(ts: DateTime<Utc>, buf: &mut [u8; WRITTEN_LEN]) -> Option<&str> {
    let year = u32::try_from(ts.year()).ok().filter(|y| *y <= 9999)?;
    let milli = ts.timestamp_subsec_millis().min(999);
    // A leap second (`subsec` past a second) is written as its second's last millisecond.
    let fields = [
        (0, 4, year),
        (5, 2, ts.month()),
        (8, 2, ts.day()),
        (11, 2, ts.hour()),
        (14, 2, ts.minute()),
        (17, 2, ts.second()),
        (20, 3, milli),
    ];
    *buf = *b"0000-00-00T00:00:00.000Z";
    for (at, width, mut value) in fields {
        for i in (at..at + width).rev() {
            buf[i] = b'0' + (value % 10) as u8;
            value /= 10;
        }
    }
    std::str::from_utf8(buf).ok()
}

/// Parses a client timestamp; `None` when it is not RFC 3339 with a zone.
pub fn parse(s: &str) -> Option<DateTime<Utc>> {
    parse_written(s).or_else(|| {
        DateTime::parse_from_rfc3339(s)
            .ok()
            .map(|t| t.with_timezone(&Utc))
    })
}

/// The form this server writes (`2026-02-12T10:30:00.123Z`), read without the general
/// parser: every record read carries several. `None` for anything else, which the general
/// parser then decides.
fn parse_written(s: &str) -> Option<DateTime<Utc>> {
    let b = s.as_bytes();
    if b.len() != WRITTEN_LEN || &b[19..20] != b"." || b[23] != b'Z' {
        return None;
    }
    let number = |from: usize, to: usize| -> Option<u32> {
        b[from..to].iter().try_fold(0u32, |n, c| {
            c.is_ascii_digit().then(|| n * 10 + u32::from(c - b'0'))
        })
    };
    let separators = [(4, b'-'), (7, b'-'), (10, b'T'), (13, b':'), (16, b':')];
    if separators.iter().any(|(at, c)| b[*at] != *c) {
        return None;
    }
    let date = NaiveDate::from_ymd_opt(number(0, 4)? as i32, number(5, 7)?, number(8, 10)?)?;
    let time = date.and_hms_milli_opt(
        number(11, 13)?,
        number(14, 16)?,
        number(17, 19)?,
        number(20, 23)?,
    )?;
    Some(time.and_utc())
}

/// Serializes `ts` as [`format`] writes it, without allocating.
fn serialize<S: serde::Serializer>(ts: DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    let mut buf = [0; WRITTEN_LEN];
    match write(ts, &mut buf) {
        Some(text) => s.serialize_str(text),
        None => s.serialize_str(&format(ts)),
    }
}

/// Reads a timestamp from the string a deserializer hands over, without copying it first.
struct Timestamp;

impl serde::de::Visitor<'_> for Timestamp {
    type Value = DateTime<Utc>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an RFC 3339 timestamp")
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<DateTime<Utc>, E> {
        parse(s).ok_or_else(|| E::custom(format_args!("bad timestamp {s:?}")))
    }
}

/// Serde adapter for optional server timestamps, so records and responses share one format.
pub mod opt_millis {
    use chrono::{DateTime, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(t) => super::serialize(*t, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
        Ok(Option::<super::millis::Read>::deserialize(d)?.map(|r| r.0))
    }
}

/// Serde adapter for required server timestamps.
pub mod millis {
    use chrono::{DateTime, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        super::serialize(*v, s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        d.deserialize_str(super::Timestamp)
    }

    /// A timestamp read in place, for the optional adapter.
    pub(super) struct Read(pub(super) DateTime<Utc>);

    impl<'de> Deserialize<'de> for Read {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Read, D::Error> {
            deserialize(d).map(Read)
        }
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
    fn the_written_form_reads_back_and_others_go_to_the_general_parser() {
        for text in [
            "2026-02-12T10:30:00.123Z",
            "0001-01-01T00:00:00.000Z",
            "9999-12-31T23:59:59.999Z",
            "2024-02-29T12:00:00.007Z",
        ] {
            let t = parse(text).unwrap();
            assert_eq!(format(t), text);
            assert_eq!(
                t,
                DateTime::parse_from_rfc3339(text)
                    .unwrap()
                    .with_timezone(&Utc)
            );
        }
        // Not the written form: decided by the general parser, as before.
        assert_eq!(
            parse("2026-02-12T10:30:00Z"),
            parse("2026-02-12T10:30:00.000Z")
        );
        assert!(parse("2025-02-29T12:00:00.000Z").is_none());
        assert!(parse("2026-13-01T00:00:00.000Z").is_none());
        assert!(parse("2026-02-12T10:30:00.12xZ").is_none());
        assert!(
            parse("2026-02-12 10:30:00.123Z").is_some(),
            "RFC 3339 allows a space"
        );
    }

    #[test]
    fn timestamps_in_records_serialize_and_read_as_the_written_form() {
        #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
        struct R {
            #[serde(with = "millis")]
            at: DateTime<Utc>,
            #[serde(with = "opt_millis")]
            maybe: Option<DateTime<Utc>>,
        }
        let r = R {
            at: parse("2026-02-12T10:30:00.123Z").unwrap(),
            maybe: None,
        };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(text, r#"{"at":"2026-02-12T10:30:00.123Z","maybe":null}"#);
        assert_eq!(serde_json::from_str::<R>(&text).unwrap(), r);
        let with = r#"{"at":"2026-02-12T10:30:00Z","maybe":"2026-02-12T12:30:00.5+02:00"}"#;
        let read: R = serde_json::from_str(with).unwrap();
        assert_eq!(format(read.maybe.unwrap()), "2026-02-12T10:30:00.500Z");
        // From a JSON tree too (no borrowed strings there).
        let tree: R = serde_json::from_value(
            serde_json::json!({"at": "2026-02-12T10:30:00.123Z", "maybe": null}),
        )
        .unwrap();
        assert_eq!(tree.at, r.at);
        assert!(serde_json::from_str::<R>(r#"{"at":"soon"}"#).is_err());
    }

    #[test]
    fn rejects_timestamps_without_zone() {
        assert!(parse("2026-02-12T10:30:00").is_none());
        assert!(parse("yesterday").is_none());
        assert!(parse("2099-12-31T23:59:59Z").is_some());
    }
}
