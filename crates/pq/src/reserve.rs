//! Disk space of a queue's memory-mapped files, reserved before anything writes through a map.
//!
//! Every file of a queue is used through a shared memory mapping (`data.mdb` by LMDB with
//! `MDB_WRITEMAP`, `lock.mdb` by LMDB's reader table, `notify` by the wake-up counter). A write
//! through a mapping into a page the file system has no block for makes the kernel allocate one
//! at that moment; on a full file system it cannot, and the writing process dies of SIGBUS — there
//! is no error code to return. So every byte of these files gets its block before the file is
//! mapped for writing, and a file whose blocks are missing is refused, never written:
//!
//! - [`reserve`] gives a file's holes blocks of their own (`fallocate` mode 0: never changes the
//!   contents, so it is safe on a file other processes have mapped) and fails with `ENOSPC` when
//!   the file system cannot, which the callers turn into a clear error;
//! - [`allocated_bytes`] is what the file system has given a file (`st_blocks × 512`), which the
//!   queue compares with the map size when it opens and when it checks a queue.
//!
//! The data file itself is reserved by writing its zeros (`Queue::create`), not by `fallocate`:
//! on ext4 and XFS `fallocate` makes unwritten extents, and the first write into each of them
//! later converts it, which slowed the LDM-6 fan-out benchmark (docs/benchmarks.md).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Opens (creating if needed, with permissions `mode` before the umask) the file at `path` and
/// reserves disk space for its first `len` bytes (see [`reserve`]).
pub(crate) fn open_reserved(path: &Path, len: u64, mode: u32) -> io::Result<File> {
    let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).mode(mode).open(path)?;
    reserve(&file, len)?;
    Ok(file)
}

/// Makes every byte of the file up to `len` (or up to its length, if longer) have a disk block
/// of its own, extending the file to `len` if it is shorter. Never changes the file's contents.
/// Fails with `ENOSPC` (or `EDQUOT`) when the file system has no room; on a file system without
/// `fallocate`, an empty file is written with zeros instead and a sparse one is an error.
pub(crate) fn reserve(file: &File, len: u64) -> io::Result<()> {
    let metadata = file.metadata()?;
    let target = len.max(metadata.len());
    if metadata.len() == target && allocated_bytes(&metadata) >= target {
        return Ok(());
    }
    let Ok(target_off) = libc::off_t::try_from(target) else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "file too large"));
    };
    loop {
        // SAFETY: fallocate on an open descriptor of ours; mode 0 allocates blocks for the
        // holes in [0, target) and extends the file to `target`; no memory is touched.
        #[allow(unsafe_code)]
        let result = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, target_off) };
        if result == 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        match error.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EOPNOTSUPP) if metadata.len() == 0 => return write_zeros(file, 0, target),
            Some(libc::EOPNOTSUPP) => {
                return Err(io::Error::other(format!(
                    "the file system cannot reserve space for it (no fallocate) and {} of its {target} bytes have \
                     none",
                    target.saturating_sub(allocated_bytes(&metadata))
                )));
            }
            _ => return Err(error),
        }
    }
}

/// Bytes of disk the file system has given the file (`st_blocks` counts 512-byte units).
pub(crate) fn allocated_bytes(metadata: &std::fs::Metadata) -> u64 {
    metadata.blocks().saturating_mul(512)
}

/// Whether an I/O error means the file system (or the user's quota) is full.
pub(crate) fn is_no_space(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

/// Writes zeros over `[from, to)` of `file`, from the end backwards (see `Queue::create` for
/// why backwards).
pub(crate) fn write_zeros(file: &File, from: u64, to: u64) -> io::Result<()> {
    let zeros = vec![0u8; 1 << 20];
    let mut end = to;
    while end > from {
        let chunk = (end - from).min(zeros.len() as u64);
        file.write_all_at(&zeros[..chunk as usize], end - chunk)?;
        end -= chunk;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_fills_holes_and_keeps_contents() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        let file = open_reserved(&path, 0, 0o600).expect("open");
        file.write_all_at(b"keep", 8192).expect("write");
        file.set_len(64 << 10).expect("extend sparse");
        reserve(&file, 32 << 10).expect("reserve");
        let metadata = file.metadata().expect("stat");
        assert_eq!(metadata.len(), 64 << 10, "a longer file keeps its length");
        assert!(allocated_bytes(&metadata) >= 64 << 10, "every byte has a block");
        let mut word = [0u8; 4];
        file.read_exact_at(&mut word, 8192).expect("read");
        assert_eq!(&word, b"keep");
        reserve(&file, 128 << 10).expect("grow");
        assert_eq!(file.metadata().expect("stat").len(), 128 << 10);
    }
}
