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
