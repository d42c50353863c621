//! Parity repair (the ldm7 extension, `ldm7_fmtp_proto::parity`): receivers that lose blocks
//! get them back from parity shards multicast once for all of them, byte-exact; what parity
//! cannot repair falls back to RETX_REQ; and the publisher sends far fewer repair bytes than
//! with unicast repairs.

use crate::support;

use std::time::Duration;

use crate::support::{Net, trusting};
use ldm7_fmtp_proto::wire::{Body, Message, MessageType};
use ldm7_fmtp_proto::{Destination, ParityConfig, ReceiverConfig, SenderConfig};
use proptest::prelude::*;

fn parity() -> ParityConfig {
    ParityConfig { group_blocks: 64, shards: 16, retry: Duration::from_millis(40), ..ParityConfig::default() }
}

fn net(receivers: usize, with_parity: bool) -> Net {
    let sender = SenderConfig { parity: with_parity.then(parity), ..SenderConfig::with_rate(100_000_000) };
    let receiver = ReceiverConfig { parity: with_parity.then(parity), ..trusting() };
    let mut net = Net::new(sender, vec![receiver; receivers]);
    // The round trip: 5 ms of TCP one way, 1 ms of multicast the other (the drivers measure it).
    for node in &net.nodes {
        net.sender.set_rtt(node.id, Duration::from_millis(6));
    }
    net
}

/// A loss process per receiver: a seeded xorshift deciding each multicast datagram.
fn random_loss(seed: u64, rate: f64) -> support::DropFilter {
    let mut state = seed | 1;
    Box::new(move |_, _| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % 1_000_000) as f64 / 1e6 < rate
    })
}

fn repair_bytes(net: &Net) -> (u64, u64) {
    let counters = net.sender.counters();
    (counters.parity_bytes, counters.retx_bytes)
}

#[test]
fn one_shard_repairs_a_different_block_at_each_receiver() {
    let mut net = net(3, true);
    // Receiver n loses block n + 1 of the product (offsets 1448, 2896, 4344).
    net.drop = Box::new(
        |to, message| matches!(message.body, Body::MemData { offset, .. } if offset == (to as u32 + 1) * 1448),
    );
    net.enqueue(40 * 1448 + 100, 1);
    net.settle(Duration::from_secs(5));
    assert_eq!(net.check_accounted(), (3, 0));
    let counters = net.sender.counters();
    assert_eq!(counters.parity_datagrams, 1, "{counters:?}");
    assert_eq!(counters.retx_data_blocks, 0);
    for node in &net.nodes {
        assert_eq!(node.receiver.counters().parity_blocks, 1);
        assert!(net.requests_of(0, MessageType::RetxReq).is_empty());
    }
}

#[test]
fn a_group_s_losses_are_asked_for_at_once_when_its_multicast_has_passed() {
    let mut net = net(1, true);
    // Three blocks of the first group (64 blocks) lost, and one of the second.
    net.drop = Box::new(
        |_, message| matches!(message.body, Body::MemData { offset, .. } if [3, 10, 40, 70].contains(&(offset / 1448))),
    );
    net.enqueue(150 * 1448, 6);
    net.settle(Duration::from_secs(5));
    assert_eq!(net.check_accounted(), (1, 0));
    // One request per group, each for all it lost: not one per gap.
    let asked = parity_requests(&net, 0);
    assert_eq!(asked, [(0, 3, 0), (1, 1, 0)]);
    assert_eq!(net.nodes[0].receiver.counters().parity_blocks, 4);
    assert!(net.requests_of(0, MessageType::RetxReq).is_empty());
}

/// Drops block `block` of product `index` at receiver `to`, for each `(to, index, block)`.
fn blocks_of_products(lost: &'static [(usize, u32, u32)]) -> support::DropFilter {
    Box::new(move |to, message| match message.body {
        Body::MemData { offset, .. } => lost.contains(&(to, message.index.0, offset / 1448)),
        _ => false,
    })
}

