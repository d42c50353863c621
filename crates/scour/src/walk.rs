//! The scour of resolved entries, in parallel: every entry at once, and within an entry every
//! subdirectory (and large directories' files in chunks) as tasks of one rayon pool, so that
//! the machine's cores and the disk's queue are kept busy. Every system call is relative to an
//! open directory (`openat`, `fstatat`, `unlinkat`): no path is looked up twice.
//!
//! What is deleted is what LDM 6.15's scour deletes (checked against its binary: the
//! integration test `scour::` of the cli crate), entry by entry:
//!
//! - a regular file whose name matches the pattern and whose modification time (whole seconds)
//!   is at or before now − AGE, in the directory and every subdirectory;
//! - a symbolic link, whatever its name: when its target cannot be reached (broken, a loop) the
//!   link; when its target's modification time is at or before now − AGE, the target (a file,
//!   or an empty directory) and the link. Links are never followed into directories. (A relative
//!   target is resolved from the link's directory; LDM resolves it from its working directory,
//!   which removes links whose targets it cannot find there.)
//! - with `-d`, every subdirectory that is empty once scoured (not a directory excluded), and
//!   the top directory itself when it was empty before the scour (a symbolic link as top: the
//!   link);
//! - nothing in or of an excluded directory.
//!
//! Other kinds of files (FIFOs, sockets, devices) are left alone with a warning. A file that
//! vanishes meanwhile (another entry on the same directory, a decoder) is not an error.

use std::ffi::{CStr, CString, OsStr};
use std::fmt;
use std::ops::ControlFlow;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ldm7_io::log_target::PRODUCT;
use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag, fstatat};
use nix::unistd::{UnlinkatFlags, unlinkat};
use rayon::prelude::*;
use tracing::{debug, error, info, warn};

use crate::age::Age;
use crate::conf::Excludes;
use crate::pattern::Pattern;
use crate::sentinel;

/// Files of one directory handled by one task; a directory with more is split.
const FILES_PER_TASK: usize = 512;

/// Most names of one directory held at once: larger directories are read and scoured a batch
/// at a time.
pub(crate) const NAMES_PER_BATCH: usize = 65_536;

/// Stack of each worker thread: the walk recurses once per directory level.
const STACK_BYTES: usize = 8 << 20;

/// One directory to scour.
#[derive(Debug, Clone)]
pub struct Job {
    /// The directory: absolute and normalized ([`crate::conf::Resolver::resolve`]).
    pub directory: PathBuf,
    /// Files at least this old are deleted.
    pub age: Age,
    /// Only files whose names match.
    pub pattern: Pattern,
    /// Where the entry comes from, for messages (`etc/scour.conf:3`).
    pub origin: String,
}

/// How every job is run.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Remove directories that are or become empty (`-d`).
    pub delete_dirs: bool,
    /// Directories neither scoured nor removed (`-e`).
    pub excludes: Excludes,
    /// Keep a `.scour<PATTERN>` file at the top of each directory and delete nothing when no
    /// matching file arrived since it was touched (LDM's scour.sh rule; not LDM 6.15's binary).
    pub sentinel: bool,
    /// The time ages count back from, seconds since the epoch.
    pub now_secs: i64,
}

/// What one job did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Regular files deleted.
    pub files_deleted: u64,
    /// Their bytes (and those of link targets deleted).
    pub bytes_deleted: u64,
    /// Empty directories removed (`-d`).
    pub directories_removed: u64,
    /// Symbolic links removed.
    pub links_removed: u64,
    /// Targets of symbolic links removed.
    pub link_targets_removed: u64,
    /// Failures (each logged).
    pub errors: u64,
}

impl Counts {
    fn add(mut self, other: Counts) -> Counts {
        self.files_deleted += other.files_deleted;
        self.bytes_deleted += other.bytes_deleted;
        self.directories_removed += other.directories_removed;
        self.links_removed += other.links_removed;
        self.link_targets_removed += other.link_targets_removed;
        self.errors += other.errors;
        self
    }
}

