//! Real sockets on loopback multicast (no root): products sent once over UDP multicast reach
//! every receiver intact even though each receiver drops 5% of the datagrams; the losses are
//! repaired over each receiver's own TCP connection. Receivers may start before the sender
//! (they retry their connection), may spool products to files instead of memory, and a
//! receiver too slow to be repaired in time degrades alone to products reported missed.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ldm7_fmtp::udp::MulticastConfig;
use ldm7_fmtp::{
    FmtpReceiver, FmtpSender, ReceivedBytes, ReceiverNotice, ReceiverOptions, ReceiverReport, SenderNotice,
    SenderOptions, SetRateError,
};
use ldm7_fmtp_proto::{CompletionOutcome, MissReason, OutgoingProduct, ReceiverEvent, SenderConfig, SenderEvent};
use md5::{Digest, Md5};

/// Longest any test here waits for what it expects (a generous margin, not a timing claim).
const PATIENCE: Duration = Duration::from_secs(60);

fn free_tcp_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|listener| listener.local_addr()).expect("free port")
}

fn loopback_group(last_octet: u8) -> MulticastConfig {
    MulticastConfig::loopback(SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(239, 255, 77, last_octet)),
        ldm7_io::free_port().expect("a free port"),
    ))
}

/// Sizes from the NEXRAD3 trace's first products, as in the IDD.
const SIZES: [usize; 10] = [18_909, 165, 89_266, 17_954, 50_265, 1_448, 2_896, 1, 250_000, 33_000];

/// `count` distinct products cycling through [`SIZES`]: (data, MD5).
fn products(count: usize) -> Vec<(Vec<u8>, [u8; 16])> {
    SIZES
        .iter()
        .cycle()
        .take(count)
        .enumerate()
        .map(|(index, &size)| {
            let data: Vec<u8> = (0..size).map(|offset| (offset * 31 + index * 7) as u8).collect();
            let digest: [u8; 16] = Md5::digest(&data).into();
            (data, digest)
        })
        .collect()
}

/// `count` distinct products of `size` bytes each, patterned by `stride`: (data, MD5).
fn same_size_products(count: usize, size: usize, stride: usize) -> Vec<(Vec<u8>, [u8; 16])> {
    (0..count)
        .map(|index| {
            let data: Vec<u8> = (0..size).map(|offset| (offset * stride + index * 5) as u8).collect();
            let digest: [u8; 16] = Md5::digest(&data).into();
            (data, digest)
        })
        .collect()
}

/// What one receiver got.
#[derive(Debug, Default)]
struct Outcome {
    /// MD5 of each delivered product (checked against its metadata).
    delivered: Vec<[u8; 16]>,
    missed: Vec<MissReason>,
    retransmitted_blocks: u64,
    spooled: usize,
    report: ReceiverReport,
}

/// Reads a receiver's notices until `wanted` products were delivered or missed; checks every
/// delivery's MD5 against its metadata.
async fn collect(mut receiver: FmtpReceiver, wanted: usize) -> Outcome {
    let mut outcome = Outcome::default();
    while outcome.delivered.len() + outcome.missed.len() < wanted {
        let notice = tokio::time::timeout(PATIENCE, receiver.next_notice())
            .await
            .unwrap_or_else(|_| panic!("no notice within {PATIENCE:?}: {outcome:?}"))
            .expect("the receiver runs");
        match notice {
            ReceiverNotice::Delivered { delivery, product } => {
                assert!(delivery.data.is_empty(), "the bytes come in the product");
                if matches!(product, ReceivedBytes::Spooled(_)) {
                    outcome.spooled += 1;
                }
                let digest = product.md5().expect("read the product");
                assert_eq!(delivery.metadata, digest, "product {:?} corrupted", delivery.index);
                outcome.retransmitted_blocks += u64::from(delivery.retransmitted_blocks);
                outcome.delivered.push(digest);
            }
            ReceiverNotice::Event(ReceiverEvent::Missed { reason, .. }) => outcome.missed.push(reason),
            _ => {}
        }
    }
    outcome.report = receiver.finish().await.expect("the receiver ran");
    outcome
}

/// Waits until `count` receivers joined.
async fn joined(sender: &mut FmtpSender, count: usize) {
    let mut joined = 0;
    while joined < count {
        match tokio::time::timeout(PATIENCE, sender.next_notice()).await {
            Ok(Some(SenderNotice::ReceiverJoined(..))) => joined += 1,
            Ok(Some(_)) => {}
            other => panic!("receivers did not connect: {other:?}"),
        }
    }
}

/// Sends the products, reading notices meanwhile, until every one was released.
async fn send_all(sender: &mut FmtpSender, products: &[(Vec<u8>, [u8; 16])]) {
    send_all_telling(sender, products, None).await;
}

/// [`send_all`], telling `all_sent` once every product was multicast whole (its EOP sent).
async fn send_all_telling(
    sender: &mut FmtpSender,
    products: &[(Vec<u8>, [u8; 16])],
    all_sent: Option<tokio::sync::oneshot::Sender<()>>,
) {
    send_all_spaced(sender, products, all_sent, Duration::ZERO).await;
}

/// [`send_all_telling`], handing the sender a product every `spacing`.
async fn send_all_spaced(
    sender: &mut FmtpSender,
    products: &[(Vec<u8>, [u8; 16])],
    mut all_sent: Option<tokio::sync::oneshot::Sender<()>>,
    spacing: Duration,
) {
    let feeder = sender.product_sender();
    let outgoing: Vec<OutgoingProduct> =
        products.iter().map(|(data, digest)| OutgoingProduct::new(data.clone(), *digest)).collect();
    let feeding = tokio::spawn(async move {
        for product in outgoing {
            feeder.send(product).await.expect("the sender runs");
            if !spacing.is_zero() {
                tokio::time::sleep(spacing).await;
            }
        }
    });
    let (mut sent, mut released) = (0, 0);
    while released < products.len() {
        match tokio::time::timeout(PATIENCE, sender.next_notice()).await {
            Ok(Some(SenderNotice::Event(SenderEvent::Sent { .. }))) => {
                sent += 1;
                if let Some(tell) = all_sent.take_if(|_| sent == products.len()) {
                    let _ = tell.send(());
                }
            }
            Ok(Some(SenderNotice::Event(SenderEvent::Released { .. }))) => released += 1,
            Ok(Some(SenderNotice::Refused(error))) => panic!("refused: {error}"),
            Ok(Some(_)) => {}
            other => panic!("{released} of {} products released: {other:?}", products.len()),
        }
    }
    feeding.await.expect("feeder");
}

