//! The one log subscriber of the `ldm7` binary, installed before any subcommand runs. Every
//! crate logs through `tracing`; this prints the lines LDM operators know (ldm-formats.md §5):
//!
//! ```text
//! 20250101T120000.123456Z ldm7[4242] NOTE Starting Up(ldm7/6): …
//! ```
//!
//! **Levels.** LDM has DEBUG, INFO, NOTE, WARN and ERROR; tracing has no NOTE. The mapping
//! (`ldm7_io::log_target`):
//!
//! | tracing event | printed as | shown |
//! |---|---|---|
//! | ERROR | ERROR | always |
//! | WARN | WARN | always |
//! | INFO, target `ldm7::product` | INFO | with `-v` or `-x` (LDM's verbose mode: one line per product) |
//! | INFO, any other target | NOTE | always (sessions starting and ending, reloads) |
//! | DEBUG | DEBUG | with `-x` |
//! | TRACE | — | never |
//!
//! Events of other crates than ours (dependencies) are shown at WARN and above only. Fields
//! other than the message follow it as ` name=value`.
//!
//! **Output.** Standard error by default; `-l FILE` appends to FILE (`-l -` is standard error),
//! as ldmd does. `--log-max-size SIZE` rotates the file when a line would take it past SIZE:
//! FILE becomes FILE.1, FILE.1 becomes FILE.2 … up to `--log-keep N` old files (the oldest is
//! removed). SIGHUP and SIGUSR1 reopen FILE, so an external logrotate can move it away and signal
//! the process (when logging to a file the process no longer ends on SIGHUP; `ldm7 serve` also
//! reloads its configuration on it). SIGUSR1 never ends a process (LDM's "refresh logging"), nor
//! does SIGUSR2, which cycles the level shown as LDM's programs do: NOTE → INFO (`-v`) → DEBUG
//! (`-x`) → NOTE, logging a NOTE line with the new level. `--log-json` prints one JSON object per event instead:
//! `{"time", "program", "pid", "level", "target", "message", "fields"}` with the LDM level.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use ldm7_types::{ByteSize, Timestamp};
use tracing::field::{Field, Visit};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// The program name in every line (a classic name may bring its own: `scour`).
pub const PROGRAM: &str = "ldm7";

/// Old log files kept by default: ldmadmin's `/log/count`.
const KEEP_DEFAULT: u32 = 7;

/// Most old log files `--log-keep` may ask for.
const KEEP_MAX: u32 = 1000;

/// The crates of this project: their events are shown down to the chosen level; other crates'
/// only at WARN and above. (The binary's own modules are `ldm7::…`.)
const OUR_CRATE_PREFIXES: &[&str] = &["ldm7::", "ldm7_"];

/// Logging options, shared by every subcommand and the classic names.
#[derive(clap::Args, Clone, Debug, Default)]
#[command(next_help_heading = "Logging")]
pub struct LogArgs {
    /// Verbose: also log one INFO line per product (LDM's -v).
    #[arg(short = 'v', long = "verbose", global = true)]
    pub verbose: bool,
    /// Debug: also log DEBUG lines; product lines carry the signature (LDM's -x).
    #[arg(short = 'x', long = "debug", global = true)]
    pub debug: bool,
    /// Append log lines to FILE instead of standard error (`-` = standard error), as ldmd's -l
    /// [default: $LDM7_LOG_FILE, which `ldm7 serve` sets for its EXEC children].
    #[arg(short = 'l', long = "log-file", value_name = "FILE", global = true, env = "LDM7_LOG_FILE")]
    pub log_file: Option<PathBuf>,
    /// Rotate the log file when it would grow past SIZE (e.g. 100M, 1GiB).
    #[arg(long = "log-max-size", value_name = "SIZE", global = true, requires = "log_file")]
    pub log_max_size: Option<ByteSize>,
    /// Old log files kept by --log-max-size: FILE.1 (newest) … FILE.N.
    #[arg(long = "log-keep", value_name = "N", global = true, default_value_t = KEEP_DEFAULT,
          value_parser = clap::value_parser!(u32).range(0..=i64::from(KEEP_MAX)))]
    pub log_keep: u32,
    /// Log one JSON object per event instead of LDM-style lines.
    #[arg(long = "log-json", global = true)]
    pub log_json: bool,
}

