//! What every driver of a sans-IO protocol crate shares (ARCHITECTURE.md, "The sans-IO
//! boundary"): the one process clock that maps the operating system's monotonic clock to the
//! protocols' [`ldm7_types::Instant`] ([`clock`]), reconnection back-off ([`backoff`], pure: it
//! lives in `ldm7_types` and is re-exported here), the
//! log targets every driver logs per-product lines with ([`log_target`]), the counter and
//! once-per-episode logging decision for a named bound that was hit ([`bound`]), the stop
//! signal a daemon's blocked threads wake on ([`stop`]), a daemon's supervised child programs
//! ([`children`]), and the one way to pick a free local
//! port ([`free_port`]: the demo, the benchmarks and the tests).
//!
//! Protocol crates never read a clock; drivers (the FMTP driver, the server's session threads,
//! the command-line clients) read it here, so that every `Instant` in a process is on one
//! timeline and comparable across sessions.

pub use ldm7_types::backoff;
pub mod bound;
pub mod children;
pub mod clock;
pub mod log_target;
pub mod stop;

pub use backoff::Backoff;
pub use bound::{BoundHits, Throttle};
pub use clock::Clock;
pub use stop::Stop;

/// A port that is free on every address for TCP and UDP at the moment of the call, for a
/// server the caller starts next (the demo, the benchmarks, the tests).
///
/// Chosen below the kernel's ephemeral range (32768–60999 by default), from 10000 up: a port
/// the kernel handed out (`bind` to port 0) is also one it hands to the next outgoing
/// connection, so between the choice and the server's `bind` another process's connection
/// could take it (tests running side by side did). Candidates go round the range from an offset
/// by process, so that processes choosing at once start apart; each is tried by binding it.
pub fn free_port() -> std::io::Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 10_000;
    const COUNT: u32 = 22_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let offset = std::process::id().wrapping_mul(7919) % COUNT;
    for _ in 0..COUNT {
        let step = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (FIRST + (offset + step.wrapping_mul(13)) % COUNT) as u16;
        let tcp = std::net::TcpListener::bind(("0.0.0.0", port));
        let udp = std::net::UdpSocket::bind(("0.0.0.0", port));
        if tcp.is_ok() && udp.is_ok() {
            return Ok(port);
        }
    }
    Err(std::io::Error::new(std::io::ErrorKind::AddrInUse, "no free port between 10000 and 32000"))
}

/// The interface of this network namespace that holds `address` (IPv4 or IPv6), if one does
/// (`getifaddrs(3)`).
pub fn interface_holding(address: std::net::IpAddr) -> Option<String> {
    nix::ifaddrs::getifaddrs().ok()?.find_map(|entry| {
        let held = entry.address.as_ref().and_then(|held| {
            held.as_sockaddr_in()
                .map(|v4| std::net::IpAddr::V4(v4.ip()))
                .or_else(|| held.as_sockaddr_in6().map(|v6| std::net::IpAddr::V6(v6.ip())))
        });
        (held == Some(address)).then(|| entry.interface_name.clone())
    })
}

/// Whether process `pid` runs (exists and is neither a zombie nor dead), from `/proc/PID/stat`.
pub fn process_lives(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // `pid (command) state …`: the command may hold spaces and parentheses, the state follows
    // the last `)`.
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some('Z' | 'X') | None)
}

/// Rotates log file `path` as LDM's `newlog` does: FILE.(keep−1) → FILE.keep … FILE.1 → FILE.2,
/// then FILE → FILE.1 (missing numbered files are skipped); with `keep` 0 FILE is removed. The
/// writer reopens FILE afterwards.
pub fn rotate_numbered(path: &std::path::Path, keep: u32) -> std::io::Result<()> {
    if keep == 0 {
        return std::fs::remove_file(path);
    }
    // Nothing to rotate: the numbered files stay where they are.
    std::fs::metadata(path)?;
    let numbered = |n: u32| {
        let mut name = path.to_path_buf().into_os_string();
        name.push(format!(".{n}"));
        std::path::PathBuf::from(name)
    };
    for n in (1..keep).rev() {
        let _ = std::fs::rename(numbered(n), numbered(n + 1));
    }
    std::fs::rename(path, numbered(1))
}

/// A process's peak resident memory in bytes (`VmHWM` of `/proc/PID/status`; `None` as `pid`:
/// this process).
pub fn peak_resident_bytes(pid: Option<u32>) -> Option<u64> {
    let path = pid.map_or_else(|| "/proc/self/status".to_owned(), |pid| format!("/proc/{pid}/status"));
    let status = std::fs::read_to_string(path).ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    let kibibytes: u64 = line.trim_start_matches("VmHWM:").trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kibibytes << 10)
}
