//! `ldm7 fmtp send | recv` as users run them: every flag value parses or is refused with a
//! message saying what is expected and exit code 1 (never a panic), and a file sent on loopback
//! multicast arrives intact in `recv --out DIR` under its MD5, the receiver started first (it
//! retries its connection until the sender listens).
//!
//! Start-up: a receiver started before its sender says it waits and gets everything once the
//! sender starts; a receiver is served while the sender has not read its inputs yet (a FIFO
//! that gets its bytes only after the receiver connected, then a large file and many small
//! ones); a receiver with no sender gives up at its `--timeout` with a message naming the
//! address; the sender's peak memory stays far below the size of its inputs (streamed).
//!
//! Under attack: forged BOPs far ahead of the sender, a flood of forged BOPs with random
//! indexes, truncated, oversized and unknown datagrams sent to the group during a transfer cost
//! no product, and the receiver counts what it dropped by reason; a receiver that missed
//! products says so and exits 2.
//!
//! Parity repair (the ldm7 extension): lossy receivers get everything, their lost blocks
//! recovered from shards multicast once for all of them.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use ldm7_testkit::wait_until;

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
fn a_receiver_that_gets_fewer_products_than_its_count_says_so_and_exits_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write_product(dir.path(), 0, 11);
    let (group, retx) = addresses(12);
    let receiver = Running::start(
        Command::new(LDM7)
            .args(["fmtp", "recv", "--group", &group, "--sender", &retx, "--count", "3", "--timeout", "2"])
            .args(["--connect-timeout", "60"]),
    );
    let sender = Command::new(LDM7)
        .args(["fmtp", "send", "--group", &group, "--retx-listen", &retx, "--receivers", "1", "--linger", "30s"])
        .arg(&file)
        .output()
        .expect("run sender");
    assert!(sender.status.success(), "sender: {}{}", text(&sender.stdout), text(&sender.stderr));
    let (status, summary, log) = receiver.outcome();
    assert_eq!(status.code(), Some(2), "{summary}{log}");
    assert!(summary.contains("delivered 1, missed 0"), "{summary}{log}");
    assert!(log.contains("1 of the 3 products expected came before 2s passed without one"), "{log}");
}

#[test]
fn a_file_sent_arrives_under_its_md5_in_the_output_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let product: Vec<u8> = (0..200_000u32).map(|i| (i * 7 + i / 1000) as u8).collect();
    let file = dir.path().join("product.bin");
    std::fs::write(&file, &product).expect("write product");
    let out = dir.path().join("out");
    let (group, retx) = addresses(2);
    // The receiver first: it retries its connection until the sender listens.
    let receiver = Running::start(
        Command::new(LDM7)
            .args(["fmtp", "recv", "--group", &group, "--sender", &retx, "--count", "1", "--timeout", "60"])
            .args(["--drop", "0.05", "--out", &out.display().to_string()]),
    );
    let sender = Command::new(LDM7)
        .args(["fmtp", "send", "--group", &group, "--retx-listen", &retx, "--receivers", "1", "--linger", "30s"])
        .arg(&file)
        .output()
        .expect("run sender");
    let (status, summary, log) = receiver.outcome();
    assert!(sender.status.success(), "sender: {}{}", text(&sender.stdout), text(&sender.stderr));
    assert!(status.success() && summary.contains("delivered 1, missed 0"), "receiver: {summary}{log}");
    let digest = md5_hex(&product);
    assert_eq!(std::fs::read(out.join(&digest)).expect("the product under its MD5"), product);
    let names: Vec<String> = std::fs::read_dir(&out)
        .expect("out")
        .map(|entry| entry.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec![digest], "only the product: the spool is gone");
}

