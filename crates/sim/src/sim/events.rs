//! Event handling: each event popped from the heap goes to the state machine it concerns;
//! workload arrivals, the sender's backlog and the liveness phase.

use std::sync::Arc;

use ldm7_fmtp_proto::{EnqueueRefusal, Instant, OutgoingProduct, ReceiverId};
use ldm7_types::Signature;

use crate::ledger::{Content, ProductRecord, Violation};
use crate::rng::mix64;
use crate::workload::{PatternData, ProductSpec, bytes_fingerprint, pattern_bytes, pattern_fingerprint};

use super::{ContentMode, Event, Ride, Simulation, content_seed};

impl Simulation {
    /// Handles one simulator event. One function on purpose: the event loop's dispatch, an arm
    /// per kind of event (sender and receiver wakes, datagrams on the multicast path, repair
    /// stream segments, connection resets, products due), each a few lines that hand the event
    /// to a state machine and route its output; the staleness rules above are the one place
    /// every kind is decided together.
    pub(super) fn handle(&mut self, event: Event) -> Result<(), Violation> {
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
            | Event::Join { .. }
            | Event::Backstop { .. } => {}
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
            Event::Backstop { receiver, index } => {
                let signature = self.ledger.backstop_delivered(receiver, index)?;
                if let Some(subscriber) = &mut self.nodes[receiver].subscriber {
                    subscriber.backstop_delivered(index.0, ldm7_types::Signature(signature));
                }
                Ok(())
            }
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
    pub(super) fn feed_backlog(&mut self) -> Result<bool, Violation> {
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
                    (OutgoingProduct::new(bytes.clone(), metadata), Content::Bytes(bytes), metadata, fingerprint)
                }
                ContentMode::Pattern => {
                    let mut metadata = [0u8; 16];
                    metadata[..8].copy_from_slice(&mix64(content_seed).to_le_bytes());
                    metadata[8..].copy_from_slice(&mix64(content_seed ^ u64::from(spec.size)).to_le_bytes());
                    let data = PatternData { seed: content_seed, len: spec.size };
                    let fingerprint = pattern_fingerprint(content_seed, spec.size);
                    (OutgoingProduct::new(data, metadata), Content::Pattern(content_seed), metadata, fingerprint)
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
}
