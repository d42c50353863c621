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

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use heed::byteorder::BigEndian;
use heed::types::{Bytes, Str, U64};
use heed::{Database, Env, EnvFlags, EnvOpenOptions, PutFlags, RoTxn, WithoutTls};
use ldm7_types::{ProdInfo, Signature, Timestamp};

use crate::notify::{NOTIFY_FILE_LEN, NOTIFY_FILE_MODE, Notifier};
use crate::record::{self, CorruptRecord, InvalidProduct, RecordView, Reference};
use crate::reserve::{self, allocated_bytes, is_no_space};

/// Name of the LMDB data file inside the queue directory.
pub const DATA_FILE: &str = "data.mdb";
/// Name of the LMDB lock file inside the queue directory.
pub const LOCK_FILE: &str = "lock.mdb";
/// Name of the wake-up file inside the queue directory.
pub const NOTIFY_FILE: &str = "notify";

/// Version of the `config` and `state` records.
const META_FORMAT_VERSION: u32 = 1;
/// Records at or below this size are copied into place with `MDB_APPEND`, which packs leaf
/// pages full; larger ones (LMDB overflow pages) are written straight into the map.
const APPEND_COPY_LEN_MAX: usize = 2048;
/// Records of products inserted together that are larger than [`APPEND_COPY_LEN_MAX`] and at
/// most this long are packed into extents (the `record` module): LMDB rounds each value up to
/// whole pages, once per extent rather than once per record. Above it the rounding is under 1%.
const PACKED_RECORD_LEN_MAX: usize = 256 << 10;
/// Most bytes of one extent. An extent is removed with its last product, so this bounds the
/// bytes of evicted products an extent can still hold (room the map size leaves).
const EXTENT_LEN_MAX: usize = 1 << 20;
/// How many times an insert retries after LMDB reports the map full.
const MAP_FULL_RETRIES_MAX: usize = 3;
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

/// What an insert did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InsertOutcome {
    /// The product is in the queue.
    Inserted {
        /// Its insertion time (the queue key; unique).
        insertion: Timestamp,
        /// Its queue sequence number.
        queue_seq: u64,
        /// How many old products were evicted to make room.
        evicted: u32,
    },
    /// A product with the same signature is already in the queue; nothing changed.
    Duplicate {
        /// Insertion time of the product already present.
        existing: Timestamp,
    },
}

/// Failure to create a queue.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// The path exists and `force` was not given.
    #[error("{0} already exists: use --force to replace the product queue there")]
    Exists(PathBuf),
    /// The path exists but is not a product queue; `force` never deletes such a thing.
    #[error("{0} exists and is not a product queue: choose another path or remove it yourself")]
    NotAQueue(PathBuf),
    /// A capacity is zero or too large.
    #[error("invalid capacity: {0}")]
    Capacity(String),
    /// The file system has less room than the queue's file takes (it is written out in full).
    #[error(
        "cannot create product queue {path}: its file takes {needed} bytes and the file system has {free} \
         free: choose a smaller --size or another file system"
    )]
    NoSpace {
        /// The queue path.
        path: PathBuf,
        /// Bytes the data file takes.
        needed: u64,
        /// Bytes available to this user on the file system.
        free: u64,
    },
    /// The file system filled up (or the user's quota ran out) while the queue was being
    /// written; what was written is removed.
    #[error(
        "cannot create product queue {path}: the file system filled up while its {needed}-byte file was \
         being written (nothing was left behind): free some space, or choose a smaller --size or another \
         file system"
    )]
    FileSystemFull {
        /// The queue path.
        path: PathBuf,
        /// Bytes the queue's files take.
        needed: u64,
    },
    /// Filesystem or LMDB failure.
    #[error("cannot create product queue {path}: {source}")]
    Storage {
        /// The queue path.
        path: PathBuf,
        /// The cause.
        source: StorageError,
    },
    /// The queue was made but could not be opened.
    #[error(transparent)]
    Open(#[from] OpenError),
}

/// Failure to open a queue.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Nothing at the path.
    #[error("no product queue at {0}: create one with `ldm7 queue create --path {0}`")]
    Missing(PathBuf),
    /// Something at the path, but not a queue this version understands.
    #[error("{path} is not a usable product queue: {why}")]
    NotAQueue {
        /// The queue path.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The data file lacks disk space for part of its map (see [`Queue::open`]): writing into it
    /// could kill the writer with SIGBUS on a full file system, so it is not opened.
    #[error(
        "product queue {path} is damaged: {why}: recreate it with `ldm7 queue create --force --path {path}` \
         (its products are lost)"
    )]
    Damaged {
        /// The queue path.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The file system is full and one of the queue's small files (lock, notify) still needs
    /// its blocks.
    #[error(
        "cannot open product queue {path}: the file system is full and {file} has no disk space reserved \
         (a queue made by an older ldm7): free some space and retry"
    )]
    FileSystemFull {
        /// The queue path.
        path: PathBuf,
        /// The file lacking space.
        file: &'static str,
    },
    /// Filesystem or LMDB failure.
    #[error("cannot open product queue {path}: {source}")]
    Storage {
        /// The queue path.
        path: PathBuf,
        /// The cause.
        source: StorageError,
    },
}