#[test]
fn a_receiver_started_before_its_sender_waits_says_so_and_gets_everything() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files: Vec<PathBuf> =
        [1usize, 1448, 300_000].iter().enumerate().map(|(index, &len)| write_product(dir.path(), index, len)).collect();
    let out = dir.path().join("out");
    let (group, retx) = addresses(3);
    let mut receiver = Running::start(
        Command::new(LDM7)
            .args(["fmtp", "recv", "--group", &group, "--sender", &retx, "--count", "3", "--timeout", "60"])
            .args(["--out", &out.display().to_string()]),
    );
    let waiting = receiver.stderr.wait_for("the receiver to say it waits for its sender", |line| {
        line.contains(&format!("waiting for the sender at {retx}"))
    });
    assert!(waiting.contains("NOTE") && waiting.contains("retrying for up to 60.0 s"), "{waiting}");
    let sender = Command::new(LDM7)
        .args(["fmtp", "send", "--group", &group, "--retx-listen", &retx, "--receivers", "1", "--linger", "30s"])
        .args(&files)
        .output()
        .expect("run sender");
    let (sender_out, sender_log) = (text(&sender.stdout), text(&sender.stderr));
    assert!(sender.status.success(), "sender: {sender_out}{sender_log}");
    assert!(sender_log.contains("waiting for 1 receiver at"), "{sender_log}");
    assert!(sender_log.contains("1 of 1 receivers connected"), "{sender_log}");
    let (summary, log) = receiver.finish();
    assert!(summary.contains("delivered 3, missed 0, retransmitted blocks 0, corrupt 0"), "{summary}{log}");
    assert_eq!(log.matches("waiting for the sender").count(), 1, "said once: {log}");
    for file in &files {
        let bytes = std::fs::read(file).expect("read input");
        assert_eq!(std::fs::read(out.join(md5_hex(&bytes))).expect("received"), bytes);
    }
}

