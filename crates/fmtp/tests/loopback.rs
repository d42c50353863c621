//! Real sockets on loopback multicast (no root): products sent once over UDP multicast reach
//! every receiver intact even though each receiver drops 5% of the datagrams; the losses are
//! repaired over each receiver's own TCP connection.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ldm7_fmtp::udp::MulticastConfig;
use ldm7_fmtp::{FmtpSender, ReceiverOptions, SenderNotice, SenderOptions, run_receiver};
use ldm7_fmtp_proto::{Product, ReceiverConfig, ReceiverEvent, SenderConfig};
use md5::{Digest, Md5};

fn free_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0").and_then(|socket| socket.local_addr()).map(|a| a.port()).unwrap_or(38_911)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lossy_receivers_get_every_product_intact() {
    let group = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(239, 255, 77, 2)), free_port());
    lossy_receivers(MulticastConfig::loopback(group), "127.0.0.1:0".parse().expect("addr")).await;
}

/// The same over IPv6 (group ff15::/16, site-local transient), in a network namespace of the
/// test's own: Linux does not loop IPv6 multicast back on `lo`, so the namespace gets a veth
/// pair and the sender loops its datagrams back on one end. Needs root.
#[test]
fn lossy_receivers_get_every_product_intact_over_ipv6() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (creates a network namespace for IPv6 multicast)");
        return;
    }
    std::thread::spawn(|| {
        // The namespace is per thread: this thread, the runtime's workers it starts and the
        // `ip` children inherit it; the namespace and the veth pair vanish with them.
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
        let ip = |args: &str| {
            let output = std::process::Command::new("ip").args(args.split(' ')).output().expect("run ip");
            assert!(output.status.success(), "ip {args}: {}", String::from_utf8_lossy(&output.stderr));
            String::from_utf8_lossy(&output.stdout).into_owned()
        };
        ip("link set lo up");
        ip("link add v6a type veth peer name v6b");
        ip("link set v6a up");
        ip("link set v6b up");
        ip("-6 addr add fd00::1/64 dev v6a nodad");
        // "N: v6a@v6b: <…>"
        let index: u32 = ip("-o link show v6a").split(':').next().and_then(|n| n.trim().parse().ok()).expect("ifindex");
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        runtime.block_on(async {
            let group = SocketAddr::new("ff15::4c44:4d37".parse().expect("group"), 38_800);
            let mut multicast = MulticastConfig::loopback(group);
            multicast.interface = "fd00::1".parse().expect("interface");
            multicast.interface_index = index;
            lossy_receivers(multicast, "[::1]:0".parse().expect("addr")).await;
        });
    })
    .join()
    .expect("IPv6 run");
}

async fn lossy_receivers(multicast: MulticastConfig, retx_listen: SocketAddr) {
    let mut sender = FmtpSender::start(SenderOptions {
        multicast: multicast.clone(),
        retx_listen,
        proto: SenderConfig::with_rate(200_000_000),
        authorize: Arc::new(|peer: SocketAddr| peer.ip().is_loopback()),
    })
    .await
    .expect("start sender");

    let receivers = 2;
    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    for seed in 0..receivers {
        let options = ReceiverOptions {
            multicast: multicast.clone(),
            source: None,
            sender_retx: sender.retx_addr(),
            proto: ReceiverConfig::default(),
            drop_probability: 0.05,
            seed,
        };
        let events_tx = events_tx.clone();
        let tagged = tokio::sync::mpsc::unbounded_channel::<ReceiverEvent>();
        let (tag_tx, mut tag_rx) = tagged;
        let forward = events_tx.clone();
        tokio::spawn(async move {
            while let Some(event) = tag_rx.recv().await {
                let _ = forward.send((seed, event));
            }
        });
        drop(events_tx);
        tasks.push(tokio::spawn(run_receiver(options, tag_tx, stop.clone())));
    }
    drop(events_tx);
    let mut joined = 0;
    while joined < receivers {
        match tokio::time::timeout(Duration::from_secs(10), sender.next_notice()).await {
            Ok(Some(SenderNotice::ReceiverJoined(..))) => joined += 1,
            Ok(Some(_)) => {}
            other => panic!("receivers did not connect: {other:?}"),
        }
    }

    // Sizes from the NEXRAD3 trace's first products, as in the IDD.
    let sizes = [18_909usize, 165, 89_266, 17_954, 50_265, 1_448, 2_896, 1, 250_000, 33_000];
    let mut expected = HashMap::new();
    for (index, &size) in sizes.iter().cycle().take(60).enumerate() {
        let data: Vec<u8> = (0..size).map(|offset| (offset * 31 + index * 7) as u8).collect();
        let digest: [u8; 16] = Md5::digest(&data).into();
        expected.insert(digest, size);
        sender.send(Product::new(data, digest.to_vec())).expect("send");
    }
    let mut delivered: HashMap<u64, Vec<[u8; 16]>> = HashMap::new();
    let wanted = expected.len() * receivers as usize;
    let mut retransmitted = 0u64;
    while delivered.values().map(Vec::len).sum::<usize>() < wanted {
        let (seed, event) = tokio::time::timeout(Duration::from_secs(30), events.recv())
            .await
            .expect("all products within 30 s")
            .expect("receivers alive");
        match event {
            ReceiverEvent::Delivered(delivery) => {
                let digest: [u8; 16] = Md5::digest(&delivery.data).into();
                assert_eq!(delivery.metadata, digest, "product {:?} corrupted", delivery.index);
                assert_eq!(expected.get(&digest), Some(&delivery.data.len()));
                retransmitted += u64::from(delivery.retransmitted_blocks);
                delivered.entry(seed).or_default().push(digest);
            }
            ReceiverEvent::Missed { index, reason } => panic!("receiver {seed} missed {index:?}: {reason:?}"),
            _ => {}
        }
    }
    for digests in delivered.values() {
        let mut unique = digests.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), expected.len(), "each product exactly once");
    }
    assert!(retransmitted > 0, "5% loss must have needed repairs");
    let _ = stop_tx.send(true);
    for task in tasks {
        let counters = task.await.expect("join").expect("receiver ran");
        let _ = counters;
    }
}
