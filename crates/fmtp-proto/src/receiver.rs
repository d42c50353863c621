//! The FMTP receiver state machine (ldm7-multicast.md §3.9), sans-IO.
//!
//! Role: assemble products from multicast BOP/MEM_DATA/EOP, detect losses from byte offsets
//! and product indexes, ask the sender over the TCP connection for what is missing, and report
//! every product as delivered (byte-exact) or missed — never silently lost.
//!
//! Invariants and rules (where they differ from the reference, why):
//! * Paths deliver in order (RESEARCH.md §2), and the sender multicasts products one after
//!   another; hence a multicast message of offset `o` means the bytes before `o` that have not
//!   arrived are lost, and a message of a newer product means older products' multicast is
//!   over. Both trigger requests at once (the reference waits for EOP or its EOP timer).
//! * Missing bytes are requested once each: RETX_REQ ranges are coalesced up to
//!   [`ReceiverConfig::request_len_max`] (default 45 blocks = 65160 bytes, the largest whole
//!   number of blocks a 16-bit `payloadlen` holds; the reference sends one request per block,
//!   which `request_len_max = 1448` reproduces). The reference sender serves
//!   `[start rounded down to a block, start + len)`, so a coalesced request is valid for it.
//! * A product is complete when its BOP is known and every byte `[0, size)` arrived; the EOP is
//!   not needed (the reference waits for it and asks for it when lost). Completion sends
//!   RETX_END and emits [`ReceiverEvent::Delivered`].
//! * Blocks that arrive before their product's BOP are kept (bounded by
//!   [`ReceiverConfig::early_bytes_max`], and within [`ReceiverConfig::in_flight_bytes_max`]
//!   with everything else held; a block that does not fit is dropped and requested later)
//!   while BOP_REQ is outstanding, and used when the RETX_BOP arrives (RESEARCH.md §3: dropping
//!   them multiplied retransmissions). Holes of a
//!   product are requested only once its size is known.
//! * A jump in product indexes sends BOP_REQ for every skipped index (at most
//!   [`ReceiverConfig::index_gap_max`]; older skipped ones are reported as one
//!   [`ReceiverEvent::IndexGap`]). Indexes are compared in serial arithmetic; a jump of exactly
//!   2³¹ is invalid and counted as malformed.
//! * Indexes are believed only within [`IndexTrust::Confirmed`]'s window of indexes the sender
//!   confirmed (the default; the reference believes all, [`IndexTrust::All`]): the first index
//!   seen and any index seen twice beyond the window are asked about with BOP_REQ (RETX_BOP
//!   confirms, RETX_REJ refutes); messages beyond the window are dropped and counted, so forged
//!   datagrams cannot move the receiver off the sender's stream (docs/security.md).
//! * Receive timer, per product with a known size: fires when no multicast message for it came
//!   for `slack + factor × (bytes still expected × 8 / rate)`; then the tail is requested and
//!   EOP_REQ sent (lost tail and lost EOP, §3.9). An overall
//!   [`ReceiverConfig::incomplete_timeout`] abandons a product that never completes.
//! * RETX_REJ abandons the product: [`MissReason::Rejected`]. Every abandoned product except a
//!   rejected one also sends RETX_END, so that the sender need not hold it for this receiver.
//! * A receiver cannot know of products lost whole before the first index it sees, nor of
//!   products lost whole after the newest index it has seen until a newer one arrives; LDM's
//!   backlog request and backstop cover those.
//! * Requests are not repeated (TCP is reliable and the sender answers every request with
//!   data, RETX_BOP/RETX_EOP or RETX_REJ); after a reconnection [`Receiver::stream_reset`]
//!   re-issues the outstanding ones.
//! * [`ReceiverConfig::assembly`] chooses whether product bytes are assembled in memory
//!   ([`Assembly::Memory`], the default), written through a [`ProductSink`]
//!   ([`Assembly::Sink`]: a spool file, the product queue; see [`Receiver::with_sink`]) or only
//!   tracked ([`Assembly::Discard`], for the simulator at scale); bounds are accounted alike in
//!   all three, so with a sink the bytes it holds for products in flight are bounded by
//!   [`ReceiverConfig::in_flight_bytes_max`]. Blocks that arrive before their BOP stay in memory
//!   (under [`ReceiverConfig::early_bytes_max`]) until the sink is opened. Either way each
//!   delivery carries [`Delivery::fingerprint`], an order-independent digest of the blocks
//!   taken. A sink error makes the product missed ([`MissReason::SinkFailed`]), never a panic.
//! * Bounds: in-flight products and bytes (oldest incomplete product abandoned:
//!   [`MissReason::Evicted`]), product size ([`MissReason::TooLarge`]), early bytes; each hit
//!   is counted and reported as [`ReceiverEvent::BoundHit`].

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use crate::ConfigError;
use crate::index::ProductIndex;
use crate::parity::ParityConfig;
use crate::ranges::RangeSet;
use crate::sink::{ProductSink, SinkSlot};
use crate::time::{Instant, WallClock, WallTime, transmission_time};
use crate::wire::{self, BLOCK_LEN, Body, Bop, Message, REQUEST_LEN_MAX};

/// The receive timer: how long a product may go without multicast progress before its tail
/// and EOP are requested.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReceiveTimer {
    /// The multicast rate the bytes still expected are assumed to arrive at (bits/s, > 0).
    pub rate_bits_per_s: u64,
    /// Multiplier of the expected transfer time (≥ 0).
    pub factor: f64,
    /// Added to the scaled transfer time (network jitter, sender scheduling).
    pub slack: Duration,
}

impl Default for ReceiveTimer {
    /// The reference waits 20 × size / 20 000 000 s (1 µs per byte, §3.9): 20 Mbit/s × 2.5.
    fn default() -> Self {
        Self { rate_bits_per_s: 20_000_000, factor: 2.5, slack: Duration::from_millis(100) }
    }
}

/// Receiver settings.
#[derive(Clone, Debug, PartialEq)]
pub struct ReceiverConfig {
    /// The receive timer.
    pub receive_timer: ReceiveTimer,
    /// Largest RETX_REQ length (1..=65535; 1448 reproduces the reference's one request per
    /// block).
    pub request_len_max: u16,
    /// Bound: products being received at once.
    pub in_flight_products_max: usize,
    /// Bound: bytes held for products being received (buffers of known size + early blocks).
    pub in_flight_bytes_max: u64,
    /// Bound: largest product accepted (≤ `in_flight_bytes_max`); larger ones are missed.
    pub product_size_max: u32,
    /// Bound: bytes of blocks held for products whose BOP is still unknown.
    pub early_bytes_max: u64,
    /// Bound: products requested for one jump of the product index.
    pub index_gap_max: u32,
    /// A product not complete this long after it was first seen is abandoned (the sender's
    /// deadline, 300 s by default, normally rejects it before).
    pub incomplete_timeout: Duration,
    /// Whether product bytes are assembled in memory.
    pub assembly: Assembly,
    /// Which product indexes are believed without asking the sender.
    pub index_trust: IndexTrust,
    /// ldm7 extension: ask for lost blocks as parity shards (PARITY_REQ) rather than with
    /// RETX_REQ ([`crate::parity`]); the sender must use the same settings. Used with
    /// [`Assembly::Memory`], with [`Assembly::Sink`] when the sink reads back
    /// ([`ProductSink::reads_back`]: a decode needs the group's other blocks), and with
    /// [`Assembly::Discard`] given [`Receiver::set_fingerprint_source`]. `None`: off, as the
    /// reference.
    pub parity: Option<ParityConfig>,
}

/// Which product indexes a receiver believes without asking the sender over its TCP
/// connection. An unauthenticated multicast datagram can carry any index: one forged BOP far
/// ahead of the sender would otherwise move the receiver's newest index there, and the real
/// products after it would count as old duplicates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexTrust {
    /// Believe every index (the reference's behaviour; for simulators and unit tests without a
    /// sender).
    All,
    /// Ask the sender (BOP_REQ; RETX_BOP confirms, RETX_REJ refutes) about the first index
    /// seen, and about any index more than `window` products ahead of the newest one. Until
    /// the first index is confirmed, events are held ([`Receiver::poll_event`] returns none)
    /// and messages more than `window` away from it are dropped; while a jump is being
    /// confirmed, other messages beyond the window are dropped. Dropped messages are counted
    /// ([`ReceiverCounters::index_unbelieved`]), refuted indexes too
    /// ([`ReceiverCounters::index_forged`]).
    Confirmed {
        /// Products the index may advance by at once without confirmation (≥ 1).
        window: u32,
    },
}

impl Default for IndexTrust {
    fn default() -> Self {
        Self::Confirmed { window: 1024 }
    }
}

/// What the receiver does with the bytes of data blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Assembly {
    /// Assemble each product in memory: [`Delivery::data`] holds its bytes.
    #[default]
    Memory,
    /// Keep no product bytes, only which ranges arrived: [`Delivery::data`] is empty and
    /// [`Delivery::fingerprint`] is the only witness of the content. Memory bounds are
    /// accounted as if the bytes were held, so bounds behave as with [`Assembly::Memory`]. For
    /// the simulator at scale (hundreds of receivers of gigabytes each).
    Discard,
    /// Write each product through the [`ProductSink`] given to [`Receiver::with_sink`]:
    /// [`Delivery::data`] is empty and the bytes are in the sink (opened at the BOP, closed
    /// before the product's event). Blocks that arrive before the BOP are held in memory.
    Sink,
}

impl Default for ReceiverConfig {
    fn default() -> Self {
        Self {
            receive_timer: ReceiveTimer::default(),
            request_len_max: REQUEST_LEN_MAX,
            in_flight_products_max: 1024,
            in_flight_bytes_max: 512 << 20,
            product_size_max: 256 << 20,
            early_bytes_max: 16 << 20,
            index_gap_max: 256,
            incomplete_timeout: Duration::from_secs(600),
            assembly: Assembly::Memory,
            index_trust: IndexTrust::default(),
            parity: None,
        }
    }
}

/// Something the application should know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReceiverEvent {
    /// The first multicast message arrived, for product `index`: every product from `index` on
    /// will be [`ReceiverEvent::Delivered`] or [`ReceiverEvent::Missed`] (or part of an
    /// [`ReceiverEvent::IndexGap`]); older ones are ignored (LDM-7 fetches them through the
    /// backlog, which ends before this product).
    Started {
        /// The first product.
        index: ProductIndex,
    },
    /// A product arrived whole.
    Delivered(Delivery),
    /// A product will not arrive over FMTP: fetch it another way (LDM: REQUEST_PRODUCT).
    Missed {
        /// The product.
        index: ProductIndex,
        /// Why.
        reason: MissReason,
    },
    /// Products `first..=last` were skipped by a jump of the product index too large to
    /// request one by one ([`ReceiverConfig::index_gap_max`]); none of them was requested.
    IndexGap {
        /// The oldest skipped index.
        first: ProductIndex,
        /// The newest skipped index not requested.
        last: ProductIndex,
    },
    /// A bound was hit (also counted in [`ReceiverCounters::bound_hits`]).
    BoundHit {
        /// Which bound.
        bound: ReceiverBound,
        /// The product concerned, if one.
        index: Option<ProductIndex>,
    },
}

/// A delivered product.
#[derive(Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The product index.
    pub index: ProductIndex,
    /// The BOP metadata (LDM: the MD5 signature).
    pub metadata: Vec<u8>,
    /// The product bytes (empty with [`Assembly::Discard`] and [`Assembly::Sink`]).
    pub data: Vec<u8>,
    /// Wrapping sum of [`block_fingerprint`] over the data blocks taken (each byte once). A
    /// party that knows the product can recompute it from the §3 tiling (block `k` at
    /// `k × 1448`) and check coverage and sampled content without the bytes.
    pub fingerprint: u64,
    /// The BOP start time (sender's wall clock).
    pub start_time: WallTime,
    /// When the product completed.
    pub completed_at: Instant,
    /// Data blocks that came by repair: retransmitted (RETX_DATA adding new bytes) or recovered
    /// from parity shards ([`ReceiverConfig::parity`]); 0 means "multicast-itself-sufficient"
    /// (RESEARCH.md §5).
    pub retransmitted_blocks: u32,
    /// Completion wall time − start time, in nanoseconds; may be slightly negative when the
    /// two hosts' clocks disagree.
    pub latency_ns: i64,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("index", &self.index)
            .field("size", &self.data.len())
            .field("metadata_len", &self.metadata.len())
            .field("start_time", &self.start_time)
            .field("completed_at", &self.completed_at)
            .field("retransmitted_blocks", &self.retransmitted_blocks)
            .field("latency_ns", &self.latency_ns)
            .field("fingerprint", &format_args!("{:#018x}", self.fingerprint))
            .finish()
    }
}

