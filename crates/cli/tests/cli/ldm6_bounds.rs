//! The LDM-6 server's bounds against misuse (issue #16 item 4, docs/server.md "Bounds"), each
//! attack made on loopback against a real `ldm7 serve` while a real downstream `ldm7 serve`
//! keeps receiving from it: idle connections cost little memory and are closed after
//! `first_call_timeout` (and an idle push after `push_idle_timeout`); connections beyond
//! `connections_per_host_max` are refused; a second FEEDME from a host for the same feed
//! replaces the first (and not with `one_feeder_per_host = false`); an oversized record is
//! refused before it is buffered while a large pushed product still passes. Every refusal is
//! logged once and counted in `ldm7_connections_refused_total`.
//!
//! The attacks come from 127.0.0.2 and the downstream from 127.0.0.1, so that per-host bounds
//! and the one-feeder rule tell them apart.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::{LDM7, LOCAL, Node, free_port, run, tail};
use ldm7_testkit::wait_until;

const ATTACKER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// The upstream: allows 127.0.0.1 (the downstream) and 127.0.0.2 (the attacker), accepts
/// pushes from both, serves metrics, and has `settings` as its `ldm7.toml`.
fn upstream(root: &Path, settings: &str) -> (Node, u16) {
    let config = format!(
        "ALLOW ANY {LOCAL}\nALLOW ANY ^127\\.0\\.0\\.2$\nACCEPT ANY .* {LOCAL}\nACCEPT ANY .* ^127\\.0\\.0\\.2$\n"
    );
    let mut node = Node::new(root, "up", "100M", &config);
    std::fs::write(node.dir.join("ldm7.toml"), settings).expect("settings");
    let metrics = free_port();
    node.set_extra(vec!["--metrics".into(), format!("127.0.0.1:{metrics}"), "--max-clients".into(), "1000".into()]);
    node.start();
    wait_until(Duration::from_secs(10), "the metrics endpoint", || metrics_text(metrics));
    (node, metrics)
}

/// A downstream requesting everything from `up`, already receiving (`count` products).
fn downstream(root: &Path, up: &Node) -> Node {
    let config = format!("ALLOW ANY {LOCAL}\nREQUEST ANY \".*\" 127.0.0.1:{}\n", up.port);
    let mut node = Node::new(root, "down", "100M", &config);
    node.start();
    node
}

/// Inserts `count` products of `size` bytes into `node`'s queue (idents `tag.N`).
fn insert(node: &Node, tag: &str, count: usize, size: usize) {
    let dir = node.dir.join(format!("files-{tag}"));
    std::fs::create_dir_all(&dir).expect("dir");
    let files: Vec<String> = (0..count)
        .map(|k| {
            let path = dir.join(format!("{tag}.{k}"));
            let mut data = format!("{tag} {k} ").into_bytes();
            data.resize(size.max(data.len()), b'x' ^ (k as u8));
            std::fs::write(&path, data).expect("write");
            path.display().to_string()
        })
        .collect();
    let queue = node.queue_path();
    let mut args = vec!["insert", "-q", queue.as_str(), "-f", "EXP"];
    args.extend(files.iter().map(String::as_str));
    run(&args);
}

/// A connection from the attacker's address.
fn connect_from_attacker(port: u16) -> TcpStream {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    socket.bind(&SocketAddr::from((ATTACKER, 0)).into()).expect("bind 127.0.0.2");
    socket.connect(&SocketAddr::from(([127, 0, 0, 1], port)).into()).expect("connect");
    let stream: TcpStream = socket.into();
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    stream
}

/// An LDM-6 call record (AUTH_NONE), one fragment.
fn call(xid: u32, procedure: u32, body: &[u8]) -> Vec<u8> {
    let mut record = Vec::new();
    record.extend_from_slice(&(0x8000_0000 | (40 + body.len()) as u32).to_be_bytes());
    for word in [xid, 0, 2, 300_029, 6, procedure, 0, 0, 0, 0] {
        record.extend_from_slice(&word.to_be_bytes());
    }
    record.extend_from_slice(body);
    record
}

/// A product class of one spec, from an hour ago to TS_ENDT.
fn class(feed: &str, pattern: &str) -> Vec<u8> {
    let from = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs() - 3600;
    let feedtype = ldm7_types::FeedType::from_name(feed).expect("feed").0;
    let mut body = Vec::new();
    for word in [from as u32, 0, 0x7fff_ffff, 999_999, 1, feedtype, pattern.len() as u32] {
        body.extend_from_slice(&word.to_be_bytes());
    }
    body.extend_from_slice(pattern.as_bytes());
    body.resize(body.len().next_multiple_of(4), 0);
    body
}

