//! The outputs of the actions: files (FILE, STDIOFILE), databases (DBFILE) and decoders (PIPE)
//! kept open between products, keyed by the action, its options and its expanded arguments,
//! as pqact keeps them; the least recently used is closed when [`Outputs::max_open`] are open
//! and one more is needed, and one unused for six hours is closed when the queue is idle.
//! EXEC programs are started (and reaped) here too.
//!
//! A failing output never stops the others: its error is logged (once per output until it
//! works again), counted, and the output is closed so the next product opens it afresh.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ldm7_types::ProdInfo;
use redb::ReadableTable;

use super::conf::{ActionKind, Entry, Options};
use super::edex::Edex;
use super::output::{metadata_record, remove_wmo, strip_control};
use super::pipe::{Decoder, Ending, Leftovers, Programs};

/// An output unused this long is closed when the queue is idle (as pqact does).
pub const IDLE_CLOSE: Duration = Duration::from_secs(6 * 3600);

/// Counts of what the actions did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ActCounters {
    /// Actions that completed.
    pub done: u64,
    /// Actions that failed (logged).
    pub failed: u64,
    /// FILE writes refused for want of room (`ENOSPC`, `EDQUOT`), each held and tried again.
    pub no_room: u64,
    /// Products a decoder never took, after a second decoder was tried.
    pub pipe_dropped: u64,
    /// Decoders started.
    pub decoders_started: u64,
    /// Outputs closed to stay under the open-output bound.
    pub closed_lru: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    kind: ActionKind,
    options: Options,
    args: Vec<String>,
}

#[derive(Debug)]
enum Output {
    File(File),
    Stdio(BufWriter<File>),
    Db(redb::Database),
    Pipe(Decoder),
}

#[derive(Debug)]
struct Slot {
    output: Output,
    last_use: u64,
    last_time: Instant,
}

/// The open outputs and the running programs.
#[derive(Debug)]
pub struct Outputs {
    open: HashMap<Key, Slot>,
    max_open: usize,
    uses: u64,
    pipe_timeout: Duration,
    edex: Option<Edex>,
    programs: Programs,
    /// Outputs whose failure was logged and that have not worked since.
    failing: HashSet<String>,
    /// Leftovers of decoders that ended, for the next one with the same command.
    leftovers: HashMap<Key, Leftovers>,
    /// Decoders whose input is closed, until they exit.
    ending: Vec<Ending>,
    counters: ActCounters,
}

const DB_TABLE: redb::TableDefinition<'static, &[u8], &[u8]> = redb::TableDefinition::new("products");

impl Outputs {
    /// Outputs that keep at most `max_open` open; a decoder that takes no input for
    /// `pipe_timeout` while products wait is given up; `edex` receives `-edex` notifications.
    pub fn new(max_open: usize, pipe_timeout: Duration, edex: Option<Edex>) -> Self {
        Self {
            open: HashMap::new(),
            max_open: max_open.max(1),
            uses: 0,
            pipe_timeout,
            edex,
            programs: Programs::default(),
            failing: HashSet::new(),
            leftovers: HashMap::new(),
            ending: Vec::new(),
            counters: ActCounters::default(),
        }
    }

    /// What the actions did so far.
    pub fn counters(&self) -> ActCounters {
        self.counters
    }

