//! Parity runs at the receiver ([`ReceiverConfig::parity`], docs/parity.md "Runs"): a PARITY
//! datagram whose group field carries [`RUN_MARK`] is a shard of consecutive small products
//! coded together. The receiver learns the run from it (first product, product count), asks
//! for the run's parity from then on, and decodes the run's lost blocks from the products it
//! holds: those still in flight, and those it delivered lately, whose bytes it keeps for that
//! (`RecentProducts`).

use std::collections::VecDeque;

use crate::index::ProductIndex;
use crate::parity::{ParityConfig, RUN_MARK};
use crate::time::Instant;
use crate::wire::{Body, Message};

use super::parity::HeldShards;
use super::{Assembly, MissReason, Receiver, block_fingerprint};

#[cfg(doc)]
use super::ReceiverConfig;

/// A run being repaired here.
#[derive(Debug)]
pub(super) struct RunRepair {
    /// Its products (from its first, whose key is this run's key).
    count: u16,
    /// Shards held.
    shards: HeldShards,
    /// Lost blocks when the last run request went out.
    asked_for: u32,
    /// Run requests sent.
    rounds: u8,
    /// When to ask again if the run is still incomplete.
    retry_at: Option<Instant>,
    /// Its lost blocks were asked for with RETX_REQ.
    fallback: bool,
}

/// Products of runs kept after their delivery, for the decodes of their runs: small products
/// ([`ParityConfig::in_runs`]) delivered lately, by key, with their bytes (none with
/// [`Assembly::Discard`]), bounded by their blocks.
#[derive(Debug, Default)]
pub(super) struct RecentProducts {
    products: VecDeque<(i64, u32, Vec<u8>)>,
    blocks: u64,
}

/// Blocks of delivered products kept at most: sixteen groups (24 MB at 1024 blocks of 1448
/// bytes; at 100 Mbit/s two seconds of multicast, at 1 Gbit/s 190 ms). A run whose product
/// is no longer kept is repaired by RETX_REQ.
const RECENT_GROUPS: u64 = 16;

/// Runs known at most (the oldest is forgotten).
const RUNS_MAX: usize = 4096;

impl RecentProducts {
    fn keep(&mut self, key: i64, size: u32, bytes: Vec<u8>, parity: &ParityConfig) {
        // (A product whose size is not known here counts as a block.)
        let blocks = parity.blocks(u64::from(size)).max(1);
        let bound = RECENT_GROUPS * u64::from(parity.group_blocks);
        while self.blocks + blocks > bound {
            let Some((_, old_size, _)) = self.products.pop_front() else { break };
            self.blocks -= parity.blocks(u64::from(old_size)).max(1);
        }
        self.products.push_back((key, size, bytes));
        self.blocks += blocks;
    }

    fn get(&self, key: i64) -> Option<(u32, &[u8])> {
        // Kept in delivery order, which is nearly key order: look from the newest.
        self.products.iter().rev().find(|(k, _, _)| *k == key).map(|(_, size, bytes)| (*size, bytes.as_slice()))
    }
}

/// Where a run member's bytes are for a decode.
enum Member {
    /// In flight here: its key and size.
    InFlight(i64, u32),
    /// Delivered here: its key and size.
    Delivered(i64, u32),
}

impl Receiver {
    /// The key product `index` has or would have here.
    fn key_of(&self, index: ProductIndex) -> Option<i64> {
        let (newest, newest_key) = self.newest?;
        Some(newest_key + i64::from(index.serial_difference(newest)?))
    }

    /// The run product `key` belongs to, if one is known here (learnt from a shard, before
    /// or after the product's first message came).
    pub(super) fn run_of(&self, key: i64) -> Option<i64> {
        self.runs
            .range(..=key)
            .next_back()
            .filter(|(first, run)| key < **first + i64::from(run.count))
            .map(|(first, _)| *first)
    }

