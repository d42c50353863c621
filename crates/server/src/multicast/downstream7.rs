//! The subscriber side of LDM-7 (a RECEIVE entry; ldm7-multicast.md §2.2 steps 1, 3–5, §2.3,
//! §2.4): subscribes to the upstream, receives the feed by FMTP into the product queue, fetches
//! what FMTP could not deliver through the backstop (REQUEST_PRODUCT) and what it missed while
//! away through the backlog (REQUEST_BACKLOG), and logs one [`QueueDelivery`] line per product.
//!
//! One task per RECEIVE entry, on the server's LDM-7 runtime. What to ask the upstream for and
//! when — the backstop, the backlog and its fence, the quiet-feed tail check, the resume point
//! and the resubscription back-off — is decided by the sans-IO [`Downstream7`]
//! (`ldm7_ldm_proto::downstream7`, tested in virtual time); this driver feeds it what the
//! control session, the FMTP receiver and the inserter report, applies its decisions on the
//! control session, and keeps the resume point in a file ([`ResumeFile`]). The driver's own
//! work:
//!
//! 1. Connects to the upstream and sends SUBSCRIBE (feed, this host's attachment). A refusal or
//!    a lost connection is retried after the back-off the core says, for as long as the server
//!    runs; the first failure of an outage is logged as a warning, the retries at debug level,
//!    and the resubscription once it succeeds.
//! 2. On `Subscribed`: configures the address it was given on the RECEIVE entry's interface if
//!    one is named (needs root), joins the group there (or on loopback when the address is a
//!    loopback one) and connects its FMTP repair connection *from* that address — the publisher
//!    only takes repair connections from addresses it handed out.
//! 3. Each product FMTP delivers is written into a spool file as it arrives (never whole in
//!    memory beyond the receiver's bounds), checked (XDR header, BOP metadata, MD5 of the data)
//!    and copied from the spool into the queue in one pass. A product that fails the check is
//!    fetched through the backstop instead.
//! 4. The answers to REQUEST_PRODUCT and REQUEST_BACKLOG come on the control connection and are
//!    inserted (`Inserted`, `Backlog`).
//!
//! Duplicates (a product that came both ways) are dropped by the queue and counted.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use ldm7_fmtp::udp::{MulticastConfig, receive_buffer_bytes};
use ldm7_fmtp::{FmtpReceiver, ReceivedBytes, ReceiverNotice, ReceiverOptions, md5_side_by_side};
use ldm7_fmtp_proto::{ParityChoice, ParityConfig, ReceiveTimer, ReceiverConfig, ReceiverEvent, WallTime};
use ldm7_io::Clock;
use ldm7_io::log_target::PRODUCT;
use ldm7_ldm_proto::downstream7::{
    BacklogReason, Downstream7, Downstream7Config, FmtpReport, Traffic, UpstreamRequest,
};
use ldm7_ldm_proto::{
    BacklogSpec, McastSubInfo, SessionError, SubscribeAnswer, SubscribeOffer, Subscriber, SubscriberConfig,
    SubscriberEvent, VcEndPoint,
};
use ldm7_metrics::{DeliveryMode, QueueDelivery};
use ldm7_pq::{InsertError, InsertOutcome, Queue};
use ldm7_types::{ProdInfo, Signature, Timestamp};
use md5::{Digest, Md5};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::product::{self, ProductError};
use crate::config::Receive;
use crate::settings::ReceiveSettings;

/// Bytes read from the head of a spooled product to decode its XDR header (the largest
/// `prod_info` is 8 + 16 + 4 + 64 + 4 + 4 + 4 + 256 + 4 bytes).
const HEAD_BYTES: usize = 512;
/// Chunk size when copying a spooled product into the queue.
const COPY_CHUNK_BYTES: usize = 256 << 10;
/// How often the resume point (last product's signature) is saved while products arrive.
const SAVE_EVERY: Duration = Duration::from_secs(1);
/// How long a connection to the upstream may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
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
    Address { address: ipnet::IpNet, interface: String, source: ldm7_net::hostcfg::AddressError },
}

