//! A file-backed [`ProductSink`]: the receiver writes each product it assembles into a spool
//! file of its own, with positioned writes, so that no product is ever held whole in memory.
//!
//! Invariants:
//! * One spool file per product in flight, created at its BOP with the product's size, in a
//!   fresh directory under the caller's spool directory (removed, with anything left in it,
//!   when the last handle goes). The receiver's in-flight bounds
//!   (`ReceiverConfig::in_flight_bytes_max`, `in_flight_products_max`) bound the bytes and files
//!   in flight; the product-size bound bounds each file.
//! * A product closed uncompleted (missed, evicted) loses its file at once. A completed one
//!   waits for [`SpoolSink::take`], which the driver calls when it polls the product's
//!   `Delivered` event (right after), and becomes a [`SpooledProduct`] the application reads
//!   (file handle, one copy into the product queue) or renames into place; dropping it removes
//!   the file.
//! * A failing write (disk full) is reported to the receiver, which reports the product missed;
//!   the failure is logged once per episode (until a product is spooled whole again).
//! * Products smaller than [`SpoolSink::memory_below`] (default [`MEMORY_BELOW_DEFAULT`]) are
//!   assembled in memory instead ([`Taken::Memory`]): a file created, written, read back and
//!   removed per product costs the file system more than the product (a subscriber of the NGRID
//!   hour at 60× spent a fifth of its CPU allocating and freeing inodes). The receiver's
//!   in-flight byte bound counts them as it counts the files.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use ldm7_fmtp_proto::{ProductIndex, ProductSink, SinkError};
use ldm7_io::BoundHits;
use md5::{Digest, Md5};

/// Bytes read at once when hashing or copying a spooled product.
const READ_CHUNK_BYTES: usize = 1 << 20;

/// Products smaller than this are assembled in memory rather than in a file.
pub const MEMORY_BELOW_DEFAULT: u32 = 1 << 20;

/// A completed product taken from the spool: in its file, or (a small one) in memory.
#[derive(Debug)]
pub enum Taken {
    /// In its spool file.
    File(SpooledProduct),
    /// In memory: the bytes and the BOP metadata.
    Memory(Vec<u8>, Vec<u8>),
}

/// Writes products into spool files; clones share the spool (the receiver holds one as its
/// sink, the driver another to [`take`](Self::take) completed products).
#[derive(Clone, Debug)]
pub struct SpoolSink {
    dir: Arc<tempfile::TempDir>,
    state: Arc<Mutex<Spool>>,
    memory_below: u32,
}

impl SpoolSink {
    /// A spool in a fresh directory under `parent` (created if missing). Put it on the file
    /// system of the products' destination, so that [`SpooledProduct::persist`] renames.
    pub fn new(parent: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(parent)?;
        let dir = tempfile::Builder::new().prefix(".fmtp-spool-").tempdir_in(parent)?;
        Ok(Self {
            dir: Arc::new(dir),
            state: Arc::new(Mutex::new(Spool::default())),
            memory_below: MEMORY_BELOW_DEFAULT,
        })
    }

    /// Products below `bytes` are assembled in memory (0: every product in a file).
    pub fn with_memory_below(mut self, bytes: u32) -> Self {
        self.memory_below = bytes;
        self
    }

    /// Products below this size are assembled in memory.
    pub fn memory_below(&self) -> u32 {
        self.memory_below
    }

    /// The spool's directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The completed product `index`, if the receiver completed it and nobody took it yet.
    pub fn take(&self, index: ProductIndex) -> Option<Taken> {
        let SpoolEntry { backing, size, metadata } = self.lock().completed.remove(&index)?;
        Some(match backing {
            Backing::File(path, file) => {
                Taken::File(SpooledProduct { path, file, size, metadata, _dir: self.dir.clone(), kept: false })
            }
            Backing::Memory(bytes) => Taken::Memory(bytes, metadata),
        })
    }

    /// Products being written now.
    pub fn open_products(&self) -> usize {
        self.lock().open.len()
    }

    fn lock(&self) -> MutexGuard<'_, Spool> {
        // A panic while holding the lock leaves maps that are still consistent (each operation
        // is one insert or remove): carry on.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl ProductSink for SpoolSink {
    fn open(&mut self, index: ProductIndex, size: u32, metadata: &[u8]) -> Result<(), SinkError> {
        let dir = self.dir.path().to_path_buf();
        let mut spool = self.lock();
        if size < self.memory_below {
            let backing = Backing::Memory(vec![0; size as usize]);
            spool.open.insert(index, SpoolEntry { backing, size: u64::from(size), metadata: metadata.to_vec() });
            return Ok(());
        }
        spool.next_file += 1;
        let path = dir.join(format!("{}-{}.part", index.0, spool.next_file));
        let created = File::options().read(true).write(true).create_new(true).open(&path).and_then(|file| {
            file.set_len(u64::from(size))?;
            Ok(file)
        });
        match created {
            Ok(file) => {
                let backing = Backing::File(path, file);
                spool.open.insert(index, SpoolEntry { backing, size: u64::from(size), metadata: metadata.to_vec() });
                Ok(())
            }
            Err(error) => {
                let _ = std::fs::remove_file(&path);
                Err(spool.failed(&path, error))
            }
        }
    }

