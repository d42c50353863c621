//! The simulator's randomness: xoshiro256++ seeded through SplitMix64, written out here so that
//! a seed replays the same run whatever the `rand` version (rand's `SmallRng` is documented as
//! not portable across versions). It implements [`rand::RngCore`], so `rand`'s distributions
//! work on it too.
//!
//! Every independent source of randomness (each receiver's loss process, the path jitter, …)
//! gets its own stream, derived from the run seed and a stream number: the loss pattern a
//! receiver sees does not depend on what the other receivers do, so a scenario can be compared
//! with and without one receiver under identical losses for the others.

/// A seeded pseudo-random stream (xoshiro256++).
#[derive(Clone, Debug)]
pub struct SimRng {
    state: [u64; 4],
}

impl SimRng {
    /// The stream `stream` of the run seeded with `seed`.
    pub fn new(seed: u64, stream: u64) -> Self {
        let mut mixer = seed ^ mix64(stream.wrapping_add(0x6a09_e667_f3bc_c909));
        let mut next = || {
            mixer = mixer.wrapping_add(0x9e37_79b9_7f4a_7c15);
            mix64(mixer)
        };
        let state = [next(), next(), next(), next()];
        Self { state }
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let [s0, s1, s2, s3] = &mut self.state;
        let result = s0.wrapping_add(*s3).rotate_left(23).wrapping_add(*s0);
        let t = *s1 << 17;
        *s2 ^= *s0;
        *s3 ^= *s1;
        *s1 ^= *s2;
        *s0 ^= *s3;
        *s2 ^= t;
        *s3 = s3.rotate_left(45);
        result
    }

    /// A uniform number in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform number in `[0, bound)` (`bound > 0`; Lemire's multiply-shift, bias < 2⁻³²
    /// for the small bounds used here).
    pub fn below(&mut self, bound: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }

    /// True with probability `threshold / 2⁶⁴` (see [`Chance`]).
    #[inline]
    pub fn hit(&mut self, chance: Chance) -> bool {
        self.next_u64() < chance.0
    }
}

impl rand::RngCore for SimRng {
    fn next_u32(&mut self) -> u32 {
        (SimRng::next_u64(self) >> 32) as u32
    }

    fn next_u64(&mut self) -> u64 {
        SimRng::next_u64(self)
    }

    fn fill_bytes(&mut self, dst: &mut [u8]) {
        for chunk in dst.chunks_mut(8) {
            let bytes = SimRng::next_u64(self).to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
    }
}

/// A probability precomputed as a 64-bit threshold, so that a draw is one compare.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Chance(u64);

impl Chance {
    /// Never.
    pub const NEVER: Self = Self(0);

    /// A probability in `[0, 1]` (clamped; 1 is "almost always": 1 − 2⁻⁶⁴).
    pub fn new(probability: f64) -> Self {
        if probability.is_nan() || probability <= 0.0 {
            return Self::NEVER;
        }
        if probability >= 1.0 {
            return Self(u64::MAX);
        }
        // probability < 1, so the product is < 2⁶⁴.
        Self((probability * 18_446_744_073_709_551_616.0) as u64)
    }

    /// Whether it can ever happen.
    pub fn is_never(self) -> bool {
        self.0 == 0
    }

    /// The probability it stands for.
    pub fn probability(self) -> f64 {
        self.0 as f64 / 18_446_744_073_709_551_616.0
    }
}

pub use ldm7_types::content::mix64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let mut a = SimRng::new(7, 1);
        let mut b = SimRng::new(7, 1);
        let mut c = SimRng::new(7, 2);
        let a: Vec<u64> = (0..4).map(|_| a.next_u64()).collect();
        let b: Vec<u64> = (0..4).map(|_| b.next_u64()).collect();
        let c: Vec<u64> = (0..4).map(|_| c.next_u64()).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn chance_matches_its_probability() {
        let mut rng = SimRng::new(1, 0);
        let chance = Chance::new(0.1);
        let hits = (0..100_000).filter(|_| rng.hit(chance)).count();
        assert!((9_500..10_500).contains(&hits), "{hits}");
        assert!(!SimRng::new(1, 0).hit(Chance::NEVER));
        assert!(Chance::new(-1.0).is_never());
        let unit = rng.unit();
        assert!((0.0..1.0).contains(&unit));
        assert!(rng.below(10) < 10);
    }
}
