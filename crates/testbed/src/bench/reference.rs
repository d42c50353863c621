//! Side by side with the reference: Unidata LDM 6.15 built by
//! `../shared/tools/build-reference-ldm.sh`, found through `LDM_REF_BIN` (its `bin/`). Both
//! systems run as the same kind of processes on the same product files and queue sizes, under
//! one harness; the order alternates run by run, and medians and their ratio are printed.
//!
//! This module holds what the side-by-side benchmarks ([`super::ldm6`], [`super::act`]) need —
//! the two systems' commands, product files, process control — and `ldm7 bench insert`
//! (`pqinsert` vs `ldm7 insert`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// The environment variable naming the reference build's `bin/` directory.
pub const REF_BIN_VAR: &str = "LDM_REF_BIN";

/// One of the two systems under test.
#[derive(Clone, Debug)]
pub enum System {
    /// This project: the `ldm7` executable.
    Ldm7(PathBuf),
    /// Unidata LDM: its `bin/` directory.
    Reference(PathBuf),
}

impl System {
    /// Both systems when `LDM_REF_BIN` names a reference build (checked), else ldm7 alone.
    pub fn from_env() -> anyhow::Result<Vec<System>> {
        let exe = std::env::current_exe().context("find the ldm7 executable")?;
        let mut systems = vec![System::Ldm7(exe)];
        if let Some(bin) = std::env::var_os(REF_BIN_VAR) {
            let bin = PathBuf::from(bin);
            for program in ["pqcreate", "pqinsert", "pqmon", "ldmd"] {
                if !bin.join(program).is_file() {
                    bail!(
                        "{REF_BIN_VAR}={}: no {program} there; point it at the bin/ of a reference build \
                         (../shared/tools/build-reference-ldm.sh)",
                        bin.display()
                    );
                }
            }
            systems.insert(0, System::Reference(bin));
        }
        Ok(systems)
    }

    /// A short name for tables.
    pub fn name(&self) -> &'static str {
        match self {
            System::Ldm7(_) => "ldm7",
            System::Reference(_) => "LDM 6.15",
        }
    }

    /// Creates a product queue of `bytes` and `slots` at `path` (replacing one there).
    pub fn create_queue(&self, path: &Path, bytes: u64, slots: u64) -> anyhow::Result<()> {
        let mut command = match self {
            System::Ldm7(exe) => {
                let mut command = Command::new(exe);
                command.args(["queue", "create", "--force", "--size", &bytes.to_string()]);
                command.args(["--slots", &slots.to_string(), "--path"]).arg(path);
                command
            }
            System::Reference(bin) => {
                let mut command = Command::new(bin.join("pqcreate"));
                command.args(["-l", "-", "-c", "-s", &bytes.to_string(), "-S", &slots.to_string(), "-q"]).arg(path);
                command
            }
        };
        run_quietly(&mut command, "create a queue")
    }

    /// The command that inserts `files` (names relative to `dir`) into `queue` as feed EXP, each
    /// product named by its file: `ldm7 insert` or `pqinsert`.
    pub fn insert_command(&self, dir: &Path, queue: &Path, files: &[String]) -> Command {
        let mut command = match self {
            System::Ldm7(exe) => {
                let mut command = Command::new(exe);
                command.args(["insert", "-f", "EXP", "-q"]).arg(queue);
                command
            }
            System::Reference(bin) => {
                let mut command = Command::new(bin.join("pqinsert"));
                command.args(["-l", "/dev/null", "-f", "EXP", "-q"]).arg(queue);
                command
            }
        };
        command.args(files).current_dir(dir).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        command
    }

    /// Starts the system's LDM server in `dir` with its configuration file `ldmd.conf` and its
    /// queue `q.pq`, logging to `dir/log`; in its own process group (the reference forks).
    pub fn spawn_server(&self, dir: &Path, port: u16) -> anyhow::Result<Child> {
        use std::os::unix::process::CommandExt;
        let mut command = match self {
            System::Ldm7(exe) => {
                let mut command = Command::new(exe);
                command.args([
                    "serve",
                    "-c",
                    "ldmd.conf",
                    "-q",
                    "q.pq",
                    "--state-dir",
                    "state",
                    "-P",
                    &port.to_string(),
                ]);
                command
            }
            System::Reference(bin) => {
                let mut command = Command::new(bin.join("ldmd"));
                command.args(["-l", "-", "-q", "q.pq", "-P", &port.to_string(), "ldmd.conf"]);
                command
            }
        };
        command
            .current_dir(dir)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("log"))?)
            .spawn()
            .with_context(|| format!("start the {} server", self.name()))
    }

    /// How many products the queue at `path` holds, asked of the system's own tool as a user
    /// would (`ldm7 queue info`, `pqmon`).
    pub fn product_count(&self, path: &Path) -> anyhow::Result<u64> {
        match self {
            System::Ldm7(exe) => {
                let output = Command::new(exe).args(["queue", "info", "--json", "--path"]).arg(path).output()?;
                let text = String::from_utf8_lossy(&output.stdout);
                let field = text.split("\"product_count\":").nth(1).context("queue info: no product_count")?;
                Ok(field.split(|c: char| !c.is_ascii_digit()).next().unwrap_or("").parse()?)
            }
            System::Reference(bin) => {
                let output = Command::new(bin.join("pqmon")).args(["-l", "-", "-q"]).arg(path).output()?;
                // pqmon logs a header line ("... NOTE  nprods nfree ...") then the numbers.
                let text = String::from_utf8_lossy(&output.stderr);
                let mut numbers = false;
                for line in text.lines() {
                    let Some((_, fields)) = line.split_once(" NOTE ") else { continue };
                    let first = fields.split_whitespace().next().unwrap_or("");
                    if first == "nprods" {
                        numbers = true;
                    } else if numbers {
                        return first.parse().with_context(|| format!("pqmon: {line}"));
                    }
                }
                bail!("pqmon printed no product count: {text}")
            }
        }
    }
}

