//! LDM-7 on loopback with real `ldm7 serve` processes (no root): a publisher multicasts a feed
//! from its queue by FMTP to subscribers that RECEIVE it into their own queues. Every product
//! reaches every subscriber's queue intact and once — by FMTP, the backstop or the backlog —
//! through loss, a subscriber killed and restarted, and a publisher restarted; subscriptions
//! that ALLOW does not grant and repair connections from addresses the publisher did not hand
//! out are refused and logged. With parity repair (docs/parity.md) lossy subscribers get their
//! lost blocks back from shards multicast.

use crate::support;

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use crate::support::{LOCAL, Node, run, tail};
use ldm7_testkit::{shared_data_or_skip, wait_until};

const TRACE: &str = "traces/unidata_ldm_NGRID_1hr_20150615T00Z.txt";

/// A multicast group of this test process and test (tests run in parallel on one loopback).
fn group(test: u8) -> String {
    format!("239.255.{}.{test}:{}", std::process::id() % 250 + 1, support::free_port())
}

fn publisher(root: &std::path::Path, test: u8, allow: &str, settings: &str) -> Node {
    let config = format!("{allow}\nMULTICAST EXP {} 127.0.0.1:0 24 0 dummy dummy\n", group(test));
    // The most a test inserts, 1,500 NGRID-sized products, takes 350 MB.
    let node = Node::new(root, "pub", "600M", &config);
    std::fs::write(node.dir.join("ldm7.toml"), settings).expect("settings");
    node
}

/// A second publisher in the same root, allowing everyone.
fn publisher_in(root: &std::path::Path, name: &str, test: u8, settings: &str) -> Node {
    let config = format!("{}\nMULTICAST EXP {} 127.0.0.1:0 24 0 dummy dummy\n", allow_all(), group(test));
    let node = Node::new(root, name, "600M", &config);
    std::fs::write(node.dir.join("ldm7.toml"), settings).expect("settings");
    node
}

fn allow_all() -> String {
    format!("ALLOW ANY {LOCAL}")
}

fn subscriber(root: &std::path::Path, name: &str, publisher: &Node, drop: f64) -> Node {
    let node = Node::new(root, name, "600M", &format!("RECEIVE EXP 127.0.0.1:{}\n", publisher.port));
    let settings = format!("[receive]\nretry_min = \"100ms\"\nretry_max = \"1s\"\ndrop = {drop}\n");
    std::fs::write(node.dir.join("ldm7.toml"), settings).expect("settings");
    node
}

/// Inserts `limit` NGRID-sized products (seeded contents) into a node's queue as EXP.
fn replay(node: &Node, trace: &std::path::Path, limit: usize, seed: u64) {
    let (queue, trace) = (node.queue_path(), trace.display().to_string());
    let (limit, seed) = (limit.to_string(), seed.to_string());
    run(&[
        "insert", "-q", &queue, "--replay", &trace, "--feed", "EXP", "--speed", "0", "--limit", &limit, "--seed", &seed,
    ]);
}

/// Lines of a delivery mode in a subscriber's log.
fn deliveries(node: &Node, mode: &str) -> usize {
    node.log().lines().filter(|line| line.contains(&format!(" INFO {mode}: {{latency: "))).count()
}

/// Waits until a subscriber has subscribed (its FMTP repair connection is up).
fn wait_subscribed(node: &Node) {
    wait_until(Duration::from_secs(20), &format!("{} to subscribe", node.dir.display()), || {
        node.log().contains("FMTP repair connection to").then_some(())
    });
}

/// Every subscriber holds exactly the publisher's products, intact.
fn assert_same_products(publisher: &Node, subscribers: &[Node]) {
    let (expected, _) = publisher.verify();
    for node in subscribers {
        let (got, _) = node.verify();
        assert_eq!(got.len(), expected.len(), "{}: {}", node.dir.display(), tail(&node.log()));
        assert_eq!(got, expected, "{}", node.dir.display());
    }
}