/// How a job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Scoured.
    Scoured,
    /// The directory is in the excludes file.
    Excluded,
    /// `--sentinel`: no new matching file since the last scour; nothing deleted.
    Stale,
    /// The directory could not be opened.
    Failed,
}

/// What a job did, for the log.
#[derive(Debug, Clone)]
pub struct Report {
    /// The directory.
    pub directory: PathBuf,
    /// The age.
    pub age: Age,
    /// The pattern.
    pub pattern: String,
    /// How it ended.
    pub outcome: Outcome,
    /// What was removed.
    pub counts: Counts,
    /// How long it took.
    pub elapsed: Duration,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = format!("{} ({}, {})", self.directory.display(), self.age, self.pattern);
        let counts = &self.counts;
        match self.outcome {
            Outcome::Excluded => write!(f, "{what}: excluded"),
            Outcome::Stale => write!(f, "{what}: no new file since the last scour, nothing deleted"),
            Outcome::Failed => write!(f, "{what}: could not be opened"),
            Outcome::Scoured => write!(
                f,
                "{what}: {} files deleted ({:.1} MB), {} links and {} of their targets, {} directories removed, {} errors, in {:.3} s",
                counts.files_deleted,
                counts.bytes_deleted as f64 / 1e6,
                counts.links_removed,
                counts.link_targets_removed,
                counts.directories_removed,
                counts.errors,
                self.elapsed.as_secs_f64()
            ),
        }
    }
}

/// The worker pool cannot be started.
#[derive(Debug, thiserror::Error)]
#[error("cannot start {threads} scour threads: {source}")]
pub struct PoolError {
    threads: usize,
    source: rayon::ThreadPoolBuildError,
}

/// Most worker threads by default.
const THREADS_DEFAULT_MAX: usize = 64;

/// The default number of worker threads: eight per core, at most [`THREADS_DEFAULT_MAX`].
/// Deleting waits off the CPU for the file system more than it computes: on two
/// cores, 100,000 files half old (`ldm7 bench scour --files 100000 --dirs 1000 --threads N`)
/// took 1.96 s with 2 threads, 1.39 s with 4, 1.06 s with 8, 0.85–0.96 s with 16 and no less
/// with 32 or 64 (docs/operations.md).
pub fn threads_default() -> usize {
    (std::thread::available_parallelism().map_or(2, usize::from) * 8).min(THREADS_DEFAULT_MAX)
}

/// Runs every job on a pool of `threads` workers; one report per job, in order.
pub fn scour(jobs: &[Job], options: &Options, threads: usize) -> Result<Vec<Report>, PoolError> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .stack_size(STACK_BYTES)
        .thread_name(|index| format!("scour-{index}"))
        .build()
        .map_err(|source| PoolError { threads, source })?;
    Ok(pool.install(|| jobs.par_iter().map(|job| scour_job(job, options)).collect()))
}

/// Runs one job in the current pool.
pub fn scour_job(job: &Job, options: &Options) -> Report {
    let started = Instant::now();
    let report = |outcome, counts| Report {
        directory: job.directory.clone(),
        age: job.age,
        pattern: job.pattern.to_string(),
        outcome,
        counts,
        elapsed: started.elapsed(),
    };
    if options.excludes.contains(&job.directory) {
        info!(target: PRODUCT, "{}: {} is excluded", job.origin, job.directory.display());
        return report(Outcome::Excluded, Counts::default());
    }
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let dir = match Dir::open(&job.directory, flags, Mode::empty()) {
        Ok(dir) => dir,
        Err(errno) => {
            error!("{}: cannot open directory {}: {}", job.origin, job.directory.display(), errno.desc());
            return report(Outcome::Failed, Counts { errors: 1, ..Counts::default() });
        }
    };
    if options.sentinel && sentinel::is_stale(job, &options.excludes) {
        return report(Outcome::Stale, Counts::default());
    }
    let walk = Walk {
        pattern: &job.pattern,
        cutoff_secs: options.now_secs.saturating_sub(i64::try_from(job.age.seconds()).unwrap_or(i64::MAX)),
        delete_dirs: options.delete_dirs,
        excludes: &options.excludes,
    };
    debug!(
        "{}: scouring {} for files matching {} modified at or before {} s",
        job.origin,
        job.directory.display(),
        job.pattern,
        walk.cutoff_secs
    );
    let (mut counts, was_empty) = walk.directory(dir, &job.directory);
    if options.sentinel {
        sentinel::touch(job);
    } else if options.delete_dirs && was_empty {
        counts = counts.add(remove_top(&job.directory));
    }
    report(Outcome::Scoured, counts)
}

