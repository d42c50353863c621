//! Receivers under forged multicast: product indexes are believed only when the sender confirms
//! them ([`IndexTrust::Confirmed`], the default). Each test runs a real sender and receivers
//! over the in-memory network of `support`, with a forger injecting well-formed datagrams.

use std::time::Duration;

use crate::support::Net;
use ldm7_fmtp_proto::wire::{Body, Bop, Message, MessageType};
use ldm7_fmtp_proto::{IndexTrust, ProductIndex, ReceiverConfig, ReceiverEvent, SenderConfig, WallTime};

fn sender_config() -> SenderConfig {
    SenderConfig { queued_products_max: 100_000, ..SenderConfig::with_rate(1_000_000_000) }
}

/// A well-formed BOP of a product that does not exist.
fn forged_bop(index: u32) -> Vec<u8> {
    let bop = Bop { start_time: WallTime { secs: 1, nanos: 0 }, product_size: 1_000, metadata: &[0xee; 16] };
    Message { index: ProductIndex(index), body: Body::Bop(bop) }.to_vec().expect("emit")
}

fn started(events: &[ReceiverEvent]) -> Vec<ProductIndex> {
    events
        .iter()
        .filter_map(|event| match event {
            ReceiverEvent::Started { index } => Some(*index),
            _ => None,
        })
        .collect()
}

fn index_gaps(events: &[ReceiverEvent]) -> usize {
    events.iter().filter(|event| matches!(event, ReceiverEvent::IndexGap { .. })).count()
}

#[test]
fn the_first_index_is_confirmed_once_and_everything_arrives() {
    let mut net = Net::new(sender_config(), vec![ReceiverConfig::default(); 2]);
    let first = net.enqueue(3_000, 1);
    for seed in 2..21 {
        net.enqueue(100 + seed as usize * 997, seed);
    }
    net.settle(Duration::from_secs(10));
    assert_eq!(net.check_accounted(), (40, 0));
    for (n, node) in net.nodes.iter().enumerate() {
        let asked: Vec<ProductIndex> = net.requests_of(n, MessageType::BopReq).iter().map(|m| m.index).collect();
        assert_eq!(asked, vec![first], "one confirmation, of the first product");
        assert_eq!(node.receiver.counters().index_confirmations, 1);
        assert_eq!(node.receiver.counters().index_forged, 0);
        assert_eq!(node.events.first(), Some(&ReceiverEvent::Started { index: first }), "Started comes first");
        assert_eq!(net.requests_of(n, MessageType::RetxEnd).len(), 20, "every product ended, the first too");
    }
    assert!(net.sender.is_idle(), "every product released");
}

#[test]
fn a_forged_bop_far_ahead_is_refuted_and_every_real_product_arrives() {
    let mut net = Net::new(sender_config(), vec![ReceiverConfig::default(); 2]);
    for seed in 0..5 {
        net.enqueue(2_000, seed);
    }
    net.run_for(Duration::from_millis(50));
    let newest = net.sent.keys().map(|index| index.0).max().expect("sent");
    // Repeated, as a real product's messages are: the receivers ask the sender about it.
    for _ in 0..3 {
        for to in 0..2 {
            net.inject(to, forged_bop(newest.wrapping_add(100_000)));
        }
    }
    net.run_for(Duration::from_millis(2));
    for seed in 5..105 {
        net.enqueue(1_500 + seed as usize, seed);
    }
    net.settle(Duration::from_secs(10));
    assert_eq!(net.check_accounted(), (2 * 105, 0), "nothing lost, nothing missed");
    for node in &net.nodes {
        let counters = node.receiver.counters();
        assert_eq!((counters.index_forged, counters.index_unbelieved), (1, 3), "{counters:?}");
        assert_eq!(index_gaps(&node.events), 0);
        assert_eq!(counters.missed, 0);
    }
}

#[test]
fn a_forged_first_index_is_refuted_and_the_real_first_product_named() {
    let mut net = Net::new(sender_config(), vec![ReceiverConfig::default()]);
    net.inject(0, forged_bop(3_000_000_000));
    net.run_for(Duration::from_millis(2));
    let first = net.enqueue(5_000, 1);
    for seed in 2..51 {
        net.enqueue(700 * seed as usize, seed);
    }
    net.settle(Duration::from_secs(10));
    assert_eq!(net.check_accounted(), (50, 0));
    let node = &net.nodes[0];
    assert_eq!(started(&node.events), vec![first], "{:?}", &node.events[..3]);
    assert_eq!(node.events.first(), Some(&ReceiverEvent::Started { index: first }));
    let counters = node.receiver.counters();
    assert_eq!(counters.index_forged, 1, "{counters:?}");
    assert_eq!(counters.started, counters.delivered, "the forged product is not counted as started: {counters:?}");
}

