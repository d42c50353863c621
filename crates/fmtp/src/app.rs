//! The FMTP transport as a tool (`ldm7 fmtp send | recv`, issue #3): for tests, benchmarks and
//! operators, without LDM's queue or sessions. The command line only parses flags into these
//! typed options and prints; everything else is here.
//!
//! * [`send`]: checks its inputs (files, or a trace whose sizes and, with a [`Speedup`], times
//!   it replays with synthetic content) without reading them, opens its sockets — the
//!   retransmission server listens from here on — says how many receivers it waits for (LDM
//!   sends nothing without one) and, while they arrive, reads the first input. Then it streams
//!   the inputs: each is read when its turn comes (its MD5 is the BOP metadata, as LDM-7 uses
//!   it) and its bytes are read back block by block for the multicast and for repairs, never
//!   held (the memory bound is in the `inputs` module: no product bytes for regular files and
//!   replays, whatever their size and number). It serves repairs, then lingers until every
//!   product was released.
//! * [`recv`]: joins, connects — a sender that does not listen yet is waited for, retrying
//!   until the connect deadline (the idle timeout starts once connected) and reported
//!   ([`RecvProgress::Waiting`]; no sender in time: [`AppError::NoSender`]) — repairs, checks
//!   each product's MD5 against its metadata and, with an output directory, stores it there as
//!   `<md5>`: through the spool (`SpoolSink`), so that no product is held whole in memory, the
//!   spool file being renamed into place.
//!
//! Progress is reported through a callback, so that the caller decides what to print.

mod inputs;

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use ed25519_dalek::{SigningKey, VerifyingKey};
use ldm7_fmtp_proto::mac::MacLevel;
use ldm7_fmtp_proto::{
    DeadlinePolicy, EnqueueRefusal, MissReason, ParityConfig, ProductIndex, SenderConfig, SenderCounters, SenderEvent,
};
use ldm7_io::Clock;
use ldm7_types::{Instant, Rate, Signature};
use tokio::sync::oneshot;

use self::inputs::OpenFiles;
pub use self::inputs::{OPEN_FILES_MAX, READ_CHUNK_BYTES};
use crate::receiver::{
    BufferReturn, ConnectionState, FmtpReceiver, ReceiveError, ReceivedBytes, ReceiverNotice, ReceiverOptions,
    ReceiverReport, md5_side_by_side,
};
use crate::sender::{FmtpSender, ProductSender, SenderDriverCounters, SenderNotice, SenderOptions};
use crate::stream::ConnectError;
use crate::udp::{MulticastConfig, RECEIVE_GAP_DEFAULT, buffer_bytes_for_rate, parity_group_of, receive_buffer_bytes};

/// On-the-wire overhead paced per message, as tc HTB counts it: Ethernet (14), IPv4 (20) and
/// UDP (8) headers.
const WIRE_OVERHEAD_BYTES: u64 = 42;

/// Extra time after the linger for the last notices to arrive.
const LINGER_GRACE: Duration = Duration::from_secs(1);

/// Products read and handed to the sender task but not yet taken by it (the driver's
/// `SenderBounds::product_inputs_max` for this tool). With [`QUEUED_PRODUCTS_MAX`] it bounds
/// how far reading the inputs runs ahead of the multicast.
pub const PRODUCT_INPUTS_MAX: usize = 2;

/// Products the protocol holds waiting for their multicast (`SenderConfig::queued_products_max`
/// for this tool).
pub const QUEUED_PRODUCTS_MAX: usize = 8;

/// What [`send`] sends.
#[derive(Clone, Debug, PartialEq)]
pub enum ProductSource {
    /// These files, one product each.
    Files(Vec<PathBuf>),
    /// Synthetic products with a trace's sizes (content derived from the product's position).
    Replay {
        /// The trace file (`ldm7_types::trace` format).
        trace: PathBuf,
        /// At most this many products.
        limit: Option<usize>,
        /// Pace by the trace's times divided by this.
        speed: Speedup,
    },
}

/// Replay pacing: the trace's time divided by a factor; [`Speedup::UNPACED`] (0) sends as fast
/// as the rate allows.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
pub struct Speedup(f64);

impl Speedup {
    /// No pacing by the trace's times.
    pub const UNPACED: Speedup = Speedup(0.0);

    /// The factor (finite, ≥ 0).
    pub fn factor(self) -> f64 {
        self.0
    }
}

