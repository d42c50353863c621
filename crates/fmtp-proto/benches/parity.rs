//! Decoding and coding one parity group (docs/parity.md) on the engine parity repair uses
//! ([`ParityEngine::new`]: AVX-512 and GFNI where the CPU has them) against the
//! `reed-solomon-simd` crate's own ([`ParityEngine::portable`]), at the default coding (992
//! blocks of 1,448 bytes, 32 shards) with 10 blocks lost, about what a receiver loses of a
//! group at 1%, and the decoding a receiver runs (`ParityDecoder`: its own high-rate decoding
//! on that engine) (`cargo bench -p ldm7-fmtp-proto --bench parity`).

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ldm7_fmtp_proto::parity::{ParityConfig, ParityDecoder, ParityEngine};
use reed_solomon_simd::rate::{DefaultRateDecoder, DefaultRateEncoder, RateDecoder, RateEncoder};
use std::hint::black_box;

const BLOCKS: usize = 992;
const SHARDS: usize = 32;
const BLOCK_LEN: usize = 1448;
const LOST: usize = 10;

fn group() -> Vec<Vec<u8>> {
    (0..BLOCKS).map(|block| ldm7_types::content::bytes(block as u64, BLOCK_LEN as u32)).collect()
}

/// A way to make an engine, by name.
type Engines = [(&'static str, fn() -> ParityEngine); 2];

fn engines() -> Engines {
    [("crate", ParityEngine::portable), ("ours", ParityEngine::new)]
}

fn code(c: &mut Criterion) {
    let data = group();
    let mut bench = c.benchmark_group("parity_code");
    bench.throughput(Throughput::Bytes((BLOCKS * BLOCK_LEN) as u64));
    for (name, engine) in engines() {
        let mut encoder = DefaultRateEncoder::new(BLOCKS, SHARDS, BLOCK_LEN, engine(), None).unwrap();
        bench.bench_function(BenchmarkId::from_parameter(format!("{name} ({})", engine().name())), |b| {
            b.iter(|| {
                encoder.reset(BLOCKS, SHARDS, BLOCK_LEN).unwrap();
                for block in &data {
                    encoder.add_original_shard(block).unwrap();
                }
                black_box(encoder.encode().unwrap().recovery(0).map(|shard| shard[0]));
            })
        });
    }
    bench.finish();
}

fn decode(c: &mut Criterion) {
    let data = group();
    let shards: Vec<Vec<u8>> = {
        let mut encoder = DefaultRateEncoder::new(BLOCKS, SHARDS, BLOCK_LEN, ParityEngine::portable(), None).unwrap();
        for block in &data {
            encoder.add_original_shard(block).unwrap();
        }
        encoder.encode().unwrap().recovery_iter().map(<[u8]>::to_vec).collect()
    };
    let lost: Vec<usize> = (0..LOST).map(|k| (k * 97 + 5) % BLOCKS).collect();
    let mut bench = c.benchmark_group("parity_decode");
    bench.throughput(Throughput::Bytes((BLOCKS * BLOCK_LEN) as u64));
    for (name, engine) in engines() {
        let mut decoder = DefaultRateDecoder::new(BLOCKS, SHARDS, BLOCK_LEN, engine(), None).unwrap();
        bench.bench_function(BenchmarkId::from_parameter(format!("{name} ({})", engine().name())), |b| {
            b.iter(|| {
                decoder.reset(BLOCKS, SHARDS, BLOCK_LEN).unwrap();
                for (position, block) in data.iter().enumerate().filter(|(p, _)| !lost.contains(p)) {
                    decoder.add_original_shard(position, block).unwrap();
                }
                for (index, shard) in shards.iter().enumerate().take(LOST) {
                    decoder.add_recovery_shard(index, shard).unwrap();
                }
                black_box(decoder.decode().unwrap().restored_original_iter().count());
            })
        });
    }
    // What a receiver runs: the high-rate decoding of `parity::decode` on the engine.
    let config = ParityConfig { group_blocks: BLOCKS as u32, shards: SHARDS as u32, ..ParityConfig::default() };
    let bytes: Vec<u8> = data.concat();
    let mut decoder = ParityDecoder::default();
    bench.bench_function(BenchmarkId::from_parameter("receiver (ParityDecoder)"), |b| {
        b.iter(|| {
            let restored = decoder
                .decode(
                    &config,
                    &bytes,
                    |position| lost.contains(&(position as usize)),
                    shards.iter().enumerate().take(LOST).map(|(index, shard)| (index as u32, &shard[..])),
                )
                .unwrap();
            black_box(restored.len());
        })
    });
    bench.finish();
}

criterion_group!(benches, code, decode);
criterion_main!(benches);
