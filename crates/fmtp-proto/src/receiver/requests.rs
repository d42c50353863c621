//! Requests and timers: the RETX_REQs for lost bytes (or, with parity, the groups to ask
//! parity for), the queue of messages for the TCP connection, and the timers (receive timer,
//! incomplete timeout, parity retries) with the receive timer's EOP_REQ.

use std::time::Duration;

use crate::time::{Instant, transmission_time};
use crate::wire::{Body, Message};

use super::parity::codes_product;
use super::{MissReason, ReceiveTimer, Receiver, TimerKind};

impl Receiver {
    pub(super) fn add_timer(&mut self, timer: (Instant, i64, TimerKind)) {
        self.timers.insert(timer);
        self.timers_first = Some(self.timers_first.map_or(timer.0, |first| first.min(timer.0)));
    }

    pub(super) fn remove_timer(&mut self, timer: (Instant, i64, TimerKind)) {
        if self.timers.remove(&timer) && self.timers_first == Some(timer.0) {
            self.timers_first = self.timers.first().map(|(at, _, _)| *at);
        }
    }

    pub(super) fn advance(&mut self, now: Instant) {
        self.now = self.now.max(now);
        if self.timers_first.is_none_or(|first| first > self.now) {
            return;
        }
        while let Some(&(at, key, kind)) = self.timers.first() {
            if at > self.now {
                break;
            }
            self.timers.pop_first();
            self.timers_first = self.timers.first().map(|(at, _, _)| *at);
            match kind {
                TimerKind::Abandon => self.abandon(key, MissReason::TimedOut),
                TimerKind::Receive => self.receive_timer_fired(key),
                TimerKind::Parity => self.parity_timer_fired(key),
            }
        }
    }

    fn receive_timer_fired(&mut self, key: i64) {
        let timer = self.config.receive_timer;
        let now = self.now;
        let Some(product) = self.products.get_mut(&key) else { return };
        product.receive_timer = None;
        let Some(size) = product.bop.as_ref().map(|b| u64::from(b.size)) else { return };
        if product.ended {
            // Its tail was requested when the multicast ended.
            return;
        }
        let due = receive_due(&timer, product.last_multicast, size.saturating_sub(product.multicast_end));
        if due > now {
            product.receive_timer = Some(due);
            self.add_timer((due, key, TimerKind::Receive));
            return;
        }
        let (index, eop_seen, eop_requested) = (product.index, product.eop_seen, product.eop_requested);
        product.eop_requested = true;
        self.end_multicast(key);
        if !eop_seen && !eop_requested && self.products.contains_key(&key) {
            self.request(Message { index, body: Body::EopReq });
            self.counters.eop_requests += 1;
        }
    }

    pub(super) fn schedule_receive_timer(&mut self, key: i64) {
        let timer = self.config.receive_timer;
        let Some(product) = self.products.get_mut(&key) else { return };
        let Some(size) = product.bop.as_ref().map(|b| u64::from(b.size)) else { return };
        if product.receive_timer.is_some() {
            return;
        }
        let due = receive_due(&timer, product.last_multicast, size.saturating_sub(product.multicast_end));
        product.receive_timer = Some(due);
        self.add_timer((due, key, TimerKind::Receive));
    }

    /// Requests the bytes of `[start, end)` neither received nor requested yet, coalesced: as
    /// parity of their groups when parity is in use, else (and for groups that fell back) with
    /// RETX_REQ.
    pub(super) fn request_missing(&mut self, key: i64, start: u64, end: u64) {
        let parity = self.parity_in_use();
        let Some(product) = self.products.get_mut(&key) else { return };
        let size = product.bop.as_ref().map_or(0, |bop| u64::from(bop.size));
        let parity = parity.filter(|parity| codes_product(parity, size));
        let mut ranges = Vec::new();
        let mut groups: Vec<u16> = Vec::new();
        for (gap_start, gap_end) in product.received.gaps_iter(start, end) {
            for (from, to) in product.requested.gaps(gap_start, gap_end) {
                product.requested.insert(from, to);
                let Some(parity) = &parity else {
                    ranges.push((from, to));
                    continue;
                };
                let mut at = from;
                while at < to {
                    // < 2¹⁶ groups (checked above).
                    let group = parity.group_of(at) as u16;
                    let (_, group_end, _) = parity.group_range(u32::from(group), size);
                    let piece_end = group_end.min(to);
                    if product.parity.get(&group).is_some_and(|repair| repair.fallback) {
                        ranges.push((at, piece_end));
                    } else if groups.last() != Some(&group) {
                        groups.push(group);
                    }
                    at = piece_end;
                }
            }
        }
        for (from, to) in ranges {
            self.retx_request(key, from, to);
        }
        for group in groups {
            self.ask_parity_when_passed(key, group);
        }
    }

    /// RETX_REQs for `[from, to)` (already marked requested).
    pub(super) fn retx_request(&mut self, key: i64, from: u64, to: u64) {
        let chunk = u64::from(self.config.request_len_max);
        let Some(product) = self.products.get(&key) else { return };
        let index = product.index;
        let mut at = from;
        while at < to {
            let len = chunk.min(to - at);
            // at < size ≤ u32::MAX and len ≤ request_len_max ≤ u16::MAX.
            self.transmits.push_back(Message { index, body: Body::RetxReq { offset: at as u32, len: len as u16 } });
            self.counters.retx_requests += 1;
            at += len;
        }
        self.counters.retx_request_bytes += to - from;
    }

    pub(super) fn request(&mut self, message: Message<'static>) {
        self.transmits.push_back(message);
    }
}

fn receive_due(timer: &ReceiveTimer, last_multicast: Instant, remaining_bytes: u64) -> Instant {
    let transfer = transmission_time(remaining_bytes, timer.rate_bits_per_s);
    let scaled = Duration::try_from_secs_f64(transfer.as_secs_f64() * timer.factor).unwrap_or(Duration::MAX);
    last_multicast + timer.slack + scaled
}
