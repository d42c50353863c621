//! LDM-6 on loopback with real `ldm7 serve` processes: fan-out of 10,000 NGRID-sized products
//! to four downstreams, a relay chain, a downstream killed and restarted, a host refused the
//! way LDM refuses it, and a malformed record that closes only its own connection.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::{LDM7, LOCAL, Node, replay, run, tail};
use ldm7_testkit::wait_until;

fn allow_local() -> String {
    format!("ALLOW ANY {LOCAL}\nACCEPT ANY .* {LOCAL}\n")
}

fn request(from: &Node) -> String {
    format!("{}REQUEST ANY \".*\" 127.0.0.1:{}\n", allow_local(), from.port)
}

#[test]
fn four_downstreams_get_every_product_intact_and_once() {
    let Some(trace) = support::ngrid_trace() else { return };
    let root = tempfile::tempdir().expect("tempdir");
    // 10,000 NGRID-sized products take 1.43 GB.
    let mut upstream = Node::new(root.path(), "up", "1600M", &allow_local());
    // Four downstreams with the same request from one address, as behind a NAT: one feeder per
    // host and feed would have each FEEDME replace the one before (ldm6_bounds.rs tests that).
    std::fs::write(upstream.dir.join("ldm7.toml"), "[ldm6]\none_feeder_per_host = false\n").expect("settings");
    replay(&upstream, &trace, 10_000, 1);
    assert_eq!(upstream.count(), 10_000);
    upstream.start();
    let mut downstreams: Vec<Node> =
        (0..4).map(|k| Node::new(root.path(), &format!("down{k}"), "1600M", &request(&upstream))).collect();
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
    let Some(trace) = support::ngrid_trace() else { return };
    let root = tempfile::tempdir().expect("tempdir");
    let mut a = Node::new(root.path(), "a", "200M", &allow_local());
    replay(&a, &trace, 150, 2);
    a.start();
    let mut b = Node::new(root.path(), "b", "200M", &request(&a));
    b.start();
    let mut c = Node::new(root.path(), "c", "200M", &request(&b));
    c.start();
    // More products while the chain runs.
    replay(&a, &trace, 300, 3);
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
    let Some(trace) = support::ngrid_trace() else { return };
    let root = tempfile::tempdir().expect("tempdir");
    let mut upstream = Node::new(root.path(), "up", "1G", &allow_local());
    replay(&upstream, &trace, 2_000, 4);
    upstream.start();
    let mut down = Node::new(root.path(), "down", "1G", &request(&upstream));
    down.start();
    down.wait_for(300, Duration::from_secs(60));
    down.kill9();
    let before = down.count();
    replay(&upstream, &trace, 1_000, 5);
    // As after a real crash, the upstream has seen the downstream go (its end of the connection
    // is closed) before the downstream comes back.
    wait_until(Duration::from_secs(30), "the upstream to close the killed downstream's connection", || {
        (support::open_connections(upstream.port) == 0).then_some(())
    });
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
    let Some(trace) = support::ngrid_trace() else { return };
    let root = tempfile::tempdir().expect("tempdir");
    let mut upstream = Node::new(root.path(), "up", "200M", &allow_local());
    replay(&upstream, &trace, 50, 6);
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
    replay(&upstream, &trace, 80, 7);
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
    let pid = server.pid();
    assert!(Command::new("kill").args(["-HUP", &pid.to_string()]).status().expect("kill").success());
    wait_until(Duration::from_secs(5), "the server to log \"Configuration reloaded\"", || {
        server.log().contains("Configuration reloaded").then_some(())
    });
    // Allowed now: notify connects and ends on its own silence limit (nothing in the queue), as
    // asked (-T): exit 0.
    let output = notify(&host);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
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
    server.set_extra(vec!["--max-clients".into(), "1".into()]);
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

#[test]
fn exec_children_are_reaped_logged_and_restarted_when_configured() {
    let root = tempfile::tempdir().expect("tempdir");
    let conf = format!("{}EXEC \"sh exit3.sh\"\nEXEC \"sleep 600\"\n", allow_local());
    let mut server = Node::new(root.path(), "s", "50M", &conf);
    std::fs::write(server.dir.join("exit3.sh"), "exit 3\n").expect("script");
    std::fs::write(server.dir.join("ldm7.toml"), "[exec]\nrestart = true\nrestart_max = \"2s\"\n").expect("settings");
    server.start();
    let count = |log: &str, needle: &str| log.lines().filter(|line| line.contains(needle)).count();
    // A child that exits: its status logged as an error, and it is started again (1 s, then 2 s).
    wait_until(Duration::from_secs(30), "the exiting child logged twice and started again", || {
        (count(&server.log(), "child") >= 2 && count(&server.log(), "exited with status 3") >= 2).then_some(())
    });
    assert!(
        server.log().contains("ERROR") && server.log().contains("starting it again in 1 s"),
        "{}",
        tail(&server.log())
    );
    // A child killed with SIGKILL: logged with the signal, started again with a new pid.
    let started = "EXEC [\"sleep\", \"600\"]: pid ";
    let pid = wait_until(Duration::from_secs(10), "the sleep child's pid", || {
        server.log().lines().find_map(|line| line.split_once(started).map(|(_, pid)| pid.trim().to_owned()))
    });
    assert!(Command::new("kill").args(["-KILL", &pid]).status().expect("kill").success());
    wait_until(Duration::from_secs(30), "the killed child logged and started again", || {
        let log = server.log();
        (log.contains(&format!("child {pid} terminated by signal 9 (SIGKILL)")) && count(&log, started) >= 2)
            .then_some(())
    });
    // Stopping ends every child: SIGTERM, each end logged as the server's own doing.
    server.stop();
    assert!(server.log().contains("terminated by SIGTERM (the server stops)"), "{}", tail(&server.log()));
}

#[test]
fn sighup_adds_and_removes_requests_without_a_restart() {
    let Some(trace) = support::ngrid_trace() else { return };
    let root = tempfile::tempdir().expect("tempdir");
    let mut upstream = Node::new(root.path(), "up", "200M", &allow_local());
    replay(&upstream, &trace, 50, 1);
    upstream.start();
    let mut down = Node::new(root.path(), "down", "200M", &allow_local());
    down.start();
    let hup = |node: &Node| {
        assert!(Command::new("kill").args(["-HUP", &node.pid().to_string()]).status().expect("kill").success());
    };
    // Added by a reload: it starts and brings every product.
    std::fs::write(down.dir.join("ldmd.conf"), request(&upstream)).expect("rewrite");
    hup(&down);
    down.wait_for(50, Duration::from_secs(60));
    let added = format!("REQUEST added: 127.0.0.1:{}", upstream.port);
    assert!(down.log().contains(&added), "{}", tail(&down.log()));
    // Removed by a reload: it ends, and its connection to the upstream with it.
    std::fs::write(down.dir.join("ldmd.conf"), allow_local()).expect("rewrite");
    hup(&down);
    wait_until(Duration::from_secs(30), "the removed REQUEST's connection closed", || {
        (support::open_connections(upstream.port) == 0).then_some(())
    });
    assert!(down.log().contains(&format!("REQUEST removed: 127.0.0.1:{}", upstream.port)), "{}", tail(&down.log()));
    // An EXEC added is not started by a reload: said so.
    std::fs::write(down.dir.join("ldmd.conf"), format!("{}EXEC \"true\"\n", allow_local())).expect("rewrite");
    hup(&down);
    wait_until(Duration::from_secs(10), "the EXEC change logged", || {
        down.log().contains("EXEC entries changed: they take effect when the server starts again").then_some(())
    });
    down.stop();
    upstream.stop();
}
