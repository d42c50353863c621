//! Product indexes: the keys that unwrap them, what a multicast index or a RETX_EOP says of
//! the products before it (skipped indexes requested, older multicasts ended), and the trust in
//! indexes ([`IndexTrust`]): the first index and far ones asked about with BOP_REQ, the
//! sender's answers confirming or refuting them.

use crate::index::ProductIndex;
use crate::wire::{Body, Message};

use super::{Anchor, Incoming, IndexTrust, MissReason, Receiver, ReceiverBound, ReceiverEvent};

/// Bound of [`Receiver::candidates`].
const CANDIDATES_MAX: usize = 256;

/// Bound of [`Receiver::refuted`].
const REFUTED_MAX: usize = 64;

impl Receiver {
    /// The key of a product being received, if the index is one.
    pub(super) fn known_key(&self, index: ProductIndex) -> Option<i64> {
        self.known(index).map(|(key, _)| key)
    }

    /// The key and state of product `index` if it is being received (one lookup).
    pub(super) fn known(&self, index: ProductIndex) -> Option<(i64, &Incoming)> {
        let (newest, newest_key) = self.newest?;
        let key = newest_key + i64::from(index.serial_difference(newest)?);
        self.products.get(&key).map(|product| (key, product))
    }

    /// Index bookkeeping for a multicast message (§3.9): a newer index ends older products'
    /// multicast and requests skipped indexes; returns the product's key, creating its entry,
    /// or `None` when the message concerns a finished product or is invalid.
    pub(super) fn observe_multicast(&mut self, index: ProductIndex, is_bop: bool) -> Option<i64> {
        let Some((newest, newest_key)) = self.newest else {
            if self.refuted.contains(&index) {
                // The sender said it has no such product: not a first index either.
                self.counters.index_unbelieved += 1;
                return None;
            }
            self.newest = Some((index, 0));
            self.events.push_back(ReceiverEvent::Started { index });
            self.create(0, index, false, !is_bop);
            if let IndexTrust::Confirmed { .. } = self.config.index_trust {
                // Believed once the sender says it has the product (a BOP_REQ went out with the
                // product unless this is its BOP).
                self.anchor = Anchor::Tentative { index, key: 0, end_held: false };
                if is_bop {
                    self.request(Message { index, body: Body::BopReq });
                    self.counters.bop_requests += 1;
                }
                self.counters.index_confirmations += 1;
            }
            return Some(0);
        };
        let Some(difference) = index.serial_difference(newest) else {
            self.counters.malformed += 1;
            return None;
        };
        let key = newest_key + i64::from(difference);
        if let IndexTrust::Confirmed { window } = self.config.index_trust {
            let tentative = self.tentative_anchor().is_some();
            let far = i64::from(difference).unsigned_abs() > u64::from(window);
            if far && !self.products.contains_key(&key) {
                if difference > 0 || tentative {
                    self.unbelieved(index, window);
                } else {
                    // Older than any product this receiver could still be taking.
                    self.counters.index_unbelieved += 1;
                }
                return None;
            }
        }
        self.advance_newest(index, key, difference, is_bop)
    }

    /// A product the sender says it multicast (RETX_EOP): when it is newer than any seen, the
    /// receiver moves there as a multicast message would move it, requesting the skipped
    /// products and this one's BOP (within the trust window; nothing when no product was seen
    /// yet: a session's first product is the first one the multicast shows).
    pub(super) fn announced(&mut self, index: ProductIndex) {
        let Some((newest, newest_key)) = self.newest else { return };
        let Some(difference) = index.serial_difference(newest).filter(|difference| *difference > 0) else { return };
        if let IndexTrust::Confirmed { window } = self.config.index_trust
            && u64::from(difference.unsigned_abs()) > u64::from(window)
        {
            self.counters.index_unbelieved += 1;
            return;
        }
        let key = newest_key + i64::from(difference);
        self.counters.announced += 1;
        self.advance_newest(index, key, difference, false);
    }

