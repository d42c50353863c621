//! The namespace lab measured for real (root only; each test skips with a message otherwise).
//!
//! Every test makes its own lab named `l7t<pid><letter>` and takes it down when it ends, even on
//! failure (the `TestLab` guard). Traffic goes only between namespaces these tests create. The
//! tests take a process-wide lock so that measurements do not share the two cores with each other.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ldm7_net::command::program_exists;
use ldm7_net::lab::{self, LabSpec};
use ldm7_net::netns::{in_netns, spawn_in_netns};
use ldm7_net::tc::{self, HtbPlan};
use ldm7_net::{ByteSize, Rate};

static SERIAL: Mutex<()> = Mutex::new(());

fn root_or_skip(test: &str, tools: &[&str]) -> bool {
    if !nix::unistd::geteuid().is_root() {
        eprintln!(
            "skipping {test}: needs root (network namespaces, bridges, tc); run `cargo test -p ldm7-net` as root"
        );
        return false;
    }
    for tool in tools {
        if !program_exists(tool) {
            eprintln!("skipping {test}: {tool} is not installed (apt-get install -y vde2 iptables iproute2)");
            return false;
        }
    }
    true
}

/// A lab that is taken down when dropped.
struct TestLab {
    spec: LabSpec,
}

impl TestLab {
    fn up(letter: char, body: &str) -> TestLab {
        let name = format!("l7t{}{letter}", std::process::id());
        let text = format!("name = \"{name}\"\n{body}");
        let spec = LabSpec::from_toml_str(&text).expect("test spec is valid");
        let _ = lab::down_spec(&spec);
        assert!(lab::up(&spec, &text).expect("lab up"), "a fresh lab is created");
        TestLab { spec }
    }

    fn netns(&self, host: &str) -> String {
        self.spec.netns_of(host)
    }

    fn address(&self, feed: &str, host: &str) -> Ipv4Addr {
        self.spec.feed(feed).unwrap().address_of(host).unwrap().address
    }
}

impl Drop for TestLab {
    fn drop(&mut self) {
        if let Err(error) = lab::down_spec(&self.spec) {
            eprintln!("cleanup of lab {} failed: {error}", self.spec.name);
        }
    }
}

const TWO_HOSTS: &str = r#"
[[hosts]]
name = "pub"
[[hosts]]
name = "sub"
"#;

#[test]
fn up_then_down_leaves_nothing_behind() {
    if !root_or_skip("up_then_down_leaves_nothing_behind", &["vde_switch", "wirefilter", "iptables"]) {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let netns_before = ldm7_net::netns::list();
    let body = format!(
        r#"{TWO_HOSTS}
[[hosts]]
name = "sub2"
loss_percent = 1.0
[[feeds]]
name = "ngrid"
publisher = "pub"
subscribers = ["sub", "sub2"]
rate = "20M"
[[feeds]]
name = "conduit"
publisher = "sub"
subscribers = ["pub", "sub2"]
rate = "40M"
delay = {{ sub2 = "5ms" }}
"#
    );
    let test_lab = TestLab::up('a', &body);
    let spec = test_lab.spec.clone();
    let text = format!("name = \"{}\"\n{body}", spec.name);
    for namespace in spec.namespaces() {
        assert!(ldm7_net::netns::exists(&namespace), "{namespace} exists while up");
    }
    assert!(!lab::up(&spec, &text).unwrap(), "a second up with the same spec changes nothing");
    let status = lab::status(&spec.name).unwrap();
    assert_eq!(status.paths.len(), 2, "{status:?}");
    assert!(status.paths.iter().all(|p| p.legs.len() == 3), "{status:?}");
    drop(test_lab);

    assert_eq!(ldm7_net::netns::list(), netns_before, "the namespaces are as before");
    assert!(!spec.run_dir().exists(), "{} is removed", spec.run_dir().display());
    let run_dir = spec.run_dir().to_string_lossy().into_owned();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            assert!(!String::from_utf8_lossy(&cmdline).contains(&run_dir), "a process of the lab survived: {entry:?}");
        }
    }
    assert!(!lab::down(&spec.name).unwrap(), "down again has nothing to do");
}

