//! `ldm7 plan` as a user runs it: a hand-computed trace, the real NGRID hour, a queue, bad input.

use std::path::Path;
use std::process::{Command, Output};

use ldm7_testkit::shared_data_or_skip;

const LDM7: &str = env!("CARGO_BIN_EXE_ldm7");

fn ldm7(args: &[&str]) -> Output {
    Command::new(LDM7).args(args).output().expect("run ldm7")
}

fn ok(args: &[&str]) -> String {
    let output = ldm7(args);
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "ldm7 {args:?}: {text}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn path(path: &Path) -> &str {
    path.to_str().expect("utf-8")
}

#[test]
fn a_hand_computed_trace_gives_its_backlogs_and_carries_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = dir.path().join("t.txt");
    // 1000 B/s: 3000 B at 0 s and 0.5 s, 10 B at 1.5 s (one-second intervals).
    std::fs::write(&trace, "3000 20240101000000.000\n3000 20240101000000.500\n10 20240101000001.500\n").expect("write");
    let csv = dir.path().join("plan.csv");
    let args =
        ["--interval", "1s", "--wait", "100s", "--rate-min", "8000", "--rate-max", "8000", "--rate-step", "1000"];
    let mut command = vec!["plan", "--trace", path(&trace), "--csv", path(&csv)];
    command.extend(args);
    let summary = ok(&command);
    assert!(summary.contains("3 products"), "{summary}");
    let csv = std::fs::read_to_string(&csv).expect("csv");
    let rows: Vec<Vec<&str>> = csv.lines().skip(1).map(|line| line.split(',').collect()).collect();
    assert_eq!(rows.len(), 2, "{csv}");
    // products, bytes, rate, buffer, backlog carried in.
    let pick = |row: &Vec<&str>| {
        (row[3].to_owned(), row[4].to_owned(), row[6].to_owned(), row[8].to_owned(), row[10].to_owned())
    };
    assert_eq!(pick(&rows[0]), ("2".into(), "6000".into(), "8000".into(), "2500".into(), "0".into()));
    assert_eq!(pick(&rows[1]), ("1".into(), "10".into(), "8000".into(), "4500".into(), "5000".into()));
}

#[test]
fn the_ngrid_hour_needs_a_buffer_that_falls_steeply_with_the_rate() {
    let Some(trace) = shared_data_or_skip("traces/unidata_ldm_NGRID_1hr_20150615T00Z.txt") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let png = dir.path().join("plan.png");
    let summary = ok(&["plan", "--trace", path(&trace), "--interval", "10min", "--wait", "1s", "--png", path(&png)]);
    assert!(summary.contains("28166 products"), "{summary}");
    // The buffer-against-rate table: MB at 20, 40, 60, 100, 200, 500 Mbit/s and 1 Gbit/s.
    let table: Vec<f64> = summary
        .lines()
        .skip_while(|line| !line.starts_with("the whole span at one rate"))
        .skip(2)
        .take_while(|line| line.contains("bit/s"))
        .map(|line| line.split_whitespace().nth(2).expect("buffer").parse().expect("a number"))
        .collect();
    assert_eq!(table.len(), 7, "{summary}");
    assert!(table.windows(2).all(|pair| pair[1] <= pair[0]), "{table:?}");
    // As in the research (300 MB at 20 Mbit/s to 20 MB at 500): steeply down to the largest
    // product's size (53.9 MB in this hour), which any rate must hold behind it.
    assert!(table[0] > 200.0 && table[5] < 60.0, "{table:?}");
    // Six ten-minute intervals (and the product at the hour's last instant), each with a rate.
    let intervals = summary.lines().filter(|line| line.starts_with('[')).count();
    assert_eq!(intervals, 7, "{summary}");
    assert!(!summary.contains("cannot meet W"), "{summary}");
    let image = std::fs::read(&png).expect("png");
    assert_eq!(&image[..8], b"\x89PNG\r\n\x1a\n");
}

#[test]
fn a_queue_is_planned_from_its_products() {
    let Some(trace) = shared_data_or_skip("traces/unidata_ldm_NEXRAD3_500prod_20150911T2259Z.txt") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let queue = dir.path().join("q.pq");
    ok(&["queue", "create", "-q", path(&queue), "--size", "50M", "--slots", "1000"]);
    ok(&["insert", "-q", path(&queue), "--replay", path(&trace), "--speed", "0", "--feed", "NEXRAD3"]);
    let summary = ok(&["plan", "-q", path(&queue), "-f", "NEXRAD3", "--wait", "1s"]);
    assert!(summary.contains("NEXRAD3 of queue") && summary.contains("500 products"), "{summary}");
    let none = ldm7(&["plan", "-q", path(&queue), "-f", "NGRID"]);
    assert_eq!(none.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&none.stderr).contains("no products to plan for"));
}

#[test]
fn bad_settings_and_inputs_are_refused_clearly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = dir.path().join("t.txt");
    std::fs::write(&trace, "3000 20240101000000.000\n").expect("write");
    let refused = |args: &[&str], needle: &str| {
        let output = ldm7(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    };
    refused(&["plan", "--trace", path(&trace), "--rate-min", "2G", "--rate-max", "1G"], "below the smallest rate");
    refused(&["plan", "--trace", path(&trace), "--interval", "0s"], "holding interval");
    refused(&["plan", "--trace", path(&dir.path().join("absent.txt"))], "cannot read trace");
    refused(&["plan"], "--trace");
}

#[test]
fn the_repair_budget_and_the_receive_buffer_are_planned() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = dir.path().join("t.txt");
    // 8 Mbit/s of data: 1 MB a second for ten seconds.
    let lines: String = (0..10).map(|second| format!("1000000 2024010100000{second}.000\n")).collect();
    std::fs::write(&trace, lines).expect("write");
    let base = ["plan", "--trace", path(&trace), "--interval", "1h", "--wait", "1s", "--rate-step", "1000000"];
    let parity = ok(&[&base[..], &["--subscribers", "570", "--loss", "0.01"]].concat());
    assert!(parity.contains("570 subscribers at 1% loss, parity 992/32: 2.10% of the data"), "{parity}");
    assert!(parity.contains("HTB repair share (lab retx_share) 0.021"), "{parity}");
    let unicast = ok(&[&base[..], &["--subscribers", "570", "--parity", "off"]].concat());
    assert!(unicast.contains("unicast retransmissions: 570.00% of the data"), "{unicast}");
    let buffer = ok(&[&base[..], &["--receive-gap", "2s", "--rate-max", "400M", "--rate-min", "400M"]].concat());
    // 400 Mbit/s × 1.0x for 2 s: about 100 MB.
    assert!(buffer.contains("each subscriber's buffer for a 2s gap at 4"), "{buffer}");
    // A plan that meets W says nothing of the ceiling; one that cannot (W = 1 s under a
    // ceiling of 4 Mbit/s, where a 1 MB product takes 2 s) says its repair figures are for it.
    assert!(!parity.contains("for the ceiling"), "{parity}");
    let unmet = ok(&[&base[..], &["--rate-max", "4M"]].concat());
    assert!(unmet.contains("cannot meet W") && unmet.contains("for the ceiling, as W is not met"), "{unmet}");
    let bad = ldm7(&[&base[..], &["--parity", "100/3"]].concat());
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("power of two"), "{}", String::from_utf8_lossy(&bad.stderr));
}
