//! The simulation: one [`Sender`], N [`Receiver`]s, links, faults and checkers on a seeded
//! event heap in virtual time.
//!
//! Each step pops the earliest event, feeds it to the state machine it concerns, drains that
//! machine in the documented order (transmits, events, timeout), schedules what it emitted,
//! and runs the checkers on what changed ([`crate::ledger`]).
//!
//! Scale: a multicast datagram is encoded once and shared (`Rc<[u8]>`) by all its deliveries;
//! receivers with the same one-way delay and jitter form a *delay group*, and one heap event
//! delivers a datagram to a whole group, deciding each member's loss inline. Heap events per
//! datagram are thus per group, not per receiver; per-receiver events are only TCP messages and
//! timers. Timers are scheduled lazily: one pending wake per state machine, re-armed only when
//! its `poll_timeout` moves earlier.
//!
//! Phases (TigerBeetle's VOPR): the *safety phase* runs the workload under the configured
//! faults; once every workload product has been multicast and [`Liveness::delay`] has passed,
//! the *liveness phase* heals the network (no loss, no stalls, no further resets), multicasts
//! a sentinel product so that every receiver learns of products it lost whole at the end, and
//! runs until nothing is pending. Then every product must be accounted for.

use std::collections::VecDeque;
use std::fmt;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use ldm7_fmtp_proto::wire::{Body, Message};
use ldm7_fmtp_proto::{
    Assembly, BlockRun, Destination, EnqueueRefusal, IndexTrust, Instant, ParityConfig, Product, ProductIndex,
    Receiver, ReceiverConfig, ReceiverCounters, ReceiverId, Sender, SenderConfig, SenderCounters, SenderEvent,
    WallClock, WallTime, block_fingerprint,
};
use ldm7_types::Signature;

use crate::due::{DueList, LossCalendar};
use crate::ledger::{Content, Ledger, ProductRecord, ReceiverTally, Violation};
use crate::net::{
    Bottleneck, BottleneckState, Channel, LossModel, LossProcess, Reset, Stall, TcpSpec, Uplink, UplinkState,
};
use crate::queue::EventQueue;
use crate::rng::{SimRng, mix64};
use crate::stats::LatencyStats;
use crate::workload::{PatternData, ProductSpec, Workload, bytes_fingerprint, pattern_bytes, pattern_fingerprint};

/// The seed of the pattern content of the product at `position` (0 for the first) of a run
/// with seed `seed`.
fn content_seed(seed: u64, position: u64) -> u64 {
    mix64(seed ^ mix64(position.wrapping_add(1)))
}

/// Decides whether receiver `n` (its position in [`SimConfig::receivers`]) loses a multicast
/// datagram, on top of its loss model: scripted losses for named scenarios.
pub type DropFilter = Box<dyn FnMut(usize, &Message<'_>) -> bool>;

/// How product bytes are made and checked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ContentMode {
    /// Products are materialized in memory, their metadata is their MD5 signature (as LDM),
    /// receivers assemble them, and each delivery's MD5 is checked.
    #[default]
    Memory,
    /// Products are generated on demand from a seed ([`PatternData`]); receivers discard
    /// bytes ([`Assembly::Discard`]); each sender message is checked byte by byte against the
    /// pattern once, and each delivery by its fingerprint. For runs at scale.
    Pattern,
}

/// When and how the liveness phase starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Liveness {
    /// Time after the last workload product was multicast before the network is healed (the
    /// receive timers get this long to recover tails under faults).
    pub delay: Duration,
    /// Size of the sentinel product multicast after healing (`None`: no sentinel).
    pub sentinel_size: Option<u32>,
}

impl Default for Liveness {
    fn default() -> Self {
        Self { delay: Duration::from_secs(1), sentinel_size: Some(1_000) }
    }
}

/// A receiver's links and faults.
#[derive(Clone, Debug, PartialEq)]
pub struct ReceiverSpec {
    /// One-way delay of the multicast path.
    pub multicast_delay: Duration,
    /// Extra multicast delay, uniform in `[0, jitter]`, drawn per datagram and delay group
    /// (the path segment the group shares); FIFO is kept.
    pub jitter: Duration,
    /// Multicast loss seen by this receiver alone.
    pub loss: LossModel,
    /// TCP, receiver → sender (requests).
    pub to_sender: TcpSpec,
    /// TCP, sender → receiver (repairs).
    pub to_receiver: TcpSpec,
    /// Stall windows of the TCP connection (both directions).
    pub stalls: Vec<Stall>,
    /// Resets of the TCP connection.
    pub resets: Vec<Reset>,
    /// When the receiver joins (connects and joins the group).
    pub join_at: Instant,
    /// Its own receiver settings (default: [`SimConfig::receiver`]).
    pub config: Option<ReceiverConfig>,
}

impl ReceiverSpec {
    /// A receiver at round-trip time `rtt` (half each way on every path), no loss, unlimited
    /// TCP rate with a 4 MiB socket buffer at the sender.
    pub fn with_rtt(rtt: Duration) -> Self {
        let one_way = rtt / 2;
        Self {
            multicast_delay: one_way,
            jitter: Duration::ZERO,
            loss: LossModel::None,
            to_sender: TcpSpec { delay: one_way, rate_bits_per_s: None, buffer_bytes: None },
            to_receiver: TcpSpec { delay: one_way, rate_bits_per_s: None, buffer_bytes: Some(4 << 20) },
            stalls: Vec::new(),
            resets: Vec::new(),
            join_at: Instant::ZERO,
            config: None,
        }
    }

    /// With this multicast loss.
    pub fn loss(mut self, loss: LossModel) -> Self {
        self.loss = loss;
        self
    }

    /// With this multicast jitter.
    pub fn jitter(mut self, jitter: Duration) -> Self {
        self.jitter = jitter;
        self
    }

    /// With TCP limited to `rate_bits_per_s` in both directions and a socket buffer of
    /// `buffer_bytes` at the sender.
    pub fn tcp_rate(mut self, rate_bits_per_s: u64, buffer_bytes: u64) -> Self {
        self.to_sender.rate_bits_per_s = Some(rate_bits_per_s);
        self.to_receiver.rate_bits_per_s = Some(rate_bits_per_s);
        self.to_receiver.buffer_bytes = Some(buffer_bytes);
        self
    }

    /// With this one-way TCP delay (both directions).
    pub fn tcp_delay(mut self, delay: Duration) -> Self {
        self.to_sender.delay = delay;
        self.to_receiver.delay = delay;
        self
    }

    /// With a TCP stall.
    pub fn stall(mut self, stall: Stall) -> Self {
        self.stalls.push(stall);
        self
    }

    /// With a TCP reset.
    pub fn reset(mut self, reset: Reset) -> Self {
        self.resets.push(reset);
        self
    }

    /// Joining at `at`.
    pub fn join_at(mut self, at: Instant) -> Self {
        self.join_at = at;
        self
    }
}

/// A simulation's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// The seed: the run is a function of it and of the rest of this configuration.
    pub seed: u64,
    /// The sender.
    pub sender: SenderConfig,
    /// Receivers without their own settings. By default they believe every product index
    /// ([`IndexTrust::All`]): the simulated paths carry no forged datagrams, and the ledger's
    /// liveness check counts from each receiver's first datagram, where a receiver that asks the
    /// sender to confirm its first index drops a first product the sender already released
    /// (covered by LDM-7's backlog, not by FMTP).
    pub receiver: ReceiverConfig,
    /// How product bytes are made and checked.
    pub content: ContentMode,
    /// Multicast loss shared by all receivers (at the publisher, before the fan-out).
    pub shared_loss: LossModel,
    /// A bottleneck on the multicast path, before the fan-out.
    pub bottleneck: Option<Bottleneck>,
    /// The publisher's uplink for repairs, shared by every repair connection (`None`: repairs
    /// are limited only by the sender's repair pacing and each receiver's path).
    pub repair_uplink: Option<Uplink>,
    /// The receivers.
    pub receivers: Vec<ReceiverSpec>,
    /// The liveness phase.
    pub liveness: Liveness,
    /// Virtual time by which the run must be at rest.
    pub time_limit: Duration,
    /// Whether members that get a product without loss may take it whole, without being
    /// handed its BOP and EOP one by one (docs/simulator.md; on by default, off to compare).
    pub whole_products: bool,
}

impl SimConfig {
    /// Sender paced at 100 Mbit/s (multicast and repairs), default receivers, memory content.
    pub fn new(seed: u64, receivers: Vec<ReceiverSpec>) -> Self {
        Self {
            seed,
            sender: SenderConfig::with_rate(100_000_000),
            receiver: ReceiverConfig { index_trust: IndexTrust::All, ..ReceiverConfig::default() },
            content: ContentMode::Memory,
            shared_loss: LossModel::None,
            bottleneck: None,
            repair_uplink: None,
            receivers,
            liveness: Liveness::default(),
            time_limit: Duration::from_secs(7 * 24 * 3600),
            whole_products: true,
        }
    }

    /// Sets parity repair ([`ldm7_fmtp_proto::parity`]) at the sender and every receiver:
    /// groups of `group_blocks` data blocks with up to `shards` parity shards each, a receiver
    /// asking again after twice the largest round-trip time and 100 ms more.
    pub fn with_parity(mut self, group_blocks: u32, shards: u32) -> Self {
        let rtt_max =
            self.receivers.iter().map(|spec| spec.to_sender.delay + spec.to_receiver.delay).max().unwrap_or_default();
        let parity = ParityConfig {
            group_blocks,
            shards,
            block_len: self.sender.block_len,
            retry: rtt_max * 2 + Duration::from_millis(100),
            ..ParityConfig::default()
        };
        self.sender.parity = Some(parity);
        self.receiver.parity = Some(parity);
        self
    }
}

/// One delivery at one receiver (kept with [`Simulation::with_delivery_log`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeliveryRecord {
    /// The receiver.
    pub receiver: usize,
    /// When it completed.
    pub at: Instant,
    /// From the product's creation to its completion.
    pub latency: Duration,
    /// Its size.
    pub bytes: u32,
    /// Blocks of it that came by repair.
    pub retransmitted_blocks: u32,
}

