//! LDM-6 sessions in virtual time, with proptest: pairs of sans-IO sessions talk through byte
//! pipes that deliver arbitrary fragments in arbitrary order of the two directions, while
//! virtual time advances by arbitrary steps and timeouts are called early, late and on time.
//!
//! Properties:
//! - FEEDME (primary and alternate), NOTIFYME and HIYA push: every product offered is received
//!   exactly once, in order, byte-exact (declined ones are reported to the sender instead), and
//!   no session closes (ldm6-protocol.md §6.1–§6.3).
//! - The timers of ldm6-protocol.md §7 fire at their times, never before: the turn-around probe (10 ms),
//!   the NULLPROC keep-alive 30 s after the last send and the flush right after catching up, the
//!   60 s call timeout, the 120 s first-call limit, the downstream's 300 s silence limit.
//! - No session panics on arbitrary bytes (raw, framed, or mutated valid records), in any
//!   state, whatever the driver answers and whenever it calls `handle_timeout`; a session reports
//!   at most one `Closed`, and nothing after it.

use std::collections::VecDeque;
use std::time::Duration;

use ldm7_ldm_proto::{
    Downstream, DownstreamConfig, DownstreamEvent, FeedMode, HiyaAnswer, INTERVAL, NotifyClient, NotifyEvent,
    PushClient, PushEvent, RequestAnswer, SessionError, Upstream, UpstreamEvent,
};
use ldm7_types::{FeedType, Instant, ProdClass, ProdInfo, Signature, Timestamp};
use ldm7_xdr::ldm::{LdmCall, Message, Proc, ReplyBody};
use proptest::prelude::*;

/// The synchronous-call timeout (§7).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// The pause between a FEEDME/NOTIFYME reply and the first data (§6.1, §7).
const TURN_AROUND: Duration = Duration::from_secs(1);
const TURN_AROUND_PROBE: Duration = Duration::from_millis(10);
/// How long a fresh connection may make no call (§7).
const FIRST_CALL_LIMIT: Duration = Duration::from_secs(120);
/// The downstream's silence limit (§7).
const SILENCE: Duration = Duration::from_secs(300);
/// Total virtual time a schedule may advance: under the call timeout, so that a delivery
/// property never meets a legitimate timeout.
const SCHEDULE_TIME_MAX: Duration = Duration::from_secs(50);

// ---------------------------------------------------------------------------------------------
// Delivery properties.

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn feedme_delivers_every_product_once_in_order(
        products in products_strategy(),
        alternate in any::<bool>(),
        accepts in prop::collection::vec(prop::bool::weighted(0.8), 24),
        schedule in schedule_strategy(),
        start in start_strategy(),
    ) {
        let mode = if alternate { FeedMode::Alternate } else { FeedMode::Primary };
        let mut feed = FeedPair::new(start, mode, &products, accepts);
        let mut net = Net::new(start);
        run(&mut net, &mut feed, &schedule);
        let expected: Vec<_> =
            products.iter().enumerate().filter(|(k, _)| !alternate || feed.accepts[*k]).map(|(_, p)| p.clone()).collect();
        let declined: Vec<_> = products
            .iter()
            .enumerate()
            .filter(|(k, _)| alternate && !feed.accepts[*k])
            .map(|(_, (info, _))| info.signature)
            .collect();
        prop_assert_eq!(&feed.received, &expected);
        prop_assert_eq!(&feed.declined, &declined);
        prop_assert!(!feed.up_closed && !feed.down_closed);
    }

    #[test]
    fn notifyme_delivers_every_notification_once_in_order(
        products in products_strategy(),
        schedule in schedule_strategy(),
        start in start_strategy(),
    ) {
        let mut pair = NotifyPair::new(start, &products);
        let mut net = Net::new(start);
        run(&mut net, &mut pair, &schedule);
        let expected: Vec<_> = products.iter().map(|(info, _)| info.clone()).collect();
        prop_assert_eq!(&pair.received, &expected);
        prop_assert!(!pair.closed);
    }

    #[test]
    fn hiya_push_delivers_every_product_once_in_order(
        products in products_strategy(),
        max_hereis in prop_oneof![Just(0u32), 0u32..6000, Just(u32::MAX)],
        accepts in prop::collection::vec(prop::bool::weighted(0.8), 24),
        schedule in schedule_strategy(),
        start in start_strategy(),
    ) {
        let mut pair = PushPair::new(start, &products, max_hereis, accepts);
        let mut net = Net::new(start);
        run(&mut net, &mut pair, &schedule);
        let announced = |info: &ProdInfo| info.size > max_hereis;
        let expected: Vec<_> = products
            .iter()
            .enumerate()
            .filter(|(k, (info, _))| !announced(info) || pair.accepts[*k])
            .map(|(_, p)| p.clone())
            .collect();
        let declined: Vec<_> = products
            .iter()
            .enumerate()
            .filter(|(k, (info, _))| announced(info) && !pair.accepts[*k])
            .map(|(_, (info, _))| info.signature)
            .collect();
        prop_assert_eq!(&pair.received, &expected);
        prop_assert_eq!(&pair.declined, &declined);
        prop_assert!(pair.flushed, "the NULLPROC flush was answered");
        prop_assert!(!pair.closed);
    }
}

