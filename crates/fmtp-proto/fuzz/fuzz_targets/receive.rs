//! The receiver state machine on arbitrary input: records of `[kind u8][delay u8][len u16 BE]
//! [bytes]` become datagrams (even kind) or stream frames (odd kind) at increasing times. It
//! must never panic. While product indexes stay below 1024 (records with `kind & 2 == 0` have
//! their index folded into that range) an index names one product, so each index must be
//! reported (delivered or missed) at most once; a record with a raw index may make the same
//! number name a later product (serial arithmetic after jumps adding up to 2³²), so it resets
//! that check.
#![no_main]

use std::collections::HashSet;

use ldm7_fmtp_proto::{Instant, Receiver, ReceiverConfig, ReceiverEvent};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let config = ReceiverConfig {
        in_flight_products_max: 8,
        in_flight_bytes_max: 1 << 20,
        product_size_max: 1 << 20,
        early_bytes_max: 1 << 16,
        index_gap_max: 16,
        ..ReceiverConfig::default()
    };
    let mut receiver = Receiver::new(config).expect("valid config");
    let mut now = Instant::ZERO;
    let mut reported = HashSet::new();
    let mut rest = data;
    while rest.len() >= 4 {
        let (kind, delay_ms, len) = (rest[0], rest[1], usize::from(u16::from_be_bytes([rest[2], rest[3]])));
        let mut record = rest[4..(4 + len).min(rest.len())].to_vec();
        rest = &rest[4 + record.len()..];
        if kind & 2 == 0 && record.len() >= 4 {
            let index = u32::from_be_bytes([record[0], record[1], record[2], record[3]]) % 1024;
            record[..4].copy_from_slice(&index.to_be_bytes());
        } else {
            reported.clear();
        }
        now = now + std::time::Duration::from_millis(u64::from(delay_ms) * 10);
        if kind % 2 == 0 {
            receiver.handle_datagram(now, &record);
        } else {
            let _ = receiver.handle_stream_frame(now, &record);
        }
        receiver.handle_timeout(now);
        while receiver.poll_transmit().is_some() {}
        while let Some(event) = receiver.poll_event() {
            if let ReceiverEvent::Delivered(delivery) = &event {
                assert!(reported.insert(delivery.index.0), "product reported twice");
            }
            if let ReceiverEvent::Missed { index, .. } = &event {
                assert!(reported.insert(index.0), "product reported twice");
            }
        }
    }
});
