//! `ldm7 bench compare` (root): the research comparison of LDM-6 unicast and LDM-7 multicast
//! (RESEARCH.md §5, §6) as one command, on one `ldm7 lab` path and with one harness (this
//! crate's [`Lab`], [`Server`], [`Replay`] and records).
//!
//! Each run builds a lab — a publisher and N subscribers, the feed on a Linux bridge, the
//! publisher's HTB at `--rate` with a 600 MB BFIFO, receive-side loss per subscriber — starts
//! `ldm7 serve` in every host, waits until every subscriber is connected, replays the first
//! `--span` of the NGRID trace at `--speed` into the publisher's queue, waits until every
//! subscriber holds every product, and reads every queue and log:
//!
//! - **LDM-6**: each subscriber `REQUEST NGRID ".*" 10.77.1.1`, from a static feed address
//!   `10.77.1.(k+1)/24`, so the unicast crosses the publisher's HTB as the multicast does;
//! - **LDM-7**: each subscriber `RECEIVE NGRID 10.76.0.1:388 ngrid s<k> ngrid-<k>`; the
//!   publisher hands out the feed addresses and adds the subscribers' legs to the path.
//!
//! Per subscriber: throughput as the research defines it — Σ size / Σ latency over the products
//! received by FMTP (`Received` lines) for LDM-7, over every product for LDM-6 —, products
//! delivered (intact: MD5), p50/p99 latency over every product. Per run: publisher egress bytes
//! (HTB path class, Ethernet frames) per product byte of the feed, publisher CPU seconds. Latency
//! = the subscriber's queue insertion − the product's creation, its insertion at the publisher
//! (one clock). `--repeat` runs each mode again and reports medians.
//!
//! `--lossy-neighbour` measures instead the effect of one subscriber at `--neighbour-loss`
//! (20%) on the others: LDM-7 alone, the same runs with and without the last subscriber lossy,
//! and the others' p99 latency ratio (with / without).
//!
//! Outputs in `--out` (default `experiments/results/`): a CSV per run, a summary CSV of medians
//! and a PNG plot (per-subscriber throughput LDM-6 vs LDM-7, or the p99 latencies), text
//! rendered with DejaVu Sans embedded in the binary (no system font needed: [`crate::figure`]).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use ldm7_fmtp_proto::ParityChoice;
use ldm7_pq::Capacity;
use ldm7_types::Rate;

use crate::{
    Comparison, DeliveryMode, Egress, Lab, ProductRecord, Replay, ReplayOptions, Server, ServerConfig,
    latency_quantile_us, median,
};

/// What `ldm7 bench compare` measures.
#[derive(Debug, Clone)]
pub struct CompareOptions {
    /// Path rate: the publisher's HTB rate and the FMTP sending rate.
    pub rate: Rate,
    /// Number of subscribers.
    pub subscribers: usize,
    /// Receive-side loss in percent: one value for every subscriber, or one per subscriber.
    pub loss: Vec<f64>,
    /// How much of the trace to replay (trace time).
    pub span: Duration,
    /// Replay speed (the trace's pace × speed).
    pub speed: f64,
    /// Runs per measurement; medians are reported.
    pub repeat: u32,
    /// Which protocols to run.
    pub modes: Vec<Protocol>,
    /// Measure one lossy subscriber's effect on the others' latency instead (LDM-7 only).
    pub lossy_neighbour: bool,
    /// Share of the path rate HTB assures to FMTP repairs (the lab's `retx_share`; `None`: the
    /// plan's for the subscribers and their loss, at least 0.02).
    pub retx_share: Option<f64>,
    /// The LDM-7 publisher's parity repair (`parity` in its ldm7.toml).
    pub parity: ParityChoice,
    /// The lossy neighbour's loss, percent.
    pub neighbour_loss: f64,
    /// The trace (`None`: the one-hour NGRID trace in `$LDM7_SHARED`, else `../shared`).
    pub trace: Option<PathBuf>,
    /// Where the CSV files and the plot go.
    pub out: PathBuf,
    /// Name of this measurement in the output files (`None`: from the parameters).
    pub label: Option<String>,
    /// Directory for the lab hosts' queues and logs (`None`: the system temporary directory).
    pub dir: Option<PathBuf>,
}

