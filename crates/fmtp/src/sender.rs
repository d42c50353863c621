//! Runs the sans-IO FMTP [`Sender`] on real sockets (ldm7-multicast.md §3.8): multicast UDP
//! through [`crate::udp`] in GSO batches, and one TCP retransmission connection per receiver.
//! The driver decides nothing about the protocol; it owns the sockets, the timers and every
//! queue between them, and feeds the protocol the hints it needs:
//!
//! * **Writability** — each receiver's repairs go through a writer task behind a queue bounded
//!   by [`SenderBounds::repair_queue_bytes_max`]. When the queue reaches the bound (the
//!   receiver's socket is not draining), the driver calls `Sender::set_writable(id, false)`
//!   and the protocol serves the others; when the writer has drained it to half, `true` again.
//! * **TCP backpressure** — a receiver's connection is read in chunks of at most
//!   [`SenderBounds::stream_chunk_bytes_max`], each read only after the previous chunk was
//!   consumed. Frames are handed to the protocol only while `Sender::accepts_stream(id)`; the
//!   rest of the chunk is held and no more is read until the receiver's repair backlog is back
//!   under its bound, so a receiver asking faster than it can be served is slowed by TCP
//!   instead of having requests dropped.
//! * **RTT** — the kernel's smoothed RTT of each connection (`TCP_INFO`) every
//!   [`RTT_INTERVAL`], for `Sender::set_rtt`.
//! * **Rate** — [`RateHandle::set_rate`] changes the pacing rate of the running protocol
//!   (`Sender::set_rate`) when the feed's path rate changes.
//!
//! One task owns the state machine and follows its polling order (transmit, events, timeout).
//! Every channel has a named bound ([`SenderBounds`]) and a counter ([`SenderDriverCounters`]);
//! hitting a bound is logged once per episode. Nothing accepted is dropped: a full product
//! input makes [`ProductSender::send`] wait; a product the protocol refuses comes back in
//! [`SenderNotice::Refused`]; notices the application has not read yet wait in the task, which
//! meanwhile takes no new product.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use ldm7_fmtp_proto::pacing::{Pacing, Peak};
use ldm7_fmtp_proto::wire::{self, Body, Message, MessageType, Split};
use ldm7_fmtp_proto::{
    ConfigError, Destination, EnqueueError, Instant, OutgoingProduct, ProductIndex, ReceiverId, Sender, SenderBound,
    SenderConfig, SenderCounters, SenderEvent,
};
use ldm7_io::{BoundHits, Clock, Throttle};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::error::TrySendError as ChannelFull;
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::stream::{self, CurrentKey, ExchangeTicket, KeyAnswer, KeyDesk, accept_handshake, read_more, tcp_rtt};
use crate::udp::{MulticastConfig, MulticastSender};
use ed25519_dalek::SigningKey;
use ldm7_fmtp_proto::lists::{DigestLister, MacSigning};
use ldm7_fmtp_proto::mac::{MacLevel, OfferKey, SenderKey};

/// A protocol bound hit is logged at most this often (per bound), with the count.
const BOUND_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// How often each receiver connection's RTT is read from the kernel.
pub const RTT_INTERVAL: Duration = Duration::from_secs(1);

/// Pause after a failed `accept` (out of file descriptors) before trying again.
const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(100);

/// Largest FMTP datagram (12-byte header + 1448 bytes).
const DATAGRAM_LEN_MAX: usize = 1460;

/// Most segments in one GSO send.
const GSO_SEGMENTS_MAX: usize = 44;

/// Most bytes a writer task coalesces into one socket write.
const WRITE_BATCH_BYTES_MAX: usize = 64 << 10;

/// Who may open a retransmission connection (LDM: the subscriber's allowed address).
pub type Authorizer = Arc<dyn Fn(SocketAddr) -> bool + Send + Sync>;

/// The driver's own bounds (the protocol's are in [`SenderConfig`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SenderBounds {
    /// Products handed to [`ProductSender::send`] and not yet taken by the sender task (which
    /// takes one only when the protocol's send queue has room).
    pub product_inputs_max: usize,
    /// Connection events, stream chunks and RTT samples waiting for the sender task.
    pub inputs_max: usize,
    /// Notices the application has not read. Beyond it notices wait in the task, which takes
    /// no new product until they are read.
    pub notices_max: usize,
    /// Repair bytes queued for one receiver's socket; at the bound the receiver is marked not
    /// writable until its writer drained half of it.
    pub repair_queue_bytes_max: usize,
    /// Largest chunk read from a receiver's connection before the sender task consumed the
    /// previous one (the unit of TCP backpressure).
    pub stream_chunk_bytes_max: usize,
    /// Receiver connections at once; more are refused.
    pub receivers_max: usize,
    /// The kernel's send buffer of each repair connection (`SO_SNDBUF`); `None` leaves Linux's
    /// autotuning (up to `net.ipv4.tcp_wmem`, 4 MiB by default). Repairs in the kernel's buffer
    /// are beyond the protocol's reach: a product released at its deadline still reaches a slow
    /// receiver from there. Bound it to bound memory per receiver and make deadlines bite; keep
    /// it above the repair rate × RTT.
    pub repair_send_buffer_bytes: Option<usize>,
    /// A receiver whose connection takes none of its repairs for this long (it stopped reading,
    /// or never did) is cut off: it holds memory, a connection and its products' release.
    pub repair_stall_max: Duration,
}

impl Default for SenderBounds {
    fn default() -> Self {
        Self {
            product_inputs_max: 64,
            inputs_max: 1024,
            notices_max: 4096,
            repair_queue_bytes_max: 256 << 10,
            stream_chunk_bytes_max: 16 << 10,
            receivers_max: 1024,
            repair_send_buffer_bytes: None,
            repair_stall_max: Duration::from_secs(60),
        }
    }
}

/// Settings of an [`FmtpSender`].
#[derive(Clone)]
pub struct SenderOptions {
    /// The multicast group, interface, TTL.
    pub multicast: MulticastConfig,
    /// Where the retransmission server listens (port 0: any).
    pub retx_listen: SocketAddr,
    /// Protocol settings (rate, deadline, bounds).
    pub proto: SenderConfig,
    /// Connection filter on the peer address.
    pub authorize: Authorizer,
    /// The driver's queue bounds.
    pub bounds: SenderBounds,
    /// MAC level of the multicast datagrams (§3.7; every receiver must use the same). A fresh
    /// key is made for each sender; with a MAC, data blocks shrink by its length so that a
    /// datagram stays 1460 bytes, as the reference's do.
    pub mac_level: MacLevel,
    /// The publisher's long-term identity: each key answer is signed with it, for receivers
    /// that pin its public key (an ldm7 extension; a reference receiver cannot read a signed
    /// answer).
    pub identity: Option<Arc<SigningKey>>,
    /// Make a new MAC key this often and hand it to every receiver over its repair connection
    /// (KEY_UPDATE, sealed to the receiver's offer, signed by the identity), signing with it once
    /// all acknowledged it (KEY_ACK) or [`KEY_SWITCH_DEADLINE`] passed. An ldm7 extension: every
    /// receiver must be ldm7. At least [`MAC_ROTATION_MIN`]; ignored at MAC level 0.
    pub mac_rotation: Option<Duration>,
    /// At MAC level 2: a signature on each datagram (the reference's way, which a reference
    /// receiver requires) or signed digest lists (ldm7 receivers only; `ldm7_fmtp_proto::lists`).
    /// [`FmtpSender::signing_handle`] switches a running sender.
    pub mac_signing: MacSigning,
    /// Where parity shards are multicast (`None`: to the group with the data). LDM-7 sends
    /// them to a port of their own, so that a reference receiver on the group never sees a
    /// message type it does not know (docs/parity.md).
    pub parity_group: Option<SocketAddr>,
}

