//! Named FMTP scenarios on the simulator. Every run ends with the simulator's own checks: each
//! product delivered once with the right MD5 and fingerprint, or reported missed, never
//! silently lost; sender and receivers at rest. `LDM7_SEED=n` replays a failing seed. The
//! last two run parity repair (the ldm7 extension, docs/parity.md).

use std::time::Duration;

use ldm7_fmtp_proto::wire::{Body, MessageType};
use ldm7_fmtp_proto::{DeadlinePolicy, Instant, SenderConfig};
use ldm7_sim::{
    ContentMode, LossModel, ReceiverSpec, Report, Reset, SimConfig, Simulation, Stall, Workload, seed_from_env,
};

const MS: Duration = Duration::from_millis(1);
const BLOCK: u32 = 1448;

fn rtt30() -> ReceiverSpec {
    ReceiverSpec::with_rtt(30 * MS)
}

fn run(config: SimConfig, workload: Workload) -> Report {
    let seed = config.seed;
    match Simulation::new(config, workload).expect("valid configuration").run() {
        Ok(report) => report,
        Err(failure) => panic!("{failure} (seed {seed})"),
    }
}

fn run_with_drops(config: SimConfig, workload: Workload, filter: ldm7_sim::DropFilter) -> Report {
    let seed = config.seed;
    let simulation = Simulation::new(config, workload).expect("valid configuration").with_drop_filter(filter);
    match simulation.run() {
        Ok(report) => report,
        Err(failure) => panic!("{failure} (seed {seed})"),
    }
}

/// Every receiver got every product (workload and sentinel) and nothing was missed.
fn assert_all_delivered(report: &Report, products: u64) {
    assert_eq!(report.products, products + 1, "{report}");
    for (n, receiver) in report.receivers.iter().enumerate() {
        assert_eq!(receiver.tally.delivered, products + 1, "receiver {n}: {report}");
        assert_eq!(receiver.tally.missed, 0, "receiver {n}: {report}");
    }
}

