//! UDP multicast sockets for FMTP (ldm7-multicast.md §3.1): the sender's socket (outgoing
//! interface, TTL, loopback) and a receiver's socket (bound to the group, joined on an interface,
//! source-specific when the source is known), with Linux batching — GSO on send, GRO and
//! `recvmmsg` on receive, through `quinn-udp` — and socket buffers sized from the rate.
//!
//! Sockets are non-blocking and registered with tokio; [`MulticastSender::send_segments`] and
//! [`MulticastReceiver::recv_batch`] wait for readiness.

use std::io::{self, IoSliceMut};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket as StdUdpSocket};
use std::time::Duration;

pub use quinn_udp::RecvMeta;
use quinn_udp::{Transmit, UdpSockRef, UdpSocketState};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::Interest;
use tokio::net::UdpSocket;

/// Where and how to multicast.
#[derive(Clone, Debug)]
pub struct MulticastConfig {
    /// The group and port (IPv4 or IPv6 multicast address).
    pub group: SocketAddr,
    /// Local address of the interface to send from or join on (`0.0.0.0`/`::` = the kernel's choice).
    pub interface: IpAddr,
    /// IPv6 interface index (0 = the kernel's choice); ignored for IPv4.
    pub interface_index: u32,
    /// Multicast TTL / hop limit (LDM's default is 1: the local network only).
    pub ttl: u32,
    /// Whether this host's own receivers see the datagrams (needed for loopback tests and demos).
    pub loopback: bool,
    /// Socket buffer wanted, bytes (see [`buffer_bytes_for_rate`]).
    pub buffer_bytes: usize,
}

impl MulticastConfig {
    /// A configuration on the loopback interface, as the demo and tests use.
    pub fn loopback(group: SocketAddr) -> Self {
        let interface = if group.is_ipv4() { IpAddr::V4(Ipv4Addr::LOCALHOST) } else { IpAddr::V6(Ipv6Addr::LOCALHOST) };
        Self { group, interface, interface_index: 0, ttl: 1, loopback: true, buffer_bytes: 4 << 20 }
    }
}

/// Socket buffer for a rate: a quarter of a second of traffic, at least 1 MiB, at most 256 MiB
/// (enough to ride out scheduling stalls of the sending or receiving thread).
pub fn buffer_bytes_for_rate(rate_bits_per_s: u64) -> usize {
    let quarter_second = rate_bits_per_s / 8 / 4;
    usize::try_from(quarter_second.clamp(1 << 20, 256 << 20)).unwrap_or(256 << 20)
}

/// The longest time a receiving host is planned not to read its multicast socket
/// ([`receive_buffer_bytes`]; `ldm7_plan::repair::RECEIVE_GAP_DEFAULT`).
pub const RECEIVE_GAP_DEFAULT: Duration = ldm7_fmtp_proto::RECEIVE_GAP_DEFAULT;

/// A receiving socket's buffer for a rate: what arrives at `rate_bits_per_s` during `gap`, at
/// least 4 MiB, at most 1 GiB. Beyond `net.core.rmem_max` it takes CAP_NET_ADMIN
/// (`SO_RCVBUFFORCE`); without it the receiver warns at start with the sysctl to set.
pub fn receive_buffer_bytes(rate_bits_per_s: u64, gap: Duration) -> usize {
    let bytes = (rate_bits_per_s as f64 / 8.0 * gap.as_secs_f64()) as u64;
    usize::try_from(bytes.clamp(4 << 20, 1 << 30)).unwrap_or(1 << 30)
}

/// Where parity shards of a feed multicast to `group` go: the same address, the next port (the
/// one before when the group's is the last). A reference receiver, bound to the group's port,
/// never sees them (docs/parity.md).
pub fn parity_group_of(group: SocketAddr) -> SocketAddr {
    let port = group.port().checked_add(1).unwrap_or(group.port() - 1);
    SocketAddr::new(group.ip(), port)
}