/// Why a configuration cannot run.
#[derive(Debug, thiserror::Error)]
pub enum SimConfigError {
    /// The sender or a receiver refused its settings.
    #[error(transparent)]
    Fmtp(#[from] ldm7_fmtp_proto::ConfigError),
    /// Too many receivers for the simulator's id space.
    #[error("{0} receivers: at most {max} are supported", max = u32::MAX)]
    TooManyReceivers(usize),
}

/// A failed run: which invariant broke, when, and the seed that replays it.
#[derive(Debug, thiserror::Error)]
#[error("simulation failed at {at} (seed {seed}): {violation}; replay with LDM7_SEED={seed}")]
pub struct Failure {
    /// The seed.
    pub seed: u64,
    /// Virtual time of the failure.
    pub at: Instant,
    /// What broke.
    pub violation: Violation,
}

/// What a run did.
#[derive(Clone, Debug)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// Products the sender accepted (the liveness sentinel included).
    pub products: u64,
    /// Products the sender refused because no receiver was connected (LDM policy).
    pub products_skipped: u64,
    /// Bytes of the accepted products.
    pub product_bytes: u64,
    /// Virtual time of the last activity (stale timer wakes of cancelled timers excluded).
    pub virtual_time: Instant,
    /// Events processed.
    pub events: u64,
    /// Multicast datagrams the sender emitted.
    pub multicast_datagrams: u64,
    /// Of those, lost before the fan-out (shared loss, bottleneck queue).
    pub multicast_lost_shared: u64,
    /// Bytes through the repair uplink, and the longest a repair waited in it (zero without one).
    pub repair_uplink: (u64, Duration),
    /// Receiver deliveries of multicast datagrams (after per-receiver loss).
    pub datagram_deliveries: u64,
    /// Deliveries of products taken whole ([`SimConfig::whole_products`]).
    pub whole_products: u64,
    /// The sender's counters.
    pub sender: SenderCounters,
    /// Per receiver, in configuration order.
    pub receivers: Vec<ReceiverReport>,
}

/// One receiver's results.
#[derive(Clone, Debug)]
pub struct ReceiverReport {
    /// Outcomes, retransmissions and latencies.
    pub tally: ReceiverTally,
    /// The receiver's own counters.
    pub counters: ReceiverCounters,
    /// The first product it got a datagram of.
    pub first_contact: Option<ProductIndex>,
    /// Multicast datagrams it lost.
    pub datagrams_lost: u64,
}

impl Report {
    /// The publisher's bytes sent (multicast, unicast repairs and parity shards, FMTP headers
    /// included) per product byte.
    pub fn egress_per_product_byte(&self) -> f64 {
        let sent = self.sender.multicast_bytes + self.sender.retx_bytes + self.sender.parity_bytes;
        sent as f64 / self.product_bytes.max(1) as f64
    }

    /// Products delivered, all receivers.
    pub fn delivered(&self) -> u64 {
        self.receivers.iter().map(|r| r.tally.delivered).sum()
    }

    /// Products missed, all receivers.
    pub fn missed(&self) -> u64 {
        self.receivers.iter().map(|r| r.tally.missed).sum()
    }

    /// Products reported through index gaps, all receivers.
    pub fn gap_reported(&self) -> u64 {
        self.receivers.iter().map(|r| r.tally.gap_reported).sum()
    }

    /// Products lost whole before a receiver's first contact, all receivers.
    pub fn unknown_before_first_contact(&self) -> u64 {
        self.receivers.iter().map(|r| r.tally.unknown_before_first_contact).sum()
    }

    /// Retransmitted blocks over delivered products, all receivers.
    pub fn retransmitted_blocks(&self) -> u64 {
        self.receivers.iter().map(|r| r.tally.retransmitted_blocks).sum()
    }

    /// Latencies of the given receivers together.
    pub fn latency_of(&self, receivers: impl IntoIterator<Item = usize>) -> LatencyStats {
        let mut stats = LatencyStats::default();
        for receiver in receivers {
            stats.merge(&self.receivers[receiver].tally.latency);
        }
        stats
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let latency = self.latency_of(0..self.receivers.len());
        writeln!(
            f,
            "seed {}: {} products ({} bytes, {} skipped) to {} receivers in {} virtual",
            self.seed,
            self.products,
            self.product_bytes,
            self.products_skipped,
            self.receivers.len(),
            self.virtual_time
        )?;
        writeln!(
            f,
            "delivered {}, missed {}, gap-reported {}, unknown before first contact {}, retransmitted blocks {}",
            self.delivered(),
            self.missed(),
            self.gap_reported(),
            self.unknown_before_first_contact(),
            self.retransmitted_blocks()
        )?;
        writeln!(
            f,
            "publisher egress {:.3} per product byte (multicast {}, repairs {}, parity {} bytes)",
            self.egress_per_product_byte(),
            self.sender.multicast_bytes,
            self.sender.retx_bytes,
            self.sender.parity_bytes
        )?;
        write!(
            f,
            "latency mean {:?} p99 {:?} max {:?}; {} multicast datagrams ({} lost before fan-out); {} events; {} \
             deliveries taken whole",
            latency.mean(),
            latency.quantile(0.99),
            latency.max(),
            self.multicast_datagrams,
            self.multicast_lost_shared,
            self.events,
            self.whole_products
        )?;
        let (bytes, wait_max) = self.repair_uplink;
        if bytes > 0 {
            write!(f, "; repair uplink {bytes} bytes, longest wait {wait_max:?}")?;
        }
        Ok(())
    }
}

/// The simulation.
pub struct Simulation {
    seed: u64,
    content: ContentMode,
    liveness: Liveness,
    time_limit: Instant,
    now: Instant,
    queue: EventQueue<Event>,
    sender: Sender,
    queued_products_max: usize,
    retained_products_max: usize,
    sender_wake: Option<Instant>,
    nodes: Vec<Node>,
    /// Per receiver, what the multicast fan-out looks at for every member (kept apart from the
    /// nodes, densely: a product's BOP and EOP visit every member).
    lanes: Vec<Lane>,
    groups: Vec<Group>,
    shared_loss: LossProcess,
    bottleneck: Option<BottleneckState>,
    repair_uplink: Option<UplinkState>,
    jitter_rng: SimRng,
    workload: Workload,
    next_arrival: usize,
    backlog: VecDeque<ProductSpec>,
    ledger: Ledger,
    drop_filter: Option<DropFilter>,
    /// Deliveries for [`Simulation::take_deliveries`], when kept.
    delivery_log: Option<Vec<DeliveryRecord>>,
    /// Whether losses are sampled ahead (decided when the first receiver joins).
    sampled: Option<bool>,
    /// Scratch: the members losing the datagram in hand.
    losers: Vec<usize>,
    /// Scratch: riders that lost a block and wait for a block passing its group.
    noted: Vec<(u32, usize)>,
    /// Scratch: members whose sampled loss is the datagram in hand (stale ones included).
    due: Vec<usize>,
    /// Scratch: riders whose waited-for offset the block in hand reaches.
    passed: Vec<(u32, usize)>,
    /// Stream messages to the sender that arrive at `requests_at`, not yet scheduled
    /// ([`Simulation::flush_requests`]).
    requests: Vec<(u32, u32, Request)>,
    requests_at: Instant,
    /// Nodes with stream messages held back by the sender's backpressure.
    held_nodes: Vec<usize>,
    buf: Vec<u8>,
    healed: bool,
    liveness_scheduled: bool,
    counters: Counters,
    /// Events processed at the current instant (livelock detection).
    events_now: u64,
    /// When the last event that was not a stale timer wake ran (the end of the run's activity:
    /// stale wakes of timers already cancelled may run later and do nothing).
    last_active: Instant,
}

impl fmt::Debug for Simulation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Simulation")
            .field("seed", &self.seed)
            .field("now", &self.now)
            .field("receivers", &self.nodes.len())
            .field("pending_events", &self.queue.len())
            .finish_non_exhaustive()
    }
}

/// Livelock bound: events at one instant.
const EVENTS_AT_ONE_INSTANT_MAX: u64 = 50_000_000;

