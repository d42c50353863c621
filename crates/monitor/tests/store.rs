//! The store on a real SQLite file and on a real PostgreSQL server (started for the test;
//! skipped with a message where PostgreSQL is not installed): the same queries, the same
//! answers.

use std::sync::atomic::Ordering::Relaxed;

use ldm7_metrics::{Link, Minute, MinuteRow, MinuteSums, StatsProduct};
use ldm7_monitor::{IngestCounters, Ingested, Store, ingest};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

fn sums(n: u64, n_mc: u64, s: u64, latency_us: i64, retx_blocks: u64) -> MinuteSums {
    MinuteSums {
        n,
        n_fmtp: n,
        n_mc,
        s_all: s,
        s_fmtp: s,
        s_mc: s / 2,
        l_all_us: latency_us,
        l_fmtp_us: latency_us,
        l_mc_us: latency_us / 2,
        retx_blocks,
        backstop: 0,
        backlog: 0,
        latency_max_us: latency_us / n.max(1) as i64,
        host_drops: retx_blocks / 2,
    }
}

async fn exercise(store: &Store) {
    let link = Link { feed: "NGRID".into(), publisher: "pub.example:38800".into(), subscriber: "sub1".into() };
    let minute = Minute::parse("202611232137").expect("minute");
    let product = StatsProduct {
        reporter: "sub1".into(),
        minute,
        rows: vec![MinuteRow { link: link.clone(), minute, sums: sums(10, 8, 10_000, 50_000, 3) }],
    };
    let counters = IngestCounters::default();
    let reported = minute.start_secs() + 62;
    let stored = ingest(store, &counters, "sig1", &product.ident(), product.body().as_bytes(), reported).await;
    assert_eq!(stored.expect("ingest"), Ingested::Stats);
    // The same minute reported again later (a late delivery): added, not replaced.
    let late = StatsProduct {
        rows: vec![MinuteRow { link: link.clone(), minute, sums: sums(2, 2, 500, 40_000, 0) }],
        ..product.clone()
    };
    ingest(store, &counters, "sig2", &late.ident(), late.body().as_bytes(), reported + 60).await.expect("ingest");
    let next = Minute(minute.0 + 1);
    let other = StatsProduct {
        reporter: "sub1".into(),
        minute: next,
        rows: vec![MinuteRow { link: link.clone(), minute: next, sums: sums(4, 4, 4_000, 8_000, 0) }],
    };
    ingest(store, &counters, "sig3", &other.ident(), other.body().as_bytes(), reported + 61).await.expect("ingest");
    // Malformed products and rtstats lines are counted and skipped; other products ignored.
    let refused = ingest(store, &counters, "sig4", &product.ident(), b"garbage", 0).await.expect("ingest");
    assert_eq!(refused, Ingested::Refused);
    let refused = ingest(store, &counters, "sig5", "rtstats-6.15.0/h/NGRID/o", b"bad line", 0).await.expect("ingest");
    assert_eq!(refused, Ingested::Refused);
    let rtstats =
        "20261123213001 20261123213002 ldm6.example.edu NGRID ncep.example.gov 1234 98765432 1.5 0.87 3@3001 6.15.0\n";
    let ident = "rtstats-6.15.0/ldm6.example.edu/NGRID/ncep.example.gov";
    let stored = ingest(store, &counters, "sig6", ident, rtstats.as_bytes(), reported).await.expect("ingest");
    assert_eq!(stored, Ingested::RtStats);
    assert_eq!(ingest(store, &counters, "sig7", "SAUS43 KWBC", b"x", 0).await.expect("ingest"), Ingested::Ignored);
    let counts = (
        counters.stats.load(Relaxed),
        counters.stats_bad.load(Relaxed),
        counters.rtstats.load(Relaxed),
        counters.rtstats_bad.load(Relaxed),
    );
    assert_eq!(counts, (3, 1, 1, 1));
    // The same product again (same signature): not counted twice.
    let again = ingest(store, &counters, "sig1", &product.ident(), product.body().as_bytes(), reported).await;
    assert_eq!(again.expect("ingest"), Ingested::Repeated);

    let minutes = store.minutes(&link, minute, Minute(minute.0 + 10)).await.expect("minutes");
    assert_eq!(minutes.len(), 2);
    let first = minutes[0].1;
    assert_eq!((first.n, first.n_mc, first.s_all, first.retx_blocks, first.l_all_us), (12, 10, 10_500, 3, 90_000));
    assert_eq!(first.latency_max_us, 20_000, "the larger of 5,000 and 20,000");
    // A window: the sums of its minutes.
    let window = MinuteSums::total(minutes.iter().map(|(_, sums)| sums));
    assert_eq!(window.n, 16);
    assert!((window.derived().mplr.expect("mplr") - 3.0 * 1448.0 / 14_500.0).abs() < 1e-12);

    store.set_location("sub1", 40.0, -105.25).await.expect("location");
    let nodes = store.nodes().await.expect("nodes");
    let names: Vec<&str> = nodes.iter().map(|node| node.name.as_str()).collect();
    assert_eq!(names, ["ldm6.example.edu", "ncep.example.gov", "pub.example:38800", "sub1"]);
    let sub1 = &nodes[3];
    assert_eq!((sub1.latitude, sub1.longitude, sub1.last_report), (Some(40.0), Some(-105.25), Some(reported + 61)));
    assert_eq!(sub1.kind.as_deref(), Some("ldm7"));
    assert_eq!(nodes[0].kind.as_deref(), Some("ldm6"));
    assert_eq!(nodes[2].last_report, None, "a publisher that never reported");

    let links = store.links(None).await.expect("links");
    assert_eq!(links.len(), 2);
    assert_eq!((links[0].subscriber.as_str(), links[0].last_minute, links[0].kind.as_str()), ("sub1", next.0, "ldm7"));
    // The LDM 6 host's rtstats: a link from the products' origin to it, hourly.
    assert_eq!(
        (links[1].publisher.as_str(), links[1].subscriber.as_str(), links[1].kind.as_str()),
        ("ncep.example.gov", "ldm6.example.edu", "ldm6")
    );
    let ldm6 =
        Link { feed: "NGRID".into(), publisher: "ncep.example.gov".into(), subscriber: "ldm6.example.edu".into() };
    let hour = links[1].last_minute / 60;
    let hours = store.rtstats_hours(&ldm6, hour, hour + 1).await.expect("hours");
    assert_eq!((hours.len(), hours[0].products, hours[0].bytes), (1, 1234, 98_765_432));
    assert!(store.links(Some("CONDUIT")).await.expect("links").is_empty());

    // A relayed LDM 6 host: its products' origins name the relay (`origin_v_upstream`), so
    // its link starts at the relay, whatever the origins, and the hour sums them.
    for (k, origin) in ["ncep_v_relay.example.edu", "gsd_v_relay.example.edu"].into_iter().enumerate() {
        let line = format!(
            "20261123213001 20261123213002 leaf.example.edu NGRID {origin} {} 1000 1.5 {} 4@3001 6.15.0\n",
            10 * (k + 1),
            k + 1
        );
        let ident = format!("rtstats-6.15.0/leaf.example.edu/NGRID/{origin}");
        let stored = ingest(store, &counters, &format!("sig-v{k}"), &ident, line.as_bytes(), reported).await;
        assert_eq!(stored.expect("ingest"), Ingested::RtStats);
    }
    let links = store.links(Some("NGRID")).await.expect("links");
    let relayed: Vec<(&str, &str)> = links
        .iter()
        .filter(|link| link.subscriber == "leaf.example.edu")
        .map(|link| (link.publisher.as_str(), link.kind.as_str()))
        .collect();
    assert_eq!(relayed, [("relay.example.edu", "ldm6")]);
    let names: Vec<String> = store.nodes().await.expect("nodes").into_iter().map(|node| node.name).collect();
    assert!(names.iter().any(|name| name == "relay.example.edu"), "{names:?}");
    assert!(!names.iter().any(|name| name.contains("_v_")), "{names:?}");
    let relayed =
        Link { feed: "NGRID".into(), publisher: "relay.example.edu".into(), subscriber: "leaf.example.edu".into() };
    let hours = store.rtstats_hours(&relayed, hour, hour + 1).await.expect("hours");
    assert_eq!((hours.len(), hours[0].products, hours[0].bytes), (1, 30, 2000));
    assert!((hours[0].latency_mean_s - (10.0 + 2.0 * 20.0) / 30.0).abs() < 1e-9, "weighted by products");
    assert!((hours[0].latency_max_s - 4.0).abs() < 1e-9);
}

#[test]
fn the_store_on_a_sqlite_file() {
    let dir = tempfile::tempdir().expect("dir");
    let url = format!("sqlite:{}", dir.path().join("monitor.db").display());
    runtime().block_on(async {
        let store = Store::open(&url).await.expect("open");
        exercise(&store).await;
        store.close().await;
        // Reopened: the migrations are not applied twice, the rows are there.
        let store = Store::open(&url).await.expect("reopen");
        assert_eq!(store.links(None).await.expect("links").len(), 3, "an LDM-7 link and two LDM 6 ones");
    });
}

#[test]
fn the_store_on_a_postgresql_server() {
    let Some(server) = ldm7_testkit::postgres::Postgres::start_or_skip() else { return };
    runtime().block_on(async {
        let store = Store::open(&server.url()).await.expect("open");
        exercise(&store).await;
        store.close().await;
    });
}

#[test]
fn a_bad_url_says_what_is_expected() {
    let error = runtime().block_on(Store::open("mysql://x")).unwrap_err().to_string();
    assert!(error.contains("sqlite:PATH or postgres://"), "{error}");
}
