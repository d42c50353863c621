//! The Debian package (`scripts/build-deb`, built here from the test binary): its contents —
//! the binary, LDM's program names as links, man pages generated from the command definitions,
//! the systemd unit, the logrotate file, the configuration under /etc/ldm7 that the binary
//! accepts — and the unit checked by `systemd-analyze verify` where systemd is; the server's
//! systemd protocol (readiness, watchdog) over a real notify socket; binding as root and then
//! running as another user.

use std::io::Read;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use ldm7_testkit::{skip, skip_unless_root, wait_until};

use crate::support::{LOCAL, Node};

const LDM7: &str = env!("CARGO_BIN_EXE_ldm7");

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn ok(command: &mut Command) -> String {
    let output = command.stdin(Stdio::null()).output().expect("run");
    assert!(
        output.status.success(),
        "{command:?}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn the_debian_package_holds_the_binary_its_names_pages_unit_and_configuration() {
    if Command::new("dpkg-deb").arg("--version").output().is_err() {
        skip("dpkg-deb is missing (Debian's dpkg): the package is not built");
        return;
    }
    let out = tempfile::tempdir().expect("tempdir");
    let package = ok(Command::new(workspace().join("scripts/build-deb"))
        .args(["--binary", LDM7, "--compress", "none", "--out"])
        .arg(out.path()));
    let package = PathBuf::from(package.trim());
    assert!(package.is_file(), "{}", package.display());
    let listing = ok(Command::new("dpkg-deb").arg("-c").arg(&package));
    for path in [
        "./usr/bin/ldm7",
        "./usr/bin/pqact -> ldm7",
        "./usr/bin/ldmadmin -> ldm7",
        "./usr/bin/rtstats -> ldm7",
        "./usr/bin/scour -> ldm7",
        "./usr/share/man/man1/ldm7.1.gz",
        "./usr/share/man/man1/ldm7-serve.1.gz",
        "./usr/share/man/man1/ldm7-admin.1.gz",
        "./usr/share/man/man1/pqact.1.gz",
        "./usr/share/man/man1/ldmadmin.1.gz",
        "./lib/systemd/system/ldm7.service",
        "./etc/logrotate.d/ldm7",
        "./etc/ldm7/ldm7.toml",
        "./etc/ldm7/ldmd.conf",
        "./usr/share/doc/ldm7/operations.md",
    ] {
        assert!(listing.contains(path), "the package lacks {path}:\n{listing}");
    }
    assert!(listing.contains("root/root"), "files owned by root: {listing}");
    let control = ok(Command::new("dpkg-deb").arg("-f").arg(&package).args(["Package", "Version", "Depends"]));
    assert!(control.contains("Package: ldm7") && control.contains(env!("CARGO_PKG_VERSION")), "{control}");
    let root = out.path().join("root");
    ok(Command::new("dpkg-deb").arg("-x").arg(&package).arg(&root));
    let conffiles = ok(Command::new("dpkg-deb").arg("-I").arg(&package).arg("conffiles"));
    assert!(conffiles.contains("/etc/ldm7/ldm7.toml"), "{conffiles}");
    let postinst = ok(Command::new("dpkg-deb").arg("-I").arg(&package).arg("postinst"));
    assert!(postinst.contains("useradd --system") && postinst.contains("ldm"), "{postinst}");

    // The configuration it installs is what the binary accepts.
    let settings = root.join("etc/ldm7/ldm7.toml");
    let config = ok(Command::new(LDM7).args(["admin", "--settings"]).arg(&settings).arg("config"));
    assert!(config.contains("/var/lib/ldm7/queues/ldm.pq") && config.contains("/etc/ldm7/ldmd.conf"), "{config}");
    ok(Command::new(LDM7)
        .args(["serve", "--check", "-c"])
        .arg(root.join("etc/ldm7/ldmd.conf"))
        .arg("--settings")
        .arg(&settings));
    ok(Command::new(LDM7).args(["act", "--check"]).arg(root.join("etc/ldm7/pqact.conf")));

    // The unit: notify type, watchdog, the admin's pre-checks and foreground run.
    let unit = std::fs::read_to_string(root.join("lib/systemd/system/ldm7.service")).expect("unit");
    for line in [
        "Type=notify",
        "WatchdogSec=",
        "ExecStartPre=/usr/bin/ldm7 admin",
        "ExecStart=/usr/bin/ldm7 admin --settings /etc/ldm7/ldm7.toml run",
    ] {
        assert!(unit.contains(line), "{line}: {unit}");
    }
    match Command::new("systemd-analyze").arg("--version").output() {
        Ok(_) => {
            // The package is not installed: the unit is verified with the binary's path pointed
            // at the extracted one (systemd checks that its commands exist).
            let verified = out.path().join("verify");
            std::fs::create_dir_all(&verified).expect("mkdir");
            let binary = root.join("usr/bin/ldm7").display().to_string();
            std::fs::write(verified.join("ldm7.service"), unit.replace("/usr/bin/ldm7", &binary)).expect("unit copy");
            let output = Command::new("systemd-analyze")
                .args(["verify", "--man=no"])
                .arg(verified.join("ldm7.service"))
                .output()
                .expect("systemd-analyze");
            let said = String::from_utf8_lossy(&output.stderr);
            assert!(output.status.success() && !said.contains("ldm7.service:"), "systemd-analyze verify: {said}");
        }
        Err(_) => skip("systemd-analyze is missing: the unit file is not verified by systemd"),
    }

    // The man pages are roff, generated from the command definitions.
    let mut page = String::new();
    flate2_free_gunzip(&root.join("usr/share/man/man1/pqact.1.gz"), &mut page);
    assert!(page.contains(".TH PQACT 1") && page.contains("pqact"), "{page}");
}

/// `gzip -dc` of a page (no compression crate in the tests).
fn flate2_free_gunzip(path: &Path, into: &mut String) {
    let mut child = Command::new("gzip").arg("-dc").arg(path).stdout(Stdio::piped()).spawn().expect("gzip");
    child.stdout.take().expect("stdout").read_to_string(into).expect("read");
    assert!(child.wait().expect("wait").success());
}

/// Under systemd (Type=notify) the server says READY=1 once it listens and feeds the watchdog;
/// here a real notify socket stands in for systemd's.
#[test]
fn serve_tells_systemd_it_is_ready_and_feeds_the_watchdog() {
    let root = tempfile::tempdir().expect("tempdir");
    let socket_path = root.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).expect("bind the notify socket");
    socket.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let mut node = Node::new(root.path(), "node", "4M", &format!("ALLOW ANY {LOCAL}\n"));
    node.set_env(vec![
        ("NOTIFY_SOCKET".into(), socket_path.display().to_string()),
        ("WATCHDOG_USEC".into(), "200000".into()),
    ]);
    node.start();
    let mut said = Vec::new();
    let mut buffer = [0u8; 512];
    wait_until(Duration::from_secs(20), "READY=1 and two WATCHDOG=1", || {
        let len = socket.recv(&mut buffer).expect("a notification");
        said.push(String::from_utf8_lossy(&buffer[..len]).into_owned());
        (said.iter().any(|text| text.contains("READY=1"))
            && said.iter().filter(|text| text.contains("WATCHDOG=1")).count() >= 2)
            .then_some(())
    });
    assert!(said.iter().any(|text| text.contains(&format!("listening on [::]:{}", node.port))), "{said:?}");
    node.stop();
}

