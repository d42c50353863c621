//! `ldm7 demo`: a short one runs to its end, every product checked and every server on its
//! dashboard; interrupted, SIGINT (Ctrl-C) or SIGTERM once its servers run stops them and
//! removes its temporary directory (queues included); `--keep` keeps the directory, and the
//! servers are stopped all the same. Each test gives the demo its own `TMPDIR`, so that what is
//! left behind is found by directory, and looks for survivors by their working directory.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use ldm7_testkit::{shared_data_or_skip, wait_until};
use nix::sys::signal::Signal;

const LDM7: &str = env!("CARGO_BIN_EXE_ldm7");
const TRACE: &str = "traces/unidata_ldm_NGRID_1hr_20150615T00Z.txt";

#[test]
fn a_short_demo_delivers_every_product_and_every_server_reports_to_its_dashboard() {
    let Some(trace) = shared_data_or_skip(TRACE) else { return };
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut demo = Command::new(LDM7)
        .args(["demo", "--span", "3min", "--speed", "6", "--queue-size", "100M", "--trace"])
        .arg(&trace)
        .env("TMPDIR", tmp.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ldm7 demo");
    let lines = read_lines(&mut demo);
    let mut seen = Vec::new();
    let url = wait_until(Duration::from_secs(60), "the demo to print its dashboard's address", || {
        seen.extend(lines.try_iter());
        let line = seen.iter().find(|line| line.starts_with("dashboard http://"))?;
        line.split_whitespace().nth(1).map(str::to_owned)
    });
    // The publisher and the three subscribers are on the map from the start.
    let nodes: serde_json::Value = wait_until(Duration::from_secs(20), "the monitor to answer", || {
        ureq::get(&format!("{url}api/nodes")).call().ok()?.into_json().ok()
    });
    let placed = nodes.as_array().expect("an array").iter().filter(|node| node["latitude"].is_number()).count();
    assert_eq!(placed, 4, "{nodes}");
    let status = wait_until(Duration::from_secs(240), "the demo to end", || demo.try_wait().expect("wait"));
    seen.extend(lines.iter());
    let output = seen.join("\n");
    assert!(status.success(), "{output}");
    assert!(output.contains("every product reached every subscriber's queue"), "{output}");
    let reported = seen.iter().find(|line| line.contains(": every server reported (")).expect(&output);
    assert!(reported.contains("sub1, sub2, sub3), 3 links from the publisher"), "{reported}");
    let left: Vec<PathBuf> =
        std::fs::read_dir(tmp.path()).expect("read TMPDIR").map(|e| e.expect("entry").path()).collect();
    assert!(left.is_empty(), "the demo left {left:?} behind");
}

#[test]
fn sigint_stops_the_servers_and_removes_the_directory() {
    interrupted(Signal::SIGINT, false);
}

#[test]
fn sigterm_stops_the_servers_and_removes_the_directory() {
    interrupted(Signal::SIGTERM, false);
}

#[test]
fn keep_keeps_the_directory_of_an_interrupted_demo() {
    interrupted(Signal::SIGTERM, true);
}

/// Starts a small demo (two subscribers, small queues, 30 s of trace replayed in real time),
/// waits until its servers run and the replay has begun, sends `signal`, and checks what is
/// left: no process working in the demo's directory, and the directory gone (or kept with
/// `keep`).
fn interrupted(signal: Signal, keep: bool) {
    let Some(trace) = shared_data_or_skip(TRACE) else { return };
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut command = Command::new(LDM7);
    command
        .args(["demo", "--span", "30s", "--speed", "1", "--subscribers", "2", "--queue-size", "20M", "--trace"])
        .arg(&trace)
        .env("TMPDIR", tmp.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if keep {
        command.arg("--keep");
    }
    let mut demo = command.spawn().expect("start ldm7 demo");
    let lines = read_lines(&mut demo);
    let mut seen = Vec::new();
    wait_until(Duration::from_secs(60), "the demo to start its servers and replay", || {
        while let Ok(line) = lines.try_recv() {
            seen.push(line);
        }
        assert!(demo.try_wait().expect("try_wait").is_none(), "the demo ended early:\n{}", seen.join("\n"));
        seen.iter().any(|line| line.contains("replaying")).then_some(())
    });
    let servers = processes_working_in(tmp.path());
    // A publisher and two subscribers (the second is killed and restarted a third of the way).
    assert!(servers.len() >= 2, "the demo's servers run in its directory: {servers:?}");

    nix::sys::signal::kill(nix::unistd::Pid::from_raw(demo.id() as i32), signal).expect("signal the demo");
    let status = wait_until(Duration::from_secs(60), "the interrupted demo to end", || demo.try_wait().expect("wait"));
    seen.extend(lines.iter());
    let stderr = std::io::read_to_string(demo.stderr.take().expect("stderr")).expect("stderr");
    let output = format!("{}\n{stderr}", seen.join("\n"));
    assert_eq!(status.code(), Some(2), "an interrupted demo is a runtime failure:\n{output}");
    assert!(stderr.contains(&format!("interrupted by {signal}")), "{output}");

    let survivors = processes_working_in(tmp.path());
    assert!(survivors.is_empty(), "processes of the demo survived: {survivors:?}\n{output}");
    let left: Vec<PathBuf> =
        std::fs::read_dir(tmp.path()).expect("read TMPDIR").map(|e| e.expect("entry").path()).collect();
    if keep {
        assert_eq!(left.len(), 1, "--keep keeps the demo's directory: {left:?}\n{output}");
        assert!(left[0].join("pub/log").is_file(), "the publisher's log is kept: {left:?}");
        assert!(output.contains(&format!("kept {}", left[0].display())), "{output}");
    } else {
        assert!(left.is_empty(), "the demo left {left:?} behind\n{output}");
        assert!(output.contains("removed "), "{output}");
    }
}

/// The demo's standard output, line by line, through a channel (read in a thread).
fn read_lines(demo: &mut Child) -> mpsc::Receiver<String> {
    let stdout = demo.stdout.take().expect("stdout");
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    receiver
}

/// Processes whose working directory is under `dir` (deleted or not): the demo's servers run in
/// their own directories under the demo's.
fn processes_working_in(dir: &Path) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else { continue };
        let Ok(cwd) = std::fs::read_link(entry.path().join("cwd")) else { continue };
        if cwd.starts_with(dir) || cwd.to_string_lossy().starts_with(&*dir.to_string_lossy()) {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            found.push((pid, String::from_utf8_lossy(&cmdline).replace('\0', " ")));
        }
    }
    found
}
