//! LDM-6 over IPv6 across real network namespaces (root; skipped otherwise):
//!
//! 1. An IPv6-only lab (no host has an IPv4 address): a relay chain of three `ldm7 serve`
//!    processes. Each hop names its peer another way: the top allows a prefix, the relay
//!    allows the leaf by name (a reverse lookup of its IPv6 address, the reference's rule for
//!    names) and requests the top by IPv6 address, the leaf requests the relay by a name that
//!    resolves to an IPv6 address only.
//! 2. Mixed operation: an IPv4-only Unidata LDM 6.15 upstream (`LDM_REF_BIN`; skipped without)
//!    feeds a dual-stack ldm7 relay over IPv4, which feeds two IPv6-only ldm7 leaves and, at
//!    the same time, an IPv4-only ldm7 leaf and an IPv4-only Unidata LDM 6.15 leaf.
//! 3. LDM-7 in an IPv6-only lab (below).
//!
//! Every product arrives, MD5-identical, at every node.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use ldm7_pq::Capacity;
use ldm7_testbed::reference::{Host, RefConfig, RefServer, Reference, Registry};
use ldm7_testbed::{Lab, Server, ServerConfig};
use ldm7_types::Signature;
use md5::{Digest, Md5};

const LDM7: &str = env!("CARGO_BIN_EXE_ldm7");
const WAIT: Duration = Duration::from_secs(180);
const LAB_TOOLS: &[&str] = &["ip", "ip6tables"];

fn can_run(test: &str) -> bool {
    ldm7_testkit::skip_unless_root_and_tools(test, LAB_TOOLS)
}

/// `count` product files of 1 kB to 100 kB of seeded bytes in `dir`; their names and MD5s.
fn products(dir: &Path, count: usize, seed: u64) -> (Vec<String>, HashSet<Signature>) {
    std::fs::create_dir_all(dir).expect("products dir");
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut next = || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        state >> 33
    };
    let mut names = Vec::new();
    let mut signatures = HashSet::new();
    for k in 0..count {
        let size = 1_000 + (next() % 99_000) as usize;
        let bytes: Vec<u8> = (0..size).map(|_| next() as u8).collect();
        let name = format!("v6-{seed}-{k:04}");
        std::fs::write(dir.join(&name), &bytes).expect("product file");
        signatures.insert(Signature(Md5::digest(&bytes).into()));
        names.push(name);
    }
    (names, signatures)
}

fn insert(queue: &Path, dir: &Path, names: &[String]) {
    let output = std::process::Command::new(LDM7)
        .args(["insert", "-f", "EXP", "-q"])
        .arg(queue)
        .args(names)
        .current_dir(dir)
        .output()
        .expect("ldm7 insert");
    assert!(output.status.success(), "insert: {}", String::from_utf8_lossy(&output.stderr));
}

fn node(lab: &Lab, root: &Path, host: &str, conf: &str) -> Server {
    let capacity = Capacity { bytes: 200_000_000, slots: 5_000 };
    let config = ServerConfig::new(host, Some(lab.netns(host).expect("netns")), capacity, conf);
    Server::create(Path::new(LDM7), root, config).expect("server")
}

/// The data products (not statistics) `server` holds, each intact.
fn held(server: &Server) -> HashSet<Signature> {
    let records = server.records().expect("records");
    let data: Vec<_> = records.iter().filter(|r| !r.info.contains("ldm7-stats/")).collect();
    assert!(data.iter().all(|r| r.intact), "{}: a product's data does not match its MD5", server.name());
    data.iter().map(|r| r.signature).collect()
}

fn wait_for_all(server: &mut Server, expected: &HashSet<Signature>) {
    let name = server.name().to_owned();
    ldm7_testbed::wait_for(WAIT, &format!("{name} holds every product"), || {
        Ok(expected.is_subset(&held(server)).then_some(()))
    })
    .unwrap_or_else(|error| panic!("{error}\n{}", ldm7_testbed::tail(&server.log(), 30)));
}

