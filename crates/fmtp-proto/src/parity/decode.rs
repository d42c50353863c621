//! Decoding a group whose data blocks outnumber its shards (after rounding both up to powers of
//! two; every default coding): the `reed-solomon-simd` crate's high-rate decoding, done here
//! with less work than the crate's own decoder does it.
//!
//! Positions in the working space: the shards first (`0..shards`, then zeros up to the next
//! power of two, `chunk`), then the data blocks (`chunk..chunk + blocks`), then zeros up to a
//! power of two. With `E` the erased positions (shards not received, the padding up to
//! `chunk`, blocks lost) and `log` the field's logarithm with `log(0) = 0`, each position `i`
//! is weighted by `L(i) = Σ_{j∈E} log(i ⊕ j) mod 65535` (the error locator at `i`, in the log
//! domain), then the space goes through an inverse FFT, a formal derivative and an FFT, and a
//! lost block is what its position then holds, divided by its weight.
//!
//! Where the crate computes the weights of all 65536 field elements by two Walsh–Hadamard
//! transforms (a fixed 0.3 ms per group here), this sums `|E| ≤ chunk` logarithms for each of
//! the positions used (about 33,000 table reads at the default coding); the data is weighted
//! as it is copied in; and the formal derivative is the engine's
//! ([`ParityEngine::formal_derivative`]). Both were 40% of a decode with
//! the [`ParityEngine`] in its profile (`cargo bench -p ldm7-fmtp-proto --bench parity`).

use reed_solomon_simd::Error;
use reed_solomon_simd::engine::{Engine, GF_MODULUS, GF_ORDER, ShardsRefMut, tables};

use super::ParityEngine;

/// Above this many table reads (positions × erased positions), the weights are computed as the
/// crate computes them, by two Walsh–Hadamard transforms of 2¹⁶ points (about 2 million
/// additions): 32,768 at the default coding, 8 million at the largest (32,768 blocks, 256
/// shards).
const DIRECT_WEIGHTS_MAX: usize = 1 << 21;

/// Whether a group of `blocks` with `shards` is coded at the high rate, as the crate chooses
/// (its encoder codes what this decodes).
pub(super) fn high_rate(blocks: usize, shards: usize) -> bool {
    blocks.next_power_of_two() > shards.next_power_of_two()
}

/// The working space and weights, kept from group to group.
#[derive(Default)]
pub(super) struct HighRateDecoder {
    engine: Option<ParityEngine>,
    work: Vec<[u8; 64]>,
    weights: Vec<u16>,
    erased: Vec<usize>,
    received: Vec<bool>,
}

