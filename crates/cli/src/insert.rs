//! `ldm7 insert` (pqinsert): files or standard input into the queue, and `--replay` of a trace.
//! Everything is validated before anything is inserted, so a bad batch leaves the queue as it was.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use ldm7_pq::{InsertError, InsertOutcome, Queue};
use ldm7_types::{FeedType, ProdInfo, Signature, Timestamp};
use rand::{RngCore, SeedableRng};

use ldm7_io::log_target::PRODUCT;

use crate::common::{now, open_queue, origin, parse_feed, queue_path, speed_arg};
use crate::exit::{CmdResult, Failure, bad_input, runtime};
use crate::trace::{TraceProduct, feed_from_name, read_trace};

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

/// Totals of a replay.
#[derive(Debug, Default, Clone, Copy)]
pub struct ReplaySummary {
    /// Products inserted.
    pub inserted: u64,
    /// Bytes of data inserted.
    pub bytes: u64,
    /// Products refused as duplicates.
    pub duplicates: u64,
    /// Old products evicted to make room.
    pub evicted: u64,
    /// Wall time.
    pub elapsed: Duration,
}

fn replay(args: &InsertArgs, trace: &Path, with_signature: bool) -> CmdResult {
    let feed = match &args.feed {
        Some(feed) => Some(parse_feed(feed)?),
        None => None,
    };
    let mut products = read_trace(trace).map_err(bad_input)?;
    if let Some(span) = args.span {
        crate::trace::keep_span(&mut products, span);
    }
    if let Some(limit) = args.limit {
        products.truncate(limit);
    }
    let queue = open_queue(&queue_path(args.queue.as_deref()))?;
    let default_feed = feed.or_else(|| feed_from_name(trace)).unwrap_or(FeedType::EXP);
    let summary = replay_into(
        &queue,
        trace,
        &products,
        default_feed,
        feed.is_some(),
        args.speed,
        args.seed,
        Some(with_signature),
    )?;
    let secs = summary.elapsed.as_secs_f64().max(1e-9);
    println!(
        "replayed {} products ({:.1} MB) in {:.2} s: {:.0} products/s, {:.1} MB/s; {} duplicates, {} evicted",
        summary.inserted,
        summary.bytes as f64 / 1e6,
        secs,
        summary.inserted as f64 / secs,
        summary.bytes as f64 / 1e6 / secs,
        summary.duplicates,
        summary.evicted
    );
    Ok(())
}

/// Inserts synthetic products shaped like `products` into `queue`, paced at `speed` (0 = no
/// pacing). Each product's data is pseudo-random (seeded) and unique; its signature is the MD5
/// of the data. The ident is `<FEED>/<trace name>/<line> <creation time>`. With
/// `log_products = Some(with_signature)` each inserted product is logged (shown with `-v`) and a
/// progress bar is drawn on a terminal; `None` is silent.
#[allow(clippy::too_many_arguments)]
pub fn replay_into(
    queue: &Queue,
    trace: &Path,
    products: &[TraceProduct],
    default_feed: FeedType,
    force_feed: bool,
    speed: f64,
    seed: u64,
    log_products: Option<bool>,
) -> CmdResult<ReplaySummary> {
    let trace_name = trace.file_stem().map(|stem| stem.to_string_lossy().into_owned()).unwrap_or_default();
    let largest = products.iter().map(|product| product.size as usize).max().unwrap_or(0);
    for product in products {
        let info = info_for(product, default_feed, force_feed, &trace_name, Signature::default(), Timestamp::ZERO);
        queue.check_fits(&info).map_err(|error| bad_input(format!("{}:{}: {error}", trace.display(), product.line)))?;
    }
    // A pool of random bytes; each product is a window of it with its own index stamped in front.
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut pool = vec![0u8; largest + (1 << 20)];
    rng.fill_bytes(&mut pool);
    let total_bytes: u64 = products.iter().map(|product| u64::from(product.size)).sum();
    let progress = if log_products.is_some() && std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(total_bytes);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    let origin = origin();
    let start = Instant::now();
    let first_created = products.first().map(|product| product.created.as_unix_micros()).unwrap_or(0);
    let mut summary = ReplaySummary::default();
    let mut data = Vec::with_capacity(largest);
    for (index, product) in products.iter().enumerate() {
        if speed > 0.0 {
            let offset_secs = (product.created.as_unix_micros() - first_created).max(0) as f64 / 1e6 / speed;
            let due = start + Duration::from_secs_f64(offset_secs);
            let wait = due.saturating_duration_since(Instant::now());
            if !wait.is_zero() {
                std::thread::sleep(wait);
            }
        }
        let size = product.size as usize;
        let window = (index.wrapping_mul(7919) ^ seed as usize) % (1 << 20);
        data.clear();
        data.extend_from_slice(&pool[window..window + size]);
        let stamp = (index as u64).to_be_bytes().into_iter().chain(seed.to_be_bytes());
        for (byte, value) in data.iter_mut().zip(stamp) {
            *byte = value;
        }
        let mut info = info_for(product, default_feed, force_feed, &trace_name, Signature::md5_of(&data), now());
        info.origin.clone_from(&origin);
        match queue.insert(&info, &data) {
            Ok(InsertOutcome::Inserted { evicted, .. }) => {
                if let Some(with_signature) = log_products {
                    progress.suspend(|| tracing::info!(target: PRODUCT, "{}", info.line(with_signature)));
                }
                summary.inserted += 1;
                summary.bytes += u64::from(product.size);
                summary.evicted += u64::from(evicted);
            }
            Ok(InsertOutcome::Duplicate { .. }) => summary.duplicates += 1,
            Err(error) => {
                progress.abandon();
                return Err(runtime(anyhow::anyhow!(
                    "{}:{}: inserting failed after {} products: {error}",
                    trace.display(),
                    product.line,
                    summary.inserted
                )));
            }
        }
        progress.inc(u64::from(product.size));
        if index % 256 == 0 {
            progress.set_message(format!("{} products", index + 1));
        }
    }
    progress.finish_and_clear();
    summary.elapsed = start.elapsed();
    Ok(summary)
}

fn info_for(
    product: &TraceProduct,
    default_feed: FeedType,
    force_feed: bool,
    trace_name: &str,
    signature: Signature,
    arrival: Timestamp,
) -> ProdInfo {
    let feedtype = if force_feed { default_feed } else { product.feed.unwrap_or(default_feed) };
    let mut ident = format!("{feedtype}/{trace_name}/{} {}", product.line, product.created);
    ident.truncate(ldm7_types::IDENT_LEN_MAX);
    ProdInfo {
        arrival,
        signature,
        origin: String::new(),
        feedtype,
        seqno: product.line as u32,
        ident,
        size: product.size,
    }
}
