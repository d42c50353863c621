//! LDM-6 clients over a blocking socket: [`notify`] (a remote `notifyme`) and [`push`]
//! (`ldmsend`), the sans-IO [`NotifyClient`] and [`PushClient`] driven the way the server
//! drives its sessions ([`crate::wait::wait_input`]). The command line keeps only its flags and
//! its printing: progress comes back through a callback, failures as a typed [`ClientError`].
//!
//! [`connect`] opens the connection for these clients and for the server's REQUEST downstreams
//! (`HOST[:PORT]`, port 388 by default, no IPv6 literals, as LDM); [`wait`] is the one blocking
//! read every driver of a sans-IO session makes (the server's sessions too).

pub mod wait;

use std::fmt;
use std::io::Write;
use std::net::{TcpStream, ToSocketAddrs};
use std::ops::ControlFlow;
use std::str::FromStr;
use std::time::Duration;

use ldm7_io::Clock;
use ldm7_ldm_proto::{NotifyClient, NotifyEvent, PushClient, PushEvent, SessionError};
use ldm7_types::{HostPort, HostPortError, Instant, ProdClass, ProdInfo, Signature};

use crate::wait::{Input, wait_input};

/// LDM's well-known port.
pub const LDM_PORT: u16 = 388;

/// How long a client waits for a connection (LDM's RPC timeout).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(25);

/// The longest a client blocks in one read before it looks at its session's timers again.
const READ_SLICE: Duration = Duration::from_secs(1);

/// Size of the read buffer of a client.
const READ_BUFFER_BYTES: usize = 64 << 10;

/// An LDM server's address as operators write it: `HOST[:PORT]` or `[IPv6]:PORT` (port 388 by
/// default).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerAddress {
    /// Host name, IPv4 address, or IPv6 address without brackets.
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl ServerAddress {
    /// `host` at `port`.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        Self { host: host.into(), port }
    }
}

impl FromStr for ServerAddress {
    type Err = AddressError;

    /// `host`, `host:port`, `[v6]`, `[v6]:port` or a bare IPv6 address ([`HostPort`]).
    fn from_str(text: &str) -> Result<Self, AddressError> {
        let parsed = HostPort::parse(text).map_err(AddressError)?;
        Ok(Self::new(parsed.host, parsed.port.unwrap_or(LDM_PORT)))
    }
}

impl fmt::Display for ServerAddress {
    /// `host:port`, an IPv6 address in brackets (`[2001:db8::1]:388`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&ldm7_types::host::join(&self.host, self.port))
    }
}

/// A server address that is not `HOST[:PORT]`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid server address {}: give HOST[:PORT] or [IPv6]:PORT (a host name, an IPv4 or IPv6 address; \
     port 1-65535, 388 by default)",
    .0
)]
pub struct AddressError(HostPortError);

/// Why a connection to an LDM server could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The host name does not resolve.
    #[error("cannot resolve {host}: {source}: check the host name")]
    Resolve {
        /// The host.
        host: String,
        /// Why.
        source: std::io::Error,
    },
    /// The host name resolves to nothing.
    #[error("{host} has no address: check the host name")]
    NoAddress {
        /// The host.
        host: String,
    },
    /// Nobody answered, or the connection was refused.
    #[error("cannot connect to {address}: {source}: is an LDM server running there?")]
    Connect {
        /// The server.
        address: ServerAddress,
        /// Why.
        source: std::io::Error,
    },
}

/// Opens a TCP connection to an LDM server: each of the host's addresses in the resolver's
/// order (IPv6 and IPv4 alike) until one answers, `timeout` at most for each.
pub fn connect(address: &ServerAddress, timeout: Duration) -> Result<TcpStream, ConnectError> {
    let candidates: Vec<_> = (address.host.as_str(), address.port)
        .to_socket_addrs()
        .map_err(|source| ConnectError::Resolve { host: address.host.clone(), source })?
        .collect();
    let mut last_error = None;
    for socket_address in candidates {
        match TcpStream::connect_timeout(&socket_address, timeout) {
            Ok(stream) => {
                stream.set_nodelay(true).ok();
                return Ok(stream);
            }
            Err(source) => last_error = Some(source),
        }
    }
    match last_error {
        Some(source) => Err(ConnectError::Connect { address: address.clone(), source }),
        None => Err(ConnectError::NoAddress { host: address.host.clone() }),
    }
}

/// Why a client session failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No connection.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The server refused the request or the offer (ALLOW / ACCEPT entries).
    #[error("{server}: {why}")]
    Refused {
        /// The server.
        server: ServerAddress,
        /// Why, as the session says it.
        why: String,
    },
    /// The session failed (a malformed record, a timeout, the connection closed early).
    #[error("{server}: {source}")]
    Session {
        /// The server.
        server: ServerAddress,
        /// Why.
        source: SessionError,
    },
    /// The server closed the connection before the work was done.
    #[error("{server} closed the connection before every product was sent: look at its log")]
    Closed {
        /// The server.
        server: ServerAddress,
    },
    /// Writing to the server failed.
    #[error("{server}: cannot write: {source}")]
    Write {
        /// The server.
        server: ServerAddress,
        /// Why.
        source: std::io::Error,
    },
    /// Reading from the server failed.
    #[error("{server}: cannot read: {source}")]
    Read {
        /// The server.
        server: ServerAddress,
        /// Why.
        source: std::io::Error,
    },
}

