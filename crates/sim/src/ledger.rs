//! The checkers: what every product must become at every receiver, checked after every step
//! (safety) and at the end of the run (liveness).
//!
//! Safety, checked as events happen:
//! * each product is reported at most once per receiver: delivered or missed (or covered by an
//!   `IndexGap` report), never both, never twice;
//! * a delivery carries the product's metadata, BOP start time and size; its content is
//!   checked by full MD5 (memory content) and by [`DeliveredProduct::fingerprint`] (always — the
//!   only content witness when receivers discard bytes at scale);
//! * a rejection (`Missed(Rejected)`) only comes after the sender released the product;
//! * every message the sender emits is well-formed and carries the right bytes: multicast in
//!   product order, blocks at consecutive §3 offsets, payloads equal to the product bytes at
//!   that offset (checked once per message, not per receiver); repairs likewise.
//!
//! Liveness, at the end: every product from a receiver's first contact on is accounted for.
//! Products lost whole before a receiver's first contact cannot be known to it (FMTP learns of
//! products from indexes it sees; LDM's backlog request covers them): they are counted as
//! `unknown_before_first_contact`, never silently.
//!
//! [`DeliveredProduct::fingerprint`]: ldm7_fmtp_proto::DeliveredProduct::fingerprint

use std::sync::Arc;

use ldm7_fmtp_proto::parity::RUN_MARK;
use ldm7_fmtp_proto::wire::{BLOCK_LEN, Body, Message};
use ldm7_fmtp_proto::{
    DeliveredProduct, Instant, MissReason, ParityConfig, ParityEncoder, ProductIndex, ReceiverEvent, ReleaseReason,
    SenderEvent, WallTime,
};
use ldm7_types::Signature;

use crate::stats::LatencyStats;
use crate::workload::pattern_matches;

/// A broken invariant.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    /// A product was reported twice by one receiver.
    #[error("receiver {receiver}: product {index} reported twice ({first}, then {second})")]
    ReportedTwice {
        /// The receiver (position in the configuration).
        receiver: usize,
        /// The product index.
        index: u32,
        /// The first report.
        first: String,
        /// The second report.
        second: String,
    },
    /// A delivery does not match the product.
    #[error("receiver {receiver}: product {index} delivered wrong: {what}")]
    WrongDelivery {
        /// The receiver.
        receiver: usize,
        /// The product index.
        index: u32,
        /// What differs.
        what: String,
    },
    /// A receiver reported a product that was never enqueued.
    #[error("receiver {receiver}: reported product {index}, which was never enqueued")]
    UnknownProduct {
        /// The receiver.
        receiver: usize,
        /// The index.
        index: u32,
    },
    /// A receiver was told RETX_REJ for a product the sender still retained.
    #[error("receiver {receiver}: product {index} rejected before the sender released it")]
    RejectedBeforeRelease {
        /// The receiver.
        receiver: usize,
        /// The product index.
        index: u32,
    },
    /// Liveness: a product neither delivered nor reported missed at the end.
    #[error("receiver {receiver}: product {index} silently lost (neither delivered nor reported missed)")]
    SilentlyLost {
        /// The receiver.
        receiver: usize,
        /// The product index.
        index: u32,
    },
    /// The sender emitted something wrong or broke a bound.
    #[error("sender: {0}")]
    Sender(String),
    /// A receiver emitted something wrong or broke a bound.
    #[error("receiver {receiver}: {what}")]
    Receiver {
        /// The receiver.
        receiver: usize,
        /// What.
        what: String,
    },
    /// The run did not come to rest.
    #[error("not quiescent: {0}")]
    NotQuiescent(String),
}

