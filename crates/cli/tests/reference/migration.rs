//! An LDM site moved to ldm7 (`LDM_REF_BIN`; skipped without it): a Unidata LDM 6.15 home — its
//! registry, an ldmd.conf with EXEC entries for pqact and rtstats and a REQUEST of a reference
//! upstream, a pqact.conf, a scour.conf — is imported with `ldm7 import`, started with `ldm7
//! admin start`, fed by the reference upstream, and files the 500-product feed exactly as the
//! reference site did (identical trees); `ldm7 admin check` passes and `ldm7 admin stop` stops
//! it. A second import, of the home after the reference ran, carries its REQUEST's resume point:
//! that site gets only what came after.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use ldm7_testkit::{skip, wait_until};

const LDM7: &str = env!("CARGO_BIN_EXE_ldm7");
const LOCAL: &str = r"^((localhost|loopback)|(127\.0\.0\.1\.?))$";
const PRODUCTS: usize = 500;

fn reference_bin() -> Option<PathBuf> {
    match std::env::var_os("LDM_REF_BIN") {
        Some(bin) if Path::new(&bin).join("ldmd").is_file() => Some(PathBuf::from(bin)),
        Some(bin) => panic!("LDM_REF_BIN={} holds no ldmd", Path::new(&bin).display()),
        None => {
            skip(
                "LDM_REF_BIN is not set (a Unidata LDM 6.15 build's bin/, see ../shared/tools/build-reference-ldm.sh)",
            );
            None
        }
    }
}

fn run(command: &mut Command) -> Output {
    command.stdin(Stdio::null()).output().expect("run")
}

fn ok(command: &mut Command) -> String {
    let output = run(command);
    assert!(
        output.status.success(),
        "{command:?}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A process group killed on drop (a reference ldmd and its children).
struct Group(Child);

impl Group {
    fn spawn(command: &mut Command, log: &Path) -> Self {
        use std::os::unix::process::CommandExt;
        let log = std::fs::File::create(log).expect("log");
        Self(command.process_group(0).stdin(Stdio::null()).stdout(Stdio::null()).stderr(log).spawn().expect("spawn"))
    }

    /// SIGTERM to the group, as ldmadmin stop; waits for the server.
    fn stop(&mut self) {
        let group = nix::unistd::Pid::from_raw(-(self.0.id() as i32));
        let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGTERM);
        let _ = self.0.wait();
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let group = nix::unistd::Pid::from_raw(-(self.0.id() as i32));
        let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.0.wait();
    }
}

/// `ldm7 admin` of a site, stopped on drop if it still runs.
struct Ldm7Site {
    settings: PathBuf,
}

impl Ldm7Site {
    fn admin(&self, args: &[&str]) -> Output {
        run(Command::new(LDM7).arg("admin").arg("--settings").arg(&self.settings).args(args))
    }

    fn admin_ok(&self, args: &[&str]) -> String {
        let output = self.admin(args);
        assert!(
            output.status.success(),
            "ldm7 admin {args:?}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }
}

impl Drop for Ldm7Site {
    fn drop(&mut self) {
        let _ = self.admin(&["stop"]);
    }
}

/// Writes the products (three kinds of identifier, sizes from 1 byte to 100 kB) into `dir`;
/// returns their names in order.
fn products(dir: &Path, first: usize, count: usize) -> Vec<String> {
    std::fs::create_dir_all(dir).expect("mkdir");
    (first..first + count)
        .map(|index| {
            let name = format!("MIGRATE.{}{index:04}", ['A', 'B', 'C'][index % 3]);
            let size = 1 + (index * 7919) % 100_000;
            let data: Vec<u8> = (0..size).map(|byte| (byte * 31 + index * 17) as u8).collect();
            std::fs::write(dir.join(&name), data).expect("write");
            name
        })
        .collect()
}

/// Every file under `dir`: relative path → bytes.
fn tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, files: &mut BTreeMap<String, Vec<u8>>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(root, &path, files);
            } else {
                let relative = path.strip_prefix(root).expect("under root").display().to_string();
                files.insert(relative, std::fs::read(&path).expect("read"));
            }
        }
    }
    let mut files = BTreeMap::new();
    walk(dir, dir, &mut files);
    files
}

/// The files pqact writes for the products (see PQACT_CONF): one per product, and A's appended.
fn expected_files(names: &[String]) -> usize {
    names.len() + 1
}

