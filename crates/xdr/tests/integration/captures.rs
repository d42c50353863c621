//! Byte-exact tests against real Unidata LDM 6.15 traffic (`shared/data/captures/ldm6-*.txt`,
//! the annotated transcripts of the `.pcap` files): every record of every connection is
//! reassembled, decoded, re-encoded and compared byte for byte; decoded fields are checked
//! against the transcripts' annotations. Also the HEREIS example of ldm6-protocol.md §9.

use std::collections::HashMap;

use ldm7_types::{FeedType, Signature, Timestamp};
use ldm7_xdr::ldm::{
    AuthStat, Call, FornmeReply, HiyaReply, LdmCall, Message, Proc, ReplyBody, decode_message, encode_call,
    encode_reply,
};
use ldm7_xdr::rpc::{AcceptStat, RecordReader};

/// The byte streams of a transcript: per connection, (client→server, server→client); `None`
/// (the test skips) when the shared data is absent.
fn streams(name: &str) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    let path = ldm7_testkit::shared_data_or_skip(&format!("captures/{name}"))?;
    let text = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    let mut connections: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut current: Option<bool> = None; // Some(true) = C>S
    for line in text.lines() {
        if line.starts_with("## Connection") {
            connections.push((Vec::new(), Vec::new()));
            current = None;
        } else if let Some(rest) = line.strip_prefix("### Byte stream ") {
            current = Some(rest.starts_with("C>S"));
        } else if line.starts_with("###") {
            current = None;
        } else if let (Some(client), Some(connection)) = (current, connections.last_mut()) {
            let Some((offset, rest)) = line.split_once("  ") else { continue };
            if offset.len() != 8 || !offset.chars().all(|c| c.is_ascii_hexdigit()) {
                continue;
            }
            let hex = rest.split('|').next().unwrap_or("");
            let stream = if client { &mut connection.0 } else { &mut connection.1 };
            for word in hex.split_whitespace() {
                for k in (0..word.len()).step_by(2) {
                    stream.push(u8::from_str_radix(&word[k..k + 2], 16).expect("hex"));
                }
            }
        }
    }
    assert!(!connections.is_empty(), "{name}: no connections found");
    Some(connections)
}

fn records(stream: &[u8]) -> Vec<Vec<u8>> {
    let mut reader = RecordReader::new(1 << 20);
    // Feed in small uneven pieces: reassembly must not depend on read boundaries.
    for chunk in stream.chunks(7) {
        reader.push(chunk);
    }
    let mut records = Vec::new();
    while let Some(record) = reader.next_record().expect("valid record marking") {
        records.push(record.to_vec());
    }
    assert_eq!(reader.pending(), 0, "bytes left over");
    records
}

