//! The server side of an accepted connection (ldm6-protocol.md §6): the first call decides
//! what the session is.
//!
//! * FEEDME / NOTIFYME → [`UpstreamEvent::FeedRequest`] / [`UpstreamEvent::NotifyRequest`];
//!   the driver checks access and answers with [`Upstream::answer_request`]. After an OK the
//!   session turns the connection around ([`UpstreamEvent::FeedStarted`]) and becomes the RPC
//!   client. The reference waits 1 s there (§6.1), so that the downstream has read the reply
//!   and become an RPC server before any call arrives (a call read together with the reply is
//!   lost in the downstream's client buffer). This session instead probes:
//!   [`TURN_AROUND_PROBE_DELAY`] after the OK it calls NULLPROC, and the reply proves the
//!   downstream serves; if the probe was lost that way (or is unanswered), feeding starts
//!   after [`TURN_AROUND_DELAY`] as the reference's does, and a late answer is a stray reply.
//!   Nothing but a NULLPROC — which loses nothing — can be swallowed. Then
//!   [`Upstream::send_product`] sends HEREIS (primary), COMINGSOON then BLKDATA (alternate) or
//!   NOTIFICATION (notify) while [`Upstream::ready`];
//!   [`Upstream::flush`] sends the NULLPROC that follows a batch; a NULLPROC keep-alive goes out
//!   after [`crate::INTERVAL`] without sending.
//! * HIYA → [`UpstreamEvent::Hiya`], answered with [`Upstream::answer_hiya`]; then pushed
//!   products arrive as [`UpstreamEvent::Product`] (COMINGSOON asks
//!   [`UpstreamEvent::ComingSoon`], answered with [`Upstream::answer_coming_soon`]).
//! * IS_ALIVE → [`UpstreamEvent::IsAlive`], answered with [`Upstream::answer_is_alive`].
//! * NULLPROC is answered in any state where this end is the RPC server.
//!
//! Bounds ([`UpstreamLimits`]): a connection that starts no session within
//! `first_call_timeout` (the reference's 120 s, 4 × interval, §7) is closed; a record longer
//! than `call_bytes_max` (all its fragments) is refused as soon as its fragment header
//! announces it — before any of it is buffered — except on a connection that accepted a HIYA,
//! where products arrive and the bound is `push_record_bytes_max`; a HIYA connection that sends
//! no byte for `push_idle_timeout` is closed. A feeding connection is never closed for quiet: the
//! keep-alive NULLPROC must be answered within [`crate::CALL_TIMEOUT`], which is its liveness.
//! Until a session receives products the record buffer is allocated in small pieces
//! ([`CALL_CHUNK`]), so an idle connection costs little.
//!
//! Made by [`crate::Inbound`], the session also lets an LDM-7 first call through: it stops
//! before that record and hands the connection over to a [`crate::Publisher`].

use std::collections::VecDeque;
use std::time::Duration;

use ldm7_types::Instant;

use ldm7_types::{ProdClass, ProdInfo, Signature};
use ldm7_xdr::ldm::{AuthStat, FornmeReply, HiyaReply, LdmCall, LdmErr, Message, Proc, ReplyBody};

use crate::peer::{Peer, Receiving};
use crate::receive::{Receive, Received, ReceivedData, ReceivedProduct};
use crate::{INTERVAL, SessionError, compile_class, wire_class};

/// How long a fresh connection may stay without a call (the reference's 4 × interval, §7).
pub const FIRST_CALL_LIMIT: Duration = Duration::from_secs(120);
/// The default bound on a record before a session receives products: a FEEDME, HIYA or
/// NOTIFYME of the most specs the protocol allows (32 patterns of 255 bytes) takes under 9 KiB.
pub const CALL_BYTES_MAX: usize = 64 << 10;
/// How long a HIYA connection may send nothing by default: the reference's `inactive_timeo`
/// (§7).
pub const PUSH_IDLE_TIMEOUT: Duration = Duration::from_secs(720);
/// The size the record buffer is allocated in while a connection carries only calls and
/// replies (no products).
pub const CALL_CHUNK: usize = 4 << 10;

