//! ONC RPC over TCP (RFC 5531): record marking and the message headers LDM uses (AUTH_NONE).
//!
//! A record is one or more fragments, each behind a 4-byte header whose bit 31 marks the last
//! fragment and whose low 31 bits give its length. Receivers accept any fragmentation
//! ([`RecordReader`]); [`finish_record`] writes one fragment per record, as the reference does
//! for every record the captures show.
//!
//! The reader keeps what arrives in a buffer that the caller reads into
//! ([`RecordReader::space`] then [`RecordReader::filled`]), and hands out each one-fragment
//! record as a [`Record`] that shares that buffer: a record is never copied out of it. The
//! buffer is reused once no record refers to it any more, so a steady stream needs no new
//! memory; a record that arrives in several fragments is joined (copied) into its own.

use std::ops::Range;
use std::sync::Arc;

use crate::XdrError;
use crate::codec::{Decoder, Encoder};

/// LDM's RPC program number.
pub const LDM_PROGRAM: u32 = 300_029;
/// RPC protocol version.
pub const RPC_VERSION: u32 = 2;

pub(crate) const LAST_FRAGMENT: u32 = 0x8000_0000;

/// Fragments at least this long are read to their end and no further: the record ends where a
/// read ends, so nothing after it has to be moved to make room for the next one.
pub const DIRECT_FRAGMENT_MIN: usize = 64 << 10;

/// The size of a reader's buffer by default (it grows for records that do not fit).
pub const CHUNK: usize = 1 << 20;
/// The least room offered for a read when no large fragment is pending.
const READ_MIN: usize = 64 << 10;
/// A buffer grown larger than this for one large record is given up once that record is out.
const CHUNK_KEPT_MAX: usize = 16 << 20;
/// Buffers kept for reuse while records still refer to them.
const SPARE_MAX: usize = 2;

/// A whole record: its bytes where they arrived, shared with the reader's buffer (or, for a
/// record of several fragments, joined into its own).
#[derive(Clone)]
pub struct Record {
    buffer: Arc<Vec<u8>>,
    range: Range<usize>,
}

impl Record {
    /// Bytes `range` of this record, sharing its buffer (a range outside it is cut to what it
    /// holds).
    pub fn slice(&self, range: Range<usize>) -> Record {
        let end = range.end.min(self.range.len());
        let start = range.start.min(end);
        Record { buffer: Arc::clone(&self.buffer), range: self.range.start + start..self.range.start + end }
    }
}

impl From<Vec<u8>> for Record {
    fn from(bytes: Vec<u8>) -> Self {
        let range = 0..bytes.len();
        Record { buffer: Arc::new(bytes), range }
    }
}

impl std::ops::Deref for Record {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.buffer[self.range.clone()]
    }
}

impl AsRef<[u8]> for Record {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl PartialEq for Record {
    fn eq(&self, other: &Record) -> bool {
        **self == **other
    }
}

impl Eq for Record {}

impl PartialEq<[u8]> for Record {
    fn eq(&self, other: &[u8]) -> bool {
        **self == *other
    }
}

impl PartialEq<Vec<u8>> for Record {
    fn eq(&self, other: &Vec<u8>) -> bool {
        **self == other[..]
    }
}

impl std::fmt::Debug for Record {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&**self, formatter)
    }
}

/// Reassembles records from a TCP byte stream, whatever the fragmentation.
#[derive(Debug)]
pub struct RecordReader {
    /// Where bytes arrive. Initialized throughout (its length is its capacity), so that reads
    /// need no zeroing and no `unsafe`; bytes `start..filled` arrived and are not yet returned.
    buffer: Arc<Vec<u8>>,
    start: usize,
    filled: usize,
    /// The fragments so far of a record that came in several.
    joined: Vec<u8>,
    /// A whole record already looked at by [`RecordReader::peek_record`].
    peeked: Option<Record>,
    /// Earlier buffers that records still referred to when a read needed room, reused once
    /// they no longer do.
    spare: Vec<Arc<Vec<u8>>>,
    max: usize,
    /// The size buffers are allocated in ([`CHUNK`] unless set smaller, for connections that
    /// carry only small calls).
    chunk: usize,
}