/// The shortest [`SenderOptions::mac_rotation`].
pub const MAC_ROTATION_MIN: Duration = ldm7_fmtp_proto::mac::MAC_ROTATION_MIN;

/// Longest a new MAC key waits for receivers' acknowledgements before the sender signs with it
/// anyway (a receiver that has not taken it yet asks for repairs meanwhile).
pub const KEY_SWITCH_DEADLINE: Duration = Duration::from_secs(30);

/// How soon the sender looks again at a key switch an exchange held back.
const EXCHANGE_HOLD_RECHECK: Duration = Duration::from_millis(50);

impl SenderOptions {
    /// Options that authorize every peer, with the default bounds, no MAC and no identity.
    pub fn new(multicast: MulticastConfig, retx_listen: SocketAddr, proto: SenderConfig) -> Self {
        Self {
            multicast,
            retx_listen,
            proto,
            authorize: Arc::new(|_| true),
            bounds: SenderBounds::default(),
            mac_level: MacLevel::None,
            identity: None,
            mac_rotation: None,
            mac_signing: MacSigning::default(),
            parity_group: None,
        }
    }
}

impl std::fmt::Debug for SenderOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SenderOptions")
            .field("multicast", &self.multicast)
            .field("retx_listen", &self.retx_listen)
            .field("proto", &self.proto)
            .field("bounds", &self.bounds)
            .finish_non_exhaustive()
    }
}

/// How a receiver's repair connection went, told when it closes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Departure {
    /// The receiver's address.
    pub peer: SocketAddr,
    /// How long it was connected after its key exchange.
    pub connected_for: std::time::Duration,
    /// Messages it sent (requests, RETX_ENDs, key acknowledgements).
    pub messages: u64,
}

impl Departure {
    /// Whether the receiver left at once, having said nothing after its key exchange: what a
    /// receiver does that finds the key of another MAC level than its own (the reference's
    /// receiver throws and its subscription starts over).
    pub fn at_once(&self) -> bool {
        self.messages == 0 && self.connected_for < std::time::Duration::from_secs(2)
    }
}

/// What the sending application hears.
#[derive(Debug)]
pub enum SenderNotice {
    /// A protocol event (sent, released, bound hit).
    Event(SenderEvent),
    /// A receiver's retransmission connection opened; products handed over from now on count
    /// it among their receivers.
    ReceiverJoined(ReceiverId, SocketAddr),
    /// A receiver's connection closed.
    ReceiverLeft(ReceiverId, Departure),
    /// The protocol refused a product (LDM's policy: no receiver connected); it was not sent
    /// and is handed back.
    Refused(EnqueueError),
}

/// The driver's counters: how often each of its bounds was hit, and what it measured.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SenderDriverCounters {
    /// [`ProductSender::send`] found the product input full and waited.
    pub product_inputs_full: u64,
    /// A connection task found the sender task's input full and waited.
    pub inputs_full: u64,
    /// A notice found the application's notice channel full and waited in the task.
    pub notices_full: u64,
    /// A receiver's repair queue reached its bound: marked not writable.
    pub repair_queue_full: u64,
    /// Reading a receiver's connection was paused because the protocol accepted no more of its
    /// requests (TCP backpressure).
    pub stream_paused: u64,
    /// RTT samples handed to the protocol.
    pub rtt_samples: u64,
    /// Connections refused: peer not authorized.
    pub connections_unauthorized: u64,
    /// Connections refused: [`SenderBounds::receivers_max`] reached.
    pub connections_over_bound: u64,
    /// Multicast sends that failed.
    pub multicast_send_errors: u64,
    /// Connections cut off: the receiver took none of its repairs for
    /// [`SenderBounds::repair_stall_max`].
    pub connections_stalled: u64,
    /// MAC keys rotated ([`SenderOptions::mac_rotation`]).
    pub key_rotations: u64,
    /// Rotations that switched at [`KEY_SWITCH_DEADLINE`] with receivers still not acknowledging.
    pub key_switches_late: u64,
    /// Signed digest lists multicast (MAC level 2 signing lists).
    pub digest_lists: u64,
}

/// Why a product could not be handed over: the sender task ended. The product is handed back.
#[derive(Debug, thiserror::Error)]
#[error("the FMTP sender stopped: product not sent")]
pub struct SendError(pub OutgoingProduct);

/// Why [`ProductSender::try_send`] did not take a product (handed back).
#[derive(Debug, thiserror::Error)]
pub enum TrySendError {
    /// [`SenderBounds::product_inputs_max`] products wait already: try again later.
    #[error("the FMTP sender's product input is full")]
    Full(OutgoingProduct),
    /// The sender task ended.
    #[error("the FMTP sender stopped")]
    Stopped(OutgoingProduct),
}

/// Hands products to a running [`FmtpSender`]; clone it to feed products from another task
/// while this one reads notices.
#[derive(Clone, Debug)]
pub struct ProductSender {
    products: mpsc::Sender<OutgoingProduct>,
    shared: Arc<Shared>,
}

impl ProductSender {
    /// Hands a product over for multicast, waiting while
    /// [`SenderBounds::product_inputs_max`] products are waiting already. Read the notices
    /// meanwhile (another task, or `select!`): the sender takes no product while the
    /// application leaves its notices unread.
    pub async fn send(&self, product: OutgoingProduct) -> Result<(), SendError> {
        match self.try_send(product) {
            Ok(()) => Ok(()),
            Err(TrySendError::Stopped(product)) => Err(SendError(product)),
            Err(TrySendError::Full(product)) => {
                // The normal state of a feeder faster than the rate: said once (at NOTE), then
                // counted ([`SenderDriverCounters::product_inputs_full`]).
                let bound = self.products.max_capacity();
                if self.shared.product_inputs.hit() {
                    if self.shared.product_inputs.count() == 1 {
                        tracing::info!(
                            bound,
                            "FMTP sender: product input full; sending waits for the multicast (said once, then counted)"
                        );
                    } else {
                        tracing::debug!(bound, "FMTP sender: product input full; sending waits for the multicast");
                    }
                }
                self.products.send(product).await.map_err(|error| SendError(error.0))
            }
        }
    }

    /// Hands a product over if there is room now.
    pub fn try_send(&self, product: OutgoingProduct) -> Result<(), TrySendError> {
        match self.products.try_send(product) {
            Ok(()) => {
                self.shared.product_inputs.relieved();
                Ok(())
            }
            Err(ChannelFull::Full(product)) => Err(TrySendError::Full(product)),
            Err(ChannelFull::Closed(product)) => Err(TrySendError::Stopped(product)),
        }
    }
}

/// Why [`RateHandle::set_rate`] did not change the rate.
#[derive(Debug, thiserror::Error)]
pub enum SetRateError {
    /// The protocol refused the rate (zero, or an unpaced sender).
    #[error(transparent)]
    Refused(#[from] ConfigError),
    /// The sender task ended.
    #[error("the FMTP sender stopped")]
    Stopped,
}

/// Changes the pacing rate of a running [`FmtpSender`] (multicast and repairs); clone it to
/// use it from another task.
#[derive(Clone, Debug)]
pub struct RateHandle {
    inputs: Inputs,
}

/// Switches a running [`FmtpSender`] between level-2 signing modes; clone it to use it from
/// another thread. The sender takes the mode at its next send (a list of datagrams already
/// sent goes out first).
#[derive(Clone, Debug)]
pub struct SigningHandle {
    lists: Arc<AtomicBool>,
}

impl SigningHandle {
    /// Signs with `signing` from now on (only level 2 has modes; other levels ignore it).
    pub fn set(&self, signing: MacSigning) {
        self.lists.store(signing == MacSigning::Lists, Ordering::Relaxed);
    }

