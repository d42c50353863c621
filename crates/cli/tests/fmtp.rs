//! `ldm7 fmtp send | recv` as users run them: every flag value parses or is refused with a
//! message saying what is expected and exit code 1 (never a panic), and a file sent on loopback
//! multicast arrives intact in `recv --out DIR` under its MD5, the receiver started first (it
//! retries its connection until the sender listens).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Command, Output, Stdio};

const LDM7: &str = env!("CARGO_BIN_EXE_ldm7");

fn ldm7(args: &[&str]) -> Output {
    Command::new(LDM7).args(args).output().expect("run ldm7")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `ldm7 fmtp …`, expects exit 1 and returns standard error.
fn refused(args: &[&str]) -> String {
    let mut all = vec!["fmtp"];
    all.extend_from_slice(args);
    let output = ldm7(&all);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "ldm7 {all:?}: {}{stderr}", text(&output.stdout));
    assert!(!stderr.contains("panicked"), "ldm7 {all:?} panicked: {stderr}");
    stderr
}

const SEND: &[&str] = &["send", "--group", "239.255.90.1:38990"];
const RECV: &[&str] = &["recv", "--group", "239.255.90.1:38990", "--sender", "127.0.0.1:38991"];

fn with<'a>(base: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
    base.iter().chain(extra).copied().collect()
}

#[test]
fn durations_that_are_not_durations_are_refused() {
    for flag in ["--retx-timeout", "--linger"] {
        for bad in ["inf", "-1", "nan", "5 parsecs", ""] {
            let stderr = refused(&with(SEND, &[flag, bad, "/dev/null"]));
            assert!(stderr.contains("expected a duration"), "{flag} {bad:?}: {stderr}");
        }
    }
    for flag in ["--timeout", "--connect-timeout"] {
        for bad in ["inf", "-1", "nan"] {
            let stderr = refused(&with(RECV, &[flag, bad]));
            assert!(stderr.contains("expected a duration"), "{flag} {bad:?}: {stderr}");
        }
    }
}

#[test]
fn bad_rates_drops_and_speeds_are_refused() {
    for bad in ["fast", "-5M", "inf", "nan", "0"] {
        let stderr = refused(&with(SEND, &["--rate", bad, "/dev/null"]));
        assert!(stderr.contains("expected a positive rate"), "--rate {bad:?}: {stderr}");
        let stderr = refused(&with(RECV, &["--rate", bad]));
        assert!(stderr.contains("expected a positive rate"), "--rate {bad:?}: {stderr}");
    }
    for bad in ["1", "1.5", "-0.1", "nan", "inf", "5%"] {
        let stderr = refused(&with(RECV, &["--drop", bad]));
        assert!(stderr.contains("expected a fraction"), "--drop {bad:?}: {stderr}");
    }
    for bad in ["-1", "nan", "inf", "quick"] {
        let stderr = refused(&with(SEND, &["--speed", bad, "/dev/null"]));
        assert!(stderr.contains("expected a factor"), "--speed {bad:?}: {stderr}");
    }
    for (flag, bad) in [("--ttl", "-1"), ("--receivers", "-1"), ("--limit", "many")] {
        let stderr = refused(&with(SEND, &[flag, bad, "/dev/null"]));
        assert!(stderr.contains(&format!("invalid value '{bad}' for '{flag}")), "{stderr}");
    }
    let stderr = refused(&with(RECV, &["--count", "-1"]));
    assert!(stderr.contains("invalid value '-1' for '--count"), "{stderr}");
}

#[test]
fn bad_inputs_are_refused_before_anything_runs() {
    let stderr = refused(&["send", "--group", "127.0.0.1:38990", "/dev/null"]);
    assert!(stderr.contains("not a multicast address"), "{stderr}");
    let stderr = refused(SEND);
    assert!(stderr.contains("nothing to send"), "{stderr}");
    let stderr = refused(&with(SEND, &["/nonexistent/product"]));
    assert!(stderr.contains("cannot read /nonexistent/product"), "{stderr}");
    let stderr = refused(&with(SEND, &["--replay", "/nonexistent/trace"]));
    assert!(stderr.contains("cannot read trace"), "{stderr}");
}

#[test]
fn a_file_sent_arrives_under_its_md5_in_the_output_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let product: Vec<u8> = (0..200_000u32).map(|i| (i * 7 + i / 1000) as u8).collect();
    let file = dir.path().join("product.bin");
    std::fs::write(&file, &product).expect("write product");
    let out = dir.path().join("out");
    let group = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(239, 255, 90, 2)), free_port());
    let retx = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), free_port());
    let (group, retx) = (group.to_string(), retx.to_string());
    // The receiver first: it retries its connection until the sender listens.
    let receiver = Command::new(LDM7)
        .args(["fmtp", "recv", "--group", &group, "--sender", &retx, "--count", "1", "--timeout", "60"])
        .args(["--drop", "0.05", "--out", &out.display().to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start receiver");
    let sender = Command::new(LDM7)
        .args(["fmtp", "send", "--group", &group, "--retx-listen", &retx, "--receivers", "1", "--linger", "30s"])
        .arg(&file)
        .output()
        .expect("run sender");
    let received = receiver.wait_with_output().expect("receiver");
    let (summary, log) = (text(&received.stdout), text(&received.stderr));
    assert!(sender.status.success(), "sender: {}{}", text(&sender.stdout), text(&sender.stderr));
    assert!(received.status.success() && summary.contains("delivered 1, missed 0"), "receiver: {summary}{log}");
    let digest = md5_hex(&product);
    assert_eq!(std::fs::read(out.join(&digest)).expect("the product under its MD5"), product);
    let names: Vec<String> = std::fs::read_dir(&out)
        .expect("out")
        .map(|entry| entry.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec![digest], "only the product: the spool is gone");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|listener| listener.local_addr()).expect("port").port()
}

fn md5_hex(bytes: &[u8]) -> String {
    use md5::{Digest, Md5};
    Md5::digest(bytes).iter().map(|byte| format!("{byte:02x}")).collect()
}