/// Decoded files: products A and B by kind, C by its first digit, and every A appended to one
/// file (the order of arrival matters).
const PQACT_CONF: &str = "# The migration test's actions.\n\
EXP\t^MIGRATE\\.([AB])([0-9]+)$\n\tFILE\t-close\tfeed/\\1/\\2.dat\n\
EXP\t^MIGRATE\\.C([0-9])([0-9]+)$\n\tFILE\t-close\tfeed/c/\\1/\\2\n\
EXP\t^MIGRATE\\.A\n\tSTDIOFILE\t-close\tall-a.log\n";

const SCOUR_CONF: &str = "# Keep decoded files two days (directories under the data directory).\nfeed\t2\n";

/// An LDM home as ldmadmin runs one, with its registry naming its own paths (its programs read
/// it through `LDM_REGISTRY_DIR`): EXEC "pqact" takes its queue, configuration and data
/// directory from it.
fn ldm_home(home: &Path, installed_registry: &Path, port: u16, up_port: u16, stats_port: u16) {
    for dir in ["etc", "var/queues", "var/data", "var/logs"] {
        std::fs::create_dir_all(home.join(dir)).expect("mkdir");
    }
    // The installed registry, with this home's paths and port (the rest as installed).
    let mut registry = std::fs::read_to_string(installed_registry).expect("the reference's registry.xml");
    let installed_home = installed_registry.parent().and_then(Path::parent).expect("LDMHOME").display().to_string();
    registry = registry.replace(&installed_home, &home.display().to_string());
    registry = registry.replace("<port>388</port>", &format!("<port>{port}</port>"));
    registry = registry.replace("<size>500M</size>", "<size>200M</size>");
    // A fully qualified name: LDM 6.15's rtstats crashes at start (SIGSEGV) when the registry's
    // is not (it logs a warning before its logging is set up), and ldmd ends with a crashed child.
    let (before, after) = registry.split_once("<hostname>").expect("a <hostname>");
    let after = &after[after.find("</hostname>").expect("</hostname>")..];
    registry = format!("{before}<hostname>ldm.site.test{after}");
    std::fs::write(home.join("etc/registry.xml"), registry).expect("registry");
    std::fs::write(
        home.join("etc/ldmd.conf"),
        format!(
            "# The site's feed from its upstream, its decoder and its statistics.\n\
             EXEC\t\"pqact\"\n\
             EXEC\t\"rtstats -h 127.0.0.1 -P {stats_port}\"\n\
             REQUEST\tEXP\t\"^MIGRATE\"\t127.0.0.1:{up_port}\n\
             ALLOW\tANY\t{LOCAL}\n"
        ),
    )
    .expect("ldmd.conf");
    std::fs::write(home.join("etc/pqact.conf"), PQACT_CONF).expect("pqact.conf");
    std::fs::write(home.join("etc/scour.conf"), SCOUR_CONF).expect("scour.conf");
}

fn count_files(dir: &Path) -> usize {
    tree(dir).len()
}