    /// The mode asked for.
    pub fn get(&self) -> MacSigning {
        if self.lists.load(Ordering::Relaxed) { MacSigning::Lists } else { MacSigning::Datagram }
    }
}

/// Finishes a running [`FmtpSender`] in order (an orderly stop); clone it to use it from
/// another task.
#[derive(Clone, Debug)]
pub struct FinishHandle {
    inputs: Inputs,
}

/// An orderly finish under way: see [`Finishing::settled`].
#[derive(Debug)]
pub struct Finishing {
    /// The index the next product would have had: the products handed over from it on were
    /// withdrawn (not multicast); a later sender starting at this index may multicast them with
    /// the same indexes.
    pub next_index: ProductIndex,
    settled: oneshot::Receiver<()>,
}

impl Finishing {
    /// Returns once every product multicast is released (each receiver finished it, or its
    /// retransmission deadline passed); `false` if the sender task ended first. Bound the wait
    /// with a timeout: a receiver that never finishes holds a product until its deadline.
    pub async fn settled(self) -> bool {
        self.settled.await.is_ok()
    }
}

impl FinishHandle {
    /// The sender takes no more products: those handed over and not begun are withdrawn, the
    /// one under way is finished, and repairs go on being served (see [`Finishing::settled`]).
    /// `None` if the sender task ended.
    pub async fn finish(&self) -> Option<Finishing> {
        let (withdrawn, next_index) = oneshot::channel();
        let (settle, settled) = oneshot::channel();
        self.inputs.send(Input::Finish { withdrawn, settled: settle }).await.ok()?;
        Some(Finishing { next_index: next_index.await.ok()?, settled })
    }
}

impl RateHandle {
    /// Paces multicast and repairs at `rate_bits_per_s` from now on (see `Sender::set_rate`);
    /// returns once the sender task applied it.
    pub async fn set_rate(&self, rate_bits_per_s: u64) -> Result<(), SetRateError> {
        let (reply, applied) = oneshot::channel();
        self.inputs.send(Input::SetRate { rate_bits_per_s, reply }).await.map_err(|()| SetRateError::Stopped)?;
        applied.await.map_err(|_| SetRateError::Stopped)?.map_err(SetRateError::Refused)
    }
}

/// A running FMTP sender: hand it products, read its notices. Dropping it stops the sender.
#[derive(Debug)]
pub struct FmtpSender {
    products: ProductSender,
    rate: RateHandle,
    signing: SigningHandle,
    notices: mpsc::Receiver<SenderNotice>,
    retx_addr: SocketAddr,
    source_addr: SocketAddr,
    counters: watch::Receiver<SenderCounters>,
    shared: Arc<Shared>,
    tasks: [JoinHandle<()>; 2],
}

impl FmtpSender {
    /// Opens the sockets and starts the sender (inside a tokio runtime).
    pub async fn start(options: SenderOptions) -> io::Result<Self> {
        let bounds = options.bounds;
        if [bounds.product_inputs_max, bounds.inputs_max, bounds.notices_max, bounds.receivers_max].contains(&0)
            || bounds.repair_queue_bytes_max < DATAGRAM_LEN_MAX
            || bounds.stream_chunk_bytes_max < DATAGRAM_LEN_MAX
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("FMTP sender bounds too small: {bounds:?} (queues ≥ 1, byte bounds ≥ {DATAGRAM_LEN_MAX})"),
            ));
        }
        if options.proto.parity.is_some() {
            // Before the multicast: a table built at the first group coded holds up the stream.
            let _ = tokio::task::spawn_blocking(ldm7_fmtp_proto::parity::prepare_tables).await;
        }
        if let Some(every) = options.mac_rotation.filter(|every| *every < MAC_ROTATION_MIN) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("MAC key rotation every {every:?}: at least {MAC_ROTATION_MIN:?}"),
            ));
        }
        let udp = MulticastSender::open(&options.multicast).map_err(io::Error::other)?;
        let source_addr = udp.local_addr()?;
        let listener = TcpListener::bind(options.retx_listen).await?;
        let retx_addr = listener.local_addr()?;
        let mut proto = options.proto.clone();
        let mac = SenderKey::generate(options.mac_level, &mut rand_core::OsRng);
        proto.block_len =
            proto.block_len.min(crate::udp::payload_len_max(options.multicast.group) - options.mac_level.mac_len());
        if let Some(parity) = &mut proto.parity {
            // A shard is as long as a block.
            parity.block_len = proto.block_len;
        }
        let current_key = KeyDesk::new(CurrentKey { epoch: 0, material: Arc::new(mac.material()) });
        let keys = KeyAnswer { current: current_key.clone(), identity: options.identity.clone() };
        let rotation = options.mac_rotation.filter(|_| options.mac_level != MacLevel::None).map(|every| Rotation {
            every,
            due: Clock::now() + every,
            pending: None,
        });
        for pacing in [&mut proto.multicast_pacing, &mut proto.retx_pacing].into_iter().flatten() {
            pacing.bucket_bytes = pacing.bucket_bytes.max(timer_burst_bytes(pacing.rate_bits_per_s));
        }
        if let Some(pacing) = &mut proto.multicast_pacing {
            catch_up_late_wakes(pacing);
            // The MAC the driver appends is on the wire too (tc counts it). At level 2 the most a
            // mode costs: a signature on each datagram (digest lists cost about 35 bytes a
            // datagram, and the mode may switch).
            pacing.overhead_bytes_per_message += options.mac_level.mac_len() as u64;
        }
        let queued_products_max = proto.queued_products_max;
        let mut sender = Sender::new(proto, Clock::now()).map_err(io::Error::other)?;
        let (anchor, wall) = Clock::wall_anchor();
        sender.set_wall_clock(anchor, wall);

        let shared = Arc::new(Shared::default());
        let (product_tx, product_rx) = mpsc::channel(bounds.product_inputs_max);
        let (input_tx, input_rx) = mpsc::channel(bounds.inputs_max);
        let (notice_tx, notices) = mpsc::channel(bounds.notices_max);
        let (counters_tx, counters) = watch::channel(SenderCounters::default());
        let inputs = Inputs { inputs: input_tx, shared: shared.clone() };
        let rate = RateHandle { inputs: inputs.clone() };
        let accept = tokio::spawn(accept_loop(listener, options.authorize.clone(), inputs, bounds, keys));
        let max_segments = udp.max_segments().clamp(1, GSO_SEGMENTS_MAX);
        let signing = SigningHandle { lists: Arc::new(AtomicBool::new(options.mac_signing == MacSigning::Lists)) };
        let task = SenderTask {
            sender,
            finishing: Vec::new(),
            udp,
            queued_products_max,
            bounds,
            links: HashMap::new(),
            notices: notice_tx,
            pending_notices: VecDeque::new(),
            shared: shared.clone(),
            counters: counters_tx,
            message: Vec::with_capacity(DATAGRAM_LEN_MAX),
            batch: Vec::with_capacity(DATAGRAM_LEN_MAX * max_segments),
            max_segments,
            segment_len: 0,
            segments: 0,
            parity_group: options.parity_group,
            batch_to: None,
            bound_log: Throttle::new(BOUND_LOG_INTERVAL),
            mac,
            mac_epoch: 0,
            current_key,
            identity: options.identity.clone(),
            rotation,
            signing: signing.clone(),
            lister: None,
            list: Vec::with_capacity(DATAGRAM_LEN_MAX),
        };
        let run = tokio::spawn(task.run(product_rx, input_rx));
        Ok(Self {
            products: ProductSender { products: product_tx, shared: shared.clone() },
            rate,
            signing,
            notices,
            retx_addr,
            source_addr,
            counters,
            shared,
            tasks: [run, accept],
        })
    }

    /// The retransmission server's address (give it to receivers).
    pub fn retx_addr(&self) -> SocketAddr {
        self.retx_addr
    }

    /// The address multicast datagrams come from.
    pub fn source_addr(&self) -> SocketAddr {
        self.source_addr
    }

    /// Hands a product over (see [`ProductSender::send`]).
    pub async fn send(&self, product: OutgoingProduct) -> Result<(), SendError> {
        self.products.send(product).await
    }

    /// A handle to send products from another task.
    pub fn product_sender(&self) -> ProductSender {
        self.products.clone()
    }

    /// A handle that changes the pacing rate (the path rate changed).
    pub fn rate_handle(&self) -> RateHandle {
        self.rate.clone()
    }

    /// The next notice; `None` once the sender stopped.
    pub async fn next_notice(&mut self) -> Option<SenderNotice> {
        self.notices.recv().await
    }

    /// A handle that finishes the sender in order (see [`FinishHandle::finish`]).
    pub fn finish_handle(&self) -> FinishHandle {
        FinishHandle { inputs: self.rate.inputs.clone() }
    }

    /// A handle that switches level-2 signing between each datagram and digest lists.
    pub fn signing_handle(&self) -> SigningHandle {
        self.signing.clone()
    }

    /// The protocol counters as of the last loop turn.
    pub fn counters(&self) -> SenderCounters {
        self.counters.borrow().clone()
    }

    /// A handle that reads the protocol counters from anywhere (metrics).
    pub fn counters_watch(&self) -> watch::Receiver<SenderCounters> {
        self.counters.clone()
    }

    /// The driver's counters now.
    pub fn driver_counters(&self) -> SenderDriverCounters {
        self.shared.snapshot()
    }
}