// ---------------------------------------------------------------------------------------------
// Timer properties.

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The upstream's turn-around (a NULLPROC probe after 10 ms), its keep-alive 30 s after the last send, its flush
    /// right after catching up, and the downstream's 300 s silence limit, for arbitrary gaps
    /// between products.
    #[test]
    fn feeding_timers_fire_at_their_times(
        start in start_strategy(),
        gaps in prop::collection::vec((0u64..=70_000, any::<bool>()), 1..24),
    ) {
        let mut up = Upstream::new(start);
        let mut down = Downstream::new(start, DownstreamConfig::new(exp_class()));
        exchange(start, &mut up, &mut down);
        let Some(UpstreamEvent::FeedRequest { .. }) = up.poll_event() else { panic!("no FEEDME") };
        up.answer_request(start, RequestAnswer::Ok { id: 1 }).unwrap();
        exchange(start, &mut up, &mut down);
        prop_assert!(matches!(down.poll_event(), Some(DownstreamEvent::Accepted { .. })), "unexpected event");
        // Turn-around: the NULLPROC probe not a nanosecond early; its answer starts the feed
        // (without an answer the feed would start at the reference's 1 s).
        let probe_at = start + TURN_AROUND_PROBE;
        prop_assert_eq!(up.poll_timeout(), Some(probe_at));
        up.handle_timeout(before(probe_at));
        prop_assert!(up.poll_event().is_none() && !up.ready() && !up.has_output());
        up.handle_timeout(probe_at);
        let probe = output_of(&mut up);
        prop_assert_eq!(calls_in(&probe), vec![Proc::Nullproc]);
        prop_assert_eq!(up.poll_timeout(), Some(start + TURN_AROUND));
        down.handle_input(probe_at, &probe);
        up.handle_input(probe_at, &output_of(&mut down));
        prop_assert!(matches!(up.poll_event(), Some(UpstreamEvent::FeedStarted)), "unexpected event");
        let fed_at = probe_at;
        let (mut now, mut last_send, mut last_down_receive) = (fed_at, fed_at, probe_at);
        for (k, (gap_ms, send)) in gaps.into_iter().enumerate() {
            prop_assert!(up.ready());
            let keepalive_at = last_send + INTERVAL;
            prop_assert_eq!(up.poll_timeout(), Some(keepalive_at));
            prop_assert_eq!(down.poll_timeout(), Some(last_down_receive + SILENCE));
            let next = now + Duration::from_millis(gap_ms);
            if next >= keepalive_at {
                // Idle for the whole interval: nothing before it, one NULLPROC at it.
                if before(keepalive_at) >= now {
                    up.handle_timeout(before(keepalive_at));
                    prop_assert!(!up.has_output() && up.ready());
                }
                up.handle_timeout(keepalive_at);
                let keepalive = output_of(&mut up);
                prop_assert_eq!(calls_in(&keepalive), vec![Proc::Nullproc], "keep-alive at {}", keepalive_at);
                prop_assert!(!up.ready(), "the keep-alive waits for its reply");
                prop_assert_eq!(up.poll_timeout(), Some(keepalive_at + CALL_TIMEOUT));
                now = keepalive_at;
                down.handle_input(now, &keepalive);
                up.handle_input(now, &output_of(&mut down));
                prop_assert!(up.ready(), "the keep-alive's reply arrived");
                last_send = now;
                last_down_receive = now;
                continue;
            }
            now = next;
            up.handle_timeout(now); // early: must do nothing
            prop_assert!(!up.has_output());
            if send {
                let (info, data) = product(k as u32, 100 + k);
                up.send_product(now, &info, &data).unwrap();
                up.flush(now);
                // Caught up: the NULLPROC flush follows the product at once.
                let bytes = output_of(&mut up);
                prop_assert_eq!(calls_in(&bytes), vec![Proc::Hereis, Proc::Nullproc]);
                down.handle_input(now, &bytes);
                up.handle_input(now, &output_of(&mut down));
                prop_assert!(matches!(down.poll_event(), Some(DownstreamEvent::Product(p)) if p.info == info), "unexpected event");
                last_send = now;
                last_down_receive = now;
            } else {
                // Nothing new since the last flush: no second flush.
                up.flush(now);
                prop_assert!(!up.has_output());
            }
        }
        // The downstream gives up after 300 s of silence, not a nanosecond before.
        let silent_at = last_down_receive + SILENCE;
        down.handle_timeout(before(silent_at));
        prop_assert!(down.poll_event().is_none());
        down.handle_timeout(silent_at);
        prop_assert!(matches!(down.poll_event(), Some(DownstreamEvent::Closed(Err(SessionError::Silence(300))))), "unexpected event");
    }

    /// Every synchronous call times out 60 s after it was made (FEEDME, NOTIFYME, HIYA), a
    /// connection that makes no call is closed after 120 s, and a NOTIFYME client's silence limit
    /// counts from the last record received.
    #[test]
    fn call_and_idle_limits_fire_at_their_deadlines(
        start in start_strategy(),
        silence_s in 31u64..=900,
    ) {
        let deadline = start + CALL_TIMEOUT;
        let mut down = Downstream::new(start, DownstreamConfig::new(exp_class()));
        prop_assert_eq!(down.poll_timeout(), Some(deadline));
        down.handle_timeout(before(deadline));
        prop_assert!(down.poll_event().is_none());
        down.handle_timeout(deadline);
        prop_assert!(matches!(down.poll_event(), Some(DownstreamEvent::Closed(Err(SessionError::CallTimeout(_))))), "unexpected event");

        let mut push = PushClient::new(start, &exp_class());
        prop_assert_eq!(push.poll_timeout(), Some(deadline));
        push.handle_timeout(before(deadline));
        prop_assert!(push.poll_event().is_none());
        push.handle_timeout(deadline);
        prop_assert!(matches!(push.poll_event(), Some(PushEvent::Closed(Err(SessionError::CallTimeout(_))))), "unexpected event");

        let silence = Duration::from_secs(silence_s);
        let mut notify = NotifyClient::new(start, exp_class(), silence);
        prop_assert_eq!(notify.poll_timeout(), Some(deadline));
        notify.handle_timeout(before(deadline));
        prop_assert!(notify.poll_event().is_none());
        notify.handle_timeout(deadline);
        prop_assert!(matches!(notify.poll_event(), Some(NotifyEvent::Closed(Err(SessionError::CallTimeout(_))))), "unexpected event");

        // Accepted 10 s in: the silence limit counts from the reply.
        let mut notify = NotifyClient::new(start, exp_class(), silence);
        let mut up = Upstream::new(start);
        up.handle_input(start, &output_of(&mut notify));
        let Some(UpstreamEvent::NotifyRequest { .. }) = up.poll_event() else { panic!("no NOTIFYME") };
        let replied = start + Duration::from_secs(10);
        up.answer_request(replied, RequestAnswer::Ok { id: 1 }).unwrap();
        notify.handle_input(replied, &output_of(&mut up));
        prop_assert!(matches!(notify.poll_event(), Some(NotifyEvent::Accepted { .. })), "unexpected event");
        let silent_at = replied + silence;
        prop_assert_eq!(notify.poll_timeout(), Some(silent_at));
        notify.handle_timeout(before(silent_at));
        prop_assert!(notify.poll_event().is_none());
        notify.handle_timeout(silent_at);
        prop_assert!(matches!(notify.poll_event(), Some(NotifyEvent::Closed(Err(SessionError::Silence(_))))), "unexpected event");

        let mut idle = Upstream::new(start);
        let limit = start + FIRST_CALL_LIMIT;
        prop_assert_eq!(idle.poll_timeout(), Some(limit));
        idle.handle_timeout(before(limit));
        prop_assert!(idle.poll_event().is_none());
        idle.handle_timeout(limit);
        prop_assert!(matches!(idle.poll_event(), Some(UpstreamEvent::Closed(Err(SessionError::Silence(120))))), "unexpected event");
    }
}