/// Why a product was missed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MissReason {
    /// The sender answered RETX_REJ (its deadline passed).
    Rejected,
    /// Not complete within [`ReceiverConfig::incomplete_timeout`].
    TimedOut,
    /// Abandoned to respect the in-flight bounds (the oldest incomplete product goes first).
    Evicted,
    /// Larger than [`ReceiverConfig::product_size_max`].
    TooLarge,
    /// The sender closed the connection (or the receiver stopped) while it was in flight
    /// ([`Receiver::disconnected`]).
    Disconnected,
    /// The [`ProductSink`] refused to open or write it (for example, a full disk).
    SinkFailed,
}

/// The receiver's named bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReceiverBound {
    /// [`ReceiverConfig::in_flight_products_max`].
    InFlightProducts,
    /// [`ReceiverConfig::in_flight_bytes_max`].
    InFlightBytes,
    /// [`ReceiverConfig::product_size_max`].
    ProductSize,
    /// [`ReceiverConfig::early_bytes_max`] (blocks dropped, requested later).
    EarlyBytes,
    /// [`ReceiverConfig::index_gap_max`].
    IndexGap,
}

/// Monotonic counters: read them any time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReceiverCounters {
    /// Datagrams handled.
    pub datagrams: u64,
    /// Datagram bytes handled.
    pub datagram_bytes: u64,
    /// Stream messages handled.
    pub stream_messages: u64,
    /// Stream bytes handled (whole frames).
    pub stream_bytes: u64,
    /// Datagrams or frames that did not parse (or carried an invalid index jump); of them,
    /// the next three by reason.
    pub malformed: u64,
    /// Shorter than their header or their announced payload.
    pub truncated: u64,
    /// Longer than their header announces, or a payload over the maximum.
    pub oversized: u64,
    /// Of no known message type.
    pub unknown_type: u64,
    /// Multicast messages dropped because their index was not believed ([`IndexTrust`]).
    pub index_unbelieved: u64,
    /// Indexes the sender was asked to confirm ([`IndexTrust::Confirmed`]).
    pub index_confirmations: u64,
    /// Products learnt of from the sender's RETX_EOP, newer than any the multicast showed (lost
    /// whole at the tail of a burst).
    pub announced: u64,
    /// Indexes the sender refuted (RETX_REJ to a confirmation): forged, or a first product
    /// the sender no longer had.
    pub index_forged: u64,
    /// Messages of a type the sender must not send on that channel.
    pub unexpected: u64,
    /// Messages that brought nothing new (duplicate blocks, BOPs, messages of finished
    /// products).
    pub duplicates: u64,
    /// Multicast messages of products already finished here, or older than the first one: late
    /// copies, or replays of captured datagrams (dropped).
    pub stale: u64,
    /// Data blocks that did not fit the product (past its size).
    pub out_of_range: u64,
    /// A repeated BOP that disagreed with the first (§3.4: an error).
    pub bop_mismatches: u64,
    /// RETX_REQ sent.
    pub retx_requests: u64,
    /// Bytes asked for by RETX_REQ.
    pub retx_request_bytes: u64,
    /// BOP_REQ sent.
    pub bop_requests: u64,
    /// EOP_REQ sent.
    pub eop_requests: u64,
    /// RETX_END sent.
    pub retx_ends: u64,
    /// RETX_DATA blocks that brought new bytes.
    pub retx_blocks: u64,
    /// RETX_REJ received for a product being received.
    pub rejects: u64,
    /// Products started on (each ends as one `delivered` or one `missed`: the difference is
    /// the products in flight).
    pub started: u64,
    /// Products delivered.
    pub delivered: u64,
    /// Products missed (all reasons).
    pub missed: u64,
    /// Products skipped by an index jump and not requested.
    pub index_gap_products: u64,
    /// Times a bound was hit.
    pub bound_hits: u64,
    /// Products missed because the [`ProductSink`] failed.
    pub sink_failures: u64,
    /// PARITY_REQ sent.
    pub parity_requests: u64,
    /// Parity shards taken (held for a decode).
    pub parity_shards: u64,
    /// Parity shards not needed here (their group complete, or the product finished).
    pub parity_unused: u64,
    /// Parity shards coded otherwise than this receiver's settings say (ignored).
    pub parity_mismatched: u64,
    /// Blocks recovered from parity.
    pub parity_blocks: u64,
    /// Groups whose lost blocks were asked for with RETX_REQ after all (too many lost, or
    /// the parity did not come after [`ParityConfig::rounds_max`] requests, or a decode failed).
    pub parity_fallbacks: u64,
    /// Decodes that failed (shards that lie about their coding).
    pub parity_decode_failures: u64,
}

/// The FMTP receiver. See the crate documentation for the polling order.
#[derive(Debug)]
pub struct Receiver {
    config: ReceiverConfig,
    wall_clock: WallClock,
    now: Instant,
    /// The newest index seen on multicast and its key. Keys unwrap indexes: key(i) = key of
    /// the newest + serial difference.
    newest: Option<(ProductIndex, i64)>,
    products: BTreeMap<i64, Incoming>,
    /// The keys of the products whose multicast has not ended (a newer index ends them).
    multicasting: BTreeSet<i64>,
    timers: BTreeSet<(Instant, i64, TimerKind)>,
    /// When the first of `timers` is due (kept with them: looking it up in the set on every
    /// datagram was a tenth of a large simulation's time).
    timers_first: Option<Instant>,
    in_flight_bytes: u64,
    early_bytes: u64,
    transmits: VecDeque<Message<'static>>,
    events: VecDeque<ReceiverEvent>,
    counters: ReceiverCounters,
    /// Where the bytes go with [`Assembly::Sink`].
    sink: Option<SinkSlot>,
    /// The first index seen and whether the sender confirmed it ([`IndexTrust`]).
    anchor: Anchor,
    /// An index beyond the window that the sender was asked about.
    confirming: Option<ProductIndex>,
    /// While one is asked about: the newest index seen beyond it, within the window of it
    /// (the stream went on; believed with it).
    frontier: Option<ProductIndex>,
    /// Indexes beyond the window seen once: one seen twice is asked about (a real product
    /// comes as several messages, a forged flood as one each). Cleared when full.
    candidates: HashMap<ProductIndex, u32>,
    /// Indexes the sender refuted lately (not asked about again).
    refuted: VecDeque<ProductIndex>,
    /// The multicast message being handled is an EOP (one of a product already complete is
    /// usual, not stale).
    eop_seen_last: bool,
    /// Indexes beyond the window seen twice lately (the last 64): when the sender confirms one,
    /// those shortly before it were its stream's too.
    repeated: VecDeque<ProductIndex>,
    /// With [`Assembly::Discard`]: the fingerprint of product bytes `[start, end)`, for blocks
    /// recovered from parity ([`Receiver::set_fingerprint_source`]).
    fingerprint_source: Option<FingerprintSource>,
    /// Products whose `parity_waiting` is set (a simulator asks after every visit).
    parity_waiting_products: u32,
    /// How long parity shards take to come after a PARITY_REQ here ([`ParityRtt`]).
    parity_rtt: ParityRtt,
    /// The driver holds datagrams read and not yet handed over ([`Receiver::set_backlog`]).
    backlog: bool,
    /// Parity requests held while [`Receiver::backlog`]: product key, group, whether a retry,
    /// and since when.
    deferred_parity: Vec<(i64, u16, bool, Instant)>,
}

/// [`Receiver::set_fingerprint_source`]'s function.
struct FingerprintSource(Box<dyn FnMut(ProductIndex, u32, u32) -> u64 + Send>);

impl std::fmt::Debug for FingerprintSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FingerprintSource")
    }
}

/// Bound of [`Receiver::candidates`].
const CANDIDATES_MAX: usize = 256;
/// Bound of [`Receiver::refuted`].
const REFUTED_MAX: usize = 64;

/// The first product index a receiver saw ([`IndexTrust::Confirmed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Anchor {
    /// Believed (or nothing seen yet).
    Confirmed,
    /// Asked about; events are held. `end_held`: the product finished and its RETX_END waits
    /// for the answer (sent before it, the sender might release the product and drop the
    /// answer).
    Tentative { index: ProductIndex, key: i64, end_held: bool },
}

impl Receiver {
    /// A receiver that has seen nothing. [`Assembly::Sink`] needs [`Receiver::with_sink`].
    pub fn new(config: ReceiverConfig) -> Result<Self, ConfigError> {
        if config.assembly == Assembly::Sink {
            return Err(ConfigError("Assembly::Sink needs a sink: construct with Receiver::with_sink".into()));
        }
        Self::checked(config, None)
    }

    /// A receiver that writes product bytes through `sink` ([`Assembly::Sink`]; the
    /// configuration's `assembly` is set to it).
    pub fn with_sink(mut config: ReceiverConfig, sink: impl ProductSink + 'static) -> Result<Self, ConfigError> {
        config.assembly = Assembly::Sink;
        Self::checked(config, Some(SinkSlot(Box::new(sink))))
    }

    fn checked(config: ReceiverConfig, sink: Option<SinkSlot>) -> Result<Self, ConfigError> {
        let timer = &config.receive_timer;
        if timer.rate_bits_per_s == 0 || !(timer.factor.is_finite() && timer.factor >= 0.0) {
            return Err(ConfigError("receive timer needs a positive rate and a finite factor ≥ 0".into()));
        }
        if config.index_trust == (IndexTrust::Confirmed { window: 0 }) {
            return Err(ConfigError("the index trust window must be at least 1".into()));
        }
        if config.request_len_max == 0 || config.in_flight_products_max == 0 || config.index_gap_max == 0 {
            return Err(ConfigError(
                "request_len_max, in_flight_products_max and index_gap_max must be at least 1".into(),
            ));
        }
        if let Some(parity) = &config.parity {
            parity.validate()?;
        }
        if u64::from(config.product_size_max) > config.in_flight_bytes_max {
            return Err(ConfigError(format!(
                "product_size_max ({}) exceeds in_flight_bytes_max ({}): raise in_flight_bytes_max",
                config.product_size_max, config.in_flight_bytes_max
            )));
        }
        Ok(Self {
            config,
            wall_clock: WallClock::default(),
            now: Instant::ZERO,
            newest: None,
            products: BTreeMap::new(),
            multicasting: BTreeSet::new(),
            timers: BTreeSet::new(),
            timers_first: None,
            in_flight_bytes: 0,
            early_bytes: 0,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            counters: ReceiverCounters::default(),
            sink,
            anchor: Anchor::Confirmed,
            confirming: None,
            frontier: None,
            candidates: HashMap::new(),
            refuted: VecDeque::new(),
            repeated: VecDeque::new(),
            eop_seen_last: false,
            fingerprint_source: None,
            parity_waiting_products: 0,
            parity_rtt: ParityRtt::default(),
            backlog: false,
            deferred_parity: Vec::new(),
        })
    }

    /// With [`Assembly::Discard`] and [`ReceiverConfig::parity`]: where the fingerprints of
    /// blocks recovered from parity come from (`source(index, start, end)` is the sum of the
    /// [`block_fingerprint`]s of the product's blocks in `[start, end)`), as a simulator that
    /// checked the parity it multicast gives them. Without it a discarding receiver asks with
    /// RETX_REQ.
    pub fn set_fingerprint_source(&mut self, source: impl FnMut(ProductIndex, u32, u32) -> u64 + Send + 'static) {
        self.fingerprint_source = Some(FingerprintSource(Box::new(source)));
    }

    /// Whether a parity shard of group `group` of product `index` would be of use here now
    /// (the product is being received, its size is known and the group is incomplete): a
    /// simulator hands parity datagrams only to the receivers that want them.
    pub fn wants_parity(&self, index: ProductIndex, group: u16) -> bool {
        let (Some(parity), Some((_, product))) = (self.parity_in_use(), self.known(index)) else { return false };
        product.group_incomplete(&parity, group)
    }

    /// Anchors wall-clock time (for latencies) to the monotonic clock: `wall` was read at
    /// `now`. The default maps `Instant::ZERO` to the Unix epoch.
    pub fn set_wall_clock(&mut self, now: Instant, wall: WallTime) {
        self.wall_clock = WallClock { instant: now, wall };
    }

    /// Handles one multicast datagram (BOP, MEM_DATA or EOP; anything else is counted and
    /// ignored, §3.3).
    pub fn handle_datagram(&mut self, now: Instant, datagram: &[u8]) {
        self.advance(now);
        self.counters.datagrams += 1;
        self.counters.datagram_bytes += datagram.len() as u64;
        let message = match Message::parse(datagram) {
            Ok(message) => message,
            Err(error) => {
                self.count_malformed(&error);
                return;
            }
        };
        if !message.message_type().is_multicast() {
            self.counters.unexpected += 1;
            return;
        }
        if let Body::Parity { group, group_blocks_log2, shards_log2, shard, data } = message.body {
            self.on_parity(message.index, group, (group_blocks_log2, shards_log2), shard, data);
            return;
        }
        self.eop_seen_last = matches!(message.body, Body::Eop);
        let Some(key) = self.observe_multicast(message.index, matches!(message.body, Body::Bop(_))) else {
            return;
        };
        match message.body {
            Body::Bop(bop) => self.on_bop(key, &bop, false),
            Body::MemData { offset, data } => self.on_data(key, offset, data, false),
            Body::Eop => self.on_eop(key),
            _ => unreachable!("is_multicast checked above"),
        }
    }