/// Small products multicast one after another are coded together as a run: one shard repairs
/// a block of a different product at each receiver.
#[test]
fn small_products_multicast_together_are_repaired_by_the_shards_of_their_run() {
    let mut net = net(3, true);
    // Ten products of 5 blocks (50 blocks: within a group of 64); receiver n loses block 1 of
    // product n + 2.
    net.drop = blocks_of_products(&[(0, 2, 1), (1, 3, 1), (2, 4, 1)]);
    for seed in 0..10 {
        net.enqueue(5 * 1448 - 100, seed);
    }
    net.settle(Duration::from_secs(5));
    assert_eq!(net.check_accounted(), (30, 0));
    let counters = net.sender.counters();
    assert_eq!((counters.parity_runs_coded, counters.parity_datagrams), (1, 1), "{counters:?}");
    assert_eq!(counters.retx_data_blocks, 0);
    for n in 0..3 {
        assert_eq!(net.nodes[n].receiver.counters().parity_blocks, 1);
        assert!(net.requests_of(n, MessageType::RetxReq).is_empty());
        let asked = net.requests_of(n, MessageType::ParityReq);
        assert!(asked.iter().all(|m| matches!(m.body, Body::ParityReq { group: 0, need: 1, from: 0 })), "{asked:?}");
    }
}

/// A receiver that lost blocks of several products of a run gets as many of the run's shards,
/// which also repair the others.
#[test]
fn the_shards_of_a_run_cover_the_receiver_that_lost_most_of_it() {
    let mut net = net(2, true);
    net.drop = blocks_of_products(&[(0, 1, 2), (0, 4, 0), (0, 7, 3), (1, 5, 0)]);
    for seed in 0..10 {
        net.enqueue(6 * 1448, seed);
    }
    net.settle(Duration::from_secs(5));
    assert_eq!(net.check_accounted(), (20, 0));
    let counters = net.sender.counters();
    assert_eq!((counters.parity_runs_coded, counters.parity_datagrams), (1, 3), "{counters:?}");
    assert_eq!(net.nodes[0].receiver.counters().parity_blocks, 3);
    assert_eq!(net.nodes[1].receiver.counters().parity_blocks, 1);
    assert_eq!(counters.retx_data_blocks, 0);
}

/// A receiver that learnt the run from a shard asks for the run's parity when one is lost.
#[test]
fn a_lost_shard_of_a_run_is_asked_for_by_the_run() {
    let mut net = net(1, true);
    let mut parity_seen = 0;
    net.drop = Box::new(move |_, message| match message.body {
        Body::MemData { offset, .. } => [1, 3].contains(&message.index.0) && offset == 1448,
        Body::Parity { .. } => {
            parity_seen += 1;
            parity_seen == 1
        }
        _ => false,
    });
    for seed in 0..6 {
        net.enqueue(4 * 1448, seed);
    }
    net.settle(Duration::from_secs(5));
    assert_eq!(net.check_accounted(), (6, 0));
    let asked = parity_requests(&net, 0);
    // Each product's own request, then the run's: one more shard, from index 2 (shard 1 held).
    assert_eq!(asked, [(0, 1, 0), (0, 1, 0), (ldm7_fmtp_proto::parity::RUN_MARK, 1, 2)]);
    assert_eq!(net.nodes[0].receiver.counters().parity_blocks, 2);
    assert!(net.requests_of(0, MessageType::RetxReq).is_empty());
}

/// Drops block 5 of every product and the `nth` parity shard multicast (from 1).
fn block_5_and_shard(nth: u32) -> support::DropFilter {
    let mut parity_seen = 0;
    Box::new(move |_, message| match message.body {
        Body::MemData { offset, .. } => offset == 5 * 1448,
        Body::Parity { .. } => {
            parity_seen += 1;
            parity_seen == nth
        }
        _ => false,
    })
}

#[test]
fn lost_parity_is_asked_for_again() {
    let mut net = net(1, true);
    net.drop = block_5_and_shard(1);
    net.enqueue(20 * 1448, 2);
    net.settle(Duration::from_secs(5));
    assert_eq!(net.check_accounted(), (1, 0));
    assert_eq!(net.requests_of(0, MessageType::ParityReq).len(), 2);
    assert_eq!(net.sender.counters().parity_datagrams, 2);
}

