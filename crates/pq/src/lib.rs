//! The product queue: a bounded, persistent store of products shared by every ldm7 process on
//! a host — the daemon's sessions, `ldm7 insert`, `ldm7 watch`, `ldm7 cat` and actions.
//!
//! - Bounded twice, by bytes and by product slots, fixed at creation; an insert that does not
//!   fit evicts the oldest products first (ldm-formats.md §4).
//! - A product whose signature is present is refused as [`InsertOutcome::Duplicate`].
//! - Products are ordered by insertion time (unique, microseconds): readers follow the queue
//!   from a time cursor with [`Follower`], woken across processes by a futex
//!   (`notify` module) within a millisecond.
//! - Reads are zero-copy inside a [`Snapshot`] (an LMDB read transaction): a product handed to a
//!   reader cannot be evicted under it.
//! - Crash-safe: every change is one LMDB transaction; a process killed at any moment leaves
//!   the previous committed state.
//! - Full-disk-safe: every byte of a queue's memory-mapped files has its disk block before
//!   anything writes through a map (`reserve` module), a queue is built beside its path and
//!   renamed into place, and a data file with holes or cut short is refused
//!   ([`OpenError::Damaged`]), so a full file system is an error, never a SIGBUS.
//!
//! The on-disk layout is described in `docs/queue.md`.

mod notify;
mod queue;
mod record;
mod reserve;

pub use queue::{
    Capacity, CheckReport, CreateError, DATA_FILE, Follower, InsertError, InsertOutcome, LOCK_FILE, MinimumResidence,
    NOTIFY_FILE, OpenError, OwnedProduct, Queue, QueueStats, QueuedProduct, Snapshot, StorageError,
};
pub use record::{CorruptRecord, InvalidProduct};
