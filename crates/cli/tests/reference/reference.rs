//! ldm7 and Unidata LDM 6.15 feeding each other on loopback, both ways, when a reference build
//! is at hand (`LDM_REF_BIN` = its `bin/`, built by `../shared/tools/build-reference-ldm.sh`);
//! skipped with a message otherwise. The bytes every downstream holds are compared with the
//! files inserted upstream, in order.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ldm7_testkit::{skip, wait_until};

const LDM7: &str = env!("CARGO_BIN_EXE_ldm7");
const LOCAL: &str = r"^((localhost|loopback)|(127\.0\.0\.1\.?))$";
const PRODUCTS: usize = 200;

fn reference_bin() -> Option<PathBuf> {
    match std::env::var_os("LDM_REF_BIN") {
        Some(bin) if Path::new(&bin).join("ldmd").is_file() => Some(PathBuf::from(bin)),
        Some(bin) => {
            panic!("LDM_REF_BIN={} holds no ldmd: point it at a reference build's bin/", Path::new(&bin).display())
        }
        None => {
            skip(
                "LDM_REF_BIN is not set (a Unidata LDM 6.15 build's bin/, see ../shared/tools/build-reference-ldm.sh)",
            );
            None
        }
    }
}

fn ok(command: &mut Command) -> Vec<u8> {
    let output = command.stdin(Stdio::null()).output().expect("run");
    assert!(output.status.success(), "{command:?}: {}", String::from_utf8_lossy(&output.stderr));
    output.stdout
}

/// Server in its own process group, killed with it on drop.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let group = nix::unistd::Pid::from_raw(-(self.0.id() as i32));
        let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.0.wait();
    }
}

fn spawn(mut command: Command, dir: &Path) -> Server {
    use std::os::unix::process::CommandExt;
    let log = std::fs::File::create(dir.join("log")).expect("log");
    Server(command.current_dir(dir).process_group(0).stdout(Stdio::null()).stderr(log).spawn().expect("start"))
}

fn ldm7_server(dir: &Path, port: u16) -> Server {
    let mut command = Command::new(LDM7);
    command.args(["serve", "-c", "ldmd.conf", "-q", "q.pq", "--state-dir", "state", "-P", &port.to_string()]);
    spawn(command, dir)
}

fn ldmd(bin: &Path, dir: &Path, port: u16) -> Server {
    let mut command = Command::new(bin.join("ldmd"));
    command.args(["-l", "-", "-q", "q.pq", "-P", &port.to_string(), "ldmd.conf"]);
    spawn(command, dir)
}

fn reference_count(bin: &Path, queue: &Path) -> usize {
    let output = Command::new(bin.join("pqmon")).args(["-l", "-", "-q"]).arg(queue).output().expect("pqmon");
    let text = String::from_utf8_lossy(&output.stderr);
    text.lines()
        .rev()
        .filter(|line| line.contains("pqmon.c:main"))
        .filter_map(|line| line.split_once(" NOTE ").and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok()))
        .next()
        .unwrap_or(0)
}