    /// Takes a newer index: older products' multicast is over, skipped indexes are requested.
    fn advance_newest(&mut self, index: ProductIndex, key: i64, difference: i32, is_bop: bool) -> Option<i64> {
        let (newest, _) = self.newest?;
        if difference <= 0 {
            if self.products.contains_key(&key) {
                return Some(key);
            }
            if self.eop_seen_last {
                // The EOP of a product completed from its blocks (it need not wait for it).
                self.counters.duplicates += 1;
            } else {
                // A product finished here (or older than the first one): a late copy or a replay.
                self.counters.stale += 1;
            }
            return None;
        }
        // Everything older has finished its multicast: request what it still lacks.
        let older: Vec<i64> = self.multicasting.range(..key).copied().collect();
        for older_key in older {
            self.end_multicast(older_key);
        }
        self.newest = Some((index, key));
        let skipped = (difference - 1) as u32;
        let requested = skipped.min(self.config.index_gap_max);
        if skipped > requested {
            let first = newest.next();
            let last = newest.wrapping_add(skipped - requested);
            self.counters.index_gap_products += u64::from(skipped - requested);
            self.bound_hit(ReceiverBound::IndexGap, None);
            self.events.push_back(ReceiverEvent::IndexGap { first, last });
        }
        for back in (1..=requested).rev() {
            let gap_key = key - i64::from(back);
            self.create(gap_key, index.wrapping_add(back.wrapping_neg()), true, true);
        }
        self.create(key, index, false, !is_bop);
        self.products.contains_key(&key).then_some(key)
    }

    pub(super) fn tentative_anchor(&self) -> Option<(ProductIndex, i64)> {
        match self.anchor {
            Anchor::Tentative { index, key, .. } => Some((index, key)),
            Anchor::Confirmed => None,
        }
    }

    pub(super) fn ask_to_confirm(&mut self, index: ProductIndex) {
        self.request(Message { index, body: Body::BopReq });
        self.counters.bop_requests += 1;
    }

    /// A multicast message whose index is beyond the window: dropped; its index is asked
    /// about once seen twice (one question at a time), unless refuted lately.
    fn unbelieved(&mut self, index: ProductIndex, window: u32) {
        self.counters.index_unbelieved += 1;
        if self.refuted.contains(&index) {
            return;
        }
        if self.candidates.len() >= CANDIDATES_MAX && !self.candidates.contains_key(&index) {
            self.candidates.clear();
        }
        let seen = self.candidates.entry(index).or_insert(0);
        *seen += 1;
        let repeated = *seen == 2;
        if repeated {
            if self.repeated.len() >= REFUTED_MAX {
                self.repeated.pop_front();
            }
            self.repeated.push_back(index);
        }
        if let Some(asked) = self.confirming {
            // The stream goes on from the index asked about, a window at a time.
            let from = self.frontier.unwrap_or(asked);
            if index.serial_difference(from).is_some_and(|d| d > 0 && d.unsigned_abs() <= window) {
                self.frontier = Some(index);
            }
            return;
        }
        if repeated {
            self.confirming = Some(index);
            self.frontier = None;
            self.counters.index_confirmations += 1;
            self.ask_to_confirm(index);
        }
    }

    /// The oldest index seen repeatedly beyond the window that lies within the window before
    /// `index` (the sender confirmed `index`: they are its stream's, seen while the receiver did
    /// not yet know where that stream was).
    fn earliest_repeated_before(&self, index: ProductIndex, window: u32) -> Option<ProductIndex> {
        self.repeated
            .iter()
            .filter_map(|seen| seen.serial_difference(index).filter(|d| *d < 0 && d.unsigned_abs() <= window))
            .min()
            .map(|difference| index.wrapping_add(difference as u32))
    }