/// The sums of every statistics product in a node's queue (its per-minute delivery statistics),
/// and the links they name.
fn statistics(node: &Node) -> (ldm7_metrics::MinuteSums, Vec<ldm7_metrics::Link>) {
    let queue = ldm7_pq::Queue::open(std::path::Path::new(&node.queue_path())).expect("queue");
    let snapshot = queue.snapshot().expect("snapshot");
    let mut rows = Vec::new();
    for product in snapshot.products_from(ldm7_types::Timestamp::ZERO).expect("iterate") {
        let product = product.expect("product");
        if support::is_stats(&product.info.ident) {
            rows.extend(ldm7_metrics::StatsProduct::parse(&product.info.ident, product.data).expect("parse").rows);
        }
    }
    let mut links: Vec<_> = rows.iter().map(|row| row.link.clone()).collect();
    links.dedup();
    (ldm7_metrics::MinuteSums::total(rows.iter().map(|row| &row.sums)), links)
}

/// `GET /metrics` of a server's Prometheus endpoint (checks the status and content type).
fn get_metrics(port: u16) -> String {
    use std::io::{Read, Write};
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to the metrics endpoint");
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").expect("request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.to_ascii_lowercase().contains("content-type: text/plain; version=0.0.4"), "{head}");
    body.to_owned()
}

/// A sample's value in exposition text.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Blocks retransmitted, summed over a subscriber's `Received` lines.
fn retransmitted_blocks(node: &Node) -> u64 {
    node.log().lines().filter_map(|line| line.split("retrans: ").nth(1)?.split(',').next()?.parse::<u64>().ok()).sum()
}

#[test]
fn three_subscribers_one_lossy_get_every_product_by_fmtp() {
    let Some(trace) = shared_data_or_skip(TRACE) else { return };
    let root = tempfile::tempdir().expect("tempdir");
    let mut publisher = publisher(root.path(), 1, &allow_all(), "[multicast]\nrate = \"400 Mbit/s\"\n");
    publisher.start();
    let mut subscribers: Vec<Node> = [0.0, 0.0, 0.05]
        .iter()
        .enumerate()
        .map(|(k, drop)| subscriber(root.path(), &format!("sub{k}"), &publisher, *drop))
        .collect();
    all_by_fmtp(&publisher, &mut subscribers, &trace, 1500, 7);
    let repaired =
        subscribers[2].log().lines().filter(|line| line.contains("Received:") && !line.contains("retrans: 0,")).count();
    assert!(repaired > 0, "the lossy subscriber needed repairs");
    let publisher_log = publisher.log();
    assert_eq!(publisher_log.matches("Multicasted: prodIndex=").count(), 1500);
    // No circuit (`dummy` switch and port), so each subscriber keeps its own address, as the
    // reference's publisher hands them (ldm7-multicast.md §4.3).
    assert!(publisher_log.contains("address 127.0.0.1/32"), "subscribers keep their own address");
    for node in &mut subscribers {
        node.stop();
    }
    publisher.stop();
    // Each subscriber published its deliveries as statistics products (the minute in progress
    // at shutdown too): every product, all by FMTP, the lossy one's repairs counted.
    for node in &subscribers {
        let (sums, links) = statistics(node);
        assert_eq!((sums.n, sums.n_fmtp, sums.backstop, sums.backlog), (1500, 1500, 0, 0), "{}", node.dir.display());
        assert_eq!(sums.retx_blocks, retransmitted_blocks(node));
        assert_eq!(sums.n - sums.n_mc, repaired_count(node));
        assert_eq!(links.len(), 1);
        assert_eq!(
            (links[0].feed.as_str(), links[0].publisher.clone()),
            ("EXP", format!("127.0.0.1:{}", publisher.port))
        );
    }
    let (lossy, _) = statistics(&subscribers[2]);
    assert!(lossy.derived().mplr.is_some_and(|mplr| mplr > 0.0));
}