/// Failure to insert (a duplicate is not a failure: see [`InsertOutcome::Duplicate`]).
#[derive(Debug, thiserror::Error)]
pub enum InsertError {
    /// The product's metadata is unusable.
    #[error("invalid product: {0}")]
    Invalid(#[from] InvalidProduct),
    /// The product alone is larger than the queue (LDM's `PQ_BIG`).
    #[error(
        "product of {record_len} bytes (with metadata) does not fit a queue of {capacity_bytes} bytes: create a larger queue"
    )]
    TooBig {
        /// Bytes the product needs.
        record_len: u64,
        /// The queue's byte capacity.
        capacity_bytes: u64,
    },
    /// LMDB's file is full even after evicting: a reader holds a very old snapshot.
    #[error("the queue file is full: a reader is holding an old snapshot open; stop stuck readers and retry")]
    MapFull,
    /// Filesystem or LMDB failure.
    #[error("product queue storage failure: {0}")]
    Storage(#[from] StorageError),
    /// The source of a streamed product failed or gave the wrong number of bytes; nothing was
    /// inserted.
    #[error("the product's bytes could not be read: {0}")]
    Source(#[source] io::Error),
}

/// Per-attempt state of an insert transaction.
struct PutScratch {
    /// Bytes evicted beyond what the new products need (grows on each map-full retry).
    reserve_bytes: u64,
    /// The failure of a streamed product's source, if it failed.
    source_error: Option<io::Error>,
    /// Address and length of each record written straight into the map.
    written: Vec<(usize, usize)>,
}

/// Where an inserted product's bytes come from.
enum Data<'a> {
    /// A slice in memory.
    Slice(&'a [u8]),
    /// A writer callback that writes exactly `info.size` bytes (see [`Queue::insert_streamed`]).
    Streamed(&'a mut dyn FnMut(&mut dyn Write) -> io::Result<()>),
    /// A callback that fills the data's slice of the reserved space (see [`Queue::insert_filled`]).
    Filled(&'a mut dyn FnMut(&mut [u8]) -> io::Result<()>),
}

/// A failure of the storage layer (LMDB, the filesystem) or a damaged record.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// LMDB or I/O failure.
    #[error(transparent)]
    Lmdb(#[from] heed::Error),
    /// Filesystem failure.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// A stored record does not parse.
    #[error("damaged product record: {0}")]
    Corrupt(#[from] CorruptRecord),
    /// A meta record does not parse.
    #[error("damaged queue metadata: {0}")]
    Meta(String),
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
    /// Creates a queue at `path` (a directory). Refuses an existing path unless `force`, and
    /// even then replaces only a product queue (removed first: its space may be what the new
    /// one needs).
    ///
    /// The queue is built in `PATH.tmp-PID` beside `path` — its lock and notify files reserved,
    /// its data file written full of zeros, then its tables — and renamed into place, so `path`
    /// holds a whole queue or nothing. A failure removes what it wrote; a build left by a killed
    /// creation is removed by the next creation at the same path. Without `fsync` (the queue's
    /// durability is LMDB's `MDB_NOSYNC`): after an operating-system crash a queue whose blocks
    /// did not reach the disk is refused by [`Queue::open`] as damaged.
    pub fn create(path: &Path, capacity: Capacity, force: bool) -> Result<Self, CreateError> {
        if capacity.bytes == 0 || capacity.slots == 0 {
            return Err(CreateError::Capacity("size and slots must both be at least 1".into()));
        }
        if capacity.bytes > (1 << 46) {
            return Err(CreateError::Capacity(format!("{} bytes is more than 64 TiB", capacity.bytes)));
        }
        let storage = |source: StorageError| CreateError::Storage { path: path.to_owned(), source };
        let Some(name) = path.file_name() else {
            return Err(CreateError::NotAQueue(path.to_owned()));
        };
        if path.exists() {
            if !force {
                return Err(CreateError::Exists(path.to_owned()));
            }
            remove_queue_files(path)?;
            fs::remove_dir(path).map_err(|error| storage(error.into()))?;
        }
        let parent = path.parent().filter(|parent| !parent.as_os_str().is_empty()).unwrap_or(Path::new("."));
        fs::create_dir_all(parent).map_err(|error| storage(error.into()))?;
        remove_stale_builds(parent, name);
        let mut build_name = name.to_owned();
        build_name.push(format!("{BUILD_SUFFIX}{}", std::process::id()));
        let build = parent.join(build_name);
        if build.exists() {
            remove_queue_files(&build)?;
            fs::remove_dir(&build).map_err(|error| storage(error.into()))?;
        }
        fs::create_dir(&build).map_err(|error| storage(error.into()))?;
        // What a failed creation made is removed: a half-written file would hold the very
        // space whose lack made it fail.
        let built = Self::build(&build, capacity)
            .and_then(|()| fs::rename(&build, path).map_err(|error| storage(error.into())))
            .map_err(|error| match error {
                CreateError::Storage { source, .. } if storage_is_no_space(&source) => {
                    CreateError::FileSystemFull { path: path.to_owned(), needed: queue_file_bytes(capacity) }
                }
                CreateError::Storage { source, .. } => storage(source),
                CreateError::NoSpace { needed, free, .. } => {
                    CreateError::NoSpace { path: path.to_owned(), needed, free }
                }
                other => other,
            });
        if let Err(error) = built {
            if remove_queue_files(&build).is_ok() {
                let _ = fs::remove_dir(&build);
            }
            return Err(error);
        }
        Ok(Self::open(path)?)
    }

    /// Builds a queue in the empty directory `dir`: every byte of its files gets its disk block
    /// before anything is written through a map.
    fn build(dir: &Path, capacity: Capacity) -> Result<(), CreateError> {
        let storage = |source: StorageError| CreateError::Storage { path: dir.to_owned(), source };
        let needed = queue_file_bytes(capacity);
        let free = available_bytes(dir).map_err(|error| storage(error.into()))?;
        if free < needed {
            return Err(CreateError::NoSpace { path: dir.to_owned(), needed, free });
        }
        reserve::open_reserved(&dir.join(LOCK_FILE), LOCK_FILE_BYTES, LOCK_FILE_MODE)
            .map_err(|error| storage(error.into()))?;
        reserve::open_reserved(&dir.join(NOTIFY_FILE), NOTIFY_FILE_LEN, NOTIFY_FILE_MODE)
            .map_err(|error| storage(error.into()))?;
        // LMDB writes its two meta pages with `pwrite` and sizes the file to the map; nothing
        // has been written through the map yet.
        let env = open_env(dir, Some(capacity)).map_err(storage)?;
        let info = env.info();
        let written_bytes = (info.last_page_number as u64 + 1) * PAGE_BYTES;
        allocate_data_file(&dir.join(DATA_FILE), written_bytes, info.map_size as u64)
            .map_err(|error| storage(error.into()))?;
        let mut txn = env.write_txn().map_err(|error| storage(error.into()))?;
        let created = (|| -> Result<_, heed::Error> {
            env.create_database::<U64<BigEndian>, Bytes>(&mut txn, Some("products"))?;
            env.create_database::<Bytes, U64<BigEndian>>(&mut txn, Some("signatures"))?;
            env.create_database::<U64<BigEndian>, Bytes>(&mut txn, Some("extents"))?;
            let meta: MetaTable = env.create_database(&mut txn, Some("meta"))?;
            let created_micros = Timestamp::from_system_time(SystemTime::now()).as_unix_micros();
            meta.put(&mut txn, "config", &ConfigRecord { capacity, created_micros }.encode())?;
            meta.put(&mut txn, "state", &State::default().encode())?;
            Ok(())
        })();
        created.map_err(|error| storage(error.into()))?;
        txn.commit().map_err(|error| storage(error.into()))?;
        Ok(())
    }

    /// Opens an existing queue for reading and inserting.
    pub fn open(path: &Path) -> Result<Self, OpenError> {
        let data_path = path.join(DATA_FILE);
        if !path.exists() {
            return Err(OpenError::Missing(path.to_owned()));
        }
        if !data_path.is_file() {
            return Err(OpenError::NotAQueue {
                path: path.to_owned(),
                why: format!("{} is missing", data_path.display()),
            });
        }
        let storage = |source: StorageError| OpenError::Storage { path: path.to_owned(), source };
        let not_a_queue = |why: String| OpenError::NotAQueue { path: path.to_owned(), why };
        let reserve_failed = |file: &'static str| {
            move |error: io::Error| {
                if is_no_space(&error) {
                    OpenError::FileSystemFull { path: path.to_owned(), file }
                } else {
                    OpenError::Storage { path: path.to_owned(), source: error.into() }
                }
            }
        };
        let data = fs::metadata(&data_path).map_err(|error| storage(error.into()))?;
        let damaged = |why: String| OpenError::Damaged { path: path.to_owned(), why };
        let recorded_map_bytes = recorded_map_bytes(&data_path).map_err(|error| storage(error.into()))?;
        if let Some(why) = data_file_problem(data.len(), allocated_bytes(&data), recorded_map_bytes) {
            return Err(damaged(why));
        }
        // LMDB writes its lock file's header through a map as it opens it.
        reserve::open_reserved(&path.join(LOCK_FILE), LOCK_FILE_BYTES, LOCK_FILE_MODE)
            .map_err(reserve_failed(LOCK_FILE))?;
        // LMDB keeps the map size in its file: open with that, then read our capacity. It sizes a
        // shorter file up to the map (with a hole), which is why the length was checked first.
        let env = open_env(path, None).map_err(storage)?;
        if let Some(why) = data_file_problem(data.len(), allocated_bytes(&data), Some(env.info().map_size as u64)) {
            return Err(damaged(why));
        }
        let txn = env.read_txn().map_err(|error| storage(error.into()))?;
        let products: Option<ProductsTable> =
            env.open_database(&txn, Some("products")).map_err(|error| storage(error.into()))?;
        let signatures: Option<SignaturesTable> =
            env.open_database(&txn, Some("signatures")).map_err(|error| storage(error.into()))?;
        let meta: Option<MetaTable> = env.open_database(&txn, Some("meta")).map_err(|error| storage(error.into()))?;
        let extents: Option<ExtentsTable> =
            env.open_database(&txn, Some("extents")).map_err(|error| storage(error.into()))?;
        let (Some(products), Some(signatures), Some(meta)) = (products, signatures, meta) else {
            return Err(not_a_queue("a table is missing".into()));
        };
        let config = {
            let bytes = meta
                .get(&txn, "config")
                .map_err(|error| storage(error.into()))?
                .ok_or_else(|| not_a_queue("it has no queue configuration".into()))?;
            ConfigRecord::decode(bytes).map_err(not_a_queue)?
        };
        let capacity = config.capacity;
        // Committing (not dropping) the read transaction keeps the table handles it opened.
        txn.commit().map_err(|error| storage(error.into()))?;
        // A queue made before records were packed has no extents table: it gets an empty one.
        let extents = match extents {
            Some(extents) => extents,
            None => (|| -> Result<ExtentsTable, heed::Error> {
                let mut txn = env.write_txn()?;
                let extents = env.create_database(&mut txn, Some("extents"))?;
                txn.commit()?;
                Ok(extents)
            })()
            .map_err(|error| storage(error.into()))?,
        };
        // Readers killed while reading leave stale LMDB reader slots; clear them.
        env.clear_stale_readers().map_err(|error| storage(error.into()))?;
        let notifier = Notifier::open(&path.join(NOTIFY_FILE)).map_err(reserve_failed(NOTIFY_FILE))?;
        Ok(Self::assemble(env, (products, signatures, meta, extents), capacity, notifier, path))
    }

    fn assemble(
        env: Env<WithoutTls>,
        (products, signatures, meta, extents): (ProductsTable, SignaturesTable, MetaTable, ExtentsTable),
        capacity: Capacity,
        notifier: Notifier,
        path: &Path,
    ) -> Self {
        let release_pages = AtomicBool::new(false);
        Self { env, products, signatures, meta, extents, capacity, notifier, path: path.to_owned(), release_pages }
    }

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

    /// Inserts a product, evicting the oldest products first if it does not fit. `info.size`
    /// must equal `data.len()`. The insertion time is the current clock, bumped by 1 µs past
    /// the newest product when the clock has not moved on (or moved back).
    pub fn insert(&self, info: &ProdInfo, data: &[u8]) -> Result<InsertOutcome, InsertError> {
        self.insert_at(Timestamp::from_system_time(SystemTime::now()), info, data)
    }

    /// Checks, without inserting, that a product with this metadata (and `info.size` bytes of
    /// data) is valid and fits the queue; returns the bytes it would occupy. Tools use it to
    /// refuse a batch before inserting any of it.
    pub fn check_fits(&self, info: &ProdInfo) -> Result<usize, InsertError> {
        let record_len = record::record_len(info, info.size as usize)?;
        if record_len as u64 > self.capacity.bytes {
            return Err(InsertError::TooBig { record_len: record_len as u64, capacity_bytes: self.capacity.bytes });
        }
        Ok(record_len)
    }

    /// [`Queue::insert`] with the clock reading given (tests and replays).
    pub fn insert_at(&self, now: Timestamp, info: &ProdInfo, data: &[u8]) -> Result<InsertOutcome, InsertError> {
        if usize::try_from(info.size).ok() != Some(data.len()) {
            return Err(InvalidProduct::SizeMismatch { declared: info.size, actual: data.len() }.into());
        }
        self.insert_data(now, info, Data::Slice(data))
    }

    /// Inserts a product whose `info.size` bytes `fill` writes straight into the queue's
    /// reserved space (one copy, and never the whole product in memory: a product received into
    /// a spool file is copied in chunks). `fill` may be called more than once (the insert is
    /// retried when LMDB's file is full); each call must write the same bytes. If it fails or
    /// writes a different number of bytes, nothing is inserted ([`InsertError::Source`]). A
    /// duplicate is detected before `fill` is called.
    pub fn insert_streamed(
        &self,
        info: &ProdInfo,
        mut fill: impl FnMut(&mut dyn Write) -> io::Result<()>,
    ) -> Result<InsertOutcome, InsertError> {
        self.insert_data(Timestamp::from_system_time(SystemTime::now()), info, Data::Streamed(&mut fill))
    }

    /// Inserts several products in one transaction: one commit and one wake-up for the batch,
    /// which is what makes many small products cheap. Products are stored in slice order with
    /// increasing insertion times, exactly as the same products inserted one by one (a later
    /// product of the batch may evict an earlier one, and a repeated signature is a
    /// [`InsertOutcome::Duplicate`]). Every product is checked first: if one is invalid or too
    /// big, nothing is inserted. Returns one outcome per product, in order.
    ///
    /// When the batch fits the queue as a whole, the records of its products between 2 KiB and
    /// 256 KiB are packed into extents of up to 1 MiB (see the `record` module): fewer bytes to
    /// write and to keep in memory than one run of whole pages per record.
    pub fn insert_batch(&self, products: &[(&ProdInfo, &[u8])]) -> Result<Vec<InsertOutcome>, InsertError> {
        let mut record_lens = Vec::with_capacity(products.len());
        for (info, data) in products {
            if usize::try_from(info.size).ok() != Some(data.len()) {
                return Err(InvalidProduct::SizeMismatch { declared: info.size, actual: data.len() }.into());
            }
            record_lens.push(self.check_fits(info)?);
        }
        let now = Timestamp::from_system_time(SystemTime::now());
        let outcomes = self.with_map_full_retries(|queue, scratch| {
            let mut txn = queue.env.write_txn()?;
            let mut state = queue.state(&txn)?;
            let outcomes = match queue.put_packed(&mut txn, &mut state, now, products, &record_lens, scratch)? {
                Some(outcomes) => outcomes,
                None => {
                    let mut outcomes = Vec::with_capacity(products.len());
                    for ((info, data), &record_len) in products.iter().zip(&record_lens) {
                        let mut data = Data::Slice(data);
                        outcomes
                            .push(queue.put_product(&mut txn, &mut state, now, info, &mut data, record_len, scratch)?);
                    }
                    outcomes
                }
            };
            queue.meta.put(&mut txn, "state", &state.encode())?;
            txn.commit()?;
            queue.release_written(&scratch.written);
            Ok(outcomes)
        })?;
        if outcomes.iter().any(|outcome| matches!(outcome, InsertOutcome::Inserted { .. })) {
            self.notifier.notify();
        }
        Ok(outcomes)
    }

    /// Inserts a product whose `info.size` bytes `fill` writes into the queue's reserved space,
    /// handed to it as one slice (e.g. `read_exact` from a file: the kernel's copy into the
    /// queue is the only one). `fill` may be called more than once (the insert is retried when
    /// LMDB's file is full) and must fill the whole slice each time; if it fails, nothing is
    /// inserted ([`InsertError::Source`]). A duplicate is detected before `fill` is called.
    pub fn insert_filled(
        &self,
        info: &ProdInfo,
        mut fill: impl FnMut(&mut [u8]) -> io::Result<()>,
    ) -> Result<InsertOutcome, InsertError> {
        self.insert_data(Timestamp::from_system_time(SystemTime::now()), info, Data::Filled(&mut fill))
    }

    fn insert_data(&self, now: Timestamp, info: &ProdInfo, mut data: Data<'_>) -> Result<InsertOutcome, InsertError> {
        let record_len = self.check_fits(info)?;
        let outcome = self.with_map_full_retries(|queue, scratch| {
            let mut txn = queue.env.write_txn()?;
            let mut state = queue.state(&txn)?;
            let outcome = queue.put_product(&mut txn, &mut state, now, info, &mut data, record_len, scratch)?;
            if matches!(outcome, InsertOutcome::Inserted { .. }) {
                queue.meta.put(&mut txn, "state", &state.encode())?;
                txn.commit()?;
                queue.release_written(&scratch.written);
            }
            Ok(outcome)
        })?;
        if matches!(outcome, InsertOutcome::Inserted { .. }) {
            self.notifier.notify();
        }
        Ok(outcome)
    }

    /// Runs one write transaction, retrying when LMDB reports its file full: pages still
    /// visible to old snapshots cannot be reused yet, so stale readers are cleared and each
    /// retry evicts more than strictly needed (`reserve_bytes`) to free whole pages. A failure
    /// of a streamed product's source ends the insert at once.
    fn with_map_full_retries<T>(
        &self,
        mut transaction: impl FnMut(&Self, &mut PutScratch) -> Result<T, StorageError>,
    ) -> Result<T, InsertError> {
        let mut reserve_bytes = 0u64;
        for attempt in 0..=MAP_FULL_RETRIES_MAX {
            let mut scratch = PutScratch { reserve_bytes, source_error: None, written: Vec::new() };
            let result = transaction(self, &mut scratch);
            if let Some(error) = scratch.source_error {
                return Err(InsertError::Source(error));
            }
            match result {
                Err(StorageError::Lmdb(heed::Error::Mdb(heed::MdbError::MapFull)))
                    if attempt < MAP_FULL_RETRIES_MAX =>
                {
                    self.env.clear_stale_readers().map_err(StorageError::from)?;
                    reserve_bytes = (reserve_bytes * 2).max(self.capacity.bytes / 8);
                }
                Err(StorageError::Lmdb(heed::Error::Mdb(heed::MdbError::MapFull))) => return Err(InsertError::MapFull),
                Err(error) => return Err(error.into()),
                Ok(value) => return Ok(value),
            }
        }
        Err(InsertError::MapFull)
    }

    /// Puts one product into an open write transaction, evicting the oldest products first
    /// while it does not fit; updates `state` (the caller stores it and commits).
    #[allow(clippy::too_many_arguments)]
    fn put_product(
        &self,
        txn: &mut heed::RwTxn<'_>,
        state: &mut State,
        now: Timestamp,
        info: &ProdInfo,
        data: &mut Data<'_>,
        record_len: usize,
        scratch: &mut PutScratch,
    ) -> Result<InsertOutcome, StorageError> {
        let PutScratch { reserve_bytes, source_error, written } = scratch;
        let outcome = self.place(txn, state, now, info, record_len, *reserve_bytes)?;
        let InsertOutcome::Inserted { insertion, queue_seq, .. } = outcome else {
            return Ok(outcome);
        };
        let key = insertion.as_unix_micros() as u64;
        let header = record_header(info, queue_seq, record_len);
        match data {
            Data::Slice(data) => self.put_record(txn, key, header, data, written)?,
            Data::Streamed(fill) => {
                let result = self.products.put_reserved(txn, &key, record_len, |space| {
                    written.push((space.as_uninit_mut().as_ptr() as usize, record_len));
                    space.write_all(&header)?;
                    let mut counted = Counted { inner: space, count: 0 };
                    let result = fill(&mut counted).and_then(|()| {
                        if counted.count == u64::from(info.size) {
                            Ok(())
                        } else {
                            Err(io::Error::other(format!(
                                "{} bytes written for a product of {} bytes",
                                counted.count, info.size
                            )))
                        }
                    });
                    if let Err(error) = result {
                        *source_error = Some(error);
                        return Err(io::Error::other("product source failed"));
                    }
                    Ok(())
                });
                if source_error.is_some() {
                    // The caller drops the transaction, which discards the reserved record.
                    return Err(StorageError::Meta("product source failed".into()));
                }
                result?;
            }
            Data::Filled(fill) => {
                let result = self.products.put_reserved(txn, &key, record_len, |space| {
                    written.push((space.as_uninit_mut().as_ptr() as usize, record_len));
                    space.write_all(&header)?;
                    let tail = &mut space.as_uninit_mut()[header.len()..];
                    // SAFETY: the reserved space lies in LMDB's shared file mapping (the
                    // environment is always opened with WRITE_MAP), whose bytes are always
                    // initialized (file contents or zeroes), so viewing them as `u8` is sound;
                    // the slice is exclusively ours for the duration of this callback.
                    #[allow(unsafe_code)]
                    let tail = unsafe { std::slice::from_raw_parts_mut(tail.as_mut_ptr().cast::<u8>(), tail.len()) };
                    if let Err(error) = fill(tail) {
                        *source_error = Some(error);
                        return Err(io::Error::other("product source failed"));
                    }
                    // SAFETY: the header and then the whole tail were written above.
                    #[allow(unsafe_code)]
                    unsafe {
                        space.assume_written(record_len);
                    }
                    Ok(())
                });
                if source_error.is_some() {
                    return Err(StorageError::Meta("product source failed".into()));
                }
                result?;
            }
        }
        self.signatures.put(txn, info.signature.as_bytes(), &key)?;
        Ok(outcome)
    }

    /// Places one product as every insert does: a duplicate if its signature is in the queue,
    /// else the oldest products evicted while it does not fit and its key and sequence number
    /// taken, and `state` counts it. The caller writes its record and its signature entry.
    fn place(
        &self,
        txn: &mut heed::RwTxn<'_>,
        state: &mut State,
        now: Timestamp,
        info: &ProdInfo,
        record_len: usize,
        reserve_bytes: u64,
    ) -> Result<InsertOutcome, StorageError> {
        if let Some(existing) = self.signatures.get(txn, info.signature.as_bytes())? {
            return Ok(InsertOutcome::Duplicate { existing: Timestamp::from_unix_micros(existing as i64) });
        }
        let len = record_len as u64;
        let mut evicted = 0u32;
        let bytes_limit = self.capacity.bytes.saturating_sub(reserve_bytes).max(len);
        while state.product_count > 0
            && (state.product_count + 1 > self.capacity.slots || state.used_bytes + len > bytes_limit)
        {
            self.evict_oldest(txn, state, now)?;
            evicted += 1;
        }
        let key = u64::try_from(now.as_unix_micros()).unwrap_or(0).max(state.last_key + 1);
        let queue_seq = state.next_queue_seq;
        state.used_bytes += len;
        state.product_count += 1;
        state.next_queue_seq += 1;
        state.last_key = key;
        state.inserted_count += 1;
        Ok(InsertOutcome::Inserted { insertion: Timestamp::from_unix_micros(key as i64), queue_seq, evicted })
    }

    /// Stores one record (`header` then `data`) as the value of `key`: copied into a leaf page
    /// up to [`APPEND_COPY_LEN_MAX`], else written straight into its own overflow pages.
    fn put_record(
        &self,
        txn: &mut heed::RwTxn<'_>,
        key: u64,
        mut header: Vec<u8>,
        data: &[u8],
        written: &mut Vec<(usize, usize)>,
    ) -> Result<(), StorageError> {
        let record_len = header.len() + data.len();
        if record_len <= APPEND_COPY_LEN_MAX {
            header.extend_from_slice(data);
            self.products.put_with_flags(txn, PutFlags::APPEND, &key, &header)?;
        } else {
            self.products.put_reserved(txn, &key, record_len, |space| {
                written.push((space.as_uninit_mut().as_ptr() as usize, record_len));
                space.write_all(&header)?;
                space.write_all(data)
            })?;
        }
        Ok(())
    }

    /// [`Queue::insert_batch`]'s transaction with the records packed into extents: `None`
    /// (nothing done) unless the batch's distinct products fit the queue together, since only
    /// then does no product of the batch evict another (the products then go one by one).
    /// Outcomes, evictions and totals are those of [`Queue::put_product`] one by one.
    fn put_packed(
        &self,
        txn: &mut heed::RwTxn<'_>,
        state: &mut State,
        now: Timestamp,
        products: &[(&ProdInfo, &[u8])],
        record_lens: &[usize],
        scratch: &mut PutScratch,
    ) -> Result<Option<Vec<InsertOutcome>>, StorageError> {
        let bytes_limit = self.capacity.bytes.saturating_sub(scratch.reserve_bytes);
        let mut distinct = std::collections::HashSet::new();
        let (mut count, mut bytes) = (0u64, 0u64);
        for ((info, _), &len) in products.iter().zip(record_lens) {
            if distinct.insert(info.signature) {
                count += 1;
                bytes += len as u64;
            }
        }
        if count > self.capacity.slots || bytes > bytes_limit {
            return Ok(None);
        }
        // Each product placed as one by one would (the batch's records are not in the table
        // yet, so a repeat of an earlier one is found here); since they fit together, the
        // evictions take only products already in the queue.
        let mut placed: std::collections::HashMap<Signature, Timestamp> = std::collections::HashMap::new();
        let mut outcomes = Vec::with_capacity(products.len());
        let mut new: Vec<(usize, u64, u64)> = Vec::new();
        for (index, ((info, _), &len)) in products.iter().zip(record_lens).enumerate() {
            let outcome = match placed.get(&info.signature) {
                Some(&existing) => InsertOutcome::Duplicate { existing },
                None => self.place(txn, state, now, info, len, scratch.reserve_bytes)?,
            };
            if let InsertOutcome::Inserted { insertion, queue_seq, .. } = outcome {
                placed.insert(info.signature, insertion);
                new.push((index, insertion.as_unix_micros() as u64, queue_seq));
            }
            outcomes.push(outcome);
        }
        // Extents: runs of packable records in batch order, up to EXTENT_LEN_MAX, two or more.
        let packable = |len: usize| len > APPEND_COPY_LEN_MAX && len <= PACKED_RECORD_LEN_MAX;
        let mut extents: Vec<Vec<usize>> = Vec::new();
        let (mut run, mut run_len) = (Vec::new(), 0usize);
        for (position, &(index, _, _)) in new.iter().enumerate() {
            let len = record_lens[index];
            if !packable(len) {
                continue;
            }
            if run_len + len > EXTENT_LEN_MAX {
                extents.push(std::mem::take(&mut run));
                run_len = 0;
            }
            run.push(position);
            run_len += len;
        }
        extents.push(run);
        extents.retain(|run| run.len() >= 2);
        let mut reference_of: Vec<Option<(Reference, usize)>> = vec![None; new.len()];
        for (number, run) in extents.iter().enumerate() {
            let extent = new[run[0]].1;
            let mut offset = 0u32;
            for (k, &position) in run.iter().enumerate() {
                let len = record_lens[new[position].0] as u32;
                let reference = Reference { extent, offset, len, last: k + 1 == run.len() };
                reference_of[position] = Some((reference, number));
                offset += len;
            }
        }
        let written = &mut scratch.written;
        for (position, &(index, key, queue_seq)) in new.iter().enumerate() {
            let (info, data) = products[index];
            match reference_of[position] {
                Some((reference, number)) => {
                    if reference.offset == 0 {
                        let run = &extents[number];
                        let extent_len: usize = run.iter().map(|&member| record_lens[new[member].0]).sum();
                        self.extents.put_reserved(txn, &key, extent_len, |space| {
                            written.push((space.as_uninit_mut().as_ptr() as usize, extent_len));
                            let mut header = Vec::with_capacity(record::HEADER_LEN + 320);
                            for &member in run {
                                let (index, _, queue_seq) = new[member];
                                let (info, data) = products[index];
                                header.clear();
                                record::write_header(&mut header, info, queue_seq);
                                space.write_all(&header)?;
                                space.write_all(data)?;
                            }
                            Ok(())
                        })?;
                    }
                    self.products.put_with_flags(txn, PutFlags::APPEND, &key, &reference.encode())?;
                }
                None => {
                    let header = record_header(info, queue_seq, record_lens[index]);
                    self.put_record(txn, key, header, data, written)?;
                }
            }
            self.signatures.put(txn, info.signature.as_bytes(), &key)?;
        }
        Ok(Some(outcomes))
    }

    /// Drops this process's mapping of committed records' pages when asked to
    /// ([`Queue::set_release_pages`]). A record larger than half a page lives in its own run of
    /// LMDB overflow pages, so the whole pages around it are its own; adjacent runs are released
    /// together.
    fn release_written(&self, written: &[(usize, usize)]) {
        if !self.release_pages.load(Ordering::Relaxed) {
            return;
        }
        let page = PAGE_BYTES as usize;
        let mut runs: Vec<(usize, usize)> = written
            .iter()
            .filter(|&&(_, len)| len > page / 2)
            .map(|&(start, len)| (start / page * page, (start + len).div_ceil(page) * page))
            .collect();
        runs.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::with_capacity(runs.len());
        for (start, end) in runs {
            match merged.last_mut() {
                Some(last) if start <= last.1 => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }
        for (start, end) in merged {
            // SAFETY: the range lies inside LMDB's shared file mapping, which stays mapped while
            // the environment is open (it is always opened with WRITE_MAP, so reserved space is
            // in the map, never in heap memory). MADV_DONTNEED on a shared file mapping only
            // drops page-table entries: dirty pages stay in the page cache and reach the file;
            // the next access maps them again. No Rust reference into the range is alive (the
            // transaction that wrote it has committed).
            #[allow(unsafe_code)]
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
            }
        }
    }

    fn evict_oldest(&self, txn: &mut heed::RwTxn<'_>, state: &mut State, now: Timestamp) -> Result<(), StorageError> {
        let Some((key, bytes)) = self.products.first(txn)? else {
            return Err(StorageError::Meta("state counts products but the table is empty".into()));
        };
        let reference = Reference::parse(bytes)?;
        let record = match reference {
            Some(reference) => self.extent_record(txn, reference)?,
            None => bytes,
        };
        let view = RecordView::parse(record)?;
        let record_len = record.len() as u64;
        let signature = view.signature;
        // Minimum virtual residence time (ldm-formats.md §4): now − min(creation, insertion).
        let since_micros = view.arrival_micros.min(key as i64);
        let residence_micros = now.as_unix_micros().saturating_sub(since_micros);
        if state.mvrt_micros < 0 || residence_micros < state.mvrt_micros {
            state.mvrt_micros = residence_micros;
            state.mvrt_used_bytes = state.used_bytes;
            state.mvrt_used_slots = state.product_count;
        }
        self.products.delete(txn, &key)?;
        self.signatures.delete(txn, &signature)?;
        if let Some(reference) = reference.filter(|reference| reference.last) {
            self.extents.delete(txn, &reference.extent)?;
        }
        state.used_bytes -= record_len.min(state.used_bytes);
        state.product_count -= 1;
        state.evicted_count += 1;
        Ok(())
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

    /// A consistent read-only view of the queue. Keep it short-lived: while it is open, pages it
    /// can see are not reused.
    pub fn snapshot(&self) -> Result<Snapshot<'_>, StorageError> {
        Ok(Snapshot { queue: self, txn: self.env.read_txn()? })
    }

    /// The change counter; pass it to [`Queue::wait_for_change`] after finding nothing new.
    pub fn changes(&self) -> u32 {
        self.notifier.changes()
    }

    /// Sleeps until a product is inserted (in any process) after `changes` was read, or
    /// `timeout` passes. May return early; callers re-check the queue.
    pub fn wait_for_change(&self, changes: u32, timeout: Option<Duration>) {
        self.notifier.wait(changes, timeout);
    }

    /// Follows the queue from insertion time `from` (inclusive).
    pub fn follow(&self, from: Timestamp) -> Follower<'_> {
        Follower {
            queue: self,
            next_key: u64::try_from(from.as_unix_micros()).unwrap_or(0),
            last_seq: None,
            skipped: 0,
        }
    }

    /// Usage statistics (what `ldm7 queue info` shows).
    pub fn stats(&self) -> Result<QueueStats, StorageError> {
        let snapshot = self.snapshot()?;
        let state = self.state(&snapshot.txn)?;
        let oldest = self.products.first(&snapshot.txn)?.map(|(key, _)| Timestamp::from_unix_micros(key as i64));
        let newest = self.products.last(&snapshot.txn)?.map(|(key, _)| Timestamp::from_unix_micros(key as i64));
        let config = self.config(&snapshot.txn)?;
        let file_bytes = fs::metadata(self.path.join(DATA_FILE)).map(|metadata| metadata.len()).unwrap_or(0);
        let info = self.env.info();
        Ok(QueueStats {
            capacity: self.capacity,
            used_bytes: state.used_bytes,
            product_count: state.product_count,
            oldest_insertion: oldest,
            newest_insertion: newest,
            inserted_count: state.inserted_count,
            evicted_count: state.evicted_count,
            mvrt: (state.mvrt_micros >= 0).then(|| MinimumResidence {
                residence: Duration::from_micros(state.mvrt_micros as u64),
                used_bytes: state.mvrt_used_bytes,
                used_slots: state.mvrt_used_slots,
            }),
            created: Timestamp::from_unix_micros(config.created_micros),
            map_bytes: info.map_size as u64,
            map_written_bytes: (info.last_page_number as u64 + 1) * PAGE_BYTES,
            file_bytes,
            readers: info.number_of_readers,
        })
    }

    /// Reads every product and cross-checks the tables and totals (what `ldm7 queue check` does).
    pub fn check(&self) -> Result<CheckReport, StorageError> {
        let snapshot = self.snapshot()?;
        let txn = &snapshot.txn;
        let state = self.state(txn)?;
        let mut report = CheckReport::default();
        let mut problem = |text: String| {
            if report.problems.len() < CHECK_PROBLEMS_MAX {
                report.problems.push(text);
            }
        };
        let data_path = self.path.join(DATA_FILE);
        let data = fs::metadata(&data_path)?;
        if let Some(why) = data_file_problem(data.len(), allocated_bytes(&data), Some(self.env.info().map_size as u64))
        {
            problem(why);
        }
        for (name, len) in [(LOCK_FILE, LOCK_FILE_BYTES), (NOTIFY_FILE, NOTIFY_FILE_LEN)] {
            let metadata = fs::metadata(self.path.join(name))?;
            let needed = len.max(metadata.len());
            if allocated_bytes(&metadata) < needed {
                problem(format!(
                    "{name} has {} of its {needed} bytes on the disk",
                    allocated_bytes(&metadata).min(needed)
                ));
            }
        }
        let mut previous: Option<(u64, u64)> = None;
        let mut used_bytes = 0u64;
        // Per extent: how many references are marked last, the key of the last one so marked,
        // and the newest key referring to it.
        let mut extent_uses: std::collections::HashMap<u64, (u64, u64, u64)> = std::collections::HashMap::new();
        for entry in self.products.iter(txn)? {
            let (key, bytes) = entry?;
            report.product_count += 1;
            let reference = match Reference::parse(bytes) {
                Ok(reference) => reference,
                Err(error) => {
                    problem(format!("product at insertion time {key}: {error}"));
                    continue;
                }
            };
            used_bytes += reference.map_or(bytes.len() as u64, |reference| u64::from(reference.len));
            if let Some(reference) = reference {
                let (lasts, last_key, newest) = extent_uses.entry(reference.extent).or_default();
                *newest = key;
                if reference.last {
                    *lasts += 1;
                    *last_key = key;
                }
            }
            let resolved = match reference {
                Some(reference) => self.extent_record(txn, reference),
                None => Ok(bytes),
            };
            let record = match resolved {
                Ok(record) => record,
                Err(error) => {
                    problem(format!("product at insertion time {key}: {error}"));
                    continue;
                }
            };
            let view = match RecordView::parse(record) {
                Ok(view) => view,
                Err(error) => {
                    problem(format!("product at insertion time {key}: {error}"));
                    continue;
                }
            };
            if let Err(error) = view.prod_info() {
                problem(format!("product at insertion time {key}: {error}"));
            }
            if let Some((previous_key, previous_seq)) = previous
                && (key <= previous_key || view.queue_seq <= previous_seq)
            {
                problem(format!("product at insertion time {key} is out of order"));
            }
            previous = Some((key, view.queue_seq));
            match self.signatures.get(txn, &view.signature)? {
                Some(indexed) if indexed == key => {}
                Some(indexed) => problem(format!(
                    "signature {} of the product at {key} points at {indexed}",
                    Signature(view.signature)
                )),
                None => {
                    problem(format!("signature {} of the product at {key} is not indexed", Signature(view.signature)))
                }
            }
        }
        for entry in self.extents.iter(txn)? {
            let (extent, _) = entry?;
            match extent_uses.get(&extent) {
                None => problem(format!("extent {extent} holds no product's record")),
                Some(&(lasts, last_key, newest)) if lasts != 1 || last_key != newest => {
                    problem(format!("extent {extent}: its newest record is not the one marked last"))
                }
                Some(_) => {}
            }
        }
        report.signature_count = self.signatures.len(txn)?;
        report.used_bytes = used_bytes;
        if report.signature_count != report.product_count {
            problem(format!("{} signatures for {} products", report.signature_count, report.product_count));
        }
        if state.product_count != report.product_count || state.used_bytes != used_bytes {
            problem(format!(
                "totals say {} products and {} bytes; the table holds {} and {}",
                state.product_count, state.used_bytes, report.product_count, used_bytes
            ));
        }
        if used_bytes > self.capacity.bytes || report.product_count > self.capacity.slots {
            problem(format!(
                "over capacity: {} bytes in {} products, capacity {} bytes and {} slots",
                used_bytes, report.product_count, self.capacity.bytes, self.capacity.slots
            ));
        }
        if let Some((last_key, _)) = previous
            && last_key > state.last_key
        {
            problem(format!("newest product {last_key} is after the recorded last insertion {}", state.last_key));
        }
        Ok(report)
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

/// Most problems a check lists (it still counts past them).
const CHECK_PROBLEMS_MAX: usize = 100;

/// The result of [`Queue::check`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckReport {
    /// Products read.
    pub product_count: u64,
    /// Signature index entries.
    pub signature_count: u64,
    /// Sum of the stored record sizes.
    pub used_bytes: u64,
    /// What is wrong (empty when the queue is sound); at most 100 are listed.
    pub problems: Vec<String>,
}

impl CheckReport {
    /// Whether the queue passed.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Usage statistics of a queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueStats {
    /// The fixed capacities.
    pub capacity: Capacity,
    /// Bytes of stored products.
    pub used_bytes: u64,
    /// Products stored.
    pub product_count: u64,
    /// Insertion time of the oldest product.
    pub oldest_insertion: Option<Timestamp>,
    /// Insertion time of the newest product.
    pub newest_insertion: Option<Timestamp>,
    /// Products inserted since creation.
    pub inserted_count: u64,
    /// Products evicted since creation.
    pub evicted_count: u64,
    /// The minimum virtual residence time, once anything was evicted.
    pub mvrt: Option<MinimumResidence>,
    /// When the queue was created.
    pub created: Timestamp,
    /// Size of the LMDB memory map.
    pub map_bytes: u64,
    /// Bytes of the map written so far: up to the highest page LMDB has used (pages that
    /// evictions free are reused below it).
    pub map_written_bytes: u64,
    /// Size of the data file (sparse: disk use may be less).
    pub file_bytes: u64,
    /// LMDB reader slots in use.
    pub readers: u32,
}

/// The shortest time any product stayed before eviction, with the usage at that moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MinimumResidence {
    /// The residence time.
    pub residence: Duration,
    /// Bytes in use then.
    pub used_bytes: u64,
    /// Products stored then.
    pub used_slots: u64,
}

/// A writer that counts what passes through it.
struct Counted<'w> {
    inner: &'w mut dyn Write,
    count: u64,
}

impl Write for Counted<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let written = self.inner.write(buf)?;
        self.count += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A consistent read-only view of the queue (an LMDB read transaction).
pub struct Snapshot<'q> {
    queue: &'q Queue,
    txn: RoTxn<'q, WithoutTls>,
}

