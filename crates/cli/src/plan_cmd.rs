//! `ldm7 plan`: a feed's path rate and sender buffer per holding interval, from a trace or a
//! product queue (RESEARCH.md §4; the recurrences: `ldm7_plan`; docs/planning.md).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ldm7_plan::{Arrival, IntervalPlan, Occupancy, PlanConfig};
use ldm7_types::{FeedType, Rate, Timestamp};

use crate::exit::{CmdResult, bad_input, runtime};

/// Arguments of `ldm7 plan`.
#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// A trace: `SIZE YYYYMMDDhhmmss.fff [FEED]` per line.
    #[arg(long, value_name = "FILE", required_unless_present_any = ["queue", "idd"], conflicts_with_all = ["queue", "idd"])]
    pub trace: Option<PathBuf>,
    /// A product queue: the creation times and sizes of its products.
    #[arg(short = 'q', long, value_name = "PATH", conflicts_with = "idd")]
    pub queue: Option<PathBuf>,
    /// Every feed of a generated IDD stretch (the workload model: --set, --only, --duration,
    /// --scale, --seed as `ldm7 trace generate` takes them), one plan per feed.
    #[arg(long)]
    pub idd: bool,
    #[command(flatten)]
    pub model: crate::trace_cmd::IddArgs,
    /// Only the products of this feed (a trace's feed column, or the queue's products).
    #[arg(short = 'f', long, value_name = "FEED")]
    pub feed: Option<FeedType>,
    /// The holding interval: how long a path rate is held.
    #[arg(long, default_value = "1h", value_parser = crate::common::duration_arg)]
    pub interval: Duration,
    /// W: the longest a product may wait for the sender.
    #[arg(long, default_value = "2ms", value_parser = crate::common::duration_arg)]
    pub wait: Duration,
    /// The smallest rate considered.
    #[arg(long, default_value = "1M")]
    pub rate_min: Rate,
    /// The path's ceiling.
    #[arg(long, default_value = "10G")]
    pub rate_max: Rate,
    /// Rates are multiples of this (a path is set up in steps).
    #[arg(long, default_value = "1M")]
    pub rate_step: Rate,
    /// Rates of the buffer-against-rate table (the whole trace at one rate), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "20M,40M,60M,100M,200M,500M,1G")]
    pub sweep: Vec<Rate>,
    /// Write the intervals as CSV to this file.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Draw rate and buffer against time into this PNG file.
    #[arg(long, value_name = "FILE")]
    pub png: Option<PathBuf>,
    /// Subscribers the repairs are planned for (the publisher's `subscribers_max`).
    #[arg(long, default_value_t = ldm7_fmtp::PLANNED_SUBSCRIBERS_DEFAULT)]
    pub subscribers: u32,
    /// Each subscriber's loss, a share (the publisher's `parity_loss`).
    #[arg(long, default_value_t = ldm7_fmtp::PLANNED_LOSS_DEFAULT)]
    pub loss: f64,
    /// How losses are repaired: `auto` (parity as ldm7 peers negotiate it), GROUP/SHARDS, or
    /// `off` (unicast retransmissions, as with reference subscribers).
    #[arg(long, value_name = "auto|off|GROUP/SHARDS", default_value = "auto")]
    pub parity: ldm7_fmtp::ParityChoice,
    /// The longest time a subscriber's host may not read the multicast (its `receive_gap`).
    #[arg(long, default_value = "500ms", value_parser = crate::common::duration_arg)]
    pub receive_gap: Duration,
}

impl PlanArgs {
    /// The repair budget of the planned subscribers at the planned loss.
    fn repairs(&self) -> (String, ldm7_plan::RepairBudget) {
        let repair = match self.parity.resolve(self.subscribers, self.loss) {
            Some(parity) => ldm7_plan::Repair::Parity { group_blocks: parity.group_blocks, shards: parity.shards },
            None => ldm7_plan::Repair::Unicast,
        };
        let how = match repair {
            ldm7_plan::Repair::Parity { group_blocks, shards } => format!("parity {group_blocks}/{shards}"),
            ldm7_plan::Repair::Unicast => "unicast retransmissions".to_owned(),
        };
        (how, ldm7_plan::repair_budget(self.subscribers, self.loss, repair))
    }

