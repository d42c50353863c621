//! Randomized runs (TigerBeetle VOPR style): each seed draws a configuration — receivers,
//! loss models, delays, jitter, TCP rates, stalls, resets, late joins, deadline policy,
//! workload — and the simulator's checkers must hold. A failure names the seed;
//! `LDM7_SEED=n cargo test -p ldm7-sim --test random` replays exactly that run, and
//! `LDM7_SIM_RUNS=n` runs more seeds.

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

#[test]
fn random_configurations_keep_every_invariant() {
    let seeds: Vec<u64> = match std::env::var("LDM7_SEED") {
        Ok(seed) => vec![seed.trim().parse().expect("LDM7_SEED must be an unsigned integer")],
        Err(_) => {
            let runs = std::env::var("LDM7_SIM_RUNS").ok().and_then(|n| n.parse().ok()).unwrap_or(40);
            // A different set each day, reproducible from the printed seed.
            let base =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() / 86_400)
                    * 1_000;
            (base..base + runs).collect()
        }
    };
    for seed in seeds {
        let (config, workload) = random_config(seed);
        let description = format!("{} receivers, {} products", config.receivers.len(), workload.products.len());
        let simulation = Simulation::new(config, workload).expect("valid configuration");
        if let Err(failure) = simulation.run() {
            panic!("{failure}\n({description}; replay: LDM7_SEED={seed} cargo test -p ldm7-sim --test random)");
        }
    }
}