/// As root, `--user` binds first, then runs as that user, and serves.
#[test]
fn serve_binds_as_root_then_runs_as_the_user() {
    if !skip_unless_root("serve_binds_as_root_then_runs_as_the_user") {
        return;
    }
    let root = tempfile::tempdir().expect("tempdir");
    let mut node = Node::new(root.path(), "node", "4M", &format!("ALLOW ANY {LOCAL}\n"));
    node.set_extra(vec!["--user".into(), "nobody".into()]);
    node.start();
    // The port listens before the server gives root up: its log says when it has.
    node.wait_for_log("Running as user nobody", Duration::from_secs(10));
    let nobody = nix::unistd::User::from_name("nobody").expect("getpwnam").expect("a nobody user");
    let status = std::fs::read_to_string(format!("/proc/{}/status", node.pid())).expect("status");
    let uid_line = status.lines().find(|line| line.starts_with("Uid:")).expect("Uid:");
    assert!(
        uid_line.split_whitespace().skip(1).all(|uid| uid == nobody.uid.to_string()),
        "real, effective, saved and file-system uids are nobody's: {uid_line}"
    );
    // It serves: a notifyme gets its answer.
    let output = Command::new(LDM7)
        .args(["notify", "-h", &format!("127.0.0.1:{}", node.port), "-T", "0.5"])
        .output()
        .expect("notify");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    node.stop();
}
