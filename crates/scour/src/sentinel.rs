//! `--sentinel`: the rule of LDM's old scour.sh and of scour(1)'s manual page, which LDM 6.15's
//! scour binary does not apply (checked: it writes no `.scour*` file and always deletes).
//!
//! A zero-size file `.scour<PATTERN>` at the top of each scoured directory keeps the time of
//! the last scour of that directory with that pattern. When it exists and no regular file
//! matching the pattern anywhere under the directory is newer, nothing is deleted and a warning
//! is logged (the data feeding the directory may have stopped: the files there are the last
//! ones a site has). After a scour the file is created or its time set to now. Sentinel files
//! themselves (`.scour*`) never count as new files.

use std::ffi::{CStr, OsStr};
use std::ops::ControlFlow;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use nix::dir::Dir;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{Mode, SFlag, fstatat};
use rayon::prelude::*;
use tracing::warn;

use crate::conf::Excludes;
use crate::pattern::Pattern;
use crate::walk::{Job, NAMES_PER_BATCH, for_each_batch, joined, kind};

/// The prefix of sentinel file names.
const PREFIX: &[u8] = b".scour";

/// The sentinel file of a job: `DIRECTORY/.scour<PATTERN>`.
pub fn path(job: &Job) -> PathBuf {
    let mut name = PREFIX.to_vec();
    name.extend_from_slice(job.pattern.as_bytes());
    job.directory.join(OsStr::from_bytes(&name))
}

/// Whether the job is to be skipped: its sentinel exists and nothing matching is newer (then
/// the warning is logged here).
pub fn is_stale(job: &Job, excludes: &Excludes) -> bool {
    let sentinel = path(job);
    let Ok(since) = std::fs::metadata(&sentinel).and_then(|metadata| metadata.modified()) else { return false };
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let Ok(dir) = Dir::open(&job.directory, flags, Mode::empty()) else { return false };
    let search = Search { pattern: &job.pattern, since, excludes };
    if search.newer_in(dir, &job.directory) {
        return false;
    }
    warn!(
        "{}: no file matching {} arrived in {} since its last scour ({} is newer than all): nothing deleted; is data still arriving?",
        job.origin,
        job.pattern,
        job.directory.display(),
        sentinel.display()
    );
    true
}

/// Creates the job's sentinel or sets its time to now.
pub fn touch(job: &Job) {
    let sentinel = path(job);
    let touched = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&sentinel)
        .and_then(|file| file.set_modified(SystemTime::now()));
    if let Err(error) = touched {
        warn!("{}: cannot touch the sentinel file {}: {error}", job.origin, sentinel.display());
    }
}

struct Search<'a> {
    pattern: &'a Pattern,
    since: SystemTime,
    excludes: &'a Excludes,
}

impl Search<'_> {
    /// Whether a matching regular file under `dir` was modified after `since`.
    fn newer_in(&self, mut dir: Dir, path: &Path) -> bool {
        let Ok(fd) = dir.as_fd().try_clone_to_owned() else { return false };
        let fd = fd.as_fd();
        let mut errors = 0;
        let mut found = false;
        for_each_batch(&mut dir, fd, path, NAMES_PER_BATCH, &mut errors, |batch| {
            found = batch.files.par_iter().any(|name| self.is_new_file(fd, name))
                || batch.directories.par_iter().any(|name| self.newer_in_subdirectory(fd, path, name));
            if found { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
        });
        found
    }

    fn is_new_file(&self, dir: BorrowedFd<'_>, name: &CStr) -> bool {
        !name.to_bytes().starts_with(PREFIX)
            && self.pattern.matches(name)
            && fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
                .is_ok_and(|stat| kind(stat) == SFlag::S_IFREG && self.is_newer(stat.st_mtime, stat.st_mtime_nsec))
    }

    fn newer_in_subdirectory(&self, parent: BorrowedFd<'_>, parent_path: &Path, name: &CStr) -> bool {
        let path = joined(parent_path, name);
        if self.excludes.contains(&path) {
            return false;
        }
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        Dir::openat(parent, name, flags, Mode::empty()).is_ok_and(|dir| self.newer_in(dir, &path))
    }

    fn is_newer(&self, secs: i64, nanos: i64) -> bool {
        let modified = if secs >= 0 {
            SystemTime::UNIX_EPOCH + std::time::Duration::new(secs as u64, nanos.clamp(0, 999_999_999) as u32)
        } else {
            SystemTime::UNIX_EPOCH
        };
        modified > self.since
    }
}
