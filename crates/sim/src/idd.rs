//! The IDD workload model (`shared/data/WORKLOAD.md` §3, parameters in `model_params.json`):
//! a seeded generator of product streams for every feed of the IDD, so that planning and the
//! simulator can run on an hour of the whole IDD rather than on the one NGRID trace.
//!
//! Per feed:
//! - **sizes** from a mixture of two lognormals on ln(bytes), truncated at the feed's largest
//!   product (a draw above it is drawn again), rounded up to whole bytes, at least 1;
//! - **arrivals** from a two-phase hyperexponential renewal process (H2): after each product the
//!   next gap is, with probability `p_burst`, exponential of mean `m1` (within a burst), else
//!   exponential of mean `m2` (between bursts), with `m2` set so that the mean rate is the feed's
//!   rate exactly: `m2 = (mean_gap − p_burst·m1)/(1 − p_burst)`;
//! - **slow modulation** (NGRID and CONDUIT): the rate of each minute is multiplied by
//!   `Z_t = exp(σ·Y_t − σ²/2)` with `Y_t` a unit-variance AR(1) (φ = 0.5), which stretches only
//!   the gaps between bursts (`m2`); `E[Z_t] = 1`, so the hourly count is the rate on average;
//! - **jumbo products**: two per hour in every feed whose largest product exceeds 1 MiB, sized
//!   log-uniformly in [1 MiB, largest], in place of two drawn products (the hourly draw seldom
//!   reaches the tail that large-product paths must be tested with).
//!
//! Rate sets ([`RateSet`]): `idd2018` — the rates of the 13-minute all-feed window of
//! 2018-11-13 (12 feeds, about 426,000 products and 40 GB per hour; the four smallest feeds,
//! 0.1% of the products, have no size measurements and are left out); `paper` — the six feeds
//! at the per-feed rates the LDM7 papers quote (about 79,000 products and 6.4 GB per hour).
//! NOTHER and DIFAX have only a median and a mean in the measurements: their sizes are single
//! lognormals fitted to those (truncated at the largest product, like the others) and their arrivals H2
//! with `p_burst = 0.9` and `m1` fitted to the median gap (docs/workload.md).
//!
//! Every feed draws from its own random stream (the run seed and the feed's bits), so a feed's
//! products do not change when other feeds are added or left out.

use std::time::Duration;

use ldm7_types::FeedType;
use rand::distr::Distribution;
use rand_distr::{Exp1, StandardNormal};

use crate::rng::SimRng;
use crate::workload::{ProductSpec, Workload};

/// A mixture of two lognormals on ln(bytes), truncated at `max_bytes`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SizeModel {
    /// Weight of the first component (1 for a single lognormal).
    pub w1: f64,
    /// Mean of ln(bytes), first component.
    pub mu1: f64,
    /// Standard deviation of ln(bytes), first component.
    pub sigma1: f64,
    /// Mean of ln(bytes), second component.
    pub mu2: f64,
    /// Standard deviation of ln(bytes), second component.
    pub sigma2: f64,
    /// The largest product.
    pub max_bytes: u32,
}

impl SizeModel {
    /// One size.
    pub fn draw(&self, rng: &mut SimRng) -> u32 {
        let max = f64::from(self.max_bytes);
        loop {
            let (mu, sigma) = if rng.unit() < self.w1 { (self.mu1, self.sigma1) } else { (self.mu2, self.sigma2) };
            let normal: f64 = StandardNormal.sample(rng);
            let bytes = (mu + sigma * normal).exp().ceil();
            if bytes <= max {
                // 1 ≤ bytes ≤ max_bytes ≤ u32::MAX.
                return bytes.max(1.0) as u32;
            }
        }
    }

    /// Of the mixture below `max_bytes` (what [`SizeModel::draw`] draws from): the share of
    /// each component kept, `P(ln X ≤ ln max)`.
    fn kept(&self) -> (f64, f64) {
        let top = f64::from(self.max_bytes).ln();
        (self.w1 * phi((top - self.mu1) / self.sigma1), (1.0 - self.w1) * phi((top - self.mu2) / self.sigma2))
    }