#[test]
fn a_failed_up_removes_what_it_created() {
    if !root_or_skip("a_failed_up_removes_what_it_created", &["vde_switch", "wirefilter"]) {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let netns_before = ldm7_net::netns::list();
    let name = format!("l7t{}g", std::process::id());
    let text = format!(
        r#"name = "{name}"
{TWO_HOSTS}
[[feeds]]
name = "ngrid"
publisher = "pub"
subscribers = ["sub"]
rate = "20M"
[[feeds]]
name = "conduit"
publisher = "pub"
subscribers = ["sub"]
rate = "20M"
delay = {{ sub = "1ms" }}
"#
    );
    let spec = LabSpec::from_toml_str(&text).unwrap();
    // Sabotage: a plain file where the VDE directory must go, so the second feed fails after the
    // namespaces, the bridge and the first feed's veths exist.
    std::fs::create_dir_all(spec.run_dir()).unwrap();
    std::fs::write(spec.run_dir().join("vde"), "in the way").unwrap();
    let error = lab::up(&spec, &text).unwrap_err();
    eprintln!("failed up reported: {error}");
    assert!(matches!(error, lab::LabError::UpFailed { .. }), "{error}");
    assert_eq!(error.exit_code(), 2);
    assert!(error.to_string().contains("everything it had created was removed"), "{error}");
    assert_eq!(ldm7_net::netns::list(), netns_before, "no namespace is left behind");
    assert!(!spec.run_dir().exists(), "the run directory is removed");
}

#[test]
fn round_trip_time_is_the_configured_40_ms() {
    if !root_or_skip("round_trip_time_is_the_configured_40_ms", &["vde_switch", "wirefilter"]) {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = TestLab::up(
        'b',
        &format!(
            r#"{TWO_HOSTS}
[[feeds]]
name = "ngrid"
publisher = "pub"
subscribers = ["sub"]
rate = "40M"
delay = {{ sub = "20ms" }}
"#
        ),
    );
    let server_address = SocketAddrV4::new(lab.address("ngrid", "sub"), 40007);
    let server = spawn_in_netns(&lab.netns("sub"), move || {
        let socket = UdpSocket::bind(server_address).unwrap();
        socket.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut buffer = [0u8; 64];
        while let Ok((n, peer)) = socket.recv_from(&mut buffer) {
            socket.send_to(&buffer[..n], peer).unwrap();
            if &buffer[..n] == b"end" {
                break;
            }
        }
    })
    .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let rtts = in_netns(&lab.netns("pub"), move || {
        let socket = UdpSocket::bind("0.0.0.0:0").unwrap();
        socket.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let mut rtts = Vec::new();
        let mut buffer = [0u8; 64];
        for probe in 0u32..40 {
            let start = Instant::now();
            socket.send_to(&probe.to_be_bytes(), server_address).unwrap();
            if let Ok((4, _)) = socket.recv_from(&mut buffer) {
                rtts.push(start.elapsed());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        socket.send_to(b"end", server_address).unwrap();
        rtts
    })
    .unwrap();
    server.join().unwrap().unwrap();
    let mut sorted = rtts.clone();
    sorted.sort();
    assert!(sorted.len() >= 35, "most probes come back: {}", sorted.len());
    let median_ms = sorted[sorted.len() / 2].as_secs_f64() * 1e3;
    eprintln!(
        "RTT over VDE with 20 ms one-way on the subscriber leg: median {median_ms:.2} ms over {} probes (min {:.2}, max {:.2})",
        sorted.len(),
        sorted[0].as_secs_f64() * 1e3,
        sorted[sorted.len() - 1].as_secs_f64() * 1e3
    );
    assert!((36.0..=44.0).contains(&median_ms), "median RTT {median_ms:.2} ms is not within 10% of 40 ms");
}

#[test]
fn loss_is_the_configured_5_percent() {
    if !root_or_skip("loss_is_the_configured_5_percent", &["iptables"]) {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = TestLab::up(
        'c',
        r#"
[[hosts]]
name = "pub"
[[hosts]]
name = "sub"
loss_percent = 5.0
[[feeds]]
name = "ngrid"
publisher = "pub"
subscribers = ["sub"]
rate = "100M"
buffer = "10MB"
"#,
    );
    const PACKETS: u32 = 20_000;
    let target = SocketAddrV4::new(lab.address("ngrid", "sub"), 40008);
    let receiver = spawn_in_netns(&lab.netns("sub"), move || {
        let socket = UdpSocket::bind(target).unwrap();
        socket.set_read_timeout(Some(Duration::from_millis(700))).unwrap();
        let mut seen = vec![false; PACKETS as usize];
        let mut buffer = [0u8; 64];
        while let Ok(n) = socket.recv(&mut buffer) {
            if n >= 4 {
                let sequence = u32::from_be_bytes(buffer[..4].try_into().unwrap());
                if let Some(slot) = seen.get_mut(sequence as usize) {
                    *slot = true;
                }
            }
        }
        seen.iter().filter(|s| **s).count()
    })
    .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    in_netns(&lab.netns("pub"), move || {
        let socket = UdpSocket::bind("0.0.0.0:0").unwrap();
        let mut payload = [0u8; 64];
        for sequence in 0..PACKETS {
            payload[..4].copy_from_slice(&sequence.to_be_bytes());
            socket.send_to(&payload, target).unwrap();
            if sequence % 50 == 49 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    })
    .unwrap();
    let received = receiver.join().unwrap().unwrap();
    let loss_percent = 100.0 * (1.0 - received as f64 / f64::from(PACKETS));
    eprintln!("loss with 5% configured: {loss_percent:.2}% ({received} of {PACKETS} received)");
    assert!((4.0..=6.0).contains(&loss_percent), "measured loss {loss_percent:.2}% is not within 1 pp of 5%");
}

#[test]
fn full_speed_udp_gets_the_htb_rate() {
    if !root_or_skip("full_speed_udp_gets_the_htb_rate", &[]) {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = TestLab::up(
        'd',
        &format!(
            r#"{TWO_HOSTS}
[[feeds]]
name = "ngrid"
publisher = "pub"
subscribers = ["sub"]
rate = "20M"
buffer = "10MB"
multicast_port = 38800
"#
        ),
    );
    let feed = lab.spec.feed("ngrid").unwrap().clone();
    let mut results = Vec::new();
    for megabits in [20u64, 100, 500] {
        let rate = Rate::from_megabits_per_s(megabits);
        let plan = HtbPlan { multicast_port: Some(38800), ..HtbPlan::new(rate, ByteSize::from_bytes(10_000_000)) };
        tc::install(Some(&lab.netns("pub")), "ngrid", &plan).unwrap();
        let measured = blast_multicast(&lab, &feed);
        let counters = tc::read_counters(Some(&lab.netns("pub")), "ngrid").unwrap();
        let multicast = counters.multicast().unwrap();
        eprintln!(
            "HTB {rate}: receiver measured {:.2} Mbit/s ({:+.2}%); tc multicast class sent {} pkt, dropped {}, overlimits {}",
            measured / 1e6,
            100.0 * (measured / rate.bits_per_s() as f64 - 1.0),
            multicast.sent_packets,
            multicast.dropped_packets,
            multicast.overlimits
        );
        results.push((rate, measured));
    }
    for (rate, measured) in results {
        let ratio = measured / rate.bits_per_s() as f64;
        assert!((0.95..=1.05).contains(&ratio), "{rate}: measured {:.2} Mbit/s is not within 5%", measured / 1e6);
    }
}

/// Sends 1448-byte multicast datagrams as fast as the socket allows for 2.2 s from the publisher;
/// returns the rate at the subscriber in bits/s on the wire (payload + UDP + IP + Ethernet
/// headers, which is what HTB counts), measured from 0.5 s to 2 s.
fn blast_multicast(lab: &TestLab, feed: &ldm7_net::lab::FeedSpec) -> f64 {
    const PAYLOAD: usize = 1448;
    const WIRE: usize = PAYLOAD + 8 + 20 + 14;
    let group = feed.multicast_group;
    let sub_address = lab.address("ngrid", "sub");
    let pub_address = lab.address("ngrid", "pub");
    let ready = Arc::new(AtomicBool::new(false));
    let receiver_ready = Arc::clone(&ready);
    let receiver = spawn_in_netns(&lab.netns("sub"), move || {
        let socket = multicast_receiver(group, 38800, sub_address);
        socket.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        receiver_ready.store(true, Ordering::SeqCst);
        let mut buffer = vec![0u8; 2048];
        let mut start: Option<Instant> = None;
        let mut window_start = None;
        let mut bytes = 0u64;
        let mut last = Instant::now();
        while let Ok(n) = socket.recv(&mut buffer) {
            let now = Instant::now();
            let first = *start.get_or_insert(now);
            let since = now - first;
            if since >= Duration::from_millis(500) && since < Duration::from_millis(2000) {
                window_start.get_or_insert(now);
                if n == PAYLOAD {
                    bytes += WIRE as u64;
                }
                last = now;
            }
        }
        let elapsed = window_start.map_or(1.0, |w| (last - w).as_secs_f64());
        bytes as f64 * 8.0 / elapsed
    })
    .unwrap();
    while !ready.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(5));
    }
    in_netns(&lab.netns("pub"), move || {
        let socket = UdpSocket::bind(SocketAddrV4::new(pub_address, 0)).unwrap();
        let payload = vec![0x5au8; PAYLOAD];
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(2200) {
            for _ in 0..64 {
                let _ = socket.send_to(&payload, SocketAddrV4::new(group, 38800));
            }
        }
    })
    .unwrap();
    receiver.join().unwrap().unwrap()
}

fn multicast_receiver(group: Ipv4Addr, port: u16, interface: Ipv4Addr) -> UdpSocket {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).unwrap();
    socket.set_reuse_address(true).unwrap();
    let _ = socket.set_recv_buffer_size(8 << 20);
    socket.bind(&SocketAddrV4::new(group, port).into()).unwrap();
    socket.join_multicast_v4(&group, &interface).unwrap();
    socket.into()
}

#[test]
fn adding_and_removing_a_leg_starts_and_stops_multicast_reception() {
    if !root_or_skip("adding_and_removing_a_leg_starts_and_stops_multicast_reception", &["vde_switch", "wirefilter"]) {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (letter, delay) in [('e', ""), ('f', "delay = { sub2 = \"1ms\" }")] {
        let lab = TestLab::up(
            letter,
            &format!(
                r#"
[[hosts]]
name = "pub"
[[hosts]]
name = "sub1"
[[hosts]]
name = "sub2"
[[feeds]]
name = "ngrid"
publisher = "pub"
subscribers = ["sub1", "sub2"]
rate = "20M"
{delay}
"#
            ),
        );
        leg_controls_reception(&lab);
    }
}

fn leg_controls_reception(lab: &TestLab) {
    let feed = lab.spec.feed("ngrid").unwrap().clone();
    let kind = if feed.uses_vde() { "vde" } else { "linux-bridge" };
    let group = feed.multicast_group;
    let stop = Arc::new(AtomicBool::new(false));
    let counters: Vec<Arc<AtomicU64>> = (0..2).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let mut receivers = Vec::new();
    for (host, counter) in ["sub1", "sub2"].into_iter().zip(&counters) {
        let (stop, counter, address) = (Arc::clone(&stop), Arc::clone(counter), lab.address("ngrid", host));
        receivers.push(
            spawn_in_netns(&lab.netns(host), move || {
                let socket = multicast_receiver(group, 38900, address);
                socket.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
                let mut buffer = [0u8; 64];
                while !stop.load(Ordering::SeqCst) {
                    if socket.recv(&mut buffer).is_ok() {
                        counter.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
            .unwrap(),
        );
    }
    let sender_stop = Arc::clone(&stop);
    let pub_address = lab.address("ngrid", "pub");
    let sender = spawn_in_netns(&lab.netns("pub"), move || {
        let socket = UdpSocket::bind(SocketAddrV4::new(pub_address, 0)).unwrap();
        while !sender_stop.load(Ordering::SeqCst) {
            let _ = socket.send_to(b"product block", SocketAddrV4::new(group, 38900));
            std::thread::sleep(Duration::from_millis(5));
        }
    })
    .unwrap();
    let window = |counter: &AtomicU64| {
        std::thread::sleep(Duration::from_millis(100));
        let before = counter.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(400));
        counter.load(Ordering::SeqCst) - before
    };
    let mut paths = lab::path_service(&lab.spec, &feed);
    let leg = lab::leg_of(&lab.spec, &feed, "sub1");

    let with_leg = window(&counters[0]);
    paths.remove_leg("ngrid", &leg.endpoint).unwrap();
    let without_leg = window(&counters[0]);
    let other_meanwhile = window(&counters[1]);
    paths.add_leg("ngrid", &leg).unwrap();
    let leg_again = window(&counters[0]);
    stop.store(true, Ordering::SeqCst);
    sender.join().unwrap().unwrap();
    for receiver in receivers {
        receiver.join().unwrap().unwrap();
    }
    eprintln!(
        "{kind}: packets at sub1 in 400 ms with its leg {with_leg}, after remove_leg {without_leg}, after add_leg {leg_again}; sub2 meanwhile {other_meanwhile}"
    );
    assert!(with_leg > 20, "{kind}: sub1 receives while its leg is on the path");
    assert_eq!(without_leg, 0, "{kind}: sub1 receives nothing once its leg is removed");
    assert!(other_meanwhile > 20, "{kind}: sub2 is not affected");
    assert!(leg_again > 20, "{kind}: sub1 receives again once its leg is added back");
}

#[test]
fn lab_refuses_to_run_without_root() {
    let example = std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().join("examples/lab");
    if !root_or_skip("lab_refuses_to_run_without_root", &["setpriv"]) || !example.exists() {
        eprintln!(
            "skipping lab_refuses_to_run_without_root: needs root, setpriv and the example binary ({})",
            example.display()
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let spec = dir.path().join("lab.toml");
    std::fs::write(&spec, format!("name = \"l7t{}z\"\n{TWO_HOSTS}", std::process::id())).unwrap();
    std::fs::set_permissions(&spec, std::fs::Permissions::from_mode(0o644)).unwrap();
    let output = std::process::Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .arg(&example)
        .args(["up", "--spec"])
        .arg(&spec)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("needs root"), "{stderr}");
}