impl LogArgs {
    /// Whether logging goes to a file (not standard error).
    pub fn to_file(&self) -> bool {
        self.log_file.as_deref().is_some_and(|path| path != Path::new("-"))
    }
}

/// The log file cannot be opened or its SIGHUP handler installed.
#[derive(Debug, thiserror::Error)]
pub enum LogSetupError {
    /// The file cannot be opened for appending.
    #[error("cannot open the log file {path}: {source}: check the directory exists and is writable")]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// SIGHUP, SIGUSR1 or SIGUSR2 cannot be caught.
    #[error("cannot install the signal handlers of logging (SIGHUP, SIGUSR1, SIGUSR2): {0}")]
    Signal(#[source] std::io::Error),
    /// Another subscriber is installed already (a bug: install once, in `main`).
    #[error("the log subscriber is installed already")]
    Installed,
}

/// Installs the process's subscriber as `args` say; its lines name `program`. SIGUSR1 (and, with
/// a log file, SIGHUP) reopen the file; SIGUSR2 cycles the level (module doc).
pub fn install(args: &LogArgs, program: &'static str) -> Result<(), LogSetupError> {
    use signal_hook::consts::{SIGHUP, SIGUSR1, SIGUSR2};
    let reopen = Arc::new(AtomicBool::new(false));
    // Caught even when logging to standard error: LDM's programs do not end on SIGUSR1.
    signal_hook::flag::register(SIGUSR1, reopen.clone()).map_err(LogSetupError::Signal)?;
    let sink = match &args.log_file {
        Some(path) if args.to_file() => {
            signal_hook::flag::register(SIGHUP, reopen.clone()).map_err(LogSetupError::Signal)?;
            let rotation = args.log_max_size.map(|size| Rotation { size_max_bytes: size.bytes(), keep: args.log_keep });
            Sink::File(LogFile::open(path.clone(), rotation, reopen)?)
        }
        _ => Sink::Stderr,
    };
    let lowest = Arc::new(AtomicU8::new(Verbosity { verbose: args.verbose, debug: args.debug }.lowest() as u8));
    let layer = LdmLayer {
        lowest: lowest.clone(),
        json: args.log_json,
        program,
        pid: std::process::id(),
        sink: Mutex::new(sink),
    };
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
        .map_err(|_| LogSetupError::Installed)?;
    let mut cycles = signal_hook::iterator::Signals::new([SIGUSR2]).map_err(LogSetupError::Signal)?;
    std::thread::Builder::new()
        .name("log-level".into())
        .spawn(move || {
            for _ in cycles.forever() {
                let level = LdmLevel::from_u8(lowest.load(Ordering::Relaxed)).cycled();
                lowest.store(level as u8, Ordering::Relaxed);
                // Every call site asks the layer again whether it is shown.
                tracing::callsite::rebuild_interest_cache();
                tracing::info!("SIGUSR2: logging level now {} (NOTE, INFO, DEBUG in turn)", level.name());
            }
        })
        .map_err(LogSetupError::Signal)?;
    Ok(())
}

/// LDM's log levels, least to most severe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum LdmLevel {
    /// Protocol detail (`-x`).
    Debug,
    /// One line per product (`-v`).
    Info,
    /// Sessions starting and ending.
    Note,
    /// Something went wrong for one peer.
    Warn,
    /// Something went wrong for the process.
    Error,
}

impl LdmLevel {
    /// The LDM level of a tracing event (table in the module doc); `None` for TRACE.
    pub fn of(metadata: &Metadata<'_>) -> Option<LdmLevel> {
        Some(match *metadata.level() {
            Level::ERROR => LdmLevel::Error,
            Level::WARN => LdmLevel::Warn,
            Level::INFO if metadata.target() == ldm7_io::log_target::PRODUCT => LdmLevel::Info,
            Level::INFO => LdmLevel::Note,
            Level::DEBUG => LdmLevel::Debug,
            Level::TRACE => return None,
        })
    }

    /// The next lowest level shown after SIGUSR2, as LDM cycles it: one level lower, and from
    /// DEBUG back to NOTE.
    pub fn cycled(self) -> LdmLevel {
        match self {
            LdmLevel::Debug => LdmLevel::Note,
            LdmLevel::Info => LdmLevel::Debug,
            LdmLevel::Note => LdmLevel::Info,
            LdmLevel::Warn => LdmLevel::Note,
            LdmLevel::Error => LdmLevel::Warn,
        }
    }