impl Simulation {
    /// A simulation of `workload` under `config`.
    pub fn new(config: SimConfig, workload: Workload) -> Result<Self, SimConfigError> {
        if config.receivers.len() > u32::MAX as usize {
            return Err(SimConfigError::TooManyReceivers(config.receivers.len()));
        }
        let seed = config.seed;
        let now = Instant::ZERO;
        let sender = Sender::new(config.sender.clone(), now)?;
        let mut queue = EventQueue::new();
        let mut nodes = Vec::with_capacity(config.receivers.len());
        let mut lanes = Vec::with_capacity(config.receivers.len());
        // Per receiver: its TCP delay to the sender if that path is a plain delay, its parity
        // settings and its receive timer's slack (whether a group's members take products
        // whole alike).
        let mut alike = Vec::with_capacity(config.receivers.len());
        let mut groups: Vec<Group> = Vec::new();
        for (position, spec) in config.receivers.iter().enumerate() {
            let mut receiver_config = spec.config.clone().unwrap_or_else(|| config.receiver.clone());
            receiver_config.assembly = match config.content {
                ContentMode::Memory => Assembly::Memory,
                ContentMode::Pattern => Assembly::Discard,
            };
            let mut receiver = Receiver::new(receiver_config.clone())?;
            if config.content == ContentMode::Pattern && receiver_config.parity.is_some() {
                // Blocks recovered from parity are known by their fingerprints, as the blocks of
                // a run are: the ledger checks every parity shard the sender multicasts.
                let first = config.sender.first_index;
                receiver.set_fingerprint_source(move |index, start, end| {
                    let position = u64::from(index.0.wrapping_sub(first.0));
                    crate::workload::pattern_range_fingerprint(content_seed(seed, position), start, end)
                });
            }
            let group = match groups.iter().position(|g| g.delay == spec.multicast_delay && g.jitter == spec.jitter) {
                Some(group) => group,
                None => {
                    groups.push(Group::new(spec.multicast_delay, spec.jitter));
                    groups.len() - 1
                }
            };
            groups[group].members.push(position);
            nodes.push(Node {
                receiver,
                id: ReceiverId(position as u64),
                connection: 0,
                connected: false,
                loss: LossProcess::new(&spec.loss, SimRng::new(seed, position as u64)),
                to_sender: Channel::new(spec.to_sender.clone(), &spec.stalls),
                to_receiver: Channel::new(spec.to_receiver.clone(), &spec.stalls),
                rtt: spec.to_sender.delay + spec.to_receiver.delay,
                held: VecDeque::new(),
                wake: None,
                in_flight_products_max: receiver_config.in_flight_products_max,
                in_flight_bytes_max: receiver_config.in_flight_bytes_max,
                datagrams_lost: 0,
                next_loss: u64::MAX,
            });
            lanes.push(Lane { group: group as u32, ..Lane::default() });
            let plain = spec.to_sender.rate_bits_per_s.is_none() && spec.stalls.is_empty() && spec.resets.is_empty();
            alike.push((
                plain.then_some(spec.to_sender.delay),
                receiver_config.parity,
                receiver_config.receive_timer.slack,
            ));
            queue.push(spec.join_at, Event::Join { receiver: position });
            for reset in &spec.resets {
                queue.push(reset.at, Event::Reset { receiver: position, reconnect_after: reset.reconnect_after });
            }
        }
        for group in &mut groups {
            let (to_sender, parity, _) = alike[group.members[0]];
            group.parity = parity;
            let same =
                group.members.iter().all(|&m| alike[m].0.is_some() && alike[m].0 == to_sender && alike[m].1 == parity);
            let gap_max = group.members.iter().map(|&m| alike[m].2).min().unwrap_or_default();
            group.whole = match to_sender {
                Some(to_sender) if same && config.whole_products => Some(WholeSpec { to_sender, gap_max }),
                _ => None,
            };
        }
        queue.push(now, Event::Arrival);
        Ok(Self {
            seed,
            content: config.content,
            liveness: config.liveness,
            time_limit: Instant::ZERO + config.time_limit,
            now,
            queue,
            queued_products_max: config.sender.queued_products_max,
            retained_products_max: config.sender.retained_products_max,
            ledger: Ledger::new(config.sender.first_index, nodes.len(), config.content == ContentMode::Memory),
            sender,
            sender_wake: None,
            nodes,
            lanes,
            groups,
            shared_loss: LossProcess::new(&config.shared_loss, SimRng::new(seed, u64::MAX)),
            bottleneck: config.bottleneck.map(BottleneckState::new),
            repair_uplink: config.repair_uplink.map(UplinkState::new),
            jitter_rng: SimRng::new(seed, u64::MAX - 2),
            workload,
            next_arrival: 0,
            backlog: VecDeque::new(),
            drop_filter: None,
            delivery_log: None,
            sampled: None,
            losers: Vec::new(),
            noted: Vec::new(),
            due: Vec::new(),
            passed: Vec::new(),
            requests: Vec::new(),
            requests_at: Instant::ZERO,
            held_nodes: Vec::new(),
            buf: Vec::with_capacity(2048),
            healed: false,
            liveness_scheduled: false,
            counters: Counters::default(),
            events_now: 0,
            last_active: now,
        })
    }

    /// Keeps a record of every delivery, for [`Simulation::take_deliveries`] (a rate-control
    /// loop reads them; see [`crate::control`]).
    pub fn with_delivery_log(mut self) -> Self {
        self.delivery_log = Some(Vec::new());
        self
    }

