//! The process clock: [`Clock::now`] is nanoseconds since the first reading in this process, as
//! the protocols' [`Instant`]. Converting back ([`Clock::to_std`]) gives the `std` instant a
//! blocking wait or a tokio timer needs.

use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use ldm7_types::{Instant, WallTime};

static EPOCH: OnceLock<std::time::Instant> = OnceLock::new();

/// The process clock (a unit type: every driver in the process shares one epoch).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Clock;

impl Clock {
    fn epoch() -> std::time::Instant {
        *EPOCH.get_or_init(std::time::Instant::now)
    }

    /// Now, on the protocols' timeline.
    pub fn now() -> Instant {
        Instant::from_nanos(u64::try_from(Self::epoch().elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    /// The `std` instant of a protocol instant (for `sleep_until`, socket timeouts).
    pub fn to_std(at: Instant) -> std::time::Instant {
        let epoch = Self::epoch();
        epoch.checked_add(Duration::from_nanos(at.as_nanos())).unwrap_or(epoch + Duration::from_secs(86_400 * 365))
    }

    /// How long from now until `at` (zero if it passed).
    pub fn until(at: Instant) -> Duration {
        at.saturating_duration_since(Self::now())
    }

    /// A wall-clock anchor for the FMTP state machines' `set_wall_clock`: now, and the real
    /// time read at the same moment.
    pub fn wall_anchor() -> (Instant, WallTime) {
        let now = Self::now();
        (now, WallTime::from(SystemTime::now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn now_is_monotonic_and_round_trips() {
        let first = Clock::now();
        let second = Clock::now();
        assert!(second >= first);
        let later = second + Duration::from_millis(5);
        assert_eq!(Clock::to_std(later) - Clock::to_std(second), Duration::from_millis(5));
        assert!(Clock::until(first).is_zero());
    }
}