/// Parity repair (an ldm7 extension, docs/parity.md) in `ldm7 serve`, negotiated: with the
/// defaults a subscriber offers it and the publisher answers with its coding (992/32 for the
/// default `subscribers_max` and `parity_loss`); `parity = "off"` on either end makes that
/// subscription plain FMTP. Lossy subscribers get every product by FMTP either way; the lost
/// blocks of those granted parity come back as shards multicast (the publisher's metrics), not
/// as retransmissions.
#[test]
fn parity_is_negotiated_between_ldm7_peers_and_off_refuses_it() {
    let Some(trace) = shared_data_or_skip(TRACE) else { return };
    let root = tempfile::tempdir().expect("tempdir");
    let lossy = |name: &str, publisher: &Node, extra: &str| {
        let node = subscriber(root.path(), name, publisher, 0.03);
        let path = node.dir.join("ldm7.toml");
        let settings = std::fs::read_to_string(&path).expect("settings");
        std::fs::write(&path, format!("{settings}{extra}")).expect("settings");
        node
    };
    let said = |node: &Node, what: &str| {
        let log = node.log();
        assert!(log.lines().any(|line| line.contains("subscribed: ") && line.contains(what)), "{what}: {}", tail(&log));
    };

    // The defaults: parity; one subscriber refusing it.
    let mut publisher = publisher(root.path(), 13, &allow_all(), "[multicast]\nrate = \"400 Mbit/s\"\n");
    let publisher_metrics = support::free_port();
    publisher.set_extra(vec!["--metrics".into(), format!("127.0.0.1:{publisher_metrics}")]);
    publisher.start();
    let mut subscribers = vec![lossy("sub0", &publisher, ""), lossy("sub1", &publisher, "parity = \"off\"\n")];
    all_by_fmtp(&publisher, &mut subscribers, &trace, 300, 13);
    said(&subscribers[0], "parity repair 992/32 on port");
    said(&subscribers[1], "unicast repairs (no parity)");
    for node in &subscribers {
        assert!(retransmitted_blocks(node) > 0, "the lossy subscriber's repaired blocks: {}", tail(&node.log()));
    }
    let text = get_metrics(publisher_metrics);
    let parity = metric(&text, "ldm7_fmtp_parity_bytes_total{feed=\"EXP\"}").unwrap_or(0.0);
    assert!(parity > 0.0, "{text}");
    for node in &mut subscribers {
        node.stop();
    }
    publisher.stop();

    // The publisher refusing it: unicast repairs only.
    let settings = "[multicast]\nrate = \"400 Mbit/s\"\nparity = \"off\"\n";
    let mut publisher = publisher_in(root.path(), "pub-off", 14, settings);
    let publisher_metrics = support::free_port();
    publisher.set_extra(vec!["--metrics".into(), format!("127.0.0.1:{publisher_metrics}")]);
    publisher.start();
    let mut subscribers = vec![lossy("sub2", &publisher, "")];
    all_by_fmtp(&publisher, &mut subscribers, &trace, 300, 14);
    said(&subscribers[0], "unicast repairs (no parity)");
    let text = get_metrics(publisher_metrics);
    assert_eq!(metric(&text, "ldm7_fmtp_parity_bytes_total{feed=\"EXP\"}"), Some(0.0), "{text}");
    assert!(metric(&text, "ldm7_fmtp_retransmitted_bytes_total{feed=\"EXP\"}").unwrap_or(0.0) > 0.0, "{text}");
    for node in &mut subscribers {
        node.stop();
    }
    publisher.stop();
}

/// Starts the subscribers, waits until each subscribed, replays `count` products into the
/// publisher's queue and checks that every subscriber got them all, by FMTP only.
fn all_by_fmtp(publisher: &Node, subscribers: &mut [Node], trace: &std::path::Path, count: usize, seed: u64) {
    for node in subscribers.iter_mut() {
        node.start();
        wait_subscribed(node);
    }
    replay(publisher, trace, count, seed);
    for node in subscribers.iter() {
        node.wait_for(count as u64, Duration::from_secs(120));
    }
    assert_same_products(publisher, subscribers);
    for node in subscribers.iter() {
        assert_eq!(deliveries(node, "Received"), count, "{}", tail(&node.log()));
        assert_eq!(deliveries(node, "Inserted") + deliveries(node, "Backlog"), 0);
    }
}

