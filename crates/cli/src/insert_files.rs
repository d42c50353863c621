//! The file-insert pipeline of `ldm7 insert`: readers on every core read files and hash them
//! (MD5: the files of a run side by side in SIMD lanes, `md5-many`) while one inserter puts
//! finished products into the queue, many per transaction.
//!
//! Invariants:
//! - Products are inserted in argument order (arrival times increase in that order), as
//!   `pqinsert` does: finished products wait in a reorder buffer for their predecessors.
//! - Memory is bounded: the bytes of products read but not yet inserted never exceed
//!   [`IN_FLIGHT_BYTES_MAX`] (standard input, which can be read only once, may exceed it alone).
//!   Readers reserve their product's bytes in argument order, so the oldest product in flight
//!   always holds its reservation and the pipeline cannot deadlock. Buffers are reused, and the
//!   queue gives back its map pages after each commit.
//! - A product smaller than [`STREAMED_BYTES_MIN`] is read into a buffer, hashed, and copied
//!   once, into the queue's reserved space. A larger file is never held: a reader hashes it in
//!   chunks, and the inserter reads it again straight into the queue's reserved space (the
//!   kernel's copy is the only one); a file whose size or modification time changed between the
//!   two reads is refused.
//! - A file that cannot be read stops the insert there: the products before it are in the
//!   queue, none after it.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, mpsc};
use std::time::SystemTime;

use ldm7_io::log_target::PRODUCT;
use ldm7_pq::{InsertOutcome, Queue};
use ldm7_types::{ProdInfo, Signature};

use crate::common::now;
use crate::exit::{CmdResult, bad_input};
use crate::insert::{Input, insert_failure, inserted_so_far};

/// Most bytes of products read but not yet inserted.
pub const IN_FLIGHT_BYTES_MAX: u64 = 8 << 20;
/// Files of at least this size are hashed in chunks and read into the queue at their turn.
pub const STREAMED_BYTES_MIN: u64 = 1 << 20;
/// Most files a reader takes at once.
const RUN_FILES_MAX: usize = 32;
/// Most bytes a reader takes at once (a larger file goes alone).
const RUN_BYTES_MAX: u64 = 1 << 20;
/// The chunk in which a reader hashes a large file.
const HASH_CHUNK_BYTES: usize = 1 << 20;
/// Most products in one queue transaction.
const BATCH_PRODUCTS_MAX: usize = 512;
/// Most bytes in one queue transaction (a larger product goes alone).
const BATCH_BYTES_MAX: u64 = 4 << 20;

/// Inserts `inputs` in order; returns how many were inserted (duplicates are not). With
/// `signature_from_ident` a product's signature is the MD5 of its identifier.
pub fn insert_all(
    queue: &Queue,
    inputs: Vec<Input>,
    signature_from_ident: bool,
    with_signature: bool,
) -> CmdResult<u64> {
    let readers = std::thread::available_parallelism().map_or(1, usize::from).min(inputs.len()).max(1);
    let budget = Budget::new(&inputs);
    let (ready_tx, ready_rx) = mpsc::channel::<Vec<ReadProduct>>();
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        for _ in 0..readers {
            let ready_tx = ready_tx.clone();
            let (budget, inputs, stop) = (&budget, &inputs, &stop);
            scope.spawn(move || {
                let hasher = md5_many::Md5Many::new();
                let mut chunk = Vec::new();
                while let Some(run) = budget.next_run() {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let mut reads: Vec<ReadProduct> = run
                        .into_iter()
                        .map(|(index, buffer)| {
                            read_one(&inputs[index], index, buffer, signature_from_ident, &mut chunk)
                        })
                        .collect();
                    if !signature_from_ident {
                        hash_together(&hasher, &mut reads);
                    }
                    if ready_tx.send(reads).is_err() {
                        break;
                    }
                }
            });
        }
        drop(ready_tx);
        let result = insert_in_order(queue, &inputs, &budget, ready_rx, with_signature);
        stop.store(true, Ordering::Relaxed);
        budget.close();
        result
    })
}

/// Hashes the products of a run that were read into buffers, side by side in SIMD lanes
/// (multi-buffer MD5: many times one stream's speed).
fn hash_together(hasher: &md5_many::Md5Many, reads: &mut [ReadProduct]) {
    let mut lanes: Vec<&mut ReadProduct> =
        reads.iter_mut().filter(|read| read.buffer.is_some() && read.result.is_ok()).collect();
    if lanes.is_empty() {
        return;
    }
    let mut digests = vec![[0u8; 16]; lanes.len()];
    {
        let inputs: Vec<&[u8]> = lanes.iter().map(|read| read.buffer.as_deref().unwrap_or_default()).collect();
        hasher.hash_many(&inputs, &mut digests);
    }
    for (read, digest) in lanes.iter_mut().zip(digests) {
        if let Ok(hashed) = &mut read.result {
            hashed.signature = Signature(digest);
        }
    }
}

