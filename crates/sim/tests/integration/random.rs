//! Randomized runs (TigerBeetle VOPR style): each seed draws a configuration — receivers,
//! loss models, delays, jitter, TCP rates, stalls, resets, late joins, deadline policy,
//! workload — and the simulator's checkers must hold.
//!
//! The default run uses the fixed seeds [`FIXED_SEEDS`] and [`REGRESSION_SEEDS`]: the same
//! configurations every run, so a red CI means a change broke something, never that the day's
//! seeds were unlucky. Fresh seeds are explored outside the test suite by `scripts/explore`,
//! which sets `LDM7_SEED_FROM=a LDM7_SIM_RUNS=n` (seeds a, a+1, … a+n−1). A failure names its
//! seed; `LDM7_SEED=n cargo test -p ldm7-sim --test integration -- random::` replays exactly that run. A seed
//! that found a bug joins [`REGRESSION_SEEDS`] with the fix.

use std::time::Duration;

use ldm7_fmtp_proto::{DeadlinePolicy, Instant, SenderConfig};
use ldm7_sim::rng::SimRng;
use ldm7_sim::{ContentMode, LossModel, ReceiverSpec, Reset, SimConfig, Simulation, Stall, Workload};

fn ms(rng: &mut SimRng, low: u64, high: u64) -> Duration {
    Duration::from_millis(low + rng.below(high - low + 1))
}

fn random_config(seed: u64) -> (SimConfig, Workload) {
    let mut rng = SimRng::new(seed, 0x5eed);
    let receivers = 1 + rng.below(6) as usize;
    let specs = (0..receivers)
        .map(|_| {
            let mut spec = ReceiverSpec::with_rtt(ms(&mut rng, 1, 120));
            spec.loss = match rng.below(4) {
                0 => LossModel::None,
                1 => LossModel::Bernoulli(rng.unit() * 0.02),
                2 => LossModel::Bernoulli(rng.unit() * 0.25),
                _ => LossModel::bursts(rng.unit() * 0.15, 1.0 + rng.unit() * 20.0),
            };
            if rng.below(2) == 0 {
                spec.jitter = ms(&mut rng, 0, 10);
            }
            if rng.below(4) == 0 {
                let rate = 1_000_000 + rng.below(50_000_000);
                spec = spec.tcp_rate(rate, 16_384 + rng.below(1 << 20));
            }
            if rng.below(4) == 0 {
                let start = Instant::ZERO + ms(&mut rng, 0, 2_000);
                spec = spec.stall(Stall { start, duration: ms(&mut rng, 10, 3_000) });
            }
            if rng.below(5) == 0 {
                let at = Instant::ZERO + ms(&mut rng, 0, 2_000);
                spec = spec.reset(Reset { at, reconnect_after: ms(&mut rng, 1, 500) });
            }
            if rng.below(5) == 0 {
                spec = spec.join_at(Instant::ZERO + ms(&mut rng, 0, 1_500));
            }
            spec
        })
        .collect();
    let mut config = SimConfig::new(seed, specs);
    config.sender = SenderConfig::with_rate(5_000_000 + rng.below(200_000_000));
    config.sender.deadline = match rng.below(3) {
        0 => DeadlinePolicy::Constant(ms(&mut rng, 20, 5_000)),
        1 => DeadlinePolicy::Proportional { f_snd: 1.0 + rng.unit() * 20.0, min: ms(&mut rng, 0, 200) },
        _ => DeadlinePolicy::default(),
    };
    config.content = if rng.below(2) == 0 { ContentMode::Memory } else { ContentMode::Pattern };
    let count = 10 + rng.below(150) as usize;
    let size_max = [1_448, 100_000, 2_000_000][rng.below(3) as usize];
    let workload = Workload::generated(seed, count, 0, size_max, ms(&mut rng, 1, 50));
    (config, workload)
}

/// The seeds of every default run.
const FIXED_SEEDS: std::ops::Range<u64> = 1..41;

/// Seeds that once found a bug, kept with its fix (none yet).
const REGRESSION_SEEDS: &[u64] = &[];

#[test]
fn random_configurations_keep_every_invariant() {
    let seeds = seeds();
    let fixed = seeds == FIXED_SEEDS.chain(REGRESSION_SEEDS.iter().copied()).collect::<Vec<_>>();
    let (mut failures, mut taking_whole) = (Vec::new(), 0);
    for seed in seeds {
        match run_seed(seed) {
            Ok(whole) => taking_whole += usize::from(whole > 0),
            Err(failure) => failures.push(failure),
        }
    }
    assert!(failures.is_empty(), "{} seed(s) failed:\n{}", failures.len(), failures.join("\n"));
    // The fixed seeds keep exercising products taken whole (18 of the 40 take some).
    assert!(!fixed || taking_whole >= 10, "only {taking_whole} runs took products whole");
}

/// `LDM7_SEED` alone; else `LDM7_SIM_RUNS` seeds from `LDM7_SEED_FROM`; else the fixed seeds.
fn seeds() -> Vec<u64> {
    let number = |name: &str| {
        std::env::var(name).ok().map(|text| {
            text.trim().parse::<u64>().unwrap_or_else(|_| panic!("{name}={text:?} is not an unsigned integer"))
        })
    };
    if let Some(seed) = number("LDM7_SEED") {
        return vec![seed];
    }
    match (number("LDM7_SEED_FROM"), number("LDM7_SIM_RUNS")) {
        (Some(first), runs) => (first..first.saturating_add(runs.unwrap_or(40))).collect(),
        (None, Some(runs)) => (FIXED_SEEDS.start..FIXED_SEEDS.start + runs).collect(),
        (None, None) => FIXED_SEEDS.chain(REGRESSION_SEEDS.iter().copied()).collect(),
    }
}

/// Runs one seed: the deliveries taken whole, or a failure (a checker's verdict, or a panic) as
/// a line that names the seed and how to replay it.
fn run_seed(seed: u64) -> Result<u64, String> {
    let (config, workload) = random_config(seed);
    let description = format!("{} receivers, {} products", config.receivers.len(), workload.products.len());
    let outcome = std::panic::catch_unwind(move || {
        Simulation::new(config, workload)
            .expect("valid configuration")
            .run()
            .map(|report| report.whole_products)
            .map_err(|failure| failure.to_string())
    });
    let failure = match outcome {
        Ok(Ok(whole)) => return Ok(whole),
        Ok(Err(failure)) => failure,
        Err(panic) => {
            let message =
                panic.downcast_ref::<String>().map(String::as_str).or_else(|| panic.downcast_ref::<&str>().copied());
            format!("seed {seed} panicked: {}", message.unwrap_or("(no message)"))
        }
    };
    Err(format!(
        "{failure} ({description}); replay: LDM7_SEED={seed} cargo test -p ldm7-sim --test integration -- random::"
    ))
}
