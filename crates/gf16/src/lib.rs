//! The Reed–Solomon engine parity coding runs on (`ldm7_fmtp_proto::parity`, docs/parity.md):
//! the `reed-solomon-simd` crate's own ([`DefaultEngine`], AVX2 at best), or on x86-64 CPUs
//! with AVX-512 and GFNI an engine of ours that multiplies by a constant of GF(2¹⁶) with
//! `GF2P8AFFINEQB`. A crate of its own: the protocol crates have no `unsafe`, and SIMD
//! intrinsics need it.
//!
//! Why: a receiver decodes nearly every group at 1% loss, and in the goodput harness (four
//! receivers sharing two vCPUs) the crate's AVX2 field multiplications (nibble table lookups)
//! were the largest share of a receiver's own work. The code is the crate's: the same
//! additive FFT over GF(2¹⁶) in its Cantor basis and the same skew factors, so shards are the
//! same bytes whichever engine coded them (tested below against the crate's engine).
//!
//! Multiplying a field element by a constant `c` is linear over GF(2): a 16×16 bit matrix
//! whose column `j` is `c·2ʲ`. The crate keeps a shard's 64-byte chunk as the low bytes of 32
//! elements then their high bytes; the matrix's four 8×8 blocks map low and high input bytes
//! to low and high output bytes, and `GF2P8AFFINEQB` applies an 8×8 bit matrix to every byte of
//! a vector with one matrix per 64-bit lane. So one 512-bit chunk is multiplied with two affine
//! transforms (the chunk, and the chunk with its halves swapped) and one XOR, where the AVX2
//! engine needs eight table lookups and their masks. The matrices of all 65536 constants are
//! built once per process (2 MiB, on the first [`ParityEngine::new`]).

use reed_solomon_simd::engine::{DefaultEngine, Engine, GF_ORDER, GfElement, ShardsRefMut};

/// The engine parity coding uses: ours where the CPU has AVX-512 and GFNI, else the crate's.
pub struct ParityEngine(Inner);

enum Inner {
    #[cfg(target_arch = "x86_64")]
    Affine(gfni::Affine),
    Crate(DefaultEngine),
}

impl std::fmt::Debug for ParityEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Default for ParityEngine {
    fn default() -> Self {
        Self::new()
    }
}

impl ParityEngine {
    /// The best engine for this CPU.
    pub fn new() -> Self {
        #[cfg(target_arch = "x86_64")]
        if let Some(engine) = gfni::Affine::detect() {
            return Self(Inner::Affine(engine));
        }
        Self::portable()
    }

    /// The crate's engine, whatever the CPU.
    pub fn portable() -> Self {
        Self(Inner::Crate(DefaultEngine::new()))
    }

    /// `x = y · 2^log_m` for `y` of `x.len()` whole chunks as bytes.
    pub fn mul_from(&self, x: &mut [[u8; 64]], y: &[u8], log_m: GfElement) {
        match &self.0 {
            #[cfg(target_arch = "x86_64")]
            Inner::Affine(engine) => engine.mul_from(x, y, log_m),
            Inner::Crate(engine) => {
                x.as_flattened_mut().copy_from_slice(y);
                engine.mul(x, log_m);
            }
        }
    }

    /// The formal derivative of a working space of `chunks` chunks a position: for each
    /// position `i` from 1 up, with `w` its lowest set bit, positions `i − w .. i` gain (XOR)
    /// positions `i .. i + w`. (The crate's decoders do this themselves, without SIMD.)
    pub fn formal_derivative(&self, work: &mut [[u8; 64]], chunks: usize) {
        match &self.0 {
            #[cfg(target_arch = "x86_64")]
            Inner::Affine(engine) => engine.formal_derivative(work, chunks),
            Inner::Crate(_) => formal_derivative_from(work, chunks, 1),
        }
    }

    /// Which engine this is, for logs and benchmarks.
    pub fn name(&self) -> &'static str {
        match &self.0 {
            #[cfg(target_arch = "x86_64")]
            Inner::Affine(_) => "avx512-gfni",
            Inner::Crate(_) => "reed-solomon-simd",
        }
    }
}

