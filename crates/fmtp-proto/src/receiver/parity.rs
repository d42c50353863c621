//! Repair by parity ([`ReceiverConfig::parity`]): lost blocks asked for as parity of their
//! block group once the multicast passed it (PARITY_REQ, retried after a wait derived from the
//! measured answer time, falling back to RETX_REQ), shards held and groups decoded.

use std::time::Duration;

use crate::index::ProductIndex;
use crate::parity::{ParityConfig, RUN_MARK, RUN_OPEN_MAX};
use crate::time::Instant;
use crate::wire::{Body, Message};

use super::{Assembly, Incoming, MissReason, Receiver, TimerKind, block_fingerprint};

#[cfg(doc)]
use super::ReceiverConfig;

impl Receiver {
    /// Asks for the parity of `group` (which lost blocks) once the multicast has passed it: a
    /// group still being multicast may lose more, and one PARITY_REQ then asks for all of them
    /// (the shards of a group can be decoded only after it passed anyway). Only the group being
    /// multicast can wait, so a product has at most one waiting.
    pub(super) fn ask_parity_when_passed(&mut self, key: i64, group: u16) {
        let Some(parity) = self.parity_in_use() else { return };
        let Some(product) = self.products.get_mut(&key) else { return };
        if !product.passed(&parity, group) {
            let waiting = product.parity_waiting.replace(group);
            self.parity_waiting_products += u32::from(waiting.is_none());
            if let Some(earlier) = waiting.filter(|&earlier| earlier != group) {
                self.ask_parity(key, earlier, false);
            }
            return;
        }
        self.ask_parity(key, group, false);
    }

    /// Sends the PARITY_REQ of the product's waiting group if the multicast has passed it.
    pub(super) fn ask_waiting_parity(&mut self, key: i64) {
        let Some(product) = self.products.get_mut(&key) else { return };
        let Some(group) = product.parity_waiting else { return };
        let Some(parity) = self.config.parity else { return };
        if product.passed(&parity, group) {
            product.parity_waiting = None;
            self.parity_waiting_products -= 1;
            self.ask_parity(key, group, false);
        }
    }

    /// The parity settings that repair a product of `size` bytes ([`codes_product`]).
    pub(super) fn parity_for(&self, size: u64) -> Option<ParityConfig> {
        self.parity_in_use().filter(|parity| codes_product(parity, size))
    }

    /// The parity settings when this receiver repairs by parity.
    pub(super) fn parity_in_use(&self) -> Option<ParityConfig> {
        let parity = self.config.parity?;
        match self.config.assembly {
            Assembly::Memory => Some(parity),
            Assembly::Discard if self.fingerprint_source.is_some() => Some(parity),
            Assembly::Sink if self.sink.as_ref().is_some_and(|sink| sink.0.reads_back()) => Some(parity),
            _ => None,
        }
    }

    /// Blocks of `[start, end)` neither received nor still to come by multicast (asked for).
    fn lost_blocks(product: &Incoming, start: u64, end: u64, block_len: u64) -> u32 {
        let lost: u64 = Self::lost_ranges(product, start, end).map(|(from, to)| (to - from).div_ceil(block_len)).sum();
        // ≤ the blocks of a group ≤ 32768.
        lost as u32
    }

    /// The ranges of `[start, end)` neither received nor still to come by multicast (asked for).
    pub(super) fn lost_ranges(product: &Incoming, start: u64, end: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        product.received.gaps_iter(start, end).flat_map(|(from, to)| product.requested.within(from, to))
    }

    /// Asks for the parity shards a group still needs (on a new loss, or again when
    /// `retry`), falling back to RETX_REQ when parity cannot repair it.
    fn ask_parity(&mut self, key: i64, group: u16, retry: bool) {
        if self.backlog {
            // One entry per group; a retry held after a first ask stays a retry.
            match self.deferred_parity.iter_mut().find(|(k, g, _, _)| (*k, *g) == (key, group)) {
                Some((_, _, held_retry, _)) => *held_retry |= retry,
                None => self.deferred_parity.push((key, group, retry, self.now)),
            }
            return;
        }
        self.send_parity_request(key, group, retry);
    }

