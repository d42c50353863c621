//! Repairs over the receivers' TCP connections: requests queued per receiver (within the
//! backlog bounds, data ranges merged), RETX_REJ for products not retained, and the queues
//! served round-robin under the repair token bucket.

use std::ops::Bound::{Excluded, Unbounded};

use crate::index::ProductIndex;
use crate::wire::{Body, HEADER_LEN, MessageType};

use super::{
    DataUnavailable, Destination, REPAIR_ROUND_MIN, ReceiverId, ReceiverState, ReleaseReason, Sender, SenderBound,
    SenderEvent, Transmit, Work, WorkKind, emit_block, emit_control, sync_ready,
};

impl Sender {
    pub(super) fn over_soft_bound(&self, receiver: &ReceiverState) -> bool {
        receiver.backlog_bytes >= self.config.retx_backlog_bytes_max
            || receiver.work.len() >= self.config.retx_backlog_items_max
    }

    pub(super) fn queue_request(&mut self, id: ReceiverId, key: u64, index: ProductIndex, kind: WorkKind) {
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

    pub(super) fn queue_reject(&mut self, id: ReceiverId, index: ProductIndex) {
        if let Some(receiver) = self.receivers.get_mut(&id) {
            self.counters.rejects += 1;
            receiver.push(Work { key: u64::MAX, index, kind: WorkKind::Reject, lost: false });
            sync_ready(&mut self.ready, id, receiver);
        }
    }

    /// The next writable receiver with queued work after the round-robin cursor.
    pub(super) fn next_receiver_to_serve(&self) -> Option<ReceiverId> {
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

    pub(super) fn head_cost(&self, id: ReceiverId) -> usize {
        let Some(work) = self.receivers.get(&id).and_then(|r| r.work.front()) else { return HEADER_LEN };
        match work.kind {
            WorkKind::Data { next, end } => HEADER_LEN + self.config.block_len.min((end - next) as usize),
            WorkKind::Bop => HEADER_LEN + self.products.get(&work.key).map_or(0, |p| 18 + p.metadata.len()),
            WorkKind::Eop | WorkKind::Reject => HEADER_LEN,
        }
    }

    pub(super) fn transmit_repair(&mut self, id: ReceiverId, buf: &mut Vec<u8>) -> Transmit {
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
}
