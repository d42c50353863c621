//! ldm7 extension: repairs by parity over the multicast (docs/parity.md).
//!
//! With unicast repairs, every receiver's losses cost the publisher their own bytes again: at
//! independent loss p and N receivers the publisher sends about (1 + N·p) × the product bytes
//! (6.7× at 570 receivers and 1%). With parity repair a product's data blocks are taken in
//! groups of `group_blocks`; a receiver that lost e blocks of a group asks (PARITY_REQ, on its
//! TCP connection) for e parity shards of the group, and the sender multicasts Reed–Solomon
//! parity shards of that group. Any e distinct shards repair any e lost blocks, so one shard
//! repairs a different block at every receiver that needs one: the publisher sends about the
//! largest loss count of any receiver in each group, not their sum (NORM's reactive FEC).
//!
//! Both ends must use the same [`ParityConfig`]; every PARITY datagram carries the group size
//! and the shard count it was coded with, and a receiver whose own differ ignores it (counted)
//! and asks with RETX_REQ as without the extension. The code is the systematic Reed–Solomon
//! code of the `reed-solomon-simd` crate over GF(2¹⁶); a group's last data block is padded
//! with zeros to `block_len` for coding.
//!
//! Wire (flags not used by FMTP v3):
//! * PARITY (0x1000, multicast): `seqnum` = group (bits 31–16) | ⌈log₂ group_blocks⌉ (15–12)
//!   | log₂ shards (11–8) | shard index (7–0); the payload is the shard, `block_len` bytes.
//!   (Until 2026-11-30 a group was a power of two and the field its exact log₂; the default
//!   groups are now `1024 − shards` blocks, which the field names as 10.)
//! * PARITY_REQ (0x2000, receiver → sender, TCP): `seqnum` = group (bits 31–16) | shards
//!   still needed (15–0); `payloadlen` = the lowest shard index the receiver may still use
//!   (every index from it up is one it does not hold); nothing follows the header (as
//!   RETX_REQ).

use std::time::Duration;

use crate::ConfigError;
use crate::wire::BLOCK_LEN;

mod decode;
pub use ldm7_gf16::ParityEngine;
use reed_solomon_simd::rate::{DefaultRateDecoder, DefaultRateEncoder, RateDecoder, RateEncoder};

/// Parity repair settings, the same at the sender and its receivers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParityConfig {
    /// Data blocks per group: from 64 to 32768. Larger groups need fewer parity shards per data
    /// block (the largest loss count among many receivers grows slower than the group), smaller
    /// ones repair sooner and cost less to decode. Decoding works on the group and its shards
    /// rounded up to a power of two: a group of a power of two less the shards (the default,
    /// `1024 − shards`) decodes fastest for its size.
    pub group_blocks: u32,
    /// Parity shards a group can have: a power of two from 1 to 256. A receiver that lost
    /// more blocks of a group asks for them with RETX_REQ.
    pub shards: u32,
    /// Bytes of a data block and of a shard: the sender's block length (even).
    pub block_len: usize,
    /// Receiver: the longest wait for the shards asked for before asking again (parity comes
    /// by multicast and can be lost): at least the round-trip time plus the time to multicast
    /// a group's shards. It is the wait until a first answer was timed; from then on the
    /// receiver waits about twice the time shards took to come, from
    /// [`crate::PARITY_RETRY_MIN`] up to this.
    pub retry: Duration,
    /// Receiver: requests for one group before its blocks are asked for with RETX_REQ.
    pub rounds_max: u8,
}

impl Default for ParityConfig {
    fn default() -> Self {
        Self { group_blocks: 256, shards: 32, block_len: BLOCK_LEN, retry: Duration::from_millis(250), rounds_max: 4 }
    }
}

/// Group numbers from this one up name a *run* (docs/parity.md "Runs"): in a PARITY datagram
/// the group field is this mark plus the run's product count, `prodindex` its first product; in
/// a PARITY_REQ the mark alone asks for the parity of the run the product belongs to. A
/// product's own groups number below it.
pub const RUN_MARK: u16 = 0x8000;

/// Products in one run at most (the count must fit below [`RUN_MARK`]).
pub const RUN_PRODUCTS_MAX: usize = 0x7fff;

/// How long a sender keeps a run open after its first product's EOP for more products to join
/// it: the longest a request for a run's parity waits for the run to be coded. The receiver
/// waits this much longer before asking a small product's parity again.
pub const RUN_OPEN_MAX: Duration = Duration::from_millis(50);