/// Reads and hashes one input (a large file only hashed, in chunks).
fn read_one(
    input: &Input,
    index: usize,
    mut buffer: Vec<u8>,
    signature_from_ident: bool,
    chunk: &mut Vec<u8>,
) -> ReadProduct {
    if is_streamed(input) {
        let result = hash_file(&input.path, signature_from_ident, &input.info, chunk);
        return ReadProduct { index, buffer: None, result };
    }
    // The data's signature is computed for the whole run at once ([`hash_together`]).
    let result = read_into(&input.path, input.info.size, &mut buffer).map(|()| Hashed {
        signature: if signature_from_ident {
            Signature::md5_of(input.info.ident.as_bytes())
        } else {
            Signature::default()
        },
        size: buffer.len() as u64,
        modified: None,
    });
    ReadProduct { index, buffer: Some(buffer), result }
}

/// A product read by a reader: its data (none for a file streamed at insertion) and signature,
/// or why it could not be read.
struct ReadProduct {
    index: usize,
    buffer: Option<Vec<u8>>,
    result: std::io::Result<Hashed>,
}

/// What a reader learned of a product.
struct Hashed {
    signature: Signature,
    size: u64,
    /// A streamed file's modification time when it was hashed.
    modified: Option<SystemTime>,
}

/// Whether an input is hashed in chunks and read into the queue at its turn.
fn is_streamed(input: &Input) -> bool {
    input.path.as_os_str() != "-" && u64::from(input.info.size) >= STREAMED_BYTES_MIN
}

/// The inserter: takes products in argument order and inserts runs of them in batches.
fn insert_in_order(
    queue: &Queue,
    inputs: &[Input],
    budget: &Budget,
    ready: mpsc::Receiver<Vec<ReadProduct>>,
    with_signature: bool,
) -> CmdResult<u64> {
    let mut waiting: BTreeMap<usize, ReadProduct> = BTreeMap::new();
    let mut next = 0usize;
    let mut inserted = 0u64;
    while next < inputs.len() {
        // Wait for the next product in order, then take whatever else is ready.
        while !waiting.contains_key(&next) {
            let Ok(reads) = ready.recv() else {
                return Err(bad_input(format!("{}: reading stopped unexpectedly", inputs[next].path.display())));
            };
            waiting.extend(reads.into_iter().map(|read| (read.index, read)));
        }
        while let Ok(reads) = ready.try_recv() {
            waiting.extend(reads.into_iter().map(|read| (read.index, read)));
        }
        let mut batch: Vec<(ProdInfo, ReadProduct)> = Vec::new();
        let mut batch_bytes = 0u64;
        while let Some(read) = waiting.remove(&next) {
            let input = &inputs[next];
            let hashed = match &read.result {
                Ok(hashed) => hashed,
                Err(error) => {
                    let message = format!("cannot read {}: {error}", input.path.display());
                    insert_batch(queue, inputs, &mut batch, budget, with_signature, &mut inserted)?;
                    return Err(bad_input(format!("{message}; {}", inserted_so_far(inserted))));
                }
            };
            let mut info = input.info.clone();
            info.signature = hashed.signature;
            info.size = hashed.size as u32;
            next += 1;
            if read.buffer.is_none() {
                insert_batch(queue, inputs, &mut batch, budget, with_signature, &mut inserted)?;
                let modified = hashed.modified;
                insert_streamed(queue, input, info, modified, with_signature, &mut inserted)?;
                budget.release(vec![(read.index, None)]);
                break;
            }
            batch_bytes += hashed.size;
            batch.push((info, read));
            if batch.len() >= BATCH_PRODUCTS_MAX || batch_bytes >= BATCH_BYTES_MAX {
                break;
            }
        }
        insert_batch(queue, inputs, &mut batch, budget, with_signature, &mut inserted)?;
    }
    Ok(inserted)
}

/// Inserts `batch` in one transaction, logs each product, and returns its buffers.
fn insert_batch(
    queue: &Queue,
    inputs: &[Input],
    batch: &mut Vec<(ProdInfo, ReadProduct)>,
    budget: &Budget,
    with_signature: bool,
    inserted: &mut u64,
) -> CmdResult<()> {
    if batch.is_empty() {
        return Ok(());
    }
    let arrival = now();
    for (info, _) in batch.iter_mut() {
        info.arrival = arrival;
    }
    let pairs: Vec<(&ProdInfo, &[u8])> =
        batch.iter().map(|(info, read)| (info, read.buffer.as_deref().unwrap_or_default())).collect();
    let outcomes =
        queue.insert_batch(&pairs).map_err(|error| insert_failure(&inputs[batch[0].1.index].path, error, *inserted))?;
    drop(pairs);
    let mut done = Vec::with_capacity(batch.len());
    for ((info, read), outcome) in batch.drain(..).zip(outcomes) {
        report(&inputs[read.index], &info, outcome, with_signature, inserted);
        done.push((read.index, read.buffer));
    }
    budget.release(done);
    Ok(())
}

