//! The FMTP sender state machine (ldm7-multicast.md §3.8), sans-IO.
//!
//! Role: number products sequentially, multicast each as BOP, 1448-byte data blocks and EOP,
//! paced by a token bucket; serve every connected receiver's repair requests from the stored
//! product until the product's retransmission deadline; tell the application when a product may
//! be released.
//!
//! Invariants:
//! * Products are multicast strictly one after another, in index order (receivers rely on it:
//!   a message of a newer product means older products' multicast is over).
//! * Data block `k` of a product starts at `k × 1448` and carries 1448 bytes except the last.
//! * A product is retained from [`Sender::enqueue`] until it is released: when every receiver
//!   connected when its BOP was multicast (plus every receiver that asked for repairs of it
//!   since) has sent RETX_END or disconnected, or when its deadline passes, or when the
//!   retained-products bound evicts it. Any request for a product that is not retained is
//!   answered RETX_REJ (§3.8).
//! * At release, receivers that had not finished get RETX_EOP (§3.8: "sends RETX_EOP over TCP to
//!   every receiver that has not sent RETX_END"); their queued repairs of that product are
//!   dropped, and a receiver whose queued repairs were dropped also gets RETX_REJ (after its
//!   RETX_EOP, if owed one): the repairs it waits for will not come, exactly as if its requests
//!   had arrived after the release (§3.8: RETX_REJ for a product no longer held). Without it, a
//!   receiver slower than the deadline would wait for its own incomplete timeout.
//! * Repairs for one receiver are sent in request order (a RETX_EOP answering an EOP_REQ comes
//!   after the data requested before it); receivers are served round-robin, one message each.
//! * Every queue has a bound ([`SenderConfig`]); hitting one increments a counter and emits
//!   [`SenderEvent::BoundHit`] once per episode.
//! * A receiver's first RETX_END for a retained product emits one [`SenderEvent::Completed`]
//!   (its repair rounds, RTT and whether it gave the product up as far as the sender can tell):
//!   what a delivery monitor at the publisher sees of each subscriber.
//!
//! The code is split by concern: this module holds the settings, the events, the counters, the
//! sender's state and the per-receiver repair queues; `api` the public inputs, outputs and
//! queries; `multicast` the paced multicast of the product in front; `repairs` the requests
//! queued per receiver and served round-robin; `parity` the parity shards asked for;
//! `products` a retained product's deadline, tail probes, completions and release;
//! `interest` the set of receivers that hold a product.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use foldhash::fast::FixedState;

use crate::ConfigError;
use crate::index::ProductIndex;
use crate::pacing::{Pacing, TokenBucket};
use crate::parity::{ParityConfig, ParityEncoder};
use crate::time::{Instant, WallClock, WallTime};
use crate::wire::{BLOCK_LEN, Body, Bop, HEADER_LEN, METADATA_LEN_MAX, Message, MessageType, Packet};

mod api;
mod interest;
mod multicast;
mod parity;
mod products;
mod repairs;
mod runs;

use interest::InterestSet;
use parity::ParityGroup;
use runs::Run;

/// A receiver (one retransmission TCP connection), numbered by the driver. Ids must not be
/// reused while the old connection is still known to the sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReceiverId(pub u64);

impl fmt::Display for ReceiverId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "receiver {}", self.0)
    }
}

/// The bytes of a product, read block by block when the sender multicasts or repairs it. The
/// sender never copies a product except into the outgoing message buffer.
///
/// Implemented for in-memory buffers (`bytes::Bytes`, `Arc<[u8]>`, `Vec<u8>`, `Box<[u8]>`,
/// `&'static [u8]`). The production source (the product queue) implements it by reading the
/// product's region on demand and returns [`DataUnavailable`] once the product was evicted; a
/// zero-copy in-memory handle can also be wrapped with `Bytes::from_owner`.
pub trait ProductData: Send {
    /// Product length in bytes.
    fn len(&self) -> u64;

    /// Whether the product is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fills `out` with the product bytes `[offset, offset + out.len())`; the sender only asks
    /// for ranges inside `[0, len())`.
    fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<(), DataUnavailable>;
}

/// The product's bytes can no longer be read (for example, evicted from the product queue).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("product bytes are no longer available")]
pub struct DataUnavailable;

