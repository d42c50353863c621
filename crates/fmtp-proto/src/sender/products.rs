//! Products from their EOP to their release: numbering (keys and indexes), time moving
//! (deadlines, tail probes), the multicast's progress, a receiver's RETX_END (completion),
//! the retained-products bound, and the release with its RETX_EOPs and RETX_REJs.

use std::collections::VecDeque;
use std::time::Duration;

use crate::index::ProductIndex;
use crate::time::{Instant, transmission_time};

use super::interest::Interest;
use super::{
    Completion, CompletionOutcome, DeadlinePolicy, ReceiverId, ReleaseReason, Sender, SenderBound, SenderEvent,
    SentProduct, Stage, TAIL_PROBES_MAX, Work, WorkKind, sync_ready,
};

impl Sender {
    pub(super) fn index_of(&self, key: u64) -> ProductIndex {
        // Indexes wrap: the low 32 bits of the key count.
        self.config.first_index.wrapping_add(key as u32)
    }

    /// The key of a retained product with this index (serial arithmetic against the newest).
    pub(super) fn key_of(&self, index: ProductIndex) -> Option<u64> {
        let newest_key = self.next_key.checked_sub(1)?;
        let difference = index.serial_difference(self.index_of(newest_key))?;
        let key = i128::from(newest_key) + i128::from(difference);
        let key = u64::try_from(key).ok()?;
        self.products.contains_key(&key).then_some(key)
    }

    /// Moves time forward and releases products whose deadline passed.
    pub(super) fn advance(&mut self, now: Instant) {
        self.now = self.now.max(now);
        while let Some(&(at, key)) = self.deadlines.first() {
            if at > self.now {
                break;
            }
            self.release(key, ReleaseReason::DeadlinePassed);
        }
        self.close_due_run();
        if let Some((at, key)) = self.tail_probe
            && at <= self.now
        {
            self.tail_probe = None;
            // A product waiting to be multicast will reveal the gap itself.
            if self.multicast_queue.is_empty() {
                self.probe_tail(key);
            }
        }
    }

    /// RETX_EOP of the last product multicast to every receiver that has not finished it, and
    /// its EOP multicast again; the next probe, while one has not finished it.
    fn probe_tail(&mut self, key: u64) {
        let Some(product) = self.products.get(&key) else { return };
        let index = product.index;
        if !product.interest.any_pending() {
            return;
        }
        if self.repeated_eop.is_none() {
            self.repeated_eop = Some(index);
        }
        let (probes, wait) = self.tail_probes;
        if probes < TAIL_PROBES_MAX {
            self.tail_probes = (probes + 1, wait * 2);
            if probes + 1 < TAIL_PROBES_MAX {
                self.tail_probe = Some((self.now + wait * 2, key));
            }
        }
        for (id, receiver) in &mut self.receivers {
            if product.interest.get(*id) != Some(Interest::Pending)
                || receiver.work.iter().any(|work| work.key == key && matches!(work.kind, WorkKind::Eop))
            {
                continue;
            }
            receiver.push(Work { key, index, kind: WorkKind::Eop, lost: false });
            sync_ready(&mut self.ready, *id, receiver);
            self.counters.tail_probes += 1;
        }
    }

    fn deadline_for(&self, size: u32) -> Duration {
        match self.config.deadline {
            DeadlinePolicy::Constant(duration) => duration,
            DeadlinePolicy::Proportional { f_snd, min } => {
                let transfer = self
                    .config
                    .multicast_pacing
                    .map_or(Duration::ZERO, |p| transmission_time(u64::from(size), p.rate_bits_per_s));
                let scaled = Duration::try_from_secs_f64(transfer.as_secs_f64() * f_snd).unwrap_or(Duration::MAX);
                let rtt_max = self.receivers.values().map(|r| r.rtt).max().unwrap_or(Duration::ZERO);
                scaled.max(rtt_max).max(min)
            }
        }
    }

    /// Bytes of a product the multicast has sent so far.
    pub(super) fn multicast_progress(&self, key: u64) -> u32 {
        let Some(product) = self.products.get(&key) else { return 0 };
        Self::progress_of(product, key, &self.multicast_queue, self.stage)
    }

    /// [`Sender::multicast_progress`] of `product` (key `key`).
    fn progress_of(product: &SentProduct, key: u64, multicast_queue: &VecDeque<u64>, stage: Stage) -> u32 {
        if product.deadline.is_some() {
            return product.size;
        }
        match (multicast_queue.front() == Some(&key), stage) {
            (true, Stage::Data(offset)) => offset,
            (true, Stage::Eop) => product.size,
            _ => 0,
        }
    }