#[test]
fn a_receiver_is_served_while_the_sender_still_reads_its_inputs() {
    let dir = tempfile::tempdir().expect("tempdir");
    // First a FIFO that gets its bytes only once the receiver is connected: the sender cannot
    // have read its inputs before it served the receiver. Then a large file and many small ones.
    let fifo = dir.path().join("fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("run mkfifo");
    assert!(made.success(), "mkfifo");
    let large = dir.path().join("large");
    std::fs::File::create(&large).and_then(|file| file.set_len(24 << 20)).expect("large file");
    let small: Vec<PathBuf> = (0..300).map(|index| write_product(dir.path(), index, 1000 + index * 7)).collect();
    let (group, retx) = addresses(4);
    let total = 2 + small.len();
    let mut sender = Running::start(
        Command::new(LDM7)
            .args(["fmtp", "send", "--group", &group, "--retx-listen", &retx, "--rate", "1G", "--receivers", "1"])
            .args(["--linger", "60s"])
            .arg(&fifo)
            .arg(&large)
            .args(&small),
    );
    sender.stderr.wait_for("the sender to wait for its receiver", |line| line.contains("waiting for 1 receiver at"));
    let out = dir.path().join("out");
    let mut receiver = Running::start(
        Command::new(LDM7)
            .args(["fmtp", "recv", "--group", &group, "--sender", &retx, "--rate", "1G", "--timeout", "60"])
            .args(["--count", &total.to_string(), "--out", &out.display().to_string()]),
    );
    receiver.stderr.wait_for("the receiver to connect", |line| line.contains(&format!("connected to {retx}")));
    sender.stderr.wait_for("the sender to count its receiver", |line| line.contains("1 of 1 receivers connected"));
    let fifo_bytes: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let writer = {
        let (fifo, bytes) = (fifo.clone(), fifo_bytes.clone());
        std::thread::spawn(move || std::fs::OpenOptions::new().write(true).open(fifo)?.write_all(&bytes))
    };
    let (summary, log) = receiver.finish();
    writer.join().expect("writer thread").expect("write the FIFO");
    assert!(
        summary.contains(&format!("delivered {total}, missed 0")) && summary.contains("corrupt 0"),
        "{summary}{log}"
    );
    let (sender_out, sender_log) = sender.finish();
    assert!(sender_out.contains(&format!("{total} products")), "{sender_out}{sender_log}");
    for bytes in [fifo_bytes, vec![0u8; 24 << 20]] {
        assert!(out.join(md5_hex(&bytes)).is_file(), "the FIFO's and the large file's products arrived");
    }
    for file in small {
        let bytes = std::fs::read(&file).expect("read input");
        assert_eq!(std::fs::read(out.join(md5_hex(&bytes))).expect("received"), bytes);
    }
}

#[test]
fn a_receiver_without_a_sender_gives_up_at_its_timeout() {
    let (group, retx) = addresses(5);
    let output = ldm7(&["fmtp", "recv", "--group", &group, "--sender", &retx, "--timeout", "1"]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "a runtime failure: {}{stderr}", text(&output.stdout));
    assert!(stderr.contains(&format!("waiting for the sender at {retx}")), "{stderr}");
    assert!(stderr.contains(&format!("no FMTP sender answered at {retx} within")), "{stderr}");
    assert!(stderr.contains("start `ldm7 fmtp send --retx-listen"), "says what to do: {stderr}");
}

#[test]
fn the_sender_streams_its_inputs_in_bounded_memory() {
    const INPUT_BYTES: u64 = 64 << 20;
    const PEAK_MIB_MAX: u64 = 100;
    let dir = tempfile::tempdir().expect("tempdir");
    // Sparse files: 256 MiB of input without writing it.
    let files: Vec<PathBuf> = (0..4)
        .map(|index| {
            let path = dir.path().join(format!("input{index}"));
            let file = std::fs::File::create(&path).expect("create input");
            file.set_len(INPUT_BYTES).expect("size input");
            file.write_all_at(&[index as u8 + 1], INPUT_BYTES / 2).expect("distinct content");
            path
        })
        .collect();
    let (group, retx) = addresses(6);
    let receiver = Running::start(
        Command::new(LDM7).args(["fmtp", "recv", "--group", &group, "--sender", &retx, "--rate", "1G"]).args([
            "--count",
            "4",
            "--timeout",
            "60",
        ]),
    );
    let sender = Command::new(LDM7)
        .args(["fmtp", "send", "--group", &group, "--retx-listen", &retx, "--rate", "1G", "--linger", "60s"])
        .args(&files)
        .output()
        .expect("run sender");
    let (sender_out, sender_log) = (text(&sender.stdout), text(&sender.stderr));
    assert!(sender.status.success(), "sender: {sender_out}{sender_log}");
    let (summary, log) = receiver.finish();
    assert!(summary.contains("delivered 4, missed 0") && summary.contains("corrupt 0"), "{summary}{log}");
    let peak_mib: u64 = sender_out
        .split("peak memory ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|number| number.parse().ok())
        .unwrap_or_else(|| panic!("no peak memory in the summary: {sender_out}"));
    assert!(
        peak_mib < PEAK_MIB_MAX,
        "the sender held {peak_mib} MiB at its peak for {} MiB of inputs: {sender_out}",
        (4 * INPUT_BYTES) >> 20
    );
}

/// A product file of `len` bytes whose content depends on `index`.
#[test]
fn forged_and_malformed_datagrams_on_the_group_cost_no_product_and_are_counted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files: Vec<PathBuf> =
        (0..100).map(|index| write_product(dir.path(), index, 1 + (index * 7_919) % 30_000)).collect();
    let out = dir.path().join("out");
    let (group, retx) = addresses(7);
    let receiver = Running::start(
        Command::new(LDM7)
            .args(["fmtp", "recv", "--group", &group, "--sender", &retx, "--count", "100", "--timeout", "60"])
            .args(["--out", &out.display().to_string()]),
    );
    let forger = Forger::start(group.parse().expect("group"), out.clone());
    // 10 Mbit/s: the 1.5 MB take over a second, so that the forger, a batch per product
    // delivered, keeps up on a busy machine (at 100 Mbit/s the transfer took 0.12 s and a loaded
    // run saw 705 forgeries).
    let sender = Command::new(LDM7)
        .args(["fmtp", "send", "--group", &group, "--retx-listen", &retx, "--receivers", "1", "--linger", "30s"])
        .args(["--rate", "10M"])
        .args(&files)
        .output()
        .expect("run sender");
    let forged = forger.stop();
    let (status, summary, log) = receiver.outcome();
    let missing: Vec<usize> = files
        .iter()
        .enumerate()
        .filter(|(_, file)| !out.join(md5_hex(&std::fs::read(file).expect("read"))).exists())
        .map(|(index, _)| index)
        .collect();
    assert!(
        sender.status.success() && status.success(),
        "sender: {}{}\nreceiver ({status}), missing products {missing:?}: {summary}{log}",
        text(&sender.stdout),
        text(&sender.stderr)
    );
    assert!(forged > 1_000, "the forger sent {forged} datagrams");
    assert!(summary.contains("delivered 100, missed 0"), "{summary}{log}");
    for reason in ["truncated", "oversized", "unknown type", "index not believed"] {
        assert!(summary.contains(reason), "dropped datagrams counted as {reason}: {summary}");
    }
    for file in &files {
        let bytes = std::fs::read(file).expect("read input");
        assert_eq!(std::fs::read(out.join(md5_hex(&bytes))).expect("received"), bytes);
    }
}

#[test]
fn a_receiver_that_missed_products_says_which_and_exits_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files: Vec<PathBuf> = (0..5).map(|index| write_product(dir.path(), index, 200_000)).collect();
    let (group, retx) = addresses(8);
    // Half the multicast is lost and the sender gives up on repairs at once: products are missed.
    let receiver = Running::start(
        Command::new(LDM7)
            .args(["fmtp", "recv", "--group", &group, "--sender", &retx, "--count", "5", "--timeout", "30"])
            .args(["--drop", "0.5"]),
    );
    let sender = Command::new(LDM7)
        .args(["fmtp", "send", "--group", &group, "--retx-listen", &retx, "--receivers", "1", "--linger", "10s"])
        .args(["--retx-timeout", "1ms"])
        .args(&files)
        .output()
        .expect("run sender");
    assert!(sender.status.success(), "sender: {}{}", text(&sender.stdout), text(&sender.stderr));
    let (status, summary, log) = receiver.outcome();
    assert_eq!(status.code(), Some(2), "{summary}{log}");
    // Rejected by the sender, or still in flight when it closed the connection.
    assert!(log.contains("missed product"), "{log}");
    assert!(log.contains("products were missed"), "{log}");
}

