//! The sender's inputs, streamed: [`plan`] checks them without reading their contents (files
//! exist and are files or pipes; the trace parses), and [`prepare`] reads one when its turn
//! comes — it computes the product's MD5 (the BOP metadata, needed before its first block goes
//! out) and returns an [`OutgoingProduct`] whose bytes the sender reads back block by block, when
//! it multicasts them and when it repairs them.
//!
//! Memory bound (what `fmtp send` holds of product bytes, whatever the size and number of its
//! inputs):
//!
//! * a regular file is never held: its bytes are read again by offset (`pread`) when the sender
//!   multicasts or repairs a block. Open files are kept in [`OpenFiles`], at most
//!   [`OPEN_FILES_MAX`] at once (least recently read closed first; a product whose file is
//!   closed reopens it, counted in [`OpenFiles::reopened`]); a product's file closes when the
//!   sender releases it. A file that changes size or modification time after it was hashed
//!   is no longer read: the protocol reports that product's data unavailable, and receivers
//!   miss it rather than get bytes that do not match its MD5;
//! * a synthetic (`--replay`) product is computed from its position at any offset
//!   ([`synthetic_fill`]), never stored;
//! * a pipe or device (`/dev/stdin`, `<(…)`) cannot be read twice: its bytes are held from
//!   its turn until the sender releases the product;
//! * hashing reads through one buffer of [`READ_CHUNK_BYTES`] per product being prepared
//!   (regular files are prepared up to [`HASH_BATCH_FILES`] at a time, [`next_batch`], and
//!   hashed side by side), and reading back blocks in order goes through one read-ahead window
//!   of the same size.
//!
//! Read-ahead is bounded by the sender's product queues (`app::PRODUCT_INPUTS_MAX` +
//! `app::QUEUED_PRODUCTS_MAX` products prepared and not yet multicast), the products prepared
//! and waiting for them (up to [`HASH_BATCH_FILES`]) and the batch being prepared.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use ldm7_fmtp_proto::{DataUnavailable, OutgoingProduct, ProductData};
use ldm7_io::BoundHits;
use md5::{Digest, Md5};

use super::{AppError, ProductSource, Speedup};

/// Input files open at once for reading back blocks (multicast and repairs).
pub const OPEN_FILES_MAX: usize = 64;

/// Bytes read at once while hashing an input.
pub const READ_CHUNK_BYTES: usize = 256 << 10;

/// Regular files hashed together, side by side in SIMD lanes ([`prepare_batch`]), at most ...
pub const HASH_BATCH_FILES: usize = HASH_LANES;

/// ... and their bytes at most (a larger file is hashed alone): a batch is read whole before
/// its first product goes out.
pub const HASH_BATCH_BYTES: u64 = 64 << 20;

/// The inputs, checked, in sending order; nothing of their contents read yet.
#[derive(Debug)]
pub(super) struct Plan {
    /// One entry per product.
    pub inputs: Vec<PlannedInput>,
}

/// One product to be read when its turn comes.
#[derive(Clone, Debug)]
pub(super) struct PlannedInput {
    /// Where its bytes come from.
    pub kind: InputKind,
    /// Its due time after the start (replay pacing).
    pub due: Option<Duration>,
}

/// Where a product's bytes come from.
#[derive(Clone, Debug)]
pub(super) enum InputKind {
    /// A regular file: hashed at its turn, read back by offset.
    File(Arc<Path>),
    /// A pipe or device: read whole at its turn.
    Stream(PathBuf),
    /// Synthetic content of this size for this position in the trace.
    Synthetic {
        /// Its position (the content's seed).
        position: u64,
        /// Its size.
        len: u64,
    },
}

/// A product ready to hand to the sender.
pub(super) struct Prepared {
    /// The product (bytes and MD5 metadata).
    pub product: OutgoingProduct,
    /// Its size.
    pub len: u64,
    /// Its due time after the start.
    pub due: Option<Duration>,
}

