//! LDM-6 on loopback with real `ldm7 serve` processes: fan-out of 10,000 NGRID-sized products
//! to four downstreams, a relay chain, a downstream killed and restarted, a host refused the
//! way LDM refuses it, and a malformed record that closes only its own connection.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ldm7_pq::Queue;
use ldm7_testkit::{shared_data, wait_until};
use ldm7_types::{Signature, Timestamp};
use md5::{Digest, Md5};

const LDM7: &str = env!("CARGO_BIN_EXE_ldm7");
const LOCAL: &str = r"^((localhost|loopback)|(127\.0\.0\.1\.?))$";

fn run(args: &[&str]) -> String {
    let output = Command::new(LDM7).args(args).output().expect("run ldm7");
    assert!(output.status.success(), "ldm7 {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("port")
}

/// One `ldm7 serve` with its own directory, queue and configuration.
struct Node {
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
    extra: Vec<String>,
}

impl Node {
    fn new(root: &Path, name: &str, queue_size: &str, config: &str) -> Self {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).expect("dir");
        run(&["queue", "create", "-q", dir.join("q.pq").to_str().expect("utf-8"), "--size", queue_size]);
        std::fs::write(dir.join("ldmd.conf"), config).expect("config");
        Self { dir, port: free_port(), child: None, extra: Vec::new() }
    }

    fn queue_path(&self) -> String {
        self.dir.join("q.pq").display().to_string()
    }

    fn start(&mut self) -> &mut Self {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join("log")).expect("log");
        let child = Command::new(LDM7)
            .args(["serve", "-c", "ldmd.conf", "-q", "q.pq", "--state-dir", "state", "--retry-max", "0.5", "-v"])
            .args(["-P", &self.port.to_string()])
            .args(&self.extra)
            .current_dir(&self.dir)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start ldm7 serve");
        self.child = Some(child);
        // Listening? Read from the kernel's socket table rather than probing with a connection,
        // which the server would count as a client.
        wait_until(Duration::from_secs(10), &format!("ldm7 serve listening on port {}", self.port), || {
            listening(self.port).then_some(())
        });
        self
    }

    fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM and wait: the server must drain and exit 0.
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
            let status = wait_until(Duration::from_secs(10), "ldm7 serve to exit on SIGTERM", || {
                child.try_wait().expect("wait")
            });
            assert!(status.success(), "ldm7 serve exited with {status}: {}", self.log());
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    fn count(&self) -> u64 {
        Queue::open(Path::new(&self.queue_path())).map(|q| q.stats().expect("stats").product_count).unwrap_or(0)
    }

    fn wait_for(&self, count: u64, within: Duration) {
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

    /// Every product: MD5 of its data equals its signature; returns the signatures and origins.
    fn verify(&self) -> (HashSet<Signature>, Vec<String>) {
        let queue = Queue::open(Path::new(&self.queue_path())).expect("open");
        let snapshot = queue.snapshot().expect("snapshot");
        let mut signatures = HashSet::new();
        let mut origins = Vec::new();
        for product in snapshot.products_from(Timestamp::ZERO).expect("iterate") {
            let product = product.expect("product");
            let digest: [u8; 16] = Md5::digest(product.data).into();
            assert_eq!(Signature(digest), product.info.signature, "{}: corrupted {}", self.dir.display(), product.info);
            assert!(signatures.insert(product.info.signature), "duplicate {}", product.info);
            origins.push(product.info.origin.clone());
        }
        (signatures, origins)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Whether a TCP socket listens on `port` (any address), from `/proc/net/tcp` and `tcp6`.
fn listening(port: u16) -> bool {
    let local_port = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|table| {
        std::fs::read_to_string(table).unwrap_or_default().lines().skip(1).any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // Field 1 is the local address:port in hex, field 3 the state (0A = LISTEN).
            fields.len() > 3 && fields[1].ends_with(&local_port) && fields[3] == "0A"
        })
    })
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

fn allow_local() -> String {
    format!("ALLOW ANY {LOCAL}\nACCEPT ANY .* {LOCAL}\n")
}

fn request(from: &Node) -> String {
    format!("{}REQUEST ANY \".*\" 127.0.0.1:{}\n", allow_local(), from.port)
}

fn replay(node: &Node, limit: usize, seed: u64) {
    let trace = shared_data("traces/unidata_ldm_NGRID_1hr_20150615T00Z.txt");
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

#[test]
fn four_downstreams_get_every_product_intact_and_once() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut upstream = Node::new(root.path(), "up", "2G", &allow_local());
    replay(&upstream, 10_000, 1);
    assert_eq!(upstream.count(), 10_000);
    upstream.start();
    let mut downstreams: Vec<Node> =
        (0..4).map(|k| Node::new(root.path(), &format!("down{k}"), "2G", &request(&upstream))).collect();
    let started = Instant::now();
    for node in &mut downstreams {
        node.start();
    }
    for node in &downstreams {
        node.wait_for(10_000, Duration::from_secs(300));
    }
    eprintln!("10,000 products to 4 downstreams in {:.1} s", started.elapsed().as_secs_f64());
    let (expected, _) = upstream.verify();
    for node in &mut downstreams {
        let (got, origins) = node.verify();
        assert_eq!(got, expected, "{}", node.dir.display());
        assert!(origins.iter().all(|origin| origin.ends_with("_v_127.0.0.1")), "origin rewritten: {:?}", &origins[..1]);
        node.stop();
    }
    upstream.stop();
}

