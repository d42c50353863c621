//! A tiny deterministic in-memory network for the state-machine tests: one [`Sender`], N
//! [`Receiver`]s, multicast with a per-datagram drop filter, reliable in-order TCP channels with
//! a fixed delay, virtual time. Not the project simulator (`crates/sim`): just enough to drive
//! the protocol logic and check that every product ends delivered byte-exact or missed.

#![allow(dead_code)]

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Duration;

use ldm7_fmtp_proto::wire::{Body, Message, MessageType};
use ldm7_fmtp_proto::{
    DeliveredProduct, Destination, IndexTrust, Instant, MissReason, OutgoingProduct, ProductIndex, Receiver,
    ReceiverConfig, ReceiverEvent, ReceiverId, Sender, SenderConfig, SenderEvent,
};

/// The default receiver settings, but believing every product index as the reference does:
/// the tests of loss and repair count requests exactly, and the confirmation of the first index
/// ([`IndexTrust::Confirmed`], tested in `forged.rs`) would add one.
pub fn trusting() -> ReceiverConfig {
    ReceiverConfig { index_trust: IndexTrust::All, ..ReceiverConfig::default() }
}

/// Decides whether receiver `n` loses a multicast datagram.
pub type DropFilter = Box<dyn FnMut(usize, &Message<'_>) -> bool>;

/// One receiver and what happened to it.
pub struct Node {
    pub id: ReceiverId,
    pub receiver: Receiver,
    /// Requests from this receiver are lost (its TCP send side is dead).
    pub muted: bool,
    /// One-way delay of this receiver's TCP channel, both directions.
    pub stream_delay: Duration,
    pub delivered: HashMap<ProductIndex, DeliveredProduct>,
    pub missed: HashMap<ProductIndex, MissReason>,
    pub events: Vec<ReceiverEvent>,
    /// Every message the receiver sent to the sender.
    pub requests: Vec<(Instant, Message<'static>)>,
}

enum Delivering {
    Datagram { to: usize, bytes: Vec<u8> },
    ToReceiver { to: usize, bytes: Vec<u8> },
    ToSender { from: usize, bytes: Vec<u8> },
}

struct Scheduled {
    at: Instant,
    sequence: u64,
    what: Delivering,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.sequence) == (other.at, other.sequence)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.sequence).cmp(&(other.at, other.sequence))
    }
}

/// The network.
pub struct Net {
    pub now: Instant,
    pub sender: Sender,
    pub nodes: Vec<Node>,
    pub multicast_delay: Duration,
    /// The delay of PARITY datagrams, when not `multicast_delay` (a driver receives them on a
    /// socket of their own: they may pass the data multicast, or fall behind it).
    pub parity_delay: Option<Duration>,
    pub drop: DropFilter,
    /// Deliver every multicast datagram twice.
    pub duplicate: bool,
    /// What was enqueued: index → (data, metadata).
    pub sent: HashMap<ProductIndex, (Vec<u8>, Vec<u8>)>,
    pub sender_events: Vec<SenderEvent>,
    /// Every transmit of the sender: (time, destination, type, bytes).
    pub transmits: Vec<(Instant, Destination, MessageType, usize)>,
    queue: BinaryHeap<Reverse<Scheduled>>,
    sequence: u64,
}

impl Net {
    /// A sender and `receivers.len()` receivers, all connected at time 0, no loss, 1 ms
    /// multicast delay, 5 ms TCP delay.
    pub fn new(sender: SenderConfig, receivers: Vec<ReceiverConfig>) -> Self {
        let now = Instant::ZERO;
        let mut net = Self {
            now,
            sender: Sender::new(sender, now).expect("sender config"),
            nodes: Vec::new(),
            multicast_delay: Duration::from_millis(1),
            parity_delay: None,
            drop: Box::new(|_, _| false),
            duplicate: false,
            sent: HashMap::new(),
            sender_events: Vec::new(),
            transmits: Vec::new(),
            queue: BinaryHeap::new(),
            sequence: 0,
        };
        for config in receivers {
            net.add_receiver(config);
        }
        net
    }

    /// Adds and connects a receiver now; returns its position.
    pub fn add_receiver(&mut self, config: ReceiverConfig) -> usize {
        self.add(Receiver::new(config).expect("receiver config"))
    }