    /// Handles MEM_DATA datagrams of one product that arrived back to back and in order, without
    /// their bytes: as [`Receiver::handle_datagram`] would each of them at `now` (the last one's
    /// arrival), for a caller that has checked their content and gives their fingerprints —
    /// [`BlockRun::fingerprint`] for the whole run, and `range_fingerprint(start, end)` for a
    /// block-aligned part of it, needed only when part of the run is already here or its
    /// product's BOP is not. Only with [`Assembly::Discard`] (there are no bytes to keep);
    /// otherwise the run is counted as unexpected and dropped.
    ///
    /// For simulators: a receiver's cost then grows with what changes its state (a gap, a new
    /// product, a timer), not with every datagram.
    pub fn handle_block_run(
        &mut self,
        now: Instant,
        run: &BlockRun,
        range_fingerprint: &mut dyn FnMut(u32, u32) -> u64,
    ) {
        self.advance(now);
        self.counters.datagrams += u64::from(run.datagrams);
        self.counters.datagram_bytes += run.wire_bytes;
        if self.config.assembly != Assembly::Discard || run.end <= run.start {
            self.counters.unexpected += u64::from(run.datagrams);
            return;
        }
        self.eop_seen_last = false;
        let Some(key) = self.observe_multicast(run.index, false) else { return };
        let Some(product) = self.products.get_mut(&key) else { return };
        let (start, end) = (u64::from(run.start), u64::from(run.end));
        if product.bop.is_none() {
            // The BOP was lost. When all of the run is new and fits the bounds, it is kept as one
            // early block (as its blocks would be one by one, the fingerprint theirs summed);
            // otherwise block by block, as they would have come.
            let len = u64::from(run.end - run.start);
            if product.received.within(u64::from(run.start), u64::from(run.end)).next().is_none()
                && self.early_bytes + len <= self.config.early_bytes_max
                && self.in_flight_bytes + len <= self.config.in_flight_bytes_max
            {
                product.last_multicast = self.now;
                product.multicast_end = product.multicast_end.max(u64::from(run.end));
                product.received.insert(u64::from(run.start), u64::from(run.end));
                product.early.push(EarlyBlock {
                    offset: run.start,
                    len: run.end - run.start,
                    fingerprint: run.fingerprint,
                    data: Vec::new(),
                });
                product.early_bytes += len;
                self.early_bytes += len;
                self.in_flight_bytes += len;
                return;
            }
            let mut offset = run.start;
            while offset < run.end {
                let block_end = (offset + BLOCK_LEN as u32).min(run.end);
                let fingerprint = range_fingerprint(offset, block_end);
                self.on_block(key, offset, block_end - offset, fingerprint, Vec::new(), false);
                offset = block_end;
            }
            return;
        }
        let previous_end = product.multicast_end;
        product.last_multicast = self.now;
        product.multicast_end = product.multicast_end.max(end);
        let size = product.bop.as_ref().map_or(0, |bop| u64::from(bop.size));
        if end > size {
            self.counters.out_of_range += u64::from(run.datagrams);
            return;
        }
        let new_bytes: u64 = product.received.gaps_iter(start, end).map(|(from, to)| to - from).sum();
        let fingerprint = if new_bytes == end - start {
            product.received.insert(start, end);
            run.fingerprint
        } else {
            // Part is here already (a repair overtook the multicast): only the rest counts.
            let missing = product.received.gaps(start, end);
            let blocks_new: u64 = missing.iter().map(|(from, to)| (to - from).div_ceil(BLOCK_LEN as u64)).sum();
            self.counters.duplicates += u64::from(run.datagrams).saturating_sub(blocks_new);
            for &(from, to) in &missing {
                product.received.insert(from, to);
            }
            // Block-aligned, within [start, end) ⊂ u32.
            missing.iter().fold(0u64, |sum, &(from, to)| sum.wrapping_add(range_fingerprint(from as u32, to as u32)))
        };
        if new_bytes == 0 {
            return;
        }
        product.fingerprint = product.fingerprint.wrapping_add(fingerprint);
        if self.complete_if_done(key) {
            return;
        }
        if start > previous_end {
            self.request_missing(key, previous_end, start);
        }
        self.ask_waiting_parity(key);
        self.decode_passed_groups(key, start, end);
    }

    /// For simulators: whether this receiver could take the next product whole from the
    /// multicast (its BOP, every block in order, its EOP) without being handed it, and if so
    /// the newest index it has seen and the largest product that would fit. That holds when
    /// bytes are discarded ([`Assembly::Discard`]), the newest index is believed and nothing
    /// is still multicasting here (a new BOP would then change nothing but the newest index),
    /// and one more product fits the bounds: handing it the product would only move the
    /// newest index, count, deliver and send RETX_END — what [`Receiver::took_whole_products`]
    /// does at once for a run of such products.
    pub fn whole_product_room(&self) -> Option<(ProductIndex, u32)> {
        let (newest, _) = self.newest?;
        let quiet = self.config.assembly == Assembly::Discard
            && self.multicasting.is_empty()
            && self.anchor == Anchor::Confirmed
            && self.confirming.is_none()
            && self.products.len() < self.config.in_flight_products_max;
        if !quiet {
            return None;
        }
        let room = self.config.in_flight_bytes_max.saturating_sub(self.in_flight_bytes);
        // ≤ product_size_max ≤ u32::MAX.
        Some((newest, room.min(u64::from(self.config.product_size_max)) as u32))
    }

    /// For simulators: the receiver took `count` products whole from the multicast, the
    /// newest `newest` and the others the ones just before it, in `datagrams` datagrams of
    /// `datagram_bytes` bytes — each of them, when it began, a product that
    /// [`Receiver::whole_product_room`] allowed. Equivalent to handing it each product's BOP,
    /// blocks and EOP (the deliveries, which carry nothing the caller does not know, are not
    /// reported again; the RETX_ENDs are the caller's to send). Refused, changing nothing, when
    /// the receiver is not in such a state or `newest` is not `count` products ahead.
    pub fn took_whole_products(
        &mut self,
        newest: ProductIndex,
        count: u32,
        datagrams: u64,
        datagram_bytes: u64,
    ) -> Result<(), ConfigError> {
        let (Some((seen, _)), Some((_, key))) = (self.whole_product_room(), self.newest) else {
            return Err(ConfigError("the receiver cannot take whole products now".into()));
        };
        if count == 0 || newest.serial_difference(seen) != i32::try_from(count).ok() {
            return Err(ConfigError(format!("{count} whole products up to {newest} do not follow {seen}")));
        }
        self.newest = Some((newest, key + i64::from(count)));
        self.eop_seen_last = true;
        let counters = &mut self.counters;
        counters.datagrams += datagrams;
        counters.datagram_bytes += datagram_bytes;
        counters.started += u64::from(count);
        counters.delivered += u64::from(count);
        counters.retx_ends += u64::from(count);
        // Each EOP came after its product was complete.
        counters.duplicates += u64::from(count);
        Ok(())
    }

    /// Handles one message from the sender's TCP connection (RETX_DATA, RETX_BOP, RETX_EOP,
    /// RETX_REJ; anything else is counted as unexpected).
    pub fn handle_stream(&mut self, now: Instant, message: &Message<'_>) {
        self.advance(now);
        self.counters.stream_messages += 1;
        self.counters.stream_bytes += message.buffer_len() as u64;
        if !matches!(message.body, Body::RetxData { .. } | Body::RetxBop(_) | Body::RetxEop | Body::RetxRej) {
            self.counters.unexpected += 1;
            return;
        }
        if self.answers_confirmation(message) {
            return;
        }
        if matches!(message.body, Body::RetxEop) {
            // The sender's word (its repair connection, not the multicast): a product newer than
            // any seen here was multicast and is over — lost whole, with no later product to
            // reveal the gap (the sender's tail probe, or its release).
            self.announced(message.index);
        }
        let Some(key) = self.known_key(message.index) else {
            // Finished, abandoned or never requested: nothing to do (e.g. the EOP_REQ the
            // reference sends after RETX_END is answered RETX_REJ, capture fmtp-ldm7).
            self.counters.duplicates += 1;
            return;
        };
        match message.body {
            Body::RetxData { offset, data } => self.on_data(key, offset, data, true),
            Body::RetxBop(bop) => self.on_bop(key, &bop, true),
            Body::RetxEop => self.on_eop(key),
            Body::RetxRej => {
                self.counters.rejects += 1;
                self.abandon(key, MissReason::Rejected);
            }
            _ => unreachable!("checked above"),
        }
    }

    /// Parses one stream frame (from [`wire::split_frame`]) and handles it; a frame that does
    /// not parse is counted and returned as an error.
    pub fn handle_stream_frame(&mut self, now: Instant, frame: &[u8]) -> Result<(), wire::Error> {
        match Message::parse(frame) {
            Ok(message) => {
                self.handle_stream(now, &message);
                Ok(())
            }
            Err(error) => {
                self.advance(now);
                self.count_malformed(&error);
                Err(error)
            }
        }
    }

