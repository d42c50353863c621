//! LDM-7 (program 300029 version 7) against the real capture `captures/fmtp-ldm7.txt`: every
//! RPC record is reassembled, decoded, re-encoded and compared byte for byte, with the decoded
//! fields checked against the transcript (including the `CidrAddr` byte-order quirk on the
//! real bytes); the FMTP payloads decode as XDR products. Property tests: generated v7 messages
//! survive encode → any fragmentation → decode; arbitrary bytes never panic; bounds hold.

use std::collections::HashMap;
use std::net::Ipv4Addr;

use ldm7_testkit::{capture_streams, hex_words, shared_data_or_skip};
use ldm7_types::{FeedType, ProdInfo, Signature, Timestamp};
use ldm7_xdr::XdrError;
use ldm7_xdr::ldm7::{
    BacklogSpec, Call, CidrAddr, Ldm7Call, Ldm7Status, McastInfo, McastSubInfo, McastSubReq, Message, MissedProduct,
    Proc, RecordBytes, Reply, ReplyBody, STRING_LEN_MAX, SubscriptionReply, VcEndPoint, WireProduct, decode_message,
    decode_product, encode_call, encode_product, encode_reply,
};
use ldm7_xdr::rpc::{AcceptStat, AuthStat, RecordReader, write_fragmented};
use proptest::prelude::*;

const CAPTURE: &str = "captures/fmtp-ldm7.txt";

fn records(stream: &[u8]) -> Vec<Vec<u8>> {
    let mut reader = RecordReader::new(1 << 20);
    // Small uneven pieces: reassembly must not depend on read boundaries.
    for chunk in stream.chunks(5) {
        reader.push(chunk);
    }
    let mut records = Vec::new();
    while let Some(record) = reader.next_record().expect("valid record marking") {
        records.push(record.to_vec());
    }
    assert_eq!(reader.pending(), 0, "bytes left over");
    records
}

/// The LDM-7 connection of the capture, both directions.
struct Captured {
    client: Vec<Message>,
    server: Vec<Message>,
    client_records: Vec<Vec<u8>>,
    server_records: Vec<Vec<u8>>,
}

/// Decodes every record of the LDM-7 connection, re-encodes each and compares.
fn capture() -> Option<Captured> {
    let connections = capture_streams(CAPTURE)?;
    assert_eq!(connections.len(), 1, "one LDM-7 RPC connection");
    let (client, server) = (records(&connections[0].0), records(&connections[0].1));
    let mut calls: HashMap<u32, Proc> = HashMap::new();
    for record in client.iter().chain(&server) {
        if let Ok(Message::Call(call)) = decode_message(record.clone(), |_| None) {
            calls.insert(call.xid, call.call.proc());
        }
    }
    let decode_all = |records: &[Vec<u8>]| {
        records
            .iter()
            .map(|record| {
                let message = decode_message(record.clone(), |xid| calls.get(&xid).copied())
                    .unwrap_or_else(|error| panic!("decode {record:02x?}: {error}"));
                let mut again = Vec::new();
                match &message {
                    Message::Call(call) => encode_call(&mut again, call),
                    Message::Reply(reply) => encode_reply(&mut again, reply.xid, &reply.body),
                }
                assert_eq!(&again[4..], &record[..], "re-encoding {message:?} differs");
                assert_eq!(
                    u32::from_be_bytes([again[0], again[1], again[2], again[3]]),
                    0x8000_0000 | record.len() as u32
                );
                message
            })
            .collect::<Vec<_>>()
    };
    Some(Captured {
        client: decode_all(&client),
        server: decode_all(&server),
        client_records: client,
        server_records: server,
    })
}

fn signature(hex: &str) -> Signature {
    hex.parse().expect("signature")
}

fn captured_product(n: u32, micros: i32, signature_hex: &str) -> ProdInfo {
    ProdInfo {
        arrival: Timestamp { secs: 1_795_338_479, micros },
        signature: signature(signature_hex),
        origin: "vm".into(),
        feedtype: FeedType::EXP,
        seqno: n,
        ident: format!("TEST/cap.{n}"),
        size: 8,
    }
}

