//! Test vectors from a real LDM-7 capture (`shared/data/captures/fmtp-ldm7.txt` / `.pcap`,
//! Unidata LDM `a6513010`): every multicast datagram and every message of the retransmission
//! TCP connection is decoded field by field and re-emitted byte-identically.

use ldm7_fmtp_proto::index::ProductIndex;
use ldm7_fmtp_proto::time::WallTime;
use ldm7_fmtp_proto::wire::{self, Body, Bop, Message, MessageType, Packet, Split, handshake};

/// The 15 multicast datagrams (UDP payloads), in capture order, with their `[DROPPED]` mark.
const DATAGRAMS: [(&str, bool, &str); 15] = [
    (
        "#1",
        false,
        "00000000 00000000 00220001 00000000 6b02b0ef 2d189bf1 00000044 00109947 2f8d2f76 0bcc394e 80d09275 150a",
    ),
    (
        "#2",
        true,
        "00000000 00000000 00440004 6b02b0ef 000ac16a 99472f8d 2f760bcc 394e80d0 9275150a 00000002 766d0000 40000000 00000001 0000000a 54455354 2f636170 2e310000 00000008 68656c6c 6f20310a",
    ),
    ("#3", false, "00000000 00000000 00000002"),
    (
        "#4",
        false,
        "00000001 00000000 00220001 00000000 6b02b0ef 2d1b33dc 00000044 001026c5 cb6d09e6 4fbeeb09 c9cd9c01 83f2",
    ),
    (
        "#5",
        false,
        "00000001 00000000 00440004 6b02b0ef 000af26c 26c5cb6d 09e64fbe eb09c9cd 9c0183f2 00000002 766d0000 40000000 00000002 0000000a 54455354 2f636170 2e320000 00000008 68656c6c 6f20320a",
    ),
    ("#6", true, "00000001 00000000 00000002"),
    (
        "#7",
        false,
        "00000002 00000000 00220001 00000000 6b02b0ef 2d1bbf71 00000044 0010b6ad bdcdf075 12b2f9d1 8b417453 a896",
    ),
    (
        "#8",
        false,
        "00000002 00000000 00440004 6b02b0ef 000b2219 b6adbdcd f07512b2 f9d18b41 7453a896 00000002 766d0000 40000000 00000003 0000000a 54455354 2f636170 2e330000 00000008 68656c6c 6f20330a",
    ),
    ("#9", false, "00000002 00000000 00000002"),
    (
        "#10",
        true,
        "00000003 00000000 00220001 00000000 6b02b0ef 2d1c35aa 00000044 00107735 73951a7d 06ef9ca2 c58cfa9b 2026",
    ),
    (
        "#11",
        false,
        "00000003 00000000 00440004 6b02b0ef 000b5104 77357395 1a7d06ef 9ca2c58c fa9b2026 00000002 766d0000 40000000 00000004 0000000a 54455354 2f636170 2e340000 00000008 68656c6c 6f20340a",
    ),
    ("#12", false, "00000003 00000000 00000002"),
    (
        "#13",
        false,
        "00000004 00000000 00220001 00000000 6b02b0ef 2d1ca60f 00000044 001074c9 65fe228a 11b38c9f 39337657 bb52",
    ),
    (
        "#14",
        true,
        "00000004 00000000 00440004 6b02b0ef 000b7fde 74c965fe 228a11b3 8c9f3933 7657bb52 00000002 766d0000 40000000 00000005 0000000a 54455354 2f636170 2e350000 00000008 68656c6c 6f20350a",
    ),
    ("#15", false, "00000004 00000000 00000002"),
];