impl ClientError {
    /// Whether the failure is the operator's to fix (a bad address or a refusal) rather than
    /// one of the network or the server.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            ClientError::Refused { .. }
                | ClientError::Connect(ConnectError::Resolve { .. } | ConnectError::NoAddress { .. })
        )
    }

    /// Whether the session ended on its silence limit ([`NotifyOptions::silence`]): nothing
    /// arrived for that long.
    pub fn is_silence(&self) -> bool {
        matches!(self, ClientError::Session { source: SessionError::Silence(_), .. })
    }
}

/// What [`notify`] asks for.
#[derive(Clone, Debug)]
pub struct NotifyOptions {
    /// The upstream server.
    pub server: ServerAddress,
    /// The products to be told about (its `from`: how far back to start).
    pub class: ProdClass,
    /// The session ends after this long without a message (notifyme's `-T`, 300 s).
    pub silence: Duration,
    /// How long to wait for the connection.
    pub connect_timeout: Duration,
}

impl NotifyOptions {
    /// notifyme's defaults: 300 s of silence, a 25 s connection timeout.
    pub fn new(server: ServerAddress, class: ProdClass) -> Self {
        Self { server, class, silence: Duration::from_secs(300), connect_timeout: CONNECT_TIMEOUT }
    }
}

/// What a NOTIFYME session reports as it goes.
#[derive(Debug)]
pub enum NotifyProgress {
    /// The upstream accepted the request for this class.
    Accepted(ProdClass),
    /// The upstream allows only this subset; the session asked again for it.
    Reclassified(ProdClass),
    /// A product's metadata.
    Notification(ProdInfo),
}

/// Runs a NOTIFYME session: NOTIFYME, then NOTIFICATIONs until the upstream closes the
/// connection or `on_progress` breaks (both `Ok`); the silence limit ends it with
/// [`SessionError::Silence`].
pub fn notify(
    options: &NotifyOptions,
    mut on_progress: impl FnMut(NotifyProgress) -> ControlFlow<()>,
) -> Result<(), ClientError> {
    let server = &options.server;
    let mut connection = Connection::open(server, options.connect_timeout)?;
    let mut session = NotifyClient::new(Clock::now(), options.class.clone(), options.silence);
    loop {
        while let Some(event) = session.poll_event() {
            let progress = match event {
                NotifyEvent::Accepted { class, .. } => NotifyProgress::Accepted(class),
                NotifyEvent::Reclassified(class) => NotifyProgress::Reclassified(class),
                NotifyEvent::Notification(info) => NotifyProgress::Notification(info),
                NotifyEvent::Refused { why } => return Err(ClientError::Refused { server: server.clone(), why }),
                NotifyEvent::Closed(Ok(())) => return Ok(()),
                NotifyEvent::Closed(Err(source)) => {
                    return Err(ClientError::Session { server: server.clone(), source });
                }
            };
            if on_progress(progress).is_break() {
                return Ok(());
            }
        }
        session.take_output(&mut connection.out);
        match connection.exchange(session.poll_timeout())? {
            Input::Bytes(n) => session.handle_input(Clock::now(), &connection.buf[..n]),
            Input::Timeout => session.handle_timeout(Clock::now()),
            // Stopped comes only from `wait_input_or_stop`, which a client does not call.
            Input::Eof | Input::Stopped => session.handle_eof(),
        }
    }
}

/// What [`push`] asks for.
#[derive(Clone, Debug)]
pub struct PushOptions {
    /// The receiving server.
    pub server: ServerAddress,
    /// The class offered with HIYA (it must hold every product).
    pub class: ProdClass,
    /// How long to wait for the connection.
    pub connect_timeout: Duration,
}

impl PushOptions {
    /// ldmsend's defaults: a 25 s connection timeout.
    pub fn new(server: ServerAddress, class: ProdClass) -> Self {
        Self { server, class, connect_timeout: CONNECT_TIMEOUT }
    }
}

/// One product to push.
#[derive(Clone, Debug)]
pub struct PushProduct {
    /// Its metadata (the signature is the MD5 of `data`).
    pub info: ProdInfo,
    /// Its bytes.
    pub data: Vec<u8>,
}

/// What a push session reports as it goes.
#[derive(Debug)]
pub enum PushProgress<'a> {
    /// The receiver accepted a subset of the offer that does not hold this product: not sent.
    NotAccepted(&'a ProdInfo),
    /// The receiver declined this product (it has it already, or it is too big).
    Declined(Signature),
}

/// What a push session did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PushSummary {
    /// Products the receiver took.
    pub sent: u64,
    /// Products it declined.
    pub declined: u64,
    /// Products outside the class it accepted.
    pub not_accepted: u64,
}

