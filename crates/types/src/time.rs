//! LDM timestamps: seconds and microseconds since the Unix epoch (a `struct timeval`,
//! ldm6-protocol.md §3 rule 2), with LDM's special values.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A point in time with microsecond resolution, as LDM carries it (`timestampt`).
///
/// Ordinary values have `0 <= micros < 1_000_000`; the special values [`Timestamp::NONE`] and
/// [`Timestamp::END`] are kept bit-exact because they travel on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Timestamp {
    /// Seconds since 1970-01-01T00:00:00Z.
    pub secs: i64,
    /// Microseconds within the second.
    pub micros: i32,
}

impl Timestamp {
    /// `TS_NONE` = {-1, -1}: "no time".
    pub const NONE: Self = Self { secs: -1, micros: -1 };
    /// `TS_ZERO` = {0, 0}: the epoch, the start of all time in a product class.
    pub const ZERO: Self = Self { secs: 0, micros: 0 };
    /// `TS_ENDT` = {0x7FFFFFFF, 999999}: the end of time in a product class.
    pub const END: Self = Self { secs: 0x7FFF_FFFF, micros: 999_999 };

    /// A timestamp from microseconds since the epoch.
    pub const fn from_unix_micros(micros: i64) -> Self {
        Self { secs: micros.div_euclid(1_000_000), micros: micros.rem_euclid(1_000_000) as i32 }
    }

    /// Microseconds since the epoch.
    pub const fn as_unix_micros(self) -> i64 {
        self.secs * 1_000_000 + self.micros as i64
    }

    /// Converts a system time (the caller reads the clock; this crate never does).
    pub fn from_system_time(time: SystemTime) -> Self {
        match time.duration_since(UNIX_EPOCH) {
            Ok(after) => Self::from_unix_micros(i64::try_from(after.as_micros()).unwrap_or(i64::MAX)),
            Err(before) => Self::from_unix_micros(-i64::try_from(before.duration().as_micros()).unwrap_or(i64::MAX)),
        }
    }

    /// This timestamp as a system time (special values map to their numeric meaning).
    pub fn to_system_time(self) -> SystemTime {
        let micros = self.as_unix_micros();
        if micros >= 0 {
            UNIX_EPOCH + Duration::from_micros(micros.unsigned_abs())
        } else {
            UNIX_EPOCH - Duration::from_micros(micros.unsigned_abs())
        }
    }

    /// `self - earlier`, saturating at zero.
    pub fn saturating_duration_since(self, earlier: Self) -> Duration {
        let micros = self.as_unix_micros().saturating_sub(earlier.as_unix_micros());
        Duration::from_micros(u64::try_from(micros).unwrap_or(0))
    }

    /// This timestamp moved back by `duration` (saturating at the epoch's distant past).
    pub fn saturating_sub(self, duration: Duration) -> Self {
        let micros = i64::try_from(duration.as_micros()).unwrap_or(i64::MAX);
        Self::from_unix_micros(self.as_unix_micros().saturating_sub(micros))
    }
}

/// LDM's printed form (`ldmprint.c`): `YYYYMMDDhhmmss.uuuuuu` in UTC, and `TS_NONE`, `TS_ZERO`,
/// `TS_ENDT` for the special values.
impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::NONE => return f.pad("TS_NONE"),
            Self::ZERO => return f.pad("TS_ZERO"),
            Self::END => return f.pad("TS_ENDT"),
            _ => {}
        }
        let days = self.secs.div_euclid(86_400);
        let second_of_day = self.secs.rem_euclid(86_400);
        let (year, month, day) = civil_from_days(days);
        let text = format!(
            "{year:04}{month:02}{day:02}{:02}{:02}{:02}.{:06}",
            second_of_day / 3600,
            second_of_day / 60 % 60,
            second_of_day % 60,
            self.micros.clamp(0, 999_999)
        );
        f.pad(&text)
    }
}

