//! One `ldm7 serve` process of the test bed: its directory holds the queue `q.pq`, `ldmd.conf`,
//! `ldm7.toml` (when given), the state directory `state/`, the log `log` (`-v -l log`: one line
//! per product) and `stderr` (whatever the process prints before its logging is set up). It
//! runs in a lab host's namespace (`ip netns exec`, which execs, so the child's pid is the
//! server's) or in the current one (on a port of its own: [`ServerConfig::local`]).
//!
//! The one runner of `ldm7 serve` for everything that starts servers to watch them work: the
//! lab tests, the loopback tests of the command (`crates/cli/tests/cli/support.rs` wraps it),
//! the demo and the benchmarks.
//!
//! Invariant: at most one process per [`Server`]; dropping it kills the process.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use ldm7_pq::{Capacity, Queue};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::records::{ProductRecord, read_records};
use crate::{Result, TestbedError, io_error, tail, wait_for};

/// How long a server may take to listen after it starts.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a server may take to drain and exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// Lines of the log shown when a server misbehaves.
const TAIL_LINES: usize = 30;

/// What a server is made of.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Its name (also the name of its directory under the root given to [`Server::create`]).
    pub name: String,
    /// The namespace it runs in (`None`: the current one).
    pub netns: Option<String>,
    /// The queue's capacity.
    pub capacity: Capacity,
    /// The text of `ldmd.conf`.
    pub ldmd_conf: String,
    /// The text of `ldm7.toml` (`None`: no settings file).
    pub settings: Option<String>,
    /// The port it listens on (388 in a lab host: each host has its own namespace).
    pub port: u16,
    /// Further arguments of `ldm7 serve`.
    pub extra_args: Vec<String>,
    /// Environment variables set for it (e.g. systemd's `NOTIFY_SOCKET`).
    pub env: Vec<(String, String)>,
}

impl ServerConfig {
    /// A server called `name` in namespace `netns`, on port 388, with a queue of `capacity`.
    pub fn new(name: &str, netns: Option<String>, capacity: Capacity, ldmd_conf: &str) -> Self {
        Self {
            name: name.to_string(),
            netns,
            capacity,
            ldmd_conf: ldmd_conf.to_string(),
            settings: None,
            port: 388,
            extra_args: Vec::new(),
            env: Vec::new(),
        }
    }

    /// A server called `name` in the current namespace, listening on `port` of every address.
    pub fn local(name: &str, port: u16, capacity: Capacity, ldmd_conf: &str) -> Self {
        Self { port, ..Self::new(name, None, capacity, ldmd_conf) }
    }

    /// With these further arguments of `ldm7 serve` (after the ones every server gets).
    pub fn args<S: AsRef<str>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.extra_args.extend(args.into_iter().map(|arg| arg.as_ref().to_string()));
        self
    }

    /// With this `ldm7.toml`.
    pub fn settings(mut self, text: &str) -> Self {
        self.settings = Some(text.to_string());
        self
    }
}

/// One `ldm7 serve` (see the module documentation).
#[derive(Debug)]
pub struct Server {
    config: ServerConfig,
    exe: PathBuf,
    dir: PathBuf,
    child: Option<Child>,
}