/// Byte stream R>S 10.77.0.2:45579 -> 10.77.0.1:42263 (574 bytes), 16 bytes a line.
const STREAM_RECEIVER_TO_SENDER: &str = "\
    000001aa 2d2d2d2d 2d424547 494e2052 \
    53412050 55424c49 43204b45 592d2d2d \
    2d2d0a4d 49494243 674b4341 51454173 \
    4d726d49 614b5152 6e36646a 48537439 \
    717a6849 322b7137 5a312b2b 784f2f66 \
    716d524b 33576878 505a7051 2b4e456d \
    52516d0a 504a5754 6b394e4e 34724137 \
    62785373 4f54596f 6377735a 6f414273 \
    70422f4b 35715531 2f566269 6b662b46 \
    2f656c4f 62583162 72543679 72345a39 \
    446d5374 0a716655 70362f6b 61773658 \
    524b5174 76463953 38627539 536f4c63 \
    4467586d 5872766f 6d627349 6c517052 \
    52625230 4b785245 3358716e 45656868 \
    2f2b3255 640a7054 45785456 6f6b6a59 \
    48364844 62643657 687a464d 33394a69 \
    4e536631 36586637 636c4f2b 34445955 \
    57782b56 4f636746 6f62426b 47376531 \
    3464776d 41440a57 74633943 51424238 \
    62625a47 562b4952 35386453 34504833 \
    7354324c 58794e79 4c54652f 55363662 \
    50372b61 6e563456 63366f4b 3354646d \
    3857594a 48515a0a 444c3077 66524434 \
    5a594458 396b376b 3372792f 78534c7a \
    796c5472 336f7956 55514944 41514142 \
    0a2d2d2d 2d2d454e 44205253 41205055 \
    424c4943 204b4559 2d2d2d2d 2d0a0000 \
    00000000 000005a8 00080000 00020000 \
    00000000 00200000 00000000 00000000 \
    00200000 00030000 00000000 00800000 \
    00010000 00000000 02000000 00040000 \
    000005a8 00080000 00030000 000005a8 \
    00080000 00030000 00000000 02000000 \
    00010000 00000000 00200000 00040000 \
    00000000 00200000 00030000 00000000 \
    00200000 00030000 00000000 0200 \
";

/// Byte stream S>R 10.77.0.1:42263 -> 10.77.0.2:45579 (582 bytes), 16 bytes a line.
const STREAM_SENDER_TO_RECEIVER: &str = "\
    00000100 740d3334 cefdffec 27fdc796 \
    00d6a7f7 0cc363df 2d2979a2 483fddd0 \
    e7477598 a65dc458 e087c088 3220d26f \
    c8754aa9 a932f49f db9dd104 c82c7afe \
    bea5dcdb 57926ce8 874d950d 92a835c5 \
    3c5a374c 6cf80ad1 e699c027 5986ce82 \
    c8e53865 47731917 71d62fce 7932c11f \
    5d4cc48d 5360aba5 2353b762 21de454a \
    88f8d099 a07124ea 486654ea 2eb9871b \
    4982a9c0 d9133104 32091802 7b0d0b98 \
    1f3665f6 66c41f8c ef0f57aa 26a080c3 \
    317a36c3 5dfa6092 37bd61b9 244996d3 \
    ebad8ce1 0b57543f ad325d77 4acbfce5 \
    47d507b8 30c28855 7cd20635 c2affe14 \
    42d03f47 6303e845 dc8654da 03b56654 \
    c78ed89a f9c031e7 45c45a7b 94552e51 \
    a0d8ccb1 00000000 00000000 00440040 \
    6b02b0ef 000ac16a 99472f8d 2f760bcc \
    394e80d0 9275150a 00000002 766d0000 \
    40000000 00000001 0000000a 54455354 \
    2f636170 2e310000 00000008 68656c6c \
    6f20310a 00000003 00000000 00220100 \
    00000000 6b02b0ef 2d1c35aa 00000044 \
    00107735 73951a7d 06ef9ca2 c58cfa9b \
    20260000 00010000 00000000 04000000 \
    00040000 00000044 00406b02 b0ef000b \
    7fde74c9 65fe228a 11b38c9f 39337657 \
    bb520000 0002766d 00004000 00000000 \
    00050000 000a5445 53542f63 61702e35 \
    00000000 00086865 6c6c6f20 350a0000 \
    00030000 00000044 00406b02 b0ef000b \
    51047735 73951a7d 06ef9ca2 c58cfa9b \
    20260000 0002766d 00004000 00000000 \
    00040000 000a5445 53542f63 61702e34 \
    00000000 00086865 6c6c6f20 340a0000 \
    00030000 00000000 04000000 00030000 \
    00000000 0010 \
";