    /// A receiver's RETX_END for a retained product: marks it done and, the first time, emits
    /// [`SenderEvent::Completed`].
    pub(super) fn complete(&mut self, id: ReceiverId, key: u64) {
        // One lookup of each (a RETX_END comes from every receiver for every product).
        let Some(product) = self.products.get_mut(&key) else { return };
        let multicast_ended = Self::progress_of(product, key, &self.multicast_queue, self.stage) >= product.size;
        let Some(receiver) = self.receivers.get(&id) else { return };
        let awaits_repairs =
            receiver.work_per_key.contains_key(&key) && receiver.work.iter().any(|w| w.key == key && w.lost);
        let rtt = receiver.rtt;
        if product.interest.finish(id) == Some(Interest::Done) {
            return;
        }
        let outcome =
            if multicast_ended && !awaits_repairs { CompletionOutcome::Whole } else { CompletionOutcome::GaveUp };
        let repair_rounds = product.interest.take_rounds(id);
        self.counters.completions += 1;
        if outcome == CompletionOutcome::GaveUp {
            self.counters.completions_given_up += 1;
        }
        self.events.push_back(SenderEvent::Completed(Completion {
            index: product.index,
            receiver: id,
            at: self.now,
            size: product.size,
            rtt,
            repair_rounds,
            outcome,
        }));
    }

    /// The EOP went out: start the deadline, and release at once if nobody is interested.
    pub(super) fn finish_multicast(&mut self, key: u64) {
        self.multicast_queue.pop_front();
        self.stage = Stage::Bop;
        let Some(product) = self.products.get(&key) else { return };
        let (index, size, failed) = (product.index, product.size, product.failed);
        self.counters.products_sent += 1;
        self.events.push_back(SenderEvent::Sent { index, size });
        if failed {
            self.release(key, ReleaseReason::DataUnavailable);
            return;
        }
        let deadline = self.now + self.deadline_for(size);
        if let Some(product) = self.products.get_mut(&key) {
            product.deadline = Some(deadline);
        }
        self.deadlines.insert((deadline, key));
        self.retained_count += 1;
        self.run_product_sent(key);
        self.release_if_done(key);
        let pending = self.products.get(&key).is_some_and(|p| p.interest.any_pending());
        self.tail_probe = match self.config.tail_probe {
            Some(delay) if pending && self.multicast_queue.is_empty() => {
                let rtt_max = self.receivers.values().map(|r| r.rtt).max().unwrap_or(Duration::ZERO);
                let wait = delay.max(rtt_max * 2);
                self.tail_probes = (0, wait);
                Some((self.now + wait, key))
            }
            _ => None,
        };
        while self.retained_count > self.config.retained_products_max {
            let Some(oldest) = self.products.iter().find(|(_, p)| p.deadline.is_some()).map(|(k, _)| *k) else {
                break;
            };
            if !self.retained_bound_hit {
                self.retained_bound_hit = true;
                self.counters.bound_hits += 1;
                self.events.push_back(SenderEvent::BoundHit { bound: SenderBound::RetainedProducts, receiver: None });
            }
            self.release(oldest, ReleaseReason::Evicted);
        }
        if self.retained_count < self.config.retained_products_max {
            self.retained_bound_hit = false;
        }
    }

    pub(super) fn release_if_done(&mut self, key: u64) {
        let done = self.products.get(&key).is_some_and(|p| p.deadline.is_some() && !p.interest.any_pending());
        if done && !self.held_for_run(key) {
            self.release(key, ReleaseReason::AllDone);
        }
    }

    pub(super) fn release(&mut self, key: u64, reason: ReleaseReason) {
        let Some(product) = self.products.remove(&key) else { return };
        if let Some(first) = product.run {
            self.run_product_released(first, key, reason);
        }
        if let Some(deadline) = product.deadline {
            self.deadlines.remove(&(deadline, key));
            self.retained_count -= 1;
        } else if let Some(position) = self.multicast_queue.iter().position(|k| *k == key) {
            // Released before its multicast finished (data unavailable mid-product).
            self.multicast_queue.remove(position);
            if position == 0 {
                self.stage = Stage::Bop;
            }
        }
        let unfinished: Vec<ReceiverId> = product.interest.pending().collect();
        // Only the receivers still pending and those that asked for repairs can have work queued
        // for it (work for a product is queued on a request, or as a tail probe to a pending
        // receiver, and purged at the RETX_END that ends the request's entry): the others are
        // left as they are, not visited.
        let mut concerned: Vec<ReceiverId> = unfinished.iter().copied().chain(product.interest.asking()).collect();
        concerned.sort_unstable();
        concerned.dedup();
        for id in concerned {
            let Some(receiver) = self.receivers.get_mut(&id) else { continue };
            let purged = receiver.purge(key);
            if product.interest.get(id) == Some(Interest::Pending) {
                receiver.push(Work { key, index: product.index, kind: WorkKind::Eop, lost: false });
            }
            if purged {
                self.counters.rejects += 1;
                receiver.push(Work { key, index: product.index, kind: WorkKind::Reject, lost: false });
            }
            sync_ready(&mut self.ready, id, receiver);
        }
        debug_assert!(self.receivers.values().all(|receiver| {
            !receiver.work_per_key.contains_key(&key)
                || receiver
                    .work
                    .iter()
                    .any(|work| work.key == key && matches!(work.kind, WorkKind::Eop | WorkKind::Reject))
        }));
        match reason {
            ReleaseReason::AllDone => self.counters.released_all_done += 1,
            ReleaseReason::DeadlinePassed => self.counters.released_deadline += 1,
            ReleaseReason::Evicted => self.counters.released_evicted += 1,
            ReleaseReason::DataUnavailable => self.counters.released_data_unavailable += 1,
        }
        self.events.push_back(SenderEvent::Released { index: product.index, reason, unfinished });
    }
}
