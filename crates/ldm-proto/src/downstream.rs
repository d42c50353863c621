//! The downstream of a REQUEST (ldm6-protocol.md §6.1): FEEDME, the RECLASS loop, then the
//! turn-around — this end becomes the RPC server of HEREIS, COMINGSOON + BLKDATA and NULLPROC.
//!
//! The driver opens the connection, builds the session with the class to request (its `from`
//! already chosen: now − offset, or just after the last product received), feeds bytes and
//! answers [`DownstreamEvent::ComingSoon`] (accept unless it is a duplicate or too big). When
//! nothing arrives for [`DownstreamConfig::silence`] the session ends with
//! [`SessionError::Silence`] and the driver reconnects.

use std::collections::VecDeque;
use std::time::Duration;

use ldm7_types::Instant;

use ldm7_types::{ProdClass, ProdInfo, Signature};
use ldm7_xdr::ldm::{FornmeReply, LdmCall, Message, ReplyBody};

use crate::peer::{Peer, Receiving};
use crate::receive::{Receive, Received, ReceivedData, ReceivedProduct};
use crate::{FeedMode, MAX_HEREIS_PRIMARY, SessionError, compile_class, signature_spec, wire_class};

/// A downstream session's settings.
#[derive(Clone, Debug)]
pub struct DownstreamConfig {
    /// The class to request.
    pub class: ProdClass,
    /// Primary (HEREIS) or alternate (COMINGSOON + BLKDATA).
    pub mode: FeedMode,
    /// The last product received in an earlier session: sent as the `SIG=` spec.
    pub resume_after: Option<Signature>,
    /// Close when nothing arrives this long (reference: 10 × interval = 300 s).
    pub silence: Duration,
}

impl DownstreamConfig {
    /// Primary mode, no resume point, 300 s silence limit.
    pub fn new(class: ProdClass) -> Self {
        Self { class, mode: FeedMode::Primary, resume_after: None, silence: Duration::from_secs(300) }
    }
}

/// What the session reports or asks.
#[derive(Debug)]
pub enum DownstreamEvent {
    /// The upstream accepted the request (after any RECLASS): products follow.
    Accepted {
        /// The upstream's id (its process id).
        id: u32,
        /// The class being fed.
        class: ProdClass,
    },
    /// The upstream allows only this subset; the session asked again for it.
    Reclassified(ProdClass),
    /// A product.
    Product(ReceivedProduct),
    /// A COMINGSOON: answer with [`Downstream::answer_coming_soon`].
    ComingSoon {
        /// The announced product.
        info: ProdInfo,
        /// An incomplete product it discarded.
        abandoned: Option<ProdInfo>,
    },
    /// The upstream refused: `why` says how (not allowed, nothing allowed, bad pattern).
    Refused {
        /// Why.
        why: String,
    },
    /// The session is over; close the connection (and reconnect after a delay).
    Closed(Result<(), SessionError>),
}

#[derive(Debug)]
enum State {
    Requesting,
    Receiving,
    Closed,
}

/// A downstream (REQUEST) session.
#[derive(Debug)]
pub struct Downstream {
    config: DownstreamConfig,
    peer: Peer,
    state: State,
    receive: Receive,
    events: VecDeque<DownstreamEvent>,
}

impl Downstream {
    /// A session on a connection just opened; the FEEDME is queued for output.
    pub fn new(now: Instant, config: DownstreamConfig) -> Self {
        let mut session = Self {
            config,
            peer: Peer::new(now, 0x6c64_0001),
            state: State::Requesting,
            receive: Receive::default(),
            events: VecDeque::new(),
        };
        session.send_feedme(now);
        session
    }

    fn send_feedme(&mut self, now: Instant) {
        let mut class = wire_class(&self.config.class);
        if let Some(signature) = &self.config.resume_after {
            class.specs.push(signature_spec(signature));
        }
        let max_hereis = match self.config.mode {
            FeedMode::Primary => MAX_HEREIS_PRIMARY,
            FeedMode::Alternate => 0,
        };
        self.peer.call(now, &LdmCall::Feedme { class, max_hereis });
    }

    /// Bytes received from the upstream.
    pub fn handle_input(&mut self, now: Instant, bytes: &[u8]) {
        self.receive(now, bytes);
    }

    /// Room to read the upstream's bytes into, without a copy: read from the socket into it,
    /// then call [`Downstream::input_received`] (the alternative to
    /// [`Downstream::handle_input`]). Products are handed out in the buffer they arrived in.
    pub fn input_space(&mut self) -> &mut [u8] {
        self.peer.input_space()
    }

    /// `len` bytes were read into [`Downstream::input_space`].
    pub fn input_received(&mut self, now: Instant, len: usize) {
        self.received(now, len);
    }

