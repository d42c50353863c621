//! The one generator of synthetic product content: a product's bytes are a pure function of a
//! 64-bit seed and the byte position, so any range of any product can be generated (or checked)
//! on its own, in any order, without the product in memory. The simulator hands the FMTP sender
//! products that generate their blocks on demand and checks any block it receives; `ldm7 insert
//! --replay`, `ldm7 fmtp send --synthetic`, the demo and the benchmarks fill their products with
//! it. A mix per 64 bytes (eight words share one), so generating runs at several GB/s.
//!
//! A run of products takes a run seed; product `position` (0 for the first) of it has the
//! content seed [`product_seed`]`(run, position)`: distinct products for distinct positions.

/// SplitMix64's finalizer: a bijective 64-bit mix.
#[inline]
pub const fn mix64(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The content seed of the product at `position` (0 for the first) of a run with seed `run`.
#[inline]
pub const fn product_seed(run: u64, position: u64) -> u64 {
    mix64(run ^ mix64(position.wrapping_add(1)))
}

/// The 8 pattern bytes of word `word` (bytes `8 × word ..`): a mix of the product's seed and
/// the word's line of 8 words, plus an odd multiple of the word's place in its line — every
/// byte depends on the product and its position, at a mix per 64 bytes.
#[inline]
fn pattern_word(seed: u64, word: u64) -> [u8; 8] {
    pattern_in_line(pattern_line(seed, word), word).to_le_bytes()
}

/// The mix of the line (8 words) that word `word` is in.
#[inline]
fn pattern_line(seed: u64, word: u64) -> u64 {
    mix64(seed ^ (word >> 3).wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// Word `word` of its line, given the line's mix.
#[inline]
fn pattern_in_line(line: u64, word: u64) -> u64 {
    line.wrapping_add((word & 7).wrapping_mul(0xd6e8_feb8_6659_fd93))
}

/// The pattern words from word `first` on, one per call (a mix per line, not per word).
fn pattern_words(seed: u64, first: u64) -> impl Iterator<Item = u64> {
    let mut line = pattern_line(seed, first);
    (first..).map(move |word| {
        if word & 7 == 0 {
            line = pattern_line(seed, word);
        }
        pattern_in_line(line, word)
    })
}

/// Fills `out` with the pattern bytes `[offset, offset + out.len())` of the product `seed`.
#[inline]
pub fn fill(seed: u64, offset: u64, out: &mut [u8]) {
    let head = ((8 - offset % 8) % 8).min(out.len() as u64) as usize;
    let (head_bytes, rest) = out.split_at_mut(head);
    for (k, byte) in head_bytes.iter_mut().enumerate() {
        let position = offset + k as u64;
        *byte = pattern_word(seed, position / 8)[(position % 8) as usize];
    }
    let first = (offset + head as u64) / 8;
    let last = first + (rest.len() / 8) as u64;
    let mut chunks = rest.chunks_exact_mut(8);
    let mut words = pattern_words(seed, first);
    for (chunk, word) in (&mut chunks).zip(&mut words) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    let tail = chunks.into_remainder();
    tail.copy_from_slice(&pattern_word(seed, last)[..tail.len()]);
}

/// Whether `bytes` are the pattern bytes at `offset` of the product `seed` (one pass, no
/// allocation).
pub fn matches(seed: u64, offset: u64, bytes: &[u8]) -> bool {
    let head = ((8 - offset % 8) % 8).min(bytes.len() as u64) as usize;
    let (head_bytes, rest) = bytes.split_at(head);
    for (k, byte) in head_bytes.iter().enumerate() {
        let position = offset + k as u64;
        if *byte != pattern_word(seed, position / 8)[(position % 8) as usize] {
            return false;
        }
    }
    let first = (offset + head as u64) / 8;
    let mut chunks = rest.chunks_exact(8);
    let mut differ = 0u64;
    for (chunk, expected) in (&mut chunks).zip(pattern_words(seed, first)) {
        // chunks_exact yields 8-byte chunks.
        differ |= u64::from_le_bytes(chunk.try_into().expect("8 bytes")) ^ expected;
    }
    let tail = chunks.remainder();
    let last = first + (rest.len() / 8) as u64;
    differ == 0 && tail == &pattern_word(seed, last)[..tail.len()]
}

/// The pattern bytes of a whole product (small scenarios).
pub fn bytes(seed: u64, size: u32) -> Vec<u8> {
    let mut bytes = vec![0; size as usize];
    fill(seed, 0, &mut bytes);
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_range_reads_as_the_whole_does() {
        let whole = bytes(product_seed(7, 3), 1000);
        for (offset, len) in [(0, 1000), (1, 7), (5, 64), (63, 130), (999, 1)] {
            let mut part = vec![0; len];
            fill(product_seed(7, 3), offset as u64, &mut part);
            assert_eq!(part, whole[offset..offset + len]);
            assert!(matches(product_seed(7, 3), offset as u64, &part));
        }
        assert_ne!(bytes(product_seed(7, 4), 1000), whole, "another position, other bytes");
        assert_ne!(bytes(product_seed(8, 3), 1000), whole, "another run, other bytes");
    }
}
