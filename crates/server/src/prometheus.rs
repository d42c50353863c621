//! Prometheus metrics of a running server: `GET /metrics` in the text exposition format
//! (version 0.0.4), names after Prometheus conventions (`ldm7_` prefix, `_total` counters,
//! base units: bytes, seconds). Served when `ldm7 serve --metrics ADDR` is given.
//!
//! | metric | labels | what |
//! |---|---|---|
//! | `ldm7_connections_accepted_total` | | LDM connections accepted |
//! | `ldm7_connections_refused_total` | `reason` = `busy`, `host`, `per_host`, `record_too_long`, `idle`, `replaced` | connections refused or closed by the server's bounds (docs/server.md "Bounds") |
//! | `ldm7_feeders_active` | | LDM-6 feeds (FEEDME sessions) being sent |
//! | `ldm7_connections_active` | | connections being served |
//! | `ldm7_products_sent_total` | | products sent to LDM-6 downstreams |
//! | `ldm7_products_received_total` | | products received over LDM-6 and inserted |
//! | `ldm7_products_duplicate_total` | | LDM-6 products the queue already had |
//! | `ldm7_insert_errors_total` | | products that could not be inserted |
//! | `ldm7_malformed_total` | | malformed records and mismatched products |
//! | `ldm7_delivered_products_total` | `receive`, `mode` = `multicast`, `retransmitted`, `backstop`, `backlog` | LDM-7 subscriber deliveries |
//! | `ldm7_receive_retransmitted_blocks_total` | `receive` | FMTP blocks repaired over TCP |
//! | `ldm7_receive_host_dropped_datagrams_total` | `receive` | multicast datagrams the kernel dropped at this host (the receiving socket's buffer was full; not path loss) |
//! | `ldm7_receive_subscriptions_total`, `ldm7_receive_backstop_requests_total`, `ldm7_receive_corrupt_total`, `ldm7_receive_duplicates_total` | `receive` | |
//! | `ldm7_publisher_subscriptions_total`, `ldm7_publisher_refusals_total`, `ldm7_publisher_products_multicast_total`, `ldm7_publisher_backstop_products_sent_total`, `ldm7_publisher_backlog_products_sent_total` | | publisher side |
//! | `ldm7_fmtp_multicast_bytes_total`, `ldm7_fmtp_retransmitted_blocks_total`, `ldm7_fmtp_retransmitted_bytes_total`, `ldm7_fmtp_retransmission_requests_total`, `ldm7_fmtp_rejections_total`, `ldm7_fmtp_parity_bytes_total`, `ldm7_fmtp_subscribers` | `feed` | each multicast feed's FMTP sender |
//! | `ldm7_path_rate_bits_per_second` | `feed` | each multicast feed's path rate now (FMTP pacing) |
//! | `ldm7_rate_monitor_intervals_total`, `ldm7_rate_monitor_deliveries_total`, `ldm7_rate_monitor_violations_total`, `ldm7_rate_monitor_raises_total`, `ldm7_rate_monitor_lowers_total`, `ldm7_rate_monitor_at_ceiling_total`, `ldm7_rate_monitor_rate_change_failures_total` | `feed` | the online monitor of a feed with `rate_control` |
//! | `ldm7_rate_monitor_subscribers`, `ldm7_rate_monitor_violating_subscribers` | `feed` | the monitor's last interval |
//! | `ldm7_queue_products`, `ldm7_queue_bytes`, `ldm7_queue_capacity_bytes`, `ldm7_queue_capacity_slots`, `ldm7_queue_oldest_age_seconds` | | the product queue |
//! | `ldm7_queue_inserted_total`, `ldm7_queue_evicted_total` | | |
//! | `ldm7_statistics_products_total` | | per-minute statistics products published |

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ldm7_prometheus::{Endpoint, Exposition, Family};

use crate::server::Shared;

