//! Seed corpora: each target's starting inputs, made from the captures of real LDM 6.15 and
//! LDM-7 traffic (`shared/data/captures/*.txt`, the annotated transcripts), from what our own
//! encoders and key exchange produce, and from configurations written the way the docs and tests
//! write them. `ldm7-fuzz-seeds` writes them into `fuzz/corpus/<target>/`.

use std::path::Path;

use ldm7_fmtp_proto::mac;
use ldm7_fmtp_proto::wire::{Body, Bop, Message};
use ldm7_fmtp_proto::{ProductIndex, WallTime};
use ldm7_types::{FeedType, Signature};
use ldm7_xdr::ldm7::{self, Ldm7Call};
use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::SeedableRng;

use crate::{keys, receive_record};

/// One seed: its target and its bytes.
pub type Seed = (&'static str, Vec<u8>);

/// Every seed: the ones made here, and, when `captures` (the directory of the transcripts)
/// is given, the ones from real traffic; `examples` is the project's `examples/lab`.
pub fn all(captures: Option<&Path>, examples: Option<&Path>) -> std::io::Result<Vec<Seed>> {
    let mut seeds = Vec::new();
    fmtp(&mut seeds);
    ldm7_calls(&mut seeds);
    configurations(&mut seeds);
    if let Some(captures) = captures {
        from_captures(captures, &mut seeds)?;
    }
    if let Some(examples) = examples {
        let mut files: Vec<_> = std::fs::read_dir(examples)?.collect::<Result<_, _>>()?;
        files.sort_by_key(|entry| entry.file_name());
        for entry in files {
            if entry.path().extension().is_some_and(|extension| extension == "toml") {
                seeds.push(("lab_spec", std::fs::read(entry.path())?));
            }
        }
    }
    Ok(seeds)
}

/// Every kind of FMTP message from our encoder; a receiver's record streams (whole products in
/// several blocks, a lost block repaired, a refused first index, a lost EOP); the key exchange.
/// One function on purpose: a list of seeds, each a few lines, sharing the message builders
/// at its top.
fn fmtp(seeds: &mut Vec<Seed>) {
    let metadata = [0x99u8; 16];
    let bop = |index: u32, size: u32| Message {
        index: ProductIndex(index),
        body: Body::Bop(Bop {
            start_time: WallTime { secs: 1_795_338_479, nanos: 756_587_505 },
            product_size: size,
            metadata: &metadata,
        }),
    };
    let block = [0x5au8; 1448];
    let emit = |message: Message<'_>| message.to_vec().expect("a message we build emits");
    let every_kind = [
        bop(0, 3000),
        Message { index: ProductIndex(0), body: Body::MemData { offset: 1448, data: &block } },
        Message { index: ProductIndex(0), body: Body::Eop },
        Message { index: ProductIndex(0), body: Body::RetxReq { offset: 1448, len: 1448 } },
        Message { index: ProductIndex(0), body: Body::RetxRej },
        Message { index: ProductIndex(0), body: Body::RetxEnd },
        Message { index: ProductIndex(0), body: Body::RetxData { offset: 0, data: &block[..100] } },
        Message { index: ProductIndex(0), body: Body::BopReq },
        Message {
            index: ProductIndex(7),
            body: Body::RetxBop(Bop { start_time: WallTime { secs: 2, nanos: 3 }, product_size: 9, metadata: b"" }),
        },
        Message { index: ProductIndex(u32::MAX), body: Body::EopReq },
        Message { index: ProductIndex(0), body: Body::RetxEop },
        Message { index: ProductIndex(3), body: Body::KeyUpdate { sealed: &block[..320] } },
        Message { index: ProductIndex(3), body: Body::KeyAck },
        Message {
            index: ProductIndex(0),
            body: Body::Parity { group: 1, group_blocks_log2: 8, shards_log2: 5, shard: 3, data: &block },
        },
        Message { index: ProductIndex(0), body: Body::ParityReq { group: 1, need: 2, from: 0 } },
    ];
    let mut stream = Vec::new();
    for message in every_kind.iter().cloned() {
        let bytes = emit(message);
        stream.extend_from_slice(&bytes);
        seeds.push(("fmtp_decode", bytes));
    }
    seeds.push(("fmtp_decode", stream));

    // Receiver streams. Kind 0: a datagram (index folded below 1024); kind 1: a repair frame.
    let product = |index: u32, size: u32, lose: Option<u32>| {
        let mut records = vec![receive_record(0, 0, &emit(bop(index, size)))];
        for offset in (0..size).step_by(1448) {
            let len = (size - offset).min(1448) as usize;
            if Some(offset) != lose {
                let data = Message { index: ProductIndex(index), body: Body::MemData { offset, data: &block[..len] } };
                records.push(receive_record(0, 0, &emit(data)));
            }
        }
        records.push(receive_record(0, 1, &emit(Message { index: ProductIndex(index), body: Body::Eop })));
        records
    };
    let confirm = |index: u32, size: u32| {
        let retx_bop = Message {
            index: ProductIndex(index),
            body: Body::RetxBop(Bop {
                start_time: WallTime { secs: 1_795_338_479, nanos: 0 },
                product_size: size,
                metadata: &metadata,
            }),
        };
        receive_record(1, 1, &emit(retx_bop))
    };
    let repair = |index: u32, offset: u32, len: usize| {
        let data = Message { index: ProductIndex(index), body: Body::RetxData { offset, data: &block[..len] } };
        receive_record(1, 2, &emit(data))
    };
    let three: Vec<u8> = (0..3).flat_map(|index| product(index, 3000, None)).flatten().collect();
    let mut confirmed = three.clone();
    confirmed.extend(confirm(0, 3000));
    seeds.push(("fmtp_receive", three));
    seeds.push(("fmtp_receive", confirmed.clone()));
    let mut repaired: Vec<u8> = confirm(5, 4000);
    repaired.extend(product(5, 4000, Some(1448)).concat());
    repaired.extend(repair(5, 1448, 1448));
    repaired.extend(product(6, 100, None).concat());
    seeds.push(("fmtp_receive", repaired));
    let mut refused = product(9, 2000, None).concat();
    refused.extend(receive_record(1, 1, &emit(Message { index: ProductIndex(9), body: Body::RetxRej })));
    refused.extend(product(10, 10, None).concat());
    seeds.push(("fmtp_receive", refused));
    let mut eop_lost = product(3, 1448, None);
    eop_lost.pop();
    let mut eop_lost = eop_lost.concat();
    eop_lost.extend(confirm(3, 1448));
    eop_lost.extend(receive_record(1, 200, &emit(Message { index: ProductIndex(3), body: Body::RetxEop })));
    seeds.push(("fmtp_receive", eop_lost));
    // Lost blocks (product, block): a few; a burst past the shard count (RETX_REQ after all);
    // none.
    for lost in [
        &[(0, 3), (0, 70), (0, 71), (1, 5)][..],
        &[(0, 10), (0, 11), (0, 12), (0, 13), (0, 14), (0, 15), (0, 16), (0, 17), (0, 18), (1, 0)],
        &[],
    ] {
        seeds.push(("fmtp_parity", parity_session(lost)));
    }
    let mut far = confirmed;
    far.extend(receive_record(2, 0, &emit(bop(100_000, 10))));
    far.extend(receive_record(2, 0, &emit(bop(100_000, 10))));
    seeds.push(("fmtp_receive", far));

    // Key exchange: an offer answered (plain and signed); key material of each level; a datagram
    // signed at each level.
    let keys = keys();
    let mut rng = ChaCha20Rng::seed_from_u64(1);
    let mut offer = vec![0u8];
    offer.extend_from_slice(keys.offer.pem());
    seeds.push(("fmtp_keys", offer));
    for identity in [None, Some(&keys.identity)] {
        let answer = mac::answer_offer(keys.offer.pem(), &keys.senders[1].material(), identity, &mut rng)
            .expect("our offer is answered");
        let mut seed = vec![1u8];
        seed.extend_from_slice(&answer);
        seeds.push(("fmtp_keys", seed));
    }
    let datagram = emit(bop(4, 1000));
    for (level, sender) in keys.senders.iter().enumerate() {
        let mut seed = vec![2u8, level as u8];
        seed.extend_from_slice(&sender.material());
        seeds.push(("fmtp_keys", seed));
        let mut signed = datagram.clone();
        sender.sign_in_place(&mut signed);
        let mut seed = vec![3u8];
        seed.extend_from_slice(&signed);
        seeds.push(("fmtp_keys", seed));
    }
}

/// The LDM-7 calls the capture does not show, from our encoder: the backstop's and the
/// backlog's.
fn ldm7_calls(seeds: &mut Vec<Seed>) {
    let info = crate::sample_info(FeedType::EXP, "TEST/cap.1".to_owned());
    let product = || ldm7::WireProduct { info: info.clone(), data: b"hello 1\n".to_vec().into() };
    let calls = [
        Ldm7Call::RequestProduct(4),
        Ldm7Call::RequestBacklog(ldm7::BacklogSpec {
            after: Signature([1; 16]),
            after_is_set: true,
            before: Signature([2; 16]),
            time_offset_secs: 3600,
        }),
        Ldm7Call::TestConnection,
        Ldm7Call::DeliverMissedProduct(ldm7::MissedProduct { index: 4, product: product() }),
        Ldm7Call::NoSuchProduct(5),
        Ldm7Call::DeliverBacklogProduct(product()),
        Ldm7Call::EndBacklog,
    ];
    let mut stream = Vec::new();
    for (xid, call) in (1..).zip(calls) {
        let mut record = Vec::new();
        ldm7::encode_call(&mut record, &ldm7::Call { xid, call });
        stream.extend_from_slice(&record);
        seeds.push(("ldm7_rpc", record));
    }
    seeds.push(("ldm7_rpc", stream));
}

/// The records of an RPC byte stream, each with its record mark (one fragment each, as LDM
/// sends them).
fn rpc_records(stream: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = stream;
    std::iter::from_fn(move || {
        let mark = rest.get(..4)?;
        let len = 4 + (u32::from_be_bytes([mark[0], mark[1], mark[2], mark[3]]) & 0x7fff_ffff) as usize;
        let (record, after) = rest.split_at(len.min(rest.len()));
        rest = after;
        Some(record)
    })
}

/// ldmd.conf, pqact.conf and lab specs as the docs and tests write them: every keyword, action
/// and option.
fn configurations(seeds: &mut Vec<Seed>) {
    const LDMD: [&str; 6] = [
        "ALLOW ANY ^((localhost|loopback)|(127\\.0\\.0\\.1\\.?$))\nALLOW NGRID|NEXRAD3 \\.edu$ ^NEXRAD3 ^.*KFTG\n",
        "ACCEPT ANY .* ^127\\.\nREQUEST EXP \"^TEST/.*\" up.example.edu:388 PRIMARY\nPOLL WMO .* other.example.edu\n",
        "request ngrid .* a.example.edu\nREQUEST NGRID .* b.example.edu ALTERNATE\n# a comment\nEXEC \"pqact -d /data etc/pqact.conf\"\n",
        "MULTICAST NGRID 224.0.55.1:38800\nMULTICAST NEXRAD3 224.0.55.2 192.168.8.1:38801 24 3001 sdn-switch port-7\n",
        "RECEIVE NGRID up.example.edu:388 eth1 sdn-switch port-9 3001\nRECEIVE EXP 10.0.0.1\n",
        "ALLOW\tANY\t\"quoted \\\" host\"\n  EXEC \"a b\\ c\"\nALLOW ANY x\n  REQEST ANY .* h\n",
    ];
    for text in LDMD {
        seeds.push(("ldmd_conf", text.as_bytes().to_vec()));
    }
    const PQACT: [&str; 6] = [
        "WMO\t^(SAUS..) (KWBC) ([0-3][0-9])([0-2][0-9])\n\tFILE\t-close\tdata/\\1/\\2_(\\3:yyyy)(\\3:mm)\\3\\4.txt\n",
        "EXP\t^TEST/(.*)\n\tPIPE\t-close -strip\tdecoder -v \\1 %Y%m%d%H (seq)\nEXP\t^_ELSE_$\n\tNOOP\n",
        "NGRID|NEXRAD3\t^(.*)/(.*)\n\tSTDIOFILE\t-flush -overwrite\t\"dir with blank/\\(12)\" &\n",
        "ANY\t.*\n\tDBFILE\t-strip\tdb/gdbm\t\\0\nANY\t.*\n\tEXEC\t-wait\tprogram arg \\&\\\\\n",
        "EXP\t^TEST\n\tFILE\t-edex -log -metadata\tout/%j/%H%M%S\n# comment\n\nWMO\t(x)(y)?\n\tFILE\tout/\\2\\9\n",
        "EXP\t^TEST/cap.1\n\tFILE\t-removewmo -nodata\tf/(01:yy)(15:mmm)\n\0TEST/cap.1",
    ];
    for text in PQACT {
        seeds.push(("pqact_conf", text.as_bytes().to_vec()));
    }
    let spec = "name = \"fz\"\ncontrol_subnet = \"10.99.0.0/24\"\n\n[[hosts]]\nname = \"pub\"\n[[hosts]]\nname = \"s1\"\nloss = \"1%\"\n\n\
                [[feeds]]\nname = \"ngrid\"\npublisher = \"pub\"\nsubscribers = [\"s1\"]\nrate = \"40 Mbit/s\"\nbuffer = \"2 MB\"\n\
                subnet = \"10.98.0.0/24\"\nmulticast_group = \"224.0.55.1\"\nmulticast_port = 38801\ndelay = { s1 = \"20ms\" }\n";
    seeds.push(("lab_spec", spec.as_bytes().to_vec()));
}

/// The multicast datagrams (`hex:` lines) and the byte streams (`### Byte stream` hex dumps) of
/// each transcript: the LDM-6 streams seed `ldm6_rpc`; of `fmtp-ldm7.txt`, the datagrams and the
/// repair connection's streams seed the FMTP targets and its LDM-7 RPC streams `ldm7_rpc`.
fn from_captures(captures: &Path, seeds: &mut Vec<Seed>) -> std::io::Result<()> {
    let mut names: Vec<String> = std::fs::read_dir(captures)?
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".txt") && (name.starts_with("ldm6-") || name.starts_with("fmtp-")))
        .collect();
    names.sort();
    for name in names {
        let text = std::fs::read_to_string(captures.join(&name))?;
        if name.starts_with("ldm6-") {
            for stream in ldm7_testkit::transcript_streams(&text) {
                seeds.extend(rpc_records(&stream.bytes).map(|record| ("ldm6_rpc", record.to_vec())));
                seeds.push(("ldm6_rpc", stream.bytes));
            }
            continue;
        }
        let mut records = Vec::new();
        for datagram in &ldm7_testkit::transcript_datagrams(&text) {
            seeds.push(("fmtp_decode", datagram.clone()));
            records.extend(receive_record(0, 0, datagram));
        }
        for stream in ldm7_testkit::transcript_streams(&text) {
            if !stream.section.contains("retransmission") {
                seeds.extend(rpc_records(&stream.bytes).map(|record| ("ldm7_rpc", record.to_vec())));
                seeds.push(("ldm7_rpc", stream.bytes));
            } else {
                seeds.push(("fmtp_decode", stream.bytes.clone()));
                // The handshake blob (4-byte length + blob) first: the receiver's PEM offer, or
                // the sender's answer; the frames after it.
                let Some(len) = stream.bytes.get(..4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
                else {
                    continue;
                };
                let Some(blob) = stream.bytes.get(4..4 + len) else { continue };
                let mut seed = vec![if stream.bytes.len() > 4 && blob.starts_with(b"-----") { 0u8 } else { 1u8 }];
                seed.extend_from_slice(blob);
                seeds.push(("fmtp_keys", seed));
                if !blob.starts_with(b"-----") {
                    // The sender's frames, after the datagrams, as the repair connection.
                    let mut rest = &stream.bytes[4 + len..];
                    while rest.len() >= 12 {
                        let frame_len = 12 + usize::from(u16::from_be_bytes([rest[8], rest[9]]));
                        let carries = u16::from_be_bytes([rest[10], rest[11]]) & (0x1 | 0x4 | 0x40 | 0x100) != 0;
                        let take = if carries { frame_len.min(rest.len()) } else { 12 };
                        records.extend(receive_record(1, 1, &rest[..take]));
                        rest = &rest[take..];
                    }
                }
            }
        }
        seeds.push(("fmtp_receive", records));
    }
    Ok(())
}

