//! The LDM-7 subscriber's decisions, sans-IO: what a RECEIVE asks its upstream for and when
//! (ldm7-multicast.md §2.2–§2.4). The server's driver (`ldm7_server::multicast::downstream7`)
//! feeds it what the control session ([`crate::Subscriber`]), the FMTP receiver and the
//! inserter report, applies the [`UpstreamRequest`]s it makes on the control session, and keeps the
//! resume point in a file. Time is an argument; nothing here reads a clock.
//!
//! The decisions:
//!
//! 1. **Backstop**: a product FMTP reports missed (or one the inserter found unusable) is asked
//!    for with REQUEST_PRODUCT; a jump of the product index asks for each index skipped (at
//!    most [`INDEX_GAP_REQUESTS_MAX`]).
//! 2. **Backlog** (§2.4): when the session's first FMTP product (the receiver's first index) is
//!    resolved — delivered by FMTP, or answered through the backstop — it asks for the backlog
//!    from just after the resume point (or `time_offset` back without one) up to that product
//!    ([`BacklogStart`]; the reference asks at the first product delivered, which for a lossy
//!    subscriber is often a later one). Only when no FMTP datagram at all arrives for
//!    [`FIRST_QUIET`] after the repair connection (a quiet feed), or nothing resolves for
//!    [`BACKLOG_WAIT`], does it ask up to the upstream's newest product: products the multicast
//!    is still carrying would otherwise come twice.
//! 3. **Fences**: each REQUEST_BACKLOG goes with a fence far ahead of the newest FMTP index seen
//!    (the control session sends it; a reference publisher, which never sends END_BACKLOG,
//!    answers it with NO_SUCH_PRODUCT after the backlog's last product). A backlog asked before
//!    any index was known gets its fence with the first index ([`UpstreamRequest::FenceBacklogs`]).
//! 4. **Tail check** ([`TailCheck`]): when the feed goes quiet (no FMTP message, multicast or
//!    repair, for [`TAIL_QUIET`], no product in FMTP's hands) and the session's backlog is
//!    complete, it asks for anything after the product of the highest FMTP index delivered
//!    (not the last delivery: one repaired late comes after newer ones), once per such product:
//!    FMTP learns of a product lost whole only from a newer one, so the end of a burst would
//!    otherwise wait for the next product.
//! 5. **Resume point** ([`ResumePoint`]): the newest product before which nothing is missing —
//!    the end of the session's resolved prefix of FMTP indexes, moved only once the session's
//!    own backlog is complete. (The reference keeps the last product received by multicast; a
//!    product still being repaired, or fetched through the backstop, when the session dies
//!    would then never arrive.)
//! 6. **Resubscription**: a session that ended (refused, connection lost, the receiver failed)
//!    is started again after a back-off doubling from `retry_min` to `retry_max`, reset after a
//!    session that lasted longer than `retry_max`; the first failure of an outage is to be
//!    logged as a warning, the retries quietly, and the resubscription once it succeeds.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use ldm7_types::backoff::Backoff;
use ldm7_types::{Instant, Signature};

use crate::{BacklogSpec, fence_index};

/// How long the feed must be quiet (no FMTP notice) before the subscriber checks for products
/// lost whole at its end.
pub const TAIL_QUIET: Duration = Duration::from_secs(2);
/// How long after the repair connection a feed that brought no datagram counts as quiet (the
/// backlog is then asked up to the newest product). Longer than a restarted publisher's
/// catch-up wait (`catch_up_wait`, 1.5 s), with room for a loaded host: at 2 s, a subscriber
/// back from a publisher restart on a busy machine took the catch-up's first seconds as a quiet
/// feed and fetched those products by its backlog too.
pub const FIRST_QUIET: Duration = Duration::from_secs(5);
/// How far back a tail check reaches if the upstream no longer has the newest product.
pub const TAIL_OFFSET: Duration = Duration::from_secs(60);
/// How long after the FMTP connection the subscriber waits for a first product with its
/// signature before it asks for the backlog up to the newest product anyway: the default
/// retransmission deadline, by which every product FMTP started on has been delivered or
/// reported missed (and fetched through the backstop).
pub const BACKLOG_WAIT: Duration = Duration::from_secs(300);
/// Most products asked for one jump of the product index.
pub const INDEX_GAP_REQUESTS_MAX: u32 = 100_000;
/// Bound: resolved products remembered beyond the resume prefix (it holds when one product
/// stays unresolved for long).
pub const RESUME_RESOLVED_MAX: usize = 1 << 20;