/// MD5 signatures of the five products (the BOP metadata), from the capture notes.
const SIGNATURES: [&str; 5] = [
    "99472f8d2f760bcc394e80d09275150a",
    "26c5cb6d09e64fbeeb09c9cd9c0183f2",
    "b6adbdcdf07512b2f9d18b417453a896",
    "773573951a7d06ef9ca2c58cfa9b2026",
    "74c965fe228a11b38c9f39337657bb52",
];
/// BOP start-time nanoseconds of products 0..5 (seconds are all 1795338479).
const START_NANOS: [u32; 5] = [756_587_505, 756_757_468, 756_793_201, 756_823_466, 756_852_239];
const START_SECS: u64 = 1_795_338_479;
/// XDR `prod_info` arrival microseconds of products 0..5 (seconds 1795338479).
const ARRIVAL_MICROS: [u32; 5] = [704_874, 717_420, 729_625, 741_636, 753_630];

fn hex(text: &str) -> Vec<u8> {
    let digits: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    assert_eq!(digits.len() % 2, 0, "odd hex length");
    digits.chunks(2).map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap()).collect()
}

/// The 68-byte FMTP product (XDR-encoded LDM product) of capture product `n` (0-based).
fn product_bytes(n: usize) -> Vec<u8> {
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&(START_SECS as u32).to_be_bytes());
    bytes.extend_from_slice(&ARRIVAL_MICROS[n].to_be_bytes());
    bytes.extend_from_slice(&hex(SIGNATURES[n]));
    bytes.extend_from_slice(&hex("00000002 766d0000 40000000"));
    bytes.extend_from_slice(&(n as u32 + 1).to_be_bytes());
    bytes.extend_from_slice(&hex("0000000a"));
    bytes.extend_from_slice(format!("TEST/cap.{}\0\0", n + 1).as_bytes());
    bytes.extend_from_slice(&hex("00000008"));
    bytes.extend_from_slice(format!("hello {}\n", n + 1).as_bytes());
    bytes
}

fn expect_bop(bop: &Bop<'_>, n: usize) {
    assert_eq!(bop.start_time, WallTime { secs: START_SECS, nanos: START_NANOS[n] });
    assert_eq!(bop.product_size, 68);
    assert_eq!(bop.metadata, hex(SIGNATURES[n]));
}

fn assert_reemits(message: &Message<'_>, bytes: &[u8]) {
    assert_eq!(message.buffer_len(), bytes.len());
    assert_eq!(message.to_vec().unwrap(), bytes, "re-emission of {message:?}");
}

#[test]
fn multicast_datagrams_decode_field_by_field() {
    assert_eq!(DATAGRAMS.iter().filter(|(_, dropped, _)| *dropped).count(), 4);
    for (position, (name, _, text)) in DATAGRAMS.iter().enumerate() {
        let bytes = hex(text);
        let n = position / 3;
        let packet = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(packet.index(), ProductIndex(n as u32), "{name}");
        assert_eq!(packet.seqnum(), 0, "{name}");
        let message = Message::parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(message.index, ProductIndex(n as u32));
        match (position % 3, message.body) {
            (0, Body::Bop(bop)) => {
                assert_eq!(packet.flags(), 0x0001);
                assert_eq!(packet.payload_len(), 34);
                assert_eq!(bytes.len(), 46);
                expect_bop(&bop, n);
            }
            (1, Body::MemData { offset, data }) => {
                assert_eq!(packet.flags(), 0x0004);
                assert_eq!(packet.payload_len(), 68);
                assert_eq!(bytes.len(), 80);
                assert_eq!(offset, 0);
                assert_eq!(data, product_bytes(n), "{name}");
            }
            (2, Body::Eop) => {
                assert_eq!(packet.flags(), 0x0002);
                assert_eq!(bytes.len(), 12);
            }
            (_, body) => panic!("{name}: unexpected {body:?}"),
        }
        assert!(message.message_type().is_multicast());
        assert_reemits(&message, &bytes);
    }
}

#[test]
fn datagram_rule_needs_exact_length() {
    let mut bytes = hex(DATAGRAMS[2].2);
    bytes.push(0);
    assert!(matches!(Message::parse(&bytes), Err(wire::Error::TrailingBytes { expected: 12, actual: 13 })));
    let bytes = hex(DATAGRAMS[1].2);
    assert!(matches!(Message::parse(&bytes[..79]), Err(wire::Error::Truncated { needed: 80, available: 79 })));
}