impl Drop for FmtpSender {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Bucket depth that keeps the rate when the task wakes at the timer's granularity (about a
/// millisecond): [`PACING_CATCH_UP`] of traffic, and at least one full GSO batch. Tokens
/// beyond the depth are lost, and a sender that wakes later than that sends below its rate.
fn timer_burst_bytes(rate_bits_per_s: u64) -> u64 {
    traffic_bytes(rate_bits_per_s, PACING_CATCH_UP).max((GSO_SEGMENTS_MAX * DATAGRAM_LEN_MAX) as u64)
}

/// Bytes sent in `span` at `rate_bits_per_s`.
fn traffic_bytes(rate_bits_per_s: u64, span: Duration) -> u64 {
    u64::try_from(u128::from(rate_bits_per_s) * span.as_millis() / 8 / 1000).unwrap_or(u64::MAX)
}

/// The largest burst: how late the sender task may wake without losing pacing tokens
/// ([`timer_burst_bytes`]). Deliberately short: where receivers share the sender's cores, a
/// burst of tokens saved up is what a receiver cannot absorb. In `ldm7 demo` (three
/// subscribers and the publisher at 1 Gbit/s on two vCPUs) a subscriber fell behind NGRID's
/// bursts and took products from the backstop in 1 of 2 runs with a 20 ms bucket and 2 of 5
/// with 6 ms, none of 6 with 2 ms. What a late wake costs is repaid at the peak rate instead
/// ([`catch_up_late_wakes`]).
const PACING_CATCH_UP: Duration = Duration::from_millis(2);

/// How much sending time a multicast sender that woke late may still make up.
const PACING_OWED: Duration = Duration::from_millis(20);

/// How much faster than the rate it makes it up, in percent.
const PACING_PEAK_PERCENT_OVER: u64 = 25;

/// Multicast pacing that repays late wakes: up to [`PACING_OWED`] of traffic a busy sender did
/// not send on time is sent later, at most [`PACING_PEAK_PERCENT_OVER`] percent above the rate
/// and in bursts of at most [`PACING_CATCH_UP`] (a peak-rate bucket). Time with nothing to send
/// is not owed (`Pacing::peak`). On two vCPUs shared with four receivers at 500 Mbit/s the
/// sender lost about a fifth of its rate to wakes 2–10 ms late (docs/benchmarks.md, issue #37).
/// A pacing the caller gave a peak rate is left as it is.
fn catch_up_late_wakes(pacing: &mut Pacing) {
    if pacing.peak.is_some() {
        return;
    }
    pacing.bucket_bytes = pacing.bucket_bytes.max(traffic_bytes(pacing.rate_bits_per_s, PACING_OWED));
    pacing.peak =
        Some(Peak { percent_over: PACING_PEAK_PERCENT_OVER, bucket_bytes: timer_burst_bytes(pacing.rate_bits_per_s) });
}

/// Counters shared by the tasks (atomics; [`Shared::snapshot`] reads them).
#[derive(Debug, Default)]
struct Shared {
    product_inputs: BoundHits,
    inputs: BoundHits,
    notices: BoundHits,
    repair_queue_full: AtomicU64,
    stream_paused: AtomicU64,
    rtt_samples: AtomicU64,
    connections_unauthorized: AtomicU64,
    connections_over_bound: BoundHits,
    multicast_send_errors: BoundHits,
    connections_stalled: AtomicU64,
    key_rotations: AtomicU64,
    key_switches_late: AtomicU64,
    digest_lists: AtomicU64,
}

impl Shared {
    fn snapshot(&self) -> SenderDriverCounters {
        SenderDriverCounters {
            product_inputs_full: self.product_inputs.count(),
            inputs_full: self.inputs.count(),
            notices_full: self.notices.count(),
            repair_queue_full: self.repair_queue_full.load(Ordering::Relaxed),
            stream_paused: self.stream_paused.load(Ordering::Relaxed),
            rtt_samples: self.rtt_samples.load(Ordering::Relaxed),
            connections_unauthorized: self.connections_unauthorized.load(Ordering::Relaxed),
            connections_over_bound: self.connections_over_bound.count(),
            multicast_send_errors: self.multicast_send_errors.count(),
            connections_stalled: self.connections_stalled.load(Ordering::Relaxed),
            key_rotations: self.key_rotations.load(Ordering::Relaxed),
            key_switches_late: self.key_switches_late.load(Ordering::Relaxed),
            digest_lists: self.digest_lists.load(Ordering::Relaxed),
        }
    }
}

/// What the connection tasks tell the sender task.
enum Input {
    /// A receiver finished the key exchange; `exchange` holds a key switch back until the
    /// task has taken it.
    Connected { id: ReceiverId, peer: SocketAddr, link: Box<Link>, exchange: ExchangeTicket },
    /// Whole frames read from a receiver's connection; its reader waits for a read credit.
    Frames { id: ReceiverId, frames: Vec<u8> },
    /// A receiver's repair queue drained below half its bound.
    Writable(ReceiverId),
    /// A receiver connection's RTT.
    Rtt(ReceiverId, Duration),
    /// A receiver's connection ended.
    Disconnected(ReceiverId),
    /// Pace at a new rate; the outcome goes back on `reply`.
    SetRate { rate_bits_per_s: u64, reply: oneshot::Sender<Result<(), ConfigError>> },
    /// Take no more products and withdraw those not begun (the next index then said on
    /// `withdrawn`); say on `settled` once every product multicast is released.
    Finish { withdrawn: oneshot::Sender<ProductIndex>, settled: oneshot::Sender<()> },
}

/// The sender task's input channel, counting when it is full.
#[derive(Clone)]
struct Inputs {
    inputs: mpsc::Sender<Input>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Inputs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inputs").finish_non_exhaustive()
    }
}