impl RecordReader {
    /// A reader refusing records longer than `max` bytes.
    pub fn new(max: usize) -> Self {
        Self {
            buffer: Arc::new(Vec::new()),
            start: 0,
            filled: 0,
            joined: Vec::new(),
            peeked: None,
            spare: Vec::new(),
            max,
            chunk: CHUNK,
        }
    }

    /// A reader refusing records longer than `max` bytes whose buffers are allocated `chunk`
    /// bytes at a time (at least 4 KiB): a small chunk keeps a connection that carries only
    /// small calls small; buffers still grow for any record up to `max`.
    pub fn with_chunk(max: usize, chunk: usize) -> Self {
        Self { chunk: chunk.clamp(4 << 10, CHUNK), ..Self::new(max) }
    }

    /// Changes the bound and the chunk (a connection whose session now receives products:
    /// larger records, larger reads). A fragment already announced beyond the new bound is
    /// refused at the next [`RecordReader::next_record`].
    pub fn set_limits(&mut self, max: usize, chunk: usize) {
        self.max = max;
        self.chunk = chunk.clamp(4 << 10, CHUNK);
    }

    /// The bound on a record's length (all its fragments).
    pub fn max(&self) -> usize {
        self.max
    }

    /// Lets go of the buffers when nothing is pending (a connection gone quiet): they go back to
    /// the allocator once no record refers to them, and the next [`RecordReader::space`]
    /// allocates again. Returns whether the reader held any.
    pub fn release_idle(&mut self) -> bool {
        if self.pending() > 0 || self.held_bytes() == 0 {
            return false;
        }
        self.buffer = Arc::new(Vec::new());
        self.spare.clear();
        self.joined = Vec::new();
        self.start = 0;
        self.filled = 0;
        true
    }

    /// Bytes of memory the reader holds (its buffer, spares and joined fragments).
    pub fn held_bytes(&self) -> usize {
        self.buffer.len() + self.spare.iter().map(|spare| spare.len()).sum::<usize>() + self.joined.capacity()
    }

    /// Room for the next read from the stream: read into it, then call
    /// [`RecordReader::filled`] with the number of bytes read. While a large fragment is
    /// arriving the room ends where it ends.
    pub fn space(&mut self) -> &mut [u8] {
        if self.start == self.filled {
            self.start = 0;
            self.filled = 0;
        }
        let pending = self.filled - self.start;
        // The rest of a large fragment whose header arrived: exactly that much room.
        let large = self.fragment_len().filter(|&len| len > pending && len - pending >= DIRECT_FRAGMENT_MIN);
        let room = large.unwrap_or(pending + READ_MIN.min(self.chunk));
        let shrink = pending == 0 && self.buffer.len() > CHUNK_KEPT_MAX && room <= self.chunk;
        if Arc::get_mut(&mut self.buffer).is_none() || room > self.buffer.len() || shrink {
            // Records still refer to this buffer, or it is too small (or too large): carry what
            // is pending into another.
            self.replace_buffer(room);
        } else if self.buffer.len() - self.start < room {
            let (start, filled) = (self.start, self.filled);
            Arc::get_mut(&mut self.buffer).expect("checked").copy_within(start..filled, 0);
            self.start = 0;
            self.filled = pending;
        }
        let end = large.map_or(self.buffer.len(), |len| self.start + len);
        let filled = self.filled;
        &mut Arc::get_mut(&mut self.buffer).expect("unique after the checks above")[filled..end]
    }

    /// `len` bytes were read into the room [`RecordReader::space`] gave.
    pub fn filled(&mut self, len: usize) {
        self.filled = (self.filled + len).min(self.buffer.len());
    }