    fn refuted(&mut self, index: ProductIndex) {
        self.counters.index_forged += 1;
        if self.refuted.len() >= REFUTED_MAX {
            self.refuted.pop_front();
        }
        self.refuted.push_back(index);
    }

    /// Handles the sender's answer about an index it was asked to confirm; returns whether the
    /// message was one (it is then handled).
    pub(super) fn answers_confirmation(&mut self, message: &Message<'_>) -> bool {
        let confirmed = match message.body {
            Body::RetxBop(_) | Body::RetxData { .. } | Body::RetxEop => true,
            Body::RetxRej => false,
            _ => return false,
        };
        if let Some((index, key)) = self.tentative_anchor().filter(|(index, _)| *index == message.index) {
            let Anchor::Tentative { end_held, .. } = self.anchor else { return false };
            self.anchor = Anchor::Confirmed;
            if confirmed {
                if end_held {
                    self.request(Message { index, body: Body::RetxEnd });
                    self.counters.retx_ends += 1;
                }
                // Handled as any answer for the product (a duplicate BOP, usually).
                return false;
            }
            self.refute_anchor(index, key);
            return true;
        }
        if self.confirming != Some(message.index) {
            return false;
        }
        self.confirming = None;
        let frontier = self.frontier.take();
        let Body::RetxBop(bop) = message.body else {
            if !confirmed {
                self.refuted(message.index);
            }
            return true;
        };
        // The sender has it: the index is real.
        let window = match self.config.index_trust {
            IndexTrust::Confirmed { window } => window,
            IndexTrust::All => u32::MAX,
        };
        let starting = self.tentative_anchor().is_some() || self.newest.is_none();
        let key = match (self.tentative_anchor(), self.newest) {
            (Some((anchor, anchor_key)), _)
                if message.index.serial_difference(anchor).is_some_and(|d| d.unsigned_abs() <= window) =>
            {
                // Near the first index seen: that one is the sender's too.
                let Anchor::Tentative { end_held, .. } = self.anchor else { return true };
                self.anchor = Anchor::Confirmed;
                if end_held {
                    self.request(Message { index: anchor, body: Body::RetxEnd });
                    self.counters.retx_ends += 1;
                }
                let Some(difference) = message.index.serial_difference(anchor) else { return true };
                if difference < 0 {
                    // Older than the first index: the session starts there instead.
                    self.start_earlier(message.index, anchor_key + i64::from(difference), anchor, true);
                    anchor_key + i64::from(difference)
                } else {
                    let Some((newest, newest_key)) = self.newest else { return true };
                    let Some(ahead) = message.index.serial_difference(newest) else { return true };
                    match self.advance_newest(message.index, newest_key + i64::from(ahead), ahead, true) {
                        Some(key) => key,
                        None => return true,
                    }
                }
            }
            (Some((anchor, _)), _) => {
                // The first index seen was not the sender's (it is far from a real one).
                self.refuted(anchor);
                self.discard_all();
                self.anchor_at(message.index)
            }
            (None, None) => self.anchor_at(message.index),
            (None, Some((newest, newest_key))) => {
                let Some(difference) = message.index.serial_difference(newest) else { return true };
                match self.advance_newest(message.index, newest_key + i64::from(difference), difference, true) {
                    Some(key) => key,
                    None => return true,
                }
            }
        };
        self.on_bop(key, &bop, true);
        // At the start, the stream's products seen before the one confirmed are taken too.
        let started = self.events.iter().find_map(|event| match event {
            ReceiverEvent::Started { index } => Some(*index),
            _ => None,
        });
        if let (true, Some(first), Some((newest, newest_key))) = (starting, started, self.newest)
            && let Some(earliest) = self.earliest_repeated_before(first, window)
        {
            let first_key = newest_key + i64::from(first.serial_difference(newest).unwrap_or(0));
            let earliest_key = first_key + i64::from(earliest.serial_difference(first).unwrap_or(0));
            self.start_earlier(earliest, earliest_key, first, false);
        }
        // The messages that came meanwhile went on from it: take the newest of them.
        if let (Some(frontier), Some((newest, newest_key))) = (frontier, self.newest)
            && let Some(difference) = frontier.serial_difference(newest).filter(|d| *d > 0)
        {
            self.advance_newest(frontier, newest_key + i64::from(difference), difference, false);
        }
        true
    }

