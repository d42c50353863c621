//! Runs the sans-IO FMTP [`Receiver`] on real sockets (ldm7-multicast.md §3.9): it joins the
//! multicast group, opens the TCP retransmission connection to the sender — retrying with
//! back-off until [`ReceiverOptions::connect_deadline`] (§3.1: the reference retries every 5 s
//! for up to 120 s; we start at 20 ms and double to 2 s) — and follows the protocol's polling
//! order (transmit, events, timeout). The driver decides nothing about the protocol. The
//! connection's state ([`FmtpReceiver::connection`]: connecting, retrying, connected) lets an
//! application say that it waits for a sender that does not listen yet.
//!
//! Products are assembled in memory (`Assembly::Memory`, the default), or, with
//! [`ReceiverOptions::spool`], written into spool files ([`SpoolSink`]) so that no product is
//! held whole in memory; each delivery comes with its bytes as a [`ReceivedBytes`].
//!
//! Bounds ([`ReceiverBounds`], counted in [`ReceiverDriverCounters`], logged once per episode):
//! notices wait for the application in a bounded channel — when it is full the task waits
//! (multicast then queues in the socket buffer and what overflows is repaired), never drops
//! one; requests wait for the socket in a queue bounded in bytes — at the bound they stay in
//! the protocol's own (bounded) queue. Requests are written by a task of their own, so that a
//! sender that stops reading (its TCP backpressure) never stops this receiver from reading
//! repairs.

use std::collections::{HashSet, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ldm7_fmtp_proto::wire::{self, Body, Message, Split};
use ldm7_fmtp_proto::{
    Assembly, ConfigError, DeliveredProduct, MissReason, ProductIndex, Receiver, ReceiverBound, ReceiverConfig,
    ReceiverCounters, ReceiverEvent,
};
use ldm7_io::{Backoff, BoundHits, Clock, Throttle};
use md5::{Digest, Md5};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;

use crate::reader::{Batch, DatagramReader, ReaderCounterHandle, ReaderOptions};
use crate::spool::{SpoolSink, SpooledProduct, Taken};
use crate::stream::{ConnectError, HandshakeError, READ_CHUNK_BYTES, connect_with_backoff, offer_handshake, read_more};
use crate::udp::{MulticastConfig, MulticastReceiver, SocketError};
use ed25519_dalek::VerifyingKey;
use ldm7_fmtp_proto::lists::Refused;
use ldm7_fmtp_proto::mac::{KeyOffer, KeyRing, MacError, MacLevel, Verifier};

/// First pause between attempts to connect to the retransmission server.
pub const CONNECT_RETRY_MIN: Duration = Duration::from_millis(20);
/// Longest pause between attempts.
pub const CONNECT_RETRY_MAX: Duration = Duration::from_secs(2);

/// Longest time the protocol's timer waits for the datagrams already read to be handled.
const TIMER_HELD_MAX: Duration = Duration::from_secs(1);

/// How long a receiver asked to stop still writes the requests it has queued.
const FLUSH_ON_STOP: Duration = Duration::from_secs(1);
/// A product incomplete this long is said in the log (once), with where its repair stands.
const SLOW_PRODUCT: Duration = Duration::from_secs(60);
/// How often the products in flight are looked at for that.
const SLOW_PRODUCT_CHECK: Duration = Duration::from_secs(5);
/// How long a receiver holds a RETX_END for others to go with it. Each segment a receiver
/// writes costs the publisher a TCP acknowledgement (66 bytes on the wire) when nothing else
/// comes within its delayed-acknowledgement time; one RETX_END per product and receiver made
/// those 0.30% of the publisher's egress in the lab (8 subscribers, NGRID at 3×: 19,015
/// acknowledgements for 2,335 products). Any other request takes the held ones with it. Well
/// below the publisher's tail probe (200 ms), which would otherwise ask a receiver holding the
/// last product's RETX_END whether it finished.
const COMPLETION_HOLD: Duration = Duration::from_millis(50);
/// Held RETX_ENDs go out at once beyond this many bytes.
const COMPLETION_HOLD_BYTES: usize = 1024;
/// When the sender closed the connection, the multicast already received is taken until none
/// comes for this long ...
const DRAIN_QUIET: Duration = Duration::from_millis(100);
/// ... for at most this long.
const DRAIN_MAX: Duration = Duration::from_secs(2);
/// Default of [`ReceiverOptions::connect_deadline`] (the reference's 120 s).
pub const CONNECT_DEADLINE_DEFAULT: Duration = Duration::from_secs(120);

/// A protocol bound hit is logged at most this often (per bound), with the count.
const BOUND_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// The driver's own bounds (the protocol's are in [`ReceiverConfig`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReceiverBounds {
    /// Notices the application has not read; beyond it the receiver waits for the application.
    pub notices_max: usize,
    /// Request bytes waiting for the socket; beyond it requests stay queued in the protocol.
    pub request_queue_bytes_max: usize,
    /// Multicast bytes read by the reader thread and not yet taken by the receiver task; beyond
    /// it the thread stops reading and the socket buffer fills (`None`: the multicast socket
    /// buffer's size, [`MulticastConfig::buffer_bytes`]).
    pub read_queue_bytes_max: Option<usize>,
}

impl Default for ReceiverBounds {
    fn default() -> Self {
        Self { notices_max: 1024, request_queue_bytes_max: 64 << 10, read_queue_bytes_max: None }
    }
}