    /// Bytes received from the stream (copied into the reader's buffer).
    pub fn push(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let space = self.space();
            let len = space.len().min(bytes.len());
            space[..len].copy_from_slice(&bytes[..len]);
            self.filled(len);
            bytes = &bytes[len..];
        }
    }

    /// Bytes buffered but not yet returned in a record.
    pub fn pending(&self) -> usize {
        self.filled - self.start + self.joined.len() + self.peeked.as_ref().map_or(0, |record| record.len())
    }

    /// The next complete record, if the stream holds one.
    pub fn next_record(&mut self) -> Result<Option<Record>, XdrError> {
        if let Some(record) = self.peeked.take() {
            return Ok(Some(record));
        }
        self.assemble()
    }

    /// The next complete record without consuming it: the following
    /// [`RecordReader::next_record`] returns it (a session looks at a call's version before
    /// deciding who handles it).
    pub fn peek_record(&mut self) -> Result<Option<&[u8]>, XdrError> {
        if self.peeked.is_none() {
            self.peeked = self.assemble()?;
        }
        Ok(self.peeked.as_deref())
    }

    /// The header of the next fragment, if it arrived: its body's length and whether it is the
    /// record's last.
    fn fragment_header(&self) -> Option<(usize, bool)> {
        let header = self.buffer.get(self.start..self.start + 4).filter(|_| self.filled - self.start >= 4)?;
        let word = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
        Some(((word & !LAST_FRAGMENT) as usize, word & LAST_FRAGMENT != 0))
    }

    /// The length (header included) of the next fragment, if its header arrived and it is
    /// within the bound.
    fn fragment_len(&self) -> Option<usize> {
        let (len, _) = self.fragment_header()?;
        (self.joined.len() + len <= self.max).then_some(4 + len)
    }

    /// Moves what is pending into another buffer with at least `room` bytes: a spare one no
    /// record refers to any more, or a new one.
    fn replace_buffer(&mut self, room: usize) {
        let wanted = room.max(self.chunk);
        let reusable = self.spare.iter().position(|spare| Arc::strong_count(spare) == 1 && spare.len() >= wanted);
        let mut next = match reusable {
            Some(at) => self.spare.swap_remove(at),
            None => Arc::new(vec![0; wanted.div_ceil(self.chunk) * self.chunk]),
        };
        let pending = self.filled - self.start;
        Arc::get_mut(&mut next).expect("a spare or new buffer is unique")[..pending]
            .copy_from_slice(&self.buffer[self.start..self.filled]);
        let previous = std::mem::replace(&mut self.buffer, next);
        if Arc::strong_count(&previous) > 1 && previous.len() <= CHUNK_KEPT_MAX {
            if self.spare.len() == SPARE_MAX {
                self.spare.remove(0);
            }
            self.spare.push(previous);
        }
        self.start = 0;
        self.filled = pending;
    }

    fn assemble(&mut self) -> Result<Option<Record>, XdrError> {
        loop {
            let Some((len, last)) = self.fragment_header() else { return Ok(None) };
            if self.joined.len() + len > self.max {
                return Err(XdrError::RecordTooLong { len: self.joined.len() + len, max: self.max });
            }
            if self.filled - self.start < 4 + len {
                return Ok(None);
            }
            let body = self.start + 4..self.start + 4 + len;
            self.start = body.end;
            if last && self.joined.is_empty() {
                // One-fragment record: handed out where it lies.
                return Ok(Some(Record { buffer: Arc::clone(&self.buffer), range: body }));
            }
            self.joined.extend_from_slice(&self.buffer[body]);
            if last {
                return Ok(Some(Record::from(std::mem::take(&mut self.joined))));
            }
        }
    }
}

/// Starts a record in `out`: reserves the fragment header. Returns its offset for
/// [`finish_record`].
pub fn start_record(out: &mut Vec<u8>) -> usize {
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    at
}

