//! One accepted connection on the daemon's port, whichever LDM version its first call uses
//! (the reference `ldmd` registers versions 6 and 7 on every socket, ldm6-protocol.md §1):
//! one object per connection for the driver.
//!
//! Design: LDM-7 keeps its own session type ([`Publisher`]) and this small dispatcher sits in
//! front of it and of the LDM-6 [`Upstream`], rather than one session type growing both
//! protocols. The connection starts as an [`Upstream`] awaiting its first call (it keeps the
//! 120 s first-call limit, answers NULLPROC, and answers calls of other programs or versions
//! with PROG_UNAVAIL / PROG_MISMATCH 6..7). When the next record is an LDM-7 call and no
//! LDM-6 session has begun, the upstream stops before that record and hands the connection —
//! the unread bytes included — over to a [`Publisher`], which takes the call (normally
//! SUBSCRIBE) from there. Once an LDM-6 session has begun, version-7 calls are answered
//! PROG_MISMATCH 6..6 as before, and a [`Publisher`] answers anything but version 7 with
//! PROG_MISMATCH 7..7.
//!
//! Events carry their session's type ([`InboundEvent::Ldm6`], [`InboundEvent::Ldm7`]); the
//! driver answers them through [`Inbound::upstream`] or [`Inbound::publisher`].

use std::collections::VecDeque;

use ldm7_types::Instant;

use crate::{Publisher, PublisherEvent, Upstream, UpstreamEvent, UpstreamLimits};

/// What the connection's session reports or asks.
#[derive(Debug)]
pub enum InboundEvent {
    /// From the LDM-6 session (answer through [`Inbound::upstream`]).
    Ldm6(UpstreamEvent),
    /// From the LDM-7 session (answer through [`Inbound::publisher`]).
    Ldm7(PublisherEvent),
}

/// The server side of one accepted connection, LDM-6 or LDM-7.
#[derive(Debug)]
pub struct Inbound {
    session: Session,
    /// Events of the LDM-6 session not polled when it handed over to LDM-7.
    carried: VecDeque<UpstreamEvent>,
}

#[derive(Debug)]
enum Session {
    Ldm6(Box<Upstream>),
    Ldm7(Box<Publisher>),
}

impl Inbound {
    /// A session for a connection accepted at `now`, with the default bounds.
    pub fn new(now: Instant) -> Self {
        Self::with_limits(now, UpstreamLimits::default())
    }

    /// A session for a connection accepted at `now`; the LDM-6 session keeps `limits` (and an
    /// LDM-7 one the record bound of a connection before its session starts).
    pub fn with_limits(now: Instant, limits: UpstreamLimits) -> Self {
        Self { session: Session::Ldm6(Box::new(Upstream::serving_ldm7(now, limits))), carried: VecDeque::new() }
    }

    /// Bytes received from the peer.
    pub fn handle_input(&mut self, now: Instant, bytes: &[u8]) {
        match &mut self.session {
            Session::Ldm6(upstream) => {
                upstream.handle_input(now, bytes);
                self.hand_over_if_ldm7(now);
            }
            Session::Ldm7(publisher) => publisher.handle_input(now, bytes),
        }
    }

    /// Room for the next read from the socket, while the connection is LDM-6: the record
    /// buffer itself ([`Upstream::input_space`]); `None` once it went LDM-7 (whose session
    /// takes [`Inbound::handle_input`]).
    pub fn input_space(&mut self) -> Option<&mut [u8]> {
        match &mut self.session {
            Session::Ldm6(upstream) => Some(upstream.input_space()),
            Session::Ldm7(_) => None,
        }
    }

    /// `len` bytes were read into [`Inbound::input_space`].
    pub fn handle_input_filled(&mut self, now: Instant, len: usize) {
        if let Session::Ldm6(upstream) = &mut self.session {
            upstream.handle_input_filled(now, len);
            self.hand_over_if_ldm7(now);
        }
    }

    /// Lets go of the LDM-6 input buffer while nothing is pending
    /// ([`Upstream::release_idle_buffers`]).
    pub fn release_idle_buffers(&mut self) -> bool {
        match &mut self.session {
            Session::Ldm6(upstream) => upstream.release_idle_buffers(),
            Session::Ldm7(_) => false,
        }
    }

    /// An LDM-7 first call waits: the connection goes to a [`Publisher`].
    fn hand_over_if_ldm7(&mut self, now: Instant) {
        let Session::Ldm6(upstream) = &mut self.session else { return };
        if upstream.ldm7_call_waiting() {
            let (peer, events) = upstream.hand_over(now);
            self.carried.extend(events);
            let mut publisher = Box::new(Publisher::from_peer(now, peer));
            publisher.handle_input(now, &[]);
            self.session = Session::Ldm7(publisher);
        }
    }

    /// The LDM-6 session, unless the connection went LDM-7.
    pub fn upstream(&mut self) -> Option<&mut Upstream> {
        match &mut self.session {
            Session::Ldm6(upstream) => Some(upstream.as_mut()),
            Session::Ldm7(_) => None,
        }
    }

    /// The LDM-7 session, once the connection's first call was an LDM-7 one.
    pub fn publisher(&mut self) -> Option<&mut Publisher> {
        match &mut self.session {
            Session::Ldm6(_) => None,
            Session::Ldm7(publisher) => Some(publisher.as_mut()),
        }
    }

    /// Whether the connection went LDM-7.
    pub fn is_ldm7(&self) -> bool {
        matches!(self.session, Session::Ldm7(_))
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<InboundEvent> {
        if let Some(event) = self.carried.pop_front() {
            return Some(InboundEvent::Ldm6(event));
        }
        match &mut self.session {
            Session::Ldm6(upstream) => upstream.poll_event().map(InboundEvent::Ldm6),
            Session::Ldm7(publisher) => publisher.poll_event().map(InboundEvent::Ldm7),
        }
    }

    /// Bytes to write to the peer (appended to `into`).
    pub fn take_output(&mut self, into: &mut Vec<u8>) {
        match &mut self.session {
            Session::Ldm6(upstream) => upstream.take_output(into),
            Session::Ldm7(publisher) => publisher.take_output(into),
        }
    }

    /// Whether there are bytes to write.
    pub fn has_output(&self) -> bool {
        match &self.session {
            Session::Ldm6(upstream) => upstream.has_output(),
            Session::Ldm7(publisher) => publisher.has_output(),
        }
    }

    /// When [`Inbound::handle_timeout`] must be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.session {
            Session::Ldm6(upstream) => upstream.poll_timeout(),
            Session::Ldm7(publisher) => publisher.poll_timeout(),
        }
    }

    /// Time passed.
    pub fn handle_timeout(&mut self, now: Instant) {
        match &mut self.session {
            Session::Ldm6(upstream) => upstream.handle_timeout(now),
            Session::Ldm7(publisher) => publisher.handle_timeout(now),
        }
    }

    /// The peer closed the connection (or it failed).
    pub fn handle_eof(&mut self) {
        match &mut self.session {
            Session::Ldm6(upstream) => upstream.handle_eof(),
            Session::Ldm7(publisher) => publisher.handle_eof(),
        }
    }

    /// Whether the session is over.
    pub fn is_closed(&self) -> bool {
        match &self.session {
            Session::Ldm6(upstream) => upstream.is_closed(),
            Session::Ldm7(publisher) => publisher.is_closed(),
        }
    }
}