impl std::fmt::Debug for Snapshot<'_> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Snapshot").field("queue", &self.queue.path).finish()
    }
}

impl<'q> Snapshot<'q> {
    /// The first product inserted at or after `from`.
    pub fn product_at_or_after(&self, from: Timestamp) -> Result<Option<Product<'_>>, StorageError> {
        let key = u64::try_from(from.as_unix_micros()).unwrap_or(0);
        self.queue.products.get_greater_than_or_equal_to(&self.txn, &key)?.map(|entry| self.product(entry)).transpose()
    }

    /// The product with this signature.
    pub fn product_by_signature(&self, signature: &Signature) -> Result<Option<Product<'_>>, StorageError> {
        let Some(key) = self.queue.signatures.get(&self.txn, signature.as_bytes())? else {
            return Ok(None);
        };
        self.queue.products.get(&self.txn, &key)?.map(|bytes| self.product((key, bytes))).transpose()
    }

    /// Products inserted at or after `from`, oldest first.
    pub fn products_from(
        &self,
        from: Timestamp,
    ) -> Result<impl Iterator<Item = Result<Product<'_>, StorageError>> + '_, StorageError> {
        let key = u64::try_from(from.as_unix_micros()).unwrap_or(0);
        let range = self.queue.products.range(&self.txn, &(key..))?;
        Ok(range.map(move |entry| self.product(entry?)))
    }

    /// Products inserted before `before`, newest first (for "the last N products").
    pub fn products_before_reversed(
        &self,
        before: Timestamp,
    ) -> Result<impl Iterator<Item = Result<Product<'_>, StorageError>> + '_, StorageError> {
        let key = u64::try_from(before.as_unix_micros()).unwrap_or(0);
        let range = self.queue.products.rev_range(&self.txn, &(..key))?;
        Ok(range.map(move |entry| self.product(entry?)))
    }

    /// The product of a `products` entry, its record found if it is packed.
    fn product<'s>(&'s self, (key, bytes): (u64, &'s [u8])) -> Result<Product<'s>, StorageError> {
        Product::from_record(key, self.queue.record(&self.txn, bytes)?)
    }
}