    /// What repairs add to a data rate, and the receive buffer a subscriber needs at the
    /// resulting path rate (docs/planning.md "Repairs"). `at_ceiling`: the rate is the ceiling
    /// because W could not be met, which the lines say (a buffer for the ceiling is no plan).
    fn repair_lines(&self, data_rate_bps: f64, at_ceiling: bool) -> String {
        let (how, budget) = self.repairs();
        let path_rate = data_rate_bps * (1.0 + budget.share);
        let buffer = ldm7_plan::repair::receive_buffer_bytes(path_rate, self.receive_gap.as_secs_f64())
            .max(4.0 * 1024.0 * 1024.0);
        format!(
            "repairs   {} subscribers at {}% loss, {how}: {:.2}% of the data ({:.2}% by unicast); the path needs \
             {} Mbit/s for {} Mbit/s of data; HTB repair share (lab retx_share) {:.3}\n\
             receive   each subscriber's buffer for a {} gap at {} Mbit/s: {:.1} MB (receive_gap in ldm7.toml; \
             above net.core.rmem_max it needs root, else `sysctl -w net.core.rmem_max={}`)\n",
            self.subscribers,
            self.loss * 100.0,
            budget.share * 100.0,
            budget.unicast_share * 100.0,
            mbit(path_rate),
            mbit(data_rate_bps),
            budget.path_share(),
            ldm7_types::units::format_duration(self.receive_gap),
            mbit(path_rate),
            buffer / 1e6,
            buffer.ceil() as u64
        ) + if at_ceiling {
            "          (for the ceiling, as W is not met: give a larger --wait to plan these for the rate the feed needs)\n"
        } else {
            ""
        }
    }
}

/// The products to plan for, in time order.
struct Offered {
    /// What they are ("NGRID from trace …").
    what: String,
    /// When the first arrived (time 0 of the arrivals).
    start: Timestamp,
    arrivals: Vec<Arrival>,
    /// How many came before the product before them (put in order).
    reordered: usize,
    /// The feed's name, when planning several.
    feed: Option<&'static str>,
}

/// Runs `ldm7 plan`.
pub fn run(args: &PlanArgs) -> CmdResult {
    let config = PlanConfig {
        interval_s: args.interval.as_secs_f64(),
        wait_max_s: args.wait.as_secs_f64(),
        rate_min_bps: args.rate_min.bits_per_s() as f64,
        rate_max_bps: args.rate_max.bits_per_s() as f64,
        rate_step_bps: args.rate_step.bits_per_s() as f64,
    };
    let offered = match (&args.trace, &args.queue) {
        (Some(trace), _) => from_trace(trace, args.feed)?,
        (None, Some(queue)) => from_queue(queue, args.feed)?,
        (None, None) if args.idd => {
            let mut feeds = from_model(&args.model)?;
            if feeds.len() > 1 {
                return plan_feeds(args, &config, &feeds);
            }
            feeds.pop().ok_or_else(|| bad_input("no feeds to plan for"))?
        }
        (None, None) => return Err(bad_input("give --trace FILE, --queue PATH or --idd")),
    };
    if offered.arrivals.is_empty() {
        return Err(bad_input(format!("{}: no products to plan for", offered.what)));
    }
    let plans = ldm7_plan::plan(&offered.arrivals, &config).map_err(bad_input)?;
    let rates: Vec<f64> = args.sweep.iter().map(|rate| rate.bits_per_s() as f64).collect();
    let sweep = ldm7_plan::sweep(&offered.arrivals, &rates).map_err(bad_input)?;
    print!("{}", summary(&offered, args, &plans, &sweep));
    let busiest = plans.iter().map(|plan| plan.held_rate_bps).fold(0.0, f64::max);
    let at_ceiling = plans.iter().any(|plan| plan.rate_bps.is_none());
    print!("\n{}", args.repair_lines(busiest, at_ceiling));
    if let Some(path) = &args.csv {
        write_csv(path, &[(None, offered.start, &plans)]).map_err(runtime)?;
        println!("intervals written to {}", path.display());
    }
    if let Some(path) = &args.png {
        draw(path, &offered.what, &plans).map_err(runtime)?;
        println!("plot written to {}", path.display());
    }
    Ok(())
}

