//! The upstream LDM-7 of one connection (ldm7-multicast.md §2.2 step 2, §2.3, §2.4): the
//! publisher. On the daemon's port it is reached through [`crate::Inbound`], which hands a
//! connection whose first call is an LDM-7 one over to it; [`Publisher::new`] serves a
//! connection known to be LDM-7.
//!
//! * SUBSCRIBE → [`PublisherEvent::Subscribe`]; the driver checks ALLOW and MULTICAST
//!   entries, starts the multicast sender, chooses the FMTP client address (§4.3) and answers
//!   with [`Publisher::answer_subscribe`] (`LDM7_OK` with the subscription, or a refusal
//!   status, after which the session closes) or [`Publisher::answer_subscribe_system_error`]
//!   (the reference's SYSTEM_ERR on an internal failure; the session closes).
//! * Then every message is a one-way CALL (nothing is ever replied):
//!   [`PublisherEvent::RequestProduct`] is answered, **in request order**, by
//!   [`Publisher::deliver_missed_product`] or [`Publisher::no_such_product`] (§2.3: the
//!   downstream drops an answer that is not for its oldest request, so the session refuses to
//!   send one); [`PublisherEvent::RequestBacklog`] by [`Publisher::deliver_backlog_product`]
//!   for each product then, optionally, [`Publisher::end_backlog`] (§2.4; the reference never
//!   sends END_BACKLOG). A subscriber's backlog fence (a request for an index not multicast
//!   yet, [`crate::is_fence`]) is set aside ([`Publisher::set_aside_fence`]) and answered by
//!   [`Publisher::answer_fences`], out of request order, once the backlogs asked before it are
//!   sent. At most [`crate::REQUESTED_MAX`] requests may await an answer: a
//!   downstream asking more closes the session with [`SessionError::Protocol`].
//! * Backpressure as in the LDM-6 feed: the product deliveries need [`Publisher::ready`],
//!   which is false while more than [`OUTPUT_HIGH_WATER`] bytes wait in the output; the driver
//!   loops "while ready, deliver; take the output and write it", so a backlog of any size
//!   streams with at most the high-water mark plus one product buffered here.
//! * Heartbeat: TEST_CONNECTION to the downstream after [`HEARD_NOTHING_LIMIT`] (60 s)
//!   without receiving anything (§2.2 step 4); the downstream's TEST_CONNECTIONs are
//!   [`PublisherEvent::TestConnection`].
//! * A connection that makes no call within 120 s is closed (4 × interval, as LDM-6).
//!
//! The reference's log lines (§5) come from the driver: `Incoming subscription request from
//! <host>:<port> for feed <feed>` on Subscribe, `Missed product sent: index=<n>, info="…"`
//! after a delivery, `Backlog product sent: …` after each backlog product.

use std::collections::VecDeque;
use std::time::Duration;

use ldm7_types::{FeedType, Instant, ProdInfo};
use ldm7_xdr::ldm7::{
    self, AcceptStat, BacklogSpec, Call, Ldm7Call, Ldm7Status, McastProdIndex, ReplyBody, SubscriptionReply, VcEndPoint,
};

use crate::peer::Peer;
use crate::receive7::Receiving7;
use crate::upstream::FIRST_CALL_LIMIT;
use crate::{INTERVAL, REQUESTED_MAX, SessionError};

/// The publisher sends TEST_CONNECTION after hearing nothing this long (2 × interval).
pub const HEARD_NOTHING_LIMIT: Duration = Duration::from_secs(2 * INTERVAL.as_secs());

/// Output bytes above which [`Publisher::ready`] is false.
pub const OUTPUT_HIGH_WATER: usize = 1 << 20;