/// Checks the inputs without reading their contents: every file exists and is a regular file
/// that opens, a pipe or a device; the trace parses and holds products.
pub(super) fn plan(source: &ProductSource) -> Result<Plan, AppError> {
    let inputs = match source {
        ProductSource::Replay { trace, limit, speed } => replay_plan(trace, *limit, *speed)?,
        ProductSource::Files(files) if files.is_empty() => {
            return Err(AppError::Input("nothing to send: name files or give --replay TRACE".into()));
        }
        ProductSource::Files(files) => files
            .iter()
            .map(|file| {
                let metadata = std::fs::metadata(file)
                    .map_err(|error| AppError::Input(format!("cannot read {}: {error}", file.display())))?;
                let kind = if metadata.is_file() {
                    // Opening a regular file reads nothing (a pipe's open would wait for a writer).
                    File::open(file)
                        .map_err(|error| AppError::Input(format!("cannot read {}: {error}", file.display())))?;
                    InputKind::File(Arc::from(file.as_path()))
                } else if metadata.is_dir() {
                    return Err(AppError::Input(format!(
                        "cannot read {}: a directory; name the files in it",
                        file.display()
                    )));
                } else {
                    InputKind::Stream(file.clone())
                };
                Ok(PlannedInput { kind, due: None })
            })
            .collect::<Result<_, _>>()?,
    };
    Ok(Plan { inputs })
}

/// Reads the input (blocking: run it off the async threads): hashes it and returns the product.
/// `key` names the product in `files` (unique per input).
pub(super) fn prepare(input: &PlannedInput, key: u64, files: &Arc<OpenFiles>) -> Result<Prepared, AppError> {
    let (product, len) = match &input.kind {
        InputKind::File(path) => {
            let (data, digest) = hash_file(path, key, files)
                .map_err(|error| AppError::Input(format!("cannot read {}: {error}", path.display())))?;
            let len = data.len;
            (OutgoingProduct::new(data, digest.to_vec()), len)
        }
        InputKind::Stream(path) => {
            let unreadable = |error: io::Error| AppError::Input(format!("cannot read {}: {error}", path.display()));
            let mut file = File::open(path).map_err(unreadable)?;
            let mut bytes = Vec::new();
            let (digest, len) = md5_of_reader(&mut file, |chunk| bytes.extend_from_slice(chunk)).map_err(unreadable)?;
            (OutgoingProduct::new(bytes, digest.to_vec()), len)
        }
        InputKind::Synthetic { position, len } => {
            let data = SyntheticData { position: *position, len: *len };
            let mut hasher = Md5::new();
            let mut chunk = vec![0u8; READ_CHUNK_BYTES];
            let mut offset = 0;
            while offset < *len {
                let take = (*len - offset).min(READ_CHUNK_BYTES as u64) as usize;
                synthetic_fill(*position, offset, &mut chunk[..take]);
                hasher.update(&chunk[..take]);
                offset += take as u64;
            }
            let digest: [u8; 16] = hasher.finalize().into();
            (OutgoingProduct::new(data, digest.to_vec()), *len)
        }
    };
    Ok(Prepared { product, len, due: input.due })
}

/// Takes the next inputs to prepare together from `inputs` (numbered by their keys): the next
/// one, and after a regular file the regular files that follow it, up to [`HASH_BATCH_FILES`]
/// and [`HASH_BATCH_BYTES`] (by their sizes now; a file whose size cannot be read ends the
/// batch, and its error comes when it is read).
pub(super) fn next_batch(
    inputs: &mut std::iter::Peekable<impl Iterator<Item = (u64, PlannedInput)>>,
) -> Vec<(u64, PlannedInput)> {
    let Some(first) = inputs.next() else { return Vec::new() };
    let size = |input: &PlannedInput| match &input.kind {
        InputKind::File(path) => std::fs::metadata(path).ok().map(|metadata| metadata.len()),
        _ => None,
    };
    let Some(mut bytes) = size(&first.1) else { return vec![first] };
    let mut batch = vec![first];
    while batch.len() < HASH_BATCH_FILES {
        match inputs.peek().and_then(|(_, input)| size(input)) {
            Some(len) if bytes + len <= HASH_BATCH_BYTES => bytes += len,
            _ => break,
        }
        batch.extend(inputs.next());
    }
    batch
}