fn from_trace(path: &Path, feed: Option<FeedType>) -> CmdResult<Offered> {
    let products = ldm7_testbed::trace::read_trace(path).map_err(bad_input)?;
    let named = ldm7_types::trace::feed_from_name(path);
    // A product without a feed column is of the feed the trace is about.
    let times: Vec<(i64, u64)> = products
        .iter()
        .filter(|product| feed.is_none_or(|feed| product.feed.or(named).is_none_or(|own| feed.intersects(own))))
        .map(|product| (product.created.as_unix_micros(), u64::from(product.size)))
        .collect();
    // Else the feed every product's column names, if they all name one.
    let column = products
        .first()
        .and_then(|first| first.feed)
        .filter(|&only| products.iter().all(|product| product.feed == Some(only)));
    let about = feed.or(named).or(column).map_or_else(|| "products".to_owned(), |feed| feed.to_string());
    let name = path.file_name().map_or_else(|| path.display().to_string(), |name| name.to_string_lossy().into_owned());
    Ok(offered(format!("{about} of trace {name}"), times))
}

/// Each feed of a generated IDD stretch (ldm7_sim::idd).
fn from_model(args: &crate::trace_cmd::IddArgs) -> CmdResult<Vec<Offered>> {
    let config = args.config()?;
    let trace = ldm7_sim::idd::IddTrace::generate(&config);
    let start = Timestamp::from_unix_micros(MODEL_START_UNIX_S * 1_000_000);
    Ok(trace
        .feeds
        .iter()
        .enumerate()
        .map(|(index, (model, _))| {
            let times = trace
                .workload(index)
                .products
                .iter()
                .map(|product| {
                    let micros = i64::try_from(product.at.as_micros()).unwrap_or(i64::MAX);
                    (start.as_unix_micros().saturating_add(micros), u64::from(product.size))
                })
                .collect();
            let what = format!(
                "{} of a generated {} stretch ({}, seed {})",
                model.name,
                args.set.name(),
                ldm7_types::units::format_duration(args.duration),
                args.seed
            );
            let mut offered = offered(what, times);
            offered.feed = Some(model.name);
            offered
        })
        .collect())
}

/// Where generated stretches start: 2018-11-13 13:00:00Z, the hour of the all-feed window.
const MODEL_START_UNIX_S: i64 = 1_542_114_000;

