//! The `vde` driver: one `vde_switch` per feed, driven through its management socket, and one
//! `wirefilter` per leg between the switch and the host's TAP device. This is how the lab gets
//! one-way delay (and per-leg loss and bandwidth) on a kernel without netem.
//!
//! ```text
//!  host ns A: tap "ngrid" ⇄ wirefilter -d 20 -b … ⇄ ┐
//!                                                      vde_switch (RUN/ngrid/switch.ctl)
//!  host ns B: tap "ngrid" ⇄ wirefilter -d 0  -b … ⇄ ┘
//! ```
//!
//! A wirefilter runs inside the host's namespace and opens the TAP device there with the
//! `tap://NAME` plug of libvdeplug4; the TAP is created persistent beforehand, so removing a leg
//! (closing its switch endpoint and stopping its wirefilter) leaves the host's interface, address
//! and qdisc in place, and adding it again reattaches. All files live under one run directory per
//! path; processes are only ever signalled after checking that their command line names that
//! directory.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{Endpoint, Leg, PathError, PathInfo, PathService};
use crate::command::Cmd;
use crate::netns::process_alive;
use ldm7_types::units::Rate;

/// How long to wait for a VDE process to come up or go away.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(3);
/// Ports per switch (hosts per feed, with room).
const SWITCH_PORTS: u32 = 80;

/// VDE paths, each in its own directory under `run_dir`.
#[derive(Debug, Clone)]
pub struct VdePaths {
    run_dir: PathBuf,
}

impl VdePaths {
    /// A driver keeping its sockets, pid files and logs under `run_dir` (created on demand).
    pub fn new(run_dir: impl Into<PathBuf>) -> VdePaths {
        VdePaths { run_dir: run_dir.into() }
    }

    /// The directory of path `name`.
    pub fn path_dir(&self, name: &str) -> PathBuf {
        self.run_dir.join(name)
    }

    /// The data socket directory of the switch of path `name` (what `vde_plug` connects to).
    pub fn switch_socket(&self, name: &str) -> PathBuf {
        self.path_dir(name).join("switch.ctl")
    }

    /// The process ids of every VDE process of path `name` that is alive (switch and legs).
    pub fn pids(&self, name: &str) -> Vec<i32> {
        let dir = self.path_dir(name);
        let mut pids = Vec::new();
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for entry in entries.flatten() {
                let path = entry.path();
                if path.extension().is_some_and(|e| e == "pid")
                    && let Some(pid) = read_pid(&path)
                    && owned_alive(pid, &dir)
                {
                    pids.push(pid);
                }
            }
        }
        pids
    }

    fn mgmt(&self, name: &str) -> PathBuf {
        self.path_dir(name).join("switch.mgmt")
    }

    fn leg_stem(&self, name: &str, endpoint: &Endpoint) -> PathBuf {
        let node = if endpoint.node.is_empty() { "here" } else { &endpoint.node };
        self.path_dir(name).join(format!("leg-{node}-{}", endpoint.interface))
    }

    fn require(&self, name: &str) -> Result<Rate, PathError> {
        let dir = self.path_dir(name);
        let switch_pid = read_pid(&dir.join("switch.pid"));
        if !switch_pid.is_some_and(|pid| owned_alive(pid, &dir)) {
            return Err(PathError::NoSuchPath(name.to_string()));
        }
        let bits = std::fs::read_to_string(dir.join("rate")).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(0);
        Ok(Rate::from_bits_per_s(bits))
    }

    /// (record, pid) of every leg whose wirefilter is alive.
    fn legs(&self, name: &str) -> Vec<(LegRecord, i32)> {
        let dir = self.path_dir(name);
        let mut legs = Vec::new();
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for entry in entries.flatten() {
                let path = entry.path();
                if path.extension().is_some_and(|e| e == "leg")
                    && let Ok(text) = std::fs::read_to_string(&path)
                    && let Ok(record) = serde_json::from_str::<LegRecord>(&text)
                    && let Some(pid) = read_pid(&path.with_extension("pid"))
                    && owned_alive(pid, &dir)
                {
                    legs.push((record, pid));
                }
            }
        }
        legs.sort_by_key(|(record, _)| record.port);
        legs
    }

    /// Removes what the driver remembers of a leg whose wirefilter is stopped.
    fn forget_leg(&self, name: &str, endpoint: &Endpoint) {
        let stem = self.leg_stem(name, endpoint);
        for extension in ["leg", "pid", "mgmt"] {
            let _ = std::fs::remove_file(stem.with_extension(extension));
        }
    }

    /// (port, endpoint id) of every active switch endpoint, from `port/print`.
    fn active_ports(&self, name: &str) -> Result<Vec<(u32, u32)>, PathError> {
        Ok(parse_port_print(&mgmt_command(&self.mgmt(name), "port/print")?))
    }
}