/// What a RECEIVE is configured with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Downstream7Config {
    /// Without a resume point, the backlog starts this long back.
    pub time_offset: Duration,
    /// The first resubscription delay.
    pub retry_min: Duration,
    /// The longest resubscription delay.
    pub retry_max: Duration,
}

/// Why a backlog is asked for (the driver logs it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BacklogReason {
    /// The session's first FMTP product is resolved: the backlog ends before it.
    BeforeFirst,
    /// A quiet feed, or nothing resolved for [`BACKLOG_WAIT`]: up to the newest product.
    UpToNewest,
    /// The tail check: anything after the newest product FMTP brought.
    Tail,
}

/// What the driver is to do on the control session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpstreamRequest {
    /// REQUEST_PRODUCT of this FMTP index (the backstop).
    RequestProduct(u32),
    /// REQUEST_BACKLOG with `spec`, fenced at `fence` when an index is known.
    RequestBacklog {
        /// The request.
        spec: BacklogSpec,
        /// The fence's index (`None`: no FMTP index known yet; [`UpstreamRequest::FenceBacklogs`]
        /// follows with the first).
        fence: Option<u32>,
        /// Why.
        reason: BacklogReason,
    },
    /// Fence the backlogs asked before any FMTP index was known, at this index.
    FenceBacklogs(u32),
}

/// What FMTP reported, as far as the decisions go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FmtpReport {
    /// The receiver's repair connection is up.
    Connected,
    /// The receiver's first multicast message was for this index.
    Started(u32),
    /// A product delivered (with the signature its BOP metadata carries, if any).
    Delivered(u32, Option<Signature>),
    /// A product FMTP gave up on.
    Missed(u32),
    /// Indexes skipped by a jump of the product index, both ends included.
    IndexGap(u32, u32),
    /// Anything else (a bound hit, a protocol event): activity only.
    Other,
}

/// FMTP's traffic at a look: messages received so far (multicast and repairs) and products in
/// its hands.
pub type Traffic = Option<(u64, u64)>;

/// How a session's end is to be handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resubscribe {
    /// Wait this long before the next session.
    pub delay: Duration,
    /// Whether this end starts an outage (log it as a warning; later ones quietly).
    pub outage_starts: bool,
}

/// One RECEIVE's decisions, across its sessions.
#[derive(Debug)]
pub struct Downstream7 {
    config: Downstream7Config,
    resume: ResumePoint,
    backoff: Backoff,
    in_outage: bool,
    session: SessionState,
    decisions: VecDeque<UpstreamRequest>,
}

/// What one session decides by.
#[derive(Debug, Default)]
struct SessionState {
    started: Option<Instant>,
    /// Where this session's backlog starts (the resume point at its start).
    backlog_after: Option<Signature>,
    backlog_start: BacklogStart,
    tail: TailCheck,
    /// The newest FMTP index seen: backlog fences go far ahead of it.
    newest_index: Option<u32>,
    /// A backlog was asked before any index was known.
    unfenced: bool,
}

impl Downstream7 {
    /// A RECEIVE whose saved resume point is `saved`.
    pub fn new(config: Downstream7Config, saved: Option<Signature>) -> Self {
        let backoff = Backoff::new(config.retry_min, config.retry_max);
        Self {
            config,
            resume: ResumePoint::new(saved),
            backoff,
            in_outage: false,
            session: SessionState::default(),
            decisions: VecDeque::new(),
        }
    }