fn feedme(feed: &str) -> Vec<u8> {
    let mut body = class(feed, ".*");
    body.extend_from_slice(&u32::MAX.to_be_bytes());
    call(0x1000, 4, &body)
}

fn nullproc() -> Vec<u8> {
    call(1, 0, &[])
}

/// The next record's body, or `None` when the server closed the connection (or `within`
/// passed without one: `Err`).
fn read_record(stream: &mut TcpStream) -> std::io::Result<Option<Vec<u8>>> {
    let mut marker = [0u8; 4];
    match stream.read_exact(&mut marker) {
        Ok(()) => {}
        Err(error) if matches!(error.kind(), ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset) => {
            return Ok(None);
        }
        Err(error) => return Err(error),
    }
    let len = (u32::from_be_bytes(marker) & 0x7fff_ffff) as usize;
    let mut body = vec![0u8; len];
    match stream.read_exact(&mut body) {
        Ok(()) => Ok(Some(body)),
        Err(error) if matches!(error.kind(), ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset) => Ok(None),
        Err(error) => Err(error),
    }
}

fn word(body: &[u8], index: usize) -> u32 {
    u32::from_be_bytes(body[index * 4..index * 4 + 4].try_into().expect("4 bytes"))
}

/// Sends a FEEDME and checks the OK reply.
fn feed_me(stream: &mut TcpStream, feed: &str) {
    stream.write_all(&feedme(feed)).expect("FEEDME");
    let reply = read_record(stream).expect("read").expect("a reply to FEEDME");
    // xid, REPLY, MSG_ACCEPTED, verf, SUCCESS, then fornme_reply_t: OK.
    assert_eq!((word(&reply, 1), word(&reply, 2), word(&reply, 5), word(&reply, 6)), (1, 0, 0, 0), "{reply:?}");
}

/// Whether the server closed `stream` within `within` (records it sent meanwhile skipped).
fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        stream.set_read_timeout(Some(left)).expect("timeout");
        match read_record(stream) {
            Ok(None) => return true,
            Ok(Some(_)) => {}
            Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return false,
            Err(_) => return true,
        }
    }
}

/// The metrics text, if the endpoint answers.
fn metrics_text(port: u16) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    text.contains("ldm7_connections_refused_total").then_some(text)
}

/// `ldm7_connections_refused_total{reason="…"}`.
fn refused(metrics: u16, reason: &str) -> u64 {
    let text = metrics_text(metrics).expect("metrics");
    let prefix = format!("ldm7_connections_refused_total{{reason=\"{reason}\"}} ");
    text.lines().find_map(|line| line.strip_prefix(&prefix)).and_then(|value| value.parse().ok()).expect("sample")
}

/// The server's resident memory, KiB.
fn rss_kib(node: &Node) -> u64 {
    let pid = node.pid();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.split_whitespace().next()?.parse().ok())
        .expect("VmRSS")
}

fn log_lines(node: &Node, text: &str) -> usize {
    node.log().lines().filter(|line| line.contains(text)).count()
}

/// Bound on what one idle connection may add to the server's resident memory: its thread, the
/// allocator's per-thread heap and the session's small record buffer. Measured on the
/// reference machine (2 vCPU, gVisor): ~420 KiB, most of it the allocator's per-thread heap;
/// ~4 MiB before the read and write buffers were allocated lazily (docs/server.md "Bounds").
const IDLE_CONNECTION_KIB_MAX: u64 = 768;

