//! The LDM-6 server's bounds against misuse (docs/server.md "Bounds", docs/security.md): who
//! is refused and why, connections per host, and one feeder per downstream host and feed.
//!
//! * Every refusal has a [`ConnectionRefusal`] reason, a counter
//!   (`ldm7_connections_refused_total{reason}`) and a log line — the first of a reason at once,
//!   then at most one per [`LOG_INTERVAL`] carrying how many were not logged, so that a flood
//!   of refused connections cannot flood the log.
//! * [`HostConnections`] counts the connections of each address; a slot is held by a
//!   [`HostSlot`] for the life of the connection.
//! * [`Feeders`] implements the reference's anti-DoS rule (ldm6-protocol.md §6.1 step 3): when a
//!   host's FEEDME is accepted, the feeds this server already sends that host and that the new
//!   request covers are ended — the downstream restarted or reconnected, and its old
//!   connection (perhaps dead, perhaps behind a broken NAT) would otherwise be fed on. The new
//!   connection serves. Off with `one_feeder_per_host = false`.

use std::collections::HashMap;
use std::net::{IpAddr, Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ldm7_types::ProdClass;

/// At most one log line per reason in this period (the counters have every refusal).
pub const LOG_INTERVAL: Duration = Duration::from_secs(60);

/// Why a connection was refused or closed by the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConnectionRefusal {
    /// `--max-clients` connections were open.
    Busy,
    /// No ALLOW entry names the host.
    Host,
    /// `connections_per_host_max` connections from that address were open.
    PerHost,
    /// A record longer than the connection's bound was announced (refused before buffering).
    RecordTooLong,
    /// No session within `first_call_timeout`, or a push silent for `push_idle_timeout`.
    Idle,
    /// A newer FEEDME from the same host for the same feed replaced this feed.
    Replaced,
}

impl ConnectionRefusal {
    /// Every reason, in the order of the metrics.
    pub const ALL: [ConnectionRefusal; 6] = [
        ConnectionRefusal::Busy,
        ConnectionRefusal::Host,
        ConnectionRefusal::PerHost,
        ConnectionRefusal::RecordTooLong,
        ConnectionRefusal::Idle,
        ConnectionRefusal::Replaced,
    ];

