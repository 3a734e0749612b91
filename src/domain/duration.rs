//! Durations in the forms OJS clients send: ISO 8601 (`PT1S`, `PT0.5S`, `P1DT2H`; retry §4),
//! Go-style (`1s`, `500ms`, `1h30m`; the core seed's examples) — and their ISO output form.
//! Every duration a client gives is bounded by [`MAX`].

use std::time::Duration;

use serde_json::Value;

use super::error::OjsError;

/// The longest duration a client may give: timeouts, visibility timeouts, retry intervals,
/// `@every` and relative times (`+P…`). Bounding them here keeps every deadline and due time
/// computed from one far inside what time arithmetic and RFC 3339 can hold.
pub const MAX: Duration = Duration::from_secs(365 * 86_400);
/// [`MAX`] as error messages and docs/configuration.md write it.
pub const MAX_TEXT: &str = "P365D (31536000000 ms)";

/// Parses an ISO 8601 or Go-style duration. `None` when the text is neither, or longer than
/// [`MAX`].
pub fn parse(text: &str) -> Option<Duration> {
    let t = text.trim();
    let d = if t.starts_with('P') || t.starts_with('p') {
        parse_iso(&t[1..])
    } else {
        parse_go(t)
    };
    d.filter(|d| *d <= MAX)
}

/// An age as operators write one (`7d`, the `ojs` command line's form) or any duration
/// `parse` takes; at most a century of days.
pub fn age(text: &str) -> Option<Duration> {
    match text.strip_suffix('d').map(str::parse::<u64>) {
        Some(Ok(days)) if days <= 36_500 => Some(Duration::from_secs(days * 86_400)),
        Some(_) => None,
        None => parse(text),
    }
}

/// A whole number of `unit_ms` milliseconds (1 for `*_ms` fields, 1000 for seconds) as a
/// duration of at most [`MAX`]; `positive` refuses zero.
///
/// # Errors
/// 400 naming `field` and the allowed range.
pub fn from_number(
    v: &Value,
    field: &str,
    unit_ms: u64,
    positive: bool,
) -> Result<Duration, OjsError> {
    let max = MAX.as_millis() as u64 / unit_ms;
    v.as_u64()
        .filter(|n| *n <= max && (*n > 0 || !positive))
        .map(|n| Duration::from_millis(n * unit_ms))
        .ok_or_else(|| {
            let min = u8::from(positive);
            OjsError::invalid(
                field,
                format!(
                    "{field} must be an integer from {min} to {max} (at most {MAX_TEXT}), got {v}."
                ),
            )
        })
}

/// `[nW][nD][T[nH][nM][n[.f]S]]` after the leading `P`; months and years are refused because
/// their length depends on the calendar.
fn parse_iso(body: &str) -> Option<Duration> {
    if body.is_empty() {
        return None;
    }
    let (date, time) = match body.find(['T', 't']) {
        Some(i) => (&body[..i], Some(&body[i + 1..])),
        None => (body, None),
    };
    let mut ms = 0f64;
    ms += fields(date, &[('W', 604_800_000.0), ('D', 86_400_000.0)])?;
    if let Some(time) = time {
        if time.is_empty() {
            return None;
        }
        ms += fields(time, &[('H', 3_600_000.0), ('M', 60_000.0), ('S', 1000.0)])?;
    }
    to_duration(ms)
}

/// Reads `<number><unit>` pairs in the given unit order, each unit at most once.
fn fields(mut s: &str, units: &[(char, f64)]) -> Option<f64> {
    let mut total = 0f64;
    let mut next_unit = 0;
    while !s.is_empty() {
        let end = s.find(|c: char| c.is_ascii_alphabetic())?;
        let number: f64 = parse_number(&s[..end])?;
        let unit = s[end..].chars().next()?.to_ascii_uppercase();
        let pos = units[next_unit..].iter().position(|(u, _)| *u == unit)? + next_unit;
        total += number * units[pos].1;
        next_unit = pos + 1;
        s = &s[end + 1..];
    }
    Some(total)
}

fn parse_number(s: &str) -> Option<f64> {
    if s.is_empty()
        || !s
            .chars()
            .all(|c| c.is_ascii_digit() || c == '.' || c == ',')
    {
        return None;
    }
    s.replace(',', ".").parse().ok()
}

/// Go's `time.ParseDuration` subset: a sequence of `<number><unit>` with units
/// `h`, `m`, `s`, `ms`, `us`/`µs`, `ns`.
fn parse_go(s: &str) -> Option<Duration> {
    if s.is_empty() {
        return None;
    }
    if s == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = s;
    let mut ms = 0f64;
    while !rest.is_empty() {
        let end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let number = parse_number(&rest[..end])?;
        rest = &rest[end..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let factor = match &rest[..unit_len] {
            "h" => 3_600_000.0,
            "m" => 60_000.0,
            "s" => 1000.0,
            "ms" => 1.0,
            "us" | "µs" => 0.001,
            "ns" => 0.000_001,
            _ => return None,
        };
        ms += number * factor;
        rest = &rest[unit_len..];
    }
    to_duration(ms)
}

fn to_duration(ms: f64) -> Option<Duration> {
    (ms.is_finite() && ms >= 0.0).then(|| Duration::from_micros((ms * 1000.0).round() as u64))
}

/// Formats in the largest whole unit, as operators write a period: `1s`, `10s`, `5m`,
/// `1h`, `250ms`.
pub fn format_short(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        0 => "0s".into(),
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1_000 == 0 => format!("{}s", ms / 1_000),
        ms => format!("{ms}ms"),
    }
}