fn ipv4_addresses(lab: &Lab, host: &str) -> String {
    lab.exec(host, "ip", &["-4", "-o", "addr", "show", "scope", "global"]).expect("ip addr")
}

#[test]
fn an_ldm6_relay_chain_in_an_ipv6_only_lab() {
    if !can_run("an_ldm6_relay_chain_in_an_ipv6_only_lab") {
        return;
    }
    let _lock = ldm7_testkit::lab_lock();
    let name = format!("v6c{}", std::process::id() % 10_000);
    let spec = format!(
        "name = \"{name}\"\nfamily = \"ipv6\"\n[[hosts]]\nname = \"top\"\n[[hosts]]\nname = \"relay\"\n\
         [[hosts]]\nname = \"leaf\"\n"
    );
    let lab = Lab::up(&spec).expect("lab up");
    for host in ["top", "relay", "leaf"] {
        assert_eq!(ipv4_addresses(&lab, host).trim(), "", "{host} has an IPv4 address");
    }
    let top_address = lab.control_ip("top").expect("top");
    assert!(top_address.is_ipv6());
    let root = tempfile::tempdir().expect("tempdir");
    let (names, expected) = products(&root.path().join("files"), 200, 6);
    let mut top = node(&lab, root.path(), "top", "ALLOW ANY fd00:4c37:76::/64\n");
    insert(&top.queue_path(), &root.path().join("files"), &names[..100]);
    top.start().expect("top");
    let relay_conf = format!("ALLOW ANY ^leaf\\.{name}\\.test$\nREQUEST EXP \".*\" [{top_address}]:388\n");
    let mut relay = node(&lab, root.path(), "relay", &relay_conf);
    relay.start().expect("relay");
    let mut leaf = node(&lab, root.path(), "leaf", &format!("REQUEST EXP \".*\" relay.{name}.test\n"));
    leaf.start().expect("leaf");
    insert(&top.queue_path(), &root.path().join("files"), &names[100..]);
    wait_for_all(&mut leaf, &expected);
    assert_eq!(held(&relay), held(&leaf));
    // The relay saw the leaf by its name (reverse lookup of its IPv6 address).
    let leaf_address = lab.control_ip("leaf").expect("leaf");
    assert!(
        relay.log().contains(&format!("leaf.{name}.test [{leaf_address}]")),
        "{}",
        ldm7_testbed::tail(&relay.log(), 30)
    );
    for server in [&mut leaf, &mut relay, &mut top] {
        server.stop().expect("stop");
    }
    lab.down().expect("lab down");
}

