//! Byte-accurate token bucket for the sender's pacing (ARCHITECTURE.md "Rate": the FMTP sender
//! paces itself at the feed's path rate).
//!
//! Tokens are kept in bit·nanoseconds (bits × 10⁹) so that refilling at `rate` bits/s over `dt`
//! nanoseconds adds exactly `rate × dt`: no rounding drift, however small the steps. A message
//! of `n` bytes costs `(n + overhead) × 8 × 10⁹`. A message is sent only when the bucket holds
//! its whole cost (no debt), so over any interval the bytes sent are at most
//! `rate × interval / 8 + bucket depth`.

use crate::time::Instant;

/// A pacing rate and burst allowance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pacing {
    /// Sustained rate in bits per second (> 0).
    pub rate_bits_per_s: u64,
    /// Bucket depth in bytes: what a sender that fell behind may still send on top of the rate.
    /// Must hold one largest message plus its overhead ([`crate::wire::MESSAGE_LEN_MAX`] +
    /// `overhead_bytes_per_message`).
    pub bucket_bytes: u64,
    /// Bytes charged per message on top of the FMTP bytes (e.g. 28 for UDP + IPv4 headers, to
    /// pace on-the-wire bytes). 0 paces FMTP bytes.
    pub overhead_bytes_per_message: u64,
    /// How fast a sender that fell behind catches up; `None`: at once (the bucket's depth is the
    /// largest burst).
    pub peak: Option<Peak>,
}

/// A second, shallower bucket at a rate a little above the sustained one, as in a token bucket
/// filter's peak rate: a sender that woke late sends what it owes (up to the sustained
/// bucket's depth) at most `percent_over` percent faster than the rate, not in one burst.
///
/// Only lateness is owed, not idleness: while the sender has nothing to send
/// ([`TokenBucket::idle`]), the sustained bucket fills no higher than the peak bucket's depth,
/// so the burst after a quiet spell is the peak bucket's, as without a peak rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peak {
    /// The peak rate's excess over the sustained rate, in percent (> 0).
    pub percent_over: u64,
    /// The peak bucket's depth in bytes: the largest burst. Must hold one largest message plus
    /// its overhead.
    pub bucket_bytes: u64,
}

impl Pacing {
    /// Pacing at `rate_bits_per_s` with a depth of 8 largest messages, no overhead and no
    /// peak rate.
    pub const fn new(rate_bits_per_s: u64) -> Self {
        Self {
            rate_bits_per_s,
            bucket_bytes: 8 * crate::wire::MESSAGE_LEN_MAX as u64,
            overhead_bytes_per_message: 0,
            peak: None,
        }
    }

    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.rate_bits_per_s == 0 {
            return Err("pacing rate is 0 bits/s: give a positive rate or no pacing".into());
        }
        let needed = crate::wire::MESSAGE_LEN_MAX as u64 + self.overhead_bytes_per_message;
        if self.bucket_bytes < needed {
            return Err(format!(
                "pacing bucket of {} bytes cannot hold one {needed}-byte message: use at least {needed}",
                self.bucket_bytes
            ));
        }
        if let Some(peak) = &self.peak {
            if peak.percent_over == 0 {
                return Err("pacing peak rate 0% over the rate: give a positive excess or no peak".into());
            }
            if peak.bucket_bytes < needed {
                return Err(format!(
                    "pacing peak bucket of {} bytes cannot hold one {needed}-byte message: use at least {needed}",
                    peak.bucket_bytes
                ));
            }
        }
        Ok(())
    }
}

const NANOS_PER_SECOND: u128 = 1_000_000_000;

/// One bucket's level, in bit·nanoseconds.
#[derive(Clone, Debug)]
struct Level {
    rate_bits_per_s: u128,
    capacity: u128,
    tokens: u128,
}

impl Level {
    fn full(rate_bits_per_s: u128, bucket_bytes: u64) -> Self {
        let capacity = u128::from(bucket_bytes) * 8 * NANOS_PER_SECOND;
        Self { rate_bits_per_s, capacity, tokens: capacity }
    }

    fn refill(&mut self, elapsed_nanos: u128) {
        let want = self.tokens.saturating_add(elapsed_nanos.saturating_mul(self.rate_bits_per_s));
        self.tokens = self.capacity.min(want);
    }

