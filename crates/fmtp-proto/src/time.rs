//! Time as the state machines see it: the project's monotonic [`Instant`] and [`WallTime`]
//! (`ldm7_types`, shared with the LDM sessions), and the transmission time of a byte count.

use std::time::Duration;

pub use ldm7_types::{Instant, WallClock, WallTime};

/// The time a byte count takes at a rate: `bytes × 8 / rate_bits_per_s` (zero rate: zero).
pub(crate) fn transmission_time(bytes: u64, rate_bits_per_s: u64) -> Duration {
    if rate_bits_per_s == 0 {
        return Duration::ZERO;
    }
    let nanos = u128::from(bytes) * 8 * 1_000_000_000 / u128::from(rate_bits_per_s);
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transmission_time_is_exact() {
        assert_eq!(transmission_time(1_250_000, 10_000_000), Duration::from_secs(1));
        assert_eq!(transmission_time(1, 0), Duration::ZERO);
    }
}
