//! Property tests: generated messages survive encode → fragment arbitrarily → reassemble →
//! decode; arbitrary bytes never make the decoders panic; bounds hold.

use ldm7_types::{FeedType, ProdInfo, Signature, Timestamp};
use ldm7_xdr::ldm::{Call, LdmCall, Message, Proc, WireClass, WireSpec, decode_message, encode_call};
use ldm7_xdr::rpc::{RecordReader, write_fragmented};
use proptest::prelude::*;

fn text(max: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec(0x20u8..0x7f, 0..=max).prop_map(|bytes| String::from_utf8(bytes).expect("ascii"))
}

fn timestamp() -> impl Strategy<Value = Timestamp> {
    (any::<i32>(), -1i32..1_000_000).prop_map(|(secs, micros)| Timestamp { secs: i64::from(secs), micros })
}

fn prod_info(size: u32) -> impl Strategy<Value = ProdInfo> {
    (timestamp(), any::<[u8; 16]>(), text(64), any::<u32>(), any::<u32>(), text(255)).prop_map(
        move |(arrival, signature, origin, feedtype, seqno, ident)| ProdInfo {
            arrival,
            signature: Signature(signature),
            origin,
            feedtype: FeedType(feedtype),
            seqno,
            ident,
            size,
        },
    )
}

fn class() -> impl Strategy<Value = WireClass> {
    (timestamp(), timestamp(), proptest::collection::vec((any::<u32>(), text(255)), 0..=32)).prop_map(
        |(from, to, specs)| WireClass {
            from,
            to,
            specs: specs
                .into_iter()
                .map(|(feedtype, pattern)| WireSpec { feedtype: FeedType(feedtype), pattern })
                .collect(),
        },
    )
}

fn call() -> impl Strategy<Value = LdmCall> {
    prop_oneof![
        Just(LdmCall::Nullproc),
        proptest::collection::vec(any::<u8>(), 0..3000).prop_flat_map(
            |data| prod_info(data.len() as u32).prop_map(move |info| LdmCall::Hereis { info, data: data.clone() })
        ),
        (class(), any::<u32>()).prop_map(|(class, max_hereis)| LdmCall::Feedme { class, max_hereis }),
        class().prop_map(LdmCall::Hiya),
        class().prop_map(LdmCall::Notifyme),
        prod_info(77).prop_map(LdmCall::Notification),
        (prod_info(5), any::<u32>()).prop_map(|(info, pktsz)| LdmCall::ComingSoon { info, pktsz }),
        (any::<[u8; 16]>(), any::<u32>(), proptest::collection::vec(any::<u8>(), 0..2000))
            .prop_map(|(signature, pktnum, data)| LdmCall::BlkData { signature: Signature(signature), pktnum, data }),
        any::<u32>().prop_map(LdmCall::IsAlive),
    ]
}

proptest! {
    #[test]
    fn calls_round_trip_through_any_fragmentation(call in call(), xid in any::<u32>(), fragment in 1usize..600, chunk in 1usize..300) {
        let call = Call { xid, version: 6, call };
        let mut record = Vec::new();
        encode_call(&mut record, &call);
        let mut fragmented = Vec::new();
        write_fragmented(&mut fragmented, &record[4..], fragment);
        let mut reader = RecordReader::new(1 << 20);
        let mut got = None;
        for piece in fragmented.chunks(chunk) {
            reader.push(piece);
            if let Some(record) = reader.next_record().expect("valid") {
                got = Some(record);
            }
        }
        let got = got.expect("one record");
        prop_assert_eq!(&got[..], &record[4..]);
        prop_assert_eq!(decode_message(&got, |_| None).expect("decode"), Message::Call(call));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = decode_message(&bytes, |_| Some(Proc::Feedme));
        let _ = decode_message(&bytes, |_| Some(Proc::Hiya));
        let _ = decode_message(&bytes, |_| None);
        let mut reader = RecordReader::new(1000);
        reader.push(&bytes);
        while let Ok(Some(record)) = reader.next_record() {
            let _ = decode_message(&record, |_| Some(Proc::ComingSoon));
        }
    }

    #[test]
    fn plausible_headers_with_garbage_never_panic(proc in 0u32..16, tail in proptest::collection::vec(any::<u8>(), 0..300)) {
        let mut record = vec![0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 4, 0x93, 0xfd, 0, 0, 0, 6];
        record.extend_from_slice(&proc.to_be_bytes());
        record.extend_from_slice(&[0; 16]);
        record.extend_from_slice(&tail);
        let _ = decode_message(&record, |_| None);
    }
}

#[test]
fn records_over_the_bound_are_refused_before_buffering() {
    let mut reader = RecordReader::new(1000);
    reader.push(&0x8000_0fa0u32.to_be_bytes());
    assert!(reader.next_record().is_err());
    // A length word claiming 4 GB of product data is refused without allocating it.
    let mut record = Vec::new();
    encode_call(
        &mut record,
        &Call {
            xid: 1,
            version: 6,
            call: LdmCall::Notification(ProdInfo {
                arrival: Timestamp::ZERO,
                signature: Signature([0; 16]),
                origin: "o".into(),
                feedtype: FeedType::EXP,
                seqno: 0,
                ident: "i".into(),
                size: u32::MAX,
            }),
        },
    );
    // Turn the NOTIFICATION (proc 8) into a HEREIS (proc 1) whose data is missing.
    record[4 + 20..4 + 24].copy_from_slice(&1u32.to_be_bytes());
    assert!(decode_message(&record[4..], |_| None).is_err());
}

proptest! {
    /// A HEREIS written as head + data + padding (vectored writes) is byte for byte the record
    /// `encode_hereis` writes.
    #[test]
    fn hereis_head_data_and_padding_equal_the_whole_record(
        (info, data) in proptest::collection::vec(any::<u8>(), 0..3000)
            .prop_flat_map(|data| prod_info(data.len() as u32).prop_map(move |info| (info, data.clone()))),
        xid in any::<u32>(),
    ) {
        let mut whole = Vec::new();
        ldm7_xdr::ldm::encode_hereis(&mut whole, xid, &info, &data);
        let mut pieces = b"earlier bytes".to_vec();
        let pad = ldm7_xdr::ldm::encode_hereis_head(&mut pieces, xid, &info);
        pieces.extend_from_slice(&data);
        pieces.extend(std::iter::repeat_n(0u8, pad));
        prop_assert_eq!(&pieces[b"earlier bytes".len()..], &whole[..]);
    }
}
