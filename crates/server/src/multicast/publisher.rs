//! The publisher side of LDM-7 (ldm7-multicast.md §2.2 step 2, §4; RESEARCH.md §2):
//! [`Multicaster`] answers SUBSCRIBEs and runs one [`Feed`] per multicast feed — an FMTP
//! sender fed from the product queue — started with its first subscription and stopped after
//! its last.
//!
//! A SUBSCRIBE is decided in this order, each refusal one log line and a status on the wire:
//! the feed reduced to what ALLOW grants the host (nothing → `LDM7_UNAUTH`); a MULTICAST entry
//! for it (none → `LDM7_NOENT`); the feed's sender running (cannot start → `LDM7_MCAST`); an
//! address for the subscriber (the feed's pool, §4.2, or the subscriber's own address on a
//! feed without a subnet, §4.3; none left → `LDM7_MCAST`, "all addresses reserved" as the
//! reference); the subscriber's leg added to the path when a path service is configured and the
//! subscriber named its attachment (fails → `LDM7_MCAST`). The [`Subscription`] undoes all of
//! it when dropped (the session ended): address released, leg removed, the feed stopped if it
//! was the last.
//!
//! A feed's products are read from the queue as they are inserted, in queue order, by one
//! thread per feed ([`Feed`]): each product's index is written to the feed's persistent
//! product-index map before it is handed to FMTP, and FMTP reads its bytes from the queue block
//! by block ([`super::product::QueuedProduct`]), so memory holds at most
//! `product_queue_max` products' headers. Indexes are consecutive from the map's next index, so
//! a restarted publisher continues the sequence. Products are multicast even in the moment
//! between a subscription and its receiver's repair connection (the reference skips them):
//! an index is then never skipped, and the subscriber's backlog would fetch them anyway.
//!
//! A feed with `rate_control` settings runs the online latency-violation monitor
//! ([`super::rate_control`]): it starts at the first rate step, learns each subscriber's
//! latency from its RETX_END, and steps the path rate (path service, the HTB tree of the
//! multicast interface if it has one, FMTP pacing) every interval.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use ldm7_fmtp::udp::{MulticastConfig, buffer_bytes_for_rate};
use ldm7_fmtp::{FmtpSender, SenderNotice, SenderOptions};
use ldm7_fmtp_proto::{DeadlinePolicy, Pacing, Product, ProductIndex, SenderConfig, SenderEvent, WallClock};
use ldm7_io::Clock;
use ldm7_ldm_proto::{CidrAddr, Ldm7Status, McastInfo, McastSubInfo, VcEndPoint};
use ldm7_net::hostcfg::Ipv4Cidr;
use ldm7_net::path::{Endpoint, Leg, PathError, PathService};
use ldm7_pq::Queue;
use ldm7_types::{FeedType, ProdClass, ProdSpec, Signature, Timestamp};

use super::index_map::{IndexMap, IndexMapError};
use super::pool::{Pool, PoolError};
use super::product::QueuedProduct;
use super::rate_control::{self, Actuators, RateControl, RateControlStatus, SharedPath};
use crate::access::{self, PeerHost, ProductFilter};
use crate::config::{Config, Multicast};
use crate::settings::{Deadline, MulticastSettings, PathSettings, Settings};

/// How long the queue reader waits for a product before looking at the stop flag.
const READER_POLL: Duration = Duration::from_millis(250);

/// Bytes of Ethernet (14), IPv4 (20) and UDP (8) headers per datagram: pacing counts what tc
/// HTB counts on the wire.
const WIRE_OVERHEAD_BYTES: u64 = 42;

/// Why a SUBSCRIBE was refused.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// ALLOW grants the host none of the feed.
    #[error("no ALLOW entry grants {peer} any of {feed}")]
    Unauthorized {
        /// The host.
        peer: String,
        /// The feed asked for.
        feed: FeedType,
    },
    /// No MULTICAST entry multicasts the feed.
    #[error("no MULTICAST entry multicasts {0}")]
    NoSuchFeed(FeedType),
    /// The feed's FMTP sender could not start.
    #[error("cannot start multicasting {feed}: {source}")]
    Start {
        /// The feed.
        feed: FeedType,
        /// Why.
        #[source]
        source: FeedError,
    },
    /// No address is left for the subscriber.
    #[error("no FMTP address for the subscriber: {0}")]
    Pool(#[from] PoolError),
    /// The subscriber's leg could not be added to the path.
    #[error("cannot add {endpoint} to the path {path}: {why}")]
    Path {
        /// The path.
        path: String,
        /// The subscriber's attachment.
        endpoint: Endpoint,
        /// Why.
        why: String,
    },
    /// The server is stopping.
    #[error("the server is shutting down")]
    ShuttingDown,
}