/// Prepares a batch from [`next_batch`] (blocking), in order: regular files hashed side by side
/// in SIMD lanes (several in about the time of one: with four receivers on the sender's two
/// cores, hashing each file alone was a quarter of the sender's CPU), anything else as
/// [`prepare`] does. An input that cannot be read has its error in its place.
pub(super) fn prepare_batch(batch: &[(u64, PlannedInput)], files: &Arc<OpenFiles>) -> Vec<Result<Prepared, AppError>> {
    let paths: Option<Vec<&Arc<Path>>> = batch
        .iter()
        .map(|(_, input)| match &input.kind {
            InputKind::File(path) => Some(path),
            _ => None,
        })
        .collect();
    let Some(paths) = paths.filter(|paths| paths.len() > 1) else {
        return batch.iter().map(|(key, input)| prepare(input, *key, files)).collect();
    };
    let hashed = hash_files(&paths);
    batch
        .iter()
        .zip(paths)
        .zip(hashed)
        .map(|(((key, input), path), hashed)| {
            let (file, digest, len) =
                hashed.map_err(|error| AppError::Input(format!("cannot read {}: {error}", path.display())))?;
            let data = file_data(path, *key, file, len, files);
            Ok(Prepared { product: OutgoingProduct::new(data, digest.to_vec()), len, due: input.due })
        })
        .collect()
}

/// Streams hashed side by side at once. md5-many (0.1.0-alpha.4) runs at SIMD speed only when
/// it is given a multiple of eight streams and every one gets input of the same length (five
/// or six streams ran at a third of one stream's speed, eight at over four times it): full
/// chunks are hashed eight at a time, lanes beyond the files hashing a copy that is discarded;
/// a file's last, shorter chunk is hashed alone.
const HASH_LANES: usize = 8;

/// Each file's MD5 and length, the files read a chunk at a time in turn and hashed side by
/// side; with the file, open.
fn hash_files(paths: &[&Arc<Path>]) -> Vec<io::Result<(File, [u8; 16], u64)>> {
    let mut opened: Vec<io::Result<File>> = paths.iter().map(File::open).collect();
    let mut states = vec![md5_many::Md5State::new(); paths.len()];
    let mut chunks = vec![vec![0u8; READ_CHUNK_BYTES]; paths.len()];
    let mut lens = vec![0u64; paths.len()];
    let mut done: Vec<bool> = opened.iter().map(Result::is_err).collect();
    let hasher = md5_many::Md5Many::new();
    let mut lanes = [md5_many::Md5State::new(); HASH_LANES];
    while done.iter().any(|done| !done) {
        let mut counts = vec![0usize; paths.len()];
        for at in 0..paths.len() {
            if done[at] {
                continue;
            }
            let Ok(file) = &mut opened[at] else { continue };
            match read_full(file, &mut chunks[at]) {
                Ok(count) => {
                    counts[at] = count;
                    lens[at] += count as u64;
                    done[at] = count < READ_CHUNK_BYTES;
                }
                Err(error) => {
                    opened[at] = Err(error);
                    done[at] = true;
                }
            }
        }
        let full: Vec<usize> = (0..paths.len()).filter(|&at| counts[at] == READ_CHUNK_BYTES).collect();
        for group in full.chunks(HASH_LANES) {
            if let [at] = group {
                states[*at].update(&chunks[*at]);
                continue;
            }
            let mut inputs = [chunks[group[0]].as_slice(); HASH_LANES];
            for (lane, &at) in group.iter().enumerate() {
                lanes[lane] = states[at];
                inputs[lane] = &chunks[at];
            }
            hasher.update_many(&mut lanes, &inputs);
            for (lane, &at) in group.iter().enumerate() {
                states[at] = lanes[lane];
            }
        }
        for at in (0..paths.len()).filter(|&at| (1..READ_CHUNK_BYTES).contains(&counts[at])) {
            states[at].update(&chunks[at][..counts[at]]);
        }
    }
    let digests = states.iter().map(md5_many::Md5State::finalize);
    opened.into_iter().zip(digests).zip(lens).map(|((file, digest), len)| Ok((file?, digest, len))).collect()
}

