//! A PostgreSQL server of a test's own: `initdb` into a temporary directory and `postgres` on a
//! free loopback port, stopped and removed when dropped. Uses the distribution's binaries
//! (`/usr/lib/postgresql/<version>/bin`); as root, the server runs as the `postgres` user (it
//! refuses root). Absent binaries skip the test with a message.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running server; dropped: stopped and its directory removed.
#[derive(Debug)]
pub struct Postgres {
    child: Child,
    dir: PathBuf,
    port: u16,
}

fn bin_dir() -> Option<PathBuf> {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| entry.ok().map(|entry| entry.path().join("bin")))
        .filter(|bin| bin.join("initdb").is_file() && bin.join("postgres").is_file())
        .collect();
    versions.sort();
    versions.pop()
}

/// `program` as the `postgres` user when we are root (the server refuses root), else as us.
fn as_server_user(program: &Path) -> Command {
    use std::os::unix::process::CommandExt;
    let mut command = Command::new(program);
    if crate::is_root() {
        let id = |flag: &str| -> u32 {
            let output = Command::new("id").args([flag, "postgres"]).output().expect("id postgres");
            String::from_utf8_lossy(&output.stdout).trim().parse().expect("the postgres user's ids")
        };
        command.uid(id("-u")).gid(id("-g"));
    }
    command
}

impl Postgres {
    /// Starts a server, or skips (returns `None`) when PostgreSQL is not installed.
    pub fn start_or_skip() -> Option<Self> {
        let Some(bin) = bin_dir() else {
            crate::skip("PostgreSQL is not installed (the distribution's postgresql package)");
            return None;
        };
        let dir = std::env::temp_dir().join(format!("ldm7-pg-{}-{}", std::process::id(), crate::unique()));
        std::fs::create_dir_all(&dir).expect("PostgreSQL directory");
        if crate::is_root() {
            let status = Command::new("chown").args(["-R", "postgres:postgres"]).arg(&dir).status().expect("chown");
            assert!(status.success(), "chown the PostgreSQL directory");
        }
        let data = dir.join("data");
        let output = as_server_user(&bin.join("initdb"))
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync", "-D"])
            .arg(&data)
            .output()
            .expect("run initdb");
        assert!(output.status.success(), "initdb: {}", String::from_utf8_lossy(&output.stderr));
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
        let child = as_server_user(&bin.join("postgres"))
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-k"])
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start postgres");
        let server = Self { child, dir, port };
        crate::wait_until(Duration::from_secs(30), "PostgreSQL to accept connections", || {
            std::net::TcpStream::connect(("127.0.0.1", port)).ok()
        });
        // Accepting TCP is not yet accepting logins: give the start-up a moment to finish.
        std::thread::sleep(Duration::from_millis(300));
        Some(server)
    }

    /// A URL for the `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // SIGINT: a fast shutdown; SIGKILL if it has not ended in 10 s.
        let _ = Command::new("kill").args(["-INT", &self.child.id().to_string()]).status();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while matches!(self.child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