#[test]
fn an_imported_ldm_home_files_the_feed_as_the_reference_did() {
    let Some(bin) = reference_bin() else { return };
    let installed_registry = bin.parent().expect("LDMHOME").join("etc/registry.xml");
    let root = tempfile::tempdir().expect("tempdir");
    let root = root.path();

    // The reference upstream, with the 500-product feed.
    let up = root.join("upstream");
    std::fs::create_dir_all(&up).expect("mkdir");
    let up_port = ldm7_io::free_port().expect("a free port");
    std::fs::write(up.join("ldmd.conf"), format!("ALLOW ANY {LOCAL} .*\n")).expect("conf");
    ok(Command::new(bin.join("pqcreate")).args(["-l", "-", "-c", "-s", "200M", "-q"]).arg(up.join("q.pq")));
    let files = root.join("files");
    let names = products(&files, 0, PRODUCTS);
    ok(Command::new(bin.join("pqinsert"))
        .args(["-l", "/dev/null", "-f", "EXP", "-q"])
        .arg(up.join("q.pq"))
        .args(&names)
        .current_dir(&files));
    let mut upstream = Group::spawn(
        Command::new(bin.join("ldmd"))
            .args(["-l", "-", "-q", "q.pq", "-P", &up_port.to_string(), "ldmd.conf"])
            .current_dir(&up),
        &up.join("log"),
    );
    wait_until(Duration::from_secs(30), "the reference upstream listens", || {
        std::net::TcpStream::connect(("127.0.0.1", up_port)).ok().map(|_| ())
    });

    // The LDM site, imported before it ever ran (a copy taken at once).
    let ldm = root.join("ldm");
    let ldm_port = ldm7_io::free_port().expect("a free port");
    // The statistics host both sites' rtstats report to (an ldm7 server accepting them).
    let stats = root.join("stats");
    std::fs::create_dir_all(&stats).expect("mkdir");
    let stats_port = ldm7_io::free_port().expect("a free port");
    std::fs::write(stats.join("ldmd.conf"), format!("ACCEPT EXP ^rtstats- {LOCAL}\n")).expect("conf");
    ok(Command::new(LDM7).args(["queue", "create", "--size", "10M", "--path"]).arg(stats.join("q.pq")));
    let _stats_host = Group::spawn(
        Command::new(LDM7)
            .args(["serve", "-c", "ldmd.conf", "-q", "q.pq", "-P", &stats_port.to_string()])
            .current_dir(&stats),
        &stats.join("log"),
    );
    ldm_home(&ldm, &installed_registry, ldm_port, up_port, stats_port);
    let migrated = root.join("ldm7");
    let import =
        |home: &Path| ok(Command::new(LDM7).arg("import").arg(&ldm).arg("--to").arg(home).env_remove("LDM7_HOME"));
    let report = import(&migrated);
    assert!(report.contains("runs ldm7's rtstats"), "{report}");
    assert!(report.contains("/queue/size 200M"), "{report}");
    assert!(import(&migrated).contains("written: nothing"), "a second import changes nothing");

    // The migrated site's clock is checked against a local time server; an edited ldm7.toml is
    // kept by a later import.
    let settings = migrated.join("etc/ldm7.toml");
    let text = std::fs::read_to_string(&settings).expect("ldm7.toml");
    let text = text.replace(
        "time_servers = [\"us.pool.ntp.org\"]",
        &format!("time_servers = [\"{}\"]", ldm7_testkit::sntp::time_server(0.0)),
    );
    let text =
        text.replace(&format!("port = {ldm_port}"), &format!("port = {}", ldm7_io::free_port().expect("a port")));
    // Decoded files go to the new home's tree, beside the reference's, to compare them.
    let text = text.replace(&format!("datadir = \"{}\"", ldm.join("var/data").display()), "datadir = \"var/data\"");
    std::fs::write(&settings, text).expect("edit ldm7.toml");
    assert!(import(&migrated).contains("kept"), "an edited ldm7.toml is kept");

    // The reference site files the feed.
    ok(Command::new(bin.join("pqcreate"))
        .args(["-l", "-", "-c", "-s", "200M", "-q"])
        .arg(ldm.join("var/queues/ldm.pq")));
    let mut reference = Group::spawn(
        Command::new(bin.join("ldmd"))
            .args(["-l", "-", "-q", "var/queues/ldm.pq", "-P", &ldm_port.to_string(), "etc/ldmd.conf"])
            .current_dir(&ldm)
            // As ldmadmin runs it: LDM's programs on the PATH for the EXEC entries, and the
            // site's own registry (its queue, pqact configuration and data directory).
            .env("PATH", format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default()))
            .env("LDM_REGISTRY_DIR", ldm.join("etc"))
            .env("LDMHOME", &ldm),
        &ldm.join("var/logs/ldmd.log"),
    );
    let expected = expected_files(&names);
    wait_until(Duration::from_secs(120), "the reference site files every product", || {
        (count_files(&ldm.join("var/data")) >= expected).then_some(())
    });
    // pqact appends to all-a.log as the products come: settled when no file changes.
    let settled = |dir: &Path| {
        let mut last = tree(dir);
        wait_until(Duration::from_secs(60), "the files to settle", || {
            std::thread::sleep(Duration::from_millis(500)); // Nothing signals the last write of pqact.
            let now = tree(dir);
            let same = now == last;
            last = now;
            same.then_some(())
        });
        last
    };
    let reference_tree = settled(&ldm.join("var/data"));
    // Its rtstats reports once a minute or so (its first report goes before any product).
    let reports = |version: &str| {
        let pattern = format!("^rtstats-{version}/ldm.site.test/EXP/");
        let output = run(Command::new(LDM7).args(["cat", "-p", &pattern, "-q"]).arg(stats.join("q.pq")));
        String::from_utf8_lossy(&output.stdout).lines().map(str::to_owned).collect::<Vec<_>>()
    };
    wait_until(Duration::from_secs(120), "the reference's rtstats report at the statistics host", || {
        (!reports("6.15.0").is_empty()).then_some(())
    });
    reference.stop();

    // The migrated site: its queue made, started.
    let site = Ldm7Site { settings: settings.clone() };
    site.admin_ok(&["mkqueue"]);
    let started = site.admin_ok(&["start"]);
    assert!(started.contains("the server runs"), "{started}");
    assert_eq!(site.admin(&["start"]).status.code(), Some(1), "a second start is refused");
    wait_until(Duration::from_secs(120), "the migrated site files every product", || {
        (count_files(&migrated.join("var/data")) >= expected).then_some(())
    });
    let migrated_tree = settled(&migrated.join("var/data"));
    assert_eq!(migrated_tree.len(), reference_tree.len(), "{:?}", migrated_tree.keys().collect::<Vec<_>>());
    for (name, bytes) in &reference_tree {
        assert!(migrated_tree.get(name) == Some(bytes), "{name} differs from the reference's");
    }
    let check = site.admin(&["check"]);
    let said = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "ldm7 admin check: {said}{}", String::from_utf8_lossy(&check.stderr));
    assert!(said.contains("the clock is"), "{said}");
    site.admin_ok(&["pqactcheck"]);
    // scour from cron: nothing is two days old.
    site.admin_ok(&["scour"]);
    assert_eq!(tree(&migrated.join("var/data")).len(), reference_tree.len(), "scour removed young files");
    assert!(site.admin_ok(&["pqactHUP"]).contains("pqact"));
    let log = std::fs::read_to_string(migrated.join("var/logs/ldmd.log")).expect("log");
    assert!(log.contains(" ldmd[") && log.contains(" pqact["), "{log}");
    // Both sites' rtstats reported to the statistics host: LDM's and ldm7's, alike.
    let ldm7_version = ldm7_metrics::rtstats::reporter_version();
    wait_until(Duration::from_secs(60), "the migrated site's rtstats report", || {
        (!reports(&ldm7_version).is_empty()).then_some(())
    });
    for line in reports("6.15.0").iter().chain(&reports(&ldm7_version)) {
        let stats = ldm7_metrics::RtStats::parse(line.as_bytes()).expect("an rtstats line");
        assert_eq!((stats.host.as_str(), stats.feed.as_str()), ("ldm.site.test", "EXP"), "{line}");
        assert!(stats.products >= 1 && stats.products <= PRODUCTS as u64, "{line}");
    }
    assert!(site.admin_ok(&["stop"]).contains("stopped"));
    assert_eq!(site.admin(&["isrunning"]).status.code(), Some(1));

    // The LDM home after its run, imported again: its REQUEST resumes where the reference's
    // ldmd stopped, so the new site gets only the products inserted after.
    let resumed = root.join("ldm7-resumed");
    let report = import(&resumed);
    assert!(report.contains("resumes after product"), "{report}");
    let settings = resumed.join("etc/ldm7.toml");
    let text = std::fs::read_to_string(&settings)
        .expect("ldm7.toml")
        .replace("time_servers = [\"us.pool.ntp.org\"]", "time_servers = []");
    let text =
        text.replace(&format!("port = {ldm_port}"), &format!("port = {}", ldm7_io::free_port().expect("a port")));
    let text = text.replace(&format!("datadir = \"{}\"", ldm.join("var/data").display()), "datadir = \"var/data\"");
    std::fs::write(&settings, text).expect("edit ldm7.toml");
    let site = Ldm7Site { settings };
    site.admin_ok(&["mkqueue"]);
    site.admin_ok(&["start"]);
    let later = products(&files, PRODUCTS, 9);
    ok(Command::new(bin.join("pqinsert"))
        .args(["-l", "/dev/null", "-f", "EXP", "-q"])
        .arg(up.join("q.pq"))
        .args(&later)
        .current_dir(&files));
    // Nine products: three of each kind, the A's also appended.
    wait_until(Duration::from_secs(60), "the resumed site files the new products", || {
        (count_files(&resumed.join("var/data")) >= 10).then_some(())
    });
    let resumed_tree = settled(&resumed.join("var/data"));
    assert_eq!(resumed_tree.len(), 10, "only the products after the resume point: {:?}", resumed_tree.keys());
    site.admin_ok(&["stop"]);
    upstream.stop();
}