impl Inputs {
    /// Sends, waiting while the channel is full; `Err` once the sender task ended.
    async fn send(&self, input: Input) -> Result<(), ()> {
        match self.inputs.try_send(input) {
            Ok(()) => {
                self.shared.inputs.relieved();
                Ok(())
            }
            Err(ChannelFull::Closed(_)) => Err(()),
            Err(ChannelFull::Full(input)) => {
                if self.shared.inputs.hit() {
                    tracing::info!(
                        bound = self.inputs.max_capacity(),
                        "FMTP sender: input channel full; connections wait for the sender task"
                    );
                }
                self.inputs.send(input).await.map_err(|_| ())
            }
        }
    }

    async fn closed(&self) {
        self.inputs.closed().await;
    }
}

/// One receiver's repair queue between the sender task and the writer task.
#[derive(Debug, Default)]
struct RepairQueue {
    /// Bytes handed to the writer and not yet written to the socket.
    queued_bytes: AtomicUsize,
    /// The sender task marked the receiver not writable; the writer clears it (and says so)
    /// once the queue drained to half.
    blocked: AtomicBool,
    /// Episodes of a full queue (logged once each; an episode ends when the queue is empty).
    full: BoundHits,
}

/// The sender task's view of one receiver connection.
struct Link {
    peer: SocketAddr,
    writer: mpsc::UnboundedSender<Vec<u8>>,
    queue: Arc<RepairQueue>,
    /// Read credits: one more chunk may be read per permit.
    credit: Arc<Semaphore>,
    /// Repair bytes of this loop turn not yet handed to the writer.
    out: Vec<u8>,
    /// Frames read but not yet handed to the protocol (it accepted no more).
    held: Vec<u8>,
    /// The reader waits for a credit the task withholds.
    paused: bool,
    /// Episodes of paused reading (logged once each; one ends when a chunk is taken whole).
    pauses: BoundHits,
    /// The receiver's offer: later MAC keys are sealed to it.
    offer: OfferKey,
    /// The epoch of the key the exchange handed it.
    epoch: u32,
    /// When it joined (its key exchange done).
    joined: Instant,
    /// Messages it sent.
    messages: u64,
}

impl Link {
    /// Hands this turn's repair bytes to the writer.
    fn flush(&mut self) {
        if self.out.is_empty() {
            return;
        }
        let bytes = std::mem::take(&mut self.out);
        self.queue.queued_bytes.fetch_add(bytes.len(), Ordering::SeqCst);
        // A closed writer means the connection is ending; its Disconnected input follows.
        let _ = self.writer.send(bytes);
    }

    /// Marks the queue blocked unless the writer drained it meanwhile; returns whether it is.
    fn block(&self, low_water_bytes: usize) -> bool {
        self.queue.blocked.store(true, Ordering::SeqCst);
        let drained = self.queue.queued_bytes.load(Ordering::SeqCst) <= low_water_bytes;
        !(drained && self.queue.blocked.compare_exchange(true, false, Ordering::SeqCst, Ordering::SeqCst).is_ok())
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        // Ends the reader task if it waits for a credit.
        self.credit.close();
    }
}

struct SenderTask {
    sender: Sender,
    /// Who waits for the sender to settle (an orderly stop: no new product is taken).
    finishing: Vec<oneshot::Sender<()>>,
    udp: MulticastSender,
    queued_products_max: usize,
    bounds: SenderBounds,
    links: HashMap<ReceiverId, Link>,
    notices: mpsc::Sender<SenderNotice>,
    /// Notices the application's full channel could not take yet (bounded by the products the
    /// protocol holds: no product is taken while any waits).
    pending_notices: VecDeque<SenderNotice>,
    shared: Arc<Shared>,
    counters: watch::Sender<SenderCounters>,
    message: Vec<u8>,
    batch: Vec<u8>,
    max_segments: usize,
    segment_len: usize,
    segments: usize,
    /// Where parity shards go (`None`: the group).
    parity_group: Option<SocketAddr>,
    /// Where the batch being filled goes (`None`: the group).
    batch_to: Option<SocketAddr>,
    /// Protocol bound hits: logged once, then at most once a minute per bound with the count.
    bound_log: Throttle<SenderBound>,
    /// Signs each multicast datagram (§3.6).
    mac: SenderKey,
    /// Its epoch (0 for the first key, one more at each rotation).
    mac_epoch: u32,
    /// What connection tasks hand out in the exchange.
    current_key: KeyDesk,
    /// Signs key updates.
    identity: Option<Arc<SigningKey>>,
    /// Key rotation, when on.
    rotation: Option<Rotation>,
    /// The level-2 signing mode asked for.
    signing: SigningHandle,
    /// Digests of datagrams sent and not yet listed (level 2 signing lists).
    lister: Option<DigestLister>,
    /// A DIGESTS datagram being sent.
    list: Vec<u8>,
}

/// MAC key rotation: when the next key is made, and the one being handed out.
struct Rotation {
    every: Duration,
    due: Instant,
    pending: Option<PendingKey>,
}

/// A key handed out and not yet signing.
struct PendingKey {
    epoch: u32,
    key: SenderKey,
    /// Receivers that have not acknowledged it.
    waiting: HashSet<ReceiverId>,
    /// When the sender signs with it at the latest.
    deadline: Instant,
}

/// What woke the sender task.
enum Wake {
    Input(Option<Input>),
    NoticeSlot(Option<mpsc::OwnedPermit<SenderNotice>>),
    Product(Option<OutgoingProduct>),
    Timer,
}

impl SenderTask {
    async fn run(mut self, mut products: mpsc::Receiver<OutgoingProduct>, mut inputs: mpsc::Receiver<Input>) {
        let mut products_open = true;
        loop {
            self.drive().await;
            if !self.finishing.is_empty() && self.sender.is_settled() {
                for reply in self.finishing.drain(..) {
                    let _ = reply.send(());
                }
            }
            let list_due = self.lister.as_ref().and_then(DigestLister::due);
            let timeout = [self.sender.poll_timeout(), self.rotation_timeout(), list_due].into_iter().flatten().min();
            let take_products = products_open
                && self.pending_notices.is_empty()
                && self.sender.queued_products() < self.queued_products_max;
            let sleep_until = timeout.map(|at| tokio::time::Instant::from_std(Clock::to_std(at)));
            let notice_slot = (!self.pending_notices.is_empty()).then(|| self.notices.clone().reserve_owned());
            let wake = tokio::select! {
                input = inputs.recv() => Wake::Input(input),
                permit = async { notice_slot.expect("guarded").await }, if notice_slot.is_some() => {
                    Wake::NoticeSlot(permit.ok())
                }
                product = products.recv(), if take_products => Wake::Product(product),
                () = async { tokio::time::sleep_until(sleep_until.expect("guarded")).await }, if sleep_until.is_some() => {
                    Wake::Timer
                }
            };
            match wake {
                Wake::Input(None) => return,
                Wake::Input(Some(Input::Finish { withdrawn, settled })) => {
                    // Handed over and not taken yet: withdrawn, as the products not begun.
                    products.close();
                    while products.try_recv().is_ok() {}
                    products_open = false;
                    self.sender.withdraw_unsent();
                    // The caller may have stopped waiting.
                    let _ = withdrawn.send(self.sender.next_index());
                    self.finishing.push(settled);
                }
                Wake::Input(Some(input)) => self.handle_input(input),
                Wake::NoticeSlot(Some(permit)) => {
                    if let Some(notice) = self.pending_notices.pop_front() {
                        permit.send(notice);
                    }
                    self.flush_notices();
                }
                Wake::NoticeSlot(None) => self.pending_notices.clear(), // The application is gone.
                Wake::Product(None) => products_open = false,
                Wake::Product(Some(product)) => {
                    if let Err(error) = self.sender.enqueue(Clock::now(), product) {
                        self.notify(SenderNotice::Refused(error));
                    }
                }
                Wake::Timer => {
                    let now = Clock::now();
                    self.sender.handle_timeout(now);
                    self.rotate_when_due(now);
                }
            }
        }
    }

