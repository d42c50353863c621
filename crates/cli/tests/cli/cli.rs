//! The `ldm7` command as users run it: real processes, a real queue in a temporary directory.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use ldm7_testkit::shared_data_or_skip;

const LDM7: &str = env!("CARGO_BIN_EXE_ldm7");

fn ldm7(args: &[&str]) -> Output {
    Command::new(LDM7).args(args).env_remove("LDM7_QUEUE").output().expect("run ldm7")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn ok(args: &[&str]) -> String {
    let output = ldm7(args);
    assert!(output.status.success(), "ldm7 {args:?} failed: {}{}", text(&output.stdout), text(&output.stderr));
    text(&output.stdout)
}

fn fails_with(code: i32, args: &[&str]) -> String {
    let output = ldm7(args);
    assert_eq!(output.status.code(), Some(code), "ldm7 {args:?}: {}{}", text(&output.stdout), text(&output.stderr));
    text(&output.stderr)
}

struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Self {
        Self { dir: tempfile::tempdir().expect("tempdir") }
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    fn queue(&self, size: &str) -> String {
        let queue = self.path("q.pq").display().to_string();
        ok(&["queue", "create", "--path", &queue, "--size", size, "--slots", "1000"]);
        queue
    }
    fn file(&self, name: &str, contents: &[u8]) -> String {
        let path = self.path(name);
        std::fs::write(&path, contents).expect("write");
        path.display().to_string()
    }
}

fn product_count(queue: &str) -> u64 {
    let info = ok(&["queue", "info", "--json", "--path", queue]);
    let field = info.split("\"product_count\":").nth(1).expect("product_count field");
    field.split(|c: char| !c.is_ascii_digit()).next().expect("number").parse().expect("count")
}

#[test]
fn create_info_check_and_overwrite_refusal() {
    let scratch = Scratch::new();
    let queue = scratch.queue("10M");
    let info = ok(&["queue", "info", "--path", &queue]);
    assert!(info.contains("10000000 bytes, 1000 slots"), "{info}");
    assert!(info.contains("products               0"), "{info}");
    assert!(ok(&["queue", "check", "--path", &queue]).contains("queue is sound"));
    let error = fails_with(1, &["queue", "create", "--path", &queue, "--size", "1M"]);
    assert!(error.contains("--force"), "{error}");
    ok(&["queue", "create", "--path", &queue, "--size", "2M", "--force"]);
    assert!(ok(&["queue", "info", "--path", &queue]).contains("2000000 bytes"));
    let not_queue = scratch.file("precious.txt", b"keep me");
    fails_with(1, &["queue", "create", "--path", &not_queue, "--size", "1M", "--force"]);
    assert_eq!(std::fs::read(&not_queue).expect("read"), b"keep me");
    // No directory is invented for a mistyped path.
    let missing = scratch.path("no/such/q.pq").display().to_string();
    let error = fails_with(1, &["queue", "create", "--path", &missing, "--size", "1M"]);
    assert!(error.contains("no/such does not exist") && error.contains("mkdir -p"), "{error}");
    assert!(!scratch.path("no").exists(), "queue create made a directory");
}

/// `watch -T` and `notify -T` end normally when their timeout passes (exit 0); see the notify
/// case in ldm6.rs.
#[test]
fn watch_timeout_ends_normally() {
    let scratch = Scratch::new();
    let queue = scratch.queue("1M");
    let output = ldm7(&["watch", "-q", &queue, "-T", "0.2"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
}

#[test]
fn insert_then_cat_is_byte_identical() {
    let scratch = Scratch::new();
    let queue = scratch.queue("10M");
    let first = scratch.file("first.bin", &(0..=255u8).cycle().take(100_000).collect::<Vec<_>>());
    let second = scratch.file("second.txt", b"hello world\n");
    ok(&["insert", "-q", &queue, "-f", "NEXRAD3", "-s", "7", &first, &second]);
    let output = ldm7(&["cat", "-q", &queue]);
    assert!(output.status.success());
    let mut expected = std::fs::read(&first).expect("read");
    expected.extend_from_slice(b"hello world\n");
    assert_eq!(output.stdout, expected);
    let lines = ok(&["cat", "-q", &queue, "--info", "-p", "^second"]);
    assert_eq!(lines.lines().count(), 1, "{lines}");
    assert!(lines.trim_start().starts_with("12 "), "{lines}");
    assert!(lines.ends_with(" NEXRAD3 007  second.txt\n"), "{lines}");
    assert!(ok(&["cat", "-q", &queue, "--info", "-f", "NGRID"]).is_empty());
    assert_eq!(ok(&["cat", "-q", &queue, "--info", "--last", "1"]).lines().count(), 1);
}

#[test]
fn duplicates_are_reported_not_errors() {
    let scratch = Scratch::new();
    let queue = scratch.queue("10M");
    let file = scratch.file("a", b"same bytes");
    ok(&["insert", "-q", &queue, &file]);
    let output = ldm7(&["insert", "-q", &queue, &file]);
    assert!(output.status.success());
    assert!(text(&output.stderr).contains("duplicate"), "{}", text(&output.stderr));
    assert_eq!(product_count(&queue), 1);
    // -i: the signature comes from the ident, so different data with the same ident is a duplicate.
    let other = scratch.file("b", b"other bytes");
    ok(&["insert", "-q", &queue, "-i", "-p", "ID", &file]);
    ok(&["insert", "-q", &queue, "-i", "-p", "ID", &other]);
    assert_eq!(product_count(&queue), 2);
}

/// Many files, one larger than the reader's in-flight bound, and standard input: every product
/// goes in intact and in argument order, and the inserter's peak memory stays within
/// 64 MB plus the largest product (the queue's map pages are not held).
#[test]
fn many_files_go_in_in_order_with_bounded_memory() {
    let scratch = Scratch::new();
    let queue = scratch.path("q.pq").display().to_string();
    ok(&["queue", "create", "--path", &queue, "--size", "300M", "--slots", "5000"]);
    let mut files = Vec::new();
    let mut expected = Vec::new();
    for index in 0..1500u32 {
        let size = 1 + (index as usize * 7919) % 60_000;
        let data: Vec<u8> = (0..size).map(|byte| (byte as u32 ^ index.wrapping_mul(2654435761)) as u8).collect();
        files.push(scratch.file(&format!("f{index:04}"), &data));
        expected.push((format!("f{index:04}"), data));
        if index == 700 {
            let large: Vec<u8> = (0..40_000_000u32).map(|byte| (byte % 253) as u8).collect();
            files.push(scratch.file("large", &large));
            expected.push(("large".to_owned(), large));
        }
    }
    let mut args = vec!["insert", "-q", queue.as_str(), "-f", "EXP"];
    args.extend(files.iter().map(String::as_str));
    args.push("-");
    let mut child = Command::new(LDM7)
        .args(&args)
        .env_remove("LDM7_QUEUE")
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ldm7 insert");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(b"from standard input").expect("write stdin");
    }
    expected.push(("stdin".to_owned(), b"from standard input".to_vec()));
    let (status, peak_rss_bytes) = ldm7_testbed::wait_with_peak_rss(&mut child).expect("wait for ldm7 insert");
    let mut stderr = String::new();
    child.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("stderr");
    assert!(status.success(), "{stderr}");
    assert!(
        peak_rss_bytes <= (64 << 20) + 40_000_000,
        "peak RSS {peak_rss_bytes} bytes is more than 64 MB plus the largest product"
    );

    let listing = ok(&["cat", "-q", &queue, "--info"]);
    let idents: Vec<&str> = listing.lines().map(|line| line.rsplit("  ").next().expect("ident")).collect();
    let wanted: Vec<&str> = expected.iter().map(|(ident, _)| ident.as_str()).collect();
    assert_eq!(idents, wanted, "products in argument order");
    let output = ldm7(&["cat", "-q", &queue]);
    let all: Vec<u8> = expected.iter().flat_map(|(_, data)| data.iter().copied()).collect();
    assert!(output.stdout == all, "product bytes differ from the files");
    assert!(ok(&["queue", "check", "--path", &queue]).contains("queue is sound"));
}

#[test]
fn classic_name_pqinsert_works() {
    let scratch = Scratch::new();
    let queue = scratch.queue("10M");
    let link = scratch.path("pqinsert");
    std::os::unix::fs::symlink(LDM7, &link).expect("symlink");
    let file = scratch.file("data", b"via pqinsert");
    let output = Command::new(&link).args(["-q", &queue, "-f", "EXP", "-p", "CLASSIC", &file]).output().expect("run");
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(ok(&["cat", "-q", &queue, "--info"]).contains(" EXP 000  CLASSIC"));
    let usage = Command::new(&link).arg("--bogus").output().expect("run");
    assert_eq!(usage.status.code(), Some(1));
}

#[test]
fn bad_input_is_refused_and_nothing_inserted() {
    let scratch = Scratch::new();
    let missing = scratch.path("missing.pq").display().to_string();
    let file = scratch.file("small", b"x");
    let error = fails_with(1, &["insert", "-q", &missing, &file]);
    assert!(error.contains("ldm7 queue create"), "{error}");

    let queue = scratch.queue("100K");
    let big = scratch.file("big", &vec![7u8; 200_000]);
    let error = fails_with(1, &["insert", "-q", &queue, &file, &big]);
    assert!(error.contains("larger queue"), "{error}");
    let error = fails_with(1, &["insert", "-q", &queue, "-f", "NOSUCHFEED", &file]);
    assert!(error.contains("unknown feedtype"), "{error}");
    let unreadable = scratch.path("no-such-file").display().to_string();
    let error = fails_with(1, &["insert", "-q", &queue, &file, &unreadable]);
    assert!(error.contains("cannot read"), "{error}");
    assert_eq!(product_count(&queue), 0);
    fails_with(1, &["cat", "-q", &queue, "-p", "(unclosed"]);
    fails_with(1, &["queue", "create", "--path", &queue, "--size", "12X"]);
    fails_with(1, &["no-such-command"]);
}

#[test]
fn replay_and_watch_across_processes() {
    let Some(trace) = shared_data_or_skip("traces/unidata_ldm_NEXRAD3_500prod_20150911T2259Z.txt") else { return };
    let scratch = Scratch::new();
    let queue = scratch.queue("200M");
    // `-o 3600`: the watcher follows from an hour back, so it sees all 500 products whether it
    // opens the queue before the inserter starts (then it is woken for each) or after.
    let watcher = Command::new(LDM7)
        .args(["watch", "-q", &queue, "-f", "NEXRAD3", "-o", "3600", "--count", "500", "--timeout", "60"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start watcher");
    let summary = ok(&["insert", "-q", &queue, "--replay", &trace.display().to_string(), "--speed", "0"]);
    assert!(summary.contains("replayed 500 products"), "{summary}");
    let output = watcher.wait_with_output().expect("watcher");
    assert!(output.status.success());
    let lines = text(&output.stdout);
    assert_eq!(lines.lines().count(), 500);
    assert!(lines.lines().all(|line| line.contains(" NEXRAD3 ")), "{lines}");
    assert_eq!(product_count(&queue), 500);
}

#[test]
fn bench_queue_runs_tiny() {
    let scratch = Scratch::new();
    let dir = scratch.path("bench");
    std::fs::create_dir(&dir).expect("mkdir");
    let output = ok(&[
        "bench",
        "queue",
        "--dir",
        &dir.display().to_string(),
        "--queue-bytes",
        "20000000",
        "--volume-bytes",
        "4000000",
        "--repeat",
        "1",
        "--wakeups",
        "50",
        "--sizes",
        "1000,30000",
    ]);
    assert!(output.contains("wake-up"), "{output}");
}

/// kill -9 of an inserting `ldm7 insert --replay` at random moments never damages the queue.
#[test]
fn killed_inserter_leaves_a_sound_queue() {
    let Some(trace) = shared_data_or_skip("traces/unidata_ldm_NGRID_1hr_20150615T00Z.txt") else { return };
    let scratch = Scratch::new();
    // The NGRID hour holds a 54 MB product: the queue must be larger than that.
    let queue = scratch.queue("100M");
    let mut further = 20u64;
    for round in 0..50 {
        // `-v`: a line per product inserted.
        let mut child = Command::new(LDM7)
            .args(["insert", "-v", "-q", &queue, "--replay", &trace.display().to_string(), "--speed", "0"])
            .args(["--seed", &round.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start inserter");
        // Kill it at a pseudo-random point of its insert stream: once it has inserted its first
        // product and a pseudo-random number more, 0 to 360 (or has ended first).
        further = (further * 37 + 11) % 181;
        let target = 1 + 2 * further;
        let stderr = BufReader::new(child.stderr.take().expect("stderr"));
        let (reached, inserted) = std::sync::mpsc::channel();
        // The reader goes on reading until the inserter is gone (a closed pipe would end it).
        std::thread::spawn(move || {
            let mut products = 0;
            for line in stderr.lines().map_while(Result::ok) {
                if line.contains(" NGRID ") {
                    products += 1;
                    if products == target {
                        let _ = reached.send(products);
                    }
                }
            }
            let _ = reached.send(products);
        });
        let count = inserted
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("round {round}: not {target} inserts within 60 s"));
        assert!(count > 0, "round {round}: the inserter inserted nothing");
        child.kill().expect("kill -9");
        child.wait().expect("reap");
        let check = ldm7(&["queue", "check", "--path", &queue]);
        assert!(check.status.success(), "round {round}: {}{}", text(&check.stdout), text(&check.stderr));
    }
    assert!(product_count(&queue) > 0);
}

/// `ldm7 fmtp send` to two `ldm7 fmtp recv` processes on loopback multicast, each dropping 5% of
/// the datagrams: every product arrives intact at both (repaired over TCP).
#[test]
fn fmtp_send_recv_on_loopback_with_drop() {
    let Some(trace) = shared_data_or_skip("traces/unidata_ldm_NEXRAD3_500prod_20150911T2259Z.txt") else { return };
    let scratch = Scratch::new();
    // Below the ephemeral range: a port bind(0) handed out can be another test's outgoing one.
    let port = ldm7_io::free_port().expect("a free port");
    let group = format!("239.255.78.{}:{port}", port % 200 + 1);
    let retx = format!("127.0.0.1:{port}");
    let mut sender = Command::new(LDM7)
        .args(["fmtp", "send", "--group", &group, "--retx-listen", &retx, "--rate", "500M", "--receivers", "2"])
        .args(["--replay", &trace.display().to_string(), "--limit", "200"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start sender");
    // The sender's first line says it is up: its retransmission server listens.
    let mut sender_out = BufReader::new(sender.stdout.take().expect("sender stdout"));
    let mut sender_text = String::new();
    sender_out.read_line(&mut sender_text).expect("read the sender's first line");
    assert!(sender_text.contains("retransmission server"), "the sender did not start: {sender_text:?}");
    let receivers: Vec<_> = (1..=2)
        .map(|seed| {
            let out = scratch.path(&format!("r{seed}"));
            let child = Command::new(LDM7)
                .args(["fmtp", "recv", "--group", &group, "--sender", &retx, "--drop", "0.05", "--count", "200"])
                .args(["--seed", &seed.to_string(), "--timeout", "30", "--out", &out.display().to_string()])
                .stdout(Stdio::piped())
                .spawn()
                .expect("start receiver");
            (out, child)
        })
        .collect();
    for (out, child) in receivers {
        let output = child.wait_with_output().expect("receiver");
        let summary = text(&output.stdout);
        assert!(output.status.success(), "{summary}");
        assert!(summary.contains("delivered 200, missed 0"), "{summary}");
        assert!(!summary.contains("retransmitted blocks 0,"), "5% loss needs repairs: {summary}");
        let files: Vec<_> =
            std::fs::read_dir(&out).expect("out dir").map(|entry| entry.expect("entry").path()).collect();
        assert_eq!(files.len(), 200);
        for file in files {
            let data = std::fs::read(&file).expect("read product");
            let name = file.file_name().and_then(|name| name.to_str()).expect("name").to_owned();
            assert_eq!(ldm7_types::Signature::md5_of(&data).to_string(), name, "product content matches its MD5");
        }
    }
    sender_out.read_to_string(&mut sender_text).expect("read the sender's output");
    let status = sender.wait().expect("sender");
    assert!(status.success(), "{sender_text}");
    assert!(sender_text.contains("released 200"), "{sender_text}");
}

#[test]
fn serve_check_reports_rate_control_and_refuses_bad_values_by_key() {
    let scratch = Scratch::new();
    let config = scratch.file("ldmd.conf", b"MULTICAST EXP 239.255.1.1:38800 127.0.0.1:0 24 0 dummy dummy\n");
    let good = scratch.file(
        "good.toml",
        b"[multicast.feeds.EXP.rate_control]\nsteps = [\"5 Mbit/s\", \"20 Mbit/s\"]\ninterval = \"2s\"\n",
    );
    let report = ok(&["serve", "-c", &config, "--settings", &good, "--check"]);
    assert!(report.contains("MULTICAST EXP to 239.255.1.1:38800 at 5 Mbit/s"), "{report}");
    assert!(
        report.contains("rate control: steps 5 Mbit/s → 20 Mbit/s, interval 2s, W 2ms, alpha 0.1, beta 0.01"),
        "{report}"
    );
    for (settings, key) in [
        ("[multicast.rate_control]\nsteps = [\"20M\", \"5M\"]\n", "multicast.rate_control.steps"),
        ("[multicast.rate_control]\nsteps = [\"5M\"]\nbeta = -1\n", "multicast.rate_control.beta"),
        ("[multicast.feeds.EXP]\nrate = \"9M\"\nrate_control = { steps = [\"5M\"] }\n", "multicast.feeds.EXP.rate"),
    ] {
        let bad = scratch.file("bad.toml", settings.as_bytes());
        let stderr = fails_with(1, &["serve", "-c", &config, "--settings", &bad, "--check"]);
        assert!(stderr.contains(key), "{settings:?}: {stderr}");
    }
}