/// Five products of 20 blocks and a bit, 50 ms apart; receiver 0 loses what `drop` says of
/// product index 2, receiver 1 loses nothing.
fn scripted(drop: impl Fn(&ldm7_fmtp_proto::wire::Message<'_>) -> bool + 'static) -> Report {
    let config = SimConfig::new(seed_from_env(11), vec![rtt30(), rtt30()]);
    let workload = Workload::uniform(5, 20 * BLOCK + 100, 50 * MS);
    let report = run_with_drops(
        config,
        workload,
        Box::new(move |receiver, message| receiver == 0 && message.index.0 == 2 && drop(message)),
    );
    assert_all_delivered(&report, 5);
    assert_eq!(report.receivers[1].tally.retransmitted_blocks, 0, "{report}");
    report
}

#[test]
fn lost_bop_is_requested_and_following_blocks_are_kept() {
    let report = scripted(|message| message.message_type() == MessageType::Bop);
    let counters = &report.receivers[0].counters;
    assert_eq!(counters.bop_requests, 1, "{counters:?}");
    // The blocks that followed the lost BOP were kept: none was retransmitted.
    assert_eq!(report.receivers[0].tally.retransmitted_blocks, 0, "{report}");
}

#[test]
fn lost_eop_alone_costs_nothing() {
    // The receiver completes a product on its last byte; the EOP is only needed when the tail
    // is lost too (next tests).
    let report = scripted(|message| message.message_type() == MessageType::Eop);
    let counters = &report.receivers[0].counters;
    assert_eq!((counters.eop_requests, counters.retx_requests), (0, 0), "{counters:?}");
    assert_eq!(report.receivers[0].tally.retransmitted_blocks, 0, "{report}");
}

#[test]
fn tail_loss_is_recovered() {
    // The last three blocks and the EOP of product 2: nothing of it follows to reveal the gap
    // before product 3's BOP, or the receive timer.
    let report = scripted(|message| match message.body {
        Body::MemData { offset, .. } => offset >= 18 * BLOCK,
        _ => message.message_type() == MessageType::Eop,
    });
    assert_eq!(report.receivers[0].tally.retransmitted_blocks, 3, "{report}");
}

#[test]
fn tail_loss_of_the_last_product_is_recovered_by_the_timer() {
    // No later product reveals the loss: only the receive timer can (the liveness sentinel
    // comes a second later, after the timer fired).
    let config = SimConfig::new(seed_from_env(12), vec![rtt30()]);
    let workload = Workload::uniform(3, 20 * BLOCK, 50 * MS);
    let report = run_with_drops(
        config,
        workload,
        Box::new(|_, message| {
            message.index.0 == 2
                && match message.body {
                    Body::MemData { offset, .. } => offset >= 15 * BLOCK,
                    _ => message.message_type() == MessageType::Eop,
                }
        }),
    );
    assert_all_delivered(&report, 3);
    assert_eq!(report.receivers[0].tally.retransmitted_blocks, 5, "{report}");
    assert_eq!(report.receivers[0].counters.eop_requests, 1, "{report}");
}

#[test]
fn whole_product_lost_is_requested_from_the_index_gap() {
    let report = scripted(|_| true);
    let counters = &report.receivers[0].counters;
    assert_eq!(counters.bop_requests, 1, "{counters:?}");
    assert_eq!(report.receivers[0].tally.retransmitted_blocks, 21, "{report}");
}

#[test]
fn request_after_the_deadline_is_rejected_and_the_product_missed() {
    // Receiver 0's TCP connection stalls for 2 s from the start; the deadline is 200 ms: its
    // request for the lost block arrives late and is rejected.
    let mut config = SimConfig::new(
        seed_from_env(13),
        vec![rtt30().stall(Stall { start: Instant::ZERO, duration: Duration::from_secs(2) }), rtt30()],
    );
    config.sender.deadline = DeadlinePolicy::Constant(200 * MS);
    let workload = Workload::uniform(3, 10 * BLOCK, 50 * MS);
    let report = run_with_drops(
        config,
        workload,
        Box::new(|receiver, message| {
            receiver == 0
                && message.index.0 == 1
                && matches!(message.body, Body::MemData { offset, .. } if offset == 4 * BLOCK)
        }),
    );
    let tally = &report.receivers[0].tally;
    assert_eq!((tally.missed, tally.missed_rejected), (1, 1), "{report}");
    assert_eq!(tally.delivered, 3, "{report}");
    assert_eq!(report.receivers[0].counters.rejects, 1, "{report}");
    assert_eq!(report.receivers[1].tally.delivered, 4, "{report}");
}

#[test]
fn slow_receiver_does_not_slow_the_others() {
    // Ten receivers at 1% loss; add an eleventh at 20% loss behind a 2 Mbit/s TCP connection
    // with a 64 KiB socket buffer. The ten see the same losses in both runs (per-receiver
    // random streams), so their latencies must not change.
    let seed = seed_from_env(14);
    let fast: Vec<ReceiverSpec> = (0..10).map(|_| rtt30().loss(LossModel::Bernoulli(0.01))).collect();
    let workload = Workload::generated(seed, 300, 1_000, 400_000, 20 * MS);
    let sender = SenderConfig::with_rate(50_000_000);
    let mut alone = SimConfig::new(seed, fast.clone());
    alone.sender = sender.clone();
    let mut with_slow = SimConfig::new(seed, {
        let mut receivers = fast;
        receivers.push(rtt30().loss(LossModel::Bernoulli(0.20)).tcp_rate(2_000_000, 64 << 10));
        receivers
    });
    with_slow.sender = sender;
    let baseline = run(alone, workload.clone());
    let report = run(with_slow, workload);
    assert_all_delivered(&baseline, 300);
    let slow = &report.receivers[10].tally;
    assert_eq!(slow.delivered + slow.missed, 301, "{report}");
    let before = baseline.latency_of(0..10);
    let after = report.latency_of(0..10);
    assert_eq!(after.count(), before.count(), "{report}");
    let (before_p99, after_p99) = (before.quantile(0.99), after.quantile(0.99));
    assert!(
        after_p99 <= before_p99.mul_f64(1.10) + 5 * MS && after.mean() <= before.mean().mul_f64(1.10) + 5 * MS,
        "the others slowed down: p99 {before_p99:?} → {after_p99:?}, mean {:?} → {:?}; slow receiver: {slow:?}",
        before.mean(),
        after.mean()
    );
    // The slow receiver really was slow.
    assert!(slow.latency.quantile(0.99) > after_p99 * 2, "{slow:?}");
}

#[test]
fn receiver_slower_than_the_deadline_gets_rejections_not_timeouts() {
    // Receiver 1 loses 20% behind a 500 kbit/s TCP connection with a 64 KiB buffer, and the
    // deadline is 1 s: it cannot be repaired in time. The repairs the sender drops at each
    // deadline are answered RETX_REJ, so its products end missed (rejected) at once, not at its
    // 600 s incomplete timeout; receiver 0 is unaffected.
    let seed = seed_from_env(21);
    let specs = vec![
        rtt30().loss(LossModel::Bernoulli(0.01)),
        rtt30().loss(LossModel::Bernoulli(0.20)).tcp_rate(500_000, 64 << 10),
    ];
    let mut config = SimConfig::new(seed, specs);
    config.sender = SenderConfig::with_rate(50_000_000);
    config.sender.deadline = DeadlinePolicy::Constant(Duration::from_secs(1));
    let workload = Workload::generated(seed, 200, 1_000, 400_000, 20 * MS);
    let report = run(config, workload);
    assert_eq!(report.receivers[0].tally.delivered, 201, "{report}");
    let slow = &report.receivers[1].tally;
    assert_eq!(slow.delivered + slow.missed, 201, "{report}");
    assert!(slow.missed_rejected > 0, "{report}");
    assert_eq!(slow.missed_other, 0, "{report}");
    assert!(report.virtual_time < Instant::ZERO + Duration::from_secs(300), "{report}");
}

#[test]
fn the_backstop_brings_every_product_fmtp_missed() {
    // The run above, with the LDM-7 backstop: the subscriber's decisions (the server's
    // `Downstream7`) ask for each product FMTP missed at the slow receiver, and each comes over
    // unicast; every product reaches both receivers, none twice.
    let seed = seed_from_env(21);
    let specs = vec![
        rtt30().loss(LossModel::Bernoulli(0.01)),
        rtt30().loss(LossModel::Bernoulli(0.20)).tcp_rate(500_000, 64 << 10),
    ];
    let mut config = SimConfig::new(seed, specs).with_backstop(10_000_000);
    config.sender = SenderConfig::with_rate(50_000_000);
    config.sender.deadline = DeadlinePolicy::Constant(Duration::from_secs(1));
    let workload = Workload::generated(seed, 200, 1_000, 400_000, 20 * MS);
    let report = run(config, workload);
    let slow = &report.receivers[1].tally;
    assert!(slow.missed > 0, "{report}");
    assert_eq!(slow.backstop, slow.missed + slow.gap_reported, "{report}");
    for (n, receiver) in report.receivers.iter().enumerate() {
        assert_eq!(receiver.tally.delivered + receiver.tally.backstop, 201, "receiver {n}: {report}");
    }
    assert_eq!(report.backstop_requests, report.backstop(), "{report}");
    assert!(report.to_string().contains("missed for good 0"), "{report}");
}

fn lossy_run(seed: u64, receivers: usize, loss: LossModel, products: usize) -> Report {
    let specs = (0..receivers).map(|_| rtt30().loss(loss).jitter(2 * MS)).collect();
    let mut config = SimConfig::new(seed, specs);
    config.content = ContentMode::Memory;
    let workload = Workload::generated(seed, products, 100, 2_000_000, 30 * MS);
    run(config, workload)
}

#[test]
fn one_percent_loss() {
    let report = lossy_run(seed_from_env(15), 4, LossModel::Bernoulli(0.01), 400);
    assert_all_delivered(&report, 400);
    assert!(report.retransmitted_blocks() > 0, "{report}");
}

#[test]
fn ten_percent_loss() {
    let report = lossy_run(seed_from_env(16), 4, LossModel::Bernoulli(0.10), 400);
    assert_all_delivered(&report, 400);
    // About a tenth of the blocks came again.
    let blocks: u64 = report.receivers.iter().map(|r| r.counters.datagrams).sum();
    let ratio = report.retransmitted_blocks() as f64 / blocks as f64;
    assert!((0.07..0.15).contains(&ratio), "retransmitted/received {ratio}: {report}");
}

#[test]
fn ten_percent_loss_in_bursts() {
    let report = lossy_run(seed_from_env(17), 4, LossModel::bursts(0.10, 8.0), 300);
    assert_all_delivered(&report, 300);
}

#[test]
fn hundred_receivers_at_one_percent_loss() {
    let seed = seed_from_env(18);
    let specs = (0..100).map(|_| rtt30().loss(LossModel::Bernoulli(0.01))).collect();
    let mut config = SimConfig::new(seed, specs);
    config.content = ContentMode::Pattern;
    let workload = Workload::generated(seed, 500, 100, 2_000_000, 30 * MS);
    let report = run(config, workload);
    assert_all_delivered(&report, 500);
    let lost: u64 = report.receivers.iter().map(|r| r.datagrams_lost).sum();
    let rate = lost as f64 / (report.multicast_datagrams * 100) as f64;
    assert!((0.008..0.012).contains(&rate), "loss rate {rate}");
}

#[test]
fn receiver_joining_mid_stream_gets_everything_from_its_first_product() {
    let seed = seed_from_env(19);
    let late = Instant::ZERO + Duration::from_millis(1_005);
    let specs = vec![rtt30().loss(LossModel::Bernoulli(0.01)), rtt30().loss(LossModel::Bernoulli(0.01)).join_at(late)];
    let config = SimConfig::new(seed, specs);
    let workload = Workload::uniform(100, 30 * BLOCK, 20 * MS);
    let report = run(config, workload);
    assert_eq!(report.receivers[0].tally.delivered, 101, "{report}");
    let joiner = &report.receivers[1];
    let first = joiner.first_contact.expect("the joiner saw datagrams").0;
    // It joined in the middle of product ~50: it gets (most of) that one onwards.
    assert!((48..=52).contains(&first), "first contact {first}");
    assert_eq!(joiner.tally.missed, 0, "{report}");
    assert_eq!(joiner.tally.delivered, 101 - u64::from(first), "{report}");
}

#[test]
fn connection_resets_lose_nothing_silently() {
    let seed = seed_from_env(20);
    let reset = |ms| Reset { at: Instant::ZERO + Duration::from_millis(ms), reconnect_after: 100 * MS };
    let specs = vec![
        rtt30().loss(LossModel::Bernoulli(0.05)).reset(reset(300)).reset(reset(900)),
        rtt30().loss(LossModel::Bernoulli(0.05)),
    ];
    let config = SimConfig::new(seed, specs);
    let workload = Workload::generated(seed, 100, 1_000, 500_000, 15 * MS);
    let report = run(config, workload);
    assert_eq!(report.receivers[1].tally.delivered, 101, "{report}");
    // While receiver 0 is disconnected the sender prunes it from the products it multicasts
    // (§3.8); those released before it reconnects are rejected and reported missed — for the
    // backstop to fetch over unicast — never silently lost.
    let tally = &report.receivers[0].tally;
    assert_eq!(tally.delivered + tally.missed, 101, "{report}");
    assert_eq!(tally.missed, tally.missed_rejected, "{report}");
    assert!(tally.missed <= 20, "{report}");
    assert_eq!(report.receivers[0].counters.malformed, 0);
}

#[test]
fn same_seed_same_run() {
    let a = lossy_run(21, 3, LossModel::bursts(0.05, 4.0), 100);
    let b = lossy_run(21, 3, LossModel::bursts(0.05, 4.0), 100);
    assert_eq!(a.to_string(), b.to_string());
    assert_eq!(a.events, b.events);
    let c = lossy_run(22, 3, LossModel::bursts(0.05, 4.0), 100);
    assert_ne!(a.events, c.events);
}

/// The receiver bound under repair pressure (issue "simulator at IDD scale": receiver 178 of
/// 570, NGRID at 1% loss and 40 Mbit/s, held 998 bytes over its 512 MiB): repairs cannot keep
/// up, receivers fill their in-flight bounds, and blocks of products whose BOP was lost keep
/// arriving. The simulator checks the bounds after every step; every product is delivered or
/// reported missed (evicted, rejected), never silently dropped. Here at a small scale, with
/// bounds to match: `cargo run --release -p ldm7-sim --example ngrid -- --receivers 570 --seed 7`
/// is the full case.
#[test]
fn receivers_stay_within_their_bounds_when_repairs_cannot_keep_up() {
    let seed = seed_from_env(23);
    let bounds = ldm7_fmtp_proto::ReceiverConfig {
        in_flight_bytes_max: 2_000_000,
        product_size_max: 1_000_000,
        early_bytes_max: 1_000_000,
        index_trust: ldm7_fmtp_proto::IndexTrust::All,
        ..ldm7_fmtp_proto::ReceiverConfig::default()
    };
    let specs = (0..20)
        .map(|_| {
            let mut spec = ReceiverSpec::with_rtt(100 * MS).loss(LossModel::Bernoulli(0.05));
            spec.config = Some(bounds.clone());
            spec
        })
        .collect();
    let mut config = SimConfig::new(seed, specs);
    config.sender = SenderConfig::with_rate(8_000_000);
    // Two products fill a receiver's bound: a third whose BOP was lost has nowhere to go.
    let workload = Workload::generated(seed, 300, 950_000, 1_000_000, 30 * MS);
    let report = run(config, workload);
    let hits: u64 = report.receivers.iter().map(|r| r.counters.bound_hits).sum();
    assert!(hits > 0, "the bounds were reached: {report}");
    for (n, receiver) in report.receivers.iter().enumerate() {
        assert_eq!(receiver.tally.delivered + receiver.tally.missed, 301, "receiver {n}: {report}");
    }
}

/// The research's online monitor (RESEARCH.md §4) in the loop: a steady 4 Mbit/s feed on a
/// 10 Mbit/s path, then a four-second burst at 64 Mbit/s. Products of the burst wait for the
/// sender, every subscriber violates, and the rate steps up each one-second interval until
/// the burst fits; after three calm intervals at a time it steps back down to the first step.
#[test]
fn the_online_monitor_raises_the_rate_under_a_burst_and_lowers_it_after() {
    use ldm7_plan::{MonitorConfig, ViolationMonitor};
    let seed = seed_from_env(24);
    let mut config = SimConfig::new(seed, (0..10).map(|_| rtt30()).collect());
    config.content = ContentMode::Pattern;
    let mut products = Vec::new();
    let mut at = Duration::ZERO;
    for (count, size, gap) in [(50, 50_000, 100 * MS), (80, 400_000, 50 * MS), (200, 50_000, 100 * MS)] {
        for _ in 0..count {
            products.push(ldm7_sim::ProductSpec { at, size });
            at += gap;
        }
    }
    let steps = vec![10e6, 20e6, 50e6, 100e6];
    let mut monitor = ViolationMonitor::new(MonitorConfig::research(steps)).expect("monitor");
    let simulation = Simulation::new(config, Workload { products }).expect("valid configuration").with_delivery_log();
    let run = ldm7_sim::control::run_with_rate_control(simulation, &mut monitor, Duration::from_secs(1))
        .unwrap_or_else(|failure| panic!("{failure} (seed {seed})"));
    let secs = |at: Instant| at.saturating_duration_since(Instant::ZERO).as_secs_f64();
    let rates: Vec<String> =
        run.rates.iter().map(|(at, rate)| format!("{:.0} s: {} Mbit/s", secs(*at), rate / 1e6)).collect();
    assert_eq!(run.rates[0].1, 10e6);
    assert_eq!(run.peak_rate_bps(), 100e6, "the burst takes the rate up: {rates:?}");
    assert_eq!(run.final_rate_bps(), 10e6, "and calm brings it back: {rates:?}");
    // Up while the burst lasts (it starts at 5 s and ends at 9 s), down only after it.
    let first_raise = secs(run.rates[1].0);
    assert!((5.0..=7.0).contains(&first_raise), "{rates:?}");
    assert!(run.rates.windows(2).all(|pair| pair[0].1 < pair[1].1 || secs(pair[1].0) >= 9.0), "{rates:?}");
    let counters = monitor.counters();
    assert_eq!((counters.raises, counters.lowers), (3, 3), "{rates:?}");
    assert_all_delivered(&run.report, 330);
}

/// Repairs over the publisher's own uplink (the issue's "repair capacity modelled apart from the
/// multicast path"): ten receivers at 5% loss share a 2 Mbit/s uplink for their repairs. Every
/// product still arrives, but repairs queue behind each other there, so the lossy receivers'
/// latency grows; without the uplink (repairs limited by the sender's pacing and each receiver's
/// path) they do not wait.
#[test]
fn repairs_share_the_publishers_uplink() {
    let seed = seed_from_env(25);
    let simulate = |uplink: Option<ldm7_sim::Uplink>| {
        let specs = (0..10).map(|_| rtt30().loss(LossModel::Bernoulli(0.05))).collect();
        let mut config = SimConfig::new(seed, specs);
        config.content = ContentMode::Pattern;
        config.repair_uplink = uplink;
        let workload = Workload::generated(seed, 200, 1_000, 200_000, 50 * MS);
        let report = run(config, workload);
        assert_all_delivered(&report, 200);
        report
    };
    let open = simulate(None);
    let narrow = simulate(Some(ldm7_sim::Uplink::repairs_only(2_000_000)));
    assert_eq!(open.repair_uplink, (0, Duration::ZERO));
    let (bytes, wait_max) = narrow.repair_uplink;
    assert!(bytes > 0 && wait_max > 10 * MS, "{narrow}");
    let latency = |report: &Report| report.latency_of(0..10).mean();
    assert!(latency(&narrow) > latency(&open), "narrow: {narrow}\nopen: {open}");
}

/// The alternative repair model: the publisher's one interface shared by the multicast and the
/// repairs as two HTB classes. At 24 Mbit/s, with the multicast paced at 20 Mbit/s (products of
/// 1–200 kB every 50 ms), the repairs of ten receivers at 5% loss get only the 4 Mbit/s the
/// multicast leaves while it sends, so they wait longer than on a 24 Mbit/s link of their own
/// (seed 26: longest wait 92 ms against 3.4 ms, mean latency 63 ms against 56 ms) — and every
/// product still arrives.
#[test]
fn repairs_get_what_the_multicast_leaves_of_a_shared_interface() {
    let seed = seed_from_env(26);
    let simulate = |uplink: ldm7_sim::Uplink| {
        let specs = (0..10).map(|_| rtt30().loss(LossModel::Bernoulli(0.05))).collect();
        let mut config = SimConfig::new(seed, specs);
        config.sender = SenderConfig::with_rate(20_000_000);
        config.content = ContentMode::Pattern;
        config.repair_uplink = Some(uplink);
        let workload = Workload::generated(seed, 300, 1_000, 200_000, 50 * MS);
        let report = run(config, workload);
        assert_all_delivered(&report, 300);
        report
    };
    let own = simulate(ldm7_sim::Uplink::repairs_only(24_000_000));
    let shared = simulate(ldm7_sim::Uplink::htb_share(24_000_000));
    let (own_bytes, own_wait) = own.repair_uplink;
    let (shared_bytes, shared_wait) = shared.repair_uplink;
    assert!(own_bytes > 0 && shared_bytes > 0);
    assert!(shared_wait > 2 * own_wait, "shared: {shared}\nown: {own}");
    let latency = |report: &Report| report.latency_of(0..10).mean();
    assert!(latency(&shared) > latency(&own), "shared: {shared}\nown: {own}");
}

/// Parity repair (the ldm7 extension) with real decoding: memory content, each delivery's MD5
/// checked; 10% loss in bursts at eight receivers (groups lose more blocks than they have
/// shards, so some fall back to RETX_REQ).
#[test]
fn parity_repair_in_memory_under_bursts() {
    let seed = seed_from_env(41);
    let specs = (0..8).map(|_| rtt30().loss(LossModel::bursts(0.10, 8.0)).jitter(2 * MS)).collect();
    let mut config = SimConfig::new(seed, specs).with_parity(64, 16);
    config.content = ContentMode::Memory;
    let workload = Workload::generated(seed, 120, 100, 2_000_000, 30 * MS);
    let report = run(config, workload);
    assert_all_delivered(&report, 120);
    let recovered: u64 = report.receivers.iter().map(|r| r.counters.parity_blocks).sum();
    assert!(recovered > 0 && report.sender.parity_datagrams > 0, "{report}");
}

/// `receivers` at 30 ms RTT and 1% independent loss, repaired by parity (groups of 256
/// blocks, 32 shards), the sender at `rate_bps`, pattern content.
fn parity_at_one_percent_loss(seed: u64, receivers: usize, rate_bps: u64) -> SimConfig {
    let specs = (0..receivers).map(|_| rtt30().loss(LossModel::Bernoulli(0.01))).collect();
    let mut config = SimConfig::new(seed, specs).with_parity(256, 32);
    config.sender = SenderConfig { parity: config.sender.parity, ..SenderConfig::with_rate(rate_bps) };
    config.content = ContentMode::Pattern;
    config
}

/// The bar (#15): at 570 subscribers and 1% independent loss, parity repair keeps the
/// publisher's egress within 1.1 × the product bytes, where unicast repairs cost about 1 + N·p;
/// every product delivered, every parity shard the sender multicasts checked against the
/// product's content.
#[test]
fn parity_keeps_egress_near_the_ingest_at_570_subscribers_and_one_percent_loss() {
    let seed = seed_from_env(42);
    let config = parity_at_one_percent_loss(seed, 570, 40_000_000);
    let workload = Workload::generated(seed, 150, 100_000, 3_000_000, 100 * MS);
    let report = run(config, workload);
    assert_all_delivered(&report, 150);
    let egress = report.egress_per_product_byte();
    assert!(egress <= 1.1, "egress {egress:.3} per product byte: {report}");
    assert!(report.sender.parity_datagrams > 0, "{report}");
}

/// Members that get a product without loss take it whole (not visited for its BOP and EOP):
/// the same receivers deliver the same products, with the same counters and latencies, as when
/// every member is handed every BOP and EOP — with unicast repairs and with parity, and with
/// receivers joining late (the ledger checks every delivery either way).
#[test]
fn taking_products_whole_changes_nothing_a_receiver_reports() {
    let seed = seed_from_env(29);
    for parity in [false, true] {
        let late = Instant::ZERO + Duration::from_millis(700);
        let specs: Vec<ReceiverSpec> = (0..60)
            .map(|n| {
                let spec = rtt30().loss(LossModel::Bernoulli(0.01));
                if n % 10 == 9 { spec.join_at(late) } else { spec }
            })
            .collect();
        // Each product coded alone: with runs (below), a request's time decides which run's
        // parity answers it, and a member taking products whole asks for a BOP it lost at
        // another time than one handed every datagram.
        let report = |whole: bool| run(whole_products_config(seed, &specs, whole, parity, false), whole_workload(seed));
        let (whole, visited) = (report(true), report(false));
        assert_eq!(visited.whole_products, 0);
        assert!(
            whole.whole_products * 10 > whole.delivered() * 3,
            "parity {parity}: {} of {} deliveries taken whole",
            whole.whole_products,
            whole.delivered()
        );
        assert_eq!(whole.missed() + visited.missed(), 0, "{whole}\n{visited}");
        for (n, (a, b)) in whole.receivers.iter().zip(&visited.receivers).enumerate() {
            let what = format!("parity {parity}, receiver {n}");
            assert_eq!(a.first_contact, b.first_contact, "{what}");
            assert_eq!(a.tally.delivered, b.tally.delivered, "{what}");
            assert_eq!(a.counters.started, b.counters.started, "{what}");
            assert_eq!(a.counters.delivered, b.counters.delivered, "{what}");
            assert_eq!(a.counters.retx_ends, b.counters.retx_ends, "{what}");
            assert_eq!(a.datagrams_lost, b.datagrams_lost, "{what}");
            assert_eq!(a.counters.datagrams, b.counters.datagrams, "{what}");
            assert_eq!(a.counters.datagram_bytes, b.counters.datagram_bytes, "{what}");
            assert_eq!(a.counters.duplicates, b.counters.duplicates, "{what}");
            let (mean_a, mean_b) = (a.tally.latency.mean().as_secs_f64(), b.tally.latency.mean().as_secs_f64());
            assert!((mean_a - mean_b).abs() <= 0.01 * mean_b, "{what}: mean latency {mean_a} vs {mean_b}");
        }
    }
}

fn whole_products_config(seed: u64, specs: &[ReceiverSpec], whole: bool, parity: bool, runs: bool) -> SimConfig {
    let mut config = SimConfig::new(seed, specs.to_vec());
    config.content = ContentMode::Pattern;
    config.whole_products = whole;
    let mut config = if parity { config.with_parity(64, 16) } else { config };
    config.sender.parity_runs = runs;
    config
}

fn whole_workload(seed: u64) -> Workload {
    Workload::generated(seed, 400, 100, 300_000, 10 * MS)
}

/// With parity runs (the default), taking products whole changes when some requests go out,
/// not what arrives: every product at every receiver either way, and about as many repairs.
#[test]
fn taking_products_whole_with_parity_runs_delivers_the_same() {
    let seed = seed_from_env(29);
    let specs: Vec<ReceiverSpec> = (0..60).map(|_| rtt30().loss(LossModel::Bernoulli(0.01))).collect();
    let report = |whole: bool| run(whole_products_config(seed, &specs, whole, true, true), whole_workload(seed));
    let (whole, visited) = (report(true), report(false));
    assert!(whole.whole_products * 10 > whole.delivered() * 3, "{whole}");
    assert_eq!((whole.missed(), visited.missed()), (0, 0), "{whole}\n{visited}");
    assert_eq!(whole.delivered(), visited.delivered());
    let (a, b) = (whole.sender.parity_datagrams as f64, visited.sender.parity_datagrams as f64);
    assert!(a > 0.0 && (a - b).abs() <= 0.05 * b, "parity datagrams {a} taking products whole, {b} visited");
    assert!(whole.sender.parity_runs_coded > 0, "{whole}");
}

/// A member taking a product whole is handed its BOP and its share of the run only when
/// something concerns it (a loss): its receive timer, set as of the BOP, must then fire between
/// the blocks that came before it and the others, not before all of them. On a slow path
/// (products of ~50 blocks at 2 Mbit/s, the receive timer due before the last blocks come
/// when none pushed it), a member would otherwise end the product's multicast early and ask
/// for every block again: at 1% independent loss no group loses more than its shards.
#[test]
fn a_member_visited_late_takes_its_blocks_before_its_timers() {
    let seed = seed_from_env(43);
    let config = parity_at_one_percent_loss(seed, 40, 2_000_000);
    let workload = Workload::generated(seed, 150, 50_000, 80_000, 300 * MS);
    let report = run(config, workload);
    assert_all_delivered(&report, 150);
    assert!(report.whole_products > 0, "{report}");
    let fallbacks: u64 = report.receivers.iter().map(|r| r.counters.parity_fallbacks).sum();
    assert_eq!(fallbacks, 0, "{report}");
    assert_eq!(report.sender.retx_requests, 0, "{report}");
}
