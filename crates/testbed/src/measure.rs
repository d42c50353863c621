//! Publisher-side measurements: what left the publisher's feed interface, and a process's CPU
//! time.
//!
//! Egress is read two ways, both counting Ethernet frames (payload + UDP/TCP + IP + Ethernet
//! headers): the HTB path class `1:1` of the lab's tc tree (`ldm7_net::tc`: everything the
//! path carried, multicast, repairs and any unicast on the feed interface) and the interface's
//! own `tx_bytes` (which also counts what HTB passed before any class was made).

use ldm7_net::command::Cmd;
use ldm7_net::tc;

use crate::{Result, TestbedError};

/// Bytes sent on a feed interface, at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Egress {
    /// Bytes the HTB path class sent (0 without the lab's tc tree).
    pub htb_bytes: u64,
    /// Packets the HTB path class sent (a GSO packet counts as its segments).
    pub htb_packets: u64,
    /// Bytes the interface transmitted (`/sys/class/net/DEV/statistics/tx_bytes`).
    pub tx_bytes: u64,
}

impl Egress {
    /// Reads the counters of `dev` in namespace `netns` (`None`: the current one).
    pub fn read(netns: Option<&str>, dev: &str) -> Result<Egress> {
        let counters = tc::read_counters(netns, dev)?;
        let (htb_bytes, htb_packets) = counters.path().map_or((0, 0), |class| (class.sent_bytes, class.sent_packets));
        // `ip netns exec` mounts the namespace's own sysfs, so this reads that namespace's device.
        let text = Cmd::new("cat").netns(netns).arg(format!("/sys/class/net/{dev}/statistics/tx_bytes")).run()?;
        let tx_bytes = text.trim().parse().map_err(|_| TestbedError::Io {
            what: format!("tx_bytes of {dev}"),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not a number: {text:?}")),
        })?;
        Ok(Egress { htb_bytes, htb_packets, tx_bytes })
    }

    /// The HTB bytes less the 14-byte Ethernet header of every packet: IP datagrams.
    pub fn ip_bytes(self) -> u64 {
        self.htb_bytes.saturating_sub(ETHERNET_HEADER_BYTES * self.htb_packets)
    }

    /// What was sent between `earlier` and `self`.
    pub fn since(self, earlier: Egress) -> Egress {
        Egress {
            htb_bytes: self.htb_bytes.saturating_sub(earlier.htb_bytes),
            htb_packets: self.htb_packets.saturating_sub(earlier.htb_packets),
            tx_bytes: self.tx_bytes.saturating_sub(earlier.tx_bytes),
        }
    }
}

/// Datagrams the kernel dropped for want of room in a UDP socket's receive buffer in namespace
/// `netns` so far (`Udp: RcvbufErrors` of `/proc/net/snmp`, which `ip netns exec` shows per
/// namespace): losses of the host, not of the network.
pub fn udp_receive_drops(netns: Option<&str>) -> Result<u64> {
    let text = Cmd::new("cat").netns(netns).arg("/proc/net/snmp").run()?;
    parse_udp_receive_drops(&text).ok_or_else(|| TestbedError::Io {
        what: "Udp RcvbufErrors of /proc/net/snmp".to_owned(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, "no Udp: RcvbufErrors line pair"),
    })
}

/// `RcvbufErrors` of the two `Udp:` lines (names, then values) of `/proc/net/snmp`.
fn parse_udp_receive_drops(snmp: &str) -> Option<u64> {
    let mut udp = snmp.lines().filter(|line| line.starts_with("Udp:"));
    let (names, values) = (udp.next()?, udp.next()?);
    let column = names.split_whitespace().position(|name| name == "RcvbufErrors")?;
    values.split_whitespace().nth(column)?.parse().ok()
}

/// The median of `values`, NaNs left out (NaN when none is left): `ldm7_types::quantile`'s
/// (nearest rank: of an even number of runs, the lower middle one).
pub fn median(values: Vec<f64>) -> f64 {
    ldm7_types::quantile::median(values)
}

/// Bytes of an Ethernet header (no VLAN tag, no FCS: what tc counts).
const ETHERNET_HEADER_BYTES: u64 = 14;

/// CPU time of process `pid` so far (utime + stime of `/proc/PID/stat`, seconds); `None` when
/// it is gone or the file is unreadable.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces: count fields after its closing parenthesis,
    // where utime and stime are the 12th and 13th (fields 14 and 15 of proc(5)).
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / clock_ticks_per_second())
}

/// Waits for a child process and returns its exit status and peak resident memory in bytes
/// (`ru_maxrss` of `wait4`). The child is reaped here.
pub fn wait_with_peak_rss(child: &mut std::process::Child) -> std::io::Result<(std::process::ExitStatus, u64)> {
    use std::os::unix::process::ExitStatusExt;
    let mut status = 0;
    // SAFETY: `rusage` is plain data that wait4 fills in; the pid is our own unreaped child.
    #[allow(unsafe_code)]
    let (pid, usage) = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        (libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage), usage)
    };
    if pid != child.id() as libc::pid_t {
        return Err(std::io::Error::last_os_error());
    }
    Ok((std::process::ExitStatus::from_raw(status), usage.ru_maxrss as u64 * 1024))
}

/// `sysconf(_SC_CLK_TCK)`: the unit of utime and stime (USER_HZ, 100 on Linux).
fn clock_ticks_per_second() -> f64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(ticks)) if ticks > 0 => ticks as f64,
        _ => 100.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_cpu_time() {
        let mut spin = 0u64;
        for k in 0..20_000_000u64 {
            spin = spin.wrapping_add(k * k);
        }
        assert!(spin > 0);
        assert!(cpu_seconds(std::process::id()).is_some_and(|seconds| seconds >= 0.0));
        assert_eq!(cpu_seconds(u32::MAX), None);
    }

    #[test]
    fn udp_receive_drops_are_read_from_the_udp_lines() {
        let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
                    Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\n\
                    Udp: 10 2 7 30 5 0\n\
                    UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\n\
                    UdpLite: 0 0 0 0 9 0\n";
        assert_eq!(parse_udp_receive_drops(snmp), Some(5));
        assert_eq!(parse_udp_receive_drops("Ip: a\nIp: 1\n"), None);
    }
}