    /// The median of the sizes drawn (the truncated mixture; bisection on its distribution
    /// function).
    pub fn median(&self) -> f64 {
        let (kept1, kept2) = self.kept();
        let cdf = |x: f64| {
            self.w1 * phi((x.ln() - self.mu1) / self.sigma1) + (1.0 - self.w1) * phi((x.ln() - self.mu2) / self.sigma2)
        };
        let half = (kept1 + kept2) / 2.0;
        let (mut low, mut high) = (1.0f64, f64::from(self.max_bytes).max(2.0));
        for _ in 0..200 {
            let middle = (low * high).sqrt();
            if cdf(middle) < half {
                low = middle;
            } else {
                high = middle;
            }
        }
        (low * high).sqrt()
    }

    /// The mean of the sizes drawn (the truncated mixture: `E[X; X ≤ max] / P(X ≤ max)`).
    pub fn mean(&self) -> f64 {
        let top = f64::from(self.max_bytes).ln();
        let part = |mu: f64, sigma: f64| (mu + sigma * sigma / 2.0).exp() * phi((top - mu - sigma * sigma) / sigma);
        let (kept1, kept2) = self.kept();
        (self.w1 * part(self.mu1, self.sigma1) + (1.0 - self.w1) * part(self.mu2, self.sigma2)) / (kept1 + kept2)
    }
}

/// The standard normal distribution function.
fn phi(z: f64) -> f64 {
    0.5 * erfc(-z / std::f64::consts::SQRT_2)
}

/// The complementary error function (Numerical Recipes' Chebyshev fit, |error| < 1.2e-7).
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98 + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let value = t * poly.exp();
    if x >= 0.0 { value } else { 2.0 - value }
}

/// The burst process of a feed's arrivals (H2); the rate sets the mean gap.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BurstModel {
    /// Probability that the next gap is within a burst.
    pub p_burst: f64,
    /// Mean gap within a burst, seconds.
    pub m1_s: f64,
}

impl BurstModel {
    /// The mean gap between bursts that gives a mean gap of `mean_gap_s` (at least `m1`: a rate
    /// too high for the burst spacing becomes back-to-back bursts).
    pub fn m2_s(&self, mean_gap_s: f64) -> f64 {
        ((mean_gap_s - self.p_burst * self.m1_s) / (1.0 - self.p_burst)).max(self.m1_s)
    }
}

/// One feed of the model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FeedModel {
    /// The name it is known by (and written in traces as).
    pub name: &'static str,
    /// Its feedtype.
    pub feed: FeedType,
    /// Product sizes.
    pub sizes: SizeModel,
    /// Arrivals.
    pub bursts: BurstModel,
    /// σ of the per-minute rate modulation (0: none).
    pub modulation_sigma: f64,
}

impl FeedModel {
    /// Whether the feed gets jumbo products (its largest product exceeds 1 MiB).
    pub fn has_jumbo_tail(&self) -> bool {
        self.sizes.max_bytes > JUMBO_MIN
    }
}

/// Jumbo products are at least this large.
pub const JUMBO_MIN: u32 = 1 << 20;

/// Jumbo products per hour per feed with a large tail.
pub const JUMBO_PER_HOUR: f64 = 2.0;

const fn single(mu: f64, sigma: f64, max_bytes: u32) -> SizeModel {
    SizeModel { w1: 1.0, mu1: mu, sigma1: sigma, mu2: mu, sigma2: sigma, max_bytes }
}

