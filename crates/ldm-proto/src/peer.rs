//! One end of an LDM RPC connection: record reassembly, call and reply encoding, the one
//! outstanding synchronous call and its deadline. Sessions build on it.
//!
//! LDM makes at most one synchronous call at a time on a connection; a reply whose xid does not
//! match the outstanding call is skipped (Sun `clnt_tcp` behaviour: the reference `notifyme`
//! answers NOTIFICATIONs with stray PROC_UNAVAIL replies, ldm6-protocol.md §2).

use std::time::Duration;

use ldm7_types::Instant;

use ldm7_xdr::codec::Decoder;
use ldm7_xdr::ldm::{Call, LdmCall, Message, Proc, ReplyBody};
use ldm7_xdr::rpc::{Header, LDM_PROGRAM, Record, RecordReader, decode_header};

use crate::SessionError;
use crate::receive::ReceivedData;
use ldm7_types::ProdInfo;

/// The synchronous-call timeout of the reference (ldm6-protocol.md §7).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Largest record accepted: a product of 256 MiB plus headers (products larger than the queue
/// allows are refused later, with a clear error, not here).
pub const RECORD_MAX: usize = (256 << 20) + 4096;

/// A call this end made and waits on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Outstanding {
    pub xid: u32,
    pub proc: Proc,
    pub deadline: Instant,
}

#[derive(Debug)]
pub(crate) struct Peer {
    reader: RecordReader,
    out: Vec<u8>,
    next_xid: u32,
    pub outstanding: Option<Outstanding>,
    /// When this end last wrote anything (keep-alive).
    pub last_send: Instant,
    /// When this end last received a whole record (silence timeout).
    pub last_receive: Instant,
    /// Replies skipped because no call waited on their xid.
    pub stray_replies: u64,
}

impl Peer {
    pub fn new(now: Instant, first_xid: u32) -> Self {
        Self {
            reader: RecordReader::new(RECORD_MAX),
            out: Vec::new(),
            next_xid: first_xid,
            outstanding: None,
            last_send: now,
            last_receive: now,
            stray_replies: 0,
        }
    }

    /// Bytes received from the socket.
    pub fn push(&mut self, bytes: &[u8]) {
        self.reader.push(bytes);
    }

    /// Sets the bound on a record and the size its buffer is allocated in
    /// ([`RecordReader::set_limits`]).
    pub fn set_record_limits(&mut self, max: usize, chunk: usize) {
        self.reader.set_limits(max, chunk);
    }

    /// Lets go of the input buffer while nothing is pending ([`RecordReader::release_idle`]).
    pub fn release_idle_input(&mut self) -> bool {
        self.reader.release_idle()
    }

    /// Room for the next read from the socket ([`RecordReader::space`]).
    pub fn input_space(&mut self) -> &mut [u8] {
        self.reader.space()
    }

    /// `len` bytes were read into [`Peer::input_space`].
    pub fn input_filled(&mut self, len: usize) {
        self.reader.filled(len);
    }