    /// Nanoseconds until the level holds `cost`.
    fn wait_for(&self, cost: u128) -> u128 {
        cost.saturating_sub(self.tokens).div_ceil(self.rate_bits_per_s)
    }
}

/// The bucket state: the sustained level and, with a peak rate, the peak level. Starts full
/// and idle.
#[derive(Clone, Debug)]
pub(crate) struct TokenBucket {
    sustained: Level,
    peak: Option<(u64, Level)>,
    overhead_bytes: u128,
    updated: Instant,
    /// Nothing to send since the last [`TokenBucket::idle`] (and no message taken since).
    idle: bool,
}

impl TokenBucket {
    pub(crate) fn new(pacing: &Pacing, now: Instant) -> Self {
        let rate = u128::from(pacing.rate_bits_per_s);
        Self {
            sustained: Level::full(rate, pacing.bucket_bytes),
            peak: pacing
                .peak
                .map(|peak| (peak.percent_over, Level::full(peak_rate(rate, peak.percent_over), peak.bucket_bytes))),
            overhead_bytes: u128::from(pacing.overhead_bytes_per_message),
            updated: now,
            idle: true,
        }
        .settled()
    }

    /// With a peak rate and idle: the sustained level held to the peak bucket's depth.
    fn settled(mut self) -> Self {
        self.hold_idle();
        self
    }

    fn hold_idle(&mut self) {
        if let (true, Some((_, peak))) = (self.idle, &self.peak) {
            self.sustained.tokens = self.sustained.tokens.min(peak.capacity);
        }
    }

    /// The sender has nothing to send at `now`: what it earns until its next message is not
    /// owed to it beyond the peak bucket's depth.
    pub(crate) fn idle(&mut self, now: Instant) {
        self.refill(now);
        self.idle = true;
        self.hold_idle();
    }

    fn levels(&self) -> impl Iterator<Item = &Level> {
        std::iter::once(&self.sustained).chain(self.peak.as_ref().map(|(_, level)| level))
    }

    fn levels_mut(&mut self) -> impl Iterator<Item = &mut Level> {
        std::iter::once(&mut self.sustained).chain(self.peak.as_mut().map(|(_, level)| level))
    }

    /// Adds the tokens earned since the last update (time never goes backwards here).
    pub(crate) fn refill(&mut self, now: Instant) {
        if now > self.updated {
            let elapsed = u128::from(now.as_nanos() - self.updated.as_nanos());
            for level in self.levels_mut() {
                level.refill(elapsed);
            }
            self.hold_idle();
            self.updated = now;
        }
    }

    /// Paces at `rate_bits_per_s` from `now` on; what was earned at the old rate is kept.
    pub(crate) fn set_rate(&mut self, now: Instant, rate_bits_per_s: u64) {
        self.refill(now);
        let rate = u128::from(rate_bits_per_s.max(1));
        self.sustained.rate_bits_per_s = rate;
        if let Some((percent_over, level)) = &mut self.peak {
            level.rate_bits_per_s = peak_rate(rate, *percent_over);
        }
    }

    /// Takes the cost of a `len`-byte message if the bucket holds it.
    pub(crate) fn try_take(&mut self, len: usize) -> bool {
        let cost = self.cost(len);
        if !self.allows(len) {
            return false;
        }
        for level in self.levels_mut() {
            level.tokens -= cost;
        }
        self.idle = false;
        true
    }

    /// Whether a `len`-byte message could be taken now (after [`TokenBucket::refill`]).
    pub(crate) fn allows(&self, len: usize) -> bool {
        let cost = self.cost(len);
        self.levels().all(|level| level.tokens >= cost)
    }

    /// The earliest instant at which a `len`-byte message can be taken.
    pub(crate) fn ready_at(&self, len: usize) -> Instant {
        let cost = self.cost(len);
        let wait = self.levels().map(|level| level.wait_for(cost)).max().unwrap_or(0);
        Instant::from_nanos(self.updated.as_nanos().saturating_add(u64::try_from(wait).unwrap_or(u64::MAX)))
    }

    fn cost(&self, len: usize) -> u128 {
        (len as u128 + self.overhead_bytes) * 8 * NANOS_PER_SECOND
    }
}

