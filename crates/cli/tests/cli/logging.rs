//! The one logger, as operators see it from the real binary: LDM-style lines
//! (`YYYYMMDDThhmmss.uuuuuuZ ldm7[pid] LEVEL message`), NOTE and above by default, INFO product
//! lines with `-v`, DEBUG with `-x`, JSON with `--log-json`, `-l FILE` with rotation by size and
//! reopening on SIGHUP and SIGUSR1, SIGUSR2 cycling the level, and the classic program name
//! (`ldmd[pid]`) when invoked by it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use ldm7_testkit::wait_until;

const LDM7: &str = env!("CARGO_BIN_EXE_ldm7");

fn ldm7(args: &[&str]) -> Output {
    let output = Command::new(LDM7).args(args).env_remove("LDM7_QUEUE").output().expect("run ldm7");
    assert!(output.status.success(), "ldm7 {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    output
}

fn stderr_lines(output: &Output) -> Vec<String> {
    String::from_utf8_lossy(&output.stderr).lines().map(str::to_owned).collect()
}

/// `YYYYMMDDThhmmss.uuuuuuZ ldm7[pid] LEVEL message`: the level and the message, or why not.
fn parse_line(line: &str, pid: Option<u32>) -> Result<(String, String), String> {
    parse_program_line(line, "ldm7", pid)
}

/// `YYYYMMDDThhmmss.uuuuuuZ PROGRAM[pid] LEVEL message`: the level and the message, or why not.
fn parse_program_line(line: &str, name: &str, pid: Option<u32>) -> Result<(String, String), String> {
    let mut parts = line.splitn(4, ' ');
    let (Some(time), Some(program), Some(level), Some(message)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(format!("not four fields: {line:?}"));
    };
    let digits = |text: &str| text.chars().all(|c| c.is_ascii_digit());
    let time_ok = time.len() == 23
        && digits(&time[..8])
        && &time[8..9] == "T"
        && digits(&time[9..15])
        && &time[15..16] == "."
        && digits(&time[16..22])
        && time.ends_with('Z');
    if !time_ok {
        return Err(format!("time {time:?} is not YYYYMMDDThhmmss.uuuuuuZ: {line:?}"));
    }
    let pid_text = program.strip_prefix(name).and_then(|rest| rest.strip_prefix('[')?.strip_suffix(']'));
    match (pid_text.and_then(|text| text.parse::<u32>().ok()), pid) {
        (Some(got), Some(expected)) if got != expected => return Err(format!("pid {got}, expected {expected}")),
        (None, _) => return Err(format!("program {program:?} is not {name}[pid]: {line:?}")),
        _ => {}
    }
    if !["DEBUG", "INFO", "NOTE", "WARN", "ERROR"].contains(&level) {
        return Err(format!("level {level:?} is not an LDM level: {line:?}"));
    }
    Ok((level.to_owned(), message.to_owned()))
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
    fn text(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).unwrap_or_default()
    }
    fn queue(&self) -> String {
        let queue = self.path("q.pq").display().to_string();
        ldm7(&["queue", "create", "-q", &queue, "--size", "10M"]);
        queue
    }
    fn files(&self, count: usize) -> Vec<String> {
        (0..count)
            .map(|k| {
                let path = self.path(&format!("product.{k}"));
                std::fs::write(&path, format!("product number {k}\n")).expect("write");
                path.display().to_string()
            })
            .collect()
    }
}

fn insert(queue: &str, files: &[String], flags: &[&str]) -> Output {
    let mut args = vec!["insert", "-q", queue];
    args.extend_from_slice(flags);
    args.extend(files.iter().map(String::as_str));
    ldm7(&args)
}

