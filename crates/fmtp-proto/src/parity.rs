//! ldm7 extension: repairs by parity over the multicast (docs/fmtp.md "Parity repair").
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
//! * PARITY (0x1000, multicast): `seqnum` = group (bits 31–16) | log₂ group_blocks (15–12) |
//!   log₂ shards (11–8) | shard index (7–0); the payload is the shard, `block_len` bytes.
//! * PARITY_REQ (0x2000, receiver → sender, TCP): `seqnum` = group (bits 31–16) | shards
//!   still needed (15–0); `payloadlen` = the lowest shard index the receiver may still use
//!   (every index from it up is one it does not hold); nothing follows the header (as
//!   RETX_REQ).

use std::time::Duration;

use crate::ConfigError;
use crate::wire::BLOCK_LEN;

/// Parity repair settings, the same at the sender and its receivers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParityConfig {
    /// Data blocks per group: a power of two from 64 to 32768. Larger groups need fewer parity
    /// shards per data block (the largest loss count among many receivers grows slower than
    /// the group), smaller ones repair sooner and cost less to decode.
    pub group_blocks: u32,
    /// Parity shards a group can have: a power of two from 1 to 256. A receiver that lost
    /// more blocks of a group asks for them with RETX_REQ.
    pub shards: u32,
    /// Bytes of a data block and of a shard: the sender's block length (even).
    pub block_len: usize,
    /// Receiver: how long to wait for the shards asked for before asking again (parity comes
    /// by multicast and can be lost): at least the round-trip time plus the time to multicast
    /// a group's shards.
    pub retry: Duration,
    /// Receiver: requests for one group before its blocks are asked for with RETX_REQ.
    pub rounds_max: u8,
}

impl Default for ParityConfig {
    fn default() -> Self {
        Self { group_blocks: 256, shards: 32, block_len: BLOCK_LEN, retry: Duration::from_millis(250), rounds_max: 4 }
    }
}