#[test]
fn signed_multicast_with_a_pinned_publisher_arrives_and_a_wrong_pin_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = dir.path().join("publisher.key");
    let made = ldm7(&["fmtp", "keygen", "--out", &key.display().to_string()]);
    assert!(made.status.success(), "{}", text(&made.stderr));
    assert!(text(&made.stdout).contains("publisher.key.pub"), "{}", text(&made.stdout));
    let other = dir.path().join("other.key");
    assert!(ldm7(&["fmtp", "keygen", "--out", &other.display().to_string()]).status.success());
    let again = ldm7(&["fmtp", "keygen", "--out", &key.display().to_string()]);
    assert_eq!(again.status.code(), Some(1), "an identity is never overwritten");
    let files: Vec<PathBuf> = (0..5).map(|index| write_product(dir.path(), index, 1 + index * 40_000)).collect();
    for (octet, pin, level) in [(9, &key, "2"), (10, &other, "1")] {
        let (group, retx) = addresses(octet);
        let pin = format!("{}.pub", pin.display());
        let receiver = Running::start(
            Command::new(LDM7)
                .args(["fmtp", "recv", "--group", &group, "--sender", &retx, "--count", "5", "--timeout", "30"])
                .args(["--drop", "0.05", "--pin", &pin])
                .env("FMTP_MAC_LEVEL", level),
        );
        let sender = Command::new(LDM7)
            .args(["fmtp", "send", "--group", &group, "--retx-listen", &retx, "--receivers", "1", "--linger", "10s"])
            .args(["--mac-level", level, "--identity", &key.display().to_string(), "--mac-rotation", "1s"])
            .args(&files)
            .output()
            .expect("run sender");
        let (status, summary, log) = receiver.outcome();
        if pin.contains("publisher") {
            assert!(sender.status.success(), "sender: {}{}", text(&sender.stdout), text(&sender.stderr));
            assert!(status.success() && summary.contains("delivered 5, missed 0"), "{summary}{log}");
        } else {
            assert_eq!(status.code(), Some(2), "{summary}{log}");
            assert!(log.contains("not signed by the pinned publisher key"), "{log}");
        }
    }
}

