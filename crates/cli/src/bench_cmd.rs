//! `ldm7 bench`: the flags of each benchmark, parsed into the test bed's options
//! ([`ldm7_testbed::bench`], where the benchmarks are); every failure of a benchmark exits 2.

use std::path::PathBuf;
use std::time::Duration;

use clap::Subcommand;
use ldm7_testbed::bench::{act, compare, ldm6, queue, reference, scour};
use ldm7_types::Rate;

use crate::common::{duration_arg, speed_arg};
use crate::exit::{CmdResult, runtime};

/// The benchmarks.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Queue insert and read rates, and cross-process wake-up latency.
    Queue(BenchQueueArgs),
    /// Inserting files: `ldm7 insert` (side by side with `pqinsert` when LDM_REF_BIN is set).
    Insert(BenchInsertArgs),
    /// LDM-6 fan-out on loopback: 1 and 4 downstream servers from a preloaded queue.
    Ldm6(BenchLdm6Args),
    /// Product actions: `ldm7 act` through 20 FILE entries and one PIPE vs a plain loop.
    Act(BenchActArgs),
    /// LDM-6 unicast vs LDM-7 multicast on one lab path (root): throughput, latency, egress, CPU.
    Compare(BenchCompareArgs),
    /// Deleting old files: `ldm7 scour` (side by side with LDM's `scour` when LDM_REF_BIN is
    /// set) on a generated tree, survivors checked.
    Scour(BenchScourArgs),
}

/// Runs a benchmark.
pub fn run(command: BenchCommand) -> CmdResult {
    match command {
        BenchCommand::Queue(args) => queue::run(&args.into()),
        BenchCommand::Insert(args) => reference::run_insert(&args.into()),
        BenchCommand::Ldm6(args) => ldm6::run(&args.into()),
        BenchCommand::Act(args) => act::run(&args.into()),
        BenchCommand::Compare(args) => compare::run(&args.into()),
        BenchCommand::Scour(args) => scour::run(&args.into()),
    }
    .map_err(runtime)
}

/// Arguments of `ldm7 bench queue`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchQueueArgs {
    /// Directory for the scratch queue (default: the system temporary directory).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Capacity of the scratch queue in bytes (LDM's default is 500 MB).
    #[arg(long, default_value_t = 500_000_000, value_name = "BYTES")]
    pub queue_bytes: u64,
    /// Bytes inserted per measurement and product size (at least 2000 products).
    #[arg(long, default_value_t = 1_000_000_000, value_name = "BYTES")]
    pub volume_bytes: u64,
    /// Runs per measurement; medians are reported.
    #[arg(long, default_value_t = 5)]
    pub repeat: u32,
    /// Products for the wake-up latency measurement.
    #[arg(long, default_value_t = 2000)]
    pub wakeups: u32,
    /// Gap between wake-up products, microseconds (the reader must be asleep when one lands).
    #[arg(long, default_value_t = 2000, value_name = "MICROS")]
    pub wakeup_gap_micros: u64,
    /// Product sizes to measure, bytes.
    #[arg(long, value_delimiter = ',', default_values_t = [1_000usize, 30_000, 1_000_000])]
    pub sizes: Vec<usize>,
    /// Internal: run as the wake-up reader of the queue at this path.
    #[arg(long, hide = true, value_name = "QUEUE")]
    pub wake_reader: Option<PathBuf>,
    /// Internal: run as the pipe baseline reader.
    #[arg(long, hide = true)]
    pub pipe_reader: bool,
}

impl From<BenchQueueArgs> for queue::QueueOptions {
    fn from(args: BenchQueueArgs) -> Self {
        Self {
            dir: args.dir,
            queue_bytes: args.queue_bytes,
            volume_bytes: args.volume_bytes,
            repeat: args.repeat,
            wakeups: args.wakeups,
            wakeup_gap_micros: args.wakeup_gap_micros,
            sizes: args.sizes,
            wake_reader: args.wake_reader,
            pipe_reader: args.pipe_reader,
        }
    }
}

/// Arguments of `ldm7 bench insert`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchInsertArgs {
    /// Directory for the product files and scratch queues (default: the system temporary
    /// directory).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Product sets, COUNTxSIZE (bytes), each inserted by one process into a fresh queue.
    #[arg(long, value_delimiter = ',', default_values_t = ["10000x30000".to_owned(), "200x5000000".to_owned()])]
    pub sets: Vec<String>,
    /// Runs per set and system; medians are reported.
    #[arg(long, default_value_t = 5)]
    pub repeat: u32,
}

impl From<BenchInsertArgs> for reference::InsertOptions {
    fn from(args: BenchInsertArgs) -> Self {
        Self { dir: args.dir, sets: args.sets, repeat: args.repeat }
    }
}

/// Arguments of `ldm7 bench scour`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchScourArgs {
    /// Directory for the generated trees (default: the system temporary directory).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Files in the tree (half of them old).
    #[arg(long, default_value_t = 1_000_000)]
    pub files: usize,
    /// Leaf directories the files are spread over.
    #[arg(long, default_value_t = 10_000)]
    pub dirs: usize,
    /// Bytes per file.
    #[arg(long, default_value_t = 1000, value_name = "BYTES")]
    pub size: usize,
    /// Runs per system; medians are reported.
    #[arg(long, default_value_t = 3)]
    pub repeat: u32,
    /// Worker threads of `ldm7 scour` [default: its own].
    #[arg(long, value_name = "N")]
    pub threads: Option<u16>,
}

impl From<BenchScourArgs> for scour::ScourOptions {
    fn from(args: BenchScourArgs) -> Self {
        Self {
            dir: args.dir,
            files: args.files,
            dirs: args.dirs,
            size: args.size,
            repeat: args.repeat,
            threads: args.threads,
        }
    }
}