/// What the session reports or asks.
#[derive(Debug)]
pub enum PublisherEvent {
    /// A SUBSCRIBE: answer with [`Publisher::answer_subscribe`].
    Subscribe {
        /// The feed asked for.
        feed: FeedType,
        /// The downstream's circuit end ([`VcEndPoint::unused`] without one).
        vc_end: VcEndPoint,
        /// What an ldm7 downstream offers (the extension; `None` from the reference).
        offer: Option<ldm7::SubscribeOffer>,
    },
    /// A REQUEST_PRODUCT: answer (in order) with [`Publisher::deliver_missed_product`] or
    /// [`Publisher::no_such_product`].
    RequestProduct {
        /// The FMTP product index (map it to a signature with the product-index map).
        index: McastProdIndex,
    },
    /// A REQUEST_BACKLOG: send the backlog with [`Publisher::deliver_backlog_product`].
    RequestBacklog {
        /// From where to where.
        spec: BacklogSpec,
    },
    /// The downstream's heartbeat.
    TestConnection,
    /// A call this end does not serve was handled (see the crate's rule); the session goes
    /// on.
    Unserved(String),
    /// The session is over; close the connection.
    Closed(Result<(), SessionError>),
}

#[derive(Debug)]
enum State {
    AwaitSubscribe { deadline: Instant },
    Deciding { xid: u32, offered: bool },
    Subscribed,
    Closed,
}

/// An upstream LDM-7 session on one connection.
#[derive(Debug)]
pub struct Publisher {
    peer: Peer,
    state: State,
    events: VecDeque<PublisherEvent>,
    /// Product requests not answered yet, oldest first.
    requested: VecDeque<McastProdIndex>,
    /// Backlog fences set aside, waiting for their answer.
    fences: VecDeque<McastProdIndex>,
    /// When the last heartbeat went out (the silence clock restarts then too).
    last_heartbeat: Instant,
    unserved: u64,
}

impl Publisher {
    /// A session for an LDM-7 connection accepted at `now`.
    pub fn new(now: Instant) -> Self {
        Self::from_peer(now, Peer::new(now, 0x4c37_0001))
    }

    /// A session continuing a connection whose first LDM-7 call waits in `peer`.
    pub(crate) fn from_peer(now: Instant, peer: Peer) -> Self {
        Self {
            peer,
            state: State::AwaitSubscribe { deadline: now + FIRST_CALL_LIMIT },
            events: VecDeque::new(),
            requested: VecDeque::new(),
            fences: VecDeque::new(),
            last_heartbeat: now,
            unserved: 0,
        }
    }

    /// Bytes received from the downstream.
    pub fn handle_input(&mut self, now: Instant, bytes: &[u8]) {
        self.receive(now, bytes);
    }

    /// Answers the pending SUBSCRIBE. `LDM7_OK` starts the session; a refusal is sent and the
    /// session closes.
    /// The extension's answer goes only to a downstream that offered (a reference downstream
    /// gets the reference's reply exactly), and always to one that did (without parity if the
    /// driver gave none: it then knows it talks to an ldm7 publisher that declined).
    pub fn answer_subscribe(&mut self, now: Instant, mut reply: SubscriptionReply) -> Result<(), SessionError> {
        let State::Deciding { xid, offered } = self.state else {
            return Err(SessionError::Usage("no SUBSCRIBE is waiting for an answer"));
        };
        if reply == SubscriptionReply::Refused(Ldm7Status::Ok) {
            return Err(SessionError::Usage("a refusal needs a status other than LDM7_OK"));
        }
        if let SubscriptionReply::Ok(info) = &mut reply {
            info.answer = if offered { Some(info.answer.unwrap_or_default()) } else { None };
        }
        let refused = matches!(reply, SubscriptionReply::Refused(_));
        self.peer.send_reply(now, |out| ldm7::encode_reply(out, xid, &ReplyBody::Subscribe(reply)));
        if refused {
            self.close(Ok(()));
        } else {
            self.state = State::Subscribed;
            self.last_heartbeat = now;
        }
        Ok(())
    }

    /// Answers the pending SUBSCRIBE with SYSTEM_ERR (an internal failure, as the reference
    /// does); the session closes.
    pub fn answer_subscribe_system_error(&mut self, now: Instant) -> Result<(), SessionError> {
        let State::Deciding { xid, .. } = self.state else {
            return Err(SessionError::Usage("no SUBSCRIBE is waiting for an answer"));
        };
        let body = ReplyBody::Error(AcceptStat::SystemErr);
        self.peer.send_reply(now, |out| ldm7::encode_reply(out, xid, &body));
        self.close(Ok(()));
        Ok(())
    }