/// Why a multicast socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// The group address is not a multicast address.
    #[error("{0} is not a multicast address: give an address in 224.0.0.0/4 or ff00::/8")]
    NotMulticast(IpAddr),
    /// The group and interface families differ.
    #[error("group {group} and interface {interface} are not the same IP version")]
    FamilyMismatch {
        /// The group.
        group: IpAddr,
        /// The interface address.
        interface: IpAddr,
    },
    /// A socket call failed.
    #[error("{call} for multicast group {group}: {source}")]
    Io {
        /// The socket call.
        call: &'static str,
        /// The group.
        group: SocketAddr,
        /// The OS error.
        source: io::Error,
    },
}

/// The size the kernel granted a socket buffer, beside what was asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferSize {
    /// Bytes requested.
    pub requested: usize,
    /// Bytes the kernel reports (Linux reports twice what it accounts for payload).
    pub granted: usize,
}

impl BufferSize {
    /// Whether the kernel capped the buffer below the request (raise `net.core.wmem_max` /
    /// `rmem_max`).
    pub fn capped(&self) -> bool {
        self.granted < self.requested
    }

    /// The sizes, with a warning naming the sysctl to raise when the kernel capped the buffer.
    fn checked(requested: usize, granted: usize, direction: &str, sysctl: &str) -> Self {
        let buffer = Self { requested, granted };
        if buffer.capped() {
            tracing::warn!(
                requested,
                granted,
                "the kernel capped the multicast {direction} buffer; raise it with `sysctl -w net.core.{sysctl}={requested}`"
            );
        }
        buffer
    }
}

/// The sending side: one socket that multicasts datagrams to the group.
#[derive(Debug)]
pub struct MulticastSender {
    socket: UdpSocket,
    state: UdpSocketState,
    group: SocketAddr,
    buffer: BufferSize,
}

impl MulticastSender {
    /// Opens the socket: bound to the interface address (ephemeral port), outgoing interface,
    /// TTL and loopback set, send buffer sized. Must be called inside a tokio runtime.
    pub fn open(config: &MulticastConfig) -> Result<Self, SocketError> {
        check_group(config)?;
        let group = config.group;
        let io = |call| move |source| SocketError::Io { call, group, source };
        let socket = new_socket(group).map_err(io("socket"))?;
        match (group.ip(), config.interface) {
            (IpAddr::V4(_), IpAddr::V4(interface)) => {
                socket.set_multicast_if_v4(&interface).map_err(io("IP_MULTICAST_IF"))?;
                socket.set_multicast_ttl_v4(config.ttl).map_err(io("IP_MULTICAST_TTL"))?;
                socket.set_multicast_loop_v4(config.loopback).map_err(io("IP_MULTICAST_LOOP"))?;
                socket.bind(&SocketAddr::new(IpAddr::V4(interface), 0).into()).map_err(io("bind"))?;
            }
            (IpAddr::V6(_), IpAddr::V6(interface)) => {
                let index = interface_index(config).map_err(io("IPV6_MULTICAST_IF"))?;
                socket.set_multicast_if_v6(index).map_err(io("IPV6_MULTICAST_IF"))?;
                socket.set_multicast_hops_v6(config.ttl).map_err(io("IPV6_MULTICAST_HOPS"))?;
                socket.set_multicast_loop_v6(config.loopback).map_err(io("IPV6_MULTICAST_LOOP"))?;
                socket.bind(&SocketAddr::new(IpAddr::V6(interface), 0).into()).map_err(io("bind"))?;
            }
            (group, interface) => return Err(SocketError::FamilyMismatch { group, interface }),
        }
        socket.set_send_buffer_size(config.buffer_bytes).map_err(io("SO_SNDBUF"))?;
        let granted = socket.send_buffer_size().map_err(io("SO_SNDBUF"))?;
        let buffer = BufferSize::checked(config.buffer_bytes, granted, "send", "wmem_max");
        let std_socket: StdUdpSocket = socket.into();
        let state = UdpSocketState::new(UdpSockRef::from(&std_socket)).map_err(io("socket options"))?;
        let socket = UdpSocket::from_std(std_socket).map_err(io("register with tokio"))?;
        Ok(Self { socket, state, group, buffer })
    }

    /// The local address datagrams come from (the source receivers filter on).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    /// The send buffer the kernel granted.
    pub fn buffer(&self) -> BufferSize {
        self.buffer
    }