/// Settings of a receiver.
#[derive(Clone, Debug)]
pub struct ReceiverOptions {
    /// The group and the interface to join on.
    pub multicast: MulticastConfig,
    /// Source-specific join on this sender address (LDM-7 joins source-specifically).
    pub source: Option<IpAddr>,
    /// The sender's retransmission server.
    pub sender_retx: SocketAddr,
    /// The local address the retransmission connection comes from (`None`: the kernel's
    /// choice). LDM-7: the address the publisher handed out (ldm7-multicast.md §4.3).
    pub local_addr: Option<IpAddr>,
    /// Protocol settings (its `assembly` is overridden by [`spool`](Self::spool)).
    pub proto: ReceiverConfig,
    /// Write products into spool files in a fresh directory under this one instead of
    /// assembling them in memory.
    pub spool: Option<PathBuf>,
    /// With a spool, products smaller than this are still assembled in memory (0: none).
    pub spool_memory_below: u32,
    /// How long to keep trying to connect to the retransmission server.
    pub connect_deadline: Duration,
    /// Receive-side loss filter for tests and demos: drop this fraction (0 ≤ p < 1) of
    /// datagrams.
    pub drop_probability: f64,
    /// Seed of the loss filter.
    pub seed: u64,
    /// The driver's queue bounds.
    pub bounds: ReceiverBounds,
    /// MAC level of the multicast datagrams: the sender's (§3.7; not negotiated — a sender of
    /// another level is refused with a message naming its level).
    pub mac_level: MacLevel,
    /// The publisher's identity key: the key answer must be signed by it (an ldm7 extension;
    /// `None` accepts any answer, as the reference does).
    pub pin: Option<VerifyingKey>,
    /// Where the sender multicasts parity shards, when not to the group itself (joined on the
    /// same interface, from the same source; see `SenderOptions::parity_group`).
    pub parity_group: Option<SocketAddr>,
}

impl ReceiverOptions {
    /// Default options: assembly in memory, no loss filter, 120 s to connect.
    pub fn new(multicast: MulticastConfig, sender_retx: SocketAddr) -> Self {
        Self {
            multicast,
            source: None,
            sender_retx,
            local_addr: None,
            proto: ReceiverConfig::default(),
            spool: None,
            spool_memory_below: crate::spool::MEMORY_BELOW_DEFAULT,
            connect_deadline: CONNECT_DEADLINE_DEFAULT,
            drop_probability: 0.0,
            seed: 1,
            bounds: ReceiverBounds::default(),
            mac_level: MacLevel::None,
            pin: None,
            parity_group: None,
        }
    }
}

/// What the receiving application hears.
#[derive(Debug)]
pub enum ReceiverNotice {
    /// The retransmission connection to the sender is up.
    Connected(SocketAddr),
    /// A product arrived whole (`delivery.data` is empty: the bytes are in `product`).
    Delivered {
        /// The protocol's account of it.
        delivery: DeliveredProduct,
        /// Its bytes.
        product: ReceivedBytes,
    },
    /// Any other protocol event: missed products, index gaps, bounds hit.
    Event(ReceiverEvent),
}

/// Where the retransmission connection stands (see [`FmtpReceiver::connection`]): so that an
/// application can say it waits for a sender that does not listen yet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ConnectionState {
    /// The first attempt to connect is under way.
    #[default]
    Connecting,
    /// Attempts failed; the receiver retries until [`ReceiverOptions::connect_deadline`].
    Retrying {
        /// Attempts made so far.
        attempts: u64,
        /// Why the last one failed.
        last_error: String,
    },
    /// The connection is up (the key exchange done).
    Connected,
}

/// A delivered product's bytes.
#[derive(Debug)]
pub enum ReceivedBytes {
    /// Assembled in memory.
    Memory(Vec<u8>),
    /// In a spool file.
    Spooled(SpooledProduct),
    /// Not kept (`Assembly::Discard`).
    Discarded,
}

impl ReceivedBytes {
    /// Length in bytes (0 when discarded).
    pub fn len(&self) -> u64 {
        match self {
            Self::Memory(bytes) => bytes.len() as u64,
            Self::Spooled(spooled) => spooled.len(),
            Self::Discarded => 0,
        }
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The MD5 digest of the bytes.
    pub fn md5(&self) -> io::Result<[u8; 16]> {
        match self {
            Self::Memory(bytes) => Ok(Md5::digest(bytes).into()),
            Self::Spooled(spooled) => spooled.md5(),
            Self::Discarded => Err(discarded()),
        }
    }

    /// The bytes in memory.
    pub fn into_vec(self) -> io::Result<Vec<u8>> {
        match self {
            Self::Memory(bytes) => Ok(bytes),
            Self::Spooled(spooled) => spooled.to_vec(),
            Self::Discarded => Err(discarded()),
        }
    }

    /// Stores the bytes at `path` (a spooled product is renamed there).
    pub fn persist(self, path: &Path) -> io::Result<()> {
        match self {
            Self::Memory(bytes) => std::fs::write(path, bytes),
            Self::Spooled(spooled) => spooled.persist(path),
            Self::Discarded => Err(discarded()),
        }
    }
}

/// The MD5 of each input, in order: several hashed side by side in SIMD lanes (in about the time
/// of one), a single one as usual. For checks of products that wait together (an LDM-7
/// subscriber's inserter, `fmtp recv`).
pub fn md5_side_by_side(inputs: &[&[u8]]) -> Vec<[u8; 16]> {
    let mut digests = vec![[0u8; 16]; inputs.len()];
    match inputs {
        [] => {}
        [only] => digests[0] = Md5::digest(only).into(),
        many => md5_many::Md5Many::new().hash_many(many, &mut digests),
    }
    digests
}

fn discarded() -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, "the receiver discards product bytes (Assembly::Discard)")
}