    fn write_at(&mut self, index: ProductIndex, offset: u32, bytes: &[u8]) -> Result<(), SinkError> {
        let mut spool = self.lock();
        let Some(entry) = spool.open.get_mut(&index) else {
            return Err(SinkError::new(format!("product {index} is not open in the spool")));
        };
        match &mut entry.backing {
            Backing::Memory(held) => {
                let range = span(index, offset, bytes.len(), held.len())?;
                held[range].copy_from_slice(bytes);
                Ok(())
            }
            Backing::File(path, file) => match file.write_all_at(bytes, u64::from(offset)) {
                Ok(()) => Ok(()),
                Err(error) => {
                    let path = path.clone();
                    Err(spool.failed(&path, error))
                }
            },
        }
    }

    fn reads_back(&self) -> bool {
        true
    }

    fn read_at(&mut self, index: ProductIndex, offset: u32, out: &mut [u8]) -> Result<(), SinkError> {
        let spool = self.lock();
        let Some(entry) = spool.open.get(&index) else {
            return Err(SinkError::new(format!("product {index} is not open in the spool")));
        };
        match &entry.backing {
            Backing::Memory(held) => {
                out.copy_from_slice(&held[span(index, offset, out.len(), held.len())?]);
                Ok(())
            }
            Backing::File(path, file) => file
                .read_exact_at(out, u64::from(offset))
                .map_err(|error| SinkError::new(format!("reading back {} at {offset}: {error}", path.display()))),
        }
    }

