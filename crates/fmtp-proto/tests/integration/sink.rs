//! Receivers that write through a [`ProductSink`] ([`Assembly::Sink`]) instead of assembling in
//! memory: every byte reaches the sink exactly once (early blocks included), every opened
//! product is closed once before its event, and a failing sink (a full disk) makes the product
//! missed — reported, released by the sender, never a panic.

use crate::support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{Net, block, drop_exact};
use ldm7_fmtp_proto::wire::MessageType;
use ldm7_fmtp_proto::{
    Assembly, MissReason, ProductIndex, ProductSink, Receiver, ReceiverConfig, ReleaseReason, SenderConfig,
    SenderEvent, SinkError,
};

const SECOND: Duration = Duration::from_secs(1);

/// An open product: its bytes, which of them were written, its metadata.
type OpenProduct = (Vec<u8>, Vec<bool>, Vec<u8>);

/// What a [`MemorySink`] saw.
#[derive(Default)]
struct Seen {
    /// Open products: bytes and which bytes were written.
    open: HashMap<ProductIndex, OpenProduct>,
    completed: HashMap<ProductIndex, (Vec<u8>, Vec<u8>)>,
    abandoned: Vec<ProductIndex>,
    /// Bytes of the open products.
    held_bytes: u64,
    /// Refuse to hold more than this (a full disk).
    capacity_bytes: u64,
    /// Refuse writes of this product.
    failing: Option<ProductIndex>,
}

/// An in-memory sink that checks the call protocol as it goes.
#[derive(Clone)]
struct MemorySink(Arc<Mutex<Seen>>);

impl MemorySink {
    fn new(capacity_bytes: u64) -> Self {
        Self(Arc::new(Mutex::new(Seen { capacity_bytes, ..Seen::default() })))
    }
    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.0.lock().expect("sink lock")
    }
}

impl ProductSink for MemorySink {
    fn open(&mut self, index: ProductIndex, size: u32, metadata: &[u8]) -> Result<(), SinkError> {
        let mut seen = self.seen();
        assert!(!seen.open.contains_key(&index), "product {index} opened twice");
        if seen.held_bytes + u64::from(size) > seen.capacity_bytes {
            return Err(SinkError::new("no space left on device"));
        }
        seen.held_bytes += u64::from(size);
        seen.open.insert(index, (vec![0; size as usize], vec![false; size as usize], metadata.to_vec()));
        Ok(())
    }

    fn write_at(&mut self, index: ProductIndex, offset: u32, bytes: &[u8]) -> Result<(), SinkError> {
        let mut seen = self.seen();
        if seen.failing == Some(index) {
            return Err(SinkError::new("write failed"));
        }
        let (data, written, _) = seen.open.get_mut(&index).expect("write to an open product");
        let range = offset as usize..offset as usize + bytes.len();
        assert!(written[range.clone()].iter().all(|w| !w), "product {index}: bytes {range:?} written twice");
        written[range.clone()].fill(true);
        data[range].copy_from_slice(bytes);
        Ok(())
    }

    fn close(&mut self, index: ProductIndex, completed: bool) {
        let mut seen = self.seen();
        let (data, written, metadata) = seen.open.remove(&index).expect("close of an open product");
        seen.held_bytes -= data.len() as u64;
        if completed {
            assert!(written.iter().all(|w| *w), "product {index} completed with bytes missing");
            seen.completed.insert(index, (data, metadata));
        } else {
            seen.abandoned.push(index);
        }
    }
}

fn sink_net(receivers: usize, capacity_bytes: u64) -> (Net, Vec<MemorySink>) {
    let mut net = Net::new(SenderConfig::with_rate(100_000_000), Vec::new());
    let sinks: Vec<MemorySink> = (0..receivers).map(|_| MemorySink::new(capacity_bytes)).collect();
    for sink in &sinks {
        net.add(Receiver::with_sink(support::trusting(), sink.clone()).expect("receiver"));
    }
    (net, sinks)
}

