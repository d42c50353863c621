//! Waiting on a session's socket: the one blocking read every driver of a sans-IO session
//! makes, bounded by the session's next timeout.

use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::os::fd::AsFd;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use std::time::Duration;

use ldm7_io::{Clock, Stop};
use ldm7_types::Instant;

/// What waiting brought.
#[derive(Debug, PartialEq, Eq)]
pub enum Input {
    /// This many bytes, at the start of the buffer.
    Bytes(usize),
    /// The wait ended without data: call the session's `handle_timeout`.
    Timeout,
    /// The peer closed the connection (or it failed): call `handle_eof`.
    Eof,
    /// The process is stopping ([`wait_input_or_stop`] only): end the session.
    Stopped,
}

/// Reads into `buf`, waiting at most until `deadline` (the session's `poll_timeout`) and never
/// longer than `longest` (how often the caller looks at other things, e.g. a shutdown flag).
pub fn wait_input(
    stream: &mut TcpStream,
    buf: &mut [u8],
    deadline: Option<Instant>,
    longest: Duration,
) -> std::io::Result<Input> {
    let wait = deadline.map_or(longest, |at| Clock::until(at).min(longest));
    if wait.is_zero() {
        return Ok(Input::Timeout);
    }
    read_within(stream, buf, wait)
}

/// [`wait_input`] for a daemon's session: also returns, with [`Input::Stopped`], as soon as
/// `stop` is given (both descriptors in one `poll(2)`), so a stopping server does not wait for
/// a poll interval. `longest` bounds the wait as in [`wait_input`] (a session with periodic work
/// of its own); `None` waits for the deadline, input or the stop alone.
pub fn wait_input_or_stop(
    stream: &mut TcpStream,
    buf: &mut [u8],
    deadline: Option<Instant>,
    longest: Option<Duration>,
    stop: &Stop,
) -> std::io::Result<Input> {
    if stop.is_stopped() {
        return Ok(Input::Stopped);
    }
    let wait = match (deadline.map(Clock::until), longest) {
        (Some(until), Some(longest)) => Some(until.min(longest)),
        (until, longest) => until.or(longest),
    };
    if wait.is_some_and(|wait| wait.is_zero()) {
        return Ok(Input::Timeout);
    }
    let timeout = match wait {
        // Milliseconds, rounded up so that a wait never ends before its deadline.
        Some(wait) => PollTimeout::try_from(wait.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32)
            .unwrap_or(PollTimeout::MAX),
        None => PollTimeout::NONE,
    };
    let mut fds = [PollFd::new(stream.as_fd(), PollFlags::POLLIN), PollFd::new(stop.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, timeout) {
        Ok(0) => return Ok(Input::Timeout),
        Ok(_) => {}
        Err(nix::errno::Errno::EINTR) => return Ok(Input::Timeout),
        Err(error) => return Err(error.into()),
    }
    if stop.is_stopped() {
        return Ok(Input::Stopped);
    }
    // Readable (or closed, or failed): the read returns at once; the timeout only guards a
    // spurious readiness.
    read_within(stream, buf, Duration::from_millis(1))
}

/// One read into `buf` that waits at most `wait`.
fn read_within(stream: &mut TcpStream, buf: &mut [u8], wait: Duration) -> std::io::Result<Input> {
    stream.set_read_timeout(Some(wait))?;
    match stream.read(buf) {
        Ok(0) => Ok(Input::Eof),
        Ok(n) => Ok(Input::Bytes(n)),
        Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {
            Ok(Input::Timeout)
        }
        Err(error) if matches!(error.kind(), ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted) => {
            Ok(Input::Eof)
        }
        Err(error) => Err(error),
    }
}