/// Stops a server started by [`System::spawn_server`]: SIGTERM to its process group, SIGKILL
/// after 10 s.
pub fn stop_server(mut child: Child) {
    let group = nix::unistd::Pid::from_raw(-(child.id() as i32));
    let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
    let _ = child.wait();
}

/// Writes `count` product files of `size` bytes (seeded pseudo-random, all distinct:
/// `ldm7_types::content`) named
/// `p000001`… into `dir`; returns their names.
pub fn write_products(dir: &Path, count: usize, size: usize, seed: u64) -> anyhow::Result<Vec<String>> {
    std::fs::create_dir_all(dir)?;
    let mut data = vec![0u8; size];
    let mut names = Vec::with_capacity(count);
    for index in 0..count {
        ldm7_types::content::fill(ldm7_types::content::product_seed(seed, index as u64), 0, &mut data);
        let name = format!("p{index:06}");
        std::fs::write(dir.join(&name), &data).with_context(|| format!("write {}", dir.join(&name).display()))?;
        names.push(name);
    }
    Ok(names)
}

/// Writes dirty pages out before a timed run (the product files just written, the previous
/// run's queues), so that neither system pays for the other's write-back.
pub fn settle() {
    nix::unistd::sync();
}

/// The order of the systems in run `run`: alternating, so neither always goes first.
pub fn run_order(systems: &[System], run: u32) -> Vec<&System> {
    let mut order: Vec<&System> = systems.iter().collect();
    if run % 2 == 1 {
        order.reverse();
    }
    order
}

