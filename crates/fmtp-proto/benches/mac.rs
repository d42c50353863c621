//! The MAC of each multicast datagram (issue #16): signing on the sender, checking on the
//! receiver, one by one and in batches, for a full datagram (`cargo bench -p ldm7-fmtp-proto
//! --bench mac`).
//!
//! A level-2 datagram carries a 12-byte header and 1,384 payload bytes (1,448 less the 64-byte
//! signature), a level-1 one 1,416; both are benched at 1,396 message bytes.

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ldm7_fmtp_proto::Instant;
use ldm7_fmtp_proto::mac::{KeyRing, MacLevel, SenderKey, Verifier};
use rand_core::{OsRng, RngCore};
use std::hint::black_box;

const MESSAGE_LEN: usize = 12 + 1384;

fn message(seed: usize) -> Vec<u8> {
    let mut message = vec![0u8; MESSAGE_LEN];
    OsRng.fill_bytes(&mut message);
    message[..8].copy_from_slice(&(seed as u64).to_be_bytes());
    message
}

fn signed(key: &SenderKey, count: usize) -> Vec<Vec<u8>> {
    (0..count)
        .map(|seed| {
            let mut datagram = message(seed);
            key.sign_in_place(&mut datagram);
            datagram
        })
        .collect()
}

fn sign(c: &mut Criterion) {
    let mut group = c.benchmark_group("sign");
    group.throughput(Throughput::Elements(1));
    for level in [MacLevel::Hmac, MacLevel::Ed25519] {
        let key = SenderKey::generate(level, &mut OsRng);
        let message = message(0);
        let mut datagram = Vec::with_capacity(MESSAGE_LEN + level.mac_len());
        group.bench_function(BenchmarkId::from_parameter(level.number()), |b| {
            b.iter(|| {
                datagram.clear();
                datagram.extend_from_slice(&message);
                key.sign_in_place(&mut datagram);
                black_box(&datagram);
            })
        });
    }
    // What the sender did before keeping its key expanded: ed25519-dalek's `SigningKey::sign`,
    // which expands the key again for every message.
    let signing = ed25519_dalek::SigningKey::generate(&mut OsRng);
    let message = message(0);
    group.bench_function("2_signing_key", |b| {
        b.iter(|| black_box(ed25519_dalek::Signer::sign(&signing, black_box(&message)).to_bytes()))
    });
    group.finish();
}

fn verify(c: &mut Criterion) {
    let mut group = c.benchmark_group("verify");
    for level in [MacLevel::Hmac, MacLevel::Ed25519] {
        let key = SenderKey::generate(level, &mut OsRng);
        let verifier = Verifier::from_material(level, &key.material()).expect("material of its level");
        let datagram = signed(&key, 1).remove(0);
        group.throughput(Throughput::Elements(1));
        group.bench_function(BenchmarkId::new("single", level.number()), |b| {
            b.iter(|| verifier.verify(black_box(&datagram)).expect("verifies"))
        });
    }
    // Level 2 through the key ring, one at a time and in batches; the throughput is per datagram.
    let key = SenderKey::generate(MacLevel::Ed25519, &mut OsRng);
    let ring = || KeyRing::new(Verifier::from_material(MacLevel::Ed25519, &key.material()).expect("material"));
    for count in [1, 8, 16, 32, 64] {
        let datagrams = signed(&key, count);
        let slices: Vec<&[u8]> = datagrams.iter().map(Vec::as_slice).collect();
        group.throughput(Throughput::Elements(count as u64));
        group.bench_function(BenchmarkId::new("ring_each", count), |b| {
            b.iter_batched_ref(
                ring,
                |ring| {
                    for datagram in &slices {
                        ring.verify(Instant::ZERO, datagram).expect("verifies");
                    }
                },
                BatchSize::SmallInput,
            )
        });
        group.bench_function(BenchmarkId::new("ring_batch", count), |b| {
            b.iter_batched_ref(
                ring,
                |ring| {
                    let results = ring.verify_batch(Instant::ZERO, &slices);
                    assert!(results.iter().all(Result::is_ok));
                },
                BatchSize::SmallInput,
            )
        });
    }
    // A batch of 32 with one forged datagram: the batch, then each alone.
    let mut datagrams = signed(&key, 32);
    datagrams[17][20] ^= 1;
    let slices: Vec<&[u8]> = datagrams.iter().map(Vec::as_slice).collect();
    group.throughput(Throughput::Elements(32));
    group.bench_function(BenchmarkId::new("ring_batch_one_forged", 32), |b| {
        b.iter_batched_ref(
            ring,
            |ring| {
                let results = ring.verify_batch(Instant::ZERO, &slices);
                assert_eq!(results.iter().filter(|result| result.is_err()).count(), 1);
            },
            BatchSize::SmallInput,
        )
    });
    // Forged datagrams keep coming, one in every batch of 32: the batches after the first that
    // held one are checked one by one.
    let mut datagrams = signed(&key, 128);
    for at in [5, 37, 69, 101] {
        datagrams[at][20] ^= 1;
    }
    let slices: Vec<&[u8]> = datagrams.iter().map(Vec::as_slice).collect();
    group.throughput(Throughput::Elements(128));
    group.bench_function(BenchmarkId::new("ring_batch_one_forged_in_each", 128), |b| {
        b.iter_batched_ref(
            ring,
            |ring| {
                let results = ring.verify_batch(Instant::ZERO, &slices);
                assert_eq!(results.iter().filter(|result| result.is_err()).count(), 4);
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, sign, verify);
criterion_main!(benches);