// ---------------------------------------------------------------------------------------------
// No panic on arbitrary input.

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn no_session_panics_on_arbitrary_bytes(
        state in 0usize..SESSION_STATES,
        chunks in prop::collection::vec(garbage_strategy(), 1..6),
        timeouts in prop::collection::vec(0u64..200_000, 0..4),
        answers in prop::collection::vec(any::<bool>(), 8),
        start in start_strategy(),
    ) {
        let mut session = AnySession::in_state(state, start);
        let mut now = start;
        let mut answers = answers.into_iter().cycle();
        for (k, chunk) in chunks.iter().enumerate() {
            session.input(now, chunk);
            session.drain(now, &mut answers);
            if let Some(ms) = timeouts.get(k) {
                now = now + Duration::from_millis(*ms);
                session.timeout(now);
                session.drain(now, &mut answers);
            }
        }
        session.eof();
        session.drain(now, &mut answers);
        prop_assert!(session.closes <= 1, "one Closed at most, got {}", session.closes);
        prop_assert!(!session.event_after_close, "an event after Closed");
    }
}

/// Found by `no_session_panics_on_arbitrary_bytes`: a push client (or a feeding upstream) closed
/// by a malformed record while a call was outstanding reported a second `Closed` when its call's
/// deadline passed.
#[test]
fn regression_closed_session_with_a_call_outstanding_ignores_its_deadline() {
    let start = Instant::from_nanos(0);
    // A record header one byte over the limit.
    let too_big = [0x10, 0x00, 0x10, 0x01];
    let mut push = PushClient::new(start, &exp_class());
    push.handle_input(start, &too_big);
    assert!(matches!(push.poll_event(), Some(PushEvent::Closed(Err(SessionError::Malformed(_))))));
    assert_eq!(push.poll_timeout(), None);
    push.handle_timeout(start + CALL_TIMEOUT);
    assert!(push.poll_event().is_none());

    let mut up = AnySession::in_state(2, start);
    let Session::Upstream(up) = &mut up.session else { unreachable!("state 2 is an upstream") };
    assert!(!up.ready(), "the COMINGSOON awaits its reply");
    up.handle_input(start, &too_big);
    assert!(matches!(up.poll_event(), Some(UpstreamEvent::Closed(Err(SessionError::Malformed(_))))));
    assert_eq!(up.poll_timeout(), None);
    up.handle_timeout(start + CALL_TIMEOUT + TURN_AROUND);
    assert!(up.poll_event().is_none());
}

