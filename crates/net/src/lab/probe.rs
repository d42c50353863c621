//! Traffic probes between the hosts of a lab that is up: full-speed multicast through the
//! publisher's HTB, UDP round trips (over a feed or over the control network), UDP loss. The lab tests use them to check that the lab does
//! what its spec says (with wide margins), and the `lab_fidelity` example to measure how exactly
//! it does it (`docs/lab.md`, "Measured fidelity").
//!
//! Each probe runs a receiver on a thread inside one host's namespace and a sender inside
//! another's. The sender starts only once the receiver reports that its socket is bound (an
//! event, not a guessed pause); a receiver ends on an end marker, or — where the end marker
//! could be lost — when nothing has arrived for [`IDLE_END`]. Nothing here asserts: the caller
//! decides what the numbers must be.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{FeedSpec, LabSpec};
use crate::netns::{NetnsError, in_netns, spawn_in_netns};

/// How long a receiver waits for the first datagram before giving up.
pub const FIRST_DATAGRAM_TIMEOUT: Duration = Duration::from_secs(10);
/// A receiver whose end marker may be lost ends after this long without a datagram.
pub const IDLE_END: Duration = Duration::from_secs(1);
/// Bytes of multicast payload per datagram (an FMTP block).
pub const BLOCK_PAYLOAD_BYTES: usize = 1448;
/// Bytes HTB counts per datagram beyond the payload: UDP (8), IPv4 (20) and Ethernet (14) headers.
pub const HEADER_BYTES: usize = 42;
/// End markers sent after a loss probe (each may be dropped by the loss under test).
const END_MARKERS: u32 = 20;

/// Why a probe could not run.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The feed or host is not in the lab.
    #[error("lab {lab:?} has no feed {feed:?} with member {host:?}; check the spec")]
    NoSuchMember {
        /// The lab.
        lab: String,
        /// The feed.
        feed: String,
        /// The host.
        host: String,
    },
    /// The member has no address on the feed: the feed has `subscriber_addresses = false` and
    /// the probe does not configure one.
    #[error(
        "host {host:?} has no address on feed {feed:?} of lab {lab:?} (subscriber_addresses = false); give it one \
         first (hostcfg::ensure_address) and probe with round_trips_between"
    )]
    NoAddress {
        /// The lab.
        lab: String,
        /// The feed.
        feed: String,
        /// The host.
        host: String,
    },
    /// The host is not in the lab.
    #[error("lab {lab:?} has no host {host:?}; check the spec")]
    NoSuchHost {
        /// The lab.
        lab: String,
        /// The host.
        host: String,
    },
    /// Entering a host's namespace failed.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// A socket operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// The receiver did not bind its socket.
    #[error("the receiver in host {host:?} did not bind its socket within {FIRST_DATAGRAM_TIMEOUT:?}")]
    ReceiverDidNotStart {
        /// The host.
        host: String,
    },
    /// Nothing arrived at all.
    #[error("nothing arrived at host {host:?} within {FIRST_DATAGRAM_TIMEOUT:?}; is the path up?")]
    NothingArrived {
        /// The host.
        host: String,
    },
}

/// What a receiver measured from a full-speed multicast blast.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlastSample {
    /// The rate of full datagrams at the receiver, counting HTB's bytes (payload + headers), over
    /// the measurement window.
    pub wire_bits_per_s: f64,
    /// Datagrams counted in the window.
    pub datagrams: u64,
}

