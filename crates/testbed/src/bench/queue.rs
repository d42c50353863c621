//! `ldm7 bench queue`: insert and read rates of the product queue for 1 kB, 30 kB and 1 MB
//! products, and the cross-process wake-up latency of a reader, each beside a baseline
//! measured in the same run on the same machine (STYLE.md rule 8):
//!
//! - inserts: the same bytes appended to a plain file with `write(2)` (what the disk path
//!   costs without a queue);
//! - wake-up: a byte sent through a pipe to a blocked process (the cheapest cross-process
//!   wake-up the kernel offers).
//!
//! Signatures are precomputed so that the rate is the queue's, not MD5's; the MD5 rate of the
//! same data is printed beside it for context. Every figure is the median of `--repeat` runs.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use ldm7_pq::{Capacity, Queue};
use ldm7_types::{FeedType, ProdInfo, Signature, Timestamp};

/// What `ldm7 bench queue` measures.
#[derive(Debug, Clone)]
pub struct QueueOptions {
    /// Directory for the scratch queue (`None`: the system temporary directory).
    pub dir: Option<PathBuf>,
    /// Capacity of the scratch queue in bytes.
    pub queue_bytes: u64,
    /// Bytes inserted per measurement and product size (at least 2000 products).
    pub volume_bytes: u64,
    /// Runs per measurement; medians are reported.
    pub repeat: u32,
    /// Products for the wake-up latency measurement.
    pub wakeups: u32,
    /// Gap between wake-up products, microseconds (the reader must be asleep when one lands).
    pub wakeup_gap_micros: u64,
    /// Product sizes to measure, bytes.
    pub sizes: Vec<usize>,
    /// Run as the wake-up reader of the queue at this path (the child the benchmark starts as
    /// `ldm7 bench queue --wakeups N --wake-reader QUEUE`).
    pub wake_reader: Option<PathBuf>,
    /// Run as the pipe baseline reader (`ldm7 bench queue --wakeups N --pipe-reader`).
    pub pipe_reader: bool,
}

/// Runs the benchmark (or a child role of it) and prints the results.
pub fn run(args: &QueueOptions) -> anyhow::Result<()> {
    if let Some(queue) = &args.wake_reader {
        return wake_reader(queue, args.wakeups);
    }
    if args.pipe_reader {
        return pipe_reader(args.wakeups);
    }
    if args.repeat == 0 || args.sizes.is_empty() || args.sizes.contains(&0) {
        bail!("--repeat and every --sizes value must be at least 1");
    }
    let parent = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let scratch = tempfile::Builder::new()
        .prefix("ldm7-bench-")
        .tempdir_in(&parent)
        .with_context(|| format!("cannot make a scratch directory in {}", parent.display()))?;
    println!(
        "ldm7 bench queue: queue {} MB, {} MB per measurement, median of {} runs, in {}",
        args.queue_bytes / 1_000_000,
        args.volume_bytes / 1_000_000,
        args.repeat,
        scratch.path().display()
    );
    println!(
        "{:>9} {:>12} {:>10} {:>12} {:>10} {:>14} {:>9} {:>10}",
        "size", "inserts/s", "MB/s", "reads/s", "MB/s", "file write MB/s", "ratio", "MD5 MB/s"
    );
    for &size in &args.sizes {
        let result = measure_size(args, scratch.path(), size)?;
        println!(
            "{:>9} {:>12.0} {:>10.0} {:>12.0} {:>10.0} {:>14.0} {:>9.2} {:>10.0}",
            size,
            result.inserts_per_s,
            result.inserts_per_s * size as f64 / 1e6,
            result.reads_per_s,
            result.reads_per_s * size as f64 / 1e6,
            result.file_bytes_per_s / 1e6,
            result.inserts_per_s * size as f64 / result.file_bytes_per_s,
            result.md5_bytes_per_s / 1e6,
        );
    }
    let wake = measure_wakeups(args, scratch.path())?;
    println!(
        "wake-up latency, insert → reader in another process ({} products, {} µs apart):",
        args.wakeups, args.wakeup_gap_micros
    );
    println!("  queue: median {:.1} µs, p99 {:.1} µs, max {:.1} µs", wake.queue.median, wake.queue.p99, wake.queue.max);
    println!(
        "  pipe baseline: median {:.1} µs, p99 {:.1} µs, max {:.1} µs (queue/pipe median {:.2})",
        wake.pipe.median,
        wake.pipe.p99,
        wake.pipe.max,
        wake.queue.median / wake.pipe.median
    );
    Ok(())
}