/// The feeds of the model (WORKLOAD.md §3.1–§3.2, model_params.json; NOTHER and DIFAX fitted
/// here, see the module documentation).
pub const FEEDS: [FeedModel; 8] = [
    FeedModel {
        name: "CONDUIT",
        feed: FeedType::CONDUIT,
        sizes: single(10.928, 1.528, 1_389_773),
        bursts: BurstModel { p_burst: 0.89931, m1_s: 0.000_745_4 },
        modulation_sigma: 0.8,
    },
    FeedModel {
        name: "NGRID",
        feed: FeedType::NGRID,
        sizes: SizeModel {
            w1: 0.6974,
            mu1: 9.9109,
            sigma1: 0.6713,
            mu2: 12.6536,
            sigma2: 0.9215,
            max_bytes: 16_357_785,
        },
        bursts: BurstModel { p_burst: 0.727, m1_s: 0.003_628_9 },
        modulation_sigma: 0.8,
    },
    FeedModel {
        name: "HDS",
        feed: FeedType::HDS,
        sizes: SizeModel {
            w1: 0.5095,
            mu1: 8.2009,
            sigma1: 0.5342,
            mu2: 10.4854,
            sigma2: 0.983,
            max_bytes: 18_664_652,
        },
        bursts: BurstModel { p_burst: 0.89493, m1_s: 0.004_104_6 },
        modulation_sigma: 0.0,
    },
    FeedModel {
        name: "NEXRAD2",
        feed: FeedType::NEXRAD2,
        sizes: SizeModel { w1: 0.5167, mu1: 9.8851, sigma1: 0.6008, mu2: 11.1614, sigma2: 0.5507, max_bytes: 796_979 },
        bursts: BurstModel { p_burst: 0.98, m1_s: 0.042_864_2 },
        modulation_sigma: 0.0,
    },
    FeedModel {
        name: "NEXRAD3",
        feed: FeedType::NEXRAD3,
        sizes: SizeModel { w1: 0.0992, mu1: 8.6083, sigma1: 0.2043, mu2: 8.7414, sigma2: 1.3704, max_bytes: 155_852 },
        bursts: BurstModel { p_burst: 0.89931, m1_s: 0.002_192_5 },
        modulation_sigma: 0.0,
    },
    FeedModel {
        name: "IDS|DDPLUS",
        feed: FeedType(FeedType::IDS.0 | FeedType::DDPLUS.0),
        sizes: SizeModel { w1: 0.8181, mu1: 5.2236, sigma1: 0.4269, mu2: 7.3578, sigma2: 1.7868, max_bytes: 220_262 },
        bursts: BurstModel { p_burst: 0.89965, m1_s: 0.000_143 },
        modulation_sigma: 0.0,
    },
    FeedModel {
        name: "NOTHER",
        feed: FeedType::NOTHER,
        // Median 295.9 KiB, mean 625.8 KiB, largest 25.5 MiB (the 2018 window).
        sizes: single(12.6217, 1.2302, 26_738_688),
        // Median gap 222 ms at 5,764 per hour.
        bursts: BurstModel { p_burst: 0.9, m1_s: 0.278_679 },
        modulation_sigma: 0.0,
    },
    FeedModel {
        name: "DIFAX",
        feed: FeedType::SATELLITE,
        // Median 362.2 KiB, mean 2.29 MiB, largest 380 MiB (the 2018 window).
        sizes: single(12.8241, 1.9616, 398_458_880),
        // Median gap 212 ms at 3,343 per hour.
        bursts: BurstModel { p_burst: 0.9, m1_s: 0.263_447 },
        modulation_sigma: 0.0,
    },
];

/// The model of a feed by name (`NGRID`, `IDS|DDPLUS`, `DIFAX`, … case-insensitive).
pub fn feed_model(name: &str) -> Option<&'static FeedModel> {
    FEEDS.iter().find(|model| model.name.eq_ignore_ascii_case(name))
}

/// Which rates the feeds run at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RateSet {
    /// The 2018-11-13 all-feed window: eight feeds, about 426,000 products per hour.
    #[default]
    Idd2018,
    /// The six feeds at the LDM7 papers' per-feed rates, about 79,000 products per hour.
    Paper,
}

impl RateSet {
    /// Products per hour of each feed in the set.
    pub fn rates(self) -> &'static [(&'static str, f64)] {
        match self {
            Self::Idd2018 => &[
                ("CONDUIT", 109_688.0),
                ("NEXRAD3", 100_430.0),
                ("NEXRAD2", 79_359.0),
                ("NGRID", 51_685.0),
                ("IDS|DDPLUS", 45_136.0),
                ("HDS", 30_834.0),
                ("NOTHER", 5_764.0),
                ("DIFAX", 3_343.0),
            ],
            Self::Paper => &[
                ("CONDUIT", 23_610.0),
                ("NGRID", 15_409.0),
                ("HDS", 8_661.0),
                ("NEXRAD2", 10_498.0),
                ("NEXRAD3", 13_591.0),
                ("IDS|DDPLUS", 7_334.0),
            ],
        }
    }

    /// The set's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Idd2018 => "idd2018",
            Self::Paper => "paper",
        }
    }
}

impl std::str::FromStr for RateSet {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.to_ascii_lowercase().as_str() {
            "idd2018" | "idd" => Ok(Self::Idd2018),
            "paper" => Ok(Self::Paper),
            _ => Err(format!("unknown rate set {text:?} (expected idd2018 or paper)")),
        }
    }
}

