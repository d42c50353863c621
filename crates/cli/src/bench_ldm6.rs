//! `ldm7 bench ldm6`: LDM-6 fan-out on loopback. One `ldm7 serve` upstream with a preloaded
//! queue; 1 and 4 downstream `ldm7 serve` processes, each with its own queue and a REQUEST;
//! the time until every downstream holds every product. The 1-downstream run is the baseline
//! of the 4-downstream one (fan-out must not serialize).
//!
//! Two times are reported: *transfer* — from the first product inserted at any downstream to
//! the last one inserted at all (queue insertion stamps; no polling error) — and *wall*, which
//! adds process start, connection, FEEDME and LDM's 1 s turn-around pause.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ldm7_pq::{Capacity, Queue};
use ldm7_types::{FeedType, ProdInfo, Signature, Timestamp};
use rand::RngCore;

/// Arguments of `ldm7 bench ldm6`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchLdm6Args {
    /// Directory for the scratch queues (default: the system temporary directory).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Products preloaded in the upstream queue.
    #[arg(long, default_value_t = 10_000)]
    pub products: usize,
    /// Product size, bytes.
    #[arg(long, default_value_t = 30_000)]
    pub size: usize,
    /// Numbers of downstreams to measure.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 4])]
    pub downstreams: Vec<usize>,
    /// Runs per measurement; medians are reported.
    #[arg(long, default_value_t = 3)]
    pub repeat: u32,
}

struct Run {
    transfer: f64,
    wall: f64,
    upstream_cpu: f64,
    downstream_cpu: f64,
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn spawn_server(exe: &Path, dir: &Path, port: u16) -> anyhow::Result<Child> {
    Command::new(exe)
        .args(["serve", "-c", "ldmd.conf", "-q", "q.pq", "--state-dir", "state", "-P", &port.to_string()])
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("log"))?)
        .spawn()
        .context("start ldm7 serve")
}

fn stop(mut child: Child) {
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let _ = child.wait();
}

fn cpu_seconds(pid: u32) -> f64 {
    ldm7_testbed::cpu_seconds(pid).unwrap_or(0.0)
}

fn queue_dir(root: &Path, name: &str, config: &str, capacity: Capacity) -> anyhow::Result<PathBuf> {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir)?;
    Queue::create(&dir.join("q.pq"), capacity, true)
        .with_context(|| format!("create the queue in {}", dir.display()))?;
    std::fs::write(dir.join("ldmd.conf"), config)?;
    Ok(dir)
}

const LOCAL: &str = r"^((localhost|loopback)|(127\.0\.0\.1\.?))$";

