//! The receiver's public face: the inputs a driver hands it (multicast datagrams, block runs,
//! stream messages, timeouts, the backlog hint, reconnection and disconnection), the outputs it
//! drains (`poll_transmit`, `poll_event`, `poll_timeout`) and the queries on its state.

use std::time::Duration;

use crate::ConfigError;
use crate::index::ProductIndex;
use crate::ranges::RangeSet;
use crate::time::{Instant, WallClock, WallTime};
use crate::wire::{self, BLOCK_LEN, Body, Message};

use super::{
    Anchor, Assembly, BlockRun, EarlyBlock, FingerprintSource, InFlight, Incoming, MissReason, PARITY_DEFER_MAX,
    RETX_EOP_DEFER_MAX, Receiver, ReceiverCounters, ReceiverEvent, SPARE_BUFFER_BYTES_MAX, SPARE_BUFFERS_MAX,
};

#[cfg(doc)]
use super::{IndexTrust, ReceiverConfig, block_fingerprint};

impl Receiver {
    /// With [`Assembly::Discard`] and [`ReceiverConfig::parity`]: where the fingerprints of
    /// blocks recovered from parity come from (`source(index, start, end)` is the sum of the
    /// [`block_fingerprint`]s of the product's blocks in `[start, end)`), as a simulator that
    /// checked the parity it multicast gives them. Without it a discarding receiver asks with
    /// RETX_REQ.
    pub fn set_fingerprint_source(&mut self, source: impl FnMut(ProductIndex, u32, u32) -> u64 + Send + 'static) {
        self.fingerprint_source = Some(FingerprintSource(Box::new(source)));
    }

    /// Whether a parity shard of group `group` of product `index` would be of use here now
    /// (the product is being received, its size is known and the group is incomplete; for a
    /// run's shard, a product of the run is): a simulator hands parity datagrams only to the
    /// receivers that want them.
    pub fn wants_parity(&self, index: ProductIndex, group: u16) -> bool {
        if group >= crate::parity::RUN_MARK {
            return self.wants_run_parity(index, group - crate::parity::RUN_MARK);
        }
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
        self.keep_taken_whole(key + 1..key + 1 + i64::from(count));
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
            if self.backlog {
                // Datagrams received before it wait to be handed over: they may hold the rest of
                // the product and of the products before it, which are taken first
                // ([`RETX_EOP_DEFER_MAX`]).
                self.deferred_eops.push((message.index, self.now));
            } else {
                self.retx_eop(message.index);
            }
            return;
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
            Body::RetxRej => {
                self.counters.rejects += 1;
                self.abandon(key, MissReason::Rejected);
            }
            _ => unreachable!("checked above"),
        }
    }

    /// A RETX_EOP taken (now, or once the driver caught up with the multicast).
    fn retx_eop(&mut self, index: ProductIndex) {
        // The sender's word (its repair connection, not the multicast): a product newer than
        // any seen here was multicast and is over — lost whole, with no later product to
        // reveal the gap (the sender's tail probe, or its release).
        self.announced(index);
        match self.known_key(index) {
            Some(key) => self.on_eop(key),
            // Finished, abandoned or never requested: nothing to do.
            None => self.counters.duplicates += 1,
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

    /// The driver says whether datagrams it received wait to be handed over (read, or still in
    /// its sockets; `true`: this receiver is behind the multicast). Parity requests wait meanwhile, at most
    /// [`PARITY_DEFER_MAX`]: the shards the sender multicast for other receivers' requests
    /// are likely among the waiting datagrams, and a request made before they are handled
    /// asks for them again. On a host whose receivers lag by tens of milliseconds (four on two
    /// vCPUs at 500 Mbit/s), such requests made the sender multicast half as many shards
    /// again as any receiver needed (issue #37). A RETX_EOP waits too, at most
    /// [`RETX_EOP_DEFER_MAX`]: the rest of its product may be among the waiting datagrams. A
    /// driver that never calls this (the simulator) asks at once.
    pub fn set_backlog(&mut self, now: Instant, backlog: bool) {
        self.advance(now);
        self.backlog = backlog;
        if !self.deferred_eops.is_empty() {
            let now = self.now;
            let deferred = std::mem::take(&mut self.deferred_eops);
            for (index, since) in deferred {
                if backlog && now.saturating_duration_since(since) < RETX_EOP_DEFER_MAX {
                    self.deferred_eops.push((index, since));
                } else {
                    self.retx_eop(index);
                }
            }
        }
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
        self.deferred_eops.clear();
        self.anchor = Anchor::Confirmed;
        self.confirming = None;
        let keys: Vec<i64> = self.products.keys().copied().collect();
        for key in keys {
            let Some(product) = self.remove(key) else { continue };
            if product.sink_open
                && let Some(sink) = &mut self.sink
            {
                sink.0.close(product.index, false);
            }
            self.counters.missed += 1;
            self.events.push_back(ReceiverEvent::Missed { index: product.index, reason: MissReason::Disconnected });
        }
        // (Nothing is left to decode.)
        self.runs.clear();
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

    /// Takes back the buffer of a product delivered in memory once the application is done
    /// with it, for a later product (at most [`SPARE_BUFFERS_MAX`] buffers and
    /// [`SPARE_BUFFER_BYTES_MAX`] bytes are kept; the rest are freed). A buffer allocated
    /// afresh for every product cost the receiving host the zeroing of new pages by the kernel,
    /// about a tenth of a receiver's time at 500 Mbit/s of 10 MB products.
    pub fn give_back_buffer(&mut self, mut buffer: Vec<u8>) {
        let kept: usize = self.spare_buffers.iter().map(Vec::capacity).sum();
        if self.config.assembly != Assembly::Memory
            || self.spare_buffers.len() >= SPARE_BUFFERS_MAX
            || kept + buffer.capacity() > SPARE_BUFFER_BYTES_MAX
        {
            return;
        }
        buffer.clear();
        self.spare_buffers.push(buffer);
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
        self.in_flight_for(Duration::ZERO)
    }

    /// [`Receiver::in_flight`], of the products in flight for `age` or longer.
    pub fn in_flight_for(&self, age: Duration) -> Vec<InFlight> {
        // (A product is given up `incomplete_timeout` after its first message.)
        let age_of = |product: &Incoming| {
            self.config.incomplete_timeout.saturating_sub(product.abandon_at.saturating_duration_since(self.now))
        };
        self.products
            .iter()
            .filter(|(_, product)| age_of(product) >= age)
            .map(|(key, product)| InFlight {
                index: product.index,
                size: product.bop.as_ref().map(|bop| bop.size),
                received_bytes: product.received.len(),
                requested_bytes: product.requested.len(),
                ended: product.ended,
                eop_seen: product.eop_seen,
                tentative: self.tentative_anchor().is_some_and(|(index, _)| index == product.index),
                age: age_of(product),
                repair: self.describe_repair(*key, product),
            })
            .collect()
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
}
