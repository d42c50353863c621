//! LDM products as FMTP carries them: the framing and its checks are
//! `ldm7_ldm_proto::fmtp_product` (re-exported here). [`QueuedProduct`] is the sending side: a
//! product of the product queue read block by block when FMTP multicasts or repairs it, so a
//! feed's products are never all in memory — only each product's small XDR header is. Once the
//! queue evicts the product, reads fail and the FMTP sender releases it ([`DataUnavailable`]).
//! [`decode`] is the receiving side's check.

use std::sync::Arc;

use ldm7_fmtp_proto::{DataUnavailable, ProductData};
use ldm7_pq::Queue;
use ldm7_types::{ProdInfo, Signature, Timestamp};

pub use ldm7_ldm_proto::fmtp_product::{ProductError, decode, encode_header, fmtp_len, verify};

/// A queued product as FMTP product bytes, read from the queue on demand.
pub struct QueuedProduct {
    queue: Arc<Queue>,
    insertion: Timestamp,
    signature: Signature,
    header: Vec<u8>,
    size: u32,
}

impl QueuedProduct {
    /// The product inserted at `insertion` with `info` (read from the same queue).
    pub fn new(queue: Arc<Queue>, insertion: Timestamp, info: &ProdInfo) -> Self {
        Self { queue, insertion, signature: info.signature, header: encode_header(info), size: info.size }
    }

    /// The BOP metadata: the signature.
    pub fn metadata(&self) -> Vec<u8> {
        self.signature.as_bytes().to_vec()
    }
}

impl std::fmt::Debug for QueuedProduct {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuedProduct").field("signature", &self.signature).field("size", &self.size).finish()
    }
}

impl ProductData for QueuedProduct {
    fn len(&self) -> u64 {
        fmtp_len(self.header.len(), self.size)
    }

    fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<(), DataUnavailable> {
        let end = offset.checked_add(out.len() as u64).ok_or(DataUnavailable)?;
        if end > self.len() {
            return Err(DataUnavailable);
        }
        let header_len = self.header.len() as u64;
        let mut written = 0usize;
        if offset < header_len {
            let from = offset as usize;
            let count = (self.header.len() - from).min(out.len());
            out[..count].copy_from_slice(&self.header[from..from + count]);
            written = count;
        }
        if written == out.len() {
            return Ok(());
        }
        // Data bytes [start, start + rest) of the product, then zero padding.
        let start = (offset + written as u64 - header_len) as usize;
        let snapshot = self.queue.snapshot().map_err(|_| DataUnavailable)?;
        let product =
            snapshot.product_at_or_after(self.insertion).map_err(|_| DataUnavailable)?.ok_or(DataUnavailable)?;
        if product.insertion != self.insertion || product.info.signature != self.signature {
            return Err(DataUnavailable);
        }
        let rest = &mut out[written..];
        let available = product.data.len().saturating_sub(start).min(rest.len());
        if available > 0 {
            rest[..available].copy_from_slice(&product.data[start..start + available]);
        }
        rest[available..].fill(0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ldm7_pq::{Capacity, InsertOutcome};
    use ldm7_types::FeedType;

    #[test]
    fn queued_product_reads_header_data_and_padding() {
        let dir = tempfile::tempdir().unwrap();
        let queue =
            Arc::new(Queue::create(&dir.path().join("q.pq"), Capacity { bytes: 1 << 20, slots: 100 }, false).unwrap());
        let data = b"hello, unaligned".repeat(101);
        let data = &data[..1601];
        let info = ProdInfo {
            arrival: Timestamp::from_unix_micros(1_700_000_000_000_000),
            signature: Signature::md5_of(data),
            origin: "vm".into(),
            feedtype: FeedType::EXP,
            seqno: 1,
            ident: "TEST/odd".into(),
            size: data.len() as u32,
        };
        let InsertOutcome::Inserted { insertion, .. } = queue.insert(&info, data).unwrap() else { panic!() };
        let product = QueuedProduct::new(queue.clone(), insertion, &info);
        let len = product.len() as usize;
        assert_eq!(len, encode_header(&info).len() + 1604);
        let mut whole = vec![0xAA; len];
        for (k, block) in whole.chunks_mut(7).enumerate() {
            product.read_at(k as u64 * 7, block).unwrap();
        }
        let (decoded, at) = decode(&whole, len as u64, &product.metadata()).unwrap();
        assert_eq!(&whole[at..at + data.len()], data);
        assert_eq!(&whole[at + data.len()..], &[0, 0, 0]);
        assert_eq!(decoded, info);
        assert_eq!(product.read_at(len as u64 - 1, &mut [0; 2]), Err(DataUnavailable));
    }
}
