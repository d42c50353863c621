//! The stored form of one product: a fixed little-endian header, origin, ident, then the data.
//!
//! ```text
//! offset size field
//!      0    1 format version (1)
//!      1    1 origin length (<= 64)
//!      2    1 ident length (<= 255)
//!      3    1 reserved (0)
//!      4    4 data length (bytes)
//!      8    8 queue sequence number (counts every insert since creation)
//!     16    8 arrival (creation) time, microseconds since the epoch (i64)
//!     24    4 feedtype mask
//!     28    4 producer sequence number (seqno)
//!     32   16 signature (MD5)
//!     48    n origin bytes, then ident bytes, then the data
//! ```
//! The queue's `products` table maps the insertion time (big-endian u64 microseconds, unique) to
//! this record, or to a [`Reference`] to it: the records of products inserted together are
//! packed into one value of the `extents` table, so that LMDB rounds their run up to whole pages
//! once rather than each record (a 30,100-byte record alone takes eight 4 KiB pages, 8.9% more).
//! `docs/queue.md` describes the whole layout.

use ldm7_types::prodinfo::InvalidProdInfo;
use ldm7_types::{FeedType, ProdInfo, Signature, Timestamp};

/// Version written in byte 0 of every record.
pub(crate) const RECORD_FORMAT_VERSION: u8 = 1;
/// Bytes before the origin.
pub(crate) const HEADER_LEN: usize = 48;
/// Byte 0 of a [`Reference`]: never a record's format version, so a program that knows only
/// records reports "record format version 2 is not supported" for a queue holding references
/// (which are as long as a record's header for that reason).
pub(crate) const REFERENCE_FORMAT: u8 = 2;
/// Bytes of an encoded [`Reference`].
pub(crate) const REFERENCE_LEN: usize = HEADER_LEN;

/// Where a packed record lies: a slice of one `extents` value.
///
/// ```text
/// offset size field
///      0    1 2 (a reference, not a record)
///      1    1 1 if this is the extent's last record (evicting it removes the extent), else 0
///      2    2 reserved (0)
///      4    4 offset of the record in the extent
///      8    4 length of the record
///     12    8 the extent's key (the insertion time of its first record's product)
///     20   28 reserved (0)
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reference {
    pub extent: u64,
    pub offset: u32,
    pub len: u32,
    pub last: bool,
}

impl Reference {
    pub fn encode(&self) -> [u8; REFERENCE_LEN] {
        let mut out = [0u8; REFERENCE_LEN];
        out[0] = REFERENCE_FORMAT;
        out[1] = u8::from(self.last);
        out[4..8].copy_from_slice(&self.offset.to_le_bytes());
        out[8..12].copy_from_slice(&self.len.to_le_bytes());
        out[12..20].copy_from_slice(&self.extent.to_le_bytes());
        out
    }

    /// The reference in a `products` value, `None` when the value is a record; a damaged
    /// reference is an error, never a panic.
    pub fn parse(bytes: &[u8]) -> Result<Option<Self>, CorruptRecord> {
        if bytes.first() != Some(&REFERENCE_FORMAT) {
            return Ok(None);
        }
        if bytes.len() != REFERENCE_LEN || bytes[1] > 1 {
            return Err(CorruptRecord::Reference(bytes.len()));
        }
        Ok(Some(Self {
            extent: u64_at(bytes, 12),
            offset: u32_at(bytes, 4),
            len: u32_at(bytes, 8),
            last: bytes[1] == 1,
        }))
    }

    /// The record this reference points at in its extent's bytes.
    pub fn record<'a>(&self, extent: &'a [u8]) -> Result<&'a [u8], CorruptRecord> {
        let start = self.offset as usize;
        extent.get(start..start + self.len as usize).ok_or(CorruptRecord::OutsideExtent {
            extent: self.extent,
            end: start + self.len as usize,
            len: extent.len(),
        })
    }
}

/// Why a product cannot be stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidProduct {
    /// The metadata breaks one of LDM's limits.
    #[error(transparent)]
    Info(#[from] InvalidProdInfo),
    /// `info.size` disagrees with the data handed over.
    #[error("product info says {declared} bytes but {actual} bytes of data were given")]
    SizeMismatch {
        /// Size in the product info.
        declared: u32,
        /// Length of the data.
        actual: usize,
    },
}