/// Why a string is not an LDM timestamp.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid time {0:?}: expected YYYYMMDDhhmmss[.uuuuuu] (UTC), TS_NONE, TS_ZERO or TS_ENDT")]
pub struct ParseTimestampError(pub String);

/// Parses what [`Display`](fmt::Display) prints; the fraction may have 0 to 6 digits.
impl FromStr for Timestamp {
    type Err = ParseTimestampError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "TS_NONE" => return Ok(Self::NONE),
            "TS_ZERO" => return Ok(Self::ZERO),
            "TS_ENDT" => return Ok(Self::END),
            _ => {}
        }
        let error = || ParseTimestampError(text.to_owned());
        let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
        if whole.len() != 14 || !whole.bytes().all(|b| b.is_ascii_digit()) {
            return Err(error());
        }
        if fraction.len() > 6 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
            return Err(error());
        }
        let number = |range: std::ops::Range<usize>| whole[range].parse::<i64>().map_err(|_| error());
        let (year, month, day) = (number(0..4)?, number(4..6)?, number(6..8)?);
        let (hour, minute, second) = (number(8..10)?, number(10..12)?, number(12..14)?);
        let days_in_month = match month {
            1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
            4 | 6 | 9 | 11 => 30,
            2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
            2 => 28,
            _ => return Err(error()),
        };
        if day < 1 || day > days_in_month || hour > 23 || minute > 59 || second > 60 {
            return Err(error());
        }
        let micros =
            if fraction.is_empty() { 0 } else { format!("{fraction:0<6}").parse::<i32>().map_err(|_| error())? };
        let secs = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second;
        Ok(Self { secs, micros })
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (the civil-calendar algorithm). The
/// month must be 1–12; the day may run past the month's end and then counts on into the next.
pub fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The proleptic Gregorian date (year, month, day) of a day count since 1970-01-01.
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let days = days + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days - era * 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 { shifted_month + 3 } else { shifted_month - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micros_round_trip() {
        for micros in [0, 1, 999_999, 1_000_000, 1_434_326_400_123_456, -1, -1_000_001] {
            assert_eq!(Timestamp::from_unix_micros(micros).as_unix_micros(), micros);
        }
        assert_eq!(Timestamp::from_unix_micros(-1), Timestamp { secs: -1, micros: 999_999 });
    }

    #[test]
    fn prints_like_ldm() {
        assert_eq!(Timestamp { secs: 1_700_000_000, micros: 123_456 }.to_string(), "20231114221320.123456");
        assert_eq!(Timestamp::ZERO.to_string(), "TS_ZERO");
        assert_eq!(Timestamp::NONE.to_string(), "TS_NONE");
        assert_eq!(Timestamp::END.to_string(), "TS_ENDT");
        assert_eq!(Timestamp { secs: 951_782_400, micros: 0 }.to_string(), "20000229000000.000000");
        assert_eq!(Timestamp { secs: 1, micros: 5 }.to_string(), "19700101000001.000005");
    }

    #[test]
    fn parses_what_it_prints() {
        assert_eq!("20231114221320.123456".parse(), Ok(Timestamp { secs: 1_700_000_000, micros: 123_456 }));
        assert_eq!("20231114221320".parse(), Ok(Timestamp { secs: 1_700_000_000, micros: 0 }));
        assert_eq!("20231114221320.5".parse(), Ok(Timestamp { secs: 1_700_000_000, micros: 500_000 }));
        assert_eq!("TS_ENDT".parse(), Ok(Timestamp::END));
        for bad in ["2023111422132", "20230230000000", "20231114221320.1234567", "2023111422132x", "", "20231314000000"]
        {
            assert!(bad.parse::<Timestamp>().is_err(), "{bad}");
        }
    }

    proptest::proptest! {
        #[test]
        fn round_trips(secs in 1i64..253_402_300_799, micros in 0i32..1_000_000) {
            let time = Timestamp { secs, micros };
            proptest::prop_assert_eq!(time.to_string().parse::<Timestamp>(), Ok(time));
        }
    }
}
