//! `ldm7`: one binary for the product queue and its tools. Invoked as `pqinsert`, `pqcat`,
//! `notifyme`, `ldmsend`, `ldmd`, `pqcreate`, `pqmon`, `pqcheck` or `scour` it behaves as that
//! classic LDM command (`scour` also names itself so in its log lines).
//!
//! Exit codes: 0 ok, 1 bad usage or input, 2 runtime failure.
//!
//! The logging flags (`-v`, `-x`, `-l FILE`, `--log-max-size`, `--log-keep`, `--log-json`) are
//! global: every subcommand and classic name takes them, and one subscriber ([`logging`]) is
//! installed before the subcommand runs.

mod act_cmd;
mod admin_cmd;
mod bench_cmd;
mod cat;
mod common;
mod demo_cmd;
mod exit;
mod fmtp_cmd;
mod insert;
mod insert_files;
mod lab_cmd;
mod logging;
mod man_cmd;
mod monitor_cmd;
mod plan_cmd;
mod queue_cmd;
mod remote;
mod rtstats_cmd;
mod scour_cmd;
mod serve;
mod trace_cmd;
mod watch;

use std::ffi::OsString;
use std::path::Path;

use clap::{Args, Parser, Subcommand};

use crate::exit::CmdResult;
use crate::logging::LogArgs;

/// mimalloc: the servers allocate a buffer per product received; glibc's allocator spent a
/// measurable share of the receiving path growing and trimming its heap (`ldm7 bench ldm6`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Turns transparent huge pages off for this process (`PR_SET_THP_DISABLE`; children inherit
/// it, which changes nothing for a program that does not ask for huge pages where the system
/// setting is `madvise`). mimalloc asks for them on its arenas, so each first touch of a 2 MiB
/// region had the kernel zero all of it, and its purges of freed parts split them again: with
/// four FMTP receivers and their sender on two cores, page zeroing took a fifth of the CPU and
/// the receivers' system time halved without it (docs/benchmarks.md, "FMTP goodput: huge
/// pages off, hashing in batches").
fn no_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    // A kernel without the call (before 3.15) keeps huge pages as they were: slower, no more.
    let _ = nix::sys::prctl::set_thp_disable(true);
}

/// Reliable distribution of near-real-time data products (LDM-compatible).
#[derive(Parser, Debug)]
#[command(name = "ldm7", version, about, propagate_version = true)]
struct Cli {
    #[command(flatten)]
    log: LogArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create, inspect and check product queues.
    #[command(subcommand)]
    Queue(queue_cmd::QueueCommand),
    /// Insert files into the queue, or replay a trace (pqinsert).
    Insert(insert::InsertArgs),
    /// Write products in the queue to standard output (pqcat).
    Cat(cat::CatArgs),
    /// Follow the queue and print a line per new product (a local notifyme).
    Watch(watch::WatchArgs),
    /// Run the actions of a pqact.conf on products as they arrive (pqact): FILE, PIPE, EXEC….
    Act(act_cmd::ActArgs),
    /// Run the demo: LDM-7 multicast on loopback, a publisher and subscribers (no root).
    Demo(demo_cmd::DemoArgs),
    /// Measure performance.
    #[command(subcommand)]
    Bench(bench_cmd::BenchCommand),
    /// FMTP multicast transport alone: send and receive products.
    #[command(subcommand)]
    Fmtp(fmtp_cmd::FmtpCommand),
    /// Run the LDM server (ldmd): ldmd.conf, LDM-6 sessions, LDM-7 multicast and subscriptions.
    Serve(serve::ServeArgs),
    /// Ask an LDM server for notifications of products (notifyme).
    Notify(remote::NotifyArgs),
    /// Push files to an LDM server (ldmsend).
    Send(remote::SendArgs),
    /// The monitor: statistics of LDM-7 servers (and LDM 6 rtstats) into a database, and its API.
    Monitor(monitor_cmd::MonitorArgs),
    /// Build and tear down the network-namespace test bed (root).
    #[command(subcommand)]
    Lab(lab_cmd::LabCommand),
    /// Plan a feed's path rate and sender buffer from a trace or a queue (per holding interval).
    Plan(plan_cmd::PlanArgs),
    /// Product traces: generate IDD-like traces from the workload model.
    #[command(subcommand)]
    Trace(trace_cmd::TraceCommand),
    /// Delete old files from the directories of a scour.conf (scour; from cron).
    Scour(scour_cmd::ScourArgs),
    /// Run a site as ldmadmin does: start, stop, check … from its settings (ldmadmin).
    Admin(admin_cmd::AdminArgs),
    /// Make an ldm7 home from an LDM installation (registry, ldmd.conf, pqact, scour, .info).
    Import(admin_cmd::ImportArgs),
    /// Send LDM's per-feed statistics reports of the queue's products to a host (rtstats).
    Rtstats(rtstats_cmd::RtstatsArgs),
    /// Write the man pages (the package's build runs it).
    #[command(hide = true)]
    Man(man_cmd::ManArgs),
}