    /// [`Receiver::ask_parity`], now.
    pub(super) fn send_parity_request(&mut self, key: i64, group: u16, retry: bool) {
        let Some(parity) = self.parity_in_use() else { return };
        let now = self.now;
        let mut wait = self.parity_rtt.retry_after(parity.retry);
        if let Some(first) = self.run_of(key) {
            // The run's parity stands for the product's own.
            self.send_run_request(first, retry);
            return;
        }
        let Some(product) = self.products.get_mut(&key) else { return };
        let Some(size) = product.bop.as_ref().map(|bop| u64::from(bop.size)) else { return };
        // A small product's parity comes once its run is closed, up to RUN_OPEN_MAX later.
        let in_run = parity.in_runs(size);
        if in_run {
            wait += RUN_OPEN_MAX;
        }
        let (start, end, _) = parity.group_range(u32::from(group), size);
        let lost = Self::lost_blocks(product, start, end, parity.block_len as u64);
        let index = product.index;
        let repair = product.parity.get_or_default(group);
        if repair.fallback || lost == 0 {
            return;
        }
        let held = repair.shards.len() as u32;
        let from = repair.shards.last().map_or(0, |last| u32::from(last) + 1);
        let need = lost.saturating_sub(held);
        if need == 0 {
            self.try_decode(key, group);
            return;
        }
        if from + need > parity.shards || (retry && repair.rounds >= parity.rounds_max) {
            repair.fallback = true;
            self.counters.parity_fallbacks += 1;
            // Only what is lost (asked for), not what the multicast has yet to bring.
            let lost: Vec<(u64, u64)> = Self::lost_ranges(product, start, end).collect();
            for (from, to) in lost {
                self.retx_request(key, from, to);
            }
            return;
        }
        if !retry && lost <= repair.asked_for {
            return;
        }
        repair.asked_for = lost;
        repair.asked_from = from;
        repair.rounds = repair.rounds.saturating_add(1);
        // Only a first request times the answer: a shard after a second one may answer either.
        // (Not a small product's: its answer waits for its run to close.)
        repair.asked_at = (repair.rounds == 1 && !in_run).then_some(now);
        let retry_at = now + wait;
        repair.retry_at = Some(retry_at);
        // need ≤ lost ≤ 32768 and from ≤ shards ≤ 256.
        self.transmits
            .push_back(Message { index, body: Body::ParityReq { group, need: need as u16, from: from as u16 } });
        self.counters.parity_requests += 1;
        self.parity_timer_by(key, retry_at);
    }

    /// What product `key`'s repair by parity stands at ([`super::InFlight::repair`]).
    pub(super) fn describe_repair(&self, key: i64, product: &Incoming) -> String {
        let mut parts: Vec<String> = [self.describe_run(key), product.parity.describe(self.now)]
            .into_iter()
            .filter(|part| !part.is_empty())
            .collect();
        if let Some(group) = product.parity_waiting {
            parts.push(format!("group {group} waits for its multicast to pass"));
        }
        if let Some(at) = product.parity_timer {
            parts.push(format!("parity timer in {} ms", at.saturating_duration_since(self.now).as_millis()));
        }
        if let Some(at) = product.receive_timer {
            parts.push(format!("receive timer in {} ms", at.saturating_duration_since(self.now).as_millis()));
        }
        parts.join("; ")
    }

    /// Makes product `key`'s parity timer due at `at` at the latest.
    pub(super) fn parity_timer_by(&mut self, key: i64, at: Instant) {
        let Some(product) = self.products.get_mut(&key) else { return };
        if product.parity_timer.is_some_and(|due| due <= at) {
            return;
        }
        if let Some(due) = product.parity_timer.replace(at) {
            self.remove_timer((due, key, TimerKind::Parity));
        }
        self.add_timer((at, key, TimerKind::Parity));
    }

    pub(super) fn parity_timer_fired(&mut self, key: i64) {
        let now = self.now;
        let Some(product) = self.products.get_mut(&key) else { return };
        product.parity_timer = None;
        let due: Vec<u16> = product
            .parity
            .iter()
            .filter(|(_, repair)| !repair.fallback && repair.retry_at.is_some_and(|at| at <= now))
            .map(|(group, _)| *group)
            .collect();
        let run = self.run_of(key);
        for group in due {
            self.ask_parity(key, group, true);
        }
        if let Some(first) = run.filter(|first| self.run_retry_at(*first).is_some_and(|at| at <= now)) {
            self.send_run_request(first, true);
        }
        // The next retry of the groups (and of the run) still waiting.
        let run_retry = run.and_then(|first| self.run_retry_at(first));
        let Some(product) = self.products.get_mut(&key) else { return };
        let next = product
            .parity
            .values()
            .filter(|repair| !repair.fallback)
            .filter_map(|repair| repair.retry_at)
            .chain(run_retry)
            .filter(|at| *at > now)
            .min();
        if let Some(at) = next
            && product.parity_timer.is_none()
        {
            product.parity_timer = Some(at);
            self.add_timer((at, key, TimerKind::Parity));
        }
    }

