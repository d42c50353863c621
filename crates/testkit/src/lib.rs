//! Test support shared by every crate's tests (a dev-dependency only):
//!
//! - [`shared_data`]: the one policy for tests that need the workplace's shared data (traces,
//!   captures, payloads in `../shared/data`): they **fail** with one clear message when it is
//!   missing, naming `LDM7_SHARED`. A skipped test would hide a broken set-up.
//! - [`is_root`] / [`skip_unless_root`]: tests that need root (network namespaces, tc,
//!   iptables) skip with a clear message when not root; CI runs as root, so they run there.
//! - [`wait_until`]: synchronization by condition with a deadline, never by sleeping a guessed
//!   time.

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The shared data directory: `$LDM7_SHARED/data`, else `../shared/data` next to the checkout.
pub fn shared_root() -> PathBuf {
    std::env::var_os("LDM7_SHARED")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"), PathBuf::from)
        .join("data")
}

/// A file or directory of the shared data (`relative` to `data/`, e.g.
/// `traces/unidata_ldm_NGRID_1hr_20150615T00Z.txt`). Panics with one clear message when it is
/// missing: the tests that need shared data fail rather than skip.
pub fn shared_data(relative: &str) -> PathBuf {
    let path = shared_root().join(relative);
    assert!(
        path.exists(),
        "the shared test data is missing: {} does not exist. Point LDM7_SHARED at the directory \
         holding data/ (the workplace's ../shared) and run again.",
        path.display()
    );
    path
}

/// Whether the tests run as root.
pub fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
        .unwrap_or(false)
}

/// `true` when the test may go on; otherwise prints why `test` is skipped (it needs root) and
/// returns `false`.
pub fn skip_unless_root(test: &str) -> bool {
    if is_root() {
        return true;
    }
    eprintln!("skipping {test}: needs root (network namespaces, tc, iptables); CI runs it as root");
    false
}

/// Calls `condition` every few milliseconds until it returns `Some`, and returns that value;
/// panics after `timeout` saying what was awaited.
pub fn wait_until<T>(timeout: Duration, what: &str, mut condition: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(value) = condition() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_for_a_condition() {
        let mut calls = 0;
        let value = wait_until(Duration::from_secs(5), "three calls", || {
            calls += 1;
            (calls == 3).then_some(calls)
        });
        assert_eq!(value, 3);
    }

    #[test]
    #[should_panic(expected = "LDM7_SHARED")]
    fn missing_shared_data_fails_clearly() {
        shared_data("no/such/file");
    }
}