/// Inserts a large file by reading it straight into the queue's reserved space, refusing it
/// if it changed since it was hashed.
fn insert_streamed(
    queue: &Queue,
    input: &Input,
    mut info: ProdInfo,
    modified: Option<SystemTime>,
    with_signature: bool,
    inserted: &mut u64,
) -> CmdResult<()> {
    info.arrival = now();
    let size = u64::from(info.size);
    let unchanged = |file: &std::fs::File| -> std::io::Result<()> {
        let metadata = file.metadata()?;
        if metadata.len() != size || metadata.modified().ok() != modified {
            return Err(std::io::Error::other("the file changed while it was being inserted"));
        }
        Ok(())
    };
    let outcome = queue
        .insert_filled(&info, |space| {
            let mut file = std::fs::File::open(&input.path)?;
            unchanged(&file)?;
            file.read_exact(space)?;
            unchanged(&file)
        })
        .map_err(|error| insert_failure(&input.path, error, *inserted))?;
    report(input, &info, outcome, with_signature, inserted);
    Ok(())
}

/// Logs what became of one product and counts it if it went in.
fn report(input: &Input, info: &ProdInfo, outcome: InsertOutcome, with_signature: bool, inserted: &mut u64) {
    match outcome {
        InsertOutcome::Inserted { .. } => {
            *inserted += 1;
            tracing::info!(target: PRODUCT, "{}", info.line(with_signature));
        }
        InsertOutcome::Duplicate { existing } => tracing::info!(
            "{}: duplicate, not inserted (same signature {} inserted at {existing})",
            input.path.display(),
            info.signature
        ),
    }
}

/// Hashes a large file in chunks (or its identifier, with `-i`, after checking the file can be
/// read), noting its size and modification time.
fn hash_file(path: &Path, signature_from_ident: bool, info: &ProdInfo, chunk: &mut Vec<u8>) -> std::io::Result<Hashed> {
    let mut file = std::fs::File::open(path)?;
    let metadata = file.metadata()?;
    let size = metadata.len();
    if u32::try_from(size).is_err() {
        return Err(std::io::Error::other(format!("{size} bytes is more than a product may hold (4 GiB)")));
    }
    let modified = metadata.modified().ok();
    if signature_from_ident {
        return Ok(Hashed { signature: Signature::md5_of(info.ident.as_bytes()), size, modified });
    }
    chunk.resize(HASH_CHUNK_BYTES, 0);
    let mut hasher = md5_many::Md5State::new();
    let mut hashed = 0u64;
    loop {
        let count = file.read(chunk)?;
        if count == 0 {
            break;
        }
        hasher.update(&chunk[..count]);
        hashed += count as u64;
    }
    if hashed != size {
        return Err(std::io::Error::other("the file changed while it was being read"));
    }
    Ok(Hashed { signature: Signature(hasher.finalize()), size, modified })
}

/// Reads a file's checked size (or all of standard input for `-`) into `buffer`, reusing its
/// capacity.
fn read_into(path: &Path, size_hint: u32, buffer: &mut Vec<u8>) -> std::io::Result<()> {
    buffer.clear();
    buffer.reserve(size_hint as usize + 1);
    if path.as_os_str() == "-" {
        std::io::stdin().lock().read_to_end(buffer)?;
    } else {
        // The size checked before is what is read (as pqinsert does); a file that shrank since
        // gives what it holds. No size query and no end-of-file probe: one read per file.
        std::fs::File::open(path)?.take(u64::from(size_hint)).read_to_end(buffer)?;
    }
    if u32::try_from(buffer.len()).is_err() {
        return Err(std::io::Error::other(format!("{} bytes is more than a product may hold (4 GiB)", buffer.len())));
    }
    Ok(())
}

/// The in-flight byte budget, the order in which readers take inputs, and the buffer pool.
struct Budget {
    state: Mutex<BudgetState>,
    changed: Condvar,
    /// Bytes each input reserves (its size when checked; standard input takes the whole budget).
    costs: Vec<u64>,
}

struct BudgetState {
    next: usize,
    in_flight_bytes: u64,
    in_flight: usize,
    pool: Vec<Vec<u8>>,
    pooled_bytes: u64,
    closed: bool,
}

