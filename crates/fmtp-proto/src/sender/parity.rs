//! Parity ([`SenderConfig::parity`]): the shards a PARITY_REQ needs chosen (none already on
//! their way to the receiver), queued, coded once per group and multicast.

use std::time::Duration;

use crate::parity::{ParityConfig, RUN_MARK};
use crate::time::Instant;
use crate::wire::{Body, Message, MessageType};

use super::{Destination, REPAIR_ROUND_MIN, ReceiverId, ReleaseReason, Sender, SenderCounters, Transmit};
use crate::pacing::TokenBucket;

#[cfg(doc)]
use super::SenderConfig;

/// The shortest time a parity shard counts as on its way to a receiver after it was multicast
/// ([`SenderConfig::parity`]).
const PARITY_IN_FLIGHT_MIN: Duration = Duration::from_millis(20);

impl Sender {
    /// Queues parity shards of a group for a receiver that needs `need` more of index `from` or
    /// above: as many as are not already on their way to it (queued, or multicast less than
    /// its round-trip time ago), shards never multicast first (they serve every receiver),
    /// then shards multicast long enough ago that this receiver lost them.
    pub(super) fn queue_parity(
        &mut self,
        id: ReceiverId,
        key: u64,
        group: u16,
        need: u16,
        from: u16,
        parity: &ParityConfig,
    ) {
        let now = self.now;
        let Some(receiver) = self.receivers.get(&id) else { return };
        let round = receiver.rtt.max(REPAIR_ROUND_MIN);
        let on_its_way = self.shard_on_its_way(id);
        let Some(product) = self.products.get_mut(&key) else { return };
        if u64::from(group) >= parity.groups(u64::from(product.size)) || need == 0 {
            self.counters.retx_requests_empty += 1;
            return;
        }
        product.asked_by(id, now, round);
        let shards = parity.shards as usize;
        let state = product.parity.entry(group).or_insert_with(|| ParityGroup::new(shards));
        let (chosen, shortfall) = choose_shards(&mut state.sent, need, from, now, on_its_way);
        for j in chosen {
            // j < shards ≤ 256.
            self.parity_queue.push_back((key, group, j as u8));
        }
        self.counters.parity_shortfall += shortfall as u64;
    }

    /// How long a shard multicast counts as on its way to receiver `id`: sent less than this
    /// long ago, it may not have reached the receiver when it asked. A round trip and a quarter
    /// more for queueing, and at least the time a busy host may take to hand a datagram to the
    /// receiver (a receiver asks again after at least `PARITY_RETRY_MIN`, longer).
    pub(super) fn shard_on_its_way(&self, id: ReceiverId) -> Duration {
        let round = self.receivers.get(&id).map_or(REPAIR_ROUND_MIN, |receiver| receiver.rtt.max(REPAIR_ROUND_MIN));
        (round + round / 4).max(PARITY_IN_FLIGHT_MIN)
    }

    /// Multicasts one queued parity shard (computing its group's shards the first time);
    /// `None` when its product is gone or its bytes cannot be read.
    pub(super) fn transmit_parity(&mut self, buf: &mut Vec<u8>, key: u64, group: u16, shard: u8) -> Option<Transmit> {
        let parity = self.config.parity?;
        if group == RUN_MARK {
            return self.transmit_run_parity(buf, key, shard, &parity);
        }
        let product = self.products.get_mut(&key)?;
        let state = product.parity.get_mut(&group)?;
        if state.shards.is_empty() {
            let (start, end, _) = parity.group_range(u32::from(group), u64::from(product.size));
            let bytes = self.parity_encoder.group_buffer((end - start) as usize);
            if product.data.read_at(start, bytes).is_err() {
                self.release(key, ReleaseReason::DataUnavailable);
                return None;
            }
            state.shards =
                self.parity_encoder.encode_filled(&parity).expect("a validated configuration codes any group");
            self.counters.parity_groups_coded += 1;
        }
        state.sent[usize::from(shard)] = ShardState::Sent(self.now);
        let message = Message { index: product.index, body: parity_body(&parity, group, shard, &state.shards) };
        Some(multicast_shard(&mut self.multicast_bucket, &mut self.counters, buf, &message))
    }
}

/// Multicasts a PARITY message: appends it to `buf`, takes its tokens, counts it.
pub(super) fn multicast_shard(
    bucket: &mut Option<TokenBucket>,
    counters: &mut SenderCounters,
    buf: &mut Vec<u8>,
    message: &Message<'_>,
) -> Transmit {
    let start = buf.len();
    message.emit_to_vec(buf).expect("a shard is at most a block");
    let len = buf.len() - start;
    if let Some(bucket) = bucket {
        bucket.try_take(len);
    }
    counters.parity_datagrams += 1;
    counters.parity_bytes += len as u64;
    Transmit { destination: Destination::Multicast, len, message_type: MessageType::Parity }
}

/// The PARITY body of shard `shard` of `shards`, coded with `parity`, for group field `group`.
pub(super) fn parity_body<'a>(parity: &ParityConfig, group: u16, shard: u8, shards: &'a [Vec<u8>]) -> Body<'a> {
    let (group_blocks_log2, shards_log2) = parity.coding_fields();
    Body::Parity { group, group_blocks_log2, shards_log2, shard, data: &shards[usize::from(shard)] }
}

/// The shards to queue (marked queued) for a receiver that needs `need` more of index `from` or
/// above: as many as are not already on their way to it (queued, or multicast less than
/// `on_its_way` ago), shards never multicast first, then shards multicast long enough ago
/// that it lost them, multicast in ascending order of index. Also how many it needs that no
/// shard index is left to give.
pub(super) fn choose_shards(
    sent: &mut [ShardState],
    need: u16,
    from: u16,
    now: Instant,
    on_its_way: Duration,
) -> (Vec<usize>, usize) {
    let shards = sent.len();
    let from = usize::from(from).min(shards);
    let on_the_way = sent[from..]
        .iter()
        .filter(|state| match state {
            ShardState::Queued => true,
            ShardState::Sent(at) => now < *at + on_its_way,
            ShardState::Unsent => false,
        })
        .count();
    let want = usize::from(need).saturating_sub(on_the_way);
    let fresh = (from..shards).filter(|&j| sent[j] == ShardState::Unsent);
    let stale = (from..shards).filter(|&j| matches!(sent[j], ShardState::Sent(at) if now >= at + on_its_way));
    let mut chosen: Vec<usize> = fresh.chain(stale).take(want).collect();
    // In ascending order: a receiver takes a shard above one it lacks as that one lost.
    chosen.sort_unstable();
    for &j in &chosen {
        sent[j] = ShardState::Queued;
    }
    let shortfall = want - chosen.len();
    (chosen, shortfall)
}

/// The parity of one group of a product's blocks.
pub(super) struct ParityGroup {
    /// Every shard, once the first is multicast.
    shards: Vec<Vec<u8>>,
    /// Per shard index.
    sent: Vec<ShardState>,
}

impl ParityGroup {
    fn new(shards: usize) -> Self {
        Self { shards: Vec::new(), sent: vec![ShardState::Unsent; shards] }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ShardState {
    Unsent,
    Queued,
    /// Last multicast then.
    Sent(Instant),
}
