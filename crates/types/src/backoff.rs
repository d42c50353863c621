//! Reconnection back-off: the delay doubles from `min` to `max`; an optional deadline ends the
//! attempts (the FMTP receiver gives up on its repair connection after it; a REQUEST or a
//! subscription retries for ever). A session that ran longer than `max` resets the schedule.

use std::time::Duration;

use crate::Instant;

/// A doubling back-off schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
    deadline: Option<Instant>,
}

impl Backoff {
    /// Delays from `min` doubling up to `max` (`min` is raised to at least 1 ms, `max` to `min`).
    pub fn new(min: Duration, max: Duration) -> Self {
        let min = min.max(Duration::from_millis(1));
        let max = max.max(min);
        Self { min, max, next: min, deadline: None }
    }

    /// Gives up once `deadline` has passed.
    pub fn with_deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// The delay before the next attempt, or `None` when the deadline would be passed by it
    /// (the last delay is cut to end at the deadline if that leaves any time).
    pub fn next_delay(&mut self, now: Instant) -> Option<Duration> {
        let mut delay = self.next;
        if let Some(deadline) = self.deadline {
            let left = deadline.saturating_duration_since(now);
            if left.is_zero() {
                return None;
            }
            delay = delay.min(left);
        }
        self.next = (self.next * 2).min(self.max);
        Some(delay)
    }

    /// Starts again from `min` (after a session that worked for a while).
    pub fn reset(&mut self) {
        self.next = self.min;
    }

    /// The longest delay.
    pub fn max(&self) -> Duration {
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_and_stops_at_the_deadline() {
        let start = Instant::from_nanos(0);
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(500));
        let delays: Vec<_> = (0..5).map(|_| backoff.next_delay(start).unwrap().as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 500, 500]);
        backoff.reset();
        assert_eq!(backoff.next_delay(start), Some(Duration::from_millis(100)));
        let mut bounded = Backoff::new(Duration::from_secs(1), Duration::from_secs(8))
            .with_deadline(start + Duration::from_millis(1500));
        assert_eq!(bounded.next_delay(start), Some(Duration::from_secs(1)));
        assert_eq!(bounded.next_delay(start + Duration::from_secs(1)), Some(Duration::from_millis(500)));
        assert_eq!(bounded.next_delay(start + Duration::from_millis(1500)), None);
    }
}
