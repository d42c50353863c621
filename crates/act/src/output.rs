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

/// `-removewmo`: the data without its SBN header and trailer and its WMO heading, as the
/// reference finds them (ldm-formats.md §2, including its quirks: a heading it cannot finish
/// parsing stays, only the bytes before it go).
pub fn remove_wmo(data: &[u8]) -> &[u8] {
    const SBN_HEADER: usize = 11;
    const SBN_TRAILER: usize = 4;
    if data.len() < 21 {
        return data;
    }
    let mut data = data;
    if data.starts_with(b"\x01\r\r\n")
        && data[4..7].iter().all(u8::is_ascii_digit)
        && &data[7..11] == b" \r\r\n"
        && data.len() >= SBN_HEADER + SBN_TRAILER
    {
        data = &data[SBN_HEADER..data.len() - SBN_TRAILER];
    }
    match wmo_heading(data) {
        Some((offset, len)) => &data[offset + len..],
        None => data,
    }
}

/// Where the WMO heading starts and how long the reference takes it to be.
fn wmo_heading(buf: &[u8]) -> Option<(usize, usize)> {
    let at = |index: usize| buf.get(index).copied().unwrap_or(0);
    let is_space = |byte: u8| matches!(byte, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c);
    // `TTAAii` followed by a blank or a letter; a `\r\r\n` before it ends the search.
    let mut offset = None;
    let mut p = 0;
    while p + 6 < buf.len() {
        if buf[p..p + 4].iter().all(u8::is_ascii_alphabetic) {
            if buf[p + 4].is_ascii_digit()
                && buf[p + 5].is_ascii_digit()
                && (is_space(at(p + 6)) || at(p + 6).is_ascii_alphabetic())
            {
                offset = Some(p);
                p += 6;
                break;
            }
        } else if buf[p..].starts_with(b"\r\r\n") {
            break;
        }
        p += 1;
    }
    let offset = offset?;
    while p < buf.len() && is_space(buf[p]) {
        p += 1;
    }
    // `CCCC`.
    if p + 4 > buf.len()
        || !(buf[p].is_ascii_alphabetic()
            && buf[p + 1].is_ascii_alphanumeric()
            && buf[p + 2].is_ascii_alphabetic()
            && buf[p + 3].is_ascii_alphanumeric())
    {
        return None;
    }
    p += 4;
    while p < buf.len() && is_space(buf[p]) {
        p += 1;
    }
    // `YYGGgg`.
    if p + 6 <= buf.len() && buf[p..p + 6].iter().all(u8::is_ascii_digit) {
        p += 6;
    }
    // `[BBB]` and the end of the line.
    let mut line_ends = 0;
    let mut bbb_found = false;
    while p < buf.len() {
        let byte = buf[p];
        if byte == b'\r' || byte == b'\n' {
            line_ends += 1;
            p += 1;
            if line_ends == 3 {
                break;
            }
        } else if line_ends > 0 {
            p -= 1;
            break;
        } else if byte.is_ascii_alphabetic() {
            if bbb_found {
                return Some((offset, 0));
            }
            let mut run = 1;
            while p + run < buf.len() && run < 3 && buf[p + run].is_ascii_alphabetic() {
                run += 1;
            }
            if p + run < buf.len() && is_space(buf[p + run]) {
                bbb_found = true;
                p += run;
            } else {
                return Some((offset, 0));
            }
        } else if is_space(byte) {
            p += 1;
        } else {
            return Some((offset, 0));
        }
    }
    // An AWIPS `NNNXXX` line.
    if p + 9 <= buf.len() && buf[p..p + 6].iter().all(u8::is_ascii_alphanumeric) && &buf[p + 6..p + 9] == b"\r\r\n" {
        p += 9;
    }
    Some((offset, p - offset))
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

    #[test]
    fn removewmo_drops_the_sbn_header_and_trailer_and_the_heading() {
        let product = b"\x01\r\r\n123 \r\r\nSAUS43 KWBC 231200 RRA\r\r\nMTRBOS\r\r\nMETAR KBOS 231154Z\r\r\n\x03END!";
        // SBN header and its 4-byte trailer ("END!"), then heading and AWIPS line go.
        assert_eq!(remove_wmo(product), b"METAR KBOS 231154Z\r\r\n\x03");
        // Without an AWIPS line; bytes before the heading go too.
        assert_eq!(remove_wmo(b"junk SDUS53 KDMX 231158\r\r\nbinary data here"), b"binary data here");
        // No heading: all kept; too short: all kept.
        assert_eq!(remove_wmo(b"no heading in this product at all"), b"no heading in this product at all");
        assert_eq!(remove_wmo(b"SAUS43 KWBC 2312"), b"SAUS43 KWBC 2312");
        // A heading the reference cannot finish parsing (a second BBB) stays; the prefix goes.
        assert_eq!(remove_wmo(b"xxSAUS43 KWBC 231200 RRA CCB\r\r\ndata"), b"SAUS43 KWBC 231200 RRA CCB\r\r\ndata");
        // A premature end of the line: the last CR/LF stays.
        assert_eq!(remove_wmo(b"SAUS43 KWBC 231200\r\ndata that follows"), b"\ndata that follows");
    }
}