/// Decodes every record of a connection, re-encodes it and compares; returns the messages of
/// (client→server, server→client).
fn round_trip(client: &[u8], server: &[u8]) -> (Vec<Message>, Vec<Message>) {
    let (client, server) = (records(client), records(server));
    // Calls by xid, both directions: replies are typed by the call they answer.
    let mut calls: HashMap<u32, Proc> = HashMap::new();
    for record in client.iter().chain(&server) {
        if let Ok(Message::Call(call)) = decode_message(record, |_| None) {
            calls.insert(call.xid, call.call.proc());
        }
    }
    let decode_all = |records: &[Vec<u8>]| {
        records
            .iter()
            .map(|record| {
                let message = decode_message(record, |xid| calls.get(&xid).copied())
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
    (decode_all(&client), decode_all(&server))
}

fn signature(hex: &str) -> Signature {
    hex.parse().expect("signature")
}

#[test]
fn feedme_primary_round_trips_byte_for_byte() {
    let Some(connections) = streams("ldm6-feedme-primary.txt") else { return };
    let (client, server) = round_trip(&connections[0].0, &connections[0].1);
    let Message::Call(Call { call: LdmCall::Feedme { class, max_hereis }, version: 6, .. }) = &client[0] else {
        panic!("{:?}", client[0])
    };
    assert_eq!(*max_hereis, u32::MAX);
    assert_eq!(class.to, Timestamp::END);
    assert_eq!((class.specs[0].feedtype, class.specs[0].pattern.as_str()), (FeedType::EXP, ".*"));
    assert!(matches!(&server[0], Message::Reply(reply) if reply.body == ReplyBody::Fornme(FornmeReply::Ok(29362))));
    let products: Vec<_> = server
        .iter()
        .filter_map(|message| match message {
            Message::Call(Call { call: LdmCall::Hereis { info, data }, .. }) => Some((info, data)),
            _ => None,
        })
        .collect();
    assert_eq!(products.len(), 3);
    assert_eq!(products[0].0.ident, "TEST/cap.1");
    assert_eq!(products[0].0.signature, signature("99472f8d2f760bcc394e80d09275150a"));
    assert_eq!(products[0].0.origin, "vm");
    assert_eq!(products[2].0.size, 19);
    assert_eq!(products[2].1.as_slice(), b"hello 3, unaligned\n");
    assert_eq!(products[0].0.arrival, Timestamp { secs: 1_795_338_382, micros: 859_218 });
}

#[test]
fn feedme_alternate_round_trips_byte_for_byte() {
    let Some(connections) = streams("ldm6-feedme-alternate.txt") else { return };
    let (client, server) = connections.iter().map(|(c, s)| round_trip(c, s)).next_back().expect("a connection");
    assert!(matches!(&client[0], Message::Call(Call { call: LdmCall::Feedme { max_hereis: 0, .. }, .. })));
    let coming: Vec<_> = server
        .iter()
        .filter_map(|message| match message {
            Message::Call(Call { call: LdmCall::ComingSoon { info, pktsz }, .. }) => Some((info.size, *pktsz)),
            _ => None,
        })
        .collect();
    assert_eq!(coming, [(8, 8), (8, 8), (19, 19)]);
    let blocks: Vec<_> = server
        .iter()
        .filter_map(|message| match message {
            Message::Call(Call { call: LdmCall::BlkData { pktnum, data, .. }, .. }) => Some((*pktnum, data.len())),
            _ => None,
        })
        .collect();
    assert_eq!(blocks, [(0, 8), (0, 8), (0, 19)]);
    let answers =
        client.iter().filter(|m| matches!(m, Message::Reply(r) if matches!(r.body, ReplyBody::ComingSoon(_))));
    assert_eq!(answers.count(), 3);
}

#[test]
fn notifyme_round_trips_including_proc_unavail_replies() {
    let Some(connections) = streams("ldm6-notifyme.txt") else { return };
    let (client, server) = round_trip(&connections[0].0, &connections[0].1);
    assert!(matches!(&client[0], Message::Call(Call { call: LdmCall::Notifyme(_), .. })));
    let notifications =
        server.iter().filter(|m| matches!(m, Message::Call(Call { call: LdmCall::Notification(_), .. }))).count();
    assert_eq!(notifications, 3);
    let unavailable = client
        .iter()
        .filter(|m| matches!(m, Message::Reply(r) if r.body == ReplyBody::Error(AcceptStat::ProcUnavail)))
        .count();
    assert_eq!(unavailable, 3);
}

#[test]
fn hiya_round_trips_byte_for_byte() {
    let Some(connections) = streams("ldm6-hiya.txt") else { return };
    let (client, server) = round_trip(&connections[0].0, &connections[0].1);
    assert!(matches!(&client[0], Message::Call(Call { call: LdmCall::Hiya(_), .. })));
    assert!(matches!(&server[0], Message::Reply(r) if r.body == ReplyBody::Hiya(HiyaReply::Ok(u32::MAX))));
    let hereis =
        client.iter().filter(|m| matches!(m, Message::Call(Call { call: LdmCall::Hereis { .. }, .. }))).count();
    assert_eq!(hereis, 3);
}

#[test]
fn refusals_round_trip_byte_for_byte() {
    let Some(connections) = streams("ldm6-refused.txt") else { return };
    let mut reclass = 0;
    let mut denied_xids = Vec::new();
    for (client, server) in &connections {
        let (_, replies) = round_trip(client, server);
        for message in replies {
            match message {
                Message::Reply(reply) if matches!(reply.body, ReplyBody::Fornme(FornmeReply::Reclass(_))) => {
                    reclass += 1
                }
                Message::Reply(reply) if reply.body == ReplyBody::Denied(AuthStat::TooWeak) => {
                    denied_xids.push(reply.xid)
                }
                _ => {}
            }
        }
    }
    assert_eq!(reclass, 1);
    // One refused request (its own xid) and one host not allowed (xid 0).
    assert!(denied_xids.contains(&0), "{denied_xids:x?}");
    assert!(denied_xids.iter().any(|xid| *xid != 0), "{denied_xids:x?}");
}

#[test]
fn hereis_example_of_the_spec_is_byte_exact() {
    let expected = "8000007c 12345678 00000000 00000002 000493fd 00000006 00000001 00000000 00000000 00000000 \
                    00000000 6553f100 0001e240 338dc638 a6e14268 39f74d2e a06f5678 00000010 686f7374 2e657861 \
                    6d706c65 2e656475 00000002 0000002a 0000000a 54455354 2e696465 6e740000 0000000c 48656c6c \
                    6f2c204c 444d210a";
    let expected: Vec<u8> = expected
        .split_whitespace()
        .flat_map(|word| (0..8).step_by(2).map(move |k| u8::from_str_radix(&word[k..k + 2], 16).expect("hex")))
        .collect();
    let info = ldm7_types::ProdInfo {
        arrival: Timestamp { secs: 1_700_000_000, micros: 123_456 },
        signature: signature("338dc638a6e1426839f74d2ea06f5678"),
        origin: "host.example.edu".into(),
        feedtype: FeedType(2),
        seqno: 42,
        ident: "TEST.ident".into(),
        size: 12,
    };
    let mut out = Vec::new();
    ldm7_xdr::ldm::encode_hereis(&mut out, 0x1234_5678, &info, b"Hello, LDM!\n");
    assert_eq!(out, expected);
    let decoded = decode_message(&out[4..], |_| None).expect("decode");
    assert_eq!(
        decoded,
        Message::Call(Call {
            xid: 0x1234_5678,
            version: 6,
            call: LdmCall::Hereis { info, data: b"Hello, LDM!\n".to_vec() }
        })
    );
}
