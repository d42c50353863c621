//! The fuzz targets of ldm7, as plain functions: every decoder and parser that takes bytes or
//! text from outside — a datagram, a TCP stream, a key exchange, a configuration file.
//!
//! Each target must never panic, hang or grow memory on any input; some also check a property
//! (what decodes re-encodes to the same message; a product is reported at most once; a MAC that
//! verifies was made by the key). The cargo-fuzz binaries of `fuzz/` call these functions under
//! libFuzzer (nightly); `tests/corpora.rs` runs the committed corpora of `fuzz/corpus/` and the
//! kept crash inputs of `fuzz/regressions/` through them on the stable toolchain, so every test
//! run replays what the campaigns found. [`seeds`] makes the seed corpora from the captures of
//! real LDM traffic and from the project's tests and examples.
//!
//! `scripts/fuzz` runs the campaigns; docs/security.md records them.

pub mod seeds;

use std::collections::HashSet;
use std::path::Path;
use std::sync::OnceLock;

use ldm7_fmtp_proto::mac::{self, KeyOffer, MacLevel, SenderKey, Verifier};
use ldm7_fmtp_proto::wire::{self, Message, Packet, Split, handshake};
use ldm7_fmtp_proto::{IndexTrust, Instant, ParityConfig, Receiver, ReceiverConfig, ReceiverEvent};
use ldm7_types::{FeedType, ProdInfo, Signature, Timestamp};
use ldm7_xdr::ldm::{self, Proc};
use ldm7_xdr::ldm7;
use ldm7_xdr::rpc::RecordReader;
use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::SeedableRng;

/// A fuzz target: its name (the directory of its corpus) and its function.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    /// The name, as `scripts/fuzz` and `fuzz/corpus/` spell it.
    pub name: &'static str,
    /// What it takes.
    pub what: &'static str,
    /// The function.
    pub run: fn(&[u8]),
}

/// Every target.
pub const TARGETS: [Target; 9] = [
    Target { name: "fmtp_decode", what: "an FMTP datagram or TCP byte stream", run: fmtp_decode },
    Target { name: "fmtp_receive", what: "the FMTP receiver fed datagrams and repair frames", run: fmtp_receive },
    Target {
        name: "fmtp_parity",
        what: "the FMTP receiver with parity repair fed datagrams, parity shards and repair frames",
        run: fmtp_parity,
    },
    Target { name: "fmtp_keys", what: "the FMTP key exchange and MAC verification", run: fmtp_keys },
    Target { name: "ldm6_rpc", what: "an LDM-6 RPC byte stream (record marking, calls, replies)", run: ldm6_rpc },
    Target { name: "ldm7_rpc", what: "an LDM-7 RPC byte stream (record marking, calls, replies)", run: ldm7_rpc },
    Target { name: "ldmd_conf", what: "an ldmd.conf file", run: ldmd_conf },
    Target { name: "pqact_conf", what: "a pqact.conf file, matched and expanded for sample products", run: pqact_conf },
    Target { name: "lab_spec", what: "a lab spec (TOML)", run: lab_spec },
];

