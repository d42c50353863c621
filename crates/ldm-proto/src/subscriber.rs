//! The downstream LDM-7 of one connection (ldm7-multicast.md §2.2 steps 1 and 3–5, §2.3,
//! §2.4): the subscriber.
//!
//! * [`Subscriber::new`] queues SUBSCRIBE(feed, vcEnd), a synchronous call with its own reply
//!   timeout ([`SUBSCRIBE_TIMEOUT`], 600 s as the reference: VLAN set-up can be slow). The
//!   reply becomes [`SubscriberEvent::Subscribed`] (then the session goes on) or
//!   [`SubscriberEvent::Refused`] (then it closes). An RPC error instead of a reply closes the
//!   session with [`SessionError::Protocol`] (e.g. PROG_MISMATCH from an LDM-6-only upstream).
//! * `McastInfo.server` with host `0.0.0.0` means "the host you connected to" (§2.2 step 3):
//!   when [`SubscriberConfig::upstream_host`] is set the session substitutes it before
//!   reporting ([`substitute_unspecified_host`]); otherwise the driver must.
//! * Afterwards every message is a one-way CALL, in both directions, and nothing is ever
//!   replied. [`Subscriber::request_product`] sends REQUEST_PRODUCT and remembers the index:
//!   answers must come in request order (§2.3), so a DELIVER_MISSED_PRODUCT or NO_SUCH_PRODUCT
//!   whose index is not the oldest outstanding request is reported as
//!   [`SubscriberEvent::Unexpected`] and dropped (the reference logs "Unexpected product").
//!   At most [`REQUESTED_MAX`] requests are outstanding; beyond it a request is not sent
//!   (counted, reported once).
//! * [`Subscriber::request_backlog`] sends REQUEST_BACKLOG (§2.4); the upstream answers with
//!   DELIVER_BACKLOG_PRODUCTs ([`SubscriberEvent::BacklogProduct`]) and maybe END_BACKLOG
//!   (the reference never sends it). [`SubscriberEvent::BacklogComplete`] says when a backlog
//!   is complete, against either upstream, by a *fence*: a REQUEST_PRODUCT sent right after the
//!   REQUEST_BACKLOG for an index the upstream has not multicast ([`fence_index`], far ahead of
//!   the newest index this end has seen). The reference serves a connection's calls one at a
//!   time, so it answers the fence (NO_SUCH_PRODUCT: not in its product-index map) after the
//!   last backlog product; ldm7 answers a fence ([`is_fence`]) once no backlog is being sent,
//!   after its END_BACKLOG, and other requests meanwhile. A backlog is complete at END_BACKLOG
//!   or at its fence's answer, whichever comes first; the fence's answer may come out of
//!   request order. Without a known index the fence waits for [`Subscriber::fence_backlogs`].
//! * Heartbeat: TEST_CONNECTION whenever [`SubscriberConfig::heartbeat`] (30 s) passed since
//!   this end last sent anything (§2.2 step 4). The upstream's TEST_CONNECTIONs are accepted
//!   silently. There is no silence limit: a healthy upstream may say nothing for hours.
//! * Products are handed over without a copy: their data stays in the record they arrived in
//!   ([`ldm7_xdr::ldm7::RecordBytes`]).
//!
//! The reference's log lines (§5) come from the driver: `Inserted: …` / `Backlog: …` on
//! MissedProduct / BacklogProduct, `Requested product <n> doesn't exist` on NoSuchProduct,
//! `All backlog data-products received: …` on EndBacklog.

use std::collections::VecDeque;
use std::time::Duration;

use ldm7_types::{FeedType, Instant};
use ldm7_xdr::ldm7::{
    self, BacklogSpec, Call, Ldm7Call, Ldm7Status, McastProdIndex, McastSubInfo, McastSubReq, Proc, Reply, ReplyBody,
    SubscriptionReply, VcEndPoint, WireProduct,
};

use crate::peer::Peer;
use crate::receive7::Receiving7;
use crate::{INTERVAL, SessionError};

/// How long SUBSCRIBE may wait for its reply (the reference raises its client timeout to
/// 600 s for this call, §2).
pub const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(600);

/// Most product requests awaiting an answer, on either end.
pub const REQUESTED_MAX: usize = 1 << 20;