/// A protocol measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// LDM-6 unicast, one TCP connection per subscriber.
    Ldm6,
    /// LDM-7 multicast by FMTP.
    Ldm7,
}

impl Protocol {
    fn name(self) -> &'static str {
        match self {
            Protocol::Ldm6 => "LDM-6",
            Protocol::Ldm7 => "LDM-7",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Protocol::Ldm6 => "ldm6",
            Protocol::Ldm7 => "ldm7",
        }
    }
}

const TRACE: &str = "traces/unidata_ldm_NGRID_1hr_20150615T00Z.txt";
const FEED: &str = "ngrid";
/// How long subscribers may take to connect.
const CONNECT_WAIT: Duration = Duration::from_secs(60);

/// One subscriber's results in one run.
#[derive(Clone, Debug)]
struct SubscriberResult {
    host: String,
    loss_percent: f64,
    products: usize,
    received: usize,
    inserted: usize,
    backlog: usize,
    /// Σ size / Σ latency (bits/s) over the products the research counts.
    throughput_bits_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
}

/// One run.
#[derive(Clone, Debug)]
struct RunResult {
    protocol: Protocol,
    variant: String,
    run: u32,
    feed_products: usize,
    feed_bytes: u64,
    egress: Egress,
    publisher_cpu_s: f64,
    replay_s: f64,
    subscribers: Vec<SubscriberResult>,
}

impl RunResult {
    /// Ethernet frames (what HTB counts) per product byte.
    fn egress_per_byte(&self) -> f64 {
        self.egress.htb_bytes as f64 / self.feed_bytes.max(1) as f64
    }

    /// IP datagrams (frames less their Ethernet headers) per product byte.
    fn egress_ip_per_byte(&self) -> f64 {
        self.egress.ip_bytes() as f64 / self.feed_bytes.max(1) as f64
    }
}

/// What one run is.
#[derive(Clone, Debug)]
struct RunPlan {
    protocol: Protocol,
    variant: String,
    losses: Vec<f64>,
}

/// Runs the comparison and writes its files.
pub fn run(args: &CompareOptions) -> anyhow::Result<()> {
    ldm7_net::lab::require_root()?;
    let losses = losses(args)?;
    if args.repeat == 0 || args.subscribers > 60 {
        bail!("--repeat must be at least 1 and --subscribers at most 60");
    }
    let trace = match &args.trace {
        Some(trace) => trace.clone(),
        None => shared_trace(),
    };
    if !trace.exists() {
        bail!("the trace {} does not exist: give one with --trace", trace.display());
    }
    let exe = std::env::current_exe().context("find the ldm7 executable")?;
    std::fs::create_dir_all(&args.out).with_context(|| format!("create {}", args.out.display()))?;
    let label = args.label.clone().unwrap_or_else(|| default_label(args));
    let plans = plans(args, &losses);
    println!(
        "ldm7 bench compare: {} subscriber(s), {}, loss {:?}%, {:?} of {} at {}x, {} run(s) each",
        args.subscribers,
        args.rate,
        losses,
        args.span,
        trace.display(),
        args.speed,
        args.repeat
    );
    let mut results = Vec::new();
    for run in 0..args.repeat {
        for plan in &plans {
            let result = measure(&exe, args, &trace, plan, run)
                .with_context(|| format!("{} {} run {}", plan.protocol.name(), plan.variant, run + 1))?;
            print_run(&result);
            let path = args.out.join(format!("{label}-{}-{}-run{}.csv", plan.protocol.tag(), plan.variant, run + 1));
            std::fs::write(&path, run_csv(&result)).with_context(|| format!("write {}", path.display()))?;
            results.push(result);
        }
    }
    let summary = summarize(&plans, &results);
    println!("{summary}");
    let path = args.out.join(format!("{label}-summary.txt"));
    std::fs::write(&path, &summary).with_context(|| format!("write {}", path.display()))?;
    let plot = args.out.join(format!("{label}.png"));
    if args.lossy_neighbour {
        plot_p99(&plot, &plans, &results, &label)?;
    } else {
        plot_throughput(&plot, &plans, &results, &label)?;
    }
    println!("wrote {} and {}", path.display(), plot.display());
    Ok(())
}

