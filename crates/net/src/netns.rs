//! Named network namespaces (`ip netns`), and running Rust code inside one.
//!
//! A named namespace is a bind mount under `/run/netns/NAME`. [`in_netns`] runs a closure on a
//! fresh thread that has joined the namespace with setns(2): the rest of the process stays where
//! it was, so tests can put a sender in one lab host and a receiver in another.

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::command::{Cmd, CommandError};

/// Where `ip netns` keeps its named namespaces.
pub const NETNS_DIR: &str = "/run/netns";

/// An error entering a namespace.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// The namespace does not exist.
    #[error("network namespace {name:?} does not exist (no {path}); is the lab up?")]
    Missing {
        /// Its name.
        name: String,
        /// Its path.
        path: String,
    },
    /// setns(2) failed.
    #[error("setns into network namespace {name:?} failed: {source}; this needs root (CAP_SYS_ADMIN)")]
    Setns {
        /// Its name.
        name: String,
        /// The errno.
        source: nix::Error,
    },
    /// The closure panicked.
    #[error("the thread running inside network namespace {name:?} panicked")]
    Panicked {
        /// Its name.
        name: String,
    },
}

/// The path of named namespace `name`.
pub fn netns_path(name: &str) -> PathBuf {
    PathBuf::from(NETNS_DIR).join(name)
}

/// True when the named namespace exists.
pub fn exists(name: &str) -> bool {
    netns_path(name).exists()
}

/// The names of all named namespaces on this machine.
pub fn list() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(NETNS_DIR)
        .map(|entries| entries.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

/// Creates named namespace `name` (fails if it exists) and brings its loopback up.
pub fn add(name: &str) -> Result<(), CommandError> {
    Cmd::new("ip").args(["netns", "add", name]).run()?;
    Cmd::new("ip").args(["-n", name, "link", "set", "lo", "up"]).run()?;
    Ok(())
}

/// The directory whose files `ip netns exec NAME` mounts over those of `/etc` (`hosts`, …).
pub fn etc_dir(name: &str) -> PathBuf {
    Path::new("/etc/netns").join(name)
}

/// Gives the processes `ip netns exec` runs in namespace `name` their own `/etc/hosts`.
pub fn write_hosts(name: &str, text: &str) -> std::io::Result<()> {
    let dir = etc_dir(name);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("hosts"), text)
}

/// Kills every process inside namespace `name`, then deletes it and its `/etc/netns/NAME`.
/// Missing is not an error.
pub fn delete(name: &str) -> Result<(), CommandError> {
    let _ = std::fs::remove_dir_all(etc_dir(name));
    if !exists(name) {
        return Ok(());
    }
    kill_processes(name);
    Cmd::new("ip").args(["netns", "del", name]).run()?;
    Ok(())
}

/// The ids of the processes inside namespace `name`.
pub fn pids(name: &str) -> Vec<i32> {
    Cmd::new("ip")
        .args(["netns", "pids", name])
        .run()
        .map(|text| text.split_whitespace().filter_map(|p| p.parse().ok()).collect())
        .unwrap_or_default()
}

/// Sends SIGTERM, then after a grace period SIGKILL, to every process inside namespace `name`.
pub fn kill_processes(name: &str) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let own = std::process::id() as i32;
    let victims: Vec<i32> = pids(name).into_iter().filter(|&p| p != own).collect();
    if victims.is_empty() {
        return;
    }
    for &pid in &victims {
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    }
    for _ in 0..50 {
        if victims.iter().all(|&p| !process_alive(p)) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for &pid in &victims {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

/// True when process `pid` exists and is not a zombie.
pub fn process_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // Field 3, after the parenthesised command name, is the state.
            stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()).is_some_and(|s| s != "Z")
        }
        Err(_) => false,
    }
}

/// Runs `f` on a new thread inside named namespace `name` and returns its result.
pub fn in_netns<T, F>(name: &str, f: F) -> Result<T, NetnsError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let file = open(name)?;
    let owned_name = name.to_string();
    let handle = std::thread::Builder::new()
        .name(format!("netns-{name}"))
        .spawn(move || -> Result<T, NetnsError> {
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|source| NetnsError::Setns { name: owned_name, source })?;
            Ok(f())
        })
        .map_err(|_| NetnsError::Panicked { name: name.to_string() })?;
    handle.join().map_err(|_| NetnsError::Panicked { name: name.to_string() })?
}

/// Spawns `f` on a new thread inside named namespace `name` without waiting for it.
pub fn spawn_in_netns<T, F>(name: &str, f: F) -> Result<std::thread::JoinHandle<Result<T, NetnsError>>, NetnsError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let file = open(name)?;
    let owned_name = name.to_string();
    std::thread::Builder::new()
        .name(format!("netns-{name}"))
        .spawn(move || -> Result<T, NetnsError> {
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|source| NetnsError::Setns { name: owned_name, source })?;
            Ok(f())
        })
        .map_err(|_| NetnsError::Panicked { name: name.to_string() })
}

fn open(name: &str) -> Result<File, NetnsError> {
    let path = netns_path(name);
    File::open(&path).map_err(|_| NetnsError::Missing { name: name.to_string(), path: path.display().to_string() })
}