// ---------------------------------------------------------------------------------------------
// The virtual network.

/// One side of a connection as the network sees it.
trait Endpoint {
    fn input(&mut self, now: Instant, bytes: &[u8]);
    fn output(&mut self, into: &mut Vec<u8>);
    fn next_timeout(&self) -> Option<Instant>;
    fn timeout(&mut self, now: Instant);
}

macro_rules! endpoint {
    ($($session:ty),*) => {$(
        impl Endpoint for $session {
            fn input(&mut self, now: Instant, bytes: &[u8]) {
                self.handle_input(now, bytes);
            }
            fn output(&mut self, into: &mut Vec<u8>) {
                self.take_output(into);
            }
            fn next_timeout(&self) -> Option<Instant> {
                self.poll_timeout()
            }
            fn timeout(&mut self, now: Instant) {
                self.handle_timeout(now);
            }
        }
    )*};
}
endpoint!(Upstream, Downstream, NotifyClient, PushClient);

/// Two sessions and the application logic around them (the drivers' decisions).
trait Pair {
    fn a(&mut self) -> &mut dyn Endpoint;
    fn b(&mut self) -> &mut dyn Endpoint;
    /// Drains both sessions' events and acts on them (answers, sends while ready).
    fn drive(&mut self, now: Instant);
    /// Whether everything the property waits for has happened.
    fn done(&self) -> bool;
}

/// One step of an arbitrary schedule.
#[derive(Clone, Debug)]
enum Step {
    /// Deliver at most this many bytes from A to B.
    AToB(usize),
    /// Deliver at most this many bytes from B to A.
    BToA(usize),
    /// Let virtual time pass, then fire the timers that are due.
    Advance(Duration),
    /// Call a side's `handle_timeout` whether or not anything is due (true: A).
    EarlyTimeout(bool),
}

fn schedule_strategy() -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        4 => (1usize..=3000).prop_map(Step::AToB),
        4 => (1usize..=3000).prop_map(Step::BToA),
        2 => (0u64..=4_000).prop_map(|ms| Step::Advance(Duration::from_millis(ms))),
        1 => any::<bool>().prop_map(Step::EarlyTimeout),
    ];
    prop::collection::vec(step, 0..120)
}

fn start_strategy() -> impl Strategy<Value = Instant> {
    (0u64..=1_000_000_000_000_000).prop_map(Instant::from_nanos)
}

/// Bytes in flight both ways, and virtual time.
struct Net {
    now: Instant,
    a_to_b: VecDeque<u8>,
    b_to_a: VecDeque<u8>,
    advanced: Duration,
}

impl Net {
    fn new(start: Instant) -> Self {
        Self { now: start, a_to_b: VecDeque::new(), b_to_a: VecDeque::new(), advanced: Duration::ZERO }
    }

    fn collect(&mut self, pair: &mut dyn Pair) {
        let mut bytes = Vec::new();
        pair.a().output(&mut bytes);
        self.a_to_b.extend(bytes.drain(..));
        pair.b().output(&mut bytes);
        self.b_to_a.extend(bytes);
    }

    /// Moves at most `max` bytes; returns whether any moved.
    fn deliver(&mut self, pair: &mut dyn Pair, to_b: bool, max: usize) -> bool {
        let queue = if to_b { &mut self.a_to_b } else { &mut self.b_to_a };
        let n = max.min(queue.len());
        if n == 0 {
            return false;
        }
        let chunk: Vec<u8> = queue.drain(..n).collect();
        if to_b {
            pair.b().input(self.now, &chunk)
        } else {
            pair.a().input(self.now, &chunk)
        }
        true
    }

    fn fire_due(&mut self, pair: &mut dyn Pair) {
        let now = self.now;
        if pair.a().next_timeout().is_some_and(|at| at <= now) {
            pair.a().timeout(now);
        }
        if pair.b().next_timeout().is_some_and(|at| at <= now) {
            pair.b().timeout(now);
        }
    }
}

/// Runs the schedule, then lets the pair finish with whole deliveries (advancing time only to
/// the next timer when nothing else can happen).
fn run(net: &mut Net, pair: &mut dyn Pair, schedule: &[Step]) {
    pair.drive(net.now);
    for step in schedule {
        net.collect(pair);
        match step {
            Step::AToB(max) => {
                net.deliver(pair, true, *max);
            }
            Step::BToA(max) => {
                net.deliver(pair, false, *max);
            }
            Step::Advance(by) => {
                if net.advanced + *by <= SCHEDULE_TIME_MAX {
                    net.advanced += *by;
                    net.now = net.now + *by;
                    net.fire_due(pair);
                }
            }
            Step::EarlyTimeout(a) => {
                let now = net.now;
                if *a { pair.a().timeout(now) } else { pair.b().timeout(now) }
            }
        }
        pair.drive(net.now);
    }
    for _ in 0..10_000 {
        if pair.done() {
            return;
        }
        net.collect(pair);
        let moved = net.deliver(pair, true, usize::MAX) | net.deliver(pair, false, usize::MAX);
        if !moved {
            // Only a timer can move things on (the turn-around): go to the earliest one.
            let next = [pair.a().next_timeout(), pair.b().next_timeout()].into_iter().flatten().min();
            let Some(next) = next else { panic!("stuck: nothing in flight and no timer") };
            net.now = net.now.max(next);
            net.fire_due(pair);
        }
        pair.drive(net.now);
    }
    panic!("no progress after 10,000 rounds");
}