#[test]
fn idle_connections_cost_little_and_are_closed_after_first_call_timeout() {
    let root = tempfile::tempdir().expect("tempdir");
    // 30 s for the idle ones: the set-up below (256 connections, products to a downstream)
    // takes several seconds on a busy machine, and the push must be closed by its own 2 s
    // before the idle connections' timeout could close it.
    let settings =
        "[ldm6]\nconnections_per_host_max = 1000\nfirst_call_timeout = \"30s\"\npush_idle_timeout = \"2s\"\n";
    let (mut up, metrics) = upstream(root.path(), settings);
    insert(&up, "before", 5, 1000);
    let mut down = downstream(root.path(), &up);
    down.wait_for(5, Duration::from_secs(30));
    let before = rss_kib(&up);
    // 256 connections, each answered a NULLPROC (so the server has certainly taken it up and
    // read from it), then idle.
    let opened = Instant::now();
    let mut idle: Vec<TcpStream> = (0..256)
        .map(|_| {
            let mut stream = connect_from_attacker(up.port);
            stream.write_all(&nullproc()).expect("NULLPROC");
            read_record(&mut stream).expect("read").expect("the NULLPROC reply");
            stream
        })
        .collect();
    let after = rss_kib(&up);
    let per_connection = after.saturating_sub(before) / 256;
    eprintln!("256 idle connections: RSS {before} KiB -> {after} KiB ({per_connection} KiB per connection)");
    assert!(
        per_connection <= IDLE_CONNECTION_KIB_MAX,
        "an idle connection costs {per_connection} KiB (bound {IDLE_CONNECTION_KIB_MAX} KiB)"
    );
    // The downstream keeps receiving meanwhile.
    insert(&up, "during", 5, 1000);
    down.wait_for(10, Duration::from_secs(30));
    // A push connection (HIYA accepted) that then sends nothing is closed after
    // push_idle_timeout (2 s), long before the 30 s of the idle ones.
    let mut push = connect_from_attacker(up.port);
    push.write_all(&call(7, 5, &class("EXP", ".*"))).expect("HIYA");
    let reply = read_record(&mut push).expect("read").expect("the HIYA reply");
    assert_eq!(word(&reply, 6), 0, "HIYA OK: {reply:?}");
    assert!(closed_within(&mut push, Duration::from_secs(10)), "the idle push connection is closed");
    assert!(opened.elapsed() < Duration::from_secs(30), "the push closed before the first-call timeout");
    assert_eq!(log_lines(&up, "ldm6.push_idle_timeout"), 1, "{}", tail(&up.log()));
    // Every idle connection is closed at first_call_timeout, with one log line for all.
    for stream in &mut idle {
        assert!(closed_within(stream, Duration::from_secs(55)), "an idle connection stays open");
    }
    wait_until(Duration::from_secs(10), "257 idle refusals counted", || {
        (refused(metrics, "idle") == 257).then_some(())
    });
    let lines = log_lines(&up, "ldm6.first_call_timeout");
    assert!(lines <= 1, "one line for 256 idle closures within a minute, not {lines}: {}", tail(&up.log()));
    insert(&up, "after", 5, 1000);
    down.wait_for(15, Duration::from_secs(30));
    down.stop();
    up.stop();
}

#[test]
fn connections_beyond_the_per_host_bound_are_refused_logged_once_and_counted() {
    let root = tempfile::tempdir().expect("tempdir");
    let (mut up, metrics) = upstream(root.path(), "[ldm6]\nconnections_per_host_max = 4\n");
    let mut down = downstream(root.path(), &up);
    insert(&up, "before", 5, 1000);
    down.wait_for(5, Duration::from_secs(30));
    // Four connections from the attacker's address are served …
    let mut held: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut stream = connect_from_attacker(up.port);
            stream.write_all(&nullproc()).expect("NULLPROC");
            read_record(&mut stream).expect("read").expect("served");
            stream
        })
        .collect();
    // … the next twenty are closed unanswered.
    for _ in 0..20 {
        let mut stream = connect_from_attacker(up.port);
        let _ = stream.write_all(&nullproc());
        assert!(matches!(read_record(&mut stream), Ok(None) | Err(_)), "refused");
    }
    assert_eq!(refused(metrics, "per_host"), 20);
    assert_eq!(log_lines(&up, "connections from 127.0.0.2 already"), 1, "{}", tail(&up.log()));
    // The downstream, from another address, keeps receiving.
    insert(&up, "during", 5, 1000);
    down.wait_for(10, Duration::from_secs(30));
    // A slot given back is taken again.
    drop(held.pop());
    wait_until(Duration::from_secs(10), "a freed slot to be served", || {
        let mut stream = connect_from_attacker(up.port);
        stream.write_all(&nullproc()).ok()?;
        read_record(&mut stream).ok().flatten()
    });
    down.stop();
    up.stop();
}

