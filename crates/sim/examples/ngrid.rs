//! Simulator speed benchmark: an LDM trace (default: the 1-hour NGRID trace) multicast to N
//! simulated receivers with Bernoulli loss and a round-trip time, every product accounted for.
//!
//! ```text
//! cargo run --release -p ldm7-sim --example ngrid -- [--receivers 100] [--loss 0.01] [--rtt-ms 30]
//!     [--rate 40M] [--retx-rate R] [--trace PATH] [--seed N] [--memory]
//!     [--parity auto|off|GROUP/SHARDS] [--backstop RATE]
//! ```
//!
//! With `--backstop`, every receiver runs the LDM-7 subscriber's decisions and fetches what
//! FMTP missed over unicast at RATE each (`ldm7_sim::Backstop`): the report then says how many
//! products the backstop brought and how many are missed for good (0 when delivery is whole).
//!
//! Prints the run's report, the wall time and the virtual/wall speed-up. Exits non-zero if a
//! checker fails (the seed is printed; `LDM7_SEED=n` or `--seed n` replays it).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[path = "support/parity_args.rs"]
mod parity_args;

use clap::Parser;
use ldm7_fmtp_proto::SenderConfig;
use ldm7_sim::{ContentMode, LossModel, ReceiverSpec, SimConfig, Simulation, Workload, seed_from_env};
use ldm7_types::Rate;

#[derive(Parser)]
#[command(about = "Multicast an LDM trace to simulated receivers and time it")]
struct Args {
    /// The trace (`SIZE YYYYMMDDhhmmss.fff` per line).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Number of receivers.
    #[arg(long, default_value_t = 100)]
    receivers: usize,
    /// Multicast loss probability per datagram and receiver.
    #[arg(long, default_value_t = 0.01)]
    loss: f64,
    /// Round-trip time in milliseconds.
    #[arg(long, default_value_t = 30)]
    rtt_ms: u64,
    /// Sender rate (multicast and repairs): `40M`, `40 Mbit/s`, `1G`, `64000` (bit/s).
    #[arg(long, default_value = "40M")]
    rate: Rate,
    /// Repair pacing rate, all receivers together (default: the sender rate, the design's
    /// retransmission class at the path rate).
    #[arg(long)]
    retx_rate: Option<Rate>,
    /// Seed (default: `LDM7_SEED`, else 1).
    #[arg(long)]
    seed: Option<u64>,
    /// Only the first N products of the trace.
    #[arg(long)]
    limit: Option<usize>,
    /// Materialize products and check full MD5s (slow at scale).
    #[arg(long)]
    memory: bool,
    /// Hand every receiver every BOP and EOP: no product taken whole (to compare; the
    /// deliveries are the same).
    #[arg(long)]
    visit_all: bool,
    #[command(flatten)]
    parity: parity_args::ParityArgs,
    /// The LDM-7 backstop: products FMTP misses come over unicast at this rate per receiver
    /// (`10M`; default: none, they are counted missed).
    #[arg(long)]
    backstop: Option<Rate>,
}

/// The one-hour NGRID trace of the shared data (`$LDM7_SHARED/data` or `../shared/data`); a
/// missing one stops the benchmark with a message naming `LDM7_SHARED`.
fn default_trace() -> PathBuf {
    ldm7_testkit::shared_data("traces/unidata_ldm_NGRID_1hr_20150615T00Z.txt")
}

/// mimalloc, as in the `idd` example.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args = Args::parse();
    let rate = args.rate.bits_per_s();
    if !(0.0..1.0).contains(&args.loss) {
        eprintln!("ngrid: --loss {}: expected a probability in [0, 1)", args.loss);
        return ExitCode::from(1);
    }
    let trace = args.trace.unwrap_or_else(default_trace);
    let mut workload = match Workload::from_trace_file(&trace) {
        Ok(workload) => workload,
        Err(error) => {
            eprintln!("ngrid: {error}");
            return ExitCode::from(1);
        }
    };
    if let Some(limit) = args.limit {
        workload = workload.take(limit);
    }
    let seed = args.seed.unwrap_or_else(|| seed_from_env(1));
    let rtt = Duration::from_millis(args.rtt_ms);
    let receivers =
        (0..args.receivers).map(|_| ReceiverSpec::with_rtt(rtt).loss(LossModel::Bernoulli(args.loss))).collect();
    let mut config = SimConfig::new(seed, receivers);
    config.sender = SenderConfig::with_rate(rate);
    if let Some(retx_rate) = args.retx_rate {
        config.sender.retx_pacing = Some(ldm7_fmtp_proto::Pacing::new(retx_rate.bits_per_s()));
    }
    config = args.parity.apply(config, args.receivers, args.loss);
    config.content = if args.memory { ContentMode::Memory } else { ContentMode::Pattern };
    config.whole_products = !args.visit_all;
    if let Some(rate) = args.backstop {
        config = config.with_backstop(rate.bits_per_s());
    }
    println!(
        "{}: {} products, {:.2} GB over {:?}, to {} receivers at {}% loss, RTT {:?}, {} bit/s, seed {seed}",
        trace.display(),
        workload.products.len(),
        workload.total_bytes() as f64 / 1e9,
        workload.duration(),
        args.receivers,
        args.loss * 100.0,
        rtt,
        rate
    );
    let started = std::time::Instant::now();
    let simulation = match Simulation::new(config, workload) {
        Ok(simulation) => simulation,
        Err(error) => {
            eprintln!("ngrid: {error}");
            return ExitCode::from(1);
        }
    };
    let result = simulation.run();
    let wall = started.elapsed();
    match result {
        Ok(report) => {
            println!("{report}");
            let virtual_time = report.virtual_time.saturating_duration_since(ldm7_fmtp_proto::Instant::ZERO);
            println!(
                "wall {:.2} s; virtual {:.1} s; speed-up {:.1}x; {:.2} M events/s",
                wall.as_secs_f64(),
                virtual_time.as_secs_f64(),
                virtual_time.as_secs_f64() / wall.as_secs_f64(),
                report.events as f64 / wall.as_secs_f64() / 1e6
            );
            ExitCode::SUCCESS
        }
        Err(failure) => {
            eprintln!("ngrid: {failure}");
            ExitCode::from(2)
        }
    }
}