fn ldm7_count(queue: &Path) -> usize {
    let output = Command::new(LDM7).args(["queue", "info", "--json", "--path"]).arg(queue).output().expect("info");
    let text = String::from_utf8_lossy(&output.stdout);
    text.split("\"product_count\":")
        .nth(1)
        .and_then(|field| field.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
        .unwrap_or(0)
}

/// Product files p000…p199 of varied sizes; returns their names and all their bytes in order.
fn products(dir: &Path) -> (Vec<String>, Vec<u8>) {
    std::fs::create_dir_all(dir).expect("mkdir");
    let mut names = Vec::new();
    let mut all = Vec::new();
    for index in 0..PRODUCTS {
        let size = 1 + (index * 7919) % 300_000;
        let data: Vec<u8> = (0..size).map(|byte| (byte * 31 + index * 17) as u8).collect();
        let name = format!("p{index:03}");
        std::fs::write(dir.join(&name), &data).expect("write");
        all.extend_from_slice(&data);
        names.push(name);
    }
    (names, all)
}

/// An upstream and a downstream directory with their ldmd.conf, and the product files.
struct Pair {
    names: Vec<String>,
    all: Vec<u8>,
    up: PathBuf,
    down: PathBuf,
    up_port: u16,
}

impl Pair {
    fn new(root: &Path) -> Self {
        let (names, all) = products(&root.join("files"));
        let (up, down) = (root.join("up"), root.join("down"));
        for dir in [&up, &down] {
            std::fs::create_dir_all(dir).expect("mkdir");
        }
        let up_port = ldm7_io::free_port().expect("a free port");
        std::fs::write(up.join("ldmd.conf"), format!("ALLOW ANY {LOCAL} .*\n")).expect("conf");
        std::fs::write(down.join("ldmd.conf"), format!("REQUEST ANY \".*\" 127.0.0.1:{up_port}\n")).expect("conf");
        Self { names, all, up, down, up_port }
    }
}

#[test]
fn ldm7_upstream_feeds_a_unidata_ldm_downstream() {
    let Some(bin) = reference_bin() else { return };
    let root = tempfile::tempdir().expect("tempdir");
    let Pair { names, all, up, down, up_port } = Pair::new(root.path());
    ok(Command::new(LDM7).args(["queue", "create", "--size", "200M", "--path"]).arg(up.join("q.pq")));
    ok(Command::new(LDM7)
        .args(["insert", "-f", "EXP", "-q"])
        .arg(up.join("q.pq"))
        .args(&names)
        .current_dir(root.path().join("files")));
    ok(Command::new(bin.join("pqcreate")).args(["-l", "-", "-c", "-s", "200M", "-q"]).arg(down.join("q.pq")));
    let _upstream = ldm7_server(&up, up_port);
    wait_until(Duration::from_secs(30), "the ldm7 upstream listens", || {
        std::net::TcpStream::connect(("127.0.0.1", up_port)).ok().map(|_| ())
    });
    let _downstream = ldmd(&bin, &down, ldm7_io::free_port().expect("a free port"));
    wait_until(Duration::from_secs(60), "the LDM downstream holds every product", || {
        (reference_count(&bin, &down.join("q.pq")) >= PRODUCTS).then_some(())
    });
    let held = ok(Command::new(bin.join("pqcat")).args(["-l", "-", "-q"]).arg(down.join("q.pq")));
    assert!(held == all, "the LDM downstream's products differ from the files");
}

#[test]
fn unidata_ldm_upstream_feeds_an_ldm7_downstream() {
    let Some(bin) = reference_bin() else { return };
    let root = tempfile::tempdir().expect("tempdir");
    let Pair { names, all, up, down, up_port } = Pair::new(root.path());
    ok(Command::new(bin.join("pqcreate")).args(["-l", "-", "-c", "-s", "200M", "-q"]).arg(up.join("q.pq")));
    ok(Command::new(bin.join("pqinsert"))
        .args(["-l", "/dev/null", "-f", "EXP", "-q"])
        .arg(up.join("q.pq"))
        .args(&names)
        .current_dir(root.path().join("files")));
    ok(Command::new(LDM7).args(["queue", "create", "--size", "200M", "--path"]).arg(down.join("q.pq")));
    let _upstream = ldmd(&bin, &up, up_port);
    wait_until(Duration::from_secs(30), "the LDM upstream listens", || {
        std::net::TcpStream::connect(("127.0.0.1", up_port)).ok().map(|_| ())
    });
    let _downstream = ldm7_server(&down, ldm7_io::free_port().expect("a free port"));
    wait_until(Duration::from_secs(60), "the ldm7 downstream holds every product", || {
        (ldm7_count(&down.join("q.pq")) >= PRODUCTS).then_some(())
    });
    let held = ok(Command::new(LDM7).args(["cat", "-q"]).arg(down.join("q.pq")));
    assert!(held == all, "the ldm7 downstream's products differ from the files");
}
