//! What FILE, STDIOFILE and PIPE write for a product besides its bytes (ldm-formats.md §2): the
//! `-metadata` record, and the `-strip` filter.

use ldm7_types::ProdInfo;

/// The `-metadata` record written before a product's data (native byte order, no padding):
/// `u32` length of the record (itself included), the 16-byte signature, `u32` size of the data
/// that follows, `u64` arrival seconds, `i32` arrival microseconds, `u32` feedtype, `u32`
/// sequence number, `u32` identifier length and its bytes, `u32` origin length and its bytes.
/// `data_len` is the size of the data as written (after `-strip`, `-removewmo`).
pub fn metadata_record(info: &ProdInfo, data_len: u32) -> Vec<u8> {
    let ident = info.ident.as_bytes();
    let origin = info.origin.as_bytes();
    let total = 4 + 16 + 4 + 8 + 4 + 4 + 4 + (4 + ident.len()) + (4 + origin.len());
    let mut record = Vec::with_capacity(total);
    record.extend_from_slice(&(total as u32).to_ne_bytes());
    record.extend_from_slice(info.signature.as_bytes());
    record.extend_from_slice(&data_len.to_ne_bytes());
    record.extend_from_slice(&(info.arrival.secs as u64).to_ne_bytes());
    record.extend_from_slice(&info.arrival.micros.to_ne_bytes());
    record.extend_from_slice(&info.feedtype.bits().to_ne_bytes());
    record.extend_from_slice(&info.seqno.to_ne_bytes());
    record.extend_from_slice(&(ident.len() as u32).to_ne_bytes());
    record.extend_from_slice(ident);
    record.extend_from_slice(&(origin.len() as u32).to_ne_bytes());
    record.extend_from_slice(origin);
    record
}

/// `-strip`: the data without its control characters (C's `iscntrl`: bytes 0–31 and 127),
/// newlines kept.
pub fn strip_control(data: &[u8]) -> Vec<u8> {
    data.iter().copied().filter(|&byte| byte == b'\n' || !(byte < 0x20 || byte == 0x7f)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ldm7_types::{FeedType, Signature, Timestamp};

    #[test]
    fn the_metadata_record_byte_by_byte() {
        let info = ProdInfo {
            arrival: Timestamp { secs: 1_795_456_509, micros: 250_000 },
            signature: Signature(*b"0123456789abcdef"),
            origin: "host".into(),
            feedtype: FeedType(8),
            seqno: 77,
            ident: "SAUS43 KWBC".into(),
            size: 1000,
        };
        let record = metadata_record(&info, 990);
        let mut expected = Vec::new();
        expected.extend_from_slice(&67u32.to_ne_bytes());
        expected.extend_from_slice(b"0123456789abcdef");
        expected.extend_from_slice(&990u32.to_ne_bytes());
        expected.extend_from_slice(&1_795_456_509u64.to_ne_bytes());
        expected.extend_from_slice(&250_000i32.to_ne_bytes());
        expected.extend_from_slice(&8u32.to_ne_bytes());
        expected.extend_from_slice(&77u32.to_ne_bytes());
        expected.extend_from_slice(&11u32.to_ne_bytes());
        expected.extend_from_slice(b"SAUS43 KWBC");
        expected.extend_from_slice(&4u32.to_ne_bytes());
        expected.extend_from_slice(b"host");
        assert_eq!(record, expected);
        assert_eq!(record.len(), 67);
    }

    #[test]
    fn strip_keeps_newlines_and_printable_bytes() {
        assert_eq!(strip_control(b"\x01\r\r\nSAUS43 KWBC\x03\t\x7f\xe9\n"), b"\nSAUS43 KWBC\xe9\n");
    }
}
