//! The subscriber side of LDM-7 (a RECEIVE entry; ldm7-multicast.md §2.2 steps 1, 3–5, §2.3,
//! §2.4): subscribes to the upstream, receives the feed by FMTP into the product queue, fetches
//! what FMTP could not deliver through the backstop (REQUEST_PRODUCT) and what it missed while
//! away through the backlog (REQUEST_BACKLOG), and logs one [`Delivery`] line per product.
//!
//! One task per RECEIVE entry, on the server's LDM-7 runtime:
//!
//! 1. Connects to the upstream and sends SUBSCRIBE (feed, this host's attachment). A refusal or
//!    a lost connection is retried with back-off (`retry_min` doubling to `retry_max`) for as
//!    long as the server runs; the first failure of an outage is logged as a warning, the
//!    retries at debug level, and the resubscription once it succeeds.
//! 2. On `Subscribed`: configures the address it was given on the RECEIVE entry's interface if
//!    one is named (needs root), joins the group there (or on loopback when the address is a
//!    loopback one) and connects its FMTP repair connection *from* that address — the publisher
//!    only takes repair connections from addresses it handed out.
//! 3. Each product FMTP delivers is written into a spool file as it arrives (never whole in
//!    memory beyond the receiver's bounds), checked (XDR header, BOP metadata, MD5 of the data)
//!    and copied from the spool into the queue in one pass. A product that fails the check is
//!    fetched through the backstop instead.
//! 4. Products FMTP reports missed (rejected after the sender's deadline, timed out, evicted, or
//!    skipped by a jump of the product index) are asked for with REQUEST_PRODUCT; the answers
//!    come in request order on the control connection and are inserted (`Inserted`).
//! 5. When the session's first FMTP product (the receiver's first index) is resolved —
//!    delivered by FMTP, or answered through the backstop — it asks for the backlog (§2.4): from
//!    just after its resume point — or `time_offset` back when it has none — up to that product
//!    ([`BacklogStart`]; the reference asks at the first product delivered, which for a lossy
//!    subscriber is often a later one). Only when no FMTP datagram at all arrives for
//!    `TAIL_QUIET` after the connection (a quiet feed), or nothing resolves for `BACKLOG_WAIT`,
//!    does it ask up to the upstream's newest product: products the multicast is still carrying
//!    would otherwise come twice (a lossy subscriber's first products can take seconds to
//!    repair).
//! 6. When the feed goes quiet (no FMTP message, multicast or repair, for `TAIL_QUIET`, and no
//!    product in FMTP's hands), it asks for anything the upstream has after the newest product
//!    FMTP brought ([`Session::ask_tail`]): FMTP learns of a product lost whole only from a newer
//!    one, so the end of a burst would otherwise wait for the next product.
//!
//! A backlog is complete at END_BACKLOG (ldm7 sends it) or when its *fence* is answered: a
//! REQUEST_PRODUCT for an index far ahead of the newest the session has seen, sent right after
//! the REQUEST_BACKLOG, which the reference (serving a connection's calls one at a time)
//! answers with NO_SUCH_PRODUCT after the backlog's last product, and ldm7 after its
//! END_BACKLOG (`ldm7_ldm_proto::Subscriber`, "fences"). So the resume point moves and the
//! quiet-feed check runs against a publisher that never sends END_BACKLOG too.
//!
//! The resume point ([`Resume`], kept in the state directory) is the newest product before
//! which nothing is missing. The reference keeps the last product received by multicast; then a
//! product still being repaired, or fetched through the backstop, when the session dies (kill
//! -9, the publisher restarting) would never arrive — its index is older than the last one
//! received, so the next backlog starts after it. Ours is the end of the session's resolved
//! prefix of FMTP indexes, and it moves only once the session's own backlog is complete.
//!
//! Duplicates (a product that came both ways) are dropped by the queue and counted.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use ldm7_fmtp::udp::{MulticastConfig, receive_buffer_bytes};
use ldm7_fmtp::{FmtpReceiver, ReceivedProduct, ReceiverNotice, ReceiverOptions};
use ldm7_fmtp_proto::{ParityChoice, ParityConfig, ReceiveTimer, ReceiverConfig, ReceiverEvent, WallTime};
use ldm7_io::log_target::PRODUCT;
use ldm7_io::{Backoff, Clock};
use ldm7_ldm_proto::{
    BacklogSpec, McastSubInfo, SessionError, SubscribeAnswer, SubscribeOffer, Subscriber, SubscriberConfig,
    SubscriberEvent, VcEndPoint,
};
use ldm7_pq::{InsertError, InsertOutcome, Queue};
use ldm7_types::{ProdInfo, Signature, Timestamp};
use md5::{Digest, Md5};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::delivery::{Delivery, DeliveryMode};
use super::product::{self, ProductError};
use crate::config::Receive;
use crate::settings::ReceiveSettings;

/// Bytes read from the head of a spooled product to decode its XDR header (the largest
/// `prod_info` is 8 + 16 + 4 + 64 + 4 + 4 + 4 + 256 + 4 bytes).
const HEAD_BYTES: usize = 512;
/// Chunk size when copying a spooled product into the queue.
const COPY_CHUNK_BYTES: usize = 256 << 10;
/// Most products asked for one jump of the product index.
const INDEX_GAP_REQUESTS_MAX: u32 = 100_000;
/// How often the resume point (last product's signature) is saved while products arrive.
const SAVE_EVERY: Duration = Duration::from_secs(1);
/// How long a connection to the upstream may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound: resolved products remembered beyond the resume prefix (it holds when one product stays
/// unresolved for long).
const RESUME_RESOLVED_MAX: usize = 1 << 20;
/// Drops at this host are logged at most this often.
const HOST_DROPS_LOG_EVERY: Duration = Duration::from_secs(60);

/// How long the FMTP receiver keeps trying to reach the repair server.
const REPAIR_CONNECT_DEADLINE: Duration = Duration::from_secs(60);

/// Counters of one RECEIVE (per feed and upstream).
#[derive(Debug, Default)]
pub struct SubscriberCounters {
    /// Successful subscriptions (1 + resubscriptions).
    pub subscriptions: AtomicU64,
    /// Products received by FMTP and inserted.
    pub received: AtomicU64,
    /// Of those, products that needed no retransmitted block.
    pub multicast_only: AtomicU64,
    /// Blocks retransmitted over TCP for inserted FMTP products.
    pub retransmitted_blocks: AtomicU64,
    /// Products inserted from the backstop.
    pub inserted: AtomicU64,
    /// Products inserted from the backlog.
    pub backlog: AtomicU64,
    /// Products that came twice (the queue had them).
    pub duplicates: AtomicU64,
    /// Products asked for by REQUEST_PRODUCT.
    pub requested: AtomicU64,
    /// REQUEST_PRODUCTs the upstream could not answer (NO_SUCH_PRODUCT).
    pub no_such_product: AtomicU64,
    /// FMTP products that failed the check (header, metadata, MD5) and were asked for again.
    pub corrupt: AtomicU64,
    /// Products that could not be inserted (too big for the queue, storage failure).
    pub insert_errors: AtomicU64,
    /// Multicast datagrams the kernel dropped at this host (the receiving socket's buffer was
    /// full): "dropped at this host", apart from the path's loss.
    pub host_drops: AtomicU64,
}

/// What a subscriber needs from the server.
#[derive(Clone)]
pub struct SubscriberContext {
    /// The product queue.
    pub queue: Arc<Queue>,
    /// Where the resume point and the spool live.
    pub state_dir: PathBuf,
    /// The server's port (the upstream's default port).
    pub server_port: u16,
    /// Set when the server stops.
    pub stop: watch::Receiver<bool>,
    /// The server's delivery statistics.
    pub stats: Arc<crate::stats::StatsPublisher>,
}

