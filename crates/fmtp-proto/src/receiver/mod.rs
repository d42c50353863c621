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
//!   delivery carries [`DeliveredProduct::fingerprint`], an order-independent digest of the
//!   blocks taken. A sink error makes the product missed ([`MissReason::SinkFailed`]), never a
//!   panic.
//! * Bounds: in-flight products and bytes (oldest incomplete product abandoned:
//!   [`MissReason::Evicted`]), product size ([`MissReason::TooLarge`]), early bytes; each hit
//!   is counted and reported as [`ReceiverEvent::BoundHit`].
//!
//! The code is split by concern: this module holds the settings, the events, the counters and
//! the receiver's state (with the products it holds); `api` the public inputs, outputs and
//! queries; `indexes` the product-index bookkeeping and the trust in indexes; `assembly` a
//! product's life from its first message to its delivery or abandonment, and the bounds;
//! `requests` the requests for lost bytes and the timers; `parity` the repair by parity
//! shards.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use crate::ConfigError;
use crate::index::ProductIndex;
use crate::parity::{ParityConfig, ParityDecoder};
use crate::ranges::RangeSet;
use crate::sink::{ProductSink, SinkSlot};
use crate::time::{Instant, WallClock, WallTime};
use crate::wire::{Message, REQUEST_LEN_MAX};

mod api;
mod assembly;
mod indexes;
mod parity;
mod requests;
mod runs;

use parity::{GroupRepairs, ParityRtt};
pub use parity::{PARITY_DEFER_MAX, PARITY_RETRY_MIN};
use runs::{RecentProducts, RunRepair};

/// The longest a RETX_EOP waits for the driver to catch up with the multicast
/// ([`Receiver::set_backlog`]).
///
/// A RETX_EOP says that the sender's multicast of a product is over. Taken while datagrams
/// received before it still wait to be handed over, it has the receiver ask for the blocks
/// among them — and, for a product newer than any handled here, for whole products (their
/// RETX_BOP answers ask for everything) — which the multicast then brings anyway. The sender's
/// tail probe goes exactly to the receivers that have not finished the last product, which a
/// receiver lagging behind the multicast has not. In a 33-server lab on two cores
/// (`ldm7 lab idd`, 6 minutes) relays taking a probe at once counted 900–4,900 such blocks each
/// ([`ReceiverCounters::multicast_after_asked`]), all in order on the path; none of them a real
/// loss. A receiver that keeps lagging takes the RETX_EOP after this long (its receive timer's
/// slack with a probing sender, and the sender probes again meanwhile).
pub const RETX_EOP_DEFER_MAX: Duration = PROBED_SENDER_SLACK;

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

/// [`ReceiveTimer::slack`] with a sender that probes the tail of its multicast (an ldm7 sender:
/// [`crate::SenderConfig::tail_probe`]).
///
/// With such a sender the timer only stands in for probes that were all lost: a product's
/// tail lost while the multicast goes on is asked for when the next product begins, and one
/// lost as the multicast falls idle when the sender's probe comes (its RETX_EOP, 200 ms after
/// the EOP). What the timer still sees is a multicast that paused mid-product: a sender or a
/// receiver not scheduled for a while on a loaded host. Asking then for the whole tail (more
/// than a parity group's shards: by RETX_REQ) has the sender send it twice, by multicast when
/// it goes on and by retransmission. In a 37-server lab on two cores (`ldm7 lab idd`) the
/// relays' receive timers fired 11–23 times per top run with the 100 ms slack, and most of
/// the 23 MB they then had retransmitted (0.11 of the top's egress per product byte) came
/// by multicast too.
pub const PROBED_SENDER_SLACK: Duration = Duration::from_secs(2);

impl ReceiveTimer {
    /// The timer for a sender that probes its tail (an ldm7 sender): multicast at
    /// `rate_bits_per_s`, with [`PROBED_SENDER_SLACK`].
    pub fn for_probing_sender(rate_bits_per_s: u64) -> Self {
        Self { rate_bits_per_s, slack: PROBED_SENDER_SLACK, ..Self::default() }
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
    /// Assemble each product in memory: [`DeliveredProduct::data`] holds its bytes.
    #[default]
    Memory,
    /// Keep no product bytes, only which ranges arrived: [`DeliveredProduct::data`] is empty and
    /// [`DeliveredProduct::fingerprint`] is the only witness of the content. Memory bounds are
    /// accounted as if the bytes were held, so bounds behave as with [`Assembly::Memory`]. For
    /// the simulator at scale (hundreds of receivers of gigabytes each).
    Discard,
    /// Write each product through the [`ProductSink`] given to [`Receiver::with_sink`]:
    /// [`DeliveredProduct::data`] is empty and the bytes are in the sink (opened at the BOP,
    /// closed before the product's event). Blocks that arrive before the BOP are held in memory.
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
    Delivered(DeliveredProduct),
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
pub struct DeliveredProduct {
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

impl std::fmt::Debug for DeliveredProduct {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeliveredProduct")
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
    /// Retransmitted blocks that were held already (asked for, and then had otherwise).
    pub retx_duplicates: u64,
    /// Multicast blocks that were asked for already (RETX_REQ or parity): requests that came
    /// before the multicast had passed.
    pub multicast_after_asked: u64,
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
    /// Of them, sent at once because a shard came above one asked for and not held (that one
    /// lost), not at the retry timer.
    pub parity_gap_requests: u64,
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
    /// Runs of small products coded together (docs/parity.md "Runs") being repaired here, by
    /// their first product's key.
    runs: BTreeMap<i64, RunRepair>,
    /// Small products delivered lately, kept for their runs' decodes.
    recent: RecentProducts,
    /// The Reed–Solomon working space, kept from one decode to the next.
    parity_decoder: ParityDecoder,
    /// RETX_EOPs held while [`Receiver::backlog`], with since when ([`RETX_EOP_DEFER_MAX`]).
    deferred_eops: Vec<(ProductIndex, Instant)>,
    /// Product buffers handed back by the application ([`Receiver::give_back_buffer`]), for
    /// the next products assembled in memory.
    spare_buffers: Vec<Vec<u8>>,
}

/// Product buffers kept for reuse ([`Receiver::give_back_buffer`]), at most.
pub const SPARE_BUFFERS_MAX: usize = 4;
/// Bytes of product buffers kept for reuse, at most (a buffer that would exceed it is freed).
pub const SPARE_BUFFER_BYTES_MAX: usize = 64 << 20;

/// [`Receiver::set_fingerprint_source`]'s function.
struct FingerprintSource(Box<dyn FnMut(ProductIndex, u32, u32) -> u64 + Send>);

impl std::fmt::Debug for FingerprintSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FingerprintSource")
    }
}

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
            runs: BTreeMap::new(),
            recent: RecentProducts::default(),
            parity_decoder: ParityDecoder::default(),
            deferred_eops: Vec::new(),
            spare_buffers: Vec::new(),
        })
    }
}

/// The fingerprint of one data block: a 64-bit mix of its offset, its length and its first and
/// last 8 bytes (O(1) whatever the length). [`DeliveredProduct::fingerprint`] sums it over the
/// blocks of a product; a wrong offset, a missing or doubled block, or a block of another product
/// changes the sum (with overwhelming probability when the sampled bytes differ).
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
    /// How long since its first message came.
    pub age: Duration,
    /// Where its repair by parity stands (its run's, its groups'; empty without parity), and
    /// its timers: for the diagnostics of a product that takes long.
    pub repair: String,
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