impl Refusal {
    /// The status the SUBSCRIBE reply carries (ldm7-multicast.md §2.1).
    pub fn status(&self) -> Ldm7Status {
        match self {
            Self::Unauthorized { .. } => Ldm7Status::Unauth,
            Self::NoSuchFeed(_) => Ldm7Status::NoEnt,
            Self::ShuttingDown => Ldm7Status::Shutdown,
            Self::Start { .. } | Self::Pool(_) | Self::Path { .. } => Ldm7Status::Mcast,
        }
    }
}

/// Why a feed's multicasting could not start.
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    /// The FMTP runtime's threads could not start.
    #[error("cannot start the FMTP threads: {0}")]
    Runtime(#[source] std::io::Error),
    /// The product-index map cannot be used.
    #[error(transparent)]
    IndexMap(#[from] IndexMapError),
    /// The MULTICAST entry's subnet cannot hold a pool.
    #[error("the FMTP address pool: {0}")]
    Pool(#[from] PoolError),
    /// The rate-control settings do not make a monitor.
    #[error("rate control: {0}")]
    RateControl(String),
    /// The publisher identity (`identity`) cannot be read.
    #[error("the publisher identity: {0}")]
    Identity(String),
    /// The FMTP sender's sockets could not be opened.
    #[error("FMTP sender on {retx_listen}, group {group}: {source}")]
    Sockets {
        /// The retransmission server's address.
        retx_listen: SocketAddr,
        /// The group.
        group: SocketAddrV4,
        /// Why.
        source: std::io::Error,
    },
}

/// Counters of the publisher side.
#[derive(Debug, Default)]
pub struct PublisherCounters {
    /// SUBSCRIBEs answered LDM7_OK.
    pub subscriptions: AtomicU64,
    /// SUBSCRIBEs refused (any reason).
    pub refusals: AtomicU64,
    /// Products handed to FMTP.
    pub products_multicast: AtomicU64,
    /// Products skipped because FMTP cannot carry them (larger than 4 GiB).
    pub products_skipped: AtomicU64,
    /// Repair connections refused because their address was not allocated.
    pub repair_connections_refused: AtomicU64,
    /// REQUEST_PRODUCTs answered with the product (backstop).
    pub missed_products_sent: AtomicU64,
    /// REQUEST_PRODUCTs answered NO_SUCH_PRODUCT.
    pub no_such_products: AtomicU64,
    /// Products sent by backlogs.
    pub backlog_products_sent: AtomicU64,
}

/// The publisher side of the server: its multicast feeds and their subscriptions.
pub struct Multicaster {
    queue: Arc<Queue>,
    state_dir: PathBuf,
    settings: Arc<Settings>,
    /// The server's port: the default port of a multicast group.
    server_port: u16,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
    feeds: Mutex<BTreeMap<u32, Arc<Feed>>>,
    path: SharedPath,
    counters: Arc<PublisherCounters>,
    stopping: AtomicBool,
}

impl std::fmt::Debug for Multicaster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Multicaster").field("state_dir", &self.state_dir).finish_non_exhaustive()
    }
}

impl Multicaster {
    /// A publisher side with no feed running yet.
    pub fn new(queue: Arc<Queue>, state_dir: PathBuf, settings: Arc<Settings>, server_port: u16) -> Self {
        let path = path_service(&settings.path);
        Self {
            queue,
            state_dir,
            settings,
            server_port,
            runtime: Mutex::new(None),
            feeds: Mutex::new(BTreeMap::new()),
            path: Arc::new(Mutex::new(path)),
            counters: Arc::new(PublisherCounters::default()),
            stopping: AtomicBool::new(false),
        }
    }

    /// The counters.
    pub fn counters(&self) -> &PublisherCounters {
        &self.counters
    }

