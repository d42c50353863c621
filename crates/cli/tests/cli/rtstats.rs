//! `ldm7 rtstats` (`rtstats`) reporting a queue's products to a statistics host (an ldm7 server
//! that ACCEPTs them), and a server running one for each host its `[rtstats] hosts` names: the
//! reports are LDM's products (identifier, feedtype, line), read back by the monitor's parser,
//! counting what arrived per hour, feedtype and origin. The line's layout is checked byte for
//! byte against one LDM 6.15's rtstats sent (`ldm7_metrics::rtstats` tests), and LDM's and
//! ldm7's reports at one statistics host in `reference::migration`.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ldm7_metrics::RtStats;
use ldm7_testkit::wait_until;

use crate::support::{LOCAL, Node};

const LDM7: &str = env!("CARGO_BIN_EXE_ldm7");

/// A child killed on drop.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The rtstats reports the statistics host holds: identifier and parsed line, in order.
fn reports(stats: &Node) -> Vec<(String, RtStats)> {
    let idents = Command::new(LDM7)
        .args(["watch", "-p", "^rtstats-", "-o", "3600", "-T", "0.2", "-q", &stats.queue_path()])
        .output()
        .expect("watch");
    let data = Command::new(LDM7).args(["cat", "-p", "^rtstats-", "-q", &stats.queue_path()]).output().expect("cat");
    let idents = String::from_utf8_lossy(&idents.stdout)
        .lines()
        .filter_map(|line| Some(line.rsplit("  ").next()?.to_owned()))
        .collect::<Vec<_>>();
    let lines = String::from_utf8_lossy(&data.stdout).lines().map(|line| format!("{line}\n")).collect::<Vec<_>>();
    idents
        .into_iter()
        .zip(lines)
        .map(|(ident, line)| {
            (ident, RtStats::parse(line.as_bytes()).unwrap_or_else(|error| panic!("{error}: {line:?}")))
        })
        .collect()
}

fn insert(queue: &str, dir: &std::path::Path, names: &[&str]) {
    for name in names {
        std::fs::write(dir.join(name), name.repeat(100)).expect("write");
    }
    let output = Command::new(LDM7)
        .args(["insert", "-f", "NGRID", "-q", queue])
        .args(names)
        .current_dir(dir)
        .output()
        .expect("insert");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

#[test]
fn rtstats_reports_each_feed_and_origin_to_the_statistics_host() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut stats = Node::new(root.path(), "stats", "10M", &format!("ACCEPT EXP ^rtstats- {LOCAL}\n"));
    stats.start();
    let queue = root.path().join("site.pq").display().to_string();
    let created =
        Command::new(LDM7).args(["queue", "create", "--size", "10M", "--path", &queue]).output().expect("create");
    assert!(created.status.success());
    let files = tempfile::tempdir().expect("tempdir");
    insert(&queue, files.path(), &["A1", "A2", "A3"]);
    let rtstats = root.path().join("bin");
    std::fs::create_dir_all(&rtstats).expect("mkdir");
    std::os::unix::fs::symlink(LDM7, rtstats.join("rtstats")).expect("link");
    let _sender = Running(
        Command::new(rtstats.join("rtstats"))
            .args([
                "-h",
                "127.0.0.1",
                "-P",
                &stats.port.to_string(),
                "-q",
                &queue,
                "-o",
                "3600",
                "-H",
                "relay.site.test",
            ])
            .args(["--report-interval", "0.5", "--report-spread", "0"])
            .stderr(Stdio::null())
            .spawn()
            .expect("rtstats"),
    );
    wait_until(Duration::from_secs(30), "a report of the three products", || {
        reports(&stats).into_iter().find(|(_, report)| report.products == 3)
    });
    insert(&queue, files.path(), &["B1", "B2"]);
    let (ident, report) = wait_until(Duration::from_secs(30), "a report of all five", || {
        reports(&stats).into_iter().find(|(_, report)| report.products == 5)
    });
    let origin = report.origin.clone();
    assert_eq!(ident, format!("rtstats-{}/relay.site.test/NGRID/{origin}", ldm7_metrics::rtstats::reporter_version()));
    assert_eq!((report.host.as_str(), report.feed.as_str()), ("relay.site.test", "NGRID"));
    assert_eq!(report.bytes, 5 * 200, "five products of 200 bytes");
    assert!(report.latency_mean_s >= 0.0 && report.latency_max_s >= 0.0);
}

#[test]
fn a_server_reports_to_the_hosts_its_settings_name() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut stats = Node::new(root.path(), "stats", "10M", &format!("ACCEPT EXP ^rtstats- {LOCAL}\n"));
    stats.start();
    let mut site = Node::new(root.path(), "site", "10M", &format!("ALLOW ANY {LOCAL}\n"));
    let settings = site.dir.join("ldm7.toml");
    std::fs::write(&settings, format!("[rtstats]\nhosts = [\"127.0.0.1:{}\"]\n", stats.port)).expect("settings");
    site.set_extra(vec!["--settings".into(), settings.display().to_string()]);
    site.start();
    let files = tempfile::tempdir().expect("tempdir");
    insert(&site.queue_path(), files.path(), &["C1"]);
    let (ident, report) = wait_until(Duration::from_secs(30), "the site's first report", || {
        reports(&stats).into_iter().find(|(_, report)| report.feed == "NGRID")
    });
    assert!(ident.starts_with("rtstats-") && ident.contains("/NGRID/"), "{ident}");
    assert_eq!(report.products, 1);
    // A server killed outright leaves no rtstats behind.
    let child = format!("rtstats -h 127.0.0.1:{}", stats.port);
    let running = || {
        std::fs::read_dir("/proc").expect("/proc").flatten().any(|entry| {
            std::fs::read(entry.path().join("cmdline"))
                .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).replace('\0', " ").trim_end() == child)
        })
    };
    assert!(running(), "the server's rtstats runs");
    site.kill9();
    wait_until(Duration::from_secs(10), "its rtstats to end with it", || (!running()).then_some(()));
}