    /// The next whole record, decoded; replies are matched to the outstanding call (stray ones
    /// skipped). A HEREIS comes as [`Incoming::Hereis`], its data left in its record.
    pub fn next_incoming(&mut self, now: Instant) -> Result<Option<Incoming>, SessionError> {
        loop {
            let Some(record) = self.next_record(now)? else { return Ok(None) };
            if let Some(hereis) = ldm7_xdr::ldm::decode_hereis_in_place(&record) {
                let (xid, info, range) = hereis?;
                return Ok(Some(Incoming::Hereis { xid, info, data: ReceivedData::in_record(&record, range) }));
            }
            let outstanding = self.outstanding;
            let message = ldm7_xdr::ldm::decode_message(&record, |xid| {
                outstanding.filter(|call| call.xid == xid).map(|call| call.proc)
            });
            match message {
                // A host the server does not allow at all gets its denial with xid 0 (§11).
                Ok(Message::Reply(reply))
                    if reply.xid == 0 && outstanding.is_some() && matches!(reply.body, ReplyBody::Denied(_)) =>
                {
                    self.outstanding = None;
                    return Ok(Some(Incoming::Message(Message::Reply(reply))));
                }
                Ok(Message::Reply(reply)) if outstanding.is_none_or(|call| call.xid != reply.xid) => {
                    self.stray_replies += 1;
                }
                Ok(Message::Reply(reply)) => {
                    self.outstanding = None;
                    return Ok(Some(Incoming::Message(Message::Reply(reply))));
                }
                Ok(message) => return Ok(Some(Incoming::Message(message))),
                // A reply we cannot type because nobody waits on it: skip it.
                Err(ldm7_xdr::XdrError::UnexpectedReply { .. }) => self.stray_replies += 1,
                Err(error) => return Err(error.into()),
            }
        }
    }

    /// The next whole record, undecoded (the LDM-7 sessions decode their own).
    pub fn next_record(&mut self, now: Instant) -> Result<Option<Record>, SessionError> {
        let record = self.reader.next_record()?;
        if record.is_some() {
            self.last_receive = now;
        }
        Ok(record)
    }

    /// Whether the next whole record is an LDM-7 call (it stays in place).
    pub fn next_is_ldm7_call(&mut self) -> bool {
        let Ok(Some(record)) = self.reader.peek_record() else { return false };
        matches!(
            decode_header(&mut Decoder::new(record)),
            Ok(Header::Call(header)) if header.program == LDM_PROGRAM && header.version == ldm7_xdr::ldm7::VERSION
        )
    }

    /// Appends a call record that `encode` writes with the xid it is given (any version; the
    /// caller tracks any reply). Returns the xid.
    pub fn send_call(&mut self, now: Instant, encode: impl FnOnce(&mut Vec<u8>, u32)) -> u32 {
        let xid = self.next_xid;
        self.next_xid = self.next_xid.wrapping_add(1);
        encode(&mut self.out, xid);
        self.last_send = now;
        xid
    }

    /// Appends a record that `encode` writes (a reply of any version).
    pub fn send_reply(&mut self, now: Instant, encode: impl FnOnce(&mut Vec<u8>)) {
        encode(&mut self.out);
        self.last_send = now;
    }

    /// Bytes waiting in the output buffer.
    pub fn output_len(&self) -> usize {
        self.out.len()
    }

    /// Sends a call; a synchronous one becomes the outstanding call.
    pub fn call(&mut self, now: Instant, call: &LdmCall) -> u32 {
        let xid = self.next_xid;
        self.next_xid = self.next_xid.wrapping_add(1);
        ldm7_xdr::ldm::encode_call(&mut self.out, &Call { xid, version: 6, call: call.clone() });
        self.last_send = now;
        let proc = call.proc();
        if proc.has_reply() {
            self.outstanding = Some(Outstanding { xid, proc, deadline: now + CALL_TIMEOUT });
        }
        xid
    }

    /// Sends a call whose product data is appended without copying it into a `LdmCall`.
    pub fn call_with_data(&mut self, now: Instant, encode: impl FnOnce(&mut Vec<u8>, u32), proc: Proc) -> u32 {
        let xid = self.next_xid;
        self.next_xid = self.next_xid.wrapping_add(1);
        encode(&mut self.out, xid);
        self.last_send = now;
        if proc.has_reply() {
            self.outstanding = Some(Outstanding { xid, proc, deadline: now + CALL_TIMEOUT });
        }
        xid
    }

    /// Sends a reply.
    pub fn reply(&mut self, now: Instant, xid: u32, body: &ReplyBody) {
        ldm7_xdr::ldm::encode_reply(&mut self.out, xid, body);
        self.last_send = now;
    }