/// The feed's coding, when a PARITY datagram names it (its size class and shard count), for
/// shards of `block_len` bytes.
fn coding_of(
    feed: Option<&ParityConfig>,
    group_blocks_log2: u8,
    shards_log2: u8,
    block_len: usize,
) -> Result<ParityConfig, String> {
    let feed = feed.ok_or("parity from a sender configured without it")?;
    if !feed.codes_as(group_blocks_log2, shards_log2) {
        return Err(format!(
            "coded as 2^{group_blocks_log2} blocks and 2^{shards_log2} shards, not as the feed's {}/{}",
            feed.group_blocks, feed.shards
        ));
    }
    let parity = ParityConfig { block_len, ..*feed };
    parity.validate().map_err(|error| error.to_string())?;
    Ok(parity)
}

/// Every parity shard of a group of a product, computed from the product's content as the
/// datagram says it was coded.
fn parity_of(
    encoder: &mut ParityEncoder,
    feed: Option<&ParityConfig>,
    record: &ProductRecord,
    group: u16,
    group_blocks_log2: u8,
    shards_log2: u8,
    block_len: usize,
) -> Result<Vec<Vec<u8>>, String> {
    let parity = coding_of(feed, group_blocks_log2, shards_log2, block_len)?;
    if u64::from(group) >= parity.groups(u64::from(record.size)) {
        return Err("no such group".into());
    }
    let (start, end, _) = parity.group_range(u32::from(group), u64::from(record.size));
    let shards = match &record.content {
        // Within the product (< 4 GiB).
        Content::Pattern(seed) => {
            crate::workload::pattern_fill(*seed, start, encoder.group_buffer((end - start) as usize));
            encoder.encode_filled(&parity)
        }
        Content::Bytes(data) => encoder.encode(&parity, &data[start as usize..end as usize]),
    };
    shards.map_err(|error| error.to_string())
}

/// Every parity shard of the run of `records` (consecutive products coded together, each
/// product's last block padded; docs/parity.md "Runs"), as the datagram says it was coded.
fn run_parity_of(
    encoder: &mut ParityEncoder,
    feed: Option<&ParityConfig>,
    records: &[ProductRecord],
    group_blocks_log2: u8,
    shards_log2: u8,
    block_len: usize,
) -> Result<Vec<Vec<u8>>, String> {
    let parity = coding_of(feed, group_blocks_log2, shards_log2, block_len)?;
    if records.len() < 2 || records.iter().any(|record| !parity.in_runs(u64::from(record.size))) {
        return Err("no such run".into());
    }
    let span = |size: u32| (size as usize).div_ceil(block_len) * block_len;
    let total: usize = records.iter().map(|record| span(record.size)).sum();
    if total > parity.group_blocks as usize * block_len {
        return Err("a run longer than a group".into());
    }
    let bytes = encoder.group_buffer(total);
    let mut at = 0;
    for record in records {
        let size = record.size as usize;
        match &record.content {
            Content::Pattern(seed) => crate::workload::pattern_fill(*seed, 0, &mut bytes[at..at + size]),
            Content::Bytes(data) => bytes[at..at + size].copy_from_slice(&data[..size]),
        }
        bytes[at + size..at + span(record.size)].fill(0);
        at += span(record.size);
    }
    encoder.encode_filled(&parity).map_err(|error| error.to_string())
}

/// What a product's bytes are.
#[derive(Clone, Debug)]
pub(crate) enum Content {
    /// Generated from a seed ([`crate::workload::pattern_fill`]).
    Pattern(u64),
    /// Held in memory.
    Bytes(Arc<[u8]>),
}

impl Content {
    fn matches(&self, offset: u32, bytes: &[u8]) -> bool {
        match self {
            Self::Pattern(seed) => pattern_matches(*seed, u64::from(offset), bytes),
            Self::Bytes(data) => {
                let start = offset as usize;
                data.get(start..start + bytes.len()) == Some(bytes)
            }
        }
    }
}