impl HighRateDecoder {
    /// The lost blocks of a group of `blocks` blocks of `block_len` bytes (`group`, the last
    /// block possibly short) from the others and the shards received, as
    /// [`super::ParityConfig::decode`]. Requires [`high_rate`].
    pub(super) fn decode<'s>(
        &mut self,
        block_len: usize,
        shards: usize,
        group: &[u8],
        lost: impl Fn(u32) -> bool,
        received_shards: impl IntoIterator<Item = (u32, &'s [u8])>,
    ) -> Result<Vec<(u32, Vec<u8>)>, Error> {
        let blocks = group.len().div_ceil(block_len);
        debug_assert!(high_rate(blocks, shards));
        if block_len == 0 || !block_len.is_multiple_of(2) {
            return Err(Error::InvalidShardSize { shard_bytes: block_len });
        }
        let chunk = shards.next_power_of_two();
        let end = chunk + blocks;
        let positions = end.next_power_of_two();
        let chunks = block_len.div_ceil(64);
        // Every position is written below: received ones by `put_weighted`, the others zeroed.
        self.work.resize(positions * chunks, [0; 64]);
        let engine = self.engine.get_or_insert_with(ParityEngine::new);

        // The shards received, in their positions.
        self.received.clear();
        self.received.resize(end, false);
        let mut shards_held: Vec<Option<&[u8]>> = vec![None; shards];
        let mut shards_received = 0;
        for (index, shard) in received_shards {
            let index = index as usize;
            if index >= shards {
                return Err(Error::InvalidRecoveryShardIndex { recovery_count: shards, index });
            }
            if shard.len() != block_len {
                return Err(Error::DifferentShardSize { shard_bytes: block_len, got: shard.len() });
            }
            if std::mem::replace(&mut self.received[index], true) {
                return Err(Error::DuplicateRecoveryShardIndex { index });
            }
            shards_held[index] = Some(shard);
            shards_received += 1;
        }
        // Blocks (each position ≤ 32768 fits u32).
        let lost_positions: Vec<usize> = (0..blocks).filter(|&p| lost(p as u32)).collect();
        if lost_positions.is_empty() {
            return Ok(Vec::new());
        }
        if blocks - lost_positions.len() + shards_received < blocks {
            return Err(Error::NotEnoughShards {
                original_count: blocks,
                original_received_count: blocks - lost_positions.len(),
                recovery_received_count: shards_received,
            });
        }
        for position in (0..blocks).filter(|p| lost_positions.binary_search(p).is_err()) {
            self.received[chunk + position] = true;
        }
        self.erased.clear();
        self.erased.extend((0..end).filter(|&i| !self.received[i]));

        // The weights of the positions used: summed directly where that is cheaper than the
        // crate's two transforms of 2¹⁶ points (every default coding), else by them.
        self.weights.clear();
        if end * self.erased.len() <= DIRECT_WEIGHTS_MAX {
            let tables::ExpLog { log, .. } = tables::get_exp_log();
            let log = |x: usize| if x == 0 { 0 } else { u32::from(log[x]) };
            self.weights.extend((0..end).map(|i| {
                let sum: u32 = self.erased.iter().map(|&j| log(i ^ j)).sum();
                // |E| ≤ 256 terms below 2¹⁶: no overflow; the remainder is below 65535.
                (sum % u32::from(GF_MODULUS)) as u16
            }));
        } else {
            let mut all = vec![0u16; GF_ORDER].into_boxed_slice();
            for &j in &self.erased {
                all[j] = 1;
            }
            let all: &mut [u16; GF_ORDER] = (&mut *all).try_into().expect("2¹⁶ elements");
            ParityEngine::eval_poly(all, end);
            self.weights.extend_from_slice(&all[..end]);
        }

        // Received shards and blocks, weighted; the rest zero.
        let mut blocks_iter = group.chunks(block_len);
        for at in 0..positions {
            let shard = &mut self.work[at * chunks..(at + 1) * chunks];
            let bytes = match at {
                at if at < chunk => shards_held.get(at).copied().flatten(),
                at if at < end => blocks_iter.next().filter(|_| self.received[at]),
                _ => None,
            };
            match bytes {
                Some(bytes) => put_weighted(engine, shard, bytes, block_len, self.weights[at]),
                None => shard.fill([0; 64]),
            }
        }

        let mut space = ShardsRefMut::new(positions, chunks, &mut self.work);
        engine.ifft(&mut space, 0, positions, end, 0);
        engine.formal_derivative(&mut self.work, chunks);
        let mut space = ShardsRefMut::new(positions, chunks, &mut self.work);
        engine.fft(&mut space, 0, positions, end, 0);

        Ok(lost_positions
            .iter()
            .map(|&position| {
                let at = chunk + position;
                let shard = &mut self.work[at * chunks..(at + 1) * chunks];
                engine.mul(shard, GF_MODULUS - self.weights[at]);
                let len = block_len.min(group.len() - position * block_len);
                // Positions < blocks ≤ 32768.
                (position as u32, take(shard, block_len, len))
            })
            .collect())
    }
}