impl Engine for ParityEngine {
    fn fft(&self, data: &mut ShardsRefMut, pos: usize, size: usize, truncated_size: usize, skew_delta: usize) {
        match &self.0 {
            #[cfg(target_arch = "x86_64")]
            Inner::Affine(engine) => engine.fft(data, pos, size, truncated_size, skew_delta),
            Inner::Crate(engine) => engine.fft(data, pos, size, truncated_size, skew_delta),
        }
    }

    fn ifft(&self, data: &mut ShardsRefMut, pos: usize, size: usize, truncated_size: usize, skew_delta: usize) {
        match &self.0 {
            #[cfg(target_arch = "x86_64")]
            Inner::Affine(engine) => engine.ifft(data, pos, size, truncated_size, skew_delta),
            Inner::Crate(engine) => engine.ifft(data, pos, size, truncated_size, skew_delta),
        }
    }

    fn mul(&self, x: &mut [[u8; 64]], log_m: GfElement) {
        match &self.0 {
            #[cfg(target_arch = "x86_64")]
            Inner::Affine(engine) => engine.mul(x, log_m),
            Inner::Crate(engine) => engine.mul(x, log_m),
        }
    }

    fn eval_poly(erasures: &mut [GfElement; GF_ORDER], truncated_size: usize) {
        // The error locator's evaluation works on 2¹⁶ field elements, not on shards: the
        // crate's best (AVX2 where present) is used with either engine.
        DefaultEngine::eval_poly(erasures, truncated_size);
    }
}

// SIMD intrinsics, measured necessary (`cargo bench -p ldm7-fmtp-proto --bench parity`;
// docs/parity.md).
/// The formal derivative's passes from position `first` up (see
/// [`ParityEngine::formal_derivative`]).
#[inline(always)]
fn formal_derivative_from(work: &mut [[u8; 64]], chunks: usize, first: usize) {
    let positions = work.len() / chunks;
    for i in first..positions {
        formal_derivative_pass(work, chunks, i);
    }
}

