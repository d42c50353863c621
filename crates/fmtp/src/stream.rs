//! The TCP retransmission connection's plumbing shared by both ends (ldm7-multicast.md §3.1,
//! §3.7): the key-exchange blobs that open it, reading into a frame buffer, the receiver's
//! connect with back-off, keep-alive, and the round-trip time the kernel measures (Linux
//! `TCP_INFO`), which the sender feeds to `Sender::set_rtt`.
//!
//! Connection opening (§3.7): the receiver sends a length-prefixed blob (the reference sends a
//! PEM RSA public key), the sender answers with a length-prefixed blob (the reference: a
//! 256-byte RSA-OAEP ciphertext of the MAC key, an empty key at MAC level 0). We frame both
//! exactly; at MAC level 0 our sender answers with 256 zero bytes and our receiver ignores the
//! answer. Interoperating with a reference LDM-7 receiver needs the real RSA encryption, which
//! is not implemented yet.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::BufMut;
use ldm7_fmtp_proto::wire::{Split, handshake};
use ldm7_io::{Backoff, Clock};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// Bytes of the sender's answer blob at MAC level 0 (the size of an RSA-2048 ciphertext).
const KEY_ANSWER_LEN: usize = 256;

/// The receiver's key blob at MAC level 0 (a placeholder public key; our sender ignores it).
const KEY_OFFER: &[u8] = b"-----BEGIN RSA PUBLIC KEY-----\nldm7 MAC level 0\n-----END RSA PUBLIC KEY-----\n";

/// Longest the key exchange may take before the connection is dropped (a peer that connects
/// and says nothing must not hold a connection for ever).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest one connection attempt may take (a host that does not answer at all).
pub const CONNECT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest read from a TCP connection at once.
pub(crate) const READ_CHUNK_BYTES: usize = 64 << 10;

/// Sender side of §3.7: reads the receiver's blob, answers. Returns the bytes that followed the
/// blob (the first frames).
pub(crate) async fn accept_handshake(
    read: &mut (impl AsyncRead + Unpin),
    write: &mut (impl AsyncWrite + Unpin),
) -> io::Result<Vec<u8>> {
    let exchange = async {
        let rest = read_blob(read).await?;
        let mut answer = Vec::new();
        handshake::emit_blob(&[0u8; KEY_ANSWER_LEN], &mut answer).map_err(io::Error::other)?;
        write.write_all(&answer).await?;
        Ok(rest)
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, exchange)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "the FMTP key exchange did not finish"))?
}

/// Receiver side of §3.7: offers a key, reads the answer. Returns the bytes that followed it.
pub(crate) async fn offer_handshake(
    read: &mut (impl AsyncRead + Unpin),
    write: &mut (impl AsyncWrite + Unpin),
) -> io::Result<Vec<u8>> {
    let exchange = async {
        let mut offer = Vec::new();
        handshake::emit_blob(KEY_OFFER, &mut offer).map_err(io::Error::other)?;
        write.write_all(&offer).await?;
        read_blob(read).await
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, exchange)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "the FMTP key exchange did not finish"))?
}

async fn read_blob(read: &mut (impl AsyncRead + Unpin)) -> io::Result<Vec<u8>> {
    let mut buffer = Vec::with_capacity(1024);
    loop {
        match handshake::split_blob(&buffer).map_err(io::Error::other)? {
            Split::Frame { rest, .. } => return Ok(rest.to_vec()),
            Split::Incomplete { .. } => {
                read_more(read, &mut buffer, READ_CHUNK_BYTES).await?;
            }
        }
    }
}

/// Appends at most `limit` bytes read from the connection to `buffer` (into its spare
/// capacity, without zeroing); end of stream is an error (`UnexpectedEof`).
pub(crate) async fn read_more(
    read: &mut (impl AsyncRead + Unpin),
    buffer: &mut Vec<u8>,
    limit: usize,
) -> io::Result<usize> {
    buffer.reserve(limit.max(1));
    let mut limited = (&mut *buffer).limit(limit.max(1));
    match read.read_buf(&mut limited).await? {
        0 => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the peer closed the connection")),
        count => Ok(count),
    }
}

/// Why the receiver could not open its retransmission connection.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot connect to the FMTP sender's retransmission server {addr} after {attempts} attempts \
     in {waited:?}: {last}; check that the sender runs and listens there"
)]
pub struct ConnectError {
    /// The server.
    pub addr: SocketAddr,
    /// Attempts made.
    pub attempts: u32,
    /// How long they took.
    pub waited: Duration,
    /// The last attempt's error.
    pub last: io::Error,
}