/// `bytes` (a block, or a shard; a short last block is padded with zeros to `block_len`) into
/// a shard's chunks as the crate lays them out, every byte of the shard written: whole 64-byte
/// chunks as they are, and the last `t` bytes of the `block_len` (when not a multiple of 64) as
/// their first `t/2` at the start of the last chunk's low half and the other `t/2` at the start
/// of its high half.
fn put(shard: &mut [[u8; 64]], bytes: &[u8], block_len: usize) {
    let whole = block_len / 64 * 64;
    let head = bytes.len().min(whole);
    let flat = shard.as_flattened_mut();
    flat[..head].copy_from_slice(&bytes[..head]);
    flat[head..].fill(0);
    let tail = block_len - whole;
    if tail == 0 || bytes.len() <= whole {
        return;
    }
    let last = &mut shard[whole / 64];
    for (k, &byte) in bytes[whole..].iter().enumerate() {
        // Byte k of the tail: the low half's k, or the high half's k − t/2.
        let at = if k < tail / 2 { k } else { 32 + k - tail / 2 };
        last[at] = byte;
    }
}

/// [`put`], then the shard times `2^log_m`; whole chunks are multiplied on the way in.
fn put_weighted(engine: &ParityEngine, shard: &mut [[u8; 64]], bytes: &[u8], block_len: usize, log_m: u16) {
    let whole = bytes.len().min(block_len) / 64;
    let (direct, rest) = shard.split_at_mut(whole);
    engine.mul_from(direct, &bytes[..whole * 64], log_m);
    if !rest.is_empty() {
        put(rest, &bytes[whole * 64..], block_len - whole * 64);
        engine.mul(rest, log_m);
    }
}

/// The first `len` bytes of a shard of `block_len` bytes, undoing [`put`]'s layout.
fn take(shard: &[[u8; 64]], block_len: usize, len: usize) -> Vec<u8> {
    let mut bytes = shard.as_flattened()[..block_len].to_vec();
    let whole = block_len / 64 * 64;
    let tail = block_len - whole;
    if tail > 0 {
        let last = &shard[whole / 64];
        bytes[whole..whole + tail / 2].copy_from_slice(&last[..tail / 2]);
        bytes[whole + tail / 2..].copy_from_slice(&last[32..32 + tail / 2]);
    }
    bytes.truncate(len);
    bytes
}

#[cfg(test)]
mod tests {
    use reed_solomon_simd::rate::{DefaultRateDecoder, DefaultRateEncoder, RateDecoder, RateEncoder};

    use super::{HighRateDecoder, high_rate};
    use crate::parity::ParityEngine;

    fn bytes(seed: u64, len: usize) -> Vec<u8> {
        ldm7_types::content::bytes(seed, u32::try_from(len).expect("a test's sizes"))
    }

    /// The crate's encoder's shards of `group` (blocks of `block_len`, the last one padded).
    fn shards(group: &[u8], block_len: usize, shards: usize) -> Vec<Vec<u8>> {
        let blocks = group.len().div_ceil(block_len);
        let mut encoder = DefaultRateEncoder::new(blocks, shards, block_len, ParityEngine::portable(), None).unwrap();
        for block in group.chunks(block_len) {
            let mut padded = block.to_vec();
            padded.resize(block_len, 0);
            encoder.add_original_shard(&padded).unwrap();
        }
        encoder.encode().unwrap().recovery_iter().map(<[u8]>::to_vec).collect()
    }

    /// Lost blocks come back as they were, and as the crate's decoder restores them, for the
    /// default coding, short last blocks, block lengths with and without a partial chunk, every
    /// shard or only some received, and as many losses as shards.
    #[test]
    fn restores_what_the_crate_restores() {
        for engine in [ParityEngine::new(), ParityEngine::portable()] {
            restores_what_the_crate_restores_on(HighRateDecoder { engine: Some(engine), ..HighRateDecoder::default() });
        }
    }

