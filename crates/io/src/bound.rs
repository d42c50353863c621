//! Hits of a named bound (STYLE.md rule 5: "hitting a bound increments a counter and logs
//! once"): [`BoundHits`] counts every hit and tells the caller when a hit starts an *episode*,
//! so that the caller logs once per episode rather than once per hit; the episode ends when the
//! caller sees the bound relieved (the queue drained, the channel had room again).
//!
//! Atomic, so that the task that hits a bound and the one that relieves it (a channel's sender
//! and its receiver) can share one through an `Arc`, and a reader can snapshot the count at any
//! time. The caller logs (with its own context); this type only decides when.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// A bound's hit counter and episode flag.
#[derive(Debug, Default)]
pub struct BoundHits {
    count: AtomicU64,
    in_episode: AtomicBool,
}

impl BoundHits {
    /// No hit yet.
    pub const fn new() -> Self {
        Self { count: AtomicU64::new(0), in_episode: AtomicBool::new(false) }
    }

    /// Records a hit; returns `true` when it starts an episode (log it now).
    pub fn hit(&self) -> bool {
        self.count.fetch_add(1, Ordering::Relaxed);
        !self.in_episode.swap(true, Ordering::AcqRel)
    }

    /// The bound is no longer pressed: the next hit starts a new episode. Returns `true` when an
    /// episode ended here (to log its end, if wanted).
    pub fn relieved(&self) -> bool {
        self.in_episode.swap(false, Ordering::AcqRel)
    }

    /// Whether an episode is under way.
    pub fn in_episode(&self) -> bool {
        self.in_episode.load(Ordering::Acquire)
    }

    /// Hits so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

/// Log throttling for events that have no "relieved" signal (a protocol reporting each time a
/// bound stops a request): the first event of a kind is logged at once, later ones at most once
/// per `interval`, with how many happened since the last line.
#[derive(Debug)]
pub struct Throttle<K> {
    interval: std::time::Duration,
    last: std::collections::HashMap<K, (ldm7_types::Instant, u64)>,
}

impl<K: std::hash::Hash + Eq> Throttle<K> {
    /// At most one line per kind per `interval`.
    pub fn new(interval: std::time::Duration) -> Self {
        Self { interval, last: std::collections::HashMap::new() }
    }

    /// Records an event of `kind` at `now`; returns `Some(count)` (events since the last line,
    /// this one included) when it should be logged.
    pub fn event(&mut self, kind: K, now: ldm7_types::Instant) -> Option<u64> {
        match self.last.get_mut(&kind) {
            Some((at, since)) => {
                *since += 1;
                if now.saturating_duration_since(*at) < self.interval {
                    return None;
                }
                let count = *since;
                *at = now;
                *since = 0;
                Some(count)
            }
            None => {
                self.last.insert(kind, (now, 0));
                Some(1)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttle_logs_the_first_then_once_per_interval_with_the_count() {
        let mut throttle = Throttle::new(std::time::Duration::from_secs(60));
        let at = |secs: u64| ldm7_types::Instant::from_nanos(secs * 1_000_000_000);
        assert_eq!(throttle.event("a", at(0)), Some(1));
        assert_eq!(throttle.event("a", at(1)), None);
        assert_eq!(throttle.event("b", at(1)), Some(1));
        assert_eq!(throttle.event("a", at(30)), None);
        assert_eq!(throttle.event("a", at(61)), Some(3));
        assert_eq!(throttle.event("a", at(62)), None);
    }

    #[test]
    fn one_log_per_episode_every_hit_counted() {
        let hits = BoundHits::new();
        assert!(!hits.relieved(), "no episode to end");
        assert!(hits.hit());
        assert!(!hits.hit());
        assert!(hits.in_episode());
        assert!(hits.relieved());
        assert!(!hits.relieved());
        assert!(hits.hit());
        assert_eq!(hits.count(), 3);
    }
}