    /// Drains the protocol's outputs in its order, feeding held frames while it accepts them.
    async fn drive(&mut self) {
        loop {
            let fed = self.feed_held();
            self.transmit().await;
            while let Some(event) = self.sender.poll_event() {
                if let SenderEvent::BoundHit { bound, receiver } = &event
                    && let Some(count) = self.bound_log.event(*bound, Clock::now())
                {
                    tracing::warn!(
                        ?bound,
                        receiver = receiver.map(|id| id.0),
                        count,
                        "FMTP sender: protocol bound hit (logged at most once a minute)"
                    );
                }
                self.notify(SenderNotice::Event(event));
            }
            self.grant_credits();
            if !fed {
                break;
            }
        }
        self.counters.send_if_modified(|counters| {
            let changed = counters != self.sender.counters();
            if changed {
                counters.clone_from(self.sender.counters());
            }
            changed
        });
    }

    fn handle_input(&mut self, input: Input) {
        let now = Clock::now();
        match input {
            Input::Connected { id, peer, mut link, exchange } => {
                // Keys it missed: a rotation between its exchange and now, one being handed out.
                if link.epoch != self.mac_epoch {
                    send_key_update(&mut link, self.mac_epoch, &self.mac, self.identity.as_deref());
                }
                // The switch then waits for its acknowledgement too: datagrams signed with the
                // pending key before it took it would fail their check.
                if let Some(pending) = self.rotation.as_mut().and_then(|rotation| rotation.pending.as_mut())
                    && send_key_update(&mut link, pending.epoch, &pending.key, self.identity.as_deref())
                {
                    pending.waiting.insert(id);
                }
                // Known now: its exchange no longer holds a switch back.
                drop(exchange);
                self.switch_when_acknowledged(now);
                self.links.insert(id, *link);
                self.sender.receiver_connected(now, id);
                self.notify(SenderNotice::ReceiverJoined(id, peer));
            }
            Input::Frames { id, frames } => {
                let Some(link) = self.links.get_mut(&id) else { return };
                link.held.extend_from_slice(&frames);
                link.paused = true;
                self.feed_held();
                self.grant_credits();
                let Some(link) = self.links.get(&id) else { return };
                if !link.paused {
                    link.pauses.relieved();
                } else {
                    self.shared.stream_paused.fetch_add(1, Ordering::Relaxed);
                    if link.pauses.hit() {
                        tracing::info!(
                            receiver = id.0,
                            peer = %link.peer,
                            "FMTP sender: the receiver's repair backlog is full; reading its requests paused"
                        );
                    }
                }
            }
            Input::Writable(id) => {
                if self.links.contains_key(&id) {
                    self.sender.set_writable(id, true);
                }
            }
            Input::Rtt(id, rtt) => {
                if self.links.contains_key(&id) {
                    self.sender.set_rtt(id, rtt);
                    self.shared.rtt_samples.fetch_add(1, Ordering::Relaxed);
                }
            }
            Input::SetRate { rate_bits_per_s, reply } => {
                let result = self.sender.set_rate(now, rate_bits_per_s);
                if result.is_ok() {
                    tracing::debug!(rate_bits_per_s, "FMTP sender: pacing rate changed");
                }
                // The caller may have stopped waiting.
                let _ = reply.send(result);
            }
            Input::Finish { .. } => {} // Taken by the task's loop (it holds the product channel).
            Input::Disconnected(id) => {
                if let Some(link) = self.links.remove(&id) {
                    self.key_acknowledged(now, id, None);
                    tracing::info!(receiver = id.0, peer = %link.peer, "FMTP receiver left");
                    self.sender.receiver_disconnected(now, id);
                    let departure = Departure {
                        peer: link.peer,
                        connected_for: now.saturating_duration_since(link.joined),
                        messages: link.messages,
                    };
                    self.notify(SenderNotice::ReceiverLeft(id, departure));
                }
            }
        }
    }

    /// Hands held frames to the protocol while it accepts them; returns whether any was.
    fn feed_held(&mut self) -> bool {
        let now = Clock::now();
        let mut fed = false;
        let mut acks = Vec::new();
        for (id, link) in &mut self.links {
            let mut consumed = 0;
            while consumed < link.held.len() && self.sender.accepts_stream(*id) {
                // The reader hands over whole, well-framed frames only.
                let Ok(Split::Frame { frame, rest }) = wire::split_frame(&link.held[consumed..]) else {
                    consumed = link.held.len();
                    break;
                };
                if let Ok(Message { index, body: Body::KeyAck }) = Message::parse(frame) {
                    // The rotation extension is the driver's: the protocol never sees it.
                    acks.push((*id, index.0));
                } else if let Err(error) = self.sender.handle_stream_frame(now, *id, frame) {
                    tracing::warn!(receiver = id.0, %error, "FMTP sender: malformed message from a receiver");
                }
                consumed = link.held.len() - rest.len();
                link.messages += 1;
                fed = true;
            }
            link.held.drain(..consumed);
        }
        for (id, epoch) in acks {
            self.key_acknowledged(now, id, Some(epoch));
        }
        fed
    }

    /// When the rotation needs the task next: the pending key's deadline, or the next key's
    /// making.
    fn rotation_timeout(&self) -> Option<Instant> {
        let rotation = self.rotation.as_ref()?;
        Some(match &rotation.pending {
            // Every receiver has it, and an exchange held the switch back (one that failed
            // tells the task nothing): look again soon.
            Some(pending) if pending.waiting.is_empty() => Clock::now() + EXCHANGE_HOLD_RECHECK,
            Some(pending) => pending.deadline,
            None => rotation.due,
        })
    }

    /// Makes the next key when due and hands it to every receiver; switches to a pending key
    /// at its deadline.
    fn rotate_when_due(&mut self, now: Instant) {
        let Some(rotation) = &mut self.rotation else { return };
        match &rotation.pending {
            Some(pending) if now >= pending.deadline => self.switch_key(now, true),
            Some(_) => self.switch_when_acknowledged(now),
            None if now >= rotation.due => {
                let epoch = self.mac_epoch.wrapping_add(1);
                let key = SenderKey::generate(self.mac.level(), &mut rand_core::OsRng);
                let mut waiting = HashSet::new();
                for (id, link) in &mut self.links {
                    if send_key_update(link, epoch, &key, self.identity.as_deref()) {
                        waiting.insert(*id);
                    }
                }
                tracing::debug!(epoch, receivers = waiting.len(), "FMTP sender: new MAC key handed out");
                let nobody = waiting.is_empty();
                rotation.pending = Some(PendingKey { epoch, key, waiting, deadline: now + KEY_SWITCH_DEADLINE });
                if nobody {
                    self.switch_key(now, false);
                }
            }
            None => {}
        }
    }

    /// Notes that `id` holds the pending key (`epoch`), or left (`None`); switches when no
    /// receiver is waited for.
    fn key_acknowledged(&mut self, now: Instant, id: ReceiverId, epoch: Option<u32>) {
        let Some(pending) = self.rotation.as_mut().and_then(|rotation| rotation.pending.as_mut()) else { return };
        if epoch.is_none_or(|epoch| epoch == pending.epoch) {
            pending.waiting.remove(&id);
        }
        self.switch_when_acknowledged(now);
    }

    /// Switches to the pending key once no receiver is waited for (and no exchange holds it).
    fn switch_when_acknowledged(&mut self, now: Instant) {
        let pending = self.rotation.as_ref().and_then(|rotation| rotation.pending.as_ref());
        if pending.is_some_and(|pending| pending.waiting.is_empty()) {
            self.switch_key(now, false);
        }
    }