fn read_slice(bytes: &[u8], offset: u64, out: &mut [u8]) -> Result<(), DataUnavailable> {
    let start = usize::try_from(offset).map_err(|_| DataUnavailable)?;
    let source = start.checked_add(out.len()).and_then(|end| bytes.get(start..end)).ok_or(DataUnavailable)?;
    out.copy_from_slice(source);
    Ok(())
}

macro_rules! slice_product_data {
    ($($ty:ty),*) => {$(
        impl ProductData for $ty {
            fn len(&self) -> u64 {
                <[u8]>::len(self) as u64
            }
            fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<(), DataUnavailable> {
                read_slice(self, offset, out)
            }
        }
    )*};
}

slice_product_data!(bytes::Bytes, Arc<[u8]>, Vec<u8>, Box<[u8]>, &'static [u8]);

/// A product handed to the sender: its bytes and the BOP metadata (LDM: the 16-byte MD5
/// signature, §3.4).
pub struct OutgoingProduct {
    data: Box<dyn ProductData>,
    metadata: Vec<u8>,
}

impl OutgoingProduct {
    /// A product from its bytes and metadata (at most 1430 bytes, checked by
    /// [`Sender::enqueue`]).
    pub fn new(data: impl ProductData + 'static, metadata: impl Into<Vec<u8>>) -> Self {
        Self { data: Box::new(data), metadata: metadata.into() }
    }

    /// Product length in bytes.
    pub fn size(&self) -> u64 {
        self.data.len()
    }

    /// The BOP metadata.
    pub fn metadata(&self) -> &[u8] {
        &self.metadata
    }
}

impl fmt::Debug for OutgoingProduct {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutgoingProduct")
            .field("size", &self.size())
            .field("metadata_len", &self.metadata.len())
            .finish()
    }
}

/// How long after its EOP a product stays available for repairs (RESEARCH.md §3).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DeadlinePolicy {
    /// A per-feed constant (the adopted form; the reference default is 300 s).
    Constant(Duration),
    /// The early form `max(f_snd × size × 8 / rate, max RTT)`, floored at `min`. The rate is
    /// the multicast pacing rate (without pacing the size term is 0). RTTs come from
    /// [`Sender::set_rtt`].
    Proportional {
        /// The timeout factor `f_snd`.
        f_snd: f64,
        /// Lower bound of the deadline.
        min: Duration,
    },
}

impl Default for DeadlinePolicy {
    fn default() -> Self {
        Self::Constant(Duration::from_secs(300))
    }
}

/// Sender settings. `Default` is unpaced, 300 s deadline, LDM's skip-without-receivers policy.
#[derive(Clone, Debug, PartialEq)]
pub struct SenderConfig {
    /// Index of the first product (LDM keeps it in a per-feed file across restarts).
    pub first_index: ProductIndex,
    /// Pacing of multicast datagrams (`None`: unpaced, as the reference, which leaves rate
    /// control to tc).
    pub multicast_pacing: Option<Pacing>,
    /// Pacing of repair messages to all receivers together: a separate budget, like the
    /// design's two tc HTB classes (multicast and retransmission) each at the path rate.
    pub retx_pacing: Option<Pacing>,
    /// Retransmission deadline.
    pub deadline: DeadlinePolicy,
    /// Multicast products when no receiver is connected. LDM does not (`LDM7_NORCVR`, §3.4):
    /// `false` makes [`Sender::enqueue`] refuse products while no receiver is connected.
    pub multicast_without_receivers: bool,
    /// Bound: products enqueued but not yet fully multicast.
    pub queued_products_max: usize,
    /// Bound: products multicast and still retained for repairs; the oldest is released early
    /// (reason [`ReleaseReason::Evicted`]) when a new one would exceed it.
    pub retained_products_max: usize,
    /// Soft bound, per receiver: product bytes queued for retransmission. Above it
    /// [`Sender::accepts_stream`] turns false; the driver should stop reading that receiver's
    /// connection (TCP backpressure).
    pub retx_backlog_bytes_max: u64,
    /// Hard bound, per receiver: queued repair messages. Requests beyond it are dropped (the
    /// receiver's own timers then report the product missed).
    pub retx_backlog_items_max: usize,
    /// Bytes of a data block (1..=1448): block `k` starts at `k × block_len`. 1448 fills a
    /// 1460-byte PDU with no MAC; with a MAC of M bytes the reference sends 1448 − M so that the
    /// datagram stays 1460 bytes ([`crate::mac::MacLevel::mac_len`]).
    pub block_len: usize,
    /// When the multicast falls idle, this long (at least twice the largest receiver RTT) after
    /// the last EOP: every receiver that has not finished the last product gets its RETX_EOP,
    /// and the product's EOP is multicast again, so that a receiver that lost the last
    /// products whole learns of them now and not at their deadline (no later product would
    /// reveal the gap). The reference's receiver ignores a RETX_EOP for a product it never
    /// heard of, but asks for the BOP of a multicast EOP's unknown product (ldm7-multicast.md
    /// §3.9); to the receivers that have the product, the repeated EOP is a duplicate. While
    /// a receiver still has not finished it, the probe repeats [`TAIL_PROBES_MAX`] times in
    /// all, each after twice the last wait. `None`: off (the reference's behaviour: RETX_EOP
    /// only at release).
    pub tail_probe: Option<Duration>,
    /// ldm7 extension: answer PARITY_REQ with parity shards multicast ([`crate::parity`];
    /// its `block_len` must be this configuration's). `None`: off, as the reference.
    pub parity: Option<ParityConfig>,
    /// With `parity`: code consecutive small products together, in runs (docs/parity.md
    /// "Runs"; receivers need no setting for it). `false` codes each product alone.
    pub parity_runs: bool,
}

