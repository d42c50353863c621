//! The queue itself: creation, opening, insertion with eviction, snapshots and statistics.
//!
//! Invariants, kept by doing every change in one LMDB write transaction:
//! - `used_bytes <= capacity_bytes` and `product_count <= capacity_slots`;
//! - insertion times (the `products` keys) strictly increase in insertion order;
//! - every product has exactly one `signatures` entry pointing at its key, and no other entries
//!   exist, so a signature is present at most once;
//! - the `state` record's totals equal the sums over `products`.
//!
//! Readers work in LMDB read transactions (snapshots): a product a reader holds stays intact
//! even while a writer evicts it, because LMDB never reuses pages a live snapshot can see.
//! A `kill -9` at any moment leaves the last committed transaction: never a torn product.
//!
//! A full file system never kills a process (see the `reserve` module): a queue is built in a
//! directory beside its path with every byte of its files on the disk, then renamed into place,
//! so a queue at its path is always whole; opening refuses a data file with fewer bytes on the
//! disk than its map (a creation by an older ldm7 that did not finish, a truncated or sparse
//! copy), because a write into such a hole kills the writer with SIGBUS when the disk is full.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use heed::byteorder::BigEndian;
use heed::types::{Bytes, Str, U64};
use heed::{Database, Env, RoTxn, WithoutTls};

use crate::notify::Notifier;
use crate::record::{CorruptRecord, Reference};

mod check;
mod error;
mod insert;
mod open;
mod read;

pub use check::{CheckReport, MinimumResidence, QueueStats};
pub use error::{CreateError, InsertError, OpenError, StorageError};
pub use insert::InsertOutcome;
pub use read::{Follower, OwnedProduct, QueuedProduct, Snapshot};

/// Name of the LMDB data file inside the queue directory.
pub const DATA_FILE: &str = "data.mdb";
/// Name of the LMDB lock file inside the queue directory.
pub const LOCK_FILE: &str = "lock.mdb";
/// Name of the wake-up file inside the queue directory.
pub const NOTIFY_FILE: &str = "notify";

/// Version of the `config` and `state` records.
const META_FORMAT_VERSION: u32 = 1;
/// LMDB's page size on this platform.
const PAGE_BYTES: u64 = 4096;
/// Most LMDB reader slots (processes and threads reading at once).
const READERS_MAX: u32 = 1022;
/// Bytes of LMDB's lock file for [`READERS_MAX`] readers: 64 bytes per reader slot after a
/// 128-byte header, (1022 − 1) × 64 + 192 on 64-bit Linux. Reserved before LMDB maps it.
const LOCK_FILE_BYTES: u64 = 64 << 10;
/// Permissions of a new lock file: LMDB's own (heed opens with 0600).
const LOCK_FILE_MODE: u32 = 0o600;

type ProductsTable = Database<U64<BigEndian>, Bytes>;
type SignaturesTable = Database<Bytes, U64<BigEndian>>;
type MetaTable = Database<Str, Bytes>;
type ExtentsTable = Database<U64<BigEndian>, Bytes>;

/// The two fixed capacities of a queue, set when it is created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Most bytes of stored products (metadata and data).
    pub bytes: u64,
    /// Most products.
    pub slots: u64,
}

impl Capacity {
    /// LDM's default slot count for a byte size: one slot per 140,000 bytes (ldm-formats.md §4).
    pub fn default_slots(bytes: u64) -> u64 {
        (bytes / 140_000).max(1)
    }
}

/// A product queue: a directory holding an LMDB environment and the wake-up file.
///
/// Cheap to share between threads (`&Queue`); open it once per process.
#[derive(Debug)]
pub struct Queue {
    env: Env<WithoutTls>,
    products: ProductsTable,
    signatures: SignaturesTable,
    meta: MetaTable,
    extents: ExtentsTable,
    capacity: Capacity,
    notifier: Notifier,
    path: PathBuf,
    /// Give back the map pages of inserted products after each commit (see
    /// [`Queue::set_release_pages`]).
    release_pages: AtomicBool,
}

impl Queue {
    /// The queue's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The queue's capacities.
    pub fn capacity(&self) -> Capacity {
        self.capacity
    }

    /// With `true`, after each insert this process drops its mapping of the pages the new
    /// products were written to: the bytes stay in the page cache and reach the file as usual,
    /// but they no longer count in this process's resident memory. A tool inserting gigabytes
    /// then stays small; reading those products again from this process costs a page fault.
    pub fn set_release_pages(&self, release: bool) {
        self.release_pages.store(release, Ordering::Relaxed);
    }