impl FromStr for Speedup {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim().parse::<f64>() {
            Ok(factor) if factor.is_finite() && factor >= 0.0 => Ok(Speedup(factor)),
            _ => Err(format!(
                "speed {text:?} is not valid: expected a factor such as \"10\" (ten times the trace's pace) or \"0\" (as fast as the rate allows)"
            )),
        }
    }
}

/// The receive-side loss filter's probability, 0 ≤ p < 1.
#[derive(Clone, Copy, Debug, Default, PartialEq, PartialOrd)]
pub struct DropProbability(f64);

impl DropProbability {
    /// The probability.
    pub fn probability(self) -> f64 {
        self.0
    }
}

impl FromStr for DropProbability {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim().parse::<f64>() {
            Ok(probability) if (0.0..1.0).contains(&probability) => Ok(DropProbability(probability)),
            _ => Err(format!(
                "drop probability {text:?} is not valid: expected a fraction from 0 to below 1, such as \"0.05\""
            )),
        }
    }
}

/// Settings of [`send`].
#[derive(Clone, Debug, PartialEq)]
pub struct SendOptions {
    /// Multicast group and port.
    pub group: SocketAddr,
    /// Address of the interface to send from.
    pub interface: IpAddr,
    /// Sending rate (multicast and repairs, each).
    pub rate: Rate,
    /// Where the retransmission server listens (`None`: the interface, any port).
    pub retx_listen: Option<SocketAddr>,
    /// Multicast TTL.
    pub ttl: u32,
    /// Receivers to wait for before sending.
    pub receivers: usize,
    /// Retransmission deadline per product.
    pub retx_timeout: Duration,
    /// After the last product was multicast, how long to wait for them all to be released.
    pub linger: Duration,
    /// The products.
    pub source: ProductSource,
    /// MAC level of the multicast datagrams (§3.7).
    pub mac_level: MacLevel,
    /// The publisher identity signing each key answer (the ldm7 extension).
    pub identity: Option<Arc<SigningKey>>,
    /// A new MAC key this often (the ldm7 extension).
    pub mac_rotation: Option<Duration>,
    /// At MAC level 2: a signature on each datagram or signed digest lists (ldm7 receivers only).
    pub mac_signing: crate::MacSigning,
    /// Answer parity requests with parity multicast (the ldm7 extension; receivers need the
    /// same group size and shard count).
    pub parity: Option<ParityConfig>,
}

/// What [`send`] reports as it goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SendProgress {
    /// The sockets are open.
    Started {
        /// Where multicast comes from.
        source: SocketAddr,
        /// The retransmission server (give it to receivers).
        retx: SocketAddr,
    },
    /// Nothing is sent until this many receivers connected (announced once, before any
    /// [`SendProgress::ReceiverJoined`]).
    Waiting {
        /// Receivers waited for.
        wanted: usize,
        /// The retransmission server they connect to.
        retx: SocketAddr,
    },
    /// A receiver connected.
    ReceiverJoined {
        /// Its address.
        peer: SocketAddr,
        /// Receivers so far (it may exceed `wanted`: later receivers are served too).
        joined: usize,
        /// Receivers waited for.
        wanted: usize,
    },
    /// The protocol refused a product (e.g. no receiver connected any more).
    Refused(EnqueueRefusal),
}

/// What [`send`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendSummary {
    /// Products sent (one per input file or trace entry).
    pub products: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Products multicast whole.
    pub sent: usize,
    /// Products released.
    pub released: usize,
    /// Products refused.
    pub refused: usize,
    /// From the first product handed over to the last release.
    pub elapsed: Duration,
    /// Input files opened again to read back blocks after being closed to stay within
    /// [`OPEN_FILES_MAX`].
    pub inputs_reopened: u64,
    /// The protocol's counters.
    pub protocol: SenderCounters,
    /// The driver's counters.
    pub driver: SenderDriverCounters,
}

impl SendSummary {
    /// Product bytes per second of `elapsed`, in bits.
    pub fn goodput_bits_per_s(&self) -> f64 {
        if self.sent == 0 || self.elapsed.is_zero() {
            return 0.0; // Nothing multicast (every product refused): no rate to speak of.
        }
        self.bytes as f64 * 8.0 / self.elapsed.as_secs_f64()
    }
}