/// Runs the benchmark and prints the results.
pub fn run(args: &BenchLdm6Args) -> anyhow::Result<()> {
    if args.products == 0 || args.size == 0 || args.repeat == 0 || args.downstreams.contains(&0) {
        bail!("--products, --size, --repeat and --downstreams must be positive");
    }
    let exe = std::env::current_exe().context("find the ldm7 executable")?;
    let scratch = match &args.dir {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .context("create a scratch directory")?;
    let bytes = (args.products * (args.size + 512)) as u64 * 5 / 4 + (64 << 20);
    let capacity = Capacity { bytes, slots: args.products as u64 * 2 };
    let up_dir = queue_dir(scratch.path(), "up", &format!("ALLOW ANY {LOCAL}\n"), capacity)?;
    {
        let queue = Queue::open(&up_dir.join("q.pq"))?;
        let mut data = vec![0u8; args.size];
        let origin = crate::common::origin();
        for index in 0..args.products {
            rand::rng().fill_bytes(&mut data);
            let info = ProdInfo {
                arrival: crate::common::now(),
                signature: Signature::md5_of(&data),
                origin: origin.clone(),
                feedtype: FeedType::EXP,
                seqno: index as u32,
                ident: format!("bench/ldm6/{index}"),
                size: args.size as u32,
            };
            queue.insert(&info, &data)?;
        }
    }
    let up_port = free_port()?;
    let upstream = spawn_server(&exe, &up_dir, up_port)?;
    std::thread::sleep(Duration::from_millis(300));
    println!(
        "ldm7 bench ldm6: {} products of {} bytes from a preloaded queue; {} run(s) each; medians",
        args.products, args.size, args.repeat
    );
    let mut baseline: Option<f64> = None;
    for &count in &args.downstreams {
        let mut runs = Vec::new();
        for run in 0..args.repeat {
            runs.push(measure(&exe, scratch.path(), upstream.id(), up_port, count, run, capacity, args.products)?);
        }
        let median = |pick: fn(&Run) -> f64| ldm7_testbed::median(runs.iter().map(pick).collect());
        let (transfer, wall, cpu) = (median(|r| r.transfer), median(|r| r.wall), median(|r| r.upstream_cpu));
        let downstream_cpu = median(|r| r.downstream_cpu);
        let total = (count * args.products) as f64;
        let vs = match baseline {
            None => {
                baseline = Some(transfer);
                String::new()
            }
            Some(one) => format!("; {:.2}x the 1-downstream transfer time", transfer / one),
        };
        println!(
            "{count} downstream(s): transfer {transfer:.2} s ({:.0} products/s, {:.1} MB/s aggregate), wall {wall:.2} s; \
             upstream CPU {cpu:.2} s ({:.0}% of one core), downstreams' CPU {downstream_cpu:.2} s{vs}",
            total / transfer,
            total * args.size as f64 / transfer / 1e6,
            cpu / transfer * 100.0
        );
        let each: Vec<String> = runs.iter().map(|r| format!("{:.2}", r.transfer)).collect();
        println!("  transfer times: {}", each.join(", "));
    }
    stop(upstream);
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn measure(
    exe: &Path,
    root: &Path,
    upstream_pid: u32,
    up_port: u16,
    count: usize,
    run: u32,
    capacity: Capacity,
    products: usize,
) -> anyhow::Result<Run> {
    let config = format!("ALLOW ANY {LOCAL}\nREQUEST ANY \".*\" 127.0.0.1:{up_port}\n");
    let mut dirs = Vec::new();
    for k in 0..count {
        dirs.push(queue_dir(root, &format!("down{count}-{run}-{k}"), &config, capacity)?);
    }
    let queues: Vec<Queue> = dirs.iter().map(|dir| Queue::open(&dir.join("q.pq"))).collect::<Result<_, _>>()?;
    let cpu_before = cpu_seconds(upstream_pid);
    let started = Instant::now();
    let mut children = Vec::new();
    for dir in &dirs {
        children.push(spawn_server(exe, dir, free_port()?)?);
    }
    let deadline = started + Duration::from_secs(600);
    loop {
        let mut complete = true;
        for queue in &queues {
            if queue.stats()?.product_count < products as u64 {
                complete = false;
                break;
            }
        }
        if complete {
            break;
        }
        if Instant::now() > deadline {
            bail!("downstreams incomplete after 600 s: see the logs in {}", root.display());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let wall = started.elapsed().as_secs_f64();
    let upstream_cpu = cpu_seconds(upstream_pid) - cpu_before;
    let downstream_cpu: f64 = children.iter().map(|child| cpu_seconds(child.id())).sum();
    let mut first = i64::MAX;
    let mut last = i64::MIN;
    for queue in &queues {
        let stats = queue.stats()?;
        first = first.min(stats.oldest_insertion.map_or(i64::MAX, Timestamp::as_unix_micros));
        last = last.max(stats.newest_insertion.map_or(i64::MIN, Timestamp::as_unix_micros));
    }
    for child in children {
        stop(child);
    }
    drop(queues);
    for dir in &dirs {
        let _ = std::fs::remove_dir_all(dir);
    }
    Ok(Run { transfer: (last - first) as f64 / 1e6, wall, upstream_cpu, downstream_cpu })
}