/// The formal derivative's pass at position `i`.
#[inline(always)]
fn formal_derivative_pass(work: &mut [[u8; 64]], chunks: usize, i: usize) {
    let width = 1 << i.trailing_zeros();
    let (low, high) = work.split_at_mut(i * chunks);
    for (x, y) in low[(i - width) * chunks..].iter_mut().zip(&high[..width * chunks]) {
        for (a, b) in x.iter_mut().zip(y) {
            *a ^= b;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod gfni {
    use std::arch::x86_64::{
        __m512i, _mm512_gf2p8affine_epi64_epi8, _mm512_loadu_si512, _mm512_set_epi64, _mm512_shuffle_i64x2,
        _mm512_storeu_si512, _mm512_xor_si512,
    };
    use std::sync::LazyLock;

    use reed_solomon_simd::engine::{GF_MODULUS, GF_ORDER, GfElement, ShardsRefMut, tables};

    /// The four 8×8 bit matrices of multiplying by one constant, as `GF2P8AFFINEQB` takes
    /// them: low bytes to low, high to high, high to low, low to high.
    type Blocks = [u64; 4];

    static MATRICES: LazyLock<Box<[Blocks]>> = LazyLock::new(|| {
        let tables::ExpLog { exp, log } = tables::get_exp_log();
        let (exp, log) = (&**exp, &**log);
        (0..GF_ORDER)
            .map(|log_m| {
                // Column j: the constant (2^log_m, or 0 at GF_MODULUS) times 2^j.
                let column = |j: usize| tables::mul(1 << j, log_m as GfElement, exp, log);
                let columns: [GfElement; 16] = std::array::from_fn(column);
                let block = |out_high: usize, in_high: usize| {
                    // Output bit i's row is the byte at 7 − i; its bit j says whether input
                    // bit j counts.
                    (0..8).fold(0u64, |matrix, i| {
                        let row = (0..8).fold(0u64, |row, j| {
                            row | u64::from((columns[8 * in_high + j] >> (8 * out_high + i)) & 1) << j
                        });
                        matrix | row << (8 * (7 - i))
                    })
                };
                [block(0, 0), block(1, 1), block(0, 1), block(1, 0)]
            })
            .collect()
    });

    /// The engine; constructed only where the CPU has AVX-512 (F, BW) and GFNI.
    #[derive(Clone, Copy)]
    pub(super) struct Affine {
        matrices: &'static [Blocks],
        skew: &'static tables::Skew,
    }

    /// One constant's multiplication, as two vectors of matrices: for a chunk as it is (low
    /// bytes in the lower half) and for the chunk with its halves swapped.
    #[derive(Clone, Copy)]
    struct Factor {
        straight: __m512i,
        crossed: __m512i,
    }

    impl Affine {
        pub(super) fn detect() -> Option<Self> {
            let present = std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("gfni");
            present.then(|| Self { matrices: &MATRICES, skew: tables::get_skew() })
        }

        /// Multiplication by `2^log_m` (by 1 at `GF_MODULUS`, as in the crate).
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,gfni")]
        fn factor(&self, log_m: GfElement) -> Factor {
            let [low, high, high_to_low, low_to_high] = self.matrices[usize::from(log_m)].map(|m| m as i64);
            Factor {
                straight: _mm512_set_epi64(high, high, high, high, low, low, low, low),
                crossed: _mm512_set_epi64(
                    low_to_high,
                    low_to_high,
                    low_to_high,
                    low_to_high,
                    high_to_low,
                    high_to_low,
                    high_to_low,
                    high_to_low,
                ),
            }
        }

        /// The butterfly factor of skew entry `at` (`None`: by zero, the butterfly only adds).
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,gfni")]
        fn skew_factor(&self, at: usize) -> Option<Factor> {
            let log_m = self.skew[at];
            (log_m != GF_MODULUS).then(|| self.factor(log_m))
        }

        /// The factors of two layers' butterflies at skew entry `base`: `m01`, `m02`, `m23`.
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,gfni")]
        fn skew_factors(&self, base: usize, dist: usize) -> [Option<Factor>; 3] {
            [self.skew_factor(base), self.skew_factor(base + dist), self.skew_factor(base + 2 * dist)]
        }

        pub(super) fn mul(&self, x: &mut [[u8; 64]], log_m: GfElement) {
            // SAFETY: `Affine` exists only where the CPU has AVX-512 and GFNI.
            unsafe { mul_chunks(x, self.factor(log_m)) }
        }

        pub(super) fn formal_derivative(&self, work: &mut [[u8; 64]], chunks: usize) {
            // SAFETY: `Affine` exists only where the CPU has AVX-512 and GFNI.
            unsafe { formal_derivative(work, chunks) }
        }

        pub(super) fn mul_from(&self, x: &mut [[u8; 64]], y: &[u8], log_m: GfElement) {
            assert_eq!(x.len() * 64, y.len());
            // SAFETY: `Affine` exists only where the CPU has AVX-512 and GFNI.
            unsafe { mul_chunks_from(x, y, self.factor(log_m)) }
        }

        pub(super) fn fft(
            &self,
            data: &mut ShardsRefMut,
            pos: usize,
            size: usize,
            truncated_size: usize,
            skew_delta: usize,
        ) {
            // SAFETY: `Affine` exists only where the CPU has AVX-512 and GFNI.
            unsafe { self.fft_layers(data, pos, size, truncated_size, skew_delta) }
        }

        pub(super) fn ifft(
            &self,
            data: &mut ShardsRefMut,
            pos: usize,
            size: usize,
            truncated_size: usize,
            skew_delta: usize,
        ) {
            // SAFETY: `Affine` exists only where the CPU has AVX-512 and GFNI.
            unsafe { self.ifft_layers(data, pos, size, truncated_size, skew_delta) }
        }

        #[target_feature(enable = "avx512f,avx512bw,gfni")]
        fn fft_layers(
            &self,
            data: &mut ShardsRefMut,
            pos: usize,
            size: usize,
            truncated_size: usize,
            skew_delta: usize,
        ) {
            // Two layers at a time, from the widest butterflies down (a decimation-in-time FFT).
            let mut span = size;
            let mut dist = size / 4;
            while dist != 0 {
                for r in (0..truncated_size).step_by(span) {
                    let factors = self.skew_factors(r + dist + skew_delta - 1, dist);
                    for i in r..r + dist {
                        let (s0, s1, s2, s3) = data.dist4_mut(pos + i, dist);
                        two_layers::<false>([s0, s1, s2, s3], factors);
                    }
                }
                span = dist;
                dist /= 4;
            }
            // An odd number of layers: the last one alone.
            if span == 2 {
                for r in (0..truncated_size).step_by(2) {
                    let factor = self.skew_factor(r + skew_delta);
                    let (x, y) = data.dist2_mut(pos + r, 1);
                    layer::<false>(x, y, factor);
                }
            }
        }

        #[target_feature(enable = "avx512f,avx512bw,gfni")]
        fn ifft_layers(
            &self,
            data: &mut ShardsRefMut,
            pos: usize,
            size: usize,
            truncated_size: usize,
            skew_delta: usize,
        ) {
            // Two layers at a time, from the narrowest butterflies up.
            let mut dist = 1;
            let mut span = 4;
            while span <= size {
                for r in (0..truncated_size).step_by(span) {
                    let factors = self.skew_factors(r + dist + skew_delta - 1, dist);
                    for i in r..r + dist {
                        let (s0, s1, s2, s3) = data.dist4_mut(pos + i, dist);
                        two_layers::<true>([s0, s1, s2, s3], factors);
                    }
                }
                dist = span;
                span *= 4;
            }
            // An odd number of layers: the last one alone.
            if dist < size {
                let factor = self.skew_factor(dist + skew_delta - 1);
                let (mut low, mut high) = data.split_at_mut(pos + dist);
                for i in 0..dist {
                    layer::<true>(&mut low[pos + i], &mut high[i], factor);
                }
            }
        }
    }

    /// `x · factor` for one chunk.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,gfni")]
    fn times(x: __m512i, factor: Factor) -> __m512i {
        // Lanes 2, 3, 0, 1: the high bytes where the low ones were and the other way round.
        let swapped = _mm512_shuffle_i64x2::<0b01_00_11_10>(x, x);
        _mm512_xor_si512(
            _mm512_gf2p8affine_epi64_epi8::<0>(x, factor.straight),
            _mm512_gf2p8affine_epi64_epi8::<0>(swapped, factor.crossed),
        )
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,gfni")]
    fn load(chunk: &[u8; 64]) -> __m512i {
        // SAFETY: 64 readable bytes; the load is unaligned.
        unsafe { _mm512_loadu_si512(chunk.as_ptr().cast()) }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,gfni")]
    fn store(chunk: &mut [u8; 64], value: __m512i) {
        // SAFETY: 64 writable bytes; the store is unaligned.
        unsafe { _mm512_storeu_si512(chunk.as_mut_ptr().cast(), value) }
    }

    /// A butterfly of the FFT: `x += y · factor; y += x` (by zero: `y += x` only); of the
    /// inverse FFT (`INVERSE`): `y += x; x += y · factor`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,gfni")]
    fn butterfly<const INVERSE: bool>(x: &mut __m512i, y: &mut __m512i, factor: Option<Factor>) {
        if INVERSE {
            *y = _mm512_xor_si512(*y, *x);
        }
        if let Some(factor) = factor {
            *x = _mm512_xor_si512(*x, times(*y, factor));
        }
        if !INVERSE {
            *y = _mm512_xor_si512(*y, *x);
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,gfni")]
    fn mul_chunks(x: &mut [[u8; 64]], factor: Factor) {
        for chunk in x {
            store(chunk, times(load(chunk), factor));
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,gfni")]
    fn mul_chunks_from(x: &mut [[u8; 64]], y: &[u8], factor: Factor) {
        for (chunk, bytes) in x.iter_mut().zip(y.as_chunks::<64>().0) {
            store(chunk, times(load(bytes), factor));
        }
    }

    /// The formal derivative in blocks of 16 positions: the pass at a block's first position
    /// (its width is 16 or more; it reads the next block whole, before that block's own passes),
    /// then the block's 15 other passes, which stay within the block, chunk by chunk in registers.
    #[target_feature(enable = "avx512f,avx512bw,gfni")]
    fn formal_derivative(work: &mut [[u8; 64]], chunks: usize) {
        let positions = work.len() / chunks;
        if positions < 16 {
            return super::formal_derivative_from(work, chunks, 1);
        }
        for base in (0..positions).step_by(16) {
            if base != 0 {
                super::formal_derivative_pass(work, chunks, base);
            }
            let block = &mut work[base * chunks..(base + 16) * chunks];
            for c in 0..chunks {
                let at = |k: usize| k * chunks + c;
                let [mut v0, mut v1, mut v2, mut v3, mut v4, mut v5, mut v6, mut v7] =
                    [0, 1, 2, 3, 4, 5, 6, 7].map(|k| load(&block[at(k)]));
                let [mut v8, mut v9, mut v10, mut v11, mut v12, mut v13, mut v14, v15] =
                    [8, 9, 10, 11, 12, 13, 14, 15].map(|k| load(&block[at(k)]));
                macro_rules! gain {
                    ($($x:ident ^= $y:ident),*) => { $($x = _mm512_xor_si512($x, $y);)* };
                }
                // The passes at 1 to 15, in order (width 1, 2, 1, 4, 1, 2, 1, 8, ...).
                gain!(v0 ^= v1);
                gain!(v0 ^= v2, v1 ^= v3);
                gain!(v2 ^= v3);
                gain!(v0 ^= v4, v1 ^= v5, v2 ^= v6, v3 ^= v7);
                gain!(v4 ^= v5);
                gain!(v4 ^= v6, v5 ^= v7);
                gain!(v6 ^= v7);
                gain!(v0 ^= v8, v1 ^= v9, v2 ^= v10, v3 ^= v11, v4 ^= v12, v5 ^= v13, v6 ^= v14, v7 ^= v15);
                gain!(v8 ^= v9);
                gain!(v8 ^= v10, v9 ^= v11);
                gain!(v10 ^= v11);
                gain!(v8 ^= v12, v9 ^= v13, v10 ^= v14, v11 ^= v15);
                gain!(v12 ^= v13);
                gain!(v12 ^= v14, v13 ^= v15);
                gain!(v14 ^= v15);
                for (k, value) in
                    [v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15].into_iter().enumerate()
                {
                    store(&mut block[at(k)], value);
                }
            }
        }
    }

    /// Two layers over four shards `dist` apart, chunk by chunk in registers. The FFT's: the
    /// pairs (0, 2) and (1, 3) by `m02`, then (0, 1) by `m01` and (2, 3) by `m23`; the inverse's
    /// (`INVERSE`) in the other order.
    #[target_feature(enable = "avx512f,avx512bw,gfni")]
    fn two_layers<const INVERSE: bool>(shards: [&mut [[u8; 64]]; 4], [m01, m02, m23]: [Option<Factor>; 3]) {
        let [s0, s1, s2, s3] = shards;
        for (((c0, c1), c2), c3) in s0.iter_mut().zip(s1.iter_mut()).zip(s2.iter_mut()).zip(s3.iter_mut()) {
            let [mut a, mut b, mut c, mut d] = [load(c0), load(c1), load(c2), load(c3)];
            if INVERSE {
                butterfly::<true>(&mut a, &mut b, m01);
                butterfly::<true>(&mut c, &mut d, m23);
                butterfly::<true>(&mut a, &mut c, m02);
                butterfly::<true>(&mut b, &mut d, m02);
            } else {
                butterfly::<false>(&mut a, &mut c, m02);
                butterfly::<false>(&mut b, &mut d, m02);
                butterfly::<false>(&mut a, &mut b, m01);
                butterfly::<false>(&mut c, &mut d, m23);
            }
            store(c0, a);
            store(c1, b);
            store(c2, c);
            store(c3, d);
        }
    }

    /// One layer's butterflies between two shards (the last of an odd number of layers).
    #[target_feature(enable = "avx512f,avx512bw,gfni")]
    fn layer<const INVERSE: bool>(x: &mut [[u8; 64]], y: &mut [[u8; 64]], factor: Option<Factor>) {
        for (cx, cy) in x.iter_mut().zip(y.iter_mut()) {
            let [mut a, mut b] = [load(cx), load(cy)];
            butterfly::<INVERSE>(&mut a, &mut b, factor);
            store(cx, a);
            store(cy, b);
        }
    }
}

#[cfg(test)]
mod tests {
    use reed_solomon_simd::engine::{Engine, tables};
    use reed_solomon_simd::rate::{DefaultRateDecoder, DefaultRateEncoder, RateDecoder, RateEncoder};

    use super::ParityEngine;

    fn bytes(seed: u64, len: usize) -> Vec<u8> {
        ldm7_types::content::bytes(seed, u32::try_from(len).expect("a test's sizes"))
    }

    #[test]
    fn multiplies_as_the_field_does() {
        let engine = ParityEngine::new();
        let tables::ExpLog { exp, log } = tables::get_exp_log();
        let (exp, log) = (&**exp, &**log);
        let data = bytes(1, 64 * 3);
        for log_m in [0u16, 1, 2, 255, 256, 4097, 40_000, 65_534, 65_535] {
            let mut chunks: Vec<[u8; 64]> = data.chunks(64).map(|c| c.try_into().unwrap()).collect();
            engine.mul(&mut chunks, log_m);
            for (before, after) in data.chunks(64).zip(&chunks) {
                for i in 0..32 {
                    let x = u16::from_le_bytes([before[i], before[32 + i]]);
                    let want = tables::mul(x, log_m, exp, log);
                    assert_eq!(
                        u16::from_le_bytes([after[i], after[32 + i]]),
                        want,
                        "{x} · 2^{log_m} ({})",
                        engine.name()
                    );
                }
            }
        }
    }

    /// Shards coded by either engine are the same bytes, and either decodes the other's, for
    /// the default coding and for codings with odd numbers of FFT layers and short blocks.
    #[test]
    fn codes_the_same_shards_as_the_crate() {
        for (originals, recoveries, shard_bytes, lost) in
            [(992, 32, 1448, 17), (96, 32, 64, 32), (1016, 8, 1448, 8), (64, 2, 130, 1), (500, 12, 1000, 7)]
        {
            let data: Vec<Vec<u8>> = (0..originals).map(|i| bytes(i as u64 + 7, shard_bytes)).collect();
            let encode = |engine| {
                let mut encoder =
                    DefaultRateEncoder::<ParityEngine>::new(originals, recoveries, shard_bytes, engine, None).unwrap();
                for shard in &data {
                    encoder.add_original_shard(shard).unwrap();
                }
                encoder.encode().unwrap().recovery_iter().map(<[u8]>::to_vec).collect::<Vec<_>>()
            };
            let ours = encode(ParityEngine::new());
            let theirs = encode(ParityEngine::portable());
            assert_eq!(ours, theirs, "{originals}/{recoveries} × {shard_bytes}");
            for engine in [ParityEngine::new(), ParityEngine::portable()] {
                let mut decoder =
                    DefaultRateDecoder::<ParityEngine>::new(originals, recoveries, shard_bytes, engine, None).unwrap();
                let gone: Vec<usize> = (0..lost).map(|k| (k * 37 + 3) % originals).collect();
                for (i, shard) in data.iter().enumerate().filter(|(i, _)| !gone.contains(i)) {
                    decoder.add_original_shard(i, shard).unwrap();
                }
                for (i, shard) in theirs.iter().enumerate().take(lost) {
                    decoder.add_recovery_shard(i, shard).unwrap();
                }
                let result = decoder.decode().unwrap();
                let restored: Vec<_> = result.restored_original_iter().collect();
                assert_eq!(restored.len(), gone.len());
                for (i, block) in restored {
                    assert_eq!(block, &data[i][..], "{originals}/{recoveries}: block {i}");
                }
            }
        }
    }
}