/// FMTP products that needed at least one retransmitted block, by the subscriber's log.
fn repaired_count(node: &Node) -> u64 {
    node.log().lines().filter(|line| line.contains("Received:") && !line.contains("retrans: 0,")).count() as u64
}

#[test]
fn the_backstop_fetches_what_fmtp_gave_up() {
    let Some(trace) = shared_data_or_skip(TRACE) else { return };
    // A retransmission deadline of zero: every repair request is rejected, so each product
    // the lossy subscriber does not get whole by multicast comes through the backstop.
    let root = tempfile::tempdir().expect("tempdir");
    let mut publisher = publisher(root.path(), 2, &allow_all(), "[multicast]\nretx_timeout = \"0\"\n");
    let publisher_metrics = support::free_port();
    publisher.set_extra(vec!["--metrics".into(), format!("127.0.0.1:{publisher_metrics}")]);
    publisher.start();
    let mut lossy = subscriber(root.path(), "lossy", &publisher, 0.2);
    let lossy_metrics = support::free_port();
    lossy.set_extra(vec!["--metrics".into(), format!("127.0.0.1:{lossy_metrics}")]);
    lossy.start();
    wait_subscribed(&lossy);
    replay(&publisher, &trace, 300, 11);
    lossy.wait_for(300, Duration::from_secs(120));
    assert_same_products(&publisher, std::slice::from_ref(&lossy));
    let (received, inserted) = (deliveries(&lossy, "Received"), deliveries(&lossy, "Inserted"));
    assert!(inserted > 0, "products came through the backstop:\n{}", tail(&lossy.log()));
    assert_eq!(received + inserted + deliveries(&lossy, "Backlog"), 300, "{}", tail(&lossy.log()));
    assert!(publisher.log().contains("Missed product sent: index="));
    // Prometheus: the same counts, by mode; the publisher's rejections.
    let text = get_metrics(lossy_metrics);
    let receive = "127.0.0.1 EXP";
    assert_eq!(
        metric(&text, &format!("ldm7_delivered_products_total{{receive=\"{receive}\",mode=\"backstop\"}}")),
        Some(inserted as f64),
        "{text}"
    );
    let fmtp: f64 = ["multicast", "retransmitted"]
        .iter()
        .filter_map(|mode| {
            metric(&text, &format!("ldm7_delivered_products_total{{receive=\"{receive}\",mode=\"{mode}\"}}"))
        })
        .sum();
    assert_eq!(fmtp, received as f64, "{text}");
    let text = get_metrics(publisher_metrics);
    assert!(metric(&text, "ldm7_fmtp_rejections_total{feed=\"EXP\"}").is_some_and(|value| value > 0.0), "{text}");
    assert_eq!(metric(&text, "ldm7_publisher_products_multicast_total"), Some(300.0), "{text}");
    lossy.stop();
    publisher.stop();
    let (sums, _) = statistics(&lossy);
    assert_eq!((sums.n, sums.n_fmtp, sums.backstop), (300, received as u64, inserted as u64));
    assert!(sums.derived().ffdr_count.is_some_and(|ffdr| ffdr < 1.0));
}

#[test]
fn a_killed_subscriber_gets_what_it_missed_through_the_backlog() {
    let Some(trace) = shared_data_or_skip(TRACE) else { return };
    let root = tempfile::tempdir().expect("tempdir");
    let mut publisher = publisher(root.path(), 3, &allow_all(), "");
    publisher.start();
    let mut steady = subscriber(root.path(), "steady", &publisher, 0.0);
    let mut killed = subscriber(root.path(), "killed", &publisher, 0.02);
    for node in [&mut steady, &mut killed] {
        node.start();
        wait_subscribed(node);
    }
    replay(&publisher, &trace, 300, 21);
    killed.wait_for(300, Duration::from_secs(60));
    killed.kill9();
    replay(&publisher, &trace, 500, 21); // the first 300 are there already: 200 new
    steady.wait_for(500, Duration::from_secs(60));
    killed.start();
    killed.wait_for(500, Duration::from_secs(60));
    assert!(deliveries(&killed, "Backlog") >= 200, "{}", tail(&killed.log()));
    replay(&publisher, &trace, 700, 21);
    for node in [&steady, &killed] {
        node.wait_for(700, Duration::from_secs(60));
    }
    assert_same_products(&publisher, &[steady, killed]);
}

