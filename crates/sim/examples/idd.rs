//! Every feed of a generated IDD stretch (the workload model, `ldm7_sim::idd`) multicast to N
//! simulated subscribers, each feed on its own path at the rate `ldm7 plan` gives it, every
//! product accounted for — the scale benchmark of the simulator.
//!
//! ```text
//! cargo run --release -p ldm7-sim --example idd -- [--receivers 570] [--loss 0.01] [--rtt-ms 30]
//!     [--set idd2018|paper] [--only FEED]... [--duration 1h] [--seed N] [--wait 1s]
//!     [--retx-factor 1] [--jobs 2] [--parity auto|off|GROUP/SHARDS]
//! ```
//!
//! Repairs are by parity multicast (the ldm7 extension, as ldm7 peers agree by default: the
//! publisher's rule for these receivers and this loss); `--parity off` repairs by unicast, as the
//! reference's FMTP.
//!
//! Feeds are independent simulations (as LDM-7 multicasts each on its own group and path) and
//! run side by side on `--jobs` threads, largest first. Prints a line per feed, the totals, the
//! wall time and the peak memory; exits non-zero if a checker fails in any feed.

use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

#[path = "support/parity_args.rs"]
mod parity_args;

use clap::Parser;
use ldm7_fmtp_proto::SenderConfig;
use ldm7_sim::idd::{IddConfig, IddTrace, RateSet};
use ldm7_sim::{ContentMode, LatencyStats, LossModel, ReceiverSpec, Report, SimConfig, Simulation, Workload};

#[derive(Parser)]
#[command(about = "Multicast every feed of a generated IDD hour to simulated subscribers and time it")]
struct Args {
    /// Subscribers of every feed.
    #[arg(long, default_value_t = 570)]
    receivers: usize,
    /// Multicast loss probability per datagram and subscriber.
    #[arg(long, default_value_t = 0.01)]
    loss: f64,
    /// Round-trip time in milliseconds.
    #[arg(long, default_value_t = 30)]
    rtt_ms: u64,
    /// The rate set: idd2018 or paper.
    #[arg(long, default_value = "idd2018")]
    set: RateSet,
    /// Only these feeds (repeatable).
    #[arg(long = "only")]
    only: Vec<String>,
    /// Seconds of the IDD to generate.
    #[arg(long, default_value_t = 3600)]
    duration_s: u64,
    /// The workload seed (and the simulation's).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// W of the plan that sets each feed's path rate, milliseconds.
    #[arg(long, default_value_t = 1000)]
    wait_ms: u64,
    /// Repairs of a feed are paced at this multiple of its path rate (the design's two HTB
    /// classes at the path rate each: 1).
    #[arg(long, default_value_t = 1.0)]
    retx_factor: f64,
    /// Feeds simulated at once.
    #[arg(long, default_value_t = 2)]
    jobs: usize,
    #[command(flatten)]
    parity: parity_args::ParityArgs,
}

/// One feed's outcome.
struct FeedRun {
    name: &'static str,
    products: usize,
    bytes: u64,
    rate_bps: u64,
    wall: Duration,
    result: Result<Report, String>,
}

/// mimalloc: the simulation allocates and frees small maps and vectors per product and
/// receiver; glibc's allocator took about 15% of a CONDUIT run (perf).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args = Args::parse();
    if !(0.0..1.0).contains(&args.loss) || args.retx_factor <= 0.0 || args.jobs == 0 {
        eprintln!("idd: --loss must be in [0, 1), --retx-factor above 0, --jobs at least 1");
        return ExitCode::from(1);
    }
    let started = std::time::Instant::now();
    let mut config = match IddConfig::hour(args.seed, args.set).only(&args.only) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("idd: {error}");
            return ExitCode::from(1);
        }
    };
    config.duration = Duration::from_secs(args.duration_s);
    let trace = IddTrace::generate(&config);
    println!(
        "{} set, seed {}: {} products, {:.2} GB over {} s, {} feeds, to {} subscribers each at {}% loss, RTT {} ms; \
         generated in {:.2} s",
        args.set.name(),
        args.seed,
        trace.products.len(),
        trace.total_bytes() as f64 / 1e9,
        args.duration_s,
        trace.feeds.len(),
        args.receivers,
        args.loss * 100.0,
        args.rtt_ms,
        started.elapsed().as_secs_f64()
    );
    // Largest feeds first, so that the threads finish together.
    let mut feeds: Vec<(usize, Workload)> = (0..trace.feeds.len()).map(|k| (k, trace.workload(k))).collect();
    feeds.sort_by_key(|(_, workload)| std::cmp::Reverse(workload.total_bytes()));
    let next = AtomicUsize::new(0);
    let runs = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..args.jobs.min(feeds.len()) {
            scope.spawn(|| {
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some((feed, workload)) = feeds.get(k) else { break };
                    let run = simulate_feed(&args, trace.feeds[*feed].0.name, workload.clone());
                    println!("{}", feed_line(&run));
                    runs.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(run);
                }
            });
        }
    });
    let runs = runs.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
    let wall = started.elapsed();
    let failed = runs.iter().filter(|run| run.result.is_err()).count();
    let (mut delivered, mut missed, mut events) = (0u64, 0u64, 0u64);
    let (mut product_bytes, mut sent_bytes) = (0u64, 0f64);
    let mut latency = LatencyStats::default();
    for report in runs.iter().filter_map(|run| run.result.as_ref().ok()) {
        delivered += report.delivered();
        missed += report.missed();
        latency.merge(&report.latency_of(0..report.receivers.len()));
        events += report.events;
        product_bytes += report.product_bytes;
        sent_bytes += report.egress_per_product_byte() * report.product_bytes as f64;
    }
    println!(
        "all feeds: {} products, {:.2} GB, path rates {:.0} Mbit/s in total; delivered {delivered}, missed {missed} \
         ({:.3}%), latency mean {:?} p99 {:?}; publisher egress {:.3} per product byte; {:.1} M events",
        runs.iter().map(|run| run.products).sum::<usize>(),
        runs.iter().map(|run| run.bytes).sum::<u64>() as f64 / 1e9,
        runs.iter().map(|run| run.rate_bps).sum::<u64>() as f64 / 1e6,
        if delivered + missed > 0 { missed as f64 * 100.0 / (delivered + missed) as f64 } else { 0.0 },
        latency.mean(),
        latency.quantile(0.99),
        sent_bytes / product_bytes.max(1) as f64,
        events as f64 / 1e6
    );
    println!(
        "wall {:.1} s ({:.1}x faster than the {} s simulated); peak memory {} MB; {failed} feed(s) failed",
        wall.as_secs_f64(),
        args.duration_s as f64 / wall.as_secs_f64(),
        args.duration_s,
        peak_rss_mb().map_or_else(|| "?".to_owned(), |mb| mb.to_string())
    );
    if failed > 0 { ExitCode::from(2) } else { ExitCode::SUCCESS }
}

