//! LDM-7 across real network namespaces (root; skipped otherwise): a publisher and subscribers
//! as `ldm7 serve` processes in the hosts of an `ldm7 lab`, the feed's path a Linux bridge the
//! publisher adds and removes legs on, HTB at 100 Mbit/s with a BFIFO, receive-side loss.
//!
//! One lab run holds every scenario (the file must stay within a few minutes):
//!
//! 1. Ten minutes of the NGRID trace (8,699 products, 1.12 GB) replayed at 5× to four
//!    subscribers (s1 5% loss, s2 1%): every product at every subscriber, intact (MD5), once.
//!    During it s3 is killed (SIGKILL) for 60 s and restarted: its gap comes through the
//!    backlog. Then the publisher is restarted: the subscribers resubscribe by themselves and
//!    nothing is lost.
//! 2. Before the replay, host `x` — allowed to connect (IDS) but not granted NGRID — subscribes
//!    and is refused (`LDM7_UNAUTH` in both logs), and then opens an FMTP repair connection from
//!    10.77.1.200, an address the publisher never handed out: refused and logged.
//! 3. After it, s5 (20% loss) joins and another minute of the trace is replayed: s1–s4 get all
//!    of it by FMTP, s5 all of it by FMTP and the backstop.
//!
//! A second, short lab holds the online rate monitor: under a burst the publisher raises its
//! path rate, which changes the HTB tree on its feed interface (`tc class change`) and the
//! bridge path's rate, and lowers both again once the burst is over.
//!
//! No assertion is about time: the deadlines only bound waits for conditions (issue #10).

use std::collections::HashSet;
use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use ldm7_pq::Capacity;
use ldm7_testbed::{
    Comparison, DeliveryMode, Lab, LogCounts, ProductRecord, Replay, ReplayOptions, Server, ServerConfig, wait_for,
};
use ldm7_types::Signature;

const LDM7: &str = env!("CARGO_BIN_EXE_ldm7");
const TRACE: &str = "traces/unidata_ldm_NGRID_1hr_20150615T00Z.txt";
/// Products in the first ten minutes of the trace.
const TEN_MINUTES: u64 = 8699;
const FEED: &str = "ngrid";
const SUBSCRIBERS: [&str; 4] = ["s1", "s2", "s3", "s4"];

/// Deadlines of waits (wide: the machine has two shared cores).
const SUBSCRIBE_WAIT: Duration = Duration::from_secs(60);
const DELIVERY_WAIT: Duration = Duration::from_secs(300);

/// What the lab runs (skipped with a message where one is missing).
const LAB_TOOLS: &[&str] = &["ip", "tc", "iptables", "vde_switch", "wirefilter"];

fn spec(name: &str) -> String {
    format!(
        r#"name = "{name}"
[[hosts]]
name = "pub"
[[hosts]]
name = "s1"
loss_percent = 5.0
[[hosts]]
name = "s2"
loss_percent = 1.0
[[hosts]]
name = "s3"
[[hosts]]
name = "s4"
[[hosts]]
name = "s5"
loss_percent = 20.0
[[hosts]]
name = "x"

[[feeds]]
name = "{FEED}"
publisher = "pub"
subscribers = ["s1", "s2", "s3", "s4", "s5", "x"]
rate = "100 Mbit/s"
buffer = "600 MB"
multicast_port = 38800
retx_port = 38801
subscriber_addresses = false
"#
    )
}

/// Publisher: NGRID to pub…s5 (10.76.0.1–6); `x` (10.76.0.7) may connect, for IDS only.
const PUBLISHER_CONF: &str = "ALLOW NGRID ^10\\.76\\.0\\.[1-6]$\nALLOW IDS ^10\\.76\\.0\\.7$\n\
    MULTICAST NGRID 239.77.1.1:38800 10.77.1.1:38801 24 0 dummy dummy\n";