impl Default for SenderConfig {
    fn default() -> Self {
        Self {
            first_index: ProductIndex(0),
            multicast_pacing: None,
            retx_pacing: None,
            deadline: DeadlinePolicy::default(),
            multicast_without_receivers: false,
            queued_products_max: 1024,
            retained_products_max: 65_536,
            retx_backlog_bytes_max: 8 << 20,
            retx_backlog_items_max: 4096,
            block_len: BLOCK_LEN,
            tail_probe: Some(TAIL_PROBE_DEFAULT),
            parity: None,
            parity_runs: true,
        }
    }
}

/// [`SenderConfig::tail_probe`]'s default.
pub const TAIL_PROBE_DEFAULT: Duration = Duration::from_millis(200);

/// Tail probes of one product at most ([`SenderConfig::tail_probe`]): at 1, 3 and 7 times the
/// probe delay after its EOP.
pub const TAIL_PROBES_MAX: u8 = 3;

impl SenderConfig {
    /// Default settings with multicast and repairs each paced at `rate_bits_per_s`.
    pub fn with_rate(rate_bits_per_s: u64) -> Self {
        let pacing = Some(Pacing::new(rate_bits_per_s));
        Self { multicast_pacing: pacing, retx_pacing: pacing, ..Self::default() }
    }
}

/// Why [`Sender::enqueue`] refused a product (the product is handed back).
#[derive(Debug, thiserror::Error)]
#[error("{reason}")]
pub struct EnqueueError {
    /// Why.
    pub reason: EnqueueRefusal,
    /// The product, unchanged.
    pub product: OutgoingProduct,
}

/// Why a product was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EnqueueRefusal {
    /// No receiver is connected and [`SenderConfig::multicast_without_receivers`] is false.
    #[error("no FMTP receiver is connected: product not multicast (LDM policy)")]
    NoReceivers,
    /// [`SenderConfig::queued_products_max`] products wait to be multicast: retry later.
    #[error("FMTP send queue is full: wait for products to be sent, or raise queued_products_max")]
    QueueFull,
    /// The metadata exceeds 1430 bytes.
    #[error("BOP metadata of {0} bytes exceeds the maximum of {METADATA_LEN_MAX}")]
    MetadataTooLong(usize),
    /// The product exceeds 4 GiB − 1 (prodsize is 32-bit).
    #[error("product of {0} bytes exceeds FMTP's 32-bit size limit")]
    ProductTooLarge(u64),
}

/// Where a [`Transmit`] goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Destination {
    /// The multicast group (UDP).
    Multicast,
    /// One receiver's retransmission connection (TCP).
    Receiver(ReceiverId),
}

/// A message [`Sender::poll_transmit`] appended to the caller's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Where to send it.
    pub destination: Destination,
    /// Bytes appended (one whole FMTP message: one datagram, or one message on the stream).
    pub len: usize,
    /// The message type (for metrics and tracing).
    pub message_type: MessageType,
}