/// Splits a stream into its handshake blob and FMTP messages, checking each re-emits exactly.
fn split_stream(stream: &[u8]) -> (Vec<u8>, Vec<Message<'_>>) {
    let Ok(Split::Frame { frame: blob, mut rest }) = handshake::split_blob(stream) else {
        panic!("no handshake blob");
    };
    let mut messages = Vec::new();
    while !rest.is_empty() {
        match wire::split_frame(rest).unwrap() {
            Split::Frame { frame, rest: after } => {
                let message = Message::parse(frame).unwrap();
                assert_reemits(&message, frame);
                messages.push(message);
                rest = after;
            }
            Split::Incomplete { needed } => panic!("stream ends inside a message ({needed} bytes missing)"),
        }
    }
    (blob.to_vec(), messages)
}

/// Interop of the key exchange (§3.7) with the captured reference receiver: its offer is a key
/// our sender can encrypt to (levels 0 and 1 give the 256-byte answer the reference sender
/// gave), and our receiver's offer has the reference's exact form.
#[test]
fn the_captured_key_offer_is_answered_as_the_reference_answered_it() {
    use ldm7_fmtp_proto::mac::{self, CIPHERTEXT_LEN, KeyOffer, MacLevel, SenderKey};
    let (offer, _) = split_stream(&hex(STREAM_RECEIVER_TO_SENDER));
    let (answer, _) = split_stream(&hex(STREAM_SENDER_TO_RECEIVER));
    assert_eq!(answer.len(), CIPHERTEXT_LEN, "the reference sender's answer at level 0");
    for level in [MacLevel::None, MacLevel::Hmac] {
        let key = SenderKey::generate(level, &mut rand_core::OsRng);
        let ours = mac::answer_offer(&offer, &key.material(), None, &mut rand_core::OsRng).expect("the offer is a key");
        assert_eq!(ours.len(), answer.len(), "level {level}");
    }
    let ours = KeyOffer::generate(&mut rand_core::OsRng).expect("key");
    let shape = |pem: &[u8]| -> Vec<usize> { pem.split(|byte| *byte == b'\n').map(<[u8]>::len).collect() };
    assert_eq!(shape(ours.pem()), shape(&offer), "same header, 64-column lines, footer");
    assert_eq!(&ours.pem()[..40], &offer[..40], "same PEM label and DER prefix (PKCS#1, 2048-bit, e = 65537)");
}

#[test]
fn receiver_to_sender_stream_decodes() {
    let stream = hex(STREAM_RECEIVER_TO_SENDER);
    assert_eq!(stream.len(), 574);
    let (blob, messages) = split_stream(&stream);
    assert_eq!(blob.len(), 426);
    assert!(blob.starts_with(b"-----BEGIN RSA PUBLIC KEY-----\nMIIBCgKCA"));
    assert!(blob.ends_with(b"-----END RSA PUBLIC KEY-----\n"));
    let expected = [
        (0, Body::RetxReq { offset: 0, len: 1448 }),
        (2, Body::RetxEnd),
        (0, Body::RetxEnd),
        (3, Body::BopReq),
        (1, Body::EopReq),
        (4, Body::RetxReq { offset: 0, len: 1448 }),
        (3, Body::RetxReq { offset: 0, len: 1448 }),
        (3, Body::EopReq),
        (1, Body::RetxEnd),
        (4, Body::RetxEnd),
        (3, Body::RetxEnd),
        (3, Body::EopReq),
    ];
    assert_eq!(messages.len(), expected.len());
    for (message, (index, body)) in messages.iter().zip(expected) {
        assert_eq!(*message, Message { index: ProductIndex(index), body });
    }
    // The request is 12 bytes on the wire although payloadlen = 1448 (bytes wanted).
    assert_eq!(&stream[430..442], hex("00000000 00000000 05a80008"));
}

