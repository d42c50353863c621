//! `ldm7 import` and `ldm7 admin` (and `ldmadmin`, the same binary under LDM's name) as an LDM
//! operator uses them, on an LDM home written here (its registry, an ldmd.conf with EXEC
//! entries, pqact and scour configurations, a REQUEST's `.info` resume file in LDM's naming and
//! format): the import's report, a second import that changes nothing, `start` refused without
//! a queue then running, pqact filing inserted products, `check` passing then failing with what
//! to do, `pqactcheck`, `pqactHUP`, `newlog`, `stop`, `clean`, `vetqueuesize` on a queue too
//! small for the maximum latency, and LDM's subcommands that do not apply answered as such. The
//! migration against a real LDM 6.15 site is `reference::migration`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use ldm7_testkit::wait_until;

use crate::support::LOCAL;

const LDM7: &str = env!("CARGO_BIN_EXE_ldm7");

/// The LDM home's registry, as an installation writes it (paths under `{home}`).
const REGISTRY: &str = "<?xml version=\"1.0\"?>\n<registry>\n  <delete-info-files>0</delete-info-files>\n  \
<hostname>ldm.site.test</hostname>\n  <insertion-check-interval>300</insertion-check-interval>\n  <check-time>\n    \
<enabled>1</enabled>\n    <limit>10</limit>\n    <ntpdate>\n      <command>ntpdate</command>\n      \
<servers>us.pool.ntp.org</servers>\n      <timeout>5</timeout>\n    </ntpdate>\n  </check-time>\n  <log>\n    \
<count>3</count>\n    <file>{home}/var/logs/ldmd.log</file>\n    <rotate>1</rotate>\n  </log>\n  <pqact>\n    \
<config-path>{home}/etc/pqact.conf</config-path>\n    <datadir-path>{home}/var/data</datadir-path>\n  </pqact>\n  \
<queue>\n    <path>{home}/var/queues/ldm.pq</path>\n    <size>20M</size>\n    <slots>default</slots>\n  </queue>\n  \
<scour>\n    <config-path>{home}/etc/scour.conf</config-path>\n  </scour>\n  <server>\n    \
<config-path>{home}/etc/ldmd.conf</config-path>\n    <ip-addr>0.0.0.0</ip-addr>\n    <max-clients>256</max-clients>\n    \
<max-latency>3600</max-latency>\n    <port>388</port>\n    <time-offset>3600</time-offset>\n    \
<enable-anti-DOS>TRUE</enable-anti-DOS>\n  </server>\n  <metrics>\n    <count>4</count>\n  </metrics>\n</registry>\n";

const PQACT_CONF: &str = "EXP\t^ADMIN\\.(.*)\n\tFILE\t-close\tadmin/\\1\n";