struct SizeResult {
    inserts_per_s: f64,
    reads_per_s: f64,
    file_bytes_per_s: f64,
    md5_bytes_per_s: f64,
}

fn measure_size(args: &QueueOptions, scratch: &Path, size: usize) -> anyhow::Result<SizeResult> {
    let count = usize::try_from(args.volume_bytes / size as u64).unwrap_or(usize::MAX).max(2000);
    let data: Vec<u8> = (0..size).map(|index| (index.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let path = scratch.join(format!("queue-{size}"));
    let capacity = Capacity { bytes: args.queue_bytes, slots: 100_000 };
    let queue = Queue::create(&path, capacity, true).context("cannot create the scratch queue")?;
    let mut inserts = Vec::new();
    let mut reads = Vec::new();
    let mut file_writes = Vec::new();
    for run in 0..args.repeat {
        let infos: Vec<ProdInfo> = (0..count).map(|index| bench_info(run, index, size)).collect();
        let started = Instant::now();
        for info in &infos {
            queue.insert(info, &data).context("insert failed")?;
        }
        inserts.push(count as f64 / started.elapsed().as_secs_f64());

        let started = Instant::now();
        let snapshot = queue.snapshot()?;
        let mut read_count = 0usize;
        let mut checksum = 0u64;
        for product in snapshot.products_from(Timestamp::ZERO)? {
            let product = product?;
            checksum = checksum.wrapping_add(touch(product.data));
            read_count += 1;
        }
        drop(snapshot);
        reads.push(read_count as f64 / started.elapsed().as_secs_f64());
        std::hint::black_box(checksum);

        file_writes.push(plain_file_rate(&scratch.join("baseline"), &data, count)?);
    }
    drop(queue);
    std::fs::remove_dir_all(&path).ok();
    let md5_started = Instant::now();
    let md5_rounds = (100_000_000 / size).max(1);
    for _ in 0..md5_rounds {
        std::hint::black_box(Signature::md5_of(&data));
    }
    let md5_bytes_per_s = (md5_rounds * size) as f64 / md5_started.elapsed().as_secs_f64();
    Ok(SizeResult {
        inserts_per_s: crate::median(inserts),
        reads_per_s: crate::median(reads),
        file_bytes_per_s: crate::median(file_writes),
        md5_bytes_per_s,
    })
}

/// Bytes per second of appending `count` copies of `data` to a new plain file with write(2).
fn plain_file_rate(path: &Path, data: &[u8], count: usize) -> anyhow::Result<f64> {
    let mut file = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let started = Instant::now();
    for _ in 0..count {
        file.write_all(data)?;
    }
    let rate = (count * data.len()) as f64 / started.elapsed().as_secs_f64();
    drop(file);
    std::fs::remove_file(path).ok();
    Ok(rate)
}

/// Reads one word per 512 bytes, so that reading costs what a consumer would pay to touch it.
fn touch(data: &[u8]) -> u64 {
    data.iter().step_by(512).fold(data.len() as u64, |sum, &byte| sum.wrapping_mul(31).wrapping_add(u64::from(byte)))
}

fn bench_info(run: u32, index: usize, size: usize) -> ProdInfo {
    let mut signature = [0u8; 16];
    signature[..4].copy_from_slice(&run.to_le_bytes());
    signature[4..12].copy_from_slice(&(index as u64).to_le_bytes());
    ProdInfo {
        arrival: Timestamp::from_system_time(SystemTime::now()),
        signature: Signature(signature),
        origin: "bench".into(),
        feedtype: FeedType::EXP,
        seqno: index as u32,
        ident: format!("bench/{size}/{run}/{index}"),
        size: size as u32,
    }
}

struct Latencies {
    median: f64,
    p99: f64,
    max: f64,
}

struct WakeResult {
    queue: Latencies,
    pipe: Latencies,
}

fn measure_wakeups(args: &QueueOptions, scratch: &Path) -> anyhow::Result<WakeResult> {
    let path = scratch.join("queue-wake");
    let queue = Queue::create(&path, Capacity { bytes: 100_000_000, slots: 10_000 }, true)?;
    let exe = std::env::current_exe().context("cannot find this program to start the reader")?;
    let mut reader = Command::new(&exe)
        .args(["bench", "queue", "--wakeups", &args.wakeups.to_string(), "--wake-reader"])
        .arg(&path)
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start the wake-up reader")?;
    let mut lines = BufReader::new(reader.stdout.take().context("reader has no stdout")?).lines();
    if lines.next().transpose()?.as_deref() != Some("ready") {
        bail!("the wake-up reader did not start");
    }
    let gap = Duration::from_micros(args.wakeup_gap_micros);
    for index in 0..args.wakeups {
        std::thread::sleep(gap);
        let sent_micros = Timestamp::from_system_time(SystemTime::now()).as_unix_micros();
        let data = sent_micros.to_le_bytes();
        let mut info = bench_info(9, index as usize, data.len());
        info.signature = Signature::md5_of(&[&data[..], &index.to_le_bytes()].concat());
        queue.insert(&info, &data)?;
    }
    let mut queue_latencies: Vec<f64> = Vec::with_capacity(args.wakeups as usize);
    for line in lines {
        queue_latencies.push(line?.trim().parse().context("bad line from the wake-up reader")?);
    }
    if !reader.wait()?.success() || queue_latencies.len() != args.wakeups as usize {
        bail!("the wake-up reader failed after {} products", queue_latencies.len());
    }
    drop(queue);
    std::fs::remove_dir_all(&path).ok();

    let mut pipe_child = Command::new(&exe)
        .args(["bench", "queue", "--wakeups", &args.wakeups.to_string(), "--pipe-reader"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start the pipe reader")?;
    let mut pipe = pipe_child.stdin.take().context("pipe reader has no stdin")?;
    let pipe_lines = BufReader::new(pipe_child.stdout.take().context("pipe reader has no stdout")?);
    for _ in 0..args.wakeups {
        std::thread::sleep(gap);
        let sent_micros = Timestamp::from_system_time(SystemTime::now()).as_unix_micros();
        pipe.write_all(&sent_micros.to_le_bytes())?;
        pipe.flush()?;
    }
    drop(pipe);
    let mut pipe_latencies = Vec::with_capacity(args.wakeups as usize);
    for line in pipe_lines.lines() {
        pipe_latencies.push(line?.trim().parse().context("bad line from the pipe reader")?);
    }
    pipe_child.wait()?;
    Ok(WakeResult { queue: summarize(&mut queue_latencies), pipe: summarize(&mut pipe_latencies) })
}

/// Child: follows the queue and prints the latency of each product in microseconds.
fn wake_reader(path: &Path, count: u32) -> anyhow::Result<()> {
    let queue = Queue::open(path)?;
    let mut follower = queue.follow(Timestamp::from_system_time(SystemTime::now()));
    let mut latencies = Vec::with_capacity(count as usize);
    println!("ready");
    std::io::stdout().flush()?;
    for _ in 0..count {
        let latency = follower
            .next_with(Some(Duration::from_secs(30)), |product| {
                let received = Timestamp::from_system_time(SystemTime::now()).as_unix_micros();
                let mut sent = [0u8; 8];
                sent.copy_from_slice(&product.data[..8]);
                received - i64::from_le_bytes(sent)
            })?
            .context("no product within 30 s")?;
        latencies.push(latency);
    }
    let mut out = std::io::stdout().lock();
    for latency in latencies {
        writeln!(out, "{latency}")?;
    }
    Ok(())
}

/// Child: reads 8-byte send times from stdin and prints each latency in microseconds.
fn pipe_reader(count: u32) -> anyhow::Result<()> {
    let mut input = std::io::stdin().lock();
    let mut latencies = Vec::with_capacity(count as usize);
    let mut word = [0u8; 8];
    for _ in 0..count {
        input.read_exact(&mut word)?;
        let received = Timestamp::from_system_time(SystemTime::now()).as_unix_micros();
        latencies.push(received - i64::from_le_bytes(word));
    }
    let mut out = std::io::stdout().lock();
    for latency in latencies {
        writeln!(out, "{latency}")?;
    }
    Ok(())
}

fn summarize(values: &mut [f64]) -> Latencies {
    values.sort_by(f64::total_cmp);
    let at = |q: f64| ldm7_types::quantile::quantile(values, q).unwrap_or(f64::NAN);
    Latencies { median: at(0.5), p99: at(0.99), max: at(1.0) }
}
