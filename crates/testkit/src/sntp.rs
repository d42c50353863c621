//! A time server on loopback for the tests of `ldm7 admin checktime` (the lab reaches no NTP
//! server): it answers every SNTP request (RFC 4330) with this host's clock moved by a skew.

use std::net::UdpSocket;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Starts a server whose clock is `skew_secs` ahead of this host's (behind when negative);
/// returns its `127.0.0.1:port`. It answers until the test process ends.
pub fn time_server(skew_secs: f64) -> String {
    let socket = UdpSocket::bind("127.0.0.1:0").expect("bind a time server");
    let address = socket.local_addr().expect("its address").to_string();
    std::thread::spawn(move || {
        let mut request = [0u8; 48];
        while let Ok((_, from)) = socket.recv_from(&mut request) {
            let now = if skew_secs >= 0.0 {
                SystemTime::now() + Duration::from_secs_f64(skew_secs)
            } else {
                SystemTime::now() - Duration::from_secs_f64(-skew_secs)
            };
            let since = now.duration_since(UNIX_EPOCH).expect("after 1970");
            let stamp =
                ((since.as_secs() + 2_208_988_800) << 32) | ((u64::from(since.subsec_nanos()) << 32) / 1_000_000_000);
            let mut reply = [0u8; 48];
            // Version 4, mode 4 (server), stratum 2; the client's transmit time echoed.
            reply[0] = (4 << 3) | 4;
            reply[1] = 2;
            reply[24..32].copy_from_slice(&request[40..48]);
            reply[32..40].copy_from_slice(&stamp.to_be_bytes());
            reply[40..48].copy_from_slice(&stamp.to_be_bytes());
            let _ = socket.send_to(&reply, from);
        }
    });
    address
}