    fn from_u8(value: u8) -> LdmLevel {
        [LdmLevel::Debug, LdmLevel::Info, LdmLevel::Note, LdmLevel::Warn, LdmLevel::Error]
            .into_iter()
            .find(|level| *level as u8 == value)
            .unwrap_or(LdmLevel::Note)
    }

    /// The name in the line.
    pub fn name(self) -> &'static str {
        match self {
            LdmLevel::Debug => "DEBUG",
            LdmLevel::Info => "INFO",
            LdmLevel::Note => "NOTE",
            LdmLevel::Warn => "WARN",
            LdmLevel::Error => "ERROR",
        }
    }
}

/// What `-v` and `-x` let through.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Verbosity {
    /// `-v`: INFO.
    pub verbose: bool,
    /// `-x`: DEBUG (and INFO).
    pub debug: bool,
}

impl Verbosity {
    /// Whether an event with this metadata is printed (before any SIGUSR2).
    #[cfg(test)]
    fn shows(self, metadata: &Metadata<'_>) -> bool {
        shown(metadata, self.lowest())
    }

    /// The lowest level of our crates' events shown.
    pub fn lowest(self) -> LdmLevel {
        if self.debug {
            LdmLevel::Debug
        } else if self.verbose {
            LdmLevel::Info
        } else {
            LdmLevel::Note
        }
    }
}

/// Whether an event with this metadata is printed when `lowest` is the lowest level shown (other
/// crates' events from WARN up whatever it is).
fn shown(metadata: &Metadata<'_>, lowest: LdmLevel) -> bool {
    let Some(level) = LdmLevel::of(metadata) else { return false };
    let target = metadata.target();
    if !OUR_CRATE_PREFIXES.iter().any(|prefix| target.starts_with(prefix)) {
        return level >= LdmLevel::Warn;
    }
    level >= lowest
}

/// Formats one event as an LDM line (without the newline).
pub fn ldm_line(now: SystemTime, program: &str, pid: u32, level: LdmLevel, fields: &EventFields) -> String {
    let mut line = format!("{} {program}[{pid}] {} {}", log_time(now), level.name(), fields.message);
    for (name, value) in &fields.others {
        line.push_str(&format!(" {name}={value}"));
    }
    line
}

/// Formats one event as a JSON object (without the newline).
pub fn json_line(
    now: SystemTime,
    program: &str,
    pid: u32,
    level: LdmLevel,
    target: &str,
    fields: &EventFields,
) -> String {
    let others: serde_json::Map<String, serde_json::Value> =
        fields.others.iter().map(|(name, value)| (name.to_string(), serde_json::Value::from(value.as_str()))).collect();
    serde_json::json!({
        "time": log_time(now),
        "program": program,
        "pid": pid,
        "level": level.name(),
        "target": target,
        "message": fields.message,
        "fields": others,
    })
    .to_string()
}

/// `YYYYMMDDThhmmss.uuuuuuZ` (UTC).
fn log_time(now: SystemTime) -> String {
    let stamp = Timestamp::from_system_time(now).to_string();
    // Timestamp prints YYYYMMDDhhmmss.uuuuuu; the log form puts a T after the date.
    let (date, time) = stamp.split_at(8.min(stamp.len()));
    format!("{date}T{time}Z")
}

/// An event's message and other fields, as text.
#[derive(Debug, Default)]
pub struct EventFields {
    /// The message.
    pub message: String,
    /// The other fields, in order.
    pub others: Vec<(&'static str, String)>,
}

impl Visit for EventFields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            self.others.push((field.name(), value.to_owned()));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.others.push((field.name(), format!("{value:?}")));
        }
    }
}

/// The layer that filters, formats and writes.
struct LdmLayer {
    /// The lowest level shown (an `LdmLevel`): `-v`/`-x`, then cycled by SIGUSR2.
    lowest: Arc<AtomicU8>,
    json: bool,
    program: &'static str,
    pid: u32,
    sink: Mutex<Sink>,
}

