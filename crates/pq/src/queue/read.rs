//! Reading: zero-copy snapshots ([`Snapshot`], [`QueuedProduct`]), owned copies, and followers
//! woken by inserts in any process ([`Follower`]).

use std::time::Duration;

use heed::{RoTxn, WithoutTls};
use ldm7_types::{ProdInfo, Signature, Timestamp};

use crate::record::RecordView;

use super::{Queue, StorageError};

impl Queue {
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

    /// Wakes every thread (of any process) waiting in [`Queue::wait_for_change`] or a
    /// [`Follower`]'s wait, as an insert would: they re-check the queue, find nothing new, and
    /// look at whatever else they wait for (a stopping server's flag).
    pub fn wake_waiters(&self) {
        self.notifier.notify();
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
}

/// A consistent read-only view of the queue (an LMDB read transaction).
pub struct Snapshot<'q> {
    queue: &'q Queue,
    pub(super) txn: RoTxn<'q, WithoutTls>,
}

impl std::fmt::Debug for Snapshot<'_> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Snapshot").field("queue", &self.queue.path).finish()
    }
}

impl<'q> Snapshot<'q> {
    /// The first product inserted at or after `from`.
    pub fn product_at_or_after(&self, from: Timestamp) -> Result<Option<QueuedProduct<'_>>, StorageError> {
        let key = u64::try_from(from.as_unix_micros()).unwrap_or(0);
        self.queue.products.get_greater_than_or_equal_to(&self.txn, &key)?.map(|entry| self.product(entry)).transpose()
    }

    /// The product with this signature.
    pub fn product_by_signature(&self, signature: &Signature) -> Result<Option<QueuedProduct<'_>>, StorageError> {
        let Some(key) = self.queue.signatures.get(&self.txn, signature.as_bytes())? else {
            return Ok(None);
        };
        self.queue.products.get(&self.txn, &key)?.map(|bytes| self.product((key, bytes))).transpose()
    }

    /// Products inserted at or after `from`, oldest first.
    pub fn products_from(
        &self,
        from: Timestamp,
    ) -> Result<impl Iterator<Item = Result<QueuedProduct<'_>, StorageError>> + '_, StorageError> {
        let key = u64::try_from(from.as_unix_micros()).unwrap_or(0);
        let range = self.queue.products.range(&self.txn, &(key..))?;
        Ok(range.map(move |entry| self.product(entry?)))
    }

    /// Products inserted before `before`, newest first (for "the last N products").
    pub fn products_before_reversed(
        &self,
        before: Timestamp,
    ) -> Result<impl Iterator<Item = Result<QueuedProduct<'_>, StorageError>> + '_, StorageError> {
        let key = u64::try_from(before.as_unix_micros()).unwrap_or(0);
        let range = self.queue.products.rev_range(&self.txn, &(..key))?;
        Ok(range.map(move |entry| self.product(entry?)))
    }

    /// The product of a `products` entry, its record found if it is packed.
    fn product<'s>(&'s self, (key, bytes): (u64, &'s [u8])) -> Result<QueuedProduct<'s>, StorageError> {
        QueuedProduct::from_record(key, self.queue.record(&self.txn, bytes)?)
    }
}

/// A product read from a snapshot; `data` borrows the queue's memory map (no copy).
#[derive(Clone, Debug)]
pub struct QueuedProduct<'s> {
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

impl<'s> QueuedProduct<'s> {
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
        visit: impl FnOnce(&QueuedProduct<'_>) -> R,
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