/// The driver's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReceiverDriverCounters {
    /// Attempts to connect to the retransmission server.
    pub connect_attempts: u64,
    /// A notice found the application's channel full and the receiver waited.
    pub notices_full: u64,
    /// Requests were held in the protocol because the request queue was at its bound.
    pub request_queue_full: u64,
    /// Datagrams dropped by the receive-side loss filter.
    pub datagrams_dropped: u64,
    /// Datagrams dropped because their MAC did not verify (forged, damaged, another key).
    pub bad_mac: u64,
    /// Unsigned datagrams of a sender signing digest lists (MAC level 2) dropped because no
    /// verified list named them in time: their list was lost (the blocks are repaired), or they
    /// were forged.
    pub unlisted: u64,
    /// MAC keys taken from a rotating sender (KEY_UPDATE, acknowledged).
    pub key_updates: u64,
    /// Key updates refused: not signed by the pinned publisher, not decryptable, a replayed
    /// epoch, another level (logged).
    pub key_updates_refused: u64,
    /// Multicast datagrams the kernel dropped at this host's sockets because their buffer was
    /// full ("dropped at this host", apart from the path's loss; `SO_MEMINFO`).
    pub host_drops: u64,
    /// Times the reader thread's queue was at its bound (the receiver task fell behind).
    pub read_queue_full: u64,
}

/// What a receiver totals at its end.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReceiverReport {
    /// The protocol's counters.
    pub protocol: ReceiverCounters,
    /// The driver's counters.
    pub driver: ReceiverDriverCounters,
}

/// Why a receiver could not run or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReceiveError {
    /// Bad protocol settings.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The loss filter probability is not in [0, 1).
    #[error("drop probability {0} must be at least 0 and below 1")]
    DropProbability(f64),
    /// The multicast socket could not be set up.
    #[error(transparent)]
    Multicast(#[from] SocketError),
    /// The spool directory could not be created.
    #[error("cannot create the spool under {path}: {source}")]
    Spool {
        /// The parent directory.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The retransmission server could not be reached before the deadline.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The connection failed (key exchange, read, malformed stream, multicast read).
    #[error("FMTP receiver connection to {addr}: {source}")]
    Connection {
        /// The sender's retransmission server.
        addr: SocketAddr,
        /// Why.
        source: io::Error,
    },
    /// The key exchange's answer cannot be used: the sender uses another MAC level, the answer
    /// is not signed by the pinned publisher key, or it does not decrypt.
    #[error("FMTP key exchange with {addr}: {source}")]
    Key {
        /// The sender's retransmission server.
        addr: SocketAddr,
        /// Why.
        source: MacError,
    },
    /// The receiver task panicked or was cancelled.
    #[error("the FMTP receiver task ended abnormally: {0}")]
    Task(String),
}

/// A running receiver: read its notices, then [`finish`](Self::finish) it. Dropping it stops
/// the receiver.
#[derive(Debug)]
pub struct FmtpReceiver {
    notices: mpsc::Receiver<ReceiverNotice>,
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<ReceiverCounters, ReceiveError>>,
    counters: watch::Receiver<ReceiverCounters>,
    connection: watch::Receiver<ConnectionState>,
    shared: Arc<Shared>,
}

impl FmtpReceiver {
    /// Joins the multicast group (errors at once) and starts the receiver task, which connects
    /// to the sender in the background (inside a tokio runtime).
    pub fn start(options: ReceiverOptions) -> Result<Self, ReceiveError> {
        if !(0.0..1.0).contains(&options.drop_probability) {
            return Err(ReceiveError::DropProbability(options.drop_probability));
        }
        let spool = match &options.spool {
            Some(parent) => Some(
                SpoolSink::new(parent)
                    .map_err(|source| ReceiveError::Spool { path: parent.clone(), source })?
                    .with_memory_below(options.spool_memory_below),
            ),
            None => None,
        };
        let mut proto = options.proto.clone();
        if let Some(parity) = &mut proto.parity {
            // Shards are as long as the sender's blocks, shortened by the MAC as they are.
            parity.block_len = crate::udp::payload_len_max(options.multicast.group) - options.mac_level.mac_len();
        }
        let receiver = match &spool {
            Some(spool) => Receiver::with_sink(proto, spool.clone())?,
            None => Receiver::new(proto)?,
        };
        let udp = MulticastReceiver::join(&options.multicast, options.source)?;
        let group = options.multicast.group;
        let socket_error = |call| move |source| ReceiveError::Multicast(SocketError::Io { call, group, source });
        let queue_bytes_max = options.bounds.read_queue_bytes_max.unwrap_or(options.multicast.buffer_bytes);
        let mut sockets = vec![udp.into_reader_socket().map_err(socket_error("socket"))?];
        if let Some(parity_group) = options.parity_group.filter(|to| *to != group) {
            let config = MulticastConfig { group: parity_group, ..options.multicast.clone() };
            let parity = MulticastReceiver::join(&config, options.source)?;
            sockets.push(parity.into_reader_socket().map_err(socket_error("socket"))?);
        }
        let reader =
            DatagramReader::spawn(sockets, ReaderOptions { queue_bytes_max }).map_err(socket_error("reader thread"))?;
        let shared = Arc::new(Shared { reader: Some(reader.counter_handle()), ..Shared::default() });
        let (notice_tx, notices) = mpsc::channel(options.bounds.notices_max.max(1));
        let (stop, stop_rx) = watch::channel(false);
        let (counters_tx, counters) = watch::channel(ReceiverCounters::default());
        let (connection_tx, connection) = watch::channel(ConnectionState::Connecting);
        let task = ReceiverTask {
            options,
            connection: connection_tx,
            receiver,
            spool,
            notices: Notices::new(notice_tx, shared.clone()),
            shared: shared.clone(),
            counters: counters_tx,
            drop_filter: None,
            bound_log: Throttle::new(BOUND_LOG_INTERVAL),
            keys: None,
            offer: None,
            key_acks: Vec::new(),
            completions: HeldCompletions::default(),
            slow: (HashSet::new(), None),
        };
        let task = tokio::spawn(task.run(reader, stop_rx));
        Ok(Self { notices, stop, task, counters, connection, shared })
    }

    /// The retransmission connection's state, as it changes (a failed connection ends the
    /// receiver: [`finish`](Self::finish) says why).
    pub fn connection(&self) -> watch::Receiver<ConnectionState> {
        self.connection.clone()
    }

    /// The next notice; `None` once the receiver ended (then [`finish`](Self::finish) says
    /// why).
    pub async fn next_notice(&mut self) -> Option<ReceiverNotice> {
        self.notices.recv().await
    }

    /// The protocol counters as of the last loop turn.
    pub fn counters(&self) -> ReceiverCounters {
        self.counters.borrow().clone()
    }

    /// The driver's counters now.
    pub fn driver_counters(&self) -> ReceiverDriverCounters {
        self.shared.snapshot()
    }

    /// Bytes of multicast the reader thread read and the receiver has not handled yet: more
    /// than 0 while the receiver is behind the multicast (a loaded host), when what its
    /// counters say lags what came.
    pub fn unhandled_bytes(&self) -> usize {
        self.shared.reader.as_ref().map_or(0, ReaderCounterHandle::queued_bytes)
    }

    /// Where the application hands back the bytes of the products it is done with, so that
    /// later products are assembled in the same memory (see `Receiver::give_back_buffer`).
    pub fn buffer_return(&self) -> BufferReturn {
        BufferReturn(self.shared.clone())
    }

    /// Asks the receiver to stop, without waiting: the requests it holds go out (the
    /// RETX_ENDs of products delivered, held up to 50 ms for others to go with
    /// them, so that the sender releases those products now), then it ends. [`Self::finish`]
    /// waits for the end and returns the totals.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }

    /// Stops the receiver (if it still runs) and returns its totals, or why it ended.
    pub async fn finish(mut self) -> Result<ReceiverReport, ReceiveError> {
        self.notices.close();
        let _ = self.stop.send(true);
        let result = (&mut self.task).await;
        let protocol = match result {
            Ok(Ok(counters)) => counters,
            Ok(Err(error)) => return Err(error),
            Err(error) => return Err(ReceiveError::Task(error.to_string())),
        };
        Ok(ReceiverReport { protocol, driver: self.shared.snapshot() })
    }
}

/// Hands delivered products' buffers back to their receiver ([`FmtpReceiver::buffer_return`]);
/// usable from any thread, and after the receiver ended (then they are freed).
#[derive(Clone, Debug)]
pub struct BufferReturn(Arc<Shared>);

impl BufferReturn {
    /// Gives back a product's bytes: a buffer in memory is kept for reuse (at most
    /// [`ldm7_fmtp_proto::SPARE_BUFFERS_MAX`] wait for the receiver; others are freed).
    pub fn give(&self, product: ReceivedBytes) {
        if let ReceivedBytes::Memory(buffer) = product {
            let mut returned = self.0.returned_buffers.lock().unwrap_or_else(PoisonError::into_inner);
            if returned.len() < ldm7_fmtp_proto::SPARE_BUFFERS_MAX {
                returned.push(buffer);
            }
        }
    }
}

impl Drop for FmtpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Debug, Default)]
struct Shared {
    /// Product buffers handed back ([`BufferReturn`]), for the task to reuse.
    returned_buffers: Mutex<Vec<Vec<u8>>>,
    connect_attempts: AtomicU64,
    notices: BoundHits,
    request_queue: BoundHits,
    datagrams_dropped: AtomicU64,
    bad_mac: AtomicU64,
    unlisted: AtomicU64,
    key_updates: AtomicU64,
    key_updates_refused: AtomicU64,
    reader: Option<ReaderCounterHandle>,
}