    /// A session starts (the control connection is being made).
    pub fn session_started(&mut self, now: Instant) {
        let backlog_after = self.resume.session_started();
        self.session = SessionState { started: Some(now), backlog_after, ..SessionState::default() };
        self.decisions.clear();
    }

    /// The upstream answered SUBSCRIBE with OK; `true` when this ends an outage (log the
    /// resubscription).
    pub fn subscribed(&mut self) -> bool {
        std::mem::take(&mut self.in_outage)
    }

    /// The session ended at `now` (not because the server stops): when to start the next.
    pub fn session_ended(&mut self, now: Instant) -> Resubscribe {
        let outage_starts = !std::mem::replace(&mut self.in_outage, true);
        if self.session.started.is_some_and(|started| now.saturating_duration_since(started) > self.backoff.max()) {
            self.backoff.reset();
        }
        let delay = self.backoff.next_delay(now).unwrap_or(self.config.retry_max);
        Resubscribe { delay, outage_starts }
    }

    /// Whether the RECEIVE is between a failed session and a working one.
    pub fn in_outage(&self) -> bool {
        self.in_outage
    }

    /// FMTP reported something at `now`, its traffic then being `traffic`.
    pub fn fmtp(&mut self, now: Instant, report: FmtpReport, traffic: Traffic) {
        let session = &mut self.session;
        let mut before = None;
        match report {
            FmtpReport::Connected => session.backlog_start.connected(now),
            FmtpReport::Started(index) => {
                session.backlog_start.started(index);
                self.resume.seen(index);
            }
            FmtpReport::Delivered(index, signature) => {
                before = session.backlog_start.resolved(index, signature);
                self.resume.seen(index);
            }
            FmtpReport::Missed(index) => {
                self.resume.seen(index);
                self.decisions.push_back(UpstreamRequest::RequestProduct(index));
            }
            FmtpReport::IndexGap(first, last) => {
                self.resume.seen(first);
                let count = last.wrapping_sub(first).wrapping_add(1);
                for offset in 0..count.min(INDEX_GAP_REQUESTS_MAX) {
                    self.decisions.push_back(UpstreamRequest::RequestProduct(first.wrapping_add(offset)));
                }
            }
            FmtpReport::Other => {}
        }
        session.tail.activity(now, traffic);
        let index = match report {
            FmtpReport::Started(index) | FmtpReport::Delivered(index, _) | FmtpReport::Missed(index) => Some(index),
            FmtpReport::IndexGap(_, last) => Some(last),
            FmtpReport::Connected | FmtpReport::Other => None,
        };
        if let Some(index) = index {
            let first = session.newest_index.is_none();
            if session.newest_index.is_none_or(|newest| index.wrapping_sub(newest) < 1 << 31) {
                session.newest_index = Some(index);
            }
            if first && std::mem::take(&mut session.unfenced) {
                self.decisions.push_back(UpstreamRequest::FenceBacklogs(fence_index(index)));
            }
        }
        if let Some(before) = before {
            self.ask_backlog(Some(before), BacklogReason::BeforeFirst);
        }
    }

    /// The backstop brought product `index` (with its signature).
    pub fn backstop_delivered(&mut self, index: u32, signature: Signature) {
        self.resume.resolved(index, Some(signature));
        if let Some(before) = self.session.backlog_start.resolved(index, Some(signature)) {
            self.ask_backlog(Some(before), BacklogReason::BeforeFirst);
        }
    }

    /// The upstream no longer has product `index` (NO_SUCH_PRODUCT): given up.
    pub fn no_such_product(&mut self, index: u32) {
        self.resume.resolved(index, None);
        self.session.backlog_start.resolved(index, None);
    }

    /// The session's backlog is complete (END_BACKLOG or its fence); `true` when it was a tail
    /// check's (log it quietly).
    pub fn backlog_complete(&mut self) -> bool {
        self.resume.backlog_complete();
        self.session.tail.backlog_done = true;
        std::mem::take(&mut self.session.tail.asked)
    }

