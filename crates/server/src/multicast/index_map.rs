//! The persistent product-index map of one multicast feed (ldm7-multicast.md §2.3): FMTP product
//! index → the product's MD5 signature, written *before* the product is multicast, so that a
//! REQUEST_PRODUCT for an index the subscriber missed can be answered from the queue, and so
//! that a restarted publisher continues the index sequence where it stopped.
//!
//! File layout (`<state dir>/<feed>.fmtp-index`, little-endian header, fixed-size records):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `LDM7IDX1` |
//! | 8 | 4 | capacity `C` (records) |
//! | 12 | 4 | next index (the index the next product gets) |
//! | 16 + 24·(i mod C) | 4 | index `i` (little-endian) |
//! | | 4 | `0x4C444D37` when the record is valid |
//! | | 16 | the signature |
//!
//! A ring of `C` records: the map remembers the last `C` products (the bound; choose it above
//! the number of products a feed multicasts while the queue keeps them). Writes are positioned
//! writes without fsync, like the product queue's commits: a killed process loses nothing
//! written; an operating-system crash may lose the newest records, which only turns their
//! REQUEST_PRODUCT into NO_SUCH_PRODUCT (the backlog then fills the hole).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use ldm7_fmtp_proto::ProductIndex;
use ldm7_types::Signature;

const MAGIC: &[u8; 8] = b"LDM7IDX1";
const HEADER_LEN: u64 = 16;
const RECORD_LEN: u64 = 24;
const VALID: u32 = 0x4C44_4D37;

/// Records kept by default: about two hours of the whole IDD (440,000 products an hour).
pub const CAPACITY_DEFAULT: u32 = ldm7_config::settings::INDEX_MAP_CAPACITY_DEFAULT;

/// Why the map cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum IndexMapError {
    /// The file cannot be opened, read or written.
    #[error("product-index map {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a product-index map.
    #[error("{0} is not a product-index map (bad magic or capacity): move it away; a new one starts at index 0")]
    NotAMap(PathBuf),
}

/// An open product-index map.
#[derive(Debug)]
pub struct IndexMap {
    file: File,
    path: PathBuf,
    capacity: u32,
    next_index: ProductIndex,
}