/// A sender with [`crate::PARITY`] and one receiver that loses the `lost` blocks (product index,
/// block number): the datagrams that reach it, the parity shards its requests bring, and the
/// sender's repair frames, as [`crate::fmtp_parity`] records.
fn parity_session(lost: &[(u32, u32)]) -> Vec<u8> {
    use ldm7_fmtp_proto::{Destination, OutgoingProduct, Receiver, ReceiverConfig, ReceiverId, Sender, SenderConfig};
    let parity = crate::PARITY;
    let now = ldm7_fmtp_proto::Instant::ZERO;
    let config = SenderConfig { block_len: parity.block_len, parity: Some(parity), ..SenderConfig::default() };
    let mut sender = Sender::new(config, now).expect("a valid sender");
    sender.receiver_connected(now, ReceiverId(1));
    let receiver_config = ReceiverConfig {
        parity: Some(parity),
        index_trust: ldm7_fmtp_proto::IndexTrust::All,
        ..ReceiverConfig::default()
    };
    let mut receiver = Receiver::new(receiver_config).expect("a valid receiver");
    for (size, seed) in [(2_100usize, 3u8), (700, 9)] {
        let data: Vec<u8> = (0..size).map(|i| (i as u8).wrapping_mul(seed).wrapping_add(i as u8 >> 3)).collect();
        sender.enqueue(now, OutgoingProduct::new(data, *b"0123456789abcdef")).expect("enqueued");
    }
    let mut records = Vec::new();
    let mut buf = Vec::new();
    for _ in 0..64 {
        let mut moved = false;
        while let Some(transmit) = sender.poll_transmit(now, &mut buf) {
            moved = true;
            let message = Message::parse(&buf).expect("the sender emits valid messages");
            let lost = matches!(message.body, Body::MemData { offset, .. }
                if lost.contains(&(message.index.0, offset / 16)));
            match transmit.destination {
                Destination::Multicast if !lost => {
                    records.extend(receive_record(0, 0, &buf));
                    receiver.handle_datagram(now, &buf);
                }
                Destination::Multicast => {}
                Destination::Receiver(_) => {
                    records.extend(receive_record(1, 0, &buf));
                    let _ = receiver.handle_stream_frame(now, &buf);
                }
            }
            buf.clear();
        }
        while let Some(request) = receiver.poll_transmit() {
            moved = true;
            sender.handle_stream(now, ReceiverId(1), &request);
        }
        if !moved {
            break;
        }
    }
    records
}
