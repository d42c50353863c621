//! The action loop of `ldm7 act` (pqact): follows the queue in insertion order and runs every
//! matching entry of the configuration for each product, in file order.
//!
//! * Where it starts: `now − offset` when an offset is given; otherwise just after the product
//!   the state file names (ldm-formats.md §2, [`super::state`]); otherwise at the tail (new
//!   products only).
//! * A reload request (SIGHUP) rereads the configuration between products; a file that does
//!   not parse keeps the old configuration and the error names its file:line.
//! * A stop request (SIGTERM) is seen between products: the product in hand is finished, files
//!   and decoders are closed, the position is saved.
//! * With no interval (`-i 0`) the loop ends when it reaches the end of the queue, as pqact's.
//! * A FILE write refused for want of room (a full disk, a quota) holds the product: the write
//!   is undone and tried again every second until it fits, so a disk filled and freed loses no
//!   file (LDM's pqact logs the error and goes on to the next product). The queue keeps what
//!   arrives meanwhile; a hold longer than the queue's span would show as products evicted
//!   before they were processed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ldm7_io::log_target::PRODUCT;
use ldm7_pq::{OwnedProduct, Queue};
use ldm7_types::{FeedType, Pattern, Timestamp};

use super::conf::{Conf, ConfError, parse};
use super::edex::Edex;
use super::outputs::{ActCounters, Outputs, Ran};
use super::state::{self, Position};

/// How often the loop looks at its signal flags while the queue is quiet.
const SIGNAL_POLL: Duration = Duration::from_millis(200);
/// How often the position is saved while products flow (and always when the queue goes quiet
/// and at exit).
const SAVE_EVERY: Duration = Duration::from_secs(5);
/// How often a FILE write refused for want of room is tried again.
const NO_ROOM_RETRY: Duration = Duration::from_secs(1);

/// What `ldm7 act` was asked to do.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The configuration files, in order (absolute paths: the loop may run in a data
    /// directory).
    pub conf_files: Vec<PathBuf>,
    /// Only products of these feedtypes (`-f`).
    pub feed: FeedType,
    /// Only products whose identifier matches (`-p`).
    pub pattern: Pattern,
    /// Start `offset` before now instead of where the state file says (`-o`).
    pub offset: Option<Duration>,
    /// How long to wait for products between checks; `None`: stop at the end of the queue
    /// (`-i 0`).
    pub interval: Option<Duration>,
    /// A decoder that takes no input this long while products wait for it is given up (`-t`).
    pub pipe_timeout: Duration,
    /// The bound on open outputs.
    pub max_open: usize,
    /// Where the position is kept.
    pub state_file: PathBuf,
    /// Where to start without a state file or `-o`: the server's start for an EXEC child of
    /// `ldm7 serve` (`LDM7_SERVER_STARTED`), so that it acts on every product the server
    /// inserted, however late it got going; `None`: the products that arrive from now on.
    pub fresh_start: Option<Timestamp>,
    /// Notify an EDEX ingest of files written by `-edex` entries (`-e`).
    pub edex: bool,
    /// Stop (as on SIGTERM) when the parent process is no longer this one (the server's pid,
    /// `LDM7_SERVER_PID`): an EXEC child of a server that was killed outright, which would
    /// otherwise act on beside the next server's own child.
    pub exit_with_parent: Option<u32>,
}

/// Requests from signal handlers.
#[derive(Clone, Debug, Default)]
pub struct Requests {
    /// Reread the configuration (SIGHUP).
    pub reload: Arc<AtomicBool>,
    /// Finish the product in hand and stop (SIGTERM, SIGINT).
    pub stop: Arc<AtomicBool>,
}

/// What a run did.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunSummary {
    /// Products read from the queue.
    pub read: u64,
    /// Products that matched at least one entry.
    pub matched: u64,
    /// Products evicted from the queue before they could be read.
    pub skipped: u64,
    /// Configuration reloads done (and refused).
    pub reloads: u64,
    /// Reloads refused because the new configuration did not parse.
    pub reloads_refused: u64,
    /// What the actions did.
    pub actions: ActCounters,
    /// Time spent holding a product until a full file system had room.
    pub held_for_room: Duration,
}