/// A product read from a snapshot; `data` borrows the queue's memory map (no copy).
#[derive(Clone, Debug)]
pub struct Product<'s> {
    /// When it was inserted into this queue (its key).
    pub insertion: Timestamp,
    /// Its queue sequence number (consecutive products have consecutive numbers, so a gap
    /// shows products evicted before a reader got to them).
    pub queue_seq: u64,
    /// Its metadata.
    pub info: ProdInfo,
    /// Its bytes.
    pub data: &'s [u8],
}

impl<'s> Product<'s> {
    fn from_record(key: u64, record: &'s [u8]) -> Result<Self, StorageError> {
        let view = RecordView::parse(record)?;
        Ok(Self {
            insertion: Timestamp::from_unix_micros(key as i64),
            queue_seq: view.queue_seq,
            info: view.prod_info()?,
            data: view.data,
        })
    }

    /// An owned copy (outlives the snapshot).
    pub fn to_owned_product(&self) -> OwnedProduct {
        OwnedProduct {
            insertion: self.insertion,
            queue_seq: self.queue_seq,
            info: self.info.clone(),
            data: self.data.to_vec(),
        }
    }
}

/// A product copied out of the queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedProduct {
    /// When it was inserted into this queue.
    pub insertion: Timestamp,
    /// Its queue sequence number.
    pub queue_seq: u64,
    /// Its metadata.
    pub info: ProdInfo,
    /// Its bytes.
    pub data: Vec<u8>,
}