/// What the driver remembers about a leg: where it attaches and which switch port it uses.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct LegRecord {
    endpoint: Endpoint,
    port: u32,
}

impl PathService for VdePaths {
    fn driver(&self) -> &'static str {
        "vde"
    }

    fn create_path(&mut self, name: &str, rate: Rate) -> Result<(), PathError> {
        if self.require(name).is_ok() {
            return Err(PathError::PathExists(name.to_string()));
        }
        let dir = self.path_dir(name);
        std::fs::create_dir_all(&dir)
            .map_err(|source| PathError::Io { what: format!("creating {}", dir.display()), source })?;
        std::fs::write(dir.join("rate"), rate.bits_per_s().to_string())
            .map_err(|source| PathError::Io { what: format!("writing {}", dir.join("rate").display()), source })?;
        let pidfile = dir.join("switch.pid");
        let _ = std::fs::remove_file(&pidfile);
        Cmd::new("vde_switch")
            .args(["--daemon", "--numports", &SWITCH_PORTS.to_string()])
            .arg("--sock")
            .arg(path_text(&self.switch_socket(name)))
            .arg("--mgmt")
            .arg(path_text(&self.mgmt(name)))
            .arg("--pidfile")
            .arg(path_text(&pidfile))
            .run_daemon(&dir.join("switch.log"))?;
        wait_for(STARTUP_TIMEOUT, || self.mgmt(name).exists() && read_pid(&pidfile).is_some())
            .then_some(())
            .ok_or_else(|| PathError::SwitchDidNotStart { name: name.to_string(), log: dir.join("switch.log") })?;
        Ok(())
    }

    fn add_leg(&mut self, name: &str, leg: &Leg) -> Result<(), PathError> {
        let rate = self.require(name)?;
        let mut legs = self.legs(name);
        let active = self.active_ports(name)?;
        if let Some(at) = legs.iter().position(|(record, _)| record.endpoint == leg.endpoint) {
            if active.iter().any(|(port, _)| *port == legs[at].0.port) {
                return Ok(());
            }
            // Half removed: its switch port closed and its wirefilter left running (a process
            // stopped while it removed the leg). The host is cut off: the leg is made again.
            let (record, pid) = legs.remove(at);
            stop_owned(pid, &self.path_dir(name));
            self.forget_leg(name, &record.endpoint);
        }
        let mut used: Vec<u32> = legs.iter().map(|(record, _)| record.port).collect();
        used.extend(active.into_iter().map(|(port, _)| port));
        let port = (1..SWITCH_PORTS)
            .find(|p| !used.contains(p))
            .ok_or_else(|| PathError::NoFreePort { name: name.to_string(), ports: SWITCH_PORTS })?;
        let dir = self.path_dir(name);
        let stem = self.leg_stem(name, &leg.endpoint);
        let pidfile = stem.with_extension("pid");
        let _ = std::fs::remove_file(&pidfile);
        let netns = (!leg.endpoint.node.is_empty()).then_some(leg.endpoint.node.as_str());
        let bandwidth = leg.bandwidth.unwrap_or(rate);
        Cmd::new("wirefilter")
            .netns(netns)
            .arg("-v")
            .arg(format!("{}[{port}]:tap://{}", path_text(&self.switch_socket(name)), leg.endpoint.interface))
            .args(["-d", &format_ms(leg.one_way_delay.max(WIREFILTER_DELAY_MIN))])
            .args(["-l", &leg.loss.percent().to_string()])
            .args(["-b", &bandwidth.bytes_per_s().to_string()])
            .arg("-M")
            .arg(path_text(&stem.with_extension("mgmt")))
            .arg("--daemon")
            .arg("--pidfile")
            .arg(path_text(&pidfile))
            .run_daemon(&stem.with_extension("log"))?;
        let attached = wait_for(STARTUP_TIMEOUT, || {
            read_pid(&pidfile).is_some_and(|pid| owned_alive(pid, &dir))
                && self.active_ports(name).is_ok_and(|ports| ports.iter().any(|(p, _)| *p == port))
        });
        if !attached {
            if let Some(pid) = read_pid(&pidfile) {
                stop_owned(pid, &dir);
            }
            return Err(PathError::LegDidNotAttach {
                name: name.to_string(),
                endpoint: leg.endpoint.clone(),
                log: stem.with_extension("log"),
            });
        }
        let record = serde_json::to_string(&LegRecord { endpoint: leg.endpoint.clone(), port }).unwrap_or_default();
        std::fs::write(stem.with_extension("leg"), record).map_err(|source| PathError::Io {
            what: format!("writing {}", stem.with_extension("leg").display()),
            source,
        })?;
        Ok(())
    }

    fn remove_leg(&mut self, name: &str, endpoint: &Endpoint) -> Result<(), PathError> {
        self.require(name)?;
        let Some((record, pid)) = self.legs(name).into_iter().find(|(record, _)| record.endpoint == *endpoint) else {
            return Err(PathError::NoSuchLeg { path: name.to_string(), endpoint: endpoint.clone() });
        };
        // Close the leg's endpoint on the switch first: from here on the host is cut off.
        for (port, endpoint_id) in self.active_ports(name)?.into_iter().filter(|(port, _)| *port == record.port) {
            mgmt_command(&self.mgmt(name), &format!("port/epclose {port} {endpoint_id}"))?;
        }
        stop_owned(pid, &self.path_dir(name));
        self.forget_leg(name, endpoint);
        Ok(())
    }

    fn set_rate(&mut self, name: &str, rate: Rate) -> Result<(), PathError> {
        self.require(name)?;
        for (record, _) in self.legs(name) {
            let mgmt = self.leg_stem(name, &record.endpoint).with_extension("mgmt");
            mgmt_command(&mgmt, &format!("bandwidth {}", rate.bytes_per_s()))?;
        }
        let file = self.path_dir(name).join("rate");
        std::fs::write(&file, rate.bits_per_s().to_string())
            .map_err(|source| PathError::Io { what: format!("writing {}", file.display()), source })?;
        Ok(())
    }

    fn list(&mut self) -> Result<Vec<PathInfo>, PathError> {
        let mut paths = Vec::new();
        let Ok(entries) = std::fs::read_dir(&self.run_dir) else { return Ok(paths) };
        let mut names: Vec<String> = entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        for name in names {
            let Ok(rate) = self.require(&name) else { continue };
            let legs = self.legs(&name).into_iter().map(|(record, _)| record.endpoint).collect();
            paths.push(PathInfo {
                detail: format!("vde_switch {}", self.switch_socket(&name).display()),
                name,
                rate,
                legs,
            });
        }
        Ok(paths)
    }

    fn remove_path(&mut self, name: &str) -> Result<(), PathError> {
        let dir = self.path_dir(name);
        if !dir.exists() {
            return Ok(());
        }
        for (record, _) in self.legs(name) {
            let _ = self.remove_leg(name, &record.endpoint);
        }
        let _ = mgmt_command(&self.mgmt(name), "shutdown");
        for pid in self.pids(name) {
            stop_owned(pid, &dir);
        }
        std::fs::remove_dir_all(&dir)
            .map_err(|source| PathError::Io { what: format!("removing {}", dir.display()), source })?;
        Ok(())
    }
}