fn publisher_settings(lab: &str) -> String {
    format!(
        "[multicast]\nrate = \"100 Mbit/s\"\n[multicast.feeds.NGRID]\npath = \"{FEED}\"\n\
         [path]\ndriver = \"linux-bridge\"\nnetns = \"{lab}-core\"\n"
    )
}

const SUBSCRIBER_SETTINGS: &str = "[receive]\nrate = \"100 Mbit/s\"\nretry_min = \"200ms\"\nretry_max = \"2s\"\n";

/// Queues that hold the whole run (eleven minutes of the trace: 1.19 GB), written out in full
/// as every queue is; s5 gets only the last minute (66 MB) and x nothing, so theirs are small.
fn capacity(host: &str) -> Capacity {
    match host {
        "s5" => Capacity { bytes: 300_000_000, slots: 5_000 },
        "x" => Capacity { bytes: 20_000_000, slots: 100 },
        _ => Capacity { bytes: 1_400_000_000, slots: 20_000 },
    }
}

fn subscriber(lab: &Lab, root: &Path, host: &str, settings: &str) -> Server {
    let port = lab.spec().bridge_port(FEED, host).expect("bridge port");
    let conf = format!("RECEIVE NGRID 10.76.0.1:388 {FEED} {host} {port}\n");
    let config =
        ServerConfig::new(host, Some(lab.netns(host).expect("netns")), capacity(host), &conf).settings(settings);
    Server::create(Path::new(LDM7), root, config).expect("subscriber")
}

/// Waits until `needle` appears `count` times in `server`'s log.
fn wait_lines(server: &Server, needle: &str, count: usize, within: Duration) {
    let what = format!("{count} × {needle:?} in the log of {}", server.name());
    let found = wait_for(within, &what, || Ok((server.log().matches(needle).count() >= count).then_some(())));
    if let Err(error) = found {
        panic!("{error}\n{}", ldm7_testbed::tail(&server.log(), 30));
    }
}

fn replay(queue: &Path, span: Duration, seed: u64) -> Replay {
    let options =
        ReplayOptions { span: Some(span), seed, ..ReplayOptions::new(&ldm7_testkit::shared_data(TRACE), 5.0) };
    Replay::start(Path::new(LDM7), queue, &options).expect("replay")
}

fn modes(records: &[ProductRecord]) -> String {
    DeliveryMode::ALL
        .iter()
        .map(|mode| format!("{mode} {}", records.iter().filter(|r| r.mode == Some(*mode)).count()))
        .collect::<Vec<_>>()
        .join(", ")
}