/// Runs one RECEIVE until the server stops.
pub async fn run(
    context: SubscriberContext,
    receive: Receive,
    settings: ReceiveSettings,
    counters: Arc<SubscriberCounters>,
) {
    let port = receive.port.unwrap_or(context.server_port);
    let name = format!("{} {}", ldm7_types::host::join(&receive.host, port), receive.feedtype);
    let state_path = context.state_dir.join(format!(
        ".ldm7-{}-{}-{port}.last",
        file_name(&receive.feedtype.to_string()),
        file_name(&receive.host)
    ));
    let mut resume = ResumeFile::new(state_path);
    let config = Downstream7Config {
        time_offset: settings.time_offset,
        retry_min: settings.retry_min,
        retry_max: settings.retry_max,
    };
    let mut core = Downstream7::new(config, resume.load());
    let mut stop = context.stop.clone();
    tracing::info!(
        "Downstream LDM7 starting up: remoteLDM7={}, feed={}, fmtpIface={}, vcEndPoint={}",
        ldm7_types::host::join(&receive.host, port),
        receive.feedtype,
        receive.interface.as_deref().unwrap_or("-"),
        vc_end(&receive).switch_id
    );
    loop {
        core.session_started(Clock::now());
        let mut session = Session {
            context: &context,
            receive: &receive,
            settings: &settings,
            counters: &counters,
            name: &name,
            port,
            core: &mut core,
            resume: &mut resume,
            configured: None,
        };
        let end = session.run().await;
        if matches!(end, SessionEnd::Stopping) {
            break;
        }
        let resubscribe = core.session_ended(Clock::now());
        if resubscribe.outage_starts {
            tracing::warn!("{name}: {end}; resubscribing with back-off until it works");
        } else {
            tracing::debug!("{name}: {end}");
        }
        let delay = resubscribe.delay;
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = stop.changed() => {}
        }
        if *stop.borrow() {
            break;
        }
    }
    resume.save(&mut core);
}

struct Session<'a> {
    context: &'a SubscriberContext,
    receive: &'a Receive,
    settings: &'a ReceiveSettings,
    counters: &'a SubscriberCounters,
    name: &'a str,
    port: u16,
    /// The decisions.
    core: &'a mut Downstream7,
    resume: &'a mut ResumeFile,
    /// The address this session configured on the RECEIVE interface.
    configured: Option<(String, ipnet::IpNet)>,
}

