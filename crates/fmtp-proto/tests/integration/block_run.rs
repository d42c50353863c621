//! `Receiver::handle_block_run` against `Receiver::handle_datagram`: two receivers see the same
//! multicast with the same losses, one datagram by datagram, the other with back-to-back blocks
//! handed over as runs (as the simulator does: a block after a gap, a BOP or an EOP is handed over
//! at once, and a run goes in before anything else). They must ask for the same repairs, in the
//! same order, and deliver the same products with the same fingerprints.

use std::time::Duration;

use ldm7_fmtp_proto::wire::{Body, Message};
use ldm7_fmtp_proto::{
    Assembly, BlockRun, IndexTrust, Instant, OutgoingProduct, ProductIndex, Receiver, ReceiverConfig, Sender,
    SenderConfig, block_fingerprint,
};
use proptest::prelude::*;

/// The multicast datagrams of products of `sizes` (a sender paced at 1 Gbit/s, no receivers'
/// requests, no tail probe: its receiver never finishes), with their send times.
fn multicast(sizes: &[usize]) -> Vec<(Instant, Vec<u8>)> {
    let config = SenderConfig { tail_probe: None, ..SenderConfig::with_rate(1_000_000_000) };
    let mut sender = Sender::new(config, Instant::ZERO).expect("sender");
    let id = ldm7_fmtp_proto::ReceiverId(1);
    sender.receiver_connected(Instant::ZERO, id);
    for (k, size) in sizes.iter().enumerate() {
        let bytes: Vec<u8> = (0..*size).map(|i| (i * 7 + k * 13) as u8).collect();
        sender
            .enqueue(Instant::ZERO, OutgoingProduct::new(std::sync::Arc::<[u8]>::from(bytes), [k as u8; 16]))
            .expect("enqueue");
    }
    let mut datagrams = Vec::new();
    let mut now = Instant::ZERO;
    let mut buf = Vec::new();
    for _ in 0..100_000 {
        buf.clear();
        match sender.poll_transmit(now, &mut buf) {
            Some(transmit) if transmit.destination == ldm7_fmtp_proto::Destination::Multicast => {
                datagrams.push((now, buf.clone()));
            }
            Some(_) => {}
            None => match sender.poll_timeout() {
                Some(at) if at > now => now = at,
                _ => break,
            },
        }
        now = now + Duration::from_micros(1);
    }
    datagrams
}

fn discarding() -> Receiver {
    Receiver::new(ReceiverConfig {
        assembly: Assembly::Discard,
        index_trust: IndexTrust::All,
        ..ReceiverConfig::default()
    })
    .expect("receiver")
}