impl Shared {
    /// Counts what a batch's check refused.
    fn count_refused(&self, refused: Refused) {
        if refused.bad_mac > 0 {
            self.bad_mac.fetch_add(refused.bad_mac, Ordering::Relaxed);
        }
        if refused.unlisted > 0 {
            self.unlisted.fetch_add(refused.unlisted, Ordering::Relaxed);
        }
    }

    fn snapshot(&self) -> ReceiverDriverCounters {
        let reader = self.reader.as_ref().map(ReaderCounterHandle::counters).unwrap_or_default();
        ReceiverDriverCounters {
            host_drops: reader.host_drops,
            read_queue_full: reader.queue_full,
            connect_attempts: self.connect_attempts.load(Ordering::Relaxed),
            notices_full: self.notices.count(),
            request_queue_full: self.request_queue.count(),
            datagrams_dropped: self.datagrams_dropped.load(Ordering::Relaxed),
            bad_mac: self.bad_mac.load(Ordering::Relaxed),
            unlisted: self.unlisted.load(Ordering::Relaxed),
            key_updates: self.key_updates.load(Ordering::Relaxed),
            key_updates_refused: self.key_updates_refused.load(Ordering::Relaxed),
        }
    }
}

/// Multicast datagrams read while the key exchange runs: the newest kept, up to
/// [`EarlyDatagrams::BYTES_MAX`].
#[derive(Debug, Default)]
struct EarlyDatagrams {
    datagrams: VecDeque<Vec<u8>>,
    bytes: usize,
}

impl EarlyDatagrams {
    /// Bound on the bytes kept (about a second of a 30 Mbit/s feed).
    const BYTES_MAX: usize = 4 << 20;

    fn push(&mut self, datagram: &[u8]) {
        self.bytes += datagram.len();
        self.datagrams.push_back(datagram.to_vec());
        while self.bytes > Self::BYTES_MAX {
            let Some(oldest) = self.datagrams.pop_front() else { break };
            self.bytes -= oldest.len();
        }
    }
}