/// A classic command: its own name, the arguments of one subcommand.
#[derive(Parser, Debug)]
#[command(version)]
struct Legacy<T: Args> {
    #[command(flatten)]
    args: T,
    #[command(flatten)]
    log: LogArgs,
}

fn main() {
    no_transparent_huge_pages();
    let argv: Vec<OsString> = std::env::args_os().collect();
    let name = argv
        .first()
        .and_then(|arg0| Path::new(arg0).file_name())
        .and_then(|name| name.to_str())
        .unwrap_or("ldm7")
        .to_owned();
    let parsed = match name.as_str() {
        "pqinsert" => legacy::<insert::InsertArgs>("pqinsert", argv).map(|(args, log)| (Command::Insert(args), log)),
        "pqcat" => legacy::<cat::CatArgs>("pqcat", argv).map(|(args, log)| (Command::Cat(args), log)),
        "pqact" => legacy::<act_cmd::ActArgs>("pqact", argv).map(|(args, log)| (Command::Act(args), log)),
        "notifyme" => legacy::<remote::NotifyArgs>("notifyme", argv).map(|(args, log)| (Command::Notify(args), log)),
        "ldmsend" => legacy::<remote::SendArgs>("ldmsend", argv).map(|(args, log)| (Command::Send(args), log)),
        "ldmd" => legacy::<serve::ServeArgs>("ldmd", argv).map(|(args, log)| (Command::Serve(args), log)),
        "pqcreate" => legacy::<queue_cmd::CreateArgs>("pqcreate", argv)
            .map(|(args, log)| (Command::Queue(queue_cmd::QueueCommand::Create(args)), log)),
        "pqmon" => legacy::<queue_cmd::InfoArgs>("pqmon", argv)
            .map(|(args, log)| (Command::Queue(queue_cmd::QueueCommand::Info(args)), log)),
        "pqcheck" => legacy::<queue_cmd::PathArgs>("pqcheck", argv)
            .map(|(args, log)| (Command::Queue(queue_cmd::QueueCommand::Check(args)), log)),
        "scour" => legacy::<scour_cmd::ScourArgs>("scour", argv).map(|(args, log)| (Command::Scour(args), log)),
        "ldmadmin" => legacy::<admin_cmd::AdminArgs>("ldmadmin", argv).map(|(args, log)| (Command::Admin(args), log)),
        "rtstats" => {
            legacy::<rtstats_cmd::RtstatsArgs>("rtstats", argv).map(|(args, log)| (Command::Rtstats(args), log))
        }
        _ => parse::<Cli>(argv).map(|cli| (cli.command, cli.log)),
    };
    let code = match parsed {
        Err(code) => code,
        Ok((command, log)) => run(&name, command, &log),
    };
    std::process::exit(code);
}

/// Installs the log subscriber, runs the command, reports its failure; returns the exit code.
fn run(name: &str, command: Command, log: &LogArgs) -> i32 {
    let program = classic_program(name).unwrap_or(logging::PROGRAM);
    if let Err(error) = logging::install(log, program) {
        eprintln!("{name}: error: {error}");
        return 1;
    }
    match dispatch(command, log) {
        Ok(()) => 0,
        Err(failure) if failure.is_quiet() => failure.exit_code(),
        Err(failure) => {
            if log.to_file() {
                // The operator reading the log file sees why the process ended.
                tracing::error!("{failure}");
            }
            eprintln!("{name}: error: {failure}");
            failure.exit_code()
        }
    }
}