/// What a receiver sent and reported, as text (in order).
fn drain(receiver: &mut Receiver, out: &mut Vec<String>) {
    while let Some(message) = receiver.poll_transmit() {
        out.push(format!("{message:?}"));
    }
    while let Some(event) = receiver.poll_event() {
        out.push(format!("{event:?}"));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn runs_ask_and_deliver_as_datagrams_do(
        sizes in proptest::collection::vec(0usize..20_000, 1..5),
        lost in proptest::collection::vec(0usize..60, 0..8),
    ) {
        let datagrams = multicast(&sizes);
        // Every block's fingerprint, for the parts of runs the receiver asks about (the blocks
        // of a product whose BOP was lost go in one by one).
        let mut blocks = std::collections::HashMap::new();
        for (_, datagram) in &datagrams {
            let message = Message::parse(datagram).expect("parses");
            if let Body::MemData { offset, data } = message.body {
                blocks.insert((message.index, offset), block_fingerprint(offset, data));
            }
        }
        let (mut one, mut runs) = (discarding(), discarding());
        let (mut seen_one, mut seen_runs) = (Vec::new(), Vec::new());
        let mut pending: Option<(BlockRun, Instant)> = None;
        let mut expect: Option<(ProductIndex, u32)> = None;
        let flush = |receiver: &mut Receiver, pending: &mut Option<(BlockRun, Instant)>,
                     expect: &mut Option<(ProductIndex, u32)>, seen: &mut Vec<String>| {
            if let Some((run, at)) = pending.take() {
                *expect = Some((run.index, run.end));
                receiver.handle_block_run(at, &run, &mut |start, end| {
                    let mut sum = 0u64;
                    let mut offset = start;
                    while offset < end {
                        sum = sum.wrapping_add(blocks[&(run.index, offset)]);
                        offset += 1448;
                    }
                    sum
                });
                drain(receiver, seen);
            }
        };
        for (k, (at, datagram)) in datagrams.iter().enumerate() {
            if lost.contains(&k) {
                continue;
            }
            one.handle_datagram(*at, datagram);
            drain(&mut one, &mut seen_one);
            let message = Message::parse(datagram).expect("parses");
            if let Body::MemData { offset, data } = message.body {
                let end = offset + data.len() as u32;
                let fingerprint = block_fingerprint(offset, data);
                if let Some((run, last)) = pending.as_mut().filter(|(run, _)| run.index == message.index && run.end == offset) {
                    run.end = end;
                    run.datagrams += 1;
                    run.wire_bytes += datagram.len() as u64;
                    run.fingerprint = run.fingerprint.wrapping_add(fingerprint);
                    *last = *at;
                    continue;
                }
                flush(&mut runs, &mut pending, &mut expect, &mut seen_runs);
                if expect == Some((message.index, offset)) {
                    let run = BlockRun { index: message.index, start: offset, end, datagrams: 1,
                        wire_bytes: datagram.len() as u64, fingerprint };
                    pending = Some((run, *at));
                    continue;
                }
                expect = Some((message.index, end));
            } else {
                flush(&mut runs, &mut pending, &mut expect, &mut seen_runs);
                expect = matches!(message.body, Body::Bop(_)).then_some((message.index, 0));
            }
            runs.handle_datagram(*at, datagram);
            drain(&mut runs, &mut seen_runs);
        }
        flush(&mut runs, &mut pending, &mut expect, &mut seen_runs);
        // BOP and EOP of each product, and its blocks.
        let blocks_total: usize = sizes.iter().map(|size| size.div_ceil(1448)).sum();
        prop_assert_eq!(datagrams.len(), 2 * sizes.len() + blocks_total);
        if lost.iter().all(|&k| k >= datagrams.len()) {
            prop_assert_eq!(seen_one.iter().filter(|line| line.starts_with("Delivered")).count(), sizes.len());
        }
        prop_assert_eq!(&seen_one, &seen_runs);
        prop_assert_eq!(one.counters(), runs.counters());
    }
}

#[test]
fn a_run_over_blocks_already_here_counts_only_the_rest() {
    let datagrams = multicast(&[5 * 1448]);
    let mut receiver = discarding();
    let mut seen = Vec::new();
    // BOP, then blocks 0 and 2 one by one (block 1 requested), then a run of blocks 1–4 that
    // repeats block 2: only blocks 1, 3 and 4 count, and the product is delivered.
    let (bop_at, bop) = &datagrams[0];
    receiver.handle_datagram(*bop_at, bop);
    let mut fingerprints = Vec::new();
    for (at, datagram) in &datagrams[1..6] {
        let message = Message::parse(datagram).expect("parses");
        let Body::MemData { offset, data } = message.body else { panic!("a block") };
        fingerprints.push((offset, block_fingerprint(offset, data), *at, datagram.clone()));
    }
    for &k in &[0, 2] {
        receiver.handle_datagram(fingerprints[k].2, &fingerprints[k].3);
    }
    drain(&mut receiver, &mut seen);
    assert!(seen.iter().any(|line| line.contains("RetxReq")), "{seen:?}");
    let run = BlockRun {
        index: ProductIndex(0),
        start: 1448,
        end: 5 * 1448,
        datagrams: 4,
        wire_bytes: 4 * 1460,
        fingerprint: fingerprints[1..].iter().fold(0u64, |sum, f| sum.wrapping_add(f.1)),
    };
    let mut asked = Vec::new();
    receiver.handle_block_run(fingerprints[4].2, &run, &mut |start, end| {
        asked.push((start, end));
        fingerprints.iter().filter(|f| f.0 >= start && f.0 < end).fold(0u64, |sum, f| sum.wrapping_add(f.1))
    });
    assert_eq!(asked, vec![(1448, 2 * 1448), (3 * 1448, 5 * 1448)]);
    drain(&mut receiver, &mut seen);
    assert!(seen.iter().any(|line| line.starts_with("Delivered")), "{seen:?}");
    assert_eq!(receiver.counters().duplicates, 1);
    assert_eq!(receiver.counters().delivered, 1);
}

#[test]
fn a_run_before_its_bop_is_kept_whole_and_delivers_as_its_blocks_would() {
    // Products of 7 blocks whose BOP is lost: one receiver takes the blocks one by one, the
    // other as a run (kept as one early block). Both get the BOP over TCP and deliver alike.
    let datagrams = multicast(&[7 * 1448 - 100]);
    let (mut one, mut runs) = (discarding(), discarding());
    let (mut seen_one, mut seen_runs) = (Vec::new(), Vec::new());
    let mut blocks = Vec::new();
    let mut run: Option<BlockRun> = None;
    let mut bop = None;
    let mut last_at = Instant::ZERO;
    for (at, datagram) in &datagrams {
        let message = Message::parse(datagram).expect("parses");
        match message.body {
            Body::Bop(bop_body) => bop = Some((bop_body.product_size, bop_body.start_time, bop_body.metadata.to_vec())),
            Body::MemData { offset, data } => {
                let fingerprint = block_fingerprint(offset, data);
                blocks.push((offset, fingerprint));
                one.handle_datagram(*at, datagram);
                drain(&mut one, &mut seen_one);
                last_at = *at;
                // The first block goes alone (it follows a loss), the rest as one run.
                if offset == 0 {
                    runs.handle_datagram(*at, datagram);
                    drain(&mut runs, &mut seen_runs);
                    continue;
                }
                let run = run.get_or_insert(BlockRun {
                    index: message.index,
                    start: offset,
                    end: offset,
                    datagrams: 0,
                    wire_bytes: 0,
                    fingerprint: 0,
                });
                run.end = offset + data.len() as u32;
                run.datagrams += 1;
                run.wire_bytes += datagram.len() as u64;
                run.fingerprint = run.fingerprint.wrapping_add(fingerprint);
            }
            _ => {}
        }
    }
    let run = run.expect("blocks after the first");
    runs.handle_block_run(last_at, &run, &mut |_, _| panic!("a run kept whole needs no block's fingerprint"));
    drain(&mut runs, &mut seen_runs);
    assert_eq!(seen_one, seen_runs);
    assert!(seen_one.iter().any(|line| line.contains("BopReq")), "{seen_one:?}");
    // The BOP comes over TCP (RETX_BOP) and the EOP by multicast.
    let (size, start_time, metadata) = bop.expect("a BOP");
    let retx_bop = Message {
        index: run.index,
        body: Body::RetxBop(ldm7_fmtp_proto::wire::Bop { product_size: size, start_time, metadata: &metadata }),
    };
    let eop = &datagrams.last().expect("the EOP").1;
    for (receiver, seen) in [(&mut one, &mut seen_one), (&mut runs, &mut seen_runs)] {
        receiver.handle_stream(last_at, &retx_bop);
        receiver.handle_datagram(last_at, eop);
        drain(receiver, seen);
    }
    assert_eq!(seen_one, seen_runs);
    assert_eq!(seen_one.iter().filter(|line| line.starts_with("Delivered")).count(), 1, "{seen_one:?}");
    assert_eq!(one.counters(), runs.counters());
}