    /// The session starts at `index` (key `key`), before the first index seen (`first`): the
    /// products between are requested, and [`ReceiverEvent::Started`] names `index`.
    fn start_earlier(&mut self, index: ProductIndex, key: i64, first: ProductIndex, bop_known: bool) {
        for event in &mut self.events {
            if let ReceiverEvent::Started { index: started } = event
                && *started == first
            {
                *started = index;
            }
        }
        let skipped = first.serial_difference(index).unwrap_or(0).max(0) as u32;
        for back in 1..skipped {
            self.create(key + i64::from(back), index.wrapping_add(back), true, true);
        }
        self.create(key, index, true, !bop_known);
    }

    /// Starts over at a confirmed index (nothing held): key 0.
    fn anchor_at(&mut self, index: ProductIndex) -> i64 {
        self.newest = Some((index, 0));
        self.anchor = Anchor::Confirmed;
        self.events.push_back(ReceiverEvent::Started { index });
        self.create(0, index, false, false);
        0
    }

    /// Drops every product and held event (all were after a first index that was not the
    /// sender's).
    fn discard_all(&mut self) {
        let keys: Vec<i64> = self.products.keys().copied().collect();
        for key in keys {
            if let Some(product) = self.remove(key) {
                if product.sink_open
                    && let Some(sink) = &mut self.sink
                {
                    sink.0.close(product.index, false);
                }
                self.counters.started -= 1;
            }
        }
        for event in self.events.drain(..) {
            match event {
                ReceiverEvent::Delivered(_) => {
                    self.counters.delivered -= 1;
                    self.counters.started -= 1;
                }
                ReceiverEvent::Missed { .. } => {
                    self.counters.missed -= 1;
                    self.counters.started -= 1;
                }
                _ => {}
            }
        }
        self.multicasting.clear();
        self.newest = None;
        self.anchor = Anchor::Confirmed;
    }

    /// The sender does not have the first product seen. If a product already finished here
    /// (this one or a later one), the stream is the sender's (a forged first index is far from
    /// every real one) and the product is missed as the sender says. Otherwise the product was
    /// forged, or the sender no longer had it (its deadline passed — then the backlog covers it,
    /// as it covers every product before the one [`ReceiverEvent::Started`] names): it is
    /// dropped, and the oldest product in flight after it, if any, becomes the one to confirm;
    /// else the next message does.
    fn refute_anchor(&mut self, index: ProductIndex, key: i64) {
        let finished =
            self.events.iter().any(|event| matches!(event, ReceiverEvent::Delivered(_) | ReceiverEvent::Missed { .. }));
        if finished || !self.products.contains_key(&key) {
            self.counters.rejects += 1;
            self.abandon(key, MissReason::Rejected);
            return;
        }
        self.refuted(index);
        if let Some(product) = self.remove(key) {
            if product.sink_open
                && let Some(sink) = &mut self.sink
            {
                sink.0.close(product.index, false);
            }
            self.counters.started -= 1;
        }
        self.events.retain(|event| !matches!(event, ReceiverEvent::Started { .. }));
        let next = self.products.iter().next().map(|(key, product)| (*key, product.index));
        match next {
            Some((next_key, next_index)) => {
                self.events.push_front(ReceiverEvent::Started { index: next_index });
                self.anchor = Anchor::Tentative { index: next_index, key: next_key, end_held: false };
                self.counters.index_confirmations += 1;
                self.ask_to_confirm(next_index);
            }
            None => {
                self.newest = None;
                self.multicasting.clear();
            }
        }
    }
}