    /// Adds and connects a receiver built by the caller (e.g. with a sink); returns its
    /// position.
    pub fn add(&mut self, receiver: Receiver) -> usize {
        let id = ReceiverId(self.nodes.len() as u64 + 100);
        self.sender.receiver_connected(self.now, id);
        self.nodes.push(Node {
            id,
            receiver,
            muted: false,
            stream_delay: Duration::from_millis(5),
            delivered: HashMap::new(),
            missed: HashMap::new(),
            events: Vec::new(),
            requests: Vec::new(),
        });
        self.nodes.len() - 1
    }

    /// Enqueues a product of `size` bytes with content derived from `seed`; returns its index.
    pub fn enqueue(&mut self, size: usize, seed: u64) -> ProductIndex {
        let data = pattern(size, seed);
        let metadata = pattern(16, seed ^ 0x5eed).to_vec();
        let index = self
            .sender
            .enqueue(self.now, OutgoingProduct::new(data.clone(), metadata.clone()))
            .expect("enqueue accepted");
        self.sent.insert(index, (data, metadata));
        index
    }

    /// Delivers `bytes` to receiver `to` as a multicast datagram after the multicast delay, as
    /// a forger on the path would.
    pub fn inject(&mut self, to: usize, bytes: Vec<u8>) {
        self.schedule(self.now + self.multicast_delay, Delivering::Datagram { to, bytes });
    }

    /// Runs until `limit` (virtual time).
    pub fn run_until(&mut self, limit: Instant) {
        for _ in 0..50_000_000u64 {
            self.flush();
            let next = [
                self.queue.peek().map(|s| s.0.at),
                self.sender.poll_timeout(),
                self.nodes.iter().filter_map(|n| n.receiver.poll_timeout()).min(),
            ]
            .into_iter()
            .flatten()
            .min();
            match next {
                Some(at) if at <= limit => self.now = self.now.max(at),
                _ => {
                    self.now = self.now.max(limit);
                    return;
                }
            }
            while self.queue.peek().is_some_and(|s| s.0.at <= self.now) {
                let Reverse(scheduled) = self.queue.pop().expect("peeked");
                self.deliver(scheduled.what);
            }
            self.sender.handle_timeout(self.now);
            for node in &mut self.nodes {
                node.receiver.handle_timeout(self.now);
            }
        }
        panic!("the network made no progress at {}", self.now);
    }

    /// Runs for `duration` more.
    pub fn run_for(&mut self, duration: Duration) {
        self.run_until(self.now + duration);
    }

    /// Runs until nothing is in flight, the sender has nothing queued and no receiver holds an
    /// incomplete product (or `limit` passes).
    pub fn settle(&mut self, limit: Duration) {
        let end = self.now + limit;
        while self.now < end {
            self.run_for(Duration::from_millis(100));
            let quiet = self.queue.is_empty()
                && self.sender.is_idle()
                && self.nodes.iter().all(|n| n.receiver.in_flight_products() == 0);
            if quiet {
                return;
            }
        }
    }

    /// Checks that every enqueued product ended, at every receiver, as exactly one of
    /// delivered (byte-exact, right metadata) or missed. Returns (delivered, missed) totals.
    pub fn check_accounted(&self) -> (usize, usize) {
        let (mut delivered, mut missed) = (0, 0);
        for (position, node) in self.nodes.iter().enumerate() {
            for (index, (data, metadata)) in &self.sent {
                match (node.delivered.get(index), node.missed.get(index)) {
                    (Some(delivery), None) => {
                        assert!(delivery.data == *data, "receiver {position}: product {index} differs");
                        assert_eq!(delivery.metadata, *metadata, "receiver {position}: product {index} metadata");
                        delivered += 1;
                    }
                    (None, Some(_)) => missed += 1,
                    (None, None) => panic!("receiver {position}: product {index} silently lost"),
                    (Some(_), Some(_)) => unreachable!("record() refuses two outcomes"),
                }
            }
        }
        (delivered, missed)
    }