#[test]
fn ldm7_in_the_lab_delivers_every_product_through_loss_outages_and_restarts() {
    if !ldm7_testkit::skip_unless_root_and_tools(
        "ldm7_in_the_lab_delivers_every_product_through_loss_outages_and_restarts",
        LAB_TOOLS,
    ) {
        return;
    }
    let _lab = ldm7_testkit::lab_lock();
    if ldm7_testkit::shared_data_or_skip(TRACE).is_none() {
        return;
    }
    let root = tempfile::tempdir().expect("tempdir");
    let name = format!("l7t{}", std::process::id() % 10_000);
    let lab = Lab::up(&spec(&name)).expect("lab up");

    let publisher_config =
        ServerConfig::new("pub", Some(lab.netns("pub").expect("netns")), capacity("pub"), PUBLISHER_CONF)
            .settings(&publisher_settings(&name));
    let mut publisher = Server::create(Path::new(LDM7), root.path(), publisher_config).expect("publisher");
    publisher.start().expect("start the publisher");
    let mut subscribers: Vec<Server> =
        SUBSCRIBERS.iter().map(|host| subscriber(&lab, root.path(), host, SUBSCRIBER_SETTINGS)).collect();
    for server in &mut subscribers {
        server.start().expect("start a subscriber");
    }
    for server in &subscribers {
        wait_lines(server, "FMTP repair connection to", 1, SUBSCRIBE_WAIT);
    }

    // An unauthorized subscriber, then a repair connection from an address not handed out.
    let mut intruder = subscriber(&lab, root.path(), "x", SUBSCRIBER_SETTINGS);
    intruder.start().expect("start x");
    wait_lines(&intruder, "LDM7_UNAUTH", 1, SUBSCRIBE_WAIT);
    wait_lines(&publisher, "refused (LDM7_UNAUTH)", 1, SUBSCRIBE_WAIT);
    intruder.stop().expect("x stops cleanly");
    let x_netns = lab.netns("x").expect("netns");
    let rogue = "10.77.1.200/24".parse().expect("cidr");
    ldm7_net::hostcfg::ensure_address(Some(&x_netns), FEED, rogue).expect("address on x");
    let read = ldm7_net::netns::in_netns(&x_netns, || {
        let server: SocketAddr = "10.77.1.1:38801".parse().expect("address");
        let mut stream = TcpStream::connect_timeout(&server, Duration::from_secs(10))?;
        stream.set_read_timeout(Some(Duration::from_secs(20)))?;
        stream.read(&mut [0u8; 1])
    })
    .expect("in x");
    assert!(matches!(read, Ok(0) | Err(_)), "the repair connection is closed, not served: {read:?}");
    wait_lines(&publisher, "refused an FMTP repair connection from 10.77.1.200", 1, SUBSCRIBE_WAIT);

    // Ten minutes of the trace at 5×; s3 killed for 60 s, then the publisher restarted.
    let first = replay(&publisher.queue_path(), Duration::from_secs(600), 1);
    subscribers[2].wait_for_products(1000, DELIVERY_WAIT).expect("s3 receives");
    subscribers[2].kill();
    std::thread::sleep(Duration::from_secs(60)); // the outage itself, not a synchronization
    subscribers[2].start().expect("restart s3");
    wait_lines(&subscribers[2], "All backlog data-products received", 2, DELIVERY_WAIT);
    publisher.restart().expect("restart the publisher");
    for server in &subscribers {
        wait_lines(server, "resubscribed", 1, SUBSCRIBE_WAIT);
    }
    let summary = first.wait().expect("replay");
    assert_eq!(summary.products, TEN_MINUTES);
    for server in &mut subscribers {
        server.wait_for_products(TEN_MINUTES, DELIVERY_WAIT).expect("every product");
    }
    let published = publisher.records().expect("publisher's queue");
    assert_eq!(published.len() as u64, TEN_MINUTES);
    for server in &subscribers {
        let records = server.records().expect("subscriber's queue");
        let comparison = Comparison::of(&published, &records);
        assert!(comparison.is_exact(), "{}: {comparison}", server.name());
        // Each product's line is written just after it goes in: the last one's may still come.
        let _ = ldm7_testbed::wait_for(DELIVERY_WAIT, "the delivery lines", || {
            Ok((LogCounts::of(&server.log()).delivered() >= records.len()).then_some(()))
        });
        let counts = LogCounts::of(&server.log());
        println!("{}: {} products; {}; log: {counts}", server.name(), records.len(), modes(&records));
        assert_eq!(counts.delivered(), records.len(), "{}: one delivery line per product", server.name());
        assert!(records.iter().all(|r| r.mode.is_some()), "{}: a product without its line", server.name());
    }
    let s3 = LogCounts::of(&subscribers[2].log());
    assert!(s3.backlog > 0, "s3's gap came through the backlog: {s3}");
    assert!(LogCounts::of(&subscribers[0].log()).repaired > 0, "s1 (5% loss) needed repairs");

    // s5 at 20% loss joins; one more minute of the trace.
    let lossy_settings = format!("{SUBSCRIBER_SETTINGS}time_offset = \"1s\"\n");
    let mut lossy = subscriber(&lab, root.path(), "s5", &lossy_settings);
    lossy.start().expect("start s5");
    wait_lines(&lossy, "FMTP repair connection to", 1, SUBSCRIBE_WAIT);
    let second = replay(&publisher.queue_path(), Duration::from_secs(60), 2).wait().expect("replay");
    let total = TEN_MINUTES + second.products;
    for server in &mut subscribers {
        server.wait_for_products(total, DELIVERY_WAIT).expect("every product");
    }
    lossy.wait_for_products(second.products, DELIVERY_WAIT).expect("every product at s5");
    let published = publisher.records().expect("publisher's queue");
    let later = &published[TEN_MINUTES as usize..];
    let later_signatures: HashSet<Signature> = later.iter().map(|r| r.signature).collect();
    for server in &subscribers {
        let records = server.records().expect("subscriber's queue");
        let comparison = Comparison::of(&published, &records);
        assert!(comparison.is_exact(), "{}: {comparison}", server.name());
        let later_records: Vec<ProductRecord> =
            records.iter().filter(|r| later_signatures.contains(&r.signature)).cloned().collect();
        assert_eq!(later_records.len(), later.len());
        assert!(
            later_records.iter().all(|r| r.mode == Some(DeliveryMode::Received)),
            "{}: everything by FMTP while s5 loses 20%: {}",
            server.name(),
            modes(&later_records)
        );
    }
    let lossy_records = lossy.records().expect("s5's queue");
    let comparison = Comparison::of(later, &lossy_records);
    assert!(comparison.is_exact(), "s5: {comparison}");
    println!(
        "s5 (20% loss): {} products; {}; log: {}",
        lossy_records.len(),
        modes(&lossy_records),
        LogCounts::of(&lossy.log())
    );
    assert!(
        lossy_records.iter().all(|r| matches!(r.mode, Some(DeliveryMode::Received | DeliveryMode::Inserted))),
        "s5: by FMTP and the backstop only: {}; its backlog requests:\n{}",
        modes(&lossy_records),
        lossy
            .log()
            .lines()
            .filter(|line| line.contains("backlog") || line.contains("feed quiet"))
            .collect::<Vec<_>>()
            .join("\n")
    );

    for server in subscribers.iter_mut().chain([&mut lossy, &mut publisher]) {
        server.stop().expect("a clean exit on SIGTERM");
    }
    lab.down().expect("lab down");
}