#[test]
fn an_ipv4_only_unidata_ldm_feeds_ipv6_only_leaves_through_a_dual_stack_relay() {
    if !can_run("an_ipv4_only_unidata_ldm_feeds_ipv6_only_leaves_through_a_dual_stack_relay") {
        return;
    }
    let Some(reference) = Reference::ldm6().expect("LDM_REF_BIN") else {
        eprintln!("skipped: LDM_REF_BIN is not set (a Unidata LDM 6.15 build's bin/)");
        return;
    };
    let _lock = ldm7_testkit::lab_lock();
    let name = format!("v6m{}", std::process::id() % 10_000);
    let spec = format!(
        "name = \"{name}\"\n[[hosts]]\nname = \"up\"\nfamily = \"ipv4\"\n[[hosts]]\nname = \"relay\"\nfamily = \"dual\"\n\
         [[hosts]]\nname = \"l1\"\nfamily = \"ipv6\"\n[[hosts]]\nname = \"l2\"\nfamily = \"ipv6\"\n\
         [[hosts]]\nname = \"l4\"\nfamily = \"ipv4\"\n[[hosts]]\nname = \"old\"\nfamily = \"ipv4\"\n"
    );
    let lab = Lab::up(&spec).expect("lab up");
    let root = tempfile::tempdir().expect("tempdir");
    let files = root.path().join("files");
    let (names, expected) = products(&files, 200, 7);
    let up_address = match lab.control_ip("up").expect("up") {
        std::net::IpAddr::V4(v4) => v4,
        other => panic!("up is IPv4-only, yet reached at {other}"),
    };
    let relay_v4 = lab.spec().control_address_of("relay").expect("relay").address;
    let host = Host::in_lab(&lab.netns("up").expect("netns"), up_address);
    let registry = Registry::default();
    let up_conf = format!("ALLOW ANY ^{}$\n", relay_v4.to_string().replace('.', "\\."));
    let config = RefConfig {
        name: "up",
        host: &host,
        port: 388,
        ldmd_conf: &up_conf,
        queue_size: "200M",
        slots: None,
        registry: &registry,
    };
    let mut up = RefServer::create(&reference, root.path(), config).expect("reference upstream");
    up.insert(&files, "EXP", &names[..100]).expect("pqinsert");
    up.start().expect("reference upstream");
    // IPv4 upstream; IPv6 and IPv4 downstreams at once: the relay has both.
    let relay_conf =
        format!("ALLOW ANY fd00:4c37:76::/64\nALLOW ANY 10.76.0.0/24\nREQUEST EXP \".*\" {up_address}:388\n");
    let mut relay = node(&lab, root.path(), "relay", &relay_conf);
    relay.start().expect("relay");
    let leaf_conf = format!("REQUEST EXP \".*\" relay.{name}.test\n");
    let mut leaves = [node(&lab, root.path(), "l1", &leaf_conf), node(&lab, root.path(), "l2", &leaf_conf)];
    for leaf in &mut leaves {
        leaf.start().expect("leaf");
    }
    // The same feed to IPv4-only downstreams at the same time: an ldm7 one and a Unidata
    // LDM 6.15 one, by the relay's IPv4 address.
    let relay_v4_text = relay_v4.to_string();
    let mut v4_leaf = node(&lab, root.path(), "l4", &format!("REQUEST EXP \".*\" {relay_v4_text}:388\n"));
    v4_leaf.start().expect("IPv4 leaf");
    let old_address = lab.spec().control_address_of("old").expect("old").address;
    let old_host = Host::in_lab(&lab.netns("old").expect("netns"), old_address);
    let old_conf = format!("REQUEST EXP \".*\" {relay_v4_text}:388\n");
    let old_config = RefConfig {
        name: "old",
        host: &old_host,
        port: 388,
        ldmd_conf: &old_conf,
        queue_size: "200M",
        slots: None,
        registry: &registry,
    };
    let mut old = RefServer::create(&reference, root.path(), old_config).expect("reference leaf");
    old.start().expect("reference leaf");
    up.insert(&files, "EXP", &names[100..]).expect("pqinsert");
    wait_for_all(&mut relay, &expected);
    for leaf in &mut leaves {
        wait_for_all(leaf, &expected);
        assert_eq!(ipv4_addresses(&lab, leaf.name()).trim(), "", "{} has an IPv4 address", leaf.name());
    }
    wait_for_all(&mut v4_leaf, &expected);
    ldm7_testbed::wait_for(WAIT, "the reference leaf holds every product", || {
        let held: HashSet<Signature> = old.held()?.iter().filter(|h| h.intact).map(|h| h.signature).collect();
        Ok(expected.is_subset(&held).then_some(()))
    })
    .unwrap_or_else(|error| panic!("{error}\n{}", ldm7_testbed::tail(&old.log(), 30)));
    let upstream: HashSet<Signature> = up.held().expect("held").iter().map(|h| h.signature).collect();
    assert_eq!(upstream, expected);
    // The relay served both families: its log names IPv6 and IPv4 peers.
    let relay_log = relay.log();
    assert!(
        relay_log.contains("[fd00:4c37:76::") && relay_log.contains("[10.76.0."),
        "{}",
        ldm7_testbed::tail(&relay_log, 30)
    );
    v4_leaf.stop().expect("stop");
    old.stop().expect("stop");
    for leaf in &mut leaves {
        leaf.stop().expect("stop");
    }
    relay.stop().expect("stop");
    up.stop().expect("stop");
    lab.down().expect("lab down");
}