    /// The `reason` label of the metric.
    pub fn label(self) -> &'static str {
        match self {
            ConnectionRefusal::Busy => "busy",
            ConnectionRefusal::Host => "host",
            ConnectionRefusal::PerHost => "per_host",
            ConnectionRefusal::RecordTooLong => "record_too_long",
            ConnectionRefusal::Idle => "idle",
            ConnectionRefusal::Replaced => "replaced",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// ConnectionRefusal counters and their rate-limited log.
#[derive(Debug, Default)]
pub struct ConnectionRefusals {
    counts: [AtomicU64; ConnectionRefusal::ALL.len()],
    /// Per reason: when a line was last logged and how many refusals were not logged since.
    logged: Mutex<[Option<(Instant, u64)>; ConnectionRefusal::ALL.len()]>,
}

impl ConnectionRefusals {
    /// Counts a refusal and logs `message` (WARN; NOTE for an unknown host or a replaced
    /// feed) unless a line of this reason was logged less than [`LOG_INTERVAL`] ago.
    pub fn refuse(&self, reason: ConnectionRefusal, message: impl FnOnce() -> String) {
        self.counts[reason.index()].fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let suppressed = {
            let mut logged = self.logged.lock().unwrap_or_else(PoisonError::into_inner);
            match &mut logged[reason.index()] {
                Some((at, count)) if now.duration_since(*at) < LOG_INTERVAL => {
                    *count += 1;
                    return;
                }
                slot => {
                    let suppressed = slot.map_or(0, |(_, count)| count);
                    *slot = Some((now, 0));
                    suppressed
                }
            }
        };
        let mut message = message();
        if suppressed > 0 {
            message.push_str(&format!(
                " ({suppressed} more `{}` refusals since the last such line were not logged; \
                 ldm7_connections_refused_total counts them all)",
                reason.label()
            ));
        }
        match reason {
            // What the reference logs as a notice: a host it does not know, a feed replaced.
            ConnectionRefusal::Host | ConnectionRefusal::Replaced => tracing::info!("{message}"),
            _ => tracing::warn!("{message}"),
        }
    }

    /// ConnectionRefusals of `reason` so far.
    pub fn count(&self, reason: ConnectionRefusal) -> u64 {
        self.counts[reason.index()].load(Ordering::Relaxed)
    }
}

/// Open connections by remote address.
#[derive(Debug, Default)]
pub struct HostConnections {
    open: Mutex<HashMap<IpAddr, usize>>,
}

impl HostConnections {
    /// A slot for one more connection from `ip`, unless `max` are open; the open count if not.
    pub fn acquire(self: &Arc<Self>, ip: IpAddr, max: usize) -> Result<HostSlot, usize> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(ip).or_insert(0);
        if *count >= max {
            return Err(*count);
        }
        *count += 1;
        Ok(HostSlot { hosts: Arc::clone(self), ip })
    }

    /// Connections open from `ip`.
    pub fn open(&self, ip: IpAddr) -> usize {
        self.open.lock().unwrap_or_else(PoisonError::into_inner).get(&ip).copied().unwrap_or(0)
    }
}

/// One connection's place in [`HostConnections`], given back when dropped.
#[derive(Debug)]
pub struct HostSlot {
    hosts: Arc<HostConnections>,
    ip: IpAddr,
}

impl Drop for HostSlot {
    fn drop(&mut self) {
        let mut open = self.hosts.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// The feeds (FEEDME sessions) being sent, by downstream address.
#[derive(Debug, Default)]
pub struct Feeders {
    entries: Mutex<Vec<FeederEntry>>,
    next_id: AtomicU64,
}

#[derive(Debug)]
struct FeederEntry {
    id: u64,
    ip: IpAddr,
    class: ProdClass,
    replaced: Arc<AtomicBool>,
    /// The connection, to shut it down when replaced (its thread may be blocked reading or
    /// waiting for the queue).
    stream: Option<TcpStream>,
}

/// A feed that a newer one replaced.
#[derive(Debug)]
pub struct ReplacedFeed {
    /// Its registration number.
    pub id: u64,
    /// What it fed.
    pub class: ProdClass,
}

impl Feeders {
    /// Registers a feed of `class` to `ip` on `stream`. With `replace`, the feeds to the same
    /// address whose classes `class` covers ([`covers`]) are ended first: flagged, their
    /// sockets shut down, and returned.
    pub fn register(
        self: &Arc<Self>,
        ip: IpAddr,
        class: &ProdClass,
        stream: Option<TcpStream>,
        replace: bool,
    ) -> (FeederRegistration, Vec<ReplacedFeed>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let flag = Arc::new(AtomicBool::new(false));
        let mut replaced = Vec::new();
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if replace {
            let mut kept = Vec::with_capacity(entries.len());
            for entry in entries.drain(..) {
                if entry.ip == ip && covers(class, &entry.class) {
                    entry.replaced.store(true, Ordering::Relaxed);
                    if let Some(stream) = &entry.stream {
                        let _ = stream.shutdown(Shutdown::Both);
                    }
                    replaced.push(ReplacedFeed { id: entry.id, class: entry.class });
                } else {
                    kept.push(entry);
                }
            }
            *entries = kept;
        }
        entries.push(FeederEntry { id, ip, class: class.clone(), replaced: flag.clone(), stream });
        (FeederRegistration { feeders: Arc::clone(self), id, replaced: flag }, replaced)
    }

    /// Feeds being sent.
    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Whether no feed is being sent.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A registered feed; dropping it (the connection ended) removes it.
#[derive(Debug)]
pub struct FeederRegistration {
    feeders: Arc<Feeders>,
    /// Its registration number (in log lines).
    pub id: u64,
    replaced: Arc<AtomicBool>,
}

impl FeederRegistration {
    /// Whether a newer feed replaced this one (the connection is to end).
    pub fn is_replaced(&self) -> bool {
        self.replaced.load(Ordering::Relaxed)
    }
}

impl Drop for FeederRegistration {
    fn drop(&mut self) {
        self.feeders.entries.lock().unwrap_or_else(PoisonError::into_inner).retain(|entry| entry.id != self.id);
    }
}

/// Whether a request for `new` covers a feed of `old`: every spec of `old` has a spec in `new`
/// with the same pattern and at least its feedtypes. Patterns are compared as text — whether
/// one ERE matches everything another does is not decided — so a feed is only ever replaced
/// by one that certainly sends all it sent.
pub fn covers(new: &ProdClass, old: &ProdClass) -> bool {
    !old.specs.is_empty()
        && old.specs.iter().all(|spec| {
            new.specs.iter().any(|candidate| {
                candidate.pattern.as_str() == spec.pattern.as_str()
                    && (candidate.feedtype & spec.feedtype) == spec.feedtype
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ldm7_types::{FeedType, ProdSpec, Timestamp};

    fn class(specs: &[(&str, &str)]) -> ProdClass {
        ProdClass {
            from: Timestamp::ZERO,
            to: Timestamp::ZERO,
            specs: specs
                .iter()
                .map(|(feed, pattern)| ProdSpec::new(feed.parse::<FeedType>().unwrap(), pattern).unwrap())
                .collect(),
        }
    }

    #[test]
    fn a_request_covers_a_feed_with_the_same_patterns_and_at_least_its_feedtypes() {
        let ngrid = class(&[("NGRID", ".*")]);
        assert!(covers(&ngrid, &ngrid));
        assert!(covers(&class(&[("NGRID|CONDUIT", ".*")]), &ngrid));
        assert!(covers(&class(&[("IDS", "^SA"), ("NGRID", ".*")]), &ngrid));
        assert!(!covers(&class(&[("NGRID", "^Y")]), &ngrid), "another pattern");
        assert!(!covers(&class(&[("CONDUIT", ".*")]), &ngrid), "another feed");
        assert!(!covers(&ngrid, &class(&[("NGRID|CONDUIT", ".*")])), "less than the old feed");
        assert!(!covers(&ngrid, &class(&[])), "an empty class is never replaced");
    }

    #[test]
    fn host_slots_are_given_back() {
        let hosts = Arc::new(HostConnections::default());
        let ip: IpAddr = "192.0.2.7".parse().unwrap();
        let first = hosts.acquire(ip, 2).unwrap();
        let second = hosts.acquire(ip, 2).unwrap();
        assert_eq!(hosts.acquire(ip, 2).unwrap_err(), 2);
        assert!(hosts.acquire("192.0.2.8".parse().unwrap(), 2).is_ok(), "other hosts are not limited by this one");
        drop(first);
        let third = hosts.acquire(ip, 2).unwrap();
        drop((second, third));
        assert_eq!(hosts.open(ip), 0);
    }

    #[test]
    fn a_covering_feed_replaces_the_hosts_older_one_unless_turned_off() {
        let feeders = Arc::new(Feeders::default());
        let ip: IpAddr = "192.0.2.7".parse().unwrap();
        let other: IpAddr = "192.0.2.8".parse().unwrap();
        let ngrid = class(&[("NGRID", ".*")]);
        let (old, replaced) = feeders.register(ip, &ngrid, None, true);
        assert!(replaced.is_empty());
        let (elsewhere, _) = feeders.register(other, &ngrid, None, true);
        let (conduit, _) = feeders.register(ip, &class(&[("CONDUIT", ".*")]), None, true);
        let (both, _) = feeders.register(ip, &ngrid, None, false);
        assert!(!old.is_replaced(), "turned off: both feed");
        let (new, replaced) = feeders.register(ip, &ngrid, None, true);
        assert_eq!(replaced.iter().map(|feed| feed.id).collect::<Vec<_>>(), vec![old.id, both.id]);
        assert!(old.is_replaced() && both.is_replaced());
        assert!(!conduit.is_replaced() && !elsewhere.is_replaced() && !new.is_replaced());
        assert_eq!(feeders.len(), 3);
        drop((old, both, new, conduit, elsewhere));
        assert!(feeders.is_empty());
    }

    #[test]
    fn refusals_are_all_counted_and_logged_at_most_once_a_minute() {
        let refusals = ConnectionRefusals::default();
        let mut logged = 0;
        for _ in 0..1000 {
            refusals.refuse(ConnectionRefusal::PerHost, || {
                logged += 1;
                "refused".into()
            });
        }
        refusals.refuse(ConnectionRefusal::Busy, || {
            logged += 1;
            "busy".into()
        });
        assert_eq!(refusals.count(ConnectionRefusal::PerHost), 1000);
        assert_eq!(refusals.count(ConnectionRefusal::Busy), 1);
        assert_eq!(logged, 2, "one line per reason within the interval");
    }
}
