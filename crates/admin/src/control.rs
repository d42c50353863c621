//! Starting and stopping the server as `ldmadmin` does: pre-checks, a detached `ldm7 serve`
//! whose command line comes from the site's settings, a pid file, readiness, `stop` by SIGTERM.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ldm7_config::ldmd::Config;
use ldm7_pq::Queue;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::{AdminError, Site};

/// How long `start` waits for the server to listen.
const START_WAIT: Duration = Duration::from_secs(60);

/// How long `stop` waits for the server to drain and exit.
const STOP_WAIT: Duration = Duration::from_secs(60);

/// What `ldm7 admin start` may override (ldmadmin start's flags).
#[derive(Clone, Debug, Default)]
pub struct StartOptions {
    /// `-v`.
    pub verbose: bool,
    /// `-x`.
    pub debug: bool,
    /// `-m`: the maximum latency.
    pub max_latency: Option<Duration>,
    /// `-o`: the time offset.
    pub time_offset: Option<Duration>,
    /// `-q`: the queue.
    pub queue: Option<PathBuf>,
    /// `-M`: the most clients.
    pub max_clients: Option<u32>,
    /// The configuration file (ldmadmin's positional `conf_file`).
    pub config: Option<PathBuf>,
}

impl Site {
    /// The running server's process id: the pid file's, when that process lives.
    pub fn running(&self) -> Option<u32> {
        let text = std::fs::read_to_string(&self.site.server.pid_file).ok()?;
        let pid: u32 = text.trim().parse().ok()?;
        process_lives(pid).then_some(pid)
    }

    /// The pre-checks of `start` (LDM's): no server running, the queue there and whole, ldmd.conf and
    /// every pqact configuration its EXEC entries name parse. The first problem, with its fix.
    pub fn pre_checks(&self, options: &StartOptions) -> Result<(), AdminError> {
        if let Some(pid) = self.running() {
            return Err(AdminError::Running { pid, what: "stop it first (ldm7 admin stop), or restart".into() });
        }
        let queue = options.queue.clone().unwrap_or_else(|| self.site.queue.path.clone());
        // Opening refuses a damaged or foreign queue; reading every product (`queuecheck`)
        // would take minutes on a large queue.
        drop(Queue::open(&queue).map_err(|error| {
            AdminError::PreCheck(format!(
                "{error}: make it with `ldm7 admin mkqueue` (after `ldm7 admin delqueue` if it is damaged)"
            ))
        })?);
        let config = options.config.clone().unwrap_or_else(|| self.site.server.config.clone());
        let parsed = Config::load(&config).map_err(|error| AdminError::PreCheck(format!("{error}")))?;
        for check in crate::pqact::check_execs(self, &parsed) {
            check
                .result
                .map_err(|error| AdminError::PreCheck(format!("the pqact configuration of {}: {error}", check.exec)))?;
        }
        Ok(())
    }