    /// Runs `entry`'s action with its expanded `args` for a product. A failure is logged and
    /// counted. A FILE write the file system has no room for is undone and reported as
    /// [`Ran::NoRoom`], for the caller to try again once there is room: nothing is lost to a
    /// full disk while the queue still holds the product.
    pub fn run(&mut self, entry: &Entry, args: &[String], info: &ProdInfo, data: &[u8]) -> Ran {
        let kind = entry.action.kind;
        let options = &entry.action.options;
        let name = describe(kind, args);
        let result = match kind {
            ActionKind::Noop => Ok(()),
            _ if args.is_empty() => Err(format!("no arguments after expansion ({})", entry.source)),
            ActionKind::Exec => self.exec(args, options.wait),
            ActionKind::File | ActionKind::StdioFile | ActionKind::DbFile | ActionKind::Pipe => {
                // A database is one output whatever the key an entry stores under (it can be
                // opened once per process).
                let key = if kind == ActionKind::DbFile {
                    Key { kind, options: Options::default(), args: args[..1].to_vec() }
                } else {
                    Key { kind, options: options.clone(), args: args.to_vec() }
                };
                self.put(&key, options, args, info, data)
            }
        };
        match result {
            Ok(()) => {
                self.counters.done += 1;
                if self.failing.remove(&name) {
                    tracing::info!("act: {name} works again");
                }
                Ran::Done
            }
            Err(error) if error.starts_with(NO_ROOM) => {
                self.counters.no_room += 1;
                if self.failing.insert(name.clone()) {
                    tracing::error!(
                        "act: {name}: {error} (product {}); holding this product until there is room",
                        info.ident
                    );
                }
                Ran::NoRoom
            }
            Err(error) => {
                self.counters.failed += 1;
                let message = format!("act: {name}: {error} (product {})", info.ident);
                if self.failing.insert(name) {
                    tracing::error!("{message}");
                } else {
                    tracing::debug!("{message}");
                }
                Ran::Failed
            }
        }
    }

    fn exec(&mut self, args: &[String], wait: bool) -> Result<(), String> {
        match self.programs.run(args, wait) {
            Ok(true) => Ok(()),
            Ok(false) => Err("the program failed".to_owned()),
            Err(error) => Err(error.to_string()),
        }
    }

    fn put(
        &mut self,
        key: &Key,
        options: &Options,
        args: &[String],
        info: &ProdInfo,
        data: &[u8],
    ) -> Result<(), String> {
        let body = body(options, data);
        let result = self.with_output(key, |output, timeout| match output {
            Output::File(file) => write_file(file, options, info, &body).map_err(|error| {
                // Only a regular file waits for room: a device that is always full
                // (`/dev/full`) fails as any other output does.
                if is_no_room(&error) && file.metadata().is_ok_and(|meta| meta.is_file()) {
                    PutError::NoRoom(error.to_string())
                } else {
                    PutError::io(error)
                }
            }),
            Output::Stdio(writer) => write_stdio(writer, options, info, &body).map_err(PutError::io),
            Output::Db(db) => {
                let db_key = args.get(1).map_or(info.ident.as_bytes(), String::as_bytes);
                store(db, db_key, &body).map_err(PutError::Output)
            }
            Output::Pipe(decoder) => {
                let mut bytes = Vec::new();
                if options.metadata || options.nodata {
                    bytes.extend_from_slice(&metadata_record(info, body.len() as u32));
                }
                if !options.nodata {
                    bytes.extend_from_slice(&body);
                }
                decoder.send(bytes, timeout).map_err(PutError::Decoder)?;
                if options.flush {
                    decoder.drain(timeout);
                }
                Ok(())
            }
        });
        match result {
            Err(PutError::Decoder(bytes)) => {
                // The decoder ended: the next one gets what it did not take, and this product.
                self.close(key);
                self.retry_pipe(key, options, bytes)
            }
            Err(PutError::Output(message)) => {
                self.close(key);
                Err(message)
            }
            Err(PutError::NoRoom(message)) => {
                self.close(key);
                Err(format!("{NO_ROOM}: {message}"))
            }
            Ok(()) => {
                if options.log {
                    let verb = if key.kind == ActionKind::StdioFile { "StdioFiled" } else { "Filed" };
                    tracing::info!("{verb} in \"{}\": {}", key.args.last().map_or("", String::as_str), info);
                }
                if options.edex
                    && key.kind == ActionKind::File
                    && let (Some(edex), Some(path)) = (self.edex.as_mut(), key.args.last())
                    && let Err(error) = edex.announce(path, &info.ident)
                {
                    tracing::warn!("act: cannot notify EDEX of {path}: {error}");
                }
                if options.close {
                    self.close(key);
                }
                Ok(())
            }
        }
    }

