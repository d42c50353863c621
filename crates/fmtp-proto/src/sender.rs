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

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::ops::Bound::{Excluded, Unbounded};
use std::sync::Arc;
use std::time::Duration;

use foldhash::fast::FixedState;

use crate::ConfigError;
use crate::index::ProductIndex;
use crate::pacing::{Pacing, TokenBucket};
use crate::parity::{ParityConfig, ParityEncoder};
use crate::time::{Instant, WallClock, WallTime, transmission_time};
use crate::wire::{self, BLOCK_LEN, Body, Bop, HEADER_LEN, METADATA_LEN_MAX, Message, MessageType, Packet};

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
pub struct Product {
    data: Box<dyn ProductData>,
    metadata: Vec<u8>,
}

impl Product {
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

impl fmt::Debug for Product {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Product").field("size", &self.size()).field("metadata_len", &self.metadata.len()).finish()
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
    pub product: Product,
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

/// The shortest time a parity shard counts as on its way to a receiver after it was multicast
/// ([`SenderConfig::parity`]).
const PARITY_IN_FLIGHT_MIN: Duration = Duration::from_millis(20);

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
        if let DeadlinePolicy::Proportional { f_snd, .. } = config.deadline {
            if !(f_snd.is_finite() && f_snd >= 0.0) {
                return Err(ConfigError(format!("deadline factor f_snd = {f_snd} must be a finite number ≥ 0")));
            }
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
        })
    }

    /// Changes the path rate from `now` on (a path service changed the feed's rate): multicast
    /// and repair pacing, and the retransmission deadlines of products multicast from now on.
    /// Refused without pacing or for a rate of 0.
    pub fn set_rate(&mut self, now: Instant, rate_bits_per_s: u64) -> Result<(), ConfigError> {
        if rate_bits_per_s == 0 {
            return Err(ConfigError("a rate of 0 bits/s: give a positive rate".into()));
        }
        if self.multicast_bucket.is_none() && self.retx_bucket.is_none() {
            return Err(ConfigError("the sender is not paced: there is no rate to change".into()));
        }
        self.now = self.now.max(now);
        for (pacing, bucket) in [
            (&mut self.config.multicast_pacing, &mut self.multicast_bucket),
            (&mut self.config.retx_pacing, &mut self.retx_bucket),
        ] {
            if let (Some(pacing), Some(bucket)) = (pacing.as_mut(), bucket.as_mut()) {
                pacing.rate_bits_per_s = rate_bits_per_s;
                bucket.set_rate(self.now, rate_bits_per_s);
            }
        }
        Ok(())
    }

    /// Anchors wall-clock time (BOP start times) to the monotonic clock: `wall` was read at
    /// `now`. Call at start and now and then (the default maps `Instant::ZERO` to the epoch).
    pub fn set_wall_clock(&mut self, now: Instant, wall: WallTime) {
        self.wall_clock = WallClock { instant: now, wall };
    }

    /// Accepts a product for multicast and returns its index. The BOP start time is the wall
    /// time at `now`.
    pub fn enqueue(&mut self, now: Instant, product: Product) -> Result<ProductIndex, EnqueueError> {
        self.advance(now);
        let refuse = |reason, product| Err(EnqueueError { reason, product });
        if product.metadata.len() > METADATA_LEN_MAX {
            return refuse(EnqueueRefusal::MetadataTooLong(product.metadata.len()), product);
        }
        let Ok(size) = u32::try_from(product.size()) else {
            return refuse(EnqueueRefusal::ProductTooLarge(product.size()), product);
        };
        if !self.config.multicast_without_receivers && self.receivers.is_empty() {
            self.counters.products_skipped_no_receivers += 1;
            return refuse(EnqueueRefusal::NoReceivers, product);
        }
        if self.multicast_queue.len() >= self.config.queued_products_max {
            self.counters.products_refused_queue_full += 1;
            return refuse(EnqueueRefusal::QueueFull, product);
        }
        let key = self.next_key;
        self.next_key += 1;
        let index = self.index_of(key);
        let start_time = self.wall_clock.wall_at(self.now);
        let Product { data, metadata } = product;
        self.products.insert(
            key,
            SentProduct {
                index,
                data,
                metadata,
                start_time,
                size,
                deadline: None,
                failed: false,
                interest: InterestSet::default(),
                parity: BTreeMap::new(),
            },
        );
        self.multicast_queue.push_back(key);
        self.counters.products_enqueued += 1;
        Ok(index)
    }

    /// A receiver's retransmission connection is up (after the driver's key exchange and
    /// authorization). It joins the interest set of every product multicast from now on.
    pub fn receiver_connected(&mut self, now: Instant, id: ReceiverId) {
        self.advance(now);
        if let std::collections::hash_map::Entry::Vacant(entry) = self.receivers.entry(id) {
            entry.insert(ReceiverState::new());
            if let Err(at) = self.ids.binary_search(&id) {
                self.ids.insert(at, id);
            }
        }
    }

    /// A receiver's connection is gone: its queued repairs are dropped and it no longer holds
    /// any product back.
    pub fn receiver_disconnected(&mut self, now: Instant, id: ReceiverId) {
        self.advance(now);
        self.ready.remove(&id);
        if self.receivers.remove(&id).is_none() {
            return;
        }
        if let Ok(at) = self.ids.binary_search(&id) {
            self.ids.remove(at);
        }
        let keys: Vec<u64> =
            self.products.iter_mut().filter_map(|(key, product)| product.interest.remove(id).map(|_| *key)).collect();
        for key in keys {
            self.release_if_done(key);
        }
    }

    /// The round-trip time measured to a receiver (used by [`DeadlinePolicy::Proportional`]).
    pub fn set_rtt(&mut self, id: ReceiverId, rtt: Duration) {
        if let Some(receiver) = self.receivers.get_mut(&id) {
            receiver.rtt = rtt;
        }
    }

    /// Whether the driver can take repair messages for a receiver now. A driver whose socket
    /// buffer to that receiver is full sets `false`; the sender then serves the others.
    pub fn set_writable(&mut self, id: ReceiverId, writable: bool) {
        if let Some(receiver) = self.receivers.get_mut(&id) {
            receiver.writable = writable;
            sync_ready(&mut self.ready, id, receiver);
        }
    }

    /// Whether the sender wants more requests from this receiver now (its repair backlog is
    /// under the bounds). A driver that stops reading the connection while this is false gets
    /// TCP backpressure instead of dropped requests.
    pub fn accepts_stream(&self, id: ReceiverId) -> bool {
        self.receivers.get(&id).is_some_and(|r| !self.over_soft_bound(r))
    }

    /// Handles one message received on a receiver's connection (RETX_REQ, BOP_REQ, EOP_REQ,
    /// RETX_END; anything else is counted as unexpected).
    pub fn handle_stream(&mut self, now: Instant, id: ReceiverId, message: &Message<'_>) {
        self.advance(now);
        if !self.receivers.contains_key(&id) {
            self.counters.unexpected += 1;
            return;
        }
        let key = self.key_of(message.index);
        match message.body {
            Body::RetxReq { offset, len } => {
                self.counters.retx_requests += 1;
                let range = key.and_then(|key| self.products.get(&key)).map(|product| {
                    // §3.8: start rounded down to a block; end = min(size, start + len).
                    let block = self.config.block_len as u64;
                    let start = u64::from(offset) / block * block;
                    (start, u64::from(product.size).min(u64::from(offset) + u64::from(len)))
                });
                match (key, range) {
                    (Some(key), Some((start, end))) if start < end && len > 0 => {
                        // Both ≤ size ≤ u32::MAX.
                        let kind = WorkKind::Data { next: start as u32, end: end as u32 };
                        self.queue_request(id, key, message.index, kind);
                    }
                    (_, Some(_)) => self.counters.retx_requests_empty += 1,
                    _ => self.queue_reject(id, message.index),
                }
            }
            Body::BopReq => {
                self.counters.bop_requests += 1;
                match key {
                    Some(key) => self.queue_request(id, key, message.index, WorkKind::Bop),
                    None => self.queue_reject(id, message.index),
                }
            }
            Body::EopReq => {
                self.counters.eop_requests += 1;
                match key {
                    Some(key) => self.queue_request(id, key, message.index, WorkKind::Eop),
                    None => self.queue_reject(id, message.index),
                }
            }
            Body::ParityReq { group, need, from } => {
                self.counters.parity_requests += 1;
                match (key, self.config.parity) {
                    (Some(key), Some(parity)) => self.queue_parity(id, key, group, need, from, &parity),
                    (None, _) => self.queue_reject(id, message.index),
                    (Some(_), None) => self.counters.unexpected += 1,
                }
            }
            Body::RetxEnd => {
                self.counters.retx_ends += 1;
                if let Some(key) = key {
                    self.complete(id, key);
                    if let Some(receiver) = self.receivers.get_mut(&id) {
                        if receiver.purge(key) {
                            sync_ready(&mut self.ready, id, receiver);
                        }
                    }
                    self.release_if_done(key);
                }
            }
            _ => self.counters.unexpected += 1,
        }
    }

    /// Parses one stream frame (from [`wire::split_frame`]) and handles it; a frame that does
    /// not parse is counted and returned as an error (the connection may be closed).
    pub fn handle_stream_frame(&mut self, now: Instant, id: ReceiverId, frame: &[u8]) -> Result<(), wire::Error> {
        match Message::parse(frame) {
            Ok(message) => {
                self.handle_stream(now, id, &message);
                Ok(())
            }
            Err(error) => {
                self.counters.malformed += 1;
                Err(error)
            }
        }
    }

    /// Processes deadlines due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.advance(now);
    }

    /// Appends the next message to send to `buf` and says where it goes, or returns `None`
    /// when nothing may be sent before [`Sender::poll_timeout`]. Repairs come before multicast
    /// when both budgets allow (each has its own token bucket).
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<Transmit> {
        self.advance(now);
        if let Some(bucket) = &mut self.retx_bucket {
            bucket.refill(self.now);
        }
        if let Some(bucket) = &mut self.multicast_bucket {
            bucket.refill(self.now);
        }
        if let Some(id) = self.next_receiver_to_serve() {
            let cost = self.head_cost(id);
            if self.retx_bucket.as_ref().is_none_or(|bucket| bucket.allows(cost)) {
                return Some(self.transmit_repair(id, buf));
            }
        }
        let cost = self.next_multicast_len()?;
        if self.multicast_bucket.as_ref().is_none_or(|bucket| bucket.allows(cost)) {
            return self.transmit_multicast(buf);
        }
        None
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<SenderEvent> {
        self.events.pop_front()
    }

    /// When to call [`Sender::handle_timeout`] and [`Sender::poll_transmit`] next: the
    /// earliest deadline or the instant pacing allows the next message. A time at or before the
    /// last `now` means "at once"; `None` means nothing is pending.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let deadline = self.deadlines.first().map(|(at, _)| *at);
        let multicast = self.next_multicast_len().map(|len| match &self.multicast_bucket {
            Some(bucket) => bucket.ready_at(len),
            None => self.now,
        });
        let repair = self.next_receiver_to_serve().map(|id| {
            let cost = self.head_cost(id);
            match &self.retx_bucket {
                Some(bucket) => bucket.ready_at(cost),
                None => self.now,
            }
        });
        let probe = self.tail_probe.map(|(at, _)| at);
        [deadline, multicast, repair, probe].into_iter().flatten().min()
    }

    /// The counters.
    pub fn counters(&self) -> &SenderCounters {
        &self.counters
    }

    /// The index the next enqueued product gets.
    pub fn next_index(&self) -> ProductIndex {
        self.index_of(self.next_key)
    }

    /// Products enqueued and not yet fully multicast.
    pub fn queued_products(&self) -> usize {
        self.multicast_queue.len()
    }

    /// Products multicast and still retained for repairs.
    pub fn retained_products(&self) -> usize {
        self.retained_count
    }

    /// Connected receivers.
    pub fn receiver_count(&self) -> usize {
        self.receivers.len()
    }

    /// Product bytes queued for retransmission to a receiver.
    pub fn retx_backlog_bytes(&self, id: ReceiverId) -> u64 {
        self.receivers.get(&id).map_or(0, |r| r.backlog_bytes)
    }

    /// Whether nothing is queued: no product waits to be multicast, no repair is queued and no
    /// tail probe is due.
    pub fn is_idle(&self) -> bool {
        self.multicast_queue.is_empty()
            && self.parity_queue.is_empty()
            && self.receivers.values().all(|r| r.work.is_empty())
            && self.tail_probe.is_none()
            && self.repeated_eop.is_none()
    }

    // ---------------------------------------------------------------------------------------
    // Helpers.

    fn index_of(&self, key: u64) -> ProductIndex {
        // Indexes wrap: the low 32 bits of the key count.
        self.config.first_index.wrapping_add(key as u32)
    }

    /// The key of a retained product with this index (serial arithmetic against the newest).
    fn key_of(&self, index: ProductIndex) -> Option<u64> {
        let newest_key = self.next_key.checked_sub(1)?;
        let difference = index.serial_difference(self.index_of(newest_key))?;
        let key = i128::from(newest_key) + i128::from(difference);
        let key = u64::try_from(key).ok()?;
        self.products.contains_key(&key).then_some(key)
    }

    /// Moves time forward and releases products whose deadline passed.
    fn advance(&mut self, now: Instant) {
        self.now = self.now.max(now);
        while let Some(&(at, key)) = self.deadlines.first() {
            if at > self.now {
                break;
            }
            self.release(key, ReleaseReason::DeadlinePassed);
        }
        if let Some((at, key)) = self.tail_probe {
            if at <= self.now {
                self.tail_probe = None;
                // A product waiting to be multicast will reveal the gap itself.
                if self.multicast_queue.is_empty() {
                    self.probe_tail(key);
                }
            }
        }
    }

    /// RETX_EOP of the last product multicast to every receiver that has not finished it, and
    /// its EOP multicast again; the next probe, while one has not finished it.
    fn probe_tail(&mut self, key: u64) {
        let Some(product) = self.products.get(&key) else { return };
        let index = product.index;
        if !product.interest.any_pending() {
            return;
        }
        if self.repeated_eop.is_none() {
            self.repeated_eop = Some(index);
        }
        let (probes, wait) = self.tail_probes;
        if probes < TAIL_PROBES_MAX {
            self.tail_probes = (probes + 1, wait * 2);
            if probes + 1 < TAIL_PROBES_MAX {
                self.tail_probe = Some((self.now + wait * 2, key));
            }
        }
        for (id, receiver) in &mut self.receivers {
            if product.interest.get(*id) != Some(Interest::Pending)
                || receiver.work.iter().any(|work| work.key == key && matches!(work.kind, WorkKind::Eop))
            {
                continue;
            }
            receiver.push(Work { key, index, kind: WorkKind::Eop, lost: false });
            sync_ready(&mut self.ready, *id, receiver);
            self.counters.tail_probes += 1;
        }
    }

    fn deadline_for(&self, size: u32) -> Duration {
        match self.config.deadline {
            DeadlinePolicy::Constant(duration) => duration,
            DeadlinePolicy::Proportional { f_snd, min } => {
                let transfer = self
                    .config
                    .multicast_pacing
                    .map_or(Duration::ZERO, |p| transmission_time(u64::from(size), p.rate_bits_per_s));
                let scaled = Duration::try_from_secs_f64(transfer.as_secs_f64() * f_snd).unwrap_or(Duration::MAX);
                let rtt_max = self.receivers.values().map(|r| r.rtt).max().unwrap_or(Duration::ZERO);
                scaled.max(rtt_max).max(min)
            }
        }
    }

    fn over_soft_bound(&self, receiver: &ReceiverState) -> bool {
        receiver.backlog_bytes >= self.config.retx_backlog_bytes_max
            || receiver.work.len() >= self.config.retx_backlog_items_max
    }

    fn queue_request(&mut self, id: ReceiverId, key: u64, index: ProductIndex, kind: WorkKind) {
        // Asked for bytes the multicast had sent already: the receiver lost them.
        let lost = match kind {
            WorkKind::Data { end, .. } => end <= self.multicast_progress(key),
            WorkKind::Bop => true,
            WorkKind::Eop | WorkKind::Reject => false,
        };
        let items_max = self.config.retx_backlog_items_max;
        let bytes_max = self.config.retx_backlog_bytes_max;
        let Some(receiver) = self.receivers.get_mut(&id) else { return };
        if receiver.work.len() >= items_max && !receiver.merges(key, &kind) {
            self.counters.requests_dropped += 1;
            if !receiver.items_bound_hit {
                receiver.items_bound_hit = true;
                self.counters.bound_hits += 1;
                self.events
                    .push_back(SenderEvent::BoundHit { bound: SenderBound::RetxBacklogItems, receiver: Some(id) });
            }
            return;
        }
        receiver.push(Work { key, index, kind, lost });
        sync_ready(&mut self.ready, id, receiver);
        if receiver.backlog_bytes >= bytes_max && !receiver.bytes_bound_hit {
            receiver.bytes_bound_hit = true;
            self.counters.bound_hits += 1;
            self.events.push_back(SenderEvent::BoundHit { bound: SenderBound::RetxBacklogBytes, receiver: Some(id) });
        }
        let round = receiver.rtt.max(REPAIR_ROUND_MIN);
        if let Some(product) = self.products.get_mut(&key) {
            product.asked_by(id, self.now, round);
        }
    }

    /// Bytes of a product the multicast has sent so far.
    fn multicast_progress(&self, key: u64) -> u32 {
        let Some(product) = self.products.get(&key) else { return 0 };
        Self::progress_of(product, key, &self.multicast_queue, self.stage)
    }

    /// [`Sender::multicast_progress`] of `product` (key `key`).
    fn progress_of(product: &SentProduct, key: u64, multicast_queue: &VecDeque<u64>, stage: Stage) -> u32 {
        if product.deadline.is_some() {
            return product.size;
        }
        match (multicast_queue.front() == Some(&key), stage) {
            (true, Stage::Data(offset)) => offset,
            (true, Stage::Eop) => product.size,
            _ => 0,
        }
    }

    /// A receiver's RETX_END for a retained product: marks it done and, the first time, emits
    /// [`SenderEvent::Completed`].
    fn complete(&mut self, id: ReceiverId, key: u64) {
        // One lookup of each (a RETX_END comes from every receiver for every product).
        let Some(product) = self.products.get_mut(&key) else { return };
        let multicast_ended = Self::progress_of(product, key, &self.multicast_queue, self.stage) >= product.size;
        let Some(receiver) = self.receivers.get(&id) else { return };
        let awaits_repairs =
            receiver.work_per_key.contains_key(&key) && receiver.work.iter().any(|w| w.key == key && w.lost);
        let rtt = receiver.rtt;
        if product.interest.finish(id) == Some(Interest::Done) {
            return;
        }
        let outcome =
            if multicast_ended && !awaits_repairs { CompletionOutcome::Whole } else { CompletionOutcome::GaveUp };
        let repair_rounds = product.interest.take_rounds(id);
        self.counters.completions += 1;
        if outcome == CompletionOutcome::GaveUp {
            self.counters.completions_given_up += 1;
        }
        self.events.push_back(SenderEvent::Completed(Completion {
            index: product.index,
            receiver: id,
            at: self.now,
            size: product.size,
            rtt,
            repair_rounds,
            outcome,
        }));
    }

    fn queue_reject(&mut self, id: ReceiverId, index: ProductIndex) {
        if let Some(receiver) = self.receivers.get_mut(&id) {
            self.counters.rejects += 1;
            receiver.push(Work { key: u64::MAX, index, kind: WorkKind::Reject, lost: false });
            sync_ready(&mut self.ready, id, receiver);
        }
    }

    /// The next writable receiver with queued work after the round-robin cursor.
    fn next_receiver_to_serve(&self) -> Option<ReceiverId> {
        match self.last_served {
            Some(last) => self
                .ready
                .range((Excluded(last), Unbounded))
                .next()
                .or_else(|| self.ready.range(..=last).next())
                .copied(),
            None => self.ready.first().copied(),
        }
    }

    fn head_cost(&self, id: ReceiverId) -> usize {
        let Some(work) = self.receivers.get(&id).and_then(|r| r.work.front()) else { return HEADER_LEN };
        match work.kind {
            WorkKind::Data { next, end } => HEADER_LEN + self.config.block_len.min((end - next) as usize),
            WorkKind::Bop => HEADER_LEN + self.products.get(&work.key).map_or(0, |p| 18 + p.metadata.len()),
            WorkKind::Eop | WorkKind::Reject => HEADER_LEN,
        }
    }

    fn transmit_repair(&mut self, id: ReceiverId, buf: &mut Vec<u8>) -> Transmit {
        self.last_served = Some(id);
        let start = buf.len();
        let block_len = self.config.block_len;
        let receiver = self.receivers.get_mut(&id).expect("next_receiver_to_serve returned a known receiver");
        let work = receiver.work.front_mut().expect("next_receiver_to_serve returned a receiver with work");
        let product = self.products.get(&work.key);
        let (message_type, finished, unavailable) = match (&mut work.kind, product) {
            (WorkKind::Data { next, end }, Some(product)) => {
                let len = block_len.min((*end - *next) as usize);
                match emit_block(buf, product, MessageType::RetxData, *next, len) {
                    Ok(()) => {
                        *next += len as u32;
                        receiver.backlog_bytes -= len as u64;
                        (MessageType::RetxData, *next >= *end, false)
                    }
                    Err(DataUnavailable) => {
                        buf.truncate(start);
                        emit_control(buf, work.index, Body::RetxRej);
                        (MessageType::RetxRej, true, true)
                    }
                }
            }
            (WorkKind::Bop, Some(product)) => {
                emit_control(buf, work.index, Body::RetxBop(product.bop()));
                (MessageType::RetxBop, true, false)
            }
            (WorkKind::Eop, _) => {
                emit_control(buf, work.index, Body::RetxEop);
                (MessageType::RetxEop, true, false)
            }
            // A reject, or a product that is no longer retained (its work was purged at
            // release, so this is defensive).
            _ => {
                emit_control(buf, work.index, Body::RetxRej);
                (MessageType::RetxRej, true, false)
            }
        };
        let key = work.key;
        if finished {
            receiver.pop_front();
            sync_ready(&mut self.ready, id, receiver);
        }
        if !self.over_soft_bound(self.receivers.get(&id).expect("receiver still present")) {
            let receiver = self.receivers.get_mut(&id).expect("receiver still present");
            receiver.bytes_bound_hit = false;
            receiver.items_bound_hit = false;
        }
        let len = buf.len() - start;
        if let Some(bucket) = &mut self.retx_bucket {
            bucket.try_take(len);
        }
        self.counters.retx_messages += 1;
        self.counters.retx_bytes += len as u64;
        if message_type == MessageType::RetxData {
            self.counters.retx_data_blocks += 1;
        }
        if unavailable {
            self.release(key, ReleaseReason::DataUnavailable);
        }
        Transmit { destination: Destination::Receiver(id), len, message_type }
    }

    fn next_multicast_len(&self) -> Option<usize> {
        if self.repeated_eop.is_some() {
            return Some(HEADER_LEN);
        }
        if !self.parity_queue.is_empty() {
            return Some(HEADER_LEN + self.config.block_len);
        }
        let product = self.products.get(self.multicast_queue.front()?)?;
        Some(match self.stage {
            Stage::Bop => HEADER_LEN + 18 + product.metadata.len(),
            Stage::Data(offset) => HEADER_LEN + self.config.block_len.min((product.size - offset) as usize),
            Stage::Eop => HEADER_LEN,
        })
    }

    fn transmit_multicast(&mut self, buf: &mut Vec<u8>) -> Option<Transmit> {
        if let Some(index) = self.repeated_eop.take() {
            let start = buf.len();
            emit_control(buf, index, Body::Eop);
            self.counters.tail_eops_multicast += 1;
            return Some(self.multicast_sent(buf.len() - start, MessageType::Eop));
        }
        while let Some((key, group, shard)) = self.parity_queue.pop_front() {
            if let Some(transmit) = self.transmit_parity(buf, key, group, shard) {
                return Some(transmit);
            }
        }
        let key = *self.multicast_queue.front()?;
        let start = buf.len();
        let product = self.products.get_mut(&key)?;
        let message_type = match self.stage {
            Stage::Bop => {
                // §3.8: the product's receiver set is the receivers connected now.
                product.interest = InterestSet::all_pending(self.ids.iter().copied());
                emit_control(buf, product.index, Body::Bop(product.bop()));
                self.stage = if product.size == 0 { Stage::Eop } else { Stage::Data(0) };
                MessageType::Bop
            }
            Stage::Data(offset) => {
                let len = self.config.block_len.min((product.size - offset) as usize);
                match emit_block(buf, product, MessageType::MemData, offset, len) {
                    Ok(()) => {
                        let next = offset + len as u32;
                        self.stage = if next >= product.size { Stage::Eop } else { Stage::Data(next) };
                        MessageType::MemData
                    }
                    Err(DataUnavailable) => {
                        // End the product now: receivers will ask for the rest and be rejected.
                        buf.truncate(start);
                        product.failed = true;
                        emit_control(buf, product.index, Body::Eop);
                        self.finish_multicast(key);
                        MessageType::Eop
                    }
                }
            }
            Stage::Eop => {
                emit_control(buf, product.index, Body::Eop);
                self.finish_multicast(key);
                MessageType::Eop
            }
        };
        Some(self.multicast_sent(buf.len() - start, message_type))
    }

    /// Accounts a multicast datagram of `len` bytes (pacing, counters).
    fn multicast_sent(&mut self, len: usize, message_type: MessageType) -> Transmit {
        if let Some(bucket) = &mut self.multicast_bucket {
            bucket.try_take(len);
        }
        self.counters.multicast_datagrams += 1;
        self.counters.multicast_bytes += len as u64;
        Transmit { destination: Destination::Multicast, len, message_type }
    }

    /// Queues parity shards of a group for a receiver that needs `need` more of index `from` or
    /// above: as many as are not already on their way to it (queued, or multicast less than
    /// its round-trip time ago), shards never multicast first (they serve every receiver),
    /// then shards multicast long enough ago that this receiver lost them.
    fn queue_parity(&mut self, id: ReceiverId, key: u64, group: u16, need: u16, from: u16, parity: &ParityConfig) {
        let now = self.now;
        let Some(receiver) = self.receivers.get(&id) else { return };
        let round = receiver.rtt.max(REPAIR_ROUND_MIN);
        // A shard multicast less than this long ago may not have reached the receiver when it
        // asked: a round trip and a quarter more for queueing, and at least the time a busy
        // host may take to hand a datagram to the receiver (a receiver asks again after at
        // least `PARITY_RETRY_MIN`, longer).
        let on_its_way = (round + round / 4).max(PARITY_IN_FLIGHT_MIN);
        let Some(product) = self.products.get_mut(&key) else { return };
        if u64::from(group) >= parity.groups(u64::from(product.size)) || need == 0 {
            self.counters.retx_requests_empty += 1;
            return;
        }
        product.asked_by(id, now, round);
        let shards = parity.shards as usize;
        let state = product.parity.entry(group).or_insert_with(|| ParityGroup::new(shards));
        let from = usize::from(from).min(shards);
        let on_the_way = state.sent[from..]
            .iter()
            .filter(|sent| match sent {
                ShardState::Queued => true,
                ShardState::Sent(at) => now < *at + on_its_way,
                ShardState::Unsent => false,
            })
            .count();
        let mut want = usize::from(need).saturating_sub(on_the_way);
        let fresh = (from..shards).filter(|&j| state.sent[j] == ShardState::Unsent);
        let stale = (from..shards).filter(|&j| matches!(state.sent[j], ShardState::Sent(at) if now >= at + on_its_way));
        let chosen: Vec<usize> = fresh.chain(stale).take(want).collect();
        want -= chosen.len();
        for j in chosen {
            state.sent[j] = ShardState::Queued;
            // j < shards ≤ 256.
            self.parity_queue.push_back((key, group, j as u8));
        }
        self.counters.parity_shortfall += want as u64;
    }

    /// Multicasts one queued parity shard (computing its group's shards the first time);
    /// `None` when its product is gone or its bytes cannot be read.
    fn transmit_parity(&mut self, buf: &mut Vec<u8>, key: u64, group: u16, shard: u8) -> Option<Transmit> {
        let parity = self.config.parity?;
        let product = self.products.get_mut(&key)?;
        let state = product.parity.get_mut(&group)?;
        if state.shards.is_empty() {
            let (start, end, _) = parity.group_range(u32::from(group), u64::from(product.size));
            let bytes = self.parity_encoder.group_buffer((end - start) as usize);
            if product.data.read_at(start, bytes).is_err() {
                self.release(key, ReleaseReason::DataUnavailable);
                return None;
            }
            state.shards =
                self.parity_encoder.encode_filled(&parity).expect("a validated configuration codes any group");
            self.counters.parity_groups_coded += 1;
        }
        state.sent[usize::from(shard)] = ShardState::Sent(self.now);
        let start = buf.len();
        let message = Message {
            index: product.index,
            body: Body::Parity {
                group,
                // log₂ of values ≤ 32768 and ≤ 256.
                group_blocks_log2: parity.group_blocks.trailing_zeros() as u8,
                shards_log2: parity.shards.trailing_zeros() as u8,
                shard,
                data: &state.shards[usize::from(shard)],
            },
        };
        message.emit_to_vec(buf).expect("a shard is at most a block");
        let len = buf.len() - start;
        if let Some(bucket) = &mut self.multicast_bucket {
            bucket.try_take(len);
        }
        self.counters.parity_datagrams += 1;
        self.counters.parity_bytes += len as u64;
        Some(Transmit { destination: Destination::Multicast, len, message_type: MessageType::Parity })
    }

    /// The EOP went out: start the deadline, and release at once if nobody is interested.
    fn finish_multicast(&mut self, key: u64) {
        self.multicast_queue.pop_front();
        self.stage = Stage::Bop;
        let Some(product) = self.products.get(&key) else { return };
        let (index, size, failed) = (product.index, product.size, product.failed);
        self.counters.products_sent += 1;
        self.events.push_back(SenderEvent::Sent { index, size });
        if failed {
            self.release(key, ReleaseReason::DataUnavailable);
            return;
        }
        let deadline = self.now + self.deadline_for(size);
        if let Some(product) = self.products.get_mut(&key) {
            product.deadline = Some(deadline);
        }
        self.deadlines.insert((deadline, key));
        self.retained_count += 1;
        self.release_if_done(key);
        let pending = self.products.get(&key).is_some_and(|p| p.interest.any_pending());
        self.tail_probe = match self.config.tail_probe {
            Some(delay) if pending && self.multicast_queue.is_empty() => {
                let rtt_max = self.receivers.values().map(|r| r.rtt).max().unwrap_or(Duration::ZERO);
                let wait = delay.max(rtt_max * 2);
                self.tail_probes = (0, wait);
                Some((self.now + wait, key))
            }
            _ => None,
        };
        while self.retained_count > self.config.retained_products_max {
            let Some(oldest) = self.products.iter().find(|(_, p)| p.deadline.is_some()).map(|(k, _)| *k) else {
                break;
            };
            if !self.retained_bound_hit {
                self.retained_bound_hit = true;
                self.counters.bound_hits += 1;
                self.events.push_back(SenderEvent::BoundHit { bound: SenderBound::RetainedProducts, receiver: None });
            }
            self.release(oldest, ReleaseReason::Evicted);
        }
        if self.retained_count < self.config.retained_products_max {
            self.retained_bound_hit = false;
        }
    }

    fn release_if_done(&mut self, key: u64) {
        let done = self.products.get(&key).is_some_and(|p| p.deadline.is_some() && !p.interest.any_pending());
        if done {
            self.release(key, ReleaseReason::AllDone);
        }
    }

    fn release(&mut self, key: u64, reason: ReleaseReason) {
        let Some(product) = self.products.remove(&key) else { return };
        if let Some(deadline) = product.deadline {
            self.deadlines.remove(&(deadline, key));
            self.retained_count -= 1;
        } else if let Some(position) = self.multicast_queue.iter().position(|k| *k == key) {
            // Released before its multicast finished (data unavailable mid-product).
            self.multicast_queue.remove(position);
            if position == 0 {
                self.stage = Stage::Bop;
            }
        }
        let unfinished: Vec<ReceiverId> = product.interest.pending().collect();
        // Only the receivers still pending and those that asked for repairs can have work queued
        // for it (work for a product is queued on a request, or as a tail probe to a pending
        // receiver, and purged at the RETX_END that ends the request's entry): the others are
        // left as they are, not visited.
        let mut concerned: Vec<ReceiverId> = unfinished.iter().copied().chain(product.interest.asking()).collect();
        concerned.sort_unstable();
        concerned.dedup();
        for id in concerned {
            let Some(receiver) = self.receivers.get_mut(&id) else { continue };
            let purged = receiver.purge(key);
            if product.interest.get(id) == Some(Interest::Pending) {
                receiver.push(Work { key, index: product.index, kind: WorkKind::Eop, lost: false });
            }
            if purged {
                self.counters.rejects += 1;
                receiver.push(Work { key, index: product.index, kind: WorkKind::Reject, lost: false });
            }
            sync_ready(&mut self.ready, id, receiver);
        }
        debug_assert!(self.receivers.values().all(|receiver| {
            !receiver.work_per_key.contains_key(&key)
                || receiver
                    .work
                    .iter()
                    .any(|work| work.key == key && matches!(work.kind, WorkKind::Eop | WorkKind::Reject))
        }));
        match reason {
            ReleaseReason::AllDone => self.counters.released_all_done += 1,
            ReleaseReason::DeadlinePassed => self.counters.released_deadline += 1,
            ReleaseReason::Evicted => self.counters.released_evicted += 1,
            ReleaseReason::DataUnavailable => self.counters.released_data_unavailable += 1,
        }
        self.events.push_back(SenderEvent::Released { index: product.index, reason, unfinished });
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
}

