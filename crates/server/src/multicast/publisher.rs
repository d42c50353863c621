//! The publisher side of LDM-7 (ldm7-multicast.md §2.2 step 2, §4; RESEARCH.md §2):
//! [`Multicaster`] answers SUBSCRIBEs and runs one [`Feed`] per multicast feed — an FMTP
//! sender fed from the product queue — started with its first subscription and stopped
//! `linger` after its last (a subscriber that resubscribes finds it running).
//!
//! A SUBSCRIBE is decided in this order, each refusal one log line and a status on the wire:
//! the feed reduced to what ALLOW grants the host (nothing → `LDM7_UNAUTH`); a MULTICAST entry
//! for it (none → `LDM7_NOENT`); the host not held off for closing its repair connections
//! right after the key exchange (a MAC level other than the feed's: `LDM7_REFUSED`,
//! [`KeyRefusals`]); the feed's sender running (cannot start → `LDM7_MCAST`); an address for the
//! subscriber, by the reference's rule (§4.3): one of the feed's pool (§4.2) when the MULTICAST
//! entry names the publisher's attachment to a circuit (switch and port not `dummy`), or — an
//! ldm7 addition — when the subscriber names its own (it configures the address on its
//! interface); else the subscriber's own address, /32 (none left → `LDM7_MCAST`, "all
//! addresses reserved" as the reference); the subscriber's leg added to the path when a path
//! service is configured and the subscriber named its attachment (fails → `LDM7_MCAST`). The
//! [`Subscription`] undoes all of it when dropped (the session ended): address released, leg
//! removed, the feed stopped `linger` later if it was the last.
//!
//! The reply names a concrete FMTP server address: in the short form (no FMTP server address)
//! the address of the interface the route to the group leaves by, which is also the source
//! the datagrams carry, since subscribers join source-specifically on that address (the
//! reference's subscriber does).
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

use std::collections::{BTreeMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use ldm7_fmtp::udp::{MulticastConfig, buffer_bytes_for_rate, parity_group_of};
use ldm7_fmtp::{FmtpSender, MacSigning, ParityConfig, SenderNotice, SenderOptions, SigningHandle};
use ldm7_fmtp_proto::{DeadlinePolicy, OutgoingProduct, Pacing, ProductIndex, SenderConfig, SenderEvent, WallClock};
use ldm7_io::Clock;
use ldm7_ldm_proto::{
    CidrAddr, Ldm7Status, McastInfo, McastSubInfo, ParityAnswer, SubscribeAnswer, SubscribeOffer, VcEndPoint,
};
use ldm7_net::path::{Endpoint, Leg, PathError, PathService};
use ldm7_pq::Queue;
use ldm7_types::{FeedType, ProdClass, ProdSpec, Signature, Timestamp};

use super::index_map::{IndexMap, IndexMapError};
use super::product::QueuedProduct;
use super::rate_control::{self, Actuators, RateControl, RateControlStatus, SharedPath};
use crate::access::{self, PeerHost, ProductFilter};
use crate::config::{Config, Multicast};
use crate::settings::{Deadline, MulticastSettings, PathSettings, Settings};
use ldm7_net::pool::{Pool, PoolError};

/// How long a stopping server lets each feed's FMTP sender serve repairs for the products it
/// multicast, while the subscriptions are still up ([`Multicaster::finish`]). Products are
/// complete a repair round trip after their EOP, well under this on any path FMTP serves.
const FINISH_WAIT: Duration = Duration::from_secs(2);

/// How long the queue reader waits for a product before it looks at the stop flag again (a
/// stopping server wakes it at once: `Queue::wake_waiters`; this bounds a missed wake-up).
const READER_POLL: Duration = Duration::from_millis(250);

/// How long a feed catching up waits for its first FMTP receiver (it was started by a
/// subscription, whose receiver connects next).
const CATCH_UP_FIRST_RECEIVER: Duration = Duration::from_secs(10);

/// Bytes of Ethernet (14), IPv4 (20) and UDP (8) headers per datagram: pacing counts what tc
/// HTB counts on the wire.
const WIRE_OVERHEAD_BYTES: u64 = 42;

/// Why a SUBSCRIBE was refused.
#[derive(Debug, thiserror::Error)]
pub enum SubscribeRefusal {
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
    /// The subscriber's FMTP receivers kept closing their repair connections right after the
    /// key exchange (a MAC level other than the feed's, most likely).
    #[error(
        "{peer}'s FMTP receivers closed their repair connections right after the key exchange, again and again: \
         its MAC level is most likely not the feed's {level}; refused for {remaining_secs} s more"
    )]
    KeyRefused {
        /// The host.
        peer: String,
        /// The feed's MAC level.
        level: ldm7_fmtp::MacLevel,
        /// Seconds until its subscriptions are taken again.
        remaining_secs: u64,
    },
    /// The server is stopping.
    #[error("the server is shutting down")]
    ShuttingDown,
}

