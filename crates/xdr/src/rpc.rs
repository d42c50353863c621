//! ONC RPC over TCP (RFC 5531): record marking and the message headers LDM uses (AUTH_NONE).
//!
//! A record is one or more fragments, each behind a 4-byte header whose bit 31 marks the last
//! fragment and whose low 31 bits give its length. Receivers accept any fragmentation
//! ([`RecordReader`]); [`finish_record`] writes one fragment per record, as the reference does
//! for every record the captures show.
//!
//! The reader copies each byte once from what it is given into the record it returns: the
//! bytes of a fragment of at least [`DIRECT_FRAGMENT_MIN`] bytes that has not fully arrived are
//! appended straight to the record as they come (a product of tens of MB is not gathered in a
//! buffer first and copied out after).

use crate::XdrError;
use crate::codec::{Decoder, Encoder};

/// LDM's RPC program number.
pub const LDM_PROGRAM: u32 = 300_029;
/// RPC protocol version.
pub const RPC_VERSION: u32 = 2;

const LAST_FRAGMENT: u32 = 0x8000_0000;

/// Fragments at least this long are assembled in place as they arrive.
pub const DIRECT_FRAGMENT_MIN: usize = 64 << 10;

/// Reassembles records from a TCP byte stream, whatever the fragmentation.
#[derive(Debug)]
pub struct RecordReader {
    buffer: Vec<u8>,
    /// Start of unconsumed bytes in `buffer`.
    start: usize,
    /// The record being assembled.
    record: Vec<u8>,
    /// A whole record already looked at by [`RecordReader::peek_record`].
    peeked: Option<Vec<u8>>,
    /// A large fragment being appended straight to `record`: whether it is the last one of its
    /// record. `buffer` is empty while bytes of it are missing.
    direct: Option<bool>,
    /// Bytes of that fragment still to come.
    direct_remaining: usize,
    max: usize,
}

impl RecordReader {
    /// A reader refusing records longer than `max` bytes.
    pub fn new(max: usize) -> Self {
        Self { buffer: Vec::new(), start: 0, record: Vec::new(), peeked: None, direct: None, direct_remaining: 0, max }
    }

    /// Bytes received from the stream.
    pub fn push(&mut self, mut bytes: &[u8]) {
        if self.direct_remaining > 0 {
            let taken = self.direct_remaining.min(bytes.len());
            self.record.extend_from_slice(&bytes[..taken]);
            self.direct_remaining -= taken;
            bytes = &bytes[taken..];
        }
        if bytes.is_empty() {
            return;
        }
        if self.start > 0 && self.start == self.buffer.len() {
            self.buffer.clear();
            self.start = 0;
        }
        self.buffer.extend_from_slice(bytes);
    }

    /// Bytes buffered but not yet returned in a record.
    pub fn pending(&self) -> usize {
        self.buffer.len() - self.start + self.record.len() + self.peeked.as_ref().map_or(0, Vec::len)
    }

    /// The next complete record, if the stream holds one.
    pub fn next_record(&mut self) -> Result<Option<Vec<u8>>, XdrError> {
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

    fn assemble(&mut self) -> Result<Option<Vec<u8>>, XdrError> {
        loop {
            if let Some(last) = self.direct {
                if self.direct_remaining > 0 {
                    return Ok(None);
                }
                self.direct = None;
                if last {
                    return Ok(Some(std::mem::take(&mut self.record)));
                }
            }
            let available = &self.buffer[self.start..];
            if available.len() < 4 {
                self.compact();
                return Ok(None);
            }
            let header = u32::from_be_bytes([available[0], available[1], available[2], available[3]]);
            let len = (header & !LAST_FRAGMENT) as usize;
            let last = header & LAST_FRAGMENT != 0;
            if self.record.len() + len > self.max {
                return Err(XdrError::RecordTooLong { len: self.record.len() + len, max: self.max });
            }
            if available.len() < 4 + len {
                if len >= DIRECT_FRAGMENT_MIN {
                    // The rest of this fragment goes straight into the record as it arrives.
                    // Room for the whole fragment is made at once: no regrowing, which would
                    // copy it again.
                    self.record.reserve_exact(len);
                    self.record.extend_from_slice(&available[4..]);
                    self.direct_remaining = 4 + len - available.len();
                    self.direct = Some(last);
                    self.buffer.clear();
                    self.start = 0;
                } else {
                    self.compact();
                }
                return Ok(None);
            }
            if last && self.record.is_empty() {
                // One-fragment record: hand it out directly.
                let record = available[4..4 + len].to_vec();
                self.start += 4 + len;
                return Ok(Some(record));
            }
            self.record.extend_from_slice(&available[4..4 + len]);
            self.start += 4 + len;
            if last {
                return Ok(Some(std::mem::take(&mut self.record)));
            }
        }
    }

    fn compact(&mut self) {
        if self.start > 0 {
            self.buffer.drain(..self.start);
            self.start = 0;
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
    fn a_large_fragment_is_assembled_in_place() {
        let body: Vec<u8> = (0..DIRECT_FRAGMENT_MIN * 3).map(|k| k as u8).collect();
        let mut stream = Vec::new();
        write_fragmented(&mut stream, &body, DIRECT_FRAGMENT_MIN * 2);
        write_fragmented(&mut stream, b"next", 100);
        let mut reader = RecordReader::new(1 << 20);
        let (head, tail) = stream.split_at(1000);
        reader.push(head);
        assert_eq!(reader.next_record().unwrap(), None);
        assert!(reader.direct.is_some() && reader.buffer.is_empty(), "the fragment goes to the record");
        for piece in tail.chunks(4096) {
            reader.push(piece);
            assert!(reader.buffer.len() <= 4096 + 8);
            if let Some(record) = reader.next_record().unwrap() {
                assert_eq!(record, body);
            }
        }
        assert_eq!(reader.next_record().unwrap().as_deref(), Some(&b"next"[..]));
        assert_eq!(reader.pending(), 0);
    }
}