/// Something the application should know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SenderEvent {
    /// The product's EOP was multicast (LDM logs "Multicasted: prodIndex=…").
    Sent {
        /// The product.
        index: ProductIndex,
        /// Its size.
        size: u32,
    },
    /// The sender no longer needs the product: the application may release it.
    Released {
        /// The product.
        index: ProductIndex,
        /// Why now.
        reason: ReleaseReason,
        /// Receivers that had not finished (got RETX_EOP); empty for `AllDone`.
        unfinished: Vec<ReceiverId>,
    },
    /// A receiver sent RETX_END for a retained product it had not finished before
    /// (ldm7-multicast.md §3.8): it holds the product now, or it gave it up.
    Completed(Completion),
    /// A bound was hit (also counted in [`SenderCounters::bound_hits`]).
    BoundHit {
        /// Which bound.
        bound: SenderBound,
        /// The receiver concerned, for per-receiver bounds.
        receiver: Option<ReceiverId>,
    },
}

/// One receiver's RETX_END for one product, with what the sender knows of that delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The product.
    pub index: ProductIndex,
    /// The receiver.
    pub receiver: ReceiverId,
    /// When the RETX_END was handled (the receiver finished about half an RTT earlier).
    pub at: Instant,
    /// The product's size, bytes.
    pub size: u32,
    /// The receiver's RTT as last given to [`Sender::set_rtt`] (zero if never).
    pub rtt: Duration,
    /// Rounds of repair requests the receiver made for the product: requests (RETX_REQ,
    /// BOP_REQ, EOP_REQ) that came more than one RTT (at least [`REPAIR_ROUND_MIN`]) after the
    /// first request of the previous round start a new round. 0: it came whole by multicast.
    pub repair_rounds: u32,
    /// Whether the receiver has the product, as far as the sender can tell.
    pub outcome: CompletionOutcome,
}

/// The shortest repair round: requests closer together than this (and than the receiver's
/// RTT) count as one round of [`Completion::repair_rounds`].
pub const REPAIR_ROUND_MIN: Duration = Duration::from_millis(1);

/// What a RETX_END means. The wire does not say: a receiver sends RETX_END both when it has
/// the product and when it gives it up (its incomplete timeout, its bounds; not after
/// RETX_REJ), so the sender infers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CompletionOutcome {
    /// The multicast of the product had ended and every repair of bytes the receiver lost was
    /// sent: it has the product (a receiver that gave up without waiting for a repair looks
    /// the same).
    Whole,
    /// Given up: repairs of bytes it had lost (asked for after the multicast sent them) were
    /// still queued, or the product's multicast had not ended, so it cannot hold the whole
    /// product.
    GaveUp,
}

/// Why a product was released.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReleaseReason {
    /// Every interested receiver sent RETX_END or disconnected.
    AllDone,
    /// The retransmission deadline passed.
    DeadlinePassed,
    /// [`SenderConfig::retained_products_max`] forced it out early.
    Evicted,
    /// [`ProductData::read_at`] failed.
    DataUnavailable,
}

/// The sender's named bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SenderBound {
    /// [`SenderConfig::retained_products_max`].
    RetainedProducts,
    /// [`SenderConfig::retx_backlog_bytes_max`].
    RetxBacklogBytes,
    /// [`SenderConfig::retx_backlog_items_max`].
    RetxBacklogItems,
}