    /// The record a `products` value holds or, for a packed product, points at.
    fn record<'t>(&self, txn: &'t RoTxn<'_>, bytes: &'t [u8]) -> Result<&'t [u8], StorageError> {
        match Reference::parse(bytes)? {
            Some(reference) => self.extent_record(txn, reference),
            None => Ok(bytes),
        }
    }

    /// The packed record a reference points at.
    fn extent_record<'t>(&self, txn: &'t RoTxn<'_>, reference: Reference) -> Result<&'t [u8], StorageError> {
        let extent = self.extents.get(txn, &reference.extent)?.ok_or(CorruptRecord::MissingExtent(reference.extent))?;
        Ok(reference.record(extent)?)
    }

    fn state(&self, txn: &RoTxn<'_>) -> Result<State, StorageError> {
        let bytes =
            self.meta.get(txn, "state")?.ok_or_else(|| StorageError::Meta("the state record is missing".into()))?;
        State::decode(bytes).map_err(StorageError::Meta)
    }

    fn config(&self, txn: &RoTxn<'_>) -> Result<ConfigRecord, StorageError> {
        let bytes =
            self.meta.get(txn, "config")?.ok_or_else(|| StorageError::Meta("the config record is missing".into()))?;
        ConfigRecord::decode(bytes).map_err(StorageError::Meta)
    }
}

/// The `config` meta record: fixed at creation.
struct ConfigRecord {
    capacity: Capacity,
    created_micros: i64,
}

impl ConfigRecord {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(28);
        out.extend_from_slice(&META_FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&self.capacity.bytes.to_le_bytes());
        out.extend_from_slice(&self.capacity.slots.to_le_bytes());
        out.extend_from_slice(&self.created_micros.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Result<Self, String> {
        let words = MetaWords::new(bytes, 28)?;
        Ok(Self {
            capacity: Capacity { bytes: words.u64_at(4), slots: words.u64_at(12) },
            created_micros: words.u64_at(20) as i64,
        })
    }
}

/// The `state` meta record: totals and counters, rewritten by every insert.
#[derive(Clone, Copy, Debug)]
struct State {
    used_bytes: u64,
    product_count: u64,
    next_queue_seq: u64,
    last_key: u64,
    inserted_count: u64,
    evicted_count: u64,
    mvrt_micros: i64,
    mvrt_used_bytes: u64,
    mvrt_used_slots: u64,
}

impl Default for State {
    fn default() -> Self {
        Self {
            used_bytes: 0,
            product_count: 0,
            next_queue_seq: 0,
            last_key: 0,
            inserted_count: 0,
            evicted_count: 0,
            mvrt_micros: -1,
            mvrt_used_bytes: 0,
            mvrt_used_slots: 0,
        }
    }
}

const STATE_LEN: usize = 4 + 9 * 8;

impl State {
    fn encode(&self) -> [u8; STATE_LEN] {
        let mut out = [0u8; STATE_LEN];
        out[..4].copy_from_slice(&META_FORMAT_VERSION.to_le_bytes());
        let words = [
            self.used_bytes,
            self.product_count,
            self.next_queue_seq,
            self.last_key,
            self.inserted_count,
            self.evicted_count,
            self.mvrt_micros as u64,
            self.mvrt_used_bytes,
            self.mvrt_used_slots,
        ];
        for (index, word) in words.iter().enumerate() {
            out[4 + 8 * index..12 + 8 * index].copy_from_slice(&word.to_le_bytes());
        }
        out
    }

    fn decode(bytes: &[u8]) -> Result<Self, String> {
        let words = MetaWords::new(bytes, STATE_LEN)?;
        let word = |index: usize| words.u64_at(4 + 8 * index);
        Ok(Self {
            used_bytes: word(0),
            product_count: word(1),
            next_queue_seq: word(2),
            last_key: word(3),
            inserted_count: word(4),
            evicted_count: word(5),
            mvrt_micros: word(6) as i64,
            mvrt_used_bytes: word(7),
            mvrt_used_slots: word(8),
        })
    }
}

/// A length- and version-checked meta record.
struct MetaWords<'a>(&'a [u8]);

impl<'a> MetaWords<'a> {
    fn new(bytes: &'a [u8], len: usize) -> Result<Self, String> {
        if bytes.len() != len {
            return Err(format!("meta record has {} bytes, expected {len}", bytes.len()));
        }
        let version = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        if version != META_FORMAT_VERSION {
            return Err(format!(
                "queue format version {version} is not supported (this program reads {META_FORMAT_VERSION})"
            ));
        }
        Ok(Self(bytes))
    }

    fn u64_at(&self, offset: usize) -> u64 {
        let mut word = [0u8; 8];
        word.copy_from_slice(&self.0[offset..offset + 8]);
        u64::from_le_bytes(word)
    }
}
