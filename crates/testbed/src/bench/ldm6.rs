//! `ldm7 bench ldm6`: LDM-6 fan-out on loopback, as a user would time it. One upstream server
//! whose queue is preloaded (by the system's own insert tool, from the same product files);
//! N downstream servers, each with a fresh queue and a REQUEST for everything, started
//! together; the time from their start until every one holds every product (asked of the
//! system's own queue tool, one downstream after another, every 50 ms).
//!
//! With `LDM_REF_BIN` pointing at a reference build, Unidata LDM 6.15 (`pqinsert`, `ldmd`,
//! `pqmon`) runs the same measurement on the same files, queue sizes and configuration, the
//! order alternating run by run; medians and the ratio are printed ([`super::reference`]).
//!
//! The page cache: by default the queues are timed as the machine leaves them after their
//! creation (a machine that reclaims idle page cache reads some of their pages back from the
//! disk during the run, more of whichever queue was created first or is larger). `--cache warm`
//! reads every queue file of both systems, upstream and downstream, into the page cache just
//! before each timed run: the state of a server whose queue fits in memory, as both systems
//! recommend, and the same for both.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::reference::{System, print_medians, remove_queue, run_order, settle, stop_server, write_products};

/// What `ldm7 bench ldm6` measures.
#[derive(Debug, Clone)]
pub struct Ldm6Options {
    /// Directory for the product files and scratch queues (`None`: the system temporary
    /// directory).
    pub dir: Option<PathBuf>,
    /// Products preloaded in the upstream queue.
    pub products: usize,
    /// Product size, bytes.
    pub size: usize,
    /// Numbers of downstreams to measure.
    pub downstreams: Vec<usize>,
    /// Runs per measurement and system; medians are reported.
    pub repeat: u32,
    /// The queues' page-cache state at the start of each run.
    pub cache: CacheState,
}

/// The queues' page-cache state at the start of a timed run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheState {
    /// As creating and preloading them left it.
    AsIs,
    /// Every file of the upstream and downstream queues read into the page cache.
    Warm,
}

/// How long one fan-out may take before the benchmark gives up.
const RUN_TIMEOUT: Duration = Duration::from_secs(600);
/// Interval between completion checks of a downstream queue.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

const LOCAL: &str = r"^((localhost|loopback)|(127\.0\.0\.1\.?))$";

/// Runs the benchmark and prints the results.
pub fn run(args: &Ldm6Options) -> anyhow::Result<()> {
    if args.products == 0 || args.size == 0 || args.repeat == 0 || args.downstreams.contains(&0) {
        bail!("--products, --size, --repeat and --downstreams must be positive");
    }
    let systems = System::from_env()?;
    let scratch = match &args.dir {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .context("create a scratch directory")?;
    let files_dir = scratch.path().join("products");
    let files = write_products(&files_dir, args.products, args.size, 11)?;
    // The same queue sizes for every queue of both systems: every product fits, none is evicted.
    let bytes = (args.products as u64 * (args.size as u64 + 1024)) * 9 / 8 + (16 << 20);
    let slots = args.products as u64 * 2;
    println!(
        "ldm7 bench ldm6: {} products of {} bytes preloaded upstream; {}; {} run(s) each, order alternating; \
         page cache {}; medians of the time from the downstreams' start until all hold all",
        args.products,
        args.size,
        systems.iter().map(System::name).collect::<Vec<_>>().join(" vs "),
        args.repeat,
        match args.cache {
            CacheState::AsIs => "as the queues' creation left it",
            CacheState::Warm => "warm (every queue file read first)",
        }
    );
    let mut upstreams = Vec::new();
    for (index, system) in systems.iter().enumerate() {
        let dir = scratch.path().join(format!("up-{index}"));
        prepare_dir(system, &dir, &format!("ALLOW ANY {LOCAL} .*\n"), bytes, slots)?;
        let mut insert = system.insert_command(&files_dir, &dir.join("q.pq"), &files);
        let output = insert.output().with_context(|| format!("preload with {}", system.name()))?;
        if !output.status.success() {
            bail!("{}: preloading failed: {}", system.name(), String::from_utf8_lossy(&output.stderr));
        }
        let port = ldm7_io::free_port()?;
        let server = system.spawn_server(&dir, port)?;
        wait_for_port(port, &dir)?;
        upstreams.push((server, port));
    }
    let result = measure_all(args, &systems, &upstreams, scratch.path(), bytes, slots);
    for (server, _) in upstreams {
        stop_server(server);
    }
    if result.is_err() {
        // Keep the servers' logs that the error points to; drop the bulk (products, queues).
        let kept = scratch.keep();
        keep_only_logs(&kept);
        eprintln!("ldm7 bench ldm6: the servers' logs are kept in {}", kept.display());
    }
    result
}

/// Removes the product files and every queue under a scratch directory, leaving the rest (the
/// servers' configurations, logs and state) for a look at what went wrong.
fn keep_only_logs(root: &Path) {
    let _ = std::fs::remove_dir_all(root.join("products"));
    let Ok(entries) = std::fs::read_dir(root) else { return };
    for entry in entries.flatten() {
        remove_queue(&entry.path().join("q.pq"));
    }
}

fn measure_all(
    args: &Ldm6Options,
    systems: &[System],
    upstreams: &[(std::process::Child, u16)],
    root: &Path,
    bytes: u64,
    slots: u64,
) -> anyhow::Result<()> {
    for &count in &args.downstreams {
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); systems.len()];
        for run in 0..args.repeat {
            for system in run_order(systems, run) {
                let index = systems.iter().position(|s| std::ptr::eq(s, system)).unwrap_or(0);
                let up_port = upstreams[index].1;
                let seconds =
                    fan_out(system, root, index, up_port, count, run, bytes, slots, args.products, args.cache)?;
                times[index].push(seconds);
            }
        }
        let megabytes = (count * args.products * args.size) as f64 / 1e6;
        println!("{count} downstream(s), {megabytes:.0} MB delivered in all:");
        print_medians(systems, &times, &vec![Vec::new(); systems.len()], "s", "");
    }
    Ok(())
}

