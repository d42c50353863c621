//! The server's delivery statistics (issue "Monitoring"; RESEARCH.md §5): every product an
//! LDM-7 subscriber puts in its queue is an event of its link (feed, publisher, this host);
//! each minute, shortly after it ends, the minute's sums are inserted into the server's own
//! queue as one statistics product (`ldm7_metrics::product`, feed EXP, identifier
//! `ldm7-stats/1/<this host>/<YYYYMMDDhhmm>`), so whoever requests EXP `^ldm7-stats/` from this
//! server — a monitor, an upstream — receives them like any product. At shutdown the minute in
//! progress is published too. A server with LDM-7 feeds (MULTICAST or RECEIVE) publishes every
//! minute from its start, an empty product when nothing was delivered: its heartbeat, so that a
//! monitor shows a publisher (which receives nothing) and an idle subscriber as alive. A server
//! with LDM-6 feeds only publishes nothing then (LDM 6 hosts report by rtstats).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use ldm7_metrics::{Aggregator, DeliveryEvent, Minute, StatsProduct};
use ldm7_pq::{InsertOutcome, Queue};
use ldm7_types::{FeedType, ProdInfo, Signature, Timestamp};

/// How long after a minute ends its statistics wait for late deliveries.
pub const GRACE: Duration = Duration::from_secs(2);

/// The per-minute statistics of one server.
#[derive(Debug)]
pub struct StatsPublisher {
    /// This host's name in links and products.
    name: String,
    aggregator: Mutex<Aggregator>,
    seqno: AtomicU32,
    /// The first minute whose heartbeat is still owed (set by the first publication).
    next_heartbeat: Mutex<Option<Minute>>,
    /// Statistics products inserted.
    pub published: AtomicU64,
}

impl StatsPublisher {
    /// Statistics of the server called `name` (its host name, with `:port` when the port is not
    /// LDM's 388).
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            aggregator: Mutex::new(Aggregator::new()),
            seqno: AtomicU32::new(0),
            next_heartbeat: Mutex::new(None),
            published: AtomicU64::new(0),
        }
    }

    /// This server's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn aggregator(&self) -> std::sync::MutexGuard<'_, Aggregator> {
        self.aggregator.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records one delivery.
    pub fn record(&self, event: &DeliveryEvent) {
        self.aggregator().record(event);
    }

    /// Records multicast datagrams dropped at this host on a link.
    pub fn record_host_drops(&self, link: &ldm7_metrics::Link, at: Timestamp, count: u64) {
        self.aggregator().record_host_drops(link, at, count);
    }

    /// Publishes every minute that ended at least [`GRACE`] before `now`; with `heartbeat`,
    /// each such minute since the first call, delivered to or not.
    pub fn publish_due(&self, queue: &Queue, now: Timestamp, heartbeat: bool) {
        let due = Minute::of(now.saturating_sub(GRACE));
        let rows = self.aggregator().take_before(due);
        self.publish(queue, rows, now, heartbeat.then_some(due));
    }

    /// Publishes everything (at shutdown); with `heartbeat`, the minute in progress too.
    pub fn publish_all(&self, queue: &Queue, now: Timestamp, heartbeat: bool) {
        let rows = self.aggregator().take_all();
        self.publish(queue, rows, now, heartbeat.then_some(Minute(Minute::of(now).0 + 1)));
    }

    /// Inserts the products of `rows`, and with `heartbeat_until` an empty one for each minute
    /// before it that owes a heartbeat and has no rows.
    fn publish(
        &self,
        queue: &Queue,
        rows: Vec<ldm7_metrics::MinuteRow>,
        now: Timestamp,
        heartbeat_until: Option<Minute>,
    ) {
        let mut by_minute: std::collections::BTreeMap<Minute, Vec<ldm7_metrics::MinuteRow>> = Default::default();
        if let Some(until) = heartbeat_until {
            let mut next = self.next_heartbeat.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            // The first call owes nothing before it: a server does not report for minutes it
            // did not run.
            let from = next.unwrap_or(until);
            for minute in from.0..until.0 {
                by_minute.insert(Minute(minute), Vec::new());
            }
            *next = Some(until.max(from));
        }
        for row in rows {
            by_minute.entry(row.minute).or_default().push(row);
        }
        for (minute, rows) in by_minute {
            let product = StatsProduct { reporter: self.name.clone(), minute, rows };
            let body = product.body();
            let info = ProdInfo {
                arrival: now,
                // Of the identifier and the data: two minutes with the same sums (or two empty
                // ones) are two products.
                signature: Signature::md5_of(format!("{}\n{body}", product.ident()).as_bytes()),
                origin: self.name.clone(),
                feedtype: FeedType::EXP,
                seqno: self.seqno.fetch_add(1, Ordering::Relaxed) % 1000,
                ident: product.ident(),
                size: body.len() as u32,
            };
            match queue.insert(&info, body.as_bytes()) {
                Ok(InsertOutcome::Inserted { .. }) => {
                    self.published.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!("statistics published: {}", info.ident);
                }
                Ok(InsertOutcome::Duplicate { .. }) => {}
                Err(error) => tracing::warn!("cannot insert the statistics product {}: {error}", info.ident),
            }
        }
    }
}