/// Reads until `buffer` is full or the end: the bytes read.
fn read_full(file: &mut File, buffer: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match file.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(count) => filled += count,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(filled)
}

/// The input files open for reading back blocks: at most [`OPEN_FILES_MAX`], least recently
/// read closed first; and one read-ahead window of [`READ_CHUNK_BYTES`], so that the multicast,
/// which reads a product's blocks in order, costs one `pread` per window rather than per block.
#[derive(Debug, Default)]
pub(super) struct OpenFiles {
    state: Mutex<OpenState>,
    /// A file was closed to stay within the bound (an episode: until no file is closed).
    full: BoundHits,
    /// Files opened again after being closed for the bound.
    reopened: AtomicU64,
}

#[derive(Debug, Default)]
struct OpenState {
    /// Least recently read first.
    files: VecDeque<(u64, File)>,
    /// Bytes `[window_start, window_start + window.len())` of product `window_key`'s file.
    window: Vec<u8>,
    window_key: Option<u64>,
    window_start: u64,
    /// Where a read that continues the last one starts: (product, offset).
    next_read: Option<(u64, u64)>,
}

impl OpenFiles {
    /// Files opened again after being closed to stay within [`OPEN_FILES_MAX`].
    pub fn reopened(&self) -> u64 {
        self.reopened.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, OpenState> {
        // A panic while holding the lock leaves the state consistent (whole entries only).
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn insert(&self, key: u64, file: File) {
        let mut state = self.lock();
        state.files.push_back((key, file));
        self.trim(&mut state.files);
    }

    fn trim(&self, files: &mut VecDeque<(u64, File)>) {
        if files.len() <= OPEN_FILES_MAX {
            self.full.relieved();
            return;
        }
        while files.len() > OPEN_FILES_MAX {
            files.pop_front();
        }
        if self.full.hit() {
            tracing::info!(
                bound = OPEN_FILES_MAX,
                "FMTP send: more input files in use than may stay open; closing the least recently read (reopened for repairs)"
            );
        }
    }

    fn remove(&self, key: u64) {
        let mut state = self.lock();
        if let Some(position) = state.files.iter().position(|(open_key, _)| *open_key == key) {
            state.files.remove(position);
        }
        if state.window_key == Some(key) {
            state.window_key = None;
        }
    }

    /// Reads `out.len()` bytes at `offset` of the product's file: from the window, or through
    /// a new window when the read continues the previous one, or directly. The file is opened
    /// again if it was closed (checking that it did not change since it was hashed).
    fn read_at(&self, data: &FileData, offset: u64, out: &mut [u8]) -> Result<(), DataUnavailable> {
        let mut state = self.lock();
        let state = &mut *state;
        let end = offset + out.len() as u64;
        let sequential = state.next_read == Some((data.key, offset));
        state.next_read = Some((data.key, end));
        if state.window_key == Some(data.key)
            && offset >= state.window_start
            && end <= state.window_start + state.window.len() as u64
        {
            let start = (offset - state.window_start) as usize;
            out.copy_from_slice(&state.window[start..start + out.len()]);
            return Ok(());
        }
        let file = self.file(&mut state.files, data)?;
        if sequential && out.len() < READ_CHUNK_BYTES {
            let window_len = (data.len - offset).min(READ_CHUNK_BYTES as u64) as usize;
            state.window_key = None;
            state.window.resize(window_len, 0);
            file.read_exact_at(&mut state.window, offset).map_err(|_| DataUnavailable)?;
            (state.window_key, state.window_start) = (Some(data.key), offset);
            out.copy_from_slice(&state.window[..out.len()]);
            return Ok(());
        }
        file.read_exact_at(out, offset).map_err(|_| DataUnavailable)
    }

    /// The product's open file, now the most recently read.
    fn file<'a>(&self, files: &'a mut VecDeque<(u64, File)>, data: &FileData) -> Result<&'a File, DataUnavailable> {
        if files.back().is_none_or(|(key, _)| *key != data.key) {
            match files.iter().position(|(key, _)| *key == data.key) {
                Some(position) => {
                    let entry = files.remove(position).ok_or(DataUnavailable)?;
                    files.push_back(entry);
                }
                None => {
                    let file = File::open(&data.path).map_err(|_| DataUnavailable)?;
                    let metadata = file.metadata().map_err(|_| DataUnavailable)?;
                    if metadata.len() != data.len || metadata.modified().ok() != data.modified {
                        return Err(DataUnavailable);
                    }
                    self.reopened.fetch_add(1, Ordering::Relaxed);
                    files.push_back((data.key, file));
                    self.trim(files);
                }
            }
        }
        files.back().map(|(_, file)| file).ok_or(DataUnavailable)
    }
}