/// What the ledger knows of an enqueued product.
#[derive(Clone, Debug)]
pub(crate) struct ProductRecord {
    pub(crate) size: u32,
    pub(crate) content: Content,
    pub(crate) metadata: [u8; 16],
    pub(crate) fingerprint: u64,
    pub(crate) enqueued_at: Instant,
    pub(crate) multicast_started: Option<Instant>,
    pub(crate) released: Option<ReleaseReason>,
}

/// What a delivery says of its product against the record: metadata, start time (the enqueue
/// time, as the sender stamps it) and the fingerprint of its blocks.
fn check_product(
    record: &ProductRecord,
    metadata: &[u8],
    start_time: WallTime,
    fingerprint: u64,
) -> Result<(), String> {
    if metadata != record.metadata {
        return Err("metadata differs".into());
    }
    let expected = WallTime::from_unix_nanos(u128::from(record.enqueued_at.as_nanos()));
    if start_time != expected {
        return Err(format!("start time {start_time:?}, expected {expected:?}"));
    }
    if fingerprint != record.fingerprint {
        return Err(format!(
            "fingerprint {fingerprint:#x}, expected {:#x} (a block missing, doubled, misplaced or wrong)",
            record.fingerprint
        ));
    }
    Ok(())
}

/// How a product ended at one receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Pending,
    Delivered,
    Missed(MissReason),
    /// Covered by an `IndexGap` report (too many skipped to request).
    Gap,
    /// Missed or skipped by FMTP, then brought by the LDM-7 backstop.
    Backstop,
}

/// Per-receiver results.
#[derive(Clone, Debug, Default)]
pub struct ReceiverTally {
    /// Products delivered.
    pub delivered: u64,
    /// Delivered without any retransmitted block ("multicast-itself-sufficient").
    pub delivered_multicast_only: u64,
    /// Products missed (all reasons).
    pub missed: u64,
    /// Missed because the sender rejected the request (deadline passed).
    pub missed_rejected: u64,
    /// Missed for other reasons (timeout, eviction, size).
    pub missed_other: u64,
    /// Products reported through `IndexGap` events.
    pub gap_reported: u64,
    /// Products lost whole before the receiver's first contact (see the module doc).
    pub unknown_before_first_contact: u64,
    /// Products FMTP missed or skipped that the LDM-7 backstop brought (with a backstop).
    pub backstop: u64,
    /// Retransmitted blocks over delivered products.
    pub retransmitted_blocks: u64,
    /// Latency of delivered products (completion − BOP start time).
    pub latency: LatencyStats,
}

#[derive(Debug, Default)]
struct ReceiverLedger {
    outcomes: Vec<Outcome>,
    joined_at: Option<Instant>,
    first_contact: Option<usize>,
    tally: ReceiverTally,
}

/// Where the multicast stands, to check that the sender emits products in order.
#[derive(Debug, Default)]
struct MulticastCursor {
    position: Option<usize>,
    next_offset: u32,
    ended: bool,
}

/// The checker state.
#[derive(Debug)]
pub(crate) struct Ledger {
    first_index: ProductIndex,
    products: Vec<ProductRecord>,
    receivers: Vec<ReceiverLedger>,
    cursor: MulticastCursor,
    /// The ledger checks delivered bytes by MD5 (memory content).
    check_md5: bool,
    /// The parity shards of the group checked last, and which group they are.
    parity_checked: Option<(ParityGroupKey, Vec<Vec<u8>>)>,
    /// Codes the groups checked (its working space kept from one to the next).
    parity_encoder: ParityEncoder,
    /// The sender's coding (PARITY datagrams name only its size class and shard count).
    parity: Option<ParityConfig>,
}

/// A product's group of blocks as a parity datagram codes it: index, group, log₂ of the group
/// size and of the shard count.
type ParityGroupKey = (ProductIndex, u16, u8, u8);

