//! The LDM-7 test bed: the pieces the lab tests (`crates/cli/tests/lab/lab_ldm7.rs`) and the research
//! comparison (`ldm7 bench compare`) share, over the namespace lab of `ldm7_net::lab`; and the
//! demo and the benchmarks themselves, which the `ldm7` binary parses the flags of and calls.
//!
//! - [`Lab`]: a lab brought up from a spec and taken down when dropped (also when a test
//!   panics or a benchmark fails half-way).
//! - [`Server`]: one `ldm7 serve` process inside a lab host's namespace (or the current one),
//!   with its own directory, queue, `ldmd.conf`, `ldm7.toml` and log; started, stopped with
//!   SIGTERM (its exit status checked), killed with SIGKILL, restarted.
//! - [`replay`]: a trace replayed into a queue, in this process ([`replay::replay_into`], what
//!   `ldm7 insert --replay` and the demo run) or as `ldm7 insert --replay` in the background
//!   ([`Replay`]); [`trace`]: trace files read.
//! - [`records`]: a queue and its server's log read into one [`ProductRecord`] per product
//!   (signature, size, creation, insertion, latency, delivery mode, retransmitted blocks), each
//!   product's data checked against its MD5 signature, and one subscriber's products compared
//!   with the publisher's ([`Comparison`]).
//! - [`measure`]: publisher egress (the HTB path class and the interface's transmitted bytes)
//!   and a process's CPU time (utime + stime).
//! - [`demo`]: `ldm7 demo`, the LDM-7 system on loopback multicast (no root).
//! - [`bench`](mod@bench): `ldm7 bench queue|insert|ldm6|act|compare`, each beside its baseline or the
//!   reference build; [`figure`]: the font their figures (and `ldm7 plan`'s) are drawn with.
//!
//! The `ldm7` executable is a parameter of the lab pieces (tests pass
//! `env!("CARGO_BIN_EXE_ldm7")`, the binary its own `std::env::current_exe()`), so this crate
//! does not depend on the binary's crate; the demo and the benchmarks run inside the binary and
//! start it again as `std::env::current_exe()`. The demo and the replay's failures say whether
//! the input or the run was at fault ([`RunError`]). The lab pieces need root; [`records`],
//! [`replay`], the demo and every benchmark but `compare` do not. Nothing here sleeps to
//! synchronize: waits poll a condition with a deadline.

pub mod bench;
pub mod demo;
pub mod figure;
mod lab;
pub mod measure;
pub mod records;
pub mod reference;
pub mod replay;
mod server;
pub mod trace;

use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use lab::Lab;
pub use measure::{Egress, cpu_seconds, median, udp_receive_drops, wait_with_peak_rss};
pub use records::{
    Comparison, DeliveryLine, DeliveryMode, LogCounts, ProductRecord, latency_quantile_us, read_records,
};
pub use replay::{Replay, ReplayOptions, ReplaySummary};
pub use server::{Server, ServerConfig};

/// Why a test-bed operation failed.
#[derive(Debug, thiserror::Error)]
pub enum TestbedError {
    /// The lab spec is invalid.
    #[error("lab spec: {0}")]
    Spec(#[from] ldm7_net::lab::SpecError),
    /// Bringing the lab up or down failed.
    #[error("lab: {0}")]
    Lab(#[from] ldm7_net::LabError),
    /// A host the lab does not have.
    #[error("lab {lab} has no host {host}")]
    NoSuchHost {
        /// The lab.
        lab: String,
        /// The host asked for.
        host: String,
    },
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// A system command (`ip`, `tc`, `cat`) failed.
    #[error(transparent)]
    Command(#[from] ldm7_net::command::CommandError),
    /// A queue could not be created, opened or read.
    #[error("queue {path}: {message}")]
    Queue {
        /// The queue file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A server exited when it should not have, or not cleanly on SIGTERM.
    #[error("{server}: {what}; the end of its log:\n{log_tail}")]
    Server {
        /// The server's name (its directory's name).
        server: String,
        /// What happened.
        what: String,
        /// The last lines of its log and standard error.
        log_tail: String,
    },
    /// `ldm7 insert --replay` failed.
    #[error("replay into {queue}: {message}")]
    Replay {
        /// The queue.
        queue: PathBuf,
        /// What it said.
        message: String,
    },
    /// A condition did not hold in time.
    #[error("timed out after {timeout:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        timeout: Duration,
    },
}

/// Result of a test-bed operation.
pub type Result<T, E = TestbedError> = std::result::Result<T, E>;

/// Why the demo or a replay failed, in the two classes the `ldm7` binary's exit status tells
/// apart.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Bad input (a trace, its span, a product that cannot fit the queue, `LDM7_SHARED`): what
    /// was wrong and what to do (exit status 1).
    #[error("{0}")]
    Input(String),
    /// The work failed while running (exit status 2).
    #[error(transparent)]
    Runtime(anyhow::Error),
}

/// A failure while running.
pub(crate) fn runtime(error: impl Into<anyhow::Error>) -> RunError {
    RunError::Runtime(error.into())
}

/// A bad-input failure from a message.
pub(crate) fn bad_input(message: impl std::fmt::Display) -> RunError {
    RunError::Input(message.to_string())
}

/// Polls `condition` (every few milliseconds, backing off to 50 ms) until it returns `Some` or
/// an error, or `timeout` passes ([`TestbedError::Timeout`] naming `what`).
pub fn wait_for<T>(timeout: Duration, what: &str, mut condition: impl FnMut() -> Result<Option<T>>) -> Result<T> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(value) = condition()? {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            return Err(TestbedError::Timeout { what: what.to_string(), timeout });
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

fn io_error(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> TestbedError {
    let what = what.into();
    move |source| TestbedError::Io { what, source }
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
