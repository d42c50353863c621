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
    /// Bucket depth in bytes: the largest burst. Must hold one largest message plus its
    /// overhead ([`crate::wire::MESSAGE_LEN_MAX`] + `overhead_bytes_per_message`).
    pub bucket_bytes: u64,
    /// Bytes charged per message on top of the FMTP bytes (e.g. 28 for UDP + IPv4 headers, to
    /// pace on-the-wire bytes). 0 paces FMTP bytes.
    pub overhead_bytes_per_message: u64,
}

impl Pacing {
    /// Pacing at `rate_bits_per_s` with a depth of 8 largest messages and no overhead.
    pub const fn new(rate_bits_per_s: u64) -> Self {
        Self { rate_bits_per_s, bucket_bytes: 8 * crate::wire::MESSAGE_LEN_MAX as u64, overhead_bytes_per_message: 0 }
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
        Ok(())
    }
}

const NANOS_PER_SECOND: u128 = 1_000_000_000;

/// The bucket state. Starts full.
#[derive(Clone, Debug)]
pub(crate) struct TokenBucket {
    rate_bits_per_s: u128,
    capacity: u128,
    tokens: u128,
    overhead_bytes: u128,
    updated: Instant,
}

impl TokenBucket {
    pub(crate) fn new(pacing: &Pacing, now: Instant) -> Self {
        let capacity = u128::from(pacing.bucket_bytes) * 8 * NANOS_PER_SECOND;
        Self {
            rate_bits_per_s: u128::from(pacing.rate_bits_per_s),
            capacity,
            tokens: capacity,
            overhead_bytes: u128::from(pacing.overhead_bytes_per_message),
            updated: now,
        }
    }

    /// Adds the tokens earned since the last update (time never goes backwards here).
    pub(crate) fn refill(&mut self, now: Instant) {
        if now > self.updated {
            let elapsed = u128::from(now.as_nanos() - self.updated.as_nanos());
            self.tokens = self.capacity.min(self.tokens.saturating_add(elapsed.saturating_mul(self.rate_bits_per_s)));
            self.updated = now;
        }
    }

    /// Paces at `rate_bits_per_s` from `now` on; what was earned at the old rate is kept.
    pub(crate) fn set_rate(&mut self, now: Instant, rate_bits_per_s: u64) {
        self.refill(now);
        self.rate_bits_per_s = u128::from(rate_bits_per_s.max(1));
    }

    /// Takes the cost of a `len`-byte message if the bucket holds it.
    pub(crate) fn try_take(&mut self, len: usize) -> bool {
        let cost = self.cost(len);
        if self.tokens >= cost {
            self.tokens -= cost;
            true
        } else {
            false
        }
    }

    /// Whether a `len`-byte message could be taken now (after [`TokenBucket::refill`]).
    pub(crate) fn allows(&self, len: usize) -> bool {
        self.tokens >= self.cost(len)
    }

    /// The earliest instant at which a `len`-byte message can be taken.
    pub(crate) fn ready_at(&self, len: usize) -> Instant {
        let cost = self.cost(len);
        if self.tokens >= cost {
            return self.updated;
        }
        let wait = (cost - self.tokens).div_ceil(self.rate_bits_per_s);
        Instant::from_nanos(self.updated.as_nanos().saturating_add(u64::try_from(wait).unwrap_or(u64::MAX)))
    }

    fn cost(&self, len: usize) -> u128 {
        (len as u128 + self.overhead_bytes) * 8 * NANOS_PER_SECOND
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paces_exactly_at_the_rate() {
        let pacing = Pacing { rate_bits_per_s: 8_000, bucket_bytes: 2_000, overhead_bytes_per_message: 0 };
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

    #[test]
    fn rejects_impossible_configurations() {
        assert!(Pacing::new(0).validate().is_err());
        assert!(Pacing { rate_bits_per_s: 1, bucket_bytes: 100, overhead_bytes_per_message: 0 }.validate().is_err());
        assert!(Pacing::new(1).validate().is_ok());
    }
}