/// `ldm7 plan --idd` over several feeds: a line per feed (its busiest interval), then the sum.
fn plan_feeds(args: &PlanArgs, config: &PlanConfig, feeds: &[Offered]) -> CmdResult {
    if args.png.is_some() {
        return Err(bad_input("--png draws one feed: add --only FEED"));
    }
    let mut planned = Vec::new();
    for feed in feeds {
        let plans = if feed.arrivals.is_empty() {
            Vec::new()
        } else {
            ldm7_plan::plan(&feed.arrivals, config).map_err(bad_input)?
        };
        planned.push(plans);
    }
    println!(
        "plan      every feed of a generated {} stretch ({}, seed {}{}): W = {}; holding interval {}; rates {} to {} in steps of {}",
        args.model.set.name(),
        ldm7_types::units::format_duration(args.model.duration),
        args.model.seed,
        if args.model.scale == 1.0 { String::new() } else { format!(", rates ×{}", args.model.scale) },
        ldm7_types::units::format_duration(args.wait),
        ldm7_types::units::format_duration(args.interval),
        args.rate_min,
        args.rate_max,
        args.rate_step
    );
    println!("(per feed, the busiest holding interval: the largest R_k and B_k over the intervals)");
    println!("feed         products        GB   offered Mbit/s   R_k Mbit/s   B_k MB   longest wait");
    let (mut products, mut bytes, mut rate_sum, mut buffer_sum, mut unmet) = (0usize, 0u64, 0.0f64, 0.0f64, 0usize);
    for (feed, plans) in feeds.iter().zip(&planned) {
        let feed_bytes: u64 = feed.arrivals.iter().map(|arrival| arrival.bytes).sum();
        let span = plans.last().map_or(0.0, |plan| plan.end_s);
        let rate = plans.iter().map(|plan| plan.held_rate_bps).fold(0.0, f64::max);
        let buffer = plans.iter().map(|plan| plan.buffer_bytes).fold(0.0, f64::max);
        let wait = plans.iter().map(|plan| plan.wait_max_s).fold(0.0, f64::max);
        let feed_unmet = plans.iter().filter(|plan| plan.rate_bps.is_none()).count();
        products += feed.arrivals.len();
        bytes += feed_bytes;
        rate_sum += rate;
        buffer_sum += buffer;
        unmet += feed_unmet;
        println!(
            "{:<11} {:>9} {:>9.3} {:>16.2} {:>12} {:>8.2} {:>14}",
            feed.feed.unwrap_or("?"),
            feed.arrivals.len(),
            feed_bytes as f64 / 1e9,
            if span > 0.0 { feed_bytes as f64 * 8.0 / span / 1e6 } else { 0.0 },
            if feed_unmet > 0 { format!("> {}", mbit(rate)) } else { mbit(rate) },
            buffer / 1e6,
            seconds(wait)
        );
    }
    println!(
        "{:<11} {:>9} {:>9.3} {:>16} {:>12} {:>8.2}",
        "all feeds",
        products,
        bytes as f64 / 1e9,
        "",
        if unmet > 0 { format!("> {}", mbit(rate_sum)) } else { mbit(rate_sum) },
        buffer_sum / 1e6
    );
    if unmet > 0 {
        println!(
            "{unmet} feed interval(s) cannot meet W under the ceiling {}: their figures are at the ceiling (a product \
             arriving just behind a large one waits for it at any rate; give a larger --wait or --rate-max)",
            args.rate_max
        );
    }
    // Each feed is its own group and path: the repairs scale each; summed here.
    print!("{}", args.repair_lines(rate_sum, unmet > 0));
    if let Some(path) = &args.csv {
        let rows: Vec<(Option<&str>, Timestamp, &[IntervalPlan])> =
            feeds.iter().zip(&planned).map(|(feed, plans)| (feed.feed, feed.start, plans.as_slice())).collect();
        write_csv(path, &rows).map_err(runtime)?;
        println!("intervals written to {}", path.display());
    }
    Ok(())
}

fn from_queue(path: &Path, feed: Option<FeedType>) -> CmdResult<Offered> {
    let queue = crate::common::open_queue(path)?;
    let snapshot = queue.snapshot().map_err(runtime)?;
    let mut times = Vec::new();
    for product in snapshot.products_from(Timestamp::ZERO).map_err(runtime)? {
        let product = product.map_err(runtime)?;
        let info = &product.info;
        if feed.is_none_or(|feed| feed.intersects(info.feedtype))
            && !ldm7_metrics::StatsProduct::is_stats_ident(&info.ident)
        {
            times.push((info.arrival.as_unix_micros(), u64::from(info.size)));
        }
    }
    let about = feed.map_or_else(|| "products".to_owned(), |feed| feed.to_string());
    Ok(offered(format!("{about} of queue {}", path.display()), times))
}

/// Puts `(creation µs, size)` pairs in time order (a stable sort keeps equal times in file
/// order) as arrivals from the first.
fn offered(what: String, mut times: Vec<(i64, u64)>) -> Offered {
    let reordered = times.windows(2).filter(|pair| pair[1].0 < pair[0].0).count();
    times.sort_by_key(|&(micros, _)| micros);
    let first = times.first().map_or(0, |&(micros, _)| micros);
    let arrivals =
        times.iter().map(|&(micros, bytes)| Arrival { at_s: (micros - first) as f64 / 1e6, bytes }).collect();
    Offered { what, start: Timestamp::from_unix_micros(first), arrivals, reordered, feed: None }
}