/// A publisher stopped while 200 products are inserted, then started again: its subscribers
/// resubscribe and get everything. With `settings` empty (the default `catch_up`) the feed
/// multicasts those 200 once; with catch-up off each subscriber fetches them by the backlog.
fn restart_publisher(test: u8, settings: &str, catching_up: bool) {
    let Some(trace) = shared_data_or_skip(TRACE) else { return };
    let root = tempfile::tempdir().expect("tempdir");
    let mut publisher = publisher(root.path(), test, &allow_all(), settings);
    publisher.start();
    let mut subscribers: Vec<Node> =
        (0..2).map(|k| subscriber(root.path(), &format!("sub{k}"), &publisher, 0.01 * k as f64)).collect();
    for node in &mut subscribers {
        node.start();
        wait_subscribed(node);
    }
    replay(&publisher, &trace, 200, 31);
    for node in &subscribers {
        node.wait_for(200, Duration::from_secs(60));
    }
    publisher.stop();
    replay(&publisher, &trace, 400, 31); // 200 while the publisher is down
    publisher.start();
    for node in &subscribers {
        wait_until(Duration::from_secs(30), "resubscription", || node.log().contains("resubscribed").then_some(()));
        node.wait_for(400, Duration::from_secs(60));
    }
    replay(&publisher, &trace, 600, 31); // after: by multicast, with indexes going on from 200
    for node in &subscribers {
        node.wait_for(600, Duration::from_secs(60));
        let backlog = deliveries(node, "Backlog");
        if catching_up {
            assert_eq!(backlog, 0, "the missed products came once by multicast: {}", tail(&node.log()));
        } else {
            assert!(backlog >= 200, "{}", tail(&node.log()));
        }
    }
    assert!(publisher.log().contains("first product index 200"), "{}", tail(&publisher.log()));
    assert_eq!(
        publisher.log().contains("catching up: multicasting the 200 products inserted since"),
        catching_up,
        "{}",
        tail(&publisher.log())
    );
    assert_same_products(&publisher, &subscribers);
}