/// Why the loop cannot run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A configuration file cannot be read.
    #[error("cannot read the configuration {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A configuration file does not parse.
    #[error(transparent)]
    Conf(#[from] ConfError),
    /// The queue failed.
    #[error("the queue: {0}")]
    Queue(#[from] ldm7_pq::StorageError),
}

/// Reads and parses the configuration files into one configuration (entries in order).
pub fn load(files: &[PathBuf]) -> Result<Conf, RunError> {
    let mut conf = Conf::default();
    for file in files {
        let text = std::fs::read_to_string(file).map_err(|source| RunError::Read { path: file.clone(), source })?;
        conf.entries.extend(parse(&file.display().to_string(), &text)?.entries);
    }
    Ok(conf)
}

/// Where to start: the insertion time of the first product to consider.
fn start(queue: &Queue, options: &RunOptions) -> Result<Timestamp, RunError> {
    let now = Timestamp::from_system_time(std::time::SystemTime::now());
    if let Some(offset) = options.offset {
        return Ok(now.saturating_sub(offset));
    }
    let saved = match state::read(&options.state_file) {
        Ok(saved) => saved,
        Err(error) => {
            tracing::warn!("act: cannot resume from the state file: {error}; starting with new products");
            None
        }
    };
    let Some(saved) = saved else {
        if let Some(started) = options.fresh_start.filter(|started| *started <= now) {
            tracing::info!(
                "act: no state file {}: starting with the products inserted since the server started ({started})",
                options.state_file.display()
            );
            return Ok(started);
        }
        tracing::info!("act: no state file {}: starting with new products", options.state_file.display());
        return Ok(now);
    };
    if saved.insertion > now {
        tracing::warn!("act: the state file's time is in the future; starting with new products");
        return Ok(now);
    }
    let snapshot = queue.snapshot()?;
    match snapshot.product_at_or_after(saved.insertion)? {
        Some(product) if product.insertion == saved.insertion => {
            if let Some(signature) = saved.signature
                && signature != product.info.signature
            {
                tracing::warn!(
                    "act: the product at the saved position is not the one processed last \
                         (another queue?); resuming by time"
                );
            }
        }
        _ => tracing::info!("act: the last product processed is no longer in the queue; resuming by time"),
    }
    tracing::info!("act: resuming after the product inserted at {}", saved.insertion);
    Ok(Timestamp::from_unix_micros(saved.insertion.as_unix_micros() + 1))
}

/// Runs the loop until the end of the queue (`-i 0`) or a stop request.
pub fn run(queue: &Queue, options: &RunOptions, requests: &Requests) -> Result<RunSummary, RunError> {
    let mut conf = load(&options.conf_files)?;
    let edex = if options.edex {
        match Edex::open() {
            Ok(edex) => Some(edex),
            Err(error) => {
                tracing::error!("act: {error}");
                None
            }
        }
    } else {
        None
    };
    let mut outputs = Outputs::new(options.max_open, options.pipe_timeout, edex);
    let mut follower = queue.follow(start(queue, options)?);
    // Said once the start position is fixed: a product inserted after this line is processed.
    tracing::info!("act: {} entries from {} configuration file(s)", conf.entries.len(), options.conf_files.len());
    let mut summary = RunSummary::default();
    let mut position: Option<Position> = None;
    let mut saved: Option<Position> = None;
    let mut last_save = Instant::now();
    let wait = options.interval.map_or(Duration::ZERO, |interval| interval.min(SIGNAL_POLL));
    loop {
        if requests.stop.load(Ordering::Relaxed) {
            tracing::info!("act: stopping");
            break;
        }
        // Looked at between products, at least every SIGNAL_POLL.
        if parent_gone(options) {
            tracing::warn!("act: the server that started it is gone; stopping");
            break;
        }
        if requests.reload.swap(false, Ordering::Relaxed) {
            summary.reloads += 1;
            match load(&options.conf_files) {
                Ok(new) => {
                    tracing::info!("act: configuration reread: {} entries", new.entries.len());
                    conf = new;
                }
                Err(error) => {
                    summary.reloads_refused += 1;
                    tracing::error!("act: configuration not changed: {error}");
                }
            }
        }
        let product: Option<OwnedProduct> = follower.next_owned(Some(wait))?;
        let Some(product) = product else {
            if position != saved {
                save(options, position.as_ref());
                saved = position;
                last_save = Instant::now();
            }
            outputs.idle();
            if options.interval.is_none() {
                break;
            }
            continue;
        };
        summary.read += 1;
        if follower.skipped() > summary.skipped {
            tracing::warn!(
                "act: {} product(s) were evicted from the queue before they could be processed",
                follower.skipped() - summary.skipped
            );
            summary.skipped = follower.skipped();
        }
        let info = &product.info;
        if options.feed.intersects(info.feedtype) && options.pattern.is_match(&info.ident) {
            // Every product read is logged (`-v`), matched or not, as LDM's pqact does.
            tracing::info!(target: PRODUCT, "{info}");
            let chosen = conf.matching(info);
            if !chosen.is_empty() {
                summary.matched += 1;
            }
            for (entry, matched) in chosen {
                let args = super::arguments(entry, info, &matched);
                tracing::debug!("act: {}: {} {}", entry.source, entry.action.kind.name(), args.join(" "));
                // A full disk holds the product here (the queue keeps it and what follows) and
                // the action is tried again every NO_ROOM_RETRY, until there is room or a stop.
                let mut held_since: Option<Instant> = None;
                while outputs.run(entry, &args, info, &product.data) == Ran::NoRoom {
                    held_since.get_or_insert_with(Instant::now);
                    if requests.stop.load(Ordering::Relaxed) || parent_gone(options) {
                        break;
                    }
                    std::thread::sleep(NO_ROOM_RETRY);
                }
                if let Some(since) = held_since {
                    summary.held_for_room += since.elapsed();
                }
            }
        }
        position = Some(Position { insertion: product.insertion, signature: Some(info.signature) });
        if last_save.elapsed() >= SAVE_EVERY {
            save(options, position.as_ref());
            saved = position;
            last_save = Instant::now();
        }
    }
    outputs.close_all();
    save(options, position.as_ref());
    summary.actions = outputs.counters();
    Ok(summary)
}

/// True when this is an EXEC child whose server is gone.
fn parent_gone(options: &RunOptions) -> bool {
    options.exit_with_parent.is_some_and(|parent| std::os::unix::process::parent_id() != parent)
}

fn save(options: &RunOptions, position: Option<&Position>) {
    let Some(position) = position else { return };
    if let Err(error) = state::write(&options.state_file, position) {
        tracing::error!("act: cannot save the position: {error}");
    }
}

/// The state file for a run: beside the first configuration file.
pub fn default_state_file(conf_files: &[PathBuf]) -> PathBuf {
    state::state_path(conf_files.first().map_or(Path::new("pqact.conf"), PathBuf::as_path))
}