    /// Processes timers due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.advance(now);
    }

    /// The driver says whether datagrams it read wait to be handed over (`true`: this receiver
    /// is behind the multicast). Parity requests wait meanwhile, at most
    /// [`PARITY_DEFER_MAX`]: the shards the sender multicast for other receivers' requests
    /// are likely among the waiting datagrams, and a request made before they are handled
    /// asks for them again. On a host whose receivers lag by tens of milliseconds (four on two
    /// vCPUs at 500 Mbit/s), such requests made the sender multicast half as many shards
    /// again as any receiver needed (issue #37). A driver that never calls this (the
    /// simulator) asks at once.
    pub fn set_backlog(&mut self, now: Instant, backlog: bool) {
        self.advance(now);
        self.backlog = backlog;
        if self.deferred_parity.is_empty() {
            return;
        }
        let now = self.now;
        let deferred = std::mem::take(&mut self.deferred_parity);
        for (key, group, retry, since) in deferred {
            if backlog && now.saturating_duration_since(since) < PARITY_DEFER_MAX {
                self.deferred_parity.push((key, group, retry, since));
            } else {
                self.send_parity_request(key, group, retry);
            }
        }
    }

    /// Whether the driver said it holds datagrams not yet handed over ([`Receiver::set_backlog`]).
    pub fn backlog(&self) -> bool {
        self.backlog
    }

    /// The TCP connection to the sender was re-established (after the driver's handshake):
    /// requests in flight on the old connection and their answers are lost, so every
    /// outstanding BOP_REQ and RETX_REQ is issued again. Messages still queued in
    /// [`Receiver::poll_transmit`] stay queued for the new connection.
    pub fn stream_reset(&mut self, now: Instant) {
        self.advance(now);
        let asked = [self.confirming, self.tentative_anchor().map(|(index, _)| index)];
        for index in asked.into_iter().flatten() {
            self.ask_to_confirm(index);
        }
        let keys: Vec<i64> = self.products.keys().copied().collect();
        for key in keys {
            let Some(product) = self.products.get_mut(&key) else { continue };
            product.requested = RangeSet::default();
            product.eop_requested = false;
            for repair in product.parity.values_mut() {
                repair.asked_for = 0;
                repair.fallback = false;
            }
            let index = product.index;
            match product.bop.as_ref().map(|b| u64::from(b.size)) {
                Some(size) => {
                    let end = if product.ended { size } else { product.multicast_end.min(size) };
                    self.request_missing(key, 0, end);
                }
                None => {
                    self.request(Message { index, body: Body::BopReq });
                    self.counters.bop_requests += 1;
                }
            }
        }
    }

    /// The session is over (the sender closed the connection, or the application stops the
    /// receiver with no new connection to come): every product in flight is reported missed
    /// ([`MissReason::Disconnected`]), and events held for the first index's confirmation are
    /// released (nothing can confirm it any more; what arrived is reported as it stands).
    pub fn disconnected(&mut self, now: Instant) {
        self.advance(now);
        self.anchor = Anchor::Confirmed;
        self.confirming = None;
        let keys: Vec<i64> = self.products.keys().copied().collect();
        for key in keys {
            let Some(product) = self.remove(key) else { continue };
            if product.sink_open {
                if let Some(sink) = &mut self.sink {
                    sink.0.close(product.index, false);
                }
            }
            self.counters.missed += 1;
            self.events.push_back(ReceiverEvent::Missed { index: product.index, reason: MissReason::Disconnected });
        }
        self.transmits.clear();
    }

    /// The next message to send on the TCP connection (BOP_REQ, RETX_REQ, EOP_REQ,
    /// RETX_END), in the order decided. Emit it with [`Message::emit_to_vec`].
    pub fn poll_transmit(&mut self) -> Option<Message<'static>> {
        self.transmits.pop_front()
    }

    /// The next event, if any. None while the first product index awaits the sender's
    /// confirmation ([`IndexTrust::Confirmed`]): the events are held until then.
    pub fn poll_event(&mut self) -> Option<ReceiverEvent> {
        if matches!(self.anchor, Anchor::Tentative { .. }) {
            return None;
        }
        self.events.pop_front()
    }

    /// When to call [`Receiver::handle_timeout`] next (`None`: no timer). The instant may be
    /// early (timers are re-evaluated lazily); calling then is harmless.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers_first
    }

    /// The counters.
    pub fn counters(&self) -> &ReceiverCounters {
        &self.counters
    }

    /// Products being received.
    pub fn in_flight_products(&self) -> usize {
        self.products.len()
    }

    /// The oldest product being received, if any (every other one is newer).
    pub fn oldest_in_flight(&self) -> Option<ProductIndex> {
        self.products.values().next().map(|product| product.index)
    }

    /// For simulators: a product being multicast with a block group that lost blocks and waits
    /// for the multicast to pass it before its PARITY_REQ goes out
    /// ([`ReceiverConfig::parity`]), and the offset the multicast must reach for that: a
    /// receiver handed blocks in runs must be handed the block that reaches it when it comes.
    pub fn parity_waiting(&self) -> Option<(ProductIndex, u32)> {
        if self.parity_waiting_products == 0 {
            return None;
        }
        let parity = self.config.parity?;
        self.multicasting.iter().find_map(|key| {
            let product = self.products.get(key)?;
            // Within the product (< 4 GiB).
            Some((product.index, product.group_end(&parity, product.parity_waiting?) as u32))
        })
    }

    /// For simulators: whether a gap at `offset` of `index` (a lost block) would only be noted
    /// when the block after it comes — the product being multicast here has a known size, its
    /// lost blocks are asked for as parity ([`ReceiverConfig::parity`]) and that block group
    /// has not fallen back to RETX_REQ — and if so the end of the block group: its PARITY_REQ
    /// goes out when a block reaching that offset comes (or the EOP, a newer product, the
    /// receive timer). The blocks after the gap can then be handed over later, in a run.
    pub fn notes_gap(&self, index: ProductIndex, offset: u32) -> Option<u32> {
        if self.anchor != Anchor::Confirmed {
            return None;
        }
        let product = self.products.get(&self.known_key(index)?)?;
        let size = u64::from(product.bop.as_ref()?.size);
        let parity = self.parity_for(size)?;
        if product.ended || u64::from(offset) >= size {
            return None;
        }
        // ≤ 2¹⁶ groups ([`codes_product`]).
        let group = parity.group_of(u64::from(offset)) as u16;
        if product.parity.get(&group).is_some_and(|repair| repair.fallback) {
            return None;
        }
        // Within the product (< 4 GiB).
        Some(product.group_end(&parity, group) as u32)
    }

    /// Bytes held for products being received.
    pub fn in_flight_bytes(&self) -> u64 {
        self.in_flight_bytes
    }

    /// Where each product being received stands, oldest first (for an operator: what a stop
    /// leaves unfinished, and why).
    pub fn in_flight(&self) -> Vec<InFlight> {
        self.products
            .values()
            .map(|product| InFlight {
                index: product.index,
                size: product.bop.as_ref().map(|bop| bop.size),
                received_bytes: product.received.len(),
                requested_bytes: product.requested.len(),
                ended: product.ended,
                eop_seen: product.eop_seen,
                tentative: self.tentative_anchor().is_some_and(|(index, _)| index == product.index),
            })
            .collect()
    }

    // ---------------------------------------------------------------------------------------
    // Helpers.

    fn add_timer(&mut self, timer: (Instant, i64, TimerKind)) {
        self.timers.insert(timer);
        self.timers_first = Some(self.timers_first.map_or(timer.0, |first| first.min(timer.0)));
    }

    fn remove_timer(&mut self, timer: (Instant, i64, TimerKind)) {
        if self.timers.remove(&timer) && self.timers_first == Some(timer.0) {
            self.timers_first = self.timers.first().map(|(at, _, _)| *at);
        }
    }

    fn advance(&mut self, now: Instant) {
        self.now = self.now.max(now);
        if self.timers_first.is_none_or(|first| first > self.now) {
            return;
        }
        while let Some(&(at, key, kind)) = self.timers.first() {
            if at > self.now {
                break;
            }
            self.timers.pop_first();
            self.timers_first = self.timers.first().map(|(at, _, _)| *at);
            match kind {
                TimerKind::Abandon => self.abandon(key, MissReason::TimedOut),
                TimerKind::Receive => self.receive_timer_fired(key),
                TimerKind::Parity => self.parity_timer_fired(key),
            }
        }
    }

    /// The key of a product being received, if the index is one.
    fn known_key(&self, index: ProductIndex) -> Option<i64> {
        self.known(index).map(|(key, _)| key)
    }

    /// The key and state of product `index` if it is being received (one lookup).
    fn known(&self, index: ProductIndex) -> Option<(i64, &Incoming)> {
        let (newest, newest_key) = self.newest?;
        let key = newest_key + i64::from(index.serial_difference(newest)?);
        self.products.get(&key).map(|product| (key, product))
    }

    /// Index bookkeeping for a multicast message (§3.9): a newer index ends older products'
    /// multicast and requests skipped indexes; returns the product's key, creating its entry,
    /// or `None` when the message concerns a finished product or is invalid.
    fn observe_multicast(&mut self, index: ProductIndex, is_bop: bool) -> Option<i64> {
        let Some((newest, newest_key)) = self.newest else {
            if self.refuted.contains(&index) {
                // The sender said it has no such product: not a first index either.
                self.counters.index_unbelieved += 1;
                return None;
            }
            self.newest = Some((index, 0));
            self.events.push_back(ReceiverEvent::Started { index });
            self.create(0, index, false, !is_bop);
            if let IndexTrust::Confirmed { .. } = self.config.index_trust {
                // Believed once the sender says it has the product (a BOP_REQ went out with the
                // product unless this is its BOP).
                self.anchor = Anchor::Tentative { index, key: 0, end_held: false };
                if is_bop {
                    self.request(Message { index, body: Body::BopReq });
                    self.counters.bop_requests += 1;
                }
                self.counters.index_confirmations += 1;
            }
            return Some(0);
        };
        let Some(difference) = index.serial_difference(newest) else {
            self.counters.malformed += 1;
            return None;
        };
        let key = newest_key + i64::from(difference);
        if let IndexTrust::Confirmed { window } = self.config.index_trust {
            let tentative = self.tentative_anchor().is_some();
            let far = i64::from(difference).unsigned_abs() > u64::from(window);
            if far && !self.products.contains_key(&key) {
                if difference > 0 || tentative {
                    self.unbelieved(index, window);
                } else {
                    // Older than any product this receiver could still be taking.
                    self.counters.index_unbelieved += 1;
                }
                return None;
            }
        }
        self.advance_newest(index, key, difference, is_bop)
    }

    /// A product the sender says it multicast (RETX_EOP): when it is newer than any seen, the
    /// receiver moves there as a multicast message would move it, requesting the skipped
    /// products and this one's BOP (within the trust window; nothing when no product was seen
    /// yet: a session's first product is the first one the multicast shows).
    fn announced(&mut self, index: ProductIndex) {
        let Some((newest, newest_key)) = self.newest else { return };
        let Some(difference) = index.serial_difference(newest).filter(|difference| *difference > 0) else { return };
        if let IndexTrust::Confirmed { window } = self.config.index_trust {
            if u64::from(difference.unsigned_abs()) > u64::from(window) {
                self.counters.index_unbelieved += 1;
                return;
            }
        }
        let key = newest_key + i64::from(difference);
        self.counters.announced += 1;
        self.advance_newest(index, key, difference, false);
    }

    /// Takes a newer index: older products' multicast is over, skipped indexes are requested.
    fn advance_newest(&mut self, index: ProductIndex, key: i64, difference: i32, is_bop: bool) -> Option<i64> {
        let (newest, _) = self.newest?;
        if difference <= 0 {
            if self.products.contains_key(&key) {
                return Some(key);
            }
            if self.eop_seen_last {
                // The EOP of a product completed from its blocks (it need not wait for it).
                self.counters.duplicates += 1;
            } else {
                // A product finished here (or older than the first one): a late copy or a replay.
                self.counters.stale += 1;
            }
            return None;
        }
        // Everything older has finished its multicast: request what it still lacks.
        let older: Vec<i64> = self.multicasting.range(..key).copied().collect();
        for older_key in older {
            self.end_multicast(older_key);
        }
        self.newest = Some((index, key));
        let skipped = (difference - 1) as u32;
        let requested = skipped.min(self.config.index_gap_max);
        if skipped > requested {
            let first = newest.next();
            let last = newest.wrapping_add(skipped - requested);
            self.counters.index_gap_products += u64::from(skipped - requested);
            self.bound_hit(ReceiverBound::IndexGap, None);
            self.events.push_back(ReceiverEvent::IndexGap { first, last });
        }
        for back in (1..=requested).rev() {
            let gap_key = key - i64::from(back);
            self.create(gap_key, index.wrapping_add(back.wrapping_neg()), true, true);
        }
        self.create(key, index, false, !is_bop);
        self.products.contains_key(&key).then_some(key)
    }

    fn tentative_anchor(&self) -> Option<(ProductIndex, i64)> {
        match self.anchor {
            Anchor::Tentative { index, key, .. } => Some((index, key)),
            Anchor::Confirmed => None,
        }
    }

    fn ask_to_confirm(&mut self, index: ProductIndex) {
        self.request(Message { index, body: Body::BopReq });
        self.counters.bop_requests += 1;
    }

    /// A multicast message whose index is beyond the window: dropped; its index is asked
    /// about once seen twice (one question at a time), unless refuted lately.
    fn unbelieved(&mut self, index: ProductIndex, window: u32) {
        self.counters.index_unbelieved += 1;
        if self.refuted.contains(&index) {
            return;
        }
        if self.candidates.len() >= CANDIDATES_MAX && !self.candidates.contains_key(&index) {
            self.candidates.clear();
        }
        let seen = self.candidates.entry(index).or_insert(0);
        *seen += 1;
        let repeated = *seen == 2;
        if repeated {
            if self.repeated.len() >= REFUTED_MAX {
                self.repeated.pop_front();
            }
            self.repeated.push_back(index);
        }
        if let Some(asked) = self.confirming {
            // The stream goes on from the index asked about, a window at a time.
            let from = self.frontier.unwrap_or(asked);
            if index.serial_difference(from).is_some_and(|d| d > 0 && d.unsigned_abs() <= window) {
                self.frontier = Some(index);
            }
            return;
        }
        if repeated {
            self.confirming = Some(index);
            self.frontier = None;
            self.counters.index_confirmations += 1;
            self.ask_to_confirm(index);
        }
    }

    /// The oldest index seen repeatedly beyond the window that lies within the window before
    /// `index` (the sender confirmed `index`: they are its stream's, seen while the receiver did
    /// not yet know where that stream was).
    fn earliest_repeated_before(&self, index: ProductIndex, window: u32) -> Option<ProductIndex> {
        self.repeated
            .iter()
            .filter_map(|seen| seen.serial_difference(index).filter(|d| *d < 0 && d.unsigned_abs() <= window))
            .min()
            .map(|difference| index.wrapping_add(difference as u32))
    }

    fn refuted(&mut self, index: ProductIndex) {
        self.counters.index_forged += 1;
        if self.refuted.len() >= REFUTED_MAX {
            self.refuted.pop_front();
        }
        self.refuted.push_back(index);
    }

    /// Handles the sender's answer about an index it was asked to confirm; returns whether the
    /// message was one (it is then handled).
    fn answers_confirmation(&mut self, message: &Message<'_>) -> bool {
        let confirmed = match message.body {
            Body::RetxBop(_) | Body::RetxData { .. } | Body::RetxEop => true,
            Body::RetxRej => false,
            _ => return false,
        };
        if let Some((index, key)) = self.tentative_anchor().filter(|(index, _)| *index == message.index) {
            let Anchor::Tentative { end_held, .. } = self.anchor else { return false };
            self.anchor = Anchor::Confirmed;
            if confirmed {
                if end_held {
                    self.request(Message { index, body: Body::RetxEnd });
                    self.counters.retx_ends += 1;
                }
                // Handled as any answer for the product (a duplicate BOP, usually).
                return false;
            }
            self.refute_anchor(index, key);
            return true;
        }
        if self.confirming != Some(message.index) {
            return false;
        }
        self.confirming = None;
        let frontier = self.frontier.take();
        let Body::RetxBop(bop) = message.body else {
            if !confirmed {
                self.refuted(message.index);
            }
            return true;
        };
        // The sender has it: the index is real.
        let window = match self.config.index_trust {
            IndexTrust::Confirmed { window } => window,
            IndexTrust::All => u32::MAX,
        };
        let starting = self.tentative_anchor().is_some() || self.newest.is_none();
        let key = match (self.tentative_anchor(), self.newest) {
            (Some((anchor, anchor_key)), _)
                if message.index.serial_difference(anchor).is_some_and(|d| d.unsigned_abs() <= window) =>
            {
                // Near the first index seen: that one is the sender's too.
                let Anchor::Tentative { end_held, .. } = self.anchor else { return true };
                self.anchor = Anchor::Confirmed;
                if end_held {
                    self.request(Message { index: anchor, body: Body::RetxEnd });
                    self.counters.retx_ends += 1;
                }
                let Some(difference) = message.index.serial_difference(anchor) else { return true };
                if difference < 0 {
                    // Older than the first index: the session starts there instead.
                    self.start_earlier(message.index, anchor_key + i64::from(difference), anchor, true);
                    anchor_key + i64::from(difference)
                } else {
                    let Some((newest, newest_key)) = self.newest else { return true };
                    let Some(ahead) = message.index.serial_difference(newest) else { return true };
                    match self.advance_newest(message.index, newest_key + i64::from(ahead), ahead, true) {
                        Some(key) => key,
                        None => return true,
                    }
                }
            }
            (Some((anchor, _)), _) => {
                // The first index seen was not the sender's (it is far from a real one).
                self.refuted(anchor);
                self.discard_all();
                self.anchor_at(message.index)
            }
            (None, None) => self.anchor_at(message.index),
            (None, Some((newest, newest_key))) => {
                let Some(difference) = message.index.serial_difference(newest) else { return true };
                match self.advance_newest(message.index, newest_key + i64::from(difference), difference, true) {
                    Some(key) => key,
                    None => return true,
                }
            }
        };
        self.on_bop(key, &bop, true);
        // At the start, the stream's products seen before the one confirmed are taken too.
        let started = self.events.iter().find_map(|event| match event {
            ReceiverEvent::Started { index } => Some(*index),
            _ => None,
        });
        if let (true, Some(first), Some((newest, newest_key))) = (starting, started, self.newest) {
            if let Some(earliest) = self.earliest_repeated_before(first, window) {
                let first_key = newest_key + i64::from(first.serial_difference(newest).unwrap_or(0));
                let earliest_key = first_key + i64::from(earliest.serial_difference(first).unwrap_or(0));
                self.start_earlier(earliest, earliest_key, first, false);
            }
        }
        // The messages that came meanwhile went on from it: take the newest of them.
        if let (Some(frontier), Some((newest, newest_key))) = (frontier, self.newest) {
            if let Some(difference) = frontier.serial_difference(newest).filter(|d| *d > 0) {
                self.advance_newest(frontier, newest_key + i64::from(difference), difference, false);
            }
        }
        true
    }

    /// The session starts at `index` (key `key`), before the first index seen (`first`): the
    /// products between are requested, and [`ReceiverEvent::Started`] names `index`.
    fn start_earlier(&mut self, index: ProductIndex, key: i64, first: ProductIndex, bop_known: bool) {
        for event in &mut self.events {
            if let ReceiverEvent::Started { index: started } = event {
                if *started == first {
                    *started = index;
                }
            }
        }
        let skipped = first.serial_difference(index).unwrap_or(0).max(0) as u32;
        for back in 1..skipped {
            self.create(key + i64::from(back), index.wrapping_add(back), true, true);
        }
        self.create(key, index, true, !bop_known);
    }

    /// Starts over at a confirmed index (nothing held): key 0.
    fn anchor_at(&mut self, index: ProductIndex) -> i64 {
        self.newest = Some((index, 0));
        self.anchor = Anchor::Confirmed;
        self.events.push_back(ReceiverEvent::Started { index });
        self.create(0, index, false, false);
        0
    }

    /// Drops every product and held event (all were after a first index that was not the
    /// sender's).
    fn discard_all(&mut self) {
        let keys: Vec<i64> = self.products.keys().copied().collect();
        for key in keys {
            if let Some(product) = self.remove(key) {
                if product.sink_open {
                    if let Some(sink) = &mut self.sink {
                        sink.0.close(product.index, false);
                    }
                }
                self.counters.started -= 1;
            }
        }
        for event in self.events.drain(..) {
            match event {
                ReceiverEvent::Delivered(_) => {
                    self.counters.delivered -= 1;
                    self.counters.started -= 1;
                }
                ReceiverEvent::Missed { .. } => {
                    self.counters.missed -= 1;
                    self.counters.started -= 1;
                }
                _ => {}
            }
        }
        self.multicasting.clear();
        self.newest = None;
        self.anchor = Anchor::Confirmed;
    }

    /// The sender does not have the first product seen. If a product already finished here
    /// (this one or a later one), the stream is the sender's (a forged first index is far from
    /// every real one) and the product is missed as the sender says. Otherwise the product was
    /// forged, or the sender no longer had it (its deadline passed — then the backlog covers it,
    /// as it covers every product before the one [`ReceiverEvent::Started`] names): it is
    /// dropped, and the oldest product in flight after it, if any, becomes the one to confirm;
    /// else the next message does.
    fn refute_anchor(&mut self, index: ProductIndex, key: i64) {
        let finished =
            self.events.iter().any(|event| matches!(event, ReceiverEvent::Delivered(_) | ReceiverEvent::Missed { .. }));
        if finished || !self.products.contains_key(&key) {
            self.counters.rejects += 1;
            self.abandon(key, MissReason::Rejected);
            return;
        }
        self.refuted(index);
        if let Some(product) = self.remove(key) {
            if product.sink_open {
                if let Some(sink) = &mut self.sink {
                    sink.0.close(product.index, false);
                }
            }
            self.counters.started -= 1;
        }
        self.events.retain(|event| !matches!(event, ReceiverEvent::Started { .. }));
        let next = self.products.iter().next().map(|(key, product)| (*key, product.index));
        match next {
            Some((next_key, next_index)) => {
                self.events.push_front(ReceiverEvent::Started { index: next_index });
                self.anchor = Anchor::Tentative { index: next_index, key: next_key, end_held: false };
                self.counters.index_confirmations += 1;
                self.ask_to_confirm(next_index);
            }
            None => {
                self.newest = None;
                self.multicasting.clear();
            }
        }
    }

    /// Starts receiving a product; `ended` when its multicast is already over; `request_bop`
    /// when its BOP was not seen.
    fn create(&mut self, key: i64, index: ProductIndex, ended: bool, request_bop: bool) {
        while self.products.len() >= self.config.in_flight_products_max {
            let Some(oldest) = self.products.keys().next().copied() else { break };
            self.bound_hit(ReceiverBound::InFlightProducts, Some(index));
            self.abandon(oldest, MissReason::Evicted);
        }
        let abandon_at = self.now + self.config.incomplete_timeout;
        self.counters.started += 1;
        self.add_timer((abandon_at, key, TimerKind::Abandon));
        self.products.insert(key, Incoming::new(index, self.now, abandon_at, ended));
        if !ended {
            self.multicasting.insert(key);
        }
        if request_bop {
            self.request(Message { index, body: Body::BopReq });
            self.counters.bop_requests += 1;
        }
    }

    fn on_bop(&mut self, key: i64, bop: &Bop<'_>, retransmitted: bool) {
        let now = self.now;
        let Some(product) = self.products.get_mut(&key) else { return };
        if !retransmitted {
            product.last_multicast = now;
        }
        if let Some(known) = &product.bop {
            if known.size != bop.product_size || known.metadata != bop.metadata || known.start_time != bop.start_time {
                self.counters.bop_mismatches += 1;
            } else {
                self.counters.duplicates += 1;
            }
            return;
        }
        let index = product.index;
        if bop.product_size > self.config.product_size_max {
            self.bound_hit(ReceiverBound::ProductSize, Some(index));
            self.abandon(key, MissReason::TooLarge);
            return;
        }
        let size = u64::from(bop.product_size);
        // This product's early blocks are already counted and move into its buffer.
        let own_early = product.early_bytes;
        while self.in_flight_bytes - own_early + size > self.config.in_flight_bytes_max {
            // The oldest other product that holds memory goes (product_size_max ≤
            // in_flight_bytes_max, so evicting enough always succeeds).
            let victim = self.products.iter().find(|(k, p)| **k != key && p.held_bytes() > 0).map(|(k, _)| *k);
            let Some(victim) = victim else { break };
            self.bound_hit(ReceiverBound::InFlightBytes, Some(index));
            self.abandon(victim, MissReason::Evicted);
        }
        let Some(product) = self.products.get_mut(&key) else { return };
        // The early blocks move into the product's buffer (or, with a sink, are written once
        // it is open).
        let mut data = match self.config.assembly {
            Assembly::Memory => vec![0; bop.product_size as usize],
            Assembly::Discard | Assembly::Sink => Vec::new(),
        };
        let mut for_sink = Vec::new();
        let mut received = RangeSet::default();
        let mut out_of_range = 0;
        for block in product.early.drain(..) {
            let end = u64::from(block.offset) + u64::from(block.len);
            if end > size {
                out_of_range += 1;
                continue;
            }
            if received.insert(u64::from(block.offset), end) == 0 {
                continue;
            }
            product.fingerprint = product.fingerprint.wrapping_add(block.fingerprint);
            match self.config.assembly {
                Assembly::Memory => data[block.offset as usize..end as usize].copy_from_slice(&block.data),
                Assembly::Sink => for_sink.push(block),
                Assembly::Discard => {}
            }
        }
        self.counters.out_of_range += out_of_range;
        self.early_bytes -= product.early_bytes;
        self.in_flight_bytes = self.in_flight_bytes - product.early_bytes + size;
        product.early_bytes = 0;
        product.data = data;
        product.received = received;
        product.bop =
            Some(BopInfo { start_time: bop.start_time, size: bop.product_size, metadata: bop.metadata.to_vec() });
        if self.config.assembly == Assembly::Sink && !self.open_in_sink(key, bop, &for_sink) {
            return;
        }
        if self.complete_if_done(key) {
            return;
        }
        let Some(product) = self.products.get(&key) else { return };
        if product.ended {
            self.request_missing(key, 0, size);
        } else {
            let multicast_end = product.multicast_end.min(size);
            self.request_missing(key, 0, multicast_end);
            self.schedule_receive_timer(key);
        }
    }

    fn on_data(&mut self, key: i64, offset: u32, data: &[u8], retransmitted: bool) {
        let fingerprint = block_fingerprint(offset, data);
        let Some(product) = self.products.get(&key) else { return };
        if product.bop.is_none() {
            // Kept until the BOP comes, with its bytes unless they are discarded.
            let bytes = match self.config.assembly {
                Assembly::Memory | Assembly::Sink => data.to_vec(),
                Assembly::Discard => Vec::new(),
            };
            // data.len() ≤ the 16-bit payload length.
            self.on_block(key, offset, data.len() as u32, fingerprint, bytes, retransmitted);
            return;
        }
        self.on_known_data(key, offset, data, fingerprint, retransmitted);
    }

    /// A block of a product whose BOP is not known yet: kept (bounded) until the RETX_BOP
    /// arrives, or dropped and requested again then.
    fn on_block(&mut self, key: i64, offset: u32, len: u32, fingerprint: u64, bytes: Vec<u8>, retransmitted: bool) {
        let now = self.now;
        let early_bytes_max = self.config.early_bytes_max;
        let in_flight_bytes_max = self.config.in_flight_bytes_max;
        let Some(product) = self.products.get_mut(&key) else { return };
        let start = u64::from(offset);
        let end = start + u64::from(len);
        if !retransmitted {
            product.last_multicast = now;
            product.multicast_end = product.multicast_end.max(end);
        }
        if product.received.contains(start, end) {
            self.counters.duplicates += 1;
        } else if self.early_bytes + u64::from(len) > early_bytes_max
            || self.in_flight_bytes + u64::from(len) > in_flight_bytes_max
        {
            // Dropped, not held: it is requested again once the BOP is known. (Evicting a
            // product whose BOP is known for a block of one whose size is not would be no
            // better a bet.)
            let bound = if self.early_bytes + u64::from(len) > early_bytes_max {
                ReceiverBound::EarlyBytes
            } else {
                ReceiverBound::InFlightBytes
            };
            let (index, first) = (product.index, !product.early_bound_hit);
            product.early_bound_hit = true;
            if first {
                self.bound_hit(bound, Some(index));
            } else {
                self.counters.bound_hits += 1;
            }
        } else {
            product.received.insert(start, end);
            product.early.push(EarlyBlock { offset, len, fingerprint, data: bytes });
            product.early_bytes += u64::from(len);
            self.early_bytes += u64::from(len);
            self.in_flight_bytes += u64::from(len);
            if retransmitted {
                product.retransmitted_blocks += 1;
                self.counters.retx_blocks += 1;
            }
        }
    }

    /// A block of a product whose BOP is known.
    fn on_known_data(&mut self, key: i64, offset: u32, data: &[u8], fingerprint: u64, retransmitted: bool) {
        let now = self.now;
        let Some(product) = self.products.get_mut(&key) else { return };
        let start = u64::from(offset);
        let end = start + data.len() as u64;
        let previous_end = product.multicast_end;
        if !retransmitted {
            product.last_multicast = now;
            product.multicast_end = product.multicast_end.max(end);
        }
        let Some(size) = product.bop.as_ref().map(|b| u64::from(b.size)) else { return };
        if end > size {
            self.counters.out_of_range += 1;
            return;
        }
        if product.received.insert(start, end) == 0 {
            self.counters.duplicates += 1;
            return;
        }
        if !self.store(key, offset, data) {
            return;
        }
        let Some(product) = self.products.get_mut(&key) else { return };
        product.fingerprint = product.fingerprint.wrapping_add(fingerprint);
        if retransmitted {
            product.retransmitted_blocks += 1;
            self.counters.retx_blocks += 1;
        }
        if self.complete_if_done(key) {
            return;
        }
        if !retransmitted && start > previous_end {
            // In-order path: what lies between the previous block and this one is lost.
            self.request_missing(key, previous_end, start);
        }
        self.ask_waiting_parity(key);
        self.decode_passed_groups(key, start, end);
    }

    fn on_eop(&mut self, key: i64) {
        if let Some(product) = self.products.get_mut(&key) {
            product.eop_seen = true;
        }
        self.end_multicast(key);
    }

    /// The product's multicast is over (EOP, RETX_EOP, a newer product, or the receive
    /// timer): request everything still missing.
    fn end_multicast(&mut self, key: i64) {
        let Some(product) = self.products.get_mut(&key) else { return };
        product.ended = true;
        self.multicasting.remove(&key);
        if let Some(size) = product.bop.as_ref().map(|b| u64::from(b.size)) {
            self.request_missing(key, 0, size);
        }
        self.ask_waiting_parity(key);
    }

    fn receive_timer_fired(&mut self, key: i64) {
        let timer = self.config.receive_timer;
        let now = self.now;
        let Some(product) = self.products.get_mut(&key) else { return };
        product.receive_timer = None;
        let Some(size) = product.bop.as_ref().map(|b| u64::from(b.size)) else { return };
        if product.ended {
            // Its tail was requested when the multicast ended.
            return;
        }
        let due = receive_due(&timer, product.last_multicast, size.saturating_sub(product.multicast_end));
        if due > now {
            product.receive_timer = Some(due);
            self.add_timer((due, key, TimerKind::Receive));
            return;
        }
        let (index, eop_seen, eop_requested) = (product.index, product.eop_seen, product.eop_requested);
        product.eop_requested = true;
        self.end_multicast(key);
        if !eop_seen && !eop_requested && self.products.contains_key(&key) {
            self.request(Message { index, body: Body::EopReq });
            self.counters.eop_requests += 1;
        }
    }

    fn schedule_receive_timer(&mut self, key: i64) {
        let timer = self.config.receive_timer;
        let Some(product) = self.products.get_mut(&key) else { return };
        let Some(size) = product.bop.as_ref().map(|b| u64::from(b.size)) else { return };
        if product.receive_timer.is_some() {
            return;
        }
        let due = receive_due(&timer, product.last_multicast, size.saturating_sub(product.multicast_end));
        product.receive_timer = Some(due);
        self.add_timer((due, key, TimerKind::Receive));
    }

    /// Requests the bytes of `[start, end)` neither received nor requested yet, coalesced: as
    /// parity of their groups when parity is in use, else (and for groups that fell back) with
    /// RETX_REQ.
    fn request_missing(&mut self, key: i64, start: u64, end: u64) {
        let parity = self.parity_in_use();
        let Some(product) = self.products.get_mut(&key) else { return };
        let size = product.bop.as_ref().map_or(0, |bop| u64::from(bop.size));
        let parity = parity.filter(|parity| codes_product(parity, size));
        let mut ranges = Vec::new();
        let mut groups: Vec<u16> = Vec::new();
        for (gap_start, gap_end) in product.received.gaps_iter(start, end) {
            for (from, to) in product.requested.gaps(gap_start, gap_end) {
                product.requested.insert(from, to);
                let Some(parity) = &parity else {
                    ranges.push((from, to));
                    continue;
                };
                let mut at = from;
                while at < to {
                    // < 2¹⁶ groups (checked above).
                    let group = parity.group_of(at) as u16;
                    let (_, group_end, _) = parity.group_range(u32::from(group), size);
                    let piece_end = group_end.min(to);
                    if product.parity.get(&group).is_some_and(|repair| repair.fallback) {
                        ranges.push((at, piece_end));
                    } else if groups.last() != Some(&group) {
                        groups.push(group);
                    }
                    at = piece_end;
                }
            }
        }
        for (from, to) in ranges {
            self.retx_request(key, from, to);
        }
        for group in groups {
            self.ask_parity_when_passed(key, group);
        }
    }

    /// Asks for the parity of `group` (which lost blocks) once the multicast has passed it: a
    /// group still being multicast may lose more, and one PARITY_REQ then asks for all of them
    /// (the shards of a group can be decoded only after it passed anyway). Only the group being
    /// multicast can wait, so a product has at most one waiting.
    fn ask_parity_when_passed(&mut self, key: i64, group: u16) {
        let Some(parity) = self.parity_in_use() else { return };
        let Some(product) = self.products.get_mut(&key) else { return };
        if !product.passed(&parity, group) {
            let waiting = product.parity_waiting.replace(group);
            self.parity_waiting_products += u32::from(waiting.is_none());
            if let Some(earlier) = waiting.filter(|&earlier| earlier != group) {
                self.ask_parity(key, earlier, false);
            }
            return;
        }
        self.ask_parity(key, group, false);
    }

    /// Sends the PARITY_REQ of the product's waiting group if the multicast has passed it.
    fn ask_waiting_parity(&mut self, key: i64) {
        let Some(product) = self.products.get_mut(&key) else { return };
        let Some(group) = product.parity_waiting else { return };
        let Some(parity) = self.config.parity else { return };
        if product.passed(&parity, group) {
            product.parity_waiting = None;
            self.parity_waiting_products -= 1;
            self.ask_parity(key, group, false);
        }
    }

    /// RETX_REQs for `[from, to)` (already marked requested).
    fn retx_request(&mut self, key: i64, from: u64, to: u64) {
        let chunk = u64::from(self.config.request_len_max);
        let Some(product) = self.products.get(&key) else { return };
        let index = product.index;
        let mut at = from;
        while at < to {
            let len = chunk.min(to - at);
            // at < size ≤ u32::MAX and len ≤ request_len_max ≤ u16::MAX.
            self.transmits.push_back(Message { index, body: Body::RetxReq { offset: at as u32, len: len as u16 } });
            self.counters.retx_requests += 1;
            at += len;
        }
        self.counters.retx_request_bytes += to - from;
    }

    /// The parity settings that repair a product of `size` bytes ([`codes_product`]).
    fn parity_for(&self, size: u64) -> Option<ParityConfig> {
        self.parity_in_use().filter(|parity| codes_product(parity, size))
    }

    /// The parity settings when this receiver repairs by parity.
    fn parity_in_use(&self) -> Option<ParityConfig> {
        let parity = self.config.parity?;
        match self.config.assembly {
            Assembly::Memory => Some(parity),
            Assembly::Discard if self.fingerprint_source.is_some() => Some(parity),
            Assembly::Sink if self.sink.as_ref().is_some_and(|sink| sink.0.reads_back()) => Some(parity),
            _ => None,
        }
    }

    /// Blocks of `[start, end)` neither received nor still to come by multicast (asked for).
    fn lost_blocks(product: &Incoming, start: u64, end: u64, block_len: u64) -> u32 {
        let lost: u64 = Self::lost_ranges(product, start, end).map(|(from, to)| (to - from).div_ceil(block_len)).sum();
        // ≤ the blocks of a group ≤ 32768.
        lost as u32
    }

    /// The ranges of `[start, end)` neither received nor still to come by multicast (asked for).
    fn lost_ranges(product: &Incoming, start: u64, end: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        product.received.gaps_iter(start, end).flat_map(|(from, to)| product.requested.within(from, to))
    }

    /// Asks for the parity shards a group still needs (on a new loss, or again when
    /// `retry`), falling back to RETX_REQ when parity cannot repair it.
    fn ask_parity(&mut self, key: i64, group: u16, retry: bool) {
        if self.backlog {
            // One entry per group; a retry held after a first ask stays a retry.
            match self.deferred_parity.iter_mut().find(|(k, g, _, _)| (*k, *g) == (key, group)) {
                Some((_, _, held_retry, _)) => *held_retry |= retry,
                None => self.deferred_parity.push((key, group, retry, self.now)),
            }
            return;
        }
        self.send_parity_request(key, group, retry);
    }

    /// [`Receiver::ask_parity`], now.
    fn send_parity_request(&mut self, key: i64, group: u16, retry: bool) {
        let Some(parity) = self.parity_in_use() else { return };
        let now = self.now;
        let wait = self.parity_rtt.retry_after(parity.retry);
        let Some(product) = self.products.get_mut(&key) else { return };
        let Some(size) = product.bop.as_ref().map(|bop| u64::from(bop.size)) else { return };
        let (start, end, _) = parity.group_range(u32::from(group), size);
        let lost = Self::lost_blocks(product, start, end, parity.block_len as u64);
        let index = product.index;
        let repair = product.parity.get_or_default(group);
        if repair.fallback || lost == 0 {
            return;
        }
        let held = repair.shards.len() as u32;
        let from = repair.shards.last().map_or(0, |last| u32::from(last) + 1);
        let need = lost.saturating_sub(held);
        if need == 0 {
            self.try_decode(key, group);
            return;
        }
        if from + need > parity.shards || (retry && repair.rounds >= parity.rounds_max) {
            repair.fallback = true;
            self.counters.parity_fallbacks += 1;
            // Only what is lost (asked for), not what the multicast has yet to bring.
            let lost: Vec<(u64, u64)> = Self::lost_ranges(product, start, end).collect();
            for (from, to) in lost {
                self.retx_request(key, from, to);
            }
            return;
        }
        if !retry && lost <= repair.asked_for {
            return;
        }
        repair.asked_for = lost;
        repair.rounds = repair.rounds.saturating_add(1);
        // Only a first request times the answer: a shard after a second one may answer either.
        repair.asked_at = (repair.rounds == 1).then_some(now);
        let retry_at = now + wait;
        repair.retry_at = Some(retry_at);
        // need ≤ lost ≤ 32768 and from ≤ shards ≤ 256.
        self.transmits
            .push_back(Message { index, body: Body::ParityReq { group, need: need as u16, from: from as u16 } });
        self.counters.parity_requests += 1;
        if product.parity_timer.is_none_or(|at| at > retry_at) {
            if let Some(at) = product.parity_timer.take() {
                self.remove_timer((at, key, TimerKind::Parity));
            }
            if let Some(product) = self.products.get_mut(&key) {
                product.parity_timer = Some(retry_at);
            }
            self.add_timer((retry_at, key, TimerKind::Parity));
        }
    }

    fn parity_timer_fired(&mut self, key: i64) {
        let now = self.now;
        let Some(product) = self.products.get_mut(&key) else { return };
        product.parity_timer = None;
        let due: Vec<u16> = product
            .parity
            .iter()
            .filter(|(_, repair)| !repair.fallback && repair.retry_at.is_some_and(|at| at <= now))
            .map(|(group, _)| *group)
            .collect();
        for group in due {
            self.ask_parity(key, group, true);
        }
        // The next retry of the groups still waiting.
        let Some(product) = self.products.get_mut(&key) else { return };
        let next = product
            .parity
            .values()
            .filter(|repair| !repair.fallback)
            .filter_map(|repair| repair.retry_at)
            .filter(|at| *at > now)
            .min();
        if let Some(at) = next {
            if product.parity_timer.is_none() {
                product.parity_timer = Some(at);
                self.add_timer((at, key, TimerKind::Parity));
            }
        }
    }

    /// A PARITY datagram: held if its group is incomplete here, then a decode tried.
    fn on_parity(&mut self, index: ProductIndex, group: u16, coding: (u8, u8), shard: u8, data: &[u8]) {
        let Some(parity) = self.parity_in_use() else {
            self.counters.unexpected += 1;
            return;
        };
        if !parity.codes_as(coding.0, coding.1) || data.len() != parity.block_len || u32::from(shard) >= parity.shards {
            self.counters.parity_mismatched += 1;
            return;
        }
        let Some(key) =
            self.known(index).filter(|(_, product)| product.group_incomplete(&parity, group)).map(|(key, _)| key)
        else {
            self.counters.parity_unused += 1;
            return;
        };
        let discard = self.config.assembly == Assembly::Discard;
        let Some(product) = self.products.get_mut(&key) else { return };
        let repair = product.parity.get_or_default(group);
        if repair.fallback || repair.shards.contains(shard) {
            self.counters.duplicates += 1;
            return;
        }
        repair.shards.insert(shard, (!discard).then_some(data));
        // Timed when the answer is whole (as many shards as blocks were lost): what a retry
        // waits for is the last shard, which may queue behind data on a busy path.
        if repair.shards.len() >= repair.asked_for as usize {
            if let Some(asked) = repair.asked_at.take() {
                self.parity_rtt.sample(self.now.saturating_duration_since(asked));
            }
        }
        self.counters.parity_shards += 1;
        self.try_decode(key, group);
    }

    /// Tries to decode the groups `[start, end)` touches (a block arrived there).
    fn decode_passed_groups(&mut self, key: i64, start: u64, end: u64) {
        let Some(parity) = self.parity_in_use() else { return };
        let Some(product) = self.products.get(&key) else { return };
        if product.parity.is_empty() || end <= start {
            return;
        }
        let (first, last) = (parity.group_of(start), parity.group_of(end - 1));
        // < 2¹⁶ groups when parity is held.
        let (first, last) = (first.min(u64::from(u16::MAX)) as u16, last.min(u64::from(u16::MAX)) as u16);
        let mut next = first;
        while next <= last {
            let Some(group) = self.products.get(&key).and_then(|p| p.parity.first_in(next, last)) else {
                break;
            };
            self.try_decode(key, group);
            let Some(after) = group.checked_add(1) else { break };
            next = after;
        }
    }

    /// Recovers a group's lost blocks once its multicast has passed and as many shards as
    /// lost blocks are held.
    fn try_decode(&mut self, key: i64, group: u16) {
        let Some(parity) = self.parity_in_use() else { return };
        let Some(product) = self.products.get_mut(&key) else { return };
        let Some(size) = product.bop.as_ref().map(|bop| u64::from(bop.size)) else { return };
        let (start, end, _) = parity.group_range(u32::from(group), size);
        let Some(repair) = product.parity.get(&group) else { return };
        if repair.fallback || repair.shards.is_empty() || !product.passed(&parity, group) {
            return;
        }
        let block_len = parity.block_len as u64;
        let missing_blocks: u64 =
            product.received.gaps_iter(start, end).map(|(from, to)| (to - from).div_ceil(block_len)).sum();
        if missing_blocks == 0 {
            product.parity.remove(&group);
            return;
        }
        if (repair.shards.len() as u64) < missing_blocks {
            return;
        }
        let missing = product.received.gaps(start, end);
        let index = product.index;
        if self.config.assembly == Assembly::Discard {
            // Nothing to store: the ranges and their fingerprints (most of a large simulation's
            // repairs, so without the vectors the other assemblies need).
            let Some(source) = self.fingerprint_source.as_mut() else { return };
            let mut count = 0;
            for &(from, to) in &missing {
                // Within the product (< 4 GiB).
                let fingerprint = (source.0)(index, from as u32, to as u32);
                product.received.insert(from, to);
                product.fingerprint = product.fingerprint.wrapping_add(fingerprint);
                count += (to - from).div_ceil(block_len);
            }
            self.decoded(key, group, count);
            return;
        }
        // Each recovered block: its range, fingerprint and bytes.
        // The group's bytes as held: in the product's buffer, or read back from the sink.
        let read_back;
        let group_bytes: &[u8] = if self.config.assembly == Assembly::Memory {
            &product.data[start as usize..end as usize]
        } else {
            let mut bytes = vec![0u8; (end - start) as usize];
            let Some(sink) = self.sink.as_mut() else { return };
            let read = product.received.within(start, end).try_for_each(|(from, to)| {
                // Within the product (< 4 GiB).
                sink.0.read_at(index, from as u32, &mut bytes[(from - start) as usize..(to - start) as usize])
            });
            if read.is_err() {
                self.counters.sink_failures += 1;
                self.abandon(key, MissReason::SinkFailed);
                return;
            }
            read_back = bytes;
            &read_back
        };
        // A block with any byte missing.
        let lost = |position: u32| {
            let at = start + u64::from(position) * block_len;
            missing.iter().any(|&(from, to)| from < at + block_len && at < to)
        };
        let shards = repair.shards.with_bytes().take(missing_blocks as usize);
        let recovered: Vec<(u64, u64, u64, Vec<u8>)> = match parity.decode(group_bytes, lost, shards) {
            Ok(restored) => restored
                .into_iter()
                .map(|(position, bytes)| {
                    let from = start + u64::from(position) * block_len;
                    // from < size ≤ u32::MAX.
                    (from, from + bytes.len() as u64, block_fingerprint(from as u32, &bytes), bytes)
                })
                .collect(),
            Err(_) => {
                self.counters.parity_decode_failures += 1;
                if let Some(repair) = product.parity.get_mut(&group) {
                    repair.shards.clear();
                    repair.rounds = parity.rounds_max;
                }
                self.ask_parity(key, group, true);
                return;
            }
        };
        let mut count = 0;
        for (from, to, fingerprint, bytes) in recovered {
            // Within the product (< 4 GiB).
            if !self.store(key, from as u32, &bytes) {
                return;
            }
            let Some(product) = self.products.get_mut(&key) else { return };
            product.received.insert(from, to);
            product.fingerprint = product.fingerprint.wrapping_add(fingerprint);
            count += (to - from).div_ceil(block_len);
        }
        self.decoded(key, group, count);
    }

    /// A group was decoded: `count` blocks recovered.
    fn decoded(&mut self, key: i64, group: u16, count: u64) {
        if let Some(product) = self.products.get_mut(&key) {
            product.parity.remove(&group);
            // Lost on the multicast and repaired: they count as the product's repaired blocks.
            product.retransmitted_blocks = product.retransmitted_blocks.saturating_add(count as u32);
        }
        self.counters.parity_blocks += count;
        self.complete_if_done(key);
    }

    /// Keeps a block's bytes where the product is assembled (its buffer, the sink, nowhere);
    /// a sink that fails makes the product missed, and `false` is returned.
    fn store(&mut self, key: i64, offset: u32, bytes: &[u8]) -> bool {
        let Some(product) = self.products.get_mut(&key) else { return false };
        match self.config.assembly {
            Assembly::Memory => {
                let start = offset as usize;
                product.data[start..start + bytes.len()].copy_from_slice(bytes);
            }
            Assembly::Sink => {
                let index = product.index;
                let written = self.sink.as_mut().map(|sink| sink.0.write_at(index, offset, bytes));
                if !matches!(written, Some(Ok(()))) {
                    self.counters.sink_failures += 1;
                    self.abandon(key, MissReason::SinkFailed);
                    return false;
                }
            }
            Assembly::Discard => {}
        }
        true
    }

    /// Delivers the product if it is complete; returns whether it was.
    fn complete_if_done(&mut self, key: i64) -> bool {
        let complete = self
            .products
            .get(&key)
            .is_some_and(|p| p.bop.as_ref().is_some_and(|bop| p.received.contains(0, u64::from(bop.size))));
        if !complete {
            return false;
        }
        let product = self.remove(key).expect("checked above");
        if product.sink_open {
            if let Some(sink) = &mut self.sink {
                sink.0.close(product.index, true);
            }
        }
        let bop = product.bop.expect("checked above");
        let latency_ns = self.wall_clock.wall_at(self.now).signed_nanos_since(bop.start_time);
        self.end(key, product.index);
        self.counters.delivered += 1;
        self.events.push_back(ReceiverEvent::Delivered(Delivery {
            index: product.index,
            metadata: bop.metadata,
            data: product.data,
            start_time: bop.start_time,
            completed_at: self.now,
            retransmitted_blocks: product.retransmitted_blocks,
            latency_ns,
            fingerprint: product.fingerprint,
        }));
        true
    }

    /// Gives up a product: Missed event, and RETX_END unless the sender rejected it.
    fn abandon(&mut self, key: i64, reason: MissReason) {
        let Some(product) = self.remove(key) else { return };
        if product.sink_open {
            if let Some(sink) = &mut self.sink {
                sink.0.close(product.index, false);
            }
        }
        if reason != MissReason::Rejected {
            self.end(key, product.index);
        }
        self.counters.missed += 1;
        self.events.push_back(ReceiverEvent::Missed { index: product.index, reason });
    }

    /// Sends RETX_END for a finished product, or holds it while the product is the first one
    /// and the sender has not confirmed it (see [`Anchor::Tentative`]).
    fn end(&mut self, key: i64, index: ProductIndex) {
        if let Anchor::Tentative { key: anchor, end_held, .. } = &mut self.anchor {
            if *anchor == key {
                *end_held = true;
                return;
            }
        }
        self.request(Message { index, body: Body::RetxEnd });
        self.counters.retx_ends += 1;
    }

    fn count_malformed(&mut self, error: &wire::Error) {
        self.counters.malformed += 1;
        match error {
            wire::Error::Truncated { .. } | wire::Error::BopTooShort { .. } | wire::Error::MetadataTruncated { .. } => {
                self.counters.truncated += 1;
            }
            wire::Error::TrailingBytes { .. } | wire::Error::PayloadTooLong { .. } => self.counters.oversized += 1,
            wire::Error::UnknownType { .. } => self.counters.unknown_type += 1,
            _ => {}
        }
    }

    fn remove(&mut self, key: i64) -> Option<Incoming> {
        let product = self.products.remove(&key)?;
        self.parity_waiting_products -= u32::from(product.parity_waiting.is_some());
        self.multicasting.remove(&key);
        self.remove_timer((product.abandon_at, key, TimerKind::Abandon));
        if let Some(at) = product.receive_timer {
            self.remove_timer((at, key, TimerKind::Receive));
        }
        if let Some(at) = product.parity_timer {
            self.remove_timer((at, key, TimerKind::Parity));
        }
        self.in_flight_bytes -= product.held_bytes();
        self.early_bytes -= product.early_bytes;
        Some(product)
    }

    /// Opens the product in the sink and writes the blocks that came before its BOP; on a sink
    /// error the product is abandoned and `false` returned.
    fn open_in_sink(&mut self, key: i64, bop: &Bop<'_>, early: &[EarlyBlock]) -> bool {
        let (Some(sink), Some(product)) = (&mut self.sink, self.products.get_mut(&key)) else { return false };
        let index = product.index;
        let mut result = sink.0.open(index, bop.product_size, bop.metadata);
        if result.is_ok() {
            product.sink_open = true;
            result = early.iter().try_for_each(|block| sink.0.write_at(index, block.offset, &block.data));
        }
        if result.is_err() {
            self.counters.sink_failures += 1;
            self.abandon(key, MissReason::SinkFailed);
            return false;
        }
        true
    }

    fn request(&mut self, message: Message<'static>) {
        self.transmits.push_back(message);
    }

    fn bound_hit(&mut self, bound: ReceiverBound, index: Option<ProductIndex>) {
        self.counters.bound_hits += 1;
        self.events.push_back(ReceiverEvent::BoundHit { bound, index });
    }
}

