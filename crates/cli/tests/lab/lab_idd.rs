//! The miniature IDD, small (issue #41): `ldm7 lab idd` as an operator runs it — 13 servers
//! (the top, 3 relays by LDM-7, 9 leaves by LDM-6 each filing with an EXEC'd pqact; with
//! `LDM_REF_BIN` also a Unidata LDM 6.15 relay with two leaves), 3 minutes of the generated IDD
//! workload, and one fault of each kind: a relay and a leaf killed with SIGKILL and started
//! again, the top stopped and started again, a relay's loss raised by 20% for a minute, a leaf's
//! disk filled and freed. Every node must hold every product (signature and MD5) and every
//! leaf's pqact must have filed every product byte; the command says so and exits 0.

use std::path::Path;
use std::process::Command;

const LDM7: &str = env!("CARGO_BIN_EXE_ldm7");
const LAB_TOOLS: &[&str] = &["ip", "tc", "iptables", "vde_switch", "wirefilter", "mount"];

#[test]
fn a_small_idd_under_one_fault_of_each_kind_delivers_everything_everywhere() {
    if !ldm7_testkit::skip_unless_root_and_tools(
        "a_small_idd_under_one_fault_of_each_kind_delivers_everything_everywhere",
        LAB_TOOLS,
    ) {
        return;
    }
    let _lab = ldm7_testkit::lab_lock();
    let scratch = tempfile::tempdir().expect("tempdir");
    let out = scratch.path().join("results");
    let output = Command::new(LDM7)
        // The monitor is left out to keep CI short (its dashboard has tests of its own).
        .args(["lab", "idd", "--relays", "3", "--leaves", "3", "--minutes", "3", "--chaos", "1", "--no-monitor"])
        .arg("--out")
        .arg(&out)
        .arg("--dir")
        .arg(scratch.path())
        .output()
        .expect("run ldm7 lab idd");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "ldm7 lab idd failed ({}):\n{stdout}\n{stderr}", output.status);
    // One fault of each kind, each logged with its time.
    for event in ["kill -9 r", "kill -9 l", "stop top (SIGTERM)", "start top again", "path loss by 20%", "fill l"] {
        assert!(stdout.contains(event), "no {event:?} event:\n{stdout}");
    }
    assert!(
        stdout.contains("its pqact had held a product for want of room"),
        "the full disk held the leaf's pqact:\n{stdout}"
    );
    assert!(stdout.contains("bar: completeness at every node with ldm7: met"), "{stdout}");
    // Every node's row: nothing missing, nothing corrupt; the leaves filed everything.
    let csv = std::fs::read_dir(&out)
        .expect("results")
        .map(|entry| entry.expect("entry").path())
        .find(|path| path.to_string_lossy().ends_with("-ldm7.csv"))
        .expect("the CSV");
    let rows = csv_rows(&csv);
    let servers = if std::env::var_os("LDM_REF_BIN").is_some() { 16 } else { 13 };
    assert_eq!(rows.len(), servers, "a row per server: {rows:?}");
    for row in &rows {
        assert_eq!((row["missing"].as_str(), row["corrupt"].as_str()), ("0", "0"), "{row:?}");
    }
    let relays_by_fmtp: u64 = rows
        .iter()
        .filter(|row| row["tier"] == "relay" && row["software"] == "ldm7")
        .map(|row| row["fmtp"].parse::<u64>().expect("a count"))
        .sum();
    assert!(relays_by_fmtp > 0, "the relays received by FMTP: {rows:?}");
}

/// The CSV's rows as maps from column to value.
fn csv_rows(path: &Path) -> Vec<std::collections::HashMap<String, String>> {
    let text = std::fs::read_to_string(path).expect("read the CSV");
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("a header").split(',').collect();
    lines.map(|line| header.iter().map(|h| h.to_string()).zip(line.split(',').map(str::to_owned)).collect()).collect()
}