    /// A PARITY datagram: held if its group is incomplete here, then a decode tried.
    pub(super) fn on_parity(&mut self, index: ProductIndex, group: u16, coding: (u8, u8), shard: u8, data: &[u8]) {
        let Some(parity) = self.parity_in_use() else {
            self.counters.unexpected += 1;
            return;
        };
        if !parity.codes_as(coding.0, coding.1) || data.len() != parity.block_len || u32::from(shard) >= parity.shards {
            self.counters.parity_mismatched += 1;
            return;
        }
        if group >= RUN_MARK {
            self.on_run_parity(index, group - RUN_MARK, shard, data);
            return;
        }
        let Some(key) =
            self.known(index).filter(|(_, product)| product.group_incomplete(&parity, group)).map(|(key, _)| key)
        else {
            self.counters.parity_unused += 1;
            return;
        };
        let discard = self.config.assembly == Assembly::Discard;
        let Some(product) = self.products.get_mut(&key) else { return };
        let repair = product.parity.get_or_default(group);
        if repair.fallback || repair.shards.contains(shard) {
            self.counters.duplicates += 1;
            return;
        }
        repair.shards.insert(shard, (!discard).then_some(data));
        // Timed when the answer is whole (as many shards as blocks were lost): what a retry
        // waits for is the last shard, which may queue behind data on a busy path.
        if repair.shards.len() >= repair.asked_for as usize
            && let Some(asked) = repair.asked_at.take()
        {
            self.parity_rtt.sample(self.now.saturating_duration_since(asked));
        }
        // The sender multicasts the shards of an answer in ascending order of index: a shard
        // above one that this receiver's request may bring and that it lacks says that one
        // was lost. Asked again now, not at the retry timer: the last product of a burst
        // waited 30–60 ms for that timer whenever a shard of its last group was lost at one
        // receiver (docs/benchmarks.md, issue #37). Not a round of its own (`rounds_max`
        // bounds the timer's retries); each gap asks once, as the next request's `from` is
        // above this shard.
        let gap = repair.rounds > 0
            && repair.shards.len() < repair.asked_for as usize
            && (repair.asked_from..u32::from(shard)).any(|i| !repair.shards.contains(i as u8));
        self.counters.parity_shards += 1;
        self.try_decode(key, group);
        if gap {
            let Some(repair) = self.products.get_mut(&key).and_then(|product| product.parity.get_mut(&group)) else {
                return;
            };
            if repair.fallback {
                return;
            }
            repair.rounds = repair.rounds.saturating_sub(1);
            self.counters.parity_gap_requests += 1;
            self.send_parity_request(key, group, true);
        }
    }

    /// Tries to decode the groups `[start, end)` touches (a block arrived there).
    pub(super) fn decode_passed_groups(&mut self, key: i64, start: u64, end: u64) {
        let Some(parity) = self.parity_in_use() else { return };
        if let Some(first) = self.run_of(key) {
            self.try_decode_run(first);
            return;
        }
        let Some(product) = self.products.get(&key) else { return };
        if product.parity.is_empty() || end <= start {
            return;
        }
        let (first, last) = (parity.group_of(start), parity.group_of(end - 1));
        // < 2¹⁶ groups when parity is held.
        let (first, last) = (first.min(u64::from(u16::MAX)) as u16, last.min(u64::from(u16::MAX)) as u16);
        let mut next = first;
        while next <= last {
            let Some(group) = self.products.get(&key).and_then(|p| p.parity.first_in(next, last)) else {
                break;
            };
            self.try_decode(key, group);
            let Some(after) = group.checked_add(1) else { break };
            next = after;
        }
    }