impl ParityConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !self.group_blocks.is_power_of_two() || !(64..=32_768).contains(&self.group_blocks) {
            return Err(ConfigError(format!(
                "parity group of {} blocks: must be a power of two from 64 to 32768",
                self.group_blocks
            )));
        }
        if !self.shards.is_power_of_two() || self.shards > 256 {
            return Err(ConfigError(format!(
                "{} parity shards per group: must be a power of two from 1 to 256",
                self.shards
            )));
        }
        if self.block_len == 0 || self.block_len % 2 != 0 || self.block_len > BLOCK_LEN {
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

    /// The PARITY datagram's `seqnum` for shard `shard` of group `group`.
    pub fn parity_seqnum(&self, group: u16, shard: u8) -> u32 {
        (u32::from(group) << 16)
            | (self.group_blocks.trailing_zeros() << 12)
            | (self.shards.trailing_zeros() << 8)
            | u32::from(shard)
    }

    /// Whether a PARITY datagram's coding (log₂ of its group size and shard count) is this
    /// configuration's.
    pub fn codes_as(&self, group_blocks_log2: u8, shards_log2: u8) -> bool {
        self.group_blocks.trailing_zeros() == u32::from(group_blocks_log2)
            && self.shards.trailing_zeros() == u32::from(shards_log2)
    }

    /// Every parity shard of a group from its data blocks (each at most `block_len` bytes; the
    /// last may be shorter and is padded with zeros).
    pub fn encode(&self, blocks: &[&[u8]]) -> Result<Vec<Vec<u8>>, CodingError> {
        let mut encoder =
            reed_solomon_simd::ReedSolomonEncoder::new(blocks.len(), self.shards as usize, self.block_len)?;
        let mut padded = vec![0u8; self.block_len];
        for block in blocks {
            if block.len() == self.block_len {
                encoder.add_original_shard(block)?;
            } else {
                padded.fill(0);
                padded[..block.len()].copy_from_slice(block);
                encoder.add_original_shard(&padded)?;
            }
        }
        let result = encoder.encode()?;
        Ok(result.recovery_iter().map(<[u8]>::to_vec).collect())
    }

    /// The lost blocks of a group of `group_blocks` data blocks from the blocks held (by their
    /// position in the group, padded as for [`ParityConfig::encode`]) and at least as many
    /// shards (by shard index) as blocks are lost: the lost blocks by position, each
    /// `block_len` bytes (the caller cuts a product's last block to its length).
    pub fn decode<'b>(
        &self,
        group_blocks: u32,
        held: impl IntoIterator<Item = (u32, &'b [u8])>,
        shards: impl IntoIterator<Item = (u32, &'b [u8])>,
    ) -> Result<Vec<(u32, Vec<u8>)>, CodingError> {
        let mut decoder =
            reed_solomon_simd::ReedSolomonDecoder::new(group_blocks as usize, self.shards as usize, self.block_len)?;
        let mut padded = vec![0u8; self.block_len];
        for (position, block) in held {
            if block.len() == self.block_len {
                decoder.add_original_shard(position as usize, block)?;
            } else {
                padded.fill(0);
                padded[..block.len()].copy_from_slice(block);
                decoder.add_original_shard(position as usize, &padded)?;
            }
        }
        for (index, shard) in shards {
            decoder.add_recovery_shard(index as usize, shard)?;
        }
        let result = decoder.decode()?;
        // Positions < group_blocks ≤ 32768.
        Ok(result.restored_original_iter().map(|(position, block)| (position as u32, block.to_vec())).collect())
    }
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

/// Reed–Solomon coding failed (shard counts or lengths the code does not take, or too few
/// shards): a bug or a datagram that lies about its coding.
#[derive(Debug, thiserror::Error)]
#[error("parity coding: {0}")]
pub struct CodingError(#[from] reed_solomon_simd::Error);

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ParityConfig {
        ParityConfig { group_blocks: 64, shards: 8, block_len: 16, ..ParityConfig::default() }
    }

    #[test]
    fn any_shards_repair_as_many_lost_blocks() {
        let config = config();
        // A short group of 5 blocks, the last one cut short.
        let blocks: Vec<Vec<u8>> =
            (0..5u8).map(|b| (0..if b == 4 { 7 } else { 16 }).map(|i| b * 31 + i).collect()).collect();
        let refs: Vec<&[u8]> = blocks.iter().map(Vec::as_slice).collect();
        let shards = config.encode(&refs).unwrap();
        assert_eq!(shards.len(), 8);
        // Lose blocks 1 and 4; repair with shards 6 and 2.
        let held = [0u32, 2, 3].map(|p| (p, refs[p as usize]));
        let restored = config.decode(5, held, [(6, shards[6].as_slice()), (2, shards[2].as_slice())]).unwrap();
        let mut restored: Vec<(u32, Vec<u8>)> = restored;
        restored.sort();
        assert_eq!(restored[0], (1, blocks[1].clone()));
        assert_eq!(restored[1].0, 4);
        assert_eq!(&restored[1].1[..7], &blocks[4][..]);
        assert!(restored[1].1[7..].iter().all(|&b| b == 0));
    }

    #[test]
    fn too_few_shards_is_an_error() {
        let config = config();
        let blocks = [[1u8; 16], [2; 16], [3; 16]];
        let refs: Vec<&[u8]> = blocks.iter().map(|b| b.as_slice()).collect();
        let shards = config.encode(&refs).unwrap();
        assert!(config.decode(3, [(0, refs[0])], [(0, shards[0].as_slice())]).is_err());
    }

    #[test]
    fn geometry_and_seqnum() {
        let config = ParityConfig::default();
        assert!(config.validate().is_ok());
        let span = 256 * 1448;
        assert_eq!(config.groups(span * 2 + 1), 3);
        assert_eq!(config.group_range(2, span * 2 + 1), (span * 2, span * 2 + 1, 1));
        assert_eq!(config.group_of(span), 1);
        assert_eq!(config.parity_seqnum(3, 17), (3 << 16) | (8 << 12) | (5 << 8) | 17);
        assert!(config.codes_as(8, 5));
        assert_eq!("128/16".parse::<ParityConfig>().unwrap(), ParityConfig { group_blocks: 128, shards: 16, ..config });
        for bad in ["128", "128/", "x/16", "100/16", "128/3", "128/16/2"] {
            assert!(bad.parse::<ParityConfig>().is_err(), "{bad}");
        }
        assert!(!config.codes_as(7, 5));
        for bad in [
            ParityConfig { group_blocks: 100, ..config },
            ParityConfig { group_blocks: 32, ..config },
            ParityConfig { shards: 512, ..config },
            ParityConfig { block_len: 1447, ..config },
            ParityConfig { rounds_max: 0, ..config },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