/// Requests between the receiver task and its writer task.
#[derive(Debug, Default)]
struct RequestQueue {
    queued_bytes: AtomicUsize,
    drained: Notify,
}

struct ReceiverTask {
    options: ReceiverOptions,
    connection: watch::Sender<ConnectionState>,
    receiver: Receiver,
    spool: Option<SpoolSink>,
    notices: Notices,
    shared: Arc<Shared>,
    counters: watch::Sender<ReceiverCounters>,
    drop_filter: Option<DropFilter>,
    /// Protocol bound hits: logged once, then at most once a minute per bound with the count.
    bound_log: Throttle<ReceiverBound>,
    /// Checks multicast datagrams: set by the key exchange, before any is read.
    keys: Option<KeyRing>,
    /// This connection's offer: opens the sender's key updates.
    offer: Option<KeyOffer>,
    /// KEY_ACKs to send.
    key_acks: Vec<u8>,
    /// RETX_ENDs held ([`COMPLETION_HOLD`]).
    completions: HeldCompletions,
    /// Products incomplete for [`SLOW_PRODUCT`] already said, and when to look again.
    slow: (HashSet<ProductIndex>, Option<std::time::Instant>),
}

/// RETX_ENDs held for others to go with them ([`COMPLETION_HOLD`]).
#[derive(Debug, Default)]
struct HeldCompletions {
    bytes: Vec<u8>,
    /// When the first was held.
    since: Option<tokio::time::Instant>,
}

impl HeldCompletions {
    /// When they are to go out.
    fn due_at(&self) -> Option<tokio::time::Instant> {
        self.since.map(|since| since + COMPLETION_HOLD)
    }

    /// Whether they are to go out now.
    fn due(&self, now: tokio::time::Instant) -> bool {
        self.bytes.len() >= COMPLETION_HOLD_BYTES || self.due_at().is_some_and(|at| at <= now)
    }

    /// Moves them to the end of `outgoing`.
    fn send_with(&mut self, outgoing: &mut Vec<u8>) {
        outgoing.append(&mut self.bytes);
        self.since = None;
    }
}

impl ReceiverTask {
    /// Says each product incomplete for [`SLOW_PRODUCT`], once, with where its repair stands
    /// (a product is given up after the receiver's `incomplete_timeout`, ten minutes by
    /// default: an operator should not wait that long to hear of it).
    fn say_slow_products(&mut self) {
        let now = std::time::Instant::now();
        if self.slow.1.is_some_and(|at| now < at) {
            return;
        }
        self.slow.1 = Some(now + SLOW_PRODUCT_CHECK);
        let slow = self.receiver.in_flight_for(SLOW_PRODUCT);
        self.slow.0.retain(|index| slow.iter().any(|product| product.index == *index));
        for product in &slow {
            if self.slow.0.insert(product.index) {
                tracing::warn!(
                    index = product.index.0,
                    "FMTP receiver: product incomplete for {} s: {:?}",
                    product.age.as_secs(),
                    product
                );
            }
        }
    }
}

/// Why the receive loop stopped without an error.
enum Stopped {
    /// Asked to, or the application went away.
    Asked,
    /// The sender closed the connection (§3.9: the receiver stops; LDM-7 restarts the session).
    SenderClosed,
}