fn shared_trace() -> PathBuf {
    std::env::var_os("LDM7_SHARED").map_or_else(|| PathBuf::from("../shared"), PathBuf::from).join("data").join(TRACE)
}

fn losses(args: &CompareOptions) -> anyhow::Result<Vec<f64>> {
    if args.subscribers == 0 {
        bail!("--subscribers must be at least 1");
    }
    if args.loss.iter().chain([&args.neighbour_loss]).any(|loss| !(0.0..100.0).contains(loss)) {
        bail!("losses are percentages from 0 up to (not including) 100");
    }
    match args.loss.len() {
        1 => Ok(vec![args.loss[0]; args.subscribers]),
        n if n == args.subscribers => Ok(args.loss.clone()),
        n => bail!("--loss has {n} values: give one, or one per subscriber ({})", args.subscribers),
    }
}

fn default_label(args: &CompareOptions) -> String {
    let mbits = args.rate.bits_per_s() as f64 / 1e6;
    let kind = if args.lossy_neighbour { "neighbour" } else { "compare" };
    format!("{kind}-{mbits}M-n{}-span{}s-x{}", args.subscribers, args.span.as_secs(), args.speed)
}

fn plans(args: &CompareOptions, losses: &[f64]) -> Vec<RunPlan> {
    if args.lossy_neighbour {
        let mut lossy = losses.to_vec();
        if let Some(last) = lossy.last_mut() {
            *last = args.neighbour_loss;
        }
        vec![
            RunPlan { protocol: Protocol::Ldm7, variant: "quiet".into(), losses: losses.to_vec() },
            RunPlan { protocol: Protocol::Ldm7, variant: "lossy".into(), losses: lossy },
        ]
    } else {
        args.modes
            .iter()
            .map(|&protocol| RunPlan { protocol, variant: "base".into(), losses: losses.to_vec() })
            .collect()
    }
}

fn lab_spec(name: &str, args: &CompareOptions, plan: &RunPlan) -> String {
    let mut spec = format!("name = \"{name}\"\n[[hosts]]\nname = \"pub\"\n");
    for (k, loss) in plan.losses.iter().enumerate() {
        let _ = write!(spec, "[[hosts]]\nname = \"s{}\"\nloss_percent = {loss:?}\n", k + 1);
    }
    let subscribers: Vec<String> = (1..=plan.losses.len()).map(|k| format!("\"s{k}\"")).collect();
    let _ = write!(
        spec,
        "[[feeds]]\nname = \"{FEED}\"\npublisher = \"pub\"\nsubscribers = [{}]\nrate = \"{}\"\nbuffer = \"600 MB\"\n\
         multicast_port = 38800\nretx_port = 38801\nsubscriber_addresses = {}\n",
        subscribers.join(", "),
        args.rate,
        plan.protocol == Protocol::Ldm6
    );
    if let Some(share) = args.retx_share {
        let _ = writeln!(spec, "retx_share = {share:?}");
    }
    spec
}