/// Completes the record begun at `at` as one last fragment.
pub fn finish_record(out: &mut [u8], at: usize) {
    let len = (out.len() - at - 4) as u32;
    out[at..at + 4].copy_from_slice(&(LAST_FRAGMENT | len).to_be_bytes());
}

/// Splits one record body into fragments of at most `fragment_max` bytes (for tests and for
/// peers that want small fragments).
pub fn write_fragmented(out: &mut Vec<u8>, body: &[u8], fragment_max: usize) {
    let fragment_max = fragment_max.clamp(1, 0x7fff_ffff);
    let mut chunks = body.chunks(fragment_max).peekable();
    if chunks.peek().is_none() {
        out.extend_from_slice(&LAST_FRAGMENT.to_be_bytes());
        return;
    }
    while let Some(chunk) = chunks.next() {
        let last = if chunks.peek().is_none() { LAST_FRAGMENT } else { 0 };
        out.extend_from_slice(&(last | chunk.len() as u32).to_be_bytes());
        out.extend_from_slice(chunk);
    }
}

/// The header of a call (AUTH_NONE credential and verifier).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallHeader {
    /// Transaction id.
    pub xid: u32,
    /// Program (LDM: 300029).
    pub program: u32,
    /// Program version (LDM: 6, or 7 for multicast).
    pub version: u32,
    /// Procedure.
    pub procedure: u32,
}

/// `accept_stat` of an accepted reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcceptStat {
    /// Executed.
    Success,
    /// Program not served.
    ProgUnavail,
    /// Version not served: the supported range.
    ProgMismatch {
        /// Lowest version served.
        low: u32,
        /// Highest version served.
        high: u32,
    },
    /// Procedure not served (the reference `notifyme`'s answer to NOTIFICATION).
    ProcUnavail,
    /// Arguments not decodable.
    GarbageArgs,
    /// Server failure (`svcerr_systemerr`).
    SystemErr,
}

/// `auth_stat` of an AUTH_ERROR rejection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthStat {
    /// AUTH_TOOWEAK (5): what ldmd answers a refused request or host.
    TooWeak,
    /// Any other value.
    Other(u32),
}

/// A reply header; for [`ReplyHeader::Accepted`] with [`AcceptStat::Success`] the result
/// follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyHeader {
    /// MSG_ACCEPTED.
    Accepted(AcceptStat),
    /// MSG_DENIED, AUTH_ERROR.
    AuthError(AuthStat),
    /// MSG_DENIED, RPC_MISMATCH.
    RpcMismatch {
        /// Lowest RPC version supported.
        low: u32,
        /// Highest.
        high: u32,
    },
}

/// The start of a message: a call or a reply header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Header {
    /// A call.
    Call(CallHeader),
    /// A reply to `xid`.
    Reply {
        /// The call's xid.
        xid: u32,
        /// What kind of reply.
        header: ReplyHeader,
    },
}

