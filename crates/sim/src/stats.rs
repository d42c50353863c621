//! Latency statistics: count, mean, max and quantiles from a log-linear histogram (8
//! sub-buckets per power of two: quantiles within 12.5%), constant memory per receiver.

use std::fmt;
use std::time::Duration;

const SUB_BUCKETS: usize = 8;
const BUCKETS: usize = 64 * SUB_BUCKETS;

/// Latencies of delivered products.
#[derive(Clone, PartialEq, Eq)]
pub struct LatencyStats {
    count: u64,
    sum_ns: u128,
    max_ns: u64,
    histogram: Box<[u64; BUCKETS]>,
}

impl Default for LatencyStats {
    fn default() -> Self {
        Self { count: 0, sum_ns: 0, max_ns: 0, histogram: Box::new([0; BUCKETS]) }
    }
}

impl LatencyStats {
    /// Records one latency (negative values count as 0).
    pub fn record(&mut self, latency_ns: i64) {
        let nanos = u64::try_from(latency_ns).unwrap_or(0);
        self.count += 1;
        self.sum_ns += u128::from(nanos);
        self.max_ns = self.max_ns.max(nanos);
        self.histogram[bucket_of(nanos)] += 1;
    }

    /// Adds another set of latencies.
    pub fn merge(&mut self, other: &Self) {
        self.count += other.count;
        self.sum_ns += other.sum_ns;
        self.max_ns = self.max_ns.max(other.max_ns);
        for (mine, theirs) in self.histogram.iter_mut().zip(other.histogram.iter()) {
            *mine += theirs;
        }
    }

    /// How many.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The mean (zero when empty).
    pub fn mean(&self) -> Duration {
        if self.count == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(u64::try_from(self.sum_ns / u128::from(self.count)).unwrap_or(u64::MAX))
    }

    /// The largest.
    pub fn max(&self) -> Duration {
        Duration::from_nanos(self.max_ns)
    }

    /// The `q`-quantile (0 ≤ q ≤ 1), as the upper edge of its histogram bucket (never above
    /// the max).
    pub fn quantile(&self, q: f64) -> Duration {
        if self.count == 0 {
            return Duration::ZERO;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (bucket, count) in self.histogram.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Duration::from_nanos(bucket_upper(bucket).min(self.max_ns));
            }
        }
        self.max()
    }
}

impl fmt::Debug for LatencyStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LatencyStats")
            .field("count", &self.count)
            .field("mean", &self.mean())
            .field("p50", &self.quantile(0.5))
            .field("p99", &self.quantile(0.99))
            .field("max", &self.max())
            .finish()
    }
}

fn bucket_of(nanos: u64) -> usize {
    if nanos < SUB_BUCKETS as u64 {
        return nanos as usize;
    }
    let exponent = 63 - nanos.leading_zeros() as usize;
    let sub = ((nanos >> (exponent - 3)) & (SUB_BUCKETS as u64 - 1)) as usize;
    ((exponent - 2) * SUB_BUCKETS + sub).min(BUCKETS - 1)
}

fn bucket_upper(bucket: usize) -> u64 {
    if bucket < SUB_BUCKETS {
        return bucket as u64;
    }
    let exponent = bucket / SUB_BUCKETS + 2;
    let sub = (bucket % SUB_BUCKETS) as u64;
    let lower = (SUB_BUCKETS as u64 + sub) << (exponent - 3);
    lower.saturating_add((1u64 << (exponent - 3)) - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_bound_their_values() {
        for nanos in [0u64, 1, 7, 8, 9, 15, 16, 1_000, 123_456_789, u64::MAX / 2] {
            let bucket = bucket_of(nanos);
            assert!(bucket_upper(bucket) >= nanos, "{nanos}");
            if bucket > 0 {
                assert!(bucket_upper(bucket - 1) < nanos, "{nanos}");
            }
        }
    }

    #[test]
    fn quantiles_within_an_eighth() {
        let mut stats = LatencyStats::default();
        for ms in 1..=100i64 {
            stats.record(ms * 1_000_000);
        }
        assert_eq!(stats.count(), 100);
        assert_eq!(stats.max(), Duration::from_millis(100));
        assert_eq!(stats.mean(), Duration::from_micros(50_500));
        let p50 = stats.quantile(0.5).as_secs_f64() * 1e3;
        assert!((50.0..=50.0 * 1.125).contains(&p50), "{p50}");
        assert_eq!(stats.quantile(1.0), Duration::from_millis(100));
        let mut merged = LatencyStats::default();
        merged.merge(&stats);
        assert_eq!(merged, stats);
    }
}
