//! A product's life here: created (with the in-flight bounds), its BOP, blocks and EOP taken
//! (blocks before the BOP kept as early blocks), its bytes stored (memory, sink or nowhere),
//! and its end: delivered when complete, or abandoned as missed, with RETX_END either way.

use crate::index::ProductIndex;
use crate::ranges::RangeSet;
use crate::wire::{Body, Bop, Message};

use super::{
    Anchor, Assembly, BopInfo, DeliveredProduct, EarlyBlock, Incoming, MissReason, Receiver, ReceiverBound,
    ReceiverEvent, TimerKind, block_fingerprint,
};

impl Receiver {
    /// Starts receiving a product; `ended` when its multicast is already over; `request_bop`
    /// when its BOP was not seen.
    pub(super) fn create(&mut self, key: i64, index: ProductIndex, ended: bool, request_bop: bool) {
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

    pub(super) fn on_bop(&mut self, key: i64, bop: &Bop<'_>, retransmitted: bool) {
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
            Assembly::Memory => take_buffer(&mut self.spare_buffers, bop.product_size as usize),
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

    pub(super) fn on_data(&mut self, key: i64, offset: u32, data: &[u8], retransmitted: bool) {
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
    pub(super) fn on_block(
        &mut self,
        key: i64,
        offset: u32,
        len: u32,
        fingerprint: u64,
        bytes: Vec<u8>,
        retransmitted: bool,
    ) {
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
        if !retransmitted && product.requested.contains(start, end) && !product.received.contains(start, end) {
            // Asked for, then brought by the multicast after all: the request came early.
            self.counters.multicast_after_asked += 1;
        }
        if product.received.insert(start, end) == 0 {
            self.counters.duplicates += 1;
            if retransmitted {
                self.counters.retx_duplicates += 1;
            }
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

    pub(super) fn on_eop(&mut self, key: i64) {
        if let Some(product) = self.products.get_mut(&key) {
            product.eop_seen = true;
        }
        self.end_multicast(key);
    }

    /// The product's multicast is over (EOP, RETX_EOP, a newer product, or the receive
    /// timer): request everything still missing.
    pub(super) fn end_multicast(&mut self, key: i64) {
        let Some(product) = self.products.get_mut(&key) else { return };
        product.ended = true;
        self.multicasting.remove(&key);
        if let Some(size) = product.bop.as_ref().map(|b| u64::from(b.size)) {
            self.request_missing(key, 0, size);
        }
        self.ask_waiting_parity(key);
        if let Some(first) = self.run_of(key) {
            // Its run may have waited for its multicast to pass.
            self.try_decode_run(first);
        }
    }

    /// Keeps a block's bytes where the product is assembled (its buffer, the sink, nowhere);
    /// a sink that fails makes the product missed, and `false` is returned.
    pub(super) fn store(&mut self, key: i64, offset: u32, bytes: &[u8]) -> bool {
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
    pub(super) fn complete_if_done(&mut self, key: i64) -> bool {
        let complete = self
            .products
            .get(&key)
            .is_some_and(|p| p.bop.as_ref().is_some_and(|bop| p.received.contains(0, u64::from(bop.size))));
        if !complete {
            return false;
        }
        let product = self.remove(key).expect("checked above");
        let size = product.bop.as_ref().map_or(0, |bop| bop.size);
        if self.parity_in_use().is_some_and(|parity| parity.in_runs(u64::from(size))) {
            // Kept a while for the decode of its run (docs/parity.md "Runs").
            let kept = match self.config.assembly {
                Assembly::Memory => Some(product.data.clone()),
                Assembly::Discard => Some(Vec::new()),
                Assembly::Sink => self.sink.as_mut().and_then(|sink| {
                    let mut bytes = vec![0u8; size as usize];
                    sink.0.read_at(product.index, 0, &mut bytes).ok().map(|()| bytes)
                }),
            };
            if let Some(bytes) = kept {
                self.keep_recent(key, size, bytes);
            }
        }
        if product.sink_open
            && let Some(sink) = &mut self.sink
        {
            sink.0.close(product.index, true);
        }
        let bop = product.bop.expect("checked above");
        let latency_ns = self.wall_clock.wall_at(self.now).signed_nanos_since(bop.start_time);
        self.end(key, product.index);
        self.counters.delivered += 1;
        self.events.push_back(ReceiverEvent::Delivered(DeliveredProduct {
            index: product.index,
            metadata: bop.metadata,
            data: product.data,
            start_time: bop.start_time,
            completed_at: self.now,
            retransmitted_blocks: product.retransmitted_blocks,
            latency_ns,
            fingerprint: product.fingerprint,
        }));
        if let Some(first) = self.run_of(key) {
            // Its bytes may be what the run's decode waited for.
            self.try_decode_run(first);
        }
        true
    }

    /// Gives up a product: Missed event, and RETX_END unless the sender rejected it.
    pub(super) fn abandon(&mut self, key: i64, reason: MissReason) {
        let Some(product) = self.remove(key) else { return };
        if product.sink_open
            && let Some(sink) = &mut self.sink
        {
            sink.0.close(product.index, false);
        }
        if reason != MissReason::Rejected {
            self.end(key, product.index);
        }
        self.counters.missed += 1;
        self.events.push_back(ReceiverEvent::Missed { index: product.index, reason });
        if let Some(first) = self.run_of(key) {
            // Its run cannot be decoded here any more: its other members ask with RETX_REQ.
            self.try_decode_run(first);
        }
    }

    /// Sends RETX_END for a finished product, or holds it while the product is the first one
    /// and the sender has not confirmed it (see [`Anchor::Tentative`]).
    fn end(&mut self, key: i64, index: ProductIndex) {
        if let Anchor::Tentative { key: anchor, end_held, .. } = &mut self.anchor
            && *anchor == key
        {
            *end_held = true;
            return;
        }
        self.request(Message { index, body: Body::RetxEnd });
        self.counters.retx_ends += 1;
    }

    pub(super) fn remove(&mut self, key: i64) -> Option<Incoming> {
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

    pub(super) fn bound_hit(&mut self, bound: ReceiverBound, index: Option<ProductIndex>) {
        self.counters.bound_hits += 1;
        self.events.push_back(ReceiverEvent::BoundHit { bound, index });
    }
}

/// A zeroed buffer of `len` bytes: the smallest spare that holds it and is not more than twice
/// as large (a small product does not carry a large buffer away), or a new one.
fn take_buffer(spares: &mut Vec<Vec<u8>>, len: usize) -> Vec<u8> {
    let fitting = spares
        .iter()
        .enumerate()
        .filter(|(_, buffer)| buffer.capacity() >= len && buffer.capacity() / 2 <= len)
        .min_by_key(|(_, buffer)| buffer.capacity())
        .map(|(at, _)| at);
    match fitting {
        Some(at) => {
            let mut buffer = spares.swap_remove(at);
            buffer.resize(len, 0);
            buffer
        }
        None => vec![0; len],
    }
}