#[test]
fn product_lines_need_v_and_signatures_need_x() {
    let scratch = Scratch::new();
    let queue = scratch.queue();
    let files = scratch.files(3);
    // Default: NOTE and above only; a clean insert logs nothing.
    assert_eq!(stderr_lines(&insert(&queue, &files[..1], &[])), Vec::<String>::new());
    // -v: one INFO line per product (and the batch summary), LDM-style.
    let output = insert(&queue, &files[1..2], &["-v"]);
    let lines = stderr_lines(&output);
    assert_eq!(lines.len(), 2, "{lines:?}");
    let (level, message) = parse_line(&lines[0], None).unwrap();
    assert_eq!(level, "INFO");
    assert!(message.ends_with(" EXP 000  product.1"), "{message}");
    assert!(message.trim_start().starts_with("17 "), "no signature without -x: {message}");
    // -x: the product line carries the signature (32 hex digits first).
    let lines = stderr_lines(&insert(&queue, &files[2..3], &["-x"]));
    let (level, message) = parse_line(&lines[0], None).unwrap();
    assert_eq!(level, "INFO");
    let signature = message.split(' ').next().unwrap();
    assert!(signature.len() == 32 && signature.chars().all(|c| c.is_ascii_hexdigit()), "{message}");
    // A duplicate is a NOTE, shown by default, wording unchanged.
    let lines = stderr_lines(&insert(&queue, &files[..1], &[]));
    assert_eq!(lines.len(), 1, "{lines:?}");
    let (level, message) = parse_line(&lines[0], None).unwrap();
    assert_eq!(level, "NOTE");
    assert!(message.contains("duplicate, not inserted"), "{message}");
}

#[test]
fn log_json_prints_one_object_per_event() {
    let scratch = Scratch::new();
    let queue = scratch.queue();
    let files = scratch.files(2);
    let output = insert(&queue, &files, &["-v", "--log-json"]);
    let lines = stderr_lines(&output);
    assert_eq!(lines.len(), 3, "{lines:?}");
    for line in &lines {
        let event: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"));
        assert_eq!(event["level"], "INFO", "{line}");
        assert_eq!(event["program"], "ldm7");
        assert_eq!(event["target"], "ldm7::product");
        assert!(event["pid"].as_u64().is_some_and(|pid| pid > 0));
        let time = event["time"].as_str().unwrap();
        assert!(time.len() == 23 && time.ends_with('Z'), "{line}");
    }
    let first: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    assert!(first["message"].as_str().unwrap().ends_with("product.0"), "{first}");
}

#[test]
fn log_file_rotates_by_size_and_keeps_n_old_files() {
    let scratch = Scratch::new();
    let queue = scratch.queue();
    let files = scratch.files(40);
    let log = scratch.path("ldm7.log").display().to_string();
    // Each INFO line is about 100 bytes: 40 of them fill several 300-byte files.
    let output = insert(&queue, &files, &["-v", "-l", &log, "--log-max-size", "300", "--log-keep", "2"]);
    assert!(output.stderr.is_empty(), "nothing on standard error with -l: {}", String::from_utf8_lossy(&output.stderr));
    let current = scratch.text("ldm7.log");
    let (first, second) = (scratch.text("ldm7.log.1"), scratch.text("ldm7.log.2"));
    assert!(!scratch.path("ldm7.log.3").exists(), "only --log-keep 2 old files");
    for (name, text) in [("ldm7.log", &current), ("ldm7.log.1", &first), ("ldm7.log.2", &second)] {
        assert!(!text.is_empty() && text.len() <= 300, "{name}: {} bytes", text.len());
        for line in text.lines() {
            parse_line(line, Some(output_pid(line))).unwrap();
        }
    }
    // Newest last: the batch summary ends the current file; FILE.1 holds the products just
    // before it, FILE.2 earlier ones.
    let summary = format!("inserted 40 of 40 product(s) into {queue}");
    assert!(current.lines().last().is_some_and(|line| line.ends_with(&summary)), "{current}");
    let numbers = |text: &str| -> Vec<u32> {
        text.lines().filter_map(|line| line.rsplit_once("product.").and_then(|(_, n)| n.parse().ok())).collect()
    };
    let kept: Vec<u32> = [&second, &first, &current].into_iter().flat_map(|text| numbers(text)).collect();
    let expected: Vec<u32> = (40 - kept.len() as u32..40).collect();
    assert!(kept.len() < 40 && kept == expected, "the newest products, in order, no gap: {kept:?}");
    // -l - is standard error.
    let output = insert(&queue, &scratch.files(41)[40..], &["-v", "-l", "-"]);
    assert_eq!(stderr_lines(&output).len(), 2);
}