    /// Each running feed's name, subscriber count and FMTP sender counters.
    pub fn feed_counters(&self) -> Vec<(String, usize, ldm7_fmtp_proto::SenderCounters)> {
        let feeds = self.feeds.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        feeds
            .values()
            .map(|feed| {
                (feed.name.clone(), feed.subscribers.load(Ordering::Relaxed), feed.sender_counters.borrow().clone())
            })
            .collect()
    }

    /// Each running feed's name, path rate (bit/s) and, when it runs the online monitor, the
    /// monitor's status.
    pub fn feed_rates(&self) -> Vec<(String, u64, Option<RateControlStatus>)> {
        let feeds = self.feeds.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        feeds
            .values()
            .map(|feed| {
                let status = feed
                    .rate_control
                    .as_ref()
                    .map(|control| control.lock().unwrap_or_else(PoisonError::into_inner).status());
                let rate = status.map_or(feed.settings.rate.bits_per_s(), |status| status.rate_bits_per_s);
                (feed.name.clone(), rate, status)
            })
            .collect()
    }

    /// Decides a SUBSCRIBE from `peer` for `feed` (see the module documentation).
    pub fn subscribe(
        self: &Arc<Self>,
        config: &Config,
        peer: &PeerHost,
        feed: FeedType,
        vc_end: &VcEndPoint,
    ) -> Result<Subscription, Refusal> {
        let result = self.try_subscribe(config, peer, feed, vc_end);
        match &result {
            Ok(_) => self.counters.subscriptions.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.counters.refusals.fetch_add(1, Ordering::Relaxed),
        };
        result
    }

    fn try_subscribe(
        self: &Arc<Self>,
        config: &Config,
        peer: &PeerHost,
        feed: FeedType,
        vc_end: &VcEndPoint,
    ) -> Result<Subscription, Refusal> {
        if self.stopping.load(Ordering::Relaxed) {
            return Err(Refusal::ShuttingDown);
        }
        let unauthorized = || Refusal::Unauthorized { peer: peer.to_string(), feed };
        let asked = ProdClass {
            from: Timestamp::ZERO,
            to: Timestamp::END,
            specs: vec![ProdSpec { feedtype: feed, pattern: ldm7_types::Pattern::everything() }],
        };
        let (allowed, filter) = match access::reduce_to_allowed(config, peer, &asked) {
            access::Allowed::Ok(filter) => (feed, filter),
            access::Allowed::Reclass(class, filter) => {
                (FeedType(class.specs.iter().fold(0, |bits, spec| bits | spec.feedtype.bits())), filter)
            }
            access::Allowed::Nothing | access::Allowed::NotAllowedHost => return Err(unauthorized()),
        };
        let entry = config
            .multicasts
            .iter()
            .find(|entry| allowed.intersects(entry.feedtype))
            .ok_or(Refusal::NoSuchFeed(allowed))?;
        let feed = self.feed(entry)?;
        let subscriber = match peer.ip {
            IpAddr::V4(address) => address,
            IpAddr::V6(address) => address.to_ipv4_mapped().unwrap_or(Ipv4Addr::UNSPECIFIED),
        };
        let fmtp_addr = feed.admit(subscriber)?;
        let mut subscription = Subscription {
            multicaster: self.clone(),
            feed: feed.clone(),
            address: fmtp_addr.addr,
            leg: None,
            info: McastSubInfo {
                mcast_info: McastInfo {
                    feed: entry.feedtype,
                    group: feed.group.to_string(),
                    server: feed.retx_addr.to_string(),
                },
                fmtp_addr,
            },
            filter,
        };
        if vc_end.switch_id.is_empty() || vc_end.switch_id.eq_ignore_ascii_case("dummy") {
            return Ok(subscription);
        }
        let endpoint = Endpoint {
            node: vc_end.switch_id.clone(),
            interface: vc_end.port_id.clone(),
            vlan_tag: (vc_end.vlan_id != 0).then_some(vc_end.vlan_id),
        };
        if let Some(path) = self.path().as_mut() {
            path.add_leg(&feed.path_name, &Leg::plain(endpoint.clone())).map_err(|error| Refusal::Path {
                path: feed.path_name.clone(),
                endpoint: endpoint.clone(),
                why: error.to_string(),
            })?;
            tracing::info!("{}: added {endpoint} to the path {}", feed.name, feed.path_name);
            subscription.leg = Some(endpoint);
        }
        Ok(subscription)
    }