/// The fingerprint of one data block: a 64-bit mix of its offset, its length and its first and
/// last 8 bytes (O(1) whatever the length). [`Delivery::fingerprint`] sums it over the blocks of
/// a product; a wrong offset, a missing or doubled block, or a block of another product changes
/// the sum (with overwhelming probability when the sampled bytes differ).
pub fn block_fingerprint(offset: u32, block: &[u8]) -> u64 {
    let (mut head, mut tail) = ([0u8; 8], [0u8; 8]);
    match (block.first_chunk::<8>(), block.last_chunk::<8>()) {
        // Every block but a product's short last one.
        (Some(first), Some(last)) => (head, tail) = (*first, *last),
        _ => {
            let sampled = block.len();
            head[..sampled].copy_from_slice(block);
            tail[8 - sampled..].copy_from_slice(block);
        }
    }
    sampled_block_fingerprint(offset, block.len(), head, tail)
}

/// [`block_fingerprint`] from what it samples of a block `len` bytes long: its first
/// `min(len, 8)` bytes at the start of `head` and its last ones at the end of `tail`, zeros
/// elsewhere (for content that can make those bytes without the rest).
pub fn sampled_block_fingerprint(offset: u32, len: usize, head: [u8; 8], tail: [u8; 8]) -> u64 {
    let position = (u64::from(offset) << 32) | (len as u64 & 0xffff_ffff);
    let mut hash = mix64(position ^ 0x243f_6a88_85a3_08d3);
    hash = mix64(hash ^ u64::from_le_bytes(head));
    mix64(hash ^ u64::from_le_bytes(tail))
}