#[test]
fn every_ldm7_record_of_the_capture_round_trips_byte_for_byte() {
    let Some(Captured { client, server, client_records, server_records }) = capture() else { return };
    assert_eq!((client.len(), server.len()), (2, 3));

    // SUBSCRIBE(ANY, {"dummy", "dummy", 0}).
    assert_eq!(
        client[0],
        Message::Call(Call {
            xid: 0x6a08_636d,
            call: Ldm7Call::Subscribe(McastSubReq { feed: FeedType::ANY, vc_end: VcEndPoint::unused(), offer: None })
        })
    );

    // The reply: LDM7_OK, the group, the FMTP server and the client address 10.77.0.2/32.
    let expected = McastSubInfo {
        mcast_info: McastInfo {
            feed: FeedType::ANY,
            group: "224.0.55.1:38801".into(),
            server: "10.77.0.1:42263".into(),
        },
        fmtp_addr: CidrAddr { addr: Ipv4Addr::new(10, 77, 0, 2), prefix_len: 32 },
        answer: None,
    };
    assert_eq!(
        server[0],
        Message::Reply(Reply { xid: 0x6a08_636d, body: ReplyBody::Subscribe(SubscriptionReply::Ok(expected)) })
    );
    // The quirk on the real bytes: the address word is 02 00 4d 0a, 10.77.0.2 reversed.
    let reply = &server_records[0];
    assert_eq!(&reply[reply.len() - 8..], [0x02, 0x00, 0x4d, 0x0a, 0, 0, 0, 32]);

    // REQUEST_BACKLOG: after = the previous session's last product, before = cap.3, 3600 s.
    let Message::Call(Call { xid: 0x6908_636d, call: Ldm7Call::RequestBacklog(spec) }) = &client[1] else {
        panic!("{:?}", client[1])
    };
    assert_eq!(
        *spec,
        BacklogSpec {
            after: signature("94889dfa3a668c941c06638dbae6cdd8"),
            after_is_set: true,
            before: signature("b6adbdcdf07512b2f9d18b417453a896"),
            time_offset_secs: 3600,
        }
    );
    assert_eq!(spec.after(), Some(signature("94889dfa3a668c941c06638dbae6cdd8")));
    assert_eq!(spec.time_offset().as_secs(), 3600);
    assert_eq!(client_records[1].len(), 80);

    // Two DELIVER_BACKLOG_PRODUCTs from the upstream: cap.1 and cap.2, one-way calls.
    let expected = [
        (0x6a08_0f05, captured_product(1, 704_874, "99472f8d2f760bcc394e80d09275150a"), b"hello 1\n"),
        (0x6908_0f05, captured_product(2, 717_420, "26c5cb6d09e64fbeeb09c9cd9c0183f2"), b"hello 2\n"),
    ];
    for (message, (xid, info, data)) in server[1..].iter().zip(&expected) {
        let Message::Call(Call { xid: got_xid, call: Ldm7Call::DeliverBacklogProduct(product) }) = message else {
            panic!("{message:?}")
        };
        assert_eq!(got_xid, xid);
        assert_eq!(&product.info, info);
        assert_eq!(&product.data[..], &data[..]);
        assert_eq!(Signature::md5_of(&product.data), info.signature);
    }
    assert!(server_records[1..].iter().all(|record| record.len() == 108));
}

#[test]
fn fmtp_payloads_are_the_xdr_products() {
    let Some(path) = shared_data_or_skip(CAPTURE) else { return };
    let text = std::fs::read_to_string(path).expect("transcript");
    let mut previous = "";
    let mut seen = 0;
    for line in text.lines() {
        if let Some(hex) = line.trim_start().strip_prefix("hex:")
            && previous.starts_with("UDP #")
            && previous.contains("MEM_DATA")
        {
            let datagram = hex_words(hex);
            let payload = &datagram[12..];
            let (info, data) = decode_product(payload).expect("an XDR product");
            assert_eq!(info.ident, format!("TEST/cap.{}", info.seqno));
            assert_eq!(data, format!("hello {}\n", info.seqno).as_bytes());
            assert_eq!(Signature::md5_of(data), info.signature);
            let mut again = Vec::new();
            encode_product(&mut again, &info, data);
            assert_eq!(again, payload);
            seen += 1;
        }
        previous = line;
    }
    assert_eq!(seen, 5, "one MEM_DATA datagram per product");
}

// ---------------------------------------------------------------------------------------------
// Properties.

fn text(max: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec(0x20u8..0x7f, 0..=max).prop_map(|bytes| String::from_utf8(bytes).expect("ascii"))
}

fn prod_info(size: u32) -> impl Strategy<Value = ProdInfo> {
    (any::<i32>(), -1i32..1_000_000, any::<[u8; 16]>(), text(64), any::<u32>(), any::<u32>(), text(255)).prop_map(
        move |(secs, micros, signature, origin, feedtype, seqno, ident)| ProdInfo {
            arrival: Timestamp { secs: i64::from(secs), micros },
            signature: Signature(signature),
            origin,
            feedtype: FeedType(feedtype),
            seqno,
            ident,
            size,
        },
    )
}