    /// Recovers a group's lost blocks once its multicast has passed and as many shards as
    /// lost blocks are held.
    fn try_decode(&mut self, key: i64, group: u16) {
        let Some(parity) = self.parity_in_use() else { return };
        let Some(product) = self.products.get_mut(&key) else { return };
        let Some(size) = product.bop.as_ref().map(|bop| u64::from(bop.size)) else { return };
        let (start, end, _) = parity.group_range(u32::from(group), size);
        let Some(repair) = product.parity.get(&group) else { return };
        if repair.fallback || repair.shards.is_empty() || !product.passed(&parity, group) {
            return;
        }
        let block_len = parity.block_len as u64;
        let missing_blocks: u64 =
            product.received.gaps_iter(start, end).map(|(from, to)| (to - from).div_ceil(block_len)).sum();
        if missing_blocks == 0 {
            product.parity.remove(&group);
            return;
        }
        if (repair.shards.len() as u64) < missing_blocks {
            return;
        }
        let missing = product.received.gaps(start, end);
        let index = product.index;
        if self.config.assembly == Assembly::Discard {
            // Nothing to store: the ranges and their fingerprints (most of a large simulation's
            // repairs, so without the vectors the other assemblies need).
            let Some(source) = self.fingerprint_source.as_mut() else { return };
            let mut count = 0;
            for &(from, to) in &missing {
                // Within the product (< 4 GiB).
                let fingerprint = (source.0)(index, from as u32, to as u32);
                product.received.insert(from, to);
                product.fingerprint = product.fingerprint.wrapping_add(fingerprint);
                count += (to - from).div_ceil(block_len);
            }
            self.decoded(key, group, count);
            return;
        }
        // Each recovered block: its range, fingerprint and bytes.
        // The group's bytes as held: in the product's buffer, or read back from the sink.
        let read_back;
        let group_bytes: &[u8] = if self.config.assembly == Assembly::Memory {
            &product.data[start as usize..end as usize]
        } else {
            let mut bytes = vec![0u8; (end - start) as usize];
            let Some(sink) = self.sink.as_mut() else { return };
            let read = product.received.within(start, end).try_for_each(|(from, to)| {
                // Within the product (< 4 GiB).
                sink.0.read_at(index, from as u32, &mut bytes[(from - start) as usize..(to - start) as usize])
            });
            if read.is_err() {
                self.counters.sink_failures += 1;
                self.abandon(key, MissReason::SinkFailed);
                return;
            }
            read_back = bytes;
            &read_back
        };
        // A block with any byte missing.
        let lost = |position: u32| {
            let at = start + u64::from(position) * block_len;
            missing.iter().any(|&(from, to)| from < at + block_len && at < to)
        };
        let shards = repair.shards.with_bytes().take(missing_blocks as usize);
        let recovered: Vec<(u64, u64, u64, Vec<u8>)> =
            match self.parity_decoder.decode(&parity, group_bytes, lost, shards) {
                Ok(restored) => restored
                    .into_iter()
                    .map(|(position, bytes)| {
                        let from = start + u64::from(position) * block_len;
                        // from < size ≤ u32::MAX.
                        (from, from + bytes.len() as u64, block_fingerprint(from as u32, &bytes), bytes)
                    })
                    .collect(),
                Err(_) => {
                    self.counters.parity_decode_failures += 1;
                    if let Some(repair) = product.parity.get_mut(&group) {
                        repair.shards.clear();
                        repair.rounds = parity.rounds_max;
                    }
                    self.ask_parity(key, group, true);
                    return;
                }
            };
        let mut count = 0;
        for (from, to, fingerprint, bytes) in recovered {
            // Within the product (< 4 GiB).
            if !self.store(key, from as u32, &bytes) {
                return;
            }
            let Some(product) = self.products.get_mut(&key) else { return };
            product.received.insert(from, to);
            product.fingerprint = product.fingerprint.wrapping_add(fingerprint);
            count += (to - from).div_ceil(block_len);
        }
        self.decoded(key, group, count);
    }

    /// A group was decoded: `count` blocks recovered.
    fn decoded(&mut self, key: i64, group: u16, count: u64) {
        if let Some(product) = self.products.get_mut(&key) {
            product.parity.remove(&group);
            // Lost on the multicast and repaired: they count as the product's repaired blocks.
            product.retransmitted_blocks = product.retransmitted_blocks.saturating_add(count as u32);
        }
        self.counters.parity_blocks += count;
        self.complete_if_done(key);
    }
}

