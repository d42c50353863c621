//! Parity runs ([`SenderConfig::parity`], docs/parity.md "Runs"): consecutive small products
//! coded together as one group.
//!
//! The shards a group costs are about the largest loss count among the receivers in it, and
//! that grows slower than the group: a product of a few blocks coded alone costs nearly a
//! shard whenever any receiver lost any of its blocks, as unicast repair would. So products of
//! at most half a group ([`ParityConfig::in_runs`]) join the *run* open when their BOP goes
//! out, as long as its blocks stay within a group; a run closes when a product does not fit
//! (or is not small), or [`RUN_OPEN_MAX`] after its first product's EOP. At the close it is
//! coded: its products' blocks one after another, each product's last block padded with zeros.
//!
//! A receiver does not know the run of a product before a shard of it comes: it asks for the
//! product's parity (group 0, its lost blocks), and the sender keeps those requests per
//! receiver and product and answers, once the run is closed, with as many run shards as the
//! receiver's products of the run need together (less those on their way). Each shard names
//! the run (its first product and product count); from then on the receiver asks for the
//! run's parity ([`RUN_MARK`]) with the count it still needs. A run of one product is no run:
//! at the close it is dissolved and its requests are answered with the product's own parity,
//! as for a product that is not small. The products of a run are released only once it is
//! closed (its coding reads them).

use std::collections::BTreeMap;

use crate::index::ProductIndex;
use crate::parity::{ParityConfig, RUN_MARK, RUN_OPEN_MAX, RUN_PRODUCTS_MAX};
use crate::time::Instant;
use crate::wire::Message;

use super::parity::{ShardState, choose_shards, multicast_shard, parity_body};
use super::{ReceiverId, ReleaseReason, Sender, Transmit};

#[cfg(doc)]
use super::SenderConfig;

/// Consecutive small products coded as one group.
#[derive(Debug)]
pub(super) struct Run {
    /// Its first product's index.
    first_index: ProductIndex,
    /// Its products' keys, consecutive.
    keys: Vec<u64>,
    /// Their data blocks together.
    blocks: u32,
    /// When it closes at the latest (set at its first product's EOP).
    close_at: Option<Instant>,
    /// No product joins any more; coded unless dissolved.
    closed: bool,
    /// A product of it was released before it closed: it cannot be coded.
    broken: bool,
    /// Every shard, from the close.
    shards: Vec<Vec<u8>>,
    /// Per shard index.
    sent: Vec<ShardState>,
    /// The shards each receiver asked for per product of the run (a request for a product's
    /// parity, before it knew the run), by product key.
    needs: BTreeMap<ReceiverId, BTreeMap<u64, u16>>,
    /// Products of it not released yet.
    retained: usize,
    /// Products every receiver finished that wait for the close to be released.
    release_held: Vec<u64>,
}

impl Sender {
    /// The product `key`'s BOP goes out: it joins the open run if it is small and fits, which
    /// otherwise closes (and a small product opens the next one).
    pub(super) fn join_run(&mut self, key: u64) {
        let Some(parity) = self.config.parity.filter(|_| self.config.parity_runs) else { return };
        let Some(product) = self.products.get(&key) else { return };
        let size = u64::from(product.size);
        let index = product.index;
        if let Some(first) = self.open_run {
            let fits = parity.in_runs(size)
                && self.runs.get(&first).is_some_and(|run| {
                    u64::from(run.blocks) + parity.blocks(size) <= u64::from(parity.group_blocks)
                        && run.keys.len() < RUN_PRODUCTS_MAX
                });
            if !fits {
                self.close_run(first);
            }
        }
        if !parity.in_runs(size) {
            return;
        }
        let first = *self.open_run.get_or_insert(key);
        let run = self.runs.entry(first).or_insert_with(|| Run {
            first_index: index,
            keys: Vec::new(),
            blocks: 0,
            close_at: None,
            closed: false,
            broken: false,
            shards: Vec::new(),
            sent: Vec::new(),
            needs: BTreeMap::new(),
            retained: 0,
            release_held: Vec::new(),
        });
        run.keys.push(key);
        // ≤ group_blocks / 2.
        run.blocks += parity.blocks(size) as u32;
        run.retained += 1;
        if let Some(product) = self.products.get_mut(&key) {
            product.run = Some(first);
        }
    }