fn measure(exe: &Path, args: &CompareOptions, trace: &Path, plan: &RunPlan, run: u32) -> anyhow::Result<RunResult> {
    let letter = match plan.protocol {
        Protocol::Ldm6 => '6',
        Protocol::Ldm7 => '7',
    };
    let name = format!("bc{letter}{}", std::process::id() % 100_000);
    let lab = Lab::up(&lab_spec(&name, args, plan))?;
    let scratch = match &args.dir {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .context("create a scratch directory")?;
    // The 1-hour trace is 6.7 GB, about evenly spread: room for a span of it with a margin, so
    // that nothing is evicted.
    let bytes = (7_000_000_000.0 * 1.5 * (args.span.as_secs_f64() / 3600.0).min(1.0)) as u64 + 200_000_000;
    let capacity = Capacity { bytes, slots: 100_000 };
    let (publisher_conf, publisher_settings) = match plan.protocol {
        Protocol::Ldm6 => ("ALLOW NGRID ^10\\.77\\.1\\.[0-9]+$\n".to_string(), None),
        Protocol::Ldm7 => (
            "ALLOW NGRID ^10\\.76\\.0\\.[0-9]+$\nMULTICAST NGRID 239.77.1.1:38800 10.77.1.1:38801 24 0 dummy dummy\n"
                .to_string(),
            Some(format!(
                "[multicast]\nrate = \"{}\"\nparity = \"{}\"\n[multicast.feeds.NGRID]\npath = \"{FEED}\"\n\
                 [path]\ndriver = \"linux-bridge\"\nnetns = \"{name}-core\"\n",
                args.rate, args.parity
            )),
        ),
    };
    let mut config = ServerConfig::new("pub", Some(lab.netns("pub")?), capacity, &publisher_conf);
    config.settings = publisher_settings;
    let mut publisher = Server::create(exe, scratch.path(), config)?;
    publisher.start()?;
    let mut subscribers = Vec::new();
    for k in 1..=plan.losses.len() {
        let host = format!("s{k}");
        let port = lab.spec().bridge_port(FEED, &host).context("bridge port")?;
        let (conf, settings) = match plan.protocol {
            Protocol::Ldm6 => ("REQUEST NGRID \".*\" 10.77.1.1:388\n".to_string(), None),
            Protocol::Ldm7 => (
                format!("RECEIVE NGRID 10.76.0.1:388 {FEED} {host} {port}\n"),
                Some(format!("[receive]\nrate = \"{}\"\nretry_min = \"200ms\"\nretry_max = \"2s\"\n", args.rate)),
            ),
        };
        let mut config = ServerConfig::new(&host, Some(lab.netns(&host)?), capacity, &conf);
        config.settings = settings;
        let mut server = Server::create(exe, scratch.path(), config)?;
        server.start()?;
        subscribers.push(server);
    }
    let ready = match plan.protocol {
        Protocol::Ldm6 => "is willing to be",
        Protocol::Ldm7 => "FMTP repair connection to",
    };
    for server in &subscribers {
        server.wait_for_log(ready, CONNECT_WAIT)?;
    }
    let egress_before = Egress::read(Some(&lab.netns("pub")?), FEED)?;
    let cpu_before = publisher.cpu_seconds().unwrap_or(0.0);
    let options =
        ReplayOptions { span: Some(args.span), seed: u64::from(run) + 1, ..ReplayOptions::new(trace, args.speed) };
    let replay = Replay::start(exe, &publisher.queue_path(), &options)?.wait()?;
    // Generous: every subscriber's copy through the path one after another, twice over.
    let published = publisher.records()?;
    let feed_bytes: u64 = published.iter().map(|r| r.size).sum();
    let serial_s = feed_bytes as f64 * 8.0 * plan.losses.len() as f64 / args.rate.bits_per_s() as f64;
    let within = Duration::from_secs_f64(2.0 * serial_s + 300.0);
    for server in &mut subscribers {
        server.wait_for_products(replay.products, within)?;
    }
    let egress = Egress::read(Some(&lab.netns("pub")?), FEED)?.since(egress_before);
    let publisher_cpu_s = publisher.cpu_seconds().unwrap_or(0.0) - cpu_before;
    for server in subscribers.iter_mut().chain([&mut publisher]) {
        server.stop()?;
    }
    let mut results = Vec::new();
    for (server, loss) in subscribers.iter().zip(&plan.losses) {
        let records = server.records()?;
        let comparison = Comparison::of(&published, &records);
        if !comparison.is_exact() {
            bail!("{}: {comparison}", server.name());
        }
        results.push(subscriber_result(plan.protocol, server.name(), *loss, &records));
    }
    drop(subscribers);
    drop(publisher);
    lab.down()?;
    Ok(RunResult {
        protocol: plan.protocol,
        variant: plan.variant.clone(),
        run: run + 1,
        feed_products: published.len(),
        feed_bytes,
        egress,
        publisher_cpu_s,
        replay_s: replay.seconds,
        subscribers: results,
    })
}

fn subscriber_result(protocol: Protocol, host: &str, loss_percent: f64, records: &[ProductRecord]) -> SubscriberResult {
    let count = |mode| records.iter().filter(|r| r.mode == Some(mode)).count();
    let counted: Vec<&ProductRecord> = match protocol {
        Protocol::Ldm6 => records.iter().collect(),
        Protocol::Ldm7 => records.iter().filter(|r| r.mode == Some(DeliveryMode::Received)).collect(),
    };
    let bytes: u64 = counted.iter().map(|r| r.size).sum();
    let latency_us: i64 = counted.iter().map(|r| r.latency_us.max(1)).sum();
    let all: Vec<&ProductRecord> = records.iter().collect();
    let quantile_ms = |q| latency_quantile_us(&all, q).map_or(f64::NAN, |us| us as f64 / 1e3);
    SubscriberResult {
        host: host.to_string(),
        loss_percent,
        products: records.len(),
        received: count(DeliveryMode::Received),
        inserted: count(DeliveryMode::Inserted),
        backlog: count(DeliveryMode::Backlog),
        throughput_bits_per_s: if latency_us > 0 { bytes as f64 * 8.0 / (latency_us as f64 / 1e6) } else { f64::NAN },
        p50_ms: quantile_ms(0.5),
        p99_ms: quantile_ms(0.99),
    }
}

fn print_run(result: &RunResult) {
    println!(
        "{} {} run {}: {} products, {:.1} MB replayed in {:.1} s; egress {:.3} bytes per product byte \
         (IP {:.3}, interface tx {:.3}); publisher CPU {:.2} s",
        result.protocol.name(),
        result.variant,
        result.run,
        result.feed_products,
        result.feed_bytes as f64 / 1e6,
        result.replay_s,
        result.egress_per_byte(),
        result.egress_ip_per_byte(),
        result.egress.tx_bytes as f64 / result.feed_bytes.max(1) as f64,
        result.publisher_cpu_s
    );
    for s in &result.subscribers {
        println!(
            "  {} (loss {}%): {} products (FMTP {}, backstop {}, backlog {}), throughput {} Mbit/s, \
             latency p50 {:.1} ms p99 {:.1} ms",
            s.host,
            s.loss_percent,
            s.products,
            s.received,
            s.inserted,
            s.backlog,
            significant(s.throughput_bits_per_s / 1e6),
            s.p50_ms,
            s.p99_ms
        );
    }
}

/// A value with three significant digits (throughputs span 0.01 to hundreds of Mbit/s).
fn significant(value: f64) -> String {
    if !value.is_finite() || value == 0.0 {
        return format!("{value}");
    }
    let decimals = (2 - value.abs().log10().floor() as i32).clamp(0, 6) as usize;
    format!("{value:.decimals$}")
}

fn run_csv(result: &RunResult) -> String {
    let mut csv = String::from(
        "protocol,variant,run,subscriber,loss_percent,products,fmtp,backstop,backlog,throughput_mbit_s,\
         p50_ms,p99_ms,feed_products,feed_bytes,egress_htb_bytes,egress_htb_packets,egress_tx_bytes,\
         egress_per_product_byte,egress_ip_per_product_byte,publisher_cpu_s\n",
    );
    for s in &result.subscribers {
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{},{},{},{},{:.4},{:.3},{:.3},{},{},{},{},{},{:.4},{:.4},{:.3}",
            result.protocol.tag(),
            result.variant,
            result.run,
            s.host,
            s.loss_percent,
            s.products,
            s.received,
            s.inserted,
            s.backlog,
            s.throughput_bits_per_s / 1e6,
            s.p50_ms,
            s.p99_ms,
            result.feed_products,
            result.feed_bytes,
            result.egress.htb_bytes,
            result.egress.htb_packets,
            result.egress.tx_bytes,
            result.egress_per_byte(),
            result.egress_ip_per_byte(),
            result.publisher_cpu_s
        );
    }
    csv
}