    /// The inserter put product `index` (delivered by FMTP) into the queue.
    pub fn inserted(&mut self, index: u32, signature: Signature) {
        self.resume.resolved(index, Some(signature));
        self.session.tail.received(index, signature);
    }

    /// The inserter found FMTP product `index` unusable: asked for through the backstop.
    pub fn unusable(&mut self, index: u32) {
        self.decisions.push_back(UpstreamRequest::RequestProduct(index));
    }

    /// When [`Downstream7::handle_timeout`] is due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        [self.session.backlog_start.due(), self.session.tail.due()].into_iter().flatten().min()
    }

    /// Time passed to `now`; FMTP's traffic is `traffic`.
    pub fn handle_timeout(&mut self, now: Instant, traffic: Traffic) {
        if self.session.backlog_start.expired(now) {
            self.ask_backlog(None, BacklogReason::UpToNewest);
        }
        if self.session.tail.due().is_some_and(|due| now >= due)
            && let Some(after) = self.session.tail.ask(now, traffic)
        {
            let spec = BacklogSpec {
                after,
                after_is_set: true,
                before: Signature([0; 16]),
                time_offset_secs: u32::try_from(TAIL_OFFSET.as_secs()).unwrap_or(u32::MAX),
            };
            self.push_backlog(spec, BacklogReason::Tail);
        }
    }

    /// The next decision to apply.
    pub fn poll_decision(&mut self) -> Option<UpstreamRequest> {
        self.decisions.pop_front()
    }

    /// The resume point, when it moved since [`Downstream7::resume_saved`] (save it).
    pub fn resume_to_save(&self) -> Option<Signature> {
        self.resume.to_save()
    }

    /// The resume point was saved.
    pub fn resume_saved(&mut self) {
        self.resume.saved();
    }

    /// REQUEST_BACKLOG from just after the session's resume point (or `time_offset` back) up
    /// to `before` (not sent), or the newest product.
    fn ask_backlog(&mut self, before: Option<Signature>, reason: BacklogReason) {
        let after = self.session.backlog_after;
        let spec = BacklogSpec {
            after: after.unwrap_or(Signature([0; 16])),
            after_is_set: after.is_some(),
            before: before.unwrap_or(Signature([0; 16])),
            time_offset_secs: u32::try_from(self.config.time_offset.as_secs()).unwrap_or(u32::MAX),
        };
        self.push_backlog(spec, reason);
    }

    fn push_backlog(&mut self, spec: BacklogSpec, reason: BacklogReason) {
        let fence = self.session.newest_index.map(fence_index);
        if fence.is_none() {
            self.session.unfenced = true;
        }
        self.decisions.push_back(UpstreamRequest::RequestBacklog { spec, fence, reason });
    }
}

/// The quiet-feed check: asked once per newest product, only after the session's backlog is
/// complete (END_BACKLOG or its fence: a new REQUEST_BACKLOG replaces one being sent), and
/// never while one is being answered.
#[derive(Debug, Default)]
struct TailCheck {
    backlog_done: bool,
    asked: bool,
    last_activity: Option<Instant>,
    /// The product of the highest FMTP index delivered: its index and signature.
    newest: Option<(u32, Signature)>,
    checked: Option<Signature>,
    /// FMTP messages received at the last notice or look.
    traffic: Option<u64>,
}

impl TailCheck {
    /// An FMTP notice came at `now`; `look` is the receiver's traffic then, so that a check at
    /// the due time can tell at once whether anything came since.
    fn activity(&mut self, now: Instant, look: Traffic) {
        self.last_activity = Some(now);
        self.traffic = look.map(|(messages, _)| messages);
    }

    /// Product `index` was delivered. The check asks after the highest index delivered, not
    /// the last delivery: a product repaired late comes after newer ones, and asking after it
    /// would bring those newer ones again through the backlog.
    fn received(&mut self, index: u32, signature: Signature) {
        if self.newest.is_none_or(|(newest, _)| index.wrapping_sub(newest) < 1 << 31) {
            self.newest = Some((index, signature));
        }
    }