    /// The product `key`'s EOP went out: the first product of the open run starts its clock.
    pub(super) fn run_product_sent(&mut self, key: u64) {
        let now = self.now;
        if let Some(run) = self.open_run.filter(|first| *first == key).and_then(|first| self.runs.get_mut(&first)) {
            run.close_at.get_or_insert(now + RUN_OPEN_MAX);
        }
    }

    /// When the open run closes, if it has a time yet.
    pub(super) fn run_close_at(&self) -> Option<Instant> {
        self.open_run.and_then(|first| self.runs.get(&first)).and_then(|run| run.close_at)
    }

    /// Closes the open run if its time came.
    pub(super) fn close_due_run(&mut self) {
        if let (Some(first), Some(at)) = (self.open_run, self.run_close_at())
            && at <= self.now
        {
            self.close_run(first);
        }
    }

    /// Closes a run: codes it and answers the requests that waited, or dissolves it (one
    /// product, or one gone); then releases the products that waited for it.
    fn close_run(&mut self, first: u64) {
        let Some(parity) = self.config.parity else { return };
        if self.open_run == Some(first) {
            self.open_run = None;
        }
        let Some(run) = self.runs.get_mut(&first) else { return };
        run.closed = true;
        let coded = run.keys.len() >= 2 && !run.broken && self.code_run(first, &parity);
        if !coded {
            self.dissolve_run(first, &parity);
            return;
        }
        let Some(run) = self.runs.get_mut(&first) else { return };
        let totals: Vec<(ReceiverId, u16)> = run
            .needs
            .iter()
            .map(|(id, needs)| (*id, needs.values().fold(0u16, |sum, need| sum.saturating_add(*need))))
            .collect();
        let held = std::mem::take(&mut run.release_held);
        for (id, total) in totals {
            let on_its_way = self.product_request_on_its_way(id);
            self.queue_run_parity(id, first, total, 0, on_its_way);
        }
        // (Requests of receivers gone since are skipped by `queue_run_parity`.)
        for key in held {
            self.release_if_done(key);
        }
    }

    /// Computes a run's shards from its products' bytes; `false` when one cannot be read.
    fn code_run(&mut self, first: u64, parity: &ParityConfig) -> bool {
        let Some(run) = self.runs.get_mut(&first) else { return false };
        let block_len = parity.block_len;
        let bytes = self.parity_encoder.group_buffer(run.blocks as usize * block_len);
        let mut at = 0;
        for key in &run.keys {
            let Some(product) = self.products.get(key) else { return false };
            let size = product.size as usize;
            let span = size.div_ceil(block_len) * block_len;
            if product.data.read_at(0, &mut bytes[at..at + size]).is_err() {
                return false;
            }
            bytes[at + size..at + span].fill(0);
            at += span;
        }
        run.shards = self.parity_encoder.encode_filled(parity).expect("a validated configuration codes any run");
        run.sent = vec![ShardState::Unsent; run.shards.len()];
        self.counters.parity_runs_coded += 1;
        true
    }

    /// A run that will not be coded: its products are on their own again, and the requests
    /// for their parity are answered with their own groups'.
    fn dissolve_run(&mut self, first: u64, parity: &ParityConfig) {
        let Some(run) = self.runs.remove(&first) else { return };
        for key in &run.keys {
            if let Some(product) = self.products.get_mut(key) {
                product.run = None;
            }
        }
        for (id, needs) in run.needs {
            for (key, need) in needs {
                self.queue_parity(id, key, 0, need, 0, parity);
            }
        }
        for key in run.release_held {
            self.release_if_done(key);
        }
    }

    /// A PARITY_REQ for product `key`: of the product's own group, of its run as the receiver
    /// knows it ([`RUN_MARK`]), or of group 0 of a product in a run (the receiver does not know
    /// the run yet).
    pub(super) fn parity_request(
        &mut self,
        id: ReceiverId,
        key: u64,
        group: u16,
        need: u16,
        from: u16,
        parity: &ParityConfig,
    ) {
        let run = self.products.get(&key).and_then(|product| product.run);
        match run {
            Some(first) if group == RUN_MARK => {
                if self.runs.get(&first).is_some_and(|run| run.closed) && need > 0 {
                    self.asked_for_run(id, key);
                    let on_its_way = self.shard_on_its_way(id);
                    self.queue_run_parity(id, first, need, from, on_its_way);
                } else {
                    self.counters.retx_requests_empty += 1;
                }
            }
            Some(first) if group == 0 && need > 0 => {
                self.asked_for_run(id, key);
                let Some(run) = self.runs.get_mut(&first) else { return };
                let needs = run.needs.entry(id).or_default();
                needs.insert(key, need);
                let total = needs.values().fold(0u16, |sum, need| sum.saturating_add(*need));
                if run.closed {
                    let on_its_way = self.product_request_on_its_way(id);
                    self.queue_run_parity(id, first, total, 0, on_its_way);
                }
            }
            _ if group >= RUN_MARK => self.counters.retx_requests_empty += 1,
            _ => self.queue_parity(id, key, group, need, from, parity),
        }
    }

