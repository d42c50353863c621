//! The FMTP driver: sockets, pacing and batching around the sans-IO state machines of
//! `ldm7-fmtp-proto` (ARCHITECTURE.md, "The sans-IO boundary"). The driver makes no protocol
//! decisions.

pub mod driver;
pub mod udp;

pub use driver::{FmtpSender, ReceiverOptions, SenderNotice, SenderOptions, run_receiver};