fn output_pid(line: &str) -> u32 {
    line.split(' ').nth(1).and_then(|p| p.strip_prefix("ldm7[")?.strip_suffix(']')?.parse().ok()).expect("pid")
}

/// `ldm7 serve -l FILE`: SIGHUP after logrotate moved the file reopens it (and reloads the
/// configuration); `-x` shows DEBUG lines; the server runs on.
#[test]
fn serve_reopens_its_log_file_on_sighup() {
    let scratch = Scratch::new();
    let queue = scratch.queue();
    std::fs::write(scratch.path("ldmd.conf"), "ALLOW ANY ^((localhost|loopback)|(127\\.0\\.0\\.1\\.?))$\n")
        .expect("config");
    // Below the ephemeral range: a port bind(0) handed out can be another test's outgoing one.
    let port = ldm7_io::free_port().expect("a free port");
    let log = scratch.path("ldmd.log");
    let mut server = Server(
        Command::new(LDM7)
            .args(["serve", "-c", "ldmd.conf", "-q", &queue, "-P", &port.to_string(), "-x", "-l"])
            .arg(&log)
            .current_dir(scratch.dir.path())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start ldm7 serve"),
    );
    let pid = server.0.id();
    wait_until(Duration::from_secs(10), "the server's first log line", || {
        scratch.text("ldmd.log").contains("Starting Up").then_some(())
    });
    // A connection that closes at once: DEBUG "connection closed" (shown with -x).
    drop(std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect"));
    wait_until(Duration::from_secs(10), "a DEBUG line", || scratch.text("ldmd.log").contains(" DEBUG ").then_some(()));
    // logrotate: move the file away, then SIGHUP.
    std::fs::rename(&log, scratch.path("ldmd.log.old")).expect("move the log");
    signal(pid, "HUP");
    wait_until(Duration::from_secs(10), "the reload line in a new log file", || {
        scratch.text("ldmd.log").contains("Configuration reloaded").then_some(())
    });
    let old = scratch.text("ldmd.log.old");
    assert!(!old.contains("Configuration reloaded"), "{old}");
    for line in old.lines().chain(scratch.text("ldmd.log").lines()) {
        parse_line(line, Some(pid)).unwrap();
    }
    signal(pid, "TERM");
    let status = server.0.wait().expect("wait");
    assert!(status.success(), "ldm7 serve exits 0 after SIGTERM: {status}");
    assert!(scratch.text("ldmd.log").contains("NOTE Exiting"));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut server.0.stderr.take().expect("stderr"), &mut stderr).expect("read");
    assert_eq!(stderr, "", "everything went to the log file");
}