/// A publisher stopped in the middle of a burst, its subscriber losing 5% of the datagrams:
/// the products it multicast reach the subscriber by FMTP before it exits (it goes on serving
/// repairs until the subscriber finished them), and those it had handed to FMTP but not begun
/// go out after its restart with the same indexes; nothing comes by the backstop or the backlog.
#[test]
fn a_stopping_publisher_finishes_what_it_multicast_and_withdraws_the_rest() {
    let Some(trace) = shared_data_or_skip(TRACE) else { return };
    let root = tempfile::tempdir().expect("tempdir");
    let mut publisher = publisher(root.path(), 16, &allow_all(), "[multicast]\nrate = \"100 Mbit/s\"\n");
    publisher.start();
    let mut lossy = subscriber(root.path(), "lossy", &publisher, 0.05);
    lossy.start();
    wait_subscribed(&lossy);
    replay(&publisher, &trace, 300, 41);
    publisher.wait_for_log("Multicasted: prodIndex=20,", Duration::from_secs(30));
    publisher.stop();
    let log = publisher.log();
    assert!(log.contains("every FMTP receiver finished the products multicast"), "{}", tail(&log));
    // The products it multicast: those up to the first withdrawn index.
    let withdrawn = log.lines().find_map(|line| {
        let (_, rest) = line.split_once("not begun are not multicast (indexes ")?;
        rest.split_once(' ')?.0.parse::<u64>().ok()
    });
    let multicast = withdrawn.unwrap_or_else(|| log.matches("Multicasted: prodIndex=").count() as u64);
    assert!(multicast < 300, "the stop came before the burst was multicast: {}", tail(&log));
    lossy.wait_for(multicast, Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(lossy.count(), multicast, "nothing beyond what was multicast: {}", tail(&lossy.log()));
    assert_eq!(deliveries(&lossy, "Received") as u64, multicast, "{}", tail(&lossy.log()));
    publisher.start();
    lossy.wait_for(300, Duration::from_secs(60));
    assert_eq!(deliveries(&lossy, "Received"), 300, "every product by FMTP: {}", tail(&lossy.log()));
    assert_eq!(deliveries(&lossy, "Inserted") + deliveries(&lossy, "Backlog"), 0, "{}", tail(&lossy.log()));
    assert_same_products(&publisher, &[lossy]);
}

#[test]
fn a_restarted_publisher_multicasts_what_was_inserted_while_it_was_down_and_nothing_is_lost() {
    restart_publisher(4, "", true);
}

#[test]
fn without_catch_up_a_restarted_publisher_leaves_what_it_missed_to_each_backlog() {
    restart_publisher(15, "[multicast]\ncatch_up = \"0s\"\n", false);
}

#[test]
fn subscriptions_not_allowed_or_not_multicast_are_refused_and_logged() {
    let root = tempfile::tempdir().expect("tempdir");
    // The host may connect (ALLOW for IDS) but is not granted EXP.
    let mut publisher = publisher(root.path(), 5, &format!("ALLOW IDS {LOCAL}"), "");
    publisher.start();
    let mut refused = subscriber(root.path(), "refused", &publisher, 0.0);
    refused.start();
    wait_until(Duration::from_secs(20), "the refusal", || refused.log().contains("LDM7_UNAUTH").then_some(()));
    assert!(publisher.log().contains("refused (LDM7_UNAUTH)"), "{}", tail(&publisher.log()));
    refused.stop();
    // A feed no MULTICAST entry carries.
    let mut other = Node::new(root.path(), "other", "100M", &format!("RECEIVE NGRID 127.0.0.1:{}\n", publisher.port));
    publisher.stop();
    std::fs::write(
        publisher.dir.join("ldmd.conf"),
        format!("{}\nMULTICAST EXP {} 127.0.0.1:0 24 0 dummy dummy\n", allow_all(), group(6)),
    )
    .expect("config");
    publisher.start();
    other.start();
    wait_until(Duration::from_secs(20), "the refusal", || other.log().contains("LDM7_NOENT").then_some(()));
    other.stop();
    publisher.stop();
}

#[test]
fn a_repair_connection_from_an_address_not_handed_out_is_refused() {
    let Some(trace) = shared_data_or_skip(TRACE) else { return };
    let root = tempfile::tempdir().expect("tempdir");
    let mut publisher = publisher(root.path(), 7, &allow_all(), "");
    publisher.start();
    let mut subscriber = subscriber(root.path(), "sub", &publisher, 0.0);
    subscriber.start();
    wait_subscribed(&subscriber);
    let log = publisher.log();
    let server = log
        .lines()
        .find_map(|line| line.split("FMTP server ").nth(1))
        .and_then(|rest| rest.split(|c: char| c == ',' || c.is_whitespace()).next())
        .and_then(|address| address.parse::<SocketAddr>().ok())
        .expect("the FMTP server's address in the log");
    let intruder = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    intruder.bind(&SocketAddr::new(Ipv4Addr::new(127, 0, 0, 200).into(), 0).into()).expect("bind");
    intruder.connect(&server.into()).expect("connect");
    let mut stream: TcpStream = intruder.into();
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let mut byte = [0u8; 1];
    let read = std::io::Read::read(&mut stream, &mut byte);
    assert!(matches!(read, Ok(0) | Err(_)), "the connection is closed, not served: {read:?}");
    wait_until(Duration::from_secs(10), "the refusal in the log", || {
        publisher.log().contains("refused an FMTP repair connection from 127.0.0.200").then_some(())
    });
    // The subscriber is not disturbed.
    replay(&publisher, &trace, 50, 41);
    subscriber.wait_for(50, Duration::from_secs(30));
    subscriber.stop();
    publisher.stop();
}

#[test]
fn a_full_pool_and_a_malformed_record_affect_only_their_own_connection() {
    let Some(trace) = shared_data_or_skip(TRACE) else { return };
    let root = tempfile::tempdir().expect("tempdir");
    let mut publisher = publisher(root.path(), 8, &allow_all(), "[multicast]\nsubscribers_max = 1\n");
    publisher.start();
    let mut first = subscriber(root.path(), "first", &publisher, 0.0);
    first.start();
    wait_subscribed(&first);
    let mut second = subscriber(root.path(), "second", &publisher, 0.0);
    second.start();
    wait_until(Duration::from_secs(20), "the refusal", || second.log().contains("LDM7_MCAST").then_some(()));
    assert!(publisher.log().contains("subscribers already"), "{}", tail(&publisher.log()));
    second.stop();
    // An LDM-7 SUBSCRIBE whose feed-request string claims 4 GB: malformed.
    let mut record = Vec::new();
    for word in [0x1234_u32, 0, 2, 300_029, 7, 1, 0, 0, 0, 0, 0x4000_0000, 0xFFFF_FFF0] {
        record.extend_from_slice(&word.to_be_bytes());
    }
    let mut marked = (0x8000_0000u32 | record.len() as u32).to_be_bytes().to_vec();
    marked.extend_from_slice(&record);
    let mut stream = TcpStream::connect(("127.0.0.1", publisher.port)).expect("connect");
    std::io::Write::write_all(&mut stream, &marked).expect("write");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let mut rest = Vec::new();
    let read = std::io::Read::read_to_end(&mut stream, &mut rest);
    assert!(read.is_ok() || rest.is_empty(), "the malformed connection is closed: {read:?}");
    wait_until(Duration::from_secs(10), "the malformed record in the log", || {
        publisher.log().contains("malformed record").then_some(())
    });
    replay(&publisher, &trace, 40, 51);
    first.wait_for(40, Duration::from_secs(30));
    assert_same_products(&publisher, std::slice::from_ref(&first));
    first.stop();
    publisher.stop();
}

#[test]
fn the_rate_monitor_raises_the_rate_under_a_burst_and_lowers_it_after() {
    let Some(trace) = shared_data_or_skip(TRACE) else { return };
    let root = tempfile::tempdir().expect("tempdir");
    // 5 Mbit/s cannot keep up with a burst of NGRID products: each waits behind the ones
    // before it, far beyond W, at every subscriber.
    let settings = "[multicast.rate_control]\nsteps = [\"5 Mbit/s\", \"20 Mbit/s\", \"50 Mbit/s\"]\n\
                    interval = \"2s\"\nlower_after = 2\n";
    let mut publisher = publisher(root.path(), 9, &allow_all(), settings);
    let metrics_port = support::free_port();
    publisher.set_extra(vec!["--metrics".into(), format!("127.0.0.1:{metrics_port}")]);
    publisher.start();
    let mut subscribers: Vec<Node> =
        (0..2).map(|k| subscriber(root.path(), &format!("sub{k}"), &publisher, 0.0)).collect();
    for node in &mut subscribers {
        node.start();
        wait_subscribed(node);
    }
    assert!(publisher.log().contains("EXP: rate monitor on: steps 5 Mbit/s → 20 Mbit/s → 50 Mbit/s"));
    replay(&publisher, &trace, 200, 61);
    for node in &subscribers {
        node.wait_for(200, Duration::from_secs(120));
    }
    assert_same_products(&publisher, &subscribers);
    // The monitor decides at its ticks: the burst's last products can reach the subscribers
    // before the tick that counts them late, so a raise may come just after the last delivery.
    for raise in ["from 5 Mbit/s to 20 Mbit/s", "from 20 Mbit/s to 50 Mbit/s"] {
        publisher.wait_for_log(&format!("path rate raised {raise}"), Duration::from_secs(10));
    }
    // Calm: no products, no violations; two intervals later a step down, two more the floor.
    wait_until(Duration::from_secs(30), "the rate back at its first step", || {
        publisher.log().contains("path rate lowered from 20 Mbit/s to 5 Mbit/s").then_some(())
    });
    let log = publisher.log();
    for line in log.lines().filter(|line| line.contains("rate monitor")) {
        println!("{line}");
    }
    let raised = log.lines().find(|line| line.contains("path rate raised from 5 Mbit/s")).expect("the raise");
    assert!(raised.contains("subscribers violated ("), "the tally is in the line: {raised}");
    let text = get_metrics(metrics_port);
    let feed = "{feed=\"EXP\"}";
    assert_eq!(metric(&text, &format!("ldm7_path_rate_bits_per_second{feed}")), Some(5e6), "{text}");
    assert!(metric(&text, &format!("ldm7_rate_monitor_raises_total{feed}")).is_some_and(|n| n >= 2.0), "{text}");
    assert!(metric(&text, &format!("ldm7_rate_monitor_lowers_total{feed}")).is_some_and(|n| n >= 2.0), "{text}");
    assert!(metric(&text, &format!("ldm7_rate_monitor_violations_total{feed}")).is_some_and(|n| n > 0.0), "{text}");
    assert_eq!(metric(&text, &format!("ldm7_rate_monitor_rate_change_failures_total{feed}")), Some(0.0), "{text}");
    for node in &mut subscribers {
        node.stop();
    }
    publisher.stop();
}

#[test]
fn a_signed_feed_with_a_rotating_key_reaches_a_pinned_subscriber_and_one_pinning_another_key_refuses_it() {
    let Some(trace) = shared_data_or_skip(TRACE) else { return };
    let root = tempfile::tempdir().expect("tempdir");
    let (identity, other) = (root.path().join("publisher.key"), root.path().join("other.key"));
    for key in [&identity, &other] {
        run(&["fmtp", "keygen", "--out", &key.display().to_string()]);
    }
    // The key also rotates every second while products flow (the extension).
    let settings = format!(
        "[multicast]\nrate = \"200 Mbit/s\"\nmac_level = 2\nidentity = {:?}\nmac_rotation = \"1s\"\n",
        identity.display()
    );
    let mut publisher = publisher(root.path(), 12, &allow_all(), &settings);
    publisher.start();
    let pinned = |name: &str, key: &std::path::Path| {
        let node = subscriber(root.path(), name, &publisher, 0.02);
        let settings = std::fs::read_to_string(node.dir.join("ldm7.toml")).expect("settings");
        let settings = format!("{settings}mac_level = 2\npin = \"{}.pub\"\n", key.display());
        std::fs::write(node.dir.join("ldm7.toml"), settings).expect("settings");
        node
    };
    let mut good = pinned("good", &identity);
    good.start();
    wait_subscribed(&good);
    let mut fooled = pinned("fooled", &other);
    fooled.start();
    wait_until(Duration::from_secs(20), "the subscriber pinning another key to refuse the exchange", || {
        fooled.log().contains("not signed by the pinned publisher key").then_some(())
    });
    // Half of the products, a key switch (due a second after the feed started; up to the
    // switch deadline while an exchange holds it back), the other half: the subscriber gets
    // products signed with both keys. (Replayed at once, 200 products can be through before the
    // first switch.)
    replay(&publisher, &trace, 100, 3);
    good.wait_for(100, Duration::from_secs(120));
    wait_until(Duration::from_secs(40), "the publisher to switch to a new MAC key", || {
        publisher.log().contains("signing with a new MAC key").then_some(())
    });
    replay(&publisher, &trace, 100, 4);
    good.wait_for(200, Duration::from_secs(120));
    assert_same_products(&publisher, std::slice::from_ref(&good));
    assert!(publisher.log().contains("signing with a new MAC key"), "{}", tail(&publisher.log()));
    assert!(!good.log().contains("refused the sender's new MAC key"), "{}", tail(&good.log()));
    // The other takes nothing from a publisher it cannot authenticate: it refuses each exchange,
    // says why, and tries again with back-off.
    assert_eq!(fooled.verify().0.len(), 0, "{}", tail(&fooled.log()));
    wait_until(Duration::from_secs(20), "the refusing subscriber to try again", || {
        (fooled.log().matches("not signed by the pinned publisher key").count() >= 2).then_some(())
    });
    assert_eq!(fooled.verify().0.len(), 0, "still nothing");
}