/// The file name cargo-fuzz gives an input in a corpus: the SHA-1 of its bytes, in hex.
pub fn corpus_name(bytes: &[u8]) -> String {
    use sha1::Digest;
    sha1::Sha1::digest(bytes).iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The target named `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().copied().find(|target| target.name == name)
}

/// The FMTP codec: whatever parses as a message re-emits to bytes that parse to the same message;
/// the packet view, the TCP framer and the handshake-blob framer never panic and respect their
/// bounds.
pub fn fmtp_decode(data: &[u8]) {
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
}

/// One record of [`fmtp_receive`]'s input: `[kind u8][delay u8][len u16 BE][bytes]`.
pub fn receive_record(kind: u8, delay: u8, bytes: &[u8]) -> Vec<u8> {
    let len = u16::try_from(bytes.len()).expect("a record is at most 65535 bytes");
    let mut record = vec![kind, delay];
    record.extend_from_slice(&len.to_be_bytes());
    record.extend_from_slice(bytes);
    record
}

/// The receiver state machine (default index trust: the first index is confirmed with the
/// sender): records of `[kind u8][delay u8][len u16 BE][bytes]` become datagrams (even kind) or
/// repair-connection frames (odd kind) `delay × 10 ms` apart. Never a panic, memory within the
/// configured bounds, and while product indexes stay below 1024 (records with `kind & 2 == 0`
/// have their index folded into that range) each index is reported (delivered or missed) at most
/// once; a record with a raw index may make a number name a later product (serial arithmetic
/// after jumps adding up to 2³²), so it resets that check.
pub fn fmtp_receive(data: &[u8]) {
    receive_records(receive_config(), data);
}

/// [`fmtp_receive`] with parity repair ([`PARITY`]: 16-byte blocks, so that an input can hold
/// whole groups and shards) and every index believed (the decode paths are reached without a
/// confirmation first). The same checks.
pub fn fmtp_parity(data: &[u8]) {
    let config = ReceiverConfig { parity: Some(PARITY), index_trust: IndexTrust::All, ..receive_config() };
    receive_records(config, data);
}

/// The parity settings of [`fmtp_parity`] (and of its seeds' sender).
pub const PARITY: ParityConfig = ParityConfig {
    group_blocks: 64,
    shards: 8,
    block_len: 16,
    retry: std::time::Duration::from_millis(20),
    rounds_max: 2,
};

fn receive_config() -> ReceiverConfig {
    ReceiverConfig {
        in_flight_products_max: 8,
        in_flight_bytes_max: 1 << 20,
        product_size_max: 1 << 20,
        early_bytes_max: 1 << 16,
        index_gap_max: 16,
        ..ReceiverConfig::default()
    }
}

fn receive_records(config: ReceiverConfig, data: &[u8]) {
    let mut receiver = Receiver::new(config).expect("valid config");
    let mut now = Instant::ZERO;
    let mut reported = HashSet::new();
    let mut rest = data;
    while rest.len() >= 4 {
        let (kind, delay, len) = (rest[0], rest[1], usize::from(u16::from_be_bytes([rest[2], rest[3]])));
        let mut record = rest[4..(4 + len).min(rest.len())].to_vec();
        rest = &rest[4 + record.len()..];
        if kind & 2 == 0 && record.len() >= 4 {
            let index = u32::from_be_bytes([record[0], record[1], record[2], record[3]]) % 1024;
            record[..4].copy_from_slice(&index.to_be_bytes());
        } else {
            reported.clear();
        }
        now = now + std::time::Duration::from_millis(u64::from(delay) * 10);
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
}

/// The deterministic keys [`fmtp_keys`] checks against (made once: an RSA key takes a while).
struct Keys {
    offer: KeyOffer,
    pin: ed25519_dalek::VerifyingKey,
    identity: ed25519_dalek::SigningKey,
    senders: [SenderKey; 3],
    verifiers: [Verifier; 3],
}

fn keys() -> &'static Keys {
    static KEYS: OnceLock<Keys> = OnceLock::new();
    KEYS.get_or_init(|| {
        let mut rng = ChaCha20Rng::seed_from_u64(16);
        let offer = KeyOffer::generate(&mut rng).expect("an RSA key");
        let identity = ed25519_dalek::SigningKey::generate(&mut rng);
        let senders = LEVELS.map(|level| SenderKey::generate(level, &mut rng));
        let verifiers = senders.each_ref().map(|sender| {
            Verifier::from_material(sender.level(), &sender.material()).expect("a sender's material verifies")
        });
        Keys { offer, pin: identity.verifying_key(), identity, senders, verifiers }
    })
}

const LEVELS: [MacLevel; 3] = [MacLevel::None, MacLevel::Hmac, MacLevel::Ed25519];

/// The key exchange and the MAC check, by the first byte:
/// - 0: the sender answers `data[1..]` as a receiver's offer (a PEM public key), with and without
///   a publisher identity; an answer is the 256-byte ciphertext (and the 64-byte signature);
/// - 1: the receiver opens `data[1..]` as a sender's answer with a pinned publisher key (only an
///   answer the publisher signed reaches the RSA decryption; the unpinned path would spend one on
///   every 256-byte input, and the capture and loopback tests cover it);
/// - 2: key material `data[2..]` at level `data[1] % 3` becomes a verifier, or an error;
/// - else: `data[1..]` as a multicast datagram is verified at each level; a datagram that
///   verifies at level 1 or 2 must be exactly what that level's key signs (no forgery passes).
pub fn fmtp_keys(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    let keys = keys();
    match mode {
        0 => {
            let mut rng = ChaCha20Rng::seed_from_u64(u64::from(mode));
            let material = [7u8; 64];
            for identity in [None, Some(&keys.identity)] {
                if let Ok(answer) = mac::answer_offer(rest, &material, identity, &mut rng) {
                    assert_eq!(answer.len(), 256 + if identity.is_some() { 64 } else { 0 });
                }
            }
        }
        1 => {
            let _ = keys.offer.open(rest, Some(&keys.pin));
        }
        2 => {
            if let Some((&level, material)) = rest.split_first()
                && let Ok(verifier) = Verifier::from_material(LEVELS[usize::from(level % 3)], material)
            {
                let _ = verifier.verify(material);
            }
        }
        _ => {
            for (sender, verifier) in keys.senders.iter().zip(&keys.verifiers) {
                if let Ok(message) = verifier.verify(rest) {
                    let mut signed = message.to_vec();
                    sender.sign_in_place(&mut signed);
                    assert_eq!(
                        signed,
                        rest,
                        "a datagram verified at level {} that its key did not sign",
                        sender.level()
                    );
                }
            }
        }
    }
}

/// LDM-6 RPC: record reassembly (bounded), then every record decoded as each kind of call and
/// reply; whatever decodes re-encodes to a record that decodes to the same message.
pub fn ldm6_rpc(data: &[u8]) {
    for record in rpc_records(data) {
        for proc in [None, Some(Proc::Feedme), Some(Proc::Hiya), Some(Proc::ComingSoon), Some(Proc::IsAlive)] {
            if let Ok(message) = ldm::decode_message(&record, |_| proc) {
                let mut again = Vec::new();
                match &message {
                    ldm::Message::Call(call) => ldm::encode_call(&mut again, call),
                    ldm::Message::Reply(reply) => ldm::encode_reply(&mut again, reply.xid, &reply.body),
                }
                assert_eq!(ldm::decode_message(&again[4..], |_| proc).as_ref(), Ok(&message));
            }
        }
    }
}

/// LDM-7 RPC: as [`ldm6_rpc`] for program 300029 version 7 (SUBSCRIBE, the backstop and backlog
/// calls, the product deliveries).
pub fn ldm7_rpc(data: &[u8]) {
    for record in rpc_records(data) {
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
}

/// The records of a byte stream (the stream itself too, as one record), reassembled with a
/// 64 KiB bound.
fn rpc_records(data: &[u8]) -> Vec<Vec<u8>> {
    let mut reader = RecordReader::new(1 << 16);
    reader.push(data);
    let mut records = vec![data.to_vec()];
    while let Ok(Some(record)) = reader.next_record() {
        records.push(record.to_vec());
    }
    records
}

/// ldmd.conf text. An input that names INCLUDE is skipped: the file it names would be read from
/// this machine (`/dev/zero` never ends), which is the administrator's to choose.
pub fn ldmd_conf(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if text.to_ascii_lowercase().contains("include") {
        return;
    }
    let _ = ldm7_config::ldmd::Config::parse(text, Path::new("/nonexistent/etc/ldmd.conf"));
}

/// pqact.conf text up to a NUL byte; what follows it (if anything) is a product identifier. The
/// entries are parsed, matched against sample products and the identifier, and each matching
/// entry's arguments expanded.
pub fn pqact_conf(data: &[u8]) {
    let (conf, ident) = match data.iter().position(|&byte| byte == 0) {
        Some(at) => (&data[..at], Some(&data[at + 1..])),
        None => (data, None),
    };
    let Ok(text) = std::str::from_utf8(conf) else { return };
    let Ok(conf) = ldm7_act::parse("pqact.conf", text) else { return };
    let mut idents = vec!["SAUS43 KWBC 231200".to_owned(), "TEST/cap.1".to_owned(), "_x".to_owned()];
    if let Some(ident) = ident {
        idents.push(String::from_utf8_lossy(ident).into_owned());
    }
    for ident in idents {
        let info = sample_info(FeedType::ANY, ident);
        for (entry, matched) in conf.matching(&info) {
            let _ = ldm7_act::arguments(entry, &info, &matched);
        }
    }
}

/// The metadata of a sample product (the first product of the captures): 8 bytes from "vm".
pub(crate) fn sample_info(feedtype: FeedType, ident: String) -> ProdInfo {
    ProdInfo {
        arrival: Timestamp { secs: 1_795_338_479, micros: 704_874 },
        signature: Signature([0x99; 16]),
        origin: "vm".to_owned(),
        feedtype,
        seqno: 1,
        ident,
        size: 8,
    }
}

/// A lab spec (TOML), parsed and validated; a valid one answers its questions.
pub fn lab_spec(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(spec) = ldm7_net::LabSpec::from_toml_str(text) {
        let _ = spec.core_netns();
        for host in &spec.hosts {
            let _ = spec.netns_of(&host.name);
        }
    }
}