    fn close(&mut self, index: ProductIndex, completed: bool) {
        let mut spool = self.lock();
        let Some(entry) = spool.open.remove(&index) else { return };
        if completed {
            spool.failures.relieved();
            spool.completed.insert(index, entry);
        } else if let Backing::File(path, _) = &entry.backing {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The bytes `[offset, offset + len)` of a product of `size` bytes held in memory, or why not.
fn span(index: ProductIndex, offset: u32, len: usize, size: usize) -> Result<std::ops::Range<usize>, SinkError> {
    let start = offset as usize;
    match start.checked_add(len) {
        Some(end) if end <= size => Ok(start..end),
        _ => Err(SinkError::new(format!("product {index}: {len} bytes at {offset} are beyond its end ({size})"))),
    }
}

/// Where a product being assembled is.
#[derive(Debug)]
enum Backing {
    /// A spool file: path and handle.
    File(PathBuf, File),
    /// Memory (a small product).
    Memory(Vec<u8>),
}

/// A product in the spool: where, its size and metadata.
#[derive(Debug)]
struct SpoolEntry {
    backing: Backing,
    size: u64,
    metadata: Vec<u8>,
}

#[derive(Debug, Default)]
struct Spool {
    open: HashMap<ProductIndex, SpoolEntry>,
    /// Completed, waiting for [`SpoolSink::take`] (the driver takes each at its event).
    completed: HashMap<ProductIndex, SpoolEntry>,
    next_file: u64,
    failures: BoundHits,
}

impl Spool {
    fn failed(&self, path: &Path, error: io::Error) -> SinkError {
        if self.failures.hit() {
            tracing::warn!(
                path = %path.display(),
                %error,
                "FMTP receiver: cannot write to the spool; products are reported missed until it works again"
            );
        }
        SinkError::new(error)
    }
}

/// A completed product in its spool file. Dropping it removes the file, unless it was
/// [`persist`](Self::persist)ed.
#[derive(Debug)]
pub struct SpooledProduct {
    path: PathBuf,
    file: File,
    size: u64,
    metadata: Vec<u8>,
    /// Keeps the spool directory alive while the file is in it.
    _dir: Arc<tempfile::TempDir>,
    kept: bool,
}

impl SpooledProduct {
    /// Product length in bytes.
    pub fn len(&self) -> u64 {
        self.size
    }

    /// Whether the product is empty.
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// The BOP metadata (LDM: the MD5 signature).
    pub fn metadata(&self) -> &[u8] {
        &self.metadata
    }

    /// Where the bytes are.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open file (read it with positioned reads, or map it).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Fills `out` with the bytes at `offset` (e.g. straight into a product-queue reservation:
    /// one copy).
    pub fn read_at(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.file.read_exact_at(out, offset)
    }

    /// The whole product in memory (for small products and tests).
    pub fn to_vec(&self) -> io::Result<Vec<u8>> {
        let len = usize::try_from(self.size).map_err(io::Error::other)?;
        let mut bytes = vec![0; len];
        self.read_at(0, &mut bytes)?;
        Ok(bytes)
    }

    /// The MD5 digest of the bytes, read in chunks.
    pub fn md5(&self) -> io::Result<[u8; 16]> {
        let mut hasher = Md5::new();
        let mut chunk = vec![0; READ_CHUNK_BYTES.min(usize::try_from(self.size).unwrap_or(READ_CHUNK_BYTES))];
        let mut offset = 0u64;
        while offset < self.size {
            let len = chunk.len().min(usize::try_from(self.size - offset).unwrap_or(chunk.len()));
            self.read_at(offset, &mut chunk[..len])?;
            hasher.update(&chunk[..len]);
            offset += len as u64;
        }
        Ok(hasher.finalize().into())
    }

    /// Moves the file to `destination` (a rename on the same file system, else a copy).
    pub fn persist(mut self, destination: &Path) -> io::Result<()> {
        if std::fs::rename(&self.path, destination).is_err() {
            std::fs::copy(&self.path, destination)?;
            let _ = std::fs::remove_file(&self.path);
        }
        self.kept = true;
        Ok(())
    }
}

impl Drop for SpooledProduct {
    fn drop(&mut self) {
        if !self.kept {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spooled_products_are_written_taken_and_removed() {
        let parent = tempfile::tempdir().expect("tempdir");
        let mut spool = SpoolSink::new(parent.path()).expect("spool").with_memory_below(0);
        let index = ProductIndex(7);
        spool.open(index, 10, b"meta").expect("open");
        spool.write_at(index, 5, b"world").expect("write");
        spool.write_at(index, 0, b"hello").expect("write");
        assert_eq!(spool.open_products(), 1);
        spool.close(index, true);
        let Some(Taken::File(product)) = spool.take(index) else { panic!("not in a file") };
        assert!(spool.take(index).is_none(), "taken once");
        assert_eq!(product.to_vec().expect("read"), b"helloworld");
        assert_eq!(product.md5().expect("md5"), <[u8; 16]>::from(Md5::digest(b"helloworld")));
        assert_eq!(product.metadata(), b"meta");
        let path = product.path().to_path_buf();
        drop(product);
        assert!(!path.exists(), "dropping removes the file");

        spool.open(ProductIndex(8), 3, b"").expect("open");
        spool.write_at(ProductIndex(8), 0, b"abc").expect("write");
        spool.close(ProductIndex(8), true);
        let kept = parent.path().join("kept");
        let Some(Taken::File(product)) = spool.take(ProductIndex(8)) else { panic!("not in a file") };
        product.persist(&kept).expect("persist");
        assert_eq!(std::fs::read(&kept).expect("read"), b"abc");

        spool.open(ProductIndex(9), 3, b"").expect("open");
        spool.close(ProductIndex(9), false);
        assert!(spool.take(ProductIndex(9)).is_none());
        let dir = spool.dir().to_path_buf();
        assert_eq!(std::fs::read_dir(&dir).expect("dir").count(), 0, "abandoned files are removed");
        drop(spool);
        assert!(!dir.exists(), "the spool directory goes with the last handle");
    }

    #[test]
    fn small_products_are_assembled_in_memory() {
        let parent = tempfile::tempdir().expect("tempdir");
        let mut spool = SpoolSink::new(parent.path()).expect("spool").with_memory_below(11);
        spool.open(ProductIndex(1), 10, b"meta").expect("open");
        spool.open(ProductIndex(2), 11, b"").expect("open");
        spool.write_at(ProductIndex(1), 5, b"world").expect("write");
        spool.write_at(ProductIndex(1), 0, b"hello").expect("write");
        let mut back = [0u8; 4];
        spool.read_at(ProductIndex(1), 3, &mut back).expect("read back");
        assert_eq!(&back, b"lowo");
        assert!(spool.write_at(ProductIndex(1), 8, b"xyz").is_err(), "beyond its end");
        assert_eq!(std::fs::read_dir(spool.dir()).expect("dir").count(), 1, "only the larger product has a file");
        spool.close(ProductIndex(1), true);
        let Some(Taken::Memory(bytes, metadata)) = spool.take(ProductIndex(1)) else { panic!("not in memory") };
        assert_eq!((bytes.as_slice(), metadata.as_slice()), (&b"helloworld"[..], &b"meta"[..]));
        spool.close(ProductIndex(2), false);
        assert_eq!(std::fs::read_dir(spool.dir()).expect("dir").count(), 0);
    }

    #[test]
    fn a_vanished_spool_fails_and_is_reported() {
        let parent = tempfile::tempdir().expect("tempdir");
        let mut spool = SpoolSink::new(parent.path()).expect("spool").with_memory_below(0);
        std::fs::remove_dir(spool.dir()).expect("remove the spool directory");
        assert!(spool.open(ProductIndex(1), 10, b"").is_err());
        assert!(spool.write_at(ProductIndex(1), 0, b"x").is_err(), "never opened");
    }
}