/// The bounds of an upstream session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpstreamLimits {
    /// Longest record (all its fragments) before a session starts and on a feeding or notifying
    /// connection (the peer sends only replies and NULLPROCs there).
    pub call_bytes_max: usize,
    /// Longest record on a connection that accepted a HIYA (products arrive there).
    pub push_record_bytes_max: usize,
    /// How long a fresh connection may go without starting a session (FEEDME, NOTIFYME, HIYA
    /// or IS_ALIVE answered); NULLPROCs do not extend it.
    pub first_call_timeout: Duration,
    /// How long a HIYA connection may send no byte at all.
    pub push_idle_timeout: Duration,
}

impl Default for UpstreamLimits {
    fn default() -> Self {
        Self {
            call_bytes_max: CALL_BYTES_MAX,
            push_record_bytes_max: crate::RECORD_MAX,
            first_call_timeout: FIRST_CALL_LIMIT,
            push_idle_timeout: PUSH_IDLE_TIMEOUT,
        }
    }
}
/// The longest pause between a FEEDME/NOTIFYME reply and the first data: the reference's
/// fixed pause (§6.1).
pub const TURN_AROUND_DELAY: Duration = Duration::from_secs(1);
/// When the turn-around probe (a NULLPROC call) follows the FEEDME/NOTIFYME reply: long
/// enough for a downstream to have read its reply first, in the common case.
pub const TURN_AROUND_PROBE_DELAY: Duration = Duration::from_millis(10);

/// Primary or alternate transfer, from the FEEDME's `max_hereis`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FeedMode {
    /// HEREIS for every product (`max_hereis > u32::MAX / 2`).
    Primary,
    /// COMINGSOON, then BLKDATA if wanted.
    Alternate,
}

/// What the session reports or asks.
#[derive(Debug)]
pub enum UpstreamEvent {
    /// A FEEDME: answer with [`Upstream::answer_request`].
    FeedRequest {
        /// The requested class (the `SIG=` spec removed).
        class: ProdClass,
        /// Primary or alternate.
        mode: FeedMode,
        /// Resume after the product with this signature (from the `SIG=` spec).
        resume_after: Option<Signature>,
    },
    /// A NOTIFYME: answer with [`Upstream::answer_request`].
    NotifyRequest {
        /// The requested class.
        class: ProdClass,
    },
    /// A HIYA (push offer): answer with [`Upstream::answer_hiya`].
    Hiya {
        /// The offered class.
        class: ProdClass,
    },
    /// An IS_ALIVE: answer with [`Upstream::answer_is_alive`].
    IsAlive {
        /// The process id asked about.
        id: u32,
    },
    /// The turn-around is done: products may be sent.
    FeedStarted,
    /// The downstream declined a product (DONT_SEND to COMINGSOON).
    Declined {
        /// The product's signature.
        signature: Signature,
    },
    /// A pushed product.
    Product(ReceivedProduct),
    /// A pushed COMINGSOON: answer with [`Upstream::answer_coming_soon`].
    ComingSoon {
        /// The announced product.
        info: ProdInfo,
        /// An incomplete product it discarded.
        abandoned: Option<ProdInfo>,
    },
    /// A request's pattern does not compile; BADPATTERN was replied.
    BadPattern(String),
    /// A call LDM-6 does not serve (another version or procedure) was answered with the
    /// standard RPC error; the connection goes on.
    Unserved(String),
    /// The session is over; close the connection.
    Closed(Result<(), SessionError>),
}

/// The driver's answer to a FEEDME or NOTIFYME.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestAnswer {
    /// Feed the request; `id` is reported to the downstream (LDM: the upstream's PID).
    Ok {
        /// The id.
        id: u32,
    },
    /// Only this subset is allowed (an empty class: nothing).
    Reclass(ProdClass),
    /// The ALLOW patterns forbid the whole request: `MSG_DENIED`/`AUTH_TOOWEAK`, then close.
    Refuse,
}