/// The loss a publisher plans parity for when its settings name none (the design's 1%).
pub const PLANNED_LOSS_DEFAULT: f64 = 0.01;

impl ParityConfig {
    /// The coding a publisher chooses for a feed of `subscribers`, each losing `loss` of the
    /// datagrams independently (docs/parity.md "Defaults"; the rule is
    /// [`ldm7_plan::repair::parity_for`]): as shards the smallest power of two from 8 to 256
    /// that covers the largest loss count of any subscriber in 1024 blocks with probability
    /// 0.999, and groups of 1024 blocks less the shards (992/32 at 1%), which decode as fast
    /// as any group of up to 1024 blocks. A group that loses more at a subscriber is repaired
    /// by RETX_REQ, as without parity.
    pub fn for_feed(subscribers: u32, loss: f64) -> Self {
        match ldm7_plan::repair::parity_for(subscribers, loss) {
            ldm7_plan::Repair::Parity { group_blocks, shards } => Self { group_blocks, shards, ..Self::default() },
            ldm7_plan::Repair::Unicast => Self::default(),
        }
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(64..=32_768).contains(&self.group_blocks) {
            return Err(ConfigError(format!("parity group of {} blocks: must be from 64 to 32768", self.group_blocks)));
        }
        if !self.shards.is_power_of_two() || self.shards > 256 {
            return Err(ConfigError(format!(
                "{} parity shards per group: must be a power of two from 1 to 256",
                self.shards
            )));
        }
        if self.block_len == 0 || !self.block_len.is_multiple_of(2) || self.block_len > BLOCK_LEN {
            return Err(ConfigError(format!(
                "parity block length {}: must be even and at most {BLOCK_LEN}",
                self.block_len
            )));
        }
        if self.rounds_max == 0 {
            return Err(ConfigError("parity rounds_max must be at least 1".into()));
        }
        Ok(())
    }

    /// Data blocks of a product of `size` bytes.
    pub fn blocks(&self, size: u64) -> u64 {
        size.div_ceil(self.block_len as u64)
    }

    /// Whether a product of `size` bytes is coded in a run with the products multicast next to
    /// it rather than alone: products of at most half a group (docs/parity.md "Runs"). The
    /// shards a group needs are about the largest loss count of the subscribers in it, which
    /// grows slower than the group: a small product alone costs nearly as much as a whole group.
    pub fn in_runs(&self, size: u64) -> bool {
        size > 0 && self.blocks(size) <= u64::from(self.group_blocks / 2)
    }

    /// Groups of a product of `size` bytes.
    pub fn groups(&self, size: u64) -> u64 {
        self.blocks(size).div_ceil(u64::from(self.group_blocks))
    }

    /// The byte range `[start, end)` of group `group` of a product of `size` bytes, and its
    /// data block count.
    pub fn group_range(&self, group: u32, size: u64) -> (u64, u64, u32) {
        let span = u64::from(self.group_blocks) * self.block_len as u64;
        let start = (u64::from(group) * span).min(size);
        let end = (start + span).min(size);
        // ≤ group_blocks.
        let blocks = (end - start).div_ceil(self.block_len as u64) as u32;
        (start, end, blocks)
    }

    /// The group holding byte `offset`.
    pub fn group_of(&self, offset: u64) -> u64 {
        offset / (u64::from(self.group_blocks) * self.block_len as u64)
    }

    /// The PARITY datagram's fields naming this coding: ⌈log₂⌉ of the group size (its size
    /// class: 992 and 1024 blocks are both 10), log₂ of the shard count.
    pub fn coding_fields(&self) -> (u8, u8) {
        // ≤ 15 and ≤ 8 (validated: at most 32768 blocks and 256 shards).
        (self.group_blocks.next_power_of_two().trailing_zeros() as u8, self.shards.trailing_zeros() as u8)
    }

    /// Whether a PARITY datagram's coding fields ([`ParityConfig::coding_fields`]) are this
    /// configuration's.
    pub fn codes_as(&self, group_blocks_log2: u8, shards_log2: u8) -> bool {
        self.coding_fields() == (group_blocks_log2, shards_log2)
    }

    /// Every parity shard of a group from its bytes (`group_range`'s; the last block may be
    /// short and is padded with zeros). [`ParityEncoder`] does the same for one group after
    /// another.
    pub fn encode(&self, group: &[u8]) -> Result<Vec<Vec<u8>>, CodingError> {
        ParityEncoder::default().encode(self, group)
    }