    /// Signs with the pending key from now on, unless an exchange that handed out the current
    /// key holds the switch back and it is not the deadline (`forced`).
    fn switch_key(&mut self, now: Instant, forced: bool) {
        let Some(rotation) = &mut self.rotation else { return };
        let Some(pending) = &rotation.pending else { return };
        let next = CurrentKey { epoch: pending.epoch, material: Arc::new(pending.key.material()) };
        let (replaced, held) = self.current_key.replace(next, forced);
        if !replaced {
            return;
        }
        let pending = rotation.pending.take().expect("checked above");
        rotation.due = now + rotation.every;
        if !pending.waiting.is_empty() || held {
            self.shared.key_switches_late.fetch_add(1, Ordering::Relaxed);
            tracing::info!(
                epoch = pending.epoch,
                receivers = pending.waiting.len(),
                "FMTP sender: switching to the new MAC key without every receiver's acknowledgement (deadline)"
            );
        }
        tracing::info!(
            epoch = pending.epoch,
            receivers = self.links.len(),
            "FMTP sender: signing with a new MAC key (rotation)"
        );
        self.mac = pending.key;
        self.mac_epoch = pending.epoch;
        self.shared.key_rotations.fetch_add(1, Ordering::Relaxed);
    }

    /// Gives paused readers their credit back once their frames were all taken and the
    /// protocol accepts more.
    fn grant_credits(&mut self) {
        for (id, link) in &mut self.links {
            if link.paused && link.held.is_empty() && self.sender.accepts_stream(*id) {
                link.paused = false;
                link.credit.add_permits(1);
            }
        }
    }

    /// Sends everything the protocol allows now: multicast in GSO batches of equal-sized
    /// segments, repairs into each receiver's queue.
    async fn transmit(&mut self) {
        let now = Clock::now();
        let low_water_bytes = self.bounds.repair_queue_bytes_max / 2;
        self.take_signing_mode().await;
        loop {
            self.message.clear();
            let Some(transmit) = self.sender.poll_transmit(now, &mut self.message) else { break };
            match transmit.destination {
                Destination::Multicast => {
                    let list_full = match &mut self.lister {
                        Some(lister) => lister.push(now, &self.message),
                        None => {
                            self.mac.sign_in_place(&mut self.message);
                            false
                        }
                    };
                    let to = if transmit.message_type == MessageType::Parity { self.parity_group } else { None };
                    let message = std::mem::take(&mut self.message);
                    self.push_multicast(&message, to).await;
                    self.message = message;
                    if list_full {
                        self.send_list().await;
                    }
                }
                Destination::Receiver(id) => {
                    let Some(link) = self.links.get_mut(&id) else { continue };
                    link.out.extend_from_slice(&self.message);
                    let queued = link.queue.queued_bytes.load(Ordering::SeqCst) + link.out.len();
                    if queued >= self.bounds.repair_queue_bytes_max {
                        link.flush();
                        if link.block(low_water_bytes) {
                            self.sender.set_writable(id, false);
                            self.shared.repair_queue_full.fetch_add(1, Ordering::Relaxed);
                            if link.queue.full.hit() {
                                tracing::info!(
                                    receiver = id.0,
                                    peer = %link.peer,
                                    bound = self.bounds.repair_queue_bytes_max,
                                    "FMTP sender: repair queue full (the receiver reads slowly); serving the others"
                                );
                            }
                        }
                    }
                }
            }
        }
        if self.lister.as_ref().and_then(DigestLister::due).is_some_and(|due| due <= now) {
            self.send_list().await;
        }
        if self.segments > 0 {
            self.flush_multicast().await;
        }
        for link in self.links.values_mut() {
            link.flush();
        }
    }

    /// Adds a multicast datagram to the GSO batch (sending the batch first when the datagram
    /// cannot join it, and after it when full or ended by a shorter one).
    async fn push_multicast(&mut self, datagram: &[u8], to: Option<SocketAddr>) {
        let len = datagram.len();
        if self.segments > 0
            && (len > self.segment_len || !self.batch.len().is_multiple_of(self.segment_len) || to != self.batch_to)
        {
            self.flush_multicast().await;
        }
        self.batch_to = to;
        if self.segments == 0 {
            self.segment_len = len;
        }
        self.batch.extend_from_slice(datagram);
        self.segments += 1;
        if self.segments == self.max_segments || len < self.segment_len {
            self.flush_multicast().await;
        }
    }

    /// Multicasts the signed list of the datagrams not yet listed (to the group).
    async fn send_list(&mut self) {
        let Some(lister) = &mut self.lister else { return };
        let mut list = std::mem::take(&mut self.list);
        lister.emit(&self.mac, &mut list);
        if !list.is_empty() {
            self.push_multicast(&list, None).await;
            self.shared.digest_lists.fetch_add(1, Ordering::Relaxed);
        }
        self.list = list;
    }

    /// Takes the level-2 signing mode asked for: a switch to signing each datagram sends the
    /// list of the datagrams sent before it first.
    async fn take_signing_mode(&mut self) {
        let lists = self.mac.level() == MacLevel::Ed25519 && self.signing.get() == MacSigning::Lists;
        if lists == self.lister.is_some() {
            return;
        }
        if lists {
            self.lister = Some(DigestLister::new());
        } else {
            self.send_list().await;
            self.lister = None;
        }
        tracing::info!(signing = %if lists { MacSigning::Lists } else { MacSigning::Datagram }, "FMTP sender: MAC level 2 signing mode");
    }

    async fn flush_multicast(&mut self) {
        match self.udp.send_segments(&self.batch, self.segment_len, self.batch_to).await {
            Ok(()) => {
                self.shared.multicast_send_errors.relieved();
            }
            Err(error) => {
                if self.shared.multicast_send_errors.hit() {
                    tracing::warn!(%error, "FMTP sender: multicast send failed (receivers will ask for repairs)");
                }
            }
        }
        self.batch.clear();
        self.segments = 0;
    }

    /// Hands a notice to the application, or keeps it while the channel is full.
    fn notify(&mut self, notice: SenderNotice) {
        if !self.pending_notices.is_empty() {
            self.pending_notices.push_back(notice);
            return;
        }
        match self.notices.try_send(notice) {
            Ok(()) => {
                self.shared.notices.relieved();
            }
            Err(ChannelFull::Full(notice)) => {
                if self.shared.notices.hit() {
                    tracing::info!(
                        bound = self.notices.max_capacity(),
                        "FMTP sender: the application is not reading notices; taking no product until it does"
                    );
                }
                self.pending_notices.push_back(notice);
            }
            Err(ChannelFull::Closed(_)) => {}
        }
    }

    fn flush_notices(&mut self) {
        while let Some(notice) = self.pending_notices.pop_front() {
            match self.notices.try_send(notice) {
                Ok(()) => {}
                Err(ChannelFull::Full(notice)) => {
                    self.pending_notices.push_front(notice);
                    return;
                }
                Err(ChannelFull::Closed(_)) => {
                    self.pending_notices.clear();
                    return;
                }
            }
        }
        self.shared.notices.relieved();
    }
}

/// Queues a KEY_UPDATE of `key` (epoch `epoch`) for a receiver; false when it cannot be sealed
/// (logged).
fn send_key_update(link: &mut Link, epoch: u32, key: &SenderKey, identity: Option<&SigningKey>) -> bool {
    let sealed = match link.offer.seal_update(epoch, &key.material(), identity, &mut rand_core::OsRng) {
        Ok(sealed) => sealed,
        Err(error) => {
            tracing::warn!(peer = %link.peer, %error, "FMTP sender: cannot seal the new MAC key to a receiver");
            return false;
        }
    };
    let update = Message { index: ProductIndex(epoch), body: Body::KeyUpdate { sealed: &sealed } };
    if update.emit_to_vec(&mut link.out).is_err() {
        return false;
    }
    link.flush();
    true
}

