//! Sender and receivers driven together in memory (see `support`): loss scenarios, deadlines,
//! duplicates, index wrap-around, pacing accuracy, bounds, and property tests over random drop
//! patterns (every product delivered byte-exact or reported missed, never silently lost).

use crate::support;

use std::time::Duration;

use crate::support::{Net, block, drop_exact};
use ldm7_fmtp_proto::sender::TAIL_PROBE_DEFAULT;
use ldm7_fmtp_proto::wire::{Body, Message, MessageType};
use ldm7_fmtp_proto::{
    Assembly, Completion, CompletionOutcome, DataUnavailable, DeadlinePolicy, Destination, EnqueueRefusal, Instant,
    MissReason, OutgoingProduct, PROBED_SENDER_SLACK, Pacing, ProductData, ProductIndex, ReceiveTimer, ReceiverBound,
    ReceiverConfig, ReceiverEvent, ReceiverId, ReleaseReason, Sender, SenderBound, SenderConfig, SenderEvent,
    block_fingerprint,
};
use proptest::prelude::*;

const SECOND: Duration = Duration::from_secs(1);

fn sender_config() -> SenderConfig {
    SenderConfig::with_rate(100_000_000)
}

fn receivers(n: usize) -> Vec<ReceiverConfig> {
    vec![support::trusting(); n]
}

fn released(net: &Net, index: u32) -> Option<(ReleaseReason, Vec<ReceiverId>)> {
    net.sender_events.iter().find_map(|event| match event {
        SenderEvent::Released { index: i, reason, unfinished } if i.0 == index => Some((*reason, unfinished.clone())),
        _ => None,
    })
}

#[test]
fn no_loss_delivers_everything_without_requests() {
    let mut net = Net::new(sender_config(), receivers(3));
    let sizes = [0, 1, 1447, 1448, 1449, 100_000, 5];
    for (seed, size) in sizes.iter().enumerate() {
        net.enqueue(*size, seed as u64);
    }
    net.settle(10 * SECOND);
    assert_eq!(net.check_accounted(), (21, 0));
    for node in &net.nodes {
        assert!(node.delivered.values().all(|d| d.retransmitted_blocks == 0));
        let counters = node.receiver.counters();
        assert_eq!((counters.retx_requests, counters.bop_requests, counters.eop_requests), (0, 0, 0));
        assert_eq!(counters.retx_ends, 7);
        assert_eq!(node.receiver.in_flight_bytes(), 0);
    }
    for index in 0..7 {
        assert_eq!(released(&net, index), Some((ReleaseReason::AllDone, vec![])));
    }
    assert_eq!(net.sender.retained_products(), 0);
    let counters = net.sender.counters();
    assert_eq!(counters.retx_messages, 0);
    // BOP + blocks + EOP per product.
    let blocks: u64 = sizes.iter().map(|s| s.div_ceil(1448) as u64).sum();
    assert_eq!(counters.multicast_datagrams, 2 * 7 + blocks);
}

#[test]
fn lost_bop_is_requested_and_following_blocks_are_kept() {
    let mut net = Net::new(sender_config(), receivers(2));
    net.drop = drop_exact(vec![(0, 1, MessageType::Bop, 0)]);
    for seed in 0..3 {
        net.enqueue(10_000, seed);
    }
    net.settle(10 * SECOND);
    assert_eq!(net.check_accounted(), (6, 0));
    let bop_requests = net.requests_of(0, MessageType::BopReq);
    assert_eq!(bop_requests, vec![Message { index: ProductIndex(1), body: Body::BopReq }]);
    // The blocks that followed the lost BOP were kept: nothing but the BOP was repaired.
    assert!(net.requests_of(0, MessageType::RetxReq).is_empty());
    assert_eq!(net.nodes[0].delivered[&ProductIndex(1)].retransmitted_blocks, 0);
    assert_eq!(net.sender.counters().retx_data_blocks, 0);
    assert!(net.nodes[1].requests.iter().all(|(_, m)| m.message_type() == MessageType::RetxEnd));
}

/// The last products of a burst lost whole: no later product reveals the gap, so the sender's
/// tail probe (RETX_EOP of the last product to whoever has not finished it) does, long before
/// their deadline; without the probe they stay unknown until then.
#[test]
fn products_lost_whole_at_the_tail_are_learnt_of_from_the_senders_probe() {
    for (probe, config) in
        [(true, ReceiverConfig::default()), (true, support::trusting()), (false, support::trusting())]
    {
        let sender = SenderConfig { tail_probe: probe.then_some(TAIL_PROBE_DEFAULT), ..sender_config() };
        let mut net = Net::new(sender, vec![config; 2]);
        // Every multicast datagram of products 3 and 4 lost at receiver 0.
        net.drop = Box::new(|to, message| to == 0 && message.index.0 >= 3 && message.message_type().is_multicast());
        for seed in 0..5 {
            net.enqueue(3 * 1448 + 100, seed);
        }
        net.settle(5 * SECOND);
        if probe {
            assert_eq!(net.check_accounted(), (10, 0), "every product at both receivers");
            assert_eq!(net.sender.counters().tail_probes, 1, "receiver 0 only");
            assert_eq!(net.nodes[0].receiver.counters().announced, 1);
            assert_eq!(net.nodes[1].receiver.counters().announced, 0);
        } else {
            assert_eq!(net.nodes[0].delivered.len(), 3, "products 3 and 4 unknown until their deadline");
            assert_eq!(net.sender.counters().tail_probes, 0);
        }
    }
}

/// The tail probe multicasts the last product's EOP again: a receiver that lost that product
/// whole asks for its BOP on seeing the EOP of a product it never heard of (as the reference's
/// receiver does, which ignores a RETX_EOP for such a product); to one that has it, the second
/// EOP changes nothing. The probe repeats while a receiver has not finished the product, three
/// times at most.
#[test]
fn the_tail_probe_multicasts_the_last_eop_again() {
    let mut net = Net::new(sender_config(), receivers(2));
    // Receiver 0 loses the BOP, block and EOP of product 2 as first multicast; the repeated EOP
    // arrives.
    let seen = std::sync::atomic::AtomicU32::new(0);
    net.drop = Box::new(move |to, message| {
        to == 0
            && message.index.0 == 2
            && message.message_type().is_multicast()
            && seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < 3
    });
    for seed in 0..3 {
        net.enqueue(100, seed);
    }
    net.settle(5 * SECOND);
    assert_eq!(net.check_accounted(), (6, 0), "every product at both receivers");
    assert!(net.sender.counters().tail_eops_multicast >= 1);
    assert_eq!(net.requests_of(0, MessageType::BopReq).len(), 1, "receiver 0 asked for product 2's BOP once");
    let kinds: Vec<MessageType> = net.nodes[1].requests.iter().map(|(_, m)| m.message_type()).collect();
    assert_eq!(kinds, vec![MessageType::RetxEnd; 3], "the repeated EOP changed nothing at receiver 1");

    // Nobody finishes the last product (its every datagram lost at receiver 0, repeats too, and
    // receiver 0's repair connection muted): three probes, then no more.
    let mut net = Net::new(sender_config(), receivers(1));
    net.drop = Box::new(|_, message| message.index.0 == 0 && message.message_type().is_multicast());
    net.nodes[0].muted = true;
    net.enqueue(100, 0);
    net.settle(10 * SECOND);
    assert_eq!(net.sender.counters().tail_eops_multicast, u64::from(ldm7_fmtp_proto::sender::TAIL_PROBES_MAX));
}

#[test]
fn lost_eop_needs_no_repair_once_the_data_is_complete() {
    let mut net = Net::new(sender_config(), receivers(1));
    net.drop = drop_exact(vec![(0, 1, MessageType::Eop, 0), (0, 2, MessageType::Eop, 0)]);
    for seed in 0..3 {
        net.enqueue(3_000, seed);
    }
    net.settle(10 * SECOND);
    assert_eq!(net.check_accounted(), (3, 0));
    let kinds: Vec<MessageType> = net.nodes[0].requests.iter().map(|(_, m)| m.message_type()).collect();
    assert_eq!(kinds, vec![MessageType::RetxEnd; 3]);
}