/// Formats as ISO 8601 (`PT1S`, `PT0.5S`, `PT5M`, `PT1H30M`, `P1DT1H`), the form OJS responses use.
pub fn format_iso(d: Duration) -> String {
    use std::fmt::Write;
    let total_ms = d.as_millis();
    if total_ms == 0 {
        return "PT0S".to_string();
    }
    let days = total_ms / 86_400_000;
    let hours = total_ms % 86_400_000 / 3_600_000;
    let minutes = total_ms % 3_600_000 / 60_000;
    let ms = total_ms % 60_000;
    // Written into one string: every retry policy in every record and response has three.
    let mut out = String::with_capacity(16);
    out.push('P');
    if days > 0 {
        let _ = write!(out, "{days}D");
    }
    if hours + minutes + ms > 0 {
        out.push('T');
        if hours > 0 {
            let _ = write!(out, "{hours}H");
        }
        if minutes > 0 {
            let _ = write!(out, "{minutes}M");
        }
        if ms > 0 {
            let _ = write!(out, "{}", ms / 1000);
            if ms % 1000 != 0 {
                let _ = write!(out, ".{:03}", ms % 1000);
                out.truncate(out.trim_end_matches('0').len());
            }
            out.push('S');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Option<Duration> {
        Some(Duration::from_millis(n))
    }

    #[test]
    fn parses_iso_8601() {
        assert_eq!(parse("PT1S"), ms(1000));
        assert_eq!(parse("PT0.5S"), ms(500));
        assert_eq!(parse("PT5M"), ms(300_000));
        assert_eq!(parse("PT1H30M"), ms(5_400_000));
        assert_eq!(parse("P1DT2H"), ms(93_600_000));
        assert_eq!(parse("P1W"), ms(604_800_000));
    }

    #[test]
    fn ages_take_days_and_periods_read_in_their_largest_unit() {
        assert_eq!(age("7d"), ms(604_800_000));
        assert_eq!(age("12h"), ms(43_200_000));
        assert_eq!(age("P1D"), ms(86_400_000));
        assert_eq!(age("36501d"), None);
        assert_eq!(age("xd"), None);
        for (n, text) in [
            (1000, "1s"),
            (10_000, "10s"),
            (300_000, "5m"),
            (3_600_000, "1h"),
            (250, "250ms"),
        ] {
            assert_eq!(format_short(Duration::from_millis(n)), text);
            assert_eq!(parse(text), ms(n));
        }
    }

    #[test]
    fn parses_go_style() {
        assert_eq!(parse("1s"), ms(1000));
        assert_eq!(parse("300s"), ms(300_000));
        assert_eq!(parse("500ms"), ms(500));
        assert_eq!(parse("1h30m"), ms(5_400_000));
        assert_eq!(parse("1.5s"), ms(1500));
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "", "P", "PT", "PT1X", "P1M", "1x", "abc", "PT-1S", "-1s", "PTS", "P1H",
        ] {
            assert_eq!(parse(bad), None, "{bad:?} should be rejected");
        }
    }

    #[test]
    fn nothing_longer_than_a_year_is_accepted() {
        assert_eq!(parse("P365D"), Some(MAX));
        assert_eq!(parse("8760h"), Some(MAX));
        for long in [
            "P366D",
            "P20000000D",
            "P100000000D",
            "8761h",
            "P99999999999999999999W",
        ] {
            assert_eq!(parse(long), None, "{long}");
        }
    }

    #[test]
    fn numbers_are_bounded_in_their_unit() {
        let max_ms = serde_json::json!(MAX.as_millis() as u64);
        assert_eq!(from_number(&max_ms, "t", 1, false).unwrap(), MAX);
        assert_eq!(
            from_number(&serde_json::json!(365 * 86_400), "t", 1000, true).unwrap(),
            MAX
        );
        for bad in [
            serde_json::json!(MAX.as_millis() as u64 + 1),
            serde_json::json!(u64::MAX),
            serde_json::json!(-1),
            serde_json::json!(1.5),
            serde_json::json!("5"),
        ] {
            let e = from_number(&bad, "timeout_ms", 1, false).unwrap_err();
            assert_eq!(e.details["field"], "timeout_ms");
        }
        assert!(from_number(&serde_json::json!(u64::MAX / 1000), "t", 1000, false).is_err());
        assert!(from_number(&serde_json::json!(0), "t", 1, true).is_err());
    }

    #[test]
    fn formats_round_trip() {
        for text in [
            "PT1S", "PT0.5S", "PT5M", "PT1H30M", "P1DT2H", "PT0S", "PT1.25S",
        ] {
            assert_eq!(format_iso(parse(text).unwrap()), text);
        }
    }
}
