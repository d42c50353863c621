//! LDM products as FMTP carries them (ldm7-multicast.md §3.4, "LDM usage of FMTP products"):
//! the FMTP product is the XDR-encoded LDM product — `xdr(prod_info)` followed by the data,
//! padded to a multiple of 4 bytes — and the BOP metadata is the product's 16-byte MD5
//! signature. The sending side frames a product with [`encode_header`] and [`fmtp_len`]; the
//! receiving side checks one with [`decode`] and [`verify`].

use ldm7_types::{ProdInfo, Signature};
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
}