impl SubscribeRefusal {
    /// The status the SUBSCRIBE reply carries (ldm7-multicast.md §2.1).
    pub fn status(&self) -> Ldm7Status {
        match self {
            Self::Unauthorized { .. } => Ldm7Status::Unauth,
            Self::NoSuchFeed(_) => Ldm7Status::NoEnt,
            Self::ShuttingDown => Ldm7Status::Shutdown,
            // The reference's subscriber waits 4 × interval (120 s) after LDM7_REFUSED, where
            // after LDM7_MCAST it would start over at once.
            Self::KeyRefused { .. } => Ldm7Status::Refused,
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
    /// The short form names no FMTP server address and no interface reaches the group.
    #[error(
        "no interface address toward the group {group}: {source}; route the group (ip route add 224.0.0.0/4 dev \
         IFACE), or name the FMTP server address in the MULTICAST entry (feedtype group fmtpServer subnetLen \
         vlanId switchId switchPort) or `interface` in [multicast] of the settings file"
    )]
    NoInterface {
        /// The group.
        group: SocketAddr,
        /// Why the kernel chose no address.
        source: std::io::Error,
    },
    /// The FMTP sender's sockets could not be opened.
    #[error("FMTP sender on {retx_listen}, group {group}: {source}")]
    Sockets {
        /// The retransmission server's address.
        retx_listen: SocketAddr,
        /// The group.
        group: SocketAddr,
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
        offer: Option<SubscribeOffer>,
    ) -> Result<Subscription, SubscribeRefusal> {
        let result = self.try_subscribe(config, peer, feed, vc_end, offer);
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
        offer: Option<SubscribeOffer>,
    ) -> Result<Subscription, SubscribeRefusal> {
        if self.stopping.load(Ordering::Relaxed) {
            return Err(SubscribeRefusal::ShuttingDown);
        }
        let unauthorized = || SubscribeRefusal::Unauthorized { peer: peer.to_string(), feed };
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
            .ok_or(SubscribeRefusal::NoSuchFeed(allowed))?;
        let subscriber_ip = peer.ip.to_canonical();
        if let Some(feed) = self.feeds().get(&entry.feedtype.bits()) {
            let held_off = feed.key_refusals.lock().unwrap_or_else(PoisonError::into_inner).held_off(subscriber_ip);
            if let Some(remaining) = held_off {
                return Err(SubscribeRefusal::KeyRefused {
                    peer: peer.to_string(),
                    level: feed.settings.mac_level,
                    remaining_secs: remaining.as_secs().max(1),
                });
            }
        }
        let feed = self.feed(entry)?;
        let subscriber = peer.ip.to_canonical();
        // §4.3: a pool address when the feed's path is a circuit the publisher is attached to
        // (the reference's rule), or when the subscriber names its attachment (it configures
        // the address on its interface); else the subscriber keeps its own address.
        let wants_pool = entry.attachment.is_set() || names_attachment(vc_end);
        let (admitted, from_pool) = feed.admit(subscriber, wants_pool)?;
        // Parity for an ldm7 subscriber that offers it, unless another feed's group has the
        // port its shards go to (they would reach that feed's receivers).
        let parity = match feed.parity {
            Some((parity, to)) if offer.is_some_and(|offer| offer.parity) => {
                let taken = config.multicasts.iter().any(|other| {
                    other.feedtype != entry.feedtype
                        && other.group == to.ip()
                        && other.group_port.unwrap_or(self.server_port) == to.port()
                });
                if taken {
                    tracing::warn!(
                        "{}: no parity repair: its shards would go to {to}, another feed's group; give that feed \
                         another port",
                        feed.name
                    );
                    None
                } else {
                    Some(ParityAnswer { group_blocks: parity.group_blocks, shards: parity.shards, port: to.port() })
                }
            }
            _ => None,
        };
        let mut subscription = Subscription {
            multicaster: self.clone(),
            feed: feed.clone(),
            address: admitted.address,
            from_pool,
            leg: None,
            reference: offer.is_none(),
            info: McastSubInfo {
                mcast_info: McastInfo {
                    feed: entry.feedtype,
                    // `[v6]:port` for an IPv6 feed.
                    group: feed.group.to_string(),
                    server: feed.retx_addr.to_string(),
                },
                fmtp_addr: admitted.reference_word(),
                // An IPv6 address travels in the extension only (the reference's is IPv4).
                answer: offer.map(|_| SubscribeAnswer { parity, address6: admitted.ipv6() }),
            },
            filter,
        };
        if subscription.reference {
            feed.reference_joined();
        }
        if !names_attachment(vc_end) {
            return Ok(subscription);
        }
        let endpoint = Endpoint {
            node: vc_end.switch_id.clone(),
            interface: vc_end.port_id.clone(),
            vlan_tag: (vc_end.vlan_id != 0).then_some(vc_end.vlan_id),
        };
        if let Some(path) = self.path().as_mut() {
            path.add_leg(&feed.path_name, &Leg::plain(endpoint.clone())).map_err(|error| SubscribeRefusal::Path {
                path: feed.path_name.clone(),
                endpoint: endpoint.clone(),
                why: error.to_string(),
            })?;
            tracing::info!("{}: added {endpoint} to the path {}", feed.name, feed.path_name);
            subscription.leg = Some(endpoint);
        }
        Ok(subscription)
    }

    /// Whether a request for `index` is a subscriber's backlog fence: an index the feed has not
    /// multicast yet ([`ldm7_ldm_proto::is_fence`]).
    pub fn is_fence(&self, subscription: &Subscription, index: ProductIndex) -> bool {
        let next = subscription.feed.index_map.lock().unwrap_or_else(PoisonError::into_inner).next_index();
        ldm7_ldm_proto::is_fence(index.0, next.0)
    }

    /// How far a backlog asked now by a subscriber of this feed may reach (see
    /// `Feed::backlog_cutoff`): the products after it come by multicast.
    pub fn backlog_cutoff(&self, subscription: &Subscription) -> Option<Timestamp> {
        subscription.feed.backlog_cutoff()
    }

    /// The product index map's signature for `index` of the feed a subscription is to.
    pub fn signature_of(&self, subscription: &Subscription, index: ProductIndex) -> Option<Signature> {
        subscription.feed.signature_of(index)
    }