impl std::fmt::Debug for SubscriberContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubscriberContext").field("state_dir", &self.state_dir).finish_non_exhaustive()
    }
}

/// Why a session ended.
#[derive(Debug, thiserror::Error)]
enum SessionEnd {
    #[error("the server is stopping")]
    Stopping,
    #[error("cannot connect to {address}: {source}")]
    Connect { address: String, source: std::io::Error },
    #[error("the upstream refused the subscription: {0}")]
    Refused(ldm7_ldm_proto::Ldm7Status),
    #[error("the control connection: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error("the upstream closed the connection")]
    Closed,
    #[error("the FMTP receiver: {0}")]
    Fmtp(#[from] ldm7_fmtp::ReceiveError),
    #[error("the FMTP receiver ended")]
    FmtpEnded,
    /// The pinned publisher key (`pin`) cannot be read.
    #[error("the pinned publisher key: {0}")]
    Pin(String),
    #[error("the inserter thread: {0}")]
    Inserter(#[source] std::io::Error),
    #[error("the inserter thread ended")]
    InserterEnded,
    #[error("the subscription reply is unusable: {0}")]
    Reply(String),
    #[error("cannot configure {address} on {interface}: {source}")]
    Address { address: ldm7_net::hostcfg::Ipv4Cidr, interface: String, source: ldm7_net::hostcfg::AddressError },
}

/// Runs one RECEIVE until the server stops.
pub async fn run(
    context: SubscriberContext,
    receive: Receive,
    settings: ReceiveSettings,
    counters: Arc<SubscriberCounters>,
) {
    let port = receive.port.unwrap_or(context.server_port);
    let name = format!("{}:{port} {}", receive.host, receive.feedtype);
    let state_path = context.state_dir.join(format!(
        ".ldm7-{}-{}-{port}.last",
        file_name(&receive.feedtype.to_string()),
        file_name(&receive.host)
    ));
    let mut resume = Resume::load(state_path);
    let mut backoff = Backoff::new(settings.retry_min, settings.retry_max);
    let mut in_outage = false;
    let mut stop = context.stop.clone();
    tracing::info!(
        "Downstream LDM7 starting up: remoteLDM7={}:{port}, feed={}, fmtpIface={}, vcEndPoint={}",
        receive.host,
        receive.feedtype,
        receive.interface.as_deref().unwrap_or("-"),
        vc_end(&receive).switch_id
    );
    loop {
        let started = Clock::now();
        let mut session = Session {
            context: &context,
            receive: &receive,
            settings: &settings,
            counters: &counters,
            name: &name,
            port,
            resume: &mut resume,
            in_outage: &mut in_outage,
            configured: None,
        };
        let end = session.run().await;
        match end {
            SessionEnd::Stopping => break,
            error if !in_outage => {
                tracing::warn!("{name}: {error}; resubscribing with back-off until it works");
                in_outage = true;
            }
            error => tracing::debug!("{name}: {error}"),
        }
        if Clock::now() - started > backoff.max() {
            backoff.reset();
        }
        let delay = backoff.next_delay(Clock::now()).unwrap_or(settings.retry_max);
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = stop.changed() => {}
        }
        if *stop.borrow() {
            break;
        }
    }
    resume.save();
}

struct Session<'a> {
    context: &'a SubscriberContext,
    receive: &'a Receive,
    settings: &'a ReceiveSettings,
    counters: &'a SubscriberCounters,
    name: &'a str,
    port: u16,
    resume: &'a mut Resume,
    in_outage: &'a mut bool,
    /// The address this session configured on the RECEIVE interface.
    configured: Option<(String, ldm7_net::hostcfg::Ipv4Cidr)>,
}