/// The parity of one group of a product's blocks.
struct ParityGroup {
    /// Every shard, once the first is multicast.
    shards: Vec<Vec<u8>>,
    /// Per shard index.
    sent: Vec<ShardState>,
}

impl ParityGroup {
    fn new(shards: usize) -> Self {
        Self { shards: Vec::new(), sent: vec![ShardState::Unsent; shards] }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ShardState {
    Unsent,
    Queued,
    /// Last multicast then.
    Sent(Instant),
}

/// One receiver's repair rounds for one product ([`Completion::repair_rounds`]).
#[derive(Clone, Copy, Debug)]
struct RepairRounds {
    count: u32,
    /// The first request of the round in progress.
    started: Instant,
}

impl RepairRounds {
    /// A request at `now`: a new round unless it came within `round` of the round's start.
    fn request(&mut self, now: Instant, round: Duration) {
        if self.count == 0 || now >= self.started + round {
            self.count = self.count.saturating_add(1);
            self.started = now;
        }
    }
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Interest {
    Pending,
    Done,
}

/// The receivers that hold a product, with a count of those still pending: whether all are
/// done is asked at every RETX_END, and a scan would cost N² per product for N receivers. Each
/// keeps its repair rounds of the product with it (found by the one search that finds it).
#[derive(Debug, Default)]
struct InterestSet {
    /// Sorted by id (a product's set is made from the receivers in order, and late holders are
    /// few: a vector, not a tree, for hundreds of receivers per product).
    by_receiver: Vec<Holder>,
    pending: usize,
}

/// A receiver that holds a product.
#[derive(Clone, Copy, Debug)]
struct Holder {
    id: ReceiverId,
    interest: Interest,
    /// Its repair rounds since it asked (a count of 0: it has not asked since its last
    /// RETX_END).
    rounds: RepairRounds,
}

impl Holder {
    fn new(id: ReceiverId, interest: Interest) -> Self {
        Self { id, interest, rounds: RepairRounds { count: 0, started: Instant::ZERO } }
    }
}

impl InterestSet {
    /// Every one of `ids` (in increasing order) pending.
    fn all_pending(ids: impl Iterator<Item = ReceiverId>) -> Self {
        let by_receiver: Vec<Holder> = ids.map(|id| Holder::new(id, Interest::Pending)).collect();
        debug_assert!(by_receiver.windows(2).all(|pair| pair[0].id < pair[1].id));
        Self { pending: by_receiver.len(), by_receiver }
    }

    fn find(&self, id: ReceiverId) -> Result<usize, usize> {
        // Ids are handed out in increasing order, so with none gone a receiver sits as far from
        // the first as its id is: try there before searching.
        let guess = self.by_receiver.first().and_then(|first| usize::try_from(id.0.checked_sub(first.id.0)?).ok());
        if let Some(at) = guess.filter(|&at| self.by_receiver.get(at).is_some_and(|known| known.id == id)) {
            return Ok(at);
        }
        self.by_receiver.binary_search_by_key(&id, |holder| holder.id)
    }

    fn get(&self, id: ReceiverId) -> Option<Interest> {
        self.find(id).ok().map(|at| self.by_receiver[at].interest)
    }

    /// `id` holds the product (pending) unless it is known already; its repair rounds.
    fn hold(&mut self, id: ReceiverId) -> &mut RepairRounds {
        let at = match self.find(id) {
            Ok(at) => at,
            Err(at) => {
                self.by_receiver.insert(at, Holder::new(id, Interest::Pending));
                self.pending += 1;
                at
            }
        };
        &mut self.by_receiver[at].rounds
    }

    /// `id` is done; what it was before.
    fn finish(&mut self, id: ReceiverId) -> Option<Interest> {
        match self.find(id) {
            Ok(at) => {
                let before = std::mem::replace(&mut self.by_receiver[at].interest, Interest::Done);
                if before == Interest::Pending {
                    self.pending -= 1;
                }
                Some(before)
            }
            Err(at) => {
                self.by_receiver.insert(at, Holder::new(id, Interest::Done));
                None
            }
        }
    }

    /// `id`'s repair rounds of the product, which end (its RETX_END).
    fn take_rounds(&mut self, id: ReceiverId) -> u32 {
        let Ok(at) = self.find(id) else { return 0 };
        std::mem::replace(&mut self.by_receiver[at].rounds.count, 0)
    }

    fn remove(&mut self, id: ReceiverId) -> Option<Interest> {
        let before = self.by_receiver.remove(self.find(id).ok()?).interest;
        if before == Interest::Pending {
            self.pending -= 1;
        }
        Some(before)
    }

    fn any_pending(&self) -> bool {
        self.pending > 0
    }

    /// The receivers still pending, in order.
    fn pending(&self) -> impl Iterator<Item = ReceiverId> + '_ {
        self.by_receiver.iter().filter(|holder| holder.interest == Interest::Pending).map(|holder| holder.id)
    }

    /// The receivers that asked for repairs since their last RETX_END, in order.
    fn asking(&self) -> impl Iterator<Item = ReceiverId> + '_ {
        self.by_receiver.iter().filter(|holder| holder.rounds.count > 0).map(|holder| holder.id)
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
        if let (Some(last), WorkKind::Data { next: start, end }) = (self.work.back_mut(), work.kind) {
            if let (true, WorkKind::Data { next: last_next, end: last_end }) = (last.key == work.key, &mut last.kind) {
                if start >= *last_next && start <= *last_end {
                    last.lost &= work.lost;
                    if end > *last_end {
                        self.backlog_bytes += u64::from(end - *last_end);
                        *last_end = end;
                    }
                    return;
                }
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interest_count_follows_every_change() {
        let ids = |n: u64| (0..n).map(ReceiverId);
        let mut interest = InterestSet::all_pending(ids(3));
        assert!(interest.any_pending());
        assert_eq!(interest.finish(ReceiverId(0)), Some(Interest::Pending));
        assert_eq!(interest.finish(ReceiverId(0)), Some(Interest::Done));
        // Unknown until now: done at once, nothing pending added.
        assert_eq!(interest.finish(ReceiverId(9)), None);
        interest.hold(ReceiverId(9));
        interest.hold(ReceiverId(4));
        assert_eq!(interest.remove(ReceiverId(1)), Some(Interest::Pending));
        assert_eq!(interest.remove(ReceiverId(1)), None);
        assert_eq!(interest.pending().collect::<Vec<_>>(), vec![ReceiverId(2), ReceiverId(4)]);
        interest.finish(ReceiverId(2));
        assert!(interest.any_pending());
        assert_eq!(interest.remove(ReceiverId(4)), Some(Interest::Pending));
        assert!(!interest.any_pending());
        assert_eq!(interest.get(ReceiverId(9)), Some(Interest::Done));
    }

    #[test]
    fn a_holder_keeps_its_repair_rounds_until_its_retx_end() {
        let round = Duration::from_millis(100);
        let at = |ms: u64| Instant::ZERO + Duration::from_millis(ms);
        let mut interest = InterestSet::all_pending((0..3).map(ReceiverId));
        assert_eq!(interest.asking().count(), 0);
        // Two requests within a round are one round; one after it, another. A receiver not
        // holding the product yet holds it (pending) once it asks.
        interest.hold(ReceiverId(1)).request(at(0), round);
        interest.hold(ReceiverId(1)).request(at(50), round);
        interest.hold(ReceiverId(1)).request(at(150), round);
        interest.hold(ReceiverId(7)).request(at(10), round);
        assert_eq!(interest.asking().collect::<Vec<_>>(), vec![ReceiverId(1), ReceiverId(7)]);
        assert_eq!(interest.get(ReceiverId(7)), Some(Interest::Pending));
        assert_eq!(interest.take_rounds(ReceiverId(1)), 2);
        assert_eq!(interest.take_rounds(ReceiverId(1)), 0);
        assert_eq!(interest.take_rounds(ReceiverId(5)), 0);
        assert_eq!(interest.asking().collect::<Vec<_>>(), vec![ReceiverId(7)]);
        // A receiver gone takes its rounds with it.
        assert_eq!(interest.remove(ReceiverId(7)), Some(Interest::Pending));
        assert_eq!(interest.asking().count(), 0);
    }
}