    /// Requests of one type sent by receiver `n`.
    pub fn requests_of(&self, n: usize, message_type: MessageType) -> Vec<Message<'static>> {
        self.nodes[n].requests.iter().filter(|(_, m)| m.message_type() == message_type).map(|(_, m)| *m).collect()
    }

    fn flush(&mut self) {
        let now = self.now;
        let mut buf = Vec::new();
        while let Some(transmit) = self.sender.poll_transmit(now, &mut buf) {
            assert_eq!(buf.len(), transmit.len);
            self.transmits.push((now, transmit.destination, transmit.message_type, transmit.len));
            let message = Message::parse(&buf).expect("the sender emits valid messages");
            assert_eq!(message.message_type(), transmit.message_type);
            match transmit.destination {
                Destination::Multicast => {
                    assert!(message.message_type().is_multicast());
                    let delay = match message.message_type() {
                        MessageType::Parity => self.parity_delay.unwrap_or(self.multicast_delay),
                        _ => self.multicast_delay,
                    };
                    for to in 0..self.nodes.len() {
                        if !(self.drop)(to, &message) {
                            let copies = if self.duplicate { 2 } else { 1 };
                            for _ in 0..copies {
                                self.schedule(now + delay, Delivering::Datagram { to, bytes: buf.clone() });
                            }
                        }
                    }
                }
                Destination::Receiver(id) => {
                    let to = self.nodes.iter().position(|n| n.id == id).expect("known receiver");
                    let at = now + self.nodes[to].stream_delay;
                    self.schedule(at, Delivering::ToReceiver { to, bytes: buf.clone() });
                }
            }
            buf.clear();
        }
        while let Some(event) = self.sender.poll_event() {
            self.sender_events.push(event);
        }
        for from in 0..self.nodes.len() {
            while let Some(message) = self.nodes[from].receiver.poll_transmit() {
                self.nodes[from].requests.push((now, message));
                if !self.nodes[from].muted {
                    let at = now + self.nodes[from].stream_delay;
                    self.schedule(at, Delivering::ToSender { from, bytes: message.to_vec().expect("emit") });
                }
            }
            while let Some(event) = self.nodes[from].receiver.poll_event() {
                record(&mut self.nodes[from], event);
            }
        }
    }

    fn schedule(&mut self, at: Instant, what: Delivering) {
        self.sequence += 1;
        self.queue.push(Reverse(Scheduled { at, sequence: self.sequence, what }));
    }

    fn deliver(&mut self, what: Delivering) {
        let now = self.now;
        match what {
            Delivering::Datagram { to, bytes } => self.nodes[to].receiver.handle_datagram(now, &bytes),
            Delivering::ToReceiver { to, bytes } => {
                self.nodes[to].receiver.handle_stream_frame(now, &bytes).expect("valid frame")
            }
            Delivering::ToSender { from, bytes } => {
                let id = self.nodes[from].id;
                self.sender.handle_stream_frame(now, id, &bytes).expect("valid frame")
            }
        }
    }
}

fn record(node: &mut Node, event: ReceiverEvent) {
    match &event {
        ReceiverEvent::Delivered(delivery) => {
            assert!(!node.missed.contains_key(&delivery.index), "product {} delivered after missed", delivery.index);
            let previous = node.delivered.insert(delivery.index, delivery.clone());
            assert!(previous.is_none(), "product {} delivered twice", delivery.index);
        }
        ReceiverEvent::Missed { index, reason } => {
            assert!(!node.delivered.contains_key(index), "product {index} missed after delivered");
            let previous = node.missed.insert(*index, *reason);
            assert!(previous.is_none(), "product {index} missed twice");
        }
        _ => {}
    }
    node.events.push(event);
}

/// Deterministic product content.
pub fn pattern(size: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..size)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// A drop filter that loses the listed (receiver, index, type, offset) datagrams; `offset` is
/// ignored for BOP/EOP.
pub fn drop_exact(list: Vec<(usize, u32, MessageType, u32)>) -> DropFilter {
    Box::new(move |to, message| {
        let offset = match message.body {
            Body::MemData { offset, .. } => offset,
            _ => 0,
        };
        list.contains(&(to, message.index.0, message.message_type(), offset))
    })
}

/// Block offset `k` (1448-byte blocks).
pub const fn block(k: u32) -> u32 {
    k * 1448
}