/// Decodes a message header; the decoder is left at the arguments or the result.
pub fn decode_header(decoder: &mut Decoder<'_>) -> Result<Header, XdrError> {
    let xid = decoder.u32("xid")?;
    match decoder.u32("msg_type")? {
        0 => {
            let rpcvers = decoder.u32("rpcvers")?;
            if rpcvers != RPC_VERSION {
                return Err(XdrError::Invalid { field: "rpcvers", value: rpcvers.into() });
            }
            let program = decoder.u32("prog")?;
            let version = decoder.u32("vers")?;
            let procedure = decoder.u32("proc")?;
            for field in ["cred", "verf"] {
                let _flavor = decoder.u32(field)?;
                decoder.opaque(400, field)?;
            }
            Ok(Header::Call(CallHeader { xid, program, version, procedure }))
        }
        1 => {
            let header = match decoder.u32("reply_stat")? {
                0 => {
                    let _flavor = decoder.u32("verf")?;
                    decoder.opaque(400, "verf")?;
                    let stat = match decoder.u32("accept_stat")? {
                        0 => AcceptStat::Success,
                        1 => AcceptStat::ProgUnavail,
                        2 => AcceptStat::ProgMismatch { low: decoder.u32("low")?, high: decoder.u32("high")? },
                        3 => AcceptStat::ProcUnavail,
                        4 => AcceptStat::GarbageArgs,
                        5 => AcceptStat::SystemErr,
                        value => return Err(XdrError::Invalid { field: "accept_stat", value: value.into() }),
                    };
                    ReplyHeader::Accepted(stat)
                }
                1 => match decoder.u32("reject_stat")? {
                    0 => ReplyHeader::RpcMismatch { low: decoder.u32("low")?, high: decoder.u32("high")? },
                    1 => ReplyHeader::AuthError(match decoder.u32("auth_stat")? {
                        5 => AuthStat::TooWeak,
                        other => AuthStat::Other(other),
                    }),
                    value => return Err(XdrError::Invalid { field: "reject_stat", value: value.into() }),
                },
                value => return Err(XdrError::Invalid { field: "reply_stat", value: value.into() }),
            };
            Ok(Header::Reply { xid, header })
        }
        value => Err(XdrError::Invalid { field: "msg_type", value: value.into() }),
    }
}

/// Encodes a call header with AUTH_NONE.
pub fn encode_call_header(encoder: &mut Encoder<'_>, header: &CallHeader) {
    encoder.u32(header.xid);
    encoder.u32(0);
    encoder.u32(RPC_VERSION);
    encoder.u32(header.program);
    encoder.u32(header.version);
    encoder.u32(header.procedure);
    for _ in 0..4 {
        encoder.u32(0);
    }
}

