//! Traces replayed into queues: synthetic products shaped like a trace's, inserted at the
//! trace's pace, so that a product's creation time is its insertion time at the publisher.
//!
//! - [`replay_into`]: the replay itself, in this process (`ldm7 insert --replay` and the demo
//!   run it), with its per-product log lines and progress bar.
//! - [`Replay`]: `ldm7 insert --replay` in the background (a process of its own, as an
//!   operator's `pqinsert` would be), and the summary line it prints read back
//!   ([`ReplaySummary`]; [`ReplayTotals`] writes it).
//! - [`now`] and [`origin`]: the arrival time and the origin of products inserted here.

use std::fmt;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use indicatif::{ProgressBar, ProgressStyle};
use ldm7_io::log_target::PRODUCT;
use ldm7_pq::{InsertOutcome, Queue};
use ldm7_types::trace::TraceProduct;
use ldm7_types::{FeedType, ProdInfo, Signature, Timestamp};

use crate::{Result, RunError, TestbedError, io_error};

/// What to replay.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    /// The trace (`SIZE YYYYMMDDhhmmss.fff [FEED]` lines).
    pub trace: PathBuf,
    /// Only the trace's first span of trace time (`None`: all of it).
    pub span: Option<Duration>,
    /// Replay speed (1 = the trace's pace, 0 = as fast as possible).
    pub speed: f64,
    /// Seed of the synthetic contents (another seed gives other signatures).
    pub seed: u64,
    /// At most this many products.
    pub limit: Option<usize>,
}

impl ReplayOptions {
    /// All of `trace` at `speed`, seed 1.
    pub fn new(trace: &Path, speed: f64) -> Self {
        Self { trace: trace.to_path_buf(), span: None, speed, seed: 1, limit: None }
    }
}

/// What `ldm7 insert --replay` reported.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReplaySummary {
    /// Products inserted.
    pub products: u64,
    /// Seconds the replay took.
    pub seconds: f64,
}

/// A replay under way.
#[derive(Debug)]
pub struct Replay {
    queue: PathBuf,
    child: Option<Child>,
}

impl Replay {
    /// Starts replaying into `queue` with `exe insert`.
    pub fn start(exe: &Path, queue: &Path, options: &ReplayOptions) -> Result<Replay> {
        let mut command = Command::new(exe);
        command.arg("insert").arg("-q").arg(queue).arg("--replay").arg(&options.trace);
        command.args(["--speed", &options.speed.to_string(), "--seed", &options.seed.to_string()]);
        if let Some(span) = options.span {
            command.args(["--span", &format!("{}ms", span.as_millis())]);
        }
        if let Some(limit) = options.limit {
            command.args(["--limit", &limit.to_string()]);
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(io_error(format!("start {} insert", exe.display())))?;
        Ok(Replay { queue: queue.to_path_buf(), child: Some(child) })
    }

    /// Waits for the replay to finish and returns its summary.
    pub fn wait(mut self) -> Result<ReplaySummary> {
        let Some(child) = self.child.take() else {
            return Err(TestbedError::Replay { queue: self.queue.clone(), message: "already waited for".into() });
        };
        let output = child.wait_with_output().map_err(io_error("wait for ldm7 insert"))?;
        let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        let failure = |message: String| TestbedError::Replay { queue: self.queue.clone(), message };
        if !output.status.success() {
            return Err(failure(format!("exited with {}: {}", output.status, text.trim())));
        }
        parse_summary(&text).ok_or_else(|| failure(format!("no summary line in {:?}", text.trim())))
    }
}

impl Drop for Replay {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Reads `replayed N products (X MB) in S s: …`.
fn parse_summary(text: &str) -> Option<ReplaySummary> {
    let line = text.lines().find(|line| line.starts_with("replayed "))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let products = words.get(1)?.parse().ok()?;
    let at = words.iter().position(|word| *word == "in")?;
    let seconds = words.get(at + 1)?.parse().ok()?;
    Some(ReplaySummary { products, seconds })
}

/// Now, from the system clock.
pub fn now() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

/// The local host name as LDM uses it for the origin (at most 64 bytes).
pub fn origin() -> String {
    let mut name = hostname::get().ok().and_then(|name| name.into_string().ok()).unwrap_or_else(|| "localhost".into());
    while name.len() > ldm7_types::ORIGIN_LEN_MAX {
        name.pop();
    }
    name
}

/// Totals of a replay by [`replay_into`].
#[derive(Debug, Default, Clone, Copy)]
pub struct ReplayTotals {
    /// Products inserted.
    pub inserted: u64,
    /// Bytes of data inserted.
    pub bytes: u64,
    /// Products refused as duplicates.
    pub duplicates: u64,
    /// Old products evicted to make room.
    pub evicted: u64,
    /// Wall time.
    pub elapsed: Duration,
}

/// The summary line `ldm7 insert --replay` prints (read back by [`Replay::wait`]).
impl fmt::Display for ReplayTotals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        write!(
            f,
            "replayed {} products ({:.1} MB) in {:.2} s: {:.0} products/s, {:.1} MB/s; {} duplicates, {} evicted",
            self.inserted,
            self.bytes as f64 / 1e6,
            secs,
            self.inserted as f64 / secs,
            self.bytes as f64 / 1e6 / secs,
            self.duplicates,
            self.evicted
        )
    }
}