/// What to generate.
#[derive(Clone, Debug, PartialEq)]
pub struct IddConfig {
    /// The run seed.
    pub seed: u64,
    /// How long a stretch of time.
    pub duration: Duration,
    /// The feeds and their rates (products per hour).
    pub feeds: Vec<(&'static FeedModel, f64)>,
    /// Every rate multiplied by this (a model-run peak hour is about 1.6).
    pub scale: f64,
    /// Whether the feeds that have one get their slow modulation.
    pub modulation: bool,
    /// Whether the feeds with a large tail get jumbo products.
    pub jumbo: bool,
}

impl IddConfig {
    /// One hour of a rate set, with modulation and jumbo products.
    pub fn hour(seed: u64, set: RateSet) -> Self {
        let feeds = set
            .rates()
            .iter()
            .map(|&(name, rate)| (feed_model(name).expect("every rate set names a modelled feed"), rate))
            .collect();
        Self { seed, duration: Duration::from_secs(3600), feeds, scale: 1.0, modulation: true, jumbo: true }
    }

    /// Keeps only the feeds whose names are given (case-insensitive); an unknown name is an
    /// error naming the feeds of the set.
    pub fn only(mut self, names: &[String]) -> Result<Self, String> {
        if names.is_empty() {
            return Ok(self);
        }
        for name in names {
            if !self.feeds.iter().any(|(model, _)| model.name.eq_ignore_ascii_case(name)) {
                let known: Vec<&str> = self.feeds.iter().map(|(model, _)| model.name).collect();
                return Err(format!("feed {name:?} is not in the set (its feeds: {})", known.join(", ")));
            }
        }
        self.feeds.retain(|(model, _)| names.iter().any(|name| model.name.eq_ignore_ascii_case(name)));
        Ok(self)
    }
}

/// One generated product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IddProduct {
    /// Its creation time, from the start.
    pub at: Duration,
    /// Index of its feed in [`IddConfig::feeds`].
    pub feed: u8,
    /// Its size in bytes.
    pub size: u32,
}

/// A generated stretch of the IDD: every feed's products, merged in time order (each feed's
/// products keep their order).
#[derive(Clone, Debug, PartialEq)]
pub struct IddTrace {
    /// The feeds, as configured.
    pub feeds: Vec<(&'static FeedModel, f64)>,
    /// The products.
    pub products: Vec<IddProduct>,
}

impl IddTrace {
    /// Generates (deterministic in the configuration).
    pub fn generate(config: &IddConfig) -> Self {
        assert!(config.feeds.len() <= usize::from(u8::MAX), "at most 255 feeds");
        let mut products = Vec::new();
        for (index, (model, rate)) in config.feeds.iter().enumerate() {
            // index < 256 (asserted above).
            products.extend(
                generate_feed(config, model, *rate * config.scale).into_iter().map(|(at, size)| IddProduct {
                    at,
                    feed: index as u8,
                    size,
                }),
            );
        }
        // Stable: equal times keep the feed order, and each feed its own order.
        products.sort_by_key(|product| product.at);
        Self { feeds: config.feeds.clone(), products }
    }

    /// One feed's products as a simulator workload.
    pub fn workload(&self, feed: usize) -> Workload {
        let products = self
            .products
            .iter()
            .filter(|product| usize::from(product.feed) == feed)
            .map(|product| ProductSpec { at: product.at, size: product.size })
            .collect();
        Workload { products }
    }

    /// Every product as one workload (all feeds on one stream).
    pub fn merged(&self) -> Workload {
        Workload { products: self.products.iter().map(|p| ProductSpec { at: p.at, size: p.size }).collect() }
    }