/// LDM removes the top directory with remove(3) when it was empty before the scour: a
/// symbolic link is unlinked, a directory removed.
fn remove_top(path: &Path) -> Counts {
    let is_link = std::fs::symlink_metadata(path).is_ok_and(|metadata| metadata.file_type().is_symlink());
    let removed = if is_link { std::fs::remove_file(path) } else { std::fs::remove_dir(path) };
    match removed {
        Ok(()) => {
            info!(target: PRODUCT, "removed empty directory {}", path.display());
            Counts { directories_removed: 1, ..Counts::default() }
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Counts::default(),
        Err(error) if error.raw_os_error() == Some(libc::ENOTEMPTY) => Counts::default(),
        Err(error) => {
            warn!("cannot remove empty directory {}: {error}", path.display());
            Counts { errors: 1, ..Counts::default() }
        }
    }
}

/// Entries of one directory, by kind: a batch of at most [`NAMES_PER_BATCH`] names.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    pub(crate) files: Vec<CString>,
    pub(crate) links: Vec<CString>,
    pub(crate) directories: Vec<CString>,
}

impl Listing {
    fn len(&self) -> usize {
        self.files.len() + self.links.len() + self.directories.len()
    }

    fn clear(&mut self) {
        self.files.clear();
        self.links.clear();
        self.directories.clear();
    }
}

/// Reads a directory's entries and hands them to `take` in batches of at most `batch_max` names
/// ([`NAMES_PER_BATCH`]; each batch handled before more is read: a directory of millions of
/// files is never held whole), until `take` breaks; whether the directory held nothing but
/// `.` and `..`. The kind of an entry comes from the directory entry itself where the file
/// system gives it (no `stat`), else from `fstatat` on `fd` (the directory, opened apart from
/// the stream being read).
pub(crate) fn for_each_batch(
    dir: &mut Dir,
    fd: BorrowedFd<'_>,
    path: &Path,
    batch_max: usize,
    errors: &mut u64,
    mut take: impl FnMut(&Listing) -> ControlFlow<()>,
) -> bool {
    let mut listing = Listing::default();
    let mut empty = true;
    for entry in dir.iter() {
        let entry = match entry {
            Ok(entry) => entry,
            Err(errno) => {
                warn!("cannot read directory {}: {}", path.display(), errno.desc());
                *errors += 1;
                break;
            }
        };
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        empty = false;
        let kind = match entry.file_type() {
            Some(Type::File) => Some(SFlag::S_IFREG),
            Some(Type::Symlink) => Some(SFlag::S_IFLNK),
            Some(Type::Directory) => Some(SFlag::S_IFDIR),
            Some(_) => None,
            None => match fstatat(fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(stat) => Some(kind(stat)),
                Err(Errno::ENOENT) => continue,
                Err(errno) => {
                    warn!("cannot look at {}: {}", joined(path, name).display(), errno.desc());
                    *errors += 1;
                    continue;
                }
            },
        };
        match kind {
            Some(SFlag::S_IFREG) => listing.files.push(name.to_owned()),
            Some(SFlag::S_IFLNK) => listing.links.push(name.to_owned()),
            Some(SFlag::S_IFDIR) => listing.directories.push(name.to_owned()),
            _ => leave_alone(path, name),
        }
        if listing.len() >= batch_max {
            if take(&listing).is_break() {
                return empty;
            }
            listing.clear();
        }
    }
    if listing.len() > 0 {
        let _ = take(&listing);
    }
    empty
}

