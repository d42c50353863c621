//! `ldm7 bench scour`: `ldm7 scour` against LDM 6.15's `scour` (through `LDM_REF_BIN`) on the
//! same generated tree — FILES files in DIRS leaf directories (two levels of at most 100), half
//! of them three days old and half under an hour, scoured with one entry `TREE 2`. Before each
//! timed run the tree is generated afresh (deterministically: same names, sizes and ages) and
//! written out (`sync`); the order of the systems alternates; after each run the survivors are
//! listed and must be exactly the tree's new files and its directories, for both systems.
//! Medians of wall time (process start to exit) and their ratio are printed.
//!
//! LDM's scour refuses every directory when `getlogin()` fails (its check that a directory is
//! not the login user's home), as it does without a login session (cron in a container, CI):
//! [`reference_command`] runs it with the process's login uid set to the current user first.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};

use super::reference::{REF_BIN_VAR, System, print_medians, run_order, settle};

/// Age of the old half of the files (the entry keeps two days).
const OLD_SECS: u64 = 3 * 86_400;

/// Leaf directories per directory of the upper level.
const DIRS_PER_GROUP: usize = 100;

/// What `ldm7 bench scour` measures.
#[derive(Debug, Clone)]
pub struct ScourOptions {
    /// Directory for the trees (`None`: the system temporary directory).
    pub dir: Option<PathBuf>,
    /// Files in the tree.
    pub files: usize,
    /// Leaf directories they are spread over.
    pub dirs: usize,
    /// Bytes per file.
    pub size: usize,
    /// Runs per system; medians are reported.
    pub repeat: u32,
    /// `ldm7 scour --threads` (`None`: its default).
    pub threads: Option<u16>,
}

/// LDM's `scour` in `bin`, run by `sh` after setting the process's login uid to the current
/// user (when it has none: root may set it once; otherwise `getlogin()` already works or the
/// reference refuses every directory, which [`run`] reports). `echo` is the shell's own, so
/// `/proc/self` is the shell that then becomes scour.
pub fn reference_command(bin: &Path) -> Command {
    let mut command = Command::new("sh");
    command
        .args(["-c", "echo \"$(id -u)\" > /proc/self/loginuid 2>/dev/null; exec \"$0\" \"$@\""])
        .arg(bin.join("scour"));
    command
}

/// The reference refused every directory because it could not find the login user: the
/// message to give instead of a wrong comparison, or `None`.
pub fn reference_refused(log: &str) -> Option<String> {
    log.contains("Could not determine login HOME").then(|| {
        "LDM's scour could not determine the login user (getlogin() failed) and so refused every \
         directory: run as root (which may set /proc/self/loginuid) or from a login session"
            .to_owned()
    })
}

/// Everything under `root`, sorted: `d path`, `f path`, `l path -> target` (relative paths).
pub fn survivors(root: &Path) -> std::io::Result<Vec<String>> {
    let mut found = Vec::new();
    list_into(root, root, &mut found)?;
    found.sort();
    Ok(found)
}

fn list_into(base: &Path, dir: &Path, found: &mut Vec<String>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let relative = path.strip_prefix(base).unwrap_or(&path).display().to_string();
        let kind = entry.file_type()?;
        if kind.is_symlink() {
            found.push(format!("l {relative} -> {}", std::fs::read_link(&path)?.display()));
        } else if kind.is_dir() {
            found.push(format!("d {relative}"));
            list_into(base, &path, found)?;
        } else {
            found.push(format!("f {relative}"));
        }
    }
    Ok(())
}

/// `ldm7 bench scour`.
pub fn run(options: &ScourOptions) -> anyhow::Result<()> {
    if options.repeat == 0 || options.files == 0 || options.dirs == 0 {
        bail!("--repeat, --files and --dirs must be positive");
    }
    let systems = systems()?;
    let scratch = match &options.dir {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .context("create a scratch directory")?;
    let tree = scratch.path().join("tree");
    let conf = scratch.path().join("scour.conf");
    std::fs::write(&conf, format!("{} 2\n", tree.display()))?;
    println!(
        "ldm7 bench scour: {}; {} files of {} bytes in {} directories, half 3 days old, entry \"TREE 2\"; \
         {} run(s) each, order alternating; medians (wall time from process start to exit)",
        systems.iter().map(System::name).collect::<Vec<_>>().join(" vs "),
        options.files,
        options.size,
        options.dirs,
        options.repeat
    );
    let mut expected = None;
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); systems.len()];
    for run in 0..options.repeat {
        for system in run_order(&systems, run) {
            let slot = systems.iter().position(|s| std::ptr::eq(s, system)).unwrap_or(0);
            let started = Instant::now();
            let kept = generate(&tree, options, SystemTime::now())?;
            settle();
            let setup = started.elapsed();
            let elapsed = scour_once(system, &conf, scratch.path(), options.threads)?;
            let left = survivors(&tree)?;
            let expected = expected.get_or_insert(kept);
            if left != *expected {
                let missing =
                    expected.iter().filter(|item| left.binary_search(item).is_err()).take(3).collect::<Vec<_>>();
                let extra =
                    left.iter().filter(|item| expected.binary_search(item).is_err()).take(3).collect::<Vec<_>>();
                bail!(
                    "{} left {} entries where {} were expected (missing e.g. {missing:?}, extra e.g. {extra:?}); log in {}",
                    system.name(),
                    left.len(),
                    expected.len(),
                    scratch.path().join("log").display()
                );
            }
            println!(
                "  run {} {:<9} {:.3} s ({} survivors as expected; tree made in {:.1} s)",
                run + 1,
                system.name(),
                elapsed.as_secs_f64(),
                left.len(),
                setup.as_secs_f64()
            );
            times[slot].push(elapsed.as_secs_f64());
            remove_tree(&tree)?;
        }
    }
    println!("{} files in {} directories (identical survivors):", options.files, options.dirs);
    // No peak RSS: wait4's counts the benchmark's own pages, which a child shares until exec.
    print_medians(&systems, &times, &vec![Vec::new(); systems.len()], "s", "");
    Ok(())
}