#[test]
fn every_byte_reaches_the_sink_once_through_losses() {
    let (mut net, sinks) = sink_net(2, u64::MAX);
    // Receiver 0 loses the BOP of product 1 (its blocks wait in memory for the RETX_BOP),
    // blocks of product 2 and the EOP of product 3; receiver 1 loses nothing.
    let mut lost = vec![(0, 1, MessageType::Bop, 0), (0, 3, MessageType::Eop, 0)];
    lost.extend((2..6).map(|k| (0, 2, MessageType::MemData, block(k))));
    net.drop = drop_exact(lost);
    let sizes = [0usize, 20_000, 100_000, 1449, 1];
    for (seed, size) in sizes.iter().enumerate() {
        net.enqueue(*size, seed as u64);
    }
    net.settle(10 * SECOND);
    for (position, sink) in sinks.iter().enumerate() {
        let node = &net.nodes[position];
        assert_eq!((node.delivered.len(), node.missed.len()), (sizes.len(), 0), "receiver {position}");
        let seen = sink.seen();
        assert!(seen.open.is_empty() && seen.abandoned.is_empty() && seen.held_bytes == 0);
        for (index, (data, metadata)) in &net.sent {
            assert!(node.delivered[index].data.is_empty(), "no bytes in memory with a sink");
            assert_eq!(seen.completed.get(index), Some(&(data.clone(), metadata.clone())), "product {index}");
        }
        assert_eq!(node.receiver.in_flight_bytes(), 0);
    }
    assert!(net.nodes[0].delivered[&ProductIndex(2)].retransmitted_blocks > 0);
}

#[test]
fn a_full_sink_makes_products_missed_and_the_sender_releases_them() {
    // Room for one 60 kB product at a time: of two products whose multicast overlaps in the
    // receiver (the second's BOP arrives while the first is incomplete), the second fails.
    let (mut net, sinks) = sink_net(1, 60_000);
    net.drop = drop_exact(vec![(0, 0, MessageType::MemData, block(3))]);
    net.enqueue(50_000, 1);
    net.enqueue(50_000, 2);
    net.enqueue(10, 3);
    net.settle(10 * SECOND);
    let node = &net.nodes[0];
    assert_eq!(node.missed.get(&ProductIndex(1)), Some(&MissReason::SinkFailed));
    assert_eq!(node.delivered.len(), 2, "the others are delivered");
    assert_eq!(node.receiver.counters().sink_failures, 1);
    // The receiver sent RETX_END for the failed product: the sender let it go at once.
    let released = net.sender_events.iter().any(
        |event| matches!(event, SenderEvent::Released { index, reason: ReleaseReason::AllDone, .. } if index.0 == 1),
    );
    assert!(released, "{:?}", net.sender_events);
    let seen = sinks[0].seen();
    assert!(seen.open.is_empty() && seen.held_bytes == 0);
}

#[test]
fn a_failing_write_abandons_the_product_and_closes_it() {
    let (mut net, sinks) = sink_net(1, u64::MAX);
    sinks[0].seen().failing = Some(ProductIndex(1));
    for seed in 0..3 {
        net.enqueue(5_000, seed);
    }
    net.settle(10 * SECOND);
    assert_eq!(net.nodes[0].missed.get(&ProductIndex(1)), Some(&MissReason::SinkFailed));
    assert_eq!(net.nodes[0].delivered.len(), 2);
    let seen = sinks[0].seen();
    assert_eq!(seen.abandoned, vec![ProductIndex(1)]);
    assert!(seen.open.is_empty());
}

#[test]
fn evicted_products_are_closed_uncompleted() {
    // Two products in flight at most: the third's arrival evicts the oldest incomplete one.
    let sink = MemorySink::new(u64::MAX);
    let config = ReceiverConfig { in_flight_products_max: 2, ..support::trusting() };
    let mut net = Net::new(SenderConfig::with_rate(100_000_000), Vec::new());
    net.add(Receiver::with_sink(config, sink.clone()).expect("receiver"));
    net.nodes[0].muted = true;
    net.drop = drop_exact((0..3).map(|index| (0, index, MessageType::MemData, block(1))).collect());
    for seed in 0..3 {
        net.enqueue(5_000, seed);
    }
    net.run_for(SECOND);
    assert_eq!(net.nodes[0].missed.get(&ProductIndex(0)), Some(&MissReason::Evicted));
    assert_eq!(sink.seen().abandoned, vec![ProductIndex(0)]);
}

#[test]
fn sink_assembly_needs_a_sink() {
    let config = ReceiverConfig { assembly: Assembly::Sink, ..support::trusting() };
    assert!(Receiver::new(config).is_err());
}