impl<S: Subscriber> Layer<S> for LdmLayer {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if self.shows(metadata) { Interest::always() } else { Interest::never() }
    }

    fn enabled(&self, metadata: &Metadata<'_>, _context: Context<'_, S>) -> bool {
        self.shows(metadata)
    }

    fn on_event(&self, event: &Event<'_>, _context: Context<'_, S>) {
        let metadata = event.metadata();
        let Some(level) = LdmLevel::of(metadata) else { return };
        let mut fields = EventFields::default();
        event.record(&mut fields);
        let now = SystemTime::now();
        let mut line = if self.json {
            json_line(now, self.program, self.pid, level, metadata.target(), &fields)
        } else {
            ldm_line(now, self.program, self.pid, level, &fields)
        };
        line.push('\n');
        let mut sink = self.sink.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        sink.write_line(line.as_bytes());
    }
}

impl LdmLayer {
    fn shows(&self, metadata: &Metadata<'_>) -> bool {
        shown(metadata, LdmLevel::from_u8(self.lowest.load(Ordering::Relaxed)))
    }
}

/// Where lines go.
enum Sink {
    Stderr,
    File(LogFile),
}

impl Sink {
    fn write_line(&mut self, line: &[u8]) {
        match self {
            // Nothing sensible is left to do when standard error fails.
            Sink::Stderr => drop(std::io::stderr().lock().write_all(line)),
            Sink::File(file) => file.write_line(line),
        }
    }
}

/// Size rotation of a log file.
#[derive(Clone, Copy, Debug)]
struct Rotation {
    size_max_bytes: u64,
    keep: u32,
}

/// A log file: appended to, rotated by size, reopened after SIGHUP.
struct LogFile {
    path: PathBuf,
    file: File,
    written_bytes: u64,
    rotation: Option<Rotation>,
    reopen: Arc<AtomicBool>,
    /// A failure to reopen or rotate was reported on standard error (once).
    failure_reported: bool,
}

impl LogFile {
    fn open(path: PathBuf, rotation: Option<Rotation>, reopen: Arc<AtomicBool>) -> Result<Self, LogSetupError> {
        let (file, written_bytes) =
            open_append(&path).map_err(|source| LogSetupError::Open { path: path.clone(), source })?;
        Ok(Self { path, file, written_bytes, rotation, reopen, failure_reported: false })
    }

    fn write_line(&mut self, line: &[u8]) {
        if self.reopen.swap(false, Ordering::Relaxed) {
            self.reopen_file();
        }
        if let Some(rotation) = self.rotation
            && self.written_bytes > 0
            && self.written_bytes + line.len() as u64 > rotation.size_max_bytes
        {
            self.rotate(rotation.keep);
        }
        if self.file.write_all(line).is_ok() {
            self.written_bytes += line.len() as u64;
        }
    }

    /// FILE.(N-1) → FILE.N … FILE → FILE.1, then a fresh FILE.
    fn rotate(&mut self, keep: u32) {
        match ldm7_io::rotate_numbered(&self.path, keep) {
            Ok(()) => self.reopen_file(),
            Err(error) => self.report(&format!("cannot rotate {}: {error}", self.path.display())),
        }
    }

    fn reopen_file(&mut self) {
        match open_append(&self.path) {
            Ok((file, written_bytes)) => {
                self.file = file;
                self.written_bytes = written_bytes;
            }
            Err(error) => {
                self.report(&format!("cannot reopen {}: {error}; logging on to the old file", self.path.display()))
            }
        }
    }

    fn report(&mut self, message: &str) {
        if !self.failure_reported {
            self.failure_reported = true;
            eprintln!("{PROGRAM}: log file: {message}");
        }
    }
}