fn load(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// The metrics of `shared`, now.
pub(crate) fn render(shared: &Shared) -> String {
    let mut out = Exposition::default();
    connections(&mut out, shared);
    subscribers(&mut out, shared);
    publisher(&mut out, shared);
    rate_control(&mut out, shared);
    queue(&mut out, shared);
    out.into_text()
}

/// The LDM connections and products: accepted, refused by reason, feeds, products sent and received.
fn connections(out: &mut Exposition, shared: &Shared) {
    let counters = &shared.counters;
    out.single("ldm7_connections_accepted_total", "counter", "LDM connections accepted.", load(&counters.connections));
    out.family("ldm7_connections_refused_total", "counter", "LDM connections refused or closed by a bound, by reason.");
    for reason in crate::limits::ConnectionRefusal::ALL {
        out.sample("ldm7_connections_refused_total", &[("reason", reason.label())], counters.refusals.count(reason));
    }
    out.single("ldm7_feeders_active", "gauge", "LDM-6 feeds (FEEDME sessions) being sent.", shared.feeders.len());
    out.single("ldm7_connections_active", "gauge", "LDM connections being served.", shared.active_connections());
    out.single(
        "ldm7_products_sent_total",
        "counter",
        "Products sent to LDM-6 downstreams.",
        load(&counters.products_sent),
    );
    out.single(
        "ldm7_products_received_total",
        "counter",
        "Products received over LDM-6 and inserted.",
        load(&counters.products_received),
    );
    out.single(
        "ldm7_products_duplicate_total",
        "counter",
        "LDM-6 products the queue already had.",
        load(&counters.duplicates),
    );
    out.single(
        "ldm7_insert_errors_total",
        "counter",
        "Products that could not be inserted.",
        load(&counters.insert_errors),
    );
    out.single(
        "ldm7_malformed_total",
        "counter",
        "Malformed records and mismatched products.",
        load(&counters.malformed),
    );
}

/// Each LDM-7 subscriber (RECEIVE): products by how they came, repairs, subscriptions, drops at this host.
fn subscribers(out: &mut Exposition, shared: &Shared) {
    let receives = shared.subscriber_counters.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
    out.family(
        "ldm7_delivered_products_total",
        "counter",
        "Products an LDM-7 subscriber put in its queue, by how they came.",
    );
    for (name, counters) in &receives {
        let received = load(&counters.received);
        let multicast = load(&counters.multicast_only);
        for (mode, value) in [
            ("multicast", multicast),
            ("retransmitted", received.saturating_sub(multicast)),
            ("backstop", load(&counters.inserted)),
            ("backlog", load(&counters.backlog)),
        ] {
            out.sample("ldm7_delivered_products_total", &[("receive", name), ("mode", mode)], value);
        }
    }
    for (metric, help, pick) in [
        ("ldm7_receive_retransmitted_blocks_total", "FMTP blocks repaired over TCP.", 0),
        ("ldm7_receive_subscriptions_total", "Successful subscriptions.", 1),
        ("ldm7_receive_backstop_requests_total", "Products asked for by the backstop.", 2),
        ("ldm7_receive_corrupt_total", "FMTP products that failed their check.", 3),
        ("ldm7_receive_duplicates_total", "Products that came twice.", 4),
        (
            "ldm7_receive_host_dropped_datagrams_total",
            "Multicast datagrams dropped at this host: the receiving socket's buffer was full (not path loss).",
            5,
        ),
    ] {
        out.family(metric, "counter", help);
        for (name, counters) in &receives {
            let value = match pick {
                0 => load(&counters.retransmitted_blocks),
                1 => load(&counters.subscriptions),
                2 => load(&counters.requested),
                3 => load(&counters.corrupt),
                4 => load(&counters.duplicates),
                _ => load(&counters.host_drops),
            };
            out.sample(metric, &[("receive", name)], value);
        }
    }
}

/// The LDM-7 publisher: subscriptions, products by how they went, and each feed's FMTP counters.
fn publisher(out: &mut Exposition, shared: &Shared) {
    let publisher = shared.multicaster.counters();
    out.single("ldm7_publisher_subscriptions_total", "counter", "SUBSCRIBEs granted.", load(&publisher.subscriptions));
    out.single("ldm7_publisher_refusals_total", "counter", "SUBSCRIBEs refused.", load(&publisher.refusals));
    out.single(
        "ldm7_publisher_products_multicast_total",
        "counter",
        "Products handed to FMTP.",
        load(&publisher.products_multicast),
    );
    out.single(
        "ldm7_publisher_backstop_products_sent_total",
        "counter",
        "Products sent by the backstop.",
        load(&publisher.missed_products_sent),
    );
    out.single(
        "ldm7_publisher_backlog_products_sent_total",
        "counter",
        "Products sent by backlogs.",
        load(&publisher.backlog_products_sent),
    );
    let feeds = shared.multicaster.feed_counters();
    type Fmtp = (String, usize, ldm7_fmtp_proto::SenderCounters);
    let fmtp: [Family<Fmtp>; 7] = [
        ("ldm7_fmtp_multicast_bytes_total", "counter", "Bytes multicast (FMTP header and payload).", |f| {
            f.2.multicast_bytes
        }),
        ("ldm7_fmtp_retransmitted_blocks_total", "counter", "Blocks retransmitted.", |f| f.2.retx_data_blocks),
        ("ldm7_fmtp_retransmitted_bytes_total", "counter", "Bytes sent on repair connections.", |f| f.2.retx_bytes),
        ("ldm7_fmtp_retransmission_requests_total", "counter", "Retransmission requests received.", |f| {
            f.2.retx_requests
        }),
        ("ldm7_fmtp_rejections_total", "counter", "Retransmission requests rejected (past the deadline).", |f| {
            f.2.rejects
        }),
        ("ldm7_fmtp_parity_bytes_total", "counter", "Parity bytes multicast (parity repair, docs/parity.md).", |f| {
            f.2.parity_bytes
        }),
        ("ldm7_fmtp_subscribers", "gauge", "Subscribers of the feed.", |f| f.1 as u64),
    ];
    out.per_feed(&fmtp, feeds.iter().map(|f| (f.0.as_str(), f)));
}

/// Each multicast feed's path rate and online rate monitor.
fn rate_control(out: &mut Exposition, shared: &Shared) {
    let rates = shared.multicaster.feed_rates();
    out.family("ldm7_path_rate_bits_per_second", "gauge", "The feed's path rate now (FMTP pacing).");
    for (feed, rate, _) in &rates {
        out.sample("ldm7_path_rate_bits_per_second", &[("feed", feed)], rate);
    }
    let monitor: [Family<crate::multicast::rate_control::RateControlStatus>; 9] = [
        ("ldm7_rate_monitor_intervals_total", "counter", "Intervals the online monitor ended.", |s| {
            s.counters.intervals
        }),
        ("ldm7_rate_monitor_deliveries_total", "counter", "Subscriber completions the monitor measured.", |s| {
            s.counters.deliveries
        }),
        ("ldm7_rate_monitor_violations_total", "counter", "Of those, late by more than W (or given up).", |s| {
            s.counters.violations
        }),
        ("ldm7_rate_monitor_raises_total", "counter", "Path rate steps up.", |s| s.counters.raises),
        ("ldm7_rate_monitor_lowers_total", "counter", "Path rate steps down.", |s| s.counters.lowers),
        ("ldm7_rate_monitor_at_ceiling_total", "counter", "Intervals that wanted a raise at the ceiling.", |s| {
            s.counters.at_ceiling
        }),
        ("ldm7_rate_monitor_rate_change_failures_total", "counter", "Rate steps refused (the rate stayed).", |s| {
            s.rate_change_failures
        }),
        ("ldm7_rate_monitor_subscribers", "gauge", "Subscribers measured in the last interval.", |s| {
            s.last_interval.subscribers as u64
        }),
        ("ldm7_rate_monitor_violating_subscribers", "gauge", "Of those, the ones over alpha.", |s| {
            s.last_interval.violating as u64
        }),
    ];
    out.per_feed(&monitor, rates.iter().filter_map(|(feed, _, status)| Some((feed.as_str(), status.as_ref()?))));
}

/// The product queue and the statistics products.
fn queue(out: &mut Exposition, shared: &Shared) {
    if let Ok(stats) = shared.queue.stats() {
        out.single("ldm7_queue_products", "gauge", "Products in the queue.", stats.product_count);
        out.single("ldm7_queue_bytes", "gauge", "Bytes of products in the queue.", stats.used_bytes);
        out.single("ldm7_queue_capacity_bytes", "gauge", "The queue's byte capacity.", stats.capacity.bytes);
        out.single("ldm7_queue_capacity_slots", "gauge", "The queue's product capacity.", stats.capacity.slots);
        out.single(
            "ldm7_queue_inserted_total",
            "counter",
            "Products inserted since the queue was made.",
            stats.inserted_count,
        );
        out.single(
            "ldm7_queue_evicted_total",
            "counter",
            "Products evicted since the queue was made.",
            stats.evicted_count,
        );
        if let Some(oldest) = stats.oldest_insertion {
            let now = ldm7_types::Timestamp::from_system_time(std::time::SystemTime::now());
            let age = now.saturating_duration_since(oldest).as_secs_f64();
            out.single("ldm7_queue_oldest_age_seconds", "gauge", "Age of the oldest product in the queue.", age);
        }
    }
    out.single(
        "ldm7_statistics_products_total",
        "counter",
        "Per-minute statistics products published.",
        load(&shared.stats.published),
    );
}

/// Serves the metrics of `shared` on `listen`.
pub(crate) fn start(shared: Arc<Shared>, listen: std::net::SocketAddr) -> std::io::Result<Endpoint> {
    Endpoint::start(Arc::new(move || render(&shared)), listen)
}