    /// The product index map's signature for `index` of the feed a subscription is to.
    pub fn signature_of(&self, subscription: &Subscription, index: ProductIndex) -> Option<Signature> {
        subscription.feed.signature_of(index)
    }

    /// Stops every feed (server shutdown): no new subscription is answered OK.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
        let feeds: Vec<Arc<Feed>> = self.feeds().values().cloned().collect();
        for feed in feeds {
            feed.stop();
        }
        if let Some(runtime) = self.runtime.lock().unwrap_or_else(PoisonError::into_inner).take() {
            runtime.shutdown_timeout(Duration::from_secs(2));
        }
    }

    /// The running feed of a MULTICAST entry, started if needed.
    fn feed(&self, entry: &Multicast) -> Result<Arc<Feed>, Refusal> {
        let mut feeds = self.feeds();
        if let Some(feed) = feeds.get(&entry.feedtype.bits()) {
            if feed.is_running() {
                feed.subscribers.fetch_add(1, Ordering::Relaxed);
                return Ok(feed.clone());
            }
        }
        let handle = self.runtime_handle().map_err(|source| Refusal::Start { feed: entry.feedtype, source })?;
        let settings = self.settings.multicast(entry.feedtype).clone();
        let feed = Feed::start(FeedStart {
            queue: self.queue.clone(),
            entry: entry.clone(),
            settings,
            state_dir: self.state_dir.clone(),
            server_port: self.server_port,
            runtime: handle,
            counters: self.counters.clone(),
            path: self.path.clone(),
        })
        .map_err(|source| Refusal::Start { feed: entry.feedtype, source })?;
        if let Some(path) = self.path().as_mut() {
            match path.create_path(&feed.path_name, feed.settings.rate) {
                // The monitor starts at the first step: so does a path left at another.
                Err(PathError::PathExists(_)) if feed.rate_control.is_some() => {
                    if let Err(error) = path.set_rate(&feed.path_name, feed.settings.rate) {
                        tracing::warn!(
                            "{}: cannot set the path {} to {}: {error}",
                            feed.name,
                            feed.path_name,
                            feed.settings.rate
                        );
                    }
                }
                Err(error) => tracing::debug!("{}: path {}: {error} (kept as it is)", feed.name, feed.path_name),
                Ok(()) => {}
            }
        }
        feed.subscribers.fetch_add(1, Ordering::Relaxed);
        feeds.insert(entry.feedtype.bits(), feed.clone());
        Ok(feed)
    }

    fn release(&self, subscription: &Subscription) {
        if let Some(endpoint) = &subscription.leg {
            if let Some(path) = self.path().as_mut() {
                match path.remove_leg(&subscription.feed.path_name, endpoint) {
                    Ok(()) => tracing::info!(
                        "{}: removed {endpoint} from the path {}",
                        subscription.feed.name,
                        subscription.feed.path_name
                    ),
                    Err(error) => tracing::warn!(
                        "{}: cannot remove {endpoint} from the path {}: {error}",
                        subscription.feed.name,
                        subscription.feed.path_name
                    ),
                }
            }
        }
        subscription.feed.release(subscription.address);
        let mut feeds = self.feeds();
        if subscription.feed.subscribers.fetch_sub(1, Ordering::Relaxed) == 1 {
            tracing::info!("{}: last subscriber gone; multicasting stops", subscription.feed.name);
            subscription.feed.stop();
            feeds.remove(&subscription.feed.feedtype.bits());
        }
    }

    fn feeds(&self) -> MutexGuard<'_, BTreeMap<u32, Arc<Feed>>> {
        self.feeds.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn path(&self) -> MutexGuard<'_, Option<Box<dyn PathService + Send>>> {
        self.path.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn runtime_handle(&self) -> Result<tokio::runtime::Handle, FeedError> {
        let mut runtime = self.runtime.lock().unwrap_or_else(PoisonError::into_inner);
        let runtime = match &mut *runtime {
            Some(runtime) => runtime,
            empty => empty.insert(
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("fmtp-send")
                    .enable_all()
                    .build()
                    .map_err(FeedError::Runtime)?,
            ),
        };
        Ok(runtime.handle().clone())
    }
}

