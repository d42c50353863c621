//! FMTP across real network namespaces (root): a publisher and four subscribers on a Linux
//! bridge built by `ldm7 lab`; two subscribers lose 5% of what arrives (iptables `statistic`).
//! Every product reaches every subscriber intact. Skips with a message when not root.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

const LDM7: &str = env!("CARGO_BIN_EXE_ldm7");

/// What the lab runs (skipped with a message where one is missing).
const LAB_TOOLS: &[&str] = &["ip", "tc", "iptables", "vde_switch", "wirefilter"];

fn run(args: &[&str]) -> Output {
    Command::new(LDM7).args(args).output().expect("run ldm7")
}

/// Takes the lab down even when the test fails.
struct Lab(String);

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = run(&["lab", "down", "--name", &self.0]);
    }
}

fn address(lab: &str, host: &str, interface: &str) -> String {
    let output = run(&["lab", "exec", host, "--name", lab, "--", "ip", "-4", "-o", "addr", "show", "dev", interface]);
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let cidr = text.split_whitespace().skip_while(|word| *word != "inet").nth(1).unwrap_or_else(|| panic!("{text}"));
    cidr.split('/').next().expect("address").to_owned()
}

#[test]
fn four_subscribers_two_lossy_all_products_intact() {
    if !ldm7_testkit::skip_unless_root_and_tools("four_subscribers_two_lossy_all_products_intact", LAB_TOOLS) {
        return;
    }
    let _lab = ldm7_testkit::lab_lock();
    let Some(trace) = ldm7_testkit::shared_data_or_skip("traces/unidata_ldm_NEXRAD3_500prod_20150911T2259Z.txt") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let name = format!("f3t{}", std::process::id() % 1000);
    let spec = format!(
        r#"name = "{name}"
[[hosts]]
name = "pub"
[[hosts]]
name = "r1"
loss_percent = 5.0
[[hosts]]
name = "r2"
loss_percent = 5.0
[[hosts]]
name = "r3"
[[hosts]]
name = "r4"
[[feeds]]
name = "feed"
publisher = "pub"
subscribers = ["r1", "r2", "r3", "r4"]
rate = "200 Mbit/s"
buffer = "4 MB"
"#
    );
    let spec_path = dir.path().join("lab.toml");
    std::fs::write(&spec_path, spec).expect("write spec");
    let up = run(&["lab", "up", "--spec", &spec_path.display().to_string()]);
    assert!(up.status.success(), "lab up: {}", String::from_utf8_lossy(&up.stderr));
    let _lab = Lab(name.clone());
    let publisher = address(&name, "pub", "feed");
    let group = "239.255.80.1:38800";
    let retx = format!("{publisher}:38801");
    let sender = Command::new(LDM7)
        .args(["lab", "exec", "pub", "--name", &name, "--", LDM7, "fmtp", "send", "--group", group])
        .args(["--iface", &publisher, "--retx-listen", &retx, "--rate", "150M", "--receivers", "4"])
        .args(["--replay", &trace.display().to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sender");
    // No pause: a receiver started before the sender listens retries its connection.
    let receivers: Vec<(PathBuf, std::process::Child)> = ["r1", "r2", "r3", "r4"]
        .iter()
        .map(|host| {
            let out = dir.path().join(host);
            let iface = address(&name, host, "feed");
            let child = Command::new(LDM7)
                .args(["lab", "exec", host, "--name", &name, "--", LDM7, "fmtp", "recv", "--group", group])
                .args(["--iface", &iface, "--sender", &retx, "--count", "500", "--timeout", "60"])
                .args(["--out", &out.display().to_string()])
                .stdout(Stdio::piped())
                .spawn()
                .expect("start receiver");
            (out, child)
        })
        .collect();
    let mut repaired = 0;
    for (index, (out, child)) in receivers.into_iter().enumerate() {
        let output = child.wait_with_output().expect("receiver");
        let summary = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(output.status.success() && summary.contains("delivered 500, missed 0"), "r{}: {summary}", index + 1);
        if !summary.contains("retransmitted blocks 0,") {
            repaired += 1;
        }
        let count = std::fs::read_dir(&out).expect("out").count();
        assert_eq!(count, 500, "r{}", index + 1);
    }
    assert!(repaired >= 2, "the two lossy subscribers needed repairs");
    let output = sender.wait_with_output().expect("sender");
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