impl Session<'_> {
    async fn run(&mut self) -> SessionEnd {
        let address = format!("{}:{}", self.receive.host, self.port);
        let connect = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&address)).await;
        let stream = match connect {
            Ok(Ok(stream)) => stream,
            Ok(Err(source)) => return SessionEnd::Connect { address, source },
            Err(_) => return SessionEnd::Connect { address, source: std::io::ErrorKind::TimedOut.into() },
        };
        let _ = stream.set_nodelay(true);
        let mut config = SubscriberConfig::new(self.receive.feedtype);
        config.vc_end = vc_end(self.receive);
        config.upstream_host = Some(self.receive.host.clone());
        // The ldm7 extension: offered to every publisher (a reference one skips it).
        config.offer = Some(SubscribeOffer { parity: self.settings.parity != ParityChoice::Off });
        let session = Subscriber::new(Clock::now(), config);
        match self.drive(stream, session).await {
            Ok(()) => SessionEnd::Closed,
            Err(end) => end,
        }
    }

    async fn drive(&mut self, stream: TcpStream, mut session: Subscriber) -> Result<(), SessionEnd> {
        let (mut read, mut write) = stream.into_split();
        let mut stop = self.context.stop.clone();
        let mut buf = vec![0u8; 256 << 10];
        let mut out = Vec::new();
        let mut receiver: Option<FmtpReceiver> = None;
        let mut inserter = Inserter::start(self.context.queue.clone(), self.name)?;
        let mut backlog_start = BacklogStart::default();
        let backlog_after = self.resume.session_started();
        let mut tail = TailCheck::default();
        // The newest FMTP index seen: backlog fences go far ahead of it.
        let mut newest_index: Option<u32> = None;
        let mut last_save = Clock::now();
        let mut unsaved = false;
        // The kernel's drop count of this session's receiver, as last accounted.
        let mut host_drops_seen = 0u64;
        let mut host_drops_logged: Option<ldm7_types::Instant> = None;
        let result = 'session: loop {
            // Events of the control session.
            while let Some(event) = session.poll_event() {
                match event {
                    SubscriberEvent::Subscribed { info } => {
                        receiver = Some(self.start_receiver(&info)?);
                        host_drops_seen = 0;
                        self.counters.subscriptions.fetch_add(1, Ordering::Relaxed);
                        if std::mem::take(self.in_outage) {
                            tracing::info!("{}: resubscribed", self.name);
                        }
                        let repair = match info.answer {
                            None => "unicast repairs (the publisher is not ldm7)".to_owned(),
                            Some(SubscribeAnswer { parity: None }) => "unicast repairs (no parity)".to_owned(),
                            Some(SubscribeAnswer { parity: Some(parity) }) => format!(
                                "parity repair {}/{} on port {}",
                                parity.group_blocks, parity.shards, parity.port
                            ),
                        };
                        tracing::info!(
                            "{}: subscribed: group {}, FMTP server {}, FMTP address {}, {repair}",
                            self.name,
                            info.mcast_info.group,
                            info.mcast_info.server,
                            info.fmtp_addr
                        );
                    }
                    SubscriberEvent::Refused { status } => return Err(SessionEnd::Refused(status)),
                    SubscriberEvent::MissedProduct { index, product } => {
                        self.resume.resolved(index, Some(product.info.signature));
                        unsaved = true;
                        if let Some(before) = backlog_start.resolved(index, Some(product.info.signature)) {
                            self.ask_backlog(&mut session, backlog_after, Some(before), newest_index)?;
                        }
                        inserter.submit(Job::control(DeliveryMode::Inserted, Some(index), product)).await?;
                    }
                    SubscriberEvent::NoSuchProduct { index } => {
                        self.resume.resolved(index, None);
                        backlog_start.resolved(index, None);
                        self.counters.no_such_product.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!("{}: Requested product {index} doesn't exist", self.name);
                    }
                    SubscriberEvent::BacklogProduct { product } => {
                        inserter.submit(Job::control(DeliveryMode::Backlog, None, product)).await?;
                    }
                    SubscriberEvent::BacklogComplete => {
                        self.resume.backlog_complete();
                        unsaved = true;
                        if std::mem::take(&mut tail.asked) {
                            tracing::debug!("{}: the quiet feed's tail is complete", self.name);
                        } else {
                            tracing::info!(
                                "All backlog data-products received: feed={}, server={}",
                                self.receive.feedtype,
                                self.receive.host
                            );
                        }
                        tail.backlog_done = true;
                    }
                    SubscriberEvent::Unexpected { proc, index, expected } => {
                        tracing::warn!(
                            "{}: Unexpected product: {proc:?} for index {index} (expected {expected:?})",
                            self.name
                        );
                    }
                    SubscriberEvent::RequestsOverBound => {
                        tracing::warn!(
                            "{}: too many products requested at once; the backlog will cover the rest",
                            self.name
                        );
                    }
                    SubscriberEvent::Unserved(call) => tracing::warn!("{}: {call}", self.name),
                    SubscriberEvent::Closed(result) => break 'session result.map_err(SessionEnd::from),
                }
            }
            if let Some(receiver) = &receiver {
                let drops = receiver.driver_counters().host_drops;
                if drops > host_drops_seen {
                    self.on_host_drops(drops - host_drops_seen, &mut host_drops_logged);
                    host_drops_seen = drops;
                }
            }
            if unsaved && Clock::now() - last_save >= SAVE_EVERY {
                self.resume.save();
                last_save = Clock::now();
                unsaved = false;
            }
            // Output is written as the socket takes it, in the same select as the reads: a
            // subscriber that stopped reading while it waited to write could deadlock with an
            // upstream doing the same (its missed products one way, our requests the other).
            session.take_output(&mut out);
            let timeout = session.poll_timeout().map(Clock::to_std).map(tokio::time::Instant::from_std);
            let far = tokio::time::Instant::now() + Duration::from_secs(3600);
            let tail_due = tail.due().map(Clock::to_std).map(tokio::time::Instant::from_std);
            // A quiet feed, or nothing resolved for long: the backlog up to the newest product.
            let backlog_due = backlog_start.due().map(Clock::to_std).map(tokio::time::Instant::from_std);
            tokio::select! {
                () = tokio::time::sleep_until(backlog_due.unwrap_or(far)), if backlog_due.is_some() => {
                    if backlog_start.expired(Clock::now()) {
                        self.ask_backlog(&mut session, backlog_after, None, newest_index)?;
                    }
                }
                written = write.write(&out), if !out.is_empty() => {
                    let count = written?;
                    out.drain(..count);
                }
                () = tokio::time::sleep_until(tail_due.unwrap_or(far)), if tail_due.is_some() => {
                    if let Some(after) = tail.ask(fmtp_traffic(receiver.as_ref())) {
                        self.ask_tail(&mut session, after, newest_index)?;
                    }
                }
                read_count = read.read(&mut buf) => {
                    match read_count? {
                        0 => session.handle_eof(),
                        count => session.handle_input(Clock::now(), &buf[..count]),
                    }
                }
                notice = next_notice(&mut receiver) => {
                    match notice {
                        Some(notice) => {
                            // The session's first product, once resolved, asks for the backlog up
                            // to it (§2.4).
                            let mut before = None;
                            match &notice {
                                ReceiverNotice::Connected(_) => backlog_start.connected(Clock::now()),
                                ReceiverNotice::Event(ReceiverEvent::Started { index }) => backlog_start.started(index.0),
                                ReceiverNotice::Delivered { delivery, .. } => {
                                    let signature = delivery.metadata.get(..16).and_then(|bytes| <[u8; 16]>::try_from(bytes).ok()).map(Signature);
                                    before = backlog_start.resolved(delivery.index.0, signature);
                                }
                                ReceiverNotice::Event(_) => {}
                            }
                            tail.activity(fmtp_traffic(receiver.as_ref()));
                            if let Some(index) = notice_index(&notice) {
                                let first = newest_index.is_none();
                                if newest_index.is_none_or(|newest| index.wrapping_sub(newest) < 1 << 31) {
                                    newest_index = Some(index);
                                }
                                // Backlogs asked before any index was known get their fence now.
                                if first && session.pending_backlogs() > 0 {
                                    session.fence_backlogs(Clock::now(), ldm7_ldm_proto::fence_index(index))?;
                                }
                            }
                            self.on_notice(&mut session, &mut inserter, notice).await?;
                            if let Some(before) = before {
                                self.ask_backlog(&mut session, backlog_after, Some(before), newest_index)?;
                            }
                        }
                        None => {
                            let ended = match receiver.take() {
                                Some(receiver) => receiver.finish().await.err().map(SessionEnd::Fmtp),
                                None => None,
                            };
                            break Err(ended.unwrap_or(SessionEnd::FmtpEnded));
                        }
                    }
                }
                done = inserter.done.recv() => {
                    match done {
                        Some(done) => {
                            if let Some(received) = self.on_done(&mut session, done)? {
                                tail.received(received);
                                unsaved = true;
                            }
                        }
                        None => break Err(SessionEnd::InserterEnded),
                    }
                }
                () = tokio::time::sleep_until(timeout.unwrap_or(far)) => session.handle_timeout(Clock::now()),
                _ = stop.changed() => {
                    if *stop.borrow() {
                        break Err(SessionEnd::Stopping);
                    }
                }
            }
        };
        if let Some(receiver) = receiver {
            let _ = receiver.finish().await;
        }
        // The address goes back to the publisher's pool with the session: take it off the
        // interface, so that no two hosts of the feed's subnet ever hold it at once.
        if let Some((interface, cidr)) = self.configured.take() {
            if let Err(error) = ldm7_net::hostcfg::remove_address(None, &interface, cidr) {
                tracing::warn!("{}: cannot remove {cidr} from {interface}: {error}", self.name);
            }
        }
        // Products handed to the inserter are inserted and accounted before the session ends.
        for done in inserter.finish().await {
            let _ = self.on_done(&mut session, done);
        }
        self.resume.save();
        match result {
            Ok(()) => Err(SessionEnd::Closed),
            Err(end) => Err(end),
        }
    }

    /// This subscription's link in the delivery statistics: feed, upstream, this server.
    fn stats_link(&self) -> ldm7_metrics::Link {
        let publisher = crate::stats::node_name(&self.receive.host, self.port);
        ldm7_metrics::Link::new(self.receive.feedtype, publisher, self.context.stats.name())
    }

    /// Accounts datagrams the kernel dropped at this host since the last look, and says so at
    /// most once a minute with what to do.
    fn on_host_drops(&self, new: u64, logged: &mut Option<ldm7_types::Instant>) {
        let total = self.counters.host_drops.fetch_add(new, Ordering::Relaxed) + new;
        self.context.stats.record_host_drops(&self.stats_link(), Timestamp::from_system_time(SystemTime::now()), new);
        let now = Clock::now();
        if logged.is_none_or(|at| now - at >= HOST_DROPS_LOG_EVERY) {
            *logged = Some(now);
            tracing::warn!(
                "{}: {total} multicast datagrams dropped at this host so far (the receiving socket's buffer was full; \
                 each is repaired): give the subscriber more CPU, or a larger buffer (receive_gap in ldm7.toml, \
                 net.core.rmem_max); docs/ldm7.md \"Receive path\"",
                self.name
            );
        }
    }

    /// Starts the FMTP receiver for a subscription.
    fn start_receiver(&mut self, info: &McastSubInfo) -> Result<FmtpReceiver, SessionEnd> {
        let reply = |why: String| SessionEnd::Reply(why);
        let group: SocketAddr = info
            .mcast_info
            .group
            .parse()
            .map_err(|_| reply(format!("group {:?} is not address:port", info.mcast_info.group)))?;
        let server: SocketAddr = info
            .mcast_info
            .server
            .parse()
            .map_err(|_| reply(format!("FMTP server {:?} is not address:port", info.mcast_info.server)))?;
        let address = info.fmtp_addr.addr;
        if let Some(interface) = &self.receive.interface {
            let cidr = ldm7_net::hostcfg::Ipv4Cidr { address, prefix_len: info.fmtp_addr.prefix_len };
            // Addresses of the same subnet left by a session that ended without cleaning up
            // (kill -9) go first: the publisher may hand them to another host.
            for stale in ldm7_net::hostcfg::addresses(None, interface).unwrap_or_default() {
                if stale != cidr && stale.prefix_len == cidr.prefix_len && stale.network() == cidr.network() {
                    match ldm7_net::hostcfg::remove_address(None, interface, stale) {
                        Ok(_) => tracing::info!("{}: removed the stale address {stale} from {interface}", self.name),
                        Err(error) => tracing::warn!("{}: cannot remove {stale} from {interface}: {error}", self.name),
                    }
                }
            }
            ldm7_net::hostcfg::ensure_address(None, interface, cidr).map_err(|source| SessionEnd::Address {
                address: cidr,
                interface: interface.clone(),
                source,
            })?;
            self.configured = Some((interface.clone(), cidr));
        }
        let join = if address.is_loopback() { Ipv4Addr::LOCALHOST } else { address };
        let rate = self.settings.rate.bits_per_s();
        let multicast = MulticastConfig {
            group,
            interface: IpAddr::V4(join),
            interface_index: 0,
            ttl: 1,
            loopback: true,
            buffer_bytes: receive_buffer_bytes(rate, self.settings.receive_gap),
        };
        // Parity as the publisher answered (never offered with `parity = "off"`).
        let parity = info.answer.and_then(|answer| answer.parity).filter(|_| self.settings.parity != ParityChoice::Off);
        let mut options = ReceiverOptions::new(multicast, server);
        options.parity_group = parity.map(|answer| SocketAddr::new(group.ip(), answer.port));
        options.mac_level = self.settings.mac_level;
        if let Some(path) = &self.settings.pin {
            // Never without the pin it asks for: a file unreadable now ends the session.
            let key = ldm7_config::keys::read_pin(path).map_err(|error| SessionEnd::Pin(error.to_string()))?;
            options.pin = Some(key);
        }
        let in_flight = self.settings.in_flight_bytes_max.bytes();
        options.proto = ReceiverConfig {
            receive_timer: ReceiveTimer { rate_bits_per_s: rate, ..ReceiveTimer::default() },
            in_flight_bytes_max: in_flight,
            product_size_max: u32::try_from(in_flight.min(u64::from(u32::MAX))).unwrap_or(u32::MAX),
            parity: parity.map(|answer| ParityConfig {
                group_blocks: answer.group_blocks,
                shards: answer.shards,
                ..ParityConfig::default()
            }),
            ..ReceiverConfig::default()
        };
        let spool = if self.settings.spool_dir.is_absolute() {
            self.settings.spool_dir.clone()
        } else {
            self.context.state_dir.join(&self.settings.spool_dir)
        };
        options.spool = Some(spool);
        options.local_addr = (!address.is_unspecified()).then_some(IpAddr::V4(address));
        options.connect_deadline = REPAIR_CONNECT_DEADLINE;
        options.drop_probability = self.settings.drop;
        // Subscribers of one host share its address: this server's own port tells them apart.
        options.seed =
            u64::from(u32::from(address)) ^ u64::from(self.port) ^ (u64::from(self.context.server_port) << 32);
        Ok(FmtpReceiver::start(options)?)
    }

    /// Handles an FMTP notice: a delivered product goes to the inserter, a missed one is asked
    /// for through the backstop.
    async fn on_notice(
        &mut self,
        session: &mut Subscriber,
        inserter: &mut Inserter,
        notice: ReceiverNotice,
    ) -> Result<(), SessionEnd> {
        match notice {
            ReceiverNotice::Connected(server) => {
                tracing::info!("{}: FMTP repair connection to {server} up", self.name);
                Ok(())
            }
            ReceiverNotice::Delivered { delivery, product } => {
                self.resume.seen(delivery.index.0);
                let job = Job {
                    mode: DeliveryMode::Received,
                    index: Some(delivery.index.0),
                    retransmitted_blocks: Some(delivery.retransmitted_blocks),
                    start: Some(delivery.start_time),
                    payload: Payload::Fmtp { product, metadata: delivery.metadata },
                };
                inserter.submit(job).await
            }
            ReceiverNotice::Event(ReceiverEvent::Missed { index, reason }) => {
                self.resume.seen(index.0);
                tracing::info!("Missed product: prodIndex={} ({reason:?})", index.0);
                self.request(session, index.0)
            }
            ReceiverNotice::Event(ReceiverEvent::IndexGap { first, last }) => {
                self.resume.seen(first.0);
                let count = last.0.wrapping_sub(first.0).wrapping_add(1);
                tracing::warn!(
                    "{}: products {}..={} skipped by the product index; asking for them",
                    self.name,
                    first.0,
                    last.0
                );
                for offset in 0..count.min(INDEX_GAP_REQUESTS_MAX) {
                    self.request(session, first.0.wrapping_add(offset))?;
                }
                Ok(())
            }
            ReceiverNotice::Event(ReceiverEvent::BoundHit { bound, index }) => {
                tracing::debug!("{}: FMTP receiver bound {bound:?} hit ({index:?})", self.name);
                Ok(())
            }
            ReceiverNotice::Event(ReceiverEvent::Started { index }) => {
                self.resume.seen(index.0);
                tracing::debug!("{}: first FMTP product: index {}", self.name, index.0);
                Ok(())
            }
            ReceiverNotice::Event(ReceiverEvent::Delivered(_)) => Ok(()),
        }
    }

    /// Accounts a product the inserter finished; returns the signature of a product that
    /// arrived by FMTP (the resume point may move).
    fn on_done(&mut self, session: &mut Subscriber, done: Done) -> Result<Option<Signature>, SessionEnd> {
        let Done { job, result, latency_us } = done;
        match result {
            Ok((info, outcome)) => {
                let signature = info.signature;
                let inserted = outcome.is_ok();
                self.account(job.mode, job.retransmitted_blocks, info, outcome, latency_us);
                if let (DeliveryMode::Received, Some(index), true) = (job.mode, job.index, inserted) {
                    self.resume.resolved(index, Some(signature));
                    return Ok(Some(signature));
                }
                Ok(None)
            }
            Err(error) => {
                self.counters.corrupt.fetch_add(1, Ordering::Relaxed);
                match (job.mode, job.index) {
                    (DeliveryMode::Received, Some(index)) => {
                        tracing::warn!("{}: FMTP product {index} unusable ({error}); asking for it again", self.name);
                        self.request(session, index)?;
                    }
                    (mode, _) => {
                        tracing::error!("{}: {} product unusable ({error}); dropped", self.name, mode.keyword());
                    }
                }
                Ok(None)
            }
        }
    }

    /// The feed went quiet: asks for whatever the upstream has after the newest product FMTP
    /// brought, which catches products lost whole at the end of a burst (FMTP learns of a lost
    /// product only from a newer one). If the upstream no longer has that product it falls back
    /// to `TAIL_OFFSET` back.
    fn ask_tail(&self, session: &mut Subscriber, after: Signature, newest: Option<u32>) -> Result<(), SessionEnd> {
        let spec = BacklogSpec {
            after,
            after_is_set: true,
            before: Signature([0; 16]),
            time_offset_secs: u32::try_from(TAIL_OFFSET.as_secs()).unwrap_or(u32::MAX),
        };
        tracing::info!("{}: feed quiet; asking for anything after {after}", self.name);
        session.request_backlog(Clock::now(), spec, newest.map(ldm7_ldm_proto::fence_index))?;
        Ok(())
    }

    fn request(&mut self, session: &mut Subscriber, index: u32) -> Result<(), SessionEnd> {
        self.counters.requested.fetch_add(1, Ordering::Relaxed);
        session.request_product(Clock::now(), index)?;
        Ok(())
    }

    /// REQUEST_BACKLOG (§2.4, and the module documentation): from just after `previous` (or
    /// `time_offset` back) up to the product `before` (not sent), or the newest; its fence
    /// goes far ahead of `newest`, the newest FMTP index seen.
    fn ask_backlog(
        &self,
        session: &mut Subscriber,
        previous: Option<Signature>,
        before: Option<Signature>,
        newest: Option<u32>,
    ) -> Result<(), SessionEnd> {
        let spec = BacklogSpec {
            after: previous.unwrap_or(Signature([0; 16])),
            after_is_set: previous.is_some(),
            before: before.unwrap_or(Signature([0; 16])),
            time_offset_secs: u32::try_from(self.settings.time_offset.as_secs()).unwrap_or(u32::MAX),
        };
        let from = match previous {
            Some(after) => format!("after {after}"),
            None => format!("of the last {} s", self.settings.time_offset.as_secs()),
        };
        let to = match before {
            Some(before) => format!("up to {before}"),
            None => "up to the newest product".to_owned(),
        };
        tracing::info!("{}: asking for the backlog {from} {to}", self.name);
        session.request_backlog(Clock::now(), spec, newest.map(ldm7_ldm_proto::fence_index))?;
        Ok(())
    }

    fn account(
        &self,
        mode: DeliveryMode,
        retransmitted_blocks: Option<u32>,
        info: ProdInfo,
        outcome: Result<InsertOutcome, InsertError>,
        latency_us: i64,
    ) {
        match outcome {
            Ok(InsertOutcome::Inserted { .. }) => {
                let counter = match mode {
                    DeliveryMode::Received => {
                        let blocks = retransmitted_blocks.unwrap_or(0);
                        self.counters.retransmitted_blocks.fetch_add(u64::from(blocks), Ordering::Relaxed);
                        if blocks == 0 {
                            self.counters.multicast_only.fetch_add(1, Ordering::Relaxed);
                        }
                        &self.counters.received
                    }
                    DeliveryMode::Inserted => &self.counters.inserted,
                    DeliveryMode::Backlog => &self.counters.backlog,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                // The product's line was logged by the inserter, right after the insertion.
                self.context.stats.record(&ldm7_metrics::DeliveryEvent {
                    link: self.stats_link(),
                    completed: Timestamp::from_system_time(SystemTime::now()),
                    mode: match mode {
                        DeliveryMode::Received => ldm7_metrics::Mode::fmtp(retransmitted_blocks.unwrap_or(0)),
                        DeliveryMode::Inserted => ldm7_metrics::Mode::Backstop,
                        DeliveryMode::Backlog => ldm7_metrics::Mode::Backlog,
                    },
                    size: u64::from(info.size),
                    latency_us,
                    retx_blocks: retransmitted_blocks.unwrap_or(0),
                });
            }
            Ok(InsertOutcome::Duplicate { .. }) => {
                self.counters.duplicates.fetch_add(1, Ordering::Relaxed);
                tracing::info!(target: PRODUCT, "Duplicate data-product: {info}");
            }
            Err(InsertError::TooBig { .. }) => {
                self.counters.insert_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("{}: Product too big for queue: {info}", self.name);
            }
            Err(error) => {
                self.counters.insert_errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!("{}: cannot insert {info}: {error}", self.name);
            }
        }
    }
}

