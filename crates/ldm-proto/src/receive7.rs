//! The receive loop of both LDM-7 sessions ([`crate::Subscriber`], [`crate::Publisher`]):
//! records are decoded as version 7, replies other than the one awaited are skipped, calls this
//! end does not serve are handled by the rule below, and any other undecodable record closes
//! the session with [`SessionError::Malformed`].
//!
//! Unserved calls (ldm7-multicast.md §2, RPC rules of ldm6-protocol.md §2):
//!
//! * another program → PROG_UNAVAIL; another LDM version → PROG_MISMATCH 7..7; an unknown
//!   version-7 procedure number → PROC_UNAVAIL: what any RPC server answers;
//! * a known procedure of the other direction: SUBSCRIBE (which expects a reply) is answered
//!   PROC_UNAVAIL; the one-way ones get **no** reply — after SUBSCRIBE no reply ever travels
//!   on an LDM-7 connection and the reference's RPC server drops the connection on one — they
//!   are counted and reported, and the session goes on.

use ldm7_types::Instant;
use ldm7_xdr::XdrError;
use ldm7_xdr::ldm7::{self, AcceptStat, Call, Message, Proc, Reply, ReplyBody};

use crate::SessionError;
use crate::peer::Peer;

pub(crate) trait Receiving7 {
    fn peer(&mut self) -> &mut Peer;
    fn closed(&self) -> bool;
    /// The xid of the SUBSCRIBE this end waits on.
    fn awaited_reply(&self) -> Option<u32> {
        None
    }
    fn on_call(&mut self, now: Instant, call: Call) -> Result<(), SessionError>;
    fn on_reply(&mut self, _now: Instant, reply: Reply) -> Result<(), SessionError> {
        Err(SessionError::Protocol(format!("unexpected reply {reply:?}")))
    }
    /// A call this end does not serve was handled by the rule of the module doc.
    fn on_unserved(&mut self, what: String);
    fn close(&mut self, result: Result<(), SessionError>);

    fn receive(&mut self, now: Instant, bytes: &[u8]) {
        if self.closed() {
            return;
        }
        self.peer().push(bytes);
        while !self.closed() {
            let record = match self.peer().next_record(now) {
                Ok(Some(record)) => record,
                Ok(None) => return,
                Err(error) => return self.close(Err(error)),
            };
            let awaited = self.awaited_reply();
            let result =
                match ldm7::decode_message(record.to_vec(), |xid| (Some(xid) == awaited).then_some(Proc::Subscribe)) {
                    Ok(Message::Call(call)) => self.on_call(now, call),
                    // A host the server does not allow at all gets its denial with xid 0
                    // (ldm6-protocol.md §11).
                    Ok(Message::Reply(reply))
                        if awaited == Some(reply.xid)
                            || (awaited.is_some() && reply.xid == 0 && matches!(reply.body, ReplyBody::Denied(_))) =>
                    {
                        self.on_reply(now, reply)
                    }
                    Ok(Message::Reply(_)) | Err(XdrError::UnexpectedReply { .. }) => {
                        self.peer().stray_replies += 1;
                        Ok(())
                    }
                    Err(error) => match error.unserved_call_versions(ldm7::VERSION, ldm7::VERSION) {
                        Some((xid, stat)) => {
                            self.peer().send_reply(now, |out| ldm7::encode_reply(out, xid, &ReplyBody::Error(stat)));
                            self.on_unserved(error.to_string());
                            Ok(())
                        }
                        None => Err(SessionError::Malformed(error)),
                    },
                };
            if let Err(error) = result {
                self.close(Err(error));
            }
        }
    }

    /// A known version-7 procedure this end does not serve (see the module doc).
    fn unserved_proc(&mut self, now: Instant, xid: u32, proc: Proc) {
        if proc.has_reply() {
            let body = ReplyBody::Error(AcceptStat::ProcUnavail);
            self.peer().send_reply(now, |out| ldm7::encode_reply(out, xid, &body));
            self.on_unserved(format!("{proc} is not served by this end; answered PROC_UNAVAIL"));
        } else {
            self.on_unserved(format!("{proc} is not served by this end; ignored"));
        }
    }
}
