//! A daemon's child programs (ldmd.conf's EXEC entries): each started, reaped when it exits,
//! its exit logged with its status (as the reference's ldmd logs each child's end), and started
//! again after a back-off when the daemon is configured to; stopped with SIGTERM.
//!
//! One thread per child, blocked in `wait(2)` on it: a child's exit is seen the moment it
//! happens, with no SIGCHLD handler and no polling. The back-off doubles from one second to the
//! configured longest, and starts over after a child that ran longer than that.

use std::process::{Child, ExitStatus};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::Stop;

/// How to start one child (called again for each restart).
pub type Spawn = Box<dyn FnMut() -> std::io::Result<Child> + Send>;

/// One child program: its name in log lines (its command line) and how to start it.
pub struct ChildProgram {
    /// The command line, as the configuration wrote it (for the log).
    pub name: String,
    /// Starts it.
    pub spawn: Spawn,
}

impl std::fmt::Debug for ChildProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChildProgram").field("name", &self.name).finish_non_exhaustive()
    }
}

/// Whether and how soon a child that exited starts again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Restart {
    /// The longest back-off.
    pub max: Duration,
}

/// The running children (see the module documentation).
#[derive(Debug)]
pub struct Children {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    stop: Stop,
    /// Each child's process id while it runs, under the lock a stop takes: a child is either
    /// started before the stop (and signalled by it) or not at all.
    pids: Mutex<Vec<Option<u32>>>,
}

/// The shortest back-off.
const RESTART_MIN: Duration = Duration::from_secs(1);

impl Children {
    /// Starts every program, each watched by a thread of its own; with `restart`, a program that
    /// exits is started again after a back-off. Fails only when the process is out of file
    /// descriptors or threads.
    pub fn start(programs: Vec<ChildProgram>, restart: Option<Restart>) -> std::io::Result<Self> {
        let shared = Arc::new(Shared { stop: Stop::new()?, pids: Mutex::new(vec![None; programs.len()]) });
        let mut threads = Vec::with_capacity(programs.len());
        for (slot, program) in programs.into_iter().enumerate() {
            let shared = shared.clone();
            let thread = std::thread::Builder::new()
                .name(format!("exec {slot}"))
                .spawn(move || watch(&shared, slot, program, restart))?;
            threads.push(thread);
        }
        Ok(Self { shared, threads })
    }

    /// The process ids of the children running now.
    pub fn pids(&self) -> Vec<u32> {
        self.shared.pids.lock().unwrap_or_else(PoisonError::into_inner).iter().flatten().copied().collect()
    }

    /// Stops: SIGTERM to every running child — to its whole process group when it leads one
    /// (a program started with `process_group(0)`: a shell script's own children go too) —
    /// then waits until each has exited (a child that ignores SIGTERM is waited for, as the
    /// reference's ldmd waits).
    pub fn stop(self) {
        {
            let pids = self.shared.pids.lock().unwrap_or_else(PoisonError::into_inner);
            self.shared.stop.stop();
            for pid in pids.iter().flatten() {
                let pid = nix::unistd::Pid::from_raw(*pid as i32);
                let term = nix::sys::signal::Signal::SIGTERM;
                if nix::sys::signal::killpg(pid, term).is_err() {
                    let _ = nix::sys::signal::kill(pid, term);
                }
            }
        }
        for thread in self.threads {
            let _ = thread.join();
        }
    }
}

/// Runs one program until the stop (or its exit, without restarts).
fn watch(shared: &Shared, slot: usize, mut program: ChildProgram, restart: Option<Restart>) {
    let mut backoff = RESTART_MIN;
    loop {
        let started = Instant::now();
        let mut child = {
            let mut pids = shared.pids.lock().unwrap_or_else(PoisonError::into_inner);
            if shared.stop.is_stopped() {
                return;
            }
            match (program.spawn)() {
                Ok(child) => {
                    pids[slot] = Some(child.id());
                    child
                }
                Err(error) => {
                    tracing::error!("EXEC {}: cannot start it: {error}", program.name);
                    drop(pids);
                    if next_start(shared, &program.name, restart, &mut backoff, started) {
                        continue;
                    }
                    return;
                }
            }
        };
        let pid = child.id();
        tracing::info!("EXEC {}: pid {pid}", program.name);
        let status = child.wait();
        shared.pids.lock().unwrap_or_else(PoisonError::into_inner)[slot] = None;
        let stopping = shared.stop.is_stopped();
        match status {
            Ok(status) => log_exit(&program.name, pid, status, stopping),
            Err(error) => tracing::error!("EXEC {}: waiting for pid {pid}: {error}", program.name),
        }
        if stopping || !next_start(shared, &program.name, restart, &mut backoff, started) {
            return;
        }
    }
}