/// How long the feed must be quiet (no FMTP notice) before the subscriber checks for products
/// lost whole at its end.
const TAIL_QUIET: Duration = Duration::from_secs(2);
/// How far back such a check reaches if the upstream no longer has the newest product.
const TAIL_OFFSET: Duration = Duration::from_secs(60);
/// How long after the FMTP connection the subscriber waits for a first product with its
/// signature before it asks for the backlog up to the newest product anyway: the default
/// retransmission deadline, by which every product FMTP started on has been delivered or
/// reported missed (and fetched through the backstop).
const BACKLOG_WAIT: Duration = Duration::from_secs(300);

/// The quiet-feed check (see [`Session::ask_tail`]): asked once per newest product, only
/// after the session's backlog is complete (END_BACKLOG or its fence: a new REQUEST_BACKLOG
/// replaces one being sent), and never while one is being answered.
#[derive(Debug, Default)]
struct TailCheck {
    backlog_done: bool,
    asked: bool,
    last_activity: Option<ldm7_types::Instant>,
    newest: Option<Signature>,
    checked: Option<Signature>,
    /// FMTP messages received at the last notice or look.
    traffic: Option<u64>,
}

impl TailCheck {
    /// An FMTP notice came; `look` is the receiver's traffic then (see [`TailCheck::ask`]), so
    /// that a check at the due time can tell at once whether anything came since.
    fn activity(&mut self, look: Option<(u64, u64)>) {
        self.last_activity = Some(Clock::now());
        self.traffic = look.map(|(messages, _)| messages);
    }