#[test]
fn sender_to_receiver_stream_decodes() {
    let stream = hex(STREAM_SENDER_TO_RECEIVER);
    assert_eq!(stream.len(), 582);
    let (blob, messages) = split_stream(&stream);
    assert_eq!(blob.len(), 256);
    assert_eq!(messages.len(), 7);
    let data = |n: usize| product_bytes(n);
    let (d0, d4, d3) = (data(0), data(4), data(3));
    let expected_plain = [
        (0, Body::RetxData { offset: 0, data: &d0 }),
        (1, Body::RetxEop),
        (4, Body::RetxData { offset: 0, data: &d4 }),
        (3, Body::RetxData { offset: 0, data: &d3 }),
        (3, Body::RetxEop),
        (3, Body::RetxRej),
    ];
    let mut plain = messages.iter().filter(|m| m.message_type() != MessageType::RetxBop);
    for (index, body) in expected_plain {
        assert_eq!(*plain.next().unwrap(), Message { index: ProductIndex(index), body });
    }
    let Body::RetxBop(bop) = messages[1].body else { panic!("second message is not RETX_BOP: {:?}", messages[1]) };
    assert_eq!(messages[1].index, ProductIndex(3));
    expect_bop(&bop, 3);
    // The RETX_BOP body is byte-identical to the multicast BOP it repeats (§3.4).
    assert_eq!(&stream[260 + 80 + 12..260 + 80 + 46], &hex(DATAGRAMS[9].2)[12..]);
}

#[test]
fn stream_split_at_every_boundary_needs_the_right_bytes() {
    let stream = hex(STREAM_SENDER_TO_RECEIVER);
    let messages = &stream[260..];
    for cut in 0..80 {
        match wire::split_frame(&messages[..cut]).unwrap() {
            Split::Incomplete { needed } if cut < 12 => assert_eq!(needed, 12 - cut),
            Split::Incomplete { needed } => assert_eq!(needed, 80 - cut),
            Split::Frame { .. } => panic!("frame at {cut} bytes"),
        }
    }
}

mod replay {
    //! The state machines against the capture: our sender reproduces the reference's bytes, our
    //! receiver recovers the reference's losses.

    use super::*;
    use ldm7_fmtp_proto::{
        Destination, Instant, OutgoingProduct, Receiver, ReceiverConfig, ReceiverEvent, ReceiverId, Sender,
        SenderConfig,
    };

    /// Capture time `t` (seconds after the first packet, as printed) as an instant.
    fn at(t: &str) -> Instant {
        let (whole, fraction) = t.split_once('.').unwrap();
        Instant::from_nanos(
            whole.parse::<u64>().unwrap() * 1_000_000_000 + format!("{fraction:0<9}").parse::<u64>().unwrap(),
        )
    }

    /// First packet of the capture: 1795338473.696846.
    const FIRST_PACKET: WallTime = WallTime { secs: 1_795_338_473, nanos: 696_846_000 };

    fn sender_with_capture_products(receivers: &[ReceiverId]) -> Sender {
        let config = SenderConfig { multicast_without_receivers: true, ..SenderConfig::default() };
        let mut sender = Sender::new(config, Instant::ZERO).unwrap();
        for id in receivers {
            sender.receiver_connected(Instant::ZERO, *id);
        }
        for n in 0..5 {
            sender.set_wall_clock(Instant::ZERO, WallTime { secs: START_SECS, nanos: START_NANOS[n] });
            let index =
                sender.enqueue(Instant::ZERO, OutgoingProduct::new(product_bytes(n), hex(SIGNATURES[n]))).unwrap();
            assert_eq!(index, ProductIndex(n as u32));
        }
        sender
    }

    #[test]
    fn sender_multicasts_the_captured_datagrams() {
        let mut sender = sender_with_capture_products(&[]);
        let mut buf = Vec::new();
        let mut datagrams = Vec::new();
        while let Some(transmit) = sender.poll_transmit(Instant::ZERO, &mut buf) {
            assert_eq!(transmit.destination, Destination::Multicast);
            datagrams.push(std::mem::take(&mut buf));
        }
        let expected: Vec<Vec<u8>> = DATAGRAMS.iter().map(|(_, _, text)| hex(text)).collect();
        assert_eq!(datagrams, expected);
    }