fn product() -> impl Strategy<Value = WireProduct> {
    proptest::collection::vec(any::<u8>(), 0..3000).prop_flat_map(|data| {
        prod_info(data.len() as u32).prop_map(move |info| WireProduct { info, data: RecordBytes::from(data.clone()) })
    })
}

fn call() -> impl Strategy<Value = Ldm7Call> {
    prop_oneof![
        (any::<u32>(), text(80), text(80), any::<u16>()).prop_map(|(feed, switch_id, port_id, vlan_id)| {
            Ldm7Call::Subscribe(McastSubReq {
                feed: FeedType(feed),
                vc_end: VcEndPoint { switch_id, port_id, vlan_id },
                offer: None,
            })
        }),
        any::<u32>().prop_map(Ldm7Call::RequestProduct),
        (any::<[u8; 16]>(), any::<bool>(), any::<[u8; 16]>(), any::<u32>()).prop_map(
            |(after, after_is_set, before, time_offset_secs)| Ldm7Call::RequestBacklog(BacklogSpec {
                after: Signature(after),
                after_is_set,
                before: Signature(before),
                time_offset_secs,
            })
        ),
        Just(Ldm7Call::TestConnection),
        (any::<u32>(), product())
            .prop_map(|(index, product)| Ldm7Call::DeliverMissedProduct(MissedProduct { index, product })),
        any::<u32>().prop_map(Ldm7Call::NoSuchProduct),
        product().prop_map(Ldm7Call::DeliverBacklogProduct),
        Just(Ldm7Call::EndBacklog),
    ]
}

fn reply_body() -> impl Strategy<Value = ReplyBody> {
    let refused = proptest::sample::select(&Ldm7Status::ALL[1..]).prop_map(SubscriptionReply::Refused);
    let ok = (any::<u32>(), text(100), text(100), any::<[u8; 4]>(), 0u8..=32).prop_map(
        |(feed, group, server, octets, prefix_len)| {
            SubscriptionReply::Ok(McastSubInfo {
                mcast_info: McastInfo { feed: FeedType(feed), group, server },
                fmtp_addr: CidrAddr { addr: Ipv4Addr::from(octets), prefix_len },
                answer: None,
            })
        },
    );
    prop_oneof![
        prop_oneof![ok, refused].prop_map(ReplyBody::Subscribe),
        Just(ReplyBody::Error(AcceptStat::SystemErr)),
        Just(ReplyBody::Error(AcceptStat::ProgMismatch { low: 6, high: 6 })),
        Just(ReplyBody::Denied(AuthStat::TooWeak)),
    ]
}

/// Encodes `encoded`'s body in fragments of `fragment` bytes, feeds it in pieces of `chunk`
/// bytes and returns the reassembled record.
fn through_fragments(encoded: &[u8], fragment: usize, chunk: usize) -> Vec<u8> {
    let mut fragmented = Vec::new();
    write_fragmented(&mut fragmented, &encoded[4..], fragment);
    let mut reader = RecordReader::new(1 << 20);
    let mut got = None;
    for piece in fragmented.chunks(chunk) {
        reader.push(piece);
        if let Some(record) = reader.next_record().expect("valid") {
            got = Some(record);
        }
    }
    got.expect("one record").to_vec()
}

