//! What the sender is given: product sizes and arrival times, from an LDM trace or generated,
//! and the product bytes themselves.
//!
//! Trace format (`../shared/data/traces/*.txt`): one product per line, `SIZE YYYYMMDDhhmmss.fff`
//! (bytes, then the UTC arrival time); arrival times are taken relative to the first line.
//!
//! Content: a product's bytes are a pure function of a 64-bit seed and the byte position
//! ([`pattern_fill`]), so the simulator can hand the sender a [`PatternData`] that generates
//! blocks on demand (no 5.5 GB in memory) and can check any block of any message by position
//! ([`pattern_matches`]) or recompute a product's expected [`DeliveredProduct::fingerprint`] in
//! O(blocks) ([`pattern_fingerprint`]). Small scenarios materialize the same bytes in memory and
//! check full MD5s.
//!
//! [`DeliveredProduct::fingerprint`]: ldm7_fmtp_proto::DeliveredProduct::fingerprint

use std::path::Path;
use std::time::Duration;

use ldm7_fmtp_proto::wire::BLOCK_LEN;
use ldm7_fmtp_proto::{DataUnavailable, ProductData, block_fingerprint, sampled_block_fingerprint};

use crate::rng::SimRng;
pub use ldm7_types::content::{bytes as pattern_bytes, fill as pattern_fill, matches as pattern_matches};

/// One product of a workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProductSpec {
    /// When it is handed to the sender, since the start of the run.
    pub at: Duration,
    /// Its size in bytes.
    pub size: u32,
}

/// Products in arrival order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Workload {
    /// The products, `at` non-decreasing.
    pub products: Vec<ProductSpec>,
}

/// Why a trace cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be read.
    #[error("cannot read trace {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A line is not a trace entry.
    #[error("trace line {0}")]
    Line(#[from] ldm7_types::trace::TraceError),
}

impl Workload {
    /// Reads a trace file.
    pub fn from_trace_file(path: impl AsRef<Path>) -> Result<Self, TraceError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|source| TraceError::Io { path: path.display().to_string(), source })?;
        Self::parse_trace(&text)
    }

    /// Parses trace text ([`ldm7_types::trace`]). Arrival times are taken relative to the
    /// first product; times that go backwards are clamped to the previous one, so the workload
    /// stays in order.
    pub fn parse_trace(text: &str) -> Result<Self, TraceError> {
        let entries = ldm7_types::trace::parse_trace(text)?;
        let first = entries.first().map(|entry| entry.created);
        let mut previous = Duration::ZERO;
        let products = entries
            .iter()
            .map(|entry| {
                let at = first.map_or(Duration::ZERO, |first| entry.created.saturating_duration_since(first));
                previous = previous.max(at);
                ProductSpec { at: previous, size: entry.size }
            })
            .collect();
        Ok(Self { products })
    }

    /// `count` products of `size` bytes, one every `interval`.
    pub fn uniform(count: usize, size: u32, interval: Duration) -> Self {
        Self::from_sizes(&vec![size; count], interval)
    }

    /// Products of the given sizes, one every `interval`.
    pub fn from_sizes(sizes: &[u32], interval: Duration) -> Self {
        let products = sizes
            .iter()
            .enumerate()
            .map(|(k, size)| ProductSpec { at: interval * u32::try_from(k).unwrap_or(u32::MAX), size: *size })
            .collect();
        Self { products }
    }

    /// `count` products with log-uniform sizes in `[size_min, size_max]` and exponential gaps
    /// of mean `interval_mean` (a Poisson arrival process), from `seed`.
    pub fn generated(seed: u64, count: usize, size_min: u32, size_max: u32, interval_mean: Duration) -> Self {
        let mut rng = SimRng::new(seed, u64::MAX - 1);
        let (low, high) = (f64::from(size_min.max(1)).ln(), f64::from(size_max.max(size_min).max(1)).ln());
        let mut at = Duration::ZERO;
        let products = (0..count)
            .map(|_| {
                let size = (low + (high - low) * rng.unit()).exp().round() as u32;
                let product = ProductSpec { at, size: size.clamp(size_min, size_max) };
                at += interval_mean.mul_f64(-(1.0 - rng.unit()).ln());
                product
            })
            .collect();
        Self { products }
    }

    /// The first `count` products.
    pub fn take(mut self, count: usize) -> Self {
        self.products.truncate(count);
        self
    }

    /// Total bytes.
    pub fn total_bytes(&self) -> u64 {
        self.products.iter().map(|p| u64::from(p.size)).sum()
    }

    /// Arrival time of the last product.
    pub fn duration(&self) -> Duration {
        self.products.last().map_or(Duration::ZERO, |p| p.at)
    }
}

/// Product bytes generated on demand from a seed: the sender reads blocks, nothing is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PatternData {
    /// The content seed.
    pub seed: u64,
    /// The size in bytes.
    pub len: u32,
}

impl ProductData for PatternData {
    fn len(&self) -> u64 {
        u64::from(self.len)
    }

    fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<(), DataUnavailable> {
        if offset + out.len() as u64 > u64::from(self.len) {
            return Err(DataUnavailable);
        }
        pattern_fill(self.seed, offset, out);
        Ok(())
    }
}