impl Ledger {
    pub(crate) fn new(
        first_index: ProductIndex,
        receivers: usize,
        check_md5: bool,
        parity: Option<ParityConfig>,
    ) -> Self {
        Self {
            first_index,
            products: Vec::new(),
            receivers: (0..receivers).map(|_| ReceiverLedger::default()).collect(),
            cursor: MulticastCursor::default(),
            check_md5,
            parity_checked: None,
            parity_encoder: ParityEncoder::default(),
            parity,
        }
    }

    /// The sender accepted a product and numbered it `index`.
    pub(crate) fn enqueued(&mut self, index: ProductIndex, record: ProductRecord) -> Result<(), Violation> {
        let expected = self.first_index.wrapping_add(self.products.len() as u32);
        if index != expected {
            return Err(Violation::Sender(format!("numbered a product {index}, expected {expected}")));
        }
        self.products.push(record);
        Ok(())
    }

    /// The size of the product with `index`, if it was enqueued.
    pub(crate) fn size_of(&self, index: ProductIndex) -> Option<u32> {
        self.products.get(index.0.wrapping_sub(self.first_index.0) as usize).map(|record| record.size)
    }

    /// The sum of the block fingerprints of `[start, end)` (block-aligned) of product `index`
    /// (0 for a product not in the ledger: the receiver's check then fails loudly).
    pub(crate) fn range_fingerprint(&self, index: ProductIndex, start: u32, end: u32) -> u64 {
        let Some(record) = self.products.get(index.0.wrapping_sub(self.first_index.0) as usize) else { return 0 };
        match &record.content {
            Content::Pattern(seed) => crate::workload::pattern_range_fingerprint(*seed, start, end),
            Content::Bytes(bytes) => {
                let end = (end as usize).min(bytes.len());
                let start = (start as usize).min(end);
                crate::workload::bytes_fingerprint_from(start, &bytes[start..end])
            }
        }
    }

    pub(crate) fn product_count(&self) -> usize {
        self.products.len()
    }

    pub(crate) fn joined(&mut self, receiver: usize, now: Instant) {
        self.receivers[receiver].joined_at = Some(now);
    }

    /// Receiver `receiver` was handed a multicast datagram of product `index` (not lost).
    #[inline]
    pub(crate) fn contact(&mut self, receiver: usize, index: ProductIndex) {
        let ledger = &mut self.receivers[receiver];
        if ledger.first_contact.is_none() {
            ledger.first_contact = Some(index.0.wrapping_sub(self.first_index.0) as usize);
        }
    }

    fn position(&self, index: ProductIndex) -> Option<usize> {
        let position = index.0.wrapping_sub(self.first_index.0) as usize;
        (position < self.products.len()).then_some(position)
    }