    /// Whether a product may be delivered: subscribed, and the output below
    /// [`OUTPUT_HIGH_WATER`].
    pub fn ready(&self) -> bool {
        matches!(self.state, State::Subscribed) && self.peer.output_len() < OUTPUT_HIGH_WATER
    }

    /// Answers the oldest REQUEST_PRODUCT, `index`, with its product (DELIVER_MISSED_PRODUCT).
    /// Needs [`Publisher::ready`].
    pub fn deliver_missed_product(
        &mut self,
        now: Instant,
        index: McastProdIndex,
        info: &ProdInfo,
        data: &[u8],
    ) -> Result<(), SessionError> {
        if !self.ready() {
            return Err(SessionError::Usage("deliver_missed_product while not ready"));
        }
        self.answer_oldest(index)?;
        self.peer.send_call(now, |out, xid| ldm7::encode_deliver_missed_product(out, xid, index, info, data));
        Ok(())
    }

    /// Answers the oldest REQUEST_PRODUCT, `index`: the product is not here (NO_SUCH_PRODUCT).
    pub fn no_such_product(&mut self, now: Instant, index: McastProdIndex) -> Result<(), SessionError> {
        self.subscribed()?;
        self.answer_oldest(index)?;
        self.send(now, Ldm7Call::NoSuchProduct(index));
        Ok(())
    }

    /// Takes the request for `index`, a backlog fence ([`crate::is_fence`]: an index not
    /// multicast yet), out of the request order: later requests are answered while it waits
    /// for [`Publisher::answer_fences`], which the driver calls once the backlogs asked before
    /// it are sent (after END_BACKLOG).
    pub fn set_aside_fence(&mut self, index: McastProdIndex) -> Result<(), SessionError> {
        self.subscribed()?;
        let Some(at) = self.requested.iter().rposition(|requested| *requested == index) else {
            return Err(SessionError::Usage("set_aside_fence for an index not requested"));
        };
        self.requested.remove(at);
        self.fences.push_back(index);
        Ok(())
    }

    /// Answers every fence set aside ([`Publisher::set_aside_fence`]) with NO_SUCH_PRODUCT;
    /// returns how many.
    pub fn answer_fences(&mut self, now: Instant) -> Result<usize, SessionError> {
        if self.fences.is_empty() {
            return Ok(0);
        }
        self.subscribed()?;
        let count = self.fences.len();
        while let Some(index) = self.fences.pop_front() {
            self.send(now, Ldm7Call::NoSuchProduct(index));
        }
        Ok(count)
    }

    /// Sends one backlog product (DELIVER_BACKLOG_PRODUCT). Needs [`Publisher::ready`].
    pub fn deliver_backlog_product(&mut self, now: Instant, info: &ProdInfo, data: &[u8]) -> Result<(), SessionError> {
        if !self.ready() {
            return Err(SessionError::Usage("deliver_backlog_product while not ready"));
        }
        self.peer.send_call(now, |out, xid| ldm7::encode_deliver_backlog_product(out, xid, info, data));
        Ok(())
    }

    /// Says the backlog is complete (END_BACKLOG; optional, the reference never sends it).
    pub fn end_backlog(&mut self, now: Instant) -> Result<(), SessionError> {
        self.subscribed()?;
        self.send(now, Ldm7Call::EndBacklog);
        Ok(())
    }

    /// Bytes to write to the downstream (appended to `into`).
    pub fn take_output(&mut self, into: &mut Vec<u8>) {
        self.peer.take_output(into);
    }

