//! The TCP retransmission connection's plumbing shared by both ends (ldm7-multicast.md §3.1,
//! §3.7): the key-exchange blobs that open it, reading into a frame buffer, the receiver's
//! connect with back-off, keep-alive, and the round-trip time the kernel measures (Linux
//! `TCP_INFO`), which the sender feeds to `Sender::set_rtt`.
//!
//! Connection opening (§3.7): the receiver sends a fresh RSA-2048 public key (PEM, PKCS#1), the
//! sender answers with the RSA-OAEP encryption of its MAC key material (empty at MAC level 0;
//! see `ldm7_fmtp_proto::mac`), optionally followed by its identity's signature (the ldm7
//! extension a pinning receiver requires).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::BufMut;
use ldm7_fmtp_proto::mac::{KeyOffer, MacError, MacLevel, OfferKey, Verifier};
use ldm7_fmtp_proto::wire::{Split, handshake};
use ldm7_io::{Backoff, Clock};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use zeroize::Zeroizing;

/// Longest the key exchange may take before the connection is dropped (a peer that connects
/// and says nothing must not hold a connection for ever).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest one connection attempt may take (a host that does not answer at all).
pub const CONNECT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest read from a TCP connection at once.
pub(crate) const READ_CHUNK_BYTES: usize = 64 << 10;

/// The key the sender signs with now: its epoch (0 for the first; one more at each rotation)
/// and the material receivers are given.
#[derive(Clone)]
pub(crate) struct CurrentKey {
    pub epoch: u32,
    pub material: Arc<Zeroizing<Vec<u8>>>,
}

/// The key connection tasks hand out in the exchange, shared with the sender task, which
/// replaces it at each rotation — but not while an exchange that handed out the old one has not
/// reached the task yet: that receiver would take the old key, learn of the new one only after
/// the switch, and fail the check of every datagram between (the task then waits for it as for
/// any receiver given the new key; the tickets of such exchanges hold the switch back).
#[derive(Clone)]
pub(crate) struct KeyDesk(Arc<std::sync::Mutex<Desk>>);

struct Desk {
    current: CurrentKey,
    /// Exchanges that handed out `current` and whose receivers the sender task does not know yet.
    exchanges: usize,
}

impl KeyDesk {
    pub fn new(current: CurrentKey) -> Self {
        Self(Arc::new(std::sync::Mutex::new(Desk { current, exchanges: 0 })))
    }

    fn desk(&self) -> std::sync::MutexGuard<'_, Desk> {
        // A panic while holding the lock leaves a key and a count: nothing half-done to fear.
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The key to hand out, with the ticket that holds a switch back until the sender task has
    /// taken the receiver (or the exchange failed): drop it then.
    pub fn take(&self) -> (CurrentKey, ExchangeTicket) {
        let mut desk = self.desk();
        desk.exchanges += 1;
        (desk.current.clone(), ExchangeTicket(self.clone()))
    }

    /// Makes `key` the one handed out, unless an exchange holds the current one and `force` is
    /// not given. Returns whether it replaced the key and whether an exchange held it.
    pub fn replace(&self, key: CurrentKey, force: bool) -> (bool, bool) {
        let mut desk = self.desk();
        let held = desk.exchanges > 0;
        if held && !force {
            return (false, true);
        }
        desk.current = key;
        (true, held)
    }
}

/// An exchange's hold on the key it handed out (see [`KeyDesk`]).
pub(crate) struct ExchangeTicket(KeyDesk);

impl Drop for ExchangeTicket {
    fn drop(&mut self) {
        self.0.desk().exchanges -= 1;
    }
}

/// What the sender hands every receiver in the exchange.
#[derive(Clone)]
pub(crate) struct KeyAnswer {
    /// The MAC key material (§3.7) signing now; the sender task replaces it at each rotation.
    pub current: KeyDesk,
    /// The publisher's identity, signing each answer (the extension).
    pub identity: Option<Arc<ed25519_dalek::SigningKey>>,
}

/// What the sender side of the exchange returns: the bytes that followed the offer (the first
/// frames), the offer (later keys are sealed to it), the epoch of the key handed out and the
/// exchange's hold on that key.
pub(crate) type Accepted = (Vec<u8>, OfferKey, u32, ExchangeTicket);