    /// When to check, if a check is wanted.
    fn due(&self) -> Option<Instant> {
        if !self.backlog_done || self.asked || self.newest.is_none() || self.newest.map(|(_, s)| s) == self.checked {
            return None;
        }
        self.last_activity.map(|at| at + TAIL_QUIET)
    }

    /// At the due time, with FMTP's traffic: marks the check asked and returns the product to
    /// ask after — unless messages arrived since the last look or products are in flight (they
    /// are still coming, or being repaired over a stalled connection, and FMTP resolves them
    /// itself: not quiet; look again later).
    fn ask(&mut self, now: Instant, look: Traffic) -> Option<Signature> {
        let traffic = look.map(|(messages, _)| messages);
        let in_flight = look.is_some_and(|(_, in_flight)| in_flight > 0);
        if traffic != self.traffic || in_flight {
            self.activity(now, look);
            return None;
        }
        let (_, newest) = self.newest?;
        self.asked = true;
        self.checked = Some(newest);
        Some(newest)
    }
}

/// When a session asks for its backlog: once, when the session's first FMTP product (the
/// receiver's first index) is resolved, or, if that one is no longer to be had, at the next
/// product resolved with its signature; up to the newest product when the feed is quiet (no
/// FMTP datagram for [`FIRST_QUIET`] after the connection) or nothing has resolved after
/// [`BACKLOG_WAIT`].
#[derive(Debug, Default)]
struct BacklogStart {
    asked: bool,
    connected_at: Option<Instant>,
    /// The receiver's first index (known once a multicast message has arrived).
    first: Option<u32>,
    /// Whether the product at `first` is resolved.
    first_resolved: bool,
}

impl BacklogStart {
    /// The FMTP repair connection is up: the waits start.
    fn connected(&mut self, now: Instant) {
        self.connected_at.get_or_insert(now);
    }

    /// The receiver's first multicast message was for product `index`.
    fn started(&mut self, index: u32) {
        self.first.get_or_insert(index);
    }

    /// Product `index` is resolved (with its signature, unless the upstream no longer had it):
    /// the product to end the backlog before, if the backlog is to be asked now.
    fn resolved(&mut self, index: u32, signature: Option<Signature>) -> Option<Signature> {
        if self.asked {
            return None;
        }
        if self.first.is_none_or(|first| first == index) {
            self.first_resolved = true;
        }
        let before = signature.filter(|_| self.first_resolved)?;
        self.asked = true;
        Some(before)
    }

    /// When to ask up to the newest product: [`FIRST_QUIET`] after the connection while no
    /// multicast message has come, [`BACKLOG_WAIT`] after it once one has.
    fn due(&self) -> Option<Instant> {
        let connected_at = self.connected_at.filter(|_| !self.asked)?;
        Some(connected_at + if self.first.is_some() { BACKLOG_WAIT } else { FIRST_QUIET })
    }

    /// Whether to ask for the backlog up to the newest product at `now`.
    fn expired(&mut self, now: Instant) -> bool {
        match self.due() {
            Some(due) if now >= due => {
                self.asked = true;
                true
            }
            _ => false,
        }
    }
}

/// The resume point of a RECEIVE: the newest product before which nothing is missing.
///
/// Within a session, products are tracked by FMTP index from the first index the session saw:
/// the prefix `first..next` is resolved (delivered by FMTP or the backstop, or given up when
/// the upstream no longer has it) and the point may move to the newest product of that prefix —
/// but only once the session's backlog is complete, since the backlog brings what came before
/// `first`. A product still in FMTP's hands or asked for through the backstop holds the prefix
/// (and so the point) below it.
#[derive(Debug)]
pub struct ResumePoint {
    /// Where the next session's backlog starts.
    point: Option<Signature>,
    /// Whether `point` moved since it was saved.
    dirty: bool,
    /// Whether this session's backlog is complete.
    backlog_complete: bool,
    /// The first FMTP index of this session.
    first: Option<u32>,
    /// Offset (from `first`) of the oldest unresolved index.
    next: u32,
    /// The newest product of the resolved prefix.
    prefix_end: Option<Signature>,
    /// Resolved indexes beyond the prefix, by offset (`None`: given up).
    resolved: BTreeMap<u32, Option<Signature>>,
}

