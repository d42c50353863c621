//! Record reassembly and LDM message decoding (versions 6 and 7) on arbitrary bytes: never a
//! panic, and whatever decodes re-encodes to the same bytes.
#![no_main]

use ldm7_xdr::ldm::{Message, Proc, decode_message, encode_call, encode_reply};
use ldm7_xdr::ldm7;
use ldm7_xdr::rpc::RecordReader;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut reader = RecordReader::new(1 << 16);
    reader.push(data);
    let mut records = vec![data.to_vec()];
    while let Ok(Some(record)) = reader.next_record() {
        records.push(record.to_vec());
    }
    for record in records {
        for proc in [None, Some(Proc::Feedme), Some(Proc::Hiya), Some(Proc::ComingSoon), Some(Proc::IsAlive)] {
            if let Ok(message) = decode_message(&record, |_| proc) {
                let mut again = Vec::new();
                match &message {
                    Message::Call(call) => encode_call(&mut again, call),
                    Message::Reply(reply) => encode_reply(&mut again, reply.xid, &reply.body),
                }
                assert_eq!(decode_message(&again[4..], |_| proc).as_ref(), Ok(&message));
            }
        }
        for proc in [None, Some(ldm7::Proc::Subscribe), Some(ldm7::Proc::TestConnection)] {
            if let Ok(message) = ldm7::decode_message(record.clone(), |_| proc) {
                let mut again = Vec::new();
                match &message {
                    ldm7::Message::Call(call) => ldm7::encode_call(&mut again, call),
                    ldm7::Message::Reply(reply) => ldm7::encode_reply(&mut again, reply.xid, &reply.body),
                }
                assert_eq!(ldm7::decode_message(again[4..].to_vec(), |_| proc).as_ref(), Ok(&message));
            }
        }
        let _ = ldm7::decode_product(&record);
    }
});