/// Sender side of §3.7: reads the receiver's key offer, answers with the key material encrypted
/// to it.
pub(crate) async fn accept_handshake(
    read: &mut (impl AsyncRead + Unpin),
    write: &mut (impl AsyncWrite + Unpin),
    keys: &KeyAnswer,
) -> io::Result<Accepted> {
    let exchange = async {
        let (offer, rest) = read_blob(read).await?;
        let invalid = |error: MacError| io::Error::new(io::ErrorKind::InvalidData, error);
        let offer = OfferKey::parse(&offer).map_err(invalid)?;
        let (current, ticket) = keys.current.take();
        let encrypted =
            offer.answer(&current.material, keys.identity.as_deref(), &mut rand_core::OsRng).map_err(invalid)?;
        let mut answer = Vec::new();
        handshake::emit_blob(&encrypted, &mut answer).map_err(io::Error::other)?;
        write.write_all(&answer).await?;
        Ok((rest, offer, current.epoch, ticket))
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, exchange)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "the FMTP key exchange did not finish"))?
}

/// Why the receiver's side of the exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The connection failed or timed out.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// The answer cannot be used: levels differ, not pinned, not decryptable.
    #[error(transparent)]
    Key(#[from] MacError),
}

/// Receiver side of §3.7: offers a fresh key, opens the answer (checking the publisher's
/// signature when `pin` is given) and returns the check of multicast datagrams at `level`, with
/// the bytes that followed the answer and the offer (it opens the key updates of a rotating
/// sender).
pub(crate) async fn offer_handshake(
    read: &mut (impl AsyncRead + Unpin),
    write: &mut (impl AsyncWrite + Unpin),
    level: MacLevel,
    pin: Option<&ed25519_dalek::VerifyingKey>,
) -> Result<(Verifier, Vec<u8>, KeyOffer), HandshakeError> {
    let exchange = async {
        // RSA key generation takes tens of milliseconds: off the runtime's threads.
        let offer = tokio::task::spawn_blocking(|| KeyOffer::generate(&mut rand_core::OsRng))
            .await
            .map_err(|error| io::Error::other(error.to_string()))??;
        let mut blob = Vec::new();
        handshake::emit_blob(offer.pem(), &mut blob).map_err(io::Error::other)?;
        write.write_all(&blob).await?;
        let (answer, rest) = read_blob(read).await?;
        let material = offer.open(&answer, pin)?;
        Ok((Verifier::from_material(level, &material)?, rest, offer))
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, exchange)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "the FMTP key exchange did not finish"))?
}

/// Reads one length-prefixed blob; returns it and the bytes that followed it.
async fn read_blob(read: &mut (impl AsyncRead + Unpin)) -> io::Result<(Vec<u8>, Vec<u8>)> {
    let mut buffer = Vec::with_capacity(1024);
    loop {
        match handshake::split_blob(&buffer).map_err(io::Error::other)? {
            Split::Frame { frame, rest } => return Ok((frame.to_vec(), rest.to_vec())),
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
        let key = ldm7_fmtp_proto::mac::SenderKey::generate(MacLevel::Hmac, &mut rand_core::OsRng);
        let current = KeyDesk::new(CurrentKey { epoch: 0, material: Arc::new(key.material()) });
        let keys = KeyAnswer { current, identity: None };
        let (offered, accepted) = tokio::join!(
            offer_handshake(&mut client_read, &mut client_write, MacLevel::Hmac, None),
            accept_handshake(&mut server_read, &mut server_write, &keys)
        );
        let (verifier, rest, _offer) = offered.expect("offer");
        assert!(rest.is_empty());
        let (rest, _offer, epoch, _ticket) = accepted.expect("accept");
        assert!(rest.is_empty() && epoch == 0);
        let mut datagram = b"twelve bytes".to_vec();
        key.sign_in_place(&mut datagram);
        assert_eq!(verifier.verify(&datagram).expect("the handed-over key checks"), b"twelve bytes");
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

    #[test]
    fn an_exchange_holds_the_key_it_handed_out_until_its_ticket_drops() {
        let key = |epoch| CurrentKey { epoch, material: Arc::new(Zeroizing::new(vec![epoch as u8; 32])) };
        let desk = KeyDesk::new(key(0));
        let (handed, first) = desk.take();
        let (_, second) = desk.take();
        assert_eq!(handed.epoch, 0);
        assert_eq!(desk.replace(key(1), false), (false, true), "held by two exchanges");
        drop(first);
        assert_eq!(desk.replace(key(1), false), (false, true), "held by one");
        drop(second);
        assert_eq!(desk.replace(key(1), false), (true, false));
        let (handed, ticket) = desk.take();
        assert_eq!(handed.epoch, 1);
        assert_eq!(desk.replace(key(2), true), (true, true), "the deadline forces it");
        drop(ticket);
        assert_eq!(desk.take().0.epoch, 2);
    }
}
