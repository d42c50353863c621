//! `ldm7 trace`: product traces (the format: [`ldm7_types::trace`]) — generated from the IDD
//! workload model ([`ldm7_sim::idd`], docs/workload.md) and summarized per feed.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ldm7_sim::idd::{IddConfig, IddTrace, RateSet};
use ldm7_types::{FeedType, Timestamp};

use crate::exit::{CmdResult, bad_input, runtime};

/// `ldm7 trace` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum TraceCommand {
    /// Generate a trace of IDD feeds from the workload model (seeded: the same flags give the
    /// same file).
    Generate(GenerateArgs),
    /// Per-feed counts, rates, size and inter-arrival quantiles of a trace.
    Stats(StatsArgs),
}

/// What to generate.
#[derive(clap::Args, Debug, Clone)]
pub struct IddArgs {
    /// The feeds' rates: idd2018 (the 2018 all-feed window: 8 feeds, ~426,000 products and
    /// ~40 GB per hour) or paper (6 feeds at the LDM7 papers' rates, ~79,000 per hour).
    #[arg(long, default_value = "idd2018")]
    pub set: RateSet,
    /// Only this feed of the set (repeatable): CONDUIT, NGRID, HDS, NEXRAD2, NEXRAD3,
    /// IDS|DDPLUS, NOTHER, DIFAX.
    #[arg(long = "only", value_name = "FEED")]
    pub only: Vec<String>,
    /// How long a stretch of time.
    #[arg(long, default_value = "1h", value_parser = crate::common::positive_duration_arg)]
    pub duration: Duration,
    /// Multiply every rate by this (a model-run peak hour: 1.6).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// The random seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// No slow per-minute rate modulation (NGRID, CONDUIT).
    #[arg(long)]
    pub no_modulation: bool,
    /// No jumbo products (two per hour of 1 MiB and more in feeds with such a tail).
    #[arg(long)]
    pub no_jumbo: bool,
}

impl IddArgs {
    /// The generator's configuration; a bad feed or scale is a usage error.
    pub fn config(&self) -> CmdResult<IddConfig> {
        if !(self.scale.is_finite() && self.scale > 0.0) {
            return Err(bad_input(format!("--scale {} must be a number above 0", self.scale)));
        }
        let mut config = IddConfig::hour(self.seed, self.set).only(&self.only).map_err(bad_input)?;
        config.duration = self.duration;
        config.scale = self.scale;
        config.modulation = !self.no_modulation;
        config.jumbo = !self.no_jumbo;
        Ok(config)
    }
}

/// Arguments of `ldm7 trace generate`.
#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub idd: IddArgs,
    /// The creation time of the stretch's start (UTC, `YYYYMMDDhhmmss`).
    #[arg(long, default_value = "20181113130000")]
    pub start: Timestamp,
    /// Write the trace here (standard output when absent).
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// Arguments of `ldm7 trace stats`.
#[derive(clap::Args, Debug)]
pub struct StatsArgs {
    /// The trace: `SIZE YYYYMMDDhhmmss.fff [FEED]` per line.
    pub trace: PathBuf,
}

/// Runs a `ldm7 trace` subcommand.
pub fn run(command: &TraceCommand) -> CmdResult {
    match command {
        TraceCommand::Generate(args) => generate(args),
        TraceCommand::Stats(args) => stats(&args.trace),
    }
}

fn generate(args: &GenerateArgs) -> CmdResult {
    let config = args.idd.config()?;
    let trace = IddTrace::generate(&config);
    let start = args.start.as_unix_micros();
    let write = |out: &mut dyn Write| -> std::io::Result<()> {
        let mut out = std::io::BufWriter::with_capacity(1 << 20, out);
        writeln!(
            out,
            "# ldm7 trace generate --set {} --duration {} --scale {} --seed {}{}{}{}",
            args.idd.set.name(),
            ldm7_types::units::format_duration(args.idd.duration),
            args.idd.scale,
            args.idd.seed,
            args.idd.only.iter().map(|feed| format!(" --only '{feed}'")).collect::<String>(),
            if args.idd.no_modulation { " --no-modulation" } else { "" },
            if args.idd.no_jumbo { " --no-jumbo" } else { "" },
        )?;
        writeln!(out, "# SIZE CREATED(UTC, µs) FEED — the IDD workload model (docs/workload.md)")?;
        for product in &trace.products {
            let micros = i64::try_from(product.at.as_micros()).unwrap_or(i64::MAX);
            let created = Timestamp::from_unix_micros(start.saturating_add(micros));
            writeln!(out, "{} {} {}", product.size, created, trace.feeds[usize::from(product.feed)].0.name)?;
        }
        out.flush()
    };
    match &args.output {
        Some(path) => {
            let mut file = std::fs::File::create(path)
                .map_err(|error| runtime(anyhow::anyhow!("cannot write {}: {error}", path.display())))?;
            write(&mut file).map_err(|error| runtime(anyhow::anyhow!("cannot write {}: {error}", path.display())))?;
        }
        None => {
            let stdout = std::io::stdout();
            let mut lock = stdout.lock();
            if let Err(error) = write(&mut lock) {
                // A closed pipe (`| head`) ends the output, not an error.
                if error.kind() != std::io::ErrorKind::BrokenPipe {
                    return Err(runtime(anyhow::anyhow!("cannot write the trace: {error}")));
                }
            }
        }
    }
    let mut summary = String::new();
    for (index, (model, rate)) in trace.feeds.iter().enumerate() {
        let (count, bytes) = trace
            .products
            .iter()
            .filter(|product| usize::from(product.feed) == index)
            .fold((0u64, 0u64), |(count, bytes), product| (count + 1, bytes + u64::from(product.size)));
        summary.push_str(&format!(
            "  {:<11} {:>9} products {:>8.2} GB   (model rate {:.0}/h)\n",
            model.name,
            count,
            bytes as f64 / 1e9,
            rate * args.idd.scale
        ));
    }
    eprint!(
        "generated {} products, {:.2} GB over {} ({} set, seed {}){}:\n{summary}",
        trace.products.len(),
        trace.total_bytes() as f64 / 1e9,
        ldm7_types::units::format_duration(args.idd.duration),
        args.idd.set.name(),
        args.idd.seed,
        args.output.as_ref().map_or_else(String::new, |path| format!(" into {}", path.display()))
    );
    Ok(())
}