fn open_append(path: &Path) -> std::io::Result<(File, u64)> {
    let file = OpenOptions::new().create(true).append(true).open(path)?;
    let written_bytes = file.metadata()?.len();
    Ok((file, written_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn metadata_of(level: Level, target: &'static str) -> Metadata<'static> {
        struct Callsite;
        impl tracing::callsite::Callsite for Callsite {
            fn set_interest(&self, _: Interest) {}
            fn metadata(&self) -> &Metadata<'_> {
                unreachable!("not registered")
            }
        }
        static CALLSITE: Callsite = Callsite;
        Metadata::new(
            "event",
            target,
            level,
            None,
            None,
            None,
            tracing::field::FieldSet::new(&["message"], tracing::callsite::Identifier(&CALLSITE)),
            tracing::metadata::Kind::EVENT,
        )
    }

    #[test]
    fn levels_map_to_ldm_levels_and_filter_as_ldm_does() {
        let note = metadata_of(Level::INFO, "ldm7_server::conn");
        let product = metadata_of(Level::INFO, ldm7_io::log_target::PRODUCT);
        let debug = metadata_of(Level::DEBUG, "ldm7_fmtp::driver");
        let warn = metadata_of(Level::WARN, "ldm7_net::lab");
        let trace = metadata_of(Level::TRACE, "ldm7_server::conn");
        let foreign_info = metadata_of(Level::INFO, "quinn_udp");
        let foreign_warn = metadata_of(Level::WARN, "quinn_udp");
        assert_eq!(LdmLevel::of(&note), Some(LdmLevel::Note));
        assert_eq!(LdmLevel::of(&product), Some(LdmLevel::Info));
        assert_eq!(LdmLevel::of(&debug), Some(LdmLevel::Debug));
        assert_eq!(LdmLevel::of(&trace), None);
        let shown = |verbosity: Verbosity| {
            [&note, &product, &debug, &warn, &trace, &foreign_info, &foreign_warn]
                .map(|metadata| verbosity.shows(metadata))
        };
        let quiet = Verbosity::default();
        let verbose = Verbosity { verbose: true, debug: false };
        let debugging = Verbosity { verbose: false, debug: true };
        assert_eq!(shown(quiet), [true, false, false, true, false, false, true]);
        assert_eq!(shown(verbose), [true, true, false, true, false, false, true]);
        assert_eq!(shown(debugging), [true, true, true, true, false, false, true]);
        // SIGUSR2 as LDM: NOTE, INFO, DEBUG, NOTE again.
        let cycle: Vec<LdmLevel> =
            std::iter::successors(Some(LdmLevel::Note), |level| Some(level.cycled())).take(4).collect();
        assert_eq!(cycle, [LdmLevel::Note, LdmLevel::Info, LdmLevel::Debug, LdmLevel::Note]);
        for level in [LdmLevel::Debug, LdmLevel::Info, LdmLevel::Note, LdmLevel::Warn, LdmLevel::Error] {
            assert_eq!(LdmLevel::from_u8(level as u8), level);
        }
    }

    #[test]
    fn lines_have_the_ldm_layout() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_micros(1_700_000_000_123_456);
        let fields = EventFields { message: "Starting Up".into(), others: vec![("peer", "10.0.0.1:388".into())] };
        assert_eq!(
            ldm_line(at, PROGRAM, 42, LdmLevel::Note, &fields),
            "20231114T221320.123456Z ldm7[42] NOTE Starting Up peer=10.0.0.1:388"
        );
        let json: serde_json::Value =
            serde_json::from_str(&json_line(at, "scour", 42, LdmLevel::Info, "t", &fields)).unwrap();
        assert_eq!(json["time"], "20231114T221320.123456Z");
        assert_eq!(json["level"], "INFO");
        assert_eq!(json["pid"], 42);
        assert_eq!(json["program"], "scour");
        assert_eq!(json["message"], "Starting Up");
        assert_eq!(json["fields"]["peer"], "10.0.0.1:388");
    }

    #[test]
    fn a_full_file_rotates_and_keeps_n_old_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ldm7.log");
        let reopen = Arc::new(AtomicBool::new(false));
        let mut file =
            LogFile::open(path.clone(), Some(Rotation { size_max_bytes: 25, keep: 2 }), reopen.clone()).expect("open");
        for n in 0..7 {
            file.write_line(format!("line {n} of ten bytes\n").as_bytes()); // 20 bytes
        }
        let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap_or_default();
        assert_eq!(read("ldm7.log"), "line 6 of ten bytes\n");
        assert_eq!(read("ldm7.log.1"), "line 5 of ten bytes\n");
        assert_eq!(read("ldm7.log.2"), "line 4 of ten bytes\n");
        assert!(!dir.path().join("ldm7.log.3").exists());
        // SIGHUP after an external move: the next line goes to a new file.
        std::fs::rename(&path, dir.path().join("moved")).expect("move");
        reopen.store(true, Ordering::Relaxed);
        file.write_line(b"after\n");
        assert_eq!(read("ldm7.log"), "after\n");
        assert_eq!(read("moved"), "line 6 of ten bytes\n");
    }
}
