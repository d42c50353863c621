//! Test support shared by every crate's tests (a dev-dependency only):
//!
//! - [`shared_data`]: the one policy for tests that need the workplace's shared data (traces,
//!   captures, payloads in `../shared/data`): they **fail** with one clear message when it is
//!   missing, naming `LDM7_SHARED`. A skipped test would hide a broken set-up.
//! - [`is_root`] / [`skip_unless_root`]: tests that need root (network namespaces, tc,
//!   iptables) skip with a clear message when not root; CI runs as root, so they run there.
//! - [`wait_until`]: synchronization by condition with a deadline, never by sleeping a guessed
//!   time.
//! - [`capture_streams`]: the reassembled TCP byte streams of an annotated capture transcript
//!   (`data/captures/*.txt`).

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

/// The byte streams of the RPC connections of a capture transcript (`relative` to `data/`, e.g.
/// `captures/fmtp-ldm7.txt`; format in `data/captures/README.md`): per `## Connection`
/// section, (client→server, server→client), read from its `### Byte stream C>S` and `S>C` hex
/// dumps. Other sections (FMTP streams) are skipped. Panics when the file holds no connection.
pub fn capture_streams(relative: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    let path = shared_data(relative);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    let mut connections: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut client_side: Option<bool> = None;
    for line in text.lines() {
        if line.starts_with("## ") {
            if line.starts_with("## Connection") {
                connections.push((Vec::new(), Vec::new()));
            }
            client_side = None;
        } else if let Some(rest) = line.strip_prefix("### Byte stream ") {
            client_side = if rest.starts_with("C>S") {
                Some(true)
            } else if rest.starts_with("S>C") {
                Some(false)
            } else {
                None
            };
        } else if line.starts_with("###") {
            client_side = None;
        } else if let (Some(client), Some(connection)) = (client_side, connections.last_mut()) {
            let Some((offset, rest)) = line.split_once("  ") else { continue };
            if offset.len() != 8 || !offset.chars().all(|c| c.is_ascii_hexdigit()) {
                continue;
            }
            let stream = if client { &mut connection.0 } else { &mut connection.1 };
            stream.extend(hex_words(rest.split('|').next().unwrap_or("")));
        }
    }
    assert!(!connections.is_empty(), "{}: no connections found", path.display());
    connections
}

/// Bytes written as whitespace-separated hex words (`00000048 6a08636d 150a`).
pub fn hex_words(text: &str) -> Vec<u8> {
    let mut bytes = Vec::new();
    for word in text.split_whitespace() {
        for k in (0..word.len()).step_by(2) {
            let pair = word.get(k..k + 2).unwrap_or_else(|| panic!("odd hex word {word:?}"));
            bytes.push(u8::from_str_radix(pair, 16).unwrap_or_else(|_| panic!("not hex: {word:?}")));
        }
    }
    bytes
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