#[test]
fn relay_chain_a_to_b_to_c() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut a = Node::new(root.path(), "a", "200M", &allow_local());
    replay(&a, 150, 2);
    a.start();
    let mut b = Node::new(root.path(), "b", "200M", &request(&a));
    b.start();
    let mut c = Node::new(root.path(), "c", "200M", &request(&b));
    c.start();
    // More products while the chain runs.
    replay(&a, 300, 3);
    c.wait_for(450, Duration::from_secs(120));
    let (at_a, _) = a.verify();
    let (at_c, origins) = c.verify();
    assert_eq!(at_a, at_c);
    assert!(origins.iter().all(|origin| origin.ends_with("_v_127.0.0.1") && !origin.contains("_v_127.0.0.1_v_")));
    for node in [&mut c, &mut b, &mut a] {
        node.stop();
    }
}

#[test]
fn killed_downstream_resumes_without_loss_or_duplicates() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut upstream = Node::new(root.path(), "up", "1G", &allow_local());
    replay(&upstream, 2_000, 4);
    upstream.start();
    let mut down = Node::new(root.path(), "down", "1G", &request(&upstream));
    down.start();
    down.wait_for(300, Duration::from_secs(60));
    down.kill9();
    let before = down.count();
    replay(&upstream, 1_000, 5);
    // The scenario, not synchronization: the resume point is at least a second old, as after a
    // real crash.
    std::thread::sleep(Duration::from_millis(1200));
    down.start();
    down.wait_for(3_000, Duration::from_secs(120));
    // Stopped (drained, exited): nothing more can arrive while the queue is checked.
    down.stop();
    let (got, _) = down.verify();
    let (expected, _) = upstream.verify();
    assert_eq!(got, expected);
    assert_eq!(down.count(), 3_000, "no duplicates");
    let log = upstream.log();
    let resumed = log.lines().filter(|l| l.contains("Starting Up(ldm7/6)") && !l.contains("SIG=NONE")).count();
    assert!(resumed >= 1, "the restarted downstream resumed with SIG= (had {before}):\n{}", tail(&log));
    upstream.stop();
}

/// The FEEDME of the primary capture (xid 0x6a0a964a, EXP ".*").
fn feedme_record() -> Vec<u8> {
    let words = [
        0x8000_004c_u32,
        0x6a0a_964a,
        0,
        2,
        0x0004_93fd,
        6,
        4,
        0,
        0,
        0,
        0,
        0x6b02_a27a,
        0x0008_5313,
        0x7fff_ffff,
        0x000f_423f,
        1,
        0x4000_0000,
        2,
        0x2e2a_0000,
        0xffff_ffff,
    ];
    words.iter().flat_map(|w| w.to_be_bytes()).collect()
}

/// A NULLPROC call (LDM program 300029, version 6, procedure 0), which an upstream answers in
/// any state.
fn nullproc_record() -> Vec<u8> {
    let words = [0x8000_0028_u32, 0x0000_0001, 0, 2, 0x0004_93fd, 6, 0, 0, 0, 0, 0];
    words.iter().flat_map(|w| w.to_be_bytes()).collect()
}