impl IndexMap {
    /// Opens the map at `path`, creating it with `capacity` records if it does not exist (an
    /// existing map keeps its own capacity).
    pub fn open(path: &Path, capacity: u32) -> Result<Self, IndexMapError> {
        let io = |source| IndexMapError::Io { path: path.to_path_buf(), source };
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).map_err(io)?;
        let length = file.metadata().map_err(io)?.len();
        if length == 0 {
            let capacity = capacity.max(1);
            let mut header = [0u8; HEADER_LEN as usize];
            header[..8].copy_from_slice(MAGIC);
            header[8..12].copy_from_slice(&capacity.to_le_bytes());
            file.write_all_at(&header, 0).map_err(io)?;
            file.set_len(HEADER_LEN + RECORD_LEN * u64::from(capacity)).map_err(io)?;
            return Ok(Self { file, path: path.to_path_buf(), capacity, next_index: ProductIndex(0) });
        }
        let mut header = [0u8; HEADER_LEN as usize];
        file.read_exact_at(&mut header, 0).map_err(io)?;
        let stored_capacity = u32::from_le_bytes(header[8..12].try_into().unwrap_or_default());
        if &header[..8] != MAGIC
            || stored_capacity == 0
            || length < HEADER_LEN + RECORD_LEN * u64::from(stored_capacity)
        {
            return Err(IndexMapError::NotAMap(path.to_path_buf()));
        }
        let next_index = ProductIndex(u32::from_le_bytes(header[12..16].try_into().unwrap_or_default()));
        Ok(Self { file, path: path.to_path_buf(), capacity: stored_capacity, next_index })
    }

    /// The index the next product gets.
    pub fn next_index(&self) -> ProductIndex {
        self.next_index
    }

    /// Records the product multicast with `index` (call before multicasting it) and advances the
    /// next index past it.
    pub fn put(&mut self, index: ProductIndex, signature: &Signature) -> Result<(), IndexMapError> {
        let io = |source| IndexMapError::Io { path: self.path.clone(), source };
        let mut record = [0u8; RECORD_LEN as usize];
        record[..4].copy_from_slice(&index.0.to_le_bytes());
        record[4..8].copy_from_slice(&VALID.to_le_bytes());
        record[8..].copy_from_slice(signature.as_bytes());
        self.file.write_all_at(&record, self.offset(index)).map_err(io)?;
        self.next_index = index.wrapping_add(1);
        self.file.write_all_at(&self.next_index.0.to_le_bytes(), 12).map_err(io)?;
        Ok(())
    }

    /// Forgets the products from `from` up to the next index (handed to FMTP, then withdrawn
    /// before they were multicast): `from` becomes the next index.
    pub fn withdraw(&mut self, from: ProductIndex) -> Result<(), IndexMapError> {
        let io = |source| IndexMapError::Io { path: self.path.clone(), source };
        let mut index = from;
        while index != self.next_index {
            self.file.write_all_at(&[0u8; RECORD_LEN as usize], self.offset(index)).map_err(io)?;
            index = index.wrapping_add(1);
        }
        self.next_index = from;
        self.file.write_all_at(&self.next_index.0.to_le_bytes(), 12).map_err(io)?;
        Ok(())
    }

    /// The signature of the product multicast with `index`, if the map still remembers it.
    pub fn get(&self, index: ProductIndex) -> Result<Option<Signature>, IndexMapError> {
        let mut record = [0u8; RECORD_LEN as usize];
        self.file
            .read_exact_at(&mut record, self.offset(index))
            .map_err(|source| IndexMapError::Io { path: self.path.clone(), source })?;
        let stored = u32::from_le_bytes(record[..4].try_into().unwrap_or_default());
        let valid = u32::from_le_bytes(record[4..8].try_into().unwrap_or_default());
        if valid != VALID || stored != index.0 {
            return Ok(None);
        }
        let mut signature = [0u8; 16];
        signature.copy_from_slice(&record[8..]);
        Ok(Some(Signature(signature)))
    }

    /// How many products the map remembers.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    fn offset(&self, index: ProductIndex) -> u64 {
        HEADER_LEN + RECORD_LEN * u64::from(index.0 % self.capacity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signature(n: u8) -> Signature {
        Signature([n; 16])
    }

    #[test]
    fn remembers_the_last_records_and_the_next_index_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("EXP.fmtp-index");
        let mut map = IndexMap::open(&path, 4).unwrap();
        assert_eq!(map.next_index(), ProductIndex(0));
        for n in 0..6u32 {
            map.put(ProductIndex(n), &signature(n as u8)).unwrap();
        }
        assert_eq!(map.get(ProductIndex(5)).unwrap(), Some(signature(5)));
        assert_eq!(map.get(ProductIndex(2)).unwrap(), Some(signature(2)));
        assert_eq!(map.get(ProductIndex(1)).unwrap(), None, "overwritten by 5");
        assert_eq!(map.get(ProductIndex(9)).unwrap(), None, "never written");
        drop(map);
        let map = IndexMap::open(&path, 99).unwrap();
        assert_eq!((map.next_index(), map.capacity()), (ProductIndex(6), 4));
        assert_eq!(map.get(ProductIndex(4)).unwrap(), Some(signature(4)));
    }

    #[test]
    fn withdrawn_records_are_forgotten_and_their_indexes_given_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("EXP.fmtp-index");
        let mut map = IndexMap::open(&path, 8).unwrap();
        for n in 0..5u32 {
            map.put(ProductIndex(n), &signature(n as u8)).unwrap();
        }
        map.withdraw(ProductIndex(3)).unwrap();
        assert_eq!(map.next_index(), ProductIndex(3));
        assert_eq!(map.get(ProductIndex(2)).unwrap(), Some(signature(2)));
        assert_eq!(map.get(ProductIndex(3)).unwrap(), None);
        assert_eq!(map.get(ProductIndex(4)).unwrap(), None);
        drop(map);
        let mut map = IndexMap::open(&path, 8).unwrap();
        assert_eq!(map.next_index(), ProductIndex(3), "kept across a restart");
        map.put(ProductIndex(3), &signature(9)).unwrap();
        assert_eq!(map.get(ProductIndex(3)).unwrap(), Some(signature(9)));
    }

    #[test]
    fn wraps_and_refuses_foreign_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("map");
        let mut map = IndexMap::open(&path, 8).unwrap();
        map.put(ProductIndex(u32::MAX), &signature(1)).unwrap();
        assert_eq!(map.next_index(), ProductIndex(0));
        let foreign = dir.path().join("foreign");
        std::fs::write(&foreign, b"not a map at all, no").unwrap();
        assert!(matches!(IndexMap::open(&foreign, 8), Err(IndexMapError::NotAMap(_))));
    }
}