impl ResumePoint {
    /// The point saved before (`None`: none yet).
    pub fn new(saved: Option<Signature>) -> Self {
        Self {
            point: saved,
            dirty: false,
            backlog_complete: false,
            first: None,
            next: 0,
            prefix_end: None,
            resolved: BTreeMap::new(),
        }
    }

    /// A session starts: returns where its backlog starts (the point so far).
    pub fn session_started(&mut self) -> Option<Signature> {
        self.backlog_complete = false;
        self.first = None;
        self.next = 0;
        self.prefix_end = None;
        self.resolved.clear();
        self.point
    }

    /// FMTP reported index `index` (delivered, missed, or the start of a gap): the session's
    /// first such index starts the prefix.
    pub fn seen(&mut self, index: u32) {
        if self.first.is_none() {
            self.first = Some(index);
        }
    }

    /// Index `index` is resolved: delivered (with its signature) or given up (`None`).
    pub fn resolved(&mut self, index: u32, signature: Option<Signature>) {
        self.seen(index);
        let Some(first) = self.first else { return };
        let offset = index.wrapping_sub(first);
        // Before the session's first index (serial arithmetic): the backlog covers it.
        if offset >= 1 << 31 || offset < self.next {
            return;
        }
        if self.resolved.len() >= RESUME_RESOLVED_MAX {
            // The prefix is stuck on one product: forget the newest; the point only lags more.
            self.resolved.pop_last();
        }
        self.resolved.insert(offset, signature);
        while let Some(signature) = self.resolved.remove(&self.next) {
            if signature.is_some() {
                self.prefix_end = signature;
            }
            self.next += 1;
        }
        self.advance();
    }

    /// The session's backlog is complete: the point may move.
    pub fn backlog_complete(&mut self) {
        self.backlog_complete = true;
        self.advance();
    }

    /// The point, when it moved since it was last saved.
    pub fn to_save(&self) -> Option<Signature> {
        self.point.filter(|_| self.dirty)
    }

    /// The point was saved.
    pub fn saved(&mut self) {
        self.dirty = false;
    }

    /// The point now.
    pub fn point(&self) -> Option<Signature> {
        self.point
    }