    fn received(&mut self, signature: Signature) {
        self.newest = Some(signature);
    }

    /// When to check, if a check is wanted.
    fn due(&self) -> Option<ldm7_types::Instant> {
        if !self.backlog_done || self.asked || self.newest.is_none() || self.newest == self.checked {
            return None;
        }
        self.last_activity.map(|at| at + TAIL_QUIET)
    }

    /// At the due time, with the FMTP messages received so far (multicast and repairs) and the
    /// products FMTP has in flight: marks the check asked and returns the product to ask after
    /// — unless messages arrived since the last look or products are in flight (they are still
    /// coming, or being repaired over a stalled connection, and FMTP resolves them itself: not
    /// quiet; look again later).
    fn ask(&mut self, look: Option<(u64, u64)>) -> Option<Signature> {
        let traffic = look.map(|(messages, _)| messages);
        let in_flight = look.is_some_and(|(_, in_flight)| in_flight > 0);
        if traffic != self.traffic || in_flight {
            self.activity(look);
            return None;
        }
        let newest = self.newest?;
        self.asked = true;
        self.checked = Some(newest);
        Some(newest)
    }
}

/// When a session asks for its backlog (see the module documentation, point 5): once, when the
/// session's first FMTP product (the receiver's first index) is resolved — the backlog ends
/// before it, by FMTP or through the backstop —, or, if that one is no longer to be had, at the
/// next product resolved with its signature; up to the newest product when the feed is quiet
/// (no FMTP datagram for [`TAIL_QUIET`] after the connection) or nothing has resolved after
/// [`BACKLOG_WAIT`].
#[derive(Debug, Default)]
struct BacklogStart {
    asked: bool,
    connected_at: Option<ldm7_types::Instant>,
    /// The receiver's first index (known once a multicast message has arrived).
    first: Option<u32>,
    /// Whether the product at `first` is resolved.
    first_resolved: bool,
}