/// A subscriber session's settings.
#[derive(Clone, Debug)]
pub struct SubscriberConfig {
    /// The feed to subscribe to.
    pub feed: FeedType,
    /// This end of the AL2S circuit ([`VcEndPoint::unused`] without one).
    pub vc_end: VcEndPoint,
    /// The host this connection went to: substituted for a server host `0.0.0.0` in the
    /// reply (§2.2 step 3). `None`: the driver substitutes.
    pub upstream_host: Option<String>,
    /// SUBSCRIBE reply timeout (reference: 600 s).
    pub subscribe_timeout: Duration,
    /// TEST_CONNECTION after this long without sending (reference: `interval`, 30 s).
    pub heartbeat: Duration,
    /// What the SUBSCRIBE offers beyond the reference (the ldm7 extension; `None`: the
    /// reference's record exactly).
    pub offer: Option<ldm7::SubscribeOffer>,
}

impl SubscriberConfig {
    /// No circuit, no substitution, the reference's timeouts.
    pub fn new(feed: FeedType) -> Self {
        Self {
            feed,
            vc_end: VcEndPoint::unused(),
            upstream_host: None,
            subscribe_timeout: SUBSCRIBE_TIMEOUT,
            heartbeat: INTERVAL,
            offer: None,
        }
    }
}

/// What the session reports.
#[derive(Debug)]
pub enum SubscriberEvent {
    /// The upstream accepted: start the FMTP receiver with this (server already substituted
    /// when [`SubscriberConfig::upstream_host`] is set).
    Subscribed {
        /// The group, FMTP server and the address to receive from.
        info: McastSubInfo,
    },
    /// The upstream refused (`LDM7_UNAUTH`: no ALLOW; `LDM7_NOENT`: no MULTICAST entry …);
    /// the session closes.
    Refused {
        /// Why.
        status: Ldm7Status,
    },
    /// The answer to the oldest REQUEST_PRODUCT: the product.
    MissedProduct {
        /// The FMTP index it was requested by.
        index: McastProdIndex,
        /// The product.
        product: WireProduct,
    },
    /// The answer to the oldest REQUEST_PRODUCT: the upstream does not have it.
    NoSuchProduct {
        /// The FMTP index.
        index: McastProdIndex,
    },
    /// A DELIVER_MISSED_PRODUCT or NO_SUCH_PRODUCT that does not answer the oldest request:
    /// dropped (§2.3).
    Unexpected {
        /// Which of the two.
        proc: Proc,
        /// Its index.
        index: McastProdIndex,
        /// The oldest outstanding request, if any.
        expected: Option<McastProdIndex>,
    },
    /// A backlog product.
    BacklogProduct {
        /// The product.
        product: WireProduct,
    },
    /// The oldest backlog asked for is complete (END_BACKLOG, or its fence answered).
    BacklogComplete,
    /// [`REQUESTED_MAX`] requests are outstanding: further requests are not sent until
    /// answers arrive (reported once per session; see [`Subscriber::requests_over_bound`]).
    RequestsOverBound,
    /// A call this end does not serve was handled (the crate's rule); the session goes on.
    Unserved(String),
    /// The session is over; close the connection.
    Closed(Result<(), SessionError>),
}

#[derive(Debug)]
enum State {
    Subscribing { xid: u32, deadline: Instant },
    Subscribed,
    Closed,
}

/// A downstream LDM-7 session on one connection.
#[derive(Debug)]
pub struct Subscriber {
    config: SubscriberConfig,
    peer: Peer,
    state: State,
    events: VecDeque<SubscriberEvent>,
    /// Indices requested and not answered yet, oldest first.
    requested: VecDeque<McastProdIndex>,
    /// Backlogs asked for and not complete, oldest first, with their fence once sent.
    backlogs: VecDeque<Option<McastProdIndex>>,
    /// Fences of backlogs END_BACKLOG completed: their answers are dropped when they come
    /// (at most [`STALE_FENCES_MAX`]).
    stale_fences: VecDeque<McastProdIndex>,
    unexpected: u64,
    unserved: u64,
    requests_over_bound: u64,
}