    fn retry_pipe(&mut self, key: &Key, options: &Options, bytes: Vec<u8>) -> Result<(), String> {
        let result = self.with_output(key, |output, timeout| match output {
            Output::Pipe(decoder) => decoder.send(bytes, timeout).map_err(PutError::Decoder),
            _ => Ok(()),
        });
        match result {
            Ok(()) => {
                if options.close {
                    self.close(key);
                }
                Ok(())
            }
            Err(PutError::Decoder(_)) | Err(PutError::Output(_)) | Err(PutError::NoRoom(_)) => {
                self.close(key);
                Err("the decoder ended twice for this product".to_owned())
            }
        }
    }

    /// Opens the output of `key` if needed and hands it to `write`.
    fn with_output(
        &mut self,
        key: &Key,
        write: impl FnOnce(&mut Output, Duration) -> Result<(), PutError>,
    ) -> Result<(), PutError> {
        self.uses += 1;
        if !self.open.contains_key(key) {
            while self.open.len() >= self.max_open {
                self.close_least_recent();
            }
            let output = self.open_output(key).map_err(PutError::Output)?;
            self.open.insert(key.clone(), Slot { output, last_use: 0, last_time: Instant::now() });
        }
        let slot = self.open.get_mut(key).expect("just opened");
        slot.last_use = self.uses;
        slot.last_time = Instant::now();
        write(&mut slot.output, self.pipe_timeout)
    }

    fn open_output(&mut self, key: &Key) -> Result<Output, String> {
        let path = || Path::new(key.args.last().map_or("", String::as_str));
        match key.kind {
            ActionKind::File => open_file(path(), key.options.overwrite).map(Output::File),
            ActionKind::StdioFile => open_file(path(), key.options.overwrite)
                .map(|file| Output::Stdio(BufWriter::with_capacity(64 << 10, file))),
            ActionKind::DbFile => open_db(Path::new(&key.args[0])).map(Output::Db),
            ActionKind::Pipe => {
                let leftovers = self.leftovers.remove(key).unwrap_or_default();
                self.counters.decoders_started += 1;
                Decoder::start(&key.args, leftovers).map(Output::Pipe).map_err(|error| error.to_string())
            }
            ActionKind::Noop | ActionKind::Exec => unreachable!("not kept open"),
        }
    }

    fn close_least_recent(&mut self) {
        let Some(key) = self.open.iter().min_by_key(|(_, slot)| slot.last_use).map(|(key, _)| key.clone()) else {
            return;
        };
        self.counters.closed_lru += 1;
        tracing::debug!("act: closing the least recently used output {}", describe(key.kind, &key.args));
        self.close(&key);
    }

    /// Closes one output (a decoder: its input ends; what it did not take waits for the next).
    fn close(&mut self, key: &Key) {
        let Some(slot) = self.open.remove(key) else { return };
        match slot.output {
            Output::File(_) => {}
            Output::Stdio(mut writer) => {
                if let Err(error) = writer.flush() {
                    tracing::error!("act: {}: {error}", describe(key.kind, &key.args));
                    self.counters.failed += 1;
                }
            }
            Output::Db(db) => drop(db),
            Output::Pipe(decoder) => {
                let (leftovers, dropped, ending) = decoder.end(self.pipe_timeout);
                self.ending.retain(|ending| !ending.has_exited());
                self.ending.push(ending);
                self.counters.pipe_dropped += dropped as u64;
                if !leftovers.is_empty() {
                    self.leftovers.insert(key.clone(), leftovers);
                }
            }
        }
    }