// ---------------------------------------------------------------------------------------------
// LDM-7 in an IPv6-only lab: MULTICAST to an IPv6 source-specific group, subscribers given
// addresses of the feed's IPv6 pool, repairs over TCPv6.

const FEED: &str = "feed";
const SUBSCRIBERS: [&str; 3] = ["s1", "s2", "s3"];
const TRACE: &str = "traces/unidata_ldm_NGRID_1hr_20150615T00Z.txt";

fn ldm7_spec(name: &str) -> String {
    let hosts: String =
        SUBSCRIBERS.iter().map(|h| format!("[[hosts]]\nname = \"{h}\"\nloss_percent = 2.0\n")).collect();
    format!(
        "name = \"{name}\"\nfamily = \"ipv6\"\n[[hosts]]\nname = \"pub\"\n{hosts}\
         [[feeds]]\nname = \"{FEED}\"\npublisher = \"pub\"\nsubscribers = [\"s1\", \"s2\", \"s3\"]\n\
         rate = \"100 Mbit/s\"\nbuffer = \"600 MB\"\nmulticast_port = 38800\nretx_port = 38801\n\
         subscriber_addresses = false\n"
    )
}

fn ldm7_subscriber(lab: &Lab, root: &Path, host: &str) -> Server {
    let port = lab.spec().bridge_port(FEED, host).expect("bridge port");
    let publisher = lab.control_ip("pub").expect("pub");
    // The monitor (on the publisher's host) may ask for the statistics.
    let conf = format!("ALLOW EXP fd00:4c37:76::/64\nRECEIVE NGRID [{publisher}]:388 {FEED} {host} {port}\n");
    let settings = "[receive]\nrate = \"100 Mbit/s\"\nretry_min = \"200ms\"\nretry_max = \"2s\"\n";
    let capacity = Capacity { bytes: 600_000_000, slots: 10_000 };
    // Named in the statistics by its IPv6 address (the hosts share the machine's host name).
    let stats_name = lab.control_ip(host).expect("address").to_string();
    let config = ServerConfig::new(host, Some(lab.netns(host).expect("netns")), capacity, &conf)
        .settings(settings)
        .args(["--stats-name", stats_name.as_str()]);
    Server::create(Path::new(LDM7), root, config).expect("subscriber")
}

fn wait_log(server: &Server, needle: &str, count: usize) {
    let what = format!("{count} × {needle:?} in the log of {}", server.name());
    ldm7_testbed::wait_for(WAIT, &what, || Ok((server.log().matches(needle).count() >= count).then_some(())))
        .unwrap_or_else(|error| panic!("{error}\n{}", ldm7_testbed::tail(&server.log(), 30)));
}

fn replay_trace(queue: &Path, limit: usize, seed: u64) {
    let trace = ldm7_testkit::shared_data(TRACE);
    let output = std::process::Command::new(LDM7)
        .args(["insert", "-q"])
        .arg(queue)
        .arg("--replay")
        .arg(&trace)
        .args(["--speed", "5", "--limit", &limit.to_string(), "--seed", &seed.to_string()])
        .output()
        .expect("ldm7 insert --replay");
    assert!(output.status.success(), "replay: {}", String::from_utf8_lossy(&output.stderr));
}