/// Connects to `addr` — from `local` when given (LDM-7: the address the publisher handed out,
/// the only one its repair server accepts, ldm7-multicast.md §4.3) — retrying with `backoff`
/// (which carries the deadline) on refusal or any other error (each attempt cut at
/// [`CONNECT_ATTEMPT_TIMEOUT`]); `on_attempt` is called before each attempt, `on_retry` after
/// each failed one that will be retried (with its error). §3.1: the reference retries every
/// 5 s for up to 120 s; we start faster.
pub(crate) async fn connect_with_backoff(
    addr: SocketAddr,
    local: Option<IpAddr>,
    mut backoff: Backoff,
    mut on_attempt: impl FnMut(),
    mut on_retry: impl FnMut(&io::Error),
) -> Result<TcpStream, ConnectError> {
    let started = Clock::now();
    let mut attempts = 0;
    loop {
        attempts += 1;
        on_attempt();
        let attempt = tokio::time::timeout(CONNECT_ATTEMPT_TIMEOUT, connect_from(addr, local)).await;
        let error = match attempt {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(error)) => error,
            Err(_) => io::Error::new(io::ErrorKind::TimedOut, "connect timed out"),
        };
        let now = Clock::now();
        let Some(delay) = backoff.next_delay(now) else {
            return Err(ConnectError { addr, attempts, waited: now.saturating_duration_since(started), last: error });
        };
        tracing::debug!(%addr, %error, ?delay, "FMTP retransmission server not reachable yet; retrying");
        on_retry(&error);
        tokio::time::sleep(delay).await;
    }
}

/// One connection attempt, bound to `local` (any port) when given.
async fn connect_from(addr: SocketAddr, local: Option<IpAddr>) -> io::Result<TcpStream> {
    let Some(local) = local else { return TcpStream::connect(addr).await };
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.bind(SocketAddr::new(local, 0))?;
    socket.connect(addr).await
}

/// Keep-alive as the reference sets it on accepted connections (§3.1: idle 60 s, interval
/// 30 s, 5 probes), so that a vanished receiver's connection ends.
pub(crate) fn set_keepalive(stream: &TcpStream) -> io::Result<()> {
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(60))
        .with_interval(Duration::from_secs(30))
        .with_retries(5);
    socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive)
}

/// The kernel's smoothed round-trip time of a TCP connection (`TCP_INFO` `tcpi_rtt`), or
/// `None` where it is not available (no sample yet, not Linux).
pub fn tcp_rtt(stream: &TcpStream) -> Option<Duration> {
    use std::os::fd::AsRawFd;
    let micros = tcp_info_rtt_micros(stream.as_raw_fd())?;
    (micros > 0).then(|| Duration::from_micros(u64::from(micros)))
}

/// `getsockopt(fd, IPPROTO_TCP, TCP_INFO)`: neither socket2, nix nor rustix offer it.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn tcp_info_rtt_micros(fd: std::os::fd::RawFd) -> Option<u32> {
    let mut info = std::mem::MaybeUninit::<libc::tcp_info>::zeroed();
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `fd` is an open socket owned by the caller's `TcpStream` for the duration of
    // the call; `info` points to a writable, zero-initialised `tcp_info` of `len` bytes, and
    // the kernel writes at most `len` bytes (older kernels fewer, leaving zeros).
    let result = unsafe {
        libc::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_INFO, info.as_mut_ptr().cast::<libc::c_void>(), &mut len)
    };
    if result != 0 {
        return None;
    }
    // SAFETY: zero-initialised above (all-zero is a valid `tcp_info`: plain integers) and
    // possibly overwritten by the kernel with valid values.
    let info = unsafe { info.assume_init() };
    Some(info.tcpi_rtt)
}

#[cfg(not(target_os = "linux"))]
fn tcp_info_rtt_micros(_fd: std::os::fd::RawFd) -> Option<u32> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn handshake_both_ways_and_rtt_of_loopback() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("listen");
        let addr = listener.local_addr().expect("addr");
        let backoff = Backoff::new(Duration::from_millis(20), Duration::from_secs(2))
            .with_deadline(Clock::now() + Duration::from_secs(10));
        let (client, accepted) =
            tokio::join!(connect_with_backoff(addr, None, backoff, || {}, |_| {}), listener.accept());
        let client = client.expect("connect");
        let (server, _) = accepted.expect("accept");
        let (mut client_read, mut client_write) = client.into_split();
        let (mut server_read, mut server_write) = server.into_split();
        client_write.write_all(b"").await.expect("write");
        let (offered, accepted) = tokio::join!(
            offer_handshake(&mut client_read, &mut client_write),
            accept_handshake(&mut server_read, &mut server_write)
        );
        assert!(offered.expect("offer").is_empty());
        assert!(accepted.expect("accept").is_empty());
        let rtt = tcp_rtt(server_read.as_ref());
        if cfg!(target_os = "linux") {
            assert!(rtt.is_some_and(|rtt| rtt < Duration::from_secs(1)), "{rtt:?}");
        }
    }

    #[tokio::test]
    async fn connect_gives_up_at_the_deadline() {
        // A port nobody listens on: refused at once, every time.
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let backoff = Backoff::new(Duration::from_millis(5), Duration::from_millis(20))
            .with_deadline(Clock::now() + Duration::from_millis(200));
        let error = connect_with_backoff(addr, None, backoff, || {}, |_| {}).await.expect_err("nobody listens");
        assert!(error.attempts >= 3, "{error}");
        assert_eq!(error.last.kind(), io::ErrorKind::ConnectionRefused, "{error}");
    }
}