    /// Checks one multicast datagram the sender emitted (once, before the fan-out).
    pub(crate) fn check_multicast(&mut self, now: Instant, datagram: &[u8]) -> Result<(), Violation> {
        let message = Message::parse(datagram).map_err(|e| Violation::Sender(format!("malformed datagram: {e}")))?;
        let index = message.index;
        let position =
            self.position(index).ok_or_else(|| Violation::Sender(format!("multicast unknown product {index}")))?;
        let cursor = &mut self.cursor;
        let record = &mut self.products[position];
        match message.body {
            Body::Bop(bop) => {
                let expected = cursor.position.map_or(0, |p| p + 1);
                if position != expected || !(cursor.ended || cursor.position.is_none()) {
                    return Err(Violation::Sender(format!("BOP of {index} out of order")));
                }
                if bop.product_size != record.size || bop.metadata != record.metadata {
                    return Err(Violation::Sender(format!("BOP of {index} has the wrong size or metadata")));
                }
                *cursor = MulticastCursor { position: Some(position), next_offset: 0, ended: false };
                record.multicast_started = Some(now);
            }
            Body::MemData { offset, data } => {
                if cursor.position != Some(position) || cursor.ended || offset != cursor.next_offset {
                    return Err(Violation::Sender(format!("block {offset} of {index} out of order")));
                }
                let expected_len = (record.size - offset).min(BLOCK_LEN as u32) as usize;
                if data.len() != expected_len || !record.content.matches(offset, data) {
                    return Err(Violation::Sender(format!("block {offset} of {index} has the wrong bytes")));
                }
                cursor.next_offset = offset + data.len() as u32;
            }
            Body::Eop => {
                // A tail probe multicasts the last product's EOP again (SenderConfig::tail_probe).
                if cursor.position == Some(position) && cursor.ended {
                    return Ok(());
                }
                if cursor.position != Some(position) || cursor.ended || cursor.next_offset != record.size {
                    return Err(Violation::Sender(format!("EOP of {index} before its data")));
                }
                cursor.ended = true;
            }
            Body::Parity { group, group_blocks_log2, shards_log2, shard, data } => {
                let key = (index, group, group_blocks_log2, shards_log2);
                if self.parity_checked.as_ref().is_none_or(|(checked, _)| *checked != key) {
                    let shards = if group >= RUN_MARK {
                        let count = usize::from(group - RUN_MARK);
                        let records = self.products.get(position..position + count).unwrap_or_default();
                        run_parity_of(
                            &mut self.parity_encoder,
                            self.parity.as_ref(),
                            records,
                            group_blocks_log2,
                            shards_log2,
                            data.len(),
                        )
                    } else {
                        parity_of(
                            &mut self.parity_encoder,
                            self.parity.as_ref(),
                            record,
                            group,
                            group_blocks_log2,
                            shards_log2,
                            data.len(),
                        )
                    }
                    .map_err(|what| Violation::Sender(format!("parity of {index} group {group}: {what}")))?;
                    self.parity_checked = Some((key, shards));
                }
                let shards = self.parity_checked.as_ref().map(|(_, shards)| shards);
                if shards.and_then(|shards| shards.get(usize::from(shard))).map(Vec::as_slice) != Some(data) {
                    return Err(Violation::Sender(format!("parity shard {shard} of {index} group {group} is wrong")));
                }
            }
            _ => return Err(Violation::Sender(format!("multicast a {:?}", message.message_type()))),
        }
        Ok(())
    }

    /// Checks one repair message the sender emitted.
    pub(crate) fn check_repair(&self, frame: &[u8]) -> Result<(), Violation> {
        let message = Message::parse(frame).map_err(|e| Violation::Sender(format!("malformed repair: {e}")))?;
        let index = message.index;
        let record = || {
            self.position(index)
                .map(|p| &self.products[p])
                .ok_or_else(|| Violation::Sender(format!("repair of unknown product {index}")))
        };
        match message.body {
            Body::RetxData { offset, data } => {
                let record = record()?;
                let aligned = (offset as usize).is_multiple_of(BLOCK_LEN) && offset < record.size;
                let expected_len = record.size.saturating_sub(offset).min(BLOCK_LEN as u32) as usize;
                if !aligned || data.len() != expected_len || !record.content.matches(offset, data) {
                    return Err(Violation::Sender(format!("RETX_DATA {offset} of {index} has the wrong bytes")));
                }
            }
            Body::RetxBop(bop) => {
                let record = record()?;
                if bop.product_size != record.size || bop.metadata != record.metadata {
                    return Err(Violation::Sender(format!("RETX_BOP of {index} has the wrong size or metadata")));
                }
            }
            Body::RetxEop | Body::RetxRej => {}
            _ => return Err(Violation::Sender(format!("sent a {:?} on a stream", message.message_type()))),
        }
        Ok(())
    }

    /// Records a sender event.
    pub(crate) fn sender_event(&mut self, event: &SenderEvent) -> Result<(), Violation> {
        if let SenderEvent::Released { index, reason, .. } = event {
            let position =
                self.position(*index).ok_or_else(|| Violation::Sender(format!("released unknown product {index}")))?;
            let record = &mut self.products[position];
            if let Some(previous) = record.released {
                return Err(Violation::Sender(format!("released {index} twice ({previous:?}, {reason:?})")));
            }
            record.released = Some(*reason);
        }
        Ok(())
    }