    /// Receiver `id` asked for repairs of product `key` (its interest, its rounds).
    fn asked_for_run(&mut self, id: ReceiverId, key: u64) {
        let now = self.now;
        let round = self.receivers.get(&id).map_or(super::REPAIR_ROUND_MIN, |r| r.rtt.max(super::REPAIR_ROUND_MIN));
        if let Some(product) = self.products.get_mut(&key) {
            product.asked_by(id, now, round);
        }
    }

    /// How long a run's shard counts as on its way to a receiver that asked for its products'
    /// parity, not knowing the run: at least [`RUN_OPEN_MAX`]. Such a receiver has not yet
    /// handled any shard of the run (or lost them all), and its requests for the run's products
    /// add up: a request for a second product that comes while the shards answering the first
    /// are still in its socket would otherwise have them multicast again. (It asks again only
    /// after waiting RUN_OPEN_MAX more than for a product's own group.)
    fn product_request_on_its_way(&self, id: ReceiverId) -> std::time::Duration {
        self.shard_on_its_way(id).max(RUN_OPEN_MAX)
    }

    /// Queues shards of a closed run for a receiver that needs `need` more of index `from` or
    /// above (as [`Sender::queue_parity`] for a group), counting as on their way to it the
    /// shards multicast less than `on_its_way` ago.
    fn queue_run_parity(&mut self, id: ReceiverId, first: u64, need: u16, from: u16, on_its_way: std::time::Duration) {
        let now = self.now;
        if !self.receivers.contains_key(&id) {
            return;
        }
        let Some(run) = self.runs.get_mut(&first) else { return };
        if run.sent.is_empty() {
            return;
        }
        let (chosen, shortfall) = choose_shards(&mut run.sent, need, from, now, on_its_way);
        for j in chosen {
            // j < shards ≤ 256.
            self.parity_queue.push_back((first, RUN_MARK, j as u8));
        }
        self.counters.parity_shortfall += shortfall as u64;
    }

    /// Multicasts shard `shard` of the run whose first product is `first`.
    pub(super) fn transmit_run_parity(
        &mut self,
        buf: &mut Vec<u8>,
        first: u64,
        shard: u8,
        parity: &ParityConfig,
    ) -> Option<Transmit> {
        let run = self.runs.get_mut(&first)?;
        *run.sent.get_mut(usize::from(shard))? = ShardState::Sent(self.now);
        // ≤ RUN_PRODUCTS_MAX < RUN_MARK.
        let group = RUN_MARK | run.keys.len() as u16;
        let message = Message { index: run.first_index, body: parity_body(parity, group, shard, &run.shards) };
        Some(multicast_shard(&mut self.multicast_bucket, &mut self.counters, buf, &message))
    }

    /// Whether product `key` must wait for its run to close before it is released.
    pub(super) fn held_for_run(&mut self, key: u64) -> bool {
        let Some(first) = self.products.get(&key).and_then(|product| product.run) else { return false };
        let Some(run) = self.runs.get_mut(&first).filter(|run| !run.closed) else { return false };
        if !run.release_held.contains(&key) {
            run.release_held.push(key);
        }
        true
    }

    /// Product `key` of run `first` was released (`reason`).
    pub(super) fn run_product_released(&mut self, first: u64, key: u64, reason: ReleaseReason) {
        let Some(run) = self.runs.get_mut(&first) else { return };
        run.retained -= 1;
        run.release_held.retain(|held| *held != key);
        if !run.closed && reason != ReleaseReason::AllDone {
            run.broken = true;
        }
        if run.closed && run.retained == 0 {
            self.runs.remove(&first);
        }
    }
}