/// Monotonic counters (Aeron-style system counters): read them any time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SenderCounters {
    /// Products accepted by `enqueue`.
    pub products_enqueued: u64,
    /// Products refused because no receiver was connected.
    pub products_skipped_no_receivers: u64,
    /// Products refused because the send queue was full.
    pub products_refused_queue_full: u64,
    /// Products whose EOP was multicast.
    pub products_sent: u64,
    /// Multicast datagrams sent.
    pub multicast_datagrams: u64,
    /// Multicast bytes sent (FMTP header + payload).
    pub multicast_bytes: u64,
    /// Repair messages sent (all types, all receivers).
    pub retx_messages: u64,
    /// Repair bytes sent (FMTP header + payload).
    pub retx_bytes: u64,
    /// RETX_DATA blocks sent.
    pub retx_data_blocks: u64,
    /// RETX_REQ received.
    pub retx_requests: u64,
    /// RETX_REQ received that asked for nothing (length 0 or beyond the product).
    pub retx_requests_empty: u64,
    /// BOP_REQ received.
    pub bop_requests: u64,
    /// EOP_REQ received.
    pub eop_requests: u64,
    /// RETX_END received.
    pub retx_ends: u64,
    /// [`SenderEvent::Completed`] emitted.
    pub completions: u64,
    /// Of those, [`CompletionOutcome::GaveUp`].
    pub completions_given_up: u64,
    /// RETX_REJ queued.
    pub rejects: u64,
    /// Products released because every interested receiver finished.
    pub released_all_done: u64,
    /// Products released at their deadline.
    pub released_deadline: u64,
    /// Products released early by the retained bound.
    pub released_evicted: u64,
    /// Products released because their bytes could not be read.
    pub released_data_unavailable: u64,
    /// Stream frames that did not parse.
    pub malformed: u64,
    /// Messages of a type a receiver must not send, or from an unknown receiver.
    pub unexpected: u64,
    /// Times a bound was hit.
    pub bound_hits: u64,
    /// Requests dropped at the hard per-receiver bound.
    pub requests_dropped: u64,
    /// RETX_EOPs sent when the multicast fell idle ([`SenderConfig::tail_probe`]).
    pub tail_probes: u64,
    /// EOPs multicast again when the multicast fell idle ([`SenderConfig::tail_probe`]).
    pub tail_eops_multicast: u64,
    /// PARITY_REQ received.
    pub parity_requests: u64,
    /// Shards asked for that no shard index was left to give (the receiver falls back to
    /// RETX_REQ).
    pub parity_shortfall: u64,
    /// Parity shards multicast.
    pub parity_datagrams: u64,
    /// Parity bytes multicast (FMTP header + shard; not in `multicast_bytes`).
    pub parity_bytes: u64,
    /// Groups whose parity was computed.
    pub parity_groups_coded: u64,
    /// Runs of small products whose parity was computed (docs/parity.md "Runs").
    pub parity_runs_coded: u64,
}

/// The FMTP sender. See the crate documentation for the polling order.
#[derive(Debug)]
pub struct Sender {
    config: SenderConfig,
    wall_clock: WallClock,
    now: Instant,
    /// Key of the next product: keys count products from 0; index = first_index + key.
    next_key: u64,
    products: BTreeMap<u64, SentProduct>,
    /// Keys of products not yet fully multicast, oldest first; the front is being sent.
    multicast_queue: VecDeque<u64>,
    stage: Stage,
    retained_count: usize,
    deadlines: BTreeSet<(Instant, u64)>,
    /// Hashed (with a fixed seed: runs stay reproducible), since every stream message looks its
    /// receiver up; where order matters, `ids` gives it.
    receivers: HashMap<ReceiverId, ReceiverState, FixedState>,
    /// The ids of `receivers`, in order.
    ids: Vec<ReceiverId>,
    /// The receivers that are writable and have repair work queued (kept with `receivers`: a
    /// scan of every receiver for each repair was most of a 570-receiver simulation's time).
    ready: BTreeSet<ReceiverId>,
    /// The receiver served last (round-robin cursor).
    last_served: Option<ReceiverId>,
    multicast_bucket: Option<TokenBucket>,
    retx_bucket: Option<TokenBucket>,
    events: VecDeque<SenderEvent>,
    counters: SenderCounters,
    retained_bound_hit: bool,
    /// When to probe the receivers that have not finished the last product multicast, and that
    /// product's key ([`SenderConfig::tail_probe`]).
    tail_probe: Option<(Instant, u64)>,
    /// The probes of that product so far, and the wait before the last.
    tail_probes: (u8, Duration),
    /// A product index whose EOP is to be multicast again (a tail probe), before new data.
    repeated_eop: Option<ProductIndex>,
    /// Parity shards to multicast before new data: product key, group, shard.
    parity_queue: VecDeque<(u64, u16, u8)>,
    /// Codes the groups repaired by parity (its working space kept from one to the next).
    parity_encoder: ParityEncoder,
    /// Runs of small products coded together, by their first product's key, while one of
    /// their products is retained (`runs`).
    runs: BTreeMap<u64, Run>,
    /// The run small products join now.
    open_run: Option<u64>,
}