fn run_quietly(command: &mut Command, what: &str) -> anyhow::Result<()> {
    let output = command.stdin(Stdio::null()).output().with_context(|| format!("{what}: start {command:?}"))?;
    if !output.status.success() {
        bail!("{what}: {command:?} failed: {}", String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(())
}

/// What `ldm7 bench insert` measures.
#[derive(Debug, Clone)]
pub struct InsertOptions {
    /// Directory for the product files and scratch queues (`None`: the system temporary
    /// directory).
    pub dir: Option<PathBuf>,
    /// Product sets, COUNTxSIZE (bytes), each inserted by one process into a fresh queue.
    pub sets: Vec<String>,
    /// Runs per set and system; medians are reported.
    pub repeat: u32,
}

/// `ldm7 bench insert`: one insert process per run on fresh queues (ldm7 alone, or side by side
/// with `pqinsert` when `LDM_REF_BIN` is set).
pub fn run_insert(args: &InsertOptions) -> anyhow::Result<()> {
    if args.repeat == 0 {
        bail!("--repeat must be positive");
    }
    let sets: Vec<(usize, usize)> = args.sets.iter().map(|set| parse_set(set)).collect::<anyhow::Result<_>>()?;
    let systems = System::from_env()?;
    let scratch = match &args.dir {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .context("create a scratch directory")?;
    println!(
        "ldm7 bench insert: {}; {} run(s) each, order alternating; medians (wall time from process start to exit)",
        systems.iter().map(System::name).collect::<Vec<_>>().join(" vs "),
        args.repeat
    );
    for (count, size) in sets {
        let files_dir = scratch.path().join(format!("files-{count}x{size}"));
        let files = write_products(&files_dir, count, size, 7)?;
        // Room for every product (no eviction) in both systems' accounting.
        let bytes = (count as u64 * (size as u64 + 1024)) * 9 / 8 + (16 << 20);
        let slots = count as u64 * 2;
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); systems.len()];
        let mut peaks: Vec<Vec<f64>> = vec![Vec::new(); systems.len()];
        for run in 0..args.repeat {
            for system in run_order(&systems, run) {
                let slot = systems.iter().position(|s| std::ptr::eq(s, system)).unwrap_or(0);
                let queue = scratch.path().join(format!("q-{}.pq", slot));
                system.create_queue(&queue, bytes, slots)?;
                settle();
                let started = Instant::now();
                let mut child = system.insert_command(&files_dir, &queue, &files).spawn()?;
                let (status, peak) = crate::wait_with_peak_rss(&mut child)?;
                let elapsed = started.elapsed().as_secs_f64();
                if !status.success() {
                    let mut stderr = String::new();
                    if let Some(mut pipe) = child.stderr.take() {
                        use std::io::Read;
                        let _ = pipe.read_to_string(&mut stderr);
                    }
                    bail!("{} insert failed: {stderr}", system.name());
                }
                let stored = system.product_count(&queue)?;
                if stored != count as u64 {
                    bail!("{} stored {stored} of {count} products", system.name());
                }
                times[slot].push(elapsed);
                peaks[slot].push(peak as f64 / 1e6);
                remove_queue(&queue);
            }
        }
        println!("{count} files of {size} bytes ({:.0} MB):", (count * size) as f64 / 1e6);
        print_medians(&systems, &times, &peaks, "s", "peak RSS MB");
    }
    Ok(())
}

/// Prints each system's median and runs, and the ratio reference/ldm7 (how many times faster
/// ldm7 is) when both ran.
pub fn print_medians(systems: &[System], times: &[Vec<f64>], extra: &[Vec<f64>], unit: &str, extra_name: &str) {
    for (index, system) in systems.iter().enumerate() {
        let runs: Vec<String> = times[index].iter().map(|time| format!("{time:.3}")).collect();
        let extra_median = if extra[index].is_empty() {
            String::new()
        } else {
            format!("; {extra_name} {:.0}", crate::median(extra[index].clone()))
        };
        println!(
            "  {:<9} median {:.3} {unit}{extra_median}  (runs: {})",
            system.name(),
            crate::median(times[index].clone()),
            runs.join(", ")
        );
    }
    if systems.len() == 2 {
        let ratios: Vec<f64> = times[0].iter().zip(&times[1]).map(|(reference, ours)| reference / ours).collect();
        let each: Vec<String> = ratios.iter().map(|ratio| format!("{ratio:.2}")).collect();
        println!(
            "  ratio LDM 6.15 / ldm7: median {:.2}x (per run: {})",
            crate::median(ratios.clone()),
            each.join(", ")
        );
    }
}

/// Removes a scratch queue of either system (a directory for ldm7, a file for LDM).
pub fn remove_queue(path: &Path) {
    let _ = if path.is_dir() { std::fs::remove_dir_all(path) } else { std::fs::remove_file(path) };
}

fn parse_set(set: &str) -> anyhow::Result<(usize, usize)> {
    let (count, size) = set.split_once('x').with_context(|| format!("{set:?}: give COUNTxSIZE, e.g. 10000x30000"))?;
    let count: usize = count.parse().with_context(|| format!("{set:?}: bad count"))?;
    let size = size
        .parse::<ldm7_types::units::ByteSize>()
        .map(|size| size.bytes() as usize)
        .map_err(|error| anyhow::anyhow!("{set:?}: bad size: {error}"))?;
    if count == 0 || size == 0 {
        bail!("{set:?}: count and size must be positive");
    }
    Ok((count, size))
}
