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