fn leave_alone(path: &Path, name: &CStr) {
    warn!("{}: not a regular file, directory or symbolic link: left alone", joined(path, name).display());
}

/// The file type bits of a stat.
pub(crate) fn kind(stat: FileStat) -> SFlag {
    SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits())
}

/// `path/name`.
pub(crate) fn joined(path: &Path, name: &CStr) -> PathBuf {
    path.join(OsStr::from_bytes(name.to_bytes()))
}

/// One job's rules, shared by its tasks.
struct Walk<'a> {
    pattern: &'a Pattern,
    /// Files modified at or before this (seconds since the epoch) are old.
    cutoff_secs: i64,
    delete_dirs: bool,
    excludes: &'a Excludes,
}

impl Walk<'_> {
    /// Scours an open directory and everything under it; whether it was empty to begin with.
    fn directory(&self, mut dir: Dir, path: &Path) -> (Counts, bool) {
        // The system calls on the entries go through a descriptor of their own, the stream
        // being read on meanwhile.
        let fd = match dir.as_fd().try_clone_to_owned() {
            Ok(fd) => fd,
            Err(error) => {
                warn!("cannot scour {}: {error}", path.display());
                return (Counts { errors: 1, ..Counts::default() }, false);
            }
        };
        let mut errors = 0;
        let mut counts = Counts::default();
        let empty = for_each_batch(&mut dir, fd.as_fd(), path, NAMES_PER_BATCH, &mut errors, |batch| {
            counts = counts.add(self.batch(fd.as_fd(), path, batch));
            ControlFlow::Continue(())
        });
        (counts.add(Counts { errors, ..Counts::default() }), empty)
    }

    /// The files (in chunks), links and subdirectories (each a task) of a batch.
    fn batch(&self, fd: BorrowedFd<'_>, path: &Path, batch: &Listing) -> Counts {
        let (files, rest) = rayon::join(
            || self.files(fd, path, &batch.files),
            || {
                let links = batch.links.iter().fold(Counts::default(), |sum, name| sum.add(self.link(fd, path, name)));
                let subdirectories = batch
                    .directories
                    .par_iter()
                    .map(|name| self.subdirectory(fd, path, name))
                    .reduce(Counts::default, Counts::add);
                links.add(subdirectories)
            },
        );
        files.add(rest)
    }

    fn files(&self, dir: BorrowedFd<'_>, path: &Path, names: &[CString]) -> Counts {
        if names.len() <= FILES_PER_TASK {
            return names.iter().fold(Counts::default(), |sum, name| sum.add(self.file(dir, path, name)));
        }
        names
            .par_chunks(FILES_PER_TASK)
            .map(|chunk| chunk.iter().fold(Counts::default(), |sum, name| sum.add(self.file(dir, path, name))))
            .reduce(Counts::default, Counts::add)
    }

    fn file(&self, dir: BorrowedFd<'_>, path: &Path, name: &CStr) -> Counts {
        if !self.pattern.matches(name) {
            return Counts::default();
        }
        let stat = match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            Err(Errno::ENOENT) => return Counts::default(),
            Err(errno) => return failure(format_args!("cannot look at {}", joined(path, name).display()), errno),
        };
        if kind(stat) != SFlag::S_IFREG || stat.st_mtime > self.cutoff_secs {
            return Counts::default();
        }
        match unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) => {
                info!(target: PRODUCT, "deleted {}", joined(path, name).display());
                Counts { files_deleted: 1, bytes_deleted: stat.st_size as u64, ..Counts::default() }
            }
            Err(Errno::ENOENT) => Counts::default(),
            Err(errno) => failure(format_args!("cannot delete {}", joined(path, name).display()), errno),
        }
    }

    /// A symbolic link, as LDM treats it: by its target's time, whatever its name.
    fn link(&self, dir: BorrowedFd<'_>, path: &Path, name: &CStr) -> Counts {
        let mut counts = Counts::default();
        match fstatat(dir, name, AtFlags::empty()) {
            Err(reason) => {
                counts = counts.add(remove_link(dir, path, name));
                debug!("{}: its target cannot be reached ({})", joined(path, name).display(), reason.desc());
            }
            Ok(target) if target.st_mtime <= self.cutoff_secs => {
                counts = counts.add(remove_target(dir, path, name, target));
                counts = counts.add(remove_link(dir, path, name));
            }
            Ok(_) => {}
        }
        counts
    }

    fn subdirectory(&self, parent: BorrowedFd<'_>, parent_path: &Path, name: &CStr) -> Counts {
        let path = joined(parent_path, name);
        if self.excludes.contains(&path) {
            info!(target: PRODUCT, "{} is excluded", path.display());
            return Counts::default();
        }
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let mut counts = match Dir::openat(parent, name, flags, Mode::empty()) {
            Ok(dir) => self.directory(dir, &path).0,
            // Gone or replaced meanwhile.
            Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => return Counts::default(),
            Err(errno) => return failure(format_args!("cannot open directory {}", path.display()), errno),
        };
        if self.delete_dirs {
            match unlinkat(parent, name, UnlinkatFlags::RemoveDir) {
                Ok(()) => {
                    info!(target: PRODUCT, "removed empty directory {}", path.display());
                    counts.directories_removed += 1;
                }
                Err(Errno::ENOTEMPTY | Errno::EEXIST | Errno::ENOENT) => {}
                Err(errno) => counts = counts.add(failure(format_args!("cannot remove {}", path.display()), errno)),
            }
        }
        counts
    }
}