/// The driver's answer to a HIYA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HiyaAnswer {
    /// Accept the whole offer.
    Ok {
        /// Largest product to send by HEREIS.
        max_hereis: u32,
    },
    /// Accept only this subset.
    Reclass {
        /// The accepted class.
        class: ProdClass,
        /// Largest product to send by HEREIS.
        max_hereis: u32,
    },
    /// Nothing of the offer is accepted: `MSG_DENIED`/`AUTH_TOOWEAK`, then close.
    Refuse,
}

#[derive(Debug)]
enum State {
    AwaitCall {
        deadline: Instant,
    },
    Deciding {
        xid: u32,
        what: Deciding,
    },
    /// After an OK: the probe goes out at `probe_at` (`None` once sent); feeding starts at its
    /// answer, or at `until`.
    TurnAround {
        until: Instant,
        probe_at: Option<Instant>,
        kind: FeedKind,
    },
    Feeding {
        kind: FeedKind,
    },
    Receiving,
    Closed,
}

/// Why a session was closed by one of its bounds ([`Upstream::closed_by`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitHit {
    /// No session started within `first_call_timeout`.
    FirstCallTimeout,
    /// A HIYA connection sent nothing for `push_idle_timeout`.
    PushIdle,
    /// A record longer than the bound was announced.
    RecordTooLong,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Deciding {
    Feed(FeedMode),
    Notify,
    Hiya,
    IsAlive,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FeedKind {
    Hereis,
    ComingSoon,
    Notify,
}

/// The server side of an accepted LDM connection.
#[derive(Debug)]
pub struct Upstream {
    peer: Peer,
    state: State,
    events: VecDeque<UpstreamEvent>,
    receive: Receive,
    /// Alternate mode: the product announced by COMINGSOON, sent by BLKDATA if accepted.
    announced: Option<(Signature, Vec<u8>)>,
    /// Something was sent since the last NULLPROC flush.
    unflushed: bool,
    /// Whether an LDM-7 first call is handed over ([`crate::Inbound`]) rather than answered
    /// PROG_MISMATCH.
    serves_ldm7: bool,
    limits: UpstreamLimits,
    /// When bytes last arrived (a HIYA connection's idle bound).
    last_input: Instant,
    /// The bound that closed the session, if one did.
    closed_by: Option<LimitHit>,
}

impl Upstream {
    /// A session for a connection accepted at `now`, with the default bounds.
    pub fn new(now: Instant) -> Self {
        Self::with_limits(now, UpstreamLimits::default())
    }

    /// A session for a connection accepted at `now`, with these bounds.
    pub fn with_limits(now: Instant, limits: UpstreamLimits) -> Self {
        let mut peer = Peer::new(now, 0x4c44_0001);
        peer.set_record_limits(limits.call_bytes_max, CALL_CHUNK);
        Self {
            peer,
            state: State::AwaitCall { deadline: now + limits.first_call_timeout },
            events: VecDeque::new(),
            receive: Receive::default(),
            announced: None,
            unflushed: false,
            serves_ldm7: false,
            limits,
            last_input: now,
            closed_by: None,
        }
    }

    /// A session that stops before an LDM-7 first call, for [`crate::Inbound`] to hand over.
    pub(crate) fn serving_ldm7(now: Instant, limits: UpstreamLimits) -> Self {
        Self { serves_ldm7: true, ..Self::with_limits(now, limits) }
    }

    /// The bound that closed the session, if one did (for the driver's log and counters).
    pub fn closed_by(&self) -> Option<LimitHit> {
        self.closed_by
    }

    /// Room for the next read from the socket: the record buffer itself (no copy). Read into
    /// it, then call [`Upstream::handle_input_filled`].
    pub fn input_space(&mut self) -> &mut [u8] {
        self.peer.input_space()
    }

    /// `len` bytes were read into [`Upstream::input_space`].
    pub fn handle_input_filled(&mut self, now: Instant, len: usize) {
        self.last_input = now;
        self.received(now, len);
    }

    /// Lets go of the input buffer while nothing is pending (the connection is quiet); it is
    /// allocated again at the next read. Returns whether there was one.
    pub fn release_idle_buffers(&mut self) -> bool {
        self.peer.release_idle_input()
    }

    /// Whether an LDM-7 first call waits to be handed over.
    pub(crate) fn ldm7_call_waiting(&mut self) -> bool {
        self.serves_ldm7 && matches!(self.state, State::AwaitCall { .. }) && self.peer.next_is_ldm7_call()
    }

    /// Gives up the connection (its buffered input and pending output) and the events not
    /// polled yet; the session is then over without a [`UpstreamEvent::Closed`].
    pub(crate) fn hand_over(&mut self, now: Instant) -> (Peer, VecDeque<UpstreamEvent>) {
        self.state = State::Closed;
        (std::mem::replace(&mut self.peer, Peer::new(now, 0)), std::mem::take(&mut self.events))
    }

    /// Bytes received from the peer (copied into the record buffer; see
    /// [`Upstream::input_space`] for reading without a copy).
    pub fn handle_input(&mut self, now: Instant, bytes: &[u8]) {
        self.last_input = now;
        self.receive(now, bytes);
    }

    fn on_call(&mut self, now: Instant, xid: u32, call: LdmCall) -> Result<(), SessionError> {
        match (&self.state, call) {
            (State::AwaitCall { .. } | State::Receiving, LdmCall::Nullproc) => {
                self.peer.reply(now, xid, &ReplyBody::Void);
                Ok(())
            }
            (State::AwaitCall { .. }, LdmCall::Feedme { class, max_hereis }) => {
                let mode = if max_hereis > u32::MAX / 2 { FeedMode::Primary } else { FeedMode::Alternate };
                match compile_class(&class) {
                    Ok((class, resume_after)) => {
                        self.state = State::Deciding { xid, what: Deciding::Feed(mode) };
                        self.events.push_back(UpstreamEvent::FeedRequest { class, mode, resume_after });
                    }
                    Err(error) => self.bad_pattern(now, xid, error.to_string()),
                }
                Ok(())
            }
            (State::AwaitCall { .. }, LdmCall::Notifyme(class)) => {
                match compile_class(&class) {
                    Ok((class, _)) => {
                        self.state = State::Deciding { xid, what: Deciding::Notify };
                        self.events.push_back(UpstreamEvent::NotifyRequest { class });
                    }
                    Err(error) => self.bad_pattern(now, xid, error.to_string()),
                }
                Ok(())
            }
            (State::AwaitCall { .. }, LdmCall::Hiya(class)) => {
                match compile_class(&class) {
                    Ok((class, _)) => {
                        self.state = State::Deciding { xid, what: Deciding::Hiya };
                        self.events.push_back(UpstreamEvent::Hiya { class });
                    }
                    Err(error) => {
                        // hiya_reply_t has no BADPATTERN arm: refuse.
                        self.peer.reply(now, xid, &ReplyBody::Denied(AuthStat::TooWeak));
                        self.events.push_back(UpstreamEvent::BadPattern(error.to_string()));
                        self.close(Ok(()));
                    }
                }
                Ok(())
            }
            (State::AwaitCall { .. }, LdmCall::IsAlive(id)) => {
                self.state = State::Deciding { xid, what: Deciding::IsAlive };
                self.events.push_back(UpstreamEvent::IsAlive { id });
                Ok(())
            }
            (
                State::Receiving,
                call @ (LdmCall::Hereis { .. } | LdmCall::ComingSoon { .. } | LdmCall::BlkData { .. }),
            ) => {
                match self.receive.call(now, &mut self.peer, xid, call)? {
                    Received::Product(product) => self.events.push_back(UpstreamEvent::Product(product)),
                    Received::ComingSoon { info, abandoned } => {
                        self.events.push_back(UpstreamEvent::ComingSoon { info, abandoned });
                    }
                    Received::Nothing => {}
                }
                Ok(())
            }
            (state, call) => Err(SessionError::Protocol(format!("unexpected {} call in state {state:?}", call.proc()))),
        }
    }

    fn bad_pattern(&mut self, now: Instant, xid: u32, error: String) {
        self.peer.reply(now, xid, &ReplyBody::Fornme(FornmeReply::BadPattern));
        self.events.push_back(UpstreamEvent::BadPattern(error));
        self.state = State::AwaitCall { deadline: now + self.limits.first_call_timeout };
    }

    fn on_reply(&mut self, now: Instant, body: ReplyBody) -> Result<(), SessionError> {
        // Only the feeding upstream makes calls: NULLPROC (the turn-around probe, flushes,
        // keep-alives) and COMINGSOON.
        match body {
            ReplyBody::Void => {
                if let State::TurnAround { kind, .. } = self.state {
                    self.start_feeding(now, kind);
                }
                Ok(())
            }
            ReplyBody::ComingSoon(code) => {
                let Some((signature, data)) = self.announced.take() else {
                    return Err(SessionError::Protocol("COMINGSOON reply without an announced product".into()));
                };
                match code {
                    LdmErr::Ok => {
                        let proc = Proc::BlkData;
                        self.peer.call_with_data(
                            now,
                            |out, xid| ldm7_xdr::ldm::encode_blkdata(out, xid, &signature, 0, &data),
                            proc,
                        );
                    }
                    _ => self.events.push_back(UpstreamEvent::Declined { signature }),
                }
                Ok(())
            }
            other => Err(SessionError::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Answers the pending FEEDME or NOTIFYME.
    pub fn answer_request(&mut self, now: Instant, answer: RequestAnswer) -> Result<(), SessionError> {
        let State::Deciding { xid, what } = self.state else {
            return Err(SessionError::Usage("no FEEDME or NOTIFYME is waiting for an answer"));
        };
        let kind = match what {
            Deciding::Feed(FeedMode::Primary) => FeedKind::Hereis,
            Deciding::Feed(FeedMode::Alternate) => FeedKind::ComingSoon,
            Deciding::Notify => FeedKind::Notify,
            _ => return Err(SessionError::Usage("the pending call is not a FEEDME or NOTIFYME")),
        };
        match answer {
            RequestAnswer::Ok { id } => {
                self.peer.reply(now, xid, &ReplyBody::Fornme(FornmeReply::Ok(id)));
                self.state = State::TurnAround {
                    until: now + TURN_AROUND_DELAY,
                    probe_at: Some(now + TURN_AROUND_PROBE_DELAY),
                    kind,
                };
            }
            RequestAnswer::Reclass(class) => {
                self.peer.reply(now, xid, &ReplyBody::Fornme(FornmeReply::Reclass(wire_class(&class))));
                // The downstream may send its next FEEDME on the same connection.
                self.state = State::AwaitCall { deadline: now + self.limits.first_call_timeout };
            }
            RequestAnswer::Refuse => {
                self.peer.reply(now, xid, &ReplyBody::Denied(AuthStat::TooWeak));
                self.close(Ok(()));
            }
        }
        Ok(())
    }

    /// Answers the pending HIYA.
    pub fn answer_hiya(&mut self, now: Instant, answer: HiyaAnswer) -> Result<(), SessionError> {
        let State::Deciding { xid, what: Deciding::Hiya } = self.state else {
            return Err(SessionError::Usage("no HIYA is waiting for an answer"));
        };
        match answer {
            HiyaAnswer::Ok { max_hereis } => {
                self.peer.reply(now, xid, &ReplyBody::Hiya(HiyaReply::Ok(max_hereis)));
                self.start_receiving(now);
            }
            HiyaAnswer::Reclass { class, max_hereis } => {
                let class = wire_class(&class);
                self.peer.reply(now, xid, &ReplyBody::Hiya(HiyaReply::Reclass { class, max_hereis }));
                self.start_receiving(now);
            }
            HiyaAnswer::Refuse => {
                self.peer.reply(now, xid, &ReplyBody::Denied(AuthStat::TooWeak));
                self.close(Ok(()));
            }
        }
        Ok(())
    }

    /// Answers the pending IS_ALIVE; the session then ends (as the reference does).
    pub fn answer_is_alive(&mut self, now: Instant, alive: bool) -> Result<(), SessionError> {
        let State::Deciding { xid, what: Deciding::IsAlive } = self.state else {
            return Err(SessionError::Usage("no IS_ALIVE is waiting for an answer"));
        };
        self.peer.reply(now, xid, &ReplyBody::IsAlive(alive));
        self.close(Ok(()));
        Ok(())
    }

    /// Answers the pending pushed COMINGSOON: accept (OK) or not (DONT_SEND: duplicate, too big).
    pub fn answer_coming_soon(&mut self, now: Instant, accept: bool) -> Result<(), SessionError> {
        self.receive.answer(now, &mut self.peer, accept)
    }

    /// Whether [`Upstream::send_product`] may be called: feeding, and no reply awaited.
    pub fn ready(&self) -> bool {
        matches!(self.state, State::Feeding { .. }) && self.peer.outstanding.is_none()
    }

    /// Whether products go out as HEREIS (a primary feed), so that
    /// [`Upstream::send_product_head`] may be used.
    pub fn sends_hereis(&self) -> bool {
        matches!(self.state, State::Feeding { kind: FeedKind::Hereis })
    }

    /// Sends a product of a primary feed without its data: the HEREIS record up to the data
    /// goes to the output, and the caller must write, right after taking that output and before
    /// anything else, the product's `info.size` data bytes and then the returned number of zero
    /// bytes (XDR padding). Lets a driver write data straight from the queue (vectored writes).
    pub fn send_product_head(&mut self, now: Instant, info: &ProdInfo) -> Result<usize, SessionError> {
        if !self.ready() || !self.sends_hereis() {
            return Err(SessionError::Usage("send_product_head needs a ready primary feed"));
        }
        let mut pad = 0;
        self.peer.call_with_data(now, |out, xid| pad = ldm7_xdr::ldm::encode_hereis_head(out, xid, info), Proc::Hereis);
        self.unflushed = true;
        Ok(pad)
    }

    /// Sends one product (its data is not needed in notify mode and may be empty).
    pub fn send_product(&mut self, now: Instant, info: &ProdInfo, data: &[u8]) -> Result<(), SessionError> {
        if !self.ready() {
            return Err(SessionError::Usage("send_product while not ready"));
        }
        let State::Feeding { kind } = self.state else { unreachable!("ready() checked") };
        match kind {
            FeedKind::Hereis => {
                self.peer.call_with_data(
                    now,
                    |out, xid| ldm7_xdr::ldm::encode_hereis(out, xid, info, data),
                    Proc::Hereis,
                );
            }
            FeedKind::Notify => {
                self.peer.call(now, &LdmCall::Notification(info.clone()));
            }
            FeedKind::ComingSoon => {
                self.peer.call(now, &LdmCall::ComingSoon { info: info.clone(), pktsz: info.size });
                self.announced = Some((info.signature, data.to_vec()));
            }
        }
        self.unflushed = true;
        Ok(())
    }

    /// The batch is over (caught up with the queue): send the NULLPROC flush if anything went
    /// out since the last one.
    pub fn flush(&mut self, now: Instant) {
        if self.ready() && self.unflushed {
            self.peer.call(now, &LdmCall::Nullproc);
            self.unflushed = false;
        }
    }

    /// Bytes to write to the peer (appended to `into`).
    pub fn take_output(&mut self, into: &mut Vec<u8>) {
        self.peer.take_output(into);
    }

    /// Whether there are bytes to write.
    pub fn has_output(&self) -> bool {
        self.peer.has_output()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<UpstreamEvent> {
        self.events.pop_front()
    }

    /// When [`Upstream::handle_timeout`] must be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.is_closed() {
            return None;
        }
        let call = self.peer.outstanding.map(|call| call.deadline);
        let state = match self.state {
            State::AwaitCall { deadline } => Some(deadline),
            State::Receiving => Some(self.last_input + self.limits.push_idle_timeout),
            State::TurnAround { until, probe_at, .. } => Some(probe_at.map_or(until, |at| at.min(until))),
            State::Feeding { .. } if self.peer.outstanding.is_none() => Some(self.peer.last_send + INTERVAL),
            _ => None,
        };
        [call, state].into_iter().flatten().min()
    }

    /// Time passed.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.is_closed() {
            return;
        }
        if let Some(call) = self.peer.call_timed_out(now) {
            self.close(Err(SessionError::CallTimeout(call.proc.to_string())));
            return;
        }
        match self.state {
            State::AwaitCall { deadline } if now >= deadline => {
                self.closed_by = Some(LimitHit::FirstCallTimeout);
                self.close(Err(SessionError::Silence(self.limits.first_call_timeout.as_secs())));
            }
            State::Receiving if now >= self.last_input + self.limits.push_idle_timeout => {
                self.closed_by = Some(LimitHit::PushIdle);
                self.close(Err(SessionError::Silence(self.limits.push_idle_timeout.as_secs())));
            }
            State::TurnAround { until, kind, .. } if now >= until => {
                // An unanswered probe is forgotten: a late answer is a stray reply.
                self.peer.outstanding = None;
                self.start_feeding(now, kind);
            }
            State::TurnAround { until, probe_at: Some(at), kind } if now >= at => {
                self.peer.call(now, &LdmCall::Nullproc);
                self.state = State::TurnAround { until, probe_at: None, kind };
            }
            State::Feeding { .. } if self.peer.outstanding.is_none() && now >= self.peer.last_send + INTERVAL => {
                self.peer.call(now, &LdmCall::Nullproc);
                self.unflushed = false;
            }
            _ => {}
        }
    }

    /// A HIYA was accepted: products arrive from now on, in records up to
    /// `push_record_bytes_max`, read in full-size pieces.
    fn start_receiving(&mut self, now: Instant) {
        self.state = State::Receiving;
        self.last_input = now;
        self.peer.set_record_limits(self.limits.push_record_bytes_max, ldm7_xdr::rpc::CHUNK);
    }

    fn start_feeding(&mut self, now: Instant, kind: FeedKind) {
        self.state = State::Feeding { kind };
        self.peer.last_send = now;
        self.events.push_back(UpstreamEvent::FeedStarted);
    }

    /// The peer closed the connection (or it failed).
    pub fn handle_eof(&mut self) {
        if !matches!(self.state, State::Closed) {
            self.close(self.peer.eof_result());
        }
    }

    /// Whether the session is over.
    pub fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed)
    }

    /// Replies skipped because no call waited on them (the reference notifyme's PROC_UNAVAIL).
    pub fn stray_replies(&self) -> u64 {
        self.peer.stray_replies
    }
}