fn summary(offered: &Offered, args: &PlanArgs, plans: &[IntervalPlan], sweep: &[(f64, Occupancy)]) -> String {
    let bytes: u64 = offered.arrivals.iter().map(|arrival| arrival.bytes).sum();
    let span = offered.arrivals.last().map_or(0.0, |arrival| arrival.at_s);
    let mut text = format!(
        "plan      {}: {} products, {:.2} GB over {:.1} min from {}",
        offered.what,
        offered.arrivals.len(),
        bytes as f64 / 1e9,
        span / 60.0,
        utc(offered.start)
    );
    if offered.reordered > 0 {
        text.push_str(&format!(" ({} put in time order)", offered.reordered));
    }
    text.push_str(&format!(
        "\nsettings  W = {}; holding interval {}; rates {} to {} in steps of {}\n",
        ldm7_types::units::format_duration(args.wait),
        ldm7_types::units::format_duration(args.interval),
        args.rate_min,
        args.rate_max,
        args.rate_step
    ));
    text.push_str(
        "interval (from the start)      products        GB   offered Mbit/s   R_k Mbit/s   B_k MB   longest wait\n",
    );
    for plan in plans {
        let rate = plan.rate_bps.map_or_else(|| format!("> {}", mbit(plan.held_rate_bps)), mbit);
        text.push_str(&format!(
            "[{} – {})   {:>9} {:>9.3} {:>16.2} {:>12} {:>8.2} {:>14}\n",
            clock(plan.start_s),
            clock(plan.end_s),
            plan.products,
            plan.bytes as f64 / 1e9,
            plan.offered_bps() / 1e6,
            rate,
            plan.buffer_bytes / 1e6,
            seconds(plan.wait_max_s)
        ));
    }
    let unmet = plans.iter().filter(|plan| plan.rate_bps.is_none()).count();
    if unmet > 0 {
        text.push_str(&format!(
            "{unmet} interval(s) cannot meet W under the ceiling {}: their figures are at the ceiling (a product \
             arriving just behind a large one waits for it at any rate: see the longest waits below, or give a \
             larger --wait or --rate-max)\n",
            args.rate_max
        ));
    }
    text.push_str("the whole span at one rate:\n      rate     buffer MB   longest wait\n");
    for (rate, occupancy) in sweep {
        text.push_str(&format!(
            "{:>10}  {:>12.2}  {:>13}\n",
            Rate::from_bits_per_s(*rate as u64).to_string(),
            occupancy.buffer_bytes / 1e6,
            seconds(occupancy.wait_max_s)
        ));
    }
    text
}

fn mbit(bps: f64) -> String {
    format!("{:.0}", bps / 1e6)
}

fn seconds(value: f64) -> String {
    if value < 1.0 { format!("{:.2} ms", value * 1e3) } else { format!("{value:.2} s") }
}

/// `hh:mm:ss` of an offset in seconds.
fn clock(offset_s: f64) -> String {
    let total = offset_s.round() as u64;
    format!("{:02}:{:02}:{:02}", total / 3600, total / 60 % 60, total % 60)
}

/// `YYYY-MM-DD hh:mm:ssZ`.
fn utc(time: Timestamp) -> String {
    let text = time.to_string();
    match (text.get(0..4), text.get(4..6), text.get(6..8), text.get(8..10), text.get(10..12), text.get(12..14)) {
        (Some(year), Some(month), Some(day), Some(hour), Some(minute), Some(second)) => {
            format!("{year}-{month}-{day} {hour}:{minute}:{second}Z")
        }
        _ => text,
    }
}