impl Subscriber {
    /// A session on a connection just opened; the SUBSCRIBE is queued for output.
    pub fn new(now: Instant, config: SubscriberConfig) -> Self {
        let mut peer = Peer::new(now, 0x6c37_0001);
        let request = McastSubReq { feed: config.feed, vc_end: config.vc_end.clone(), offer: config.offer };
        let xid =
            peer.send_call(now, |out, xid| ldm7::encode_call(out, &Call { xid, call: Ldm7Call::Subscribe(request) }));
        let deadline = now + config.subscribe_timeout;
        Self {
            config,
            peer,
            state: State::Subscribing { xid, deadline },
            events: VecDeque::new(),
            requested: VecDeque::new(),
            backlogs: VecDeque::new(),
            stale_fences: VecDeque::new(),
            unexpected: 0,
            unserved: 0,
            requests_over_bound: 0,
        }
    }

    /// Bytes received from the upstream.
    pub fn handle_input(&mut self, now: Instant, bytes: &[u8]) {
        self.receive(now, bytes);
    }

    /// Asks for the product of FMTP index `index` (the FMTP receiver gave up on it, §2.3).
    /// `Ok(false)`: not sent, [`REQUESTED_MAX`] requests are outstanding.
    pub fn request_product(&mut self, now: Instant, index: McastProdIndex) -> Result<bool, SessionError> {
        self.subscribed("request_product before the subscription")?;
        if self.requested.len() >= REQUESTED_MAX {
            if self.requests_over_bound == 0 {
                self.events.push_back(SubscriberEvent::RequestsOverBound);
            }
            self.requests_over_bound += 1;
            return Ok(false);
        }
        self.requested.push_back(index);
        self.send(now, Ldm7Call::RequestProduct(index));
        Ok(true)
    }

    /// Asks for a backlog (§2.4), followed by its fence `fence` ([`fence_index`] of the newest
    /// FMTP index this end has seen; `None` when it has seen none: then
    /// [`Subscriber::fence_backlogs`] sends it once one is known).
    pub fn request_backlog(
        &mut self,
        now: Instant,
        spec: BacklogSpec,
        fence: Option<McastProdIndex>,
    ) -> Result<(), SessionError> {
        self.subscribed("request_backlog before the subscription")?;
        self.send(now, Ldm7Call::RequestBacklog(spec));
        if let Some(fence) = fence {
            self.send(now, Ldm7Call::RequestProduct(fence));
        }
        self.backlogs.push_back(fence);
        Ok(())
    }

    /// Sends `fence` for every backlog asked for without one; returns how many.
    pub fn fence_backlogs(&mut self, now: Instant, fence: McastProdIndex) -> Result<usize, SessionError> {
        self.subscribed("fence_backlogs before the subscription")?;
        let unfenced = self.backlogs.iter().filter(|fenced| fenced.is_none()).count();
        if unfenced > 0 {
            self.send(now, Ldm7Call::RequestProduct(fence));
            for pending in self.backlogs.iter_mut().filter(|fenced| fenced.is_none()) {
                *pending = Some(fence);
            }
        }
        Ok(unfenced)
    }

    /// Backlogs asked for and not complete yet.
    pub fn pending_backlogs(&self) -> usize {
        self.backlogs.len()
    }

    /// Bytes to write to the upstream (appended to `into`).
    pub fn take_output(&mut self, into: &mut Vec<u8>) {
        self.peer.take_output(into);
    }