/// One feed: its path rate from the plan (W over the whole stretch), then the simulation.
fn simulate_feed(args: &Args, name: &'static str, workload: Workload) -> FeedRun {
    let started = std::time::Instant::now();
    let arrivals: Vec<ldm7_plan::Arrival> = workload
        .products
        .iter()
        .map(|product| ldm7_plan::Arrival { at_s: product.at.as_secs_f64(), bytes: u64::from(product.size) })
        .collect();
    let plan = ldm7_plan::PlanConfig {
        interval_s: args.duration_s as f64,
        wait_max_s: args.wait_ms as f64 / 1e3,
        rate_min_bps: 1e6,
        rate_max_bps: 10e9,
        rate_step_bps: 1e6,
    };
    let rate_bps = ldm7_plan::plan(&arrivals, &plan)
        .ok()
        .and_then(|plans| plans.iter().map(|p| p.held_rate_bps).reduce(f64::max))
        .unwrap_or(1e6) as u64;
    let rtt = Duration::from_millis(args.rtt_ms);
    let receivers =
        (0..args.receivers).map(|_| ReceiverSpec::with_rtt(rtt).loss(LossModel::Bernoulli(args.loss))).collect();
    let mut config = SimConfig::new(args.seed, receivers);
    config.sender = SenderConfig::with_rate(rate_bps);
    config.sender.retx_pacing = Some(ldm7_fmtp_proto::Pacing::new((rate_bps as f64 * args.retx_factor) as u64));
    config = args.parity.apply(config, args.receivers, args.loss);
    config.content = ContentMode::Pattern;
    let (products, bytes) = (workload.products.len(), workload.total_bytes());
    let result = Simulation::new(config, workload)
        .map_err(|error| error.to_string())
        .and_then(|simulation| simulation.run().map_err(|failure| failure.to_string()));
    FeedRun { name, products, bytes, rate_bps, wall: started.elapsed(), result }
}

fn feed_line(run: &FeedRun) -> String {
    let head = format!(
        "{:<11} {:>7} products {:>6.2} GB at {:>5} Mbit/s: ",
        run.name,
        run.products,
        run.bytes as f64 / 1e9,
        run.rate_bps / 1_000_000
    );
    match &run.result {
        Ok(report) => {
            let (delivered, missed) = (report.delivered(), report.missed());
            let latency = report.latency_of(0..report.receivers.len());
            format!(
                "{head}delivered {delivered} ({:.0}% taken whole), missed {missed}, latency mean {:?} p99 {:?}, egress \
                 {:.3} per product byte ({} PARITY_REQ, {} RETX_REQ), {:.1} M events, wall {:.1} s",
                100.0 * report.whole_products as f64 / delivered.max(1) as f64,
                latency.mean(),
                latency.quantile(0.99),
                report.egress_per_product_byte(),
                report.sender.parity_requests,
                report.sender.retx_requests,
                report.events as f64 / 1e6,
                run.wall.as_secs_f64()
            )
        }
        Err(error) => format!("{head}FAILED after {:.1} s: {error}", run.wall.as_secs_f64()),
    }
}

/// The process's peak resident memory (Linux: VmHWM), MB.
fn peak_rss_mb() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024)
}
