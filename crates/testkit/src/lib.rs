//! Test support shared by every crate's tests (a dev-dependency only):
//!
//! - [`skip`]: the one way a test skips itself. It prints why on standard error and, when
//!   `LDM7_TEST_SKIPS` names a file, appends `binary::test: reason` to it, so that
//!   `scripts/test-all` reports skipped tests as skipped, not as passes (libtest counts a test
//!   that returns early as passed and hides its output).
//! - [`shared_data_or_skip`]: tests that need the workplace's shared data (traces, captures,
//!   payloads in `../shared/data`) skip with one message when it is absent. `LDM7_SHARED` set to
//!   a directory that does not hold the data is an error, not a skip: the operator asked for it.
//!   [`shared_data`] is the strict form for benchmarks and examples (they stop with a message).
//! - [`is_root`] / [`skip_unless_root`]: tests that need root (network namespaces, tc,
//!   iptables) skip when not root; CI runs as root, so they run there.
//! - [`wait_until`]: synchronization by condition with a deadline, never by sleeping a guessed
//!   time.
//! - [`postgres::Postgres`]: a PostgreSQL server of the test's own.
//! - [`capture_streams`]: the reassembled TCP byte streams of an annotated capture transcript
//!   (`data/captures/*.txt`).

pub mod postgres;
pub mod sntp;
pub mod workspace;

use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The environment variable naming the file skipped tests are recorded in (`scripts/test-all`
/// sets it).
pub const SKIPS_ENV: &str = "LDM7_TEST_SKIPS";

/// Records that the running test skips itself because of `reason` (say what is missing and how
/// to provide it); the test then returns. The test's name is its thread's (libtest names each
/// test's thread after the test).
pub fn skip(reason: &str) {
    skip_as(&current_test(None), reason);
}

fn skip_as(name: &str, reason: &str) {
    eprintln!("skipping {name}: {reason}");
    if let Some(file) = std::env::var_os(SKIPS_ENV).filter(|file| !file.is_empty())
        && let Err(error) = record_skip(Path::new(&file), name, reason)
    {
        eprintln!("cannot record the skip in {} ({SKIPS_ENV}): {error}", Path::new(&file).display());
    }
}

/// The shared data directory: `$LDM7_SHARED/data`, else `../shared/data` next to the checkout.
pub fn shared_root() -> PathBuf {
    std::env::var_os("LDM7_SHARED").map_or_else(default_shared, PathBuf::from).join("data")
}

/// A file or directory of the shared data (`relative` to `data/`, e.g.
/// `traces/unidata_ldm_NGRID_1hr_20150615T00Z.txt`), or `None` after [`skip`] when the shared
/// data is absent (no `LDM7_SHARED` and no `../shared/data`). Panics with one clear message when
/// `LDM7_SHARED` is set but does not hold the file, or when the shared data is there without it
/// (a broken set-up, not an absent one).
pub fn shared_data_or_skip(relative: &str) -> Option<PathBuf> {
    match locate(std::env::var_os("LDM7_SHARED").as_deref(), &default_shared(), relative) {
        Located::Found(path) => Some(path),
        Located::Absent(reason) => {
            skip(&reason);
            None
        }
        Located::Wrong(message) => panic!("{message}"),
    }
}

/// A file or directory of the shared data, for benchmarks and examples: panics with one clear
/// message naming `LDM7_SHARED` when it is missing.
pub fn shared_data(relative: &str) -> PathBuf {
    match locate(std::env::var_os("LDM7_SHARED").as_deref(), &default_shared(), relative) {
        Located::Found(path) => path,
        Located::Absent(message) | Located::Wrong(message) => panic!("{message}"),
    }
}

/// Whether the tests run as root.
pub fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
        .unwrap_or(false)
}

/// `true` when the test may go on; otherwise records that `test` is skipped ([`skip`]: it needs
/// root) and returns `false`.
pub fn skip_unless_root(test: &str) -> bool {
    if is_root() {
        return true;
    }
    skip_as(&current_test(Some(test)), "needs root (network namespaces, tc, iptables); CI runs it as root");
    false
}

