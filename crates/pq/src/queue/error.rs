//! Why creating, opening or inserting into a queue failed, and failures of the storage layer.

use std::io;
use std::path::PathBuf;

use crate::record::{CorruptRecord, InvalidProduct};

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
    /// `force` and the file system has less room than the new queue's file takes even with the
    /// space of the queue being replaced; that queue is left as it was.
    #[error(
        "cannot replace product queue {path}: the new queue's file takes {needed} bytes and the file system \
         has {free} free besides the {old} bytes of the queue there, which is left as it was: choose a \
         smaller --size or another file system"
    )]
    NoSpaceToReplace {
        /// The queue path.
        path: PathBuf,
        /// Bytes the new queue's files take.
        needed: u64,
        /// Bytes available to this user on the file system.
        free: u64,
        /// Bytes the queue being replaced takes on the disk.
        old: u64,
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
    /// The data file lacks disk space for part of its map (see
    /// [`Queue::open`](crate::Queue::open)): writing into it could kill the writer with SIGBUS on
    /// a full file system, so it is not opened.
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

/// Failure to insert (a duplicate is not a failure: see
/// [`InsertOutcome::Duplicate`](crate::InsertOutcome::Duplicate)).
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