/// Hashes a regular file; its bytes are then read back through `files`.
fn hash_file(path: &Arc<Path>, key: u64, files: &Arc<OpenFiles>) -> io::Result<(FileData, [u8; 16])> {
    let mut file = File::open(path)?;
    let (digest, len) = md5_of_reader(&mut file, |_| {})?;
    Ok((file_data(path, key, file, len, files), digest))
}

/// The bytes of a file just hashed (`len` of them): its open file goes into `files`, with the
/// modification time that a reopening checks.
fn file_data(path: &Arc<Path>, key: u64, file: File, len: u64, files: &Arc<OpenFiles>) -> FileData {
    let modified = file.metadata().and_then(|metadata| metadata.modified()).ok();
    files.insert(key, file);
    FileData { key, path: path.clone(), len, modified, files: files.clone() }
}

/// A regular file's bytes, read back by offset through [`OpenFiles`]; its file closes when the
/// sender drops the product (at its release).
struct FileData {
    key: u64,
    path: Arc<Path>,
    len: u64,
    modified: Option<SystemTime>,
    files: Arc<OpenFiles>,
}

impl ProductData for FileData {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<(), DataUnavailable> {
        let end = offset.checked_add(out.len() as u64).ok_or(DataUnavailable)?;
        if end > self.len {
            return Err(DataUnavailable);
        }
        self.files.read_at(self, offset, out)
    }
}

impl Drop for FileData {
    fn drop(&mut self) {
        self.files.remove(self.key);
    }
}

/// A synthetic product's bytes, computed at any offset.
struct SyntheticData {
    position: u64,
    len: u64,
}

impl ProductData for SyntheticData {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<(), DataUnavailable> {
        let end = offset.checked_add(out.len() as u64).ok_or(DataUnavailable)?;
        if end > self.len {
            return Err(DataUnavailable);
        }
        synthetic_fill(self.position, offset, out);
        Ok(())
    }
}