/// Per plan and subscriber, the median over runs of `pick`.
fn subscriber_medians(plan: &RunPlan, results: &[RunResult], pick: fn(&SubscriberResult) -> f64) -> Vec<f64> {
    let runs: Vec<&RunResult> =
        results.iter().filter(|r| r.protocol == plan.protocol && r.variant == plan.variant).collect();
    (0..plan.losses.len())
        .map(|k| median(runs.iter().filter_map(|r| r.subscribers.get(k)).map(pick).collect()))
        .collect()
}

fn run_median(plan: &RunPlan, results: &[RunResult], pick: fn(&RunResult) -> f64) -> f64 {
    median(results.iter().filter(|r| r.protocol == plan.protocol && r.variant == plan.variant).map(pick).collect())
}

fn summarize(plans: &[RunPlan], results: &[RunResult]) -> String {
    let mut text = String::from("medians over runs\n");
    for plan in plans {
        let throughput = subscriber_medians(plan, results, |s| s.throughput_bits_per_s / 1e6);
        let p50 = subscriber_medians(plan, results, |s| s.p50_ms);
        let p99 = subscriber_medians(plan, results, |s| s.p99_ms);
        let _ = writeln!(
            text,
            "{} {}: egress {:.3} bytes per product byte (IP {:.3}), publisher CPU {:.2} s",
            plan.protocol.name(),
            plan.variant,
            run_median(plan, results, RunResult::egress_per_byte),
            run_median(plan, results, RunResult::egress_ip_per_byte),
            run_median(plan, results, |r| r.publisher_cpu_s)
        );
        for k in 0..plan.losses.len() {
            let _ = writeln!(
                text,
                "  s{} (loss {}%): throughput {} Mbit/s, p50 {:.1} ms, p99 {:.1} ms",
                k + 1,
                plan.losses[k],
                significant(throughput[k]),
                p50[k],
                p99[k]
            );
        }
    }
    let find =
        |protocol: Protocol, variant: &str| plans.iter().find(|p| p.protocol == protocol && p.variant == variant);
    if let (Some(six), Some(seven)) = (find(Protocol::Ldm6, "base"), find(Protocol::Ldm7, "base")) {
        let t6 = subscriber_medians(six, results, |s| s.throughput_bits_per_s);
        let t7 = subscriber_medians(seven, results, |s| s.throughput_bits_per_s);
        let ratios: Vec<f64> = t6.iter().zip(&t7).map(|(a, b)| b / a).collect();
        let _ = writeln!(
            text,
            "LDM-7 / LDM-6 throughput per subscriber: {} (median {:.1}x, min {:.1}x)",
            ratios.iter().map(|r| format!("{r:.1}x")).collect::<Vec<_>>().join(", "),
            median(ratios.clone()),
            ratios.iter().copied().fold(f64::INFINITY, f64::min)
        );
        let e6 = run_median(six, results, RunResult::egress_per_byte);
        let e7 = run_median(seven, results, RunResult::egress_per_byte);
        let _ = writeln!(text, "egress per product byte: LDM-6 {e6:.3}, LDM-7 {e7:.3}");
    }
    if let (Some(quiet), Some(lossy)) = (find(Protocol::Ldm7, "quiet"), find(Protocol::Ldm7, "lossy")) {
        // Per run pair, the others' p99 ratio; then medians.
        let others = quiet.losses.len().saturating_sub(1);
        let mut per_run = Vec::new();
        for (q, l) in
            results.iter().filter(|r| r.variant == "quiet").zip(results.iter().filter(|r| r.variant == "lossy"))
        {
            let ratios: Vec<f64> = (0..others).map(|k| l.subscribers[k].p99_ms / q.subscribers[k].p99_ms).collect();
            per_run.push(median(ratios));
        }
        let _ = writeln!(
            text,
            "others' p99 latency with one subscriber at {}% loss / without: per run {} → median {:.3}",
            lossy.losses.last().copied().unwrap_or(0.0),
            per_run.iter().map(|r| format!("{r:.3}")).collect::<Vec<_>>().join(", "),
            median(per_run.clone())
        );
    }
    text
}

