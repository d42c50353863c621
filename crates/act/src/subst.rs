//! The substitutions pqact makes in an action's arguments, in the reference's order
//! (ldm-formats.md §2): back-references, then strftime on the product's arrival time in UTC,
//! then the day-of-month date indicators `(DD:code)`, then `(seq)`.
//!
//! Each step works on the text the previous one produced, as the reference's does: a `%` that a
//! back-reference brought in is a strftime conversion, and `(\1:yyyy)` becomes a date indicator
//! once `\1` is replaced by two digits.

use std::fmt::Write as _;
use std::ops::Range;

use ldm7_types::Timestamp;
use ldm7_types::time::{civil_from_days, days_from_civil};

/// What the entry's pattern matched in the product identifier: the whole match (group 0) and
/// each group, as byte ranges of the identifier (`None`: the group took no part).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Matched {
    /// Group 0 (the whole match), then groups 1, 2, ….
    pub groups: Vec<Option<Range<usize>>>,
}

impl Matched {
    /// The text of group `index` of `ident` (empty if the group took no part or does not exist).
    fn group<'a>(&self, ident: &'a str, index: usize) -> std::borrow::Cow<'a, str> {
        match self.groups.get(index).cloned().flatten() {
            Some(range) => String::from_utf8_lossy(ident.as_bytes().get(range).unwrap_or_default()),
            None => std::borrow::Cow::Borrowed(""),
        }
    }
}

/// Every substitution, in order.
pub fn expand(template: &str, ident: &str, matched: &Matched, arrival: Timestamp, seqno: u32) -> String {
    let text = back_references(template, ident, matched);
    let text = strftime(&text, arrival);
    let text = date_indicators(&text, arrival);
    text.replace("(seq)", &seqno.to_string())
}

/// Step 1: `\1`…`\9`, `\(nn)`, `&` and `\0` (the whole match); `\\` → `\`, `\&` → `&`. Any
/// other backslash is kept as it is.
pub fn back_references(template: &str, ident: &str, matched: &Matched) -> String {
    let mut out = String::with_capacity(template.len() + ident.len());
    let mut chars = template.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        match c {
            '&' => out.push_str(&matched.group(ident, 0)),
            '\\' => match chars.peek().map(|&(_, next)| next) {
                Some(digit @ '0'..='9') => {
                    chars.next();
                    out.push_str(&matched.group(ident, digit as usize - '0' as usize));
                }
                Some('\\') => {
                    chars.next();
                    out.push('\\');
                }
                Some('&') => {
                    chars.next();
                    out.push('&');
                }
                Some('(') => {
                    // `\(nn)`: one or two digits in parentheses.
                    let rest = &template[at + 1..];
                    let digits = rest[1..].bytes().take_while(u8::is_ascii_digit).count();
                    if (1..=2).contains(&digits) && rest.as_bytes().get(1 + digits) == Some(&b')') {
                        let index: usize = rest[1..1 + digits].parse().unwrap_or(usize::MAX);
                        out.push_str(&matched.group(ident, index));
                        for _ in 0..digits + 2 {
                            chars.next();
                        }
                    } else {
                        out.push('\\');
                    }
                }
                _ => out.push('\\'),
            },
            other => out.push(other),
        }
    }
    out
}

/// Step 2: strftime conversions on `arrival` in UTC (`%%` → `%`). A conversion the formatter does
/// not know is kept as written, as the C library's strftime keeps it.
pub fn strftime(text: &str, arrival: Timestamp) -> String {
    if !text.contains('%') {
        return text.to_owned();
    }
    let zoned = jiff::Timestamp::new(arrival.secs, arrival.micros.clamp(0, 999_999) * 1000)
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH)
        .to_zoned(jiff::tz::TimeZone::UTC);
    let mut out = String::with_capacity(text.len() + 16);
    let mut rest = text;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let conversion = conversion_len(&rest[at..]);
        let spec = &rest[at..at + conversion];
        if spec == "%%" {
            out.push('%');
        } else if conversion > 1 {
            match jiff::fmt::strtime::format(spec, &zoned) {
                Ok(formatted) => out.push_str(&formatted),
                Err(_) => out.push_str(spec),
            }
        } else {
            out.push('%');
        }
        rest = &rest[at + conversion..];
    }
    out.push_str(rest);
    out
}