#[test]
fn twenty_thousand_forged_bops_leave_delivery_intact() {
    let mut net = Net::new(sender_config(), vec![ReceiverConfig::default(); 2]);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut forged_index = || {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (state >> 32) as u32
    };
    let mut peak_in_flight = 0;
    for seed in 0..100 {
        net.enqueue(1_000 + 37 * seed as usize, seed);
        for _ in 0..200 {
            let forged = forged_bop(forged_index());
            for to in 0..2 {
                net.inject(to, forged.clone());
            }
        }
        net.run_for(Duration::from_micros(500));
        peak_in_flight =
            peak_in_flight.max(net.nodes.iter().map(|n| n.receiver.in_flight_products()).max().unwrap_or(0));
    }
    net.settle(Duration::from_secs(30));
    assert_eq!(net.check_accounted(), (200, 0), "every real product delivered");
    // The real products of the first round trip (their messages came before the sender confirmed
    // the first real index) are requested together; forged ones are never held.
    assert!(peak_in_flight <= 30, "forged products never pile up: {peak_in_flight} in flight");
    for node in &net.nodes {
        let counters = node.receiver.counters();
        assert_eq!(counters.missed, 0, "{counters:?}");
        assert_eq!(index_gaps(&node.events), 0);
        assert!(counters.index_unbelieved >= 19_900, "every forged BOP dropped: {counters:?}");
        assert!(counters.duplicates < 1_000, "forged BOPs are not duplicates: {counters:?}");
        assert!(counters.index_forged >= 1, "{counters:?}");
        assert!(
            counters.index_confirmations <= counters.index_forged + 2,
            "forged BOPs seen once are not asked about: {counters:?}"
        );
    }
}

#[test]
fn a_real_jump_beyond_the_window_is_confirmed_and_the_skipped_products_requested() {
    let config = ReceiverConfig { index_trust: IndexTrust::Confirmed { window: 10 }, ..ReceiverConfig::default() };
    let mut net = Net::new(sender_config(), vec![config]);
    let first = net.enqueue(1_000, 0);
    net.run_for(Duration::from_millis(50));
    // The receiver's multicast path is down for 40 products.
    let outage = first.0 + 1..=first.0 + 40;
    net.drop = Box::new(move |_, message: &Message<'_>| outage.contains(&message.index.0));
    for seed in 1..61 {
        net.enqueue(1_000 + seed as usize, seed);
    }
    net.settle(Duration::from_secs(10));
    assert_eq!(net.check_accounted(), (61, 0), "the skipped products were requested and repaired");
    let counters = net.nodes[0].receiver.counters();
    assert_eq!((counters.index_confirmations, counters.index_forged), (2, 0), "{counters:?}");
    assert_eq!(index_gaps(&net.nodes[0].events), 0);
}

#[test]
fn a_forger_flooding_before_and_during_the_transfer_costs_no_product() {
    for (stream_delay_us, seed) in [(50u64, 1u64), (50, 2), (500, 3), (5_000, 4), (50, 5), (200, 6)] {
        let mut net = Net::new(sender_config(), vec![ReceiverConfig::default(); 2]);
        net.multicast_delay = Duration::from_micros(20);
        for node in &mut net.nodes {
            node.stream_delay = Duration::from_micros(stream_delay_us);
        }
        let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut random = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u32
        };
        let mut forge = |net: &mut Net| {
            let mut batch = vec![forged_bop(100_000), forged_bop(100_000), forged_bop(100_000)];
            batch.extend((0..40).map(|_| forged_bop(random())));
            for datagram in batch {
                for to in 0..2 {
                    net.inject(to, datagram.clone());
                }
            }
        };
        for _ in 0..5 {
            forge(&mut net);
            net.run_for(Duration::from_micros(300));
        }
        for product in 0..100u64 {
            net.enqueue(1 + (product as usize * 7_919) % 30_000, product);
            forge(&mut net);
            net.run_for(Duration::from_micros(300));
        }
        for _ in 0..200 {
            forge(&mut net);
            net.run_for(Duration::from_micros(300));
        }
        net.settle(Duration::from_secs(30));
        let counters: Vec<String> = net.nodes.iter().map(|n| format!("{:?}", n.receiver.counters())).collect();
        let accounted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| net.check_accounted()));
        assert!(
            matches!(accounted, Ok((200, 0))),
            "stream delay {stream_delay_us} µs, seed {seed}: {accounted:?}\n{}",
            counters.join("\n")
        );
    }
}
