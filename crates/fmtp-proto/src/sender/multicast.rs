//! The multicast: the product in front sent as BOP, data blocks and EOP, with a tail probe's
//! repeated EOP and queued parity shards before new data, each datagram paced by the multicast
//! token bucket.

use crate::wire::{Body, HEADER_LEN, MessageType};

use super::interest::InterestSet;
use super::{DataUnavailable, Destination, Sender, Stage, Transmit, emit_block, emit_control};

impl Sender {
    pub(super) fn next_multicast_len(&self) -> Option<usize> {
        if self.repeated_eop.is_some() {
            return Some(HEADER_LEN);
        }
        if !self.parity_queue.is_empty() {
            return Some(HEADER_LEN + self.config.block_len);
        }
        let product = self.products.get(self.multicast_queue.front()?)?;
        Some(match self.stage {
            Stage::Bop => HEADER_LEN + 18 + product.metadata.len(),
            Stage::Data(offset) => HEADER_LEN + self.config.block_len.min((product.size - offset) as usize),
            Stage::Eop => HEADER_LEN,
        })
    }

    pub(super) fn transmit_multicast(&mut self, buf: &mut Vec<u8>) -> Option<Transmit> {
        if let Some(index) = self.repeated_eop.take() {
            let start = buf.len();
            emit_control(buf, index, Body::Eop);
            self.counters.tail_eops_multicast += 1;
            return Some(self.multicast_sent(buf.len() - start, MessageType::Eop));
        }
        while let Some((key, group, shard)) = self.parity_queue.pop_front() {
            if let Some(transmit) = self.transmit_parity(buf, key, group, shard) {
                return Some(transmit);
            }
        }
        let key = *self.multicast_queue.front()?;
        if self.stage == Stage::Bop {
            self.join_run(key);
        }
        let start = buf.len();
        let product = self.products.get_mut(&key)?;
        let message_type = match self.stage {
            Stage::Bop => {
                // §3.8: the product's receiver set is the receivers connected now.
                product.interest = InterestSet::all_pending(self.ids.iter().copied());
                emit_control(buf, product.index, Body::Bop(product.bop()));
                self.stage = if product.size == 0 { Stage::Eop } else { Stage::Data(0) };
                MessageType::Bop
            }
            Stage::Data(offset) => {
                let len = self.config.block_len.min((product.size - offset) as usize);
                match emit_block(buf, product, MessageType::MemData, offset, len) {
                    Ok(()) => {
                        let next = offset + len as u32;
                        self.stage = if next >= product.size { Stage::Eop } else { Stage::Data(next) };
                        MessageType::MemData
                    }
                    Err(DataUnavailable) => {
                        // End the product now: receivers will ask for the rest and be rejected.
                        buf.truncate(start);
                        product.failed = true;
                        emit_control(buf, product.index, Body::Eop);
                        self.finish_multicast(key);
                        MessageType::Eop
                    }
                }
            }
            Stage::Eop => {
                emit_control(buf, product.index, Body::Eop);
                self.finish_multicast(key);
                MessageType::Eop
            }
        };
        Some(self.multicast_sent(buf.len() - start, message_type))
    }

    /// Accounts a multicast datagram of `len` bytes (pacing, counters).
    fn multicast_sent(&mut self, len: usize, message_type: MessageType) -> Transmit {
        if let Some(bucket) = &mut self.multicast_bucket {
            bucket.try_take(len);
        }
        self.counters.multicast_datagrams += 1;
        self.counters.multicast_bytes += len as u64;
        Transmit { destination: Destination::Multicast, len, message_type }
    }
}
