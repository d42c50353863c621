//! Cross-process wake-up: a change counter in a small shared file, waited on with a Linux futex.
//!
//! The file `notify` beside the LMDB files holds two 32-bit words: a change counter that every
//! insert increments after its commit, and the number of processes waiting. Waiters sleep in
//! `FUTEX_WAIT` on the counter (a shared, not private, futex: the mapping is `MAP_SHARED` on a
//! file, so the kernel keys the futex on the file page and every process meets on it). Inserters
//! call `FUTEX_WAKE` only when someone waits, so an unwatched queue costs one atomic add.
//!
//! A waiter reads the counter *before* it looks at the queue and sleeps only if the counter
//! still has that value, so a commit that lands between the look and the sleep is never missed.
//! A waiter killed while asleep leaves the waiting count one too high; inserters then make a
//! needless wake call per insert (about a microsecond) until the queue is re-created.
#![allow(unsafe_code)]

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use memmap2::MmapRaw;

/// Size of the notify file (one page).
pub(crate) const NOTIFY_FILE_LEN: u64 = 4096;
/// Permissions of a new notify file (before the umask).
pub(crate) const NOTIFY_FILE_MODE: u32 = 0o644;

#[derive(Debug)]
pub(crate) struct Notifier {
    map: MmapRaw,
}

impl Notifier {
    /// Opens (creating if needed) the notify file at `path`, its page reserved on the disk
    /// first (`reserve`): the counter is written through the mapping, and a write into a page
    /// the file system cannot back would kill the process with SIGBUS. Fails with `ENOSPC`
    /// when the file system is full and the page has no block yet.
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = crate::reserve::open_reserved(path, NOTIFY_FILE_LEN, NOTIFY_FILE_MODE)?;
        let map = MmapRaw::map_raw(&file)?;
        Ok(Self { map })
    }

    /// The change counter's current value.
    pub fn changes(&self) -> u32 {
        self.counter().load(Ordering::Acquire)
    }

    /// Announces a change (after a commit) and wakes every waiter.
    pub fn notify(&self) {
        self.counter().fetch_add(1, Ordering::AcqRel);
        if self.waiters().load(Ordering::Acquire) > 0 {
            futex_wake(self.counter());
        }
    }

    /// Sleeps until the counter differs from `seen` or `timeout` passes (`None`: no limit).
    /// May return early (spurious wake-ups); callers re-check.
    pub fn wait(&self, seen: u32, timeout: Option<Duration>) {
        self.waiters().fetch_add(1, Ordering::AcqRel);
        if self.counter().load(Ordering::Acquire) == seen {
            futex_wait(self.counter(), seen, timeout);
        }
        self.waiters().fetch_sub(1, Ordering::AcqRel);
    }

    fn counter(&self) -> &AtomicU32 {
        // SAFETY: the mapping is at least 4096 bytes, page-aligned (so 4-byte aligned), lives as
        // long as `self`, and is only ever accessed through atomics by every process.
        unsafe { &*(self.map.as_mut_ptr() as *const AtomicU32) }
    }

    fn waiters(&self) -> &AtomicU32 {
        // SAFETY: as for `counter`, at byte offset 4.
        unsafe { &*(self.map.as_mut_ptr().add(4) as *const AtomicU32) }
    }
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a valid, aligned u32 address; no other memory is touched.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX, std::ptr::null::<libc::timespec>());
    }
}

fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let timespec = timeout.map(|timeout| libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    });
    let timespec_ptr = timespec.as_ref().map_or(std::ptr::null(), |timespec| timespec as *const libc::timespec);
    // SAFETY: FUTEX_WAIT reads the aligned u32 at `word` and the timespec we own; the result
    // (woken, timed out, interrupted, value changed) needs no handling: callers re-check.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, timespec_ptr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn wait_times_out_and_notify_wakes() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("notify");
        let waiter = Notifier::open(&path).unwrap();
        let seen = waiter.changes();
        let started = Instant::now();
        waiter.wait(seen, Some(Duration::from_millis(20)));
        assert!(started.elapsed() >= Duration::from_millis(15));

        let thread = std::thread::spawn(move || {
            let notifier = Notifier::open(&path).unwrap();
            // A fixed pause, kept on purpose: the notification must come while the waiter below
            // waits (a wake-up from another process's notify is what is under test).
            std::thread::sleep(Duration::from_millis(20));
            notifier.notify();
        });
        let started = Instant::now();
        while waiter.changes() == seen {
            waiter.wait(seen, Some(Duration::from_secs(10)));
        }
        assert!(started.elapsed() < Duration::from_secs(5));
        thread.join().unwrap();
    }
}