/// A reader's position: follows new products in insertion order, blocking while there are none.
#[derive(Debug)]
pub struct Follower<'q> {
    queue: &'q Queue,
    next_key: u64,
    last_seq: Option<u64>,
    skipped: u64,
}

impl Follower<'_> {
    /// Waits up to `timeout` (`None`: forever) for the next product and hands it to `visit`
    /// inside a snapshot, without copying. Returns `None` if nothing arrived in time.
    pub fn next_with<R>(
        &mut self,
        timeout: Option<Duration>,
        visit: impl FnOnce(&Product<'_>) -> R,
    ) -> Result<Option<R>, StorageError> {
        let deadline = timeout.map(|timeout| std::time::Instant::now() + timeout);
        loop {
            let changes = self.queue.changes();
            {
                let snapshot = self.queue.snapshot()?;
                let from = Timestamp::from_unix_micros(self.next_key as i64);
                if let Some(product) = snapshot.product_at_or_after(from)? {
                    if let Some(last_seq) = self.last_seq {
                        self.skipped += product.queue_seq.saturating_sub(last_seq + 1);
                    }
                    self.last_seq = Some(product.queue_seq);
                    self.next_key = u64::try_from(product.insertion.as_unix_micros()).unwrap_or(0) + 1;
                    return Ok(Some(visit(&product)));
                }
            }
            let remaining = match deadline {
                None => None,
                Some(deadline) => match deadline.checked_duration_since(std::time::Instant::now()) {
                    Some(remaining) if !remaining.is_zero() => Some(remaining),
                    _ => return Ok(None),
                },
            };
            self.queue.wait_for_change(changes, remaining);
        }
    }

    /// Like [`Follower::next_with`], returning a copy.
    pub fn next_owned(&mut self, timeout: Option<Duration>) -> Result<Option<OwnedProduct>, StorageError> {
        self.next_with(timeout, |product| product.to_owned_product())
    }

    /// Products evicted before this follower reached them.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// The insertion time the next product will be at or after.
    pub fn position(&self) -> Timestamp {
        Timestamp::from_unix_micros(self.next_key as i64)
    }
}

