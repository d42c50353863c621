//! The research's FMTP figures in the simulator, each in one command, as CSV and PNG
//! (RESEARCH.md §6; results summarized in docs/benchmarks.md):
//!
//! ```text
//! cargo run --release -p ldm7-sim --example figures -- rate      # throughput degradation and sender buffer vs rate
//! cargo run --release -p ldm7-sim --example figures -- rtt       # throughput vs round-trip time
//! cargo run --release -p ldm7-sim --example figures -- timeout   # robustness vs the retransmission timeout factor
//!     [--out experiments/results/sim] [--seed N]
//! ```
//!
//! Throughput is the research's `T = S / L` per subscriber (summed sizes over summed
//! latencies), averaged over the subscribers; degradation is `1 − T / r`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use ldm7_fmtp_proto::{DeadlinePolicy, SenderConfig};
use ldm7_sim::{ContentMode, LossModel, ProductSpec, ReceiverSpec, Report, SimConfig, Simulation, Workload};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Figure {
    /// Throughput degradation and the loss-free sender buffer against the path rate
    /// (20–1000 Mbit/s; ten minutes of the NGRID trace, 8 subscribers, RTT 30 ms).
    Rate,
    /// Throughput against the round-trip time (0.1–100 ms) at 500 Mbit/s, without and with 1% loss.
    Rtt,
    /// Robustness (share of products fully received) against the retransmission timeout factor
    /// at 5% loss, load 0.4 of 100 Mbit/s (100 kB products), 10/20/30 subscribers.
    Timeout,
}

#[derive(Parser)]
#[command(about = "The research's FMTP figures in the simulator")]
struct Args {
    /// Which figure.
    figure: Figure,
    /// Where the CSV and PNG go.
    #[arg(long, default_value = "experiments/results/sim")]
    out: PathBuf,
    /// The trace of the rate and RTT figures (default: the one-hour NGRID trace).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Seconds of the trace used.
    #[arg(long, default_value_t = 600)]
    span_s: u64,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// One series of a figure: a name and its (x, y) points.
type Series = (String, Vec<(f64, f64)>);

fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(error) = std::fs::create_dir_all(&args.out) {
        eprintln!("figures: cannot create {}: {error}", args.out.display());
        return ExitCode::from(1);
    }
    let outcome = match args.figure {
        Figure::Rate => rate(&args),
        Figure::Rtt => rtt(&args),
        Figure::Timeout => timeout(&args),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("figures: {error}");
            ExitCode::from(2)
        }
    }
}

fn trace_span(args: &Args) -> Result<Workload, String> {
    let trace = args
        .trace
        .clone()
        .unwrap_or_else(|| ldm7_testkit::shared_data("traces/unidata_ldm_NGRID_1hr_20150615T00Z.txt"));
    let workload = Workload::from_trace_file(&trace).map_err(|error| error.to_string())?;
    let span = Duration::from_secs(args.span_s);
    Ok(Workload { products: workload.products.into_iter().filter(|product| product.at < span).collect() })
}

/// Runs `subscribers` receivers (`rtt`, `loss`) at `rate`; the report and the mean throughput.
fn simulate(
    seed: u64,
    workload: &Workload,
    subscribers: usize,
    rtt: Duration,
    loss: f64,
    sender: SenderConfig,
) -> Result<(Report, f64), String> {
    let receivers = (0..subscribers)
        .map(|_| {
            let spec = ReceiverSpec::with_rtt(rtt);
            if loss > 0.0 { spec.loss(LossModel::Bernoulli(loss)) } else { spec }
        })
        .collect();
    let mut config = SimConfig::new(seed, receivers);
    config.sender = sender;
    config.content = ContentMode::Pattern;
    let report = Simulation::new(config, workload.clone())
        .map_err(|error| error.to_string())?
        .run()
        .map_err(|failure| failure.to_string())?;
    let bits = workload.total_bytes() as f64 * 8.0;
    let throughput = report
        .receivers
        .iter()
        .map(|receiver| {
            let latency = &receiver.tally.latency;
            bits / (latency.mean().as_secs_f64() * latency.count() as f64).max(1e-9)
        })
        .sum::<f64>()
        / subscribers as f64;
    Ok((report, throughput))
}