/// Whether parity can repair a product of `size` bytes: at most 2¹⁵ block groups (group
/// numbers are 16 bits on the wire, and those from [`RUN_MARK`] up name runs).
pub(super) fn codes_product(parity: &ParityConfig, size: u64) -> bool {
    parity.groups(size) <= u64::from(RUN_MARK)
}

/// A group of a product's blocks being repaired by parity.
#[derive(Debug, Default)]
pub(super) struct GroupRepair {
    /// Shards held (without bytes with [`Assembly::Discard`]).
    shards: HeldShards,
    /// Lost blocks when the last request went out.
    pub(super) asked_for: u32,
    /// Requests sent.
    rounds: u8,
    /// When to ask again if the group is still incomplete.
    retry_at: Option<Instant>,
    /// When its first request went out, until its answer was whole ([`ParityRtt`]).
    asked_at: Option<Instant>,
    /// The lowest shard index the last request may bring (its `from`).
    asked_from: u32,
    /// Its lost blocks were asked for with RETX_REQ.
    pub(super) fallback: bool,
}

/// The time from a PARITY_REQ to the last shard it needed, smoothed as TCP smooths its round trip
/// (RFC 6298: gains 1/8 and 1/4), and the wait before asking again derived from it.
///
/// Shards come by multicast and can be lost like blocks. A fixed wait long enough for a slow
/// path ([`ParityConfig::retry`], 250 ms by default) held every lost shard that long, and the
/// last product of a burst with it (the sender releases it when every receiver has it): on a
/// LAN where shards come in a millisecond or two, half the runs of a 200 MB burst to four
/// receivers ended a quarter of a second late (docs/benchmarks.md, issue #37). The wait is
/// now twice the smoothed time plus four deviations, from [`PARITY_RETRY_MIN`] up to the
/// configured wait, which stays the wait until a first answer was timed.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct ParityRtt {
    /// Smoothed time and mean deviation, once one answer was timed.
    smoothed: Option<(Duration, Duration)>,
}

/// The shortest wait for parity shards before asking again ([`ParityRtt`]): above the
/// scheduling delays of a busy host, so that shards on their way are not asked for twice, and
/// above the 20 ms during which the sender counts a shard it multicast as on its way to the
/// receiver (a request sooner would get nothing).
pub const PARITY_RETRY_MIN: Duration = Duration::from_millis(30);

/// The longest a parity request waits for the driver to catch up ([`Receiver::set_backlog`]).
pub const PARITY_DEFER_MAX: Duration = Duration::from_millis(100);

impl ParityRtt {
    fn sample(&mut self, rtt: Duration) {
        self.smoothed = Some(match self.smoothed {
            None => (rtt, rtt / 2),
            Some((srtt, rttvar)) => {
                let deviation = srtt.abs_diff(rtt);
                (srtt * 7 / 8 + rtt / 8, rttvar * 3 / 4 + deviation / 4)
            }
        });
    }

    pub(super) fn retry_after(&self, configured: Duration) -> Duration {
        match self.smoothed {
            None => configured,
            Some((srtt, rttvar)) => (srtt * 2 + rttvar * 4).clamp(PARITY_RETRY_MIN.min(configured), configured),
        }
    }
}

/// A product's block groups under parity repair, by group (sorted; a product has few at once,
/// most often one: a vector allocates less and finds them faster than a tree).
#[derive(Debug, Default)]
pub(super) struct GroupRepairs(Vec<(u16, GroupRepair)>);