    fn advance(&mut self) {
        if self.backlog_complete && self.prefix_end.is_some() && self.point != self.prefix_end {
            self.point = self.prefix_end;
            self.dirty = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signature(n: u8) -> Signature {
        Signature([n; 16])
    }

    #[test]
    fn the_tail_is_checked_only_when_no_fmtp_message_came_since_the_last_look() {
        let now = Instant::from_nanos(1_000_000_000);
        let mut tail = TailCheck { backlog_done: true, ..TailCheck::default() };
        tail.activity(now, Some((90, 1)));
        assert_eq!(tail.due(), None, "nothing received yet");
        tail.received(3, signature(3));
        assert_eq!(tail.due(), Some(now + TAIL_QUIET));
        assert_eq!(tail.ask(now, Some((100, 0))), None, "messages since the last notice: repairs still coming");
        assert_eq!(tail.ask(now, Some((140, 0))), None);
        assert_eq!(tail.ask(now, Some((140, 2))), None, "no message, but two products in flight: FMTP resolves them");
        assert_eq!(tail.ask(now, Some((140, 0))), Some(signature(3)), "quiet: anything after the newest");
        assert_eq!(tail.due(), None, "once per newest product");
    }

    #[test]
    fn the_tail_is_checked_after_the_highest_index_delivered_not_the_last_delivery() {
        let now = Instant::from_nanos(1_000_000_000);
        let mut tail = TailCheck { backlog_done: true, ..TailCheck::default() };
        tail.activity(now, Some((10, 0)));
        tail.received(7, signature(7));
        tail.received(8, signature(8));
        // Product 6 was repaired and delivered after 7 and 8.
        tail.received(6, signature(6));
        assert_eq!(tail.ask(now, Some((10, 0))), Some(signature(8)), "after 8: 7 and 8 are not asked for again");
        // Across the index's wrap.
        let mut wrapping = TailCheck { backlog_done: true, ..TailCheck::default() };
        wrapping.activity(now, Some((10, 0)));
        wrapping.received(u32::MAX, signature(1));
        wrapping.received(0, signature(2));
        wrapping.received(u32::MAX - 1, signature(3));
        assert_eq!(wrapping.ask(now, Some((10, 0))), Some(signature(2)));
    }

    #[test]
    fn the_backlog_ends_before_the_sessions_first_product_or_reaches_the_newest_when_the_feed_is_quiet() {
        let start = Instant::from_nanos(1_000_000_000);
        let (a, b) = (Signature([1; 16]), Signature([2; 16]));
        let mut lossy = BacklogStart::default();
        assert_eq!(lossy.due(), None, "nothing before the FMTP connection");
        lossy.connected(start);
        assert_eq!(lossy.due(), Some(start + FIRST_QUIET));
        lossy.started(10);
        assert_eq!(lossy.due(), Some(start + BACKLOG_WAIT), "datagrams arrive: not quiet");
        assert!(!lossy.expired(start + FIRST_QUIET), "the first product is still being repaired");
        assert_eq!(lossy.resolved(12, Some(a)), None, "a later product first: 10 is still on its way");
        assert_eq!(lossy.resolved(10, Some(b)), Some(b), "the first product: the backlog ends before it");
        assert_eq!(lossy.resolved(11, Some(a)), None, "once");
        assert_eq!(lossy.due(), None);

        let mut gone = BacklogStart::default();
        gone.started(10);
        assert_eq!(gone.resolved(10, None), None, "the upstream no longer has it");
        assert_eq!(gone.resolved(11, Some(a)), Some(a), "the next one with its signature");

        let mut quiet = BacklogStart::default();
        quiet.connected(start);
        assert!(!quiet.expired(start));
        assert!(quiet.expired(start + FIRST_QUIET), "no datagram at all: up to the newest");
        assert_eq!(quiet.resolved(10, Some(a)), None, "already asked");

        let mut stuck = BacklogStart::default();
        stuck.connected(start);
        stuck.started(10);
        assert!(stuck.expired(start + BACKLOG_WAIT), "nothing resolved for long: up to the newest");
    }

    #[test]
    fn the_resume_point_is_the_end_of_the_resolved_prefix_after_the_backlog() {
        let mut resume = ResumePoint::new(None);
        assert_eq!(resume.session_started(), None);
        resume.seen(10);
        resume.resolved(12, Some(signature(12))); // 11 still in FMTP's hands
        resume.resolved(10, Some(signature(10)));
        assert_eq!(resume.point(), None, "not before the session's backlog is complete");
        resume.backlog_complete();
        assert_eq!(resume.point(), Some(signature(10)), "below 11, not yet resolved");
        resume.resolved(11, Some(signature(11)));
        assert_eq!(resume.point(), Some(signature(12)));
        resume.resolved(14, Some(signature(14)));
        resume.resolved(13, None); // the upstream no longer has it: given up
        assert_eq!(resume.point(), Some(signature(14)));
        assert_eq!(resume.to_save(), Some(signature(14)));
        resume.saved();
        // A new session keeps the point until its backlog is done.
        assert_eq!(resume.session_started(), Some(signature(14)));
        resume.resolved(20, Some(signature(20)));
        assert_eq!(resume.point(), Some(signature(14)));
        resume.backlog_complete();
        assert_eq!(resume.point(), Some(signature(20)));
    }
}
