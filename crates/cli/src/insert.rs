//! `ldm7 insert` (pqinsert): files or standard input into the queue, and `--replay` of a trace
//! (the replay itself is the test bed's, [`ldm7_testbed::replay::replay_into`]). Everything is
//! validated before anything is inserted, so a bad batch leaves the queue as it was.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ldm7_pq::InsertError;
use ldm7_testbed::replay::replay_into;
use ldm7_testbed::trace::{keep_span, read_trace};
use ldm7_types::trace::feed_from_name;
use ldm7_types::{FeedType, ProdInfo, Signature, Timestamp};

use ldm7_io::log_target::PRODUCT;

use crate::common::{open_queue, origin, parse_feed, queue_path, speed_arg};
use crate::exit::{CmdResult, Failure, bad_input, runtime};

/// Arguments of `ldm7 insert` / `pqinsert`.
#[derive(clap::Args, Debug)]
pub struct InsertArgs {
    /// Feedtype of the products [default: EXP; with --replay: the trace's feed].
    #[arg(short = 'f', long = "feed", value_name = "FEED")]
    pub feed: Option<String>,
    /// Product identifier [default: the file name].
    #[arg(short = 'p', long = "ident", value_name = "IDENT")]
    pub ident: Option<String>,
    /// Sequence number.
    #[arg(short = 's', long = "seqno", default_value_t = 0)]
    pub seqno: u32,
    /// Signature = MD5 of the identifier instead of the data.
    #[arg(short = 'i')]
    pub signature_from_ident: bool,
    /// The queue [default: $LDM7_QUEUE or ./ldm7.pq].
    #[arg(short = 'q', long = "queue", value_name = "PATH")]
    pub queue: Option<PathBuf>,
    /// Accepted for LDM's pqinsert (its first guess at a product's size, for standard input);
    /// each file's size is known here.
    #[arg(short = 'n', value_name = "SIZE")]
    pub size_guess: Option<u64>,
    /// Accepted for LDM's pqinsert (read the files rather than map them): files are read.
    #[arg(short = 'r')]
    pub read: bool,
    /// Insert synthetic products following this trace (`SIZE YYYYMMDDhhmmss.fff [FEED]` lines).
    #[arg(long, value_name = "TRACE", conflicts_with_all = ["files", "ident", "signature_from_ident"])]
    pub replay: Option<PathBuf>,
    /// Replay speed: 1 = the trace's own pace, 60 = an hour in a minute, 0 = as fast as possible.
    #[arg(long, default_value_t = 1.0, requires = "replay", value_parser = speed_arg)]
    pub speed: f64,
    /// Replay at most this many products.
    #[arg(long, requires = "replay")]
    pub limit: Option<usize>,
    /// Replay only the trace's first DURATION (of trace time), e.g. 10min.
    #[arg(long, value_name = "DURATION", requires = "replay", value_parser = crate::common::duration_arg)]
    pub span: Option<Duration>,
    /// Seed of the synthetic product contents.
    #[arg(long, default_value_t = 1, requires = "replay")]
    pub seed: u64,
    /// Files to insert; `-` reads standard input.
    #[arg(value_name = "FILE")]
    pub files: Vec<PathBuf>,
}