/// Sends [`BLOCK_PAYLOAD_BYTES`]-byte datagrams to `feed`'s multicast group, port `port`, from
/// `from` as fast as the socket takes them for `skip + window` (then stops), and measures at `to`
/// the rate of what arrives from `skip` after the first datagram, for `window`.
pub fn multicast_blast(
    spec: &LabSpec,
    feed: &str,
    from: &str,
    to: &str,
    port: u16,
    skip: Duration,
    window: Duration,
) -> Result<BlastSample, ProbeError> {
    let (feed_spec, from_address) = member(spec, feed, from)?;
    let (_, to_address) = member(spec, feed, to)?;
    let group = feed_spec.multicast_group;
    let (ready_tx, ready) = mpsc::channel();
    let receiver = spawn_in_netns(&spec.netns_of(to), move || -> Result<Option<BlastSample>, ProbeError> {
        let socket = multicast_receiver(group, port, to_address)?;
        let _ = ready_tx.send(());
        set_timeout(&socket, FIRST_DATAGRAM_TIMEOUT)?;
        let mut buffer = vec![0u8; 2048];
        let mut first: Option<Instant> = None;
        let (mut window_start, mut window_last, mut datagrams) = (None, None, 0u64);
        while let Ok(length) = socket.recv(&mut buffer) {
            let now = Instant::now();
            let since_first = now - *first.get_or_insert(now);
            set_timeout(&socket, IDLE_END)?;
            if since_first >= skip && since_first < skip + window && length == BLOCK_PAYLOAD_BYTES {
                window_start.get_or_insert(now);
                window_last = Some(now);
                datagrams += 1;
            }
        }
        let (Some(start), Some(last)) = (window_start, window_last) else { return Ok(None) };
        let seconds = (last - start).as_secs_f64().max(1e-6);
        let bits = datagrams as f64 * ((BLOCK_PAYLOAD_BYTES + HEADER_BYTES) * 8) as f64;
        Ok(Some(BlastSample { wire_bits_per_s: bits / seconds, datagrams }))
    })?;
    let receiver = wait_ready(&ready, receiver, to)?;
    in_netns(&spec.netns_of(from), move || -> Result<(), ProbeError> {
        let socket = bind(SocketAddrV4::new(from_address, 0))?;
        let payload = vec![0x5au8; BLOCK_PAYLOAD_BYTES];
        let start = Instant::now();
        while start.elapsed() < skip + window {
            for _ in 0..64 {
                // Full socket buffers (ENOBUFS) are expected at full speed: HTB is the limit.
                let _ = socket.send_to(&payload, SocketAddrV4::new(group, port));
            }
        }
        Ok(())
    })??;
    joined(receiver, to)?.ok_or_else(|| ProbeError::NothingArrived { host: to.to_string() })
}

/// Sends `probes` UDP datagrams from `from` to an echo server at `to` (port `port`), one every
/// `interval`, each waiting up to a second for its echo; returns the round-trip times of the
/// echoes that came back, in order.
pub fn round_trips(
    spec: &LabSpec,
    feed: &str,
    from: &str,
    to: &str,
    port: u16,
    probes: u32,
    interval: Duration,
) -> Result<Vec<Duration>, ProbeError> {
    let (_, from_address) = member(spec, feed, from)?;
    let (_, to_address) = member(spec, feed, to)?;
    round_trips_between(spec, (from, from_address), (to, to_address), port, probes, interval)
}

/// [`round_trips`] over the control network (interface `ctl`), from `from` to `to`.
pub fn control_round_trips(
    spec: &LabSpec,
    from: &str,
    to: &str,
    port: u16,
    probes: u32,
    interval: Duration,
) -> Result<Vec<Duration>, ProbeError> {
    let from_address = control_address(spec, from)?;
    let to_address = control_address(spec, to)?;
    round_trips_between(spec, (from, from_address), (to, to_address), port, probes, interval)
}