#[test]
fn lost_middle_blocks_are_requested_at_once_in_one_coalesced_request() {
    let mut net = Net::new(sender_config(), receivers(1));
    let lost = (2..5).map(|k| (0, 0, MessageType::MemData, block(k))).collect();
    net.drop = drop_exact(lost);
    net.enqueue(20 * 1448, 1);
    net.settle(10 * SECOND);
    assert_eq!(net.check_accounted(), (1, 0));
    let requests = net.requests_of(0, MessageType::RetxReq);
    assert_eq!(
        requests,
        vec![Message { index: ProductIndex(0), body: Body::RetxReq { offset: block(2), len: 3 * 1448 } }]
    );
    // Sent as soon as block 5 showed the hole, long before the EOP.
    let (asked_at, _) = net.nodes[0].requests[0];
    assert!(asked_at < Instant::from_nanos(5_000_000), "asked at {asked_at}");
    assert_eq!(net.nodes[0].delivered[&ProductIndex(0)].retransmitted_blocks, 3);
    assert_eq!(net.sender.counters().retx_data_blocks, 3);
}

#[test]
fn reference_style_requests_are_one_per_block_and_served() {
    let config = ReceiverConfig { request_len_max: 1448, ..support::trusting() };
    let mut net = Net::new(sender_config(), vec![config]);
    let lost = [2, 3, 4, 9].iter().map(|k| (0, 0, MessageType::MemData, block(*k))).collect();
    net.drop = drop_exact(lost);
    net.enqueue(10 * 1448 + 100, 1);
    net.settle(10 * SECOND);
    assert_eq!(net.check_accounted(), (1, 0));
    let offsets: Vec<u32> = net
        .requests_of(0, MessageType::RetxReq)
        .iter()
        .map(|m| match m.body {
            Body::RetxReq { offset, len } => {
                assert_eq!(len, 1448);
                offset
            }
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(offsets, vec![block(2), block(3), block(4), block(9)]);
    assert_eq!(net.nodes[0].delivered[&ProductIndex(0)].retransmitted_blocks, 4);
}

#[test]
fn lost_tail_of_a_product_is_requested_when_the_next_product_starts() {
    let mut net = Net::new(sender_config(), receivers(1));
    net.drop = drop_exact(vec![
        (0, 0, MessageType::MemData, block(8)),
        (0, 0, MessageType::MemData, block(9)),
        (0, 0, MessageType::Eop, 0),
    ]);
    net.enqueue(10 * 1448, 1);
    net.enqueue(100, 2);
    net.settle(10 * SECOND);
    assert_eq!(net.check_accounted(), (2, 0));
    let requests = net.requests_of(0, MessageType::RetxReq);
    assert_eq!(
        requests,
        vec![Message { index: ProductIndex(0), body: Body::RetxReq { offset: block(8), len: 2 * 1448 } }]
    );
    assert!(net.requests_of(0, MessageType::EopReq).is_empty(), "the next BOP ended product 0, no timer needed");
}

#[test]
fn lost_tail_of_the_last_product_is_recovered_by_the_receive_timer() {
    let mut net = Net::new(sender_config(), receivers(1));
    net.drop = drop_exact(vec![
        (0, 0, MessageType::MemData, block(3)),
        (0, 0, MessageType::MemData, block(4)),
        (0, 0, MessageType::Eop, 0),
    ]);
    net.enqueue(5 * 1448 - 10, 1);
    net.settle(10 * SECOND);
    assert_eq!(net.check_accounted(), (1, 0));
    let requests = &net.nodes[0].requests;
    let kinds: Vec<MessageType> = requests.iter().map(|(_, m)| m.message_type()).collect();
    assert_eq!(kinds, vec![MessageType::RetxReq, MessageType::EopReq, MessageType::RetxEnd]);
    assert_eq!(requests[0].1.body, Body::RetxReq { offset: block(3), len: 2 * 1448 - 10 });
    // The timer: 100 ms slack after the last multicast block (~1 ms), nothing left expected.
    let asked_at = requests[0].0;
    assert!(asked_at >= Instant::from_nanos(100_000_000) && asked_at < Instant::from_nanos(110_000_000), "{asked_at}");
}

#[test]
fn a_multicast_paused_mid_product_is_waited_for_with_a_probing_sender_and_asked_for_with_the_reference() {
    // The tail (blocks 3 and 4, and the EOP) comes 1 s late, as from a sender not scheduled
    // for that long. The sender's probe is off: it would be stalled too.
    let held: std::rc::Rc<std::cell::RefCell<Vec<Vec<u8>>>> = Default::default();
    let mut patient = support::trusting();
    patient.receive_timer = ReceiveTimer::for_probing_sender(100_000_000);
    let mut reference = support::trusting();
    reference.receive_timer = ReceiveTimer { rate_bits_per_s: 100_000_000, ..ReceiveTimer::default() };
    let mut net = Net::new(SenderConfig { tail_probe: None, ..sender_config() }, vec![patient, reference]);
    let holding = held.clone();
    net.drop = Box::new(move |to, message| {
        let tail = match message.body {
            Body::MemData { offset, .. } => offset >= block(3),
            Body::Eop => true,
            _ => false,
        };
        if tail && to == 0 {
            holding.borrow_mut().push(message.to_vec().expect("emit"));
        }
        tail
    });
    net.enqueue(5 * 1448 - 10, 1);
    net.run_for(Duration::from_secs(1));
    net.drop = Box::new(|_, _| false);
    for datagram in held.take() {
        net.inject(0, datagram);
    }
    net.settle(10 * SECOND);
    assert_eq!(net.check_accounted(), (2, 0));
    // The patient receiver took the late tail by multicast and asked for nothing but its end.
    let kinds: Vec<MessageType> = net.nodes[0].requests.iter().map(|(_, m)| m.message_type()).collect();
    assert_eq!(kinds, vec![MessageType::RetxEnd]);
    assert_eq!(net.nodes[0].delivered[&ProductIndex(0)].retransmitted_blocks, 0);
    // The reference's timer asked for the tail 100 ms after the last block.
    let requests = &net.nodes[1].requests;
    assert_eq!(requests[0].1.message_type(), MessageType::RetxReq);
    assert!(requests[0].0 < Instant::from_nanos(110_000_000), "{}", requests[0].0);
    assert!(PROBED_SENDER_SLACK > Duration::from_secs(1));
}

#[test]
fn whole_products_lost_are_requested_by_index_gap() {
    let mut net = Net::new(sender_config(), receivers(2));
    net.drop = Box::new(|to, message| to == 0 && (2..=4).contains(&message.index.0));
    for seed in 0..7 {
        net.enqueue(4_000 + seed as usize, seed);
    }
    net.settle(10 * SECOND);
    assert_eq!(net.check_accounted(), (14, 0));
    let bop_requests: Vec<u32> = net.requests_of(0, MessageType::BopReq).iter().map(|m| m.index.0).collect();
    assert_eq!(bop_requests, vec![2, 3, 4]);
    for index in 2..=4 {
        assert_eq!(net.nodes[0].delivered[&ProductIndex(index)].retransmitted_blocks, 3);
    }
}

#[test]
fn request_after_the_deadline_is_rejected_and_the_product_missed() {
    // The reference's behaviour: RETX_EOP only at release.
    let config = SenderConfig { deadline: DeadlinePolicy::Constant(SECOND), tail_probe: None, ..sender_config() };
    let mut net = Net::new(config, receivers(2));
    net.nodes[0].stream_delay = 2 * SECOND;
    net.drop = drop_exact(vec![(0, 0, MessageType::MemData, block(1))]);
    net.enqueue(3 * 1448, 1);
    net.settle(20 * SECOND);
    assert_eq!(net.check_accounted(), (1, 1));
    assert_eq!(net.nodes[0].missed[&ProductIndex(0)], MissReason::Rejected);
    let (reason, unfinished) = released(&net, 0).expect("released");
    assert_eq!((reason, unfinished), (ReleaseReason::DeadlinePassed, vec![net.nodes[0].id]));
    // At the deadline the unfinished receiver got RETX_EOP, then RETX_REJ for its late request.
    let to_zero: Vec<MessageType> = net
        .transmits
        .iter()
        .filter(|(_, destination, _, _)| *destination == Destination::Receiver(net.nodes[0].id))
        .map(|(_, _, message_type, _)| *message_type)
        .collect();
    assert_eq!(to_zero, vec![MessageType::RetxEop, MessageType::RetxRej]);
    assert_eq!(net.sender.counters().rejects, 1);
    assert_eq!(net.nodes[0].receiver.counters().rejects, 1);
}

#[test]
fn repairs_dropped_at_the_deadline_are_rejected_not_left_waiting() {
    // Repairs are paced at 100 kbit/s, so receiver 0's request for 40 blocks (58 kB, 4.6 s)
    // is still queued when the 200 ms deadline passes. The sender drops the queued repairs and
    // owes the receiver a RETX_EOP; without a RETX_REJ as well, the receiver would wait for
    // them until its incomplete timeout (600 s).
    let mut config = SenderConfig { deadline: DeadlinePolicy::Constant(Duration::from_millis(200)), ..sender_config() };
    config.retx_pacing = Some(Pacing::new(100_000));
    let mut net = Net::new(config, receivers(2));
    net.drop = drop_exact((5..45).map(|k| (0, 0, MessageType::MemData, block(k))).collect());
    net.enqueue(50 * 1448, 1);
    net.settle(10 * SECOND);
    assert_eq!(net.check_accounted(), (1, 1));
    assert_eq!(net.nodes[0].missed[&ProductIndex(0)], MissReason::Rejected);
    assert!(net.now < Instant::ZERO + 10 * SECOND, "settled long before the incomplete timeout");
    let (reason, unfinished) = released(&net, 0).expect("released");
    assert_eq!((reason, unfinished), (ReleaseReason::DeadlinePassed, vec![net.nodes[0].id]));
}

#[test]
fn discard_assembly_delivers_the_same_fingerprint_without_bytes() {
    let discard = ReceiverConfig { assembly: Assembly::Discard, ..support::trusting() };
    let mut net = Net::new(sender_config(), vec![support::trusting(), discard]);
    // Both lose the BOP of product 1 (early blocks kept) and a middle block of product 2.
    net.drop = Box::new(|_, message| {
        (message.index.0 == 1 && message.message_type() == MessageType::Bop)
            || (message.index.0 == 2 && matches!(message.body, Body::MemData { offset, .. } if offset == block(3)))
    });
    let sizes = [0, 1, 5 * 1448 + 7, 10 * 1448];
    for (seed, size) in sizes.iter().enumerate() {
        net.enqueue(*size, seed as u64);
    }
    net.settle(10 * SECOND);
    for (index, (data, _)) in &net.sent {
        let expected = data
            .chunks(1448)
            .enumerate()
            .fold(0u64, |sum, (k, chunk)| sum.wrapping_add(block_fingerprint(block(k as u32), chunk)));
        let memory = &net.nodes[0].delivered[index];
        let discarded = &net.nodes[1].delivered[index];
        assert_eq!(memory.data, *data);
        assert!(discarded.data.is_empty());
        assert_eq!((memory.fingerprint, discarded.fingerprint), (expected, expected), "product {index}");
        assert_eq!(memory.retransmitted_blocks, discarded.retransmitted_blocks);
    }
    assert_eq!(net.nodes[1].receiver.in_flight_bytes(), 0);
    // A block moved or doubled changes the sum.
    let data = &net.sent[&ProductIndex(3)].0;
    assert_ne!(block_fingerprint(0, &data[..1448]), block_fingerprint(block(1), &data[..1448]));
}

#[test]
fn requests_for_unknown_products_are_rejected() {
    let mut sender = Sender::new(sender_config(), Instant::ZERO).unwrap();
    let id = ReceiverId(1);
    sender.receiver_connected(Instant::ZERO, id);
    for body in [Body::BopReq, Body::EopReq, Body::RetxReq { offset: 0, len: 1448 }] {
        sender.handle_stream(Instant::ZERO, id, &Message { index: ProductIndex(99), body });
    }
    // RETX_END of an unknown product needs no answer.
    sender.handle_stream(Instant::ZERO, id, &Message { index: ProductIndex(98), body: Body::RetxEnd });
    let mut buf = Vec::new();
    let mut answers = Vec::new();
    while let Some(transmit) = sender.poll_transmit(Instant::ZERO, &mut buf) {
        assert_eq!(transmit.destination, Destination::Receiver(id));
        answers.push(Message::parse(&buf).unwrap().to_vec().unwrap());
        buf.clear();
    }
    let expected = Message { index: ProductIndex(99), body: Body::RetxRej }.to_vec().unwrap();
    assert_eq!(answers, vec![expected.clone(), expected.clone(), expected]);
    // Wrong-direction messages are counted, not answered.
    sender.handle_stream(Instant::ZERO, id, &Message { index: ProductIndex(0), body: Body::Eop });
    assert_eq!(sender.counters().unexpected, 1);
    assert!(sender.handle_stream_frame(Instant::ZERO, id, &[1, 2, 3]).is_err());
    assert_eq!(sender.counters().malformed, 1);
}

#[test]
fn duplicate_datagrams_are_ignored() {
    let mut net = Net::new(sender_config(), receivers(2));
    net.duplicate = true;
    net.drop = drop_exact(vec![(0, 0, MessageType::MemData, block(1)), (1, 1, MessageType::Bop, 0)]);
    for seed in 0..4 {
        net.enqueue(5_000, seed);
    }
    net.settle(10 * SECOND);
    assert_eq!(net.check_accounted(), (8, 0));
    for node in &net.nodes {
        // A copy of a product still in flight is a duplicate; one of a product already
        // delivered is stale (a late copy or a replay): both are ignored and counted.
        let counters = node.receiver.counters();
        assert!(counters.duplicates + counters.stale >= 4 * 6, "{counters:?}");
    }
    // One request per loss even though every datagram came twice.
    assert_eq!(net.requests_of(0, MessageType::RetxReq).len(), 1);
    assert_eq!(net.requests_of(1, MessageType::BopReq).len(), 1);
}

#[test]
fn product_index_wraps_around() {
    let config = SenderConfig { first_index: ProductIndex(u32::MAX - 2), ..sender_config() };
    let mut net = Net::new(config, receivers(2));
    net.drop = Box::new(|to, message| {
        to == 0
            && (message.index.0 == u32::MAX
                || (message.index.0 == 0 && message.message_type() == MessageType::Bop)
                || (message.index.0 == 1 && matches!(message.body, Body::MemData { offset: 1448, .. })))
    });
    let indexes: Vec<u32> = (0..7).map(|seed| net.enqueue(3_000, seed).0).collect();
    assert_eq!(indexes, vec![u32::MAX - 2, u32::MAX - 1, u32::MAX, 0, 1, 2, 3]);
    net.settle(10 * SECOND);
    assert_eq!(net.check_accounted(), (14, 0));
    let bop_requests: Vec<u32> = net.requests_of(0, MessageType::BopReq).iter().map(|m| m.index.0).collect();
    assert_eq!(bop_requests, vec![u32::MAX, 0]);
    assert_eq!(net.sender.next_index(), ProductIndex(4));
}

#[test]
fn pacing_sends_the_configured_rate_within_one_percent() {
    let rate_bits_per_s = 10_000_000;
    let config = SenderConfig {
        multicast_pacing: Some(Pacing::new(rate_bits_per_s)),
        multicast_without_receivers: true,
        ..SenderConfig::default()
    };
    let mut sender = Sender::new(config, Instant::ZERO).unwrap();
    for seed in 0..3 {
        sender.enqueue(Instant::ZERO, OutgoingProduct::new(support::pattern(1_000_000, seed), [0u8; 16])).unwrap();
    }
    let (window_start, window_end) = (Instant::from_nanos(500_000_000), Instant::from_nanos(1_500_000_000));
    let mut now = Instant::ZERO;
    let mut buf = Vec::new();
    let mut bytes_in_window = 0u64;
    while now < window_end {
        while let Some(transmit) = sender.poll_transmit(now, &mut buf) {
            if now >= window_start {
                bytes_in_window += transmit.len as u64;
            }
            buf.clear();
        }
        let next = sender.poll_timeout().expect("more to send");
        assert!(next > now, "poll_timeout must move forward when nothing can be sent");
        now = next;
    }
    let expected = rate_bits_per_s / 8;
    let error = bytes_in_window.abs_diff(expected) as f64 / expected as f64;
    assert!(error < 0.01, "{bytes_in_window} bytes in one virtual second, expected {expected} (error {error:.4})");
}

#[test]
fn repairs_are_paced_on_their_own_budget() {
    let retx = Pacing::new(1_000_000);
    let config = SenderConfig { retx_pacing: Some(retx), ..sender_config() };
    let mut net = Net::new(config, receivers(1));
    // Lose everything after the BOP: 100 blocks to repair at 1 Mbit/s ≈ 1.17 s.
    net.drop = Box::new(|_, message| matches!(message.body, Body::MemData { .. } | Body::Eop));
    net.enqueue(100 * 1448, 1);
    net.settle(10 * SECOND);
    assert_eq!(net.check_accounted(), (1, 0));
    let repairs: Vec<_> = net.transmits.iter().filter(|t| t.2 == MessageType::RetxData).collect();
    assert_eq!(repairs.len(), 100);
    let span = repairs.last().unwrap().0 - repairs.first().unwrap().0;
    let bytes: u64 = repairs.iter().map(|t| t.3 as u64).sum::<u64>() - retx.bucket_bytes;
    let expected = Duration::from_secs_f64(bytes as f64 * 8.0 / 1_000_000.0);
    assert!(span.abs_diff(expected) < Duration::from_millis(15), "span {span:?}, expected {expected:?}");
}

#[test]
fn retained_products_bound_evicts_the_oldest() {
    let config = SenderConfig { retained_products_max: 2, ..sender_config() };
    let mut net = Net::new(config, receivers(1));
    net.nodes[0].muted = true;
    for seed in 0..5 {
        net.enqueue(2_000, seed);
    }
    net.run_for(SECOND);
    let bound_hits = net
        .sender_events
        .iter()
        .filter(|e| matches!(e, SenderEvent::BoundHit { bound: SenderBound::RetainedProducts, .. }))
        .count();
    assert_eq!(bound_hits, 1, "one event per episode");
    for index in 0..3 {
        assert_eq!(released(&net, index), Some((ReleaseReason::Evicted, vec![net.nodes[0].id])));
    }
    assert_eq!(net.sender.retained_products(), 2);
    assert_eq!(net.sender.counters().released_evicted, 3);
}

#[test]
fn receiver_in_flight_products_bound_abandons_the_oldest() {
    let config = ReceiverConfig { in_flight_products_max: 2, incomplete_timeout: 2 * SECOND, ..support::trusting() };
    let mut net = Net::new(sender_config(), vec![config]);
    net.nodes[0].muted = true;
    net.drop = Box::new(|_, message| message.message_type() == MessageType::Bop);
    for seed in 0..4 {
        net.enqueue(2_000, seed);
    }
    net.settle(10 * SECOND);
    assert_eq!(net.check_accounted(), (0, 4));
    let node = &net.nodes[0];
    assert_eq!(node.missed[&ProductIndex(0)], MissReason::Evicted);
    assert_eq!(node.missed[&ProductIndex(1)], MissReason::Evicted);
    assert_eq!(node.missed[&ProductIndex(2)], MissReason::TimedOut);
    let hits = node
        .events
        .iter()
        .filter(|e| matches!(e, ReceiverEvent::BoundHit { bound: ReceiverBound::InFlightProducts, .. }))
        .count();
    assert_eq!(hits, 2);
    assert_eq!(node.receiver.counters().bound_hits, 2);
    assert_eq!(node.receiver.in_flight_bytes(), 0);
}

#[test]
fn the_rate_changes_only_for_a_paced_sender_and_to_a_positive_rate() {
    let mut sender = Sender::new(SenderConfig::with_rate(10_000_000), Instant::ZERO).unwrap();
    assert!(sender.set_rate(Instant::ZERO, 0).is_err());
    sender.set_rate(Instant::ZERO + Duration::from_millis(5), 100_000_000).unwrap();
    let mut unpaced = Sender::new(SenderConfig::default(), Instant::ZERO).unwrap();
    let error = unpaced.set_rate(Instant::ZERO, 100_000_000).unwrap_err();
    assert!(error.0.contains("not paced"), "{error:?}");
}

#[test]
fn receiver_size_and_byte_bounds() {
    let small = ReceiverConfig { product_size_max: 1_000, in_flight_bytes_max: 1_000, ..support::trusting() };
    let tight = ReceiverConfig { product_size_max: 20_000, in_flight_bytes_max: 20_000, ..support::trusting() };
    let mut net = Net::new(sender_config(), vec![small, tight]);
    // Receiver 1 loses a block of product 1 and its request never arrives: product 2 needs
    // the memory and evicts it.
    net.nodes[1].muted = true;
    net.drop = drop_exact(vec![(1, 1, MessageType::MemData, 0)]);
    net.enqueue(500, 0);
    net.enqueue(15_000, 1);
    net.enqueue(15_000, 2);
    net.settle(10 * SECOND);
    assert_eq!(net.check_accounted(), (3, 3));
    assert_eq!(net.nodes[0].missed[&ProductIndex(1)], MissReason::TooLarge);
    assert_eq!(net.nodes[0].missed[&ProductIndex(2)], MissReason::TooLarge);
    assert_eq!(net.nodes[1].missed[&ProductIndex(1)], MissReason::Evicted);
    assert!(net.nodes[1].events.iter().any(|e| matches!(
        e,
        ReceiverEvent::BoundHit { bound: ReceiverBound::InFlightBytes, index: Some(ProductIndex(2)) }
    )));
    // A too-large product still sends RETX_END so the sender can release it.
    assert!(net.nodes[0].requests.iter().any(|(_, m)| *m == Message { index: ProductIndex(1), body: Body::RetxEnd }));
}

#[test]
fn early_block_bound_drops_blocks_that_are_requested_later() {
    let config = ReceiverConfig { early_bytes_max: 3_000, ..support::trusting() };
    let mut net = Net::new(sender_config(), vec![config]);
    net.drop = drop_exact(vec![(0, 0, MessageType::Bop, 0)]);
    net.enqueue(10 * 1448, 7);
    net.settle(10 * SECOND);
    assert_eq!(net.check_accounted(), (1, 0));
    // Two blocks fit the early buffer; the other eight came again after the RETX_BOP.
    assert_eq!(net.nodes[0].delivered[&ProductIndex(0)].retransmitted_blocks, 8);
    let hits: Vec<_> = net.nodes[0].events.iter().filter(|e| matches!(e, ReceiverEvent::BoundHit { .. })).collect();
    assert_eq!(hits.len(), 1, "{hits:?}");
}

#[test]
fn sender_backlog_bounds_apply_backpressure() {
    let config = SenderConfig {
        retx_pacing: Some(Pacing::new(100_000)),
        retx_backlog_bytes_max: 4_000,
        retx_backlog_items_max: 3,
        multicast_without_receivers: true,
        ..SenderConfig::default()
    };
    let now = Instant::ZERO;
    let mut sender = Sender::new(config, now).unwrap();
    let id = ReceiverId(7);
    sender.receiver_connected(now, id);
    sender.enqueue(now, OutgoingProduct::new(vec![1u8; 20 * 1448], [0u8; 16])).unwrap();
    let mut buf = Vec::new();
    while sender.poll_transmit(now, &mut buf).is_some_and(|t| t.destination == Destination::Multicast) {}
    assert!(sender.accepts_stream(id));
    let request = |offset| Message { index: ProductIndex(0), body: Body::RetxReq { offset, len: 1448 } };
    for k in [0, 1, 2, 3] {
        // Adjacent requests merge into one queued range.
        sender.handle_stream(now, id, &request(block(k)));
    }
    assert_eq!(sender.retx_backlog_bytes(id), 4 * 1448);
    assert!(!sender.accepts_stream(id));
    for k in [10, 12, 14, 16] {
        sender.handle_stream(now, id, &request(block(k)));
    }
    assert_eq!(sender.counters().requests_dropped, 2);
    let mut hits = Vec::new();
    while let Some(event) = sender.poll_event() {
        if let SenderEvent::BoundHit { bound, receiver } = event {
            hits.push((bound, receiver));
        }
    }
    assert_eq!(hits, vec![(SenderBound::RetxBacklogBytes, Some(id)), (SenderBound::RetxBacklogItems, Some(id))]);
}

#[test]
fn enqueue_refusals_hand_the_product_back() {
    let mut sender =
        Sender::new(SenderConfig { queued_products_max: 2, ..SenderConfig::default() }, Instant::ZERO).unwrap();
    let refusal = sender.enqueue(Instant::ZERO, OutgoingProduct::new(vec![1u8; 10], [0u8; 16])).unwrap_err();
    assert_eq!(refusal.reason, EnqueueRefusal::NoReceivers);
    assert_eq!(refusal.product.size(), 10);
    assert_eq!(sender.counters().products_skipped_no_receivers, 1);
    sender.receiver_connected(Instant::ZERO, ReceiverId(1));
    let long = OutgoingProduct::new(vec![1u8; 10], vec![0u8; 1431]);
    assert_eq!(sender.enqueue(Instant::ZERO, long).unwrap_err().reason, EnqueueRefusal::MetadataTooLong(1431));
    sender.enqueue(Instant::ZERO, OutgoingProduct::new(vec![1u8; 10], [0u8; 16])).unwrap();
    sender.enqueue(Instant::ZERO, OutgoingProduct::new(vec![1u8; 10], [0u8; 16])).unwrap();
    let full = sender.enqueue(Instant::ZERO, OutgoingProduct::new(vec![1u8; 10], [0u8; 16])).unwrap_err();
    assert_eq!(full.reason, EnqueueRefusal::QueueFull);
    assert_eq!(sender.queued_products(), 2);
}

#[test]
fn products_without_receivers_are_released_after_multicast_when_allowed() {
    let config = SenderConfig { multicast_without_receivers: true, ..SenderConfig::default() };
    let mut sender = Sender::new(config, Instant::ZERO).unwrap();
    let index = sender.enqueue(Instant::ZERO, OutgoingProduct::new(vec![1u8; 3000], [0u8; 16])).unwrap();
    let mut buf = Vec::new();
    let mut count = 0;
    while sender.poll_transmit(Instant::ZERO, &mut buf).is_some() {
        count += 1;
    }
    assert_eq!(count, 5, "BOP, 3 blocks, EOP");
    assert_eq!(sender.poll_event(), Some(SenderEvent::Sent { index, size: 3000 }));
    assert_eq!(
        sender.poll_event(),
        Some(SenderEvent::Released { index, reason: ReleaseReason::AllDone, unfinished: vec![] })
    );
    assert_eq!(sender.poll_timeout(), None);
}

#[test]
fn withdrawing_keeps_the_product_under_way_and_gives_the_rest_back_with_their_indexes() {
    let config = SenderConfig { multicast_without_receivers: true, ..SenderConfig::default() };
    let mut sender = Sender::new(config, Instant::ZERO).unwrap();
    for n in 0..3u8 {
        sender.enqueue(Instant::ZERO, OutgoingProduct::new(vec![n; 3000], [n; 16])).unwrap();
    }
    let mut buf = Vec::new();
    // The first product's BOP and a block: under way.
    for _ in 0..2 {
        sender.poll_transmit(Instant::ZERO, &mut buf).expect("a datagram");
    }
    assert_eq!(sender.withdraw_unsent(), 2);
    assert_eq!(sender.next_index(), ProductIndex(1), "the withdrawn products' indexes are given again");
    assert!(!sender.is_settled(), "the product under way is finished first");
    let mut count = 0;
    while sender.poll_transmit(Instant::ZERO, &mut buf).is_some() {
        count += 1;
    }
    assert_eq!(count, 3, "the first product's last 2 blocks and its EOP, nothing of the others");
    assert!(sender.is_settled());
    assert_eq!(sender.withdraw_unsent(), 0, "nothing left to withdraw");
    let index = sender.enqueue(Instant::ZERO, OutgoingProduct::new(vec![7u8; 10], [7u8; 16])).unwrap();
    assert_eq!(index, ProductIndex(1));
}

#[test]
fn receiver_joining_mid_product_recovers_it_and_holds_it() {
    let config = SenderConfig { multicast_pacing: Some(Pacing::new(10_000_000)), ..sender_config() };
    let mut net = Net::new(config, receivers(1));
    net.enqueue(200 * 1448, 1);
    net.enqueue(1000, 2);
    net.run_for(Duration::from_millis(50)); // ≈ 43 blocks multicast.
    let late = net.add_receiver(support::trusting());
    net.settle(10 * SECOND);
    assert_eq!(net.check_accounted(), (4, 0));
    assert_eq!(net.requests_of(late, MessageType::BopReq).len(), 1);
    let delivery = &net.nodes[late].delivered[&ProductIndex(0)];
    assert!(delivery.retransmitted_blocks > 30 && delivery.retransmitted_blocks < 60, "{delivery:?}");
    // The product was released only after the late receiver finished too.
    let late_end = net.nodes[late]
        .requests
        .iter()
        .find(|(_, m)| *m == Message { index: ProductIndex(0), body: Body::RetxEnd })
        .unwrap()
        .0;
    assert_eq!(released(&net, 0), Some((ReleaseReason::AllDone, vec![])));
    let release_at =
        net.transmits.iter().filter(|t| t.1 == Destination::Receiver(net.nodes[late].id)).map(|t| t.0).max().unwrap();
    assert!(release_at < late_end + Duration::from_millis(5));
}

#[test]
fn requests_lost_with_a_reset_connection_are_issued_again() {
    let mut net = Net::new(sender_config(), receivers(1));
    net.nodes[0].muted = true;
    net.drop = drop_exact(vec![(0, 0, MessageType::Bop, 0), (0, 1, MessageType::MemData, block(1))]);
    net.enqueue(3_000, 1);
    net.enqueue(3_000, 2);
    net.run_for(SECOND);
    assert_eq!(net.nodes[0].receiver.in_flight_products(), 2);
    net.nodes[0].muted = false;
    net.nodes[0].receiver.stream_reset(net.now);
    net.settle(10 * SECOND);
    assert_eq!(net.check_accounted(), (2, 0));
    assert_eq!(net.requests_of(0, MessageType::BopReq).len(), 2);
    assert_eq!(net.requests_of(0, MessageType::RetxReq).len(), 2);
}

/// Product bytes that become unreadable from a given offset on.
struct Failing {
    bytes: Vec<u8>,
    readable: u64,
}

impl ProductData for Failing {
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }
    fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<(), DataUnavailable> {
        if offset >= self.readable {
            return Err(DataUnavailable);
        }
        out.copy_from_slice(&self.bytes[offset as usize..offset as usize + out.len()]);
        Ok(())
    }
}

#[test]
fn unreadable_product_data_ends_the_product_and_it_is_missed() {
    let mut net = Net::new(sender_config(), receivers(1));
    let data = Failing { bytes: vec![3; 10 * 1448], readable: 2 * 1448 };
    net.sender.enqueue(net.now, OutgoingProduct::new(data, [0u8; 16])).unwrap();
    net.enqueue(100, 2);
    net.settle(10 * SECOND);
    assert_eq!(net.nodes[0].missed[&ProductIndex(0)], MissReason::Rejected);
    assert_eq!(released(&net, 0).map(|r| r.0), Some(ReleaseReason::DataUnavailable));
    assert!(net.nodes[0].delivered.contains_key(&ProductIndex(1)));
}

#[test]
fn proportional_deadline_uses_size_rate_and_rtt() {
    let config = SenderConfig {
        multicast_pacing: Some(Pacing::new(8_000_000)),
        deadline: DeadlinePolicy::Proportional { f_snd: 5.0, min: Duration::from_millis(10) },
        tail_probe: None,
        ..SenderConfig::default()
    };
    let now = Instant::ZERO;
    let mut sender = Sender::new(config, now).unwrap();
    sender.receiver_connected(now, ReceiverId(1));
    sender.enqueue(now, OutgoingProduct::new(vec![0u8; 1_000_000], [0u8; 16])).unwrap();
    let mut buf = Vec::new();
    let mut t = now;
    // Multicast everything (≈ 1 s at 1 MB/s).
    loop {
        while sender.poll_transmit(t, &mut buf).is_some() {
            buf.clear();
        }
        if sender.queued_products() == 0 {
            break;
        }
        t = sender.poll_timeout().unwrap();
    }
    let sent_at = t;
    assert!(sent_at > Instant::from_nanos(990_000_000) && sent_at < Instant::from_nanos(1_010_000_000));
    // Deadline: 5 × 1 MB × 8 / 8 Mbit/s = 5 s.
    assert_eq!(sender.poll_timeout(), Some(sent_at + 5 * SECOND));
    sender.set_rtt(ReceiverId(1), 7 * SECOND);
    sender.enqueue(t, OutgoingProduct::new(vec![0u8; 10], [0u8; 16])).unwrap();
    loop {
        while sender.poll_transmit(t, &mut buf).is_some() {}
        if sender.queued_products() == 0 {
            break;
        }
        t = sender.poll_timeout().unwrap();
    }
    assert!(t < sent_at + Duration::from_millis(1));
    sender.handle_timeout(sent_at + 5 * SECOND);
    let mut releases = Vec::new();
    while let Some(event) = sender.poll_event() {
        if let SenderEvent::Released { index, reason, .. } = event {
            releases.push((index, reason));
        }
    }
    assert_eq!(releases, vec![(ProductIndex(0), ReleaseReason::DeadlinePassed)]);
    // The unfinished receiver is told with RETX_EOP.
    buf.clear();
    let transmit = sender.poll_transmit(sent_at + 5 * SECOND, &mut buf).unwrap();
    assert_eq!(transmit.destination, Destination::Receiver(ReceiverId(1)));
    assert_eq!(Message::parse(&buf).unwrap(), Message { index: ProductIndex(0), body: Body::RetxEop });
    // The small product's deadline is the largest RTT, 7 s.
    assert!(sender.poll_timeout().unwrap() >= t + (7 * SECOND - Duration::from_millis(1)));
}

fn completions(net: &Net) -> Vec<Completion> {
    net.sender_events
        .iter()
        .filter_map(|event| match event {
            SenderEvent::Completed(completion) => Some(*completion),
            _ => None,
        })
        .collect()
}

#[test]
fn every_receiver_reports_each_product_once_whole_before_its_release() {
    let mut net = Net::new(sender_config(), receivers(3));
    for seed in 0..5 {
        net.enqueue(10_000, seed);
    }
    net.settle(10 * SECOND);
    assert_eq!(net.check_accounted(), (15, 0));
    let completions = completions(&net);
    assert_eq!(completions.len(), 15);
    for completion in &completions {
        assert_eq!(
            (completion.outcome, completion.repair_rounds, completion.size),
            (CompletionOutcome::Whole, 0, 10_000)
        );
    }
    for node in &net.nodes {
        let mut indexes: Vec<u32> = completions.iter().filter(|c| c.receiver == node.id).map(|c| c.index.0).collect();
        indexes.sort_unstable();
        assert_eq!(indexes, vec![0, 1, 2, 3, 4]);
    }
    // Each product's completions come before its release; the last one is what released it.
    for index in 0..5 {
        let position = |wanted: &dyn Fn(&SenderEvent) -> bool| net.sender_events.iter().rposition(wanted);
        let last_completion =
            position(&|e| matches!(e, SenderEvent::Completed(c) if c.index.0 == index)).expect("completed");
        let release =
            position(&|e| matches!(e, SenderEvent::Released { index: i, .. } if i.0 == index)).expect("released");
        assert!(last_completion < release);
    }
    let counters = net.sender.counters();
    assert_eq!((counters.completions, counters.completions_given_up), (15, 0));
}

#[test]
fn a_repaired_receiver_reports_its_repair_rounds_and_rtt() {
    let mut net = Net::new(sender_config(), receivers(2));
    // Blocks 2–4 lost at receiver 0: one coalesced request, one round.
    net.drop = drop_exact((2..5).map(|k| (0, 0, MessageType::MemData, block(k))).collect());
    let id = net.nodes[0].id;
    net.sender.set_rtt(id, Duration::from_millis(10));
    net.enqueue(20 * 1448, 1);
    net.settle(10 * SECOND);
    assert_eq!(net.check_accounted(), (2, 0));
    let completions = completions(&net);
    let repaired = completions.iter().find(|c| c.receiver == id).expect("receiver 0 completed");
    assert_eq!(
        (repaired.outcome, repaired.repair_rounds, repaired.rtt),
        (CompletionOutcome::Whole, 1, Duration::from_millis(10))
    );
    // Its RETX_END came after the repairs: at least the TCP round trip after the multicast.
    let other = completions.iter().find(|c| c.receiver != id).expect("receiver 1 completed");
    assert_eq!(other.repair_rounds, 0);
    assert!(repaired.at > other.at);
}

#[test]
fn requests_more_than_an_rtt_apart_are_separate_repair_rounds() {
    let mut sender = Sender::new(sender_config(), Instant::ZERO).unwrap();
    let id = ReceiverId(1);
    sender.receiver_connected(Instant::ZERO, id);
    let index = sender.enqueue(Instant::ZERO, OutgoingProduct::new(vec![7u8; 10 * 1448], [0u8; 16])).unwrap();
    let mut buf = Vec::new();
    let mut t = Instant::ZERO;
    loop {
        while sender.poll_transmit(t, &mut buf).is_some() {
            buf.clear();
        }
        if sender.queued_products() == 0 {
            break;
        }
        t = sender.poll_timeout().unwrap().max(t);
    }
    sender.set_rtt(id, Duration::from_millis(4));
    let request = |offset| Message { index, body: Body::RetxReq { offset, len: 1448 } };
    let ms = |n: u64| t + Duration::from_millis(n);
    // Rounds start at 0, 5 and 20 ms; 2 and 8 ms fall within a round.
    for (at, offset) in [(0, 0), (2, block(1)), (5, block(2)), (8, block(3)), (20, block(4))] {
        sender.handle_stream(ms(at), id, &request(offset));
        while sender.poll_transmit(ms(at), &mut buf).is_some() {
            buf.clear();
        }
    }
    sender.handle_stream(ms(25), id, &Message { index, body: Body::RetxEnd });
    let completed: Vec<Completion> = std::iter::from_fn(|| sender.poll_event())
        .filter_map(|event| match event {
            SenderEvent::Completed(completion) => Some(completion),
            _ => None,
        })
        .collect();
    assert_eq!(completed.len(), 1);
    assert_eq!((completed[0].repair_rounds, completed[0].at), (3, ms(25)));
    assert_eq!(completed[0].outcome, CompletionOutcome::Whole);
}

#[test]
fn a_receiver_that_gave_a_product_up_is_told_apart_and_reported_once() {
    let mut sender = Sender::new(sender_config(), Instant::ZERO).unwrap();
    let (early, waiting, late, ahead) = (ReceiverId(1), ReceiverId(2), ReceiverId(3), ReceiverId(4));
    for id in [early, waiting, late, ahead] {
        sender.receiver_connected(Instant::ZERO, id);
    }
    let index = sender.enqueue(Instant::ZERO, OutgoingProduct::new(vec![7u8; 10 * 1448], [0u8; 16])).unwrap();
    let mut buf = Vec::new();
    // The BOP and the first block out: a RETX_END now cannot be for the whole product.
    for _ in 0..2 {
        sender.poll_transmit(Instant::ZERO, &mut buf).unwrap();
    }
    let end = Message { index, body: Body::RetxEnd };
    sender.handle_stream(Instant::ZERO, early, &end);
    // A request for bytes not multicast yet (an early receive timer) is not a loss: the
    // multicast may still bring them. Its repair stays queued (the receiver is not writable).
    sender.set_writable(ahead, false);
    sender.handle_stream(Instant::ZERO, ahead, &Message { index, body: Body::RetxReq { offset: block(5), len: 1448 } });
    let mut t = Instant::ZERO;
    loop {
        while sender.poll_transmit(t, &mut buf).is_some() {
            buf.clear();
        }
        if sender.queued_products() == 0 {
            break;
        }
        t = sender.poll_timeout().unwrap().max(t);
    }
    // A receiver that asked for a block and ends before it was sent gave the product up.
    sender.handle_stream(t, waiting, &Message { index, body: Body::RetxReq { offset: 0, len: 1448 } });
    sender.handle_stream(t, waiting, &end);
    sender.handle_stream(t, late, &end);
    // A repeated RETX_END is not a second completion.
    sender.handle_stream(t, late, &end);
    assert!(sender.retx_backlog_bytes(ahead) > 0, "the early request is still queued");
    sender.handle_stream(t, ahead, &end);
    let outcomes: Vec<(ReceiverId, CompletionOutcome)> = std::iter::from_fn(|| sender.poll_event())
        .filter_map(|event| match event {
            SenderEvent::Completed(completion) => Some((completion.receiver, completion.outcome)),
            _ => None,
        })
        .collect();
    assert_eq!(
        outcomes,
        vec![
            (early, CompletionOutcome::GaveUp),
            (waiting, CompletionOutcome::GaveUp),
            (late, CompletionOutcome::Whole),
            (ahead, CompletionOutcome::Whole)
        ]
    );
    assert_eq!((sender.counters().completions, sender.counters().completions_given_up), (4, 2));
}

/// xorshift64: deterministic loss decisions from a proptest seed. The last product is never
/// lost and the first product's EOP always arrives: a receiver cannot know of products lost
/// whole before the first index or after the last index it sees (LDM's backlog request and
/// backstop cover those).
fn lossy(seed: u64, loss_percent: u64, last: ProductIndex) -> support::DropFilter {
    let mut state = seed | 1;
    Box::new(move |_, message| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let protected = message.index == last || (message.index.0 == 0 && message.message_type() == MessageType::Eop);
        !protected && state % 100 < loss_percent
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// With a generous deadline every product arrives byte-exact at every receiver, whatever
    /// the multicast loss (the last product is protected: losing it whole is undetectable).
    #[test]
    fn random_loss_everything_delivered(
        seed: u64,
        loss_percent in prop_oneof![Just(0u64), 1u64..10, 10u64..60, Just(95u64)],
        sizes in proptest::collection::vec(prop_oneof![4 => 0usize..12_000, 1 => 60_000usize..200_000], 1..7),
        receiver_count in 1usize..4,
        request_len_max in prop_oneof![Just(1448u16), Just(65160u16), 1u16..5000],
    ) {
        let config = ReceiverConfig { request_len_max, ..support::trusting() };
        let mut net = Net::new(sender_config(), vec![config; receiver_count]);
        net.drop = lossy(seed, loss_percent, ProductIndex(sizes.len() as u32));
        net.duplicate = seed % 5 == 0;
        for (n, size) in sizes.iter().enumerate() {
            net.enqueue(*size, seed.wrapping_add(n as u64));
        }
        net.enqueue(10, seed);
        net.settle(60 * SECOND);
        let (delivered, missed) = net.check_accounted();
        prop_assert_eq!(missed, 0);
        prop_assert_eq!(delivered, (sizes.len() + 1) * receiver_count);
        prop_assert_eq!(net.sender.retained_products(), 0);
    }

    /// With a deadline shorter than the repair round trip some products are missed, but every
    /// product still ends as exactly one of delivered (byte-exact) or missed.
    #[test]
    fn random_loss_short_deadline_never_silently_loses(
        seed: u64,
        loss_percent in 1u64..40,
        sizes in proptest::collection::vec(0usize..12_000, 1..7),
        deadline_ms in 1u64..40,
    ) {
        let config = SenderConfig { deadline: DeadlinePolicy::Constant(Duration::from_millis(deadline_ms)), ..sender_config() };
        let mut net = Net::new(config, receivers(2));
        net.drop = lossy(seed, loss_percent, ProductIndex(sizes.len() as u32));
        for (n, size) in sizes.iter().enumerate() {
            net.enqueue(*size, seed.wrapping_add(n as u64));
        }
        net.enqueue(10, seed);
        net.settle(60 * SECOND);
        net.check_accounted();
        for node in &net.nodes {
            prop_assert_eq!(node.receiver.in_flight_products(), 0);
            prop_assert!(node.missed.values().all(|r| *r == MissReason::Rejected));
        }
    }
}

mod receiver_alone {
    //! The receiver fed crafted messages directly.

    use super::*;
    use ldm7_fmtp_proto::wire::Bop;
    use ldm7_fmtp_proto::{Receiver, WallTime};

    const T: Instant = Instant::ZERO;

    fn datagram(index: u32, body: Body<'_>) -> Vec<u8> {
        Message { index: ProductIndex(index), body }.to_vec().unwrap()
    }

    fn bop(size: u32, metadata: &[u8]) -> Bop<'_> {
        Bop { start_time: WallTime { secs: 10, nanos: 0 }, product_size: size, metadata }
    }

    /// Messages to send and events, less [`ReceiverEvent::Started`] (its own test below).
    fn drain(receiver: &mut Receiver) -> (Vec<Message<'static>>, Vec<ReceiverEvent>) {
        (
            std::iter::from_fn(|| receiver.poll_transmit()).collect(),
            std::iter::from_fn(|| receiver.poll_event())
                .filter(|event| !matches!(event, ReceiverEvent::Started { .. }))
                .collect(),
        )
    }

    #[test]
    fn the_first_multicast_message_names_the_first_product_once() {
        let mut receiver = Receiver::new(support::trusting()).unwrap();
        receiver.handle_datagram(T, &datagram(7, Body::MemData { offset: 1448, data: &[0; 10] }));
        receiver.handle_datagram(T, &datagram(6, Body::Bop(bop(10, b"m"))));
        receiver.handle_datagram(T, &datagram(8, Body::Bop(bop(10, b"m"))));
        let events: Vec<ReceiverEvent> = std::iter::from_fn(|| receiver.poll_event()).collect();
        let started: Vec<&ReceiverEvent> =
            events.iter().filter(|event| matches!(event, ReceiverEvent::Started { .. })).collect();
        assert_eq!(started, vec![&ReceiverEvent::Started { index: ProductIndex(7) }], "{events:?}");
        assert_eq!(events[0], ReceiverEvent::Started { index: ProductIndex(7) }, "before anything else");
    }

    #[test]
    fn large_index_jump_requests_the_newest_and_reports_the_rest() {
        let config = ReceiverConfig { index_gap_max: 3, ..support::trusting() };
        let mut receiver = Receiver::new(config).unwrap();
        receiver.handle_datagram(T, &datagram(u32::MAX - 1, Body::Bop(bop(0, b"m"))));
        receiver.handle_datagram(T, &datagram(8, Body::Bop(bop(0, b"m"))));
        let (requests, events) = drain(&mut receiver);
        let bop_requests: Vec<u32> = requests.iter().filter(|m| m.body == Body::BopReq).map(|m| m.index.0).collect();
        assert_eq!(bop_requests, vec![5, 6, 7]);
        assert!(events.contains(&ReceiverEvent::IndexGap { first: ProductIndex(u32::MAX), last: ProductIndex(4) }));
        assert_eq!(receiver.counters().index_gap_products, 6);
        assert_eq!(receiver.counters().delivered, 2);
    }

    #[test]
    fn bad_input_is_counted_not_trusted() {
        let mut receiver = Receiver::new(support::trusting()).unwrap();
        receiver.handle_datagram(T, &[0; 5]);
        receiver.handle_datagram(T, &datagram(1, Body::RetxData { offset: 0, data: b"x" }));
        receiver.handle_datagram(T, &datagram(1, Body::Bop(bop(10, b"meta"))));
        // A jump of exactly 2^31 has no order.
        receiver.handle_datagram(T, &datagram(1 + (1 << 31), Body::Eop));
        // A block past the product's end, a conflicting BOP, a duplicate block.
        receiver.handle_datagram(T, &datagram(1, Body::MemData { offset: 8, data: b"abc" }));
        receiver.handle_datagram(T, &datagram(1, Body::Bop(bop(11, b"meta"))));
        receiver.handle_datagram(T, &datagram(1, Body::MemData { offset: 0, data: b"01234" }));
        receiver.handle_datagram(T, &datagram(1, Body::MemData { offset: 0, data: b"01234" }));
        // A request type on the stream from the sender.
        receiver.handle_stream(T, &Message { index: ProductIndex(1), body: Body::BopReq });
        assert!(receiver.handle_stream_frame(T, &[0, 0]).is_err());
        let counters = receiver.counters().clone();
        assert_eq!(counters.malformed, 3);
        assert_eq!(counters.unexpected, 2);
        assert_eq!(counters.out_of_range, 1);
        assert_eq!(counters.bop_mismatches, 1);
        assert_eq!(counters.duplicates, 1);
        receiver.handle_datagram(T, &datagram(1, Body::MemData { offset: 5, data: b"56789" }));
        let (_, events) = drain(&mut receiver);
        let [ReceiverEvent::Delivered(delivery)] = &events[..] else { panic!("{events:?}") };
        assert_eq!((&delivery.data[..], &delivery.metadata[..]), (&b"0123456789"[..], &b"meta"[..]));
    }

    #[test]
    fn unsolicited_retx_eop_requests_the_missing_bytes_and_rejection_misses() {
        let mut receiver = Receiver::new(support::trusting()).unwrap();
        receiver.handle_datagram(T, &datagram(4, Body::Bop(bop(3000, b"m"))));
        receiver.handle_datagram(T, &datagram(4, Body::MemData { offset: 0, data: &[1; 1448] }));
        receiver.handle_stream(T, &Message { index: ProductIndex(4), body: Body::RetxEop });
        let (requests, _) = drain(&mut receiver);
        assert_eq!(requests, vec![Message { index: ProductIndex(4), body: Body::RetxReq { offset: 1448, len: 1552 } }]);
        receiver.handle_stream(T, &Message { index: ProductIndex(4), body: Body::RetxRej });
        let (requests, events) = drain(&mut receiver);
        assert!(requests.is_empty(), "no RETX_END after a rejection");
        assert_eq!(events, vec![ReceiverEvent::Missed { index: ProductIndex(4), reason: MissReason::Rejected }]);
        assert_eq!(receiver.in_flight_bytes(), 0);
        assert_eq!(receiver.poll_timeout(), None);
    }

    /// A receiver behind the multicast (its driver holds datagrams read before the sender's
    /// tail probe) takes them before the RETX_EOP: nothing it was about to handle is asked for.
    #[test]
    fn retx_eop_waits_while_the_driver_holds_datagrams() {
        let mut receiver = Receiver::new(support::trusting()).unwrap();
        receiver.handle_datagram(T, &datagram(4, Body::Bop(bop(3000, b"m"))));
        receiver.handle_datagram(T, &datagram(4, Body::MemData { offset: 0, data: &[1; 1448] }));
        receiver.set_backlog(T, true);
        // The probe overtook product 4's tail and product 5, still waiting in the driver.
        receiver.handle_stream(T, &Message { index: ProductIndex(5), body: Body::RetxEop });
        receiver.handle_stream(T, &Message { index: ProductIndex(4), body: Body::RetxEop });
        let (requests, _) = drain(&mut receiver);
        assert!(requests.is_empty(), "{requests:?}");
        receiver.handle_datagram(T, &datagram(4, Body::MemData { offset: 1448, data: &[1; 1448] }));
        receiver.handle_datagram(T, &datagram(4, Body::MemData { offset: 2896, data: &[1; 104] }));
        receiver.handle_datagram(T, &datagram(5, Body::Bop(bop(10, b"m"))));
        receiver.handle_datagram(T, &datagram(5, Body::MemData { offset: 0, data: &[2; 10] }));
        receiver.set_backlog(T, false);
        let (requests, events) = drain(&mut receiver);
        assert!(requests.iter().all(|m| m.body == Body::RetxEnd), "{requests:?}");
        assert_eq!(events.iter().filter(|e| matches!(e, ReceiverEvent::Delivered(_))).count(), 2, "{events:?}");
        assert_eq!(receiver.counters().multicast_after_asked, 0);
        assert_eq!(receiver.counters().announced, 0);
    }

    /// A receiver that stays behind still takes the RETX_EOP, after RETX_EOP_DEFER_MAX.
    #[test]
    fn a_deferred_retx_eop_is_taken_after_its_bound() {
        // A receive timer that does not fire meanwhile (it would ask for the tail itself).
        let receive_timer = ldm7_fmtp_proto::ReceiveTimer { slack: Duration::from_secs(60), ..Default::default() };
        let mut receiver = Receiver::new(ReceiverConfig { receive_timer, ..support::trusting() }).unwrap();
        receiver.handle_datagram(T, &datagram(4, Body::Bop(bop(3000, b"m"))));
        receiver.handle_datagram(T, &datagram(4, Body::MemData { offset: 0, data: &[1; 1448] }));
        receiver.set_backlog(T, true);
        receiver.handle_stream(T, &Message { index: ProductIndex(4), body: Body::RetxEop });
        receiver.set_backlog(T + Duration::from_millis(10), true);
        assert!(drain(&mut receiver).0.is_empty());
        receiver.set_backlog(T + ldm7_fmtp_proto::RETX_EOP_DEFER_MAX, true);
        let (requests, _) = drain(&mut receiver);
        assert_eq!(requests, vec![Message { index: ProductIndex(4), body: Body::RetxReq { offset: 1448, len: 1552 } }]);
    }

    #[test]
    fn byte_bound_evicts_only_products_that_hold_memory() {
        let config = ReceiverConfig { in_flight_bytes_max: 5_000, product_size_max: 5_000, ..support::trusting() };
        let mut receiver = Receiver::new(config).unwrap();
        // Product 0: 3000 bytes held, a block missing (its request is never answered here).
        receiver.handle_datagram(T, &datagram(0, Body::Bop(bop(3_000, b"m"))));
        receiver.handle_datagram(T, &datagram(0, Body::MemData { offset: 1448, data: &[0; 1448] }));
        // Product 1: BOP lost; its two blocks (2000 bytes) are held early.
        receiver.handle_datagram(T, &datagram(1, Body::MemData { offset: 0, data: &[1; 1448] }));
        receiver.handle_datagram(T, &datagram(1, Body::MemData { offset: 1448, data: &[1; 552] }));
        // Product 2: only its EOP arrives; it holds no memory.
        receiver.handle_datagram(T, &datagram(2, Body::Eop));
        assert_eq!(receiver.in_flight_bytes(), 5_000);
        // Product 1's RETX_BOP turns its early blocks into its buffer: no eviction needed.
        receiver.handle_stream(T, &Message { index: ProductIndex(1), body: Body::RetxBop(bop(2_000, b"m")) });
        let (_, events) = drain(&mut receiver);
        assert!(matches!(&events[..], [ReceiverEvent::Delivered(d)] if d.index == ProductIndex(1)), "{events:?}");
        // Product 2 (5000 bytes) needs product 0's memory, not the memory-less product 2 entry.
        receiver.handle_stream(T, &Message { index: ProductIndex(2), body: Body::RetxBop(bop(5_000, b"m")) });
        let (_, events) = drain(&mut receiver);
        assert_eq!(
            events[0],
            ReceiverEvent::BoundHit { bound: ReceiverBound::InFlightBytes, index: Some(ProductIndex(2)) }
        );
        assert_eq!(events[1], ReceiverEvent::Missed { index: ProductIndex(0), reason: MissReason::Evicted });
        assert_eq!(receiver.in_flight_products(), 1);
        assert_eq!(receiver.in_flight_bytes(), 5_000);
    }

    #[test]
    fn early_blocks_never_take_the_receiver_over_its_byte_bound() {
        let config = ReceiverConfig { in_flight_bytes_max: 5_000, product_size_max: 5_000, ..support::trusting() };
        let mut receiver = Receiver::new(config).unwrap();
        // Product 0 holds the whole bound (a block of it still missing).
        receiver.handle_datagram(T, &datagram(0, Body::Bop(bop(5_000, b"m"))));
        receiver.handle_datagram(T, &datagram(0, Body::MemData { offset: 0, data: &[0; 1448] }));
        assert_eq!(receiver.in_flight_bytes(), 5_000);
        // Product 1's BOP was lost: its block does not fit, is dropped and counted.
        receiver.handle_datagram(T, &datagram(1, Body::MemData { offset: 0, data: &[1; 1448] }));
        assert_eq!(receiver.in_flight_bytes(), 5_000);
        let (_, events) = drain(&mut receiver);
        assert!(
            events.contains(&ReceiverEvent::BoundHit {
                bound: ReceiverBound::InFlightBytes,
                index: Some(ProductIndex(1))
            }),
            "{events:?}"
        );
        // Its RETX_BOP takes product 0's memory; product 1 is then whole from its blocks again.
        receiver.handle_stream(T, &Message { index: ProductIndex(1), body: Body::RetxBop(bop(1_448, b"m")) });
        receiver.handle_stream(
            T,
            &Message { index: ProductIndex(1), body: Body::RetxData { offset: 0, data: &[1; 1448] } },
        );
        let (_, events) = drain(&mut receiver);
        assert!(
            events.contains(&ReceiverEvent::Missed { index: ProductIndex(0), reason: MissReason::Evicted }),
            "{events:?}"
        );
        assert!(
            events.iter().any(|e| matches!(e, ReceiverEvent::Delivered(d) if d.index == ProductIndex(1))),
            "{events:?}"
        );
        assert!(receiver.in_flight_bytes() <= 5_000);
    }

    #[test]
    fn latency_uses_the_wall_clock_anchor() {
        let mut receiver = Receiver::new(support::trusting()).unwrap();
        receiver.set_wall_clock(Instant::from_nanos(1_000), WallTime { secs: 10, nanos: 500 });
        receiver.handle_datagram(Instant::from_nanos(3_000_001_000), &datagram(0, Body::Bop(bop(0, b"m"))));
        let (_, events) = drain(&mut receiver);
        let [ReceiverEvent::Delivered(delivery)] = &events[..] else { panic!("{events:?}") };
        assert_eq!(delivery.latency_ns, 3_000_000_500);
    }
}

/// The buffer the receiver delivered product `index` in (the network's `delivered` map holds
/// copies; its events hold what the receiver handed over).
fn delivered_buffer(net: &mut Net, index: ldm7_fmtp_proto::ProductIndex) -> &mut Vec<u8> {
    net.nodes[0]
        .events
        .iter_mut()
        .find_map(|event| match event {
            ReceiverEvent::Delivered(delivery) if delivery.index == index => Some(&mut delivery.data),
            _ => None,
        })
        .expect("delivered")
}

#[test]
fn a_buffer_given_back_assembles_a_later_product() {
    let mut net = Net::new(sender_config(), receivers(1));
    let first = net.enqueue(100_000, 1);
    net.settle(10 * SECOND);
    let buffer = std::mem::take(delivered_buffer(&mut net, first));
    let (at, capacity) = (buffer.as_ptr(), buffer.capacity());
    net.nodes[0].receiver.give_back_buffer(buffer);
    // Too small for the next product: not taken, and it does not displace the fitting one.
    net.nodes[0].receiver.give_back_buffer(Vec::with_capacity(16));
    // A small product does not take the large buffer.
    let small = net.enqueue(1000, 3);
    net.settle(10 * SECOND);
    assert_ne!(delivered_buffer(&mut net, small).as_ptr(), at);
    let second = net.enqueue(60_000, 2);
    net.settle(10 * SECOND);
    let delivered = delivered_buffer(&mut net, second);
    assert_eq!((delivered.as_ptr(), delivered.capacity()), (at, capacity), "the buffer given back");
    assert!(*delivered == support::pattern(60_000, 2), "assembled byte-exact in the reused buffer");
    assert_eq!(net.check_accounted(), (3, 0));
}
