//! The NOTIFYME client (`ldm7 notify`, ldm6-protocol.md §6.2): NOTIFYME, then NOTIFICATIONs
//! (one-way: never answered — the reference `notifyme` answers them with PROC_UNAVAIL, which
//! upstreams discard) and NULLPROC flushes (answered).

use std::collections::VecDeque;
use std::time::Duration;

use ldm7_types::Instant;

use ldm7_types::{ProdClass, ProdInfo};
use ldm7_xdr::ldm::{FornmeReply, LdmCall, Message, ReplyBody};

use crate::peer::{Peer, Receiving};
use crate::{SessionError, compile_class, wire_class};

/// What the session reports.
#[derive(Debug)]
pub enum NotifyEvent {
    /// The upstream accepted the request.
    Accepted {
        /// Its id.
        id: u32,
        /// The class it notifies about.
        class: ProdClass,
    },
    /// The upstream allows only this subset; the session asked again.
    Reclassified(ProdClass),
    /// A product's metadata.
    Notification(ProdInfo),
    /// The upstream refused.
    Refused {
        /// Why.
        why: String,
    },
    /// The session is over.
    Closed(Result<(), SessionError>),
}

/// A NOTIFYME session.
#[derive(Debug)]
pub struct NotifyClient {
    class: ProdClass,
    peer: Peer,
    accepted: bool,
    closed: bool,
    silence: Duration,
    events: VecDeque<NotifyEvent>,
}

impl NotifyClient {
    /// A session on a connection just opened; the NOTIFYME is queued for output. Nothing for
    /// `silence` ends it (more than the upstream's 30 s keep-alive).
    pub fn new(now: Instant, class: ProdClass, silence: Duration) -> Self {
        let mut peer = Peer::new(now, 0x6e6f_0001);
        peer.call(now, &LdmCall::Notifyme(wire_class(&class)));
        Self { class, peer, accepted: false, closed: false, silence, events: VecDeque::new() }
    }

    /// Bytes received.
    pub fn handle_input(&mut self, now: Instant, bytes: &[u8]) {
        self.receive(now, bytes);
    }

    fn refuse(&mut self, why: String) {
        self.events.push_back(NotifyEvent::Refused { why });
        self.close(Ok(()));
    }

    /// Bytes to write (appended to `into`).
    pub fn take_output(&mut self, into: &mut Vec<u8>) {
        self.peer.take_output(into);
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<NotifyEvent> {
        self.events.pop_front()
    }

    /// When [`NotifyClient::handle_timeout`] must be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.closed {
            return None;
        }
        Some(match self.peer.outstanding {
            Some(call) => call.deadline,
            None => self.peer.last_receive + self.silence,
        })
    }

    /// Time passed.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.closed {
            return;
        }
        if let Some(call) = self.peer.call_timed_out(now) {
            self.close(Err(SessionError::CallTimeout(call.proc.to_string())));
        } else if self.peer.outstanding.is_none() && now >= self.peer.last_receive + self.silence {
            self.close(Err(SessionError::Silence(self.silence.as_secs())));
        }
    }

    /// The upstream closed the connection.
    pub fn handle_eof(&mut self) {
        if !self.closed {
            self.close(self.peer.eof_result());
        }
    }
}

impl Receiving for NotifyClient {
    fn peer(&mut self) -> &mut Peer {
        &mut self.peer
    }

    fn closed(&self) -> bool {
        self.closed
    }

    fn on_message(&mut self, now: Instant, message: Message) -> Result<(), SessionError> {
        match message {
            Message::Reply(reply) if !self.accepted => match reply.body {
                ReplyBody::Fornme(FornmeReply::Ok(id)) => {
                    self.accepted = true;
                    self.events.push_back(NotifyEvent::Accepted { id, class: self.class.clone() });
                    Ok(())
                }
                ReplyBody::Fornme(FornmeReply::Reclass(wire)) => {
                    let (class, _) = compile_class(&wire)
                        .map_err(|error| SessionError::Protocol(format!("RECLASS pattern: {error}")))?;
                    if class.specs.is_empty() {
                        self.refuse(format!("the upstream allows nothing of {}", self.class));
                        return Ok(());
                    }
                    self.class = class.clone();
                    self.events.push_back(NotifyEvent::Reclassified(class));
                    self.peer.call(now, &LdmCall::Notifyme(wire_class(&self.class)));
                    Ok(())
                }
                ReplyBody::Fornme(FornmeReply::BadPattern) => {
                    self.refuse(format!("the upstream cannot compile a pattern of {}", self.class));
                    Ok(())
                }
                ReplyBody::Denied(stat) => {
                    self.refuse(format!("the upstream denies access ({stat:?}): check its ALLOW entries"));
                    Ok(())
                }
                other => Err(SessionError::Protocol(format!("unexpected reply to NOTIFYME: {other:?}"))),
            },
            Message::Call(call) if self.accepted => match call.call {
                LdmCall::Notification(info) => {
                    self.events.push_back(NotifyEvent::Notification(info));
                    Ok(())
                }
                LdmCall::Nullproc => {
                    self.peer.reply(now, call.xid, &ReplyBody::Void);
                    Ok(())
                }
                other => Err(SessionError::Protocol(format!("unexpected {} call", other.proc()))),
            },
            other => Err(SessionError::Protocol(format!("unexpected {other:?}"))),
        }
    }

    fn close(&mut self, result: Result<(), SessionError>) {
        self.closed = true;
        self.events.push_back(NotifyEvent::Closed(result));
    }
}