/// The length of the conversion at the start of `text` (which starts with `%`): flags, width,
/// an `E`/`O` modifier and the conversion character; 1 when nothing follows the `%`.
fn conversion_len(text: &str) -> usize {
    let bytes = text.as_bytes();
    let mut at = 1;
    while at < bytes.len() && matches!(bytes[at], b'-' | b'_' | b'0' | b'^' | b'#') {
        at += 1;
    }
    while at < bytes.len() && bytes[at].is_ascii_digit() {
        at += 1;
    }
    if at < bytes.len() && matches!(bytes[at], b'E' | b'O') {
        at += 1;
    }
    match text[at..].chars().next() {
        Some(c) => at + c.len_utf8(),
        None => 1,
    }
}

/// Step 3: `(DD:code)`, DD exactly two digits, code one of `yyyy yy mmm mm ddd dd hh` (any
/// case). The date is the arrival time moved to day DD of the month after, of the arrival month
/// or of the month before — the first of these that is less than 1.5 days after the arrival
/// (a day past the month's end runs into the next month, as `timegm` counts it). Day 00 keeps
/// the arrival time; a day above 31 gives the code's text; an unknown code gives nothing.
pub fn date_indicators(text: &str, arrival: Timestamp) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('(') {
        out.push_str(&rest[..at]);
        let candidate = &rest[at..];
        let bytes = candidate.as_bytes();
        let indicator = (bytes.len() > 4 && bytes[1].is_ascii_digit() && bytes[2].is_ascii_digit() && bytes[3] == b':')
            .then(|| candidate[4..].find(')').map(|end| (&candidate[4..4 + end], 4 + end + 1)))
            .flatten();
        match indicator {
            Some((code, len)) => {
                let day = u32::from(bytes[1] - b'0') * 10 + u32::from(bytes[2] - b'0');
                if day > 31 {
                    // As LDM's pqact reports it (the code's text is written, as there).
                    tracing::error!("act: bad day of month in ident: {text}");
                }
                out.push_str(&date_code(day, &code.to_ascii_lowercase(), arrival));
                rest = &candidate[len..];
            }
            None => {
                out.push('(');
                rest = &candidate[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

fn date_code(day: u32, code: &str, arrival: Timestamp) -> String {
    const MONTHS: [&str; 12] = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"];
    if day > 31 {
        return code.to_owned();
    }
    let arrival_secs = arrival.secs;
    let second_of_day = arrival_secs.rem_euclid(86_400);
    let (year, month, _) = civil_from_days(arrival_secs.div_euclid(86_400));
    let adjusted = if day == 0 {
        arrival_secs
    } else {
        // Day `day` of a month `offset` months from the arrival's, at the arrival's time of day.
        let moved = |offset: i64| {
            let months = year * 12 + (month - 1) + offset;
            let (y, m) = (months.div_euclid(12), months.rem_euclid(12) + 1);
            (days_from_civil(y, m, 1) + i64::from(day) - 1) * 86_400 + second_of_day
        };
        let limit = arrival_secs + 86_400 * 3 / 2;
        [1, 0, -1].into_iter().map(moved).find(|&time| time < limit).unwrap_or_else(|| moved(-1))
    };
    let days = adjusted.div_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let mut out = String::new();
    let _ = match code {
        "yyyy" => write!(out, "{y:04}"),
        "yy" => write!(out, "{:02}", y.rem_euclid(100)),
        "mmm" => write!(out, "{}", MONTHS[(m - 1) as usize]),
        "mm" => write!(out, "{m:02}"),
        "ddd" => write!(out, "{:03}", days - days_from_civil(y, 1, 1) + 1),
        "dd" => write!(out, "{d:02}"),
        "hh" => write!(out, "{:02}", adjusted.rem_euclid(86_400) / 3600),
        _ => Ok(()),
    };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().expect("a timestamp")
    }

    /// `SAUS43 KWBC 231200` matched by `^(SAUS..) (KWBC) ([0-3][0-9])([0-2][0-9])`.
    fn matched() -> (&'static str, Matched) {
        let ident = "SAUS43 KWBC 231200";
        (ident, Matched { groups: vec![Some(0..16), Some(0..6), Some(7..11), Some(12..14), Some(14..16)] })
    }

    #[test]
    fn back_references_whole_match_and_escapes() {
        let (ident, matched) = matched();
        assert_eq!(back_references(r"data/\2/\1_\3\4", ident, &matched), "data/KWBC/SAUS43_2312");
        assert_eq!(back_references(r"\(2)-\(12)-\0-&", ident, &matched), "KWBC--SAUS43 KWBC 2312-SAUS43 KWBC 2312");
        assert_eq!(back_references(r"a\\b\&c\x", ident, &matched), r"a\b&c\x");
        assert_eq!(back_references(r"\9 and \(", ident, &matched), r" and \(");
    }

    #[test]
    fn strftime_in_utc_with_unknown_conversions_kept() {
        let arrival = at("20261123180509.250000");
        assert_eq!(strftime("%Y%m%d%H%M/%j/%y %b %%Y %!", arrival), "202611231805/327/26 Nov %Y %!");
        assert_eq!(strftime("no conversions", arrival), "no conversions");
        assert_eq!(strftime("trailing %", arrival), "trailing %");
        assert_eq!(strftime("%-d.%e", at("20260105000000")), "5. 5");
    }

    #[test]
    fn day_indicators_as_the_reference_checks_them() {
        // The reference's own cases (noon on 1971-02-28, 1980-02-29, 1971-03-01).
        let feb28 = at("19710228120000");
        assert_eq!(date_indicators("(27:yyyy)-(27:mm)-(27:dd)", feb28), "1971-02-27");
        assert_eq!(date_indicators("(28:yyyy)-(28:mm)-(28:dd)", feb28), "1971-02-28");
        assert_eq!(date_indicators("(29:yyyy)-(29:mm)-(29:dd)", feb28), "1971-03-01");
        assert_eq!(date_indicators("(01:yyyy)-(01:mm)-(01:dd)", feb28), "1971-03-01");
        assert_eq!(date_indicators("(02:yyyy)-(02:mm)-(02:dd)", feb28), "1971-02-02");
        let feb29 = at("19800229120000");
        assert_eq!(date_indicators("(29:yyyy)-(29:mm)-(29:dd)", feb29), "1980-02-29");
        assert_eq!(date_indicators("(30:yyyy)-(30:mm)-(30:dd)", feb29), "1980-03-01");
        let mar01 = at("19710301120000");
        assert_eq!(date_indicators("(28:yyyy)-(28:mm)-(28:dd)", mar01), "1971-02-28");
        assert_eq!(date_indicators("(03:yyyy)-(03:mm)-(03:dd)", mar01), "1971-02-03");
    }

    #[test]
    fn day_indicators_across_the_year_and_odd_ones() {
        assert_eq!(date_indicators("(01:yyyy)-(01:mmm)-(01:ddd)-(01:HH)", at("20261231200000")), "2027-jan-001-20");
        assert_eq!(date_indicators("(31:YY)(31:mm)(31:dd)", at("20261101020000")), "261031");
        // Day 00 keeps the arrival; a day above 31 gives the code; an unknown code nothing.
        assert_eq!(
            date_indicators("(00:dd)(45:yyyy)[(23:zz)](seq)(1:dd)", at("20261123180000")),
            "23yyyy[](seq)(1:dd)"
        );
    }

    #[test]
    fn every_step_in_order() {
        let (ident, matched) = matched();
        let arrival = at("20261123180509");
        let path = expand(r"/data/\2/%Y/(\3:mm)/\1_(\3:yyyy)(\3:mm)\3\4.(seq)", ident, &matched, arrival, 42);
        assert_eq!(path, "/data/KWBC/2026/11/SAUS43_2026112312.42");
    }
}