    /// The lost blocks of a group from the others and at least as many shards (by shard index)
    /// as blocks are lost. `group` is the group's bytes as held (what lies in a lost block is
    /// not read) and `lost(position)` says which blocks are lost. The lost blocks by position,
    /// each cut to its length in the group. [`ParityDecoder`] does the same for one group after
    /// another.
    pub fn decode<'s>(
        &self,
        group: &[u8],
        lost: impl Fn(u32) -> bool,
        shards: impl IntoIterator<Item = (u32, &'s [u8])>,
    ) -> Result<Vec<(u32, Vec<u8>)>, CodingError> {
        ParityDecoder::default().decode(self, group, lost, shards)
    }
}

/// Builds the Reed–Solomon tables (several megabytes, built once per process on first use, tens
/// of milliseconds with their pages faulted in): call it before the multicast starts, so that
/// the first group decoded or coded does not hold up the datagrams behind it.
pub fn prepare_tables() {
    // Building an engine builds the tables.
    drop(reed_solomon_simd::engine::DefaultEngine::new());
    drop(ParityEngine::new());
}

/// Decodes group after group ([`ParityConfig::decode`]), keeping the Reed–Solomon working space
/// between them: a receiver decodes a group for nearly every group at 1% loss, and making the
/// working space afresh each time (megabytes, zeroed, from fresh pages) was a visible share of
/// its CPU.
#[derive(Default)]
pub struct ParityDecoder {
    high_rate: decode::HighRateDecoder,
    decoder: Option<DefaultRateDecoder<ParityEngine>>,
    scratch: Vec<u8>,
}

impl std::fmt::Debug for ParityDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParityDecoder").field("ready", &self.decoder.is_some()).finish_non_exhaustive()
    }
}

impl ParityDecoder {
    /// The lost blocks of a group, as [`ParityConfig::decode`].
    pub fn decode<'s>(
        &mut self,
        config: &ParityConfig,
        group: &[u8],
        lost: impl Fn(u32) -> bool,
        shards: impl IntoIterator<Item = (u32, &'s [u8])>,
    ) -> Result<Vec<(u32, Vec<u8>)>, CodingError> {
        let (originals, recoveries) = (group.len().div_ceil(config.block_len), config.shards as usize);
        if decode::high_rate(originals, recoveries) {
            return Ok(self.high_rate.decode(config.block_len, recoveries, group, lost, shards)?);
        }
        let decoder = match &mut self.decoder {
            Some(decoder) => {
                decoder.reset(originals, recoveries, config.block_len)?;
                decoder
            }
            slot => slot.insert(DefaultRateDecoder::new(
                originals,
                recoveries,
                config.block_len,
                ParityEngine::new(),
                None,
            )?),
        };
        self.scratch.resize(config.block_len, 0);
        for (position, block) in group.chunks(config.block_len).enumerate() {
            // Positions < group_blocks ≤ 32768.
            if !lost(position as u32) {
                decoder.add_original_shard(position, padded(block, &mut self.scratch))?;
            }
        }
        for (index, shard) in shards {
            decoder.add_recovery_shard(index as usize, shard)?;
        }
        let result = decoder.decode()?;
        Ok(result
            .restored_original_iter()
            .map(|(position, block)| {
                let len = config.block_len.min(group.len() - position * config.block_len);
                // Positions < group_blocks ≤ 32768.
                (position as u32, block[..len].to_vec())
            })
            .collect())
    }
}

/// Codes group after group ([`ParityConfig::encode`]), keeping the Reed–Solomon working space
/// and a buffer for a group's bytes between them: a sender codes a group for every group
/// repaired, and making both afresh each time (zeroed, from fresh pages) was a measurable share
/// of a large simulation.
#[derive(Default)]
pub struct ParityEncoder {
    encoder: Option<DefaultRateEncoder<ParityEngine>>,
    scratch: Vec<u8>,
    group: Vec<u8>,
}

impl std::fmt::Debug for ParityEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParityEncoder").field("group_capacity", &self.group.capacity()).finish_non_exhaustive()
    }
}