fn dispatch(command: Command, log: &LogArgs) -> CmdResult {
    // `-x` (debug) puts the signature in product lines, as LDM does.
    let with_signature = log.debug;
    match command {
        Command::Queue(command) => queue_cmd::run(&command),
        Command::Insert(args) => insert::run(&args, with_signature),
        Command::Cat(args) => cat::run(&args, with_signature),
        Command::Watch(args) => watch::run(&args, with_signature),
        Command::Act(args) => act_cmd::run(&args),
        Command::Demo(args) => demo_cmd::run(&args),
        Command::Bench(command) => bench_cmd::run(command),
        Command::Lab(command) => lab_cmd::run(&command),
        Command::Monitor(args) => monitor_cmd::run(&args),
        Command::Plan(args) => plan_cmd::run(&args),
        Command::Trace(command) => trace_cmd::run(&command),
        Command::Fmtp(command) => fmtp_cmd::run(&command),
        Command::Serve(args) => serve::run(&args, log),
        Command::Notify(args) => remote::notify(&args, with_signature),
        Command::Send(args) => remote::send(&args),
        Command::Scour(args) => scour_cmd::run(&args),
        Command::Admin(args) => admin_cmd::run(&args, log),
        Command::Import(args) => admin_cmd::import_home(&args),
        Command::Rtstats(args) => rtstats_cmd::run(&args),
        Command::Man(args) => man_cmd::run(&args, &classic_commands()),
    }
}

/// The name in log lines of a program invoked by a classic name (`pqact[pid]`, as a site's log
/// searches expect).
fn classic_program(name: &str) -> Option<&'static str> {
    CLASSIC_NAMES.iter().copied().find(|classic| *classic == name)
}

/// The classic names the binary answers to (as links to it).
const CLASSIC_NAMES: &[&str] = &[
    "pqinsert", "pqcat", "pqact", "notifyme", "ldmsend", "ldmd", "pqcreate", "pqmon", "pqcheck", "scour", "ldmadmin",
    "rtstats",
];

/// Every classic name's command line, for its man page.
fn classic_commands() -> Vec<(&'static str, clap::Command)> {
    vec![
        ("pqinsert", legacy_command::<insert::InsertArgs>("pqinsert")),
        ("pqcat", legacy_command::<cat::CatArgs>("pqcat")),
        ("pqact", legacy_command::<act_cmd::ActArgs>("pqact")),
        ("notifyme", legacy_command::<remote::NotifyArgs>("notifyme")),
        ("ldmsend", legacy_command::<remote::SendArgs>("ldmsend")),
        ("ldmd", legacy_command::<serve::ServeArgs>("ldmd")),
        ("pqcreate", legacy_command::<queue_cmd::CreateArgs>("pqcreate")),
        ("pqmon", legacy_command::<queue_cmd::InfoArgs>("pqmon")),
        ("pqcheck", legacy_command::<queue_cmd::PathArgs>("pqcheck")),
        ("scour", legacy_command::<scour_cmd::ScourArgs>("scour")),
        ("ldmadmin", legacy_command::<admin_cmd::AdminArgs>("ldmadmin")),
        ("rtstats", legacy_command::<rtstats_cmd::RtstatsArgs>("rtstats")),
    ]
}

fn legacy<T: Args>(name: &'static str, argv: Vec<OsString>) -> Result<(T, LogArgs), i32> {
    use clap::FromArgMatches;
    let command = legacy_command::<T>(name);
    match command.try_get_matches_from(argv).and_then(|matches| Legacy::<T>::from_arg_matches(&matches)) {
        Ok(parsed) => Ok((parsed.args, parsed.log)),
        Err(error) => Err(report_usage(error)),
    }
}

/// The command line of a classic name: its arguments, its subcommand's description.
fn legacy_command<T: Args>(name: &'static str) -> clap::Command {
    use clap::CommandFactory;
    // The help of a classic name says what the command does (its subcommand's text).
    let subcommand = match name {
        "pqinsert" => "insert",
        "pqcat" => "cat",
        "pqact" => "act",
        "notifyme" => "notify",
        "ldmsend" => "send",
        "ldmd" => "serve",
        "pqcreate" | "pqmon" | "pqcheck" => "queue",
        "ldmadmin" => "admin",
        other => other,
    };
    let about = Cli::command().find_subcommand(subcommand).and_then(|found| found.get_about().cloned());
    let mut command = Legacy::<T>::command().name(name);
    if let Some(about) = about {
        command = command.about(about);
    }
    command
}

fn parse<P: Parser>(argv: Vec<OsString>) -> Result<P, i32> {
    P::try_parse_from(argv).map_err(report_usage)
}

/// Prints a clap error or help; usage errors exit 1 (clap's own default would be 2, which here
/// means a runtime failure).
fn report_usage(error: clap::Error) -> i32 {
    let _ = error.print();
    if error.use_stderr() { 1 } else { 0 }
}