impl GroupRepairs {
    fn find(&self, group: u16) -> Result<usize, usize> {
        self.0.binary_search_by_key(&group, |(group, _)| *group)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(super) fn get(&self, group: &u16) -> Option<&GroupRepair> {
        self.find(*group).ok().map(|at| &self.0[at].1)
    }

    fn get_mut(&mut self, group: &u16) -> Option<&mut GroupRepair> {
        self.find(*group).ok().map(|at| &mut self.0[at].1)
    }

    pub(super) fn get_or_default(&mut self, group: u16) -> &mut GroupRepair {
        let at = self.find(group).unwrap_or_else(|at| {
            self.0.insert(at, (group, GroupRepair::default()));
            at
        });
        &mut self.0[at].1
    }

    pub(super) fn remove(&mut self, group: &u16) -> Option<GroupRepair> {
        self.find(*group).ok().map(|at| self.0.remove(at).1)
    }

    /// The first group from `first` to `last` (inclusive) under repair.
    fn first_in(&self, first: u16, last: u16) -> Option<u16> {
        let at = self.find(first).unwrap_or_else(|at| at);
        self.0.get(at).map(|(group, _)| *group).filter(|&group| group <= last)
    }

    fn iter(&self) -> impl Iterator<Item = (&u16, &GroupRepair)> {
        self.0.iter().map(|(group, repair)| (group, repair))
    }

    /// What each group's repair stands at, for [`super::InFlight::repair`].
    pub(super) fn describe(&self, now: Instant) -> String {
        self.iter()
            .map(|(group, repair)| {
                format!(
                    "group {group}: {} shards for {} lost, round {}{}",
                    repair.shards.len(),
                    repair.asked_for,
                    repair.rounds,
                    describe_wait(repair.fallback, repair.retry_at, now)
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn values(&self) -> impl Iterator<Item = &GroupRepair> {
        self.0.iter().map(|(_, repair)| repair)
    }

    pub(super) fn values_mut(&mut self) -> impl Iterator<Item = &mut GroupRepair> {
        self.0.iter_mut().map(|(_, repair)| repair)
    }
}

/// The parity shards held for a block group: which (a bit per index; at most 256) and, unless
/// bytes are discarded, their bytes by index (a discarding receiver, most of a large
/// simulation's, then allocates nothing per group).
#[derive(Debug, Default)]
pub(super) struct HeldShards {
    held: [u64; 4],
    /// Sorted by index.
    bytes: Vec<(u8, Vec<u8>)>,
}

impl HeldShards {
    pub(super) fn len(&self) -> usize {
        self.held.iter().map(|word| word.count_ones() as usize).sum()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.held == [0; 4]
    }

    pub(super) fn contains(&self, shard: u8) -> bool {
        self.held[usize::from(shard / 64)] >> (shard % 64) & 1 == 1
    }

    /// The highest index held.
    pub(super) fn last(&self) -> Option<u8> {
        // ≤ 255.
        (0..4)
            .rev()
            .find(|&word| self.held[word] != 0)
            .map(|word| (word * 64 + 63 - self.held[word].leading_zeros() as usize) as u8)
    }

    /// Holds shard `shard`, with `bytes` unless they are discarded.
    pub(super) fn insert(&mut self, shard: u8, bytes: Option<&[u8]>) {
        self.held[usize::from(shard / 64)] |= 1 << (shard % 64);
        if let Some(bytes) = bytes {
            let at = self.bytes.partition_point(|(held, _)| *held < shard);
            self.bytes.insert(at, (shard, bytes.to_vec()));
        }
    }

    fn clear(&mut self) {
        *self = Self::default();
    }

    /// The shards held with their bytes, by index.
    pub(super) fn with_bytes(&self) -> impl Iterator<Item = (u32, &[u8])> {
        self.bytes.iter().map(|(shard, bytes)| (u32::from(*shard), bytes.as_slice()))
    }
}

/// ", by RETX_REQ", ", again in 120 ms", ", due" or ", no retry" (for the repair descriptions).
pub(super) fn describe_wait(fallback: bool, retry_at: Option<Instant>, now: Instant) -> String {
    match (fallback, retry_at) {
        (true, _) => ", by RETX_REQ".into(),
        (false, Some(at)) if at > now => format!(", again in {} ms", at.saturating_duration_since(now).as_millis()),
        (false, Some(_)) => ", due".into(),
        (false, None) => ", no retry".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::HeldShards;

    #[test]
    fn held_shards_count_order_and_keep_bytes_only_when_given() {
        let mut shards = HeldShards::default();
        assert!(shards.is_empty() && shards.last().is_none());
        for shard in [200, 3, 64, 63, 255] {
            shards.insert(shard, Some(&[shard]));
        }
        shards.insert(7, None);
        assert_eq!(shards.len(), 6);
        assert_eq!(shards.last(), Some(255));
        assert!(shards.contains(63) && shards.contains(64) && shards.contains(7) && !shards.contains(8));
        let with_bytes: Vec<(u32, Vec<u8>)> = shards.with_bytes().map(|(j, bytes)| (j, bytes.to_vec())).collect();
        assert_eq!(with_bytes, [(3, vec![3]), (63, vec![63]), (64, vec![64]), (200, vec![200]), (255, vec![255])]);
        shards.clear();
        assert!(shards.is_empty() && shards.with_bytes().next().is_none());
    }
}