impl BacklogStart {
    /// The FMTP repair connection is up: the waits start.
    fn connected(&mut self, now: ldm7_types::Instant) {
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

    /// When to ask up to the newest product: [`TAIL_QUIET`] after the connection while no
    /// multicast message has come, [`BACKLOG_WAIT`] after it once one has.
    fn due(&self) -> Option<ldm7_types::Instant> {
        let connected_at = self.connected_at.filter(|_| !self.asked)?;
        Some(connected_at + if self.first.is_some() { BACKLOG_WAIT } else { TAIL_QUIET })
    }

    /// Whether to ask for the backlog up to the newest product at `now`.
    fn expired(&mut self, now: ldm7_types::Instant) -> bool {
        match self.due() {
            Some(due) if now >= due => {
                self.asked = true;
                true
            }
            _ => false,
        }
    }
}

/// Products waiting for the inserter (each a spool file or one product in memory).
const INSERT_QUEUE_MAX: usize = 64;

/// Products the inserter checks together at most ([`hash_in_memory_products`]).
const HASHED_TOGETHER_MAX: usize = 16;

/// A product to check and insert.
struct Job {
    mode: DeliveryMode,
    index: Option<u32>,
    retransmitted_blocks: Option<u32>,
    /// The BOP creation time (FMTP); else the product's creation time is the start.
    start: Option<WallTime>,
    payload: Payload,
}

enum Payload {
    /// As FMTP delivered it: an XDR product (header and data) and the BOP metadata.
    Fmtp { product: ReceivedProduct, metadata: Vec<u8> },
    /// From the control connection (backstop, backlog).
    Control(ldm7_ldm_proto::Product),
}

impl Job {
    fn control(mode: DeliveryMode, index: Option<u32>, product: ldm7_ldm_proto::Product) -> Self {
        Self { mode, index, retransmitted_blocks: None, start: None, payload: Payload::Control(product) }
    }
}

/// What the inserter did with a job: the product's metadata and the queue's answer, or why the
/// product is unusable.
struct Done {
    job: JobHead,
    result: Result<(ProdInfo, Result<InsertOutcome, InsertError>), Unusable>,
    /// Microseconds from the product's creation to its insertion.
    latency_us: i64,
}

/// Why a received product was not inserted.
#[derive(Debug, thiserror::Error)]
enum Unusable {
    /// Its XDR header, size, metadata or MD5 is wrong.
    #[error(transparent)]
    Product(#[from] product::ProductError),
    /// The spool file could not be read (or its bytes did not hash to the signature).
    #[error("reading the spool: {0}")]
    Spool(#[source] std::io::Error),
    /// The receiver kept no bytes.
    #[error("the FMTP receiver kept no bytes")]
    Discarded,
    /// The size the metadata gives is not the number of bytes.
    #[error("{len} bytes for a product of {size}")]
    Size {
        /// Bytes received.
        len: usize,
        /// Bytes announced.
        size: u32,
    },
}

/// A job without its bytes.
#[derive(Clone, Copy)]
struct JobHead {
    mode: DeliveryMode,
    index: Option<u32>,
    retransmitted_blocks: Option<u32>,
    start: Option<WallTime>,
}

impl JobHead {
    /// Microseconds from the product's creation to now (0 for an unusable product); an
    /// inserted product's delivery line is logged here, right after its insertion and on the
    /// inserter's thread: a process killed in between (kill -9) loses at most the line of the
    /// product being inserted, not of every product whose result waits for the session.
    fn settle(&self, result: &Result<(ProdInfo, Result<InsertOutcome, InsertError>), Unusable>) -> i64 {
        let Ok((info, outcome)) = result else { return 0 };
        let latency_us = latency_us(self.start.unwrap_or_else(|| WallTime::from(info.arrival.to_system_time())));
        if let Ok(InsertOutcome::Inserted { .. }) = outcome {
            let delivery = Delivery {
                mode: self.mode,
                latency_us,
                index: self.index.map(ldm7_fmtp_proto::ProductIndex),
                retransmitted_blocks: self.retransmitted_blocks,
                info: info.clone(),
            };
            tracing::info!(target: PRODUCT, "{delivery}");
        }
        latency_us
    }
}

/// The thread that checks products and copies them into the queue, so that the session keeps
/// reading its connection and FMTP's notices while a large product is hashed and copied. Jobs
/// are done in order; at most [`INSERT_QUEUE_MAX`] wait (then submitting waits).
struct Inserter {
    jobs: Option<tokio::sync::mpsc::Sender<Job>>,
    done: tokio::sync::mpsc::UnboundedReceiver<Done>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Inserter {
    fn start(queue: Arc<Queue>, name: &str) -> Result<Self, SessionEnd> {
        let (jobs, mut incoming) = tokio::sync::mpsc::channel::<Job>(INSERT_QUEUE_MAX);
        let (done_tx, done) = tokio::sync::mpsc::unbounded_channel();
        let thread = std::thread::Builder::new()
            .name(format!("insert {name}"))
            .spawn(move || {
                let hasher = md5_many::Md5Many::new();
                let mut jobs = Vec::with_capacity(HASHED_TOGETHER_MAX);
                while let Some(job) = incoming.blocking_recv() {
                    // What waits besides is checked with it: the MD5s of products in memory
                    // side by side in SIMD lanes (under load, when jobs queue up).
                    jobs.push(job);
                    while jobs.len() < HASHED_TOGETHER_MAX {
                        match incoming.try_recv() {
                            Ok(job) => jobs.push(job),
                            Err(_) => break,
                        }
                    }
                    let digests = hash_in_memory_products(hasher, &jobs);
                    for (job, digest) in jobs.drain(..).zip(digests) {
                        let head = JobHead {
                            mode: job.mode,
                            index: job.index,
                            retransmitted_blocks: job.retransmitted_blocks,
                            start: job.start,
                        };
                        let result = match job.payload {
                            Payload::Fmtp { product, metadata } => insert_fmtp(&queue, product, &metadata, digest),
                            Payload::Control(product) => insert_control(&queue, product),
                        };
                        let latency_us = head.settle(&result);
                        if done_tx.send(Done { job: head, result, latency_us }).is_err() {
                            return;
                        }
                    }
                }
            })
            .map_err(SessionEnd::Inserter)?;
        Ok(Self { jobs: Some(jobs), done, thread: Some(thread) })
    }

    async fn submit(&mut self, job: Job) -> Result<(), SessionEnd> {
        let Some(jobs) = &self.jobs else { return Err(SessionEnd::InserterEnded) };
        jobs.send(job).await.map_err(|_| SessionEnd::InserterEnded)
    }

    /// Lets the inserter finish what it has; returns the results not read yet.
    async fn finish(mut self) -> Vec<Done> {
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
        let mut rest = Vec::new();
        while let Ok(done) = self.done.try_recv() {
            rest.push(done);
        }
        rest
    }
}

/// Checks a product that came over the control connection and inserts it (blocking).
fn insert_control(
    queue: &Queue,
    product: ldm7_ldm_proto::Product,
) -> Result<(ProdInfo, Result<InsertOutcome, InsertError>), Unusable> {
    let info = product.info;
    if product.data.len() != info.size as usize {
        return Err(Unusable::Size { len: product.data.len(), size: info.size });
    }
    product::verify(&info, &product.data)?;
    let outcome = queue.insert(&info, &product.data);
    Ok((info, outcome))
}

/// The FMTP index a notice is about, if any.
fn notice_index(notice: &ReceiverNotice) -> Option<u32> {
    match notice {
        ReceiverNotice::Delivered { delivery, .. } => Some(delivery.index.0),
        ReceiverNotice::Event(
            ReceiverEvent::Started { index }
            | ReceiverEvent::Missed { index, .. }
            | ReceiverEvent::IndexGap { last: index, .. },
        ) => Some(index.0),
        ReceiverNotice::Event(_) | ReceiverNotice::Connected(_) => None,
    }
}

/// An FMTP receiver's traffic for the quiet-feed check: messages received (multicast and
/// repair) and products in its hands.
fn fmtp_traffic(receiver: Option<&FmtpReceiver>) -> Option<(u64, u64)> {
    receiver.map(|receiver| {
        let counters = receiver.counters();
        let in_flight = counters.started.saturating_sub(counters.delivered + counters.missed);
        (counters.datagrams + counters.stream_messages, in_flight)
    })
}

/// The next FMTP notice, or never when there is no receiver yet.
async fn next_notice(receiver: &mut Option<FmtpReceiver>) -> Option<ReceiverNotice> {
    match receiver {
        Some(receiver) => receiver.next_notice().await,
        None => std::future::pending().await,
    }
}

/// The MD5 of the data of each FMTP product held in memory among `jobs` (by position; `None`
/// for the others and for those that do not decode: [`insert_fmtp`] reports why), hashed side
/// by side. One at a time, MD5 took a third of a demo subscriber's CPU; several products
/// hash in the time of one.
fn hash_in_memory_products(hasher: md5_many::Md5Many, jobs: &[Job]) -> Vec<Option<Signature>> {
    let data: Vec<Option<&[u8]>> = jobs
        .iter()
        .map(|job| match &job.payload {
            Payload::Fmtp { product: ReceivedProduct::Memory(bytes), metadata } => {
                let (info, at) = product::decode(bytes, bytes.len() as u64, metadata).ok()?;
                bytes.get(at..at.checked_add(info.size as usize)?)
            }
            _ => None,
        })
        .collect();
    let inputs: Vec<&[u8]> = data.iter().flatten().copied().collect();
    let mut digests = vec![[0u8; 16]; inputs.len()];
    if inputs.len() > 1 {
        hasher.hash_many(&inputs, &mut digests);
    } else if let Some(only) = inputs.first() {
        digests[0] = Signature::md5_of(only).0;
    }
    let mut digests = digests.into_iter();
    data.iter().map(|data| data.and_then(|_| digests.next()).map(Signature)).collect()
}

/// Checks a product FMTP delivered and copies it into the queue (blocking). `digest`: the MD5
/// of its data if already computed ([`hash_in_memory_products`]).
fn insert_fmtp(
    queue: &Queue,
    product: ReceivedProduct,
    metadata: &[u8],
    digest: Option<Signature>,
) -> Result<(ProdInfo, Result<InsertOutcome, InsertError>), Unusable> {
    let len = product.len();
    let spooled = match product {
        ReceivedProduct::Spooled(spooled) => spooled,
        ReceivedProduct::Memory(bytes) => {
            let (info, at) = product::decode(&bytes, len, metadata)?;
            let data = &bytes[at..at + info.size as usize];
            match digest {
                Some(computed) if computed != info.signature => {
                    return Err(ProductError::Signature { signature: info.signature, computed }.into());
                }
                Some(_) => {}
                None => product::verify(&info, data)?,
            }
            let outcome = queue.insert(&info, data);
            return Ok((info, outcome));
        }
        ReceivedProduct::Discarded => return Err(Unusable::Discarded),
    };
    let mut head = vec![0u8; HEAD_BYTES.min(usize::try_from(len).unwrap_or(HEAD_BYTES))];
    spooled.read_at(0, &mut head).map_err(Unusable::Spool)?;
    let (info, at) = product::decode(&head, len, metadata)?;
    let size = u64::from(info.size);
    let mut chunk = vec![0u8; COPY_CHUNK_BYTES.min(usize::try_from(size).unwrap_or(COPY_CHUNK_BYTES)).max(1)];
    let signature = info.signature;
    let outcome = queue.insert_streamed(&info, |out| {
        let mut hasher = Md5::new();
        let mut offset = 0u64;
        while offset < size {
            let count = chunk.len().min(usize::try_from(size - offset).unwrap_or(chunk.len()));
            spooled.read_at(at as u64 + offset, &mut chunk[..count])?;
            hasher.update(&chunk[..count]);
            out.write_all(&chunk[..count])?;
            offset += count as u64;
        }
        let computed = Signature(hasher.finalize().into());
        if computed != signature {
            return Err(std::io::Error::other(format!("the data's MD5 {computed} is not the signature {signature}")));
        }
        Ok(())
    });
    match outcome {
        Err(InsertError::Source(error)) => Err(Unusable::Spool(error)),
        other => Ok((info, other)),
    }
}

/// Microseconds from `start` (the BOP creation time, or a product's creation time) to now.
fn latency_us(start: WallTime) -> i64 {
    WallTime::from(SystemTime::now()).signed_nanos_since(start) / 1000
}

/// This host's attachment as SUBSCRIBE carries it (`dummy` without one).
fn vc_end(receive: &Receive) -> VcEndPoint {
    if receive.attachment.is_set() {
        VcEndPoint {
            switch_id: receive.attachment.switch.clone(),
            port_id: receive.attachment.port.clone(),
            vlan_id: receive.attachment.vlan,
        }
    } else {
        VcEndPoint::unused()
    }
}

/// The resume point of a RECEIVE (see the module documentation), kept in a small file: the
/// newest product before which nothing is missing. It is saved every second while it moves,
/// and when the session ends (a server stopping waits for its subscribers to save it).
///
/// Within a session, products are tracked by FMTP index from the first index the session saw:
/// the prefix `first..next` is resolved (delivered by FMTP or the backstop, or given up when
/// the upstream no longer has it) and the point may move to the newest product of that prefix —
/// but only once the session's backlog is complete, since the backlog brings what came before
/// `first`. A product still in FMTP's hands or asked for through the backstop holds the prefix
/// (and so the point) below it.
#[derive(Debug)]
pub(crate) struct Resume {
    path: PathBuf,
    /// What the file holds: where the next session's backlog starts.
    point: Option<Signature>,
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

impl Resume {
    pub(crate) fn load(path: PathBuf) -> Self {
        let point = std::fs::read_to_string(&path)
            .ok()
            .and_then(|text| text.lines().next().and_then(|line| line.trim().parse().ok()));
        Self {
            path,
            point,
            dirty: false,
            backlog_complete: false,
            first: None,
            next: 0,
            prefix_end: None,
            resolved: BTreeMap::new(),
        }
    }

    /// A session starts: returns where its backlog starts (the point so far).
    pub(crate) fn session_started(&mut self) -> Option<Signature> {
        self.backlog_complete = false;
        self.first = None;
        self.next = 0;
        self.prefix_end = None;
        self.resolved.clear();
        self.point
    }

    /// FMTP reported index `index` (delivered, missed, or the start of a gap): the session's
    /// first such index starts the prefix.
    pub(crate) fn seen(&mut self, index: u32) {
        if self.first.is_none() {
            self.first = Some(index);
        }
    }

    /// Index `index` is resolved: delivered (with its signature) or given up (`None`).
    pub(crate) fn resolved(&mut self, index: u32, signature: Option<Signature>) {
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

    pub(crate) fn backlog_complete(&mut self) {
        self.backlog_complete = true;
        self.advance();
    }

    fn advance(&mut self) {
        if self.backlog_complete && self.prefix_end.is_some() && self.point != self.prefix_end {
            self.point = self.prefix_end;
            self.dirty = true;
        }
    }

    pub(crate) fn save(&mut self) {
        let Some(point) = self.point.filter(|_| self.dirty) else { return };
        let temporary = self.path.with_extension("tmp");
        let saved =
            std::fs::write(&temporary, format!("{point}\n")).and_then(|()| std::fs::rename(&temporary, &self.path));
        match saved {
            Ok(()) => self.dirty = false,
            Err(error) => tracing::warn!("cannot save the LDM-7 resume point in {}: {error}", self.path.display()),
        }
    }
}

fn file_name(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' { c } else { '_' }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signature(n: u8) -> Signature {
        Signature([n; 16])
    }

    #[test]
    fn the_tail_is_checked_only_when_no_fmtp_message_came_since_the_last_look() {
        let mut tail = TailCheck { backlog_done: true, ..TailCheck::default() };
        tail.activity(Some((90, 1)));
        assert_eq!(tail.due(), None, "nothing received yet");
        tail.received(signature(3));
        assert!(tail.due().is_some());
        assert_eq!(tail.ask(Some((100, 0))), None, "messages since the last notice: repairs still coming");
        assert_eq!(tail.ask(Some((140, 0))), None);
        assert_eq!(tail.ask(Some((140, 2))), None, "no message, but two products in flight: FMTP resolves them");
        assert_eq!(tail.ask(Some((140, 0))), Some(signature(3)), "quiet: anything after the newest");
        assert_eq!(tail.due(), None, "once per newest product");
    }

    #[test]
    fn the_backlog_ends_before_the_sessions_first_product_or_reaches_the_newest_when_the_feed_is_quiet() {
        let start = ldm7_types::Instant::from_nanos(1_000_000_000);
        let (a, b) = (Signature([1; 16]), Signature([2; 16]));
        let mut lossy = BacklogStart::default();
        assert_eq!(lossy.due(), None, "nothing before the FMTP connection");
        lossy.connected(start);
        assert_eq!(lossy.due(), Some(start + TAIL_QUIET));
        lossy.started(10);
        assert_eq!(lossy.due(), Some(start + BACKLOG_WAIT), "datagrams arrive: not quiet");
        assert!(!lossy.expired(start + TAIL_QUIET), "the first product is still being repaired");
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
        assert!(quiet.expired(start + TAIL_QUIET), "no datagram at all: up to the newest");
        assert_eq!(quiet.resolved(10, Some(a)), None, "already asked");

        let mut stuck = BacklogStart::default();
        stuck.connected(start);
        stuck.started(10);
        assert!(stuck.expired(start + BACKLOG_WAIT), "nothing resolved for long: up to the newest");
    }

    /// An FMTP product held in memory (XDR header, data, padding), its BOP metadata (the
    /// signature) and its information.
    fn memory_product(ident: &str, data: &[u8]) -> (Job, ProdInfo) {
        let info = ProdInfo {
            arrival: Timestamp::from_unix_micros(1_700_000_000_000_000),
            signature: Signature::md5_of(data),
            origin: "vm".into(),
            feedtype: ldm7_types::FeedType::EXP,
            seqno: 1,
            ident: ident.into(),
            size: data.len() as u32,
        };
        let mut bytes = product::encode_header(&info);
        let len = product::fmtp_len(bytes.len(), info.size) as usize;
        bytes.extend_from_slice(data);
        bytes.resize(len, 0);
        let payload = Payload::Fmtp { product: ReceivedProduct::Memory(bytes), metadata: info.signature.0.to_vec() };
        let job = Job { mode: DeliveryMode::Received, index: None, retransmitted_blocks: None, start: None, payload };
        (job, info)
    }

    #[test]
    fn products_in_memory_are_hashed_together_and_a_corrupt_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let queue =
            Queue::create(&dir.path().join("q.pq"), ldm7_pq::Capacity { bytes: 1 << 22, slots: 100 }, false).unwrap();
        let (a, a_info) = memory_product("A", &b"first product ".repeat(1000));
        let (b, b_info) = memory_product("B", b"second");
        let (mut c, c_info) = memory_product("C", &[7; 70_001]);
        // C's data changed on its way: the same length, another MD5.
        if let Payload::Fmtp { product: ReceivedProduct::Memory(bytes), .. } = &mut c.payload {
            let at = bytes.len() - 10;
            bytes[at] ^= 1;
        }
        let discarded = Job {
            payload: Payload::Fmtp { product: ReceivedProduct::Discarded, metadata: vec![0; 16] },
            ..memory_product("D", b"d").0
        };
        let jobs = vec![a, discarded, b, c];
        let digests = hash_in_memory_products(md5_many::Md5Many::new(), &jobs);
        assert_eq!(digests[0], Some(a_info.signature));
        assert_eq!(digests[1], None, "nothing in memory");
        assert_eq!(digests[2], Some(b_info.signature));
        assert!(digests[3].is_some_and(|digest| digest != c_info.signature));
        let outcomes: Vec<_> = jobs
            .into_iter()
            .zip(digests)
            .map(|(job, digest)| match job.payload {
                Payload::Fmtp { product, metadata } => insert_fmtp(&queue, product, &metadata, digest),
                Payload::Control(_) => unreachable!(),
            })
            .collect();
        assert!(matches!(&outcomes[0], Ok((info, Ok(InsertOutcome::Inserted { .. }))) if info.ident == "A"));
        assert!(matches!(outcomes[1], Err(Unusable::Discarded)));
        assert!(matches!(&outcomes[2], Ok((info, Ok(InsertOutcome::Inserted { .. }))) if info.ident == "B"));
        assert!(matches!(outcomes[3], Err(Unusable::Product(product::ProductError::Signature { .. }))));
        // One alone is hashed too.
        let (alone, alone_info) = memory_product("E", b"alone");
        assert_eq!(hash_in_memory_products(md5_many::Md5Many::new(), &[alone]), [Some(alone_info.signature)]);
    }

    #[test]
    fn the_resume_point_is_the_end_of_the_resolved_prefix_after_the_backlog() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("resume");
        let mut resume = Resume::load(path.clone());
        assert_eq!(resume.session_started(), None);
        resume.seen(10);
        resume.resolved(12, Some(signature(12))); // 11 still in FMTP's hands
        resume.resolved(10, Some(signature(10)));
        assert_eq!(resume.point, None, "not before the session's backlog is complete");
        resume.backlog_complete();
        assert_eq!(resume.point, Some(signature(10)), "below 11, not yet resolved");
        resume.resolved(9, Some(signature(9))); // before the first index: the backlog's
        assert_eq!(resume.point, Some(signature(10)));
        resume.resolved(11, Some(signature(11)));
        assert_eq!(resume.point, Some(signature(12)));
        resume.resolved(14, Some(signature(14)));
        resume.resolved(13, None); // the upstream no longer has it: given up
        assert_eq!(resume.point, Some(signature(14)));
        resume.save();
        // A new process starts from the saved point; a new session keeps it until its backlog
        // is done.
        let mut again = Resume::load(path);
        assert_eq!(again.session_started(), Some(signature(14)));
        again.resolved(20, Some(signature(20)));
        assert_eq!(again.point, Some(signature(14)));
        again.backlog_complete();
        assert_eq!(again.point, Some(signature(20)));
    }
}