    /// Total bytes.
    pub fn total_bytes(&self) -> u64 {
        self.products.iter().map(|product| u64::from(product.size)).sum()
    }
}

/// One feed's `(creation time, size)` pairs in order.
fn generate_feed(config: &IddConfig, model: &FeedModel, per_hour: f64) -> Vec<(Duration, u32)> {
    let mut rng = SimRng::new(config.seed, 0x1dd0_0000_0000 | u64::from(model.feed.0));
    let end = config.duration.as_secs_f64();
    if per_hour <= 0.0 || end <= 0.0 {
        return Vec::new();
    }
    let mean_gap = 3600.0 / per_hour;
    let sigma = if config.modulation { model.modulation_sigma } else { 0.0 };
    let minutes = (end / 60.0).ceil() as usize + 1;
    let factors = modulation(&mut rng, sigma, minutes);
    let mut products = Vec::with_capacity((per_hour * end / 3600.0 * 1.1) as usize + 16);
    let mut t = 0.0f64;
    loop {
        let factor = factors[((t / 60.0) as usize).min(minutes - 1)];
        let exp: f64 = Exp1.sample(&mut rng);
        let gap =
            if rng.unit() < model.bursts.p_burst { model.bursts.m1_s } else { model.bursts.m2_s(mean_gap / factor) };
        t += gap * exp;
        if t >= end {
            break;
        }
        products.push((Duration::from_secs_f64(t), model.sizes.draw(&mut rng)));
    }
    if config.jumbo && model.has_jumbo_tail() && !products.is_empty() {
        let count = (JUMBO_PER_HOUR * end / 3600.0).round() as usize;
        let (low, high) = (f64::from(JUMBO_MIN).ln(), f64::from(model.sizes.max_bytes).ln());
        let mut chosen: Vec<usize> = Vec::new();
        while chosen.len() < count.min(products.len()) {
            // below(n) < n = products.len().
            let index = rng.below(products.len() as u64) as usize;
            if !chosen.contains(&index) {
                chosen.push(index);
                // Within [1 MiB, max_bytes] ⊂ u32.
                products[index].1 = (low + (high - low) * rng.unit()).exp().round() as u32;
            }
        }
    }
    products
}

/// Per-minute rate factors `exp(σ·Y_t − σ²/2)`, `Y` a unit-variance AR(1) with φ = 0.5 (all 1
/// when σ = 0).
fn modulation(rng: &mut SimRng, sigma: f64, minutes: usize) -> Vec<f64> {
    if sigma <= 0.0 {
        return vec![1.0; minutes];
    }
    const PHI: f64 = 0.5;
    let innovation = (1.0 - PHI * PHI).sqrt();
    let mut y: f64 = StandardNormal.sample(rng);
    let mut factors = Vec::with_capacity(minutes);
    for _ in 0..minutes {
        factors.push((sigma * y - sigma * sigma / 2.0).exp());
        let normal: f64 = StandardNormal.sample(rng);
        y = PHI * y + innovation * normal;
    }
    factors
}

#[cfg(test)]
mod tests {
    use super::*;

    fn median(values: &mut [f64]) -> f64 {
        ldm7_types::quantile::median(values.iter().copied())
    }

    #[test]
    fn the_model_moments_are_those_of_the_workload_tables() {
        // WORKLOAD.md §3.1: model median / mean.
        for (name, median, mean) in [
            ("CONDUIT", 54_100.0, 130_400.0),
            ("NGRID", 29_500.0, 162_300.0),
            ("HDS", 7_800.0, 30_600.0),
            ("NEXRAD2", 37_000.0, 51_700.0),
            ("NEXRAD3", 5_860.0, 12_700.0),
            ("IDS|DDPLUS", 203.0, 1_345.0),
            // Fitted here: 295.9 KiB / 625.8 KiB and 362.2 KiB / 2.29 MiB.
            ("NOTHER", 303_000.0, 640_800.0),
            ("DIFAX", 370_900.0, 2_401_000.0),
        ] {
            let model = feed_model(name).unwrap();
            let (m, a) = (model.sizes.median(), model.sizes.mean());
            assert!((m / median - 1.0).abs() < 0.01, "{name} median {m}");
            assert!((a / mean - 1.0).abs() < 0.01, "{name} mean {a}");
        }
        assert!((erfc(0.0) - 1.0).abs() < 1e-7 && (erfc(1.0) - 0.157_299_207).abs() < 1e-6);
        assert!((erfc(-1.0) - 1.842_700_793).abs() < 1e-6);
    }

    #[test]
    fn a_generated_feed_has_the_model_sizes_gaps_and_rate() {
        // NEXRAD3 at its paper rate, no modulation: WORKLOAD.md §3.2 model gaps p25/p50/p75
        // 0.71 / 1.78 / 3.94 ms and §3.1 median 5.86 kB.
        let mut config = IddConfig::hour(11, RateSet::Paper).only(&["nexrad3".into()]).unwrap();
        config.duration = Duration::from_secs(4 * 3600);
        let trace = IddTrace::generate(&config);
        let count = trace.products.len() as f64;
        assert!((count / (4.0 * 13_591.0) - 1.0).abs() < 0.05, "{count}");
        let mut sizes: Vec<f64> = trace.products.iter().map(|p| f64::from(p.size)).collect();
        let size_median = median(&mut sizes);
        assert!((size_median / 5_860.0 - 1.0).abs() < 0.05, "{size_median}");
        assert!(sizes.iter().all(|&size| (1.0..=155_852.0).contains(&size)));
        let mut gaps: Vec<f64> =
            trace.products.windows(2).map(|pair| (pair[1].at - pair[0].at).as_secs_f64() * 1e3).collect();
        let gap_median = median(&mut gaps);
        assert!((gap_median / 1.78 - 1.0).abs() < 0.08, "{gap_median}");
    }