#[test]
fn ldm7_in_an_ipv6_only_lab_delivers_every_product_through_loss_and_a_restart() {
    if !can_run("ldm7_in_an_ipv6_only_lab_delivers_every_product_through_loss_and_a_restart") {
        return;
    }
    let _lock = ldm7_testkit::lab_lock();
    if ldm7_testkit::shared_data_or_skip(TRACE).is_none() {
        return;
    }
    let name = format!("v67{}", std::process::id() % 10_000);
    let lab = Lab::up(&ldm7_spec(&name)).expect("lab up");
    let feed = lab.spec().feed(FEED).expect("feed").clone();
    let server_address = feed.numbered_address6_of("pub").expect("pub").addr();
    let group = feed.multicast_group6;
    let root = tempfile::tempdir().expect("tempdir");
    // The long form: the FMTP server on the publisher's feed address, subscribers given
    // addresses of the feed's /64.
    let publisher_conf = format!(
        "ALLOW NGRID fd00:4c37:76::/64\nMULTICAST NGRID [{group}]:38800 [{server_address}]:38801 64 0 dummy dummy\n"
    );
    let publisher_settings = format!(
        "[multicast]\nrate = \"100 Mbit/s\"\n[multicast.feeds.NGRID]\npath = \"{FEED}\"\n\
         [path]\ndriver = \"linux-bridge\"\nnetns = \"{name}-core\"\n"
    );
    let capacity = Capacity { bytes: 600_000_000, slots: 10_000 };
    let config = ServerConfig::new("pub", Some(lab.netns("pub").expect("netns")), capacity, &publisher_conf)
        .settings(&publisher_settings);
    let mut publisher = Server::create(Path::new(LDM7), root.path(), config).expect("publisher");
    publisher.start().expect("publisher");
    let mut subscribers: Vec<Server> = SUBSCRIBERS.iter().map(|h| ldm7_subscriber(&lab, root.path(), h)).collect();
    for server in &mut subscribers {
        server.start().expect("subscriber");
    }
    for server in &subscribers {
        wait_log(server, "FMTP repair connection to", 1);
        let subscribed =
            server.log().lines().find(|line| line.contains("subscribed: group")).unwrap_or_default().to_owned();
        println!("{}: {subscribed}", server.name());
        // Parity negotiated between ldm7 peers, as over IPv4.
        assert!(
            subscribed.contains(&format!("group [{group}]:38800")) && subscribed.contains("parity repair"),
            "{subscribed}"
        );
    }
    // Each subscriber has an address of the feed's IPv6 pool on its feed interface, none IPv4.
    for host in SUBSCRIBERS {
        let addresses = lab.exec(host, "ip", &["-o", "addr", "show", "dev", FEED, "scope", "global"]).expect("ip");
        assert!(addresses.contains("inet6 fd00:4c37:77:1::") && !addresses.contains("inet "), "{host}: {addresses}");
    }
    replay_trace(&publisher.queue_path(), 600, 1);
    subscribers[2].wait_for_products(300, WAIT).expect("s3 receives");
    subscribers[2].kill();
    replay_trace(&publisher.queue_path(), 400, 2);
    subscribers[2].start().expect("restart s3");
    let published = publisher.records().expect("publisher's queue");
    let total = published.len() as u64;
    assert_eq!(total, 1000);
    for server in &subscribers {
        // Every product (a statistics product may come first, so counts do not tell), and the
        // line of each (written just after the product goes in: read at once, the last one's
        // line was still to come).
        let exact = ldm7_testbed::wait_for(WAIT, &format!("{} holds every product", server.name()), || {
            let records = server.records()?;
            let lines = ldm7_testbed::LogCounts::of(&server.log()).delivered();
            Ok((ldm7_testbed::Comparison::of(&published, &records).is_exact() && lines >= records.len()).then_some(()))
        });
        let records = server.records().expect("records");
        let comparison = ldm7_testbed::Comparison::of(&published, &records);
        assert!(exact.is_ok() && comparison.is_exact(), "{}: {comparison}", server.name());
        let counts = ldm7_testbed::LogCounts::of(&server.log());
        println!("{}: {} products; log: {counts}", server.name(), records.len());
        assert_eq!(counts.delivered(), records.len(), "{}: one delivery line per product", server.name());
        // The multicast carried the blocks: what TCP repaired is about the loss, not the feed
        // (blocks too long for an IPv6 datagram would all come by repair).
        let blocks: u64 = records.iter().map(|r| r.size.div_ceil(1_428)).sum();
        let repaired: u64 = records.iter().filter_map(|r| r.retransmitted_blocks).map(u64::from).sum();
        println!("{}: {repaired} of {blocks} blocks repaired over TCP", server.name());
        assert!(repaired * 10 < blocks, "{}: {repaired} of {blocks} blocks repaired over TCP", server.name());
    }
    assert!(!publisher.log().contains("multicast send failed"), "{}", ldm7_testbed::tail(&publisher.log(), 20));
    monitor_shows_the_ipv6_nodes(&lab, root.path());
    let s3 = ldm7_testbed::LogCounts::of(&subscribers[2].log());
    assert!(s3.backlog > 0, "s3's gap came through the backlog: {s3}");
    assert!(
        publisher.log().contains(&format!("multicasting to [{group}]:38800")),
        "{}",
        ldm7_testbed::tail(&publisher.log(), 20)
    );
    for server in subscribers.iter_mut().chain([&mut publisher]) {
        server.stop().expect("a clean exit");
    }
    lab.down().expect("lab down");
}