/// Sends one command to a VDE management socket (`vde_switch -M` or `wirefilter -M`) and returns
/// its output; a non-`1000` reply is an error carrying VDE's message.
pub fn mgmt_command(socket: &Path, command: &str) -> Result<String, PathError> {
    let io = |source| PathError::Io { what: format!("VDE management socket {} ({command})", socket.display()), source };
    let mut stream = UnixStream::connect(socket).map_err(io)?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).map_err(io)?;
    read_until_prompt(&mut stream).map_err(io)?;
    stream.write_all(format!("{command}\n").as_bytes()).map_err(io)?;
    let reply = if command == "shutdown" { String::new() } else { read_until_prompt(&mut stream).map_err(io)? };
    parse_mgmt_reply(&reply).map_err(|source| PathError::Vde {
        command: command.to_string(),
        socket: socket.to_path_buf(),
        source,
    })
}

/// A management reply that is not a success.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MgmtReplyError {
    /// VDE answered with an error code (`1006 No such device or address` …).
    #[error("VDE answered {code} {message}")]
    Refused {
        /// The four-digit code.
        code: String,
        /// VDE's message.
        message: String,
    },
    /// The reply has no status line.
    #[error("unexpected reply {reply:?}; is the socket a vde_switch or wirefilter management socket?")]
    Unexpected {
        /// What came back.
        reply: String,
    },
}