/// Encodes a reply header.
pub fn encode_reply_header(encoder: &mut Encoder<'_>, xid: u32, header: &ReplyHeader) {
    encoder.u32(xid);
    encoder.u32(1);
    match *header {
        ReplyHeader::Accepted(stat) => {
            encoder.u32(0);
            encoder.u32(0);
            encoder.u32(0);
            match stat {
                AcceptStat::Success => encoder.u32(0),
                AcceptStat::ProgUnavail => encoder.u32(1),
                AcceptStat::ProgMismatch { low, high } => {
                    encoder.u32(2);
                    encoder.u32(low);
                    encoder.u32(high);
                }
                AcceptStat::ProcUnavail => encoder.u32(3),
                AcceptStat::GarbageArgs => encoder.u32(4),
                AcceptStat::SystemErr => encoder.u32(5),
            }
        }
        ReplyHeader::AuthError(stat) => {
            encoder.u32(1);
            encoder.u32(1);
            encoder.u32(match stat {
                AuthStat::TooWeak => 5,
                AuthStat::Other(value) => value,
            });
        }
        ReplyHeader::RpcMismatch { low, high } => {
            encoder.u32(1);
            encoder.u32(0);
            encoder.u32(low);
            encoder.u32(high);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peeked_record_is_returned_next() {
        let mut reader = RecordReader::new(100);
        let mut stream = Vec::new();
        write_fragmented(&mut stream, b"first record", 5);
        write_fragmented(&mut stream, b"second", 100);
        reader.push(&stream[..stream.len() - 1]);
        assert_eq!(reader.peek_record().unwrap(), Some(&b"first record"[..]));
        assert_eq!(reader.peek_record().unwrap(), Some(&b"first record"[..]));
        assert_eq!(reader.pending(), 12 + 4 + 5);
        assert_eq!(reader.next_record().unwrap().as_deref(), Some(&b"first record"[..]));
        assert_eq!(reader.peek_record().unwrap(), None);
        reader.push(&stream[stream.len() - 1..]);
        assert_eq!(reader.next_record().unwrap().as_deref(), Some(&b"second"[..]));
        assert_eq!(reader.pending(), 0);
    }

    #[test]
    fn a_large_fragment_is_read_to_its_end_and_stays_in_place() {
        let body: Vec<u8> = (0..DIRECT_FRAGMENT_MIN * 3).map(|k| k as u8).collect();
        let mut stream = Vec::new();
        write_fragmented(&mut stream, &body, body.len());
        write_fragmented(&mut stream, b"next", 100);
        let mut reader = RecordReader::new(1 << 20);
        let mut rest = &stream[..];
        let mut records = Vec::new();
        while !rest.is_empty() {
            let space = reader.space();
            let len = space.len().min(rest.len()).min(100_000);
            space[..len].copy_from_slice(&rest[..len]);
            reader.filled(len);
            rest = &rest[len..];
            while let Some(record) = reader.next_record().unwrap() {
                records.push(record);
            }
            if records.len() == 1 && reader.pending() == 0 {
                // The reads stopped at the end of the large record.
                assert_eq!(stream.len() - rest.len(), 4 + body.len());
            }
        }
        assert_eq!(records.len(), 2);
        assert_eq!(records[0], body);
        assert_eq!(records[1], b"next".to_vec());
        assert_eq!(reader.pending(), 0);
    }

    #[test]
    fn records_share_the_buffer_and_it_is_reused_when_they_are_gone() {
        let mut stream = Vec::new();
        for n in 0..4u8 {
            write_fragmented(&mut stream, &[n; 30_000], 100_000);
        }
        let mut reader = RecordReader::new(1 << 20);
        reader.push(&stream);
        let records: Vec<Record> = std::iter::from_fn(|| reader.next_record().unwrap()).collect();
        assert_eq!(records.len(), 4);
        let buffer = reader.buffer.as_ptr();
        assert!(records.iter().all(|record| Arc::ptr_eq(&record.buffer, &records[0].buffer)), "no copies");
        // Held records: the next read goes to another buffer.
        reader.push(&stream[..10]);
        assert_ne!(reader.buffer.as_ptr(), buffer);
        drop(records);
        // Given back: the old buffer is taken again when this one is held in turn.
        let held = {
            reader.push(&stream[10..]);
            std::iter::from_fn(|| reader.next_record().unwrap()).collect::<Vec<_>>()
        };
        assert_eq!(held.len(), 4);
        reader.push(&stream[..10]);
        assert_eq!(reader.buffer.as_ptr(), buffer);
    }

    #[test]
    fn a_small_chunk_reader_stays_small_for_small_records_and_grows_for_large_ones() {
        let mut reader = RecordReader::with_chunk(1 << 20, 4 << 10);
        let mut stream = Vec::new();
        write_fragmented(&mut stream, &[1; 100], 100);
        reader.push(&stream);
        assert_eq!(reader.next_record().unwrap().as_deref(), Some(&[1u8; 100][..]));
        assert_eq!(reader.held_bytes(), 4 << 10);
        // A large record still arrives whole, in a buffer of its size.
        let body: Vec<u8> = (0..200_000).map(|k| k as u8).collect();
        let mut stream = Vec::new();
        write_fragmented(&mut stream, &body, body.len());
        reader.push(&stream);
        assert_eq!(reader.next_record().unwrap(), Some(Record::from(body)));
        // Quiet: the buffers go; the next read allocates a small one again.
        assert!(reader.release_idle());
        assert_eq!(reader.held_bytes(), 0);
        assert_eq!(reader.space().len(), 4 << 10);
    }

    #[test]
    fn a_lowered_bound_refuses_an_announced_record_without_buffering_it() {
        let mut reader = RecordReader::with_chunk(1 << 20, 4 << 10);
        reader.set_limits(1000, 4 << 10);
        reader.push(&(LAST_FRAGMENT | (100 << 20)).to_be_bytes());
        assert!(matches!(reader.next_record(), Err(XdrError::RecordTooLong { max: 1000, .. })));
        assert!(reader.held_bytes() <= 4 << 10, "{}", reader.held_bytes());
        assert!(!reader.release_idle(), "the header is pending");
    }
}