fn rate(args: &Args) -> Result<(), String> {
    let workload = trace_span(args)?;
    let arrivals: Vec<ldm7_plan::Arrival> = workload
        .products
        .iter()
        .map(|product| ldm7_plan::Arrival { at_s: product.at.as_secs_f64(), bytes: u64::from(product.size) })
        .collect();
    let rates = [20e6, 40e6, 60e6, 100e6, 200e6, 500e6, 1000e6];
    let buffers = ldm7_plan::sweep(&arrivals, &rates).map_err(|error| error.to_string())?;
    let mut rows = vec!["rate_mbps,throughput_mbps,degradation,buffer_mb,latency_mean_s".to_owned()];
    let (mut degradation, mut buffer) = (Vec::new(), Vec::new());
    for (rate, (_, occupancy)) in rates.iter().zip(&buffers) {
        let (report, throughput) =
            simulate(args.seed, &workload, 8, Duration::from_millis(30), 0.0, SenderConfig::with_rate(*rate as u64))?;
        let lost = 1.0 - throughput / rate;
        let latency = report.latency_of(0..8).mean().as_secs_f64();
        println!(
            "{:>5} Mbit/s: T {:>7.2} Mbit/s, degradation {:>5.1}%, buffer {:>7.1} MB, latency {latency:.3} s",
            rate / 1e6,
            throughput / 1e6,
            lost * 100.0,
            occupancy.buffer_bytes / 1e6
        );
        rows.push(format!(
            "{},{:.3},{:.4},{:.2},{latency:.4}",
            rate / 1e6,
            throughput / 1e6,
            lost,
            occupancy.buffer_bytes / 1e6
        ));
        degradation.push((rate / 1e6, lost * 100.0));
        buffer.push((rate / 1e6, occupancy.buffer_bytes / 1e6));
    }
    write(
        args,
        "rate",
        &rows,
        "Throughput degradation 1 − T/r against rate (8 subscribers, NGRID)",
        "path rate, Mbit/s",
        "%",
        &[("degradation".into(), degradation)],
        true,
    )?;
    write(
        args,
        "rate-buffer",
        &[],
        "Loss-free sender buffer against rate (NGRID)",
        "path rate, Mbit/s",
        "MB",
        &[("buffer".into(), buffer)],
        true,
    )
}

fn rtt(args: &Args) -> Result<(), String> {
    let workload = trace_span(args)?;
    let rtts_ms = [0.1, 1.0, 10.0, 30.0, 100.0];
    let mut rows = vec!["rtt_ms,loss,throughput_mbps,latency_mean_s".to_owned()];
    let mut series: Vec<Series> = Vec::new();
    for loss in [0.0, 0.01] {
        let mut points = Vec::new();
        for &rtt_ms in &rtts_ms {
            let rtt = Duration::from_secs_f64(rtt_ms / 1e3);
            let (report, throughput) =
                simulate(args.seed, &workload, 8, rtt, loss, SenderConfig::with_rate(500_000_000))?;
            let latency = report.latency_of(0..8).mean().as_secs_f64();
            println!(
                "RTT {rtt_ms:>5} ms, loss {:>3}%: T {:>8.2} Mbit/s, latency {latency:.4} s",
                loss * 100.0,
                throughput / 1e6
            );
            rows.push(format!("{rtt_ms},{loss},{:.3},{latency:.5}", throughput / 1e6));
            points.push((rtt_ms, throughput / 1e6));
        }
        series.push((format!("{}% loss", loss * 100.0), points));
    }
    write(
        args,
        "rtt",
        &rows,
        "Throughput T = S/L against RTT at 500 Mbit/s (8 subscribers, NGRID)",
        "RTT, ms",
        "Mbit/s",
        &series,
        true,
    )
}

