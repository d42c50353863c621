//! The push client (`ldm7 send`, like `ldmsend`; ldm6-protocol.md §6.3): HIYA with the offered
//! class; then each product by HEREIS when `sz ≤ max_hereis`, else COMINGSOON and, if the
//! receiver wants it, BLKDATA; a NULLPROC flush at the end.

use ldm7_types::Instant;
use std::collections::VecDeque;

use ldm7_types::{ProdClass, ProdInfo, Signature};
use ldm7_xdr::ldm::{HiyaReply, LdmCall, LdmErr, Message, Proc, ReplyBody};

use crate::peer::{Peer, Receiving};
use crate::{SessionError, compile_class, wire_class};

/// What the session reports.
#[derive(Debug)]
pub enum PushEvent {
    /// The receiver accepts products of `class` (maybe a subset of the offer).
    Accepted {
        /// The accepted class.
        class: ProdClass,
        /// Largest product sent by HEREIS.
        max_hereis: u32,
    },
    /// The receiver refused the offer.
    Refused {
        /// Why.
        why: String,
    },
    /// The receiver declined a product (DONT_SEND: it has it already, or it is too big).
    Declined {
        /// The product's signature.
        signature: Signature,
    },
    /// The NULLPROC flush was answered: everything sent has been read.
    Flushed,
    /// The session is over.
    Closed(Result<(), SessionError>),
}

#[derive(Debug, PartialEq, Eq)]
enum State {
    Offering,
    Sending { max_hereis: u32 },
    Closed,
}

/// A HIYA push session.
#[derive(Debug)]
pub struct PushClient {
    offered: ProdClass,
    peer: Peer,
    state: State,
    announced: Option<(Signature, Vec<u8>)>,
    events: VecDeque<PushEvent>,
}

impl PushClient {
    /// A session on a connection just opened; the HIYA offering `class` is queued.
    pub fn new(now: Instant, class: &ProdClass) -> Self {
        let mut peer = Peer::new(now, 0x7075_0001);
        peer.call(now, &LdmCall::Hiya(wire_class(class)));
        Self { offered: class.clone(), peer, state: State::Offering, announced: None, events: VecDeque::new() }
    }

    /// Bytes received.
    pub fn handle_input(&mut self, now: Instant, bytes: &[u8]) {
        self.receive(now, bytes);
    }

    fn on_reply(&mut self, now: Instant, body: ReplyBody) -> Result<(), SessionError> {
        match (&self.state, body) {
            (State::Offering, ReplyBody::Hiya(HiyaReply::Ok(max_hereis))) => {
                self.state = State::Sending { max_hereis };
                self.events.push_back(PushEvent::Accepted { class: self.offered.clone(), max_hereis });
                Ok(())
            }
            (State::Offering, ReplyBody::Hiya(HiyaReply::Reclass { class, max_hereis })) => {
                let (class, _) = compile_class(&class)
                    .map_err(|error| SessionError::Protocol(format!("RECLASS pattern: {error}")))?;
                self.state = State::Sending { max_hereis };
                self.events.push_back(PushEvent::Accepted { class, max_hereis });
                Ok(())
            }
            (State::Offering, ReplyBody::Hiya(HiyaReply::DontSend)) => {
                self.refuse("the receiver wants none of the offered products (DONT_SEND)".into());
                Ok(())
            }
            (State::Offering, ReplyBody::Denied(stat)) => {
                self.refuse(format!("the receiver denies the offer ({stat:?}): check its ACCEPT entries"));
                Ok(())
            }
            (State::Sending { .. }, ReplyBody::Void) => {
                self.events.push_back(PushEvent::Flushed);
                Ok(())
            }
            (State::Sending { .. }, ReplyBody::ComingSoon(code)) => {
                let Some((signature, data)) = self.announced.take() else {
                    return Err(SessionError::Protocol("COMINGSOON reply without a COMINGSOON".into()));
                };
                if code == LdmErr::Ok {
                    self.peer.call_with_data(
                        now,
                        |out, xid| ldm7_xdr::ldm::encode_blkdata(out, xid, &signature, 0, &data),
                        Proc::BlkData,
                    );
                } else {
                    self.events.push_back(PushEvent::Declined { signature });
                }
                Ok(())
            }
            (state, body) => Err(SessionError::Protocol(format!("unexpected reply {body:?} in state {state:?}"))),
        }
    }

    fn refuse(&mut self, why: String) {
        self.events.push_back(PushEvent::Refused { why });
        self.close(Ok(()));
    }

    /// Whether [`PushClient::send_product`] may be called (accepted, no reply awaited).
    pub fn ready(&self) -> bool {
        matches!(self.state, State::Sending { .. }) && self.peer.outstanding.is_none()
    }

    /// Sends one product.
    pub fn send_product(&mut self, now: Instant, info: &ProdInfo, data: &[u8]) -> Result<(), SessionError> {
        let State::Sending { max_hereis } = self.state else {
            return Err(SessionError::Usage("send_product before the offer was accepted"));
        };
        if self.peer.outstanding.is_some() {
            return Err(SessionError::Usage("send_product while a reply is awaited"));
        }
        if info.size <= max_hereis {
            self.peer.call_with_data(now, |out, xid| ldm7_xdr::ldm::encode_hereis(out, xid, info, data), Proc::Hereis);
        } else {
            self.peer.call(now, &LdmCall::ComingSoon { info: info.clone(), pktsz: info.size });
            self.announced = Some((info.signature, data.to_vec()));
        }
        Ok(())
    }

    /// Sends the NULLPROC flush; [`PushEvent::Flushed`] follows its reply.
    pub fn flush(&mut self, now: Instant) -> Result<(), SessionError> {
        if !self.ready() {
            return Err(SessionError::Usage("flush while not ready"));
        }
        self.peer.call(now, &LdmCall::Nullproc);
        Ok(())
    }

    /// Bytes to write (appended to `into`).
    pub fn take_output(&mut self, into: &mut Vec<u8>) {
        self.peer.take_output(into);
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<PushEvent> {
        self.events.pop_front()
    }

    /// When [`PushClient::handle_timeout`] must be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.state == State::Closed {
            return None;
        }
        self.peer.outstanding.map(|call| call.deadline)
    }

    /// Time passed.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.state == State::Closed {
            return;
        }
        if let Some(call) = self.peer.call_timed_out(now) {
            self.close(Err(SessionError::CallTimeout(call.proc.to_string())));
        }
    }

    /// The receiver closed the connection.
    pub fn handle_eof(&mut self) {
        if self.state != State::Closed {
            self.close(self.peer.eof_result());
        }
    }
}

impl Receiving for PushClient {
    fn peer(&mut self) -> &mut Peer {
        &mut self.peer
    }

    fn closed(&self) -> bool {
        self.state == State::Closed
    }

    fn on_message(&mut self, now: Instant, message: Message) -> Result<(), SessionError> {
        match message {
            Message::Reply(reply) => self.on_reply(now, reply.body),
            Message::Call(call) => {
                Err(SessionError::Protocol(format!("unexpected {} call from the receiver", call.call.proc())))
            }
        }
    }

    fn close(&mut self, result: Result<(), SessionError>) {
        self.state = State::Closed;
        self.events.push_back(PushEvent::Closed(result));
    }
}