/// Arguments of `ldm7 bench ldm6`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchLdm6Args {
    /// Directory for the product files and scratch queues (default: the system temporary
    /// directory).
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
    /// Runs per measurement and system; medians are reported.
    #[arg(long, default_value_t = 3)]
    pub repeat: u32,
    /// The queues' page-cache state at the start of each run: `as-is` (as creating them left
    /// it) or `warm` (every queue file read into memory first, for both systems).
    #[arg(long, value_enum, default_value_t = CacheState::AsIs)]
    pub cache: CacheState,
}

/// The queues' page-cache state at the start of a timed run (the flag's values: the test bed's
/// [`ldm6::CacheState`], which does not depend on clap).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheState {
    /// As creating and preloading them left it.
    AsIs,
    /// Every file of the upstream and downstream queues read into the page cache.
    Warm,
}

impl From<BenchLdm6Args> for ldm6::Ldm6Options {
    fn from(args: BenchLdm6Args) -> Self {
        Self {
            dir: args.dir,
            products: args.products,
            size: args.size,
            downstreams: args.downstreams,
            repeat: args.repeat,
            cache: match args.cache {
                CacheState::AsIs => ldm6::CacheState::AsIs,
                CacheState::Warm => ldm6::CacheState::Warm,
            },
        }
    }
}

/// Arguments of `ldm7 bench act`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchActArgs {
    /// Directory for the queue and the outputs (default: the system temporary directory).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Products in the queue.
    #[arg(long, default_value_t = 5_000)]
    pub products: usize,
    /// Runs per case and side; medians are reported.
    #[arg(long, default_value_t = 3)]
    pub repeat: u32,
    /// Trace whose product sizes are used [default: the NEXRAD3 trace in $LDM7_SHARED or
    /// ../shared].
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
}

impl From<BenchActArgs> for act::ActOptions {
    fn from(args: BenchActArgs) -> Self {
        Self { dir: args.dir, products: args.products, repeat: args.repeat, trace: args.trace }
    }
}

/// Arguments of `ldm7 bench compare`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchCompareArgs {
    /// Path rate: the publisher's HTB rate and the FMTP sending rate.
    #[arg(long, default_value = "100 Mbit/s")]
    pub rate: Rate,
    /// Number of subscribers.
    #[arg(long, default_value_t = 6)]
    pub subscribers: usize,
    /// Receive-side loss in percent: one value for every subscriber, or one per subscriber
    /// (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub loss: Vec<f64>,
    /// How much of the trace to replay (trace time), e.g. 3min.
    #[arg(long, default_value = "3min", value_parser = duration_arg)]
    pub span: Duration,
    /// Replay speed (the trace's pace × SPEED).
    #[arg(long, default_value_t = 3.0, value_parser = speed_arg)]
    pub speed: f64,
    /// Runs per measurement; medians are reported.
    #[arg(long, default_value_t = 1)]
    pub repeat: u32,
    /// Which protocols to run (ldm6, ldm7).
    #[arg(long, value_delimiter = ',', default_value = "ldm6,ldm7")]
    pub modes: Vec<Protocol>,
    /// Measure one lossy subscriber's effect on the others' latency instead (LDM-7 only).
    #[arg(long)]
    pub lossy_neighbour: bool,
    /// Share of the path rate HTB assures to FMTP repairs (the lab's `retx_share`; the
    /// multicast class is assured the rest, and either may borrow up to the whole rate)
    /// [default: the plan's for the subscribers and their loss, at least 0.02].
    #[arg(long)]
    pub retx_share: Option<f64>,
    /// The LDM-7 publisher's parity repair (`parity` in its ldm7.toml): auto, off or
    /// GROUP/SHARDS.
    #[arg(long, value_name = "auto|off|GROUP/SHARDS", default_value = "auto")]
    pub parity: ldm7_fmtp::ParityChoice,
    /// The lossy neighbour's loss, percent.
    #[arg(long, default_value_t = 20.0)]
    pub neighbour_loss: f64,
    /// The trace [default: $LDM7_SHARED/data/traces/…NGRID_1hr…, else ../shared/data/traces/…].
    #[arg(long, value_name = "TRACE")]
    pub trace: Option<PathBuf>,
    /// Where the CSV files and the plot go.
    #[arg(long, value_name = "DIR", default_value = "experiments/results")]
    pub out: PathBuf,
    /// Name of this measurement in the output files [default: from the parameters].
    #[arg(long)]
    pub label: Option<String>,
    /// Directory for the lab hosts' queues and logs (default: the system temporary directory).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// A protocol measured (the flag's values: the test bed's [`compare::Protocol`], which does
/// not depend on clap).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// LDM-6 unicast, one TCP connection per subscriber.
    Ldm6,
    /// LDM-7 multicast by FMTP.
    Ldm7,
}

impl From<BenchCompareArgs> for compare::CompareOptions {
    fn from(args: BenchCompareArgs) -> Self {
        let protocol = |protocol| match protocol {
            Protocol::Ldm6 => compare::Protocol::Ldm6,
            Protocol::Ldm7 => compare::Protocol::Ldm7,
        };
        Self {
            rate: args.rate,
            subscribers: args.subscribers,
            loss: args.loss,
            span: args.span,
            speed: args.speed,
            repeat: args.repeat,
            modes: args.modes.into_iter().map(protocol).collect(),
            lossy_neighbour: args.lossy_neighbour,
            retx_share: args.retx_share,
            parity: args.parity,
            neighbour_loss: args.neighbour_loss,
            trace: args.trace,
            out: args.out,
            label: args.label,
            dir: args.dir,
        }
    }
}