impl ParityEncoder {
    /// Every parity shard of a group from its bytes, as [`ParityConfig::encode`].
    pub fn encode(&mut self, config: &ParityConfig, group: &[u8]) -> Result<Vec<Vec<u8>>, CodingError> {
        let (originals, recoveries) = (group.len().div_ceil(config.block_len), config.shards as usize);
        let encoder = match &mut self.encoder {
            Some(encoder) => {
                encoder.reset(originals, recoveries, config.block_len)?;
                encoder
            }
            slot => slot.insert(DefaultRateEncoder::new(
                originals,
                recoveries,
                config.block_len,
                ParityEngine::new(),
                None,
            )?),
        };
        self.scratch.resize(config.block_len, 0);
        for block in group.chunks(config.block_len) {
            encoder.add_original_shard(padded(block, &mut self.scratch))?;
        }
        let result = encoder.encode()?;
        Ok(result.recovery_iter().map(<[u8]>::to_vec).collect())
    }

    /// A buffer of `len` bytes for a group's bytes, to fill and then pass to
    /// [`ParityEncoder::encode_filled`] (its contents before are unspecified).
    pub fn group_buffer(&mut self, len: usize) -> &mut [u8] {
        self.group.resize(len, 0);
        &mut self.group
    }

    /// [`ParityEncoder::encode`] of the bytes [`ParityEncoder::group_buffer`] holds.
    pub fn encode_filled(&mut self, config: &ParityConfig) -> Result<Vec<Vec<u8>>, CodingError> {
        let group = std::mem::take(&mut self.group);
        let shards = self.encode(config, &group);
        self.group = group;
        shards
    }
}

/// `block` as a whole coding block: itself, or copied into `scratch` (one block long) with
/// zeros after it.
fn padded<'a>(block: &'a [u8], scratch: &'a mut [u8]) -> &'a [u8] {
    if block.len() == scratch.len() {
        return block;
    }
    scratch.fill(0);
    scratch[..block.len()].copy_from_slice(block);
    scratch
}

impl std::str::FromStr for ParityConfig {
    type Err = ConfigError;

    /// `GROUP/SHARDS` (`256/32`): data blocks per group and parity shards per group; the other
    /// settings are the defaults.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let parse = |part: &str| part.trim().parse::<u32>().ok();
        let Some((Some(group_blocks), Some(shards))) = text.split_once('/').map(|(g, s)| (parse(g), parse(s))) else {
            return Err(ConfigError(format!(
                "parity {text:?}: expected GROUP/SHARDS, data blocks and parity shards per group (e.g. 256/32)"
            )));
        };
        let config = Self { group_blocks, shards, ..Self::default() };
        config.validate()?;
        Ok(config)
    }
}

/// Subscribers a publisher plans parity for when its settings name no count (its default
/// `subscribers_max`).
pub const PLANNED_SUBSCRIBERS_DEFAULT: u32 = 256;

/// Whether and how to repair by parity, as settings and flags write it: `off`, `auto` (the
/// publisher's rule, [`ParityConfig::for_feed`]) or `GROUP/SHARDS`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ParityChoice {
    /// No parity: every loss is repaired by RETX_REQ.
    Off,
    /// Chosen by the rule from the planned subscribers and loss.
    #[default]
    Auto,
    /// This coding.
    Fixed(ParityConfig),
}

impl ParityChoice {
    /// The coding, given the subscribers and loss the rule plans for.
    pub fn resolve(self, subscribers: u32, loss: f64) -> Option<ParityConfig> {
        match self {
            Self::Off => None,
            Self::Auto => Some(ParityConfig::for_feed(subscribers, loss)),
            Self::Fixed(config) => Some(config),
        }
    }

    /// The coding when nothing is known of the subscribers: the rule at
    /// [`PLANNED_SUBSCRIBERS_DEFAULT`] and [`PLANNED_LOSS_DEFAULT`] (what a publisher with
    /// default settings chooses; `ldm7 fmtp send` and `recv` both take it, as they cannot
    /// negotiate).
    pub fn resolve_default(self) -> Option<ParityConfig> {
        self.resolve(PLANNED_SUBSCRIBERS_DEFAULT, PLANNED_LOSS_DEFAULT)
    }
}

impl std::str::FromStr for ParityChoice {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "off" | "none" => Ok(Self::Off),
            "auto" | "on" => Ok(Self::Auto),
            other => other.parse().map(Self::Fixed).map_err(|ConfigError(message)| {
                ConfigError(format!("{message}; or \"auto\" (the default) or \"off\""))
            }),
        }
    }
}

