//! `ldm7 queue create | info | check` (pqcreate, pqmon, pqcheck).

use std::path::PathBuf;

use ldm7_pq::{Capacity, CreateError, OpenError, Queue, QueueStats};

use crate::common::{now, open_queue, queue_path};
use crate::exit::{CmdResult, bad_input, input, runtime};
use ldm7_types::ByteSize;

/// `ldm7 queue …`
#[derive(clap::Subcommand, Debug)]
pub enum QueueCommand {
    /// Create a product queue (pqcreate).
    Create(CreateArgs),
    /// Show capacity, usage and ages (pqmon).
    Info(InfoArgs),
    /// Verify every record and index of a queue (pqcheck); exit 2 if damaged.
    Check(PathArgs),
}

/// Arguments of `queue create`.
#[derive(clap::Args, Debug)]
pub struct CreateArgs {
    /// Where to create the queue, in an existing directory [default: $LDM7_QUEUE or ./ldm7.pq].
    #[arg(long, short = 'q', visible_alias = "queue", value_name = "PATH")]
    pub path: Option<PathBuf>,
    /// Capacity in bytes: K/M/G = 10^3/10^6/10^9 as in LDM, or KiB/MiB/GiB.
    #[arg(long, short = 's', default_value = "500M")]
    pub size: ByteSize,
    /// Most products the queue holds [default: size / 140000, LDM's rule].
    #[arg(long, short = 'S')]
    pub slots: Option<u64>,
    /// Replace an existing queue at the path (never anything that is not a queue).
    #[arg(long, short = 'c', visible_alias = "clobber")]
    pub force: bool,
}

/// Arguments of `queue info`.
#[derive(clap::Args, Debug)]
pub struct InfoArgs {
    #[command(flatten)]
    pub path: PathArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Print LDM's size parameters on one line and exit (pqmon -S, read by ldmadmin's
    /// vetqueuesize): full (0/1), capacity bytes, most bytes used, bytes used, slots, most
    /// products, products, age of the oldest and of the newest (s), minimum residence time
    /// (s), and bytes and products at that time (-1 and 0 before any eviction).
    #[arg(short = 'S', long = "size-parameters", conflicts_with = "json")]
    pub size_parameters: bool,
    /// Print again every so many seconds (pqmon -i; 0: once).
    #[arg(short = 'i', long = "interval", value_name = "SECONDS", default_value_t = 0)]
    pub interval: u64,
}

/// The queue path alone.
#[derive(clap::Args, Debug)]
pub struct PathArgs {
    /// The queue [default: $LDM7_QUEUE or ./ldm7.pq].
    #[arg(long, short = 'q', visible_alias = "queue", value_name = "PATH")]
    pub path: Option<PathBuf>,
    /// Accepted for LDM's pqcheck -F (create a missing writer counter): an ldm7 queue has
    /// none; the check is the same.
    #[arg(short = 'F', hide_short_help = true)]
    pub force: bool,
}

/// Runs a queue subcommand.
pub fn run(command: &QueueCommand) -> CmdResult {
    match command {
        QueueCommand::Create(args) => create(args),
        QueueCommand::Info(args) => info(args),
        QueueCommand::Check(args) => check(args),
    }
}

fn create(args: &CreateArgs) -> CmdResult {
    let path = queue_path(args.path.as_deref());
    let bytes = args.size.bytes();
    let slots = args.slots.unwrap_or_else(|| Capacity::default_slots(bytes));
    if slots == 0 {
        return Err(bad_input("slots must be at least 1: give --slots, e.g. --slots 100000"));
    }
    // The queue goes in an existing directory, as pqcreate's: a mistyped path must not grow a
    // tree of directories.
    if let Some(parent) = path.parent().filter(|parent| !parent.as_os_str().is_empty())
        && !parent.is_dir()
    {
        return Err(bad_input(format!(
            "cannot create {}: the directory {} does not exist; create it first (mkdir -p {})",
            path.display(),
            parent.display(),
            parent.display()
        )));
    }
    let queue = Queue::create(&path, Capacity { bytes, slots }, args.force).map_err(|error| match error {
        CreateError::Exists(_)
        | CreateError::NotAQueue(_)
        | CreateError::Capacity(_)
        | CreateError::NoSpace { .. }
        | CreateError::NoSpaceToReplace { .. } => input(error),
        CreateError::FileSystemFull { .. } | CreateError::Storage { .. } | CreateError::Open(_) => runtime(error),
    })?;
    let capacity = queue.capacity();
    println!("created product queue {}: {} bytes, {} slots", path.display(), capacity.bytes, capacity.slots);
    Ok(())
}

fn info(args: &InfoArgs) -> CmdResult {
    let path = queue_path(args.path.path.as_deref());
    let queue = open_queue(&path)?;
    loop {
        let stats = queue.stats().map_err(runtime)?;
        if args.size_parameters {
            println!("{}", size_parameters(&stats));
        } else if args.json {
            println!("{}", info_json(&path, &stats));
        } else {
            print!("{}", info_text(&path, &stats));
        }
        if args.interval == 0 {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_secs(args.interval));
    }
}

