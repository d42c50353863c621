//! Time as every protocol state machine sees it (FMTP and LDM sessions alike): a monotonic
//! [`Instant`] in nanoseconds that the driver (real clock) or the simulator (virtual clock)
//! passes in, with `std::time::Duration` for spans, and [`WallTime`], real time as the FMTP BOP
//! start time carries it (ldm7-multicast.md §3.4).
//!
//! Nothing here reads a clock. [`WallClock`] maps instants to wall time from one anchor pair
//! the driver supplies (`set_wall_clock` on the FMTP sender and receiver). Drivers read the
//! real clock through `ldm7_io::Clock`, which maps
//! `std::time::Instant` to [`Instant`].

use std::fmt;
use std::ops::{Add, Sub};
use std::time::Duration;

/// A point on a monotonic clock, nanoseconds since an epoch the driver chooses (process start,
/// or 0 in a simulation). Arithmetic saturates instead of overflowing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(u64);

impl Instant {
    /// The epoch.
    pub const ZERO: Self = Self(0);
    /// The latest representable instant (about 584 years after the epoch).
    pub const MAX: Self = Self(u64::MAX);

    /// An instant `nanos` nanoseconds after the epoch.
    pub const fn from_nanos(nanos: u64) -> Self {
        Self(nanos)
    }

    /// Nanoseconds since the epoch.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// `self - earlier`, or zero when `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Self) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// `self + duration`, saturating at [`Instant::MAX`].
    pub fn saturating_add(self, duration: Duration) -> Self {
        Self(self.0.saturating_add(u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)))
    }
}

impl Add<Duration> for Instant {
    type Output = Self;

    fn add(self, duration: Duration) -> Self {
        self.saturating_add(duration)
    }
}

impl Sub for Instant {
    type Output = Duration;

    /// Saturating difference (zero when `earlier` is later).
    fn sub(self, earlier: Self) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

impl fmt::Display for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:09}s", self.0 / 1_000_000_000, self.0 % 1_000_000_000)
    }
}

/// Real (wall-clock) time: seconds and nanoseconds since the Unix epoch, the BOP start time
/// (`CLOCK_REALTIME` at the sender when the product was handed to FMTP; §3.4). The wire carries
/// the seconds as two 32-bit halves and the nanoseconds as-is (not checked to be < 10⁹).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WallTime {
    /// Seconds since 1970-01-01T00:00:00Z.
    pub secs: u64,
    /// Nanoseconds within the second.
    pub nanos: u32,
}

impl WallTime {
    /// The Unix epoch.
    pub const UNIX_EPOCH: Self = Self { secs: 0, nanos: 0 };

    /// A wall time from nanoseconds since the Unix epoch.
    pub const fn from_unix_nanos(nanos: u128) -> Self {
        let secs = nanos / 1_000_000_000;
        let secs = if secs > u64::MAX as u128 { u64::MAX } else { secs as u64 };
        Self { secs, nanos: (nanos % 1_000_000_000) as u32 }
    }

    /// Nanoseconds since the Unix epoch.
    pub const fn as_unix_nanos(self) -> u128 {
        self.secs as u128 * 1_000_000_000 + self.nanos as u128
    }

    /// `self - earlier` in nanoseconds, negative when `earlier` is later (clocks of two hosts are
    /// only as close as NTP keeps them: small negative latencies occur). Saturates at `i64`.
    pub fn signed_nanos_since(self, earlier: Self) -> i64 {
        let difference = self.as_unix_nanos() as i128 - earlier.as_unix_nanos() as i128;
        i64::try_from(difference).unwrap_or(if difference < 0 { i64::MIN } else { i64::MAX })
    }
}

impl From<std::time::SystemTime> for WallTime {
    /// Converts a system time the caller read (times before the epoch map to the epoch).
    fn from(time: std::time::SystemTime) -> Self {
        let since = time.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        Self { secs: since.as_secs(), nanos: since.subsec_nanos() }
    }
}

/// Maps monotonic [`Instant`]s to [`WallTime`] from one anchor pair (an instant and the wall
/// time read at that instant). The default anchor maps [`Instant::ZERO`] to the Unix epoch,
/// which is what a simulation with virtual time wants.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WallClock {
    /// The anchor instant.
    pub instant: Instant,
    /// The wall time at the anchor instant.
    pub wall: WallTime,
}

impl WallClock {
    /// The wall time at `now` (extrapolated from the anchor; earlier instants saturate).
    pub fn wall_at(&self, now: Instant) -> WallTime {
        let anchor = self.wall.as_unix_nanos() as i128;
        let delta = now.as_nanos() as i128 - self.instant.as_nanos() as i128;
        WallTime::from_unix_nanos(u128::try_from(anchor + delta).unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instant_arithmetic_saturates() {
        let t = Instant::from_nanos(10);
        assert_eq!(t + Duration::from_nanos(5), Instant::from_nanos(15));
        assert_eq!(Instant::MAX + Duration::from_secs(1), Instant::MAX);
        assert_eq!(t - Instant::from_nanos(20), Duration::ZERO);
        assert_eq!(Instant::from_nanos(1_500_000_000).to_string(), "1.500000000s");
    }

    #[test]
    fn wall_clock_maps_instants() {
        let clock = WallClock { instant: Instant::from_nanos(1_000), wall: WallTime { secs: 100, nanos: 0 } };
        assert_eq!(
            clock.wall_at(Instant::from_nanos(1_000 + 2_500_000_000)),
            WallTime { secs: 102, nanos: 500_000_000 }
        );
        assert_eq!(clock.wall_at(Instant::ZERO), WallTime { secs: 99, nanos: 999_999_000 });
        let late = WallTime { secs: 1, nanos: 0 };
        assert_eq!(WallTime::UNIX_EPOCH.signed_nanos_since(late), -1_000_000_000);
    }
}