/// Settings of [`recv`].
#[derive(Clone, Debug, PartialEq)]
pub struct RecvOptions {
    /// Multicast group and port.
    pub group: SocketAddr,
    /// Address of the interface to join on.
    pub interface: IpAddr,
    /// The sender's retransmission server.
    pub sender: SocketAddr,
    /// Join source-specifically on this sender address.
    pub source: Option<IpAddr>,
    /// Directory for received products (named by MD5); `None`: products are only checked.
    pub out: Option<PathBuf>,
    /// Receive-side loss filter (tests and demos).
    pub drop: DropProbability,
    /// Seed of the loss filter.
    pub seed: u64,
    /// Stop after this many products were delivered or missed.
    pub count: Option<u64>,
    /// Stop after this long without a notice.
    pub idle_timeout: Duration,
    /// Expected rate (sizes the socket buffer).
    pub rate: Rate,
    /// How long to keep trying to connect to the sender.
    pub connect_deadline: Duration,
    /// MAC level of the multicast datagrams: the sender's (§3.7).
    pub mac_level: MacLevel,
    /// The pinned publisher key: the key answer must be signed by it (the ldm7 extension).
    pub pin: Option<VerifyingKey>,
    /// Ask for lost blocks as parity (the ldm7 extension; the sender's group size and shard
    /// count).
    pub parity: Option<ParityConfig>,
}

/// What [`recv`] reports as it goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecvProgress {
    /// The sender is not reachable yet (not started, or not listening yet): retrying until the
    /// connect deadline. Reported once, at the first failed attempt.
    Waiting {
        /// The sender's retransmission server.
        sender: SocketAddr,
        /// How long the receiver keeps trying.
        deadline: Duration,
        /// Why the first attempt failed.
        last_error: String,
    },
    /// Connected to the sender's retransmission server.
    Connected(SocketAddr),
    /// A product will not arrive over FMTP.
    Missed {
        /// Its index.
        index: ProductIndex,
        /// Why.
        reason: MissReason,
    },
    /// Products `first..=last` were skipped by a jump of the product index too large to
    /// request them one by one: they will not arrive (each counts as missed).
    IndexGap {
        /// The oldest skipped index.
        first: ProductIndex,
        /// The newest.
        last: ProductIndex,
    },
}

/// What [`recv`] got.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecvSummary {
    /// Products delivered.
    pub delivered: u64,
    /// Products missed.
    pub missed: u64,
    /// Blocks that came by retransmission.
    pub retransmitted_blocks: u64,
    /// Delivered products whose MD5 differs from their metadata.
    pub corrupt: u64,
    /// The receiver's counters.
    pub report: ReceiverReport,
}

/// Why [`send`] or [`recv`] failed.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The options or the input files are wrong.
    #[error("{0}")]
    Input(String),
    /// The sender could not start.
    #[error("cannot start the FMTP sender: {0}")]
    Start(io::Error),
    /// The sender stopped unexpectedly.
    #[error("the FMTP sender stopped unexpectedly")]
    SenderStopped,
    /// Products were still held for repairs when the linger time ended.
    #[error("{unreleased} products were not released within the linger time ({linger:?}): receivers did not finish")]
    NotReleased {
        /// How many.
        unreleased: usize,
        /// The linger time.
        linger: Duration,
    },
    /// No sender answered at the retransmission address before the connect deadline.
    #[error(
        "no FMTP sender answered at {addr} within {:.1} s ({attempts} attempts; the last: {last}): \
         start `ldm7 fmtp send --retx-listen {addr} …`, check --sender, or wait longer with --timeout",
        .waited.as_secs_f64()
    )]
    NoSender {
        /// The sender's retransmission server.
        addr: SocketAddr,
        /// Attempts made.
        attempts: u32,
        /// How long they took.
        waited: Duration,
        /// The last attempt's error.
        last: io::Error,
    },
    /// The receiver failed.
    #[error(transparent)]
    Receive(ReceiveError),
    /// A product could not be stored.
    #[error("cannot store a product in {path}: {source}")]
    Output {
        /// Where.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// Products did not match their MD5 (see [`RecvSummary::corrupt`]).
    #[error("{0} products did not match their MD5")]
    Corrupt(u64),
    /// Products were missed (see [`RecvSummary::missed`] and the [`RecvProgress::Missed`] and
    /// [`RecvProgress::IndexGap`] reports).
    #[error(
        "{0} products were missed (see the `missed` lines above): the sender rejected them, the receiver's bounds gave them up, or they were skipped"
    )]
    Missed(u64),
    /// `--count` products were expected and fewer came before the idle timeout.
    #[error(
        "{got} of the {count} products expected came before {idle:?} passed without one: the others were never \
         seen (the sender stopped sending, or they were lost whole and the sender has not said so yet)"
    )]
    Short {
        /// Delivered or missed.
        got: u64,
        /// Expected.
        count: u64,
        /// The idle timeout.
        idle: Duration,
    },
}