    /// Answers the pending COMINGSOON: accept (OK) or not (DONT_SEND: duplicate, too big).
    pub fn answer_coming_soon(&mut self, now: Instant, accept: bool) -> Result<(), SessionError> {
        self.receive.answer(now, &mut self.peer, accept)
    }

    /// Bytes to write to the upstream (appended to `into`).
    pub fn take_output(&mut self, into: &mut Vec<u8>) {
        self.peer.take_output(into);
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<DownstreamEvent> {
        self.events.pop_front()
    }

    /// When [`Downstream::handle_timeout`] must be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::Requesting => self.peer.outstanding.map(|call| call.deadline),
            State::Receiving => Some(self.peer.last_receive + self.config.silence),
            State::Closed => None,
        }
    }

    /// Time passed.
    pub fn handle_timeout(&mut self, now: Instant) {
        match self.state {
            State::Requesting => {
                if let Some(call) = self.peer.call_timed_out(now) {
                    self.close(Err(SessionError::CallTimeout(call.proc.to_string())));
                }
            }
            State::Receiving if now >= self.peer.last_receive + self.config.silence => {
                self.close(Err(SessionError::Silence(self.config.silence.as_secs())));
            }
            _ => {}
        }
    }

    /// The upstream closed the connection.
    pub fn handle_eof(&mut self) {
        if !matches!(self.state, State::Closed) {
            self.close(self.peer.eof_result());
        }
    }

    /// The class requested now (after any RECLASS).
    pub fn class(&self) -> &ProdClass {
        &self.config.class
    }
}

impl Receiving for Downstream {
    fn peer(&mut self) -> &mut Peer {
        &mut self.peer
    }

    fn closed(&self) -> bool {
        matches!(self.state, State::Closed)
    }

    fn on_message(&mut self, now: Instant, message: Message) -> Result<(), SessionError> {
        match (&self.state, message) {
            (State::Requesting, Message::Reply(reply)) => {
                match reply.body {
                    ReplyBody::Fornme(FornmeReply::Ok(id)) => {
                        self.state = State::Receiving;
                        self.events.push_back(DownstreamEvent::Accepted { id, class: self.config.class.clone() });
                    }
                    ReplyBody::Fornme(FornmeReply::Reclass(wire)) => {
                        let (class, _) = compile_class(&wire).map_err(|error| {
                            SessionError::Protocol(format!("RECLASS with a pattern that does not compile: {error}"))
                        })?;
                        if class.specs.is_empty() || class.from == ldm7_types::Timestamp::NONE {
                            self.events.push_back(DownstreamEvent::Refused {
                                why: format!("the upstream allows nothing of {}", self.config.class),
                            });
                            self.close(Ok(()));
                            return Ok(());
                        }
                        self.config.class = class.clone();
                        self.events.push_back(DownstreamEvent::Reclassified(class));
                        self.send_feedme(now);
                    }
                    ReplyBody::Fornme(FornmeReply::BadPattern) => {
                        self.events.push_back(DownstreamEvent::Refused {
                            why: format!("the upstream cannot compile a pattern of {}", self.config.class),
                        });
                        self.close(Ok(()));
                    }
                    ReplyBody::Denied(stat) => {
                        self.events.push_back(DownstreamEvent::Refused {
                            why: format!("the upstream denies access ({stat:?}): check its ALLOW entries"),
                        });
                        self.close(Ok(()));
                    }
                    other => return Err(SessionError::Protocol(format!("unexpected reply to FEEDME: {other:?}"))),
                }
                Ok(())
            }
            (State::Receiving, Message::Call(call)) => {
                match self.receive.call(now, &mut self.peer, call.xid, call.call)? {
                    Received::Product(product) => self.events.push_back(DownstreamEvent::Product(product)),
                    Received::ComingSoon { info, abandoned } => {
                        self.events.push_back(DownstreamEvent::ComingSoon { info, abandoned });
                    }
                    Received::Nothing => {}
                }
                Ok(())
            }
            (state, message) => Err(SessionError::Protocol(format!("unexpected {message:?} in state {state:?}"))),
        }
    }

    fn close(&mut self, result: Result<(), SessionError>) {
        self.state = State::Closed;
        self.events.push_back(DownstreamEvent::Closed(result));
    }

    fn on_hereis(&mut self, _now: Instant, _xid: u32, info: ProdInfo, data: ReceivedData) -> Result<(), SessionError> {
        if !matches!(self.state, State::Receiving) {
            return Err(SessionError::Protocol(format!("unexpected HEREIS in state {:?}", self.state)));
        }
        if let Received::Product(product) = Receive::hereis(info, data) {
            self.events.push_back(DownstreamEvent::Product(product));
        }
        Ok(())
    }
}