/// A record's header (with room for its data when [`Queue::put_record`] copies it in).
fn record_header(info: &ProdInfo, queue_seq: u64, record_len: usize) -> Vec<u8> {
    let mut header = Vec::with_capacity(record_len.min(record::HEADER_LEN + 320 + APPEND_COPY_LEN_MAX));
    record::write_header(&mut header, info, queue_seq);
    header
}

/// Opens the LMDB environment with the map size `capacity` needs.
/// `None` keeps the size recorded in an existing file.
fn open_env(path: &Path, capacity: Option<Capacity>) -> Result<Env<WithoutTls>, StorageError> {
    let mut options = EnvOpenOptions::new().read_txn_without_tls();
    options.max_dbs(4).max_readers(READERS_MAX);
    if let Some(capacity) = capacity {
        options.map_size(map_bytes(capacity));
    }
    // SAFETY: NO_SYNC skips fsync at commit. LMDB's commit order (data pages, then the meta
    // page) is still what the page cache holds, so a killed process never leaves a torn
    // transaction; only an operating-system crash can lose the newest commits — the same
    // durability as LDM's memory-mapped queue. WRITE_MAP writes pages in place through the map;
    // our code never writes through a pointer into it.
    #[allow(unsafe_code)]
    unsafe {
        options.flags(EnvFlags::NO_SYNC | EnvFlags::WRITE_MAP)
    };
    // SAFETY: the directory is used only through LMDB by processes of this crate, which keep
    // LMDB's lock file; heed refuses to open one environment twice in a process.
    #[allow(unsafe_code)]
    let env = unsafe { options.open(path) }?;
    Ok(env)
}