impl AppError {
    /// Whether the caller's input was wrong (the command exits 1) rather than the run failing.
    pub fn is_input(&self) -> bool {
        matches!(self, Self::Input(_) | Self::Receive(ReceiveError::DropProbability(_)))
    }
}

/// Multicasts the products, serving repairs, and waits for their release. See the module doc.
pub async fn send(options: &SendOptions, mut progress: impl FnMut(SendProgress)) -> Result<SendSummary, AppError> {
    let plan = inputs::plan(&options.source)?;
    let multicast = multicast_config(
        options.group,
        options.interface,
        options.ttl,
        buffer_bytes_for_rate(options.rate.bits_per_s()),
    )?;
    let total = plan.inputs.len();
    let mut proto = SenderConfig::with_rate(options.rate.bits_per_s());
    for pacing in [&mut proto.multicast_pacing, &mut proto.retx_pacing].into_iter().flatten() {
        pacing.overhead_bytes_per_message = WIRE_OVERHEAD_BYTES;
    }
    proto.deadline = DeadlinePolicy::Constant(options.retx_timeout);
    proto.parity = options.parity;
    proto.queued_products_max = QUEUED_PRODUCTS_MAX;
    // Retained products hold no bytes of a file (read back by offset): keep them all.
    proto.retained_products_max = proto.retained_products_max.max(total + 1);
    let retx_listen = options.retx_listen.unwrap_or(SocketAddr::new(options.interface, 0));
    let mut sender_options = SenderOptions::new(multicast, retx_listen, proto);
    sender_options.mac_level = options.mac_level;
    sender_options.identity = options.identity.clone();
    sender_options.mac_rotation = options.mac_rotation;
    sender_options.mac_signing = options.mac_signing;
    sender_options.parity_group = options.parity.map(|_| parity_group_of(options.group));
    sender_options.bounds.product_inputs_max = PRODUCT_INPUTS_MAX;
    let mut sender = FmtpSender::start(sender_options).await.map_err(AppError::Start)?;
    let retx = sender.retx_addr();
    progress(SendProgress::Started { source: sender.source_addr(), retx });
    // The inputs are read from now on, by a task of their own (the sender takes no product
    // while notices go unread, and this task reads them): the first product is ready when the
    // last receiver arrives, and none is handed over before.
    let files = Arc::new(OpenFiles::default());
    let (go, go_signal) = oneshot::channel();
    let mut feeding = AbortOnDrop(tokio::spawn(feed(plan, sender.product_sender(), files.clone(), go_signal)));
    if options.receivers > 0 {
        progress(SendProgress::Waiting { wanted: options.receivers, retx });
    }
    let mut joined = 0;
    while joined < options.receivers {
        tokio::select! {
            notice = sender.next_notice() => match notice {
                Some(SenderNotice::ReceiverJoined(_, peer)) => {
                    joined += 1;
                    progress(SendProgress::ReceiverJoined { peer, joined, wanted: options.receivers });
                }
                Some(_) => {}
                None => return Err(AppError::SenderStopped),
            },
            // Before the go the feeder ends only when an input cannot be read.
            fed = &mut feeding.0 => {
                fed_bytes(fed)?;
                return Err(AppError::SenderStopped);
            }
        }
    }
    let started = Clock::now();
    let _ = go.send(started);
    let (mut sent, mut released, mut refused) = (0usize, 0usize, 0usize);
    let mut bytes = None;
    let mut linger_until = None;
    let mut last_release = started;
    while released + refused < total {
        // The linger starts once every product was handed over and multicast.
        if linger_until.is_none() && bytes.is_some() && sent + refused >= total {
            linger_until = Some(tokio::time::Instant::now() + options.linger + LINGER_GRACE);
        }
        let linger = async {
            match linger_until {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            notice = sender.next_notice() => match notice {
                Some(SenderNotice::Event(SenderEvent::Sent { .. })) => sent += 1,
                Some(SenderNotice::Event(SenderEvent::Released { .. })) => {
                    released += 1;
                    last_release = Clock::now();
                }
                Some(SenderNotice::Refused(error)) => {
                    refused += 1;
                    progress(SendProgress::Refused(error.reason));
                }
                Some(SenderNotice::ReceiverJoined(_, peer)) => {
                    joined += 1;
                    progress(SendProgress::ReceiverJoined { peer, joined, wanted: options.receivers });
                }
                Some(_) => {}
                None => return Err(AppError::SenderStopped),
            },
            fed = &mut feeding.0, if bytes.is_none() => bytes = Some(fed_bytes(fed)?),
            () = linger => break,
        }
    }
    let summary = SendSummary {
        products: total,
        bytes: bytes.unwrap_or_default(),
        sent,
        released,
        refused,
        elapsed: last_release.saturating_duration_since(started),
        inputs_reopened: files.reopened(),
        protocol: sender.counters(),
        driver: sender.driver_counters(),
    };
    if released + refused < total {
        return Err(AppError::NotReleased { unreleased: total - released - refused, linger: options.linger });
    }
    Ok(summary)
}

/// Receives products until the count or the idle timeout, checking (and storing) each; the
/// summary counts the corrupt ones ([`AppError::Corrupt`] is the caller's to raise). Until the
/// sender is reached, the connect deadline applies instead of the idle timeout, and the first
/// failed attempt is reported ([`RecvProgress::Waiting`]). See the module doc.
pub async fn recv(options: &RecvOptions, mut progress: impl FnMut(RecvProgress)) -> Result<RecvSummary, AppError> {
    let buffer_bytes = receive_buffer_bytes(options.rate.bits_per_s(), RECEIVE_GAP_DEFAULT);
    let multicast = multicast_config(options.group, options.interface, 1, buffer_bytes)?;
    if let Some(out) = &options.out {
        std::fs::create_dir_all(out)
            .map_err(|error| AppError::Input(format!("cannot create --out {}: {error}", out.display())))?;
    }
    let mut receiver_options = ReceiverOptions::new(multicast, options.sender);
    receiver_options.source = options.source;
    receiver_options.spool = options.out.clone();
    receiver_options.drop_probability = options.drop.probability();
    receiver_options.seed = options.seed;
    receiver_options.connect_deadline = options.connect_deadline;
    receiver_options.mac_level = options.mac_level;
    receiver_options.pin = options.pin;
    receiver_options.proto.parity = options.parity;
    receiver_options.parity_group = options.parity.map(|_| parity_group_of(options.group));
    let mut receiver = FmtpReceiver::start(receiver_options).map_err(AppError::Receive)?;
    let mut connection = receiver.connection();
    let (mut connected, mut said_waiting) = (false, false);
    let mut summary = RecvSummary::default();
    let mut verifier = Verifier::start(options.out.clone(), receiver.buffer_return())?;
    while options.count.is_none_or(|count| summary.delivered + summary.missed < count) {
        let notice = if connected {
            match tokio::time::timeout(options.idle_timeout, receiver.next_notice()).await {
                Ok(Some(notice)) => notice,
                Ok(None) | Err(_) => break,
            }
        } else {
            tokio::select! {
                notice = receiver.next_notice() => match notice {
                    Some(notice) => notice,
                    None => break,
                },
                changed = connection.changed(), if !said_waiting => {
                    let retrying = match &*connection.borrow_and_update() {
                        ConnectionState::Retrying { last_error, .. } => Some(last_error.clone()),
                        _ => None,
                    };
                    if changed.is_err() {
                        said_waiting = true; // The receiver ended: its notices say why.
                    } else if let Some(last_error) = retrying {
                        said_waiting = true;
                        progress(RecvProgress::Waiting {
                            sender: options.sender,
                            deadline: options.connect_deadline,
                            last_error,
                        });
                    }
                    continue;
                }
            }
        };
        match notice {
            ReceiverNotice::Connected(addr) => {
                connected = true;
                progress(RecvProgress::Connected(addr));
            }
            ReceiverNotice::Delivered { delivery, product } => {
                summary.delivered += 1;
                summary.retransmitted_blocks += u64::from(delivery.retransmitted_blocks);
                if options.count.is_some_and(|count| summary.delivered + summary.missed >= count) {
                    // The last one: the receiver's held RETX_ENDs go out now, not after the
                    // check of the products still queued for it (the sender releases the last
                    // products of its burst as soon as they come: issue #37's goodput).
                    receiver.stop();
                }
                if !verifier.check(delivery.metadata, product).await {
                    verifier.finish().await?; // Its error.
                }
            }
            ReceiverNotice::Event(ldm7_fmtp_proto::ReceiverEvent::Missed { index, reason }) => {
                summary.missed += 1;
                progress(RecvProgress::Missed { index, reason });
            }
            ReceiverNotice::Event(ldm7_fmtp_proto::ReceiverEvent::IndexGap { first, last }) => {
                summary.missed += u64::from(last.0.wrapping_sub(first.0)) + 1;
                progress(RecvProgress::IndexGap { first, last });
            }
            ReceiverNotice::Event(_) => {}
        }
    }
    // The receiver first: it stops at once (its held requests go out), while the check may
    // still have products to hash.
    let report = receiver.finish().await;
    summary.corrupt = verifier.finish().await?;
    summary.report = report.map_err(|error| match error {
        ReceiveError::Connect(ConnectError { addr, attempts, waited, last }) => {
            AppError::NoSender { addr, attempts, waited, last }
        }
        error => AppError::Receive(error),
    })?;
    Ok(summary)
}

/// How much nicer than the reception the check of delivered products runs (`nice` +10: a CFS
/// weight about a tenth of the receiving threads'). See [`Verifier`].
const VERIFY_NICE: libc::c_int = 10;

/// Bytes of delivered products in memory waiting for their check, at most (a product larger
/// than this waits alone): a bound on the memory they hold (products in memory are whole) that
/// slows the receiving loop, as the check in line did, when the check falls behind for good.
/// Room for a batch ([`VERIFY_BATCH_BYTES`]) being hashed and the next one gathering.
const VERIFY_QUEUE_BYTES_MAX: usize = 96 << 20;

/// Delivered products waiting for their check, at most (whatever their bytes: a spooled one
/// holds a file open).
const VERIFY_QUEUE_MAX: usize = 2 * VERIFY_BATCH_PRODUCTS;

/// The check hashes the products waiting together, side by side in SIMD lanes, once this many
/// of their bytes wait, ...
const VERIFY_BATCH_BYTES: usize = 32 << 20;

/// ... or this many products (AVX-512's lanes), ...
const VERIFY_BATCH_PRODUCTS: usize = 16;

/// ... or once the first of them waited this long (and when the reception ends).
const VERIFY_BATCH_WAIT: Duration = Duration::from_millis(500);

/// A delivered product waiting for its check, with its share of [`VERIFY_QUEUE_BYTES_MAX`].
struct Unchecked {
    metadata: Vec<u8>,
    product: ReceivedBytes,
    _bytes: tokio::sync::OwnedSemaphorePermit,
}

/// Checks each delivered product's MD5 (and stores it with `--out`) on a thread of its own, at a
/// lower CPU priority than the reception ([`VERIFY_NICE`]). The check is this tool's, not
/// FMTP's (an LDM subscriber takes the signature from the BOP, as LDM does): on a host whose
/// cores are busy, hashing 10 MB products as they complete took the cores from the receiving
/// threads (and, on a shared lab host, the sender) exactly when a product ended; at a lower
/// priority it runs in the gaps, and each product is still checked before the summary.
///
/// Products are hashed in batches ([`VERIFY_BATCH_BYTES`], [`VERIFY_BATCH_PRODUCTS`],
/// [`VERIFY_BATCH_WAIT`]): side by side, four 10 MB products take about the time of one hashed
/// alone (AVX-512), and with four receivers on two cores the check one product at a time was a
/// fifth of the machine (docs/benchmarks.md, "FMTP goodput: huge pages off, hashing in
/// batches").
struct Verifier {
    queue: Option<tokio::sync::mpsc::Sender<Unchecked>>,
    bytes: Arc<tokio::sync::Semaphore>,
    thread: Option<std::thread::JoinHandle<Result<u64, AppError>>>,
}

impl Verifier {
    fn start(out: Option<PathBuf>, buffers: BufferReturn) -> Result<Self, AppError> {
        let (queue, mut work) = tokio::sync::mpsc::channel::<Unchecked>(VERIFY_QUEUE_MAX);
        let cannot_start =
            |error: io::Error| AppError::Input(format!("cannot start the thread checking products: {error}"));
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().map_err(cannot_start)?;
        let thread = std::thread::Builder::new()
            .name("fmtp-verify".into())
            .spawn(move || {
                lower_this_thread_priority(VERIFY_NICE);
                runtime.block_on(async move {
                    let mut corrupt = 0;
                    let mut batch = Vec::with_capacity(VERIFY_BATCH_PRODUCTS);
                    while let Some(first) = work.recv().await {
                        let until = tokio::time::Instant::now() + VERIFY_BATCH_WAIT;
                        let mut bytes = first.product.len();
                        batch.push(first);
                        let mut ended = false;
                        while bytes < VERIFY_BATCH_BYTES as u64 && batch.len() < VERIFY_BATCH_PRODUCTS {
                            match tokio::time::timeout_at(until, work.recv()).await {
                                Ok(Some(more)) => {
                                    bytes += more.product.len();
                                    batch.push(more);
                                }
                                Ok(None) => {
                                    ended = true;
                                    break;
                                }
                                Err(_) => break,
                            }
                        }
                        corrupt += check_batch(&mut batch, out.as_deref(), &buffers)?;
                        if ended {
                            break;
                        }
                    }
                    Ok(corrupt)
                })
            })
            .map_err(cannot_start)?;
        let bytes = Arc::new(tokio::sync::Semaphore::new(VERIFY_QUEUE_BYTES_MAX >> 10));
        Ok(Self { queue: Some(queue), bytes, thread: Some(thread) })
    }

    /// Queues a product for its check, once its bytes fit in [`VERIFY_QUEUE_BYTES_MAX`];
    /// `false` when the thread stopped (on an error that [`Verifier::finish`] returns).
    async fn check(&mut self, metadata: Vec<u8>, product: ReceivedBytes) -> bool {
        let Some(queue) = &self.queue else { return false };
        let in_memory = match &product {
            ReceivedBytes::Memory(bytes) => bytes.len(),
            _ => 0,
        };
        // At most the whole bound (a larger product waits alone); in KiB, ≤ u32::MAX.
        let kib = (in_memory >> 10).min(VERIFY_QUEUE_BYTES_MAX >> 10) as u32;
        let Ok(permit) = self.bytes.clone().acquire_many_owned(kib).await else { return false };
        queue.send(Unchecked { metadata, product, _bytes: permit }).await.is_ok()
    }

    /// Waits for the queued checks: the corrupt products, or the first error.
    async fn finish(&mut self) -> Result<u64, AppError> {
        self.queue = None;
        let Some(thread) = self.thread.take() else { return Ok(0) };
        tokio::task::spawn_blocking(move || thread.join())
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_else(|| Err(AppError::Input("the thread checking products failed".into())))
    }
}

/// Checks (and stores, with `out`) a batch of products, emptying it: the corrupt ones. A buffer
/// not stored goes back to the receiver for a later product.
fn check_batch(
    batch: &mut Vec<Unchecked>,
    out: Option<&std::path::Path>,
    buffers: &BufferReturn,
) -> Result<u64, AppError> {
    let output_error = |source| AppError::Output { path: out.map(PathBuf::from).unwrap_or_default(), source };
    let digests = md5_of_products(batch).map_err(output_error)?;
    let mut corrupt = 0;
    for (Unchecked { metadata, product, .. }, digest) in batch.drain(..).zip(digests) {
        if metadata.len() == 16 && metadata != digest {
            corrupt += 1;
        }
        match out {
            Some(out) => {
                let path = out.join(Signature(digest).to_string());
                product.persist(&path).map_err(|source| AppError::Output { path, source })?;
            }
            None => buffers.give(product),
        }
    }
    Ok(corrupt)
}

/// The MD5 of each product: those in memory hashed side by side in SIMD lanes (several in the
/// time of one), a spooled one read back from its file.
fn md5_of_products(products: &[Unchecked]) -> io::Result<Vec<[u8; 16]>> {
    let in_memory: Vec<&[u8]> = products
        .iter()
        .filter_map(|Unchecked { product, .. }| match product {
            ReceivedBytes::Memory(bytes) => Some(bytes.as_slice()),
            _ => None,
        })
        .collect();
    let mut memory_digests = md5_side_by_side(&in_memory).into_iter();
    products
        .iter()
        .map(|Unchecked { product, .. }| match product {
            ReceivedBytes::Memory(_) => Ok(memory_digests.next().unwrap_or_default()),
            other => other.md5(),
        })
        .collect()
}

/// Raises the calling thread's nice value by `increment` (any process may; on failure the
/// priority stays as it was, which is only slower). On Linux `nice` is the calling thread's.
#[allow(unsafe_code)]
fn lower_this_thread_priority(increment: libc::c_int) {
    // SAFETY: a system call on the calling thread's scheduling priority; no memory involved.
    unsafe {
        libc::nice(increment);
    }
}

/// How much nicer than the multicast the reading and hashing of inputs runs (`nice` +10, as
/// [`VERIFY_NICE`]). See [`feed`].
const INPUTS_NICE: libc::c_int = 10;

/// Reads the inputs in order and hands them to the sender: regular files a few at a time
/// ([`inputs::next_batch`], hashed side by side), anything else one by one; the first batch is
/// prepared at once, handed over after the go (which gives the start time, for replay pacing).
/// Returns the bytes handed over.
///
/// The inputs are read and hashed on a thread of their own at a lower CPU priority
/// ([`INPUTS_NICE`]): it reads ahead (up to [`inputs::HASH_BATCH_FILES`] products wait for the
/// sender), and on cores shared with receivers a batch hashed at the multicast's priority took
/// its time from the pacing (the wire fell to three quarters of the rate while it ran).
async fn feed(
    plan: inputs::Plan,
    products: ProductSender,
    files: Arc<OpenFiles>,
    mut go: oneshot::Receiver<Instant>,
) -> Result<u64, AppError> {
    let planned = plan.inputs.len();
    let (ready, mut prepared) = tokio::sync::mpsc::channel(inputs::HASH_BATCH_FILES);
    std::thread::Builder::new()
        .name("fmtp-inputs".into())
        .spawn(move || {
            lower_this_thread_priority(INPUTS_NICE);
            let mut pending = plan.inputs.into_iter().enumerate().map(|(key, input)| (key as u64, input)).peekable();
            loop {
                let batch = inputs::next_batch(&mut pending);
                if batch.is_empty() {
                    return;
                }
                for product in inputs::prepare_batch(&batch, &files) {
                    let failed = product.is_err();
                    // A closed channel: the feed stopped (the sender did, or send() gave up).
                    if ready.blocking_send(product).is_err() || failed {
                        return;
                    }
                }
            }
        })
        .map_err(|error| AppError::Input(format!("cannot start the thread reading the inputs: {error}")))?;
    let mut started = None;
    let (mut bytes, mut handed) = (0, 0);
    while let Some(product) = prepared.recv().await {
        let product = product?;
        handed += 1;
        let started = match started {
            Some(at) => at,
            None => match (&mut go).await {
                Ok(at) => *started.insert(at),
                Err(_) => return Ok(bytes), // send() gave up.
            },
        };
        if let Some(due) = product.due {
            tokio::time::sleep_until(tokio::time::Instant::from_std(Clock::to_std(started + due))).await;
        }
        if products.send(product.product).await.is_err() {
            return Ok(bytes); // The sender stopped: send() says so.
        }
        bytes += product.len;
    }
    if handed < planned {
        // The thread ended without an error to give: it panicked.
        return Err(AppError::Input(format!("the thread reading the inputs stopped after {handed} of {planned}")));
    }
    Ok(bytes)
}

/// The feeder's outcome: the bytes it handed over, or why it stopped.
fn fed_bytes(fed: Result<Result<u64, AppError>, tokio::task::JoinError>) -> Result<u64, AppError> {
    fed.map_err(|_| AppError::SenderStopped)?
}

/// A task aborted when its handle is dropped (an early return of [`send`]).
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The multicast settings of either end, with its socket buffer (the sender's for its rate, the
/// receiver's for its rate and the scheduling gap it rides out).
fn multicast_config(
    group: SocketAddr,
    interface: IpAddr,
    ttl: u32,
    buffer_bytes: usize,
) -> Result<MulticastConfig, AppError> {
    if !group.ip().is_multicast() {
        return Err(AppError::Input(format!("--group {group} is not a multicast address (224.0.0.0/4 or ff00::/8)")));
    }
    Ok(MulticastConfig { group, interface, interface_index: 0, ttl, loopback: interface.is_loopback(), buffer_bytes })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_values_parse_or_say_what_is_expected() {
        assert_eq!("0".parse::<Speedup>(), Ok(Speedup::UNPACED));
        assert_eq!("2.5".parse::<Speedup>().map(Speedup::factor), Ok(2.5));
        for bad in ["inf", "nan", "-1", "fast", ""] {
            assert!(bad.parse::<Speedup>().is_err(), "{bad}");
        }
        assert_eq!("0.05".parse::<DropProbability>().map(DropProbability::probability), Ok(0.05));
        for bad in ["1", "inf", "nan", "-0.1", "5%"] {
            let error = bad.parse::<DropProbability>().expect_err(bad);
            assert!(error.contains("expected a fraction"), "{error}");
        }
    }

    #[test]
    fn a_unicast_group_is_refused_as_input() {
        let error = multicast_config("127.0.0.1:5000".parse().expect("addr"), IpAddr::from([127, 0, 0, 1]), 1, 1 << 20)
            .expect_err("unicast");
        assert!(error.is_input() && error.to_string().contains("not a multicast address"), "{error}");
    }
}