// ---------------------------------------------------------------------------------------------
// The pairs.

/// An upstream feeding a downstream (FEEDME), primary or alternate.
struct FeedPair {
    up: Upstream,
    down: Downstream,
    products: Vec<(ProdInfo, Vec<u8>)>,
    next: usize,
    /// The downstream's answer to the k-th COMINGSOON (cycled).
    accepts: Vec<bool>,
    comingsoons: usize,
    feeding: bool,
    received: Vec<(ProdInfo, Vec<u8>)>,
    declined: Vec<Signature>,
    up_closed: bool,
    down_closed: bool,
}

impl FeedPair {
    fn new(start: Instant, mode: FeedMode, products: &[(ProdInfo, Vec<u8>)], accepts: Vec<bool>) -> Self {
        let mut config = DownstreamConfig::new(exp_class());
        config.mode = mode;
        let accepts = (0..products.len()).map(|k| accepts[k % accepts.len()]).collect();
        Self {
            up: Upstream::new(start),
            down: Downstream::new(start, config),
            products: products.to_vec(),
            next: 0,
            accepts,
            comingsoons: 0,
            feeding: false,
            received: Vec::new(),
            declined: Vec::new(),
            up_closed: false,
            down_closed: false,
        }
    }
}

impl Pair for FeedPair {
    fn a(&mut self) -> &mut dyn Endpoint {
        &mut self.up
    }
    fn b(&mut self) -> &mut dyn Endpoint {
        &mut self.down
    }
    fn drive(&mut self, now: Instant) {
        while let Some(event) = self.up.poll_event() {
            match event {
                UpstreamEvent::FeedRequest { .. } => self.up.answer_request(now, RequestAnswer::Ok { id: 7 }).unwrap(),
                UpstreamEvent::FeedStarted => self.feeding = true,
                UpstreamEvent::Declined { signature } => self.declined.push(signature),
                UpstreamEvent::Closed(result) => panic!("upstream closed: {result:?}"),
                other => panic!("unexpected upstream event {other:?}"),
            }
        }
        while let Some(event) = self.down.poll_event() {
            match event {
                DownstreamEvent::Accepted { id: 7, .. } => {}
                DownstreamEvent::Product(product) => self.received.push((product.info, product.data.to_vec())),
                DownstreamEvent::ComingSoon { abandoned: None, .. } => {
                    let accept = self.accepts[self.comingsoons];
                    self.comingsoons += 1;
                    self.down.answer_coming_soon(now, accept).unwrap();
                }
                DownstreamEvent::Closed(result) => panic!("downstream closed: {result:?}"),
                other => panic!("unexpected downstream event {other:?}"),
            }
        }
        if self.feeding {
            while self.up.ready() && self.next < self.products.len() {
                let (info, data) = &self.products[self.next];
                self.up.send_product(now, info, data).unwrap();
                self.next += 1;
            }
            if self.next == self.products.len() {
                self.up.flush(now);
            }
        }
        self.up_closed |= self.up.is_closed();
    }
    fn done(&self) -> bool {
        self.feeding
            && self.next == self.products.len()
            && self.received.len() + self.declined.len() == self.products.len()
            && self.up.ready()
    }
}

/// An upstream notifying a NOTIFYME client.
struct NotifyPair {
    up: Upstream,
    client: NotifyClient,
    infos: Vec<ProdInfo>,
    next: usize,
    feeding: bool,
    received: Vec<ProdInfo>,
    closed: bool,
}

impl NotifyPair {
    fn new(start: Instant, products: &[(ProdInfo, Vec<u8>)]) -> Self {
        Self {
            up: Upstream::new(start),
            client: NotifyClient::new(start, exp_class(), SILENCE),
            infos: products.iter().map(|(info, _)| info.clone()).collect(),
            next: 0,
            feeding: false,
            received: Vec::new(),
            closed: false,
        }
    }
}

impl Pair for NotifyPair {
    fn a(&mut self) -> &mut dyn Endpoint {
        &mut self.up
    }
    fn b(&mut self) -> &mut dyn Endpoint {
        &mut self.client
    }
    fn drive(&mut self, now: Instant) {
        while let Some(event) = self.up.poll_event() {
            match event {
                UpstreamEvent::NotifyRequest { .. } => {
                    self.up.answer_request(now, RequestAnswer::Ok { id: 9 }).unwrap()
                }
                UpstreamEvent::FeedStarted => self.feeding = true,
                other => panic!("unexpected upstream event {other:?}"),
            }
        }
        while let Some(event) = self.client.poll_event() {
            match event {
                NotifyEvent::Accepted { id: 9, .. } => {}
                NotifyEvent::Notification(info) => self.received.push(info),
                NotifyEvent::Closed(_) => self.closed = true,
                other => panic!("unexpected notify event {other:?}"),
            }
        }
        if self.feeding {
            while self.up.ready() && self.next < self.infos.len() {
                self.up.send_product(now, &self.infos[self.next], &[]).unwrap();
                self.next += 1;
            }
            if self.next == self.infos.len() {
                self.up.flush(now);
            }
        }
    }
    fn done(&self) -> bool {
        self.feeding && self.received.len() == self.infos.len() && self.up.ready()
    }
}