/// ldm7, and LDM when `LDM_REF_BIN` names a build with `scour` (first, as
/// [`System::from_env`] orders them).
fn systems() -> anyhow::Result<Vec<System>> {
    let exe = std::env::current_exe().context("find the ldm7 executable")?;
    let mut systems = vec![System::Ldm7(exe)];
    if let Some(bin) = std::env::var_os(REF_BIN_VAR) {
        let bin = PathBuf::from(bin);
        if !bin.join("scour").is_file() {
            bail!("{REF_BIN_VAR}={}: no scour there; point it at the bin/ of an LDM 6.15 build", bin.display());
        }
        systems.insert(0, System::Reference(bin));
    }
    Ok(systems)
}

/// One timed scour; its wall time. Its log goes to `dir/log`.
fn scour_once(system: &System, conf: &Path, dir: &Path, threads: Option<u16>) -> anyhow::Result<Duration> {
    let mut command = match system {
        System::Ldm7(exe) => {
            let mut command = Command::new(exe);
            command.arg("scour");
            if let Some(threads) = threads {
                command.args(["--threads", &threads.to_string()]);
            }
            command
        }
        System::Reference(bin) => reference_command(bin),
    };
    let log_path = dir.join("log");
    command.args(["-l", "-"]).arg(conf).current_dir(dir).stdin(Stdio::null()).stdout(Stdio::null());
    command.stderr(std::fs::File::create(&log_path)?);
    let started = Instant::now();
    let mut child = command.spawn().with_context(|| format!("start {command:?}"))?;
    let status = child.wait()?;
    let elapsed = started.elapsed();
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    if let Some(message) = reference_refused(&log) {
        bail!("{message}");
    }
    if !status.success() {
        bail!("{} scour failed ({status}): {}", system.name(), log.trim());
    }
    Ok(elapsed)
}

/// Writes the tree afresh (removing what is there); returns what must survive the scour: the
/// directories and the new files, as [`survivors`] lists them.
fn generate(tree: &Path, options: &ScourOptions, now: SystemTime) -> anyhow::Result<Vec<String>> {
    if tree.exists() {
        remove_tree(tree)?;
    }
    let workers = std::thread::available_parallelism().map_or(2, usize::from).min(options.dirs);
    let content = vec![b'x'; options.size];
    let kept = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|worker| {
                let content = &content;
                scope.spawn(move || -> std::io::Result<Vec<String>> {
                    let mut kept = Vec::new();
                    for dir in (worker..options.dirs).step_by(workers) {
                        write_directory(tree, dir, options, content, now, &mut kept)?;
                    }
                    Ok(kept)
                })
            })
            .collect();
        let mut kept = Vec::new();
        for handle in handles {
            kept.extend(handle.join().map_err(|_| anyhow::anyhow!("a tree writer panicked"))??);
        }
        anyhow::Ok(kept)
    })?;
    let mut kept = kept;
    kept.extend((0..options.dirs.div_ceil(DIRS_PER_GROUP)).map(|group| format!("d g{group:03}")));
    kept.sort();
    Ok(kept)
}

/// Leaf directory `index` and its files: file `k` (numbered across the tree) is old when even.
fn write_directory(
    tree: &Path,
    index: usize,
    options: &ScourOptions,
    content: &[u8],
    now: SystemTime,
    kept: &mut Vec<String>,
) -> std::io::Result<()> {
    use std::io::Write;
    let relative = format!("g{:03}/d{:02}", index / DIRS_PER_GROUP, index % DIRS_PER_GROUP);
    let path = tree.join(&relative);
    std::fs::create_dir_all(&path)?;
    kept.push(format!("d {relative}"));
    let per_dir = options.files / options.dirs;
    let extra = usize::from(index < options.files % options.dirs);
    let first = index * per_dir + index.min(options.files % options.dirs);
    for file in first..first + per_dir + extra {
        let name = format!("f{file:07}.dat");
        let old = file % 2 == 0;
        let age = if old { OLD_SECS + (file % 7200) as u64 } else { (file % 3600) as u64 };
        let mut handle = std::fs::File::create(path.join(&name))?;
        handle.write_all(content)?;
        handle.set_modified(now - Duration::from_secs(age))?;
        if !old {
            kept.push(format!("f {relative}/{name}"));
        }
    }
    Ok(())
}

/// Removes a tree, its upper-level directories in parallel.
fn remove_tree(tree: &Path) -> anyhow::Result<()> {
    let groups: Vec<PathBuf> =
        std::fs::read_dir(tree)?.map(|entry| entry.map(|entry| entry.path())).collect::<Result<_, _>>()?;
    let workers = std::thread::available_parallelism().map_or(2, usize::from).clamp(1, groups.len().max(1));
    std::thread::scope(|scope| {
        for worker in 0..workers {
            let groups = &groups;
            scope.spawn(move || {
                for group in groups.iter().skip(worker).step_by(workers) {
                    let _ = std::fs::remove_dir_all(group);
                }
            });
        }
    });
    std::fs::remove_dir_all(tree).with_context(|| format!("remove {}", tree.display()))
}