impl Session<'_> {
    async fn run(&mut self) -> SessionEnd {
        let address = ldm7_types::host::join(&self.receive.host, self.port);
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
        let mut last_save = Clock::now();
        // The kernel's drop count of this session's receiver, as last accounted.
        let mut host_drops_seen = 0u64;
        let mut host_drops_logged: Option<ldm7_types::Instant> = None;
        let result = 'session: loop {
            // Events of the control session.
            while let Some(event) = session.poll_event() {
                if let Some(closed) = self.on_event(event, &mut receiver, &mut inserter, &mut host_drops_seen).await? {
                    break 'session closed;
                }
            }
            self.apply(&mut session)?;
            if let Some(receiver) = &receiver {
                let drops = receiver.driver_counters().host_drops;
                if drops > host_drops_seen {
                    self.on_host_drops(drops - host_drops_seen, &mut host_drops_logged);
                    host_drops_seen = drops;
                }
            }
            if Clock::now() - last_save >= SAVE_EVERY {
                self.resume.save(self.core);
                last_save = Clock::now();
            }
            // Output is written as the socket takes it, in the same select as the reads: a
            // subscriber that stopped reading while it waited to write could deadlock with an
            // upstream doing the same (its missed products one way, our requests the other).
            session.take_output(&mut out);
            let timeout = session.poll_timeout().map(Clock::to_std).map(tokio::time::Instant::from_std);
            let far = tokio::time::Instant::now() + Duration::from_secs(3600);
            // The backlog up to the newest product, the quiet-feed check.
            let decision_due = self.core.poll_timeout().map(Clock::to_std).map(tokio::time::Instant::from_std);
            tokio::select! {
                () = tokio::time::sleep_until(decision_due.unwrap_or(far)), if decision_due.is_some() => {
                    self.core.handle_timeout(Clock::now(), fmtp_traffic(receiver.as_ref(), inserter.fmtp_waiting));
                }
                written = write.write(&out), if !out.is_empty() => {
                    let count = written?;
                    out.drain(..count);
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
                            let report = fmtp_report(&notice);
                            self.core.fmtp(Clock::now(), report, fmtp_traffic(receiver.as_ref(), inserter.fmtp_waiting));
                            self.on_notice(&mut inserter, notice).await?;
                        }
                        None => {
                            let ended = match receiver.take() {
                                Some(receiver) => {
                                    log_receiver_totals(self.name, &receiver);
                                    receiver.finish().await.err().map(SessionEnd::Fmtp)
                                }
                                None => None,
                            };
                            break Err(ended.unwrap_or(SessionEnd::FmtpEnded));
                        }
                    }
                }
                done = inserter.done.recv() => {
                    match done {
                        Some(done) => {
                            inserter.took(&done);
                            self.on_done(done);
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
            log_receiver_totals(self.name, &receiver);
            let _ = receiver.finish().await;
        }
        // The address goes back to the publisher's pool with the session: take it off the
        // interface, so that no two hosts of the feed's subnet ever hold it at once.
        if let Some((interface, cidr)) = self.configured.take() {
            let removed = match cidr {
                ipnet::IpNet::V4(v4) => ldm7_net::hostcfg::remove_address(
                    None,
                    &interface,
                    ldm7_net::hostcfg::Ipv4Cidr { address: v4.addr(), prefix_len: v4.prefix_len() },
                ),
                ipnet::IpNet::V6(v6) => ldm7_net::hostcfg::remove_address6(None, &interface, v6),
            };
            if let Err(error) = removed {
                tracing::warn!("{}: cannot remove {cidr} from {interface}: {error}", self.name);
            }
        }
        // Products handed to the inserter are inserted and accounted before the session ends.
        for done in inserter.finish().await {
            self.on_done(done);
        }
        let _ = self.apply(&mut session);
        self.resume.save(self.core);
        match result {
            Ok(()) => Err(SessionEnd::Closed),
            Err(end) => Err(end),
        }
    }

    /// Acts on one event of the control session; `Some` with how it ended when it closed.
    async fn on_event(
        &mut self,
        event: SubscriberEvent,
        receiver: &mut Option<FmtpReceiver>,
        inserter: &mut Inserter,
        host_drops_seen: &mut u64,
    ) -> Result<Option<Result<(), SessionEnd>>, SessionEnd> {
        match event {
            SubscriberEvent::Subscribed { info } => {
                *receiver = Some(self.start_receiver(&info)?);
                *host_drops_seen = 0;
                self.counters.subscriptions.fetch_add(1, Ordering::Relaxed);
                if self.core.subscribed() {
                    tracing::info!("{}: resubscribed", self.name);
                }
                let repair = match info.answer {
                    None => "unicast repairs (the publisher is not ldm7)".to_owned(),
                    Some(SubscribeAnswer { parity: None, .. }) => "unicast repairs (no parity)".to_owned(),
                    Some(SubscribeAnswer { parity: Some(parity), .. }) => {
                        format!("parity repair {}/{} on port {}", parity.group_blocks, parity.shards, parity.port)
                    }
                };
                tracing::info!(
                    "{}: subscribed: group {}, FMTP server {}, FMTP address {}, {repair}",
                    self.name,
                    info.mcast_info.group,
                    info.mcast_info.server,
                    fmtp_address(&info)
                );
            }
            SubscriberEvent::Refused { status } => return Err(SessionEnd::Refused(status)),
            SubscriberEvent::MissedProduct { index, product } => {
                self.core.backstop_delivered(index, product.info.signature);
                inserter.submit(Job::control(DeliveryMode::Inserted, Some(index), product)).await?;
            }
            SubscriberEvent::NoSuchProduct { index } => {
                self.core.no_such_product(index);
                self.counters.no_such_product.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("{}: Requested product {index} doesn't exist", self.name);
            }
            SubscriberEvent::BacklogProduct { product } => {
                inserter.submit(Job::control(DeliveryMode::Backlog, None, product)).await?;
            }
            SubscriberEvent::BacklogComplete => {
                if self.core.backlog_complete() {
                    tracing::debug!("{}: the quiet feed's tail is complete", self.name);
                } else {
                    tracing::info!(
                        "All backlog data-products received: feed={}, server={}",
                        self.receive.feedtype,
                        self.receive.host
                    );
                }
            }
            SubscriberEvent::Unexpected { proc, index, expected } => {
                tracing::warn!("{}: Unexpected product: {proc:?} for index {index} (expected {expected:?})", self.name);
            }
            SubscriberEvent::RequestsOverBound => {
                tracing::warn!("{}: too many products requested at once; the backlog will cover the rest", self.name);
            }
            SubscriberEvent::Unserved(call) => tracing::warn!("{}: {call}", self.name),
            SubscriberEvent::Closed(result) => return Ok(Some(result.map_err(SessionEnd::from))),
        }
        Ok(None)
    }

    /// Applies the decisions made so far on the control session (module documentation).
    fn apply(&mut self, session: &mut Subscriber) -> Result<(), SessionEnd> {
        while let Some(decision) = self.core.poll_decision() {
            let now = Clock::now();
            match decision {
                UpstreamRequest::RequestProduct(index) => {
                    self.counters.requested.fetch_add(1, Ordering::Relaxed);
                    session.request_product(now, index)?;
                }
                UpstreamRequest::RequestBacklog { spec, fence, reason } => {
                    self.log_backlog(&spec, reason);
                    session.request_backlog(now, spec, fence)?;
                }
                UpstreamRequest::FenceBacklogs(fence) => {
                    if session.pending_backlogs() > 0 {
                        session.fence_backlogs(now, fence)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Says which backlog is asked for.
    fn log_backlog(&self, spec: &BacklogSpec, reason: BacklogReason) {
        if reason == BacklogReason::Tail {
            tracing::info!("{}: feed quiet; asking for anything after {}", self.name, spec.after);
            return;
        }
        let from = match spec.after() {
            Some(after) => format!("after {after}"),
            None => format!("of the last {} s", spec.time_offset_secs),
        };
        let to = match reason {
            BacklogReason::BeforeFirst => format!("up to {}", spec.before),
            _ => "up to the newest product".to_owned(),
        };
        tracing::info!("{}: asking for the backlog {from} {to}", self.name);
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

    /// Logs the removal of an address a session left behind.
    fn remove_stale(
        &self,
        interface: &str,
        removed: Result<bool, ldm7_net::hostcfg::AddressError>,
        stale: impl std::fmt::Display,
    ) {
        match removed {
            Ok(_) => tracing::info!("{}: removed the stale address {stale} from {interface}", self.name),
            Err(error) => tracing::warn!("{}: cannot remove {stale} from {interface}: {error}", self.name),
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
        let given = fmtp_address(info);
        if group.is_ipv4() != given.addr().is_ipv4() {
            return Err(reply(format!("group {group} and FMTP address {given} are of different families")));
        }
        let address = given.addr();
        if let Some(interface) = &self.receive.interface {
            match given {
                ipnet::IpNet::V4(v4) => {
                    let cidr = ldm7_net::hostcfg::Ipv4Cidr { address: v4.addr(), prefix_len: v4.prefix_len() };
                    // Addresses of the same subnet left by a session that ended without
                    // cleaning up (kill -9) go first: the publisher may hand them to another host.
                    for stale in ldm7_net::hostcfg::addresses(None, interface).unwrap_or_default() {
                        if stale != cidr && stale.prefix_len == cidr.prefix_len && stale.network() == cidr.network() {
                            self.remove_stale(
                                interface,
                                ldm7_net::hostcfg::remove_address(None, interface, stale),
                                stale,
                            );
                        }
                    }
                    ldm7_net::hostcfg::ensure_address(None, interface, cidr)
                }
                ipnet::IpNet::V6(v6) => {
                    for stale in ldm7_net::hostcfg::addresses6(None, interface).unwrap_or_default() {
                        if stale != v6 && stale.prefix_len() == v6.prefix_len() && stale.network() == v6.network() {
                            self.remove_stale(
                                interface,
                                ldm7_net::hostcfg::remove_address6(None, interface, stale),
                                stale,
                            );
                        }
                    }
                    ldm7_net::hostcfg::ensure_address6(None, interface, v6)
                }
            }
            .map_err(|source| SessionEnd::Address {
                address: given,
                interface: interface.clone(),
                source,
            })?;
            self.configured = Some((interface.clone(), given));
        }
        let join = match address {
            IpAddr::V4(v4) if v4.is_loopback() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            other => other,
        };
        let rate = self.settings.rate.bits_per_s();
        let multicast = MulticastConfig {
            group,
            interface: join,
            interface_index: 0,
            ttl: 1,
            loopback: true,
            buffer_bytes: receive_buffer_bytes(rate, self.settings.receive_gap),
        };
        // Parity as the publisher answered (never offered with `parity = "off"`).
        let parity = info.answer.and_then(|answer| answer.parity).filter(|_| self.settings.parity != ParityChoice::Off);
        let mut options = ReceiverOptions::new(multicast, server);
        // An IPv6 source-specific group (ff3x::/32) is joined for its sender only (an MLDv2
        // INCLUDE report): the publisher multicasts from its FMTP server's address.
        if let IpAddr::V6(v6) = group.ip()
            && v6.segments()[0] & 0xfff0 == 0xff30
        {
            options.source = Some(server.ip());
        }
        options.parity_group = parity.map(|answer| SocketAddr::new(group.ip(), answer.port));
        options.mac_level = self.settings.mac_level;
        if let Some(path) = &self.settings.pin {
            // Never without the pin it asks for: a file unreadable now ends the session.
            let key = ldm7_config::keys::read_pin(path).map_err(|error| SessionEnd::Pin(error.to_string()))?;
            options.pin = Some(key);
        }
        let in_flight = self.settings.in_flight_bytes_max.bytes();
        options.proto = ReceiverConfig {
            // An ldm7 publisher (it answered the extension) probes its tail: the timer may wait
            // out a pause of the multicast instead of asking for the tail it will still send.
            receive_timer: match info.answer {
                Some(_) => ReceiveTimer::for_probing_sender(rate),
                None => ReceiveTimer { rate_bits_per_s: rate, ..ReceiveTimer::default() },
            },
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
        options.local_addr = (!address.is_unspecified()).then_some(address);
        options.connect_deadline = REPAIR_CONNECT_DEADLINE;
        options.drop_probability = self.settings.drop;
        // Subscribers of one host share its address: this server's own port tells them apart.
        let address_bits = match address {
            IpAddr::V4(v4) => u64::from(u32::from(v4)),
            IpAddr::V6(v6) => (u128::from(v6) as u64) ^ ((u128::from(v6) >> 64) as u64),
        };
        options.seed = address_bits ^ u64::from(self.port) ^ (u64::from(self.context.server_port) << 32);
        Ok(FmtpReceiver::start(options)?)
    }

    /// Handles an FMTP notice: a delivered product goes to the inserter, a missed one is asked
    /// for through the backstop.
    async fn on_notice(&mut self, inserter: &mut Inserter, notice: ReceiverNotice) -> Result<(), SessionEnd> {
        match notice {
            ReceiverNotice::Connected(server) => {
                tracing::info!("{}: FMTP repair connection to {server} up", self.name);
                Ok(())
            }
            ReceiverNotice::Delivered { delivery, product } => {
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
                tracing::info!("Missed product: prodIndex={} ({reason:?})", index.0);
                Ok(())
            }
            ReceiverNotice::Event(ReceiverEvent::IndexGap { first, last }) => {
                tracing::warn!(
                    "{}: products {}..={} skipped by the product index; asking for them",
                    self.name,
                    first.0,
                    last.0
                );
                Ok(())
            }
            ReceiverNotice::Event(ReceiverEvent::BoundHit { bound, index }) => {
                tracing::debug!("{}: FMTP receiver bound {bound:?} hit ({index:?})", self.name);
                Ok(())
            }
            ReceiverNotice::Event(ReceiverEvent::Started { index }) => {
                tracing::debug!("{}: first FMTP product: index {}", self.name, index.0);
                Ok(())
            }
            ReceiverNotice::Event(ReceiverEvent::Delivered(_)) => Ok(()),
        }
    }

    /// Accounts a product the inserter finished and tells the decisions: an FMTP product
    /// inserted moves the resume point; one unusable is asked for again.
    fn on_done(&mut self, done: Done) {
        let Done { job, result, latency_us } = done;
        match result {
            Ok((info, outcome)) => {
                let signature = info.signature;
                let inserted = outcome.is_ok();
                self.account(job.mode, job.retransmitted_blocks, info, outcome, latency_us);
                if let (DeliveryMode::Received, Some(index), true) = (job.mode, job.index, inserted) {
                    self.core.inserted(index, signature);
                }
            }
            Err(error) => {
                self.counters.corrupt.fetch_add(1, Ordering::Relaxed);
                match (job.mode, job.index) {
                    (DeliveryMode::Received, Some(index)) => {
                        tracing::warn!("{}: FMTP product {index} unusable ({error}); asking for it again", self.name);
                        self.core.unusable(index);
                    }
                    (mode, _) => {
                        tracing::error!("{}: {} product unusable ({error}); dropped", self.name, mode.keyword());
                    }
                }
            }
        }
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
    Fmtp { product: ReceivedBytes, metadata: Vec<u8> },
    /// From the control connection (backstop, backlog).
    Control(ldm7_ldm_proto::WireProduct),
}

impl Job {
    fn control(mode: DeliveryMode, index: Option<u32>, product: ldm7_ldm_proto::WireProduct) -> Self {
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
            let delivery = QueueDelivery {
                mode: self.mode,
                latency_us,
                index: self.index,
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
    /// Products FMTP delivered that are submitted and not inserted yet ([`fmtp_traffic`]).
    fmtp_waiting: u64,
}

impl Inserter {
    fn start(queue: Arc<Queue>, name: &str) -> Result<Self, SessionEnd> {
        let (jobs, mut incoming) = tokio::sync::mpsc::channel::<Job>(INSERT_QUEUE_MAX);
        let (done_tx, done) = tokio::sync::mpsc::unbounded_channel();
        let thread = std::thread::Builder::new()
            .name(format!("insert {name}"))
            .spawn(move || {
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
                    let digests = hash_in_memory_products(&jobs);
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
        Ok(Self { jobs: Some(jobs), done, thread: Some(thread), fmtp_waiting: 0 })
    }

    async fn submit(&mut self, job: Job) -> Result<(), SessionEnd> {
        let Some(jobs) = &self.jobs else { return Err(SessionEnd::InserterEnded) };
        let fmtp = job.mode == DeliveryMode::Received;
        jobs.send(job).await.map_err(|_| SessionEnd::InserterEnded)?;
        self.fmtp_waiting += u64::from(fmtp);
        Ok(())
    }

    /// A job is done: one FMTP product fewer waiting, if it was one.
    fn took(&mut self, done: &Done) {
        if done.job.mode == DeliveryMode::Received {
            self.fmtp_waiting = self.fmtp_waiting.saturating_sub(1);
        }
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
    product: ldm7_ldm_proto::WireProduct,
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
fn fmtp_report(notice: &ReceiverNotice) -> FmtpReport {
    match notice {
        ReceiverNotice::Connected(_) => FmtpReport::Connected,
        ReceiverNotice::Delivered { delivery, .. } => {
            let signature =
                delivery.metadata.get(..16).and_then(|bytes| <[u8; 16]>::try_from(bytes).ok()).map(Signature);
            FmtpReport::Delivered(delivery.index.0, signature)
        }
        ReceiverNotice::Event(ReceiverEvent::Started { index }) => FmtpReport::Started(index.0),
        ReceiverNotice::Event(ReceiverEvent::Missed { index, .. }) => FmtpReport::Missed(index.0),
        ReceiverNotice::Event(ReceiverEvent::IndexGap { first, last }) => FmtpReport::IndexGap(first.0, last.0),
        ReceiverNotice::Event(_) => FmtpReport::Other,
    }
}

/// An FMTP receiver's traffic for the quiet-feed check: messages received (multicast and
/// repair) and products in its hands — being received, or delivered and waiting for the
/// inserter (`inserting`) — or datagrams read and not yet handled (one more "in its hands").
/// A receiver behind the multicast on a loaded host is not quiet: in `ldm7 lab idd` (seed 2)
/// relays whose receivers lagged took the pause of their counters for a quiet feed, and their
/// tail checks fetched by backlog what their readers already held; and with the receiver caught
/// up but the inserter behind (2026-11-30), each product inserted moved the check's newest
/// product and a check followed each backlog at once, fetching what the inserter held.
fn fmtp_traffic(receiver: Option<&FmtpReceiver>, inserting: u64) -> Traffic {
    receiver.map(|receiver| {
        let counters = receiver.counters();
        let in_flight = counters.started.saturating_sub(counters.delivered + counters.missed);
        let unhandled = u64::from(receiver.unhandled_bytes() > 0);
        (counters.datagrams + counters.stream_messages, in_flight + unhandled + inserting)
    })
}

/// Logs what a session's FMTP receiver totalled (as the publisher logs its sender's): how its
/// products came and what their repair cost, for an operator weighing the path's loss.
fn log_receiver_totals(name: &str, receiver: &FmtpReceiver) {
    let c = receiver.counters();
    let host_drops = receiver.driver_counters().host_drops;
    tracing::info!(
        "{name}: FMTP receiver totals: {} products delivered, {} missed; {} datagrams ({} bytes), {} duplicates, \
         {} stale, {} host drops; repairs: {} RETX_REQ ({} bytes asked), {} blocks retransmitted, {} PARITY_REQ, \
         {} parity shards taken ({} unused), {} blocks recovered from parity, {} fallbacks to RETX_REQ; {} EOP_REQ \
         (receive timer), {} retransmitted blocks held already, {} multicast blocks asked for before they came",
        c.delivered,
        c.missed,
        c.datagrams,
        c.datagram_bytes,
        c.duplicates,
        c.stale,
        host_drops,
        c.retx_requests,
        c.retx_request_bytes,
        c.retx_blocks,
        c.parity_requests,
        c.parity_shards,
        c.parity_unused,
        c.parity_blocks,
        c.parity_fallbacks,
        c.eop_requests,
        c.retx_duplicates,
        c.multicast_after_asked
    );
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
fn hash_in_memory_products(jobs: &[Job]) -> Vec<Option<Signature>> {
    let data: Vec<Option<&[u8]>> = jobs
        .iter()
        .map(|job| match &job.payload {
            Payload::Fmtp { product: ReceivedBytes::Memory(bytes), metadata } => {
                let (info, at) = product::decode(bytes, bytes.len() as u64, metadata).ok()?;
                bytes.get(at..at.checked_add(info.size as usize)?)
            }
            _ => None,
        })
        .collect();
    let inputs: Vec<&[u8]> = data.iter().flatten().copied().collect();
    let mut digests = md5_side_by_side(&inputs).into_iter();
    data.iter().map(|data| data.and_then(|_| digests.next()).map(Signature)).collect()
}

/// Checks a product FMTP delivered and copies it into the queue (blocking). `digest`: the MD5
/// of its data if already computed ([`hash_in_memory_products`]).
fn insert_fmtp(
    queue: &Queue,
    product: ReceivedBytes,
    metadata: &[u8],
    digest: Option<Signature>,
) -> Result<(ProdInfo, Result<InsertOutcome, InsertError>), Unusable> {
    let len = product.len();
    let spooled = match product {
        ReceivedBytes::Spooled(spooled) => spooled,
        ReceivedBytes::Memory(bytes) => {
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
        ReceivedBytes::Discarded => return Err(Unusable::Discarded),
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
/// The FMTP client address a subscription reply gives: the IPv6 one of the ldm7 extension
/// (an IPv6 feed), else the reference's IPv4 `CidrAddr`.
fn fmtp_address(info: &McastSubInfo) -> ipnet::IpNet {
    match info.answer.and_then(|answer| answer.address6) {
        Some((address, prefix_len)) => {
            ipnet::IpNet::V6(ipnet::Ipv6Net::new(address, prefix_len).unwrap_or_else(|_| ipnet::Ipv6Net::from(address)))
        }
        None => ipnet::IpNet::V4(
            ipnet::Ipv4Net::new(info.fmtp_addr.addr, info.fmtp_addr.prefix_len)
                .unwrap_or_else(|_| ipnet::Ipv4Net::from(info.fmtp_addr.addr)),
        ),
    }
}

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

/// The file a RECEIVE's resume point is kept in (the point itself: [`Downstream7`]'s
/// `ResumePoint`): read at start, written every [`SAVE_EVERY`] while it moves and when the
/// session ends (a server stopping waits for its subscribers to save it).
#[derive(Debug)]
pub(crate) struct ResumeFile {
    path: PathBuf,
}

impl ResumeFile {
    pub(crate) fn new(path: PathBuf) -> Self {
        Self { path }
    }

    /// The point saved before, if any.
    pub(crate) fn load(&self) -> Option<Signature> {
        std::fs::read_to_string(&self.path)
            .ok()
            .and_then(|text| text.lines().next().and_then(|line| line.trim().parse().ok()))
    }

    /// Writes the point if it moved since it was last written.
    pub(crate) fn save(&mut self, core: &mut Downstream7) {
        let Some(point) = core.resume_to_save() else { return };
        let temporary = self.path.with_extension("tmp");
        let saved =
            std::fs::write(&temporary, format!("{point}\n")).and_then(|()| std::fs::rename(&temporary, &self.path));
        match saved {
            Ok(()) => core.resume_saved(),
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
        let payload = Payload::Fmtp { product: ReceivedBytes::Memory(bytes), metadata: info.signature.0.to_vec() };
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
        if let Payload::Fmtp { product: ReceivedBytes::Memory(bytes), .. } = &mut c.payload {
            let at = bytes.len() - 10;
            bytes[at] ^= 1;
        }
        let discarded = Job {
            payload: Payload::Fmtp { product: ReceivedBytes::Discarded, metadata: vec![0; 16] },
            ..memory_product("D", b"d").0
        };
        let jobs = vec![a, discarded, b, c];
        let digests = hash_in_memory_products(&jobs);
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
        assert_eq!(hash_in_memory_products(&[alone]), [Some(alone_info.signature)]);
    }

    #[test]
    fn the_resume_file_keeps_the_point_across_processes() {
        let dir = tempfile::tempdir().unwrap();
        let mut file = ResumeFile::new(dir.path().join("resume"));
        assert_eq!(file.load(), None);
        let config = Downstream7Config {
            time_offset: Duration::from_secs(3600),
            retry_min: Duration::from_secs(1),
            retry_max: Duration::from_secs(8),
        };
        let mut core = Downstream7::new(config.clone(), None);
        let now = ldm7_types::Instant::from_nanos(1);
        core.session_started(now);
        core.fmtp(now, FmtpReport::Started(10), None);
        core.inserted(10, signature(10));
        core.backlog_complete();
        file.save(&mut core);
        assert_eq!(core.resume_to_save(), None, "saved");
        assert_eq!(ResumeFile::new(dir.path().join("resume")).load(), Some(signature(10)));
    }
}