/// The lab of the rate-monitor test: the publisher's HTB starts at the ceiling.
fn rate_spec(name: &str) -> String {
    format!(
        r#"name = "{name}"
[[hosts]]
name = "pub"
[[hosts]]
name = "s1"
[[hosts]]
name = "s2"

[[feeds]]
name = "{FEED}"
publisher = "pub"
subscribers = ["s1", "s2"]
rate = "40 Mbit/s"
buffer = "100 MB"
multicast_port = 38800
retx_port = 38801
subscriber_addresses = false
"#
    )
}

/// The path-class rate of the HTB tree on the publisher's feed interface.
fn htb_rate(lab: &Lab) -> ldm7_types::units::Rate {
    let text = lab.exec("pub", "tc", &["class", "show", "dev", FEED]).expect("tc class show");
    ldm7_net::tc::installed_rates(&text).expect("the HTB tree").0
}

/// The bridge path's rate as the linux-bridge path service lists it.
fn bridge_rate(lab: &Lab) -> ldm7_types::units::Rate {
    let mut paths = ldm7_net::path::bridge::BridgePaths::new(Some(&lab.spec().core_netns()));
    let listed = ldm7_net::path::PathService::list(&mut paths).expect("list the paths");
    listed.iter().find(|path| path.name == FEED).expect("the feed's path").rate
}