/// `true` when the test may go on: it runs as root and every program of `tools` is on `PATH`;
/// otherwise records why `test` is skipped ([`skip`]) and returns `false`. For the namespace-lab
/// tests (`tools` such as `ip`, `tc`, `iptables`, `vde_switch`).
pub fn skip_unless_root_and_tools(test: &str, tools: &[&str]) -> bool {
    if !skip_unless_root(test) {
        return false;
    }
    let on_path = |tool: &str| {
        std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
    };
    if let Some(missing) = tools.iter().find(|tool| !on_path(tool)) {
        skip_as(
            &current_test(Some(test)),
            &format!("{missing} is not installed (apt-get install -y vde2 iptables iproute2)"),
        );
        return false;
    }
    true
}

/// The machine-wide lock of the namespace-lab tests, held while one runs (see [`lab_lock`]).
#[must_use = "the lock is released when the last holder in this process drops it"]
#[derive(Debug)]
pub struct LabLock(&'static ProcessFlock);

/// A lock file shared by the threads of this process and exclusive across processes: how many
/// holders the process has, and the locked file while it has any.
#[derive(Debug)]
struct ProcessFlock(std::sync::Mutex<(usize, Option<nix::fcntl::Flock<std::fs::File>>)>);

impl ProcessFlock {
    const fn new() -> Self {
        Self(std::sync::Mutex::new((0, None)))
    }

    fn acquire(&'static self, path: &Path) -> LabLock {
        let mut holders = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if holders.0 == 0 {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(path)
                .unwrap_or_else(|error| panic!("cannot open the lab lock {}: {error}", path.display()));
            let locked = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
                .unwrap_or_else(|(_, error)| panic!("cannot lock {}: {error}", path.display()));
            holders.1 = Some(locked);
        }
        holders.0 += 1;
        LabLock(self)
    }
}

impl Drop for LabLock {
    fn drop(&mut self) {
        let mut holders = self.0.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        holders.0 -= 1;
        if holders.0 == 0 {
            // Closing the file releases the lock.
            holders.1 = None;
        }
    }
}

/// Waits until no other process runs namespace-lab tests on this machine (`scripts/test-all`
/// runs the lab tests' binaries beside the rest), and holds the lock until the returned value is
/// dropped. The labs do not collide (each has names of its own); the lock is there because their
/// numbers (rates, losses, time limits) assume that the two cores are not another lab's. An
/// advisory lock (`flock`) on `$TMPDIR/ldm7-lab.lock`: the kernel releases it when the holder
/// exits, a crashed test included.
///
/// The tests of one process share it: they run beside each other as the binary's test threads
/// allow, as they were written to; a binary whose lab tests must run one at a time serialises
/// them itself.
pub fn lab_lock() -> LabLock {
    static LAB: ProcessFlock = ProcessFlock::new();
    LAB.acquire(&std::env::temp_dir().join("ldm7-lab.lock"))
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
/// dumps. Other sections (FMTP streams) are skipped. `None` when the shared data is absent
/// ([`shared_data_or_skip`]); panics when the file holds no connection.
pub fn capture_streams(relative: &str) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    let path = shared_data_or_skip(relative)?;
    let text = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    let mut connections: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut section = None;
    for stream in transcript_streams(&text) {
        if !stream.section.starts_with("Connection") {
            continue;
        }
        if section.as_ref() != Some(&stream.section) {
            connections.push((Vec::new(), Vec::new()));
            section = Some(stream.section.clone());
        }
        let connection = connections.last_mut().expect("pushed above");
        match stream.direction.get(..3) {
            Some("C>S") => connection.0 = stream.bytes,
            Some("S>C") => connection.1 = stream.bytes,
            _ => {}
        }
    }
    assert!(!connections.is_empty(), "{}: no connections found", path.display());
    Some(connections)
}

/// One `### Byte stream` hex dump of a capture transcript.
#[derive(Clone, Debug)]
pub struct TranscriptStream {
    /// The heading of its `## ` section (`Connection 1: …`, `FMTP retransmission TCP connection: …`).
    pub section: String,
    /// What follows `### Byte stream ` (`C>S  10.77.0.2:59058 -> …`, `R>S …`).
    pub direction: String,
    /// The bytes.
    pub bytes: Vec<u8>,
}

/// Every byte stream of a capture transcript's text, in file order.
pub fn transcript_streams(text: &str) -> Vec<TranscriptStream> {
    let mut streams: Vec<TranscriptStream> = Vec::new();
    let mut section = String::new();
    let mut in_stream = false;
    for line in text.lines() {
        if let Some(heading) = line.strip_prefix("## ") {
            section = heading.to_owned();
            in_stream = false;
        } else if let Some(direction) = line.strip_prefix("### Byte stream ") {
            streams.push(TranscriptStream {
                section: section.clone(),
                direction: direction.to_owned(),
                bytes: Vec::new(),
            });
            in_stream = true;
        } else if line.starts_with('#') || line.starts_with("====") {
            in_stream = false;
        } else if in_stream && let Some(stream) = streams.last_mut() {
            let Some((offset, rest)) = line.split_once("  ") else { continue };
            if offset.len() == 8 && offset.chars().all(|c| c.is_ascii_hexdigit()) {
                stream.bytes.extend(hex_words(rest.split('|').next().unwrap_or("")));
            }
        }
    }
    streams
}

/// The datagrams of a capture transcript's text (its `hex:` lines), in file order.
pub fn transcript_datagrams(text: &str) -> Vec<Vec<u8>> {
    text.lines().filter_map(|line| line.trim_start().strip_prefix("hex:")).map(hex_words).collect()
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

/// Where the shared data is, or why not.
#[derive(Debug, PartialEq, Eq)]
enum Located {
    Found(PathBuf),
    /// No shared data at all: the tests that need it skip.
    Absent(String),
    /// A set-up that is wrong: `LDM7_SHARED` does not hold the data, or the data lacks the file.
    Wrong(String),
}

/// The policy of [`shared_data_or_skip`], with the environment and the default root as
/// arguments.
fn locate(env_shared: Option<&OsStr>, default_root: &Path, relative: &str) -> Located {
    match env_shared.filter(|value| !value.is_empty()) {
        Some(shared) => {
            let path = Path::new(shared).join("data").join(relative);
            if path.exists() {
                Located::Found(path)
            } else {
                Located::Wrong(format!(
                    "LDM7_SHARED={} does not hold the shared test data: {} does not exist. Point LDM7_SHARED \
                     at the directory holding data/ (the workplace's ../shared), or unset it to skip the tests \
                     that need it.",
                    Path::new(shared).display(),
                    path.display()
                ))
            }
        }
        None => {
            let data = default_root.join("data");
            let path = data.join(relative);
            if path.exists() {
                Located::Found(path)
            } else if !data.is_dir() {
                Located::Absent(format!(
                    "the shared test data is absent ({}); set LDM7_SHARED to the directory holding data/ \
                     to run this test",
                    data.display()
                ))
            } else {
                Located::Wrong(format!(
                    "the shared test data in {} lacks {relative}: update it (or point LDM7_SHARED at a \
                     complete copy)",
                    data.display()
                ))
            }
        }
    }
}

/// `../shared` next to the checkout (this crate is `CHECKOUT/crates/testkit`).
fn default_shared() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.ancestors().nth(3).map_or_else(|| manifest.join("../../../shared"), |parent| parent.join("shared"))
}

/// The running test: `package/binary::test` — the package as cargo tells the test process
/// (`CARGO_PKG_NAME`, when run by cargo), the binary's name without cargo's hash, the test's
/// from its thread (else `given`, else `main`).
fn current_test(given: Option<&str>) -> String {
    let binary = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.file_stem().map(|stem| stem.to_string_lossy().into_owned()))
        .map(|stem| match stem.rsplit_once('-') {
            Some((name, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => name.to_owned(),
            _ => stem,
        })
        .unwrap_or_default();
    let thread = std::thread::current().name().filter(|name| *name != "main").map(str::to_owned);
    let test = thread.or_else(|| given.map(str::to_owned)).unwrap_or_else(|| "main".to_owned());
    let binary = match std::env::var("CARGO_PKG_NAME") {
        Ok(package) if !package.is_empty() && package.replace('-', "_") != binary => format!("{package}/{binary}"),
        _ => binary,
    };
    if binary.is_empty() { test } else { format!("{binary}::{test}") }
}

/// Appends `name: reason` as one line (one `write` on an append-only file, so that tests
/// recording at once in several processes do not interleave).
fn record_skip(file: &Path, name: &str, reason: &str) -> std::io::Result<()> {
    let line = format!("{name}: {}\n", reason.replace('\n', " "));
    std::fs::OpenOptions::new().create(true).append(true).open(file)?.write_all(line.as_bytes())
}

/// A number unique within this process (for scratch names).
pub fn unique() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lab_lock_is_shared_within_a_process_and_exclusive_across_processes() {
        // A lock of its own: the lab tests' one may be held by a lab test running beside.
        static LOCK: ProcessFlock = ProcessFlock::new();
        let path = std::env::temp_dir().join(format!("ldm7-lock-test-{}", std::process::id()));
        let first = LOCK.acquire(&path);
        let second = LOCK.acquire(&path);
        // Another open file description stands for another process: flock sees it as one.
        let try_other = || {
            let other = std::fs::OpenOptions::new().write(true).open(&path).expect("open");
            nix::fcntl::Flock::lock(other, nix::fcntl::FlockArg::LockExclusiveNonblock)
                .map(drop)
                .map_err(|(_, error)| error)
        };
        assert_eq!(try_other(), Err(nix::errno::Errno::EWOULDBLOCK));
        drop(first);
        assert_eq!(try_other(), Err(nix::errno::Errno::EWOULDBLOCK));
        drop(second);
        try_other().expect("free once this process holds it no more");
        std::fs::remove_file(&path).expect("remove the lock file");
    }

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
    fn shared_data_is_found_skipped_when_absent_and_refused_when_wrong() {
        let dir = tempfile_dir();
        std::fs::create_dir_all(dir.join("shared/data/traces")).unwrap();
        std::fs::write(dir.join("shared/data/traces/t.txt"), "").unwrap();
        let shared = dir.join("shared");
        let found = locate(None, &shared, "traces/t.txt");
        assert_eq!(found, Located::Found(shared.join("data/traces/t.txt")));
        let env = Some(shared.as_os_str());
        assert_eq!(
            locate(env, Path::new("/nonexistent"), "traces/t.txt"),
            Located::Found(shared.join("data/traces/t.txt"))
        );
        // No LDM7_SHARED and no ../shared: skip.
        assert!(
            matches!(locate(None, &dir.join("nothing"), "traces/t.txt"), Located::Absent(m) if m.contains("LDM7_SHARED"))
        );
        // LDM7_SHARED set to a directory without the data: an error, never a skip.
        let wrong = dir.join("nothing");
        assert!(
            matches!(locate(Some(wrong.as_os_str()), &shared, "traces/t.txt"), Located::Wrong(m) if m.contains("LDM7_SHARED="))
        );
        // The data is there but lacks the file: an error.
        assert!(matches!(locate(None, &shared, "traces/missing.txt"), Located::Wrong(m) if m.contains("lacks")));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn skips_are_recorded_one_line_each_with_the_test_name() {
        let dir = tempfile_dir();
        let file = dir.join("skips");
        let name = current_test(None);
        assert!(name.ends_with("tests::skips_are_recorded_one_line_each_with_the_test_name"), "{name}");
        // The unit-test binary of package ldm7-testkit is ldm7_testkit: named once.
        assert!(name.starts_with("ldm7_testkit::"), "{name}");
        record_skip(&file, &name, "needs root").unwrap();
        record_skip(&file, "other::test", "the shared data\nis absent").unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        assert_eq!(text, format!("{name}: needs root\nother::test: the shared data is absent\n"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    #[should_panic(expected = "LDM7_SHARED")]
    fn missing_shared_data_fails_clearly_where_it_is_required() {
        shared_data("no/such/file");
    }

    /// A fresh directory under the system temporary directory (testkit has no dependencies).
    fn tempfile_dir() -> PathBuf {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        let dir = std::env::temp_dir().join(format!("ldm7-testkit-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