/// Parity repair (the ldm7 extension) as a user runs it: three receivers that each lose 3% of
/// the datagrams, writing products through their spool with a MAC on every datagram, get every
/// file intact; the blocks they lost come back as parity shards multicast once for all of them
/// (a shard repairs a different block at each receiver), not as one retransmission each.
#[test]
fn parity_repairs_the_losses_of_several_receivers_with_shards_multicast_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files: Vec<PathBuf> = (0..6).map(|index| write_product(dir.path(), index, 1 + index * 150_000)).collect();
    let (sent, recovered) = three_lossy_receivers_with_parity(dir.path(), &files, 11);
    let line = sent.lines().find(|line| line.contains("fmtp send: parity:")).expect("the sender's parity line");
    let shards: u64 =
        line.split(", ").find_map(|part| part.split(" shards multicast").next()?.parse().ok()).expect("shards");
    assert!(recovered > 0, "{sent}");
    // Fewer shards than blocks recovered: shards served several receivers at once.
    assert!(shards < recovered, "{shards} shards for {recovered} recovered blocks: {sent}");
}

/// Small files multicast one after another are coded together, in runs (docs/parity.md
/// "Runs"): the receivers decode the blocks they lost from the run's shards and the files they
/// already wrote to their spool.
#[test]
fn small_files_are_repaired_from_the_parity_of_their_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files: Vec<PathBuf> = (0..24).map(|index| write_product(dir.path(), index, 2_000 + index * 1_300)).collect();
    let (sent, recovered) = three_lossy_receivers_with_parity(dir.path(), &files, 12);
    let line = sent.lines().find(|line| line.contains("fmtp send: parity:")).expect("the sender's parity line");
    let runs: u64 = line.split(" and ").nth(1).and_then(|part| part.split(' ').next()?.parse().ok()).expect("runs");
    assert!(runs > 0 && recovered > 0, "{sent}");
}