fn peak_rate(rate_bits_per_s: u128, percent_over: u64) -> u128 {
    (rate_bits_per_s * (100 + u128::from(percent_over)) / 100).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paces_exactly_at_the_rate() {
        let pacing = Pacing { rate_bits_per_s: 8_000, bucket_bytes: 2_000, overhead_bytes_per_message: 0, peak: None };
        let mut bucket = TokenBucket::new(&pacing, Instant::ZERO);
        assert!(bucket.try_take(1_000));
        assert!(bucket.try_take(1_000));
        assert!(!bucket.try_take(1));
        // 1000 bytes at 1000 bytes/s: one second.
        assert_eq!(bucket.ready_at(1_000), Instant::from_nanos(1_000_000_000));
        bucket.refill(Instant::from_nanos(999_999_999));
        assert!(!bucket.allows(1_000));
        bucket.refill(Instant::from_nanos(1_000_000_000));
        assert!(bucket.try_take(1_000));
    }

    /// 8,000 bits/s sustained (1,000 bytes/s) with 4,000 bytes owed at most; peak 50% over
    /// (1,500 bytes/s) in bursts of at most 1,000 bytes.
    fn with_peak() -> Pacing {
        Pacing {
            rate_bits_per_s: 8_000,
            bucket_bytes: 4_000,
            overhead_bytes_per_message: 0,
            peak: Some(Peak { percent_over: 50, bucket_bytes: 1_000 }),
        }
    }

    fn at(millis: u64) -> Instant {
        Instant::from_nanos(millis * 1_000_000)
    }

    /// Sends 50-byte messages every 100 ms from `from` for `steps` steps; bytes sent per step.
    fn send_every_100_ms(bucket: &mut TokenBucket, from: u64, steps: u64) -> Vec<u64> {
        (0..steps)
            .map(|step| {
                bucket.refill(at(from + step * 100));
                let mut sent = 0;
                while bucket.try_take(50) {
                    sent += 50;
                }
                sent
            })
            .collect()
    }

    #[test]
    fn a_late_sender_makes_up_what_it_owes_at_the_peak_rate() {
        let mut bucket = TokenBucket::new(&with_peak(), at(0));
        // Busy from the start: the first burst is the peak bucket's, not the owed depth.
        assert!(bucket.try_take(1_000));
        assert!(!bucket.allows(1));
        // Three seconds late: 3,000 bytes earned, at most the peak bucket's 1,000 at once.
        bucket.refill(at(3_000));
        assert!(bucket.try_take(1_000));
        assert!(!bucket.allows(1));
        // Then 150 bytes every 100 ms (50% over) until the 2,000 owed are paid, then 100.
        let sent = send_every_100_ms(&mut bucket, 3_100, 60);
        assert!(sent[..40].iter().all(|&bytes| bytes == 150), "{sent:?}");
        assert!(sent[40..].iter().all(|&bytes| bytes == 100), "{sent:?}");
    }

    #[test]
    fn idle_time_is_not_owed() {
        let mut bucket = TokenBucket::new(&with_peak(), at(0));
        assert!(bucket.try_take(1_000));
        // Nothing to send for ten seconds: only the peak bucket's depth is there after.
        bucket.idle(at(0));
        bucket.refill(at(10_000));
        assert!(bucket.try_take(1_000));
        assert!(!bucket.allows(1));
        bucket.refill(at(11_000));
        assert!(bucket.try_take(1_000));
        assert!(!bucket.allows(1));
    }

    #[test]
    fn a_debt_beyond_the_owed_depth_is_not_made_up() {
        let mut bucket = TokenBucket::new(&with_peak(), at(0));
        assert!(bucket.try_take(1_000));
        // A minute late: 4,000 bytes owed at most, then 20 s at 1,000 bytes/s.
        let sent = send_every_100_ms(&mut bucket, 60_000, 201);
        assert_eq!(sent.iter().sum::<u64>(), 4_000 + 20_000);
    }

    #[test]
    fn rejects_impossible_configurations() {
        assert!(Pacing::new(0).validate().is_err());
        assert!(
            Pacing { rate_bits_per_s: 1, bucket_bytes: 100, overhead_bytes_per_message: 0, peak: None }
                .validate()
                .is_err()
        );
        assert!(Pacing::new(1).validate().is_ok());
        let peak =
            |percent_over, bucket_bytes| Pacing { peak: Some(Peak { percent_over, bucket_bytes }), ..Pacing::new(1) };
        assert!(peak(0, 10_000).validate().is_err());
        assert!(peak(25, 100).validate().is_err());
        assert!(peak(25, 10_000).validate().is_ok());
    }
}