/// Extracts the data of a management reply: `0000 DATA END WITH '.'` … `.` then `1000 Success`.
fn parse_mgmt_reply(reply: &str) -> Result<String, MgmtReplyError> {
    let mut data = Vec::new();
    let mut in_data = false;
    for line in reply.lines() {
        if line.starts_with("0000 DATA") {
            in_data = true;
        } else if in_data && line == "." {
            in_data = false;
        } else if in_data {
            data.push(line);
        } else if let Some((code, message)) = line.split_once(' ')
            && code.len() == 4
            && code.chars().all(|c| c.is_ascii_digit())
        {
            if code == "1000" {
                return Ok(data.join("\n"));
            }
            return Err(MgmtReplyError::Refused { code: code.to_string(), message: message.to_string() });
        }
    }
    if reply.is_empty() { Ok(String::new()) } else { Err(MgmtReplyError::Unexpected { reply: reply.to_string() }) }
}

/// (port, endpoint id) of every endpoint in `port/print` output.
fn parse_port_print(port_print: &str) -> Vec<(u32, u32)> {
    let mut found = Vec::new();
    let mut port = None;
    for line in port_print.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first() == Some(&"Port") {
            port = words.get(1).and_then(|w| w.parse().ok());
        } else if line.contains("endpoint ID") {
            let id = words.iter().position(|w| *w == "ID").and_then(|i| words.get(i + 1)).and_then(|w| w.parse().ok());
            if let (Some(port), Some(id)) = (port, id) {
                found.push((port, id));
            }
        }
    }
    found
}

fn read_until_prompt(stream: &mut UnixStream) -> std::io::Result<String> {
    let mut text = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let n = stream.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        text.extend_from_slice(&buffer[..n]);
        let so_far = String::from_utf8_lossy(&text);
        if so_far.ends_with("$ ") {
            break;
        }
    }
    Ok(String::from_utf8_lossy(&text).into_owned())
}

fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// True when `pid` is alive and its command line names `dir` (so it is one of ours).
fn owned_alive(pid: i32, dir: &Path) -> bool {
    process_alive(pid)
        && std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(&*dir.to_string_lossy()))
}

/// SIGTERM, then SIGKILL, a process of ours (checked with [`owned_alive`]).
pub(crate) fn stop_owned(pid: i32, dir: &Path) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    if !owned_alive(pid, dir) {
        return;
    }
    let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    if !wait_for(Duration::from_secs(1), || !process_alive(pid)) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        wait_for(Duration::from_secs(1), || !process_alive(pid));
    }
}

fn wait_for(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if done() {
            return true;
        }
        if start.elapsed() > timeout {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The least delay a leg's wirefilter is given. With a bandwidth (`-b`, which every leg has)
/// and no delay, wirefilter (vde2 2.3.2) reorders frames: of 30,000 datagrams in bursts through
/// two such legs, 1,120 to 13,204 came out of order, and a lab whose publisher's leg had no
/// delay reordered one multicast block in 400. With 0.1 ms one lab test in ten still saw some;
/// with 1 ms none did. A real path keeps its frames in order, and an FMTP receiver takes a block
/// that overtook an earlier one as the earlier one's loss (a repair the network never needed).
pub const WIREFILTER_DELAY_MIN: Duration = Duration::from_millis(1);

fn format_ms(delay: Duration) -> String {
    let micros = delay.as_micros();
    if micros.is_multiple_of(1000) { format!("{}", micros / 1000) } else { format!("{}", micros as f64 / 1000.0) }
}

fn path_text(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn management_replies_parse() {
        let reply = "0000 DATA END WITH '.'\nPort 0001 untagged_vlan=0000 ACTIVE - Unnamed Allocatable\n  -- endpoint ID 0003 module unix prog   : vde_crosscable user=root pid=19927\n.\n1000 Success\n\nvde$ ";
        let data = parse_mgmt_reply(reply).unwrap();
        assert!(data.starts_with("Port 0001"));
        assert_eq!(parse_port_print(&data), vec![(1, 3)]);
        assert_eq!(parse_mgmt_reply("1000 Success\n\nVDEwf$ ").unwrap(), "");
        assert_eq!(
            parse_mgmt_reply("1006 No such device or address\n\nvde$ ").unwrap_err(),
            MgmtReplyError::Refused { code: "1006".into(), message: "No such device or address".into() }
        );
        assert!(matches!(parse_mgmt_reply("hello"), Err(MgmtReplyError::Unexpected { .. })));
    }

    #[test]
    fn delays_are_written_in_milliseconds() {
        assert_eq!(format_ms(Duration::from_millis(20)), "20");
        assert_eq!(format_ms(Duration::from_micros(50)), "0.05");
        assert_eq!(format_ms(Duration::ZERO), "0");
    }
}