    #[test]
    fn an_idd_hour_has_the_measured_count_and_volume_and_is_reproducible() {
        let config = IddConfig::hour(7, RateSet::Idd2018);
        let trace = IddTrace::generate(&config);
        let count = trace.products.len() as f64;
        let gigabytes = trace.total_bytes() as f64 / 1e9;
        // 426,239 per hour on average; modulation makes NGRID's and CONDUIT's hours vary.
        assert!((count / 426_239.0 - 1.0).abs() < 0.25, "{count}");
        assert!((25.0..60.0).contains(&gigabytes), "{gigabytes}");
        assert!(trace.products.windows(2).all(|pair| pair[0].at <= pair[1].at));
        assert!(trace.products.iter().all(|p| p.at < Duration::from_secs(3600)));
        // Jumbo products: two in each feed with a tail over 1 MiB.
        for (index, (model, _)) in trace.feeds.iter().enumerate() {
            let jumbo = trace.products.iter().filter(|p| usize::from(p.feed) == index && p.size > JUMBO_MIN).count();
            if model.has_jumbo_tail() {
                assert!(jumbo >= 2, "{}: {jumbo}", model.name);
            } else {
                assert_eq!(jumbo, 0, "{}", model.name);
            }
        }
        assert_eq!(trace, IddTrace::generate(&config));
        assert_ne!(trace.products, IddTrace::generate(&IddConfig::hour(8, RateSet::Idd2018)).products);
        // A feed's products do not depend on the others.
        let alone = IddTrace::generate(&config.clone().only(&["HDS".into()]).unwrap());
        let hds = trace.feeds.iter().position(|(model, _)| model.name == "HDS").unwrap();
        assert_eq!(alone.workload(0), trace.workload(hds));
    }

    #[test]
    fn modulation_keeps_the_mean_rate_and_adds_minute_to_minute_variation() {
        let mut config = IddConfig::hour(3, RateSet::Paper).only(&["NGRID".into()]).unwrap();
        config.duration = Duration::from_secs(20 * 3600);
        let counts = |trace: &IddTrace| {
            let mut minutes = vec![0.0f64; 20 * 60];
            for product in &trace.products {
                minutes[(product.at.as_secs() / 60) as usize] += 1.0;
            }
            let mean = minutes.iter().sum::<f64>() / minutes.len() as f64;
            let variance = minutes.iter().map(|c| (c - mean).powi(2)).sum::<f64>() / minutes.len() as f64;
            (mean, variance.sqrt() / mean)
        };
        let (mean, cv) = counts(&IddTrace::generate(&config));
        config.modulation = false;
        let (flat_mean, flat_cv) = counts(&IddTrace::generate(&config));
        let expected = 15_409.0 / 60.0;
        assert!((mean / expected - 1.0).abs() < 0.1, "{mean}");
        assert!((flat_mean / expected - 1.0).abs() < 0.03, "{flat_mean}");
        // WORKLOAD.md §2: measured per-minute CV 0.6–1.0.
        assert!(cv > 0.5 && cv > 2.0 * flat_cv, "{cv} vs {flat_cv}");
    }

    #[test]
    fn feeds_and_sets_by_name() {
        assert_eq!("paper".parse::<RateSet>(), Ok(RateSet::Paper));
        assert!("nope".parse::<RateSet>().unwrap_err().contains("idd2018"));
        let error = IddConfig::hour(1, RateSet::Paper).only(&["DIFAX".into()]).unwrap_err();
        assert!(error.contains("NGRID"), "{error}");
        assert_eq!(feed_model("ids|ddplus").unwrap().feed, "IDS|DDPLUS".parse().unwrap());
        assert_eq!(feed_model("DIFAX").unwrap().feed, "DIFAX".parse().unwrap());
        let total: f64 = RateSet::Idd2018.rates().iter().map(|(_, rate)| rate).sum();
        assert_eq!(total, 426_239.0);
    }
}