/// Runs `insert`. With `-v` each inserted product is logged (INFO), with the signature when
/// `with_signature` (`-x`).
pub fn run(args: &InsertArgs, with_signature: bool) -> CmdResult {
    if let Some(trace) = &args.replay {
        return replay(args, trace, with_signature);
    }
    if args.files.is_empty() {
        return Err(bad_input("no files to insert: name one or more files, or `-` for standard input"));
    }
    let feed = parse_feed(args.feed.as_deref().unwrap_or("EXP"))?;
    let queue_path = queue_path(args.queue.as_deref());
    let queue = open_queue(&queue_path)?;
    let origin = origin();
    // Check every input first (it exists, can be read, and fits the queue), so that a bad
    // argument leaves the queue as it was; the data is read afterwards, one product at a time.
    // The checks (two system calls a file) run on every core, in slices of the argument list.
    let check = |file: &PathBuf| -> CmdResult<Input> {
        let ident = match &args.ident {
            Some(ident) => ident.clone(),
            None if file.as_os_str() == "-" => "stdin".to_owned(),
            None => file.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default(),
        };
        let size = input_size(file)?;
        let size = u32::try_from(size).map_err(|_| {
            bad_input(format!("{}: {size} bytes is more than a product may hold (4 GiB)", file.display()))
        })?;
        let info = ProdInfo {
            arrival: Timestamp::ZERO,
            signature: Signature::default(),
            origin: origin.clone(),
            feedtype: feed,
            seqno: args.seqno,
            ident,
            size,
        };
        queue.check_fits(&info).map_err(|error| insert_failure(file, error, 0))?;
        Ok(Input { path: file.clone(), info })
    };
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let slice_len = args.files.len().div_ceil(threads).max(1);
    let checked: Vec<CmdResult<Vec<Input>>> = std::thread::scope(|scope| {
        let slices: Vec<_> = args
            .files
            .chunks(slice_len)
            .map(|slice| scope.spawn(|| slice.iter().map(&check).collect::<CmdResult<Vec<Input>>>()))
            .collect();
        slices
            .into_iter()
            .map(|slice| slice.join().unwrap_or_else(|_| Err(bad_input("checking the files failed"))))
            .collect()
    });
    let mut inputs = Vec::with_capacity(args.files.len());
    for slice in checked {
        inputs.extend(slice?);
    }
    queue.set_release_pages(true);
    let inserted = crate::insert_files::insert_all(&queue, inputs, args.signature_from_ident, with_signature)?;
    tracing::info!(target: PRODUCT, "inserted {inserted} of {} product(s) into {}", args.files.len(), queue_path.display());
    Ok(())
}

/// A file to insert, checked, with its metadata (signature and arrival still to be set).
pub(crate) struct Input {
    pub(crate) path: PathBuf,
    pub(crate) info: ProdInfo,
}

/// The size of a file to insert, after checking that it is a readable file (`-` = standard
/// input, whose size is known only once read: 0 here).
fn input_size(file: &Path) -> CmdResult<u64> {
    if file.as_os_str() == "-" {
        return Ok(0);
    }
    let cannot = |why: String| bad_input(format!("cannot read {}: {why}: nothing was inserted", file.display()));
    let metadata = std::fs::metadata(file).map_err(|error| cannot(error.to_string()))?;
    if metadata.is_dir() {
        return Err(cannot("it is a directory".into()));
    }
    nix::unistd::access(file, nix::unistd::AccessFlags::R_OK).map_err(|error| cannot(error.desc().to_lowercase()))?;
    Ok(metadata.len())
}

/// What a failed insert leaves in the queue, after `inserted` products of the batch went in.
pub(crate) fn inserted_so_far(inserted: u64) -> String {
    if inserted == 0 {
        "nothing was inserted".to_owned()
    } else {
        format!("the {inserted} product(s) before it were inserted, none after")
    }
}

/// The failure of inserting `file`, after `inserted` products went in.
pub(crate) fn insert_failure(file: &Path, error: InsertError, inserted: u64) -> Failure {
    let message = format!("{}: {error}", file.display());
    let done = inserted_so_far(inserted);
    match error {
        InsertError::Invalid(_) | InsertError::TooBig { .. } => bad_input(format!("{message}; {done}")),
        InsertError::MapFull | InsertError::Storage(_) | InsertError::Source(_) => {
            runtime(anyhow::anyhow!("{message}; {done}"))
        }
    }
}

fn replay(args: &InsertArgs, trace: &Path, with_signature: bool) -> CmdResult {
    let feed = match &args.feed {
        Some(feed) => Some(parse_feed(feed)?),
        None => None,
    };
    let mut products = read_trace(trace).map_err(bad_input)?;
    if let Some(span) = args.span {
        keep_span(&mut products, span);
    }
    if let Some(limit) = args.limit {
        products.truncate(limit);
    }
    let queue = open_queue(&queue_path(args.queue.as_deref()))?;
    let default_feed = feed.or_else(|| feed_from_name(trace)).unwrap_or(FeedType::EXP);
    let totals = replay_into(
        &queue,
        trace,
        &products,
        default_feed,
        feed.is_some(),
        args.speed,
        args.seed,
        Some(with_signature),
    )?;
    println!("{totals}");
    Ok(())
}
