//! LDM products as FMTP carries them (ldm7-multicast.md §3.4, "LDM usage of FMTP products"):
//! the FMTP product is the XDR-encoded LDM product — `xdr(prod_info)` followed by the data,
//! padded to a multiple of 4 bytes — and the BOP metadata is the product's 16-byte MD5
//! signature.
//!
//! [`QueuedProduct`] is the sending side: a product of the product queue read block by block
//! when FMTP multicasts or repairs it, so a feed's products are never all in memory — only each
//! product's small XDR header is. Once the queue evicts the product, reads fail and the FMTP
//! sender releases it ([`DataUnavailable`]). [`decode`] is the receiving side's check.

use std::sync::Arc;

use ldm7_fmtp_proto::{DataUnavailable, ProductData};
use ldm7_pq::Queue;
use ldm7_types::{ProdInfo, Signature, Timestamp};
use ldm7_xdr::XdrError;
use ldm7_xdr::codec::{Decoder, Encoder};

/// The XDR header (`prod_info`) of an FMTP product.
pub fn encode_header(info: &ProdInfo) -> Vec<u8> {
    let mut header = Vec::with_capacity(96 + info.ident.len() + info.origin.len());
    ldm7_xdr::ldm::encode_prod_info(&mut Encoder::new(&mut header), info);
    header
}

/// Bytes of an FMTP product whose data has `size` bytes after a header of `header_len`.
pub fn fmtp_len(header_len: usize, size: u32) -> u64 {
    header_len as u64 + u64::from(size).next_multiple_of(4)
}

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

/// Why received FMTP product bytes are not an LDM product.
#[derive(Debug, thiserror::Error)]
pub enum ProductError {
    /// The XDR header does not decode.
    #[error("the product's XDR header does not decode: {0}")]
    Header(#[from] XdrError),
    /// The length does not match the header's size.
    #[error("{len} bytes do not hold a header of {header_len} and {size} data bytes")]
    Length {
        /// The FMTP product length.
        len: u64,
        /// The header length.
        header_len: usize,
        /// The size the header gives.
        size: u32,
    },
    /// The BOP metadata is not the header's signature.
    #[error("the BOP metadata does not match the product's signature {0}")]
    Metadata(Signature),
    /// The data's MD5 is not the signature.
    #[error("the data's MD5 {computed} is not the product's signature {signature}")]
    Signature {
        /// What the header says.
        signature: Signature,
        /// What the data hashes to.
        computed: Signature,
    },
}

/// Decodes the head of an FMTP product: its `prod_info` and where the data starts. `len` is
/// the FMTP product length (checked against the size), `metadata` the BOP metadata.
pub fn decode(head: &[u8], len: u64, metadata: &[u8]) -> Result<(ProdInfo, usize), ProductError> {
    let mut decoder = Decoder::new(head);
    let info = ldm7_xdr::ldm::decode_prod_info(&mut decoder)?;
    let header_len = decoder.position();
    if fmtp_len(header_len, info.size) != len {
        return Err(ProductError::Length { len, header_len, size: info.size });
    }
    if metadata.len() < 16 || metadata[..16] != info.signature.0 {
        return Err(ProductError::Metadata(info.signature));
    }
    Ok((info, header_len))
}

/// Checks that `data` hashes to the signature.
pub fn verify(info: &ProdInfo, data: &[u8]) -> Result<(), ProductError> {
    let computed = Signature::md5_of(data);
    if computed != info.signature {
        return Err(ProductError::Signature { signature: info.signature, computed });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ldm7_pq::{Capacity, InsertOutcome};
    use ldm7_types::FeedType;

    /// The first product of the LDM-7 capture: `prod_info` of TEST/cap.1 and "hello 1\n".
    const CAPTURED: &str = "6b02b0ef000ac16a99472f8d2f760bcc394e80d09275150a00000002766d00004000000000000001\
                            0000000a544553542f6361702e31000000000008";

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len()).step_by(2).map(|k| u8::from_str_radix(&text[k..k + 2], 16).unwrap()).collect()
    }

    #[test]
    fn header_is_the_captured_prod_info() {
        let head = hex(CAPTURED);
        let mut bytes = head.clone();
        bytes.extend_from_slice(b"hello 1\n");
        let (info, at) = decode(&bytes, 68, &hex("99472f8d2f760bcc394e80d09275150a")).unwrap();
        assert_eq!((info.ident.as_str(), info.origin.as_str(), info.size, at), ("TEST/cap.1", "vm", 8, 60));
        assert_eq!(encode_header(&info), head);
        verify(&info, &bytes[at..at + 8]).unwrap();
        assert!(matches!(decode(&bytes, 72, &info.signature.0), Err(ProductError::Length { .. })));
        assert!(matches!(decode(&bytes, 68, &[0; 16]), Err(ProductError::Metadata(_))));
        assert!(matches!(verify(&info, b"hello 2\n"), Err(ProductError::Signature { .. })));
    }

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