fn path_service(settings: &PathSettings) -> Option<Box<dyn PathService + Send>> {
    match settings {
        PathSettings::None => None,
        PathSettings::LinuxBridge { netns } => {
            Some(Box::new(ldm7_net::path::bridge::BridgePaths::new(netns.as_deref())))
        }
        PathSettings::Vde { run_dir } => Some(Box::new(ldm7_net::path::vde::VdePaths::new(run_dir.clone()))),
        PathSettings::Oess { url, user, password_file, workgroup, api } => {
            let password = match std::fs::read_to_string(password_file) {
                Ok(text) => text.trim().to_owned(),
                Err(error) => {
                    tracing::error!(
                        "cannot read the OESS password file {}: {error}; no legs will be added",
                        password_file.display()
                    );
                    return None;
                }
            };
            let api = if api == "provisioning" {
                ldm7_net::path::oess::OessApi::Provisioning
            } else {
                ldm7_net::path::oess::OessApi::Circuit
            };
            Some(Box::new(ldm7_net::path::oess::OessPaths::new(ldm7_net::path::oess::OessConfig {
                base_url: url.clone(),
                username: user.clone(),
                password,
                workgroup_id: *workgroup,
                api,
            })))
        }
    }
}

/// A subscriber's admission to a feed; dropping it (the session ended) undoes it.
pub struct Subscription {
    multicaster: Arc<Multicaster>,
    feed: Arc<Feed>,
    address: Ipv4Addr,
    leg: Option<Endpoint>,
    /// What the SUBSCRIBE reply carries.
    pub info: McastSubInfo,
    /// The per-product ALLOW test (backlog products).
    pub filter: ProductFilter,
}

impl Subscription {
    /// The feed (the MULTICAST entry's feedtype).
    pub fn feedtype(&self) -> FeedType {
        self.feed.feedtype
    }
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription").field("feed", &self.feed.name).field("address", &self.address).finish()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.multicaster.release(self);
    }
}

/// Who may open repair connections to a feed.
#[derive(Debug)]
enum Admission {
    /// Addresses handed out from the feed's subnet (§4.2).
    Pool(Pool),
    /// Subscribers keep their own address (a MULTICAST entry without a subnet, §4.3).
    OwnAddress {
        /// Addresses allowed now, with how many subscriptions hold each.
        allowed: BTreeMap<Ipv4Addr, usize>,
        /// Bound: subscribers at once.
        max: usize,
    },
}

struct FeedStart {
    queue: Arc<Queue>,
    entry: Multicast,
    settings: MulticastSettings,
    state_dir: PathBuf,
    server_port: u16,
    runtime: tokio::runtime::Handle,
    counters: Arc<PublisherCounters>,
    path: SharedPath,
}