/// After an exit: whether to start the program again (after the back-off, unless stopped
/// meanwhile); the back-off starts over after a child that ran longer than the longest.
fn next_start(shared: &Shared, name: &str, restart: Option<Restart>, backoff: &mut Duration, started: Instant) -> bool {
    let Some(restart) = restart else { return false };
    if started.elapsed() > restart.max {
        *backoff = RESTART_MIN;
    }
    let delay = *backoff;
    *backoff = (*backoff * 2).min(restart.max);
    tracing::info!("EXEC {name}: starting it again in {} s", delay.as_secs_f64());
    !shared.stop.wait(delay)
}

/// Logs a child's end as the reference's ldmd does: a clean exit as a notice, anything else
/// (a failure status, a signal) as an error, unless the server is stopping and sent the
/// SIGTERM itself.
fn log_exit(name: &str, pid: u32, status: ExitStatus, stopping: bool) {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(0), _) => tracing::info!("EXEC {name}: child {pid} exited with status 0"),
        (Some(code), _) => tracing::error!("EXEC {name}: child {pid} exited with status {code}"),
        (None, Some(signal)) if stopping && signal == nix::libc::SIGTERM => {
            tracing::info!("EXEC {name}: child {pid} terminated by SIGTERM (the server stops)")
        }
        (None, Some(signal)) => {
            let name_of =
                nix::sys::signal::Signal::try_from(signal).map_or_else(|_| signal.to_string(), |s| s.to_string());
            tracing::error!("EXEC {name}: child {pid} terminated by signal {signal} ({name_of})")
        }
        (None, None) => tracing::error!("EXEC {name}: child {pid} ended ({status})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// A shell script in a process group of its own, as the server starts EXEC programs.
    fn program(script: &str) -> ChildProgram {
        use std::os::unix::process::CommandExt;
        let script = script.to_owned();
        ChildProgram {
            name: script.clone(),
            spawn: Box::new(move || Command::new("sh").args(["-c", &script]).process_group(0).spawn()),
        }
    }

    #[test]
    fn an_exited_child_is_started_again_after_the_back_off() {
        let dir = std::env::temp_dir().join(format!("ldm7-children-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let count = dir.join("count");
        let children = Children::start(
            vec![program(&format!("echo run >> {}; exit 3", count.display()))],
            Some(Restart { max: Duration::from_secs(2) }),
        )
        .expect("start");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::fs::read_to_string(&count).unwrap_or_default().lines().count() < 2 {
            assert!(Instant::now() < deadline, "not started again");
            std::thread::sleep(Duration::from_millis(20));
        }
        children.stop();
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn stop_ends_a_running_child_its_own_children_and_its_watcher_at_once() {
        // The shell waits for its `sleep`, which SIGTERM to the shell alone would leave running.
        let children =
            Children::start(vec![program("sleep 600; true")], Some(Restart { max: Duration::from_secs(60) }))
                .expect("start");
        let deadline = Instant::now() + Duration::from_secs(10);
        while children.pids().is_empty() {
            assert!(Instant::now() < deadline, "never started");
            std::thread::yield_now();
        }
        let shell = children.pids()[0];
        let started = Instant::now();
        children.stop();
        assert!(started.elapsed() < Duration::from_secs(10), "stop waited {:?}", started.elapsed());
        // Nothing of the group is left (signal 0 probes the group).
        let group = nix::unistd::Pid::from_raw(shell as i32);
        let deadline = Instant::now() + Duration::from_secs(10);
        while nix::sys::signal::killpg(group, None).is_ok() {
            assert!(Instant::now() < deadline, "the shell's sleep outlived the stop");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