    /// Records a receiver event (the safety checks).
    pub(crate) fn receiver_event(&mut self, receiver: usize, event: ReceiverEvent) -> Result<(), Violation> {
        match event {
            ReceiverEvent::Delivered(delivery) => self.delivered(receiver, &delivery),
            ReceiverEvent::Missed { index, reason } => {
                let position = self.position(index).ok_or(Violation::UnknownProduct { receiver, index: index.0 })?;
                if reason == MissReason::Rejected && self.products[position].released.is_none() {
                    return Err(Violation::RejectedBeforeRelease { receiver, index: index.0 });
                }
                self.settle(receiver, position, index, Outcome::Missed(reason))?;
                let tally = &mut self.receivers[receiver].tally;
                tally.missed += 1;
                match reason {
                    MissReason::Rejected => tally.missed_rejected += 1,
                    _ => tally.missed_other += 1,
                }
                Ok(())
            }
            ReceiverEvent::IndexGap { first, last } => {
                let count = last.serial_difference(first).unwrap_or(-1);
                for step in 0..=count.max(-1) {
                    let index = first.wrapping_add(step as u32);
                    let position =
                        self.position(index).ok_or(Violation::UnknownProduct { receiver, index: index.0 })?;
                    self.settle(receiver, position, index, Outcome::Gap)?;
                    self.receivers[receiver].tally.gap_reported += 1;
                }
                Ok(())
            }
            ReceiverEvent::BoundHit { .. } | ReceiverEvent::Started { .. } => Ok(()),
        }
    }

    fn delivered(&mut self, receiver: usize, delivery: &DeliveredProduct) -> Result<(), Violation> {
        let index = delivery.index;
        let position = self.position(index).ok_or(Violation::UnknownProduct { receiver, index: index.0 })?;
        let record = &self.products[position];
        let wrong = |what: String| Violation::WrongDelivery { receiver, index: index.0, what };
        check_product(record, &delivery.metadata, delivery.start_time, delivery.fingerprint).map_err(wrong)?;
        if self.check_md5 {
            if delivery.data.len() != record.size as usize {
                return Err(wrong(format!("{} bytes, expected {}", delivery.data.len(), record.size)));
            }
            if Signature::md5_of(&delivery.data).0 != record.metadata {
                return Err(wrong("MD5 of the delivered bytes differs from the product's signature".into()));
            }
        } else if !delivery.data.is_empty() {
            return Err(wrong("bytes assembled although the receiver discards them".into()));
        }
        self.settle_delivery(receiver, position, index, delivery.retransmitted_blocks, delivery.latency_ns)
    }

    /// Settles a checked delivery and tallies it.
    fn settle_delivery(
        &mut self,
        receiver: usize,
        position: usize,
        index: ProductIndex,
        retransmitted_blocks: u32,
        latency_ns: i64,
    ) -> Result<(), Violation> {
        self.settle(receiver, position, index, Outcome::Delivered)?;
        let tally = &mut self.receivers[receiver].tally;
        tally.delivered += 1;
        tally.delivered_multicast_only += u64::from(retransmitted_blocks == 0);
        tally.retransmitted_blocks += u64::from(retransmitted_blocks);
        tally.latency.record(latency_ns);
        Ok(())
    }

    /// The LDM-7 backstop brought product `index` to `receiver`: FMTP must have missed or
    /// skipped it there, and it comes once. Returns the product's signature.
    pub(crate) fn backstop_delivered(&mut self, receiver: usize, index: ProductIndex) -> Result<[u8; 16], Violation> {
        let position = self.position(index).ok_or(Violation::UnknownProduct { receiver, index: index.0 })?;
        let outcomes = &mut self.receivers[receiver].outcomes;
        let slot = outcomes.get_mut(position);
        match slot {
            Some(slot @ (Outcome::Missed(_) | Outcome::Gap)) => *slot = Outcome::Backstop,
            other => {
                return Err(Violation::Receiver {
                    receiver,
                    what: format!(
                        "the backstop brought product {index}, which FMTP had not missed ({:?})",
                        other.map_or(Outcome::Pending, |slot| *slot)
                    ),
                });
            }
        }
        self.receivers[receiver].tally.backstop += 1;
        Ok(self.products[position].metadata)
    }