/// The [`DeliveredProduct::fingerprint`] a receiver must report for a pattern product: O(1) per
/// block (only each block's first and last 8 bytes are generated).
///
/// [`DeliveredProduct::fingerprint`]: ldm7_fmtp_proto::DeliveredProduct::fingerprint
pub fn pattern_fingerprint(seed: u64, size: u32) -> u64 {
    pattern_range_fingerprint(seed, 0, size)
}

/// The part of [`pattern_fingerprint`] from the blocks of `[start, end)` (`start` on a block
/// boundary; `end` a block boundary or the product's end).
pub fn pattern_range_fingerprint(seed: u64, start: u32, end: u32) -> u64 {
    let mut sum = 0u64;
    let mut offset = start;
    while offset < end {
        let len = (end - offset).min(BLOCK_LEN as u32) as usize;
        let sampled = len.min(8);
        let (mut head, mut tail) = ([0u8; 8], [0u8; 8]);
        pattern_fill(seed, u64::from(offset), &mut head[..sampled]);
        pattern_fill(seed, u64::from(offset) + (len - sampled) as u64, &mut tail[8 - sampled..]);
        sum = sum.wrapping_add(sampled_block_fingerprint(offset, len, head, tail));
        offset += len as u32;
    }
    sum
}

/// The fingerprint of in-memory bytes, over the §3 tiling (block `k` at `k × 1448`).
pub fn bytes_fingerprint(bytes: &[u8]) -> u64 {
    bytes_fingerprint_from(0, bytes)
}

/// The fingerprint of the blocks of `bytes`, which start at `offset` (a block boundary).
pub fn bytes_fingerprint_from(offset: usize, bytes: &[u8]) -> u64 {
    bytes.chunks(BLOCK_LEN).enumerate().fold(0u64, |sum, (k, block)| {
        // offset + k × 1448 < size ≤ u32::MAX.
        sum.wrapping_add(block_fingerprint((offset + k * BLOCK_LEN) as u32, block))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_trace_format() {
        let text = "90654 20150615000000.009\n\n# comment\n91495 20150615000001.211\n5 20150615000001.000\n";
        let workload = Workload::parse_trace(text).unwrap();
        let expected = vec![
            ProductSpec { at: Duration::ZERO, size: 90654 },
            ProductSpec { at: Duration::from_millis(1202), size: 91495 },
            // Backwards in time: clamped.
            ProductSpec { at: Duration::from_millis(1202), size: 5 },
        ];
        assert_eq!(workload.products, expected);
        assert_eq!(workload.total_bytes(), 90654 + 91495 + 5);
        let error = Workload::parse_trace("12 2015\n").unwrap_err().to_string();
        assert!(error.contains("trace line 1"), "{error}");
        assert!(Workload::parse_trace("x 20150615000000.009").is_err());
    }

    #[test]
    fn pattern_is_positional_and_checkable_anywhere() {
        let whole = pattern_bytes(42, 5_000);
        for (offset, len) in [(0, 5_000), (3, 17), (1448, 1448), (4_999, 1), (7, 0), (8, 8)] {
            let mut part = vec![0; len];
            pattern_fill(42, offset as u64, &mut part);
            assert_eq!(part, whole[offset..offset + len], "offset {offset}, len {len}");
            assert!(pattern_matches(42, offset as u64, &part));
        }
        let mut wrong = whole[100..200].to_vec();
        wrong[50] ^= 1;
        assert!(!pattern_matches(42, 100, &wrong));
        assert!(!pattern_matches(43, 100, &whole[100..200]));
        assert!(!pattern_matches(42, 101, &whole[100..200]));
        // A word, or a line of 8 words, away.
        assert!(!pattern_matches(42, 108, &whole[100..200]));
        assert!(!pattern_matches(42, 164, &whole[100..200]));
    }

    #[test]
    fn pattern_fingerprint_matches_the_bytes() {
        for size in [0, 1, 7, 8, 9, 1447, 1448, 1449, 100_000] {
            let bytes = pattern_bytes(9, size);
            assert_eq!(pattern_fingerprint(9, size), bytes_fingerprint(&bytes), "size {size}");
        }
        let data = PatternData { seed: 9, len: 10 };
        let mut out = [0u8; 4];
        data.read_at(6, &mut out).unwrap();
        assert_eq!(out, pattern_bytes(9, 10)[6..]);
        assert_eq!(data.read_at(7, &mut out), Err(DataUnavailable));
    }

    #[test]
    fn generated_workloads_are_reproducible() {
        let a = Workload::generated(5, 100, 10, 1_000_000, Duration::from_millis(10));
        assert_eq!(a, Workload::generated(5, 100, 10, 1_000_000, Duration::from_millis(10)));
        assert!(a.products.iter().all(|p| (10..=1_000_000).contains(&p.size)));
        assert!(a.products.windows(2).all(|w| w[0].at <= w[1].at));
        assert_eq!(Workload::uniform(3, 5, Duration::from_secs(1)).duration(), Duration::from_secs(2));
    }
}