/// Invoked as `ldmd` (a link to the binary), the server's lines say `ldmd[pid]`. SIGUSR2 cycles the
/// level NOTE → INFO → DEBUG → NOTE, each change logged; SIGUSR1 reopens the log file (after
/// logrotate moved it) and ends nothing.
#[test]
fn ldmd_names_itself_and_sigusr1_reopens_and_sigusr2_cycles_the_level() {
    let scratch = Scratch::new();
    let queue = scratch.queue();
    std::fs::write(scratch.path("ldmd.conf"), "ALLOW ANY ^((localhost|loopback)|(127\\.0\\.0\\.1\\.?))$\n")
        .expect("config");
    let ldmd = scratch.path("ldmd");
    std::os::unix::fs::symlink(LDM7, &ldmd).expect("link ldmd");
    let port = ldm7_io::free_port().expect("a free port");
    let log = scratch.path("ldmd.log");
    let mut server = Server(
        Command::new(&ldmd)
            .args(["-c", "ldmd.conf", "-q", &queue, "-P", &port.to_string(), "-l"])
            .arg(&log)
            .current_dir(scratch.dir.path())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start ldmd"),
    );
    let pid = server.0.id();
    let logged = |text: &str| scratch.text("ldmd.log").contains(text);
    let debug_lines = |text: &str| {
        text.lines()
            .filter(|line| parse_program_line(line, "ldmd", Some(pid)).is_ok_and(|(level, _)| level == "DEBUG"))
            .count()
    };
    wait_until(Duration::from_secs(10), "the server's first log line", || logged("Starting Up").then_some(()));
    // A connection that closes at once logs a DEBUG line: shown only at DEBUG.
    let closed_connection = || drop(std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect"));
    closed_connection();
    for level in ["INFO", "DEBUG"] {
        signal(pid, "USR2");
        let line = format!("NOTE SIGUSR2: logging level now {level}");
        wait_until(Duration::from_secs(10), &line, || logged(&line).then_some(()));
    }
    let text = scratch.text("ldmd.log");
    let before_debug = &text[..text.find("logging level now DEBUG").expect("the DEBUG line")];
    assert_eq!(debug_lines(before_debug), 0, "a DEBUG line before the level was DEBUG: {before_debug}");
    closed_connection();
    wait_until(Duration::from_secs(10), "a DEBUG line", || (debug_lines(&scratch.text("ldmd.log")) > 0).then_some(()));
    // logrotate moves the file, then SIGUSR1: the next line goes to a new file.
    std::fs::rename(&log, scratch.path("ldmd.log.old")).expect("move the log");
    signal(pid, "USR1");
    signal(pid, "USR2");
    wait_until(Duration::from_secs(10), "the level back at NOTE, in a new file", || {
        logged("NOTE SIGUSR2: logging level now NOTE").then_some(())
    });
    closed_connection();
    let old = scratch.text("ldmd.log.old");
    assert!(!old.contains("level now NOTE"), "{old}");
    for line in old.lines().chain(scratch.text("ldmd.log").lines()) {
        parse_program_line(line, "ldmd", Some(pid)).unwrap();
    }
    signal(pid, "TERM");
    let status = server.0.wait().expect("wait");
    assert!(status.success(), "ldmd exits 0 after SIGTERM: {status}");
    let text = scratch.text("ldmd.log");
    let after_note = &text[text.find("logging level now NOTE").expect("the NOTE line")..];
    assert_eq!(debug_lines(after_note), 0, "DEBUG lines after the level came back to NOTE: {after_note}");
}

/// A child killed when the test ends, however it ends.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn signal(pid: u32, name: &str) {
    let status = Command::new("kill").args([&format!("-{name}"), &pid.to_string()]).status().expect("kill");
    assert!(status.success());
}

#[test]
fn an_unwritable_log_file_is_refused_clearly() {
    let scratch = Scratch::new();
    let queue = scratch.queue();
    let missing_dir = scratch.path("no/such/dir/ldm7.log");
    let output =
        Command::new(LDM7).args(["queue", "info", "-q", &queue, "-l"]).arg(&missing_dir).output().expect("run");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cannot open the log file") && stderr.contains("writable"), "{stderr}");
    assert!(!Path::new(&missing_dir).exists());
}

#[test]
fn a_failure_is_also_logged_to_the_log_file() {
    let scratch = Scratch::new();
    let log = scratch.path("ldm7.log");
    let missing = scratch.path("missing.pq");
    let output =
        Command::new(LDM7).args(["queue", "info", "-q"]).arg(&missing).arg("-l").arg(&log).output().expect("run");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.starts_with("ldm7: error: "), "the error still goes to standard error: {stderr}");
    let text = scratch.text("ldm7.log");
    let (level, message) = parse_line(text.trim_end(), None).unwrap();
    assert_eq!(level, "ERROR");
    assert!(stderr.contains(&message), "{message} / {stderr}");
}

#[test]
fn replay_prints_one_line_per_product_with_v() {
    let scratch = Scratch::new();
    let queue = scratch.queue();
    let trace = scratch.dir.path().join("tiny_trace.txt");
    std::fs::write(
        &trace,
        "100 20150615000000.000 NGRID\n200 20150615000000.500 NGRID\n300 20150615000001.000 NGRID\n",
    )
    .unwrap();
    let trace = trace.display().to_string();
    let output = ldm7(&["insert", "-q", &queue, "--replay", &trace, "--speed", "0", "-v"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let lines = stderr_lines(&output);
    let products: Vec<&String> = lines.iter().filter(|line| line.contains(" NGRID ")).collect();
    assert_eq!(products.len(), 3, "{lines:?}");
    let quiet = ldm7(&["insert", "-q", &queue, "--replay", &trace, "--speed", "0", "--seed", "2"]);
    assert!(stderr_lines(&quiet).is_empty(), "without -v a replay logs nothing");
}