    /// The orderly start of a server shutdown, while the subscriptions are still up: no new
    /// subscription is answered OK and no new product is multicast. Each feed's FMTP sender
    /// finishes the product under way and serves repairs until every receiver finished the
    /// products multicast (at most [`FINISH_WAIT`]): a receiver torn down with its
    /// subscription — as a reference LDM-7 is when the connection ends — would otherwise lose
    /// a product multicast just before, and its next backlog starts after the newest product
    /// it holds. Products handed to FMTP and not begun are withdrawn, and their indexes given
    /// back to the feed's index map: the next start multicasts them (`catch_up`) with the
    /// same indexes.
    pub fn finish(&self) {
        self.stopping.store(true, Ordering::Relaxed);
        let feeds: Vec<Arc<Feed>> = self.feeds().values().cloned().collect();
        let handle = self.runtime.lock().unwrap_or_else(PoisonError::into_inner).as_ref().map(|r| r.handle().clone());
        let Some(runtime) = handle.filter(|_| !feeds.is_empty()) else { return };
        for feed in &feeds {
            feed.stop.store(true, Ordering::Relaxed);
        }
        let started = std::time::Instant::now();
        // Each sender answers at once (withdrawn what it had not begun).
        let finishing: Vec<Option<ldm7_fmtp::Finishing>> = runtime.block_on(async {
            let mut finishing = Vec::new();
            for feed in &feeds {
                finishing.push(feed.finish.finish().await);
            }
            finishing
        });
        // The queue readers, flagged and their hand-over closed, end now.
        self.queue.wake_waiters();
        for feed in &feeds {
            feed.join_reader();
        }
        let mut settling = Vec::new();
        for (feed, finishing) in feeds.iter().zip(finishing) {
            let Some(finishing) = finishing else { continue };
            feed.withdraw(finishing.next_index);
            let settled = async move { tokio::time::timeout(FINISH_WAIT, finishing.settled()).await == Ok(true) };
            settling.push((feed.clone(), runtime.spawn(settled)));
        }
        for (feed, settled) in settling {
            if runtime.block_on(settled).unwrap_or(false) {
                tracing::info!(
                    "{}: stopping: every FMTP receiver finished the products multicast ({:.2} s)",
                    feed.name,
                    started.elapsed().as_secs_f64()
                );
            } else {
                tracing::warn!(
                    "{}: stopping: FMTP receivers had not finished every product multicast after {} s; the rest is \
                     left to their backstop",
                    feed.name,
                    FINISH_WAIT.as_secs()
                );
            }
        }
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
    fn feed(&self, entry: &Multicast) -> Result<Arc<Feed>, SubscribeRefusal> {
        let mut feeds = self.feeds();
        if let Some(feed) = feeds.get(&entry.feedtype.bits())
            && feed.is_running()
        {
            feed.subscribers.fetch_add(1, Ordering::Relaxed);
            return Ok(feed.clone());
        }
        let handle =
            self.runtime_handle().map_err(|source| SubscribeRefusal::Start { feed: entry.feedtype, source })?;
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
        .map_err(|source| SubscribeRefusal::Start { feed: entry.feedtype, source })?;
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

    fn release(self: &Arc<Self>, subscription: &Subscription) {
        if let Some(endpoint) = &subscription.leg
            && let Some(path) = self.path().as_mut()
        {
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
        subscription.feed.release(subscription.address, subscription.from_pool);
        if subscription.reference {
            subscription.feed.reference_left();
        }
        let mut feeds = self.feeds();
        if subscription.feed.subscribers.fetch_sub(1, Ordering::Relaxed) != 1 {
            return;
        }
        let feed = subscription.feed.clone();
        let linger = feed.settings.linger;
        let handle = self.runtime.lock().unwrap_or_else(PoisonError::into_inner).as_ref().map(|r| r.handle().clone());
        match handle {
            Some(handle) if !linger.is_zero() && !self.stopping.load(Ordering::Relaxed) => {
                tracing::info!("{}: last subscriber gone; multicasting goes on for {} s", feed.name, linger.as_secs());
                let multicaster = self.clone();
                handle.spawn(async move {
                    tokio::time::sleep(linger).await;
                    // Stopping joins the feed's reader thread: not on a runtime worker.
                    let _ = tokio::task::spawn_blocking(move || multicaster.stop_if_idle(&feed)).await;
                });
            }
            _ => {
                tracing::info!("{}: last subscriber gone; multicasting stops", feed.name);
                feed.stop();
                feeds.remove(&feed.feedtype.bits());
            }
        }
    }

    /// Stops `feed` if it still has no subscriber (the end of its linger).
    fn stop_if_idle(&self, feed: &Arc<Feed>) {
        let mut feeds = self.feeds();
        let current = feeds.get(&feed.feedtype.bits()).is_some_and(|running| Arc::ptr_eq(running, feed));
        if current && feed.subscribers.load(Ordering::Relaxed) == 0 && feed.is_running() {
            tracing::info!("{}: no subscriber for {} s; multicasting stops", feed.name, feed.settings.linger.as_secs());
            feed.stop();
            feeds.remove(&feed.feedtype.bits());
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

/// What a feed's FMTP sender is started with, and what the feed keeps of it.
struct FmtpSetup {
    options: SenderOptions,
    /// The online rate monitor, when `[multicast] rate_control` is set.
    violation_monitor: Option<Arc<Mutex<RateControl>>>,
    /// The parity coding, and where shards go (`None`: parity off).
    parity: Option<(ParityConfig, SocketAddr)>,
}

/// The FMTP sender's options for a feed from its MULTICAST entry and settings: sockets, pacing
/// (counting the wire overhead), deadline, parity, MAC, and the repair connections' admission
/// (an address the pool handed out); and the feed's rate monitor.
#[allow(clippy::too_many_arguments)]
fn fmtp_setup(
    entry: &Multicast,
    settings: &MulticastSettings,
    group: SocketAddr,
    interface: IpAddr,
    first_index: ProductIndex,
    admission: &Arc<Mutex<Admission>>,
    counters: &Arc<PublisherCounters>,
    name: &str,
) -> Result<FmtpSetup, FeedError> {
    let multicast = MulticastConfig {
        group,
        interface,
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
    let parity = settings.parity_config().map(|config| (config, parity_group_of(group)));
    proto.parity = parity.map(|(config, _)| config);
    let retx_listen = SocketAddr::new(entry.fmtp_server, entry.fmtp_port);
    let mut options = SenderOptions::new(multicast, retx_listen, proto);
    options.mac_level = settings.mac_level;
    options.mac_rotation = settings.mac_rotation;
    options.mac_signing = if settings.mac_lists { MacSigning::Lists } else { MacSigning::Datagram };
    options.parity_group = parity.map(|(_, to)| to);
    if let Some(path) = &settings.identity {
        // Checked when the settings were read; a file changed since is an error now.
        let identity =
            ldm7_config::keys::read_identity(path).map_err(|error| FeedError::Identity(error.to_string()))?;
        options.identity = Some(Arc::new(identity));
    }
    let authorize_admission = admission.clone();
    let authorize_counters = counters.clone();
    let feed_name = name.to_string();
    options.authorize = Arc::new(move |peer: SocketAddr| {
        let allowed = admitted(&authorize_admission, peer.ip().to_canonical());
        if !allowed {
            authorize_counters.repair_connections_refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("{feed_name}: refused an FMTP repair connection from {peer}: address not allocated");
        }
        allowed
    });
    Ok(FmtpSetup { options, violation_monitor, parity })
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
    address: IpAddr,
    /// Whether `address` came from the feed's pool (else it is the subscriber's own).
    from_pool: bool,
    leg: Option<Endpoint>,
    /// Whether the subscriber is a reference LDM-7 (its SUBSCRIBE offered nothing): level 2
    /// signs each datagram while it is subscribed.
    reference: bool,
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
        let multicaster = self.multicaster.clone();
        multicaster.release(self);
    }
}

/// Who may open repair connections to a feed: subscribers holding an address of the feed's
/// pool, and subscribers keeping their own (§4.2, §4.3).
#[derive(Debug)]
struct Admission {
    /// Addresses handed out from the feed's subnet (a MULTICAST entry with one).
    pool: Option<Pool>,
    /// Subscribers' own addresses allowed now, with how many subscriptions hold each.
    own: BTreeMap<IpAddr, usize>,
    /// Bound: subscriptions at once (by pool addresses and own addresses together).
    max: usize,
}

impl Admission {
    fn is_allowed(&self, address: IpAddr) -> bool {
        self.own.contains_key(&address) || self.pool.as_ref().is_some_and(|pool| pool.is_allowed(address))
    }

    /// Subscriptions admitted now (several may share an own address).
    fn held(&self) -> usize {
        self.own.values().sum::<usize>() + self.pool.as_ref().map_or(0, Pool::held)
    }

    /// An address for a subscriber whose own is `subscriber`: one of the pool when it
    /// `wants_pool` and the feed has one (then `true`), else its own; within `max`
    /// subscriptions.
    fn admit(&mut self, subscriber: IpAddr, wants_pool: bool) -> Result<(Admitted, bool), SubscribeRefusal> {
        if self.held() >= self.max {
            return Err(PoolError::TooManySubscribers(self.max).into());
        }
        if let (true, Some(pool)) = (wants_pool, self.pool.as_mut()) {
            let address = pool.allocate()?;
            return Ok((Admitted { address, prefix_len: pool.subnet().prefix_len() }, true));
        }
        *self.own.entry(subscriber).or_default() += 1;
        let prefix_len = if subscriber.is_ipv4() { 32 } else { 128 };
        Ok((Admitted { address: subscriber, prefix_len }, false))
    }

    /// Undoes [`Admission::admit`].
    fn release(&mut self, address: IpAddr, from_pool: bool) {
        if from_pool {
            if let Some(pool) = self.pool.as_mut() {
                pool.release(address);
            }
        } else if let Some(count) = self.own.get_mut(&address) {
            *count -= 1;
            if *count == 0 {
                self.own.remove(&address);
            }
        }
    }
}

/// The FMTP client address a subscriber is given, with its prefix length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Admitted {
    address: IpAddr,
    prefix_len: u8,
}

impl Admitted {
    /// The reference's `CidrAddr` word: the address when IPv4, else 0.0.0.0/0 (the IPv6 one
    /// travels in the extension, [`Admitted::ipv6`]).
    fn reference_word(self) -> CidrAddr {
        match self.address {
            IpAddr::V4(addr) => CidrAddr { addr, prefix_len: self.prefix_len },
            IpAddr::V6(_) => CidrAddr { addr: Ipv4Addr::UNSPECIFIED, prefix_len: 0 },
        }
    }

    /// The address and prefix when IPv6.
    fn ipv6(self) -> Option<(std::net::Ipv6Addr, u8)> {
        match self.address {
            IpAddr::V6(address) => Some((address, self.prefix_len)),
            IpAddr::V4(_) => None,
        }
    }
}

/// Whether a SUBSCRIBE names the subscriber's attachment to the path (not `dummy`, as
/// ldm7-multicast.md §4.3 and the reference's `vcEndPoint_isValid`).
fn names_attachment(vc_end: &VcEndPoint) -> bool {
    let dummy = |text: &str| text.is_empty() || text.eq_ignore_ascii_case("dummy");
    !(dummy(&vc_end.switch_id) || dummy(&vc_end.port_id))
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
    group: SocketAddr,
    retx_addr: SocketAddr,
    admission: Arc<Mutex<Admission>>,
    index_map: Arc<Mutex<IndexMap>>,
    subscribers: std::sync::atomic::AtomicUsize,
    stop: Arc<AtomicBool>,
    reader: Mutex<Option<JoinHandle<()>>>,
    /// The task that owns the FMTP sender and reads its notices; aborting it stops FMTP.
    fmtp: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Finishes the FMTP sender in order (a stopping server).
    finish: ldm7_fmtp::FinishHandle,
    /// The FMTP sender's protocol counters.
    sender_counters: tokio::sync::watch::Receiver<ldm7_fmtp_proto::SenderCounters>,
    /// The online monitor, when the feed has `rate_control`.
    rate_control: Option<Arc<Mutex<RateControl>>>,
    /// The task that ends the monitor's intervals; aborted with the feed.
    rate_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Receivers that left right after their key exchange, and the hosts held off for it.
    key_refusals: Arc<Mutex<KeyRefusals>>,
    /// The parity coding, and where shards go (`None`: parity off).
    parity: Option<(ParityConfig, SocketAddr)>,
    /// Switches level-2 signing between digest lists and each datagram.
    signing: SigningHandle,
    /// Reference LDM-7 subscriptions now (level 2 signs each datagram while there is one).
    reference_subscribers: std::sync::atomic::AtomicUsize,
    /// FMTP receivers connected now.
    receivers: std::sync::atomic::AtomicUsize,
    /// Where their number is kept across restarts (a feed started again waits for as many
    /// before it catches up).
    receivers_file: PathBuf,
    /// How far the multicast got (what a backlog leaves to it).
    position: Mutex<MulticastPosition>,
}

/// How far a feed's multicast got in the queue: a backlog asked now stops there, since the
/// feed's later products are on their way by multicast to every subscriber of the feed.
#[derive(Debug)]
struct MulticastPosition {
    /// Where the queue reader starts (the catch-up's start, or the feed's): later products are
    /// multicast in this run.
    from: Timestamp,
    /// Products handed to FMTP and not yet multicast whole, oldest first: index and insertion.
    in_flight: VecDeque<(ProductIndex, Timestamp)>,
    /// The insertion time of the last product multicast whole (its EOP sent).
    through: Option<Timestamp>,
}

impl MulticastPosition {
    fn new(from: Timestamp) -> Self {
        Self { from, in_flight: VecDeque::new(), through: None }
    }

    /// Product `index`, inserted at `insertion`, was handed to FMTP.
    fn handed(&mut self, index: ProductIndex, insertion: Timestamp) {
        self.in_flight.push_back((index, insertion));
    }

    /// Product `index` was multicast whole (products are multicast in the order handed; one
    /// FMTP refused is passed over).
    fn multicast_whole(&mut self, index: ProductIndex) {
        while let Some((handed, insertion)) = self.in_flight.pop_front() {
            if handed == index {
                self.through = Some(insertion);
                return;
            }
        }
    }

    /// The newest insertion time a backlog may reach: the last product multicast whole, and
    /// at least everything before the reader's start.
    fn cutoff(&self) -> Timestamp {
        let before_start = Timestamp::from_unix_micros(self.from.as_unix_micros() - 1);
        self.through.map_or(before_start, |through| through.max(before_start))
    }
}

impl Feed {
    fn start(start: FeedStart) -> Result<Arc<Self>, FeedError> {
        let FeedStart { queue, entry, settings, state_dir, server_port, runtime, counters, path } = start;
        let name = entry.feedtype.to_string();
        let path_name = settings.path.clone().unwrap_or_else(|| name.clone());
        let group = SocketAddr::new(entry.group, entry.group_port.unwrap_or(server_port));
        let map_path = state_dir.join(format!("{}.fmtp-index", file_name(&name)));
        let index_map = IndexMap::open(&map_path, settings.index_map_capacity)?;
        let first_index = index_map.next_index();
        let receivers_file = state_dir.join(format!("{}.fmtp-receivers", file_name(&name)));
        let catch_up = CatchUp::plan(&queue, &index_map, &settings, &receivers_file, &name);
        let pool = if entry.subnet_len > 0 && !entry.fmtp_server.is_unspecified() {
            let subnet = ipnet::IpNet::new(entry.fmtp_server, entry.subnet_len)
                .map_err(|_| PoolError::NoHosts(ipnet::IpNet::from(entry.fmtp_server)))?;
            Some(Pool::new(subnet, settings.subscribers_max)?)
        } else {
            None
        };
        let admission = Admission { pool, own: BTreeMap::new(), max: settings.subscribers_max };
        let admission = Arc::new(Mutex::new(admission));
        // The address the datagrams leave from is the source a subscriber joins on
        // (source-specific, as the reference does) and the FMTP server address the
        // subscription reply names: never "any". In the short form it is the address the
        // kernel would send to the group from.
        let interface = match settings.interface.unwrap_or(entry.fmtp_server) {
            any if any.is_unspecified() => {
                interface_toward(group).map_err(|source| FeedError::NoInterface { group, source })?
            }
            address => address,
        };
        let FmtpSetup { options, violation_monitor, parity } =
            fmtp_setup(&entry, &settings, group, interface, first_index, &admission, &counters, &name)?;
        let retx_listen = options.retx_listen;
        let sender = runtime.block_on(FmtpSender::start(options)).map_err(|source| FeedError::Sockets {
            retx_listen,
            group,
            source,
        })?;
        // Listening on every address (the short form): the reply names the multicast
        // interface's.
        let retx_addr = match sender.retx_addr() {
            listen if listen.ip().is_unspecified() => SocketAddr::new(interface, listen.port()),
            listen => listen,
        };
        tracing::info!(
            "{name}: multicasting to {group} at {}, FMTP server {retx_addr}, first product index {}",
            settings.rate,
            first_index.0
        );
        let index_map = Arc::new(Mutex::new(index_map));
        let stop = Arc::new(AtomicBool::new(false));
        let multicast_from = catch_up
            .map_or_else(|| Timestamp::from_system_time(std::time::SystemTime::now()), |catch_up| catch_up.from);
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
            finish: sender.finish_handle(),
            sender_counters: sender.counters_watch(),
            rate_control: violation_monitor.clone(),
            rate_task: Mutex::new(None),
            key_refusals: Arc::new(Mutex::new(KeyRefusals::default())),
            parity,
            signing: sender.signing_handle(),
            reference_subscribers: std::sync::atomic::AtomicUsize::new(0),
            receivers: std::sync::atomic::AtomicUsize::new(0),
            receivers_file,
            position: Mutex::new(MulticastPosition::new(multicast_from)),
        });
        if let Some(control) = &violation_monitor {
            feed.start_rate_monitor(control, interface, path, sender.rate_handle(), &runtime);
        }
        let products = sender.product_sender();
        // Notices: read so that the sender never waits on them; log what matters. The task owns
        // the sender: aborting it (`stop`) drops the sender, which stops FMTP and makes a
        // waiting `send` return.
        let notice_task = runtime.spawn(feed.clone().log_notices(sender, violation_monitor));
        *feed.fmtp.lock().unwrap_or_else(PoisonError::into_inner) = Some(notice_task);
        let reader_feed = feed.clone();
        let reader = std::thread::Builder::new()
            .name(format!("mcast {name}"))
            .spawn(move || reader_feed.read_queue(&queue, catch_up, &runtime, &products, &counters))
            .map_err(FeedError::Runtime)?;
        *feed.reader.lock().unwrap_or_else(PoisonError::into_inner) = Some(reader);
        Ok(feed)
    }

    /// Starts the feed's rate monitor task (`rate_control`): it steps the path, the HTB tree on
    /// the interface toward the group (when there is one) and the FMTP pacing.
    fn start_rate_monitor(
        &self,
        control: &Arc<Mutex<RateControl>>,
        interface: IpAddr,
        path: SharedPath,
        pacing: ldm7_fmtp::RateHandle,
        runtime: &tokio::runtime::Handle,
    ) {
        let Some(settings) = &self.settings.rate_control else { return };
        let name = &self.name;
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
            self.path_name,
            shaped_interface.as_deref().map(|dev| format!(" and the HTB tree on {dev}")).unwrap_or_default()
        );
        let actuators =
            Actuators { feed: name.clone(), path, path_name: self.path_name.clone(), shaped_interface, pacing };
        let task = runtime.spawn(rate_control::run(control.clone(), settings.interval, actuators));
        *self.rate_task.lock().unwrap_or_else(PoisonError::into_inner) = Some(task);
    }

    /// Reads the FMTP sender's notices until it ends, so that it never waits on them: logs what
    /// matters, feeds the rate monitor, and holds off hosts whose receivers fail the key
    /// exchange. Owns the sender: aborting this task (`stop`) drops it.
    async fn log_notices(self: Arc<Self>, mut notices: FmtpSender, monitor: Option<Arc<Mutex<RateControl>>>) {
        let monitor = monitor.as_deref();
        let notices_name = &self.name;
        let notices_refusals = &self.key_refusals;
        let notices_level = self.settings.mac_level;
        while let Some(notice) = notices.next_notice().await {
            match notice {
                SenderNotice::Event(SenderEvent::Sent { index, size }) => {
                    tracing::debug!("{notices_name}: multicast product {} ({size} bytes)", index.0);
                    self.position.lock().unwrap_or_else(PoisonError::into_inner).multicast_whole(index);
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
                    self.receivers_changed(1);
                }
                SenderNotice::ReceiverLeft(id, departure) => {
                    tracing::info!("{notices_name}: FMTP {id} disconnected");
                    self.receivers_changed(-1);
                    if notices_refusals.lock().unwrap_or_else(PoisonError::into_inner).left(&departure) {
                        tracing::error!(
                            "{notices_name}: the FMTP receiver at {host} closed its repair connection right after \
                             the key exchange {KEY_REFUSALS_BEFORE_HOLD} times in a row: its MAC level is most \
                             likely not this feed's, {notices_level} (set FMTP_MAC_LEVEL={level} for a reference \
                             LDM-7 subscriber, mac_level = {level} in [receive] of an ldm7 subscriber's settings); \
                             its subscriptions are refused for {hold} s",
                            host = departure.peer.ip(),
                            level = notices_level.number(),
                            hold = KEY_REFUSAL_HOLD.as_secs()
                        );
                    }
                }
                SenderNotice::Refused(error) => {
                    tracing::error!("{notices_name}: FMTP refused a product: {}", error.reason);
                }
            }
        }
    }

    /// FMTP receivers connected or gone (`change` ±1): their number is kept in the state
    /// directory, except while the feed stops (its receivers leave because it does).
    fn receivers_changed(&self, change: isize) {
        let step = |count: usize| Some(if change > 0 { count + 1 } else { count.saturating_sub(1) });
        let before = self.receivers.fetch_update(Ordering::SeqCst, Ordering::SeqCst, step).unwrap_or_default();
        let now = step(before).unwrap_or_default();
        if self.stop.load(Ordering::Relaxed) {
            return;
        }
        if let Err(error) = std::fs::write(&self.receivers_file, format!("{now}\n")) {
            tracing::warn!(
                "{}: cannot keep the number of FMTP receivers in {}: {error}",
                self.name,
                self.receivers_file.display()
            );
        }
    }

    /// Waits for the receivers `catch_up` counts on — until as many are connected, or
    /// `catch_up_wait` after the first one (before it there is no one to multicast to) — says
    /// what it will multicast again, and returns where to follow the queue from.
    fn catch_up_start(&self, queue: &Queue, catch_up: CatchUp) -> Timestamp {
        let waited = std::time::Instant::now();
        let mut first: Option<std::time::Instant> = None;
        while !self.stop.load(Ordering::Relaxed) {
            let connected = self.receivers.load(Ordering::SeqCst);
            let waiting = if connected == 0 {
                waited.elapsed() < CATCH_UP_FIRST_RECEIVER
            } else {
                first.get_or_insert_with(std::time::Instant::now).elapsed() < self.settings.catch_up_wait
            };
            if connected >= catch_up.receivers || !waiting {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let missed = queue.snapshot().and_then(|snapshot| {
            let mut count = 0u64;
            for product in snapshot.products_from(catch_up.from)? {
                count += u64::from(super::goes_out_on(self.feedtype, &product?.info));
            }
            Ok(count)
        });
        tracing::info!(
            "{}: catching up: multicasting the {} products inserted since {} ({} of {} FMTP receivers back after \
             {:.1} s)",
            self.name,
            missed.unwrap_or_default(),
            catch_up.from,
            self.receivers.load(Ordering::SeqCst),
            catch_up.receivers,
            waited.elapsed().as_secs_f64()
        );
        catch_up.from
    }

    /// Follows the queue — from now, or from where `catch_up` says once it has waited for the
    /// receivers — and hands every product of the feed to FMTP, until stopped.
    fn read_queue(
        &self,
        queue: &Arc<Queue>,
        catch_up: Option<CatchUp>,
        runtime: &tokio::runtime::Handle,
        products: &ldm7_fmtp::ProductSender,
        counters: &PublisherCounters,
    ) {
        let start = match catch_up {
            Some(catch_up) => self.catch_up_start(queue, catch_up),
            None => Timestamp::from_system_time(std::time::SystemTime::now()),
        };
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
                self.position.lock().unwrap_or_else(PoisonError::into_inner).handed(index, insertion);
                if let Some(monitor) = &self.rate_control
                    && monitor.lock().unwrap_or_else(PoisonError::into_inner).handed(index, insertion)
                {
                    tracing::warn!(
                        "{}: rate monitor: too many products in flight to follow; some are not measured (counted)",
                        self.name
                    );
                }
            }
            if runtime.block_on(products.send(OutgoingProduct::new(product, metadata))).is_err() {
                // The feed being stopped drops the sender: not an error then.
                if !self.stop.load(Ordering::Relaxed) {
                    tracing::error!("{}: the FMTP sender stopped; multicasting stops", self.name);
                }
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
        let counters = self.sender_counters.borrow().clone();
        tracing::info!(
            "{}: FMTP totals: {} products multicast ({} bytes); repairs: {} blocks retransmitted ({} bytes), \
             {} parity shards multicast ({} bytes, {:.2}% of the multicast), {} rejections",
            self.name,
            counters.products_sent,
            counters.multicast_bytes,
            counters.retx_data_blocks,
            counters.retx_bytes,
            counters.parity_datagrams,
            counters.parity_bytes,
            counters.parity_bytes as f64 * 100.0 / counters.multicast_bytes.max(1) as f64,
            counters.rejects
        );
        if let Some(task) = self.rate_task.lock().unwrap_or_else(PoisonError::into_inner).take() {
            task.abort();
        }
        if let Some(task) = self.fmtp.lock().unwrap_or_else(PoisonError::into_inner).take() {
            task.abort();
        }
        self.join_reader();
    }

    /// Gives the indexes of products FMTP withdrew back to the index map (they were mapped when
    /// handed over): the next start continues from the first of them, and its catch-up
    /// multicasts them.
    fn withdraw(&self, next_index: ProductIndex) {
        let mut map = self.index_map.lock().unwrap_or_else(PoisonError::into_inner);
        let mapped = map.next_index().0.wrapping_sub(next_index.0);
        if mapped == 0 {
            return;
        }
        if mapped > map.capacity() {
            tracing::error!(
                "{}: the index map ({}) is not where FMTP stopped ({}): left as it is",
                self.name,
                map.next_index().0,
                next_index.0
            );
            return;
        }
        match map.withdraw(next_index) {
            Ok(()) => tracing::info!(
                "{}: stopping: {mapped} products handed to FMTP and not begun are not multicast (indexes {} to {}); \
                 the next start multicasts them",
                self.name,
                next_index.0,
                next_index.0.wrapping_add(mapped - 1)
            ),
            Err(error) => tracing::error!("{}: {error}", self.name),
        }
    }

    /// How far a backlog asked now may reach: products inserted later are on their way by
    /// this feed's multicast (handed to FMTP and not multicast whole, or not read from the
    /// queue yet), so a subscriber of the feed gets them by FMTP. `None` once the feed stops.
    fn backlog_cutoff(&self) -> Option<Timestamp> {
        if self.stop.load(Ordering::Relaxed) {
            return None;
        }
        Some(self.position.lock().unwrap_or_else(PoisonError::into_inner).cutoff())
    }

    /// Waits for the queue reader to end (the stop flag is set).
    fn join_reader(&self) {
        if let Some(reader) = self.reader.lock().unwrap_or_else(PoisonError::into_inner).take() {
            let _ = reader.join();
        }
    }

    /// An address for a subscriber whose own is `subscriber`: one of the pool when it
    /// `wants_pool` and the feed has one (then `true`), else its own.
    fn admit(&self, subscriber: IpAddr, wants_pool: bool) -> Result<(Admitted, bool), SubscribeRefusal> {
        self.admission.lock().unwrap_or_else(PoisonError::into_inner).admit(subscriber, wants_pool)
    }

    fn release(&self, address: IpAddr, from_pool: bool) {
        self.admission.lock().unwrap_or_else(PoisonError::into_inner).release(address, from_pool);
    }

    /// Whether the feed signs digest lists while no reference subscriber is on it.
    fn signs_lists(&self) -> bool {
        self.settings.mac_level == ldm7_fmtp::MacLevel::Ed25519 && self.settings.mac_lists
    }

    /// A reference LDM-7 subscribed: at level 2 with digest lists, the sender signs each
    /// datagram from now on (a reference receiver requires a signature on each; the switch
    /// comes before its SUBSCRIBE reply, so before its receiver connects).
    fn reference_joined(&self) {
        if self.reference_subscribers.fetch_add(1, Ordering::SeqCst) == 0 && self.signs_lists() {
            self.signing.set(MacSigning::Datagram);
            tracing::info!(
                "{}: a reference LDM-7 subscriber: MAC level 2 signs each datagram while one is subscribed \
                 (digest lists are for ldm7 subscribers only)",
                self.name
            );
        }
    }

    /// A reference LDM-7 subscription ended: the last one gives digest lists back.
    fn reference_left(&self) {
        if self.reference_subscribers.fetch_sub(1, Ordering::SeqCst) == 1 && self.signs_lists() {
            self.signing.set(MacSigning::Lists);
            tracing::info!("{}: no reference LDM-7 subscriber left: MAC level 2 signs digest lists again", self.name);
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

/// Where a feed started again begins (`[multicast] catch_up`): just after the last product it
/// multicast, when that is in the queue, but no further back than `catch_up`; so the products
/// inserted while it was not running go out once by multicast instead of once per subscriber
/// by the backlog. A feed that never multicast, or with `catch_up` zero, starts from now.
#[derive(Clone, Copy, Debug)]
struct CatchUp {
    /// The insertion time to follow the queue from.
    from: Timestamp,
    /// The FMTP receivers it had (it waits up to `catch_up_wait` for as many).
    receivers: usize,
}

impl CatchUp {
    fn plan(
        queue: &Queue,
        map: &IndexMap,
        settings: &MulticastSettings,
        receivers_file: &std::path::Path,
        name: &str,
    ) -> Option<CatchUp> {
        if settings.catch_up.is_zero() {
            return None;
        }
        let last = ProductIndex(map.next_index().0.wrapping_sub(1));
        let signature = map.get(last).ok().flatten()?;
        let now = Timestamp::from_system_time(std::time::SystemTime::now());
        let earliest = now.saturating_sub(settings.catch_up);
        let after_last = match queue
            .snapshot()
            .and_then(|snapshot| snapshot.product_by_signature(&signature).map(|p| p.map(|p| p.insertion)))
        {
            Ok(Some(insertion)) => Timestamp::from_unix_micros(insertion.as_unix_micros() + 1),
            // Gone from the queue: it is older than any catch-up.
            Ok(None) => earliest,
            Err(error) => {
                tracing::warn!("{name}: cannot find the last product multicast ({error}); starting from now");
                return None;
            }
        };
        let receivers =
            std::fs::read_to_string(receivers_file).ok().and_then(|text| text.trim().parse().ok()).unwrap_or(0);
        Some(CatchUp { from: after_last.max(earliest), receivers })
    }
}

/// The address of the interface the route to `group` leaves by (its first IPv4 address): on
/// loopback 127.0.0.1, which the kernel's own choice of a source address would pass over for
/// an address of another interface (host scope), sending through that other interface once the
/// socket is bound to it. Without `ip`, and for an IPv6 group, the kernel's choice (a UDP
/// socket connected to the group; it sends nothing).
fn interface_toward(group: SocketAddr) -> std::io::Result<IpAddr> {
    if let SocketAddr::V4(group) = group
        && let Ok(Some(device)) = ldm7_net::hostcfg::route_device(None, *group.ip())
    {
        let found = ldm7_net::hostcfg::addresses(None, &device).ok();
        if let Some(first) = found.and_then(|found| found.first().copied()) {
            return Ok(IpAddr::V4(first.address));
        }
    }
    let any: SocketAddr = if group.is_ipv4() {
        SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))
    } else {
        "[::]:0".parse().expect("an address")
    };
    let socket = std::net::UdpSocket::bind(any)?;
    socket.connect(group)?;
    match socket.local_addr()?.ip() {
        address if !address.is_unspecified() => Ok(address),
        _ => Err(std::io::Error::other("the kernel chose no source address")),
    }
}

/// Departures in a row right after the key exchange that hold a host off.
const KEY_REFUSALS_BEFORE_HOLD: u32 = 3;
/// How long a host is held off.
const KEY_REFUSAL_HOLD: Duration = Duration::from_secs(60);
/// Bound: hosts followed.
const KEY_REFUSAL_HOSTS_MAX: usize = 4096;

/// Receivers that close their repair connection right after the key exchange, with nothing
/// said ([`ldm7_fmtp::Departure::at_once`]): a subscriber at another MAC level than the feed's
/// does (the reference's receiver throws on the key and its subscriber starts over at once, five
/// times a second). After [`KEY_REFUSALS_BEFORE_HOLD`] in a row from one host, the host's
/// subscriptions are refused for [`KEY_REFUSAL_HOLD`] (LDM7_REFUSED: the reference waits two
/// minutes before the next), and the operator told once what to set.
#[derive(Debug, Default)]
struct KeyRefusals {
    streaks: std::collections::HashMap<IpAddr, u32>,
    held_off: std::collections::HashMap<IpAddr, std::time::Instant>,
}

impl KeyRefusals {
    /// A receiver left; returns whether its host is held off from now.
    fn left(&mut self, departure: &ldm7_fmtp::Departure) -> bool {
        let host = departure.peer.ip().to_canonical();
        if !departure.at_once() {
            self.streaks.remove(&host);
            return false;
        }
        if self.streaks.len() >= KEY_REFUSAL_HOSTS_MAX {
            self.streaks.clear();
        }
        let streak = self.streaks.entry(host).or_default();
        *streak += 1;
        if *streak < KEY_REFUSALS_BEFORE_HOLD {
            return false;
        }
        self.streaks.remove(&host);
        let now = std::time::Instant::now();
        self.held_off.retain(|_, until| *until > now);
        self.held_off.insert(host, now + KEY_REFUSAL_HOLD);
        true
    }

    /// How long `host` stays held off, if it is.
    fn held_off(&mut self, host: IpAddr) -> Option<Duration> {
        let until = *self.held_off.get(&host)?;
        let remaining = until.saturating_duration_since(std::time::Instant::now());
        if remaining.is_zero() {
            self.held_off.remove(&host);
            return None;
        }
        Some(remaining)
    }
}

fn admitted(admission: &Mutex<Admission>, address: IpAddr) -> bool {
    admission.lock().unwrap_or_else(PoisonError::into_inner).is_allowed(address)
}

/// A feed name as a file name (`IDS|DDPLUS` → `IDS_DDPLUS`).
fn file_name(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn departure(peer: &str, messages: u64, connected_ms: u64) -> ldm7_fmtp::Departure {
        ldm7_fmtp::Departure {
            peer: peer.parse().expect("address"),
            connected_for: Duration::from_millis(connected_ms),
            messages,
        }
    }

    #[test]
    fn a_backlog_stops_where_the_multicast_is_and_keeps_what_came_before_the_reader() {
        let at = |secs: i64| Timestamp::from_unix_micros(secs * 1_000_000);
        let mut position = MulticastPosition::new(at(100));
        // Nothing multicast yet: what was inserted before the reader's start, no later.
        assert_eq!(position.cutoff(), Timestamp::from_unix_micros(100 * 1_000_000 - 1));
        position.handed(ProductIndex(7), at(101));
        position.handed(ProductIndex(8), at(102));
        position.handed(ProductIndex(9), at(103));
        assert_eq!(position.cutoff(), Timestamp::from_unix_micros(100 * 1_000_000 - 1), "handed is not multicast");
        position.multicast_whole(ProductIndex(7));
        assert_eq!(position.cutoff(), at(101));
        // Product 8 refused by FMTP: passed over.
        position.multicast_whole(ProductIndex(9));
        assert_eq!(position.cutoff(), at(103));
        assert!(position.in_flight.is_empty());
        // The cutoff never falls before the reader's start, whatever was multicast.
        let mut position = MulticastPosition::new(at(200));
        position.handed(ProductIndex(1), at(150));
        position.multicast_whole(ProductIndex(1));
        assert_eq!(position.cutoff(), Timestamp::from_unix_micros(200 * 1_000_000 - 1));
    }

    #[test]
    fn a_host_whose_receivers_leave_at_once_after_the_key_exchange_is_held_off() {
        let mut refusals = KeyRefusals::default();
        let host: IpAddr = "10.0.0.7".parse().expect("address");
        assert!(!refusals.left(&departure("10.0.0.7:40000", 0, 5)));
        // A receiver that worked in between ends the streak.
        assert!(!refusals.left(&departure("10.0.0.7:40001", 12, 30_000)));
        assert!(!refusals.left(&departure("10.0.0.7:40002", 0, 5)));
        assert!(!refusals.left(&departure("10.0.0.7:40003", 0, 5)));
        assert_eq!(refusals.held_off(host), None);
        assert!(refusals.left(&departure("10.0.0.7:40004", 0, 5)), "the third in a row");
        let remaining = refusals.held_off(host).expect("held off");
        assert!(remaining <= KEY_REFUSAL_HOLD && remaining > KEY_REFUSAL_HOLD - Duration::from_secs(5));
        assert_eq!(refusals.held_off("10.0.0.8".parse().expect("address")), None, "other hosts are not");
        // Said nothing, but stayed: not a key failure.
        assert!(!departure("10.0.0.9:1", 0, 10_000).at_once());
    }

    #[test]
    fn a_pool_address_only_on_a_circuit_or_for_a_subscriber_naming_its_attachment() {
        let unused = VcEndPoint::unused();
        assert!(!names_attachment(&unused), "the reference's dummy circuit end");
        let named = VcEndPoint { switch_id: "sw1".into(), port_id: "eth1/1".into(), vlan_id: 332 };
        assert!(names_attachment(&named));
        let half = VcEndPoint { switch_id: "sw1".into(), port_id: "dummy".into(), vlan_id: 0 };
        assert!(!names_attachment(&half), "as the reference's vcEndPoint_isValid: both named");

        let subnet: ipnet::IpNet = "10.77.1.1/29".parse().expect("subnet");
        let pool = Pool::new(subnet, 3).expect("pool");
        let mut admission = Admission { pool: Some(pool), own: BTreeMap::new(), max: 3 };
        let me = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 5));
        let own = Admitted { address: me, prefix_len: 32 };
        assert_eq!(admission.admit(me, false).expect("own"), (own, false));
        assert_eq!(own.reference_word(), CidrAddr { addr: Ipv4Addr::new(192, 0, 2, 5), prefix_len: 32 });
        assert_eq!(own.ipv6(), None);
        let pooled = Admitted { address: IpAddr::V4(Ipv4Addr::new(10, 77, 1, 2)), prefix_len: 29 };
        assert_eq!(admission.admit(me, true).expect("pool"), (pooled, true));
        // Two subscriptions from one host hold two places of `subscribers_max`.
        assert!(admission.admit(me, false).is_ok());
        let full = admission.admit(me, false);
        assert!(matches!(full, Err(SubscribeRefusal::Pool(PoolError::TooManySubscribers(3)))), "{full:?}");
        assert!(admission.is_allowed(me) && admission.is_allowed(IpAddr::V4(Ipv4Addr::new(10, 77, 1, 2))));
    }

    #[test]
    fn an_ipv6_feed_hands_out_addresses_of_its_prefix_in_the_extension() {
        let subnet: ipnet::IpNet = "fd00:77:1::1/64".parse().expect("subnet");
        let mut admission = Admission { pool: Some(Pool::new(subnet, 8).expect("pool")), own: BTreeMap::new(), max: 8 };
        let me: IpAddr = "fd00:76::3".parse().expect("address");
        let (pooled, from_pool) = admission.admit(me, true).expect("pool");
        assert!(from_pool);
        assert_eq!(pooled.ipv6(), Some(("fd00:77:1::2".parse().expect("address"), 64)));
        // The reference's IPv4 word says nothing.
        assert_eq!(pooled.reference_word(), CidrAddr { addr: Ipv4Addr::UNSPECIFIED, prefix_len: 0 });
        let (own, _) = admission.admit(me, false).expect("own");
        assert_eq!(own.ipv6(), Some(("fd00:76::3".parse().expect("address"), 128)));
        assert!(admission.is_allowed(pooled.address) && admission.is_allowed(me));
        admission.release(pooled.address, true);
        assert!(!admission.is_allowed(pooled.address));
    }
}