    /// Most datagrams one [`send_segments`](Self::send_segments) call may carry (1 without GSO).
    pub fn max_segments(&self) -> usize {
        self.state.max_gso_segments()
    }

    /// Sends `contents` to the group (or to `to`, another port of it) as datagrams of
    /// `segment_size` bytes (the last may be shorter): one system call with GSO. `contents`
    /// must hold at most [`max_segments`](Self::max_segments) segments.
    pub async fn send_segments(&self, contents: &[u8], segment_size: usize, to: Option<SocketAddr>) -> io::Result<()> {
        let segment_size = (contents.len() > segment_size).then_some(segment_size);
        let destination = to.unwrap_or(self.group);
        let transmit = Transmit { destination, ecn: None, contents, segment_size, src_ip: None };
        loop {
            self.socket.writable().await?;
            match self
                .socket
                .try_io(Interest::WRITABLE, || self.state.try_send(UdpSockRef::from(&self.socket), &transmit))
            {
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                other => return other,
            }
        }
    }
}

/// The receiving side: bound to the group's port, joined on one interface.
#[derive(Debug)]
pub struct MulticastReceiver {
    socket: UdpSocket,
    state: UdpSocketState,
    buffer: BufferSize,
}

impl MulticastReceiver {
    /// Binds to the group and port and joins on the interface; with `source`, joins
    /// source-specifically (IGMPv3 for IPv4, as LDM-7 does; MLDv2 for IPv6) so only that
    /// sender's datagrams arrive.
    pub fn join(config: &MulticastConfig, source: Option<IpAddr>) -> Result<Self, SocketError> {
        check_group(config)?;
        let group = config.group;
        let io = |call| move |source| SocketError::Io { call, group, source };
        let socket = new_socket(group).map_err(io("socket"))?;
        socket.set_reuse_address(true).map_err(io("SO_REUSEADDR"))?;
        socket.set_reuse_port(true).map_err(io("SO_REUSEPORT"))?;
        socket.set_recv_buffer_size(config.buffer_bytes).map_err(io("SO_RCVBUF"))?;
        let mut granted = socket.recv_buffer_size().map_err(io("SO_RCVBUF"))?;
        if granted < config.buffer_bytes && force_recv_buffer(&socket, config.buffer_bytes).is_ok() {
            // Beyond `net.core.rmem_max`: a process with CAP_NET_ADMIN may.
            granted = socket.recv_buffer_size().map_err(io("SO_RCVBUF"))?;
        }
        let buffer = BufferSize::checked(config.buffer_bytes, granted, "receive", "rmem_max");
        socket.bind(&group.into()).map_err(io("bind"))?;
        match (group.ip(), config.interface, source) {
            (IpAddr::V4(group_ip), IpAddr::V4(interface), Some(IpAddr::V4(source))) => {
                socket.join_ssm_v4(&source, &group_ip, &interface).map_err(io("IP_ADD_SOURCE_MEMBERSHIP"))?
            }
            (IpAddr::V4(group_ip), IpAddr::V4(interface), _) => {
                socket.join_multicast_v4(&group_ip, &interface).map_err(io("IP_ADD_MEMBERSHIP"))?
            }
            (IpAddr::V6(group_ip), IpAddr::V6(_), Some(IpAddr::V6(source))) => {
                let index = interface_index(config).map_err(io("MCAST_JOIN_SOURCE_GROUP"))?;
                join_ssm_v6(&socket, group_ip, source, index).map_err(io("MCAST_JOIN_SOURCE_GROUP"))?
            }
            (IpAddr::V6(group_ip), IpAddr::V6(_), _) => {
                let index = interface_index(config).map_err(io("IPV6_JOIN_GROUP"))?;
                socket.join_multicast_v6(&group_ip, index).map_err(io("IPV6_JOIN_GROUP"))?
            }
            (group, interface, _) => return Err(SocketError::FamilyMismatch { group, interface }),
        }
        let std_socket: StdUdpSocket = socket.into();
        let state = UdpSocketState::new(UdpSockRef::from(&std_socket)).map_err(io("socket options"))?;
        let socket = UdpSocket::from_std(std_socket).map_err(io("register with tokio"))?;
        Ok(Self { socket, state, buffer })
    }