    #[test]
    fn sender_answers_the_captured_requests_byte_for_byte() {
        let id = ReceiverId(1);
        let mut sender = sender_with_capture_products(&[id]);
        let mut buf = Vec::new();
        while sender.poll_transmit(Instant::ZERO, &mut buf).is_some() {}
        buf.clear();
        let requests = hex(STREAM_RECEIVER_TO_SENDER);
        let mut rest = &requests[430..];
        while let Ok(Split::Frame { frame, rest: after }) = wire::split_frame(rest) {
            sender.handle_stream_frame(Instant::ZERO, id, frame).unwrap();
            // A driver writes answers as soon as they are produced.
            while let Some(transmit) = sender.poll_transmit(Instant::ZERO, &mut buf) {
                assert_eq!(transmit.destination, Destination::Receiver(id));
            }
            rest = after;
        }
        assert_eq!(buf, hex(STREAM_SENDER_TO_RECEIVER)[260..]);
    }

    #[test]
    fn receiver_recovers_the_captured_losses() {
        // The capture's receiver believed every index (the reference has no confirmation).
        let config = ReceiverConfig { index_trust: ldm7_fmtp_proto::IndexTrust::All, ..ReceiverConfig::default() };
        let mut receiver = Receiver::new(config).unwrap();
        receiver.set_wall_clock(Instant::ZERO, FIRST_PACKET);
        let times = [
            "6.059805", "6.059836", "6.059843", "6.059915", "6.059920", "6.059925", "6.059950", "6.059955", "6.059960",
            "6.059980", "6.059985", "6.059989", "6.060009", "6.060014", "6.060018",
        ];
        for ((_, dropped, text), t) in DATAGRAMS.iter().zip(times) {
            if !dropped {
                receiver.handle_datagram(at(t), &hex(text));
            }
        }
        let requests: Vec<Message<'static>> = std::iter::from_fn(|| receiver.poll_transmit()).collect();
        let expected = [
            (0, Body::RetxReq { offset: 0, len: 68 }),
            (1, Body::RetxEnd),
            (2, Body::RetxEnd),
            (3, Body::BopReq),
            (4, Body::RetxReq { offset: 0, len: 68 }),
        ];
        let expected: Vec<Message<'static>> =
            expected.into_iter().map(|(index, body)| Message { index: ProductIndex(index), body }).collect();
        assert_eq!(requests, expected);
        // The reference sender's answers (it answered somewhat different requests; the extra
        // RETX_EOPs, the second RETX_DATA for product 3 and the final RETX_REJ are ignored).
        let answers = hex(STREAM_SENDER_TO_RECEIVER);
        let mut rest = &answers[260..];
        while let Ok(Split::Frame { frame, rest: after }) = wire::split_frame(rest) {
            receiver.handle_stream_frame(at("6.149"), frame).unwrap();
            rest = after;
        }
        let ends: Vec<u32> = std::iter::from_fn(|| receiver.poll_transmit())
            .map(|m| {
                assert_eq!(m.body, Body::RetxEnd);
                m.index.0
            })
            .collect();
        assert_eq!(ends, vec![0, 3, 4]);
        let mut delivered = Vec::new();
        let mut started = Vec::new();
        while let Some(event) = receiver.poll_event() {
            if let ReceiverEvent::Started { index } = event {
                started.push(index.0);
                continue;
            }
            let ReceiverEvent::Delivered(delivery) = event else { panic!("unexpected {event:?}") };
            let n = delivery.index.0 as usize;
            assert_eq!(delivery.data, product_bytes(n));
            assert_eq!(delivery.metadata, hex(SIGNATURES[n]));
            assert_eq!(delivery.start_time, WallTime { secs: START_SECS, nanos: START_NANOS[n] });
            delivered.push((n, delivery.retransmitted_blocks));
            if n == 1 {
                // Completed by datagram #5 at 6.059920: 1795338479.756766000 − .756757468.
                assert_eq!(delivery.latency_ns, 8_532);
            }
        }
        // Product 3's block arrived before its BOP and was kept: no data retransmission.
        assert_eq!(delivered, vec![(1, 0), (2, 0), (0, 1), (3, 0), (4, 1)]);
        assert_eq!(started, vec![0], "the first multicast message was product 0's");
        let counters = receiver.counters();
        assert_eq!(counters.delivered, 5);
        assert_eq!(counters.missed, 0);
        assert_eq!(receiver.in_flight_products(), 0);
    }
}