/// Multicasts `files` (in `dir`) with parity 64/16 and a MAC on every datagram to three receivers
/// that each lose 3% of the datagrams and write through their spool; checks that each got every
/// file intact. The sender's output and the blocks the receivers recovered from parity.
fn three_lossy_receivers_with_parity(dir: &Path, files: &[PathBuf], group_octet: u8) -> (String, u64) {
    let count = files.len().to_string();
    let (group, retx) = addresses(group_octet);
    let receivers: Vec<(Running, PathBuf)> = (0..3u64)
        .map(|n| {
            let out = dir.join(format!("out{n}"));
            let running = Running::start(
                Command::new(LDM7)
                    .args(["fmtp", "recv", "--group", &group, "--sender", &retx, "--count", &count, "--timeout", "60"])
                    .args(["--drop", "0.03", "--seed", &(n + 5).to_string(), "--parity", "64/16"])
                    .args(["--mac-level", "1", "--out", &out.display().to_string()]),
            );
            (running, out)
        })
        .collect();
    let sender = Command::new(LDM7)
        .args(["fmtp", "send", "--group", &group, "--retx-listen", &retx, "--receivers", "3", "--linger", "30s"])
        .args(["--parity", "64/16", "--mac-level", "1"])
        .args(files)
        .output()
        .expect("run sender");
    let sent = text(&sender.stdout);
    assert!(sender.status.success(), "sender: {sent}{}", text(&sender.stderr));
    let mut recovered = 0u64;
    let delivered = format!("delivered {count}, missed 0");
    for (receiver, out) in receivers {
        let (status, summary, log) = receiver.outcome();
        assert!(status.success() && summary.contains(&delivered), "receiver: {summary}{log}");
        let line = summary.lines().find(|line| line.contains("fmtp recv: parity:")).expect("the parity line");
        let blocks: u64 =
            line.split(", ").find_map(|part| part.strip_suffix(" blocks recovered")?.parse().ok()).expect("count");
        recovered += blocks;
        for file in files {
            let bytes = std::fs::read(file).expect("read input");
            assert_eq!(std::fs::read(out.join(md5_hex(&bytes))).expect("the product under its MD5"), bytes);
        }
    }
    (sent, recovered)
}

/// Sends forged and malformed datagrams to a multicast group from a thread of its own until
/// stopped: BOPs 100,000 products ahead of the sender (three copies each, as a real product's
/// messages come several), BOPs with random indexes, and datagrams that are truncated, longer
/// than their header says, or of no known type. A batch of them at once, then one for each
/// product the receiver delivers (into `out`).
struct Forger {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<()>,
}

impl Forger {
    fn start(group: SocketAddr, out: PathBuf) -> Self {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).expect("socket");
        socket.set_multicast_if_v4(&Ipv4Addr::LOCALHOST).expect("multicast interface");
        socket.set_multicast_loop_v4(true).expect("multicast loop");
        socket.bind(&SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0).into()).expect("bind");
        let socket = std::net::UdpSocket::from(socket);
        let (stop, sent) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let (stopped, count) = (stop.clone(), sent.clone());
        let thread = std::thread::spawn(move || {
            let mut state = 0x2545_f491_4f6c_dd1du64;
            let mut batches = 1;
            let mut delivered = 0;
            loop {
                for _ in 0..batches {
                    let mut batch = vec![forged_bop(100_000), forged_bop(100_000), forged_bop(100_000)];
                    for _ in 0..40 {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        batch.push(forged_bop(state as u32));
                    }
                    let mut truncated = forged_bop(7);
                    truncated.truncate(20);
                    let mut oversized = forged_bop(7);
                    oversized.extend_from_slice(&[0xab; 1_500]);
                    let mut unknown = forged_bop(7);
                    unknown[10..12].copy_from_slice(&0x0003u16.to_be_bytes());
                    batch.extend([truncated, oversized, unknown, vec![0x55; 5]]);
                    for datagram in &batch {
                        if socket.send_to(datagram, group).is_ok() {
                            count.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                // The next products delivered (a batch each), or the stop.
                let now = wait_until(Duration::from_secs(300), "a product delivered or the forger stopped", || {
                    if stopped.load(Ordering::Relaxed) {
                        return Some(None);
                    }
                    let files = std::fs::read_dir(&out).map(Iterator::count).unwrap_or(0);
                    (files > delivered).then_some(Some(files))
                });
                let Some(files) = now else { break };
                (batches, delivered) = (files - delivered, files);
            }
        });
        Self { stop, sent, thread }
    }

    /// Stops the forger; returns how many datagrams it sent.
    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("forger");
        self.sent.load(Ordering::Relaxed)
    }
}

