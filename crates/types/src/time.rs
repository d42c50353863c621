//! LDM timestamps: seconds and microseconds since the Unix epoch (a `struct timeval`,
//! ldm6-protocol.md §3 rule 2), with LDM's special values.

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
            Err(before) => {
                Self::from_unix_micros(-i64::try_from(before.duration().as_micros()).unwrap_or(i64::MAX))
            }
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
}