/// [`round_trips`] between explicit addresses: from host `from.0` bound to `from.1`, to an echo
/// server in host `to.0` bound to `to.1` (e.g. an address a subscriber configured itself).
pub fn round_trips_between(
    spec: &LabSpec,
    from: (&str, Ipv4Addr),
    to: (&str, Ipv4Addr),
    port: u16,
    probes: u32,
    interval: Duration,
) -> Result<Vec<Duration>, ProbeError> {
    let ((from, from_address), (to, to_address)) = (from, to);
    let server_address = SocketAddrV4::new(to_address, port);
    let (ready_tx, ready) = mpsc::channel();
    let receiver = spawn_in_netns(&spec.netns_of(to), move || -> Result<(), ProbeError> {
        let socket = bind(server_address)?;
        let _ = ready_tx.send(());
        set_timeout(&socket, FIRST_DATAGRAM_TIMEOUT)?;
        let mut buffer = [0u8; 64];
        while let Ok((length, peer)) = socket.recv_from(&mut buffer) {
            let _ = socket.send_to(&buffer[..length], peer);
            if &buffer[..length] == b"end" {
                break;
            }
        }
        Ok(())
    })?;
    let receiver = wait_ready(&ready, receiver, to)?;
    let rtts = in_netns(&spec.netns_of(from), move || -> Result<Vec<Duration>, ProbeError> {
        let socket = bind(SocketAddrV4::new(from_address, 0))?;
        set_timeout(&socket, Duration::from_secs(1))?;
        let mut rtts = Vec::new();
        let mut buffer = [0u8; 64];
        for probe in 0..probes {
            let start = Instant::now();
            socket
                .send_to(&probe.to_be_bytes(), server_address)
                .map_err(|source| io_error(format!("sending probe {probe} to {server_address}"), source))?;
            // An echo of an earlier probe that came back late is not this probe's.
            while let Ok((4, _)) = socket.recv_from(&mut buffer) {
                if buffer[..4] == probe.to_be_bytes() {
                    rtts.push(start.elapsed());
                    break;
                }
            }
            // The pause between probes is the probe's own pacing, not synchronization.
            std::thread::sleep(interval);
        }
        for _ in 0..3 {
            let _ = socket.send_to(b"end", server_address);
        }
        Ok(rtts)
    })??;
    joined(receiver, to)?;
    Ok(rtts)
}

/// What a loss probe counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LossSample {
    /// Datagrams sent.
    pub sent: u32,
    /// Distinct datagrams received.
    pub received: u32,
    /// Datagrams that came after one sent later (overtaken on the way).
    pub reordered: u32,
}

impl LossSample {
    /// The share lost, in percent.
    pub fn loss_percent(&self) -> f64 {
        100.0 * (1.0 - f64::from(self.received) / f64::from(self.sent.max(1)))
    }
}