/// pqmon -S's line: `full capacity maxbytes bytes slots maxslots products age_oldest
/// age_newest min_residence mvrt_bytes mvrt_slots`.
fn size_parameters(stats: &QueueStats) -> String {
    let age = |time: Option<ldm7_types::Timestamp>| {
        time.map_or(-1.0, |time| now().saturating_duration_since(time).as_secs_f64())
    };
    let (residence, mvrt_bytes, mvrt_slots) = match stats.mvrt {
        Some(mvrt) => (mvrt.residence.as_secs() as i64, mvrt.used_bytes as i64, mvrt.used_slots),
        None => (-1, -1, 0),
    };
    format!(
        "{} {} {} {} {} {} {} {:.0} {:.0} {residence} {mvrt_bytes} {mvrt_slots}",
        u8::from(stats.evicted_count > 0),
        stats.capacity.bytes,
        stats.used_bytes.max(mvrt_bytes.max(0) as u64),
        stats.used_bytes,
        stats.capacity.slots,
        stats.product_count.max(mvrt_slots),
        stats.product_count,
        age(stats.oldest_insertion).max(0.0),
        age(stats.newest_insertion),
    )
}

fn check(args: &PathArgs) -> CmdResult {
    let path = queue_path(args.path.as_deref());
    let queue = match Queue::open(&path) {
        Err(OpenError::Damaged { why, .. }) => {
            println!("{}: not opened", path.display());
            println!("problem: {why}");
            return Err(runtime(anyhow::anyhow!(
                "queue {} is damaged: recreate it with `ldm7 queue create --force --path {}` (its products are lost)",
                path.display(),
                path.display()
            )));
        }
        Ok(queue) => queue,
        Err(_) => open_queue(&path)?,
    };
    let report = queue.check().map_err(runtime)?;
    println!(
        "{}: {} products, {} signatures, {} bytes",
        path.display(),
        report.product_count,
        report.signature_count,
        report.used_bytes
    );
    if report.is_ok() {
        println!("queue is sound");
        return Ok(());
    }
    for problem in &report.problems {
        println!("problem: {problem}");
    }
    Err(runtime(anyhow::anyhow!(
        "queue {} has {} problem(s): recreate it with `ldm7 queue create --force` (its products are lost)",
        path.display(),
        report.problems.len()
    )))
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 { 0.0 } else { 100.0 * part as f64 / whole as f64 }
}

fn age_secs(stats: &QueueStats) -> Option<f64> {
    stats.oldest_insertion.map(|oldest| now().saturating_duration_since(oldest).as_secs_f64())
}

fn info_text(path: &std::path::Path, stats: &QueueStats) -> String {
    let time = |t: Option<ldm7_types::Timestamp>| t.map(|t| t.to_string()).unwrap_or_else(|| "-".into());
    let mut text = String::new();
    let mut line = |label: &str, value: String| text.push_str(&format!("{label:<22} {value}\n"));
    line("queue", path.display().to_string());
    line("capacity", format!("{} bytes, {} slots", stats.capacity.bytes, stats.capacity.slots));
    line(
        "used",
        format!(
            "{} bytes ({:.1}%), {} slots ({:.1}%)",
            stats.used_bytes,
            percent(stats.used_bytes, stats.capacity.bytes),
            stats.product_count,
            percent(stats.product_count, stats.capacity.slots)
        ),
    );
    line("products", stats.product_count.to_string());
    line("oldest insertion", time(stats.oldest_insertion));
    line("newest insertion", time(stats.newest_insertion));
    line("age of oldest", age_secs(stats).map(|age| format!("{age:.3} s")).unwrap_or_else(|| "-".into()));
    line(
        "min. residence (MVRT)",
        match stats.mvrt {
            Some(mvrt) => format!(
                "{:.3} s (at {} bytes, {} slots)",
                mvrt.residence.as_secs_f64(),
                mvrt.used_bytes,
                mvrt.used_slots
            ),
            None => "- (nothing evicted yet: the queue has never been full)".into(),
        },
    );
    line("inserted / evicted", format!("{} / {}", stats.inserted_count, stats.evicted_count));
    line("created", stats.created.to_string());
    line(
        "file",
        format!(
            "{} bytes (map {} bytes, {} written so far)",
            stats.file_bytes, stats.map_bytes, stats.map_written_bytes
        ),
    );
    line("readers", stats.readers.to_string());
    text
}

fn info_json(path: &std::path::Path, stats: &QueueStats) -> String {
    let time = |t: Option<ldm7_types::Timestamp>| t.map(|t| format!("\"{t}\"")).unwrap_or_else(|| "null".into());
    let number = |value: Option<f64>| value.map(|v| format!("{v:.6}")).unwrap_or_else(|| "null".into());
    let path_text = path.display().to_string().replace('\\', "\\\\").replace('"', "\\\"");
    format!(
        concat!(
            "{{\"queue\":\"{}\",\"capacity_bytes\":{},\"capacity_slots\":{},\"used_bytes\":{},\"used_slots\":{},",
            "\"product_count\":{},\"oldest_insertion\":{},\"newest_insertion\":{},\"oldest_age_s\":{},",
            "\"mvrt_s\":{},\"inserted_count\":{},\"evicted_count\":{},\"created\":\"{}\",\"file_bytes\":{},",
            "\"map_bytes\":{},\"map_written_bytes\":{},\"readers\":{}}}"
        ),
        path_text,
        stats.capacity.bytes,
        stats.capacity.slots,
        stats.used_bytes,
        stats.product_count,
        stats.product_count,
        time(stats.oldest_insertion),
        time(stats.newest_insertion),
        number(age_secs(stats)),
        number(stats.mvrt.map(|mvrt| mvrt.residence.as_secs_f64())),
        stats.inserted_count,
        stats.evicted_count,
        stats.created,
        stats.file_bytes,
        stats.map_bytes,
        stats.map_written_bytes,
        stats.readers,
    )
}
