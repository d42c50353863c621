//! The research's comparison in one command: the same workload to N subscribers by LDM-6 (a
//! relay tree over TCP, `ldm7_sim::relay`) and by LDM-7 (FMTP multicast with unicast repairs,
//! the packet-level simulator), with publisher egress per ingested byte, latency and
//! throughput for each.
//!
//! ```text
//! cargo run --release -p ldm7-sim --example unicast_vs_multicast -- [--subscribers 1,8,100]
//!     [--loss 0.01] [--rtt-ms 30] [--rate 40M] [--limit 2000] [--top-fanout 20] [--relay-fanout 10]
//!     [--parity auto|off|GROUP/SHARDS]
//! ```
//!
//! LDM-7 runs as the reference's FMTP (unicast repairs), then a second time with parity repair
//! as ldm7 peers agree by default (the ldm7 extension, `ldm7_fmtp_proto::parity`): lost blocks
//! repaired by parity shards multicast once for all; `--parity off` skips that run.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant as WallInstant};

#[path = "support/parity_args.rs"]
mod parity_args;

use clap::Parser;
use ldm7_fmtp_proto::SenderConfig;
use ldm7_sim::relay::RelayTree;
use ldm7_sim::{ContentMode, LossModel, ReceiverSpec, SimConfig, Simulation, Workload, seed_from_env};
use ldm7_types::Rate;

#[derive(Parser)]
#[command(about = "LDM-6 relay tree against LDM-7 multicast on one workload")]
struct Args {
    /// The trace (default: the one-hour NGRID trace of the shared data).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Only the first N products.
    #[arg(long)]
    limit: Option<usize>,
    /// Subscriber counts to compare at.
    #[arg(long, value_delimiter = ',', default_value = "1,8,100")]
    subscribers: Vec<usize>,
    /// Packet loss per subscriber (multicast datagrams; TCP segments on the tree's links).
    #[arg(long, default_value_t = 0.01)]
    loss: f64,
    /// Round-trip time publisher ↔ subscriber (and of each tree link), ms.
    #[arg(long, default_value_t = 30)]
    rtt_ms: u64,
    /// The multicast path rate, and every node's uplink in the tree.
    #[arg(long, default_value = "40M")]
    rate: Rate,
    /// Children of the tree's publisher.
    #[arg(long, default_value_t = 20)]
    top_fanout: usize,
    /// Children of each relay.
    #[arg(long, default_value_t = 10)]
    relay_fanout: usize,
    /// Seed (default `LDM7_SEED`, else 1).
    #[arg(long)]
    seed: Option<u64>,
    /// `--parity`: also run LDM-7 with parity repair.
    #[command(flatten)]
    parity: parity_args::ParityArgs,
}

/// One LDM-7 run: egress per ingested byte, mean latency, mean throughput (bit/s).
struct Ldm7Outcome {
    egress: f64,
    latency: Duration,
    throughput: f64,
}

fn run_ldm7(
    args: &Args,
    workload: &Workload,
    subscribers: usize,
    seed: u64,
    parity: bool,
) -> Result<Ldm7Outcome, String> {
    let rtt = Duration::from_millis(args.rtt_ms);
    let receivers =
        (0..subscribers).map(|_| ReceiverSpec::with_rtt(rtt).loss(LossModel::Bernoulli(args.loss))).collect();
    let mut config = SimConfig::new(seed, receivers);
    config.sender = SenderConfig::with_rate(args.rate.bits_per_s());
    if parity {
        config = args.parity.apply(config, subscribers, args.loss);
    }
    config.content = ContentMode::Pattern;
    let report = Simulation::new(config, workload.clone())
        .map_err(|e| e.to_string())
        .and_then(|s| s.run().map_err(|failure| failure.to_string()))?;
    let latency = report.latency_of(0..subscribers).mean();
    let throughput: f64 = report
        .receivers
        .iter()
        .map(|receiver| {
            let summed = receiver.tally.latency.mean().as_secs_f64() * receiver.tally.latency.count() as f64;
            workload.total_bytes() as f64 * 8.0 / summed.max(1e-9)
        })
        .sum::<f64>()
        / subscribers.max(1) as f64;
    Ok(Ldm7Outcome { egress: report.egress_per_product_byte(), latency, throughput })
}

fn main() -> ExitCode {
    let args = Args::parse();
    let trace = args
        .trace
        .clone()
        .unwrap_or_else(|| ldm7_testkit::shared_data("traces/unidata_ldm_NGRID_1hr_20150615T00Z.txt"));
    let mut workload = match Workload::from_trace_file(&trace) {
        Ok(workload) => workload,
        Err(error) => {
            eprintln!("unicast_vs_multicast: {error}");
            return ExitCode::from(1);
        }
    };
    if let Some(limit) = args.limit {
        workload = workload.take(limit);
    }
    let seed = args.seed.unwrap_or_else(|| seed_from_env(1));
    let rtt = Duration::from_millis(args.rtt_ms);
    println!(
        "{}: {} products, {:.2} GB over {:.0} s; loss {}%, RTT {:?}, rate {}, tree fan-out {}/{}",
        trace.display(),
        workload.products.len(),
        workload.total_bytes() as f64 / 1e9,
        workload.duration().as_secs_f64(),
        args.loss * 100.0,
        rtt,
        args.rate,
        args.top_fanout,
        args.relay_fanout
    );
    println!(
        "{:>5} | {:>22} | {:>21} | {:>25} | {:>8}",
        "subs", "egress/ingest 6 · 7", "latency mean 6 · 7", "throughput Mbit/s 6 · 7", "wall s"
    );
    for &subscribers in &args.subscribers {
        let started = WallInstant::now();
        let tree = RelayTree {
            subscribers,
            top_fanout: args.top_fanout,
            relay_fanout: args.relay_fanout,
            uplink_bits_per_s: args.rate.bits_per_s(),
            link_delay: rtt / 2,
            loss: args.loss,
        };
        let unicast = match tree.run(&workload) {
            Ok(report) => report,
            Err(error) => {
                eprintln!("unicast_vs_multicast: {error}");
                return ExitCode::from(1);
            }
        };
        let multicast = match run_ldm7(&args, &workload, subscribers, seed, false) {
            Ok(outcome) => outcome,
            Err(error) => {
                eprintln!("unicast_vs_multicast: {subscribers} subscribers: {error}");
                return ExitCode::from(2);
            }
        };
        let parity = if args.parity.is_on() {
            match run_ldm7(&args, &workload, subscribers, seed, true) {
                Ok(outcome) => Some(outcome),
                Err(error) => {
                    eprintln!("unicast_vs_multicast: {subscribers} subscribers, parity: {error}");
                    return ExitCode::from(2);
                }
            }
        } else {
            None
        };
        println!(
            "{:>5} | {:>10.2} · {:>9.3} | {:>9.2?} · {:>9.2?} | {:>11.3} · {:>11.3} | {:>8.1}",
            subscribers,
            unicast.egress_per_ingest(),
            multicast.egress,
            unicast.latency.mean(),
            multicast.latency,
            unicast.mean_throughput_bits_per_s() / 1e6,
            multicast.throughput / 1e6,
            started.elapsed().as_secs_f64()
        );
        if let Some(parity) = parity {
            println!(
                "{:>5} | {:>10} · {:>9.3} | {:>9} · {:>9.2?} | {:>11} · {:>11.3} |   (LDM-7 with parity repair)",
                "",
                "",
                parity.egress,
                "",
                parity.latency,
                "",
                parity.throughput / 1e6
            );
        }
    }
    ExitCode::SUCCESS
}
