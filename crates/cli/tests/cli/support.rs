//! The test harness of the loopback server tests (ldm6.rs, ldm7.rs): real `ldm7 serve`
//! processes, each with its own directory, queue, configuration and log.

#![allow(dead_code)]

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ldm7_pq::{Capacity, Queue};
use ldm7_testbed::{Server, ServerConfig};
use ldm7_testkit::{shared_data_or_skip, wait_until};
use ldm7_types::units::ByteSize;
use ldm7_types::{Signature, Timestamp};
use md5::{Digest, Md5};

pub const LDM7: &str = env!("CARGO_BIN_EXE_ldm7");
pub const LOCAL: &str = r"^((localhost|loopback)|(127\.0\.0\.1\.?))$";

pub fn run(args: &[&str]) -> String {
    let output = Command::new(LDM7).args(args).output().expect("run ldm7");
    assert!(output.status.success(), "ldm7 {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn free_port() -> u16 {
    ldm7_io::free_port().expect("a free port")
}

/// One `ldm7 serve` on a port of its own, with its own directory, queue and configuration: the
/// test bed's server ([`ldm7_testbed::Server`]), with the tests' shorter resubscription
/// back-off and panics instead of errors.
pub struct Node {
    pub dir: PathBuf,
    pub port: u16,
    server: Server,
}

impl Node {
    /// A server called `name` under `root` with a queue of `queue_size` (e.g. `200M`; the
    /// default slot count for that size) and `config` as its `ldmd.conf`. Not started.
    pub fn new(root: &Path, name: &str, queue_size: &str, config: &str) -> Self {
        let bytes = queue_size.parse::<ByteSize>().expect("queue size").bytes();
        let capacity = Capacity { bytes, slots: Capacity::default_slots(bytes) };
        let port = free_port();
        let config = ServerConfig::local(name, port, capacity, config).args(["--retry-max", "0.5"]);
        let server = Server::create(Path::new(LDM7), root, config).unwrap_or_else(|error| panic!("{error}"));
        Self { dir: server.dir().to_path_buf(), port, server }
    }

    pub fn queue_path(&self) -> String {
        self.server.queue_path().display().to_string()
    }

    /// Starts it and waits until it listens (fails with its log when it exits first).
    pub fn start(&mut self) -> &mut Self {
        self.server.start().unwrap_or_else(|error| panic!("{error}"));
        self
    }

    /// Further arguments of `ldm7 serve`, from the next start on.
    pub fn set_extra(&mut self, args: Vec<String>) {
        self.server.set_extra_args([vec!["--retry-max".to_string(), "0.5".to_string()], args].concat());
    }

    /// Environment variables of `ldm7 serve`, from the next start on.
    pub fn set_env(&mut self, env: Vec<(String, String)>) {
        self.server.set_env(env);
    }

    /// The process id while it runs.
    pub fn pid(&self) -> u32 {
        self.server.pid().expect("the server runs")
    }

    /// Its exit status once it has exited on its own.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.server.exited().unwrap_or_else(|error| panic!("{error}"))
    }

    pub fn kill9(&mut self) {
        self.server.kill();
    }

    /// SIGTERM and wait: the server must drain and exit 0.
    pub fn stop(&mut self) {
        self.server.stop().unwrap_or_else(|error| panic!("{error}"));
    }

    /// Its log, then what it printed on standard error.
    pub fn log(&self) -> String {
        self.server.log() + &self.server.stderr()
    }

    /// Products in the queue, the server's own statistics products left out.
    pub fn count(&self) -> u64 {
        let Ok(queue) = Queue::open(Path::new(&self.queue_path())) else { return 0 };
        let snapshot = queue.snapshot().expect("snapshot");
        snapshot
            .products_from(Timestamp::ZERO)
            .expect("iterate")
            .filter(|product| !product.as_ref().is_ok_and(|product| is_stats(&product.info.ident)))
            .count() as u64
    }

    pub fn wait_for(&self, count: u64, within: Duration) {
        // Past `within` the condition itself fails, with the count and the server's log.
        let deadline = Instant::now() + within;
        wait_until(within + Duration::from_secs(1), &format!("{count} products"), || {
            let have = self.count();
            assert!(
                have >= count || Instant::now() < deadline,
                "{}: {have} of {count} products after {within:?}\n{}",
                self.dir.display(),
                tail(&self.log())
            );
            (have >= count).then_some(())
        });
    }

    /// Waits until the server's log holds `needle`; past `within` it fails with the log's tail.
    pub fn wait_for_log(&self, needle: &str, within: Duration) {
        let deadline = Instant::now() + within;
        wait_until(within + Duration::from_secs(1), needle, || {
            let log = self.log();
            let found = log.contains(needle);
            assert!(
                found || Instant::now() < deadline,
                "{}: no {needle:?} after {within:?}\n{}",
                self.dir.display(),
                tail(&log)
            );
            found.then_some(())
        });
    }

    /// Every product: MD5 of its data equals its signature; returns the signatures and origins.
    pub fn verify(&self) -> (HashSet<Signature>, Vec<String>) {
        let queue = Queue::open(Path::new(&self.queue_path())).expect("open");
        let snapshot = queue.snapshot().expect("snapshot");
        let mut signatures = HashSet::new();
        let mut origins = Vec::new();
        for product in snapshot.products_from(Timestamp::ZERO).expect("iterate") {
            let product = product.expect("product");
            if is_stats(&product.info.ident) {
                continue;
            }
            let digest: [u8; 16] = Md5::digest(product.data).into();
            assert_eq!(Signature(digest), product.info.signature, "{}: corrupted {}", self.dir.display(), product.info);
            assert!(signatures.insert(product.info.signature), "duplicate {}", product.info);
            origins.push(product.info.origin.clone());
        }
        (signatures, origins)
    }
}