/// SplitMix64's finalizer: a bijective 64-bit mix.
const fn mix64(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Whether parity can repair a product of `size` bytes: at most 2¹⁶ block groups (group
/// numbers are 16 bits on the wire).
fn codes_product(parity: &ParityConfig, size: u64) -> bool {
    parity.groups(size) <= 1 << 16
}

fn receive_due(timer: &ReceiveTimer, last_multicast: Instant, remaining_bytes: u64) -> Instant {
    let transfer = transmission_time(remaining_bytes, timer.rate_bits_per_s);
    let scaled = Duration::try_from_secs_f64(transfer.as_secs_f64() * timer.factor).unwrap_or(Duration::MAX);
    last_multicast + timer.slack + scaled
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum TimerKind {
    Receive,
    Abandon,
    Parity,
}

#[derive(Debug)]
struct BopInfo {
    start_time: WallTime,
    size: u32,
    metadata: Vec<u8>,
}

/// A product being received.
#[derive(Debug)]
struct Incoming {
    index: ProductIndex,
    bop: Option<BopInfo>,
    /// The product bytes (`size` long once the BOP is known with [`Assembly::Memory`], empty
    /// otherwise).
    data: Vec<u8>,
    /// Opened in the sink ([`Assembly::Sink`]): it must be closed.
    sink_open: bool,
    /// Blocks that arrived before the BOP.
    early: Vec<EarlyBlock>,
    early_bytes: u64,
    early_bound_hit: bool,
    received: RangeSet,
    requested: RangeSet,
    /// End of the furthest multicast block seen.
    multicast_end: u64,
    /// Last multicast message for this product (or creation).
    last_multicast: Instant,
    /// The multicast of this product is over (EOP, a newer product, or the receive timer).
    ended: bool,
    eop_seen: bool,
    eop_requested: bool,
    retransmitted_blocks: u32,
    /// Sum of the fingerprints of the blocks taken into the product.
    fingerprint: u64,
    receive_timer: Option<Instant>,
    abandon_at: Instant,
    /// Groups whose lost blocks are asked for as parity ([`ReceiverConfig::parity`]).
    parity: GroupRepairs,
    /// When the parity timer is due (the earliest retry of `parity`).
    parity_timer: Option<Instant>,
    /// A group that lost blocks while being multicast: its PARITY_REQ goes out once the
    /// multicast has passed it ([`Receiver::ask_parity_when_passed`]).
    parity_waiting: Option<u16>,
}

/// A group of a product's blocks being repaired by parity.
#[derive(Debug, Default)]
struct GroupRepair {
    /// Shards held (without bytes with [`Assembly::Discard`]).
    shards: HeldShards,
    /// Lost blocks when the last request went out.
    asked_for: u32,
    /// Requests sent.
    rounds: u8,
    /// When to ask again if the group is still incomplete.
    retry_at: Option<Instant>,
    /// When its first request went out, until its answer was whole ([`ParityRtt`]).
    asked_at: Option<Instant>,
    /// Its lost blocks were asked for with RETX_REQ.
    fallback: bool,
}

/// The time from a PARITY_REQ to the last shard it needed, smoothed as TCP smooths its round trip
/// (RFC 6298: gains 1/8 and 1/4), and the wait before asking again derived from it.
///
/// Shards come by multicast and can be lost like blocks. A fixed wait long enough for a slow
/// path ([`ParityConfig::retry`], 250 ms by default) held every lost shard that long, and the
/// last product of a burst with it (the sender releases it when every receiver has it): on a
/// LAN where shards come in a millisecond or two, half the runs of a 200 MB burst to four
/// receivers ended a quarter of a second late (docs/benchmarks.md, issue #37). The wait is
/// now twice the smoothed time plus four deviations, from [`PARITY_RETRY_MIN`] up to the
/// configured wait, which stays the wait until a first answer was timed.
#[derive(Clone, Copy, Debug, Default)]
struct ParityRtt {
    /// Smoothed time and mean deviation, once one answer was timed.
    smoothed: Option<(Duration, Duration)>,
}

/// The shortest wait for parity shards before asking again ([`ParityRtt`]): above the
/// scheduling delays of a busy host, so that shards on their way are not asked for twice, and
/// above the 20 ms during which the sender counts a shard it multicast as on its way to the
/// receiver (a request sooner would get nothing).
pub const PARITY_RETRY_MIN: Duration = Duration::from_millis(30);

/// The longest a parity request waits for the driver to catch up ([`Receiver::set_backlog`]).
pub const PARITY_DEFER_MAX: Duration = Duration::from_millis(100);

impl ParityRtt {
    fn sample(&mut self, rtt: Duration) {
        self.smoothed = Some(match self.smoothed {
            None => (rtt, rtt / 2),
            Some((srtt, rttvar)) => {
                let deviation = srtt.abs_diff(rtt);
                (srtt * 7 / 8 + rtt / 8, rttvar * 3 / 4 + deviation / 4)
            }
        });
    }

    fn retry_after(&self, configured: Duration) -> Duration {
        match self.smoothed {
            None => configured,
            Some((srtt, rttvar)) => (srtt * 2 + rttvar * 4).clamp(PARITY_RETRY_MIN.min(configured), configured),
        }
    }
}

/// A product's block groups under parity repair, by group (sorted; a product has few at once,
/// most often one: a vector allocates less and finds them faster than a tree).
#[derive(Debug, Default)]
struct GroupRepairs(Vec<(u16, GroupRepair)>);

impl GroupRepairs {
    fn find(&self, group: u16) -> Result<usize, usize> {
        self.0.binary_search_by_key(&group, |(group, _)| *group)
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn get(&self, group: &u16) -> Option<&GroupRepair> {
        self.find(*group).ok().map(|at| &self.0[at].1)
    }

    fn get_mut(&mut self, group: &u16) -> Option<&mut GroupRepair> {
        self.find(*group).ok().map(|at| &mut self.0[at].1)
    }

    fn get_or_default(&mut self, group: u16) -> &mut GroupRepair {
        let at = self.find(group).unwrap_or_else(|at| {
            self.0.insert(at, (group, GroupRepair::default()));
            at
        });
        &mut self.0[at].1
    }

    fn remove(&mut self, group: &u16) -> Option<GroupRepair> {
        self.find(*group).ok().map(|at| self.0.remove(at).1)
    }

    /// The first group from `first` to `last` (inclusive) under repair.
    fn first_in(&self, first: u16, last: u16) -> Option<u16> {
        let at = self.find(first).unwrap_or_else(|at| at);
        self.0.get(at).map(|(group, _)| *group).filter(|&group| group <= last)
    }

    fn iter(&self) -> impl Iterator<Item = (&u16, &GroupRepair)> {
        self.0.iter().map(|(group, repair)| (group, repair))
    }

    fn values(&self) -> impl Iterator<Item = &GroupRepair> {
        self.0.iter().map(|(_, repair)| repair)
    }

    fn values_mut(&mut self) -> impl Iterator<Item = &mut GroupRepair> {
        self.0.iter_mut().map(|(_, repair)| repair)
    }
}

/// The parity shards held for a block group: which (a bit per index; at most 256) and, unless
/// bytes are discarded, their bytes by index (a discarding receiver, most of a large
/// simulation's, then allocates nothing per group).
#[derive(Debug, Default)]
struct HeldShards {
    held: [u64; 4],
    /// Sorted by index.
    bytes: Vec<(u8, Vec<u8>)>,
}

impl HeldShards {
    fn len(&self) -> usize {
        self.held.iter().map(|word| word.count_ones() as usize).sum()
    }

    fn is_empty(&self) -> bool {
        self.held == [0; 4]
    }

    fn contains(&self, shard: u8) -> bool {
        self.held[usize::from(shard / 64)] >> (shard % 64) & 1 == 1
    }

    /// The highest index held.
    fn last(&self) -> Option<u8> {
        // ≤ 255.
        (0..4)
            .rev()
            .find(|&word| self.held[word] != 0)
            .map(|word| (word * 64 + 63 - self.held[word].leading_zeros() as usize) as u8)
    }

    /// Holds shard `shard`, with `bytes` unless they are discarded.
    fn insert(&mut self, shard: u8, bytes: Option<&[u8]>) {
        self.held[usize::from(shard / 64)] |= 1 << (shard % 64);
        if let Some(bytes) = bytes {
            let at = self.bytes.partition_point(|(held, _)| *held < shard);
            self.bytes.insert(at, (shard, bytes.to_vec()));
        }
    }

    fn clear(&mut self) {
        *self = Self::default();
    }

    /// The shards held with their bytes, by index.
    fn with_bytes(&self) -> impl Iterator<Item = (u32, &[u8])> {
        self.bytes.iter().map(|(shard, bytes)| (u32::from(*shard), bytes.as_slice()))
    }
}

/// MEM_DATA datagrams of one product that arrived back to back and in order, handed over at once
/// without their bytes ([`Receiver::handle_block_run`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockRun {
    /// The product.
    pub index: ProductIndex,
    /// The first block's offset.
    pub start: u32,
    /// The end of the last block.
    pub end: u32,
    /// How many datagrams.
    pub datagrams: u32,
    /// Their bytes as received, headers included.
    pub wire_bytes: u64,
    /// The sum of their [`block_fingerprint`]s.
    pub fingerprint: u64,
}

/// Where a product being received stands ([`Receiver::in_flight`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InFlight {
    /// The product.
    pub index: ProductIndex,
    /// Its size, once its BOP is known.
    pub size: Option<u32>,
    /// Bytes received.
    pub received_bytes: u64,
    /// Bytes asked for again (repairs requested).
    pub requested_bytes: u64,
    /// Its multicast is over (EOP, RETX_EOP, a newer product, or the receive timer).
    pub ended: bool,
    /// Its EOP arrived.
    pub eop_seen: bool,
    /// It is the first product and the sender has not confirmed its index yet.
    pub tentative: bool,
}

/// A block kept before its product's BOP arrived.
#[derive(Debug)]
struct EarlyBlock {
    offset: u32,
    len: u32,
    fingerprint: u64,
    /// The bytes (empty with [`Assembly::Discard`]).
    data: Vec<u8>,
}

impl Incoming {
    /// The end of block group `group` (0 before the BOP is known).
    fn group_end(&self, parity: &ParityConfig, group: u16) -> u64 {
        let size = self.bop.as_ref().map_or(0, |bop| u64::from(bop.size));
        parity.group_range(u32::from(group), size).1
    }

    /// Whether the multicast has passed block group `group` here: its parity can be asked for
    /// and decoded.
    fn passed(&self, parity: &ParityConfig, group: u16) -> bool {
        self.ended || self.multicast_end >= self.group_end(parity, group)
    }

    /// Bytes of memory this product accounts for.
    /// Whether block group `group` exists (the size is known) and lacks blocks.
    fn group_incomplete(&self, parity: &ParityConfig, group: u16) -> bool {
        let Some(size) = self.bop.as_ref().map(|bop| u64::from(bop.size)) else { return false };
        if u64::from(group) >= parity.groups(size) {
            return false;
        }
        let (start, end, _) = parity.group_range(u32::from(group), size);
        !self.received.contains(start, end)
    }

    fn held_bytes(&self) -> u64 {
        self.bop.as_ref().map_or(0, |bop| u64::from(bop.size)) + self.early_bytes
    }

    fn new(index: ProductIndex, now: Instant, abandon_at: Instant, ended: bool) -> Self {
        Self {
            index,
            bop: None,
            data: Vec::new(),
            sink_open: false,
            early: Vec::new(),
            early_bytes: 0,
            early_bound_hit: false,
            received: RangeSet::default(),
            requested: RangeSet::default(),
            multicast_end: 0,
            last_multicast: now,
            ended,
            eop_seen: false,
            eop_requested: false,
            retransmitted_blocks: 0,
            fingerprint: 0,
            receive_timer: None,
            abandon_at,
            parity: GroupRepairs::default(),
            parity_timer: None,
            parity_waiting: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::HeldShards;

    #[test]
    fn held_shards_count_order_and_keep_bytes_only_when_given() {
        let mut shards = HeldShards::default();
        assert!(shards.is_empty() && shards.last().is_none());
        for shard in [200, 3, 64, 63, 255] {
            shards.insert(shard, Some(&[shard]));
        }
        shards.insert(7, None);
        assert_eq!(shards.len(), 6);
        assert_eq!(shards.last(), Some(255));
        assert!(shards.contains(63) && shards.contains(64) && shards.contains(7) && !shards.contains(8));
        let with_bytes: Vec<(u32, Vec<u8>)> = shards.with_bytes().map(|(j, bytes)| (j, bytes.to_vec())).collect();
        assert_eq!(with_bytes, [(3, vec![3]), (63, vec![63]), (64, vec![64]), (200, vec![200]), (255, vec![255])]);
        shards.clear();
        assert!(shards.is_empty() && shards.with_bytes().next().is_none());
    }
}