impl Sender {
    /// A sender that has sent nothing and knows no receiver. `now` starts the pacing buckets
    /// (full).
    pub fn new(config: SenderConfig, now: Instant) -> Result<Self, ConfigError> {
        for pacing in [&config.multicast_pacing, &config.retx_pacing].into_iter().flatten() {
            pacing.validate().map_err(ConfigError)?;
        }
        if config.queued_products_max == 0 || config.retained_products_max == 0 || config.retx_backlog_items_max == 0 {
            return Err(ConfigError(
                "queued_products_max, retained_products_max and retx_backlog_items_max must be at least 1".into(),
            ));
        }
        if !(1..=BLOCK_LEN).contains(&config.block_len) {
            return Err(ConfigError(format!("block_len {} must be 1 to {BLOCK_LEN} bytes", config.block_len)));
        }
        if let Some(parity) = &config.parity {
            parity.validate()?;
            if parity.block_len != config.block_len {
                return Err(ConfigError(format!(
                    "parity block length {} differs from the block length {}",
                    parity.block_len, config.block_len
                )));
            }
        }
        if let DeadlinePolicy::Proportional { f_snd, .. } = config.deadline
            && !(f_snd.is_finite() && f_snd >= 0.0)
        {
            return Err(ConfigError(format!("deadline factor f_snd = {f_snd} must be a finite number ≥ 0")));
        }
        Ok(Self {
            multicast_bucket: config.multicast_pacing.as_ref().map(|p| TokenBucket::new(p, now)),
            retx_bucket: config.retx_pacing.as_ref().map(|p| TokenBucket::new(p, now)),
            config,
            wall_clock: WallClock::default(),
            now,
            next_key: 0,
            products: BTreeMap::new(),
            multicast_queue: VecDeque::new(),
            stage: Stage::Bop,
            retained_count: 0,
            deadlines: BTreeSet::new(),
            receivers: HashMap::default(),
            ids: Vec::new(),
            ready: BTreeSet::new(),
            last_served: None,
            events: VecDeque::new(),
            counters: SenderCounters::default(),
            retained_bound_hit: false,
            tail_probe: None,
            tail_probes: (0, Duration::ZERO),
            repeated_eop: None,
            parity_queue: VecDeque::new(),
            parity_encoder: ParityEncoder::default(),
            runs: BTreeMap::new(),
            open_run: None,
        })
    }
}

/// Appends a header-only or BOP message.
fn emit_control(buf: &mut Vec<u8>, index: ProductIndex, body: Body<'_>) {
    Message { index, body }.emit_to_vec(buf).expect("metadata length is checked at enqueue");
}

/// Appends a data message, reading the block straight from the product into the buffer.
fn emit_block(
    buf: &mut Vec<u8>,
    product: &SentProduct,
    message_type: MessageType,
    offset: u32,
    len: usize,
) -> Result<(), DataUnavailable> {
    let start = buf.len();
    buf.resize(start + HEADER_LEN + len, 0);
    let mut packet = Packet::new_unchecked(&mut buf[start..]);
    packet.set_index(product.index);
    packet.set_seqnum(offset);
    // len ≤ block_len ≤ BLOCK_LEN.
    packet.set_payload_len(len as u16);
    packet.set_flags(message_type.flags());
    product.data.read_at(u64::from(offset), &mut buf[start + HEADER_LEN..])
}

struct SentProduct {
    index: ProductIndex,
    data: Box<dyn ProductData>,
    metadata: Vec<u8>,
    start_time: WallTime,
    size: u32,
    /// Set when the EOP was multicast: the retransmission deadline.
    deadline: Option<Instant>,
    /// The bytes could not be read during multicast.
    failed: bool,
    /// Receivers that hold the product (pending until RETX_END), and the repair rounds of
    /// those that asked for repairs of it.
    interest: InterestSet,
    /// Parity of the groups asked for ([`SenderConfig::parity`]).
    parity: BTreeMap<u16, ParityGroup>,
    /// The run it was coded in, by its first product's key (`runs`).
    run: Option<u64>,
}

impl SentProduct {
    fn bop(&self) -> Bop<'_> {
        Bop { start_time: self.start_time, product_size: self.size, metadata: &self.metadata }
    }

    /// Receiver `id` asked for repairs at `now`: it holds the product until it finishes (or the
    /// deadline), even if it connected after the BOP, and the request counts in its rounds.
    fn asked_by(&mut self, id: ReceiverId, now: Instant, round: Duration) {
        self.interest.hold(id).request(now, round);
    }
}