/// `ldm7 monitor` on the publisher's host requests the subscribers' statistics over IPv6 and
/// shows every node, each named by its IPv6 address, with the links from the publisher.
fn monitor_shows_the_ipv6_nodes(lab: &Lab, root: &Path) {
    let netns = lab.netns("pub").expect("netns");
    let dir = root.join("monitor");
    std::fs::create_dir_all(&dir).expect("monitor dir");
    let mut command = std::process::Command::new("ip");
    command.args(["netns", "exec", &netns, LDM7, "monitor", "--db"]);
    command.arg(format!("sqlite:{}", dir.join("monitor.db").display()));
    command.args(["--listen", "[::1]:8388", "--state-dir"]).arg(&dir);
    for host in SUBSCRIBERS {
        command.args(["--upstream", &format!("[{}]:388", lab.control_ip(host).expect("address"))]);
    }
    let log = std::fs::File::create(dir.join("log")).expect("log");
    let mut monitor = command.stdout(std::process::Stdio::null()).stderr(log).spawn().expect("ldm7 monitor");
    let nodes = |path: &str| -> Option<serde_json::Value> {
        let path = path.to_owned();
        ldm7_net::netns::in_netns(&netns, move || {
            use std::io::{Read, Write};
            let mut stream = std::net::TcpStream::connect("[::1]:8388")?;
            write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
            let mut response = String::new();
            stream.read_to_string(&mut response)?;
            Ok::<_, std::io::Error>(response)
        })
        .ok()?
        .ok()
        .and_then(|response| response.split_once("\r\n\r\n").and_then(|(_, body)| serde_json::from_str(body).ok()))
    };
    let publisher = lab.control_ip("pub").expect("pub").to_string();
    let expected: Vec<String> =
        SUBSCRIBERS.iter().map(|host| lab.control_ip(host).expect("address").to_string()).chain([publisher]).collect();
    // Statistics are published a few seconds after each minute ends.
    let shown = ldm7_testbed::wait_for(Duration::from_secs(150), "the monitor to show every IPv6 node", || {
        let Some(found) = nodes("/api/nodes") else { return Ok(None) };
        let names: Vec<&str> =
            found.as_array().into_iter().flatten().filter_map(|node| node["name"].as_str()).collect();
        Ok(expected.iter().all(|name| names.contains(&name.as_str())).then_some(()))
    });
    let links = nodes("/api/links");
    let _ = monitor.kill();
    let _ = monitor.wait();
    let log = std::fs::read_to_string(dir.join("log")).unwrap_or_default();
    shown.unwrap_or_else(|error| panic!("{error}: {:?}\n{}", nodes("/api/nodes"), ldm7_testbed::tail(&log, 20)));
    let links = links.expect("links");
    let links = links.as_array().expect("an array");
    assert!(
        links.iter().any(|link| link["publisher"].as_str() == Some(expected[3].as_str()) && link["feed"] == "NGRID"),
        "{links:?}"
    );
}