    /// While the queue is idle: flushes buffered files, gives up stalled decoders, closes
    /// outputs unused for [`IDLE_CLOSE`], reaps EXEC programs.
    pub fn idle(&mut self) {
        let mut to_close = Vec::new();
        for (key, slot) in &mut self.open {
            match &mut slot.output {
                Output::Stdio(writer) => {
                    if writer.flush().is_err() {
                        to_close.push(key.clone());
                    }
                }
                Output::Pipe(decoder) => {
                    if decoder.is_stalled(self.pipe_timeout) {
                        decoder.give_up(self.pipe_timeout);
                    }
                    if decoder.is_dead() {
                        to_close.push(key.clone());
                    }
                }
                Output::File(_) | Output::Db(_) => {}
            }
            if slot.last_time.elapsed() >= IDLE_CLOSE {
                to_close.push(key.clone());
            }
        }
        for key in to_close {
            self.close(&key);
        }
        // What ended decoders did not take goes to new ones now, not with the next product.
        let pending: Vec<Key> = self.leftovers.keys().cloned().collect();
        for key in pending {
            self.reopen(&key);
        }
        self.programs.reap();
    }

    /// Opens the output of `key` again (a decoder for leftovers), logging a failure.
    fn reopen(&mut self, key: &Key) -> bool {
        match self.open_output(key) {
            Ok(output) => {
                self.open.insert(key.clone(), Slot { output, last_use: self.uses, last_time: Instant::now() });
                true
            }
            Err(error) => {
                tracing::error!("act: {}: {error}", describe(key.kind, &key.args));
                false
            }
        }
    }

    /// Closes everything: files flushed, decoders given the end of their input (and the time
    /// of the pipe timeout to take what waits for them).
    pub fn close_all(&mut self) {
        let keys: Vec<Key> = self.open.keys().cloned().collect();
        for key in keys {
            self.close(&key);
        }
        // Leftovers of decoders that ended get one more decoder each.
        let pending: Vec<Key> = self.leftovers.keys().cloned().collect();
        for key in pending {
            if self.reopen(&key) {
                self.close(&key);
            }
        }
        // Decoders get the pipe timeout to finish what they were given.
        let deadline = Instant::now() + self.pipe_timeout;
        let still = self.ending.drain(..).filter(|ending| !ending.wait(deadline)).count();
        if still > 0 {
            tracing::warn!(
                "act: {still} decoder(s) still running {:?} after the end of their input",
                self.pipe_timeout
            );
        }
        let dropped: usize = self.leftovers.drain().map(|(_, leftovers)| leftovers.len()).sum();
        if dropped > 0 {
            self.counters.pipe_dropped += dropped as u64;
            tracing::error!("act: {dropped} product(s) were never taken by their decoders");
        }
        self.programs.reap();
    }
}

#[derive(Debug)]
enum PutError {
    Output(String),
    /// A FILE write without room, undone.
    NoRoom(String),
    Decoder(Vec<u8>),
}

/// What running one action for one product came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ran {
    /// It completed.
    Done,
    /// It failed (logged and counted); the product is not tried again.
    Failed,
    /// A FILE write the file system had no room for; undone, to be tried again.
    NoRoom,
}

/// How a no-room error's message begins.
const NO_ROOM: &str = "no room";

fn is_no_room(error: &std::io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

impl PutError {
    fn io(error: std::io::Error) -> Self {
        Self::Output(error.to_string())
    }
}

fn describe(kind: ActionKind, args: &[String]) -> String {
    format!("{} {}", kind.name(), args.join(" "))
}

/// The product's bytes as the options want them: `-removewmo`, then `-strip`.
fn body<'d>(options: &Options, data: &'d [u8]) -> Cow<'d, [u8]> {
    let data = if options.removewmo { remove_wmo(data) } else { data };
    if options.strip { Cow::Owned(strip_control(data)) } else { Cow::Borrowed(data) }
}

