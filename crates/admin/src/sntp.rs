//! The clock's offset from a time server, by one SNTP exchange (RFC 4330): what `ldmadmin
//! checktime` asks `ntpdate -q` for.

use std::net::{ToSocketAddrs, UdpSocket};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Seconds from 1900 (NTP's era) to 1970.
const NTP_TO_UNIX_SECONDS: u64 = 2_208_988_800;

/// The default NTP port.
const NTP_PORT: u16 = 123;

/// How long one server is waited for.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// The server's clock minus ours, in seconds (positive: ours is behind), from one request to
/// `server` (`host` or `host:port`).
pub fn offset(server: &str, timeout: Duration) -> Result<f64, String> {
    let address = if server.contains(':') { server.to_owned() } else { format!("{server}:{NTP_PORT}") };
    let target = address
        .to_socket_addrs()
        .map_err(|error| format!("{server}: {error}"))?
        .next()
        .ok_or_else(|| format!("{server}: no address"))?;
    let socket = UdpSocket::bind(if target.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" })
        .map_err(|error| format!("{server}: {error}"))?;
    socket.set_read_timeout(Some(timeout)).map_err(|error| format!("{server}: {error}"))?;
    let mut request = [0u8; 48];
    // Leap indicator 0, version 4, mode 3 (client).
    request[0] = (4 << 3) | 3;
    let sent = SystemTime::now();
    request[40..48].copy_from_slice(&to_ntp(sent).to_be_bytes());
    socket.send_to(&request, target).map_err(|error| format!("{server}: {error}"))?;
    let mut reply = [0u8; 48];
    let (len, _) = socket.recv_from(&mut reply).map_err(|error| format!("{server}: no answer ({error})"))?;
    let received = SystemTime::now();
    if len < 48 || reply[0] & 0x7 != 4 {
        return Err(format!("{server}: not an NTP server's answer"));
    }
    let stamp = |at: usize| u64::from_be_bytes(reply[at..at + 8].try_into().expect("8 bytes"));
    let (server_received, server_sent) = (from_ntp(stamp(32)), from_ntp(stamp(40)));
    if server_sent == 0.0 {
        return Err(format!("{server}: the answer has no time (the server is not synchronized)"));
    }
    let (t1, t4) = (seconds(sent), seconds(received));
    Ok(((server_received - t1) + (server_sent - t4)) / 2.0)
}

fn seconds(time: SystemTime) -> f64 {
    time.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs_f64()
}

/// A time as NTP's 32.32 fixed-point seconds since 1900.
fn to_ntp(time: SystemTime) -> u64 {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let seconds = since.as_secs() + NTP_TO_UNIX_SECONDS;
    let fraction = (u64::from(since.subsec_nanos()) << 32) / 1_000_000_000;
    (seconds << 32) | fraction
}

/// NTP's 32.32 fixed-point seconds since 1900 as Unix seconds (0.0 for a zero stamp).
fn from_ntp(stamp: u64) -> f64 {
    if stamp == 0 {
        return 0.0;
    }
    let seconds = (stamp >> 32) as f64 - NTP_TO_UNIX_SECONDS as f64;
    seconds + (stamp & 0xffff_ffff) as f64 / 4_294_967_296.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offset_of_a_skewed_server_is_measured() {
        let measured = offset(&ldm7_testkit::sntp::time_server(42.0), TIMEOUT).expect("offset");
        assert!((measured - 42.0).abs() < 0.5, "{measured}");
        let measured = offset(&ldm7_testkit::sntp::time_server(-3.5), TIMEOUT).expect("offset");
        assert!((measured + 3.5).abs() < 0.5, "{measured}");
    }

    #[test]
    fn a_silent_server_is_an_error() {
        let silent = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let address = silent.local_addr().expect("address").to_string();
        let error = offset(&address, Duration::from_millis(100)).expect_err("no answer");
        assert!(error.contains("no answer"), "{error}");
    }
}