/// Inserts synthetic products shaped like `products` into `queue`, paced at `speed` (0 = no
/// pacing). Each product's data is pseudo-random (seeded: `ldm7_types::content`) and unique; its signature is the MD5
/// of the data. The ident is `<FEED>/<trace name>/<line> <creation time>`. With
/// `log_products = Some(with_signature)` each inserted product is logged (shown with `-v`) and a
/// progress bar is drawn on a terminal; `None` is silent.
///
/// A product that cannot fit the queue is bad input ([`RunError::Input`], before anything is
/// inserted); a failed insert a runtime failure.
#[allow(clippy::too_many_arguments)]
pub fn replay_into(
    queue: &Queue,
    trace: &Path,
    products: &[TraceProduct],
    default_feed: FeedType,
    force_feed: bool,
    speed: f64,
    seed: u64,
    log_products: Option<bool>,
) -> Result<ReplayTotals, RunError> {
    let trace_name = trace.file_stem().map(|stem| stem.to_string_lossy().into_owned()).unwrap_or_default();
    let largest = products.iter().map(|product| product.size as usize).max().unwrap_or(0);
    for product in products {
        let info = info_for(product, default_feed, force_feed, &trace_name, Signature::default(), Timestamp::ZERO);
        queue
            .check_fits(&info)
            .map_err(|error| RunError::Input(format!("{}:{}: {error}", trace.display(), product.line)))?;
    }
    let total_bytes: u64 = products.iter().map(|product| u64::from(product.size)).sum();
    let progress = if log_products.is_some() && std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(total_bytes);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    let origin = origin();
    let start = Instant::now();
    let first_created = products.first().map(|product| product.created.as_unix_micros()).unwrap_or(0);
    let mut summary = ReplayTotals::default();
    let mut data = Vec::with_capacity(largest);
    for (index, product) in products.iter().enumerate() {
        if speed > 0.0 {
            let offset_secs = (product.created.as_unix_micros() - first_created).max(0) as f64 / 1e6 / speed;
            let due = start + Duration::from_secs_f64(offset_secs);
            let wait = due.saturating_duration_since(Instant::now());
            if !wait.is_zero() {
                std::thread::sleep(wait);
            }
        }
        // The workspace's one content generator: product `index` of the run `seed`.
        data.resize(product.size as usize, 0);
        ldm7_types::content::fill(ldm7_types::content::product_seed(seed, index as u64), 0, &mut data);
        let mut info = info_for(product, default_feed, force_feed, &trace_name, Signature::md5_of(&data), now());
        info.origin.clone_from(&origin);
        match queue.insert(&info, &data) {
            Ok(InsertOutcome::Inserted { evicted, .. }) => {
                if let Some(with_signature) = log_products {
                    progress.suspend(|| tracing::info!(target: PRODUCT, "{}", info.line(with_signature)));
                }
                summary.inserted += 1;
                summary.bytes += u64::from(product.size);
                summary.evicted += u64::from(evicted);
            }
            Ok(InsertOutcome::Duplicate { .. }) => summary.duplicates += 1,
            Err(error) => {
                progress.abandon();
                return Err(RunError::Runtime(anyhow::anyhow!(
                    "{}:{}: inserting failed after {} products: {error}",
                    trace.display(),
                    product.line,
                    summary.inserted
                )));
            }
        }
        progress.inc(u64::from(product.size));
        if index % 256 == 0 {
            progress.set_message(format!("{} products", index + 1));
        }
    }
    progress.finish_and_clear();
    summary.elapsed = start.elapsed();
    Ok(summary)
}

fn info_for(
    product: &TraceProduct,
    default_feed: FeedType,
    force_feed: bool,
    trace_name: &str,
    signature: Signature,
    arrival: Timestamp,
) -> ProdInfo {
    let feedtype = if force_feed { default_feed } else { product.feed.unwrap_or(default_feed) };
    let mut ident = format!("{feedtype}/{trace_name}/{} {}", product.line, product.created);
    ident.truncate(ldm7_types::IDENT_LEN_MAX);
    ProdInfo {
        arrival,
        signature,
        origin: String::new(),
        feedtype,
        seqno: product.line as u32,
        ident,
        size: product.size,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_line_is_read() {
        let text = "replayed 575 products (66.1 MB) in 11.94 s: 48 products/s, 5.5 MB/s; 0 duplicates, 0 evicted\n";
        assert_eq!(parse_summary(text), Some(ReplaySummary { products: 575, seconds: 11.94 }));
        assert_eq!(parse_summary("nothing"), None);
    }

    #[test]
    fn the_summary_line_written_is_the_one_read() {
        let totals = ReplayTotals {
            inserted: 575,
            bytes: 66_100_000,
            duplicates: 0,
            evicted: 0,
            elapsed: Duration::from_millis(11_940),
        };
        let line = totals.to_string();
        assert_eq!(
            line,
            "replayed 575 products (66.1 MB) in 11.94 s: 48 products/s, 5.5 MB/s; 0 duplicates, 0 evicted"
        );
        assert_eq!(parse_summary(&line), Some(ReplaySummary { products: 575, seconds: 11.94 }));
    }
}