#[test]
fn more_losses_than_shards_fall_back_to_retx_req() {
    let mut net = net(2, true);
    // Receiver 0 loses 20 blocks of the first group (more than its 16 shards); receiver 1 one.
    net.drop = Box::new(|to, message| match message.body {
        Body::MemData { offset, .. } => {
            let block = offset / 1448;
            if to == 0 { (10..30).contains(&block) } else { block == 3 }
        }
        _ => false,
    });
    net.enqueue(100 * 1448, 3);
    net.settle(Duration::from_secs(5));
    assert_eq!(net.check_accounted(), (2, 0));
    assert_eq!(net.nodes[0].receiver.counters().parity_fallbacks, 1);
    assert!(!net.requests_of(0, MessageType::RetxReq).is_empty());
    assert!(net.requests_of(1, MessageType::RetxReq).is_empty());
    assert_eq!(net.nodes[1].receiver.counters().parity_blocks, 1);
}

#[test]
fn a_receiver_without_the_extension_ignores_parity_and_uses_retx_req() {
    let sender = SenderConfig { parity: Some(parity()), ..SenderConfig::with_rate(100_000_000) };
    let with = ReceiverConfig { parity: Some(parity()), ..trusting() };
    let mut net = Net::new(sender, vec![with, trusting()]);
    net.drop = Box::new(|_, message| matches!(message.body, Body::MemData { offset, .. } if offset == 1448 * 7));
    net.enqueue(30 * 1448, 4);
    net.settle(Duration::from_secs(5));
    assert_eq!(net.check_accounted(), (2, 0));
    assert_eq!(net.nodes[1].receiver.counters().unexpected, 1, "the parity datagram");
    assert_eq!(net.requests_of(1, MessageType::RetxReq).len(), 1);
    assert_eq!(net.nodes[0].receiver.counters().parity_blocks, 1);
}

#[test]
fn a_shard_coded_otherwise_is_ignored() {
    let other = ParityConfig { shards: 32, ..parity() };
    let sender = SenderConfig { parity: Some(other), ..SenderConfig::with_rate(100_000_000) };
    let mut net = Net::new(sender, vec![ReceiverConfig { parity: Some(parity()), ..trusting() }]);
    net.drop = Box::new(|_, message| matches!(message.body, Body::MemData { offset, .. } if offset == 1448 * 2));
    net.enqueue(10 * 1448, 5);
    net.settle(Duration::from_secs(5));
    // Delivered after all, by RETX_REQ once the parity requests ran out.
    assert_eq!(net.check_accounted(), (1, 0));
    let counters = net.nodes[0].receiver.counters();
    assert!(counters.parity_mismatched >= 1, "{counters:?}");
    assert_eq!(counters.parity_fallbacks, 1);
}

#[test]
fn a_parity_request_for_a_released_product_is_rejected() {
    let mut net = net(1, true);
    net.enqueue(3 * 1448, 6);
    net.settle(Duration::from_secs(2));
    assert_eq!(net.check_accounted(), (1, 0));
    let request =
        Message { index: ldm7_fmtp_proto::ProductIndex(0), body: Body::ParityReq { group: 0, need: 1, from: 0 } };
    let id = net.nodes[0].id;
    net.sender.handle_stream(net.now, id, &request);
    let mut buf = Vec::new();
    let transmit = net.sender.poll_transmit(net.now, &mut buf).expect("an answer");
    assert_eq!((transmit.destination, transmit.message_type), (Destination::Receiver(id), MessageType::RetxRej));
}

#[test]
fn wire_round_trip() {
    for body in [
        Body::Parity { group: 513, group_blocks_log2: 8, shards_log2: 5, shard: 31, data: &[7; 1448] },
        Body::ParityReq { group: 65_535, need: 12, from: 3 },
    ] {
        let message = Message { index: ldm7_fmtp_proto::ProductIndex(9), body };
        let bytes = message.to_vec().unwrap();
        assert_eq!(Message::parse(&bytes).unwrap(), message);
    }
    // A PARITY_REQ is a bare header, as a RETX_REQ.
    let request =
        Message { index: ldm7_fmtp_proto::ProductIndex(1), body: Body::ParityReq { group: 2, need: 3, from: 4 } };
    assert_eq!(request.to_vec().unwrap(), [0, 0, 0, 1, 0, 2, 0, 3, 0, 4, 0x20, 0]);
}