#[test]
fn host_not_allowed_is_refused_as_ldm_does() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut server = Node::new(root.path(), "s", "50M", "ALLOW ANY ^nohost\\.example\\.org$\n");
    server.start();
    let mut stream = TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
    stream.write_all(&feedme_record()).expect("write");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let mut reply = Vec::new();
    let mut buf = [0u8; 256];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => reply.extend_from_slice(&buf[..n]),
        }
    }
    // MSG_DENIED / AUTH_ERROR / AUTH_TOOWEAK with xid 0, as the reference (capture ldm6-refused).
    let expected: Vec<u8> = [0x8000_0014_u32, 0, 1, 1, 1, 5].iter().flat_map(|w| w.to_be_bytes()).collect();
    assert_eq!(reply, expected);
    // The tools say so clearly.
    let output = Command::new(LDM7)
        .args(["notify", "-h", &format!("127.0.0.1:{}", server.port), "-T", "5"])
        .output()
        .expect("notify");
    assert_eq!(output.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("denies access"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    server.stop();
}

#[test]
fn malformed_record_closes_only_that_connection() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut upstream = Node::new(root.path(), "up", "200M", &allow_local());
    replay(&upstream, 50, 6);
    upstream.start();
    let mut down = Node::new(root.path(), "down", "200M", &request(&upstream));
    down.start();
    down.wait_for(50, Duration::from_secs(60));
    // A record whose call header is garbage, then a record larger than any product.
    for garbage in [vec![0x80, 0, 0, 8, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 7], 0x7fff_fff0_u32.to_be_bytes().to_vec()] {
        let mut stream = TcpStream::connect(("127.0.0.1", upstream.port)).expect("connect");
        stream.write_all(&garbage).expect("write");
        stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        let mut buf = [0u8; 64];
        let closed = matches!(stream.read(&mut buf), Ok(0) | Err(_));
        assert!(closed, "the server closes a connection that sent a malformed record");
    }
    // The others go on: the downstream still receives, a new client is served.
    replay(&upstream, 80, 7);
    down.wait_for(130, Duration::from_secs(60));
    let output = Command::new(LDM7)
        .args(["notify", "-h", &format!("127.0.0.1:{}", upstream.port), "-o", "3600", "--count", "3"])
        .output()
        .expect("notify");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(String::from_utf8_lossy(&output.stdout).lines().count(), 3);
    assert!(upstream.log().contains("malformed"), "{}", tail(&upstream.log()));
    down.stop();
    upstream.stop();
}

#[test]
fn send_pushes_files_that_notify_then_sees() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut server = Node::new(root.path(), "s", "50M", &allow_local());
    server.start();
    let files: Vec<PathBuf> = (1..=3)
        .map(|k| {
            let path = root.path().join(format!("cap.{k}"));
            std::fs::write(&path, format!("hello {k}{}\n", if k == 3 { ", unaligned" } else { "" })).expect("write");
            path
        })
        .collect();
    let host = format!("localhost:{}", server.port);
    let mut args = vec!["send", "-h", &host, "-f", "EXP"];
    args.extend(files.iter().map(|p| p.to_str().expect("utf-8")));
    let output = Command::new(LDM7).args(&args).output().expect("send");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let lines = run(&["notify", "-h", &host, "-f", "EXP", "-o", "60", "--count", "3"]);
    let lines: Vec<&str> = lines.lines().collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(lines[2].ends_with("cap.3") && lines[2].contains(" EXP 002  "), "{lines:?}");
    let (signatures, _) = server.verify();
    assert_eq!(signatures.len(), 3);
    // Pushing again: every product is a duplicate, nothing new.
    let output = Command::new(LDM7).args(&args).output().expect("send");
    assert!(output.status.success());
    assert_eq!(server.count(), 3);
    server.stop();
}

#[test]
fn sighup_reloads_the_configuration_and_exec_runs_programs() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut server =
        Node::new(root.path(), "s", "50M", "ALLOW ANY ^nohost\\.example\\.org$\nEXEC \"touch exec-ran\"\n");
    server.start();
    let host = format!("127.0.0.1:{}", server.port);
    let notify =
        |host: &str| Command::new(LDM7).args(["notify", "-h", host, "-o", "60", "-T", "3"]).output().expect("notify");
    assert_eq!(notify(&host).status.code(), Some(1), "refused before the reload");
    std::fs::write(server.dir.join("ldmd.conf"), allow_local()).expect("rewrite");
    let pid = server.child.as_ref().expect("running").id();
    assert!(Command::new("kill").args(["-HUP", &pid.to_string()]).status().expect("kill").success());
    wait_until(Duration::from_secs(5), "the server to log \"Configuration reloaded\"", || {
        server.log().contains("Configuration reloaded").then_some(())
    });
    // Allowed now: notify connects and ends on its own silence limit (nothing in the queue).
    let output = notify(&host);
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("accepted"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(server.dir.join("exec-ran").exists(), "EXEC ran its program in the server's directory");
    server.stop();
}

#[test]
fn connections_beyond_max_clients_are_refused_and_counted() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut server = Node::new(root.path(), "s", "50M", &allow_local());
    server.extra = vec!["--max-clients".into(), "1".into()];
    server.start();
    // Hold the only slot with a connection the server has certainly accepted: it answered a
    // NULLPROC on it (start() checks for the listening socket without connecting).
    let mut held = TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
    held.write_all(&nullproc_record()).expect("write");
    held.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let mut reply = [0u8; 4];
    held.read_exact(&mut reply).expect("the server answers NULLPROC on the held connection");
    let output = Command::new(LDM7)
        .args(["notify", "-h", &format!("127.0.0.1:{}", server.port), "-T", "5"])
        .output()
        .expect("notify");
    assert_eq!(output.status.code(), Some(2), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(String::from_utf8_lossy(&output.stderr).contains("closed the connection"));
    assert!(server.log().contains("refusing"), "{}", tail(&server.log()));
    server.stop();
}