/// Opens (creating it and its directories as needed) a FILE or STDIOFILE output: appending,
/// or from the start with `-overwrite`.
fn open_file(path: &Path, overwrite: bool) -> Result<File, String> {
    if path.as_os_str().is_empty() {
        return Err("no file name".into());
    }
    let mut options = OpenOptions::new();
    options.write(true).create(true).mode(0o666);
    if overwrite {
        options.truncate(true);
    } else {
        options.append(true);
    }
    let opened = match options.open(path) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let parent = path.parent().filter(|parent| !parent.as_os_str().is_empty()).map(PathBuf::from);
            if let Some(parent) = parent {
                std::fs::create_dir_all(&parent)
                    .map_err(|error| format!("cannot create the directory {}: {error}", parent.display()))?;
            }
            options.open(path)
        }
        other => other,
    };
    opened.map_err(|error| format!("cannot open: {error}"))
}

/// Writes a product to a FILE or STDIOFILE output: from the start and truncated after it with
/// `-overwrite` (`truncate` cuts the file at the position given), the metadata record first with
/// `-metadata`.
fn write_product<W: Write + Seek>(
    out: &mut W,
    options: &Options,
    info: &ProdInfo,
    body: &[u8],
    truncate: impl FnOnce(&mut W, u64) -> std::io::Result<()>,
) -> std::io::Result<()> {
    if options.overwrite {
        out.seek(SeekFrom::Start(0))?;
    }
    if options.metadata {
        out.write_all(&metadata_record(info, body.len() as u32))?;
    }
    out.write_all(body)?;
    if options.overwrite {
        let end = out.stream_position()?;
        truncate(out, end)?;
    }
    Ok(())
}

/// FILE: `-flush` syncs to the disk. An append that fails part-way is cut back to where it began,
/// so a product tried again is not filed twice.
fn write_file(file: &mut File, options: &Options, info: &ProdInfo, body: &[u8]) -> std::io::Result<()> {
    let began = if options.overwrite { None } else { file.metadata().ok().map(|meta| meta.len()) };
    let written = write_product(file, options, info, body, |file, end| file.set_len(end))
        .and_then(|()| if options.flush { file.sync_all() } else { Ok(()) });
    if written.is_err()
        && let Some(began) = began
    {
        let _ = file.set_len(began);
    }
    written
}

/// STDIOFILE: `-flush` (and `-close`) empty the buffer.
fn write_stdio(writer: &mut BufWriter<File>, options: &Options, info: &ProdInfo, body: &[u8]) -> std::io::Result<()> {
    // `stream_position` on a buffered writer writes its buffer out first.
    write_product(writer, options, info, body, |writer, end| writer.get_ref().set_len(end))?;
    if options.flush || options.close {
        writer.flush()?;
    }
    Ok(())
}

fn open_db(path: &Path) -> Result<redb::Database, String> {
    if let Some(parent) = path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .map_err(|error| format!("cannot create the directory {}: {error}", parent.display()))?;
    }
    redb::Database::create(path).map_err(|error| format!("cannot open the database: {error}"))
}

/// Stores a product under `key`; a product under a key already present is appended to what is
/// there (as pqact's gdbm store concatenates).
fn store(db: &redb::Database, key: &[u8], body: &[u8]) -> Result<(), String> {
    let mut txn = db.begin_write().map_err(text)?;
    txn.set_durability(redb::Durability::Eventual);
    {
        let mut table = txn.open_table(DB_TABLE).map_err(text)?;
        let joined = match table.get(key).map_err(text)? {
            Some(old) => [old.value(), body].concat(),
            None => body.to_vec(),
        };
        table.insert(key, joined.as_slice()).map_err(text)?;
    }
    txn.commit().map_err(text)
}

fn text(error: impl std::fmt::Display) -> String {
    error.to_string()
}

/// Reads what a DBFILE entry stored under `key` (for tests and tools).
pub fn db_get(path: &Path, key: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let db = redb::Database::open(path).map_err(text)?;
    let txn = db.begin_read().map_err(text)?;
    let table = txn.open_table(DB_TABLE).map_err(text)?;
    Ok(table.get(key).map_err(text)?.map(|value| value.value().to_vec()))
}