impl Server {
    /// Makes the server's directory `root/<name>`: creates its queue (replacing one left
    /// there) and writes its configuration files. Does not start it.
    pub fn create(exe: &Path, root: &Path, config: ServerConfig) -> Result<Server> {
        let dir = root.join(&config.name);
        std::fs::create_dir_all(&dir).map_err(io_error(format!("create {}", dir.display())))?;
        let queue = dir.join("q.pq");
        Queue::create(&queue, config.capacity, true)
            .map_err(|error| TestbedError::Queue { path: queue.clone(), message: error.to_string() })?;
        write(&dir.join("ldmd.conf"), &config.ldmd_conf)?;
        if let Some(settings) = &config.settings {
            write(&dir.join("ldm7.toml"), settings)?;
        }
        Ok(Server { config, exe: exe.to_path_buf(), dir, child: None })
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its queue.
    pub fn queue_path(&self) -> PathBuf {
        self.dir.join("q.pq")
    }

    /// Its namespace.
    pub fn netns(&self) -> Option<&str> {
        self.config.netns.as_deref()
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.config.port
    }

    /// Replaces its further arguments of `ldm7 serve` (used at the next start).
    pub fn set_extra_args(&mut self, args: Vec<String>) {
        self.config.extra_args = args;
    }

    /// Environment variables of the process, from the next start on.
    pub fn set_env(&mut self, env: Vec<(String, String)>) {
        self.config.env = env;
    }

    /// Rewrites its `ldmd.conf` (read at the next start).
    pub fn set_ldmd_conf(&mut self, text: &str) -> Result<()> {
        self.config.ldmd_conf = text.to_string();
        write(&self.dir.join("ldmd.conf"), text)
    }

    /// Starts it and waits until it listens on its port. Fails when it is running already, when
    /// it exits first, or after 30 s.
    pub fn start(&mut self) -> Result<()> {
        if self.child.is_some() {
            return Err(self.failure("start asked while it is running"));
        }
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("stderr"))
            .map_err(io_error(format!("open {}/stderr", self.dir.display())))?;
        let mut command = match &self.config.netns {
            Some(netns) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", netns]).arg(&self.exe);
                command
            }
            None => Command::new(&self.exe),
        };
        command
            .args(["serve", "-c", "ldmd.conf", "-q", "q.pq", "--state-dir", "state", "-v", "-l", "log"])
            .args(["-P", &self.config.port.to_string()])
            .args(&self.config.extra_args)
            .envs(self.config.env.iter().map(|(name, value)| (name, value)))
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        let child = command.spawn().map_err(io_error(format!("start {} serve", self.exe.display())))?;
        let pid = child.id();
        self.child = Some(child);
        let port = self.config.port;
        wait_for(START_TIMEOUT, &format!("{} to listen on port {port}", self.config.name), || {
            if let Some(status) = self.try_wait()? {
                return Err(self.failure(&format!("exited with {status} while starting")));
            }
            Ok(listening(pid, port).then_some(()))
        })
    }

    /// Sends SIGTERM and waits for the process to exit; it must drain and exit with status 0.
    pub fn stop(&mut self) -> Result<()> {
        let Some(pid) = self.pid() else { return Ok(()) };
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        let status = wait_for(STOP_TIMEOUT, &format!("{} to exit on SIGTERM", self.config.name), || self.try_wait());
        self.child = None;
        match status {
            Ok(status) if status.success() => Ok(()),
            Ok(status) => Err(self.failure(&format!("exited with {status} on SIGTERM"))),
            Err(error) => {
                self.kill();
                Err(error)
            }
        }
    }

    /// Sends SIGTERM and returns at once ([`wait_exit`](Self::wait_exit) reaps it): to stop
    /// several servers at the same time.
    pub fn terminate(&self) {
        if let Some(pid) = self.pid() {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        }
    }

    /// Waits until the process has exited, at most until `deadline`, then kills it; its exit
    /// status when it exited by itself.
    pub fn wait_exit(&mut self, deadline: std::time::Instant) -> Option<ExitStatus> {
        self.child.take().and_then(|mut child| wait_or_kill(&mut child, deadline))
    }

    /// Its exit status once the process has exited on its own (`None` while it runs, and when it
    /// was not started or was stopped by this value).
    pub fn exited(&mut self) -> Result<Option<ExitStatus>> {
        self.try_wait()
    }

    /// Kills the process with SIGKILL (no drain) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// [`stop`](Self::stop), then [`start`](Self::start).
    pub fn restart(&mut self) -> Result<()> {
        self.stop()?;
        self.start()
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process runs (it has not exited).
    pub fn is_running(&mut self) -> bool {
        matches!(self.try_wait(), Ok(None)) && self.child.is_some()
    }

    /// Its CPU time so far (user + system, seconds), while it runs.
    pub fn cpu_seconds(&self) -> Option<f64> {
        self.pid().and_then(crate::measure::cpu_seconds)
    }

    /// Its log (empty before it wrote one).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    /// What it printed on standard error before its log was set up (and any panic).
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr")).unwrap_or_default()
    }

    /// Products in its queue.
    pub fn product_count(&self) -> Result<u64> {
        let path = self.queue_path();
        let queue = Queue::open(&path).map_err(|error| queue_error(&path, error))?;
        let stats = queue.stats().map_err(|error| queue_error(&path, error))?;
        Ok(stats.product_count)
    }

    /// Waits until its queue holds at least `count` products. Fails early when a process that
    /// was started has exited.
    pub fn wait_for_products(&mut self, count: u64, timeout: Duration) -> Result<()> {
        let what = format!("{} to hold {count} products", self.config.name);
        let path = self.queue_path();
        let queue = Queue::open(&path).map_err(|error| queue_error(&path, error))?;
        let result = wait_for(timeout, &what, || {
            if let Some(status) = self.try_wait()? {
                return Err(self.failure(&format!("exited with {status}")));
            }
            let have = queue.stats().map_err(|error| queue_error(&path, error))?.product_count;
            Ok((have >= count).then_some(()))
        });
        result.map_err(|error| match error {
            TestbedError::Timeout { .. } => {
                let have = queue.stats().map(|stats| stats.product_count).unwrap_or(0);
                self.failure(&format!("{error} (it holds {have})"))
            }
            other => other,
        })
    }

    /// Waits until its log contains `needle`.
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) -> Result<()> {
        let what = format!("{:?} in the log of {}", needle, self.config.name);
        wait_for(timeout, &what, || Ok(self.log().contains(needle).then_some(())))
            .map_err(|error| self.failure(&error.to_string()))
    }

    /// Its queue and log read into one record per product (see [`crate::records`]).
    pub fn records(&self) -> Result<Vec<ProductRecord>> {
        read_records(&self.queue_path(), Some(&self.log()))
    }

    fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        match self.child.as_mut() {
            None => Ok(None),
            Some(child) => {
                let status = child.try_wait().map_err(io_error(format!("wait for {}", self.config.name)))?;
                if status.is_some() {
                    self.child = None;
                }
                Ok(status)
            }
        }
    }

    fn failure(&self, what: &str) -> TestbedError {
        let log_tail = format!("{}\n{}", tail(&self.log(), TAIL_LINES), tail(&self.stderr(), 5));
        TestbedError::Server { server: self.config.name.clone(), what: what.to_string(), log_tail }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits for `child` to exit until `deadline`, then kills it; its exit status when it exited by
/// itself. (A server's [`Server::wait_exit`], and the demo's other processes.)
pub(crate) fn wait_or_kill(child: &mut Child, deadline: std::time::Instant) -> Option<ExitStatus> {
    while std::time::Instant::now() < deadline {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(io_error(format!("write {}", path.display())))
}

fn queue_error(path: &Path, error: impl std::fmt::Display) -> TestbedError {
    TestbedError::Queue { path: path.to_path_buf(), message: error.to_string() }
}

/// Whether a TCP socket listens on `port` in the namespace of process `pid`: its
/// `/proc/PID/net/tcp{,6}` (state `0A`), so no probe connection counts as a client.
pub(crate) fn listening(pid: u32, port: u16) -> bool {
    let local_port = format!(":{port:04X}");
    ["tcp", "tcp6"].iter().any(|table| {
        std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default().lines().skip(1).any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.len() > 3 && fields[1].ends_with(&local_port) && fields[3] == "0A"
        })
    })
}