#[test]
fn a_second_feedme_from_the_same_host_for_the_same_feed_replaces_the_first() {
    let root = tempfile::tempdir().expect("tempdir");
    let (mut up, metrics) = upstream(root.path(), "");
    let mut down = downstream(root.path(), &up);
    insert(&up, "before", 5, 1000);
    down.wait_for(5, Duration::from_secs(30));
    let mut first = connect_from_attacker(up.port);
    feed_me(&mut first, "EXP");
    // Another feed from the same host is not the same feed: both go on.
    let mut other = connect_from_attacker(up.port);
    feed_me(&mut other, "IDS");
    let mut second = connect_from_attacker(up.port);
    feed_me(&mut second, "EXP");
    // The first was ended before the second's reply went out.
    assert!(closed_within(&mut first, Duration::from_secs(5)), "the replaced feed's connection is closed");
    assert!(!closed_within(&mut second, Duration::from_millis(1500)), "the new feed goes on");
    assert!(!closed_within(&mut other, Duration::from_millis(100)), "another feed of the host goes on");
    assert_eq!(refused(metrics, "replaced"), 1);
    assert_eq!(log_lines(&up, "replaces feed #"), 1, "{}", tail(&up.log()));
    // The downstream (another host, another feed) was not touched.
    insert(&up, "during", 5, 1000);
    down.wait_for(10, Duration::from_secs(30));
    down.stop();
    up.stop();

    // Turned off: both feeds go on.
    let root = tempfile::tempdir().expect("tempdir");
    let (mut up, metrics) = upstream(root.path(), "[ldm6]\none_feeder_per_host = false\n");
    let mut first = connect_from_attacker(up.port);
    feed_me(&mut first, "EXP");
    let mut second = connect_from_attacker(up.port);
    feed_me(&mut second, "EXP");
    assert!(!closed_within(&mut first, Duration::from_millis(1500)), "both feeds go on");
    assert!(!closed_within(&mut second, Duration::from_millis(100)), "both feeds go on");
    assert_eq!(refused(metrics, "replaced"), 0);
    up.stop();
}

#[test]
fn an_oversized_record_is_refused_before_it_is_buffered() {
    let root = tempfile::tempdir().expect("tempdir");
    let (mut up, metrics) = upstream(root.path(), "");
    let mut down = downstream(root.path(), &up);
    insert(&up, "before", 5, 1000);
    down.wait_for(5, Duration::from_secs(30));
    let before = rss_kib(&up);
    // A fragment header announcing 200 MiB, then 16 MiB of it; and a record of many 32 KiB
    // fragments, none last.
    let mut refused_attacks = 0;
    for attack in 0..2 {
        let mut stream = connect_from_attacker(up.port);
        let mut sent = 0usize;
        let chunk = vec![0u8; 32 << 10];
        if attack == 0 {
            let _ = stream.write_all(&(0x8000_0000u32 | (200 << 20)).to_be_bytes());
        }
        let closed = loop {
            let mut piece = Vec::new();
            if attack == 1 {
                piece.extend_from_slice(&(chunk.len() as u32).to_be_bytes());
            }
            piece.extend_from_slice(&chunk);
            if stream.write_all(&piece).is_err() {
                break true;
            }
            sent += piece.len();
            if sent >= 16 << 20 {
                break closed_within(&mut stream, Duration::from_secs(5));
            }
        };
        assert!(closed, "attack {attack}: the server closes the connection");
        refused_attacks += 1;
    }
    let after = rss_kib(&up);
    eprintln!("oversized records: RSS {before} KiB -> {after} KiB");
    // The attacks sent 32 MiB (the socket buffers took part of it); two connection threads
    // cost under 1 MiB each (see IDLE_CONNECTION_KIB_MAX).
    assert!(after < before + 8192, "the server buffered the oversized records: {before} KiB -> {after} KiB");
    wait_until(Duration::from_secs(10), "the refusals counted", || {
        (refused(metrics, "record_too_long") == refused_attacks).then_some(())
    });
    assert_eq!(log_lines(&up, "refused before reading it"), 1, "{}", tail(&up.log()));
    // A product far larger than the pre-session bound still passes on a push (HIYA, then
    // COMINGSOON + BLKDATA or HEREIS) and reaches the downstream.
    let big = root.path().join("big.product");
    std::fs::write(&big, vec![7u8; 3 << 20]).expect("write");
    let output = Command::new(LDM7)
        .args(["send", "-h", &format!("127.0.0.1:{}", up.port), "-f", "EXP", big.to_str().expect("utf-8")])
        .output()
        .expect("send");
    assert!(output.status.success(), "ldm7 send: {}", String::from_utf8_lossy(&output.stderr));
    insert(&up, "during", 5, 1000);
    down.wait_for(11, Duration::from_secs(30));
    down.stop();
    up.stop();
}