impl ReceiverTask {
    async fn run(
        mut self,
        mut reader: DatagramReader,
        mut stop: watch::Receiver<bool>,
    ) -> Result<ReceiverCounters, ReceiveError> {
        let addr = self.options.sender_retx;
        let connection = |source| ReceiveError::Connection { addr, source };
        if self.options.drop_probability > 0.0 {
            self.drop_filter = Some(DropFilter::new(self.options.drop_probability, self.options.seed));
        }
        let backoff = Backoff::new(CONNECT_RETRY_MIN, CONNECT_RETRY_MAX)
            .with_deadline(Clock::now() + self.options.connect_deadline);
        let shared = self.shared.clone();
        let (retry_shared, connection_state) = (self.shared.clone(), self.connection.clone());
        let on_attempt = move || {
            shared.connect_attempts.fetch_add(1, Ordering::Relaxed);
        };
        let on_retry = move |error: &io::Error| {
            let attempts = retry_shared.connect_attempts.load(Ordering::Relaxed);
            connection_state.send_replace(ConnectionState::Retrying { attempts, last_error: error.to_string() });
        };
        if self.options.proto.parity.is_some() {
            // Before it joins: a table built at the first decode holds up the datagrams behind it.
            let _ = tokio::task::spawn_blocking(ldm7_fmtp_proto::parity::prepare_tables).await;
        }
        let connecting = connect_with_backoff(addr, self.options.local_addr, backoff, on_attempt, on_retry);
        let stream = tokio::select! {
            stream = connecting => stream?,
            () = stopped(&mut stop) => return Ok(self.receiver.counters().clone()),
        };
        stream.set_nodelay(true).map_err(connection)?;
        let (mut read, mut write) = stream.into_split();
        let pin = self.options.pin;
        let (verifier, mut stream_buffer, offer, early) = {
            let handshake = offer_handshake(&mut read, &mut write, self.options.mac_level, pin.as_ref());
            tokio::pin!(handshake);
            // The multicast is read meanwhile (the sender may start as soon as it answered, and a
            // socket buffer left to fill — with a forger's junk, say — would lose the first
            // products): the newest datagrams are kept, up to a bound, and taken once the key is
            // known.
            let mut early = EarlyDatagrams::default();
            let (verifier, stream_buffer, offer) = loop {
                tokio::select! {
                    answer = &mut handshake => break answer.map_err(|error| match error {
                        HandshakeError::Io(source) => ReceiveError::Connection { addr, source },
                        HandshakeError::Key(source) => ReceiveError::Key { addr, source },
                    })?,
                    received = reader.next() => {
                        for datagram in read_batch(received).map_err(connection)?.datagrams() {
                            early.push(datagram);
                        }
                    }
                    () = stopped(&mut stop) => return Ok(self.receiver.counters().clone()),
                }
            };
            (verifier, stream_buffer, offer, early)
        };
        tracing::info!(sender = %addr, "FMTP receiver connected");
        self.connection.send_replace(ConnectionState::Connected);
        let (anchor, wall) = Clock::wall_anchor();
        self.receiver.set_wall_clock(anchor, wall);
        if self.notices.send(ReceiverNotice::Connected(addr)).await.is_err() {
            return Ok(self.receiver.counters().clone());
        }
        let queue = Arc::new(RequestQueue::default());
        let (requests, request_rx) = mpsc::unbounded_channel();
        let mut writer = tokio::spawn(write_requests(write, request_rx, queue.clone()));
        let now = Clock::now();
        let mut keys = KeyRing::new(verifier);
        let early: Vec<&[u8]> = early.datagrams.iter().map(Vec::as_slice).collect();
        let receiver = &mut self.receiver;
        let refused = keys.check_batch(now, &early, |message| receiver.handle_datagram(now, message));
        self.shared.count_refused(refused);
        self.keys = Some(keys);
        self.offer = Some(offer);
        let result = self.receive(&mut reader, &mut read, &mut stream_buffer, &requests, &queue, &mut stop).await;
        if matches!(result, Ok(Stopped::Asked)) {
            // What the stop leaves unfinished is said, each with where it stands.
            let unfinished = self.receiver.in_flight();
            if !unfinished.is_empty() {
                tracing::warn!(
                    products = unfinished.len(),
                    "FMTP receiver: products unfinished at the stop (first: {:?})",
                    &unfinished[..unfinished.len().min(20)]
                );
            }
            // Asked to stop: what is queued still goes out (the RETX_END of products already
            // delivered, so that the sender need not hold them until its deadline), briefly.
            let mut held = Vec::new();
            self.completions.send_with(&mut held);
            if !held.is_empty() {
                queue.queued_bytes.fetch_add(held.len(), Ordering::SeqCst);
                let _ = requests.send(held);
            }
            drop(requests);
            if tokio::time::timeout(FLUSH_ON_STOP, &mut writer).await.is_err() {
                tracing::info!(sender = %addr, "FMTP receiver: requests still queued at the stop are dropped");
            }
        }
        writer.abort();
        match result {
            Ok(Stopped::Asked) => {}
            Ok(Stopped::SenderClosed) => {
                tracing::info!(sender = %addr, "FMTP sender closed the connection");
                self.drain_multicast(&mut reader).await;
                // What was in flight will not come: say so (never silently lost).
                self.receiver.disconnected(Clock::now());
                while let Some(event) = self.receiver.poll_event() {
                    let notice = self.notice_of(event);
                    if self.notices.send(notice).await.is_err() {
                        break;
                    }
                }
            }
            Err(error) => return Err(connection(error)),
        }
        Ok(self.receiver.counters().clone())
    }

    /// The receive loop.
    async fn receive(
        &mut self,
        reader: &mut DatagramReader,
        read: &mut tokio::net::tcp::OwnedReadHalf,
        stream_buffer: &mut Vec<u8>,
        requests: &mpsc::UnboundedSender<Vec<u8>>,
        queue: &RequestQueue,
        stop: &mut watch::Receiver<bool>,
    ) -> io::Result<Stopped> {
        let request_bytes_max = self.options.bounds.request_queue_bytes_max.max(1);
        // Frames that came with the key exchange's answer.
        self.handle_stream(stream_buffer)?;
        loop {
            self.say_slow_products();
            // 1. Requests, up to the queue's bound (key acknowledgements first).
            let mut outgoing = std::mem::take(&mut self.key_acks);
            let mut held_back = false;
            loop {
                if queue.queued_bytes.load(Ordering::SeqCst) + outgoing.len() >= request_bytes_max {
                    held_back = true;
                    break;
                }
                let Some(message) = self.receiver.poll_transmit() else { break };
                if matches!(message.body, Body::RetxEnd) {
                    message.emit_to_vec(&mut self.completions.bytes).map_err(io::Error::other)?;
                    self.completions.since.get_or_insert_with(tokio::time::Instant::now);
                    continue;
                }
                // The RETX_ENDs held go first, in the order they came.
                self.completions.send_with(&mut outgoing);
                message.emit_to_vec(&mut outgoing).map_err(io::Error::other)?;
            }
            if self.completions.due(tokio::time::Instant::now()) {
                self.completions.send_with(&mut outgoing);
            }
            if !outgoing.is_empty() {
                queue.queued_bytes.fetch_add(outgoing.len(), Ordering::SeqCst);
                // A closed writer means the connection failed: the read side reports it.
                let _ = requests.send(outgoing);
            }
            if held_back {
                if self.shared.request_queue.hit() {
                    tracing::info!(
                        bound = request_bytes_max,
                        "FMTP receiver: request queue full (the sender reads slowly); requests wait"
                    );
                }
            } else {
                self.shared.request_queue.relieved();
            }
            // 2. Events.
            while let Some(event) = self.receiver.poll_event() {
                let notice = self.notice_of(event);
                if self.notices.send(notice).await.is_err() {
                    return Ok(Stopped::Asked);
                }
            }
            self.counters.send_if_modified(|counters| {
                let changed = counters != self.receiver.counters();
                if changed {
                    counters.clone_from(self.receiver.counters());
                }
                changed
            });
            // 3. Wait for a datagram, a repair, the timer, room for requests, or the stop. The
            // timer waits while datagrams already read wait too (up to TIMER_HELD_MAX): a
            // receiver behind the multicast would otherwise take the blocks still queued for
            // lost and ask for them again.
            let timer = self.receiver.poll_timeout().map(Clock::to_std);
            let overdue =
                timer.is_some_and(|at| std::time::Instant::now().saturating_duration_since(at) >= TIMER_HELD_MAX);
            let sleep_until = timer.filter(|_| reader.is_idle() || overdue).map(tokio::time::Instant::from_std);
            let flush_at = self.completions.due_at();
            tokio::select! {
                received = reader.next() => {
                    let batch = read_batch(received)?;
                    self.take_batch(&batch, reader.is_idle());
                    reader.recycle(batch);
                }
                read_count = read_more(read, stream_buffer, READ_CHUNK_BYTES) => {
                    match read_count {
                        Ok(_) => {
                            // Whether datagrams received before these frames still wait (read,
                            // or still in the sockets): a RETX_EOP then waits for them
                            // (RETX_EOP_DEFER_MAX).
                            self.receiver.set_backlog(Clock::now(), !reader.is_caught_up());
                            self.handle_stream(stream_buffer)?;
                        }
                        Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(Stopped::SenderClosed),
                        Err(error) => return Err(error),
                    }
                }
                () = async { tokio::time::sleep_until(sleep_until.expect("guarded")).await }, if sleep_until.is_some() => {
                    // Datagrams still in the sockets (the reader thread too waits to be
                    // scheduled on a busy host) may hold the shards a parity retry would ask
                    // for again: the retry waits for them as for those read.
                    self.receiver.set_backlog(Clock::now(), !reader.is_caught_up());
                    self.receiver.handle_timeout(Clock::now());
                }
                () = queue.drained.notified(), if held_back => {}
                () = async { tokio::time::sleep_until(flush_at.expect("guarded")).await }, if flush_at.is_some() => {}
                () = stopped(stop) => return Ok(Stopped::Asked),
            }
        }
    }