async fn accept_loop(
    listener: TcpListener,
    authorize: Authorizer,
    inputs: Inputs,
    bounds: SenderBounds,
    keys: KeyAnswer,
) {
    let live = Arc::new(AtomicUsize::new(0));
    let accept_errors = BoundHits::new();
    let mut next_id = 1u64;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => {
                accept_errors.relieved();
                accepted
            }
            Err(error) => {
                if accept_errors.hit() {
                    tracing::warn!(%error, "FMTP sender: cannot accept retransmission connections; retrying");
                }
                tokio::time::sleep(ACCEPT_RETRY_DELAY).await;
                continue;
            }
        };
        if !authorize(peer) {
            inputs.shared.connections_unauthorized.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%peer, "FMTP sender: refused a retransmission connection: peer not authorized");
            continue;
        }
        if live.load(Ordering::SeqCst) >= bounds.receivers_max {
            if inputs.shared.connections_over_bound.hit() {
                tracing::warn!(%peer, bound = bounds.receivers_max, "FMTP sender: too many receivers; refusing more");
            }
            continue;
        }
        inputs.shared.connections_over_bound.relieved();
        live.fetch_add(1, Ordering::SeqCst);
        let id = ReceiverId(next_id);
        next_id += 1;
        let inputs = inputs.clone();
        let live = live.clone();
        let keys = keys.clone();
        tokio::spawn(async move {
            if let Err(error) = serve_connection(stream, peer, id, &inputs, bounds, &keys).await {
                tracing::info!(%peer, receiver = id.0, %error, "FMTP retransmission connection closed");
            }
            live.fetch_sub(1, Ordering::SeqCst);
            let _ = inputs.send(Input::Disconnected(id)).await;
        });
    }
}

/// One receiver's connection: key exchange, then its writer task, then reading frames with
/// credits until the connection ends.
async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    id: ReceiverId,
    inputs: &Inputs,
    bounds: SenderBounds,
    keys: &KeyAnswer,
) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream::set_keepalive(&stream)?;
    if let Some(bytes) = bounds.repair_send_buffer_bytes {
        socket2::SockRef::from(&stream).set_send_buffer_size(bytes)?;
    }
    let (mut read, mut write) = stream.into_split();
    let (first, offer, epoch, exchange) = accept_handshake(&mut read, &mut write, keys).await?;
    let queue = Arc::new(RepairQueue::default());
    let credit = Arc::new(Semaphore::new(0));
    let (writer, repairs) = mpsc::unbounded_channel();
    let low_water_bytes = bounds.repair_queue_bytes_max / 2;
    tokio::spawn(write_repairs(
        write,
        repairs,
        queue.clone(),
        low_water_bytes,
        id,
        inputs.clone(),
        bounds.repair_stall_max,
    ));
    let link = Link {
        peer,
        writer,
        queue,
        credit: credit.clone(),
        out: Vec::new(),
        held: Vec::new(),
        paused: false,
        pauses: BoundHits::new(),
        offer,
        epoch,
        joined: Clock::now(),
        messages: 0,
    };
    if inputs.send(Input::Connected { id, peer, link: Box::new(link), exchange }).await.is_err() {
        return Ok(());
    }
    tracing::info!(%peer, receiver = id.0, "FMTP receiver joined");
    read_frames(read, first, id, &credit, inputs, bounds.stream_chunk_bytes_max).await
}

/// Reads a receiver's requests: hands whole frames over, then reads the next chunk only with
/// a credit from the sender task (TCP backpressure); samples the RTT meanwhile.
async fn read_frames(
    mut read: OwnedReadHalf,
    mut buffer: Vec<u8>,
    id: ReceiverId,
    credit: &Semaphore,
    inputs: &Inputs,
    chunk_bytes_max: usize,
) -> io::Result<()> {
    let mut rtt_timer = tokio::time::interval(RTT_INTERVAL);
    rtt_timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut needs_credit = false;
    loop {
        if !needs_credit {
            let whole = whole_frames_len(&buffer)?;
            if whole > 0 {
                let rest = buffer.split_off(whole);
                let frames = std::mem::replace(&mut buffer, rest);
                if inputs.send(Input::Frames { id, frames }).await.is_err() {
                    return Ok(());
                }
                needs_credit = true;
                continue;
            }
        }
        tokio::select! {
            _ = rtt_timer.tick() => {
                if let Some(rtt) = tcp_rtt(read.as_ref())
                    && inputs.send(Input::Rtt(id, rtt)).await.is_err() {
                        return Ok(());
                    }
            }
            permit = credit.acquire(), if needs_credit => match permit {
                Ok(permit) => {
                    permit.forget();
                    needs_credit = false;
                }
                // The sender task dropped the link.
                Err(_) => return Ok(()),
            },
            read = read_more(&mut read, &mut buffer, chunk_bytes_max), if !needs_credit => {
                read?;
            }
            () = inputs.closed() => return Ok(()),
        }
    }
}

/// Bytes of the whole frames at the front of `buffer`.
fn whole_frames_len(buffer: &[u8]) -> io::Result<usize> {
    let mut rest = buffer;
    loop {
        match wire::split_frame(rest) {
            Ok(Split::Frame { rest: after, .. }) => rest = after,
            Ok(Split::Incomplete { .. }) => return Ok(buffer.len() - rest.len()),
            Err(error) => return Err(io::Error::new(io::ErrorKind::InvalidData, error)),
        }
    }
}

/// Writes all of `bytes`, failing with `TimedOut` when one write takes nothing for `stall_max`.
async fn write_making_progress(write: &mut OwnedWriteHalf, bytes: &[u8], stall_max: Duration) -> io::Result<()> {
    let mut written = 0;
    while written < bytes.len() {
        match tokio::time::timeout(stall_max, write.write(&bytes[written..])).await {
            Ok(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(Ok(n)) => written += n,
            Ok(Err(error)) => return Err(error),
            Err(_) => return Err(io::ErrorKind::TimedOut.into()),
        }
    }
    Ok(())
}

/// Writes a receiver's repairs as the sender task queues them, coalescing; says when the
/// queue drained below half its bound after the task marked it full.
async fn write_repairs(
    mut write: OwnedWriteHalf,
    mut repairs: mpsc::UnboundedReceiver<Vec<u8>>,
    queue: Arc<RepairQueue>,
    low_water_bytes: usize,
    id: ReceiverId,
    inputs: Inputs,
    stall_max: Duration,
) {
    while let Some(mut batch) = repairs.recv().await {
        while batch.len() < WRITE_BATCH_BYTES_MAX {
            match repairs.try_recv() {
                Ok(more) => batch.extend_from_slice(&more),
                Err(_) => break,
            }
        }
        match write_making_progress(&mut write, &batch, stall_max).await {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::TimedOut => {
                inputs.shared.connections_stalled.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    receiver = id.0,
                    "FMTP sender: the receiver took none of its repairs for {stall_max:?} (it does not read its \
                     connection); cutting it off"
                );
                break;
            }
            Err(error) => {
                tracing::info!(receiver = id.0, %error, "FMTP sender: cannot write repairs; closing the connection");
                break;
            }
        }
        let left = queue.queued_bytes.fetch_sub(batch.len(), Ordering::SeqCst) - batch.len();
        if left <= low_water_bytes
            && queue.blocked.compare_exchange(true, false, Ordering::SeqCst, Ordering::SeqCst).is_ok()
            && inputs.send(Input::Writable(id)).await.is_err()
        {
            return;
        }
        if left == 0 {
            queue.full.relieved();
        }
    }
    let _ = inputs.send(Input::Disconnected(id)).await;
}