impl Budget {
    fn new(inputs: &[Input]) -> Self {
        let costs = inputs
            .iter()
            .map(|input| match input.path.as_os_str() == "-" {
                true => IN_FLIGHT_BYTES_MAX,
                false if is_streamed(input) => 0,
                false => u64::from(input.info.size),
            })
            .collect();
        let state =
            BudgetState { next: 0, in_flight_bytes: 0, in_flight: 0, pool: Vec::new(), pooled_bytes: 0, closed: false };
        Self { state: Mutex::new(state), changed: Condvar::new(), costs }
    }

    /// The next run of consecutive inputs to read (at most [`RUN_FILES_MAX`] files and
    /// [`RUN_BYTES_MAX`] bytes, at least one) with a buffer for each, once the first one's bytes
    /// fit the budget; `None` when every input is taken or the insert stopped. Runs keep the
    /// hand-overs between readers and the inserter few.
    fn next_run(&self) -> Option<Vec<(usize, Vec<u8>)>> {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        loop {
            if state.closed || state.next >= self.costs.len() {
                return None;
            }
            let cost = self.costs[state.next];
            if state.in_flight == 0 || state.in_flight_bytes + cost <= IN_FLIGHT_BYTES_MAX {
                break;
            }
            state = self.changed.wait(state).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        let mut run = Vec::new();
        let mut run_bytes = 0u64;
        while state.next < self.costs.len() && run.len() < RUN_FILES_MAX {
            let cost = self.costs[state.next];
            let fits = state.in_flight == 0 || state.in_flight_bytes + cost <= IN_FLIGHT_BYTES_MAX;
            if !run.is_empty() && (!fits || run_bytes + cost > RUN_BYTES_MAX) {
                break;
            }
            let index = state.next;
            state.next += 1;
            state.in_flight += 1;
            state.in_flight_bytes += cost;
            run_bytes += cost;
            let buffer = state.take_buffer(cost);
            run.push((index, buffer));
        }
        Some(run)
    }

    /// Returns inserted products' reservations and buffers.
    fn release(&self, done: Vec<(usize, Option<Vec<u8>>)>) {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for (index, buffer) in done {
            state.in_flight -= 1;
            state.in_flight_bytes -= self.costs[index];
            if let Some(buffer) = buffer {
                state.give_buffer(buffer);
            }
        }
        drop(state);
        self.changed.notify_all();
    }

    /// Stops handing out inputs (the inserter finished or failed).
    fn close(&self) {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).closed = true;
        self.changed.notify_all();
    }
}

impl BudgetState {
    /// A pooled buffer that can hold `bytes` without growing, or else the largest pooled one
    /// (or a new one); none for a product that needs none (streamed, or empty).
    fn take_buffer(&mut self, bytes: u64) -> Vec<u8> {
        if bytes == 0 {
            return Vec::new();
        }
        let fitting = self.pool.iter().position(|buffer| buffer.capacity() as u64 > bytes);
        let chosen = fitting.or_else(|| (0..self.pool.len()).max_by_key(|&position| self.pool[position].capacity()));
        match chosen {
            Some(position) => {
                let buffer = self.pool.swap_remove(position);
                self.pooled_bytes -= buffer.capacity() as u64;
                buffer
            }
            None => Vec::new(),
        }
    }

    /// Keeps a buffer for reuse while the pool stays within the in-flight bound.
    fn give_buffer(&mut self, buffer: Vec<u8>) {
        let bytes = buffer.capacity() as u64;
        if self.pooled_bytes + bytes <= IN_FLIGHT_BYTES_MAX {
            self.pooled_bytes += bytes;
            self.pool.push(buffer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The multi-buffer MD5 of a run equals one-stream MD5 (md-5) for every length around the
    /// block and lane boundaries, mixed in one run, with unread inputs left alone.
    #[test]
    fn hashing_a_run_together_equals_hashing_each() {
        let hasher = md5_many::Md5Many::new();
        let mut lengths: Vec<usize> = (0..=200).collect();
        lengths.extend([447, 448, 511, 512, 1000, 4096, 30_000, 65_543, 1 << 20]);
        for run in lengths.chunks(37) {
            let mut reads: Vec<ReadProduct> = run
                .iter()
                .enumerate()
                .map(|(index, &len)| {
                    let data: Vec<u8> = (0..len).map(|byte| (byte * 131 + len * 7 + index) as u8).collect();
                    let hashed = Hashed { signature: Signature::default(), size: len as u64, modified: None };
                    ReadProduct { index, buffer: Some(data), result: Ok(hashed) }
                })
                .collect();
            reads.push(ReadProduct { index: 99, buffer: None, result: Err(std::io::Error::other("unreadable")) });
            hash_together(&hasher, &mut reads);
            for read in &reads {
                match (&read.buffer, &read.result) {
                    (Some(data), Ok(hashed)) => {
                        assert_eq!(hashed.signature, Signature::md5_of(data), "{} bytes", data.len())
                    }
                    (None, Err(_)) => {}
                    _ => panic!("unexpected read"),
                }
            }
        }
    }
}