    /// Whether there are bytes to write.
    pub fn has_output(&self) -> bool {
        self.peer.has_output()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<SubscriberEvent> {
        self.events.pop_front()
    }

    /// When [`Subscriber::handle_timeout`] must be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::Subscribing { deadline, .. } => Some(deadline),
            State::Subscribed => Some(self.peer.last_send + self.config.heartbeat),
            State::Closed => None,
        }
    }

    /// Time passed.
    pub fn handle_timeout(&mut self, now: Instant) {
        match self.state {
            State::Subscribing { deadline, .. } if now >= deadline => {
                self.close(Err(SessionError::ReplyTimeout {
                    call: "SUBSCRIBE",
                    timeout_secs: self.config.subscribe_timeout.as_secs(),
                }));
            }
            State::Subscribed if now >= self.peer.last_send + self.config.heartbeat => {
                self.send(now, Ldm7Call::TestConnection);
            }
            _ => {}
        }
    }

    /// The upstream closed the connection (or it failed).
    pub fn handle_eof(&mut self) {
        match self.state {
            State::Subscribing { .. } => self.close(Err(SessionError::ClosedBeforeReply(Proc::Subscribe.to_string()))),
            State::Subscribed => self.close(Ok(())),
            State::Closed => {}
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

    /// Deliveries dropped because they did not answer the oldest request.
    pub fn unexpected_deliveries(&self) -> u64 {
        self.unexpected
    }

    /// Calls this end did not serve.
    pub fn unserved_calls(&self) -> u64 {
        self.unserved
    }

    /// Requests not sent because [`REQUESTED_MAX`] were outstanding.
    pub fn requests_over_bound(&self) -> u64 {
        self.requests_over_bound
    }

    /// Replies skipped because no call waited on them.
    pub fn stray_replies(&self) -> u64 {
        self.peer.stray_replies
    }

    fn subscribed(&self, misuse: &'static str) -> Result<(), SessionError> {
        match self.state {
            State::Subscribed => Ok(()),
            State::Closed => Err(SessionError::Usage("the session is closed")),
            State::Subscribing { .. } => Err(SessionError::Usage(misuse)),
        }
    }

    fn send(&mut self, now: Instant, call: Ldm7Call) {
        self.peer.send_call(now, |out, xid| ldm7::encode_call(out, &Call { xid, call }));
    }

    /// Whether `index` answers a fence: its backlog and every older one are complete (an
    /// upstream answers a fence only after the backlogs asked before it), or END_BACKLOG
    /// completed its backlog before and the answer is dropped.
    fn answers_fence(&mut self, index: McastProdIndex) -> bool {
        if let Some(at) = self.backlogs.iter().rposition(|fence| *fence == Some(index)) {
            for _ in 0..=at {
                if let Some(Some(other)) = self.backlogs.pop_front().filter(|fence| *fence != Some(index)) {
                    self.remember_stale(other);
                }
                self.events.push_back(SubscriberEvent::BacklogComplete);
            }
            return true;
        }
        if let Some(at) = self.stale_fences.iter().position(|fence| *fence == index) {
            self.stale_fences.remove(at);
            return true;
        }
        false
    }

    /// END_BACKLOG: the oldest backlog is complete; its fence's answer, still to come, is
    /// dropped.
    fn end_backlog(&mut self) {
        let Some(fence) = self.backlogs.pop_front() else { return };
        if let Some(fence) = fence.filter(|fence| !self.backlogs.contains(&Some(*fence))) {
            self.remember_stale(fence);
        }
        self.events.push_back(SubscriberEvent::BacklogComplete);
    }

    fn remember_stale(&mut self, fence: McastProdIndex) {
        if self.stale_fences.len() >= STALE_FENCES_MAX {
            self.stale_fences.pop_front();
        }
        self.stale_fences.push_back(fence);
    }

    /// A delivery answering request `index`: accepted if it is the oldest request (§2.3).
    fn answers_oldest(&mut self, proc: Proc, index: McastProdIndex) -> bool {
        if self.requested.front() == Some(&index) {
            self.requested.pop_front();
            return true;
        }
        self.unexpected += 1;
        let expected = self.requested.front().copied();
        self.events.push_back(SubscriberEvent::Unexpected { proc, index, expected });
        false
    }
}

/// Most fences remembered after END_BACKLOG completed their backlogs.
pub const STALE_FENCES_MAX: usize = 64;

/// How far ahead of the newest FMTP index seen a fence lies: far beyond any index a publisher
/// has multicast or will for long, short of half the index space (serial arithmetic).
pub const FENCE_DISTANCE: u32 = 1 << 30;

/// The fence of a subscriber whose newest FMTP index seen is `newest`.
pub fn fence_index(newest: McastProdIndex) -> McastProdIndex {
    newest.wrapping_add(FENCE_DISTANCE)
}

/// Whether a REQUEST_PRODUCT of `index` is a fence for a publisher whose next product index
/// is `next`: an index it has not multicast yet (`index` at or after `next`, in serial
/// arithmetic). Every product a subscriber can ask for was multicast before, with an index
/// before `next`.
pub fn is_fence(index: McastProdIndex, next: McastProdIndex) -> bool {
    index.wrapping_sub(next) < 1 << 31
}

/// `server` (`host:port`, `[v6]:port`) with a host `0.0.0.0` replaced by `upstream_host`
/// (§2.2 step 3); other addresses unchanged.
pub fn substitute_unspecified_host(server: &str, upstream_host: &str) -> String {
    match server.rsplit_once(':') {
        Some(("0.0.0.0", port)) if upstream_host.contains(':') => format!("[{upstream_host}]:{port}"),
        Some(("0.0.0.0", port)) => format!("{upstream_host}:{port}"),
        _ => server.to_owned(),
    }
}

impl Receiving7 for Subscriber {
    fn peer(&mut self) -> &mut Peer {
        &mut self.peer
    }

    fn closed(&self) -> bool {
        matches!(self.state, State::Closed)
    }

    fn awaited_reply(&self) -> Option<u32> {
        match self.state {
            State::Subscribing { xid, .. } => Some(xid),
            _ => None,
        }
    }

    fn on_reply(&mut self, _now: Instant, reply: Reply) -> Result<(), SessionError> {
        match reply.body {
            ReplyBody::Subscribe(SubscriptionReply::Ok(mut info)) => {
                if let Some(host) = &self.config.upstream_host {
                    info.mcast_info.server = substitute_unspecified_host(&info.mcast_info.server, host);
                }
                self.state = State::Subscribed;
                self.events.push_back(SubscriberEvent::Subscribed { info });
            }
            ReplyBody::Subscribe(SubscriptionReply::Refused(status)) => {
                self.events.push_back(SubscriberEvent::Refused { status });
                self.close(Ok(()));
            }
            other => {
                return Err(SessionError::Protocol(format!(
                    "the upstream answered SUBSCRIBE with {other:?}: it does not serve LDM-7 multicast to this host"
                )));
            }
        }
        Ok(())
    }

    fn on_call(&mut self, now: Instant, call: Call) -> Result<(), SessionError> {
        if !matches!(self.state, State::Subscribed) {
            return Err(SessionError::Protocol(format!("{} before the SUBSCRIBE reply", call.call.proc())));
        }
        match call.call {
            Ldm7Call::DeliverMissedProduct(missed) => {
                if self.answers_fence(missed.index) {
                    // The upstream had a product at the fence's index after all (the reference
                    // looks only in its map): a product of the feed, kept as backlog.
                    let product = missed.product;
                    self.events.push_back(SubscriberEvent::BacklogProduct { product });
                } else if self.answers_oldest(Proc::DeliverMissedProduct, missed.index) {
                    let event = SubscriberEvent::MissedProduct { index: missed.index, product: missed.product };
                    self.events.push_back(event);
                }
            }
            Ldm7Call::NoSuchProduct(index) => {
                if self.answers_fence(index) {
                    // The backlog is complete; nothing else to say.
                } else if self.answers_oldest(Proc::NoSuchProduct, index) {
                    self.events.push_back(SubscriberEvent::NoSuchProduct { index });
                }
            }
            Ldm7Call::DeliverBacklogProduct(product) => {
                self.events.push_back(SubscriberEvent::BacklogProduct { product })
            }
            Ldm7Call::EndBacklog => self.end_backlog(),
            Ldm7Call::TestConnection => {}
            other => self.unserved_proc(now, call.xid, other.proc()),
        }
        Ok(())
    }

    fn on_unserved(&mut self, what: String) {
        self.unserved += 1;
        self.events.push_back(SubscriberEvent::Unserved(what));
    }

    fn close(&mut self, result: Result<(), SessionError>) {
        self.state = State::Closed;
        self.events.push_back(SubscriberEvent::Closed(result));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_lie_ahead_of_every_multicast_index() {
        assert!(is_fence(fence_index(41), 42));
        assert!(is_fence(42, 42), "the next index is not multicast yet");
        assert!(!is_fence(41, 42));
        assert!(!is_fence(0, 42));
        // Across the wrap.
        assert!(is_fence(fence_index(u32::MAX - 1), u32::MAX));
        assert!(!is_fence(u32::MAX - 5, 3));
    }

    #[test]
    fn only_an_unspecified_server_host_is_substituted() {
        assert_eq!(substitute_unspecified_host("0.0.0.0:42263", "10.77.0.1"), "10.77.0.1:42263");
        assert_eq!(substitute_unspecified_host("0.0.0.0:1", "up.example.edu"), "up.example.edu:1");
        assert_eq!(substitute_unspecified_host("0.0.0.0:1", "fd00::1"), "[fd00::1]:1");
        assert_eq!(substitute_unspecified_host("10.77.0.1:42263", "other"), "10.77.0.1:42263");
        assert_eq!(substitute_unspecified_host("[::]:5", "other"), "[::]:5");
    }
}