    /// Hands a read's datagrams to the protocol, through the loss filter and the MAC check.
    fn take_batch(&mut self, batch: &Batch, reader_idle: bool) {
        let now = Clock::now();
        // Product buffers the application is done with, for the products this read may begin.
        let returned =
            std::mem::take(&mut *self.shared.returned_buffers.lock().unwrap_or_else(PoisonError::into_inner));
        for buffer in returned {
            self.receiver.give_back_buffer(buffer);
        }
        // The datagrams of a read are checked together (at level 2, as Ed25519 batches: about
        // half the work of checking each alone).
        let mut kept: Vec<&[u8]> = Vec::with_capacity(batch.len());
        for datagram in batch.datagrams() {
            if self.drop_filter.as_mut().is_some_and(DropFilter::drops) {
                self.shared.datagrams_dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            kept.push(datagram);
        }
        // Unsigned datagrams of a level-2 sender signing digest lists wait for theirs.
        if let Some(keys) = self.keys.as_mut() {
            let receiver = &mut self.receiver;
            let refused = keys.check_batch(now, &kept, |message| receiver.handle_datagram(now, message));
            self.shared.count_refused(refused);
        }
        // Parity requests wait while more datagrams do (the shards others asked for may be
        // among them).
        self.receiver.set_backlog(now, !reader_idle);
    }

    /// Takes the multicast already received when the sender closed the connection: a sender
    /// that finished quickly (all released, or its repairs given up) may close it before a
    /// loaded receiver read the datagrams it sent. They are taken until none comes for
    /// [`DRAIN_QUIET`], for at most [`DRAIN_MAX`]; what they leave unfinished is missed.
    async fn drain_multicast(&mut self, reader: &mut DatagramReader) {
        let until = tokio::time::Instant::now() + DRAIN_MAX;
        loop {
            let quiet = (tokio::time::Instant::now() + DRAIN_QUIET).min(until);
            match tokio::time::timeout_at(quiet, reader.next()).await {
                Ok(Some(Ok(batch))) => {
                    self.take_batch(&batch, reader.is_idle());
                    reader.recycle(batch);
                }
                Ok(_) | Err(_) => break,
            }
        }
    }

    /// Hands the whole frames at the front of the buffer to the protocol.
    fn handle_stream(&mut self, stream_buffer: &mut Vec<u8>) -> io::Result<()> {
        let now = Clock::now();
        let mut consumed = 0;
        loop {
            match wire::split_frame(&stream_buffer[consumed..]) {
                Ok(Split::Frame { frame, rest }) => {
                    if let Ok(Message { index, body: Body::KeyUpdate { sealed } }) = Message::parse(frame) {
                        // The rotation extension is the driver's: the protocol never sees it.
                        self.key_update(index.0, sealed);
                    } else if let Err(error) = self.receiver.handle_stream_frame(now, frame) {
                        tracing::warn!(%error, "FMTP receiver: malformed message from the sender");
                    }
                    consumed = stream_buffer.len() - rest.len();
                }
                Ok(Split::Incomplete { .. }) => break,
                Err(error) => return Err(io::Error::new(io::ErrorKind::InvalidData, error)),
            }
        }
        stream_buffer.drain(..consumed);
        Ok(())
    }

    /// Takes a rotating sender's next key and acknowledges it; a key that cannot be taken is
    /// logged and counted (datagrams signed with it will fail their check and be repaired).
    fn key_update(&mut self, epoch: u32, sealed: &[u8]) {
        let (Some(offer), Some(keys)) = (&self.offer, &mut self.keys) else { return };
        let taken = offer
            .open_update(epoch, sealed, self.options.pin.as_ref())
            .and_then(|material| Verifier::from_material(keys.level(), &material))
            .and_then(|next| keys.announce(Clock::now(), epoch, next));
        match taken {
            Ok(()) => {
                self.shared.key_updates.fetch_add(1, Ordering::Relaxed);
                let ack = Message { index: ProductIndex(epoch), body: Body::KeyAck };
                // A bodiless message always emits.
                let _ = ack.emit_to_vec(&mut self.key_acks);
            }
            Err(error) => {
                self.shared.key_updates_refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(epoch, %error, "FMTP receiver: refused the sender's new MAC key");
            }
        }
    }

    /// The application's view of a protocol event: a delivery with its bytes.
    fn notice_of(&mut self, event: ReceiverEvent) -> ReceiverNotice {
        let ReceiverEvent::Delivered(mut delivery) = event else {
            if let ReceiverEvent::BoundHit { bound, index } = &event
                && let Some(count) = self.bound_log.event(*bound, Clock::now())
            {
                tracing::warn!(
                    ?bound,
                    index = index.map(|i| i.0),
                    count,
                    "FMTP receiver: protocol bound hit (logged at most once a minute)"
                );
            }
            return ReceiverNotice::Event(event);
        };
        let product = match (self.receiver_assembly(), &self.spool) {
            (Assembly::Sink, Some(spool)) => match spool.take(delivery.index) {
                Some(Taken::File(spooled)) => ReceivedBytes::Spooled(spooled),
                Some(Taken::Memory(bytes, _)) => ReceivedBytes::Memory(bytes),
                None => {
                    tracing::error!(index = delivery.index.0, "FMTP receiver: a delivered product is not in the spool");
                    let index = delivery.index;
                    return ReceiverNotice::Event(ReceiverEvent::Missed { index, reason: MissReason::SinkFailed });
                }
            },
            (Assembly::Discard, _) => ReceivedBytes::Discarded,
            _ => ReceivedBytes::Memory(std::mem::take(&mut delivery.data)),
        };
        ReceiverNotice::Delivered { delivery, product }
    }

    fn receiver_assembly(&self) -> Assembly {
        if self.spool.is_some() { Assembly::Sink } else { self.options.proto.assembly }
    }
}

/// The application's notice channel, counting when it is full.
struct Notices {
    notices: mpsc::Sender<ReceiverNotice>,
    shared: Arc<Shared>,
    /// When an episode of a full channel was last logged: an application that keeps up only
    /// just starts one every few notices (a demo subscriber logged 114 lines in a minute).
    logged: std::sync::Mutex<Option<std::time::Instant>>,
}

impl Notices {
    fn new(notices: mpsc::Sender<ReceiverNotice>, shared: Arc<Shared>) -> Self {
        Self { notices, shared, logged: std::sync::Mutex::new(None) }
    }

