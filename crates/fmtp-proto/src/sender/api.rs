//! The sender's public face: the inputs a driver hands it (products, receivers connecting and
//! going, their stream messages, timeouts, rate and RTT hints), the outputs it drains
//! (`poll_transmit`, `poll_event`, `poll_timeout`) and the queries on its state.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::ConfigError;
use crate::index::ProductIndex;
use crate::time::{Instant, WallClock, WallTime};
use crate::wire::{self, Body, METADATA_LEN_MAX, Message};

use super::interest::InterestSet;
use super::{
    EnqueueError, EnqueueRefusal, OutgoingProduct, ReceiverId, ReceiverState, Sender, SenderCounters, SenderEvent,
    SentProduct, Stage, Transmit, WorkKind, sync_ready,
};

#[cfg(doc)]
use super::DeadlinePolicy;

impl Sender {
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
    pub fn enqueue(&mut self, now: Instant, product: OutgoingProduct) -> Result<ProductIndex, EnqueueError> {
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
        let OutgoingProduct { data, metadata } = product;
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
                run: None,
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
                    (Some(key), Some(parity)) => self.parity_request(id, key, group, need, from, &parity),
                    (None, _) => self.queue_reject(id, message.index),
                    (Some(_), None) => self.counters.unexpected += 1,
                }
            }
            Body::RetxEnd => {
                self.counters.retx_ends += 1;
                if let Some(key) = key {
                    self.complete(id, key);
                    if let Some(receiver) = self.receivers.get_mut(&id)
                        && receiver.purge(key)
                    {
                        sync_ready(&mut self.ready, id, receiver);
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
        let Some(cost) = self.next_multicast_len() else {
            if let Some(bucket) = &mut self.multicast_bucket {
                bucket.idle(self.now);
            }
            return None;
        };
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
        [deadline, multicast, repair, probe, self.run_close_at()].into_iter().flatten().min()
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

    /// Takes back the products accepted and not begun (no BOP multicast yet) and returns how
    /// many: an orderly stop finishes the product under way and leaves the rest to the
    /// application, which may hand them to a later sender with the same indexes (from
    /// [`Sender::next_index`], which is the first of them after this).
    pub fn withdraw_unsent(&mut self) -> usize {
        let begun = usize::from(!self.multicast_queue.is_empty() && !matches!(self.stage, Stage::Bop));
        let withdrawn: Vec<u64> = self.multicast_queue.drain(begun..).collect();
        for key in &withdrawn {
            self.products.remove(key);
        }
        if let Some(first) = withdrawn.first() {
            // Multicast goes in key order: no key from the first withdrawn on went out.
            self.next_key = *first;
        }
        withdrawn.len()
    }

    /// Whether every product handed over is done with: idle, and none retained for repairs
    /// (each receiver finished it, or its retransmission deadline passed).
    pub fn is_settled(&self) -> bool {
        self.is_idle() && self.retained_count == 0
    }

    /// Whether nothing is queued: no product waits to be multicast, no repair is queued and no
    /// tail probe is due.
    pub fn is_idle(&self) -> bool {
        self.multicast_queue.is_empty()
            && self.parity_queue.is_empty()
            && self.receivers.values().all(|r| r.work.is_empty())
            && self.tail_probe.is_none()
            && self.repeated_eop.is_none()
            && self.open_run.is_none()
    }
}
