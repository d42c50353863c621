//! The FMTP decoder on arbitrary bytes: parsing never panics, and whatever parses re-emits to
//! bytes that parse to the same message. Also the TCP framer and the handshake-blob framer.
#![no_main]

use ldm7_fmtp_proto::wire::{self, Message, Packet, Split, handshake};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(message) = Message::parse(data) {
        let bytes = message.to_vec().expect("a parsed message re-emits");
        assert_eq!(bytes.len(), message.buffer_len());
        assert_eq!(Message::parse(&bytes).expect("re-emitted bytes parse"), message);
    }
    if let Ok(packet) = Packet::new_checked(data) {
        let _ = (packet.index(), packet.seqnum(), packet.payload_len(), packet.flags(), packet.payload());
        let _ = Message::parse_packet(&packet);
    }
    let mut rest = data;
    while let Ok(Split::Frame { frame, rest: after }) = wire::split_frame(rest) {
        assert!(frame.len() >= wire::HEADER_LEN && frame.len() <= wire::MESSAGE_LEN_MAX);
        let _ = Message::parse(frame);
        rest = after;
    }
    if let Ok(Split::Frame { frame, .. }) = handshake::split_blob(data) {
        assert!(frame.len() <= handshake::BLOB_LEN_MAX);
    }
});
