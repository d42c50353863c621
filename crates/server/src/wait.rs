//! Waiting on a session's socket: the one blocking read every driver of a sans-IO session
//! makes, bounded by the session's next timeout.

use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::time::Duration;

use ldm7_io::Clock;
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

/// [`wait_input`] into memory that need not be initialized (a record's spare room): the
/// kernel writes the bytes; [`Input::Bytes`] tells how many, at the start of `room`.
pub fn wait_input_into(
    stream: &TcpStream,
    room: &mut [std::mem::MaybeUninit<u8>],
    deadline: Option<Instant>,
    longest: Duration,
) -> std::io::Result<Input> {
    use std::os::fd::AsRawFd;
    let wait = deadline.map_or(longest, |at| Clock::until(at).min(longest));
    if wait.is_zero() || room.is_empty() {
        return Ok(Input::Timeout);
    }
    stream.set_read_timeout(Some(wait))?;
    // SAFETY: `room` is valid for writes of its length; read(2) writes at most that many bytes
    // and never reads them, so uninitialized memory is fine.
    #[allow(unsafe_code)]
    let count = unsafe { libc::read(stream.as_raw_fd(), room.as_mut_ptr().cast(), room.len()) };
    match count {
        0 => Ok(Input::Eof),
        n if n > 0 => Ok(Input::Bytes(n as usize)),
        _ => {
            let error = std::io::Error::last_os_error();
            match error.kind() {
                ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted => Ok(Input::Timeout),
                ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted => Ok(Input::Eof),
                _ => Err(error),
            }
        }
    }
}