/// A feed's products: sizes and creation times (µs).
#[derive(Default)]
struct FeedTally {
    sizes: Vec<f64>,
    times: Vec<i64>,
}

fn stats(path: &Path) -> CmdResult {
    let products = ldm7_testbed::trace::read_trace(path).map_err(bad_input)?;
    let named = ldm7_types::trace::feed_from_name(path);
    let mut feeds: Vec<(String, FeedTally)> = Vec::new();
    for product in &products {
        let name = product.feed.or(named).map_or_else(|| "(no feed)".to_owned(), feed_label);
        let index = match feeds.iter().position(|(known, _)| *known == name) {
            Some(index) => index,
            None => {
                feeds.push((name, FeedTally::default()));
                feeds.len() - 1
            }
        };
        feeds[index].1.sizes.push(f64::from(product.size));
        feeds[index].1.times.push(product.created.as_unix_micros());
    }
    let first = products.iter().map(|product| product.created.as_unix_micros()).min().unwrap_or(0);
    let last = products.iter().map(|product| product.created.as_unix_micros()).max().unwrap_or(0);
    let span_s = ((last - first) as f64 / 1e6).max(1e-6);
    feeds.sort_by_key(|(_, tally)| std::cmp::Reverse(tally.sizes.len()));
    let total_bytes: f64 = feeds.iter().flat_map(|(_, tally)| &tally.sizes).sum();
    println!(
        "trace {}: {} products, {:.2} GB over {:.1} min: {:.0} products/h, {:.2} GB/h",
        path.display(),
        products.len(),
        total_bytes / 1e9,
        span_s / 60.0,
        products.len() as f64 * 3600.0 / span_s,
        total_bytes / 1e9 * 3600.0 / span_s
    );
    println!(
        "{:<11} {:>8} {:>8}   size B: {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>10}   gap ms: {:>7} {:>7} {:>7} {:>7}",
        "feed",
        "products",
        "per h",
        "p10",
        "p25",
        "median",
        "p75",
        "p90",
        "p99",
        "mean",
        "max",
        "p25",
        "median",
        "p75",
        "p90"
    );
    for (name, tally) in &mut feeds {
        tally.sizes.sort_by(f64::total_cmp);
        // Gaps between creation times, per feed in time order (WORKLOAD.md §5).
        tally.times.sort_unstable();
        let mut gaps: Vec<f64> = tally.times.windows(2).map(|pair| (pair[1] - pair[0]) as f64 / 1e3).collect();
        gaps.sort_by(f64::total_cmp);
        let size = |q: f64| format!("{:.0}", quantile(&tally.sizes, q));
        let gap = |q: f64| if gaps.is_empty() { "-".to_owned() } else { format!("{:.2}", quantile(&gaps, q)) };
        let mean = tally.sizes.iter().sum::<f64>() / tally.sizes.len() as f64;
        println!(
            "{:<11} {:>8} {:>8.0}   size B: {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9.0} {:>10}   gap ms: {:>7} {:>7} {:>7} {:>7}",
            name,
            tally.sizes.len(),
            tally.sizes.len() as f64 * 3600.0 / span_s,
            size(0.10),
            size(0.25),
            size(0.50),
            size(0.75),
            size(0.90),
            size(0.99),
            mean,
            size(1.0),
            gap(0.25),
            gap(0.50),
            gap(0.75),
            gap(0.90)
        );
    }
    Ok(())
}

/// A feed's name as the workload model calls it (DIFAX rather than SATELLITE).
fn feed_label(feed: FeedType) -> String {
    ldm7_sim::idd::FEEDS
        .iter()
        .find(|model| model.feed == feed)
        .map_or_else(|| feed.to_string(), |model| model.name.to_owned())
}

/// The `q` quantile of sorted values (`ldm7_types::quantile`; NaN when there are none).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    ldm7_types::quantile::quantile(sorted, q).unwrap_or(f64::NAN)
}