/// Grouped bars: one group per subscriber, one bar per plan.
fn plot_bars(path: &Path, title: &str, y_label: &str, series: &[(String, Vec<f64>)]) -> anyhow::Result<()> {
    use plotters::prelude::*;
    crate::figure::register_font()?;
    let groups = series.iter().map(|(_, values)| values.len()).max().unwrap_or(0);
    let top = series.iter().flat_map(|(_, v)| v.iter().copied()).filter(|v| v.is_finite()).fold(0.0, f64::max);
    let root = BitMapBackend::new(path, (1000, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(20)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..groups as f64, 0f64..(top * 1.15).max(1e-9))
        .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        // Labels every half unit; only the group centres (k + 0.5) are named.
        .x_labels(2 * groups + 1)
        .x_label_formatter(&|x| {
            if (x - x.floor() - 0.5).abs() < 0.01 { format!("s{}", x.floor() as usize + 1) } else { String::new() }
        })
        .y_desc(y_label)
        .label_style(("sans-serif", 15))
        .draw()
        .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    let colors = [RGBColor(200, 80, 60), RGBColor(50, 110, 180), RGBColor(90, 160, 90), RGBColor(150, 100, 170)];
    let width = 0.8 / series.len().max(1) as f64;
    for (index, (name, values)) in series.iter().enumerate() {
        let color = colors[index % colors.len()];
        chart
            .draw_series(values.iter().enumerate().filter(|(_, v)| v.is_finite()).map(|(k, v)| {
                let left = k as f64 + 0.1 + width * index as f64;
                Rectangle::new([(left, 0.0), (left + width * 0.95, *v)], color.filled())
            }))
            .map_err(|e| anyhow::anyhow!("plot: {e}"))?
            .label(name.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled()));
        chart
            .draw_series(values.iter().enumerate().filter(|(_, v)| v.is_finite()).map(|(k, v)| {
                let left = k as f64 + 0.1 + width * index as f64;
                Text::new(significant(*v), (left, *v + top * 0.02), ("sans-serif", 12).into_font())
            }))
            .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    root.present().map_err(|e| anyhow::anyhow!("write {}: {e}", path.display()))?;
    Ok(())
}

fn plot_throughput(path: &Path, plans: &[RunPlan], results: &[RunResult], label: &str) -> anyhow::Result<()> {
    let series: Vec<(String, Vec<f64>)> = plans
        .iter()
        .map(|plan| {
            (plan.protocol.name().to_string(), subscriber_medians(plan, results, |s| s.throughput_bits_per_s / 1e6))
        })
        .collect();
    plot_bars(path, &format!("Per-subscriber throughput (Σ size / Σ latency), {label}"), "Mbit/s", &series)
}

fn plot_p99(path: &Path, plans: &[RunPlan], results: &[RunResult], label: &str) -> anyhow::Result<()> {
    let series: Vec<(String, Vec<f64>)> = plans
        .iter()
        .map(|plan| {
            let name =
                if plan.variant == "lossy" { "LDM-7, last subscriber lossy" } else { "LDM-7, no lossy subscriber" };
            (name.to_string(), subscriber_medians(plan, results, |s| s.p99_ms))
        })
        .collect();
    plot_bars(path, &format!("p99 latency per subscriber, {label}"), "ms", &series)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_specs() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(
            (significant(14.56), significant(0.01594), significant(915.2)),
            ("14.6".into(), "0.0159".into(), "915".into())
        );
        // Nearest rank (ldm7_types::quantile): of an even number of runs, the lower middle one.
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.0);
        assert!(median(vec![f64::NAN]).is_nan());
        let args = CompareOptions {
            rate: "100M".parse().expect("rate"),
            subscribers: 2,
            loss: vec![1.0, 0.0],
            span: Duration::from_secs(60),
            speed: 3.0,
            repeat: 1,
            modes: vec![Protocol::Ldm6, Protocol::Ldm7],
            lossy_neighbour: false,
            retx_share: None,
            parity: ParityChoice::Auto,
            neighbour_loss: 20.0,
            trace: None,
            out: PathBuf::from("out"),
            label: None,
            dir: None,
        };
        let plan = RunPlan { protocol: Protocol::Ldm6, variant: "base".into(), losses: losses(&args).expect("losses") };
        let spec = lab_spec("bc6x", &args, &plan);
        let parsed = ldm7_net::LabSpec::from_toml_str(&spec).expect("a valid lab spec");
        assert_eq!(parsed.hosts.len(), 3);
        assert!(parsed.feeds[0].subscriber_addresses);
        assert_eq!(
            plans(&CompareOptions { lossy_neighbour: true, ..args.clone() }, &plan.losses)[1].losses,
            [1.0, 20.0]
        );
        assert!(losses(&CompareOptions { loss: vec![1.0, 2.0, 3.0], ..args }).is_err());
    }

    #[test]
    fn the_plot_renders_with_the_embedded_font() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("plot.png");
        plot_bars(&path, "test", "Mbit/s", &[("A".into(), vec![1.0, 2.0]), ("B".into(), vec![3.0, f64::NAN])])
            .expect("plot");
        assert!(std::fs::metadata(&path).expect("png").len() > 1000);
    }
}
