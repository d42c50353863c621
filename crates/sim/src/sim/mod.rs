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
use std::time::Duration;

use ldm7_fmtp_proto::{
    Assembly, BlockRun, Instant, ParityConfig, ProductIndex, Receiver, ReceiverId, Sender, WallTime,
};

use crate::due::{DueList, LossCalendar};
use crate::ledger::{Ledger, Violation};
use crate::net::{BottleneckState, Channel, LossProcess, UplinkState};
use crate::queue::EventQueue;
use crate::rng::SimRng;
use crate::workload::{ProductSpec, Workload};
use ldm7_ldm_proto::downstream7::{Downstream7, Downstream7Config};

mod config;
mod drain;
mod events;
mod fanout;
mod members;
mod report;
mod stream;

pub use config::{Backstop, ContentMode, DropFilter, Liveness, ReceiverSpec, SimConfig, SimConfigError};
pub use report::{DeliveryRecord, Failure, ReceiverReport, Report};

use stream::Request;

/// The seed of the pattern content of the product at `position` (0 for the first) of a run
/// with seed `seed`.
fn content_seed(seed: u64, position: u64) -> u64 {
    ldm7_types::content::product_seed(seed, position)
}

/// Each delay group's parity, and whether its members may take products whole: all alike
/// (`alike` per receiver: its TCP delay to the sender if that path is a plain delay, its parity
/// settings and its receive timer's slack) and `whole_products` on.
fn settle_groups(
    groups: &mut [Group],
    alike: &[(Option<Duration>, Option<ParityConfig>, Duration)],
    whole_products: bool,
) {
    for group in groups {
        let (to_sender, parity, _) = alike[group.members[0]];
        group.parity = parity;
        let same =
            group.members.iter().all(|&m| alike[m].0.is_some() && alike[m].0 == to_sender && alike[m].1 == parity);
        let gap_max = group.members.iter().map(|&m| alike[m].2).min().unwrap_or_default();
        group.whole = match to_sender {
            Some(to_sender) if same && whole_products => Some(WholeSpec { to_sender, gap_max }),
            _ => None,
        };
    }
}

/// A receiver's LDM-7 subscriber decisions for the backstop ([`Backstop`]): one session, from
/// `now`, with the server's defaults.
fn backstop_subscriber(now: Instant) -> Downstream7 {
    let config = Downstream7Config {
        time_offset: Duration::from_secs(3600),
        retry_min: Duration::from_secs(1),
        retry_max: Duration::from_secs(30),
    };
    let mut subscriber = Downstream7::new(config, None);
    subscriber.session_started(now);
    subscriber
}

/// The simulation.
pub struct Simulation {
    seed: u64,
    backstop: Option<Backstop>,
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
                subscriber: config.backstop.map(|_| backstop_subscriber(now)),
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
        settle_groups(&mut groups, &alike, config.whole_products);
        queue.push(now, Event::Arrival);
        Ok(Self {
            seed,
            backstop: config.backstop,
            content: config.content,
            liveness: config.liveness,
            time_limit: Instant::ZERO + config.time_limit,
            now,
            queue,
            queued_products_max: config.sender.queued_products_max,
            retained_products_max: config.sender.retained_products_max,
            ledger: Ledger::new(
                config.sender.first_index,
                nodes.len(),
                config.content == ContentMode::Memory,
                config.sender.parity,
            ),
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

    fn failure(&self, violation: Violation) -> Failure {
        Failure { seed: self.seed, at: self.now, violation }
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
    /// A product the receiver asked for through the backstop arrives.
    Backstop {
        receiver: usize,
        index: ProductIndex,
    },
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
    /// The LDM-7 subscriber's decisions, with a backstop ([`Backstop`]).
    subscriber: Option<Downstream7>,
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
    /// Products asked for through the backstop, and backlog or fence requests (not served).
    backstop_requests: u64,
    backlog_requests: u64,
}