/// Runs a HIYA push session: HIYA, every product (HEREIS up to the receiver's `max_hereis`,
/// COMINGSOON + BLKDATA above), then a NULLPROC flush whose reply ends the session.
pub fn push(
    options: &PushOptions,
    mut products: Vec<PushProduct>,
    mut on_progress: impl FnMut(PushProgress<'_>),
) -> Result<PushSummary, ClientError> {
    let server = &options.server;
    let mut connection = Connection::open(server, options.connect_timeout)?;
    let mut session = PushClient::new(Clock::now(), &options.class);
    let session_error = |source| ClientError::Session { server: server.clone(), source };
    let mut summary = PushSummary::default();
    let mut next = 0;
    let mut flushed = false;
    loop {
        while let Some(event) = session.poll_event() {
            match event {
                PushEvent::Accepted { class: accepted, .. } => {
                    // Products outside a reclassified offer are skipped.
                    products.retain(|product| {
                        let keep = accepted.matches_feed_ident(product.info.feedtype, &product.info.ident);
                        if !keep {
                            summary.not_accepted += 1;
                            on_progress(PushProgress::NotAccepted(&product.info));
                        }
                        keep
                    });
                }
                PushEvent::Refused { why } => return Err(ClientError::Refused { server: server.clone(), why }),
                PushEvent::Declined { signature } => {
                    summary.declined += 1;
                    summary.sent = summary.sent.saturating_sub(1);
                    on_progress(PushProgress::Declined(signature));
                }
                PushEvent::Flushed => flushed = true,
                PushEvent::Closed(Ok(())) => return Err(ClientError::Closed { server: server.clone() }),
                PushEvent::Closed(Err(source)) => return Err(session_error(source)),
            }
        }
        if flushed {
            return Ok(summary);
        }
        while session.ready() && next < products.len() {
            let product = &products[next];
            session.send_product(Clock::now(), &product.info, &product.data).map_err(session_error)?;
            summary.sent += 1;
            next += 1;
        }
        if session.ready() && next == products.len() {
            session.flush(Clock::now()).map_err(session_error)?;
            next += 1;
        }
        session.take_output(&mut connection.out);
        match connection.exchange(session.poll_timeout())? {
            Input::Bytes(n) => session.handle_input(Clock::now(), &connection.buf[..n]),
            Input::Timeout => session.handle_timeout(Clock::now()),
            // Stopped comes only from `wait_input_or_stop`, which a client does not call.
            Input::Eof | Input::Stopped => session.handle_eof(),
        }
    }
}

/// A client's socket and buffers.
struct Connection<'a> {
    server: &'a ServerAddress,
    stream: TcpStream,
    buf: Vec<u8>,
    out: Vec<u8>,
}

impl<'a> Connection<'a> {
    fn open(server: &'a ServerAddress, timeout: Duration) -> Result<Self, ClientError> {
        let stream = connect(server, timeout)?;
        Ok(Self { server, stream, buf: vec![0; READ_BUFFER_BYTES], out: Vec::new() })
    }

    /// Writes the session's output, then waits for input until its next timeout.
    fn exchange(&mut self, timeout: Option<Instant>) -> Result<Input, ClientError> {
        if !self.out.is_empty() {
            self.stream
                .write_all(&self.out)
                .map_err(|source| ClientError::Write { server: self.server.clone(), source })?;
            self.out.clear();
        }
        wait_input(&mut self.stream, &mut self.buf, timeout, READ_SLICE)
            .map_err(|source| ClientError::Read { server: self.server.clone(), source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_addresses_parse_as_ldm_writes_them() {
        assert_eq!("idd.example.edu".parse(), Ok(ServerAddress::new("idd.example.edu", 388)));
        assert_eq!("127.0.0.1:38800".parse(), Ok(ServerAddress::new("127.0.0.1", 38800)));
        for bad in ["", "host:", "host:0", "host:70000", "host:x", ":388", "a b"] {
            let error = bad.parse::<ServerAddress>().unwrap_err();
            assert!(error.to_string().contains("HOST[:PORT]"), "{bad:?}: {error}");
        }
        assert_eq!(ServerAddress::new("h", 1).to_string(), "h:1");
    }

    #[test]
    fn ipv6_server_addresses() {
        assert_eq!("[::1]:38800".parse(), Ok(ServerAddress::new("::1", 38800)));
        assert_eq!("2001:db8::1".parse(), Ok(ServerAddress::new("2001:db8::1", 388)));
        assert_eq!(ServerAddress::new("::1", 388).to_string(), "[::1]:388");
        for bad in ["::1:388:", "[::1", "[fe80::1]:388", "[host]:388"] {
            let error = bad.parse::<ServerAddress>().unwrap_err();
            assert!(error.to_string().contains("[IPv6]:PORT"), "{bad:?}: {error}");
        }
    }

    #[test]
    fn connects_over_ipv6_loopback() {
        let Ok(listener) = std::net::TcpListener::bind("[::1]:0") else {
            eprintln!("skipped: no IPv6 loopback here");
            return;
        };
        let port = listener.local_addr().unwrap().port();
        let stream = connect(&format!("[::1]:{port}").parse().unwrap(), Duration::from_secs(5)).unwrap();
        assert!(stream.peer_addr().unwrap().is_ipv6());
    }
}
