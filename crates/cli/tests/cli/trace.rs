//! `ldm7 trace generate`, `ldm7 trace stats` and `ldm7 plan --idd` as a user runs them: an IDD
//! hour from the workload model, written, read back and summarized; every feed planned.

use std::path::Path;
use std::process::{Command, Output};

const LDM7: &str = env!("CARGO_BIN_EXE_ldm7");

fn ldm7(args: &[&str]) -> Output {
    Command::new(LDM7).args(args).output().expect("run ldm7")
}

fn ok(args: &[&str]) -> (String, String) {
    let output = ldm7(args);
    let (stdout, stderr) =
        (String::from_utf8_lossy(&output.stdout).into_owned(), String::from_utf8_lossy(&output.stderr).into_owned());
    assert!(output.status.success(), "ldm7 {args:?}: {stdout}{stderr}");
    (stdout, stderr)
}

fn path(path: &Path) -> &str {
    path.to_str().expect("utf-8")
}

/// The row of `feed` in `ldm7 trace stats` output, as numbers (the feed name left out).
fn stats_row(stats: &str, feed: &str) -> Vec<f64> {
    let line = stats.lines().find(|line| line.split_whitespace().next() == Some(feed)).unwrap_or_else(|| {
        panic!("no {feed} row in\n{stats}");
    });
    line.split_whitespace().skip(1).filter_map(|field| field.parse().ok()).collect()
}

#[test]
fn a_generated_idd_hour_is_the_model_and_reads_back_as_a_trace() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = dir.path().join("idd.txt");
    let (_, summary) = ok(&["trace", "generate", "--seed", "5", "-o", path(&trace)]);
    assert!(summary.contains("idd2018 set, seed 5"), "{summary}");
    // Same flags, same file.
    let again = dir.path().join("again.txt");
    ok(&["trace", "generate", "--seed", "5", "-o", path(&again)]);
    let text = std::fs::read_to_string(&trace).expect("read");
    assert_eq!(text, std::fs::read_to_string(&again).expect("read"));
    let lines = text.lines().filter(|line| !line.starts_with('#')).count();
    assert!((320_000..540_000).contains(&lines), "{lines} products");
    let mut feeds: Vec<&str> =
        text.lines().filter(|line| !line.starts_with('#')).filter_map(|line| line.split(' ').nth(2)).collect();
    feeds.sort_unstable();
    feeds.dedup();
    assert_eq!(feeds, ["CONDUIT", "DIFAX", "HDS", "IDS|DDPLUS", "NEXRAD2", "NEXRAD3", "NGRID", "NOTHER"]);

    let (stats, _) = ok(&["trace", "stats", path(&trace)]);
    assert!(stats.contains(&format!("{lines} products")), "{stats}");
    // Columns: products, per h, size p10 p25 median p75 p90 p99 mean max, gap p25 median p75 p90.
    // WORKLOAD.md §3.1 model medians and §3.2 model gap medians (at the paper rates; here the
    // 2018 rates, so only the within-burst quartile is compared for gaps).
    for (feed, size_median, gap_p25) in
        [("NEXRAD3", 5_860.0, 0.71), ("NEXRAD2", 37_000.0, 12.6), ("HDS", 7_800.0, 1.34)]
    {
        let row = stats_row(&stats, feed);
        assert!((row[4] / size_median - 1.0).abs() < 0.08, "{feed} median size {}: {stats}", row[4]);
        assert!((row[10] / gap_p25 - 1.0).abs() < 0.25, "{feed} gap p25 {}: {stats}", row[10]);
    }
    let ids = stats_row(&stats, "IDS|DDPLUS");
    assert!((150.0..260.0).contains(&ids[4]), "{stats}");
}

#[test]
fn one_feed_for_a_shorter_stretch_at_a_peak_rate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = dir.path().join("ngrid.txt");
    ok(&[
        "trace",
        "generate",
        "--set",
        "paper",
        "--only",
        "ngrid",
        "--duration",
        "30min",
        "--scale",
        "1.6",
        "--start",
        "20150615000000",
        "-o",
        path(&trace),
    ]);
    let text = std::fs::read_to_string(&trace).expect("read");
    assert!(text.lines().filter(|line| !line.starts_with('#')).all(|line| line.ends_with(" NGRID")));
    assert!(text.lines().nth(2).expect("a product").contains(" 20150615"), "{text:.200}");
    // The planner reads it like any trace.
    let (plan, _) = ok(&["plan", "--trace", path(&trace), "--interval", "10min", "--wait", "1s"]);
    assert!(plan.contains("NGRID of trace ngrid.txt"), "{plan}");
}

#[test]
fn every_feed_of_a_generated_hour_is_planned() {
    let dir = tempfile::tempdir().expect("tempdir");
    let csv = dir.path().join("idd.csv");
    let (plan, _) = ok(&["plan", "--idd", "--set", "paper", "--seed", "3", "--wait", "1s", "--csv", path(&csv)]);
    for feed in ["CONDUIT", "NGRID", "HDS", "NEXRAD2", "NEXRAD3", "IDS|DDPLUS"] {
        assert!(plan.lines().any(|line| line.starts_with(feed)), "{feed}: {plan}");
    }
    let total = plan.lines().find(|line| line.starts_with("all feeds")).expect("a total line");
    let numbers: Vec<f64> = total.split_whitespace().filter_map(|field| field.parse().ok()).collect();
    // ~79,000 products and ~6.4 GB per hour at the paper rates.
    assert!((60_000.0..100_000.0).contains(&numbers[0]), "{total}");
    assert!((4.0..9.0).contains(&numbers[1]), "{total}");
    let csv = std::fs::read_to_string(&csv).expect("csv");
    assert!(csv.starts_with("feed,start_unix_s,"), "{csv}");
    assert_eq!(csv.lines().count(), 1 + 6, "{csv}");

    // One feed: the single-feed summary, with its plot.
    let png = dir.path().join("hds.png");
    let (one, _) = ok(&["plan", "--idd", "--only", "HDS", "--interval", "20min", "--wait", "1s", "--png", path(&png)]);
    assert!(one.contains("HDS of a generated idd2018 stretch"), "{one}");
    assert!(std::fs::metadata(&png).expect("png").len() > 10_000);
}

#[test]
fn bad_model_flags_are_refused_with_the_reason() {
    for (args, expected) in [
        (vec!["trace", "generate", "--only", "FOO"], "feed \"FOO\" is not in the set"),
        (vec!["trace", "generate", "--set", "nope"], "unknown rate set"),
        (vec!["trace", "generate", "--scale", "0"], "--scale 0 must be a number above 0"),
        (vec!["trace", "generate", "--duration", "0"], "is zero"),
        (vec!["plan", "--idd", "--png", "x.png"], "--png draws one feed"),
        (vec!["trace", "stats", "/nonexistent/trace.txt"], "cannot read trace"),
    ] {
        let output = ldm7(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}
