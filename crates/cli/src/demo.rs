//! `ldm7 demo`: the product queue at work with no set-up and no root. It creates a queue in a
//! temporary directory, starts `ldm7 watch` in another process, replays the real one-hour NGRID
//! trace into the queue as fast as it can, and prints what the watcher saw and a summary.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ldm7_pq::{Capacity, Queue};
use ldm7_types::FeedType;

use crate::exit::{CmdResult, bad_input, runtime};
use crate::insert::replay_into;
use crate::trace::{feed_from_name, read_trace};

const DEFAULT_TRACE: &str = "data/traces/unidata_ldm_NGRID_1hr_20150615T00Z.txt";

/// Arguments of `ldm7 demo`.
#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Trace to replay [default: the one-hour NGRID trace in $LDM7_SHARED or ../shared].
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Replay speed (0 = as fast as possible).
    #[arg(long, default_value_t = 0.0, value_parser = crate::common::speed_arg)]
    pub speed: f64,
    /// Queue capacity (smaller than the trace, so the queue evicts as a real one does).
    #[arg(long, default_value = "1G")]
    pub queue_size: ldm7_types::ByteSize,
    /// Lines of the watcher to show at the start (then every 2000th).
    #[arg(long, default_value_t = 15)]
    pub show: u64,
}

/// Runs the demo.
pub fn run(args: &DemoArgs) -> CmdResult {
    let trace = match &args.trace {
        Some(trace) => trace.clone(),
        None => find_shared(DEFAULT_TRACE).ok_or_else(|| {
            bad_input(format!(
                "cannot find {DEFAULT_TRACE}: set LDM7_SHARED to the shared directory or pass --trace FILE"
            ))
        })?,
    };
    let products = read_trace(&trace).map_err(bad_input)?;
    let total_bytes: u64 = products.iter().map(|product| u64::from(product.size)).sum();
    let dir = tempfile::Builder::new().prefix("ldm7-demo-").tempdir().map_err(runtime)?;
    let queue_path = dir.path().join("ldm7.pq");
    let capacity = Capacity {
        bytes: args.queue_size.bytes(),
        slots: Capacity::default_slots(args.queue_size.bytes()).max(20_000),
    };
    println!("== ldm7 demo ==");
    println!("trace    {} ({} products, {:.2} GB)", trace.display(), products.len(), total_bytes as f64 / 1e9);
    println!("queue    {} ({} MB, {} slots)", queue_path.display(), capacity.bytes / 1_000_000, capacity.slots);
    let queue = Queue::create(&queue_path, capacity, false).map_err(runtime)?;

    let exe = std::env::current_exe().map_err(runtime)?;
    let mut watcher = Command::new(exe)
        .args(["watch", "--offset", "86400", "--summary", "--timeout", "30", "--count"])
        .arg(products.len().to_string())
        .arg("--queue")
        .arg(&queue_path)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|error| runtime(anyhow::anyhow!("cannot start the watcher process: {error}")))?;
    let stdout = watcher.stdout.take().ok_or_else(|| runtime(anyhow::anyhow!("watcher has no stdout")))?;
    let show = args.show;
    let reader = std::thread::spawn(move || {
        let mut count = 0u64;
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            count += 1;
            if count <= show || count % 2000 == 0 {
                println!("watch #{count:<6} {line}");
            } else if count == show + 1 {
                println!("watch ...     (every 2000th line from here)");
            }
        }
        count
    });
    println!("watcher  pid {} follows the queue in another process; replaying now", watcher.id());
    std::thread::sleep(Duration::from_millis(200));

    let feed = feed_from_name(&trace).unwrap_or(FeedType::EXP);
    let summary = replay_into(&queue, &trace, &products, feed, false, args.speed, 1, true)?;
    let waited = Instant::now();
    let status = watcher.wait().map_err(runtime)?;
    let seen = reader.join().unwrap_or(0);
    let stats = queue.stats().map_err(runtime)?;
    let secs = summary.elapsed.as_secs_f64().max(1e-9);
    println!("== summary ==");
    println!(
        "inserted {} products, {:.2} GB in {:.2} s: {:.0} products/s, {:.0} MB/s",
        summary.inserted,
        summary.bytes as f64 / 1e9,
        secs,
        summary.inserted as f64 / secs,
        summary.bytes as f64 / 1e6 / secs
    );
    println!(
        "queue    {} products now, {} evicted to stay within {} MB; minimum residence {}",
        stats.product_count,
        stats.evicted_count,
        capacity.bytes / 1_000_000,
        stats.mvrt.map(|mvrt| format!("{:.3} s", mvrt.residence.as_secs_f64())).unwrap_or_else(|| "-".into())
    );
    println!(
        "watcher  saw {seen} of {} products ({}), finished {:.2} s after the last insert",
        summary.inserted,
        if seen == summary.inserted { "all of them, in order" } else { "SOME MISSING" },
        waited.elapsed().as_secs_f64()
    );
    if !status.success() || seen != summary.inserted {
        return Err(runtime(anyhow::anyhow!(
            "the watcher saw {seen} of {} products (exit {status})",
            summary.inserted
        )));
    }
    Ok(())
}

/// Finds `relative` under the shared data directory: `$LDM7_SHARED`, then `../shared` from the
/// current directory and from the workspace this binary was built in.
pub fn find_shared(relative: &str) -> Option<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Some(shared) = std::env::var_os("LDM7_SHARED") {
        roots.push(PathBuf::from(shared));
    }
    if let Ok(current) = std::env::current_dir() {
        roots.push(current.join("../shared"));
        roots.push(current.join("shared"));
    }
    roots.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    roots.into_iter().map(|root| root.join(relative)).find(|path| path.is_file())
}