/// At 20 receivers and 2% independent loss, parity repair sends a small fraction of the
/// repair bytes unicast repair does, and both deliver every product byte-exact.
#[test]
fn parity_sends_far_fewer_repair_bytes_than_unicast() {
    let sizes = [300_000usize, 1_000_000, 45_000, 700_000, 5_000];
    let mut repairs = Vec::new();
    for with_parity in [false, true] {
        let mut net = net(20, with_parity);
        net.drop = random_loss(77, 0.02);
        for (seed, size) in sizes.iter().enumerate() {
            net.enqueue(*size, seed as u64);
        }
        net.settle(Duration::from_secs(30));
        assert_eq!(net.check_accounted(), (20 * sizes.len(), 0));
        let (parity_bytes, retx_bytes) = repair_bytes(&net);
        repairs.push(parity_bytes + retx_bytes);
    }
    let total: usize = sizes.iter().sum();
    let (unicast, parity) = (repairs[0] as f64 / total as f64, repairs[1] as f64 / total as f64);
    // Unicast: about N·p = 0.4 of the product bytes; parity: the largest loss count per group.
    assert!(unicast > 0.3, "unicast repairs {unicast:.3} of the bytes");
    eprintln!("repair bytes per product byte: unicast {unicast:.3}, parity {parity:.3}");
    assert!(parity < unicast / 3.0, "parity repairs {parity:.3} of the bytes, unicast {unicast:.3}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Whatever is lost (data, BOP, EOP, parity), every product ends delivered byte-exact at
    /// every receiver, or reported missed: never silently lost, never corrupted.
    #[test]
    fn any_loss_ends_delivered_or_missed(seed in any::<u64>(), rate in 0.0f64..0.2, receivers in 1usize..5,
                                         sizes in proptest::collection::vec(1usize..300_000, 1..5)) {
        let mut net = net(receivers, true);
        let mut inner = random_loss(seed, rate);
        let last = sizes.len() as u32 - 1;
        net.drop = Box::new(move |to, m| m.index.0 != 0 && m.index.0 != last && inner(to, m));
        for (n, size) in sizes.iter().enumerate() {
            net.enqueue(*size, seed ^ n as u64);
        }
        net.settle(Duration::from_secs(60));
        let (delivered, missed) = net.check_accounted();
        prop_assert_eq!(delivered + missed, receivers * sizes.len());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// The same with many small products (coded in runs), some lost whole.
    #[test]
    fn any_loss_of_small_products_ends_delivered_or_missed(seed in any::<u64>(), rate in 0.0f64..0.2,
                                                           receivers in 1usize..5,
                                                           sizes in proptest::collection::vec(1usize..40_000, 2..24)) {
        let mut net = net(receivers, true);
        let mut inner = random_loss(seed, rate);
        let last = sizes.len() as u32 - 1;
        net.drop = Box::new(move |to, m| m.index.0 != 0 && m.index.0 != last && inner(to, m));
        for (n, size) in sizes.iter().enumerate() {
            net.enqueue(*size, seed ^ n as u64);
        }
        net.settle(Duration::from_secs(60));
        let (delivered, missed) = net.check_accounted();
        prop_assert_eq!(delivered + missed, receivers * sizes.len());
    }
}

/// Receiver `n`'s PARITY_REQs: (group, need, from).
fn parity_requests(net: &Net, n: usize) -> Vec<(u16, u16, u16)> {
    net.requests_of(n, MessageType::ParityReq)
        .iter()
        .filter_map(|message| match message.body {
            Body::ParityReq { group, need, from } => Some((group, need, from)),
            _ => None,
        })
        .collect()
}

/// The times receiver `n` sent its PARITY_REQs.
fn parity_request_times(net: &Net, n: usize) -> Vec<ldm7_fmtp_proto::Instant> {
    net.nodes[n]
        .requests
        .iter()
        .filter(|(_, m)| m.message_type() == MessageType::ParityReq)
        .map(|(at, _)| *at)
        .collect()
}

#[test]
fn a_lost_shard_is_asked_for_again_after_the_timed_round_trip_not_the_configured_wait() {
    // The configured wait (250 ms) holds until a first answer was timed: afterwards the
    // receiver asks again after about twice the time shards took to come (6 ms here).
    let slow = ParityConfig { retry: Duration::from_millis(250), ..parity() };
    let sender = SenderConfig { parity: Some(slow), ..SenderConfig::with_rate(100_000_000) };
    let receiver = ReceiverConfig { parity: Some(slow), ..trusting() };
    let mut net = Net::new(sender, vec![receiver]);
    net.sender.set_rtt(net.nodes[0].id, Duration::from_millis(6));
    // Block 5 of each product; the shard answering the second product's first request. (Of
    // 40 blocks, more than half a group: each is a group of its own. A small product's answer
    // waits for its run to close and is not timed.)
    net.drop = block_5_and_shard(2);
    net.enqueue(40 * 1448, 1);
    net.settle(Duration::from_secs(5));
    net.enqueue(40 * 1448, 2);
    net.settle(Duration::from_secs(5));
    assert_eq!(net.check_accounted(), (2, 0));
    let times = parity_request_times(&net, 0);
    assert_eq!(times.len(), 3, "one request for the first product, two for the second");
    let wait = times[2].saturating_duration_since(times[1]);
    assert!(
        wait >= ldm7_fmtp_proto::PARITY_RETRY_MIN && wait < Duration::from_millis(60),
        "asked again after {wait:?}"
    );
}

#[test]
fn parity_requests_wait_while_the_driver_holds_datagrams_then_go_when_it_caught_up() {
    let mut net = net(1, true);
    net.drop = Box::new(|_, message| matches!(message.body, Body::MemData { offset, .. } if offset == 5 * 1448));
    net.nodes[0].receiver.set_backlog(net.now, true);
    net.enqueue(20 * 1448, 1);
    net.run_for(Duration::from_millis(30));
    assert!(net.requests_of(0, MessageType::ParityReq).is_empty(), "asked while behind");
    assert!(net.nodes[0].receiver.backlog());
    let now = net.now;
    net.nodes[0].receiver.set_backlog(now, false);
    net.settle(Duration::from_secs(5));
    assert_eq!(net.check_accounted(), (1, 0));
    let times = parity_request_times(&net, 0);
    assert_eq!(times, [now], "asked once, when the driver caught up");
}

#[test]
fn a_receiver_that_stays_behind_asks_for_parity_after_the_longest_deferral() {
    let mut net = net(1, true);
    net.drop = Box::new(|_, message| matches!(message.body, Body::MemData { offset, .. } if offset == 5 * 1448));
    net.nodes[0].receiver.set_backlog(net.now, true);
    net.enqueue(20 * 1448, 1);
    // The driver says it is behind at each read, for longer than the longest deferral.
    let end = net.now + Duration::from_secs(1);
    while net.now < end && net.requests_of(0, MessageType::ParityReq).is_empty() {
        net.run_for(Duration::from_millis(5));
        let now = net.now;
        net.nodes[0].receiver.set_backlog(now, true);
    }
    let times = parity_request_times(&net, 0);
    assert_eq!(times.len(), 1, "asked while still behind");
    assert!(times[0].saturating_duration_since(ldm7_fmtp_proto::Instant::ZERO) >= ldm7_fmtp_proto::PARITY_DEFER_MAX);
    net.nodes[0].receiver.set_backlog(net.now, false);
    net.settle(Duration::from_secs(5));
    assert_eq!(net.check_accounted(), (1, 0));
}

/// A receiver that does not know the run yet asks for each product it lost blocks of; its
/// request for a second product of the run, while the shard answering its first is still on
/// its way to it (50 ms here, more than its round trip), gets one more shard, not two.
#[test]
fn a_run_s_second_product_request_counts_the_shard_answering_the_first() {
    use ldm7_fmtp_proto::{Instant, OutgoingProduct, ReceiverId, Sender};
    let mut sender =
        Sender::new(SenderConfig { parity: Some(parity()), ..SenderConfig::default() }, Instant::ZERO).expect("sender");
    let id = ReceiverId(1);
    sender.receiver_connected(Instant::ZERO, id);
    sender.set_rtt(id, Duration::from_millis(2));
    for seed in 0..4u8 {
        sender.enqueue(Instant::ZERO, OutgoingProduct::new(vec![seed; 3 * 1448], vec![seed; 16])).expect("enqueue");
    }
    let mut buf = Vec::new();
    let mut shards_sent = |sender: &mut Sender, now: Instant| {
        let mut count = 0;
        while let Some(transmit) = sender.poll_transmit(now, &mut buf) {
            count += usize::from(transmit.message_type == MessageType::Parity);
            buf.clear();
        }
        count
    };
    assert_eq!(shards_sent(&mut sender, Instant::ZERO), 0, "the products multicast, no shard");
    let ask = |sender: &mut Sender, now: Instant, index: u32| {
        let request = Message {
            index: ldm7_fmtp_proto::ProductIndex(index),
            body: Body::ParityReq { group: 0, need: 1, from: 0 },
        };
        sender.handle_stream(now, id, &request);
    };
    ask(&mut sender, Instant::ZERO + Duration::from_millis(1), 0);
    // The run closes 50 ms after its first EOP: the request is answered then.
    assert_eq!(shards_sent(&mut sender, Instant::ZERO + Duration::from_millis(10)), 0, "the run is open");
    let closed = Instant::ZERO + Duration::from_millis(60);
    assert_eq!(shards_sent(&mut sender, closed), 1);
    assert_eq!(sender.counters().parity_runs_coded, 1);
    ask(&mut sender, closed + Duration::from_millis(30), 2);
    assert_eq!(shards_sent(&mut sender, closed + Duration::from_millis(30)), 1, "one more for the second product");
    // Asked again much later (the shards were lost): both again.
    ask(&mut sender, closed + Duration::from_millis(200), 2);
    assert_eq!(shards_sent(&mut sender, closed + Duration::from_millis(200)), 2);
}

/// The delays of a network, in ms: of the data multicast, of the parity shards (on a socket of
/// their own in a driver), of TCP each way.
#[derive(Clone, Copy, Debug)]
struct Lags {
    data: u64,
    parity: u64,
    tcp: u64,
}

/// A network where the sender keeps only `retained` products for repairs, with `lags`: repairs
/// come late, or not at all (RETX_REJ for a product evicted), and the TCP messages and the
/// shards may pass the data multicast. The first and last products are never lost (no
/// receiver can know of a product lost whole before the first it sees, nor of the last until a
/// later one comes).
fn late_repairs_net(seed: u64, rate: f64, receivers: usize, lags: Lags, retained: usize, last: u32) -> Net {
    let sender = SenderConfig {
        parity: Some(parity()),
        retained_products_max: retained,
        ..SenderConfig::with_rate(100_000_000)
    };
    let receiver = ReceiverConfig { parity: Some(parity()), ..trusting() };
    let mut net = Net::new(sender, vec![receiver; receivers]);
    net.multicast_delay = Duration::from_millis(lags.data);
    net.parity_delay = Some(Duration::from_millis(lags.parity));
    for node in &mut net.nodes {
        node.stream_delay = Duration::from_millis(lags.tcp);
    }
    for node in &net.nodes {
        net.sender.set_rtt(node.id, Duration::from_millis(2 * lags.tcp + lags.data));
    }
    let mut loss = random_loss(seed, rate);
    net.drop = Box::new(move |to, message| message.index.0 != 0 && message.index.0 != last && loss(to, message));
    net
}

/// A run whose first product the sender evicted while a receiver still repaired the run
/// (found by the property below): the receiver's run requests named that product and its
/// retry timer sat on it, so when the RETX_REJ came the run's other products lost their only
/// timer and ended neither delivered nor missed.
#[test]
fn a_run_whose_product_the_sender_gave_up_still_ends_every_product() {
    let sizes = [1, 1, 2897, 1449, 1, 1, 1, 1, 1];
    let seed = 273_798_321_980_796_780;
    let lags = Lags { data: 30, parity: 30, tcp: 60 };
    let mut net = late_repairs_net(seed, 0.341_779_253_878_358_67, 3, lags, 6, sizes.len() as u32 - 1);
    for (n, size) in sizes.iter().enumerate() {
        net.enqueue(*size, seed ^ n as u64);
        net.run_for(Duration::from_millis(15));
    }
    net.settle(Duration::from_secs(60));
    let (delivered, missed) = net.check_accounted();
    assert_eq!(delivered + missed, 3 * sizes.len());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Small products (coded in runs) with repairs that come late or never, and shards that
    /// pass the data or fall behind it: every product still ends delivered or reported missed
    /// at every receiver.
    #[test]
    fn late_or_refused_repairs_of_runs_end_delivered_or_missed(seed in any::<u64>(), rate in 0.0f64..0.35,
            receivers in 1usize..5, data in 0u64..80, parity in 0u64..80, tcp in 1u64..300, retained in 2usize..30,
            gap in 0u64..20, sizes in proptest::collection::vec(1usize..40_000, 2..60)) {
        let lags = Lags { data, parity, tcp };
        let mut net = late_repairs_net(seed, rate, receivers, lags, retained, sizes.len() as u32 - 1);
        for (n, size) in sizes.iter().enumerate() {
            net.enqueue(*size, seed ^ n as u64);
            net.run_for(Duration::from_millis(gap));
        }
        net.settle(Duration::from_secs(60));
        let (delivered, missed) = net.check_accounted();
        prop_assert_eq!(delivered + missed, receivers * sizes.len());
    }
}

/// A shard lost on its way is asked for again as soon as a shard above it comes (the sender
/// multicasts an answer in ascending order of index), not after the retry wait; one lost last
/// shard still waits for the timer.
#[test]
fn a_lost_shard_is_asked_again_at_the_next_shard_not_at_the_timer() {
    for (lost_shard, early) in [(0u8, true), (1, true), (2, false)] {
        let mut net = net(1, true);
        // Three blocks of the first group lost, then shard `lost_shard` of its answer (0, 1, 2).
        let mut shards_seen = 0u32;
        net.drop = Box::new(move |_, message| match message.body {
            Body::MemData { offset, .. } => [3, 10, 40].contains(&(offset / 1448)),
            Body::Parity { shard, .. } if shard == lost_shard && shards_seen == 0 => {
                shards_seen += 1;
                true
            }
            _ => false,
        });
        net.enqueue(60 * 1448, 8);
        net.settle(Duration::from_secs(5));
        assert_eq!(net.check_accounted(), (1, 0), "shard {lost_shard}");
        let asked = parity_requests(&net, 0);
        assert_eq!(asked.len(), 2, "shard {lost_shard}: {asked:?}");
        assert_eq!(asked[0], (0, 3, 0));
        let times = parity_request_times(&net, 0);
        let between = times[1].saturating_duration_since(times[0]);
        let counters = net.nodes[0].receiver.counters();
        if early {
            // At the next shard: well within the retry wait (40 ms here).
            assert!(between < Duration::from_millis(20), "shard {lost_shard}: asked again after {between:?}");
            assert_eq!(counters.parity_gap_requests, 1);
            // From above the shard that showed the gap, for the one still missing (the other
            // shards of the answer may still be on their way: the sender counts them).
            assert_eq!(asked[1].2, u16::from(lost_shard) + 2);
        } else {
            assert!(between >= Duration::from_millis(30), "shard {lost_shard}: asked again after {between:?}");
            assert_eq!(counters.parity_gap_requests, 0);
        }
        assert_eq!(counters.parity_blocks, 3);
        assert_eq!(counters.parity_fallbacks, 0);
        // Every shard multicast once: the early request took none on its way.
        assert_eq!(net.sender.counters().parity_datagrams, 4, "shard {lost_shard}");
    }
}