/// Sends `datagrams` numbered 64-byte UDP datagrams from `from` to `to` (port `port`), 50 at a
/// time with a millisecond between batches so that no socket buffer overflows, then end markers;
/// counts the distinct datagrams that arrived.
pub fn udp_loss(
    spec: &LabSpec,
    feed: &str,
    from: &str,
    to: &str,
    port: u16,
    datagrams: u32,
) -> Result<LossSample, ProbeError> {
    let (_, from_address) = member(spec, feed, from)?;
    let (_, to_address) = member(spec, feed, to)?;
    let target = SocketAddrV4::new(to_address, port);
    let (ready_tx, ready) = mpsc::channel();
    let receiver = spawn_in_netns(&spec.netns_of(to), move || -> Result<(u32, u32), ProbeError> {
        let socket = bind(target)?;
        let _ = ready_tx.send(());
        set_timeout(&socket, FIRST_DATAGRAM_TIMEOUT)?;
        let mut seen = vec![false; datagrams as usize];
        let mut highest: Option<u32> = None;
        let mut reordered = 0;
        let mut buffer = [0u8; 64];
        while let Ok(length) = socket.recv(&mut buffer) {
            set_timeout(&socket, IDLE_END)?;
            if length == 3 && &buffer[..3] == b"end" {
                break;
            }
            if length >= 4 {
                let sequence = u32::from_be_bytes([buffer[0], buffer[1], buffer[2], buffer[3]]);
                if let Some(slot) = seen.get_mut(sequence as usize) {
                    *slot = true;
                }
                if highest.is_some_and(|highest| sequence < highest) {
                    reordered += 1;
                }
                highest = highest.max(Some(sequence));
            }
        }
        Ok((seen.iter().filter(|s| **s).count() as u32, reordered))
    })?;
    let receiver = wait_ready(&ready, receiver, to)?;
    in_netns(&spec.netns_of(from), move || -> Result<(), ProbeError> {
        let socket = bind(SocketAddrV4::new(from_address, 0))?;
        let mut payload = [0u8; 64];
        for sequence in 0..datagrams {
            payload[..4].copy_from_slice(&sequence.to_be_bytes());
            socket
                .send_to(&payload, target)
                .map_err(|source| io_error(format!("sending datagram {sequence} to {target}"), source))?;
            if sequence % 50 == 49 {
                // Pacing of the probe itself, so that only the configured loss drops datagrams.
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        for _ in 0..END_MARKERS {
            let _ = socket.send_to(b"end", target);
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    })??;
    let (received, reordered) = joined(receiver, to)?;
    Ok(LossSample { sent: datagrams, received, reordered })
}

/// A UDP socket that receives multicast group `group` on port `port` through the interface with
/// address `interface`, with an 8 MB receive buffer.
pub fn multicast_receiver(group: Ipv4Addr, port: u16, interface: Ipv4Addr) -> Result<UdpSocket, ProbeError> {
    use socket2::{Domain, Protocol, Socket, Type};
    let what = format!("receiving multicast {group}:{port} on {interface}");
    let error = |source| io_error(what.clone(), source);
    let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).map_err(error)?;
    socket.set_reuse_address(true).map_err(error)?;
    // A smaller buffer only costs datagrams at the highest rates; not worth failing for.
    let _ = socket.set_recv_buffer_size(8 << 20);
    socket.bind(&SocketAddrV4::new(group, port).into()).map_err(error)?;
    socket.join_multicast_v4(&group, &interface).map_err(error)?;
    Ok(socket.into())
}

fn member<'a>(spec: &'a LabSpec, feed: &str, host: &str) -> Result<(&'a FeedSpec, Ipv4Addr), ProbeError> {
    let no_such_member =
        || ProbeError::NoSuchMember { lab: spec.name.clone(), feed: feed.to_string(), host: host.to_string() };
    let feed_spec = spec.feed(feed).filter(|f| f.is_member(host)).ok_or_else(no_such_member)?;
    let address = feed_spec.address_of(host).ok_or_else(|| ProbeError::NoAddress {
        lab: spec.name.clone(),
        feed: feed.to_string(),
        host: host.to_string(),
    })?;
    Ok((feed_spec, address.address))
}

fn control_address(spec: &LabSpec, host: &str) -> Result<Ipv4Addr, ProbeError> {
    spec.control_address_of(host)
        .map(|cidr| cidr.address)
        .ok_or_else(|| ProbeError::NoSuchHost { lab: spec.name.clone(), host: host.to_string() })
}

fn bind(address: SocketAddrV4) -> Result<UdpSocket, ProbeError> {
    UdpSocket::bind(address).map_err(|source| io_error(format!("binding a UDP socket to {address}"), source))
}

fn set_timeout(socket: &UdpSocket, timeout: Duration) -> Result<(), ProbeError> {
    socket.set_read_timeout(Some(timeout)).map_err(|source| io_error("setting a read timeout".to_string(), source))
}

fn io_error(what: String, source: std::io::Error) -> ProbeError {
    ProbeError::Io { what, source }
}

/// A receiver thread in a host's namespace.
type ReceiverThread<T> = std::thread::JoinHandle<Result<Result<T, ProbeError>, NetnsError>>;

/// Waits for the receiver's "bound" event. A receiver that failed drops its end of the channel
/// first; its own error is returned then.
fn wait_ready<T>(
    ready: &mpsc::Receiver<()>,
    receiver: ReceiverThread<T>,
    host: &str,
) -> Result<ReceiverThread<T>, ProbeError> {
    match ready.recv_timeout(FIRST_DATAGRAM_TIMEOUT) {
        Ok(()) => Ok(receiver),
        Err(mpsc::RecvTimeoutError::Disconnected) => match joined(receiver, host) {
            Err(error) => Err(error),
            Ok(_) => Err(ProbeError::ReceiverDidNotStart { host: host.to_string() }),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => Err(ProbeError::ReceiverDidNotStart { host: host.to_string() }),
    }
}

fn joined<T>(handle: ReceiverThread<T>, host: &str) -> Result<T, ProbeError> {
    handle.join().map_err(|_| NetnsError::Panicked { name: host.to_string() })??
}