#[test]
fn the_rate_monitor_steps_the_htb_tree_and_the_bridge_path_in_the_lab() {
    if !ldm7_testkit::skip_unless_root("the_rate_monitor_steps_the_htb_tree_and_the_bridge_path_in_the_lab") {
        return;
    }
    let _lab = ldm7_testkit::lab_lock();
    if ldm7_testkit::shared_data_or_skip(TRACE).is_none() {
        return;
    }
    let root = tempfile::tempdir().expect("tempdir");
    let name = format!("l7r{}", std::process::id() % 10_000);
    let lab = Lab::up(&rate_spec(&name)).expect("lab up");
    let mbit = ldm7_types::units::Rate::from_megabits_per_s;
    assert_eq!(htb_rate(&lab), mbit(40));

    let conf = "ALLOW NGRID ^10\\.76\\.0\\.[1-3]$\n\
                MULTICAST NGRID 239.77.1.1:38800 10.77.1.1:38801 24 0 dummy dummy\n";
    let settings = format!(
        "{}[multicast.feeds.NGRID.rate_control]\nsteps = [\"10 Mbit/s\", \"40 Mbit/s\"]\ninterval = \"2s\"\n\
         lower_after = 2\n",
        publisher_settings(&name)
    );
    let config =
        ServerConfig::new("pub", Some(lab.netns("pub").expect("netns")), capacity("s5"), conf).settings(&settings);
    let mut publisher = Server::create(Path::new(LDM7), root.path(), config).expect("publisher");
    publisher.start().expect("start the publisher");
    let mut subscribers: Vec<Server> = ["s1", "s2"]
        .iter()
        .map(|host| {
            let port = lab.spec().bridge_port(FEED, host).expect("bridge port");
            let conf = format!("RECEIVE NGRID 10.76.0.1:388 {FEED} {host} {port}\n");
            let netns = Some(lab.netns(host).expect("netns"));
            let config = ServerConfig::new(host, netns, capacity("s5"), &conf).settings(SUBSCRIBER_SETTINGS);
            Server::create(Path::new(LDM7), root.path(), config).expect("subscriber")
        })
        .collect();
    for server in &mut subscribers {
        server.start().expect("start a subscriber");
    }
    for server in &subscribers {
        wait_lines(server, "FMTP repair connection to", 1, SUBSCRIBE_WAIT);
    }
    wait_lines(&publisher, &format!("the path {FEED} and the HTB tree on {FEED} follows"), 1, SUBSCRIBE_WAIT);
    // The monitor starts both at the first step.
    wait_for(SUBSCRIBE_WAIT, "the HTB tree at the first step", || Ok((htb_rate(&lab) == mbit(10)).then_some(())))
        .expect("HTB at 10 Mbit/s");
    assert_eq!(bridge_rate(&lab), mbit(10));

    // Twenty seconds of the trace at 5× (about 40 MB in 4 s): far more than 10 Mbit/s carries.
    let burst = replay(&publisher.queue_path(), Duration::from_secs(20), 3).wait().expect("replay");
    wait_lines(&publisher, "path rate raised from 10 Mbit/s to 40 Mbit/s", 1, DELIVERY_WAIT);
    assert_eq!(htb_rate(&lab), mbit(40));
    assert_eq!(bridge_rate(&lab), mbit(40));
    for server in &mut subscribers {
        server.wait_for_products(burst.products, DELIVERY_WAIT).expect("every product");
    }
    let published = publisher.records().expect("publisher's queue");
    for server in &subscribers {
        let comparison = Comparison::of(&published, &server.records().expect("subscriber's queue"));
        assert!(comparison.is_exact(), "{}: {comparison}", server.name());
    }
    wait_lines(&publisher, "path rate lowered from 40 Mbit/s to 10 Mbit/s", 1, DELIVERY_WAIT);
    assert_eq!(htb_rate(&lab), mbit(10));
    assert_eq!(bridge_rate(&lab), mbit(10));
    for line in publisher.log().lines().filter(|line| line.contains("rate monitor")) {
        println!("{line}");
    }

    for server in subscribers.iter_mut().chain([&mut publisher]) {
        server.stop().expect("a clean exit on SIGTERM");
    }
    lab.down().expect("lab down");
}
