//! Inserting products: one by one, streamed, filled or in batches, each placed (a duplicate, or
//! the oldest products evicted while it does not fit) and its record written, packed into extents
//! when a batch allows, with retries when LMDB's file is full.

use std::io::{self, Write};
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use heed::PutFlags;
use ldm7_types::{ProdInfo, Signature, Timestamp};

use crate::record::{self, InvalidProduct, RecordView, Reference};

use super::{InsertError, PAGE_BYTES, Queue, State, StorageError};

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

impl Queue {
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

/// A record's header (with room for its data when [`Queue::put_record`] copies it in).
fn record_header(info: &ProdInfo, queue_seq: u64, record_len: usize) -> Vec<u8> {
    let mut header = Vec::with_capacity(record_len.min(record::HEADER_LEN + 320 + APPEND_COPY_LEN_MAX));
    record::write_header(&mut header, info, queue_seq);
    header
}