/// A well-formed FMTP BOP (ldm7-multicast.md §3.2–§3.4) of a 1,000-byte product that does not
/// exist, with a 16-byte signature as its metadata.
fn forged_bop(index: u32) -> Vec<u8> {
    let mut datagram = Vec::new();
    datagram.extend_from_slice(&index.to_be_bytes());
    datagram.extend_from_slice(&0u32.to_be_bytes());
    datagram.extend_from_slice(&(18u16 + 16).to_be_bytes());
    datagram.extend_from_slice(&0x0001u16.to_be_bytes());
    datagram.extend_from_slice(&[0, 0, 0, 0, 0x60, 0, 0, 0, 0, 0, 0, 0]);
    datagram.extend_from_slice(&1_000u32.to_be_bytes());
    datagram.extend_from_slice(&16u16.to_be_bytes());
    datagram.extend_from_slice(&[0xee; 16]);
    datagram
}

fn write_product(dir: &Path, index: usize, len: usize) -> PathBuf {
    let bytes: Vec<u8> = (0..len).map(|i| (i * 13 + index * 7 + i / 251) as u8).chain(index.to_be_bytes()).collect();
    let path = dir.join(format!("product{index}"));
    std::fs::write(&path, bytes).expect("write product");
    path
}

/// A multicast group and a free loopback retransmission address, as flag values.
fn addresses(group_octet: u8) -> (String, String) {
    let group = SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(239, 255, 90, group_octet)),
        ldm7_io::free_port().expect("a free port"),
    );
    let retx = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), ldm7_io::free_port().expect("a free port"));
    (group.to_string(), retx.to_string())
}

/// A child process whose standard error is read line by line as it comes (so that a test can
/// wait for a line, with a deadline); killed if the test ends before it.
struct Running {
    child: Option<Child>,
    stdout: Option<std::process::ChildStdout>,
    stderr: Lines,
}

impl Running {
    fn start(command: &mut Command) -> Self {
        let mut child =
            command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start ldm7");
        let stdout = child.stdout.take();
        let stderr = Lines::read(child.stderr.take().expect("stderr"));
        Self { child: Some(child), stdout, stderr }
    }

    /// Waits for the process to end; returns its status, standard output and error.
    fn outcome(mut self) -> (std::process::ExitStatus, String, String) {
        let mut stdout = String::new();
        if let Some(mut out) = self.stdout.take() {
            out.read_to_string(&mut stdout).expect("read stdout");
        }
        let status = self.child.take().expect("child").wait().expect("wait");
        (status, stdout, self.stderr.rest())
    }

    /// Waits for the process to end successfully; returns its standard output and error.
    fn finish(mut self) -> (String, String) {
        let mut stdout = String::new();
        if let Some(mut out) = self.stdout.take() {
            out.read_to_string(&mut stdout).expect("read stdout");
        }
        let status = self.child.take().expect("child").wait().expect("wait");
        let stderr = self.stderr.rest();
        assert!(status.success(), "ldm7 failed ({status}): {stdout}{stderr}");
        (stdout, stderr)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Lines of a stream, read by a thread of their own.
struct Lines {
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Lines {
    /// How long a test waits for a line it expects.
    const WAIT: Duration = Duration::from_secs(60);

    fn read(stream: impl Read + Send + 'static) -> Self {
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { return };
                if send.send(line).is_err() {
                    return;
                }
            }
        });
        Self { lines, seen: Vec::new() }
    }

    /// The first line (from now on) that matches; panics with everything read when the stream
    /// ends or [`Self::WAIT`] passes first.
    fn wait_for(&mut self, what: &str, matches: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Self::WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if matches(&line) {
                        return line;
                    }
                }
                Err(error) => panic!("waiting for {what}: {error:?}; read so far:\n{}", self.seen.join("\n")),
            }
        }
    }

    /// Everything read, to the end of the stream.
    fn rest(&mut self) -> String {
        self.seen.extend(self.lines.iter());
        self.seen.join("\n")
    }
}

fn md5_hex(bytes: &[u8]) -> String {
    use md5::{Digest, Md5};
    Md5::digest(bytes).iter().map(|byte| format!("{byte:02x}")).collect()
}