    fn settle(
        &mut self,
        receiver: usize,
        position: usize,
        index: ProductIndex,
        outcome: Outcome,
    ) -> Result<(), Violation> {
        let outcomes = &mut self.receivers[receiver].outcomes;
        if outcomes.len() <= position {
            outcomes.resize(position + 1, Outcome::Pending);
        }
        let slot = &mut outcomes[position];
        if *slot != Outcome::Pending {
            return Err(Violation::ReportedTwice {
                receiver,
                index: index.0,
                first: format!("{:?}", *slot),
                second: format!("{outcome:?}"),
            });
        }
        *slot = outcome;
        Ok(())
    }

    /// Checks a product as members that took it whole got it (its BOP and the fingerprint of
    /// its blocks as their group received them), as [`Ledger::receiver_event`] checks one
    /// delivery; each member's delivery is then settled by [`Ledger::delivered_whole`].
    pub(crate) fn check_whole(
        &self,
        index: ProductIndex,
        size: u32,
        metadata: [u8; 16],
        start_time: WallTime,
        fingerprint: u64,
    ) -> Result<(), Violation> {
        let wrong = |what: String| Violation::Sender(format!("product {index} as a group took it whole: {what}"));
        let position = self.position(index).ok_or_else(|| wrong("never enqueued".into()))?;
        let record = &self.products[position];
        if size != record.size {
            return Err(wrong(format!("{size} bytes, expected {}", record.size)));
        }
        if self.check_md5 {
            return Err(wrong("with memory content, whose bytes are checked one delivery at a time".into()));
        }
        check_product(record, &metadata, start_time, fingerprint).map_err(wrong)
    }

    /// Receiver `receiver` took product `index` whole (checked by [`Ledger::check_whole`]).
    pub(crate) fn delivered_whole(
        &mut self,
        receiver: usize,
        index: ProductIndex,
        latency_ns: i64,
    ) -> Result<(), Violation> {
        let position = self.position(index).ok_or(Violation::UnknownProduct { receiver, index: index.0 })?;
        self.settle_delivery(receiver, position, index, 0, latency_ns)
    }

    /// The liveness check: every product from each receiver's first contact on is accounted
    /// for. Fills in `unknown_before_first_contact`.
    pub(crate) fn check_liveness(&mut self) -> Result<(), Violation> {
        for (receiver, ledger) in self.receivers.iter_mut().enumerate() {
            let Some(joined_at) = ledger.joined_at else { continue };
            let first_contact = ledger.first_contact.unwrap_or(self.products.len());
            for (position, record) in self.products.iter().enumerate() {
                let outcome = ledger.outcomes.get(position).copied().unwrap_or(Outcome::Pending);
                if position >= first_contact {
                    if outcome == Outcome::Pending {
                        let index = self.first_index.wrapping_add(position as u32).0;
                        return Err(Violation::SilentlyLost { receiver, index });
                    }
                } else if outcome == Outcome::Pending && record.multicast_started.is_some_and(|at| at >= joined_at) {
                    ledger.tally.unknown_before_first_contact += 1;
                }
            }
        }
        Ok(())
    }

    pub(crate) fn tally(&self, receiver: usize) -> &ReceiverTally {
        &self.receivers[receiver].tally
    }

    pub(crate) fn first_contact(&self, receiver: usize) -> Option<ProductIndex> {
        self.receivers[receiver].first_contact.map(|p| self.first_index.wrapping_add(p as u32))
    }
}