    /// Whether a full channel may be logged now (the first time, then once a minute).
    fn log_due(&self) -> bool {
        let Ok(mut logged) = self.logged.lock() else { return false };
        let now = std::time::Instant::now();
        if logged.is_some_and(|at| now.saturating_duration_since(at) < BOUND_LOG_INTERVAL) {
            return false;
        }
        *logged = Some(now);
        true
    }

    /// Hands a notice to the application, waiting while its channel is full; `Err` when the
    /// application went away.
    async fn send(&self, notice: ReceiverNotice) -> Result<(), ()> {
        match self.notices.try_send(notice) {
            Ok(()) => {
                self.shared.notices.relieved();
                Ok(())
            }
            Err(TrySendError::Closed(_)) => Err(()),
            Err(TrySendError::Full(notice)) => {
                if self.shared.notices.hit() && self.log_due() {
                    tracing::info!(
                        bound = self.notices.max_capacity(),
                        times = self.shared.notices.count(),
                        "FMTP receiver: the application is not reading notices; receiving waits \
                         (logged at most once a minute)"
                    );
                }
                self.notices.send(notice).await.map_err(|_| ())
            }
        }
    }
}

/// A batch from the reader thread, or why it ended.
fn read_batch(received: Option<io::Result<Batch>>) -> io::Result<Batch> {
    received.unwrap_or_else(|| Err(io::Error::other("the multicast reader thread ended")))
}

/// Resolves when `stop` is set (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// Writes requests as the receiver task queues them, coalescing.
async fn write_requests(
    mut write: OwnedWriteHalf,
    mut requests: mpsc::UnboundedReceiver<Vec<u8>>,
    queue: Arc<RequestQueue>,
) {
    while let Some(mut batch) = requests.recv().await {
        while let Ok(more) = requests.try_recv() {
            batch.extend_from_slice(&more);
        }
        if let Err(error) = write.write_all(&batch).await {
            tracing::info!(%error, "FMTP receiver: cannot write requests to the sender");
            return;
        }
        queue.queued_bytes.fetch_sub(batch.len(), Ordering::SeqCst);
        queue.drained.notify_one();
    }
}

/// The receive-side loss filter: SplitMix64 draws, deterministic from the seed.
struct DropFilter {
    /// Drop when a draw is below this.
    threshold: u64,
    state: u64,
}

impl DropFilter {
    fn new(probability: f64, seed: u64) -> Self {
        // probability < 1, so the product is below 2^64.
        Self { threshold: (probability * 18_446_744_073_709_551_616.0) as u64, state: seed }
    }

    fn drops(&mut self) -> bool {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) < self.threshold
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_filter_drops_about_the_fraction_asked() {
        let mut filter = DropFilter::new(0.05, 1);
        let dropped = (0..100_000).filter(|_| filter.drops()).count();
        assert!((4_000..6_000).contains(&dropped), "{dropped}");
        let mut none = DropFilter::new(0.0, 1);
        assert!(!(0..10_000).any(|_| none.drops()));
    }
}
