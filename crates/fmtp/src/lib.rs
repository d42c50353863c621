//! The FMTP driver and application: sockets, timers, queues and batching around the sans-IO
//! state machines of `ldm7-fmtp-proto` (ARCHITECTURE.md, "The sans-IO boundary";
//! `docs/spec/ldm7-multicast.md` §3). The driver makes no protocol decisions.
//!
//! * [`sender`] — [`FmtpSender`]: multicast in GSO batches, one repair connection per receiver
//!   with its writability, TCP backpressure and RTT fed to the protocol.
//! * [`receiver`] — [`FmtpReceiver`]: joins the group, connects to the sender with back-off,
//!   repairs losses, hands each product over in memory or in a spool file.
//! * [`spool`] — [`SpoolSink`]: the file-backed product sink (one spool file per product in
//!   flight).
//! * [`stream`] — the TCP connection's key exchange, connect with back-off, RTT (`TCP_INFO`).
//! * [`udp`] — multicast sockets (GSO/GRO, `recvmmsg`).
//! * [`reader`] — the receiving end's reader thread (reads the multicast sockets and nothing
//!   else; counts the kernel's drops).
//! * [`app`] — the FMTP transport as a tool (`ldm7 fmtp send | recv`): products streamed from
//!   files or a trace (read back by offset, never held), waiting for receivers, lingering for
//!   releases, receiving into a directory with MD5 checks (waiting for a sender not yet up),
//!   summaries.
//!
//! Every queue between the tasks has a named bound ([`SenderBounds`], [`ReceiverBounds`]) and a
//! counter ([`SenderDriverCounters`], [`ReceiverDriverCounters`], next to the protocol's
//! `SenderCounters` and `ReceiverCounters`); hitting one is logged once per episode with
//! `tracing`. Nothing accepted is dropped: full queues make the producer wait.

pub mod app;
pub mod reader;
pub mod receiver;
pub mod sender;
pub mod spool;
pub mod stream;
pub mod udp;

pub use ldm7_fmtp_proto::lists::MacSigning;
pub use ldm7_fmtp_proto::mac::MacLevel;
pub use ldm7_fmtp_proto::{PLANNED_LOSS_DEFAULT, PLANNED_SUBSCRIBERS_DEFAULT, ParityChoice, ParityConfig};
pub use receiver::{
    BufferReturn, ConnectionState, FmtpReceiver, ReceiveError, ReceivedBytes, ReceiverBounds, ReceiverDriverCounters,
    ReceiverNotice, ReceiverOptions, ReceiverReport, md5_side_by_side,
};
pub use sender::{
    Authorizer, Departure, FinishHandle, Finishing, FmtpSender, KEY_SWITCH_DEADLINE, MAC_ROTATION_MIN, ProductSender,
    RateHandle, SendError, SenderBounds, SenderDriverCounters, SenderNotice, SenderOptions, SetRateError,
    SigningHandle, TrySendError,
};
pub use spool::{SpoolSink, SpooledProduct, Taken};