impl fmt::Debug for SentProduct {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentProduct")
            .field("index", &self.index)
            .field("size", &self.size)
            .field("deadline", &self.deadline)
            .field("interest", &self.interest)
            .finish_non_exhaustive()
    }
}

/// Where the multicast of the front product stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Bop,
    Data(u32),
    Eop,
}

#[derive(Debug)]
struct ReceiverState {
    work: VecDeque<Work>,
    /// How many items of `work` each product has (so that a release purges only the queues
    /// that hold work for it).
    work_per_key: HashMap<u64, u32, FixedState>,
    /// Product bytes in queued `Data` work.
    backlog_bytes: u64,
    rtt: Duration,
    writable: bool,
    bytes_bound_hit: bool,
    items_bound_hit: bool,
}

impl ReceiverState {
    fn new() -> Self {
        Self {
            work: VecDeque::new(),
            work_per_key: HashMap::default(),
            backlog_bytes: 0,
            rtt: Duration::ZERO,
            writable: true,
            bytes_bound_hit: false,
            items_bound_hit: false,
        }
    }

    /// Whether `kind` for `key` would be absorbed by the last queued item.
    fn merges(&self, key: u64, kind: &WorkKind) -> bool {
        match (self.work.back(), kind) {
            (Some(Work { key: k, kind: WorkKind::Data { next, end }, .. }), WorkKind::Data { next: start, .. }) => {
                *k == key && *start >= *next && *start <= *end
            }
            _ => false,
        }
    }

    /// Queues work, merging a data range that continues or overlaps the last queued range of
    /// the same product (the reference receiver asks block by block).
    fn push(&mut self, work: Work) {
        if let (Some(last), WorkKind::Data { next: start, end }) = (self.work.back_mut(), work.kind)
            && let (true, WorkKind::Data { next: last_next, end: last_end }) = (last.key == work.key, &mut last.kind)
            && start >= *last_next
            && start <= *last_end
        {
            last.lost &= work.lost;
            if end > *last_end {
                self.backlog_bytes += u64::from(end - *last_end);
                *last_end = end;
            }
            return;
        }
        if let WorkKind::Data { next, end } = work.kind {
            self.backlog_bytes += u64::from(end - next);
        }
        *self.work_per_key.entry(work.key).or_insert(0) += 1;
        self.work.push_back(work);
    }

    fn pop_front(&mut self) {
        let Some(work) = self.work.pop_front() else { return };
        if let WorkKind::Data { next, end } = work.kind {
            self.backlog_bytes -= u64::from(end - next);
        }
        if let Some(count) = self.work_per_key.get_mut(&work.key) {
            *count -= 1;
            if *count == 0 {
                self.work_per_key.remove(&work.key);
            }
        }
    }

    /// Drops queued work for a product; returns whether anything was dropped.
    fn purge(&mut self, key: u64) -> bool {
        if self.work_per_key.remove(&key).is_none() {
            return false;
        }
        let before = self.work.len();
        let mut freed = 0;
        self.work.retain(|w| {
            let keep = w.key != key;
            if let (false, WorkKind::Data { next, end }) = (keep, w.kind) {
                freed += u64::from(end - next);
            }
            keep
        });
        self.backlog_bytes -= freed;
        self.work.len() != before
    }
}

#[derive(Clone, Copy, Debug)]
struct Work {
    /// The product's key (`u64::MAX` for a reject of an unknown product).
    key: u64,
    index: ProductIndex,
    kind: WorkKind,
    /// A repair of what the receiver lost (a BOP, or bytes multicast before it asked): it
    /// cannot have the product before this is sent ([`CompletionOutcome`]).
    lost: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WorkKind {
    /// RETX_DATA blocks for `[next, end)`; `next` is block-aligned.
    Data {
        next: u32,
        end: u32,
    },
    Bop,
    Eop,
    Reject,
}

/// Keeps `ready` (receivers writable with repair work queued) in step with `receiver`.
fn sync_ready(ready: &mut BTreeSet<ReceiverId>, id: ReceiverId, receiver: &ReceiverState) {
    if receiver.writable && !receiver.work.is_empty() {
        ready.insert(id);
    } else {
        ready.remove(&id);
    }
}