proptest! {
    #[test]
    fn v7_calls_round_trip_through_any_fragmentation(call in call(), xid in any::<u32>(), fragment in 1usize..600, chunk in 1usize..300) {
        let call = Call { xid, call };
        let mut encoded = Vec::new();
        encode_call(&mut encoded, &call);
        let record = through_fragments(&encoded, fragment, chunk);
        prop_assert_eq!(&record[..], &encoded[4..]);
        prop_assert_eq!(decode_message(record, |_| None).expect("decode"), Message::Call(call));
    }

    #[test]
    fn v7_replies_round_trip(body in reply_body(), xid in any::<u32>(), fragment in 1usize..100) {
        let mut encoded = Vec::new();
        encode_reply(&mut encoded, xid, &body);
        let record = through_fragments(&encoded, fragment, 7);
        let decoded = decode_message(record, |got| (got == xid).then_some(Proc::Subscribe)).expect("decode");
        prop_assert_eq!(decoded, Message::Reply(Reply { xid, body }));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = decode_message(bytes.clone(), |_| Some(Proc::Subscribe));
        let _ = decode_message(bytes.clone(), |_| None);
        let _ = decode_product(&bytes);
        let mut reader = RecordReader::new(1000);
        reader.push(&bytes);
        while let Ok(Some(record)) = reader.next_record() {
            let _ = decode_message(record.to_vec(), |_| Some(Proc::Subscribe));
        }
    }

    #[test]
    fn plausible_v7_headers_with_garbage_never_panic(proc in 0u32..12, reply in any::<bool>(), tail in proptest::collection::vec(any::<u8>(), 0..300)) {
        let mut record = if reply {
            vec![0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        } else {
            let mut call = vec![0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 4, 0x93, 0xfd, 0, 0, 0, 7];
            call.extend_from_slice(&proc.to_be_bytes());
            call.extend_from_slice(&[0; 16]);
            call
        };
        record.extend_from_slice(&tail);
        let _ = decode_message(record, |_| Proc::from_number(proc));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Large fragments are assembled in place (`DIRECT_FRAGMENT_MIN`); whatever the
    /// fragmentation, the read boundaries and the peeks, the records come out whole and in order.
    #[test]
    fn large_records_survive_any_fragmentation_and_reads(
        sizes in proptest::collection::vec(0usize..300_000, 1..4),
        fragment in 1_000usize..200_000,
        chunks in proptest::collection::vec(1usize..100_000, 1..8),
        peek in any::<bool>(),
    ) {
        let bodies: Vec<Vec<u8>> = sizes.iter().enumerate()
            .map(|(n, size)| (0..*size).map(|k| (k * 7 + n) as u8).collect())
            .collect();
        let mut stream = Vec::new();
        for body in &bodies {
            write_fragmented(&mut stream, body, fragment);
        }
        let mut reader = RecordReader::new(1 << 20);
        let mut got = Vec::new();
        let mut rest = &stream[..];
        let mut turn = 0;
        while !rest.is_empty() {
            let take = chunks[turn % chunks.len()].min(rest.len());
            turn += 1;
            reader.push(&rest[..take]);
            rest = &rest[take..];
            loop {
                let peeked = if peek { reader.peek_record().expect("valid").map(<[u8]>::to_vec) } else { None };
                let next = reader.next_record().expect("valid");
                if peek {
                    prop_assert_eq!(&peeked, &next.as_ref().map(|record| record.to_vec()));
                }
                match next {
                    Some(record) => got.push(record),
                    None => break,
                }
            }
        }
        prop_assert_eq!(reader.pending(), 0);
        prop_assert_eq!(got, bodies);
    }
}

#[test]
fn bounds_are_enforced_before_allocating() {
    // A switch id over the bound.
    let long = "x".repeat(STRING_LEN_MAX + 1);
    let mut record = Vec::new();
    let request = McastSubReq {
        feed: FeedType::EXP,
        vc_end: VcEndPoint { switch_id: long, port_id: String::new(), vlan_id: 1 },
        offer: None,
    };
    encode_call(&mut record, &Call { xid: 1, call: Ldm7Call::Subscribe(request) });
    assert!(matches!(decode_message(record[4..].to_vec(), |_| None), Err(XdrError::TooLong { field: "switchId", .. })));

    // A product claiming 4 GB of data that is not there.
    let info = ProdInfo {
        arrival: Timestamp::ZERO,
        signature: Signature([0; 16]),
        origin: "o".into(),
        feedtype: FeedType::EXP,
        seqno: 0,
        ident: "i".into(),
        size: u32::MAX,
    };
    let mut record = Vec::new();
    ldm7_xdr::ldm7::encode_deliver_backlog_product(&mut record, 1, &info, b"");
    assert!(matches!(decode_message(record[4..].to_vec(), |_| None), Err(XdrError::Truncated { .. })));

    // Version 6 and unknown procedures are answerable errors, not panics.
    let mut v6 = Vec::new();
    ldm7_xdr::ldm::encode_call(
        &mut v6,
        &ldm7_xdr::ldm::Call { xid: 9, version: 6, call: ldm7_xdr::ldm::LdmCall::Nullproc },
    );
    let error = decode_message(v6[4..].to_vec(), |_| None).unwrap_err();
    assert_eq!(error.unserved_call_versions(7, 7), Some((9, AcceptStat::ProgMismatch { low: 7, high: 7 })));
    let mut unknown = Vec::new();
    encode_call(&mut unknown, &Call { xid: 10, call: Ldm7Call::TestConnection });
    unknown[4 + 20..4 + 24].copy_from_slice(&9u32.to_be_bytes());
    let error = decode_message(unknown[4..].to_vec(), |_| None).unwrap_err();
    assert_eq!(error.unserved_call(), Some((10, AcceptStat::ProcUnavail)));
}