    fn restores_what_the_crate_restores_on(mut decoder: HighRateDecoder) {
        for (case, (blocks, shard_count, block_len, short, lost, skip)) in [
            (992, 32, 1448, 0, 10, 0),
            (992, 32, 1448, 0, 32, 0),
            (992, 32, 1448, 700, 5, 3),
            (1016, 8, 1448, 0, 8, 0),
            (300, 32, 1448, 1, 20, 7),
            (64, 16, 128, 0, 16, 0),
            (100, 4, 1000, 999, 3, 1),
            (65, 2, 2, 1, 1, 0),
            (17, 1, 64, 0, 1, 0),
            // Weights by the transforms (16,256 positions × 200 or more erased).
            (16_000, 256, 64, 0, 200, 0),
        ]
        .into_iter()
        .enumerate()
        {
            assert!(high_rate(blocks, shard_count));
            let mut group = bytes(case as u64, blocks * block_len);
            group.truncate(group.len() - short);
            let coded = shards(&group, block_len, shard_count);
            let gone: Vec<u32> = (0..lost).map(|k| ((k * 37 + case * 5 + 3) % blocks) as u32).collect();
            let mut gone_sorted = gone.clone();
            gone_sorted.sort_unstable();
            gone_sorted.dedup();
            // Shards received: skip the first `skip`, then as many as needed.
            let received: Vec<(u32, &[u8])> =
                coded.iter().enumerate().skip(skip).take(gone_sorted.len()).map(|(i, s)| (i as u32, &s[..])).collect();
            let restored =
                decoder.decode(block_len, shard_count, &group, |p| gone.contains(&p), received.clone()).unwrap();
            let positions: Vec<u32> = restored.iter().map(|(p, _)| *p).collect();
            assert_eq!(positions, gone_sorted, "case {case}");
            for (position, block) in &restored {
                let start = *position as usize * block_len;
                let want = &group[start..(start + block_len).min(group.len())];
                assert_eq!(&block[..], want, "case {case}: block {position}");
            }
            // The crate's own decoder agrees.
            let mut theirs =
                DefaultRateDecoder::new(blocks, shard_count, block_len, ParityEngine::portable(), None).unwrap();
            for (position, block) in group.chunks(block_len).enumerate().filter(|(p, _)| !gone.contains(&(*p as u32))) {
                let mut padded = block.to_vec();
                padded.resize(block_len, 0);
                theirs.add_original_shard(position, &padded).unwrap();
            }
            for (index, shard) in received {
                theirs.add_recovery_shard(index as usize, shard).unwrap();
            }
            let result = theirs.decode().unwrap();
            for ((position, ours), (their_position, their_block)) in
                restored.iter().zip(result.restored_original_iter())
            {
                assert_eq!(*position as usize, their_position);
                assert_eq!(&ours[..], &their_block[..ours.len()], "case {case}");
            }
        }
    }

    #[test]
    fn says_what_is_wrong_with_what_it_got() {
        let mut decoder = HighRateDecoder::default();
        let group = bytes(9, 64 * 128);
        let coded = shards(&group, 128, 8);
        let lost = |p: u32| p < 3;
        let too_few = decoder.decode(128, 8, &group, lost, [(0, &coded[0][..])]).unwrap_err();
        assert!(matches!(too_few, reed_solomon_simd::Error::NotEnoughShards { .. }), "{too_few:?}");
        let twice = [(1, &coded[1][..]), (1, &coded[1][..]), (2, &coded[2][..])];
        assert!(matches!(
            decoder.decode(128, 8, &group, lost, twice).unwrap_err(),
            reed_solomon_simd::Error::DuplicateRecoveryShardIndex { index: 1 }
        ));
        let beyond = [(8, &coded[1][..])];
        assert!(matches!(
            decoder.decode(128, 8, &group, lost, beyond).unwrap_err(),
            reed_solomon_simd::Error::InvalidRecoveryShardIndex { index: 8, .. }
        ));
        let short = [(0, &coded[0][..100])];
        assert!(matches!(
            decoder.decode(128, 8, &group, lost, short).unwrap_err(),
            reed_solomon_simd::Error::DifferentShardSize { got: 100, .. }
        ));
        // Nothing lost: nothing to restore, whatever the shards.
        assert!(decoder.decode(128, 8, &group, |_| false, []).unwrap().is_empty());
        // And it still decodes after the errors.
        let good: Vec<(u32, &[u8])> = coded.iter().take(3).enumerate().map(|(i, s)| (i as u32, &s[..])).collect();
        let restored = decoder.decode(128, 8, &group, lost, good).unwrap();
        assert_eq!(restored[2].1, group[256..384]);
    }
}