fn run(command: &mut Command) -> Output {
    command.stdin(Stdio::null()).env_remove("LDM7_HOME").env_remove("LDM7_SETTINGS").output().expect("run")
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// The ldm7 site made by the import, driven through `ldmadmin` (a link in its bin/).
struct Site {
    home: PathBuf,
}

impl Site {
    fn admin(&self, args: &[&str]) -> Output {
        run(Command::new(self.home.join("bin/ldmadmin"))
            .arg("--settings")
            .arg(self.home.join("etc/ldm7.toml"))
            .args(args))
    }

    fn ok(&self, args: &[&str]) -> String {
        let output = self.admin(args);
        assert!(output.status.success(), "ldmadmin {args:?}: {}", text(&output));
        text(&output)
    }

    fn fails(&self, args: &[&str]) -> String {
        let output = self.admin(args);
        assert_eq!(output.status.code(), Some(1), "ldmadmin {args:?}: {}", text(&output));
        text(&output)
    }

    fn settings(&self, edit: impl FnOnce(String) -> String) {
        let path = self.home.join("etc/ldm7.toml");
        let edited = edit(std::fs::read_to_string(&path).expect("ldm7.toml"));
        std::fs::write(path, edited).expect("write ldm7.toml");
    }

    fn insert(&self, names: &[&str], size: usize) {
        let dir = self.home.join("incoming");
        std::fs::create_dir_all(&dir).expect("mkdir");
        for name in names {
            // Distinct contents (the signature is their MD5).
            let content: Vec<u8> = name.bytes().cycle().take(size.max(name.len())).collect();
            std::fs::write(dir.join(name), content).expect("write");
        }
        let output = run(Command::new(LDM7)
            .args(["insert", "-f", "EXP", "-q"])
            .arg(self.home.join("var/queues/ldm.pq"))
            .args(names)
            .current_dir(&dir));
        assert!(output.status.success(), "insert: {}", text(&output));
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        let _ = self.admin(&["stop"]);
    }
}

/// An LDM home at `ldm`: registry, ldmd.conf, pqact.conf, scour.conf and the REQUEST's resume file.
fn ldm_home(ldm: &Path) {
    std::fs::create_dir_all(ldm.join("etc")).expect("mkdir");
    std::fs::write(ldm.join("etc/registry.xml"), REGISTRY.replace("{home}", &ldm.display().to_string()))
        .expect("registry");
    std::fs::write(
        ldm.join("etc/ldmd.conf"),
        format!(
            "EXEC\t\"pqact\"\nEXEC\t\"rtstats -h rtstats.unidata.ucar.edu\"\n\
             REQUEST\tEXP\t\"^ADMIN\"\tupstream.example.edu\nALLOW\tANY\t{LOCAL}\n"
        ),
    )
    .expect("ldmd.conf");
    std::fs::write(ldm.join("etc/pqact.conf"), PQACT_CONF).expect("pqact.conf");
    std::fs::write(ldm.join("etc/scour.conf"), "admin\t2\n").expect("scour.conf");
    // The REQUEST's resume point, named and written as LDM 6.15 does.
    let exp = exp_bits();
    let name = ldm7_admin::import::ldm_info_name("upstream.example.edu", 388, &[(exp, "^ADMIN")]);
    std::fs::write(
        ldm.join(name),
        "# Information on the last, successfully-received product\n\
         {20261128080000.000000,EXP,7,{9,localhost},12,{8,ADMIN.x1},0123456789abcdef0123456789abcdef}\n",
    )
    .expect(".info");
}

fn exp_bits() -> u32 {
    "EXP".parse::<ldm7_types::FeedType>().expect("EXP").bits()
}

#[test]
fn an_imported_home_is_run_checked_and_stopped_with_ldmadmin() {
    let root = tempfile::tempdir().expect("tempdir");
    let (ldm, home) = (root.path().join("ldm"), root.path().join("ldm7"));
    ldm_home(&ldm);
    let import = || run(Command::new(LDM7).arg("import").arg(&ldm).arg("--to").arg(&home));
    let output = import();
    let report = text(&output);
    assert!(output.status.success(), "{report}");
    for said in [
        "/queue/size 20M",
        "/server/enable-anti-DOS TRUE → [ldm6] one_feeder_per_host",
        "EXEC \"rtstats -h rtstats.unidata.ucar.edu\": runs ldm7's rtstats",
        "resumes after product 0123456789abcdef0123456789abcdef",
        "/metrics/count 4: ldm7 serves Prometheus metrics",
        "/server/ip-addr 0.0.0.0 → listen \"::\" (every address, IPv6 and IPv4",
    ] {
        assert!(report.contains(said), "the report lacks {said:?}: {report}");
    }
    let ldm7_info = ldm7_admin::import::ldm7_info_name("upstream.example.edu", 388, &[(exp_bits(), "^ADMIN")]);
    assert_eq!(
        std::fs::read_to_string(home.join(ldm7_info)).expect("the resume point under ldm7's name"),
        "0123456789abcdef0123456789abcdef\n"
    );
    assert!(text(&import()).contains("written: nothing"), "a second import changes nothing");

    let site = Site { home: home.clone() };
    let port = ldm7_io::free_port().expect("a free port");
    let time_server = ldm7_testkit::sntp::time_server(0.0);
    site.settings(|toml| {
        toml.replace("port = 388", &format!("port = {port}"))
            .replace("[\"us.pool.ntp.org\"]", &format!("[\"{time_server}\"]"))
    });
    // No upstream here: the REQUEST is taken out; products are inserted locally.
    std::fs::write(home.join("etc/ldmd.conf"), format!("EXEC\t\"pqact\"\nALLOW\tANY\t{LOCAL}\n")).expect("ldmd.conf");
    let said = site.fails(&["start"]);
    assert!(said.contains("ldm7 admin mkqueue"), "start without a queue says what to do: {said}");
    site.ok(&["mkqueue"]);
    assert!(site.ok(&["start"]).contains("the server runs"));
    assert!(site.fails(&["start"]).contains("the server is running"), "a second start is refused");
    assert_eq!(site.admin(&["isrunning"]).status.code(), Some(0));
    let said = site.fails(&["check"]);
    assert!(said.contains("PROBLEM  insertion") && said.contains("no product"), "{said}");

    // pqact files what arrives; check passes.
    site.insert(&["ADMIN.one", "ADMIN.two"], 1000);
    let data = ldm.join("var/data/admin");
    wait_until(Duration::from_secs(30), "pqact files the products", || {
        (data.join("one").is_file() && data.join("two").is_file()).then_some(())
    });
    let said = site.ok(&["check"]);
    for finding in ["ok       running", "ok       time", "ok       insertion", "ok       queue size"] {
        assert!(said.contains(finding), "{said}");
    }
    assert!(site.ok(&["pqactcheck"]).contains("1 entries"));
    std::fs::write(home.join("etc/pqact.conf"), "EXP\t^ADMIN\n\tNOSUCHACTION\tx\n").expect("break pqact.conf");
    let said = site.fails(&["pqactcheck"]);
    assert!(said.contains("pqact.conf:2") || said.contains("pqact.conf:1"), "pqactcheck names file and line: {said}");
    std::fs::write(home.join("etc/pqact.conf"), PQACT_CONF).expect("restore pqact.conf");

    // newlog: the old file numbered, the server writing to a new one.
    site.ok(&["newlog"]);
    assert!(home.join("var/logs/ldmd.log.1").is_file());
    // pqact reopens the file too: its line on SIGHUP goes to the new one.
    site.ok(&["pqactHUP"]);
    wait_until(Duration::from_secs(30), "pqact's line in the new log file", || {
        std::fs::read_to_string(home.join("var/logs/ldmd.log")).ok().filter(|log| log.contains(" pqact["))
    });
    let log = std::fs::read_to_string(home.join("var/logs/ldmd.log.1")).expect("log");
    assert!(log.contains(" ldmd[") && log.contains(" pqact["), "the programs name themselves: {log}");

    assert!(site.ok(&["stop"]).contains("stopped"));
    assert_eq!(site.admin(&["isrunning"]).status.code(), Some(1));
    assert!(site.fails(&["stop"]).contains("not running"));
    std::fs::write(home.join("ldmd.pid"), "999999999\n").expect("a stale pid file");
    assert!(site.ok(&["clean"]).contains("removed"));
    assert!(site.ok(&["config"]).contains("queue.size"));
    site.ok(&["scour"]);
    assert!(data.join("one").is_file(), "scour keeps files younger than two days");

    // A queue that keeps products less than the maximum latency: the fix, with numbers.
    site.settings(|toml| toml.replace("size = \"20M\"", "size = \"1M\""));
    site.ok(&["mkqueue", "-c"]);
    let names: Vec<String> = (0..40).map(|index| format!("ADMIN.fill{index}")).collect();
    site.insert(&names.iter().map(String::as_str).collect::<Vec<_>>(), 100_000);
    let said = site.fails(&["vetqueuesize"]);
    assert!(said.contains("PROBLEM") && said.contains("Fix: set [queue] size"), "{said}");
    site.ok(&["delqueue"]);
    assert!(!home.join("var/queues/ldm.pq").exists());

    for command in ["mksurfqueue", "printmetrics", "plotmetrics", "updategempaktables"] {
        assert!(site.fails(&[command]).contains("not applicable"), "{command}");
    }
    assert!(site.ok(&["usage"]).contains("vetqueuesize"));
}

#[test]
fn a_clock_off_by_more_than_the_limit_fails_check_with_what_to_do() {
    let root = tempfile::tempdir().expect("tempdir");
    let home = root.path().join("site");
    std::fs::create_dir_all(home.join("etc")).expect("mkdir");
    let fast = ldm7_testkit::sntp::time_server(120.0);
    std::fs::write(home.join("etc/ldm7.toml"), format!("[check]\ntime_servers = [\"{fast}\"]\ntime_limit = \"10s\"\n"))
        .expect("settings");
    let output = run(Command::new(LDM7).args(["admin", "--settings"]).arg(home.join("etc/ldm7.toml")).arg("checktime"));
    let said = text(&output);
    assert_eq!(output.status.code(), Some(1), "{said}");
    assert!(said.contains("more than the 10 s limit") && said.contains("synchronize the clock"), "{said}");
    let missing = run(Command::new(LDM7).args(["admin", "--settings"]).arg(root.path().join("none.toml")).arg("check"));
    assert_eq!(missing.status.code(), Some(1));
    assert!(text(&missing).contains("ldm7 import"), "{}", text(&missing));
}
