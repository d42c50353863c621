//! Creating and opening a queue: building it beside its path with every byte of its files on the
//! disk, refusing a damaged data file, the LMDB environment, and removing queue files.

use std::fs;
use std::io;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::SystemTime;

use heed::byteorder::BigEndian;
use heed::types::{Bytes, U64};
use heed::{Env, EnvFlags, EnvOpenOptions, WithoutTls};
use ldm7_types::Timestamp;

use crate::notify::{NOTIFY_FILE_LEN, NOTIFY_FILE_MODE, Notifier};
use crate::reserve::{self, allocated_bytes, is_no_space};

use super::{
    Capacity, ConfigRecord, CreateError, DATA_FILE, ExtentsTable, LOCK_FILE, LOCK_FILE_BYTES, LOCK_FILE_MODE,
    MetaTable, NOTIFY_FILE, OpenError, PAGE_BYTES, ProductsTable, Queue, READERS_MAX, SignaturesTable, State,
    StorageError,
};

impl Queue {
    /// Creates a queue at `path` (a directory). Refuses an existing path unless `force`, and
    /// even then replaces only a product queue.
    ///
    /// The queue is built in `PATH.tmp-PID` beside `path` — its lock and notify files reserved,
    /// its data file written full of zeros, then its tables — and renamed into place, so `path`
    /// holds a whole queue or nothing. A queue being replaced stays until the new one is whole:
    /// the two directories are exchanged in one rename (`RENAME_EXCHANGE`) and the old one is
    /// removed after; a creation that fails, a full disk included, leaves it as it was. Only
    /// when the file system has room for the new queue only with the old one's space is the old
    /// one removed first (its products are what `force` gives up; the new queue's room was
    /// checked, so only another process filling the disk meanwhile can then leave neither), and
    /// when even that space is too little nothing is touched. A failure removes what it wrote;
    /// a build left by a killed creation is removed by the next creation at the same path.
    /// Without `fsync` (the queue's durability is LMDB's `MDB_NOSYNC`): after an
    /// operating-system crash a queue whose blocks did not reach the disk is refused by
    /// [`Queue::open`] as damaged.
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
        let parent = path.parent().filter(|parent| !parent.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let mut replacing = false;
        if path.exists() {
            if !force {
                return Err(CreateError::Exists(path.to_owned()));
            }
            let old = queue_allocated_bytes(path)?;
            let needed = queue_file_bytes(capacity);
            let free = available_bytes(parent).map_err(|error| storage(error.into()))?;
            if free >= needed {
                replacing = true;
            } else if free.saturating_add(old) >= needed {
                remove_queue_files(path)?;
                fs::remove_dir(path).map_err(|error| storage(error.into()))?;
            } else {
                return Err(CreateError::NoSpaceToReplace { path: path.to_owned(), needed, free, old });
            }
        }
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
            .and_then(|()| move_into_place(&build, path, replacing).map_err(|error| storage(error.into())))
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
        // After an exchange the build directory holds the old queue: removed the same way.
        if (built.is_err() || replacing) && remove_queue_files(&build).is_ok() {
            let _ = fs::remove_dir(&build);
        }
        built?;
        Ok(Self::open(path)?)
    }

    /// Deletes the queue at `path` (its files and its directory); refuses anything that is not
    /// a product queue.
    pub fn remove(path: &Path) -> Result<(), CreateError> {
        if !path.exists() {
            return Err(CreateError::Storage {
                path: path.to_owned(),
                source: io::Error::new(io::ErrorKind::NotFound, "no product queue there").into(),
            });
        }
        remove_queue_files(path)?;
        fs::remove_dir(path).map_err(|error| CreateError::Storage { path: path.to_owned(), source: error.into() })
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
pub(super) fn data_file_problem(len: u64, allocated: u64, map_bytes: Option<u64>) -> Option<String> {
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
        let Ok(pid) = pid.parse::<u32>() else { continue };
        if !ldm7_io::process_lives(pid) && remove_queue_files(&entry.path()).is_ok() {
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

/// Puts the whole queue built in `build` at `path`: a rename, or with `replacing` an exchange
/// with the queue there (which `build` then holds). Where the file system cannot exchange, the
/// old queue is removed and the new one renamed into place.
fn move_into_place(build: &Path, path: &Path, replacing: bool) -> io::Result<()> {
    if !replacing {
        return fs::rename(build, path);
    }
    match exchange(build, path) {
        Err(error) if matches!(error.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP)) => {
            remove_queue_files(path).map_err(|error| io::Error::other(error.to_string()))?;
            fs::remove_dir(path)?;
            fs::rename(build, path)
        }
        result => result,
    }
}

/// Exchanges two directories in one step (`renameat2` with `RENAME_EXCHANGE`).
fn exchange(one: &Path, other: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = |path: &Path| {
        std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the path"))
    };
    let (one, other) = (c_path(one)?, c_path(other)?);
    // SAFETY: both are NUL-terminated strings that outlive the call; renameat2 reads them only.
    #[allow(unsafe_code)]
    let status =
        unsafe { libc::renameat2(libc::AT_FDCWD, one.as_ptr(), libc::AT_FDCWD, other.as_ptr(), libc::RENAME_EXCHANGE) };
    if status == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// What the files of the queue at `path` take on the disk (refusing anything but a queue).
fn queue_allocated_bytes(path: &Path) -> Result<u64, CreateError> {
    if !path.is_dir() {
        return Err(CreateError::NotAQueue(path.to_owned()));
    }
    let storage = |error: io::Error| CreateError::Storage { path: path.to_owned(), source: error.into() };
    let mut bytes = 0;
    for entry in fs::read_dir(path).map_err(storage)? {
        let entry = entry.map_err(storage)?;
        if ![DATA_FILE, LOCK_FILE, NOTIFY_FILE].iter().any(|known| entry.file_name() == *known) {
            return Err(CreateError::NotAQueue(path.to_owned()));
        }
        bytes += allocated_bytes(&entry.metadata().map_err(storage)?);
    }
    Ok(bytes)
}