    /// What the repair of product `key`'s run stands at (empty when it is in no run known here).
    pub(super) fn describe_run(&self, key: i64) -> String {
        let Some(first) = self.run_of(key) else { return String::new() };
        let Some(run) = self.runs.get(&first) else { return String::new() };
        format!(
            "product {} of a run of {}: {} shards for {} lost, round {}{}",
            key - first + 1,
            run.count,
            run.shards.len(),
            run.asked_for,
            run.rounds,
            super::parity::describe_wait(run.fallback, run.retry_at, self.now)
        )
    }

    /// Products `keys` taken whole without their bytes or sizes ([`Assembly::Discard`], a
    /// simulator's [`Receiver::took_whole_products`]): kept as delivered, for their runs'
    /// decodes (which need nothing of them then).
    pub(super) fn keep_taken_whole(&mut self, keys: std::ops::Range<i64>) {
        let Some(parity) = self.parity_in_use() else { return };
        for key in keys.clone() {
            self.recent.keep(key, 0, Vec::new(), &parity);
        }
        // The runs that waited for them (as for a product delivered).
        let waiting: Vec<i64> = self
            .runs
            .iter()
            .filter(|(first, run)| **first < keys.end && keys.start < **first + i64::from(run.count))
            .map(|(first, _)| *first)
            .collect();
        for first in waiting {
            self.try_decode_run(first);
        }
    }

    /// A delivered product: kept for its run's decode if it is small.
    pub(super) fn keep_recent(&mut self, key: i64, size: u32, bytes: Vec<u8>) {
        let Some(parity) = self.parity_in_use() else { return };
        if parity.in_runs(u64::from(size)) {
            self.recent.keep(key, size, bytes, &parity);
        }
    }

    /// Whether a shard of the run of `count` products from `index` would be of use here now: a
    /// product of the run being received here lost blocks (asked for, not received).
    pub(super) fn wants_run_parity(&self, index: ProductIndex, count: u16) -> bool {
        let Some(first) = self.key_of(index).filter(|_| self.parity_in_use().is_some()) else { return false };
        if self.runs.get(&first).is_some_and(|run| run.fallback) {
            return false;
        }
        (first..first + i64::from(count)).filter_map(|key| self.products.get(&key)).any(|product| {
            product.bop.as_ref().is_some_and(|bop| Self::lost_ranges(product, 0, u64::from(bop.size)).next().is_some())
        })
    }

    /// A PARITY datagram of a run: the run learnt, the shard held, a decode tried.
    pub(super) fn on_run_parity(&mut self, index: ProductIndex, count: u16, shard: u8, data: &[u8]) {
        let Some(parity) = self.parity_in_use() else { return };
        let Some(first) = self.key_of(index).filter(|_| count >= 2) else {
            self.counters.parity_unused += 1;
            return;
        };
        let members: Vec<i64> =
            (first..first + i64::from(count)).filter(|key| self.products.contains_key(key)).collect();
        if members.is_empty() {
            self.counters.parity_unused += 1;
            return;
        }
        let discard = self.config.assembly == Assembly::Discard;
        if !self.runs.contains_key(&first) && self.runs.len() >= RUNS_MAX {
            // Forgotten: what its members lost is asked for with RETX_REQ.
            if let Some(oldest) = self.runs.keys().next().copied() {
                self.fallback_run(oldest);
                self.runs.remove(&oldest);
            }
        }
        let run = self.runs.entry(first).or_insert_with(|| RunRepair {
            count,
            shards: HeldShards::default(),
            asked_for: 0,
            rounds: 0,
            retry_at: None,
            fallback: false,
        });
        if run.fallback || run.count != count || run.shards.contains(shard) {
            self.counters.duplicates += 1;
            return;
        }
        run.shards.insert(shard, (!discard).then_some(data));
        self.counters.parity_shards += 1;
        let learnt = run.retry_at.is_none();
        for key in &members {
            if let Some(product) = self.products.get_mut(key) {
                // The run's requests stand for the product's own from now on.
                product.parity.remove(&0);
            }
        }
        if learnt {
            // More shards may be on their way (the sender answered what the products asked
            // for together): ask again only if they do not come.
            let at = self.now + self.parity_rtt.retry_after(parity.retry);
            self.schedule_run_retry(first, at);
        }
        self.try_decode_run(first);
    }