/// The intervals as CSV: one feed's (`None`: no feed column), or several feeds' with a first
/// column naming the feed.
fn write_csv(path: &Path, feeds: &[(Option<&str>, Timestamp, &[IntervalPlan])]) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(path).map_err(|error| anyhow::anyhow!("cannot write {}: {error}", path.display()))?,
    );
    let named = feeds.iter().any(|(feed, _, _)| feed.is_some());
    writeln!(
        out,
        "{}start_unix_s,start_s,end_s,products,bytes,offered_bps,rate_bps,held_rate_bps,buffer_bytes,wait_max_s,backlog_in_bytes",
        if named { "feed," } else { "" }
    )?;
    for &(feed, start, plans) in feeds {
        let origin = start.as_unix_micros() as f64 / 1e6;
        let prefix = if named { format!("{},", feed.unwrap_or("")) } else { String::new() };
        for plan in plans {
            writeln!(
                out,
                "{prefix}{:.3},{},{},{},{},{:.0},{},{:.0},{:.0},{:.6},{:.0}",
                origin + plan.start_s,
                plan.start_s,
                plan.end_s,
                plan.products,
                plan.bytes,
                plan.offered_bps(),
                plan.rate_bps.map_or_else(String::new, |rate| format!("{rate:.0}")),
                plan.held_rate_bps,
                plan.buffer_bytes,
                plan.wait_max_s,
                plan.backlog_in_bytes
            )?;
        }
    }
    out.flush()?;
    Ok(())
}

/// Rate (and offered load) and buffer against time, one step per interval.
fn draw(path: &Path, what: &str, plans: &[IntervalPlan]) -> anyhow::Result<()> {
    use plotters::prelude::*;
    ldm7_testbed::figure::register_font()?;
    let fail = |error: &dyn std::fmt::Display| anyhow::anyhow!("plot: {error}");
    let end_h = plans.last().map_or(1.0, |plan| plan.end_s / 3600.0);
    let steps = |value: &dyn Fn(&IntervalPlan) -> f64| -> Vec<(f64, f64)> {
        plans
            .iter()
            .flat_map(|plan| [(plan.start_s / 3600.0, value(plan)), (plan.end_s / 3600.0, value(plan))])
            .collect()
    };
    let rates = steps(&|plan| plan.held_rate_bps / 1e6);
    let offered = steps(&|plan| (plan.offered_bps() / 1e6).max(1e-3));
    let buffers = steps(&|plan| plan.buffer_bytes / 1e6);
    let top_rate = rates.iter().chain(&offered).map(|point| point.1).fold(1.0, f64::max) * 2.0;
    let low_rate = rates.iter().chain(&offered).map(|point| point.1).fold(f64::INFINITY, f64::min).max(1e-3) / 2.0;
    let top_buffer = buffers.iter().map(|point| point.1).fold(0.0, f64::max).max(1e-3) * 1.15;

    let root = BitMapBackend::new(path, (1000, 760)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let (upper, lower) = root.split_vertically(380);
    let mut chart = ChartBuilder::on(&upper)
        .caption(format!("Path rate R_k — {what}"), ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..end_h, (low_rate..top_rate).log_scale())
        .map_err(|e| fail(&e))?;
    chart
        .configure_mesh()
        .x_desc("hours from the start")
        .y_desc("Mbit/s")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| fail(&e))?;
    let blue = RGBColor(50, 110, 180);
    let grey = RGBColor(150, 150, 150);
    chart
        .draw_series(LineSeries::new(rates, blue.stroke_width(2)))
        .map_err(|e| fail(&e))?
        .label("R_k (smallest rate meeting W)")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], blue.stroke_width(2)));
    chart
        .draw_series(LineSeries::new(offered, grey.stroke_width(1)))
        .map_err(|e| fail(&e))?
        .label("offered load")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], grey.stroke_width(1)));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| fail(&e))?;
    let mut chart = ChartBuilder::on(&lower)
        .caption("Loss-free sender buffer B_k at R_k", ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..end_h, 0f64..top_buffer)
        .map_err(|e| fail(&e))?;
    chart
        .configure_mesh()
        .x_desc("hours from the start")
        .y_desc("MB")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| fail(&e))?;
    chart.draw_series(LineSeries::new(buffers, RGBColor(200, 80, 60).stroke_width(2))).map_err(|e| fail(&e))?;
    root.present().map_err(|e| anyhow::anyhow!("write {}: {e}", path.display()))?;
    Ok(())
}
