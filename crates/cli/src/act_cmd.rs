//! `ldm7 act` (pqact): product actions from a `pqact.conf`, unchanged (ldm-formats.md §2;
//! docs/act.md). Follows the queue and runs every matching entry for each product;
//! `--check` only reads the configuration files, reports the first error with file:line
//! (exit 1), and prints every entry as it was understood.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use ldm7_act::run::{self, Requests, RunError, RunOptions};

use crate::common::{duration_arg, open_queue, parse_feed, parse_pattern, positive_duration_arg, queue_path};
use crate::exit::{CmdResult, bad_input, input, runtime};

/// Arguments of `ldm7 act` / `pqact`.
#[derive(clap::Args, Debug)]
pub struct ActArgs {
    /// Only check the configuration: print each entry as parsed, or the first error with its
    /// file:line (exit 1).
    #[arg(long)]
    pub check: bool,
    /// Only products of this feedtype expression.
    #[arg(short = 'f', long = "feed", default_value = "ANY")]
    pub feed: String,
    /// Only products whose identifier matches this extended regular expression.
    #[arg(short = 'p', long = "pattern", default_value = ".*")]
    pub pattern: String,
    /// Start with products inserted this long ago, e.g. 3600 (seconds) or 1h, instead of
    /// after the last product processed (the state file) or, without one, at new products.
    #[arg(short = 'o', long = "offset", value_name = "DURATION", value_parser = duration_arg)]
    pub offset: Option<Duration>,
    /// The queue [default: $LDM7_QUEUE or ./ldm7.pq].
    #[arg(short = 'q', long = "queue", value_name = "PATH")]
    pub queue: Option<PathBuf>,
    /// Directory that relative paths in the configuration are relative to [default: the
    /// current directory].
    #[arg(short = 'd', long = "datadir", value_name = "DIR")]
    pub datadir: Option<PathBuf>,
    /// How long to wait for new products between checks; 0: stop at the end of the queue.
    #[arg(short = 'i', long = "interval", value_name = "DURATION", default_value = "15", value_parser = duration_arg)]
    pub interval: Duration,
    /// Give up a PIPE decoder that takes no input for this long while products wait for it
    /// (it is killed; the next product starts a new one).
    #[arg(short = 't', long = "pipe-timeout", value_name = "DURATION", default_value = "60", value_parser = positive_duration_arg)]
    pub pipe_timeout: Duration,
    /// Notify an AWIPS EDEX ingest (System V shared memory) of files written by -edex entries.
    #[arg(short = 'e', long = "edex")]
    pub edex: bool,
    /// The most files, databases and decoders kept open at once [default: from the
    /// open-file limit].
    #[arg(long, value_name = "N")]
    pub max_open: Option<usize>,
    /// Where the position is kept [default: the first configuration file + ".state"].
    #[arg(long, value_name = "PATH")]
    pub state: Option<PathBuf>,
    /// Print a summary on standard error at exit.
    #[arg(long)]
    pub summary: bool,
    /// The configuration files, in order [default: pqact.conf].
    #[arg(value_name = "CONF")]
    pub conf: Vec<PathBuf>,
}

/// Runs `ldm7 act`.
pub fn run(args: &ActArgs) -> CmdResult {
    // Without files or a data directory: the site's (`$LDM7_SETTINGS`), else ./pqact.conf and
    // the current directory.
    let site = crate::common::site_settings()?;
    let files = match (&site, args.conf.is_empty()) {
        (_, false) => args.conf.clone(),
        (Some(site), true) => vec![site.pqact.config.clone()],
        (None, true) => vec![PathBuf::from("pqact.conf")],
    };
    let datadir = args.datadir.clone().or_else(|| site.map(|site| site.pqact.datadir));
    if args.check {
        return check(&files);
    }
    let feed = parse_feed(&args.feed)?;
    let pattern = parse_pattern(&args.pattern)?;
    let files: Vec<PathBuf> = files.iter().map(|file| absolute(file)).collect::<CmdResult<_>>()?;
    // The configuration is checked before anything else happens.
    run::load(&files).map_err(|error| match error {
        RunError::Read { .. } => input(error),
        other => bad_input(other),
    })?;
    let queue = open_queue(&absolute(&queue_path(args.queue.as_deref()))?)?;
    let state_file = match &args.state {
        Some(path) => absolute(path)?,
        None => run::default_state_file(&files),
    };
    if let Some(datadir) = &datadir {
        std::env::set_current_dir(datadir)
            .with_context(|| format!("cannot change to the data directory {}", datadir.display()))
            .map_err(input)?;
    }
    let requests = Requests::default();
    for (signal, flag) in [
        (signal_hook::consts::SIGHUP, &requests.reload),
        (signal_hook::consts::SIGTERM, &requests.stop),
        (signal_hook::consts::SIGINT, &requests.stop),
    ] {
        signal_hook::flag::register(signal, flag.clone()).map_err(runtime)?;
    }
    let options = RunOptions {
        conf_files: files,
        feed,
        pattern,
        offset: args.offset,
        interval: (!args.interval.is_zero()).then_some(args.interval),
        pipe_timeout: args.pipe_timeout,
        max_open: args.max_open.unwrap_or_else(default_max_open),
        state_file,
        edex: args.edex,
        // An EXEC child of `ldm7 serve` (which sets LDM7_SERVER_PID) ends with the server.
        exit_with_parent: crate::common::server_pid(),
        fresh_start: crate::common::server_started(),
    };
    let summary = run::run(&queue, &options, &requests).map_err(runtime)?;
    let counters = summary.actions;
    let text = format!(
        "act: {} products read, {} matched, {} actions done, {} failed, {} evicted before reading, \
         {} decoders started, {} products never taken by a decoder, {:.0} s held for want of room",
        summary.read,
        summary.matched,
        counters.done,
        counters.failed,
        summary.skipped,
        counters.decoders_started,
        counters.pipe_dropped,
        summary.held_for_room.as_secs_f64()
    );
    tracing::info!("{text}");
    if args.summary {
        eprintln!("{text}");
    }
    Ok(())
}

fn check(files: &[PathBuf]) -> CmdResult {
    let mut entries = 0;
    for file in files {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read the configuration {}", file.display()))
            .map_err(input)?;
        let conf = ldm7_act::parse(&file.display().to_string(), &text).map_err(bad_input)?;
        for entry in &conf.entries {
            println!("{entry}");
        }
        entries += conf.entries.len();
    }
    eprintln!("{entries} entries in {} file(s): valid", files.len());
    Ok(())
}

fn absolute(path: &Path) -> CmdResult<PathBuf> {
    std::path::absolute(path).with_context(|| format!("cannot resolve {}", path.display())).map_err(input)
}

/// Half the open-file limit less a margin (a decoder takes two descriptors: its input and its
/// standard error), as pqact keeps its outputs under `OPEN_MAX − 3`.
fn default_max_open() -> usize {
    let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(soft, _)| soft)
        .unwrap_or(1024);
    let soft = usize::try_from(soft.min(1 << 20)).unwrap_or(1024);
    (soft.saturating_sub(32) / 2).max(8)
}