    /// Starts the server in the background after the pre-checks; returns its process id once it
    /// listens. Rotates the log first when the settings say so.
    pub fn start(&self, options: &StartOptions) -> Result<u32, AdminError> {
        self.pre_checks(options)?;
        if let Some(dir) = self.site.log.file.parent() {
            std::fs::create_dir_all(dir).map_err(AdminError::io(dir))?;
        }
        if self.site.log.rotate {
            self.newlog(self.site.log.count)?;
        }
        self.prepare_directories()?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.site.log.file)
            .map_err(AdminError::io(&self.site.log.file))?;
        let mut command = self.serve_command(options);
        let mut child = {
            use std::os::unix::process::CommandExt;
            command
                .process_group(0)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .map_err(|error| AdminError::StartFailed(format!("{}: {error}", self.exe.display())))?
        };
        let pid = child.id();
        let address = self.local_address();
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait().map_err(|error| AdminError::StartFailed(error.to_string()))? {
                return Err(AdminError::StartFailed(format!(
                    "it exited ({status}); its last log lines ({}):\n{}",
                    self.site.log.file.display(),
                    tail(&self.site.log.file, 10)
                )));
            }
            if TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok() {
                break;
            }
            if started.elapsed() > START_WAIT {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
                return Err(AdminError::StartFailed(format!(
                    "it did not listen on {address} within {} s; see {}",
                    START_WAIT.as_secs(),
                    self.site.log.file.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let pid_file = &self.site.server.pid_file;
        if let Some(dir) = pid_file.parent() {
            std::fs::create_dir_all(dir).map_err(AdminError::io(dir))?;
        }
        std::fs::write(pid_file, format!("{pid}\n")).map_err(AdminError::io(pid_file))?;
        Ok(pid)
    }

    /// `ldm7 serve` (as `ldmd`) with the site's settings: the command `start` runs.
    pub fn serve_command(&self, options: &StartOptions) -> Command {
        let site = &self.site;
        // Run as `ldmd` (the binary's classic name for `serve`): its log lines say `ldmd[pid]`,
        // as a site's searches of its log expect.
        let mut command = Command::new(&self.exe);
        std::os::unix::process::CommandExt::arg0(&mut command, "ldmd");
        let config = options.config.clone().unwrap_or_else(|| site.server.config.clone());
        let queue = options.queue.clone().unwrap_or_else(|| site.queue.path.clone());
        let seconds = |duration: Duration| duration.as_secs().to_string();
        command
            .arg("-c")
            .arg(&config)
            .arg("-q")
            .arg(&queue)
            .args(["-P", &site.server.port.to_string(), "-I", &site.server.listen.to_string()])
            .arg("--state-dir")
            .arg(&site.server.state_dir)
            .args(["-o", &seconds(options.time_offset.unwrap_or(site.server.time_offset))])
            .args(["-m", &seconds(options.max_latency.unwrap_or(site.server.max_latency))])
            .args(["--max-clients", &options.max_clients.unwrap_or(site.server.max_clients).to_string()])
            .arg("--settings")
            .arg(&self.settings_file)
            .arg("-l")
            .arg(&site.log.file);
        if let Some(name) = &site.server.hostname {
            command.args(["--stats-name", name]);
        }
        if let Some(metrics) = site.server.metrics {
            command.args(["--metrics", &metrics.to_string()]);
        }
        if let Some(user) = &site.server.user {
            command.args(["--user", user]);
        }
        if options.verbose {
            command.arg("-v");
        }
        if options.debug {
            command.arg("-x");
        }
        // The site's programs (EXEC "pqact", "scour", …) find their defaults through the
        // settings, and the classic names in the home's bin/ and beside the binary.
        let mut path = vec![site.home.join("bin")];
        if let Some(dir) = self.exe.parent() {
            path.push(dir.to_owned());
        }
        path.extend(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()));
        command
            .current_dir(&site.home)
            .env("LDM7_SETTINGS", &self.settings_file)
            .env("LDM7_QUEUE", &queue)
            .env("PATH", std::env::join_paths(path).unwrap_or_default());
        command
    }

    /// Where the server is reached on this host.
    fn local_address(&self) -> SocketAddr {
        // `::` takes IPv4 connections too (and is `0.0.0.0` on a host without IPv6).
        let ip = match self.site.server.listen {
            ip if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            ip => ip,
        };
        SocketAddr::new(ip, self.site.server.port)
    }

    /// Runs the server in the foreground, replacing this process (for a service manager:
    /// systemd's `ExecStart`, whose main process the server then is); writes the pid file first.
    /// Returns only on failure.
    pub fn run_in_foreground(&self, options: &StartOptions) -> AdminError {
        if let Some(pid) = self.running() {
            return AdminError::Running { pid, what: "stop it first".into() };
        }
        if let Err(error) = self.prepare_directories() {
            return error;
        }
        let pid_file = &self.site.server.pid_file;
        if let Err(error) = std::fs::write(
            pid_file,
            format!(
                "{}
",
                std::process::id()
            ),
        ) {
            return AdminError::Io { path: pid_file.clone(), source: error };
        }
        let error = std::os::unix::process::CommandExt::exec(&mut self.serve_command(options));
        let _ = std::fs::remove_file(pid_file);
        AdminError::StartFailed(format!("{}: {error}", self.exe.display()))
    }

    /// The directories the server writes (log, state, data, pid file), made and, when the server
    /// runs as another user, given to it.
    pub fn prepare_directories(&self) -> Result<(), AdminError> {
        let site = &self.site;
        let mut dirs = vec![site.server.state_dir.clone(), site.pqact.datadir.clone()];
        dirs.extend(site.log.file.parent().map(Path::to_path_buf));
        dirs.extend(site.server.pid_file.parent().map(Path::to_path_buf));
        for dir in &dirs {
            std::fs::create_dir_all(dir).map_err(AdminError::io(dir))?;
        }
        self.give_to_user(&dirs)
    }

    /// Makes `paths` (and what directories among them hold) the server user's, when
    /// `[server] user` is set and this runs as root; otherwise does nothing.
    pub fn give_to_user(&self, paths: &[PathBuf]) -> Result<(), AdminError> {
        let Some(user) = &self.site.server.user else { return Ok(()) };
        if !nix::unistd::Uid::effective().is_root() {
            return Ok(());
        }
        let account = nix::unistd::User::from_name(user)
            .map_err(|error| AdminError::Other(format!("user {user}: {error}")))?
            .ok_or_else(|| {
                AdminError::Other(format!("[server] user {user} does not exist: create it (useradd --system {user})"))
            })?;
        for path in paths {
            let mut all = vec![path.clone()];
            if path.is_dir() && path.join("data.mdb").is_file() {
                all.extend(std::fs::read_dir(path).map_err(AdminError::io(path))?.flatten().map(|entry| entry.path()));
            }
            for each in all {
                std::os::unix::fs::chown(&each, Some(account.uid.as_raw()), Some(account.gid.as_raw()))
                    .map_err(AdminError::io(&each))?;
            }
        }
        Ok(())
    }

    /// Stops the running server (SIGTERM: it drains and exits) and removes the pid file;
    /// returns the process id it had.
    pub fn stop(&self) -> Result<u32, AdminError> {
        let Some(pid) = self.running() else {
            return Err(AdminError::NotRunning(format!(
                " (no live process in {})",
                self.site.server.pid_file.display()
            )));
        };
        kill(Pid::from_raw(pid as i32), Signal::SIGTERM)
            .map_err(|error| AdminError::Other(format!("cannot signal the server (pid {pid}): {error}")))?;
        let started = Instant::now();
        while process_lives(pid) {
            if started.elapsed() > STOP_WAIT {
                return Err(AdminError::StopFailed {
                    pid,
                    seconds: STOP_WAIT.as_secs(),
                    log: self.site.log.file.display().to_string(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = std::fs::remove_file(&self.site.server.pid_file);
        Ok(pid)
    }

    /// Rotates the log file: FILE.(count-1) → FILE.count … FILE → FILE.1 (LDM's `newlog`, `-n`
    /// files kept), then tells a running server to reopen it (SIGUSR1).
    pub fn newlog(&self, count: u32) -> Result<(), AdminError> {
        let file = &self.site.log.file;
        match ldm7_io::rotate_numbered(file, count) {
            // No log yet: nothing to rotate.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            rotated => rotated.map_err(AdminError::io(file))?,
        }
        // The server and its EXEC children all write the file (`LDM7_LOG_FILE`): each reopens it.
        if let Some(pid) = self.running() {
            for process in std::iter::once(pid).chain(self.children()) {
                let _ = kill(Pid::from_raw(process as i32), Signal::SIGUSR1);
            }
        }
        Ok(())
    }

    /// After an abnormal end: removes a pid file whose process is gone; returns what it removed.
    pub fn clean(&self) -> Result<Vec<PathBuf>, AdminError> {
        if let Some(pid) = self.running() {
            return Err(AdminError::Running { pid, what: "nothing to clean; stop it first".into() });
        }
        let mut removed = Vec::new();
        let pid_file = &self.site.server.pid_file;
        if pid_file.exists() {
            std::fs::remove_file(pid_file).map_err(AdminError::io(pid_file))?;
            removed.push(pid_file.clone());
        }
        Ok(removed)
    }

    /// The server's children (its EXEC entries' processes).
    pub fn children(&self) -> Vec<u32> {
        let Some(server) = self.running() else { return Vec::new() };
        let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
        entries
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| parent_of(*pid) == Some(server))
            .collect()
    }

    /// The server's children whose program name is `name` (e.g. `pqact`).
    pub fn children_named(&self, name: &str) -> Vec<u32> {
        self.children().into_iter().filter(|pid| program_name(*pid).as_deref() == Some(name)).collect()
    }

    /// `pqactHUP`: SIGHUP to the server's pqact children (they reread their configuration);
    /// returns their process ids.
    pub fn hup_pqact(&self) -> Result<Vec<u32>, AdminError> {
        if self.running().is_none() {
            return Err(AdminError::NotRunning(String::new()));
        }
        let children = self.children_named("pqact");
        for pid in &children {
            let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGHUP);
        }
        Ok(children)
    }
}

pub use ldm7_io::process_lives;

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
}

/// The base name of a process's `argv[0]`.
fn program_name(pid: u32) -> Option<String> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let first = cmdline.split(|byte| *byte == 0).next()?;
    let name = Path::new(std::str::from_utf8(first).ok()?).file_name()?.to_str()?.to_owned();
    Some(name)
}

/// The last `lines` lines of a file.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