/// A push client offering products to an upstream that accepted its HIYA.
struct PushPair {
    receiver: Upstream,
    pusher: PushClient,
    products: Vec<(ProdInfo, Vec<u8>)>,
    max_hereis: u32,
    next: usize,
    accepts: Vec<bool>,
    comingsoons: usize,
    accepted: bool,
    flush_sent: bool,
    flushed: bool,
    received: Vec<(ProdInfo, Vec<u8>)>,
    declined: Vec<Signature>,
    closed: bool,
}

impl PushPair {
    fn new(start: Instant, products: &[(ProdInfo, Vec<u8>)], max_hereis: u32, accepts: Vec<bool>) -> Self {
        // `accepts` is indexed by product (a product sent by HEREIS skips its entry).
        let accepts = (0..products.len()).map(|k| accepts[k % accepts.len()]).collect();
        Self {
            receiver: Upstream::new(start),
            pusher: PushClient::new(start, &exp_class()),
            products: products.to_vec(),
            max_hereis,
            next: 0,
            accepts,
            comingsoons: 0,
            accepted: false,
            flush_sent: false,
            flushed: false,
            received: Vec::new(),
            declined: Vec::new(),
            closed: false,
        }
    }
}

impl Pair for PushPair {
    fn a(&mut self) -> &mut dyn Endpoint {
        &mut self.pusher
    }
    fn b(&mut self) -> &mut dyn Endpoint {
        &mut self.receiver
    }
    fn drive(&mut self, now: Instant) {
        while let Some(event) = self.receiver.poll_event() {
            match event {
                UpstreamEvent::Hiya { .. } => {
                    self.receiver.answer_hiya(now, HiyaAnswer::Ok { max_hereis: self.max_hereis }).unwrap();
                }
                UpstreamEvent::Product(product) => self.received.push((product.info, product.data.to_vec())),
                UpstreamEvent::ComingSoon { info, abandoned: None } => {
                    // Answer for the product it announces.
                    let k = self.products.iter().position(|(p, _)| p.signature == info.signature).unwrap();
                    self.comingsoons += 1;
                    self.receiver.answer_coming_soon(now, self.accepts[k]).unwrap();
                }
                other => panic!("unexpected receiver event {other:?}"),
            }
        }
        while let Some(event) = self.pusher.poll_event() {
            match event {
                PushEvent::Accepted { max_hereis, .. } => {
                    assert_eq!(max_hereis, self.max_hereis);
                    self.accepted = true;
                }
                PushEvent::Declined { signature } => self.declined.push(signature),
                PushEvent::Flushed => self.flushed = true,
                PushEvent::Closed(_) => self.closed = true,
                other => panic!("unexpected push event {other:?}"),
            }
        }
        if self.accepted {
            while self.pusher.ready() && self.next < self.products.len() {
                let (info, data) = &self.products[self.next];
                self.pusher.send_product(now, info, data).unwrap();
                self.next += 1;
            }
            if self.pusher.ready() && self.next == self.products.len() && !self.flush_sent {
                self.pusher.flush(now).unwrap();
                self.flush_sent = true;
            }
        }
    }
    fn done(&self) -> bool {
        self.flushed
    }
}

// ---------------------------------------------------------------------------------------------
// Sessions in every state, for arbitrary input.

const SESSION_STATES: usize = 9;

enum Session {
    Upstream(Upstream),
    Downstream(Downstream),
    Notify(NotifyClient),
    Push(PushClient),
}

/// A session and what it reported.
struct AnySession {
    session: Session,
    closes: usize,
    event_after_close: bool,
}

impl AnySession {
    /// 0 fresh upstream, 1 feeding upstream (primary), 2 feeding upstream (alternate), 3
    /// upstream receiving a push, 4 fresh downstream, 5 receiving downstream, 6 fresh notify
    /// client, 7 accepted notify client, 8 push client (fresh; accepted when the input says so).
    fn in_state(state: usize, start: Instant) -> Self {
        let session = match state {
            0 => Session::Upstream(Upstream::new(start)),
            1 | 2 => {
                let mode = if state == 1 { FeedMode::Primary } else { FeedMode::Alternate };
                let mut up = Upstream::new(start);
                let mut config = DownstreamConfig::new(exp_class());
                config.mode = mode;
                let mut down = Downstream::new(start, config);
                exchange(start, &mut up, &mut down);
                up.poll_event();
                up.answer_request(start, RequestAnswer::Ok { id: 1 }).unwrap();
                up.handle_timeout(start + TURN_AROUND);
                up.poll_event();
                let (info, data) = product(1, 2000);
                up.send_product(start + TURN_AROUND, &info, &data).unwrap();
                output_of(&mut up);
                Session::Upstream(up)
            }
            3 => {
                let mut up = Upstream::new(start);
                let mut pusher = PushClient::new(start, &exp_class());
                let mut bytes = Vec::new();
                pusher.take_output(&mut bytes);
                up.handle_input(start, &bytes);
                up.poll_event();
                up.answer_hiya(start, HiyaAnswer::Ok { max_hereis: 1000 }).unwrap();
                output_of(&mut up);
                Session::Upstream(up)
            }
            4 => Session::Downstream(Downstream::new(start, DownstreamConfig::new(exp_class()))),
            5 => {
                let mut up = Upstream::new(start);
                let mut down = Downstream::new(start, DownstreamConfig::new(exp_class()));
                exchange(start, &mut up, &mut down);
                up.poll_event();
                up.answer_request(start, RequestAnswer::Ok { id: 1 }).unwrap();
                exchange(start, &mut up, &mut down);
                down.poll_event();
                Session::Downstream(down)
            }
            6 => Session::Notify(NotifyClient::new(start, exp_class(), SILENCE)),
            7 => {
                let mut client = NotifyClient::new(start, exp_class(), SILENCE);
                let mut up = Upstream::new(start);
                up.handle_input(start, &output_of(&mut client));
                up.poll_event();
                up.answer_request(start, RequestAnswer::Ok { id: 1 }).unwrap();
                client.handle_input(start, &output_of(&mut up));
                client.poll_event();
                Session::Notify(client)
            }
            _ => Session::Push(PushClient::new(start, &exp_class())),
        };
        Self { session, closes: 0, event_after_close: false }
    }