    /// The deliveries recorded since the last call (none without
    /// [`Simulation::with_delivery_log`]).
    pub fn take_deliveries(&mut self) -> Vec<DeliveryRecord> {
        self.delivery_log.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Changes the sender's path rate now (as a path service would).
    pub fn set_rate(&mut self, rate_bits_per_s: u64) -> Result<(), Failure> {
        let changed = self
            .sender
            .set_rate(self.now, rate_bits_per_s)
            .map_err(|error| Violation::Sender(format!("cannot change the rate: {}", error.0)))
            .and_then(|()| self.drain_sender());
        changed.map_err(|violation| self.failure(violation))
    }

    /// A receiver's round-trip time to the sender (its two TCP delays).
    pub fn receiver_rtt(&self, receiver: usize) -> Option<Duration> {
        self.nodes.get(receiver).map(|node| node.rtt)
    }

    /// Adds scripted multicast losses (active until the liveness phase).
    pub fn with_drop_filter(mut self, filter: DropFilter) -> Self {
        self.drop_filter = Some(filter);
        self
    }

    /// Runs to the end and checks liveness.
    pub fn run(mut self) -> Result<Report, Failure> {
        self.finish()
    }

    /// Runs events due up to `limit`; returns whether the run came to rest (nothing pending).
    pub fn run_until(&mut self, limit: Instant) -> Result<bool, Failure> {
        loop {
            let Some(at) = self.queue.peek_time().filter(|&at| at <= limit) else {
                // Blocks still pending go to their receivers before the stretch ends (which
                // may schedule more).
                let flushed = self.flush_runs().map_err(|violation| self.failure(violation))?;
                self.flush_requests();
                if flushed {
                    continue;
                }
                if self.queue.peek_time().is_none() {
                    return Ok(true);
                }
                self.now = self.now.max(limit);
                return Ok(false);
            };
            if at > self.time_limit {
                let what = format!("events still pending at the time limit {} ({:?})", self.time_limit, self);
                return Err(self.failure(Violation::NotQuiescent(what)));
            }
            let (at, event) = self.queue.pop().expect("peeked");
            if at > self.now {
                self.now = at;
                self.events_now = 0;
            }
            self.events_now += 1;
            self.counters.events += 1;
            if self.events_now > EVENTS_AT_ONE_INSTANT_MAX {
                let what = format!("{EVENTS_AT_ONE_INSTANT_MAX} events at one instant: no progress");
                return Err(self.failure(Violation::NotQuiescent(what)));
            }
            self.handle(event).map_err(|violation| self.failure(violation))?;
            self.flush_requests();
        }
    }

    /// Runs until nothing is pending, then checks that everything is at rest and every product
    /// accounted for.
    pub fn finish(&mut self) -> Result<Report, Failure> {
        loop {
            self.run_until(Instant::MAX)?;
            // Held BOPs handed over can make a receiver send (not at rest yet then).
            self.catch_up_all().map_err(|violation| self.failure(violation))?;
            self.flush_requests();
            if self.queue.peek_time().is_none() {
                break;
            }
        }
        self.check_at_rest().map_err(|violation| self.failure(violation))?;
        self.ledger.check_liveness().map_err(|violation| self.failure(violation))?;
        Ok(self.report())
    }

    /// The report so far (products members took whole since their last visit count once
    /// [`Simulation::finish`] has brought them up to date).
    pub fn report(&self) -> Report {
        Report {
            seed: self.seed,
            products: self.ledger.product_count() as u64,
            products_skipped: self.counters.products_skipped,
            product_bytes: self.counters.product_bytes,
            virtual_time: self.last_active,
            events: self.counters.events,
            multicast_datagrams: self.counters.multicast_datagrams,
            multicast_lost_shared: self.counters.multicast_lost_shared,
            repair_uplink: self
                .repair_uplink
                .as_ref()
                .map_or((0, Duration::ZERO), |uplink| (uplink.bytes, uplink.wait_max)),
            datagram_deliveries: self.counters.datagram_deliveries,
            whole_products: self.counters.whole_products,
            sender: self.sender.counters().clone(),
            receivers: (0..self.nodes.len())
                .map(|n| ReceiverReport {
                    tally: self.ledger.tally(n).clone(),
                    counters: self.nodes[n].receiver.counters().clone(),
                    first_contact: self.ledger.first_contact(n),
                    datagrams_lost: self.nodes[n].datagrams_lost,
                })
                .collect(),
        }
    }

    /// Virtual time now.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The sender.
    pub fn sender(&self) -> &Sender {
        &self.sender
    }

    /// Receiver `n`.
    pub fn receiver(&self, n: usize) -> &Receiver {
        &self.nodes[n].receiver
    }

    /// Events processed so far.
    pub fn events(&self) -> u64 {
        self.counters.events
    }

    /// Products accepted by the sender so far.
    pub fn products_enqueued(&self) -> usize {
        self.ledger.product_count()
    }

    // ---------------------------------------------------------------------------------------
    // Event handling.

    fn failure(&self, violation: Violation) -> Failure {
        Failure { seed: self.seed, at: self.now, violation }
    }

    fn handle(&mut self, event: Event) -> Result<(), Violation> {
        let stale = match &event {
            // A wake is stale if another replaced it or its timer was cancelled meanwhile.
            Event::SenderWake => {
                self.sender_wake != Some(self.now) || self.sender.poll_timeout().is_none_or(|at| at > self.now)
            }
            Event::ReceiverWake { receiver } => {
                let node = &self.nodes[*receiver];
                node.wake != Some(self.now) || node.receiver.poll_timeout().is_none_or(|at| at > self.now)
            }
            _ => false,
        };
        // Whatever concerns a receiver comes after the blocks it has been sent (a stale wake
        // concerns nobody).
        match &event {
            Event::ReceiverWake { .. } if stale => {}
            Event::ToReceiver { receiver, .. }
            | Event::ReceiverWake { receiver }
            | Event::Reset { receiver, .. }
            | Event::Reconnect { receiver } => {
                self.catch_up(*receiver)?;
                self.flush_run(*receiver)?;
            }
            Event::Liveness => {
                self.flush_runs()?;
            }
            Event::Arrival
            | Event::SenderWake
            | Event::Multicast { .. }
            | Event::WholeEnds { .. }
            | Event::ToSender { .. }
            | Event::Writable { .. }
            | Event::Join { .. } => {}
        }
        if !stale {
            self.last_active = self.now;
        }
        match event {
            Event::Arrival => self.on_arrival(),
            Event::SenderWake => {
                if self.sender_wake != Some(self.now) {
                    return Ok(());
                }
                self.sender_wake = None;
                self.sender.handle_timeout(self.now);
                self.drain_sender()
            }
            Event::Multicast { group, datagram } => self.on_multicast(group, datagram),
            Event::WholeEnds { index, receivers } => self.on_whole_ends(index, &receivers),
            Event::ToReceiver { receiver, generation, frame } => {
                let node = &mut self.nodes[receiver];
                if generation != node.to_receiver.generation {
                    self.counters.stream_lost_in_reset += 1;
                    return Ok(());
                }
                node.receiver
                    .handle_stream_frame(self.now, &frame)
                    .map_err(|e| Violation::Receiver { receiver, what: format!("refused a repair frame: {e}") })?;
                self.drain_receiver(receiver)
            }
            Event::ToSender { requests } => {
                let mut taken = false;
                for (receiver, generation, request) in requests {
                    taken |= self.on_request(receiver as usize, generation, request)?;
                }
                if taken { self.drain_sender() } else { Ok(()) }
            }
            Event::ReceiverWake { receiver } => {
                let node = &mut self.nodes[receiver];
                if node.wake != Some(self.now) {
                    return Ok(());
                }
                node.wake = None;
                if stale {
                    // Its timer moved later (or went): only the wake follows it.
                    if let Some(at) = node.receiver.poll_timeout() {
                        node.wake = Some(at);
                        self.queue.push(at, Event::ReceiverWake { receiver });
                    }
                    return Ok(());
                }
                node.receiver.handle_timeout(self.now);
                self.drain_receiver(receiver)
            }
            Event::Writable { receiver, generation } => {
                let node = &mut self.nodes[receiver];
                if generation != node.to_receiver.generation || !node.connected {
                    return Ok(());
                }
                match node.to_receiver.writable(self.now) {
                    Ok(()) => {
                        self.sender.set_writable(node.id, true);
                        self.drain_sender()
                    }
                    Err(at) => {
                        self.queue.push(at.max(self.now), Event::Writable { receiver, generation });
                        Ok(())
                    }
                }
            }
            Event::Join { receiver } => {
                if self.sampled() {
                    let node = &mut self.nodes[receiver];
                    let group = &mut self.groups[self.lanes[receiver].group as usize];
                    self.lanes[receiver].ride = Ride::Attention;
                    group.attention.push(receiver);
                    node.next_loss = group.seq.saturating_add(node.loss.until_loss());
                    if node.next_loss != u64::MAX {
                        group.losses.push(node.next_loss, receiver);
                    }
                }
                let node = &mut self.nodes[receiver];
                self.lanes[receiver].joined = true;
                node.connected = true;
                self.sender.receiver_connected(self.now, node.id);
                self.sender.set_rtt(node.id, node.rtt);
                self.groups[self.lanes[receiver].group as usize].joined += 1;
                self.ledger.joined(receiver, self.now);
                self.feed_backlog()?;
                self.drain_sender()
            }
            Event::Reset { receiver, reconnect_after } => {
                let node = &mut self.nodes[receiver];
                if self.healed || !node.connected {
                    return Ok(());
                }
                node.to_sender.reset(self.now);
                node.to_receiver.reset(self.now);
                node.held.clear();
                node.connected = false;
                self.counters.resets += 1;
                self.sender.receiver_disconnected(self.now, node.id);
                self.queue.push(self.now + reconnect_after, Event::Reconnect { receiver });
                self.drain_sender()
            }
            Event::Reconnect { receiver } => {
                let node = &mut self.nodes[receiver];
                node.connection += 1;
                node.id = ReceiverId((u64::from(node.connection) << 32) | receiver as u64);
                node.connected = true;
                self.sender.receiver_connected(self.now, node.id);
                self.sender.set_rtt(node.id, node.rtt);
                node.receiver.stream_reset(self.now);
                self.drain_receiver(receiver)?;
                self.drain_sender()
            }
            Event::Liveness => self.on_liveness(),
        }
    }

    /// Hands the sender the workload products that are due, and schedules the next arrival.
    fn on_arrival(&mut self) -> Result<(), Violation> {
        let elapsed = self.now - Instant::ZERO;
        while let Some(spec) = self.workload.products.get(self.next_arrival) {
            if spec.at > elapsed {
                self.queue.push(Instant::ZERO + spec.at, Event::Arrival);
                break;
            }
            self.backlog.push_back(*spec);
            self.next_arrival += 1;
        }
        self.feed_backlog()?;
        self.drain_sender()
    }

    /// Enqueues backlog products while the sender's queue has room; returns whether any was.
    fn feed_backlog(&mut self) -> Result<bool, Violation> {
        let mut fed = false;
        while let Some(spec) = self.backlog.front().copied() {
            if self.sender.queued_products() >= self.queued_products_max {
                break;
            }
            self.backlog.pop_front();
            let position = self.ledger.product_count() as u64;
            let content_seed = content_seed(self.seed, position);
            let (product, content, metadata, fingerprint) = match self.content {
                ContentMode::Memory => {
                    let bytes: Arc<[u8]> = pattern_bytes(content_seed, spec.size).into();
                    let metadata = Signature::md5_of(&bytes).0;
                    let fingerprint = bytes_fingerprint(&bytes);
                    (Product::new(bytes.clone(), metadata), Content::Bytes(bytes), metadata, fingerprint)
                }
                ContentMode::Pattern => {
                    let mut metadata = [0u8; 16];
                    metadata[..8].copy_from_slice(&mix64(content_seed).to_le_bytes());
                    metadata[8..].copy_from_slice(&mix64(content_seed ^ u64::from(spec.size)).to_le_bytes());
                    let data = PatternData { seed: content_seed, len: spec.size };
                    let fingerprint = pattern_fingerprint(content_seed, spec.size);
                    (Product::new(data, metadata), Content::Pattern(content_seed), metadata, fingerprint)
                }
            };
            match self.sender.enqueue(self.now, product) {
                Ok(index) => {
                    let record = ProductRecord {
                        size: spec.size,
                        content,
                        metadata,
                        fingerprint,
                        enqueued_at: self.now,
                        multicast_started: None,
                        released: None,
                    };
                    self.ledger.enqueued(index, record)?;
                    self.counters.product_bytes += u64::from(spec.size);
                    fed = true;
                }
                Err(error) => match error.reason {
                    EnqueueRefusal::NoReceivers => self.counters.products_skipped += 1,
                    EnqueueRefusal::QueueFull => {
                        self.backlog.push_front(spec);
                        break;
                    }
                    reason => return Err(Violation::Sender(format!("refused a product: {reason}"))),
                },
            }
        }
        Ok(fed)
    }

    fn on_liveness(&mut self) -> Result<(), Violation> {
        self.healed = true;
        self.drop_filter = None;
        self.shared_loss.heal();
        for group in &mut self.groups {
            group.losses.clear();
        }
        for node in &mut self.nodes {
            node.next_loss = u64::MAX;
            node.loss.heal();
            node.to_sender.heal();
            node.to_receiver.heal();
        }
        if let Some(size) = self.liveness.sentinel_size {
            self.backlog.push_back(ProductSpec { at: self.now - Instant::ZERO, size });
        }
        self.feed_backlog()?;
        self.drain_sender()
    }

    /// Whether losses are sampled ahead ([`Simulation::on_multicast_sampled`]): with pattern
    /// content and no scripted drops, decided once, when the first receiver joins.
    fn sampled(&mut self) -> bool {
        *self.sampled.get_or_insert(matches!(self.content, ContentMode::Pattern) && self.drop_filter.is_none())
    }

    fn on_multicast(&mut self, group: usize, datagram: Rc<[u8]>) -> Result<(), Violation> {
        if self.sampled() {
            return self.on_multicast_sampled(group, datagram);
        }
        // Scripted drops or memory content: each datagram to each receiver, losses drawn per
        // datagram. The sender's datagrams were checked when emitted: the header is there.
        let index = ProductIndex(u32::from_be_bytes([datagram[0], datagram[1], datagram[2], datagram[3]]));
        let message = match self.drop_filter {
            Some(_) => Some(Message::parse(&datagram).map_err(|e| Violation::Sender(e.to_string()))?),
            None => None,
        };
        for member in 0..self.groups[group].members.len() {
            let receiver = self.groups[group].members[member];
            if !self.lanes[receiver].joined {
                continue;
            }
            let node = &mut self.nodes[receiver];
            let mut lost = node.loss.lose();
            if let (Some(filter), Some(message)) = (&mut self.drop_filter, &message) {
                lost |= filter(receiver, message);
            }
            if lost {
                node.datagrams_lost += 1;
                continue;
            }
            self.counters.datagram_deliveries += 1;
            self.hand_over(receiver, index, &datagram)?;
        }
        Ok(())
    }

    /// A multicast datagram reaches a group whose members' losses are sampled: each member's
    /// next lost datagram is drawn ahead ([`LossProcess::until_loss`]), members riding the
    /// group's run of data blocks take a block without anything done for them, and only the
    /// members that lose it, that lost the one before, or that must see it at once (BOP, EOP,
    /// a break in the group's run) are visited — a datagram's cost grows with the losses, not
    /// with the members. Members that take a product whole are not visited for its BOP and
    /// EOP either ([`Ride::Whole`]).
    fn on_multicast_sampled(&mut self, group: usize, datagram: Rc<[u8]>) -> Result<(), Violation> {
        let message = Message::parse(&datagram).map_err(|e| Violation::Sender(e.to_string()))?;
        let index = message.index;
        if let Body::Parity { group: of_group, .. } = message.body {
            return self.on_parity_sampled(group, index, of_group, &datagram);
        }
        let seq = self.groups[group].seq;
        self.groups[group].seq += 1;
        // Who loses it (each draws its next loss).
        let mut losers = std::mem::take(&mut self.losers);
        losers.clear();
        let mut due = std::mem::take(&mut self.due);
        due.clear();
        self.groups[group].losses.take(seq, &mut due);
        for &member in &due {
            let node = &mut self.nodes[member];
            if node.next_loss != seq || !self.lanes[member].joined {
                continue;
            }
            node.datagrams_lost += 1;
            node.next_loss = (seq + 1).saturating_add(node.loss.until_loss());
            if node.next_loss != u64::MAX {
                self.groups[group].losses.push(node.next_loss, member);
            }
            losers.push(member);
        }
        self.due = due;
        self.counters.datagram_deliveries += (self.groups[group].joined - losers.len()) as u64;
        let result = match message.body {
            Body::MemData { offset, data } => {
                // offset + len ≤ the product size ≤ u32::MAX.
                let end = offset + data.len() as u32;
                self.on_block_sampled(
                    group,
                    seq,
                    index,
                    offset,
                    end,
                    block_fingerprint(offset, data),
                    &datagram,
                    &losers,
                )
            }
            Body::Bop(ref bop) => {
                let held = HeldBop {
                    at: self.now,
                    seq,
                    index,
                    size: bop.product_size,
                    start_time: bop.start_time,
                    metadata: bop.metadata.try_into().ok(),
                    datagram: datagram.clone(),
                };
                self.on_bop_sampled(group, held, &losers)
            }
            _ => self.on_eop_sampled(group, seq, index, &datagram, &losers),
        };
        self.losers = losers;
        result
    }

    /// A parity shard reaches a group: only the members whose product still misses blocks of
    /// that block group take it, each deciding its loss on its own (a draw of its loss model,
    /// apart from the sampled losses of the data stream), after their share of the run so far.
    /// It takes no place in the group's run: the next block continues it.
    ///
    /// Whether a member wants it is asked of its state machine as of the member's last visit,
    /// before its share of the run is handed over: a member riding the product's run since its
    /// BOP wants every shard of it that the run has not passed. A member taking the product
    /// whole ([`Ride::Whole`]) is such a member; when it wants the shard it is visited like one
    /// (its BOP, then its share).
    fn on_parity_sampled(
        &mut self,
        group: usize,
        index: ProductIndex,
        of_group: u16,
        datagram: &[u8],
    ) -> Result<(), Violation> {
        let seq = self.groups[group].seq;
        let current = self.groups[group].bop.as_ref().filter(|bop| bop.index == index).map(|bop| bop.size);
        let parity = self.groups[group].parity;
        // What a member taking the product whole would say: the block group is incomplete there
        // while the run has not passed it (once it has, the shard is for the others).
        let current_wants = current.zip(parity).is_some_and(|(size, parity)| {
            let size = u64::from(size);
            u64::from(of_group) < parity.groups(size)
                && parity.group_range(u32::from(of_group), size).1 > u64::from(self.groups[group].run.end_of(index))
        });
        for member in 0..self.groups[group].members.len() {
            let receiver = self.groups[group].members[member];
            let lane = &self.lanes[receiver];
            if !lane.joined {
                continue;
            }
            let wants = match lane.ride {
                Ride::Whole(_) if current.is_some() => current_wants,
                // Nothing older than what it held at its last visit can be in flight there
                // (products are created newer than the newest).
                _ => {
                    lane.oldest.is_some_and(|oldest| index.serial_difference(oldest).is_some_and(|d| d >= 0))
                        && self.nodes[receiver].receiver.wants_parity(index, of_group)
                }
            };
            if !wants {
                continue;
            }
            let node = &mut self.nodes[receiver];
            if node.loss.lose() {
                node.datagrams_lost += 1;
                continue;
            }
            self.counters.datagram_deliveries += 1;
            self.flush_member_to(receiver, seq)?;
            self.hand_over(receiver, index, datagram)?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn on_block_sampled(
        &mut self,
        group: usize,
        seq: u64,
        index: ProductIndex,
        offset: u32,
        end: u32,
        fingerprint: u64,
        datagram: &[u8],
        losers: &[usize],
    ) -> Result<(), Violation> {
        if !self.groups[group].run.continues(index, offset, seq) {
            // A break in the group's stream (a shared loss, or blocks of a product whose BOP
            // never came): nobody rides across it.
            for member in 0..self.groups[group].members.len() {
                let receiver = self.groups[group].members[member];
                if self.lanes[receiver].ride.rides() {
                    self.flush_member_to(receiver, seq)?;
                    self.attend(receiver);
                }
            }
            self.groups[group].run.reset(index, seq, offset);
        }
        self.groups[group].run.push(end, self.now, fingerprint, datagram.len() as u64);
        // Riders that lose it: their share ends before it. One whose state machine would only
        // note the gap (parity repair: the group's request waits for the multicast to pass it)
        // rides on from the next block and is visited when a block passes the group; the others
        // take the next datagram at once.
        let mut noted = std::mem::take(&mut self.noted);
        noted.clear();
        for &receiver in losers {
            if self.lanes[receiver].ride.rides() {
                self.flush_member_to(receiver, seq)?;
                match self.nodes[receiver].receiver.notes_gap(index, offset) {
                    Some(group_end) => {
                        self.lanes[receiver].ride = Ride::From(seq + 1);
                        noted.push((group_end, receiver));
                    }
                    None => self.attend(receiver),
                }
            }
        }
        // Members that lost the datagram before take this one at once (and ride from the next),
        // unless they lose it too.
        let attention = std::mem::take(&mut self.groups[group].attention);
        for receiver in attention {
            if losers.contains(&receiver) || self.lanes[receiver].ride != Ride::Attention {
                if self.lanes[receiver].ride == Ride::Attention {
                    self.groups[group].attention.push(receiver);
                }
                continue;
            }
            self.hand_over(receiver, index, datagram)?;
            self.lanes[receiver].ride = Ride::From(seq + 1);
        }
        // Riders waiting for the multicast to pass a block group (to ask for its parity) take
        // their share up to this block, which passes it, as it comes; those that lost it wait
        // for the next one.
        let mut passed = std::mem::take(&mut self.passed);
        while self.groups[group].waiting.any_due(end) {
            passed.clear();
            self.groups[group].waiting.take(end, &mut passed);
            for &(group_end, receiver) in &passed {
                if losers.contains(&receiver) {
                    noted.push((group_end, receiver));
                    continue;
                }
                self.lanes[receiver].waiting = None;
                if matches!(self.lanes[receiver].ride, Ride::From(_)) {
                    self.flush_member_to(receiver, seq + 1)?;
                }
            }
        }
        self.passed = passed;
        for &(group_end, receiver) in &noted {
            self.lanes[receiver].waiting = Some((index, group_end));
            self.groups[group].waiting.push(group_end, receiver);
        }
        self.noted = noted;
        Ok(())
    }

    /// A BOP reaches a group: every member's share of the run ends here. A member that may
    /// take the product whole ([`Simulation::takes_whole`]) is not visited: it rides from here
    /// with the BOP held for it; the others take the BOP at once (unless they lose it).
    fn on_bop_sampled(&mut self, group: usize, bop: HeldBop, losers: &[usize]) -> Result<(), Violation> {
        self.groups[group].attention.clear();
        self.groups[group].waiting.clear();
        let whole = self.groups[group].whole.is_some() && bop.size > 0;
        for member in 0..self.groups[group].members.len() {
            let receiver = self.groups[group].members[member];
            if !self.lanes[receiver].joined {
                continue;
            }
            // The previous product's run (with its held BOP, when its EOP never came).
            self.flush_member_to(receiver, bop.seq)?;
            let ride = if losers.contains(&receiver) {
                Ride::Attention
            } else if whole && self.takes_whole(receiver, bop.index, bop.size) {
                Ride::Whole(bop.seq + 1)
            } else {
                self.hand_over(receiver, bop.index, &bop.datagram)?;
                Ride::From(bop.seq + 1)
            };
            self.lanes[receiver].ride = ride;
            if ride == Ride::Attention {
                self.groups[group].attention.push(receiver);
            }
        }
        self.groups[group].run.reset(bop.index, bop.seq + 1, 0);
        self.groups[group].bop = Some(bop);
        Ok(())
    }

    /// An EOP reaches a group: members that took the product whole complete it together (one
    /// entry in the group's log, their RETX_ENDs as one event); everyone else's share of the
    /// run ends here and they take the EOP at once (unless they lose it).
    fn on_eop_sampled(
        &mut self,
        group: usize,
        seq: u64,
        index: ProductIndex,
        datagram: &[u8],
        losers: &[usize],
    ) -> Result<(), Violation> {
        self.groups[group].attention.clear();
        let entry = self.whole_product(group, seq, index, datagram.len())?;
        let number = self.groups[group].products.len() as u32;
        let mut completers = Vec::new();
        for member in 0..self.groups[group].members.len() {
            let receiver = self.groups[group].members[member];
            if !self.lanes[receiver].joined {
                continue;
            }
            let lost = losers.contains(&receiver);
            let lane = &mut self.lanes[receiver];
            if entry.is_some() && !lost && matches!(lane.ride, Ride::Whole(_)) {
                lane.whole = match lane.whole {
                    (from, to) if from == to => (number, number + 1),
                    (from, to) if to == number => (from, to + 1),
                    (from, to) => {
                        let what = format!("took product {index} whole out of turn (after entries {from}..{to})");
                        return Err(Violation::Receiver { receiver, what });
                    }
                };
                completers.push(receiver as u32);
            } else {
                self.flush_member_to(receiver, seq)?;
                if !lost {
                    self.hand_over(receiver, index, datagram)?;
                }
            }
            self.lanes[receiver].ride = Ride::Attention;
            self.groups[group].attention.push(receiver);
        }
        self.groups[group].run.clear();
        let Some(entry) = entry else { return Ok(()) };
        if completers.is_empty() {
            return Ok(());
        }
        if let Some(log) = &mut self.delivery_log {
            for &receiver in &completers {
                log.push(DeliveryRecord {
                    receiver: receiver as usize,
                    at: entry.completed_at,
                    latency: Duration::from_nanos(entry.latency_ns.max(0) as u64),
                    bytes: entry.size,
                    retransmitted_blocks: 0,
                });
            }
        }
        let delay = self.groups[group].whole.map_or(Duration::ZERO, |whole| whole.to_sender);
        let arrival = (entry.completed_at + delay).max(self.now);
        self.counters.whole_products += completers.len() as u64;
        self.groups[group].products.push(entry);
        self.queue.push(arrival, Event::WholeEnds { index, receivers: completers });
        Ok(())
    }

    /// The group's current product as a member that took it whole got it, checked as the ledger
    /// checks a delivery — or `None` when nobody can have (the run since its BOP is not the
    /// whole product, or its blocks came so far apart that a receive timer could have fired
    /// between them).
    fn whole_product(
        &self,
        group: usize,
        seq: u64,
        index: ProductIndex,
        eop_len: usize,
    ) -> Result<Option<WholeProduct>, Violation> {
        let group = &self.groups[group];
        let (Some(bop), Some(whole)) = (&group.bop, group.whole) else { return Ok(None) };
        if bop.index != index || group.run.first_seq != bop.seq + 1 || group.run.start != 0 {
            return Ok(None);
        }
        let Some((run, completed_at)) = group.run.share(bop.seq + 1, seq) else { return Ok(None) };
        if run.end != bop.size || u64::from(run.datagrams) != seq - bop.seq - 1 {
            return Ok(None);
        }
        let mut last = bop.at;
        for &at in &group.run.times {
            if at - last >= whole.gap_max {
                return Ok(None);
            }
            last = at;
        }
        let Some(metadata) = bop.metadata else { return Ok(None) };
        self.ledger.check_whole(index, bop.size, metadata, bop.start_time, run.fingerprint)?;
        Ok(Some(WholeProduct {
            index,
            size: bop.size,
            completed_at,
            // As the receiver reckons it (the simulator leaves its wall clock at the default).
            latency_ns: WallClock::default().wall_at(completed_at).signed_nanos_since(bop.start_time),
            datagrams: u64::from(run.datagrams) + 2,
            wire_bytes: run.wire_bytes + bop.datagram.len() as u64 + eop_len as u64,
        }))
    }

    /// Whether member `receiver` may take product `index` of `size` bytes whole: its state
    /// machine (as of its last visit, with the whole products since) allows it
    /// ([`Receiver::whole_product_room`]) and has seen the product just before.
    fn takes_whole(&self, receiver: usize, index: ProductIndex, size: u32) -> bool {
        let lane = &self.lanes[receiver];
        let Some((seen, room)) = lane.room else { return false };
        let newest = match lane.whole {
            (from, to) if from < to => self.groups[lane.group as usize].products[to as usize - 1].index,
            _ => seen,
        };
        newest.next() == index && size <= room
    }

    /// A stream message from receiver `receiver` reaches the sender (on its connection of
    /// generation `generation`); whether the sender took it (the caller then lets it send).
    fn on_request(&mut self, receiver: usize, generation: u32, request: Request) -> Result<bool, Violation> {
        if generation != self.nodes[receiver].to_sender.generation {
            self.counters.stream_lost_in_reset += 1;
            return Ok(false);
        }
        self.pass_request(receiver, request)
    }

    /// Hands the sender a stream message that reached it from receiver `receiver`, unless the
    /// connection is down or backpressure holds it back (behind what it holds already); whether
    /// the sender took it.
    fn pass_request(&mut self, receiver: usize, request: Request) -> Result<bool, Violation> {
        let node = &mut self.nodes[receiver];
        if !node.connected {
            self.counters.stream_lost_in_reset += 1;
            return Ok(false);
        }
        if !node.held.is_empty() || !self.sender.accepts_stream(node.id) {
            // TCP backpressure: the sender stops reading this connection.
            if node.held.is_empty() {
                self.held_nodes.push(receiver);
            }
            node.held.push_back(request);
            return Ok(false);
        }
        self.sender
            .handle_stream_frame(self.now, node.id, request.frame())
            .map_err(|e| Violation::Receiver { receiver, what: format!("sent a malformed frame: {e}") })?;
        Ok(true)
    }

    /// Schedules the stream messages to the sender that arrive at one instant as one event.
    fn flush_requests(&mut self) {
        schedule_requests(&mut self.queue, &mut self.requests, self.requests_at);
    }

    /// The RETX_ENDs of members that took a product whole reach the sender (each as if on its
    /// own connection), then the sender sends what it has to (a RETX_END changes no
    /// transmission that the others could come before, but a release).
    fn on_whole_ends(&mut self, index: ProductIndex, receivers: &[u32]) -> Result<(), Violation> {
        let Some(&first) = receivers.first() else { return Ok(()) };
        let request = Request::encode(first as usize, &Message { index, body: Body::RetxEnd })?;
        for &receiver in receivers {
            self.pass_request(receiver as usize, request)?;
        }
        self.drain_sender()
    }

    /// Brings member `receiver`'s state machine up to date before it is visited: the whole
    /// products it took since its last visit ([`Receiver::took_whole_products`], and the ledger
    /// settles them), then — if it is taking the current product whole — the held BOP, as of
    /// when it came (its ride goes on from there).
    fn catch_up(&mut self, receiver: usize) -> Result<(), Violation> {
        let lane = &mut self.lanes[receiver];
        let (from, to) = lane.whole;
        let group = lane.group as usize;
        if from < to {
            lane.whole = (to, to);
            let entries = &self.groups[group].products[from as usize..to as usize];
            let newest = entries[entries.len() - 1].index;
            let (datagrams, bytes) = entries
                .iter()
                .fold((0, 0), |(datagrams, bytes), entry| (datagrams + entry.datagrams, bytes + entry.wire_bytes));
            self.nodes[receiver]
                .receiver
                .took_whole_products(newest, to - from, datagrams, bytes)
                .map_err(|e| Violation::Receiver { receiver, what: e.0 })?;
            for entry in entries {
                self.ledger.delivered_whole(receiver, entry.index, entry.latency_ns)?;
            }
        }
        if let Ride::Whole(from) = self.lanes[receiver].ride {
            self.lanes[receiver].ride = Ride::From(from);
            let Some(bop) = &self.groups[group].bop else {
                return Err(Violation::Receiver { receiver, what: "takes a product whole without its BOP".into() });
            };
            let (at, datagram) = (bop.at, bop.datagram.clone());
            self.nodes[receiver].receiver.handle_datagram(at, &datagram);
            self.drain_receiver_at(receiver, at)?;
        }
        Ok(())
    }

    /// Receiver `receiver` takes the next datagram at once. (A joined receiver is in its
    /// group's attention list exactly when its ride is [`Ride::Attention`].)
    fn attend(&mut self, receiver: usize) {
        let lane = &mut self.lanes[receiver];
        if lane.ride != Ride::Attention {
            lane.ride = Ride::Attention;
            self.groups[lane.group as usize].attention.push(receiver);
        }
    }

    /// Hands receiver `receiver` a datagram now.
    fn hand_over(&mut self, receiver: usize, index: ProductIndex, datagram: &[u8]) -> Result<(), Violation> {
        self.catch_up(receiver)?;
        self.ledger.contact(receiver, index);
        self.nodes[receiver].receiver.handle_datagram(self.now, datagram);
        self.drain_receiver(receiver)
    }

    /// Hands a riding receiver its share of its group's run before group datagram `to` (and
    /// first brings it up to date: [`Simulation::catch_up`]).
    ///
    /// A timer of the receiver that was due before the last of these blocks came (one set as of
    /// the held BOP that [`Simulation::catch_up`] just handed it, say) fires between the blocks
    /// that came before it and the others, as it would have: handed the run at once, the
    /// receiver would take its blocks as come after the timer.
    fn flush_member_to(&mut self, receiver: usize, to: u64) -> Result<(), Violation> {
        if !self.lanes[receiver].ride.rides() {
            return Ok(());
        }
        self.catch_up(receiver)?;
        let Ride::From(mut from) = self.lanes[receiver].ride else { return Ok(()) };
        self.lanes[receiver].ride = Ride::From(to.max(from));
        let group = self.lanes[receiver].group as usize;
        let mut timers = true;
        while from < to {
            let due = if timers { self.nodes[receiver].receiver.poll_timeout() } else { None };
            let until = due.map_or(to, |due| self.groups[group].run.arrived_by(from, to, due));
            if until > from {
                if !self.hand_share(receiver, group, from, until)? {
                    break;
                }
                from = until;
                continue;
            }
            // Due before block `from` came (and after the blocks handed).
            let Some(due) = due else { break };
            let node = &mut self.nodes[receiver];
            node.receiver.handle_timeout(due);
            // A timer due again at once: the rest goes as one run.
            timers = node.receiver.poll_timeout().is_none_or(|next| next > due);
            self.drain_receiver_at(receiver, due)?;
        }
        Ok(())
    }

    /// Hands receiver `receiver` the blocks `[from, to)` of its group's run as one run, as of
    /// when the last came; whether there were any.
    fn hand_share(&mut self, receiver: usize, group: usize, from: u64, to: u64) -> Result<bool, Violation> {
        let Some((run, at)) = self.groups[group].run.share(from, to) else { return Ok(false) };
        let index = run.index;
        self.ledger.contact(receiver, index);
        let (nodes, ledger) = (&mut self.nodes, &self.ledger);
        nodes[receiver]
            .receiver
            .handle_block_run(at, &run, &mut |start, end| ledger.range_fingerprint(index, start, end));
        self.drain_receiver_at(receiver, at)?;
        Ok(true)
    }

    /// Hands a riding receiver the blocks it was not handed yet, as of when the last arrived
    /// (before anything else concerns it).
    fn flush_run(&mut self, receiver: usize) -> Result<(), Violation> {
        let to = self.groups[self.lanes[receiver].group as usize].seq;
        self.flush_member_to(receiver, to)
    }

    /// [`Simulation::flush_run`] for every receiver; whether any had blocks to hand over (or a
    /// held BOP).
    fn flush_runs(&mut self) -> Result<bool, Violation> {
        let mut any = false;
        for receiver in 0..self.nodes.len() {
            let lane = &self.lanes[receiver];
            let group = &self.groups[lane.group as usize];
            let pending = match lane.ride {
                Ride::From(from) => group.run.share(from, group.seq).is_some(),
                Ride::Whole(_) => true,
                Ride::Attention => false,
            };
            if pending {
                any = true;
                self.flush_run(receiver)?;
            }
        }
        Ok(any)
    }

    /// Brings every member's state machine and ledger up to date (the whole products they took
    /// since their last visit), before the checks at rest and the report.
    fn catch_up_all(&mut self) -> Result<(), Violation> {
        for receiver in 0..self.nodes.len() {
            self.catch_up(receiver)?;
        }
        Ok(())
    }

    // ---------------------------------------------------------------------------------------
    // Draining the state machines.

    fn drain_sender(&mut self) -> Result<(), Violation> {
        loop {
            loop {
                self.buf.clear();
                let Some(transmit) = self.sender.poll_transmit(self.now, &mut self.buf) else { break };
                if transmit.len != self.buf.len() {
                    return Err(Violation::Sender(format!(
                        "transmit of {} bytes wrote {}",
                        transmit.len,
                        self.buf.len()
                    )));
                }
                match transmit.destination {
                    Destination::Multicast => self.on_multicast_transmit()?,
                    Destination::Receiver(id) => self.on_repair_transmit(id)?,
                }
            }
            while let Some(event) = self.sender.poll_event() {
                self.ledger.sender_event(&event)?;
                if let SenderEvent::BoundHit { .. } = event {
                    self.counters.sender_bound_hits += 1;
                }
            }
            let fed = self.feed_backlog()? | self.feed_held()?;
            if !fed {
                break;
            }
        }
        if self.sender.retained_products() > self.retained_products_max {
            return Err(Violation::Sender(format!("retains {} products", self.sender.retained_products())));
        }
        if self.sender.queued_products() > self.queued_products_max {
            return Err(Violation::Sender(format!("queues {} products", self.sender.queued_products())));
        }
        if !self.liveness_scheduled
            && self.next_arrival == self.workload.products.len()
            && self.backlog.is_empty()
            && self.sender.queued_products() == 0
        {
            self.liveness_scheduled = true;
            self.queue.push(self.now + self.liveness.delay, Event::Liveness);
        }
        if let Some(at) = self.sender.poll_timeout() {
            let at = at.max(self.now);
            if self.sender_wake.is_none_or(|wake| at < wake) {
                self.sender_wake = Some(at);
                self.queue.push(at, Event::SenderWake);
            }
        }
        Ok(())
    }

    fn on_multicast_transmit(&mut self) -> Result<(), Violation> {
        self.ledger.check_multicast(self.now, &self.buf)?;
        self.counters.multicast_datagrams += 1;
        if let Some(uplink) = &mut self.repair_uplink {
            uplink.multicast(self.now, self.buf.len());
        }
        if self.shared_loss.lose() {
            self.counters.multicast_lost_shared += 1;
            return Ok(());
        }
        let departure = match &mut self.bottleneck {
            Some(link) => match link.admit(self.now, self.buf.len(), !self.healed) {
                Some(departure) => departure,
                None => {
                    self.counters.multicast_lost_shared += 1;
                    return Ok(());
                }
            },
            None => self.now,
        };
        let datagram: Rc<[u8]> = Rc::from(&self.buf[..]);
        for (position, group) in self.groups.iter_mut().enumerate() {
            if group.joined == 0 {
                continue;
            }
            let jitter = if group.jitter.is_zero() {
                Duration::ZERO
            } else {
                Duration::from_nanos(self.jitter_rng.below(group.jitter.as_nanos() as u64 + 1))
            };
            let arrival = (departure + group.delay + jitter).max(group.last_arrival);
            group.last_arrival = arrival;
            self.queue.push(arrival, Event::Multicast { group: position, datagram: datagram.clone() });
        }
        Ok(())
    }

    fn on_repair_transmit(&mut self, id: ReceiverId) -> Result<(), Violation> {
        self.ledger.check_repair(&self.buf)?;
        let receiver = (id.0 & 0xffff_ffff) as usize;
        let node = self
            .nodes
            .get_mut(receiver)
            .filter(|node| node.id == id && node.connected)
            .ok_or_else(|| Violation::Sender(format!("repair for {id}, which is not connected")))?;
        let ready = match &mut self.repair_uplink {
            Some(uplink) => uplink.pass(self.now, self.buf.len()),
            None => self.now,
        };
        let arrival = node.to_receiver.send_after(self.now, ready, self.buf.len());
        let generation = node.to_receiver.generation;
        self.queue.push(arrival, Event::ToReceiver { receiver, generation, frame: self.buf.clone() });
        if let Err(at) = node.to_receiver.writable(self.now) {
            self.sender.set_writable(id, false);
            self.queue.push(at.max(self.now), Event::Writable { receiver, generation });
        }
        Ok(())
    }

    /// Hands the sender stream messages it held back, while it accepts them; returns whether
    /// any was.
    fn feed_held(&mut self) -> Result<bool, Violation> {
        let mut fed = false;
        let mut k = 0;
        while k < self.held_nodes.len() {
            let receiver = self.held_nodes[k];
            let node = &mut self.nodes[receiver];
            while self.sender.accepts_stream(node.id) {
                let Some(request) = node.held.pop_front() else { break };
                self.sender
                    .handle_stream_frame(self.now, node.id, request.frame())
                    .map_err(|e| Violation::Receiver { receiver, what: format!("sent a malformed frame: {e}") })?;
                fed = true;
            }
            if node.held.is_empty() {
                self.held_nodes.swap_remove(k);
            } else {
                k += 1;
            }
        }
        Ok(fed)
    }

    #[inline]
    fn drain_receiver(&mut self, receiver: usize) -> Result<(), Violation> {
        self.drain_receiver_at(receiver, self.now)
    }

    /// Takes what receiver `receiver` has to send and report, as of `at` (`now`, or when the
    /// last block of a run it was just handed arrived).
    fn drain_receiver_at(&mut self, receiver: usize, at: Instant) -> Result<(), Violation> {
        let node = &mut self.nodes[receiver];
        if node.connected {
            while let Some(message) = node.receiver.poll_transmit() {
                let request = Request::encode(receiver, &message)?;
                let arrival = node.to_sender.send(at, request.frame().len()).max(self.now);
                let generation = node.to_sender.generation;
                // Messages that arrive at the same instant go as one event (members that lost
                // the same datagram, or finished a product together, ask or end at once).
                if arrival != self.requests_at {
                    schedule_requests(&mut self.queue, &mut self.requests, self.requests_at);
                    self.requests_at = arrival;
                }
                // Receiver positions are < 2³² (checked at construction).
                self.requests.push((receiver as u32, generation, request));
            }
        }
        while let Some(event) = node.receiver.poll_event() {
            if let (Some(log), ldm7_fmtp_proto::ReceiverEvent::Delivered(delivery)) = (&mut self.delivery_log, &event) {
                log.push(DeliveryRecord {
                    receiver,
                    at,
                    latency: Duration::from_nanos(delivery.latency_ns.max(0) as u64),
                    bytes: self.ledger.size_of(delivery.index).unwrap_or(0),
                    retransmitted_blocks: delivery.retransmitted_blocks,
                });
            }
            self.ledger.receiver_event(receiver, event)?;
        }
        let lane = &mut self.lanes[receiver];
        lane.oldest = node.receiver.oldest_in_flight();
        lane.room = node.receiver.whole_product_room();
        if let Some((index, offset)) = node.receiver.parity_waiting() {
            let group = &mut self.groups[lane.group as usize];
            if lane.waiting != Some((index, offset)) && group.bop.as_ref().is_some_and(|bop| bop.index == index) {
                lane.waiting = Some((index, offset));
                group.waiting.push(offset, receiver);
            }
        }
        if node.receiver.in_flight_products() > node.in_flight_products_max
            || node.receiver.in_flight_bytes() > node.in_flight_bytes_max
        {
            let what = format!(
                "holds {} products, {} bytes, over its bounds",
                node.receiver.in_flight_products(),
                node.receiver.in_flight_bytes()
            );
            return Err(Violation::Receiver { receiver, what });
        }
        if let Some(at) = node.receiver.poll_timeout() {
            let at = at.max(self.now);
            if node.wake.is_none_or(|wake| at < wake) {
                node.wake = Some(at);
                self.queue.push(at, Event::ReceiverWake { receiver });
            }
        }
        Ok(())
    }

    fn check_at_rest(&self) -> Result<(), Violation> {
        let pending = |what: String| Err(Violation::NotQuiescent(what));
        if self.next_arrival < self.workload.products.len() || !self.backlog.is_empty() {
            return pending("workload products were never enqueued".into());
        }
        if !self.sender.is_idle() || self.sender.retained_products() > 0 {
            return pending(format!(
                "the sender still queues {} and retains {} products",
                self.sender.queued_products(),
                self.sender.retained_products()
            ));
        }
        for (receiver, node) in self.nodes.iter().enumerate() {
            if node.receiver.in_flight_products() > 0 {
                return pending(format!(
                    "receiver {receiver} still holds {} products",
                    node.receiver.in_flight_products()
                ));
            }
        }
        Ok(())
    }
}

/// Schedules `requests` (stream messages to the sender that arrive at `at`, in the order they
/// were sent), if any, as one event.
fn schedule_requests(queue: &mut EventQueue<Event>, requests: &mut Vec<(u32, u32, Request)>, at: Instant) {
    if !requests.is_empty() {
        queue.push(at, Event::ToSender { requests: std::mem::take(requests) });
    }
}

enum Event {
    /// Workload products are due.
    Arrival,
    /// The sender's `poll_timeout` (valid only if it still equals `sender_wake`).
    SenderWake,
    /// A multicast datagram reaches a delay group.
    Multicast {
        group: usize,
        datagram: Rc<[u8]>,
    },
    /// The RETX_ENDs of the members that took a product whole reach the sender.
    WholeEnds {
        index: ProductIndex,
        receivers: Vec<u32>,
    },
    /// A repair message reaches a receiver.
    ToReceiver {
        receiver: usize,
        generation: u32,
        frame: Vec<u8>,
    },
    /// Requests reach the sender: (receiver, its connection's generation, the message), in the
    /// order they were sent; the sender takes them all, then sends what it has to (as a sender
    /// that reads every connection ready at an instant before it polls its transmissions).
    ToSender {
        requests: Vec<(u32, u32, Request)>,
    },
    /// A receiver's `poll_timeout` (valid only if it still equals the node's `wake`).
    ReceiverWake {
        receiver: usize,
    },
    /// A receiver's socket buffer at the sender may have drained.
    Writable {
        receiver: usize,
        generation: u32,
    },
    Join {
        receiver: usize,
    },
    Reset {
        receiver: usize,
        reconnect_after: Duration,
    },
    Reconnect {
        receiver: usize,
    },
    /// Heal the network and send the sentinel.
    Liveness,
}

struct Node {
    receiver: Receiver,
    /// The current connection's id: connection number in the high 32 bits, position low.
    id: ReceiverId,
    connection: u32,
    connected: bool,
    loss: LossProcess,
    to_sender: Channel,
    to_receiver: Channel,
    rtt: Duration,
    /// Stream messages the sender is not reading yet (backpressure), in order.
    held: VecDeque<Request>,
    wake: Option<Instant>,
    in_flight_products_max: usize,
    in_flight_bytes_max: u64,
    datagrams_lost: u64,
    /// Sampled losses: the group sequence number of the next datagram it loses.
    next_loss: u64,
}

/// How a receiver takes its group's next datagram when losses are sampled
/// ([`Simulation::on_multicast_sampled`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Ride {
    /// Data blocks of the group's current run, from this sequence number on, are its own
    /// without anything done per block; they are handed over when something concerns it.
    From(u64),
    /// As `From`, and the product's BOP (held by the group) was not handed over either: the
    /// receiver takes the product whole unless something concerns it before its EOP
    /// ([`Simulation::catch_up`] then hands it the BOP as of when it came).
    Whole(u64),
    /// The next datagram is handed over as it comes (after a loss, an EOP, a join).
    #[default]
    Attention,
}

impl Ride {
    /// Whether it rides the group's run.
    fn rides(self) -> bool {
        !matches!(self, Self::Attention)
    }
}

/// A stream message from a receiver, encoded, kept inline (a receiver's messages are requests
/// and RETX_ENDs: a header and a few bytes; millions of them would otherwise be as many
/// allocations).
#[derive(Clone, Copy)]
struct Request {
    len: u8,
    bytes: [u8; Request::LEN_MAX],
}

impl Request {
    const LEN_MAX: usize = 24;

    fn encode(receiver: usize, message: &Message<'_>) -> Result<Self, Violation> {
        let mut request = Self { len: 0, bytes: [0; Self::LEN_MAX] };
        let len = message.buffer_len();
        if len > Self::LEN_MAX {
            return Err(Violation::Receiver {
                receiver,
                what: format!("sent a {len}-byte stream message: {message:?}"),
            });
        }
        message
            .emit(&mut request.bytes[..len])
            .map_err(|e| Violation::Receiver { receiver, what: format!("cannot emit {message:?}: {e}") })?;
        // ≤ LEN_MAX.
        request.len = len as u8;
        Ok(request)
    }

    fn frame(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

/// What the fan-out looks at for each member.
#[derive(Debug, Default)]
struct Lane {
    group: u32,
    joined: bool,
    ride: Ride,
    /// The oldest product its state machine held as of its last visit (it may want parity
    /// shards of that one and newer ones).
    oldest: Option<ProductIndex>,
    /// [`Receiver::whole_product_room`] as of its last visit.
    room: Option<(ProductIndex, u32)>,
    /// The entries of its group's log of whole products it took since its last visit.
    whole: (u32, u32),
    /// What its entry in its group's `waiting` says, if it has one.
    waiting: Option<(ProductIndex, u32)>,
}

/// A BOP a group received, held for the members taking the product whole.
struct HeldBop {
    at: Instant,
    seq: u64,
    index: ProductIndex,
    size: u32,
    start_time: WallTime,
    metadata: Option<[u8; 16]>,
    datagram: Rc<[u8]>,
}

/// A product members of a group took whole.
struct WholeProduct {
    index: ProductIndex,
    size: u32,
    completed_at: Instant,
    latency_ns: i64,
    datagrams: u64,
    wire_bytes: u64,
}

/// Whether a group's members may take products whole: every member's TCP path to the sender
/// is a plain delay (no rate, stalls or resets), the same for all (their RETX_ENDs go as one
/// event), and they repair alike.
#[derive(Clone, Copy, Debug)]
struct WholeSpec {
    /// That delay.
    to_sender: Duration,
    /// Blocks of a product taken whole came less than this apart (the members' smallest
    /// receive-timer slack: no receive timer can have fired between them).
    gap_max: Duration,
}

/// Receivers sharing one multicast delay and jitter: one heap event per datagram.
struct Group {
    delay: Duration,
    jitter: Duration,
    members: Vec<usize>,
    joined: usize,
    last_arrival: Instant,
    /// Sampled losses: datagrams that have reached the group.
    seq: u64,
    /// Sampled losses: each joined member's next lost datagram, earliest first.
    losses: LossCalendar,
    /// Sampled losses: members with [`Ride::Attention`].
    attention: Vec<usize>,
    /// Sampled losses: the data blocks the group has had back to back since the last BOP.
    run: GroupRun,
    /// Sampled losses: whether members may take products whole, and how.
    whole: Option<WholeSpec>,
    /// The parity settings its members repair with.
    parity: Option<ParityConfig>,
    /// The current product's BOP, held for the members taking it whole.
    bop: Option<HeldBop>,
    /// The products members took whole, in order.
    products: Vec<WholeProduct>,
    /// Sampled losses: riders of the current product whose state machine waits for the
    /// multicast to reach an offset ([`Receiver::parity_waiting`]), earliest offset first.
    waiting: DueList,
}

impl Group {
    fn new(delay: Duration, jitter: Duration) -> Self {
        Self {
            delay,
            jitter,
            members: Vec::new(),
            joined: 0,
            last_arrival: Instant::ZERO,
            seq: 0,
            losses: LossCalendar::new(),
            attention: Vec::new(),
            run: GroupRun::default(),
            whole: None,
            parity: None,
            bop: None,
            products: Vec::new(),
            waiting: DueList::new(),
        }
    }
}

/// Back-to-back data blocks of one product as a group received them, with running sums, so
/// that any member's share of them is one [`BlockRun`] in O(1).
#[derive(Debug, Default)]
struct GroupRun {
    index: ProductIndex,
    /// The group sequence number of its first block.
    first_seq: u64,
    /// The offset of its first block.
    start: u32,
    /// Per block: its end offset and arrival time.
    ends: Vec<u32>,
    times: Vec<Instant>,
    /// Running sums from the first block (one more entry than blocks): fingerprints, bytes.
    fingerprints: Vec<u64>,
    wire_bytes: Vec<u64>,
}

impl GroupRun {
    fn reset(&mut self, index: ProductIndex, first_seq: u64, start: u32) {
        self.index = index;
        self.first_seq = first_seq;
        self.start = start;
        self.ends.clear();
        self.times.clear();
        self.fingerprints.clear();
        self.fingerprints.push(0);
        self.wire_bytes.clear();
        self.wire_bytes.push(0);
    }

    /// Nothing continues it (after an EOP: the next product starts with its BOP).
    fn clear(&mut self) {
        self.ends.clear();
        self.times.clear();
        self.fingerprints.clear();
        self.wire_bytes.clear();
    }

    /// Whether the block at `offset` of `index`, the group's datagram `seq`, continues it.
    fn continues(&self, index: ProductIndex, offset: u32, seq: u64) -> bool {
        !self.fingerprints.is_empty()
            && index == self.index
            && offset == self.ends.last().copied().unwrap_or(self.start)
            && seq == self.first_seq + self.ends.len() as u64
    }

    fn push(&mut self, end: u32, at: Instant, fingerprint: u64, wire_bytes: u64) {
        let (sum, bytes) =
            (self.fingerprints.last().copied().unwrap_or(0), self.wire_bytes.last().copied().unwrap_or(0));
        self.ends.push(end);
        self.times.push(at);
        self.fingerprints.push(sum.wrapping_add(fingerprint));
        self.wire_bytes.push(bytes + wire_bytes);
    }

    /// Where the run of `index` has come to: a member riding it since the product's BOP holds
    /// every byte before this offset (0 when the run is of another product, or none).
    fn end_of(&self, index: ProductIndex) -> u32 {
        if self.fingerprints.is_empty() || index != self.index {
            return 0;
        }
        self.ends.last().copied().unwrap_or(self.start)
    }

    /// The group sequence number in `[from, to]` before which every block of `[from, to)`
    /// came at or before `at` (their times only grow).
    fn arrived_by(&self, from: u64, to: u64, at: Instant) -> u64 {
        // Outside the run: nothing to split ([`GroupRun::share`] has nothing either).
        let (Some(first), Some(end)) = (from.checked_sub(self.first_seq), to.checked_sub(self.first_seq)) else {
            return to;
        };
        let (Ok(first), Ok(end)) = (usize::try_from(first), usize::try_from(end)) else { return to };
        let end = end.min(self.times.len());
        if first >= end {
            return to;
        }
        let came = self.times[first..end].partition_point(|&time| time <= at);
        if first + came == end { to } else { from + came as u64 }
    }

    /// The blocks with group sequence numbers in `[from, to)`, if any, and when the last
    /// arrived.
    fn share(&self, from: u64, to: u64) -> Option<(BlockRun, Instant)> {
        let first = usize::try_from(from.checked_sub(self.first_seq)?).ok()?;
        let end = usize::try_from(to.checked_sub(self.first_seq)?).ok()?.min(self.ends.len());
        if first >= end {
            return None;
        }
        let run = BlockRun {
            index: self.index,
            start: if first == 0 { self.start } else { self.ends[first - 1] },
            end: self.ends[end - 1],
            // At most a product's blocks.
            datagrams: (end - first) as u32,
            wire_bytes: self.wire_bytes[end] - self.wire_bytes[first],
            fingerprint: self.fingerprints[end].wrapping_sub(self.fingerprints[first]),
        };
        Some((run, self.times[end - 1]))
    }
}

#[derive(Debug, Default)]
struct Counters {
    events: u64,
    products_skipped: u64,
    product_bytes: u64,
    multicast_datagrams: u64,
    multicast_lost_shared: u64,
    datagram_deliveries: u64,
    stream_lost_in_reset: u64,
    resets: u64,
    sender_bound_hits: u64,
    whole_products: u64,
}