fn timeout(args: &Args) -> Result<(), String> {
    // 100 kB products at load 0.4 of 100 Mbit/s: one every 20 ms. The deadline is
    // max(f_snd × 8 ms, the largest RTT): a repair takes at least an RTT (30 ms).
    let products = (0..1000).map(|k| ProductSpec { at: Duration::from_millis(20 * k), size: 100_000 }).collect();
    let workload = Workload { products };
    let factors = [1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0];
    let mut rows = vec!["subscribers,f_snd,robustness".to_owned()];
    let mut series: Vec<Series> = Vec::new();
    for subscribers in [10, 20, 30] {
        let mut points = Vec::new();
        for &f_snd in &factors {
            let mut sender = SenderConfig::with_rate(100_000_000);
            sender.deadline = DeadlinePolicy::Proportional { f_snd, min: Duration::ZERO };
            let (report, _) = simulate(args.seed, &workload, subscribers, Duration::from_millis(30), 0.05, sender)?;
            let (delivered, missed): (u64, u64) = report
                .receivers
                .iter()
                .fold((0, 0), |(d, m), receiver| (d + receiver.tally.delivered, m + receiver.tally.missed));
            let robustness = delivered as f64 / (delivered + missed).max(1) as f64;
            println!(
                "{subscribers:>2} subscribers, f_snd {f_snd:>4}: {:.1}% of products fully received",
                robustness * 100.0
            );
            rows.push(format!("{subscribers},{f_snd},{robustness:.4}"));
            points.push((f_snd, robustness * 100.0));
        }
        series.push((format!("{subscribers} subscribers"), points));
    }
    write(
        args,
        "timeout",
        &rows,
        "Robustness against the timeout factor (5% loss, load 0.4)",
        "timeout factor f_snd",
        "% fully received",
        &series,
        true,
    )
}

/// Writes `<name>.csv` (when there are rows) and `<name>.png`.
#[allow(clippy::too_many_arguments)]
fn write(
    args: &Args,
    name: &str,
    rows: &[String],
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    log_x: bool,
) -> Result<(), String> {
    if !rows.is_empty() {
        let path = args.out.join(format!("{name}.csv"));
        let mut file = std::fs::File::create(&path).map_err(|error| format!("{}: {error}", path.display()))?;
        for row in rows {
            writeln!(file, "{row}").map_err(|error| format!("{}: {error}", path.display()))?;
        }
        println!("wrote {}", path.display());
    }
    let path = args.out.join(format!("{name}.png"));
    plot(&path, title, x_label, y_label, series, log_x).map_err(|error| format!("{}: {error}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

fn plot(path: &Path, title: &str, x_label: &str, y_label: &str, series: &[Series], log_x: bool) -> Result<(), String> {
    use plotters::prelude::*;
    // The font the test bed's figures are drawn with (it owns the asset).
    ldm7_testbed::figure::register_font().map_err(|error| error.to_string())?;
    let fail = |error: &dyn std::fmt::Display| error.to_string();
    let points = series.iter().flat_map(|(_, points)| points.iter());
    let (x_low, x_high, y_high) =
        points.fold((f64::INFINITY, 0.0f64, 0.0f64), |(low, high, top), &(x, y)| (low.min(x), high.max(x), top.max(y)));
    let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let mut builder = ChartBuilder::on(&root);
    builder.caption(title, ("sans-serif", 20)).margin(15).x_label_area_size(40).y_label_area_size(60);
    let colors = [RGBColor(50, 110, 180), RGBColor(200, 80, 60), RGBColor(90, 160, 90), RGBColor(150, 100, 170)];
    macro_rules! draw {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc(x_label)
                .y_desc(y_label)
                .label_style(("sans-serif", 14))
                .draw()
                .map_err(|e| fail(&e))?;
            for (index, (name, points)) in series.iter().enumerate() {
                let color = colors[index % colors.len()];
                chart
                    .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))
                    .map_err(|e| fail(&e))?
                    .label(name.clone())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
                chart
                    .draw_series(points.iter().map(|&point| Circle::new(point, 4, color.filled())))
                    .map_err(|e| fail(&e))?;
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .label_font(("sans-serif", 14))
                .draw()
                .map_err(|e| fail(&e))?;
        }};
    }
    let y_range = 0f64..(y_high * 1.1).max(1e-9);
    if log_x {
        draw!(builder.build_cartesian_2d((x_low * 0.8..x_high * 1.25).log_scale(), y_range).map_err(|e| fail(&e))?);
    } else {
        draw!(builder.build_cartesian_2d(x_low..x_high, y_range).map_err(|e| fail(&e))?);
    }
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}