impl Receiving for Upstream {
    fn peer(&mut self) -> &mut Peer {
        &mut self.peer
    }

    fn closed(&self) -> bool {
        matches!(self.state, State::Closed)
    }

    fn on_message(&mut self, now: Instant, message: Message) -> Result<(), SessionError> {
        match message {
            Message::Call(call) => self.on_call(now, call.xid, call.call),
            Message::Reply(reply) => self.on_reply(now, reply.body),
        }
    }

    fn on_unserved(&mut self, call: ldm7_xdr::XdrError) {
        self.events.push_back(UpstreamEvent::Unserved(call.to_string()));
    }

    fn yields_to_ldm7(&mut self) -> bool {
        self.ldm7_call_waiting()
    }

    fn versions_served(&self) -> (u32, u32) {
        if self.serves_ldm7 && matches!(self.state, State::AwaitCall { .. }) { (6, 7) } else { (6, 6) }
    }

    fn close(&mut self, result: Result<(), SessionError>) {
        if let Err(SessionError::Malformed(ldm7_xdr::XdrError::RecordTooLong { .. })) = &result {
            self.closed_by = Some(LimitHit::RecordTooLong);
        }
        self.state = State::Closed;
        self.events.push_back(UpstreamEvent::Closed(result));
    }

    fn on_hereis(&mut self, _now: Instant, _xid: u32, info: ProdInfo, data: ReceivedData) -> Result<(), SessionError> {
        if !matches!(self.state, State::Receiving) {
            return Err(SessionError::Protocol(format!("unexpected HEREIS call in state {:?}", self.state)));
        }
        if let Received::Product(product) = Receive::hereis(info, data) {
            self.events.push_back(UpstreamEvent::Product(product));
        }
        Ok(())
    }
}