    /// Bytes to write to the socket (taken: the caller writes all of them).
    pub fn take_output(&mut self, into: &mut Vec<u8>) {
        if into.is_empty() {
            std::mem::swap(into, &mut self.out);
        } else {
            into.extend_from_slice(&self.out);
            self.out.clear();
        }
    }

    pub fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    /// How a session ends when the peer closes: an error if a reply was awaited.
    pub fn eof_result(&self) -> Result<(), SessionError> {
        match self.outstanding {
            Some(call) => Err(SessionError::ClosedBeforeReply(call.proc.to_string())),
            None => Ok(()),
        }
    }

    /// Whether the outstanding call timed out.
    pub fn call_timed_out(&self, now: Instant) -> Option<Outstanding> {
        self.outstanding.filter(|call| now >= call.deadline)
    }
}

/// A decoded record.
#[derive(Debug)]
pub enum Incoming {
    /// Any call or reply but a HEREIS.
    Message(Message),
    /// A HEREIS, its data left in its record.
    Hereis {
        /// The call's xid.
        xid: u32,
        /// The product's metadata.
        info: ProdInfo,
        /// Its bytes.
        data: ReceivedData,
    },
}

/// What every session does with bytes from the socket: decode each whole record, hand the message
/// to the session, and close the session on the first error.
pub(crate) trait Receiving {
    fn peer(&mut self) -> &mut Peer;
    fn closed(&self) -> bool;
    fn on_message(&mut self, now: Instant, message: Message) -> Result<(), SessionError>;
    fn close(&mut self, result: Result<(), SessionError>);

    /// A HEREIS call, its data in place; sessions that receive products take it as it is,
    /// others see the call as any message.
    fn on_hereis(&mut self, now: Instant, xid: u32, info: ProdInfo, data: ReceivedData) -> Result<(), SessionError> {
        let call = LdmCall::Hereis { info, data: data.to_vec() };
        self.on_message(now, Message::Call(Call { xid, version: 6, call }))
    }

    /// A call this end does not serve was answered (PROG_MISMATCH, PROC_UNAVAIL …); the
    /// connection goes on.
    fn on_unserved(&mut self, _call: ldm7_xdr::XdrError) {}

    /// Whether the next record is an LDM-7 call another session takes over: the loop stops
    /// before it ([`crate::Inbound`]).
    fn yields_to_ldm7(&mut self) -> bool {
        false
    }

    /// The LDM versions this end serves, as a PROG_MISMATCH answer states them.
    fn versions_served(&self) -> (u32, u32) {
        (6, 6)
    }

    fn receive(&mut self, now: Instant, bytes: &[u8]) {
        if self.closed() {
            return;
        }
        self.peer().push(bytes);
        self.process(now);
    }

    /// `len` bytes were read into the peer's input space: handle what they complete.
    fn received(&mut self, now: Instant, len: usize) {
        if self.closed() {
            return;
        }
        self.peer().input_filled(len);
        self.process(now);
    }

    /// Handles every whole record received.
    fn process(&mut self, now: Instant) {
        while !self.closed() {
            if self.yields_to_ldm7() {
                return;
            }
            let (low, high) = self.versions_served();
            match self.peer().next_incoming(now) {
                Ok(Some(Incoming::Message(message))) => {
                    if let Err(error) = self.on_message(now, message) {
                        self.close(Err(error));
                    }
                }
                Ok(Some(Incoming::Hereis { xid, info, data })) => {
                    if let Err(error) = self.on_hereis(now, xid, info, data) {
                        self.close(Err(error));
                    }
                }
                Ok(None) => return,
                Err(SessionError::Malformed(error)) => match error.unserved_call_versions(low, high) {
                    Some((xid, stat)) => {
                        self.peer().reply(now, xid, &ReplyBody::Error(stat));
                        self.on_unserved(error);
                    }
                    None => self.close(Err(error.into())),
                },
                Err(error) => self.close(Err(error)),
            }
        }
    }
}
