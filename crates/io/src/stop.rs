//! The stop signal of a daemon's threads: a flag, and a file descriptor that becomes readable
//! when it is set, so that a thread blocked in `poll(2)` on its socket wakes at once on stop
//! rather than looking at a flag every so often ("shutdown by signal, not by poll": the
//! process's SIGTERM handler calls [`Stop::stop`]).
//!
//! The descriptor is one end of a Unix socket pair; [`Stop::stop`] writes a byte into the other
//! end and nothing ever reads it, so the descriptor stays readable from then on: every thread,
//! whenever it polls, sees it.

use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};

/// See the module documentation.
#[derive(Debug)]
pub struct Stop {
    stopped: AtomicBool,
    /// For [`Stop::wait`]: notified on stop.
    sleepers: (std::sync::Mutex<()>, std::sync::Condvar),
    /// Readable once stopped.
    readable: UnixStream,
    writer: UnixStream,
}

impl Stop {
    /// A signal not yet given. Fails only when the process is out of file descriptors.
    pub fn new() -> std::io::Result<Self> {
        let (readable, writer) = UnixStream::pair()?;
        Ok(Self { stopped: AtomicBool::new(false), sleepers: Default::default(), readable, writer })
    }

    /// Gives the signal: the flag, then the descriptor (a thread that saw the flag unset and then
    /// polls wakes on the descriptor).
    pub fn stop(&self) {
        if !self.stopped.swap(true, Ordering::AcqRel) {
            // A full buffer cannot happen (one byte, once); a failure leaves the flag set.
            let _ = (&self.writer).write_all(&[1]);
            // Under the lock: a sleeper checks the flag under it before it sleeps.
            let _guard = self.sleepers.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            self.sleepers.1.notify_all();
        }
    }

    /// Whether the signal was given.
    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Waits until the signal is given or `timeout` passes; whether it was given. For a thread
    /// that sleeps between attempts (a reconnection's back-off).
    pub fn wait(&self, timeout: std::time::Duration) -> bool {
        let guard = self.sleepers.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let _ = self
            .sleepers
            .1
            .wait_timeout_while(guard, timeout, |()| !self.is_stopped())
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.is_stopped()
    }
}

impl AsFd for Stop {
    /// The descriptor that becomes readable (POLLIN) when the signal is given.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.readable.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    #[test]
    fn a_waiting_thread_wakes_at_once_on_stop() {
        let stop = Arc::new(Stop::new().expect("socket pair"));
        assert!(!stop.wait(Duration::from_millis(10)));
        let waiter = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                assert!(stop.wait(Duration::from_secs(60)));
                started.elapsed()
            })
        };
        // The waiter may not have started waiting yet: either way it returns at once.
        stop.stop();
        let waited = waiter.join().expect("waiter");
        assert!(waited < Duration::from_secs(10), "{waited:?}");
        // Given once, seen by every later wait.
        assert!(stop.wait(Duration::from_secs(60)));
        assert!(stop.is_stopped());
    }
}