/// One multicast feed: its FMTP sender, the thread feeding it from the queue, its address pool
/// and product-index map.
#[derive(Debug)]
pub struct Feed {
    name: String,
    feedtype: FeedType,
    path_name: String,
    settings: MulticastSettings,
    group: SocketAddrV4,
    retx_addr: SocketAddr,
    admission: Arc<Mutex<Admission>>,
    index_map: Arc<Mutex<IndexMap>>,
    subscribers: std::sync::atomic::AtomicUsize,
    stop: Arc<AtomicBool>,
    reader: Mutex<Option<JoinHandle<()>>>,
    /// The task that owns the FMTP sender and reads its notices; aborting it stops FMTP.
    fmtp: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The FMTP sender's protocol counters.
    sender_counters: tokio::sync::watch::Receiver<ldm7_fmtp_proto::SenderCounters>,
    /// The online monitor, when the feed has `rate_control`.
    rate_control: Option<Arc<Mutex<RateControl>>>,
    /// The task that ends the monitor's intervals; aborted with the feed.
    rate_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Feed {
    fn start(start: FeedStart) -> Result<Arc<Self>, FeedError> {
        let FeedStart { queue, entry, settings, state_dir, server_port, runtime, counters, path } = start;
        let name = entry.feedtype.to_string();
        let path_name = settings.path.clone().unwrap_or_else(|| name.clone());
        let group = SocketAddrV4::new(entry.group, entry.group_port.unwrap_or(server_port));
        let map_path = state_dir.join(format!("{}.fmtp-index", file_name(&name)));
        let index_map = IndexMap::open(&map_path, settings.index_map_capacity)?;
        let first_index = index_map.next_index();
        let admission = if entry.subnet_len > 0 && !entry.fmtp_server.is_unspecified() {
            let subnet = Ipv4Cidr { address: entry.fmtp_server, prefix_len: entry.subnet_len };
            Admission::Pool(Pool::new(subnet, settings.subscribers_max)?)
        } else {
            Admission::OwnAddress { allowed: BTreeMap::new(), max: settings.subscribers_max }
        };
        let admission = Arc::new(Mutex::new(admission));
        let interface = settings.interface.unwrap_or(entry.fmtp_server);
        let multicast = MulticastConfig {
            group: SocketAddr::V4(group),
            interface: IpAddr::V4(interface),
            interface_index: 0,
            ttl: settings.ttl,
            loopback: true,
            // The highest rate the feed may reach.
            buffer_bytes: buffer_bytes_for_rate(
                settings.rate_control.as_ref().and_then(|c| c.steps.last()).unwrap_or(&settings.rate).bits_per_s(),
            ),
        };
        let mut proto = SenderConfig::with_rate(settings.rate.bits_per_s());
        for pacing in [&mut proto.multicast_pacing, &mut proto.retx_pacing].into_iter().flatten() {
            *pacing = Pacing { overhead_bytes_per_message: WIRE_OVERHEAD_BYTES, ..*pacing };
        }
        proto.first_index = first_index;
        proto.multicast_without_receivers = true;
        proto.queued_products_max = settings.product_queue_max;
        let violation_monitor = match &settings.rate_control {
            Some(control) => {
                let (anchor, wall) = Clock::wall_anchor();
                // Every product FMTP may hold: the retained ones, the queued ones, and those
                // on their way in.
                let followed_max = proto.retained_products_max + proto.queued_products_max + 1024;
                let wall_clock = WallClock { instant: anchor, wall };
                let monitor = RateControl::new(control, wall_clock, followed_max, WIRE_OVERHEAD_BYTES)
                    .map_err(FeedError::RateControl)?;
                Some(Arc::new(Mutex::new(monitor)))
            }
            None => None,
        };
        proto.deadline = match settings.deadline {
            Deadline::Constant(duration) => DeadlinePolicy::Constant(duration),
            Deadline::Proportional { factor, min } => DeadlinePolicy::Proportional { f_snd: factor, min },
        };
        proto.parity = settings.parity;
        let retx_listen = SocketAddr::V4(SocketAddrV4::new(entry.fmtp_server, entry.fmtp_port));
        let mut options = SenderOptions::new(multicast, retx_listen, proto);
        options.mac_level = settings.mac_level;
        options.mac_rotation = settings.mac_rotation;
        if let Some(path) = &settings.identity {
            // Checked when the settings were read; a file changed since is an error now.
            let identity =
                ldm7_fmtp::keys::read_identity(path).map_err(|error| FeedError::Identity(error.to_string()))?;
            options.identity = Some(Arc::new(identity));
        }
        let authorize_admission = admission.clone();
        let authorize_counters = counters.clone();
        let feed_name = name.clone();
        options.authorize = Arc::new(move |peer: SocketAddr| {
            let allowed = match peer.ip() {
                IpAddr::V4(address) => admitted(&authorize_admission, address),
                IpAddr::V6(address) => address.to_ipv4_mapped().is_some_and(|a| admitted(&authorize_admission, a)),
            };
            if !allowed {
                authorize_counters.repair_connections_refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("{feed_name}: refused an FMTP repair connection from {peer}: address not allocated");
            }
            allowed
        });
        let sender = runtime.block_on(FmtpSender::start(options)).map_err(|source| FeedError::Sockets {
            retx_listen,
            group,
            source,
        })?;
        let retx_addr = sender.retx_addr();
        tracing::info!(
            "{name}: multicasting to {group} at {}, FMTP server {retx_addr}, first product index {}",
            settings.rate,
            first_index.0
        );
        let index_map = Arc::new(Mutex::new(index_map));
        let stop = Arc::new(AtomicBool::new(false));
        let feed = Arc::new(Self {
            name: name.clone(),
            feedtype: entry.feedtype,
            path_name,
            settings,
            group,
            retx_addr,
            admission,
            index_map: index_map.clone(),
            subscribers: std::sync::atomic::AtomicUsize::new(0),
            stop: stop.clone(),
            reader: Mutex::new(None),
            fmtp: Mutex::new(None),
            sender_counters: sender.counters_watch(),
            rate_control: violation_monitor.clone(),
            rate_task: Mutex::new(None),
        });
        if let (Some(control), Some(settings)) = (&violation_monitor, &feed.settings.rate_control) {
            let shaped_interface = rate_control::shaped_interface(interface);
            let steps: Vec<String> = settings.steps.iter().map(ToString::to_string).collect();
            tracing::info!(
                "{name}: rate monitor on: steps {}, interval {:?}, W {:?}, alpha {}, beta {}, lower after {} calm intervals; \
                 the path {}{} follows",
                steps.join(" → "),
                settings.interval,
                settings.wait,
                settings.alpha,
                settings.beta,
                settings.lower_after,
                feed.path_name,
                shaped_interface.as_deref().map(|dev| format!(" and the HTB tree on {dev}")).unwrap_or_default()
            );
            let actuators = Actuators {
                feed: name.clone(),
                path,
                path_name: feed.path_name.clone(),
                shaped_interface,
                pacing: sender.rate_handle(),
            };
            let task = runtime.spawn(rate_control::run(control.clone(), settings.interval, actuators));
            *feed.rate_task.lock().unwrap_or_else(PoisonError::into_inner) = Some(task);
        }
        let products = sender.product_sender();
        let mut notices = sender;
        // Notices: read so that the sender never waits on them; log what matters. The task owns
        // the sender: aborting it (`stop`) drops the sender, which stops FMTP and makes a
        // waiting `send` return.
        let notices_name = name.clone();
        let monitor = violation_monitor;
        let notice_task = runtime.spawn(async move {
            let monitor = monitor.as_deref();
            while let Some(notice) = notices.next_notice().await {
                match notice {
                    SenderNotice::Event(SenderEvent::Sent { index, size }) => {
                        tracing::debug!("{notices_name}: multicast product {} ({size} bytes)", index.0);
                    }
                    SenderNotice::Event(SenderEvent::BoundHit { bound, receiver }) => {
                        tracing::debug!("{notices_name}: FMTP bound {bound:?} hit (receiver {receiver:?})");
                    }
                    SenderNotice::Event(SenderEvent::Released { index, unfinished, .. }) => {
                        if let Some(monitor) = monitor {
                            monitor.lock().unwrap_or_else(PoisonError::into_inner).released(index, &unfinished);
                        }
                    }
                    SenderNotice::Event(SenderEvent::Completed(completion)) => {
                        if let Some(monitor) = monitor {
                            monitor.lock().unwrap_or_else(PoisonError::into_inner).completed(&completion);
                        }
                    }
                    SenderNotice::ReceiverJoined(id, peer) => {
                        tracing::info!("{notices_name}: FMTP receiver {peer} connected ({id})");
                    }
                    SenderNotice::ReceiverLeft(id) => tracing::info!("{notices_name}: FMTP {id} disconnected"),
                    SenderNotice::Refused(error) => {
                        tracing::error!("{notices_name}: FMTP refused a product: {}", error.reason);
                    }
                }
            }
        });
        *feed.fmtp.lock().unwrap_or_else(PoisonError::into_inner) = Some(notice_task);
        let reader_feed = feed.clone();
        let reader = std::thread::Builder::new()
            .name(format!("mcast {name}"))
            .spawn(move || reader_feed.read_queue(&queue, &runtime, &products, &counters))
            .map_err(FeedError::Runtime)?;
        *feed.reader.lock().unwrap_or_else(PoisonError::into_inner) = Some(reader);
        Ok(feed)
    }

    /// Follows the queue from now and hands every product of the feed to FMTP, until stopped.
    fn read_queue(
        &self,
        queue: &Arc<Queue>,
        runtime: &tokio::runtime::Handle,
        products: &ldm7_fmtp::ProductSender,
        counters: &PublisherCounters,
    ) {
        let start = Timestamp::from_system_time(std::time::SystemTime::now());
        let mut follower = queue.follow(start);
        while !self.stop.load(Ordering::Relaxed) {
            let next = follower.next_with(Some(READER_POLL), |product| {
                super::goes_out_on(self.feedtype, &product.info).then(|| (product.insertion, product.info.clone()))
            });
            let (insertion, info) = match next {
                Ok(Some(Some(found))) => found,
                Ok(Some(None) | None) => continue,
                Err(error) => {
                    tracing::error!("{}: reading the queue: {error}; multicasting stops", self.name);
                    return;
                }
            };
            let product = QueuedProduct::new(queue.clone(), insertion, &info);
            if ldm7_fmtp_proto::ProductData::len(&product) > u64::from(u32::MAX) {
                counters.products_skipped.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("{}: product too large for FMTP (4 GiB), not multicast: {info}", self.name);
                continue;
            }
            let metadata = product.metadata();
            {
                let mut map = self.index_map.lock().unwrap_or_else(PoisonError::into_inner);
                let index = map.next_index();
                if let Err(error) = map.put(index, &info.signature) {
                    tracing::error!("{}: {error}; multicasting stops", self.name);
                    return;
                }
                tracing::info!(target: ldm7_io::log_target::PRODUCT, "Multicasted: prodIndex={}, prodInfo=\"{info}\"", index.0);
                if let Some(monitor) = &self.rate_control {
                    if monitor.lock().unwrap_or_else(PoisonError::into_inner).handed(index, insertion) {
                        tracing::warn!(
                            "{}: rate monitor: too many products in flight to follow; some are not measured (counted)",
                            self.name
                        );
                    }
                }
            }
            if runtime.block_on(products.send(Product::new(product, metadata))).is_err() {
                tracing::error!("{}: the FMTP sender stopped; multicasting stops", self.name);
                return;
            }
            counters.products_multicast.fetch_add(1, Ordering::Relaxed);
        }
        let skipped = follower.skipped();
        if skipped > 0 {
            tracing::warn!(
                "{}: {skipped} products were evicted from the queue before they could be multicast",
                self.name
            );
        }
    }

    fn is_running(&self) -> bool {
        !self.stop.load(Ordering::Relaxed)
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(task) = self.rate_task.lock().unwrap_or_else(PoisonError::into_inner).take() {
            task.abort();
        }
        if let Some(task) = self.fmtp.lock().unwrap_or_else(PoisonError::into_inner).take() {
            task.abort();
        }
        if let Some(reader) = self.reader.lock().unwrap_or_else(PoisonError::into_inner).take() {
            let _ = reader.join();
        }
    }

    fn admit(&self, subscriber: Ipv4Addr) -> Result<CidrAddr, Refusal> {
        let mut admission = self.admission.lock().unwrap_or_else(PoisonError::into_inner);
        match &mut *admission {
            Admission::Pool(pool) => {
                let address = pool.allocate()?;
                Ok(CidrAddr { addr: address, prefix_len: pool.subnet().prefix_len })
            }
            Admission::OwnAddress { allowed, max } => {
                if allowed.len() >= *max && !allowed.contains_key(&subscriber) {
                    return Err(PoolError::TooManySubscribers(*max).into());
                }
                *allowed.entry(subscriber).or_default() += 1;
                Ok(CidrAddr { addr: subscriber, prefix_len: 32 })
            }
        }
    }

    fn release(&self, address: Ipv4Addr) {
        let mut admission = self.admission.lock().unwrap_or_else(PoisonError::into_inner);
        match &mut *admission {
            Admission::Pool(pool) => pool.release(address),
            Admission::OwnAddress { allowed, .. } => {
                if let Some(count) = allowed.get_mut(&address) {
                    *count -= 1;
                    if *count == 0 {
                        allowed.remove(&address);
                    }
                }
            }
        }
    }

    fn signature_of(&self, index: ProductIndex) -> Option<Signature> {
        let map = self.index_map.lock().unwrap_or_else(PoisonError::into_inner);
        match map.get(index) {
            Ok(signature) => signature,
            Err(error) => {
                tracing::error!("{}: {error}", self.name);
                None
            }
        }
    }
}

fn admitted(admission: &Mutex<Admission>, address: Ipv4Addr) -> bool {
    match &*admission.lock().unwrap_or_else(PoisonError::into_inner) {
        Admission::Pool(pool) => pool.is_allowed(address),
        Admission::OwnAddress { allowed, .. } => allowed.contains_key(&address),
    }
}

/// A feed name as a file name (`IDS|DDPLUS` → `IDS_DDPLUS`).
fn file_name(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect()
}