    /// The retry of run `first` at `at`, on every member in flight (any of them may be
    /// delivered or given up before then; a member that comes later asks for itself).
    fn schedule_run_retry(&mut self, first: i64, at: Instant) {
        let Some(run) = self.runs.get_mut(&first) else { return };
        run.retry_at = Some(at);
        let count = i64::from(run.count);
        for key in first..first + count {
            self.parity_timer_by(key, at);
        }
    }

    /// When run `first`'s retry is due, if it has one.
    pub(super) fn run_retry_at(&self, first: i64) -> Option<Instant> {
        self.runs.get(&first).filter(|run| !run.fallback).and_then(|run| run.retry_at)
    }

    /// Lost blocks of run `first` (neither received nor still to come by multicast) over its
    /// members in flight.
    fn run_lost_blocks(&self, first: i64, count: u16, block_len: u64) -> u32 {
        (first..first + i64::from(count))
            .filter_map(|key| self.products.get(&key))
            .filter_map(|product| {
                let size = u64::from(product.bop.as_ref()?.size);
                Some(Self::lost_ranges(product, 0, size).map(|(from, to)| (to - from).div_ceil(block_len)).sum::<u64>())
            })
            .sum::<u64>()
            .min(u64::from(u32::MAX)) as u32
    }

    /// Asks for the parity run `first` still needs (on a new loss, or again when `retry`),
    /// falling back to RETX_REQ when parity cannot repair it.
    pub(super) fn send_run_request(&mut self, first: i64, retry: bool) {
        let Some(parity) = self.parity_in_use() else { return };
        let Some(run) = self.runs.get(&first) else { return };
        if run.fallback {
            // A member that came since asks with RETX_REQ too.
            self.fallback_run(first);
            return;
        }
        let count = run.count;
        let lost = self.run_lost_blocks(first, count, parity.block_len as u64);
        let Some(run) = self.runs.get_mut(&first) else { return };
        let held = run.shards.len() as u32;
        let from = run.shards.last().map_or(0, |last| u32::from(last) + 1);
        let need = lost.saturating_sub(held);
        if need == 0 {
            self.try_decode_run(first);
            if retry {
                // Still not decoded (a member's multicast, BOP or bytes awaited): waited for a
                // round, as for a request, then repaired by RETX_REQ.
                self.wait_for_run(first);
            }
            return;
        }
        if from + need > parity.shards || (retry && run.rounds >= parity.rounds_max) {
            self.fallback_run(first);
            return;
        }
        if !retry && lost <= run.asked_for {
            return;
        }
        run.asked_for = lost;
        run.rounds = run.rounds.saturating_add(1);
        let Some(index) = (first..first + i64::from(count)).find_map(|key| self.products.get(&key).map(|p| p.index))
        else {
            return;
        };
        let at = self.now + self.parity_rtt.retry_after(parity.retry);
        // need ≤ lost, from ≤ shards ≤ 256.
        self.transmits.push_back(Message {
            index,
            body: Body::ParityReq { group: RUN_MARK, need: need.min(u32::from(u16::MAX)) as u16, from: from as u16 },
        });
        self.counters.parity_requests += 1;
        self.schedule_run_retry(first, at);
    }

    /// Run `first`, which holds the shards it needs, waits a round more for what its decode
    /// needs, or falls back after the last round.
    fn wait_for_run(&mut self, first: i64) {
        let Some(parity) = self.parity_in_use() else { return };
        let Some(run) = self.runs.get_mut(&first).filter(|run| !run.fallback) else { return };
        if run.rounds >= parity.rounds_max {
            self.fallback_run(first);
            return;
        }
        run.rounds = run.rounds.saturating_add(1);
        let at = self.now + self.parity_rtt.retry_after(parity.retry);
        self.schedule_run_retry(first, at);
    }