/// Checks `info` against `data` and returns the record length.
pub(crate) fn record_len(info: &ProdInfo, data_len: usize) -> Result<usize, InvalidProduct> {
    info.validate()?;
    if usize::try_from(info.size).ok() != Some(data_len) {
        return Err(InvalidProduct::SizeMismatch { declared: info.size, actual: data_len });
    }
    Ok(HEADER_LEN + info.origin.len() + info.ident.len() + data_len)
}

/// Writes the header, origin and ident into `out` (exactly `HEADER_LEN + origin + ident` bytes).
/// Lengths must have been checked by [`record_len`].
pub(crate) fn write_header(out: &mut Vec<u8>, info: &ProdInfo, queue_seq: u64) {
    out.push(RECORD_FORMAT_VERSION);
    out.push(info.origin.len() as u8);
    out.push(info.ident.len() as u8);
    out.push(0);
    out.extend_from_slice(&info.size.to_le_bytes());
    out.extend_from_slice(&queue_seq.to_le_bytes());
    out.extend_from_slice(&info.arrival.as_unix_micros().to_le_bytes());
    out.extend_from_slice(&info.feedtype.bits().to_le_bytes());
    out.extend_from_slice(&info.seqno.to_le_bytes());
    out.extend_from_slice(info.signature.as_bytes());
    out.extend_from_slice(info.origin.as_bytes());
    out.extend_from_slice(info.ident.as_bytes());
}

/// A stored record, parsed without copying the data.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecordView<'a> {
    pub queue_seq: u64,
    pub arrival_micros: i64,
    pub feedtype: u32,
    pub seqno: u32,
    pub signature: [u8; 16],
    pub origin: &'a [u8],
    pub ident: &'a [u8],
    pub data: &'a [u8],
}

/// Why stored bytes are not a record (the queue is damaged or from another version).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CorruptRecord {
    /// Shorter than its header says.
    #[error("record of {0} bytes is truncated")]
    Truncated(usize),
    /// Unknown format version.
    #[error("record format version {0} is not supported")]
    Version(u8),
    /// Longer than its header says.
    #[error("record has {0} trailing bytes")]
    Trailing(usize),
    /// Origin or ident is not UTF-8.
    #[error("record origin or ident is not UTF-8")]
    NotUtf8,
    /// A reference to a packed record is damaged.
    #[error("damaged reference to a packed record ({0} bytes)")]
    Reference(usize),
    /// A reference points past the end of its extent.
    #[error("reference to bytes up to {end} of the {len}-byte extent {extent}")]
    OutsideExtent {
        /// The extent's key.
        extent: u64,
        /// The end of the referenced record.
        end: usize,
        /// The extent's length.
        len: usize,
    },
    /// A reference names an extent that is not in the queue.
    #[error("reference to the missing extent {0}")]
    MissingExtent(u64),
}

impl<'a> RecordView<'a> {
    /// Parses a stored record; never panics.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, CorruptRecord> {
        let header = bytes.get(..HEADER_LEN).ok_or(CorruptRecord::Truncated(bytes.len()))?;
        if header[0] != RECORD_FORMAT_VERSION {
            return Err(CorruptRecord::Version(header[0]));
        }
        let origin_len = usize::from(header[1]);
        let ident_len = usize::from(header[2]);
        let data_len = u32_at(header, 4) as usize;
        let origin_end = HEADER_LEN + origin_len;
        let ident_end = origin_end + ident_len;
        let total = ident_end.checked_add(data_len).ok_or(CorruptRecord::Truncated(bytes.len()))?;
        if bytes.len() < total {
            return Err(CorruptRecord::Truncated(bytes.len()));
        }
        if bytes.len() > total {
            return Err(CorruptRecord::Trailing(bytes.len() - total));
        }
        let mut signature = [0u8; 16];
        signature.copy_from_slice(&header[32..48]);
        Ok(Self {
            queue_seq: u64_at(header, 8),
            arrival_micros: u64_at(header, 16) as i64,
            feedtype: u32_at(header, 24),
            seqno: u32_at(header, 28),
            signature,
            origin: &bytes[HEADER_LEN..origin_end],
            ident: &bytes[origin_end..ident_end],
            data: &bytes[ident_end..total],
        })
    }

    /// The product's metadata as an owned value.
    pub fn prod_info(&self) -> Result<ProdInfo, CorruptRecord> {
        let text = |bytes: &[u8]| std::str::from_utf8(bytes).map(str::to_owned).map_err(|_| CorruptRecord::NotUtf8);
        Ok(ProdInfo {
            arrival: Timestamp::from_unix_micros(self.arrival_micros),
            signature: Signature(self.signature),
            origin: text(self.origin)?,
            feedtype: FeedType(self.feedtype),
            seqno: self.seqno,
            ident: text(self.ident)?,
            size: self.data.len() as u32,
        })
    }
}

fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[offset..offset + 4]);
    u32::from_le_bytes(word)
}

fn u64_at(bytes: &[u8], offset: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[offset..offset + 8]);
    u64::from_le_bytes(word)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ProdInfo {
        ProdInfo {
            arrival: Timestamp::from_unix_micros(1_434_326_400_123_456),
            signature: Signature::md5_of(b"x"),
            origin: "host.example".into(),
            feedtype: FeedType::NGRID,
            seqno: 42,
            ident: "TEST.ident".into(),
            size: 3,
        }
    }

    #[test]
    fn round_trip() {
        let info = sample();
        let mut bytes = Vec::new();
        write_header(&mut bytes, &info, 7);
        bytes.extend_from_slice(b"abc");
        assert_eq!(bytes.len(), record_len(&info, 3).unwrap());
        let view = RecordView::parse(&bytes).unwrap();
        assert_eq!(view.queue_seq, 7);
        assert_eq!(view.data, b"abc");
        assert_eq!(view.prod_info().unwrap(), info);
    }

    #[test]
    fn damaged_records_are_errors_not_panics() {
        let info = sample();
        let mut bytes = Vec::new();
        write_header(&mut bytes, &info, 7);
        bytes.extend_from_slice(b"abc");
        for cut in 0..bytes.len() {
            assert!(RecordView::parse(&bytes[..cut]).is_err());
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(RecordView::parse(&longer).unwrap_err(), CorruptRecord::Trailing(1));
        bytes[0] = 9;
        assert_eq!(RecordView::parse(&bytes).unwrap_err(), CorruptRecord::Version(9));
    }

    #[test]
    fn references_round_trip_and_damaged_ones_are_errors() {
        let reference = Reference { extent: 1_434_326_400_123_456, offset: 30_100, len: 30_100, last: true };
        let bytes = reference.encode();
        assert_eq!(Reference::parse(&bytes).unwrap(), Some(reference));
        let mut record = Vec::new();
        write_header(&mut record, &sample(), 7);
        assert_eq!(Reference::parse(&record).unwrap(), None, "a record is not a reference");
        assert_eq!(RecordView::parse(&bytes).unwrap_err(), CorruptRecord::Version(2), "what a reader of records says");
        assert!(Reference::parse(&bytes[..REFERENCE_LEN - 1]).is_err());
        let mut flag = bytes;
        flag[1] = 7;
        assert!(Reference::parse(&flag).is_err());
        let extent = vec![0u8; 60_199];
        assert!(matches!(reference.record(&extent), Err(CorruptRecord::OutsideExtent { end: 60_200, .. })));
        assert_eq!(reference.record(&[0u8; 60_200]).unwrap().len(), 30_100);
    }

    #[test]
    fn invalid_products_are_refused() {
        let mut info = sample();
        assert!(matches!(record_len(&info, 4), Err(InvalidProduct::SizeMismatch { .. })));
        info.ident.clear();
        assert_eq!(record_len(&info, 3), Err(InvalidProduct::Info(InvalidProdInfo::IdentEmpty)));
        info.ident = "x".repeat(256);
        assert_eq!(record_len(&info, 3), Err(InvalidProduct::Info(InvalidProdInfo::IdentTooLong(256))));
        info.ident = "x".into();
        info.origin = "o".repeat(65);
        assert!(matches!(record_len(&info, 3), Err(InvalidProduct::Info(InvalidProdInfo::OriginTooLong(_)))));
    }
}