/// One fan-out: `count` fresh downstreams started together; seconds until all hold all.
#[allow(clippy::too_many_arguments)]
fn fan_out(
    system: &System,
    root: &Path,
    index: usize,
    up_port: u16,
    count: usize,
    run: u32,
    bytes: u64,
    slots: u64,
    products: usize,
    cache: CacheState,
) -> anyhow::Result<f64> {
    let mut dirs = Vec::new();
    for k in 0..count {
        let dir = root.join(format!("down-{index}-{count}-{run}-{k}"));
        let config = format!("ALLOW ANY {LOCAL} .*\nREQUEST ANY \"{}\" 127.0.0.1:{up_port}\n", everything(k));
        prepare_dir(system, &dir, &config, bytes, slots)?;
        dirs.push(dir);
    }
    settle();
    if cache == CacheState::Warm {
        read_into_cache(&root.join(format!("up-{index}")).join("q.pq"))?;
        for dir in &dirs {
            read_into_cache(&dir.join("q.pq"))?;
        }
    }
    // Every downstream's port is chosen before any starts: a port probed and closed can be
    // handed out again by the next probe while the server it was meant for has not bound it yet
    // (two downstreams on one port: one exits, and the run waited out its timeout).
    let probes = (0..dirs.len()).map(|_| std::net::TcpListener::bind("127.0.0.1:0")).collect::<Result<Vec<_>, _>>()?;
    let ports = probes.iter().map(|probe| probe.local_addr().map(|a| a.port())).collect::<Result<Vec<_>, _>>()?;
    drop(probes);
    let started = Instant::now();
    let mut servers = Vec::new();
    for (dir, &port) in dirs.iter().zip(&ports) {
        servers.push(system.spawn_server(dir, port)?);
    }
    let mut outcome = Ok(());
    'downstreams: for dir in &dirs {
        loop {
            if let Some((k, status)) = servers
                .iter_mut()
                .enumerate()
                .find_map(|(k, server)| server.try_wait().ok().flatten().map(|status| (k, status)))
            {
                outcome = Err(anyhow::anyhow!(
                    "{}: a downstream server exited ({status}) before it held every product: see its log in {}",
                    system.name(),
                    dirs[k].display()
                ));
                break 'downstreams;
            }
            match system.product_count(&dir.join("q.pq")) {
                Ok(held) if held >= products as u64 => break,
                Ok(_) => {}
                Err(error) => {
                    outcome = Err(error);
                    break 'downstreams;
                }
            }
            if started.elapsed() > RUN_TIMEOUT {
                outcome = Err(anyhow::anyhow!(
                    "{}: a downstream is incomplete after {} s: see the logs in {}",
                    system.name(),
                    RUN_TIMEOUT.as_secs(),
                    dir.display()
                ));
                break 'downstreams;
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    for server in servers {
        stop_server(server);
    }
    outcome?;
    for dir in &dirs {
        remove_queue(&dir.join("q.pq"));
        let _ = std::fs::remove_dir_all(dir);
    }
    Ok(seconds)
}

/// The pattern of downstream `k`: everything, written differently for each downstream (`.*`,
/// `(.*)`, `((.*))`, …). The downstreams all connect from 127.0.0.1 — as hosts behind one NAT
/// address — and both systems end a host's older feed when the same host asks again for the same
/// class (one feeder per host and feed, docs/server.md "Bounds"); distinct patterns are the
/// reference's documented remedy, so both run with the rule on, as installed.
fn everything(k: usize) -> String {
    format!("{}.*{}", "(".repeat(k), ")".repeat(k))
}

/// Reads a queue (a file, or a directory of files) to its end, so that its pages are in the
/// page cache.
fn read_into_cache(queue: &Path) -> anyhow::Result<()> {
    let files = if queue.is_dir() {
        std::fs::read_dir(queue)?.map(|entry| entry.map(|entry| entry.path())).collect::<Result<Vec<_>, _>>()?
    } else {
        vec![queue.to_owned()]
    };
    for file in files.iter().filter(|file| file.is_file()) {
        let mut opened = std::fs::File::open(file).with_context(|| format!("read {}", file.display()))?;
        std::io::copy(&mut opened, &mut std::io::sink()).with_context(|| format!("read {}", file.display()))?;
    }
    Ok(())
}

/// A server directory: the configuration file and a fresh queue `q.pq`.
fn prepare_dir(system: &System, dir: &Path, config: &str, bytes: u64, slots: u64) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("ldmd.conf"), config)?;
    system.create_queue(&dir.join("q.pq"), bytes, slots)
}

/// Waits until a server accepts connections on `port`.
fn wait_for_port(port: u16, dir: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!("the upstream server in {} does not listen on port {port}: see its log", dir.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::everything;
    use ldm7_types::class::Pattern;

    #[test]
    fn each_downstream_pattern_is_distinct_and_matches_every_product() {
        let patterns: Vec<String> = (0..8).map(everything).collect();
        assert_eq!(patterns[..3], [".*", "(.*)", "((.*))"]);
        assert_eq!(patterns.iter().collect::<std::collections::HashSet<_>>().len(), patterns.len());
        for text in &patterns {
            let pattern = Pattern::new(text).unwrap();
            for ident in ["", "p00042", "SDUS53 KOAX 261200 /pN0QOAX"] {
                assert!(pattern.is_match(ident), "{text} misses {ident:?}");
            }
        }
    }
}