    fn input(&mut self, now: Instant, bytes: &[u8]) {
        match &mut self.session {
            Session::Upstream(s) => s.handle_input(now, bytes),
            Session::Downstream(s) => s.handle_input(now, bytes),
            Session::Notify(s) => s.handle_input(now, bytes),
            Session::Push(s) => s.handle_input(now, bytes),
        }
    }

    fn timeout(&mut self, now: Instant) {
        match &mut self.session {
            Session::Upstream(s) => s.handle_timeout(now),
            Session::Downstream(s) => s.handle_timeout(now),
            Session::Notify(s) => s.handle_timeout(now),
            Session::Push(s) => s.handle_timeout(now),
        }
    }

    fn eof(&mut self) {
        match &mut self.session {
            Session::Upstream(s) => s.handle_eof(),
            Session::Downstream(s) => s.handle_eof(),
            Session::Notify(s) => s.handle_eof(),
            Session::Push(s) => s.handle_eof(),
        }
    }

    /// Drains events, answering every decision (answers may be refused as misuse: never a
    /// panic), sending when ready, taking the output.
    fn drain(&mut self, now: Instant, answers: &mut impl Iterator<Item = bool>) {
        let mut yes = || answers.next().unwrap_or(true);
        let mut sink = Vec::new();
        loop {
            let (closed, any) = match &mut self.session {
                Session::Upstream(s) => match s.poll_event() {
                    None => (false, false),
                    Some(event) => {
                        let closed = matches!(event, UpstreamEvent::Closed(_));
                        let _ = match event {
                            UpstreamEvent::FeedRequest { .. } | UpstreamEvent::NotifyRequest { .. } => {
                                let answer = if yes() { RequestAnswer::Ok { id: 3 } } else { RequestAnswer::Refuse };
                                s.answer_request(now, answer)
                            }
                            UpstreamEvent::Hiya { .. } => {
                                let answer =
                                    if yes() { HiyaAnswer::Ok { max_hereis: 100 } } else { HiyaAnswer::Refuse };
                                s.answer_hiya(now, answer)
                            }
                            UpstreamEvent::IsAlive { .. } => s.answer_is_alive(now, yes()),
                            UpstreamEvent::ComingSoon { .. } => s.answer_coming_soon(now, yes()),
                            _ => Ok(()),
                        };
                        if s.ready() {
                            let (info, data) = product(2, 50);
                            let _ = s.send_product(now, &info, &data);
                            s.flush(now);
                        }
                        (closed, true)
                    }
                },
                Session::Downstream(s) => match s.poll_event() {
                    None => (false, false),
                    Some(event) => {
                        let closed = matches!(event, DownstreamEvent::Closed(_));
                        if let DownstreamEvent::ComingSoon { .. } = event {
                            let _ = s.answer_coming_soon(now, yes());
                        }
                        (closed, true)
                    }
                },
                Session::Notify(s) => match s.poll_event() {
                    None => (false, false),
                    Some(event) => (matches!(event, NotifyEvent::Closed(_)), true),
                },
                Session::Push(s) => match s.poll_event() {
                    None => (false, false),
                    Some(event) => {
                        let closed = matches!(event, PushEvent::Closed(_));
                        if s.ready() {
                            let (info, data) = product(3, if yes() { 50 } else { 5000 });
                            let _ = s.send_product(now, &info, &data);
                            if yes() {
                                let _ = s.flush(now);
                            }
                        }
                        (closed, true)
                    }
                },
            };
            if !any {
                break;
            }
            if self.closes > 0 {
                self.event_after_close = true;
            }
            if closed {
                self.closes += 1;
            }
        }
        match &mut self.session {
            Session::Upstream(s) => s.take_output(&mut sink),
            Session::Downstream(s) => s.take_output(&mut sink),
            Session::Notify(s) => s.take_output(&mut sink),
            Session::Push(s) => s.take_output(&mut sink),
        }
    }
}