    /// The receive buffer the kernel granted.
    pub fn buffer(&self) -> BufferSize {
        self.buffer
    }

    /// How many datagrams the kernel may coalesce into one buffer (GRO); size buffers as
    /// `gro_segments × 65535` to take them whole.
    pub fn gro_segments(&self) -> usize {
        self.state.gro_segments()
    }

    /// The socket, for a [`DatagramReader`](crate::reader::DatagramReader)'s thread (no
    /// longer tokio's; still non-blocking).
    pub(crate) fn into_reader_socket(self) -> io::Result<crate::reader::ReaderSocket> {
        let gro_segments = self.state.gro_segments();
        Ok(crate::reader::ReaderSocket { socket: self.socket.into_std()?, state: self.state, gro_segments })
    }

    /// Waits for datagrams and reads up to `buffers.len()` batches in one system call. Each
    /// `meta[i]` tells how many bytes `buffers[i]` holds and the datagram `stride` (with GRO a
    /// buffer may hold several datagrams, split at `stride`); see [`datagrams`].
    pub async fn recv_batch(&self, buffers: &mut [IoSliceMut<'_>], meta: &mut [RecvMeta]) -> io::Result<usize> {
        loop {
            self.socket.readable().await?;
            match self
                .socket
                .try_io(Interest::READABLE, || self.state.recv(UdpSockRef::from(&self.socket), buffers, meta))
            {
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                other => return other,
            }
        }
    }

    /// Like [`recv_batch`](Self::recv_batch) but gives up after `timeout` with `Ok(0)`.
    pub async fn recv_batch_timeout(
        &self,
        buffers: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
        timeout: Duration,
    ) -> io::Result<usize> {
        tokio::time::timeout(timeout, self.recv_batch(buffers, meta)).await.unwrap_or(Ok(0))
    }
}

/// `SO_RCVBUFFORCE`: a receive buffer beyond `net.core.rmem_max` (needs CAP_NET_ADMIN).
fn force_recv_buffer(socket: &Socket, bytes: usize) -> io::Result<()> {
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    set_option(socket, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &value)
}

/// `setsockopt(2)` with an option value of type `T` (the options socket2 does not have).
#[allow(unsafe_code)]
fn set_option<T>(socket: &Socket, level: libc::c_int, name: libc::c_int, value: &T) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: the option value is a live `T` of the length given.
    let result = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            std::ptr::from_ref(value).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if result == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// The datagrams of one received buffer: `len` bytes split every `stride` bytes.
pub fn datagrams<'a>(buffer: &'a [u8], meta: &RecvMeta) -> impl Iterator<Item = &'a [u8]> {
    let filled = &buffer[..meta.len.min(buffer.len())];
    filled.chunks(meta.stride.max(1))
}

/// Bytes an IPv6 header takes beyond an IPv4 one (40 against 20).
pub const IPV6_HEADER_EXTRA: usize = 20;

/// The largest FMTP payload (a block, before its MAC) on `group`: 1448 bytes over IPv4, the
/// reference's (a 1460-byte PDU in a 1488-byte IP datagram); over IPv6 20 bytes less, so that
/// the datagram is as long and fits the same 1500-byte MTU (an IPv6 datagram is never
/// fragmented on its way, and a GSO batch of larger ones is refused outright).
pub fn payload_len_max(group: SocketAddr) -> usize {
    let max = ldm7_fmtp_proto::wire::PAYLOAD_LEN_MAX;
    if group.is_ipv6() { max - IPV6_HEADER_EXTRA } else { max }
}

/// The index of the interface an IPv6 multicast socket uses: the configuration's, else that of
/// the interface holding its address (loopback: `lo`).
fn interface_index(config: &MulticastConfig) -> io::Result<u32> {
    if config.interface_index != 0 {
        return Ok(config.interface_index);
    }
    if config.interface.is_unspecified() {
        // The kernel's choice (by the route to the group).
        return Ok(0);
    }
    index_of_address(config.interface)
}