impl std::fmt::Display for ParityChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Off => f.write_str("off"),
            Self::Auto => f.write_str("auto"),
            Self::Fixed(config) => write!(f, "{}/{}", config.group_blocks, config.shards),
        }
    }
}

/// Reed–Solomon coding failed (shard counts or lengths the code does not take, or too few
/// shards): a bug or a datagram that lies about its coding.
#[derive(Debug, thiserror::Error)]
#[error("parity coding: {0}")]
pub struct CodingError(#[from] reed_solomon_simd::Error);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_publisher_rule_covers_the_most_unlucky_subscriber() {
        // At 1%: in 1024 blocks, the largest of 570 counts is ≤ 32 with probability 0.999; the
        // group is 1024 less the shards, so that group and shards decode as 1024.
        let chosen = |n, p| {
            let config = ParityConfig::for_feed(n, p);
            config.validate().unwrap();
            assert!((config.group_blocks + config.shards).is_power_of_two(), "{config:?}");
            (config.group_blocks, config.shards)
        };
        assert_eq!(chosen(570, 0.01), (992, 32));
        assert_eq!(chosen(8, 0.01), (992, 32));
        assert_eq!(chosen(1, 0.0), (1016, 8));
        assert_eq!(chosen(570, 0.05), (896, 128));
        assert_eq!(chosen(100_000, 0.5), (768, 256));
        // More subscribers or more loss never choose fewer shards.
        let mut last = 0;
        for n in [1, 2, 8, 32, 128, 570, 5000] {
            let (_, shards) = chosen(n, 0.02);
            assert!(shards >= last, "{n}: {shards} < {last}");
            last = shards;
        }
    }

    fn config() -> ParityConfig {
        ParityConfig { group_blocks: 64, shards: 8, block_len: 16, ..ParityConfig::default() }
    }

    #[test]
    fn any_shards_repair_as_many_lost_blocks() {
        let config = config();
        // A short group of 5 blocks, the last one cut short (7 bytes).
        let group: Vec<u8> = (0..4 * 16 + 7).map(|i: u32| (i * 31 % 251) as u8).collect();
        let shards = config.encode(&group).unwrap();
        assert_eq!(shards.len(), 8);
        // Lose blocks 1 and 4 (their bytes are not read); repair with shards 6 and 2.
        let mut held = group.clone();
        held[16..32].fill(0xaa);
        held[64..].fill(0xaa);
        let lost = |position| position == 1 || position == 4;
        let mut restored = config.decode(&held, lost, [(6, shards[6].as_slice()), (2, shards[2].as_slice())]).unwrap();
        restored.sort();
        assert_eq!(restored[0], (1, group[16..32].to_vec()));
        assert_eq!(restored[1].0, 4);
        assert_eq!(restored[1].1, group[64..].to_vec(), "cut to its length in the group");
    }

    #[test]
    fn an_encoder_kept_from_group_to_group_codes_each_as_a_fresh_one() {
        let config = config();
        let mut encoder = ParityEncoder::default();
        // Groups of 64, 3 and 40 blocks (the last two cut short), coded one after another.
        for len in [64 * 16, 2 * 16 + 5, 39 * 16 + 1] {
            let group: Vec<u8> = (0..len).map(|i: u32| (i * 7 % 253) as u8).collect();
            let fresh = config.encode(&group).unwrap();
            assert_eq!(encoder.encode(&config, &group).unwrap(), fresh);
            encoder.group_buffer(group.len()).copy_from_slice(&group);
            assert_eq!(encoder.encode_filled(&config).unwrap(), fresh);
        }
    }

    #[test]
    fn a_decoder_kept_from_group_to_group_restores_each_as_a_fresh_one() {
        let config = config();
        let mut decoder = ParityDecoder::default();
        // Groups of 64, 3 and 40 blocks (the last two cut short), with a failed decode between.
        for (len, lost) in [(64 * 16, [0, 63]), (2 * 16 + 5, [1, 2]), (39 * 16 + 1, [7, 39])] {
            let group: Vec<u8> = (0..len).map(|i: u32| (i * 7 % 253) as u8).collect();
            let shards = config.encode(&group).unwrap();
            let is_lost = |position| lost.contains(&position);
            let mut held = group.clone();
            for position in lost {
                let from = position as usize * 16;
                held[from..(from + 16).min(len as usize)].fill(0xee);
            }
            let pick = || [(5, shards[5].as_slice()), (0, shards[0].as_slice())];
            let mut restored = decoder.decode(&config, &held, is_lost, pick()).unwrap();
            restored.sort();
            let mut fresh = config.decode(&held, is_lost, pick()).unwrap();
            fresh.sort();
            assert_eq!(restored, fresh);
            let expected: Vec<(u32, Vec<u8>)> = lost
                .iter()
                .map(|&position| {
                    let from = position as usize * 16;
                    (position, group[from..(from + 16).min(len as usize)].to_vec())
                })
                .collect();
            assert_eq!(restored, expected);
            assert!(decoder.decode(&config, &held, is_lost, [(1, shards[1].as_slice())]).is_err(), "too few shards");
        }
    }

    #[test]
    fn a_group_of_a_power_of_two_less_the_shards_codes_and_restores() {
        // The default's shape (1024 − 32), small: 120 blocks and 8 shards decode as 128.
        let config = ParityConfig { group_blocks: 120, shards: 8, block_len: 16, ..ParityConfig::default() };
        config.validate().unwrap();
        let group: Vec<u8> = (0..120 * 16 - 5).map(|at| (at * 31 % 251) as u8).collect();
        let shards = config.encode(&group).unwrap();
        assert_eq!(shards.len(), 8);
        let lost = [0, 7, 50, 51, 90, 100, 118, 119];
        let mut held = group.clone();
        for &position in &lost {
            let from = position as usize * 16;
            held[from..(from + 16).min(group.len())].fill(0);
        }
        let picked: Vec<(u32, &[u8])> = (0..8).rev().map(|index| (index, shards[index as usize].as_slice())).collect();
        let mut restored = config.decode(&held, |position| lost.contains(&position), picked).unwrap();
        restored.sort();
        for (position, bytes) in restored {
            let from = position as usize * 16;
            assert_eq!(bytes, group[from..(from + 16).min(group.len())], "block {position}");
        }
    }

    #[test]
    fn too_few_shards_is_an_error() {
        let config = config();
        let group = [[1u8; 16], [2; 16], [3; 16]].concat();
        let shards = config.encode(&group).unwrap();
        assert!(config.decode(&group, |position| position > 0, [(0, shards[0].as_slice())]).is_err());
    }

    #[test]
    fn geometry_and_seqnum() {
        let config = ParityConfig::default();
        assert!(config.validate().is_ok());
        let span = 256 * 1448;
        assert_eq!(config.groups(span * 2 + 1), 3);
        assert_eq!(config.group_range(2, span * 2 + 1), (span * 2, span * 2 + 1, 1));
        assert_eq!(config.group_of(span), 1);
        let shard = [0u8; 1448];
        let mut datagram = Vec::new();
        crate::wire::Message {
            index: crate::ProductIndex(9),
            body: crate::wire::Body::Parity { group: 3, group_blocks_log2: 8, shards_log2: 5, shard: 17, data: &shard },
        }
        .emit_to_vec(&mut datagram)
        .unwrap();
        assert_eq!(&datagram[4..8], &((3u32 << 16) | (8 << 12) | (5 << 8) | 17).to_be_bytes(), "the seqnum's layout");
        assert!(config.codes_as(8, 5));
        assert_eq!("128/16".parse::<ParityConfig>().unwrap(), ParityConfig { group_blocks: 128, shards: 16, ..config });
        // A group need not be a power of two (the default is 1024 less the shards); its field
        // is its size class, ⌈log₂⌉.
        let fitted = "992/32".parse::<ParityConfig>().unwrap();
        assert_eq!(fitted, ParityConfig { group_blocks: 992, shards: 32, ..config });
        assert_eq!(fitted.coding_fields(), (10, 5));
        assert!(fitted.codes_as(10, 5) && !fitted.codes_as(9, 5));
        assert_eq!(fitted.group_range(1, 5000 * 1448), (992 * 1448, 1984 * 1448, 992));
        assert_eq!(fitted.group_of(992 * 1448), 1);
        for bad in ["128", "128/", "x/16", "40/16", "128/3", "128/16/2"] {
            assert!(bad.parse::<ParityConfig>().is_err(), "{bad}");
        }
        assert!(!config.codes_as(7, 5));
        for bad in [
            ParityConfig { group_blocks: 63, ..config },
            ParityConfig { group_blocks: 32_769, ..config },
            ParityConfig { shards: 512, ..config },
            ParityConfig { block_len: 1447, ..config },
            ParityConfig { rounds_max: 0, ..config },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