fn assert_each_once(outcome: &Outcome, products: &[(Vec<u8>, [u8; 16])]) {
    let mut got = outcome.delivered.clone();
    got.sort_unstable();
    let mut expected: Vec<[u8; 16]> = products.iter().map(|(_, digest)| *digest).collect();
    expected.sort_unstable();
    assert_eq!(got, expected, "each product exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lossy_receivers_get_every_product_intact() {
    lossy_receivers(loopback_group(2), "127.0.0.1:0".parse().expect("addr")).await;
}

/// The same over IPv6 (group ff15::/16, site-local transient), in a network namespace of the
/// test's own: Linux does not loop IPv6 multicast back on `lo`, so the namespace gets a veth
/// pair and the sender loops its datagrams back on one end. Needs root.
#[test]
fn lossy_receivers_get_every_product_intact_over_ipv6() {
    if !ldm7_testkit::skip_unless_root("lossy_receivers_get_every_product_intact_over_ipv6") {
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
    let mut options = SenderOptions::new(multicast.clone(), retx_listen, SenderConfig::with_rate(200_000_000));
    options.authorize = Arc::new(|peer: SocketAddr| peer.ip().is_loopback());
    let mut sender = FmtpSender::start(options).await.expect("start sender");
    let products = products(60);
    let mut receivers = Vec::new();
    for seed in 0..2 {
        let mut options = ReceiverOptions::new(multicast.clone(), sender.retx_addr());
        options.drop_probability = 0.05;
        options.seed = seed;
        let receiver = FmtpReceiver::start(options).expect("start receiver");
        receivers.push(tokio::spawn(collect(receiver, products.len())));
    }
    joined(&mut sender, 2).await;
    send_all(&mut sender, &products).await;
    for receiver in receivers {
        let outcome = receiver.await.expect("receiver");
        assert!(outcome.missed.is_empty(), "{outcome:?}");
        assert_each_once(&outcome, &products);
        assert!(outcome.retransmitted_blocks > 0, "5% loss must have needed repairs");
        assert!(outcome.report.driver.datagrams_dropped > 0);
    }
    assert!(sender.driver_counters().rtt_samples > 0, "{:?}", sender.driver_counters());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receivers_started_before_the_sender_connect_when_it_comes_up() {
    let multicast = loopback_group(3);
    let retx = free_tcp_addr();
    let mut receiver = FmtpReceiver::start(ReceiverOptions::new(multicast.clone(), retx)).expect("start receiver");
    // A second attempt means the first was refused: nobody listens on `retx` yet.
    wait_for("a refused connection attempt", || receiver.driver_counters().connect_attempts >= 2).await;
    let mut sender = FmtpSender::start(SenderOptions::new(multicast, retx, SenderConfig::with_rate(100_000_000)))
        .await
        .expect("sender");
    let first = tokio::time::timeout(PATIENCE, receiver.next_notice()).await.expect("connected in time");
    assert!(matches!(first, Some(ReceiverNotice::Connected(addr)) if addr == retx), "{first:?}");
    let receiving = tokio::spawn(collect(receiver, 3));
    joined(&mut sender, 1).await;
    let products = products(3);
    send_all(&mut sender, &products).await;
    let outcome = receiving.await.expect("receiver");
    assert_each_once(&outcome, &products);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_changes_at_run_time_and_each_receiver_reports_each_product() {
    let multicast = loopback_group(7);
    let options = SenderOptions::new(multicast.clone(), free_tcp_addr(), SenderConfig::with_rate(100_000_000));
    let mut sender = FmtpSender::start(options).await.expect("sender");
    let rate = sender.rate_handle();
    rate.set_rate(20_000_000).await.expect("a positive rate");
    assert!(matches!(rate.set_rate(0).await, Err(SetRateError::Refused(_))));
    let receiver = FmtpReceiver::start(ReceiverOptions::new(multicast, sender.retx_addr())).expect("receiver");
    let receiving = tokio::spawn(collect(receiver, 4));
    joined(&mut sender, 1).await;
    let products = products(4);
    let feeder = sender.product_sender();
    for (data, digest) in &products {
        feeder.send(OutgoingProduct::new(data.clone(), *digest)).await.expect("the sender runs");
    }
    let mut completions = Vec::new();
    while completions.len() < products.len() {
        match tokio::time::timeout(PATIENCE, sender.next_notice()).await {
            Ok(Some(SenderNotice::Event(SenderEvent::Completed(completion)))) => completions.push(completion),
            Ok(Some(_)) => {}
            other => {
                panic!("{} completions: {other:?}: {completions:?}; {:?}", completions.len(), sender.driver_counters())
            }
        }
    }
    assert!(completions.iter().all(|c| c.outcome == CompletionOutcome::Whole), "{completions:?}");
    assert_each_once(&receiving.await.expect("receiver"), &products);
    // An unpaced sender has no rate to change.
    let unpaced = SenderOptions::new(loopback_group(8), free_tcp_addr(), SenderConfig::default());
    let unpaced = FmtpSender::start(unpaced).await.expect("sender");
    assert!(matches!(unpaced.rate_handle().set_rate(1_000_000).await, Err(SetRateError::Refused(_))));
}

/// Waits until `condition` holds, checking every few milliseconds; panics after [`PATIENCE`].
/// The test's own thread waits (the senders and receivers run on the runtime's workers).
async fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    tokio::task::block_in_place(|| ldm7_testkit::wait_until(PATIENCE, what, || condition().then_some(())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spooled_receivers_hold_no_product_in_memory_and_get_every_byte() {
    let multicast = loopback_group(4);
    let spool = tempfile::tempdir().expect("spool dir");
    let mut sender = FmtpSender::start(SenderOptions::new(
        multicast.clone(),
        "127.0.0.1:0".parse().expect("addr"),
        SenderConfig::with_rate(200_000_000),
    ))
    .await
    .expect("start sender");
    let products = products(40);
    let mut receivers = Vec::new();
    for seed in 0..2 {
        let mut options = ReceiverOptions::new(multicast.clone(), sender.retx_addr());
        options.drop_probability = 0.05;
        options.seed = seed + 10;
        options.spool = Some(spool.path().join(format!("r{seed}")));
        // Every product in a file (small ones are otherwise assembled in memory).
        options.spool_memory_below = 0;
        let receiver = FmtpReceiver::start(options).expect("start receiver");
        receivers.push(tokio::spawn(collect(receiver, products.len())));
    }
    joined(&mut sender, 2).await;
    send_all(&mut sender, &products).await;
    for receiver in receivers {
        let outcome = receiver.await.expect("receiver");
        assert!(outcome.missed.is_empty(), "{outcome:?}");
        assert_each_once(&outcome, &products);
        assert_eq!(outcome.spooled, products.len(), "every product came through the spool");
        assert!(outcome.retransmitted_blocks > 0);
    }
    // Every spool file went with its product, and the spool directories with their receivers.
    for seed in 0..2 {
        let dir = spool.path().join(format!("r{seed}"));
        assert_eq!(std::fs::read_dir(&dir).expect("spool parent").count(), 0, "{}", dir.display());
    }
}

/// A receiver with a tiny receive buffer on its repair connection, which it reads slowly, and
/// 20% loss on the multicast: it cannot be repaired before the 2 s deadline (the repair
/// connection's kernel buffers are bounded too, so what the deadline withdraws does not reach
/// it anyway). The two others (5% loss) get every product, and the sender releases everything;
/// the slow one ends with every product delivered or missed, some missed as rejected. Counts
/// only, with wide margins: it needs about four times the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_receiver_degrades_alone_to_missed_products() {
    let multicast = loopback_group(5);
    let mut proto = SenderConfig::with_rate(200_000_000);
    proto.deadline = ldm7_fmtp_proto::DeadlinePolicy::Constant(Duration::from_secs(2));
    proto.retx_backlog_bytes_max = 64 << 10;
    let mut options = SenderOptions::new(multicast.clone(), "127.0.0.1:0".parse().expect("addr"), proto);
    options.bounds.repair_queue_bytes_max = 32 << 10;
    options.bounds.repair_send_buffer_bytes = Some(32 << 10);
    let mut sender = FmtpSender::start(options).await.expect("start sender");
    let products = products(40);
    let mut fast = Vec::new();
    for seed in 0..2 {
        let mut options = ReceiverOptions::new(multicast.clone(), sender.retx_addr());
        options.drop_probability = 0.05;
        options.seed = seed + 20;
        let receiver = FmtpReceiver::start(options).expect("start receiver");
        fast.push(tokio::spawn(collect(receiver, products.len())));
    }
    let slow = tokio::spawn(slow::receive(multicast.clone(), sender.retx_addr(), 0.20, products.len()));
    joined(&mut sender, 3).await;
    send_all(&mut sender, &products).await;
    for receiver in fast {
        let outcome = receiver.await.expect("receiver");
        assert!(outcome.missed.is_empty(), "a fast receiver missed products: {outcome:?}");
        assert_each_once(&outcome, &products);
    }
    let slow = slow.await.expect("slow receiver");
    assert_eq!(slow.delivered + slow.missed.len(), products.len(), "{slow:?}");
    assert!(slow.missed.contains(&MissReason::Rejected), "{slow:?}");
    let counters = sender.driver_counters();
    eprintln!(
        "slow receiver: {} delivered, {} missed ({} rejected); sender driver: {counters:?}",
        slow.delivered,
        slow.missed.len(),
        slow.missed.iter().filter(|reason| **reason == MissReason::Rejected).count()
    );
    assert!(counters.repair_queue_full > 0 && counters.stream_paused > 0, "{counters:?}");
}

/// A receiver built on the sans-IO state machine with sockets of its own, to be slow on
/// purpose: its repair connection has a 4 KiB receive buffer and is read 1 KiB at a time every
/// 10 ms (a rate limit, not a synchronization).
mod slow {
    use std::collections::HashMap;
    use std::io::IoSliceMut;
    use std::net::SocketAddr;
    use std::time::Duration;

    use ldm7_fmtp::udp::{MulticastConfig, MulticastReceiver, RecvMeta, datagrams};
    use ldm7_fmtp_proto::wire::{Split, handshake, split_frame};
    use ldm7_fmtp_proto::{MissReason, Receiver, ReceiverConfig, ReceiverEvent};
    use ldm7_io::Clock;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[derive(Debug, Default)]
    pub struct Outcome {
        pub delivered: usize,
        pub missed: Vec<MissReason>,
    }

    pub async fn receive(multicast: MulticastConfig, retx: SocketAddr, drop: f64, wanted: usize) -> Outcome {
        let udp = MulticastReceiver::join(&multicast, None).expect("join");
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
        socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
        socket.connect(&retx.into()).expect("connect");
        socket.set_nonblocking(true).expect("non-blocking");
        let stream = tokio::net::TcpStream::from_std(socket.into()).expect("register");
        let (mut read, mut write) = stream.into_split();
        let key = ldm7_fmtp_proto::mac::KeyOffer::generate(&mut rand_core::OsRng).expect("RSA key");
        let mut hello = Vec::new();
        handshake::emit_blob(key.pem(), &mut hello).expect("blob");
        write.write_all(&hello).await.expect("offer");
        let mut buffer = Vec::new();
        let mut chunk = [0u8; 1024];
        buffer = loop {
            if let Split::Frame { rest, .. } = handshake::split_blob(&buffer).expect("blob") {
                break rest.to_vec();
            }
            let count = read.read(&mut chunk).await.expect("answer");
            assert!(count > 0, "the sender closed during the key exchange");
            buffer.extend_from_slice(&chunk[..count]);
        };
        // Requests go out from a task of their own: the sender may stop reading them.
        let (requests, mut request_rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
        let writer = tokio::spawn(async move {
            while let Some(bytes) = request_rx.recv().await {
                if write.write_all(&bytes).await.is_err() {
                    return;
                }
            }
        });
        let config = ReceiverConfig { incomplete_timeout: Duration::from_secs(120), ..ReceiverConfig::default() };
        let mut receiver = Receiver::new(config).expect("receiver");
        let mut outcome = Outcome::default();
        let mut seen = HashMap::new();
        let mut rng = super::SplitMix(7);
        let mut storage = vec![vec![0u8; 65_535]; 8];
        let mut meta = vec![RecvMeta::default(); 8];
        let mut slow_read = tokio::time::interval(Duration::from_millis(10));
        while outcome.delivered + outcome.missed.len() < wanted {
            let mut outgoing = Vec::new();
            while let Some(message) = receiver.poll_transmit() {
                message.emit_to_vec(&mut outgoing).expect("emit");
            }
            if !outgoing.is_empty() {
                requests.send(outgoing).expect("writer runs");
            }
            while let Some(event) = receiver.poll_event() {
                match event {
                    ReceiverEvent::Delivered(delivery) => {
                        assert!(seen.insert(delivery.index, ()).is_none(), "delivered twice");
                        outcome.delivered += 1;
                    }
                    ReceiverEvent::Missed { index, reason } => {
                        assert!(seen.insert(index, ()).is_none(), "settled twice");
                        outcome.missed.push(reason);
                    }
                    _ => {}
                }
            }
            let wake = receiver.poll_timeout().map(|at| tokio::time::Instant::from_std(Clock::to_std(at)));
            tokio::select! {
                received = async {
                    let mut buffers: Vec<IoSliceMut<'_>> = storage.iter_mut().map(|b| IoSliceMut::new(b)).collect();
                    udp.recv_batch(&mut buffers, &mut meta).await
                } => {
                    let count = received.expect("multicast");
                    let now = Clock::now();
                    for (buffer, meta) in storage.iter().zip(&meta).take(count) {
                        for datagram in datagrams(buffer, meta) {
                            if !rng.below(drop) {
                                receiver.handle_datagram(now, datagram);
                            }
                        }
                    }
                }
                _ = slow_read.tick() => {
                    let count = match read.try_read(&mut chunk) {
                        Ok(0) => panic!("the sender closed the connection"),
                        Ok(count) => count,
                        Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => 0,
                        Err(error) => panic!("repairs: {error}"),
                    };
                    buffer.extend_from_slice(&chunk[..count]);
                    let now = Clock::now();
                    while let Split::Frame { frame, rest } = split_frame(&buffer).expect("framing") {
                        let consumed = buffer.len() - rest.len();
                        receiver.handle_stream_frame(now, frame).expect("valid frame");
                        buffer.drain(..consumed);
                    }
                }
                () = async { tokio::time::sleep_until(wake.expect("guarded")).await }, if wake.is_some() => {
                    receiver.handle_timeout(Clock::now());
                }
            }
        }
        writer.abort();
        outcome
    }
}

/// SplitMix64 draws for the slow receiver's loss filter.
struct SplitMix(u64);

impl SplitMix {
    fn below(&mut self, probability: f64) -> bool {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (((z ^ (z >> 31)) >> 11) as f64) / ((1u64 << 53) as f64) < probability
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_asks_for_repairs_and_never_reads_them_is_cut_off_while_others_are_served() {
    use ldm7_fmtp_proto::ProductIndex;
    use ldm7_fmtp_proto::wire::{Body, Message, handshake};
    use tokio::io::AsyncWriteExt;

    let multicast = loopback_group(9);
    let mut options = SenderOptions::new(multicast.clone(), free_tcp_addr(), SenderConfig::with_rate(200_000_000));
    options.bounds.repair_stall_max = Duration::from_secs(1);
    options.bounds.repair_send_buffer_bytes = Some(64 << 10);
    let mut sender = FmtpSender::start(options).await.expect("sender");
    let products = products(10);
    let receiver = FmtpReceiver::start(ReceiverOptions::new(multicast, sender.retx_addr())).expect("receiver");
    let receiving = tokio::spawn(collect(receiver, products.len()));
    // The attacker: a key offer as any receiver sends, then requests for the largest product,
    // again and again, never reading an answer.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("receive buffer");
    let mut peer = socket.connect(sender.retx_addr()).await.expect("connect");
    let key = ldm7_fmtp_proto::mac::KeyOffer::generate(&mut rand_core::OsRng).expect("RSA key");
    let mut offer = Vec::new();
    handshake::emit_blob(key.pem(), &mut offer).expect("blob");
    peer.write_all(&offer).await.expect("offer");
    joined(&mut sender, 2).await;
    let largest = ProductIndex(8); // 250,000 bytes (SIZES[8]).
    let request = Message { index: largest, body: Body::RetxReq { offset: 0, len: 65_160 } }.to_vec().expect("emit");
    let flood = tokio::spawn(async move {
        let mut requests = 0u64;
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while tokio::time::Instant::now() < deadline {
            match tokio::time::timeout(Duration::from_millis(200), peer.write_all(&request)).await {
                Ok(Ok(())) => requests += 1,
                Ok(Err(_)) => return (requests, true), // Cut off.
                Err(_) => {}                           // The sender reads no more: keep trying.
            }
        }
        (requests, false)
    });
    send_all(&mut sender, &products).await;
    let outcome = receiving.await.expect("receiver");
    assert!(outcome.missed.is_empty(), "{outcome:?}");
    assert_each_once(&outcome, &products);
    wait_for("the stalled peer to be cut off", || sender.driver_counters().connections_stalled == 1).await;
    let (requests, cut_off) = flood.await.expect("flood");
    assert!(cut_off, "the peer's connection was closed after {requests} requests");
}

/// Joins `group` on loopback and returns a socket that reads its datagrams (a sniffer on the
/// path, or the forger's own copy).
fn sniffer(group: SocketAddr) -> std::net::UdpSocket {
    let IpAddr::V4(address) = group.ip() else { panic!("IPv4 group") };
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).expect("socket");
    socket.set_reuse_address(true).expect("reuse");
    socket.bind(&SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), group.port()).into()).expect("bind");
    socket.join_multicast_v4(&address, &Ipv4Addr::LOCALHOST).expect("join");
    socket.set_read_timeout(Some(Duration::from_millis(50))).expect("timeout");
    socket.into()
}

/// A socket that sends to `group` on loopback as a forger would.
fn forger() -> std::net::UdpSocket {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).expect("socket");
    socket.set_multicast_if_v4(&Ipv4Addr::LOCALHOST).expect("interface");
    socket.set_multicast_loop_v4(true).expect("loop");
    socket.bind(&SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0).into()).expect("bind");
    socket.into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receivers_at_each_mac_level_get_every_product_and_forged_datagrams_are_dropped() {
    use ldm7_fmtp::MacSigning;
    use ldm7_fmtp_proto::ProductIndex;
    use ldm7_fmtp_proto::mac::MacLevel;
    use ldm7_fmtp_proto::wire::{Body, Message};
    let cases = [
        (20, MacLevel::None, MacSigning::Datagram),
        (21, MacLevel::Hmac, MacSigning::Datagram),
        (22, MacLevel::Ed25519, MacSigning::Datagram),
        (29, MacLevel::Ed25519, MacSigning::Lists),
    ];
    for (octet, level, signing) in cases {
        let multicast = loopback_group(octet);
        let group = multicast.group;
        let mut options = SenderOptions::new(multicast.clone(), free_tcp_addr(), SenderConfig::with_rate(200_000_000));
        options.mac_level = level;
        options.mac_signing = signing;
        let mut sender = FmtpSender::start(options).await.expect("sender");
        let mut receiver_options = ReceiverOptions::new(multicast, sender.retx_addr());
        receiver_options.mac_level = level;
        receiver_options.drop_probability = 0.05;
        let receiving = tokio::spawn(collect(FmtpReceiver::start(receiver_options).expect("receiver"), 20));
        joined(&mut sender, 1).await;
        // A forger on the path sends data blocks for the products being sent, with a MAC of
        // the right length that it cannot compute, and (to a sender signing lists) without
        // one. (At level 0 nothing tells them apart.)
        // It forges in step with the real multicast: a burst for every eighth datagram of the
        // sender's it sees.
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let forging = (level != MacLevel::None).then(|| {
            let stop = stop.clone();
            let sniffer = sniffer(group);
            std::thread::spawn(move || {
                let socket = forger();
                let own = socket.local_addr().expect("forger's address");
                let (mut seen, mut sent) = (0u64, 0u64);
                let mut buffer = [0u8; 2048];
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // A read times out after 50 ms: the loop then looks at `stop` again.
                    let Ok((_, from)) = sniffer.recv_from(&mut buffer) else { continue };
                    if from == own {
                        continue;
                    }
                    seen += 1;
                    if seen % 8 != 1 {
                        continue;
                    }
                    for index in 0..20 {
                        let block = Message {
                            index: ProductIndex(index),
                            body: Body::MemData { offset: 0, data: &[0x66; 100] },
                        };
                        let mut datagram = block.to_vec().expect("emit");
                        if signing == MacSigning::Lists && index % 2 == 0 {
                            // Unsigned, as a listed datagram is: no list names it.
                        } else {
                            datagram.extend(std::iter::repeat_n(0x77, level.mac_len()));
                        }
                        if socket.send_to(&datagram, group).is_ok() {
                            sent += 1;
                        }
                    }
                }
                sent
            })
        });
        let products = products(20);
        send_all(&mut sender, &products).await;
        let outcome = receiving.await.expect("receiver");
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let forged = forging.map(|thread| thread.join().expect("forger")).unwrap_or(0);
        assert!(outcome.missed.is_empty(), "level {level}: {outcome:?}");
        assert_each_once(&outcome, &products);
        assert!(outcome.retransmitted_blocks > 0, "level {level}: losses repaired");
        if level != MacLevel::None {
            assert!(forged > 0 && outcome.report.driver.bad_mac > 0, "level {level}: {forged} forged, {outcome:?}");
        }
        let lists = sender.driver_counters().digest_lists;
        if signing == MacSigning::Lists {
            assert!(lists > 0, "lists sent: {lists}");
        } else {
            assert_eq!(lists, 0, "level {level} signing {signing}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_level_2_sender_switching_between_lists_and_signing_each_datagram_loses_nothing() {
    use ldm7_fmtp::MacSigning;
    use ldm7_fmtp_proto::mac::MacLevel;
    let multicast = loopback_group(30);
    let group = multicast.group;
    let mut options = SenderOptions::new(multicast.clone(), free_tcp_addr(), SenderConfig::with_rate(200_000_000));
    options.mac_level = MacLevel::Ed25519;
    let mut sender = FmtpSender::start(options).await.expect("sender");
    let signing = sender.signing_handle();
    assert_eq!(signing.get(), MacSigning::Lists, "lists are the default");
    let mut receiver_options = ReceiverOptions::new(multicast, sender.retx_addr());
    receiver_options.mac_level = MacLevel::Ed25519;
    receiver_options.drop_probability = 0.02;
    let receiving = tokio::spawn(collect(FmtpReceiver::start(receiver_options).expect("receiver"), 30));
    joined(&mut sender, 1).await;
    // The mode flips every eight datagrams multicast (a sniffer on the group counts them).
    let flipping = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let flipper = {
        let (flipping, signing, sniffer) = (flipping.clone(), signing.clone(), sniffer(group));
        std::thread::spawn(move || {
            let (mut seen, mut flips) = (0u64, 0u32);
            let mut buffer = [0u8; 2048];
            while flipping.load(std::sync::atomic::Ordering::Relaxed) {
                // A read times out after 50 ms: the loop then looks at `flipping` again.
                if sniffer.recv(&mut buffer).is_err() {
                    continue;
                }
                seen += 1;
                if seen % 8 == 0 {
                    signing.set(if flips % 2 == 0 { MacSigning::Datagram } else { MacSigning::Lists });
                    flips += 1;
                }
            }
            flips
        })
    };
    let products = products(30);
    send_all(&mut sender, &products).await;
    flipping.store(false, std::sync::atomic::Ordering::Relaxed);
    assert!(flipper.join().expect("flipper") > 2);
    let outcome = receiving.await.expect("receiver");
    assert!(outcome.missed.is_empty(), "{outcome:?}");
    assert_each_once(&outcome, &products);
    assert_eq!(outcome.report.driver.bad_mac, 0, "{outcome:?}");
    assert!(sender.driver_counters().digest_lists > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_datagram_is_dropped_and_counted() {
    use ldm7_fmtp_proto::mac::MacLevel;
    let multicast = loopback_group(23);
    let group = multicast.group;
    let mut options = SenderOptions::new(multicast.clone(), free_tcp_addr(), SenderConfig::with_rate(200_000_000));
    options.mac_level = MacLevel::Hmac;
    let mut sender = FmtpSender::start(options).await.expect("sender");
    let mut receiver_options = ReceiverOptions::new(multicast, sender.retx_addr());
    receiver_options.mac_level = MacLevel::Hmac;
    let mut receiver = FmtpReceiver::start(receiver_options).expect("receiver");
    let capture = sniffer(group);
    joined(&mut sender, 1).await;
    let products = products(5);
    send_all(&mut sender, &products).await;
    let mut delivered = 0;
    while delivered < products.len() {
        match tokio::time::timeout(PATIENCE, receiver.next_notice()).await.expect("in time").expect("runs") {
            ReceiverNotice::Delivered { .. } => delivered += 1,
            ReceiverNotice::Event(ReceiverEvent::Missed { .. }) => panic!("missed"),
            _ => {}
        }
    }
    // Everything the sniffer saw, sent again later: valid MACs, old products.
    let mut captured = Vec::new();
    let mut buffer = [0u8; 2048];
    while let Ok(len) = capture.recv(&mut buffer) {
        captured.push(buffer[..len].to_vec());
    }
    assert!(!captured.is_empty(), "the sniffer saw the multicast");
    let replay = forger();
    for datagram in &captured {
        replay.send_to(datagram, group).expect("replay");
    }
    // EOPs of products completed from their blocks are usual duplicates; BOPs and blocks of
    // finished products are stale.
    let replayed = captured.iter().filter(|datagram| datagram[10..12] != [0, 2]).count() as u64;
    wait_for("the replays to be counted", || receiver.counters().stale >= replayed).await;
    let extra = tokio::time::timeout(Duration::from_millis(300), receiver.next_notice()).await;
    assert!(
        !matches!(extra, Ok(Some(ReceiverNotice::Delivered { .. }))),
        "a replay delivered nothing again: {extra:?}"
    );
    let report = receiver.finish().await.expect("ran");
    assert_eq!(report.driver.bad_mac, 0, "replays carry valid MACs: {report:?}");
    assert_eq!(report.protocol.delivered, products.len() as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_of_another_mac_level_is_told_which_level_the_sender_uses() {
    use ldm7_fmtp::ReceiveError;
    use ldm7_fmtp_proto::mac::{MacError, MacLevel};
    let multicast = loopback_group(24);
    let mut options = SenderOptions::new(multicast.clone(), free_tcp_addr(), SenderConfig::with_rate(100_000_000));
    options.mac_level = MacLevel::Hmac;
    let sender = FmtpSender::start(options).await.expect("sender");
    let receiver = FmtpReceiver::start(ReceiverOptions::new(multicast, sender.retx_addr())).expect("receiver");
    let error = ended_with_error(receiver).await;
    assert!(
        matches!(
            &error,
            ReceiveError::Key {
                source: MacError::LevelMismatch { sender: MacLevel::Hmac, receiver: MacLevel::None },
                ..
            }
        ),
        "{error}"
    );
    assert!(error.to_string().contains("uses MAC level 1 (HMAC-SHA-256)"), "{error}");
}

/// Waits for a receiver to end by itself (its notices end), then returns its error.
async fn ended_with_error(mut receiver: FmtpReceiver) -> ldm7_fmtp::ReceiveError {
    while tokio::time::timeout(PATIENCE, receiver.next_notice()).await.expect("the receiver ends in time").is_some() {}
    receiver.finish().await.expect_err("the receiver failed")
}

/// A man in the middle of the repair connection: performs its own key exchange with the sender,
/// answers the receiver with a key of its own choosing, then relays the rest both ways.
async fn man_in_the_middle(sender: SocketAddr) -> SocketAddr {
    use ldm7_fmtp_proto::mac::{self, KeyOffer, MacLevel, SenderKey};
    use ldm7_fmtp_proto::wire::{Split, handshake};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    async fn blob(stream: &mut tokio::net::TcpStream) -> Vec<u8> {
        let mut buffer = Vec::new();
        loop {
            if let Ok(Split::Frame { frame, .. }) = handshake::split_blob(&buffer) {
                return frame.to_vec();
            }
            let mut chunk = [0u8; 4096];
            let n = stream.read(&mut chunk).await.expect("read");
            assert!(n > 0, "closed during the exchange");
            buffer.extend_from_slice(&chunk[..n]);
        }
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move {
        let (mut victim, _) = listener.accept().await.expect("accept");
        let offer = blob(&mut victim).await;
        let mut upstream = tokio::net::TcpStream::connect(sender).await.expect("connect");
        let own = KeyOffer::generate(&mut rand_core::OsRng).expect("key");
        let mut message = Vec::new();
        handshake::emit_blob(own.pem(), &mut message).expect("blob");
        upstream.write_all(&message).await.expect("offer");
        let _real_key = own.open(&blob(&mut upstream).await, None).expect("the sender's answer");
        let chosen = SenderKey::generate(MacLevel::Hmac, &mut rand_core::OsRng);
        let answer = mac::answer_offer(&offer, &chosen.material(), None, &mut rand_core::OsRng).expect("answer");
        let mut message = Vec::new();
        handshake::emit_blob(&answer, &mut message).expect("blob");
        if victim.write_all(&message).await.is_ok() {
            let _ = tokio::io::copy_bidirectional(&mut victim, &mut upstream).await;
        }
    });
    address
}

/// A relay to the sender's repair port that holds the sender's answer in the key exchange until
/// `release` ends: the sender takes the receiver as joined and multicasts meanwhile, so the
/// receiver reads the datagrams before it has the key to check them with.
async fn answer_holding_relay(sender: SocketAddr, release: impl std::future::Future + Send + 'static) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move {
        let (receiver, _) = listener.accept().await.expect("accept");
        let upstream = tokio::net::TcpStream::connect(sender).await.expect("connect");
        let (mut receiver_read, mut receiver_write) = receiver.into_split();
        let (mut upstream_read, mut upstream_write) = upstream.into_split();
        tokio::spawn(async move { tokio::io::copy(&mut receiver_read, &mut upstream_write).await });
        release.await;
        let _ = tokio::io::copy(&mut upstream_read, &mut receiver_write).await;
    });
    address
}

/// A relay to the sender's repair port that closes the receiver's connection as soon as `close`
/// ends (as a sender that finished, or stopped, does).
async fn closing_relay(sender: SocketAddr, close: impl std::future::Future + Send + 'static) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move {
        let (mut receiver, _) = listener.accept().await.expect("accept");
        let mut upstream = tokio::net::TcpStream::connect(sender).await.expect("connect");
        tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut receiver, &mut upstream) => return,
            _ = close => {}
        }
        // Closed in order (a FIN, not a reset): what the receiver still writes is read away.
        use tokio::io::AsyncWriteExt;
        let _ = receiver.shutdown().await;
        let _ = tokio::io::copy(&mut receiver, &mut tokio::io::sink()).await;
    });
    address
}

/// A relay between a receiver and its sender's retransmission address that counts the reads of
/// what the receiver writes (its segments, when the relay keeps up).
async fn counting_relay(sender: SocketAddr) -> (SocketAddr, Arc<AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let reads = Arc::new(AtomicUsize::new(0));
    let counted = reads.clone();
    tokio::spawn(async move {
        let (receiver, _) = listener.accept().await.expect("accept");
        let upstream = tokio::net::TcpStream::connect(sender).await.expect("connect");
        receiver.set_nodelay(true).expect("nodelay");
        upstream.set_nodelay(true).expect("nodelay");
        let ((mut from_receiver, mut to_receiver), (mut from_sender, mut to_sender)) =
            (receiver.into_split(), upstream.into_split());
        tokio::spawn(async move { tokio::io::copy(&mut from_sender, &mut to_receiver).await });
        let mut buffer = vec![0u8; 65_536];
        while let Ok(read) = from_receiver.read(&mut buffer).await {
            if read == 0 || to_sender.write_all(&buffer[..read]).await.is_err() {
                break;
            }
            counted.fetch_add(1, Ordering::SeqCst);
        }
    });
    (address, reads)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ends_of_products_close_together_go_to_the_sender_together() {
    let multicast = loopback_group(32);
    let options = SenderOptions::new(multicast.clone(), free_tcp_addr(), SenderConfig::with_rate(400_000_000));
    let mut sender = FmtpSender::start(options).await.expect("sender");
    let (relay, reads) = counting_relay(sender.retx_addr()).await;
    let products = same_size_products(20, 5_000, 7);
    let receiver = FmtpReceiver::start(ReceiverOptions::new(multicast, relay)).expect("receiver");
    let receiving = tokio::spawn(collect(receiver, products.len()));
    joined(&mut sender, 1).await;
    let before = reads.load(Ordering::SeqCst);
    // A product every 5 ms: each RETX_END alone would be 20 segments, each acknowledged.
    send_all_spaced(&mut sender, &products, None, Duration::from_millis(5)).await;
    let outcome = receiving.await.expect("receiver");
    assert_each_once(&outcome, &products);
    let segments = reads.load(Ordering::SeqCst) - before;
    assert!(segments <= 8, "20 RETX_ENDs over about 100 ms held 50 ms each go in a few segments: {segments}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_multicast_read_before_the_sender_closed_is_taken_whole() {
    let multicast = loopback_group(31);
    let options = SenderOptions::new(multicast.clone(), free_tcp_addr(), SenderConfig::with_rate(2_000_000_000));
    let mut sender = FmtpSender::start(options).await.expect("sender");
    // The connection closes the moment the last EOP went out: the receiver may still have
    // datagrams of the last products to read.
    let (closing, close) = tokio::sync::oneshot::channel();
    let relay = closing_relay(sender.retx_addr(), close).await;
    let products = same_size_products(24, 100_000, 11);
    let receiver = FmtpReceiver::start(ReceiverOptions::new(multicast, relay)).expect("receiver");
    let receiving = tokio::spawn(collect(receiver, products.len()));
    joined(&mut sender, 1).await;
    send_all_telling(&mut sender, &products, Some(closing)).await;
    let outcome = receiving.await.expect("receiver");
    assert!(outcome.missed.is_empty(), "none is missed: {outcome:?}");
    assert_each_once(&outcome, &products);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datagrams_read_before_the_key_arrives_are_kept_whole() {
    use ldm7_fmtp_proto::mac::MacLevel;
    let multicast = loopback_group(28);
    let mut options = SenderOptions::new(multicast.clone(), free_tcp_addr(), SenderConfig::with_rate(400_000_000));
    options.mac_level = MacLevel::Hmac;
    let mut sender = FmtpSender::start(options).await.expect("sender");
    // The answer is held until every product was multicast whole (the sender sent its EOP).
    let (release, held) = tokio::sync::oneshot::channel();
    let relay = answer_holding_relay(sender.retx_addr(), held).await;
    let mut receiver_options = ReceiverOptions::new(multicast, relay);
    receiver_options.mac_level = MacLevel::Hmac;
    // Eight products of 250 kB (1,416 datagrams at once, under the 4 MiB kept): read in GRO
    // batches of many datagrams each while the answer is held.
    let products = same_size_products(8, 250_000, 13);
    let receiving = tokio::spawn(collect(FmtpReceiver::start(receiver_options).expect("receiver"), products.len()));
    joined(&mut sender, 1).await;
    send_all_telling(&mut sender, &products, Some(release)).await;
    let outcome = receiving.await.expect("receiver");
    assert_each_once(&outcome, &products);
    let driver = &outcome.report.driver;
    assert_eq!(driver.bad_mac, 0, "every datagram read before the key passes its check: {driver:?}");
    assert_eq!(outcome.retransmitted_blocks, 0, "none was lost: {outcome:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_receiver_refuses_a_key_swapped_in_the_middle_and_takes_its_publishers() {
    use ldm7_fmtp::ReceiveError;
    use ldm7_fmtp_proto::mac::{MacError, MacLevel};
    let identity = Arc::new(ed25519_dalek::SigningKey::generate(&mut rand_core::OsRng));
    let multicast = loopback_group(25);
    // The fooled receiver never finishes a product: the deadline releases them.
    let deadline = ldm7_fmtp_proto::DeadlinePolicy::Constant(Duration::from_secs(3));
    let proto = SenderConfig { deadline, ..SenderConfig::with_rate(100_000_000) };
    let mut options = SenderOptions::new(multicast.clone(), free_tcp_addr(), proto);
    options.mac_level = MacLevel::Hmac;
    options.identity = Some(identity.clone());
    let mut sender = FmtpSender::start(options).await.expect("sender");
    let receiver_options = |retx: SocketAddr, pin: Option<ed25519_dalek::VerifyingKey>| {
        let mut options = ReceiverOptions::new(multicast.clone(), retx);
        options.mac_level = MacLevel::Hmac;
        options.pin = pin;
        options
    };
    // Pinned, through the man in the middle: refused.
    let proxy = man_in_the_middle(sender.retx_addr()).await;
    let pinned = FmtpReceiver::start(receiver_options(proxy, Some(identity.verifying_key()))).expect("receiver");
    let error = ended_with_error(pinned).await;
    assert!(matches!(&error, ReceiveError::Key { source: MacError::NotPinned(_), .. }), "{error}");
    // Not pinned, through the man in the middle: the exchange is accepted (the reference's
    // weakness), and the real sender's datagrams then fail the swapped key.
    let proxy = man_in_the_middle(sender.retx_addr()).await;
    let mut fooled = FmtpReceiver::start(receiver_options(proxy, None)).expect("receiver");
    let first = tokio::time::timeout(PATIENCE, fooled.next_notice()).await.expect("in time");
    assert!(matches!(first, Some(ReceiverNotice::Connected(_))), "{first:?}");
    // Pinned, directly: the publisher's signed answer is taken and products arrive.
    let receiving = tokio::spawn(collect(
        FmtpReceiver::start(receiver_options(sender.retx_addr(), Some(identity.verifying_key()))).expect("receiver"),
        3,
    ));
    joined(&mut sender, 3).await;
    let products = products(3);
    send_all(&mut sender, &products).await;
    assert_each_once(&receiving.await.expect("receiver"), &products);
    wait_for("the swapped key to fail the sender's datagrams", || fooled.driver_counters().bad_mac > 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotating_key_reaches_every_receiver_and_no_datagram_fails_its_check() {
    use ldm7_fmtp_proto::mac::MacLevel;
    let identity = Arc::new(ed25519_dalek::SigningKey::generate(&mut rand_core::OsRng));
    for (octet, level) in [(26, MacLevel::Hmac), (27, MacLevel::Ed25519)] {
        let multicast = loopback_group(octet);
        let mut options = SenderOptions::new(multicast.clone(), free_tcp_addr(), SenderConfig::with_rate(200_000_000));
        options.mac_level = level;
        options.identity = Some(identity.clone());
        options.mac_rotation = Some(Duration::from_secs(1));
        let mut sender = FmtpSender::start(options).await.expect("sender");
        let retx = sender.retx_addr();
        let receiver_options = || {
            let mut options = ReceiverOptions::new(multicast.clone(), retx);
            options.mac_level = level;
            options.pin = Some(identity.verifying_key());
            options.drop_probability = 0.05;
            options
        };
        let products = products(60);
        let early: Vec<_> = (0..2)
            .map(|_| tokio::spawn(collect(FmtpReceiver::start(receiver_options()).expect("receiver"), 60)))
            .collect();
        joined(&mut sender, 2).await;
        // Six batches, the key rotated during or after each: the key changes several times
        // while products flow; a receiver joining after the third batch gets the key of its
        // time in the exchange.
        let mut late = None;
        for (batch, chunk) in products.chunks(10).enumerate() {
            if batch == 3 {
                late = Some(tokio::spawn(collect(FmtpReceiver::start(receiver_options()).expect("receiver"), 30)));
                joined(&mut sender, 1).await;
            }
            let rotations = sender.driver_counters().key_rotations;
            send_all(&mut sender, chunk).await;
            wait_for("a key rotation", || sender.driver_counters().key_rotations > rotations).await;
        }
        for receiving in early {
            let outcome = receiving.await.expect("receiver");
            assert!(outcome.missed.is_empty(), "level {level}: {outcome:?}");
            assert_each_once(&outcome, &products);
            let driver = &outcome.report.driver;
            assert!(driver.key_updates >= 3, "level {level}: {driver:?}");
            assert_eq!((driver.bad_mac, driver.key_updates_refused), (0, 0), "level {level}: {driver:?}");
        }
        let outcome = late.expect("started").await.expect("receiver");
        assert!(outcome.missed.is_empty(), "level {level}: {outcome:?}");
        assert_each_once(&outcome, &products[30..]);
        assert_eq!(outcome.report.driver.bad_mac, 0, "level {level}: {outcome:?}");
        let counters = sender.driver_counters();
        assert!(counters.key_rotations >= 3 && counters.key_switches_late == 0, "level {level}: {counters:?}");
    }
}
