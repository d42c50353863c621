//! LDM-6 over IPv6 on loopback with real `ldm7 serve` processes: a relay chain whose every hop
//! is IPv6 (REQUEST `[::1]:port`, ALLOW by address, prefix and ERE), a dual-stack server that
//! matches IPv4 peers by their IPv4 address, and malformed IPv6 in ldmd.conf refused with the
//! file, the line and what to write.

use crate::support;

use std::process::Command;
use std::time::Duration;

use crate::support::{LDM7, Node, replay, run, tail};

/// Whether this host has IPv6 on loopback; the tests skip (saying so) where it has not.
fn ipv6_loopback() -> bool {
    let usable = std::net::TcpListener::bind("[::1]:0").is_ok();
    if !usable {
        eprintln!("skipped: no IPv6 loopback (::1) on this host");
    }
    usable
}

#[test]
fn relay_chain_over_ipv6() {
    if !ipv6_loopback() {
        return;
    }
    let Some(trace) = support::ngrid_trace() else { return };
    let root = tempfile::tempdir().expect("tempdir");
    // Each hop names its downstream another way: an address, a prefix, an ERE on the RFC 5952 text.
    let mut a = Node::new(root.path(), "a", "200M", "ALLOW ANY ::1\n");
    replay(&a, &trace, 150, 2);
    a.start();
    let mut b =
        Node::new(root.path(), "b", "200M", &format!("ALLOW ANY ::1/128\nREQUEST ANY \".*\" [::1]:{}\n", a.port));
    b.start();
    let mut c = Node::new(root.path(), "c", "200M", &format!("ALLOW ANY ^::1$\nREQUEST ANY \".*\" [::1]:{}\n", b.port));
    c.start();
    replay(&a, &trace, 150, 3);
    c.wait_for(300, Duration::from_secs(120));
    let (at_a, _) = a.verify();
    let (at_c, origins) = c.verify();
    assert_eq!(at_a, at_c);
    assert!(
        origins.iter().all(|origin| origin.ends_with("_v_::1") && !origin.contains("_v_::1_v_")),
        "origin rewritten once: {:?}",
        &origins[..1]
    );
    assert!(c.log().contains(&format!("Starting Up(ldm7): [::1]:{}", b.port)), "{}", tail(&c.log()));
    // A notifyme-style client by an IPv6 address in brackets.
    let host = format!("[::1]:{}", c.port);
    let lines = run(&["notify", "-h", &host, "-o", "3600", "--count", "3"]);
    assert_eq!(lines.lines().count(), 3, "{lines}");
    for node in [&mut c, &mut b, &mut a] {
        node.stop();
    }
}

#[test]
fn a_dual_stack_server_matches_ipv4_peers_by_their_ipv4_address() {
    if !ipv6_loopback() {
        return;
    }
    let root = tempfile::tempdir().expect("tempdir");
    // IPv4 entries as an existing site writes them; nothing names ::1.
    let conf = "ALLOW ANY ^127\\.0\\.0\\.1$\nACCEPT ANY .* 127.0.0.0/8\nALLOW ANY 2001:db8::/32\n";
    let mut server = Node::new(root.path(), "s", "50M", conf);
    server.start();
    let file = root.path().join("product");
    std::fs::write(&file, "over IPv4 to a dual-stack listener\n").expect("write");
    let v4 = format!("127.0.0.1:{}", server.port);
    let output =
        Command::new(LDM7).args(["send", "-h", &v4, "-f", "EXP", file.to_str().unwrap()]).output().expect("send");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let lines = run(&["notify", "-h", &v4, "-f", "EXP", "-o", "3600", "--count", "1"]);
    assert_eq!(lines.lines().count(), 1, "{lines}");
    // The same server by IPv6: no entry names ::1, so it is refused.
    let v6 = format!("[::1]:{}", server.port);
    let refused = Command::new(LDM7)
        .args(["notify", "-h", &v6, "-f", "EXP", "-o", "3600", "--count", "1"])
        .output()
        .expect("notify");
    assert!(!refused.status.success(), "::1 was let in");
    let log = server.log();
    assert!(!log.contains("::ffff:"), "an IPv4 peer named by its mapped address:\n{}", tail(&log));
    assert!(log.contains("::1"), "the refusal names the IPv6 peer:\n{}", tail(&log));
    server.stop();
}

#[test]
fn malformed_ipv6_in_ldmd_conf_gives_the_line_and_what_to_write() {
    let root = tempfile::tempdir().expect("tempdir");
    for (entry, says) in [
        ("ALLOW ANY 2001:db8::/129", "at most 128"),
        ("ALLOW ANY 2001:db8:::1", "or an ERE such as ^2001:db8:"),
        ("ACCEPT ANY .* fe80::1%eth0", "without it"),
        ("REQUEST ANY .* [2001:db8::1", "no closing bracket"),
        ("REQUEST ANY .* 2001:db8::1:388:x", "[2001:db8::1]:388"),
        ("REQUEST ANY .* [fe80::1]:388", "[fe80::1%eth0]:388"),
        ("REQUEST ANY .* [2001:db8::1]:0", "from 1 to 65535"),
    ] {
        let conf = root.path().join("ldmd.conf");
        std::fs::write(&conf, format!("# a site\nALLOW ANY ^localhost$\n{entry}\n")).expect("write");
        let output = Command::new(LDM7)
            .args(["serve", "--check", "--config", conf.to_str().unwrap()])
            .output()
            .expect("serve --check");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{entry}: accepted");
        assert!(stderr.contains("ldmd.conf:3") && stderr.contains(says), "{entry}: {stderr}");
    }
}

#[test]
fn a_server_listens_on_each_address_given() {
    if !ipv6_loopback() {
        return;
    }
    let root = tempfile::tempdir().expect("tempdir");
    let mut server = Node::new(root.path(), "s", "50M", "ALLOW ANY ^127\\.0\\.0\\.1$\nALLOW ANY ::1\n");
    server.set_extra(vec!["-I".into(), "127.0.0.1".into(), "-I".into(), "::1".into()]);
    server.start();
    for host in [format!("127.0.0.1:{}", server.port), format!("[::1]:{}", server.port)] {
        let output =
            Command::new(LDM7).args(["notify", "-h", &host, "-o", "3600", "-T", "0.3"]).output().expect("notify");
        assert!(output.status.success(), "{host}: {}", String::from_utf8_lossy(&output.stderr));
    }
    let log = server.log();
    assert!(log.contains(&format!("listening on 127.0.0.1:{}, [::1]:{}", server.port, server.port)), "{}", tail(&log));
    server.stop();
}