    /// Run `first` cannot be repaired by parity here: its members' lost blocks are asked for
    /// with RETX_REQ, and so are those they lose from now on (again for members that came
    /// since: those already asking with RETX_REQ are left alone).
    fn fallback_run(&mut self, first: i64) {
        let Some(run) = self.runs.get_mut(&first) else { return };
        if !run.fallback {
            run.fallback = true;
            self.counters.parity_fallbacks += 1;
        }
        let count = run.count;
        for key in first..first + i64::from(count) {
            let Some(product) = self.products.get_mut(&key) else { continue };
            let repair = product.parity.get_or_default(0);
            if repair.fallback {
                // (Its losses since were asked for with RETX_REQ as they came.)
                continue;
            }
            repair.fallback = true;
            let Some(size) = product.bop.as_ref().map(|bop| u64::from(bop.size)) else { continue };
            let lost: Vec<(u64, u64)> = Self::lost_ranges(product, 0, size).collect();
            for (from, to) in lost {
                self.retx_request(key, from, to);
            }
        }
    }

    /// Recovers run `first`'s lost blocks once every member has passed and as many shards as
    /// lost blocks are held.
    pub(super) fn try_decode_run(&mut self, first: i64) {
        let Some(parity) = self.parity_in_use() else { return };
        let Some(run) = self.runs.get(&first) else { return };
        if run.fallback || run.shards.is_empty() {
            return;
        }
        let newest = self.newest.map(|(_, key)| key);
        let block_len = parity.block_len as u64;
        let mut members = Vec::with_capacity(usize::from(run.count));
        let mut missing_blocks = 0u64;
        for key in first..first + i64::from(run.count) {
            if let Some(product) = self.products.get(&key) {
                let Some(size) = product.bop.as_ref().map(|bop| bop.size) else { return };
                if !product.passed(&parity, 0) {
                    return;
                }
                missing_blocks += product
                    .received
                    .gaps_iter(0, u64::from(size))
                    .map(|(from, to)| (to - from).div_ceil(block_len))
                    .sum::<u64>();
                members.push(Member::InFlight(key, size));
            } else if let Some((size, _)) = self.recent.get(key) {
                members.push(Member::Delivered(key, size));
            } else if newest.is_none_or(|newest| key > newest) {
                // Not seen yet: its multicast may still come.
                return;
            } else {
                // Missed here, or seen before this receiver began: the run cannot be decoded.
                self.fallback_run(first);
                return;
            }
        }
        if missing_blocks == 0 {
            self.runs.remove(&first);
            return;
        }
        if (run.shards.len() as u64) < missing_blocks {
            return;
        }
        if self.config.assembly == Assembly::Discard {
            self.decode_run_fingerprints(first, &members);
        } else {
            self.decode_run_bytes(first, &members, &parity, missing_blocks as usize);
        }
    }

    /// [`Receiver::try_decode_run`] without bytes: the missing ranges and their fingerprints.
    fn decode_run_fingerprints(&mut self, first: i64, members: &[Member]) {
        let block_len = self.config.parity.map_or(1, |parity| parity.block_len as u64);
        self.runs.remove(&first);
        for member in members {
            let Member::InFlight(key, size) = *member else { continue };
            let Some(source) = self.fingerprint_source.as_mut() else { return };
            let Some(product) = self.products.get_mut(&key) else { continue };
            let mut count = 0;
            for (from, to) in product.received.gaps(0, u64::from(size)) {
                // Within the product (< 4 GiB).
                let fingerprint = (source.0)(product.index, from as u32, to as u32);
                product.received.insert(from, to);
                product.fingerprint = product.fingerprint.wrapping_add(fingerprint);
                count += (to - from).div_ceil(block_len);
            }
            self.run_member_decoded(key, count);
        }
    }