/// Removes an old link's target (a file, or a directory if empty), named by the link's text
/// relative to the link's directory.
fn remove_target(dir: BorrowedFd<'_>, path: &Path, name: &CStr, target: FileStat) -> Counts {
    let link_path = joined(path, name);
    let target_text = match nix::fcntl::readlinkat(dir, name) {
        Ok(text) => text,
        Err(Errno::ENOENT) => return Counts::default(),
        Err(errno) => return failure(format_args!("cannot read link {}", link_path.display()), errno),
    };
    // What the link names, as a path (relative to the link's directory when relative).
    let target_path = path.join(&target_text);
    let is_directory = kind(target) == SFlag::S_IFDIR;
    let flag = if is_directory { UnlinkatFlags::RemoveDir } else { UnlinkatFlags::NoRemoveDir };
    match unlinkat(dir, target_text.as_os_str(), flag) {
        Ok(()) => {
            info!(target: PRODUCT, "deleted {}, the old target of {}", target_path.display(), link_path.display());
            let bytes = if is_directory { 0 } else { target.st_size as u64 };
            Counts { link_targets_removed: 1, bytes_deleted: bytes, ..Counts::default() }
        }
        Err(Errno::ENOENT) => Counts::default(),
        Err(Errno::ENOTEMPTY | Errno::EEXIST) => {
            info!(target: PRODUCT, "kept {}, the old target of {}: a directory that is not empty", target_path.display(), link_path.display());
            Counts::default()
        }
        Err(errno) => failure(
            format_args!("cannot delete {}, the old target of {}", target_path.display(), link_path.display()),
            errno,
        ),
    }
}

fn remove_link(dir: BorrowedFd<'_>, path: &Path, name: &CStr) -> Counts {
    match unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) => {
            info!(target: PRODUCT, "removed link {}", joined(path, name).display());
            Counts { links_removed: 1, ..Counts::default() }
        }
        Err(Errno::ENOENT) => Counts::default(),
        Err(errno) => failure(format_args!("cannot remove link {}", joined(path, name).display()), errno),
    }
}

fn failure(what: fmt::Arguments<'_>, errno: Errno) -> Counts {
    warn!("{what}: {}", errno.desc());
    Counts { errors: 1, ..Counts::default() }
}