/// The MD5 and length of everything `reader` yields, read in [`READ_CHUNK_BYTES`] chunks, each
/// also handed to `each_chunk`.
fn md5_of_reader(reader: &mut impl Read, mut each_chunk: impl FnMut(&[u8])) -> io::Result<([u8; 16], u64)> {
    let mut hasher = Md5::new();
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    let mut len = 0u64;
    loop {
        let count = match reader.read(&mut chunk) {
            Ok(0) => break,
            Ok(count) => count,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        hasher.update(&chunk[..count]);
        each_chunk(&chunk[..count]);
        len += count as u64;
    }
    Ok((hasher.finalize().into(), len))
}

fn replay_plan(trace: &Path, limit: Option<usize>, speed: Speedup) -> Result<Vec<PlannedInput>, AppError> {
    let text = std::fs::read_to_string(trace)
        .map_err(|error| AppError::Input(format!("cannot read trace {}: {error}: check the path", trace.display())))?;
    let mut entries = ldm7_types::trace::parse_trace(&text)
        .map_err(|error| AppError::Input(format!("{}:{error}", trace.display())))?;
    if entries.is_empty() {
        return Err(AppError::Input(format!("trace {} holds no products", trace.display())));
    }
    if let Some(limit) = limit {
        entries.truncate(limit);
    }
    let first = entries.first().map_or(0, |entry| entry.created.as_unix_micros());
    Ok(entries
        .iter()
        .enumerate()
        .map(|(position, entry)| {
            let due = (speed.factor() > 0.0).then(|| {
                let micros = (entry.created.as_unix_micros() - first).max(0) as f64;
                Duration::try_from_secs_f64(micros / 1e6 / speed.factor()).unwrap_or(Duration::MAX)
            });
            PlannedInput { kind: InputKind::Synthetic { position: position as u64, len: u64::from(entry.size) }, due }
        })
        .collect())
}

/// Bytes `[offset, offset + out.len())` of the synthetic content of the product at `position`:
/// the workspace's one content generator (`ldm7_types::content`), run seed `0x5eed`.
pub(super) fn synthetic_fill(position: u64, offset: u64, out: &mut [u8]) {
    ldm7_types::content::fill(ldm7_types::content::product_seed(0x5eed, position), offset, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_products_differ_by_position() {
        let (mut a, mut b) = (vec![0u8; 100], vec![0u8; 100]);
        synthetic_fill(0, 0, &mut a);
        synthetic_fill(1, 0, &mut b);
        assert_ne!(a, b, "positions differ");
    }

    #[test]
    fn files_hashed_side_by_side_have_their_own_md5() {
        let dir = tempfile::tempdir().expect("tempdir");
        let chunk = READ_CHUNK_BYTES;
        // Empty, short, chunk-edge and multi-chunk files (rounds with several full chunks, with
        // a lone one, with none), and a file that is not there.
        let sizes = [0, 1, chunk - 1, chunk, chunk + 1, 3 * chunk + 5, 2 * chunk, 9 * chunk / 2];
        let mut paths = Vec::new();
        let mut contents = Vec::new();
        for (at, &size) in sizes.iter().enumerate() {
            let bytes: Vec<u8> = (0..size as u64).map(|i| (i * 131 + at as u64 * 7 + i / 251) as u8).collect();
            let path: Arc<Path> = Arc::from(dir.path().join(format!("f{at}")).as_path());
            std::fs::write(&path, &bytes).expect("write");
            paths.push(path);
            contents.push(bytes);
        }
        let missing: Arc<Path> = Arc::from(dir.path().join("missing").as_path());
        for count in 1..=paths.len() {
            let mut batch: Vec<&Arc<Path>> = paths[..count].iter().collect();
            batch.push(&missing);
            let hashed = hash_files(&batch);
            for (at, result) in hashed.iter().enumerate().take(count) {
                let (_, digest, len) = result.as_ref().expect("hashed");
                assert_eq!(*len, contents[at].len() as u64, "file {at} of {count}");
                assert_eq!(digest.as_slice(), Md5::digest(&contents[at]).as_slice(), "file {at} of {count}");
            }
            assert!(hashed[count].is_err(), "the missing file");
        }
        // A batch as `fmtp send` takes one: regular files up to the bounds, in order.
        let planned = paths.iter().map(|path| PlannedInput { kind: InputKind::File(path.clone()), due: None });
        let mut inputs = planned.enumerate().map(|(key, input)| (key as u64, input)).peekable();
        let batch = next_batch(&mut inputs);
        assert_eq!(
            batch.iter().map(|(key, _)| *key).collect::<Vec<_>>(),
            (0..HASH_BATCH_FILES as u64).collect::<Vec<_>>()
        );
        let files = Arc::new(OpenFiles::default());
        for ((key, _), prepared) in batch.iter().zip(prepare_batch(&batch, &files)) {
            let prepared = prepared.expect("prepared");
            let bytes = &contents[*key as usize];
            assert_eq!(prepared.product.metadata(), Md5::digest(bytes).as_slice());
            assert_eq!(prepared.len, bytes.len() as u64);
        }
    }

    #[test]
    fn a_batch_stops_at_its_bytes_and_at_other_inputs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = |name: &str, len: u64| {
            let path = dir.path().join(name);
            std::fs::File::create(&path).and_then(|file| file.set_len(len)).expect("file");
            PlannedInput { kind: InputKind::File(Arc::from(path.as_path())), due: None }
        };
        let stream = PlannedInput { kind: InputKind::Stream(PathBuf::from("/dev/null")), due: None };
        let third = HASH_BATCH_BYTES / 3;
        let planned = vec![
            file("a", third),
            file("b", third),
            file("c", third),
            file("d", 10),
            stream,
            file("e", 10),
            file("f", HASH_BATCH_BYTES * 2),
        ];
        let mut inputs = planned.into_iter().enumerate().map(|(key, input)| (key as u64, input)).peekable();
        let mut batches = Vec::new();
        loop {
            let batch = next_batch(&mut inputs);
            if batch.is_empty() {
                break;
            }
            batches.push(batch.iter().map(|(key, _)| *key).collect::<Vec<_>>());
        }
        assert_eq!(batches, vec![vec![0, 1, 2], vec![3], vec![4], vec![5], vec![6]]);
    }

    #[test]
    fn files_are_hashed_then_read_back_by_offset_within_the_open_files_bound() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = Arc::new(OpenFiles::default());
        let mut inputs = Vec::new();
        for key in 0..(OPEN_FILES_MAX as u64 + 3) {
            let bytes: Vec<u8> = (0..5000u64).map(|i| (i * 31 + key) as u8).collect();
            let path: Arc<Path> = Arc::from(dir.path().join(format!("p{key}")).as_path());
            std::fs::write(&path, &bytes).expect("write");
            let (data, digest) = hash_file(&path, key, &files).expect("hash");
            assert_eq!((data.len, digest.as_slice()), (5000, Md5::digest(&bytes).as_slice()));
            inputs.push((data, bytes));
        }
        assert_eq!(files.lock().files.len(), OPEN_FILES_MAX, "the bound holds");
        let mut out = vec![0u8; 1448];
        // The first files were closed for the bound: reading them opens them again.
        for (data, bytes) in &inputs {
            data.read_at(1448, &mut out).expect("read back");
            assert_eq!(out, bytes[1448..2896]);
            assert_eq!(data.read_at(4000, &mut out), Err(DataUnavailable), "past the end");
            assert!(files.lock().files.len() <= OPEN_FILES_MAX);
        }
        assert!(files.reopened() >= 3, "{}", files.reopened());
        // Blocks in order (through the read-ahead window), with repairs of others in between.
        let (data, bytes) = &inputs[5];
        let mut block = 0;
        while block * 1448 < bytes.len() {
            let start = block * 1448;
            let mut out = vec![0u8; 1448.min(bytes.len() - start)];
            data.read_at(start as u64, &mut out).expect("block");
            assert_eq!(out, bytes[start..start + out.len()], "block {block}");
            if block % 2 == 1 {
                let (other, other_bytes) = &inputs[block];
                let mut repair = vec![0u8; 100];
                other.read_at(77, &mut repair).expect("repair");
                assert_eq!(repair, other_bytes[77..177]);
            }
            block += 1;
        }
        drop(inputs);
        assert!(files.lock().files.is_empty(), "released products close their files");
    }

    #[test]
    fn a_file_changed_after_hashing_is_not_read_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path: Arc<Path> = Arc::from(dir.path().join("p").as_path());
        std::fs::write(&path, vec![1u8; 4000]).expect("write");
        let files = Arc::new(OpenFiles::default());
        let (data, _) = hash_file(&path, 0, &files).expect("hash");
        let mut out = vec![0u8; 100];
        data.read_at(0, &mut out).expect("unchanged: readable");
        files.remove(0); // as if closed for the bound
        std::fs::write(&path, vec![2u8; 5000]).expect("rewrite");
        assert_eq!(data.read_at(0, &mut out), Err(DataUnavailable));
    }

    #[test]
    fn a_pipe_is_read_whole_at_its_turn_and_a_directory_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let error = plan(&ProductSource::Files(vec![dir.path().to_owned()])).expect_err("a directory");
        assert!(error.is_input() && error.to_string().contains("a directory"), "{error}");
        let plan = plan(&ProductSource::Files(vec!["/dev/null".into()])).expect("a device");
        assert!(matches!(plan.inputs[0].kind, InputKind::Stream(_)));
        let files = Arc::new(OpenFiles::default());
        let ready = prepare(&plan.inputs[0], 0, &files).expect("read /dev/null");
        assert_eq!((ready.len, ready.product.metadata()), (0, Md5::digest(b"").as_slice()));
    }
}