/// The index of the interface that holds `address`.
pub fn index_of_address(address: IpAddr) -> io::Result<u32> {
    let name = ldm7_io::interface_holding(address)
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no interface holds {address}")))?;
    Ok(nix::net::if_::if_nametoindex(name.as_str())?)
}

/// Joins `group` from `source` only on interface `index` (MLDv2 source-specific,
/// `MCAST_JOIN_SOURCE_GROUP`; socket2 has the IPv4 call only).
#[allow(unsafe_code)]
fn join_ssm_v6(socket: &Socket, group: Ipv6Addr, source: Ipv6Addr, index: u32) -> io::Result<()> {
    let storage = |address: Ipv6Addr| {
        // SAFETY: an all-zero sockaddr_storage is a valid value.
        let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        // SAFETY: sockaddr_storage is large enough and aligned for a sockaddr_in6.
        let v6 = unsafe { &mut *std::ptr::from_mut(&mut storage).cast::<libc::sockaddr_in6>() };
        v6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
        v6.sin6_addr.s6_addr = address.octets();
        storage
    };
    let request =
        libc::group_source_req { gsr_interface: index, gsr_group: storage(group), gsr_source: storage(source) };
    set_option(socket, libc::IPPROTO_IPV6, libc::MCAST_JOIN_SOURCE_GROUP, &request)
}

fn check_group(config: &MulticastConfig) -> Result<(), SocketError> {
    if !config.group.ip().is_multicast() {
        return Err(SocketError::NotMulticast(config.group.ip()));
    }
    Ok(())
}

fn new_socket(group: SocketAddr) -> io::Result<Socket> {
    let domain = if group.is_ipv4() { Domain::IPV4 } else { Domain::IPV6 };
    let socket = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
    if group.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    Ok(socket)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(port: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::new(239, 255, 77, 1)), port)
    }

    #[tokio::test]
    async fn loopback_batch_arrives_in_order() {
        let config = MulticastConfig::loopback(group(ldm7_io::free_port().expect("a free port")));
        let receiver = MulticastReceiver::join(&config, None).expect("join");
        let sender = MulticastSender::open(&config).expect("open");
        let segments = 10.min(sender.max_segments().max(1));
        let mut contents = Vec::new();
        for index in 0..segments {
            let length = if index + 1 == segments { 100 } else { 1460 };
            contents.extend(std::iter::repeat_n(index as u8, length));
        }
        let segment = if segments > 1 { 1460 } else { contents.len() };
        sender.send_segments(&contents, segment, None).await.expect("send");
        let mut seen = Vec::new();
        let mut storage = vec![vec![0u8; 65535 * receiver.gro_segments().max(1)]; 4];
        while seen.len() < segments {
            let mut meta = [RecvMeta::default(); 4];
            let mut buffers: Vec<IoSliceMut<'_>> = storage.iter_mut().map(|b| IoSliceMut::new(b)).collect();
            let count =
                receiver.recv_batch_timeout(&mut buffers, &mut meta, Duration::from_secs(5)).await.expect("recv");
            assert!(count > 0, "no datagram within 5 s");
            drop(buffers);
            for (buffer, meta) in storage.iter().zip(&meta).take(count) {
                seen.extend(datagrams(buffer, meta).map(|datagram| (datagram[0], datagram.len())));
            }
        }
        let expected: Vec<(u8, usize)> =
            (0..segments).map(|index| (index as u8, if index + 1 == segments { 100 } else { 1460 })).collect();
        assert_eq!(seen, expected);
    }

    #[test]
    fn refuses_unicast_group() {
        let config = MulticastConfig::loopback("127.0.0.1:5000".parse().expect("addr"));
        assert!(matches!(MulticastReceiver::join(&config, None), Err(SocketError::NotMulticast(_))));
    }

    #[test]
    fn buffer_follows_rate() {
        assert_eq!(buffer_bytes_for_rate(0), 1 << 20);
        assert_eq!(buffer_bytes_for_rate(1_000_000_000), 31_250_000);
        assert_eq!(buffer_bytes_for_rate(u64::MAX), 256 << 20);
    }
}
