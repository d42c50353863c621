//! `ldm7 scour` (scour): deletes old files from the directories a scour.conf names, with LDM's
//! flags (`-d`, `-e`, `-l`, `-v`, `-x`) and configuration (docs/operations.md "scour"); the work
//! is [`ldm7_scour`]'s.
//!
//! Where things are: the configuration defaults to `etc/scour.conf` and the excludes file to
//! `etc/scour_excludes.conf` (used when it exists), both under the current directory, which is
//! the LDM home for every ldm7 command as for a cron line `cd ~ldm && scour`; relative
//! directories in the configuration are relative to `--datadir` (LDM: `regutil
//! /pqact/datadir-path`), the current directory by default, as for `ldm7 act -d`.
//!
//! Exit codes: 0 when the configuration was read, even when some of its lines had problems
//! (each logged with file:line and skipped) or some files could not be deleted (each logged),
//! as LDM's scour; 1 when the configuration or the excludes file cannot be read, or with
//! `--check` when any line has a problem; 2 when the worker threads cannot start.

use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, anyhow};
use ldm7_io::log_target::PRODUCT;
use ldm7_scour::{Excludes, Options, Plan, Resolver};

use crate::exit::{CmdResult, bad_input, input, runtime};

/// The configuration used when none is given (LDM's place under its home).
const CONFIG_DEFAULT: &str = "etc/scour.conf";

/// The excludes file used, when it exists, if `-e` is not given (LDM's
/// `regutil /scour/exclude-path`).
const EXCLUDES_DEFAULT: &str = "etc/scour_excludes.conf";

/// Arguments of `ldm7 scour` / `scour`.
#[derive(clap::Args, Debug)]
pub struct ScourArgs {
    /// Also remove directories that are or become empty (a top directory only when it was
    /// empty before, as LDM).
    #[arg(short = 'd', long = "delete-dirs")]
    pub delete_dirs: bool,
    /// File listing directories to leave alone, one a line [default: etc/scour_excludes.conf
    /// when it exists].
    #[arg(short = 'e', long = "excludes", value_name = "EXCLUDES")]
    pub excludes: Option<PathBuf>,
    /// Directory that relative directories of the configuration are relative to [default: the
    /// current directory].
    #[arg(long = "datadir", value_name = "DIR")]
    pub datadir: Option<PathBuf>,
    /// Only check the configuration: print each entry as understood and every problem with its
    /// file:line (exit 1 if there is one); delete nothing.
    #[arg(long)]
    pub check: bool,
    /// Keep a `.scour<PATTERN>` file at the top of each directory and delete nothing there when
    /// no matching file arrived since the last scour (LDM's scour.sh rule; LDM 6.15's scour
    /// does not apply it).
    #[arg(long)]
    pub sentinel: bool,
    /// Worker threads [default: eight per core, at most 64].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
    /// The configuration: lines `DIRECTORY AGE [PATTERN]` [default: etc/scour.conf].
    #[arg(value_name = "CONFIG")]
    pub config: Option<PathBuf>,
}

/// Runs `ldm7 scour`.
pub fn run(args: &ScourArgs) -> CmdResult {
    // Without a configuration or a data directory: the site's (`$LDM7_SETTINGS`), else LDM's
    // places under the current directory.
    let site = crate::common::site_settings()?;
    let config = args
        .config
        .clone()
        .or_else(|| site.as_ref().map(|site| site.scour_config.clone()))
        .unwrap_or_else(|| PathBuf::from(CONFIG_DEFAULT));
    let text = std::fs::read(&config).map_err(|error| {
        let hint = if args.config.is_some() { "check the path" } else { "give the configuration as the argument" };
        bad_input(format!("cannot read the scour configuration {}: {error}: {hint}", config.display()))
    })?;
    let datadir = args
        .datadir
        .clone()
        .or_else(|| site.as_ref().map(|site| site.pqact.datadir.clone()))
        .unwrap_or_else(|| PathBuf::from("."));
    let resolver =
        Resolver::new(&datadir).with_context(|| format!("data directory {}", datadir.display())).map_err(input)?;
    let plan = ldm7_scour::plan(&text, &config, &resolver);
    let excludes = load_excludes(args.excludes.as_deref(), &resolver.datadir)?;
    if args.check {
        return check(&plan, &excludes);
    }
    for problem in &plan.problems {
        if problem.is_missing_directory() {
            tracing::warn!("{problem}");
        } else {
            tracing::error!("{problem}");
        }
    }
    if plan.jobs.is_empty() {
        tracing::warn!("{}: no valid entries: nothing to scour", config.display());
        return Ok(());
    }
    let now_secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_secs() as i64);
    let options = Options { delete_dirs: args.delete_dirs, excludes, sentinel: args.sentinel, now_secs };
    let threads = args.threads.map_or_else(ldm7_scour::threads_default, usize::from);
    tracing::debug!("scouring {} entries of {} with {threads} threads", plan.jobs.len(), config.display());
    let started = Instant::now();
    let reports = ldm7_scour::scour(&plan.jobs, &options, threads).map_err(runtime)?;
    let mut files_deleted = 0;
    let mut errors = 0;
    for report in &reports {
        tracing::info!(target: PRODUCT, "{report}");
        files_deleted += report.counts.files_deleted;
        errors += report.counts.errors;
    }
    tracing::info!(
        target: PRODUCT,
        "scoured {} entries of {}: {files_deleted} files deleted, {errors} errors, in {:.3} s",
        reports.len(),
        config.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The excludes file: `-e` (a warning when it does not exist, which excludes nothing, as in
/// LDM), else the default when it exists.
fn load_excludes(given: Option<&Path>, datadir: &Path) -> CmdResult<Excludes> {
    let path = given.unwrap_or(Path::new(EXCLUDES_DEFAULT));
    match Excludes::load(path, datadir).map_err(input)? {
        Some(excludes) => Ok(excludes),
        None => {
            if given.is_some() {
                tracing::warn!("the excludes file {} does not exist: nothing is excluded", path.display());
            }
            Ok(Excludes::default())
        }
    }
}

/// `--check`: each entry on standard output, each problem on standard error.
fn check(plan: &Plan, excludes: &Excludes) -> CmdResult {
    for job in &plan.jobs {
        println!("{}: {}  older than {}  matching {}", job.origin, job.directory.display(), job.age, job.pattern);
    }
    if !excludes.is_empty() {
        println!("{} directories excluded", excludes.len());
    }
    for problem in &plan.problems {
        eprintln!("{problem}");
    }
    match plan.problems.len() {
        0 => Ok(()),
        count => Err(input(anyhow!("{count} problems in the configuration (above)"))),
    }
}
