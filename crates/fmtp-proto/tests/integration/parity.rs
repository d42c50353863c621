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
    let asked: Vec<(u16, u16, u16)> = net
        .requests_of(0, MessageType::ParityReq)
        .iter()
        .filter_map(|message| match message.body {
            Body::ParityReq { group, need, from } => Some((group, need, from)),
            _ => None,
        })
        .collect();
    assert_eq!(asked, [(0, 3, 0), (1, 1, 0)]);
    assert_eq!(net.nodes[0].receiver.counters().parity_blocks, 4);
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
        net.drop = random_loss(seed, rate);
        for (n, size) in sizes.iter().enumerate() {
            net.enqueue(*size, seed ^ n as u64);
        }
        net.settle(Duration::from_secs(60));
        let (delivered, missed) = net.check_accounted();
        prop_assert_eq!(delivered + missed, receivers * sizes.len());
    }
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
    // Block 5 of each product; the shard answering the second product's first request.
    net.drop = block_5_and_shard(2);
    net.enqueue(20 * 1448, 1);
    net.settle(Duration::from_secs(5));
    net.enqueue(20 * 1448, 2);
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