    /// [`Receiver::try_decode_run`] with bytes: the run laid out as the sender coded it (each
    /// member's blocks after the last's, its last block padded), the lost blocks decoded and
    /// taken into their products.
    fn decode_run_bytes(&mut self, first: i64, members: &[Member], parity: &ParityConfig, missing: usize) {
        let block_len = parity.block_len;
        let span = |size: u32| (size as usize).div_ceil(block_len) * block_len;
        let total: usize = members
            .iter()
            .map(|m| {
                span(match m {
                    Member::InFlight(_, s) | Member::Delivered(_, s) => *s,
                })
            })
            .sum();
        let mut bytes = vec![0u8; total];
        // Per member: its key, size, first block in the run, whether in flight.
        let mut layout: Vec<(i64, u32, usize, bool)> = Vec::with_capacity(members.len());
        let mut lost_positions: Vec<u32> = Vec::new();
        let mut at = 0;
        for member in members {
            match *member {
                Member::Delivered(key, size) => {
                    let Some((_, kept)) = self.recent.get(key) else { return };
                    bytes[at..at + size as usize].copy_from_slice(kept);
                    layout.push((key, size, at / block_len, false));
                    at += span(size);
                }
                Member::InFlight(key, size) => {
                    let Some(product) = self.products.get(&key) else { return };
                    let region = &mut bytes[at..at + size as usize];
                    if self.config.assembly == Assembly::Memory {
                        region.copy_from_slice(&product.data[..size as usize]);
                    } else {
                        let index = product.index;
                        let Some(sink) = self.sink.as_mut() else { return };
                        let read = product.received.within(0, u64::from(size)).try_for_each(|(from, to)| {
                            // Within the product (< 4 GiB).
                            sink.0.read_at(index, from as u32, &mut region[from as usize..to as usize])
                        });
                        if read.is_err() {
                            self.counters.sink_failures += 1;
                            self.abandon(key, MissReason::SinkFailed);
                            self.fallback_run(first);
                            return;
                        }
                    }
                    let base = at / block_len;
                    for (from, to) in product.received.gaps(0, u64::from(size)) {
                        let (first_block, end_block) = (from as usize / block_len, (to as usize).div_ceil(block_len));
                        // < group_blocks ≤ 32768.
                        lost_positions.extend((base + first_block..base + end_block).map(|position| position as u32));
                    }
                    layout.push((key, size, base, true));
                    at += span(size);
                }
            }
        }
        lost_positions.sort_unstable();
        lost_positions.dedup();
        let Some(run) = self.runs.get(&first) else { return };
        let shards = run.shards.with_bytes().take(missing);
        let lost = |position| lost_positions.binary_search(&position).is_ok();
        let restored = match self.parity_decoder.decode(parity, &bytes, lost, shards) {
            Ok(restored) => restored,
            Err(_) => {
                self.counters.parity_decode_failures += 1;
                self.fallback_run(first);
                return;
            }
        };
        self.runs.remove(&first);
        let mut recovered: Vec<(i64, u32, Vec<u8>)> = Vec::with_capacity(restored.len());
        for (position, block) in restored {
            let position = position as usize;
            // The member whose blocks hold this position (layout is in block order).
            let slot = layout.partition_point(|(_, _, base, _)| *base <= position) - 1;
            let (key, size, base, in_flight) = layout[slot];
            if !in_flight {
                continue;
            }
            let offset = (position - base) * block_len;
            let len = block_len.min(size as usize - offset);
            // offset < size ≤ u32::MAX.
            recovered.push((key, offset as u32, block[..len].to_vec()));
        }
        let mut counts: Vec<(i64, u64)> = Vec::new();
        for (key, offset, block) in recovered {
            if !self.store(key, offset, &block) {
                continue;
            }
            let Some(product) = self.products.get_mut(&key) else { continue };
            let start = u64::from(offset);
            product.received.insert(start, start + block.len() as u64);
            product.fingerprint = product.fingerprint.wrapping_add(block_fingerprint(offset, &block));
            match counts.last_mut() {
                Some((last, count)) if *last == key => *count += 1,
                _ => counts.push((key, 1)),
            }
        }
        for (key, count) in counts {
            self.run_member_decoded(key, count);
        }
    }

    /// A run member's lost blocks were recovered: `count` of them.
    fn run_member_decoded(&mut self, key: i64, count: u64) {
        if let Some(product) = self.products.get_mut(&key) {
            // Lost on the multicast and repaired: they count as the product's repaired blocks.
            product.retransmitted_blocks = product.retransmitted_blocks.saturating_add(count as u32);
        }
        self.counters.parity_blocks += count;
        self.complete_if_done(key);
    }
}