/// Whether a TCP socket listens on `port` (any address), from `/proc/net/tcp` and `tcp6`.
/// A server's own statistics product (not part of the data under test).
pub fn is_stats(ident: &str) -> bool {
    ident.starts_with("ldm7-stats/")
}

pub fn listening(port: u16) -> bool {
    let local_port = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|table| {
        std::fs::read_to_string(table).unwrap_or_default().lines().skip(1).any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // Field 1 is the local address:port in hex, field 3 the state (0A = LISTEN).
            fields.len() > 3 && fields[1].ends_with(&local_port) && fields[3] == "0A"
        })
    })
}

/// How many TCP connections a socket on local `port` still holds open (any address; from
/// `/proc/net/tcp` and `tcp6`): every state but LISTEN and TIME_WAIT, which the owner has
/// closed its side of.
pub fn open_connections(port: u16) -> usize {
    let local_port = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .map(|table| {
            std::fs::read_to_string(table)
                .unwrap_or_default()
                .lines()
                .skip(1)
                .filter(|line| {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    // Field 1 is the local address:port in hex, field 3 the state (0A = LISTEN,
                    // 06 = TIME_WAIT).
                    fields.len() > 3 && fields[1].ends_with(&local_port) && !["0A", "06"].contains(&fields[3])
                })
                .count()
        })
        .sum()
}

pub fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// The one-hour NGRID trace of the shared data; `None` (the test skips) when that is absent.
pub fn ngrid_trace() -> Option<PathBuf> {
    shared_data_or_skip("traces/unidata_ldm_NGRID_1hr_20150615T00Z.txt")
}

/// Inserts the first `limit` products of `trace` (seeded contents) into a node's queue.
pub fn replay(node: &Node, trace: &Path, limit: usize, seed: u64) {
    run(&[
        "insert",
        "-q",
        &node.queue_path(),
        "--replay",
        trace.to_str().expect("utf-8"),
        "--speed",
        "0",
        "--limit",
        &limit.to_string(),
        "--seed",
        &seed.to_string(),
    ]);
}