    /// Whether there are bytes to write.
    pub fn has_output(&self) -> bool {
        self.peer.has_output()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<PublisherEvent> {
        self.events.pop_front()
    }

    /// When [`Publisher::handle_timeout`] must be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::AwaitSubscribe { deadline } => Some(deadline),
            State::Subscribed => Some(self.heard_nothing_since() + HEARD_NOTHING_LIMIT),
            State::Deciding { .. } | State::Closed => None,
        }
    }

    /// Time passed.
    pub fn handle_timeout(&mut self, now: Instant) {
        match self.state {
            State::AwaitSubscribe { deadline } if now >= deadline => {
                self.close(Err(SessionError::Silence(FIRST_CALL_LIMIT.as_secs())));
            }
            State::Subscribed if now >= self.heard_nothing_since() + HEARD_NOTHING_LIMIT => {
                self.send(now, Ldm7Call::TestConnection);
                self.last_heartbeat = now;
            }
            _ => {}
        }
    }

    /// The downstream closed the connection (or it failed): the session ends normally.
    pub fn handle_eof(&mut self) {
        if !matches!(self.state, State::Closed) {
            self.close(Ok(()));
        }
    }

    /// Whether the session is over.
    pub fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed)
    }

    /// Product requests awaiting an answer, oldest first.
    pub fn requested(&self) -> impl ExactSizeIterator<Item = McastProdIndex> + '_ {
        self.requested.iter().copied()
    }

    /// Calls this end did not serve.
    pub fn unserved_calls(&self) -> u64 {
        self.unserved
    }

    /// Replies skipped because no call waited on them.
    pub fn stray_replies(&self) -> u64 {
        self.peer.stray_replies
    }

    fn heard_nothing_since(&self) -> Instant {
        self.peer.last_receive.max(self.last_heartbeat)
    }

    fn subscribed(&self) -> Result<(), SessionError> {
        match self.state {
            State::Subscribed => Ok(()),
            State::Closed => Err(SessionError::Usage("the session is closed")),
            _ => Err(SessionError::Usage("not subscribed yet")),
        }
    }

    fn answer_oldest(&mut self, index: McastProdIndex) -> Result<(), SessionError> {
        match self.requested.front() {
            Some(&oldest) if oldest == index => {
                self.requested.pop_front();
                Ok(())
            }
            // §2.3: the downstream would drop it as unexpected.
            _ => Err(SessionError::Usage("a product answer must be for the oldest outstanding request")),
        }
    }

    fn send(&mut self, now: Instant, call: Ldm7Call) {
        self.peer.send_call(now, |out, xid| ldm7::encode_call(out, &Call { xid, call }));
    }
}

impl Receiving7 for Publisher {
    fn peer(&mut self) -> &mut Peer {
        &mut self.peer
    }

    fn closed(&self) -> bool {
        matches!(self.state, State::Closed)
    }

    fn on_call(&mut self, now: Instant, call: Call) -> Result<(), SessionError> {
        match (&self.state, call.call) {
            (State::AwaitSubscribe { .. }, Ldm7Call::Subscribe(request)) => {
                self.state = State::Deciding { xid: call.xid, offered: request.offer.is_some() };
                self.events.push_back(PublisherEvent::Subscribe {
                    feed: request.feed,
                    vc_end: request.vc_end,
                    offer: request.offer,
                });
            }
            (_, Ldm7Call::TestConnection) => self.events.push_back(PublisherEvent::TestConnection),
            (State::Subscribed, Ldm7Call::RequestProduct(index)) => {
                if self.requested.len() + self.fences.len() >= REQUESTED_MAX {
                    return Err(SessionError::Protocol(format!(
                        "the downstream has more than {REQUESTED_MAX} product requests unanswered"
                    )));
                }
                self.requested.push_back(index);
                self.events.push_back(PublisherEvent::RequestProduct { index });
            }
            (State::Subscribed, Ldm7Call::RequestBacklog(spec)) => {
                self.events.push_back(PublisherEvent::RequestBacklog { spec });
            }
            (state, call @ (Ldm7Call::Subscribe(_) | Ldm7Call::RequestProduct(_) | Ldm7Call::RequestBacklog(_))) => {
                return Err(SessionError::Protocol(format!("unexpected {} in state {state:?}", call.proc())));
            }
            (_, other) => self.unserved_proc(now, call.xid, other.proc()),
        }
        Ok(())
    }

    fn on_unserved(&mut self, what: String) {
        self.unserved += 1;
        self.events.push_back(PublisherEvent::Unserved(what));
    }

    fn close(&mut self, result: Result<(), SessionError>) {
        self.state = State::Closed;
        self.events.push_back(PublisherEvent::Closed(result));
    }
}