/// The LMDB map size for a capacity: room for B-tree pages, page rounding of large values,
/// and pages held by snapshots, on top of the products themselves. The file is sparse.
fn map_bytes(capacity: Capacity) -> usize {
    const PAGE: u64 = PAGE_BYTES;
    let bytes = capacity.bytes + capacity.bytes / 2 + capacity.slots.saturating_mul(256) + (8 << 20);
    usize::try_from(bytes.div_ceil(PAGE) * PAGE).unwrap_or(usize::MAX)
}

/// Bytes of the file system holding `path` that this user may still write.
fn available_bytes(path: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the path"))?;
    let mut stats = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c_path` is a NUL-terminated string and `stats` is writable for one statvfs,
    // which the call fills when it returns 0.
    #[allow(unsafe_code)]
    let stats = unsafe {
        if libc::statvfs(c_path.as_ptr(), stats.as_mut_ptr()) != 0 {
            return Err(io::Error::last_os_error());
        }
        stats.assume_init()
    };
    #[allow(clippy::unnecessary_cast)] // the field types differ between platforms
    Ok((stats.f_bavail as u64).saturating_mul(stats.f_frsize as u64))
}

/// Bytes a queue of `capacity` takes on the disk: the data file (its whole map) and the lock
/// and notify files.
fn queue_file_bytes(capacity: Capacity) -> u64 {
    map_bytes(capacity) as u64 + LOCK_FILE_BYTES + NOTIFY_FILE_LEN
}

/// Writes the data file's tail with zeros once, as LDM's `pqcreate` writes its whole file, so
/// that every page of the map has its disk block: first writes into holes of a shared mapping
/// cost a block allocation and a page fault each, which made a new queue fill at a third of its
/// steady insert rate — and on a full disk such a write kills the writer with SIGBUS.
/// `from` is the end of the pages LMDB has written: those are never touched. If the file system
/// still shows holes (it drops written zeros), `fallocate` is tried; a file still short of
/// blocks is refused.
///
/// The zeros are written from the end of the file backwards: a new queue fills from the front,
/// so the pages it writes first are the newest in the page cache and the last a machine short
/// of memory gives back (a page of a shared mapping whose cached copy was given back is read
/// from the disk before it is written). Measured on four fresh downstream queues filled at once
/// (`ldm7 bench ldm6 --products 40000 --downstreams 4`, alternating): 2.8–3.7 s backwards vs
/// 3.2–4.0 s forwards, faster in each of four pairs.
fn allocate_data_file(path: &Path, from: u64, len: u64) -> io::Result<()> {
    let file = fs::OpenOptions::new().read(true).write(true).open(path)?;
    reserve::write_zeros(&file, from, len)?;
    if allocated_bytes(&file.metadata()?) < len {
        reserve::reserve(&file, len)?;
    }
    let allocated = allocated_bytes(&file.metadata()?);
    if allocated < len {
        return Err(io::Error::other(format!(
            "the file system keeps only {allocated} of the data file's {len} bytes on the disk after writing them \
             (compression or deduplication of zeros?): a queue needs a file system that allocates its file, \
             such as ext4, XFS or tmpfs"
        )));
    }
    Ok(())
}

/// What is wrong with a data file of `len` bytes with `allocated` bytes on the disk, for a map
/// of `map_bytes` when known, if anything: holes, or shorter than the map.
fn data_file_problem(len: u64, allocated: u64, map_bytes: Option<u64>) -> Option<String> {
    if allocated < len {
        return Some(format!(
            "only {allocated} of the {len} bytes of {DATA_FILE} have disk space (a creation that did not finish, \
             or a sparse copy): writing into the rest would crash on a full file system"
        ));
    }
    match map_bytes {
        Some(map_bytes) if len < map_bytes => Some(format!(
            "{DATA_FILE} is {len} bytes, shorter than its {map_bytes}-byte map (truncated, or a creation that did \
             not finish)"
        )),
        _ => None,
    }
}

/// The map size LMDB recorded in the data file's two meta pages (the larger), read before LMDB
/// opens the file (which would size a short file up to it); `None` if they are not LMDB's.
/// A meta page holds a 16-byte page header, then `MDB_meta`: magic (u32), version (u32),
/// address (u64), map size (u64), in the machine's byte order.
fn recorded_map_bytes(path: &Path) -> io::Result<Option<u64>> {
    use std::os::unix::fs::FileExt;
    const LMDB_MAGIC: u32 = 0xBEEF_C0DE;
    let file = fs::File::open(path)?;
    let mut map_bytes = None;
    for page in 0..2u64 {
        let mut meta = [0u8; 40];
        if file.read_exact_at(&mut meta, page * PAGE_BYTES).is_err() {
            continue;
        }
        let word = |at: usize| u32::from_ne_bytes([meta[at], meta[at + 1], meta[at + 2], meta[at + 3]]);
        if word(16) != LMDB_MAGIC {
            continue;
        }
        let mut size = [0u8; 8];
        size.copy_from_slice(&meta[32..40]);
        map_bytes = map_bytes.max(Some(u64::from_ne_bytes(size)));
    }
    Ok(map_bytes)
}

/// Whether a storage error is the file system (or quota) being full.
fn storage_is_no_space(error: &StorageError) -> bool {
    match error {
        StorageError::Io(error) | StorageError::Lmdb(heed::Error::Io(error)) => is_no_space(error),
        _ => false,
    }
}

/// What a queue's build directory is called after the queue's name, before the creating
/// process's id.
const BUILD_SUFFIX: &str = ".tmp-";

/// Removes the build directories beside a queue named `name` in `parent` left by creations
/// that were killed (their process is gone): they hold disk space. Only directories holding
/// nothing but queue files are removed; failures are ignored (the creation goes on).
fn remove_stale_builds(parent: &Path, name: &std::ffi::OsStr) {
    let Ok(entries) = fs::read_dir(parent) else { return };
    let mut prefix = name.to_owned();
    prefix.push(BUILD_SUFFIX);
    let prefix = prefix.to_string_lossy().into_owned();
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(pid) = file_name.to_str().and_then(|file_name| file_name.strip_prefix(&prefix)) else { continue };
        let Ok(pid) = pid.parse::<libc::pid_t>() else { continue };
        if !process_is_running(pid) && remove_queue_files(&entry.path()).is_ok() {
            let _ = fs::remove_dir(entry.path());
        }
    }
}

/// Removes the files of the queue at `path`, not the directory. Refuses anything that is not a
/// queue.
fn remove_queue_files(path: &Path) -> Result<(), CreateError> {
    let storage = |error: io::Error| CreateError::Storage { path: path.to_owned(), source: error.into() };
    if !path.is_dir() {
        return Err(CreateError::NotAQueue(path.to_owned()));
    }
    let known = [DATA_FILE, LOCK_FILE, NOTIFY_FILE];
    for entry in fs::read_dir(path).map_err(storage)? {
        let name = entry.map_err(storage)?.file_name();
        if !known.iter().any(|known| name == *known) {
            return Err(CreateError::NotAQueue(path.to_owned()));
        }
    }
    for name in known {
        match fs::remove_file(path.join(name)) {
            Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(storage(error)),
            _ => {}
        }
    }
    Ok(())
}

/// Whether process `pid` runs (a process killed but not yet reaped, a zombie, does not).
fn process_is_running(pid: libc::pid_t) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // `pid (command) state …`: the command may hold spaces and parentheses, the state follows
    // the last `)`.
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some('Z' | 'X') | None)
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
