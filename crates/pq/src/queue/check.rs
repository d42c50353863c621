//! What `ldm7 queue info` and `ldm7 queue check` show: usage statistics and a cross-check of the
//! tables, totals and files.

use std::fs;
use std::time::Duration;

use ldm7_types::{Signature, Timestamp};

use crate::notify::NOTIFY_FILE_LEN;
use crate::record::{RecordView, Reference};
use crate::reserve::allocated_bytes;

use super::open::data_file_problem;
use super::{Capacity, DATA_FILE, LOCK_FILE, LOCK_FILE_BYTES, NOTIFY_FILE, PAGE_BYTES, Queue, StorageError};

impl Queue {
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
    /// One function on purpose: one read transaction walks the tables once, and each check
    /// compares what the walk has counted so far; split, the counts would travel between
    /// functions for no gain.
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