/// Arbitrary input: raw bytes, records with random bodies, or valid LDM records with bytes
/// changed.
fn garbage_strategy() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..300),
        (prop::collection::vec(any::<u8>(), 0..300), any::<bool>()).prop_map(|(body, last)| {
            let mut record = (body.len() as u32 | if last { 0x8000_0000 } else { 0 }).to_be_bytes().to_vec();
            record.extend_from_slice(&body);
            record
        }),
        (0..valid_records().len(), prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4)).prop_map(
            |(which, changes)| {
                let mut record = valid_records()[which].clone();
                for (at, value) in changes {
                    let at = at.index(record.len());
                    record[at] ^= value;
                }
                record
            }
        ),
    ]
}

/// Valid records of every kind both ends exchange.
fn valid_records() -> Vec<Vec<u8>> {
    use ldm7_xdr::ldm::{Call, FornmeReply, HiyaReply, LdmErr, encode_call, encode_reply};
    let (info, data) = product(5, 40);
    let class = ldm7_ldm_proto::wire_class(&exp_class());
    let calls = [
        LdmCall::Feedme { class: class.clone(), max_hereis: u32::MAX },
        LdmCall::Notifyme(class.clone()),
        LdmCall::Hiya(class.clone()),
        LdmCall::IsAlive(3),
        LdmCall::Nullproc,
        LdmCall::Hereis { info: info.clone(), data: data.clone() },
        LdmCall::Notification(info.clone()),
        LdmCall::ComingSoon { info: info.clone(), pktsz: info.size },
        LdmCall::BlkData { signature: info.signature, pktnum: 0, data },
    ];
    let mut records: Vec<Vec<u8>> = calls
        .into_iter()
        .map(|call| {
            let mut out = Vec::new();
            encode_call(&mut out, &Call { xid: 0x6c64_0001, version: 6, call });
            out
        })
        .collect();
    for body in [
        ReplyBody::Void,
        ReplyBody::Fornme(FornmeReply::Ok(3)),
        ReplyBody::Fornme(FornmeReply::Reclass(class.clone())),
        ReplyBody::Fornme(FornmeReply::BadPattern),
        ReplyBody::Hiya(HiyaReply::Ok(100)),
        ReplyBody::Hiya(HiyaReply::Reclass { class, max_hereis: 10 }),
        ReplyBody::ComingSoon(LdmErr::Ok),
        ReplyBody::ComingSoon(LdmErr::DontSend),
        ReplyBody::IsAlive(true),
    ] {
        for xid in [0x6c64_0001, 0x4c44_0001, 0x6e6f_0001, 0x7075_0001] {
            let mut out = Vec::new();
            encode_reply(&mut out, xid, &body);
            records.push(out);
        }
    }
    records
}

// ---------------------------------------------------------------------------------------------
// Helpers.

/// The last nanosecond before `at`.
fn before(at: Instant) -> Instant {
    Instant::from_nanos(at.as_nanos() - 1)
}

fn exp_class() -> ProdClass {
    ProdClass::new(FeedType::EXP, ".*").expect("pattern")
}

/// Product `n` of `size` bytes (its data depends on `n`, so signatures differ).
fn product(n: u32, size: usize) -> (ProdInfo, Vec<u8>) {
    let data: Vec<u8> = (0..size).map(|k| (k as u32).wrapping_mul(31).wrapping_add(n * 7) as u8).collect();
    let mut stamp = data.clone();
    stamp.extend_from_slice(&n.to_be_bytes());
    let info = ProdInfo {
        arrival: Timestamp { secs: 1_795_338_382, micros: (n % 1_000_000) as i32 },
        signature: Signature::md5_of(&stamp),
        origin: "vm".into(),
        feedtype: FeedType::EXP,
        seqno: n,
        ident: format!("TEST/p.{n}"),
        size: size as u32,
    };
    (info, data)
}

fn products_strategy() -> impl Strategy<Value = Vec<(ProdInfo, Vec<u8>)>> {
    prop::collection::vec(prop_oneof![3 => 0usize..200, 2 => 200usize..6000, 1 => Just(0usize)], 0..16)
        .prop_map(|sizes| sizes.into_iter().enumerate().map(|(n, size)| product(n as u32, size)).collect())
}

fn output_of(up: &mut impl Endpoint) -> Vec<u8> {
    let mut bytes = Vec::new();
    up.output(&mut bytes);
    bytes
}

/// Exchanges whole outputs until both are quiet.
fn exchange(now: Instant, up: &mut Upstream, down: &mut Downstream) {
    loop {
        let bytes = output_of(up);
        down.handle_input(now, &bytes);
        let back = output_of(down);
        up.handle_input(now, &back);
        if bytes.is_empty() && back.is_empty() {
            return;
        }
    }
}

/// The procedures of the calls in a byte stream of whole records.
fn calls_in(mut bytes: &[u8]) -> Vec<Proc> {
    let mut procs = Vec::new();
    while bytes.len() >= 4 {
        let len = (u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) & 0x7fff_ffff) as usize;
        match ldm7_xdr::ldm::decode_message(&bytes[4..4 + len], |_| None) {
            Ok(Message::Call(call)) => procs.push(call.call.proc()),
            other => panic!("not a call: {other:?}"),
        }
        bytes = &bytes[4 + len..];
    }
    procs
}