/// A server's name in statistics: the host name, with `:port` when the port is not 388.
pub fn node_name(host: &str, port: u16) -> String {
    // An IPv6 host in brackets when a port follows (`[2001:db8::7]:38800`).
    if port == 388 { host.to_owned() } else { ldm7_types::host::join(host, port) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ldm7_metrics::{Link, Mode};

    #[test]
    fn with_a_heartbeat_every_minute_since_the_start_is_published_once() {
        let dir = tempfile::tempdir().expect("dir");
        let queue = Queue::create(&dir.path().join("q"), ldm7_pq::Capacity { bytes: 10 << 20, slots: 100 }, false)
            .expect("queue");
        let stats = StatsPublisher::new("pub.example");
        let at = |secs: i64| Timestamp { secs, micros: 0 };
        let published = || stats.published.load(Ordering::Relaxed);
        // Started at 00:10:30: nothing owed before minute 10.
        stats.publish_due(&queue, at(630), true);
        assert_eq!(published(), 0);
        stats.publish_due(&queue, at(661), true);
        assert_eq!(published(), 0, "minute 10 is not over for the grace yet");
        stats.publish_due(&queue, at(662), true);
        stats.publish_due(&queue, at(663), true);
        assert_eq!(published(), 1, "minute 10, once");
        // A stalled thread catches up: minutes 11 and 12.
        stats.publish_due(&queue, at(785), true);
        assert_eq!(published(), 3);
        // At shutdown, the minute in progress (13).
        stats.publish_all(&queue, at(790), true);
        assert_eq!(published(), 4);
        let snapshot = queue.snapshot().expect("snapshot");
        let idents: Vec<String> = snapshot
            .products_from(Timestamp::ZERO)
            .expect("range")
            .map(|product| product.expect("product").info.ident.clone())
            .collect();
        let minutes: Vec<&str> = idents.iter().map(|ident| &ident[ident.len() - 4..]).collect();
        assert_eq!(minutes, ["0010", "0011", "0012", "0013"]);
        for ident in &idents {
            let product = snapshot.products_from(Timestamp::ZERO).expect("range").find_map(|p| {
                let p = p.expect("product");
                (&p.info.ident == ident).then(|| p.to_owned_product())
            });
            let product = product.expect("product");
            let parsed = StatsProduct::parse(&product.info.ident, &product.data).expect("parses");
            assert!(parsed.rows.is_empty());
            assert_eq!(parsed.reporter, "pub.example");
        }
    }

    #[test]
    fn a_minute_is_published_once_it_is_over_and_reads_back() {
        let dir = tempfile::tempdir().expect("dir");
        let queue = Queue::create(&dir.path().join("q"), ldm7_pq::Capacity { bytes: 10 << 20, slots: 100 }, false)
            .expect("queue");
        let stats = StatsPublisher::new("sub.example:38800");
        let at = |secs: i64| Timestamp { secs, micros: 0 };
        let link = Link::new(FeedType::NGRID, "pub.example", "sub.example:38800");
        for (secs, mode, size) in
            [(600, Mode::Multicast, 100), (610, Mode::Retransmitted, 50), (660, Mode::Backstop, 7)]
        {
            stats.record(&DeliveryEvent {
                link: link.clone(),
                completed: at(secs),
                mode,
                size,
                latency_us: 1000,
                retx_blocks: u32::from(mode == Mode::Retransmitted),
            });
        }
        // 11:01 — minute 10 ended less than the grace ago: nothing yet.
        stats.publish_due(&queue, at(661), false);
        assert_eq!(stats.published.load(Ordering::Relaxed), 0);
        stats.publish_due(&queue, at(662), false);
        assert_eq!(stats.published.load(Ordering::Relaxed), 1);
        stats.publish_all(&queue, at(700), false);
        assert_eq!(stats.published.load(Ordering::Relaxed), 2);
        let snapshot = queue.snapshot().expect("snapshot");
        let products: Vec<_> = snapshot
            .products_from(Timestamp::ZERO)
            .expect("range")
            .map(|product| product.expect("product").to_owned_product())
            .collect();
        assert_eq!(products.len(), 2);
        let first = StatsProduct::parse(&products[0].info.ident, &products[0].data).expect("parse");
        assert_eq!(products[0].info.ident, "ldm7-stats/1/sub.example:38800/197001010010");
        assert_eq!(products[0].info.feedtype, FeedType::EXP);
        assert_eq!(first.rows.len(), 1);
        let sums = first.rows[0].sums;
        assert_eq!((sums.n, sums.n_fmtp, sums.n_mc, sums.s_all, sums.retx_blocks), (2, 2, 1, 150, 1));
        let second = StatsProduct::parse(&products[1].info.ident, &products[1].data).expect("parse");
        assert_eq!((second.minute, second.rows[0].sums.backstop), (Minute(11), 1));
    }
}
