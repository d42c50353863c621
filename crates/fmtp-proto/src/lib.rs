//! Sans-IO FMTP v3 (the LDM-7 multicast transport, `docs/spec/ldm7-multicast.md` §3): the wire
//! codec and the sender and receiver state machines.
//!
//! Nothing in this crate opens a socket, starts a thread, reads a clock or draws randomness
//! (a test greps the sources). Time is an argument ([`Instant`], nanoseconds on a clock the
//! caller chooses: real in the socket driver, virtual in the simulator); product bytes come
//! through [`ProductData`] and go out through [`ProductSink`]. The driver (`ldm7-fmtp`) owns sockets, framing of the TCP streams
//! (with [`wire::split_frame`]), the key-exchange handshake, timers and batching; the simulator
//! (`ldm7-sim`) drives the same API with virtual time.
//!
//! # Modules
//!
//! * [`wire`] — the 12-byte header, every message type, the BOP body; [`wire::Packet`] view and
//!   [`wire::Message`] parse/emit; [`wire::split_frame`] for TCP streams;
//!   [`wire::handshake`] for the length-prefixed key blobs that open each TCP connection.
//! * [`mac`] — §3.6–§3.7: MAC levels 0/1/2 (none, HMAC-SHA-256, Ed25519) on multicast
//!   datagrams and the RSA-OAEP key exchange that opens each TCP connection (a PEM public key
//!   one way, a 256-byte ciphertext back, even at level 0), with the ldm7 extension that binds
//!   the exchange to a pinned publisher identity.
//! * [`sender`] — [`Sender`]: numbering, paced multicast, repairs, deadlines, release.
//! * [`receiver`] — [`Receiver`]: assembly, loss detection, requests, delivery.
//! * [`sink`] — [`ProductSink`]: where a receiver writes product bytes when they are not
//!   assembled in memory (a spool file, the product queue), the counterpart of [`ProductData`].
//! * [`index`] — [`ProductIndex`] with serial-number comparison (wrap-around).
//! * [`time`] — [`Instant`], [`WallTime`] (BOP start time), [`WallClock`].
//! * [`pacing`] — [`Pacing`] (token-bucket settings).
//!
//! # Driving a [`Sender`]
//!
//! Inputs (each takes `now`):
//! * [`Sender::enqueue`]`(now, OutgoingProduct)` → the product's [`ProductIndex`] (sequential,
//!   wrapping, from [`SenderConfig::first_index`]); refused with the product handed back when no
//!   receiver is connected (LDM policy, configurable), the queue is full, or the metadata is too
//!   long.
//! * [`Sender::receiver_connected`]`(now, id)` after the driver accepted, authorized and ran
//!   the handshake on a receiver's TCP connection ([`ReceiverId`] is the driver's number);
//!   [`Sender::receiver_disconnected`]`(now, id)` when it closed.
//! * [`Sender::handle_stream`]`(now, id, &Message)` (or [`Sender::handle_stream_frame`] with
//!   raw frame bytes) for each message framed from a receiver's connection.
//! * [`Sender::handle_timeout`]`(now)` when [`Sender::poll_timeout`] is reached.
//! * Hints: [`Sender::set_rtt`], [`Sender::set_writable`] (skip a receiver whose socket is
//!   full), [`Sender::accepts_stream`] (stop reading a receiver whose repair backlog is over its
//!   bound: TCP backpressure), [`Sender::set_wall_clock`].
//!
//! Outputs, drained after every input in this order:
//! 1. [`Sender::poll_transmit`]`(now, &mut Vec<u8>)` until `None`: each call appends one whole
//!    message to the buffer and returns a [`Transmit`] saying where it goes
//!    ([`Destination::Multicast`] = one UDP datagram, [`Destination::Receiver`] = append to that
//!    receiver's TCP stream) and its length, so a driver can batch datagrams into one GSO
//!    buffer. `None` means pacing (or an empty queue) forbids sending before
//!    [`Sender::poll_timeout`].
//! 2. [`Sender::poll_event`] until `None`: [`SenderEvent::Sent`], [`SenderEvent::Released`]
//!    (the application may release the product: every interested receiver finished, the
//!    deadline passed, or a bound evicted it), [`SenderEvent::Completed`] (a receiver's
//!    RETX_END), [`SenderEvent::BoundHit`].
//! 3. [`Sender::poll_timeout`]: when to call [`Sender::handle_timeout`] and
//!    [`Sender::poll_transmit`] again (an instant at or before `now` means at once).
//!
//! Pacing: multicast and repairs each have a byte-accurate token bucket
//! ([`SenderConfig::multicast_pacing`], [`SenderConfig::retx_pacing`]), separate budgets like
//! the design's two tc HTB classes. Deadlines: [`DeadlinePolicy::Constant`] (default 300 s) or
//! [`DeadlinePolicy::Proportional`]. Deadlines are also checked on every input, so a request
//! arriving after a product's deadline is rejected even if the driver's timer is late.
//!
//! # Driving a [`Receiver`]
//!
//! Inputs: [`Receiver::handle_datagram`]`(now, &[u8])` for each multicast datagram;
//! [`Receiver::handle_stream`]`(now, &Message)` (or [`Receiver::handle_stream_frame`]) for each
//! message framed from the TCP connection to the sender; [`Receiver::handle_timeout`]`(now)`;
//! [`Receiver::stream_reset`]`(now)` after the TCP connection was re-established (re-issues
//! the requests lost with the old one); [`Receiver::set_wall_clock`] for latencies. A receiver
//! made with [`Receiver::with_sink`] writes product bytes through the [`ProductSink`] (opened
//! at the BOP, closed before the product's event) instead of assembling them in memory.
//!
//! Outputs, drained after every input in this order:
//! 1. [`Receiver::poll_transmit`] until `None`: messages for the TCP connection (BOP_REQ,
//!    RETX_REQ, EOP_REQ, RETX_END), to emit with [`Message::emit_to_vec`].
//! 2. [`Receiver::poll_event`] until `None`: [`ReceiverEvent::Started`] (once, at the first
//!    multicast message: the first product the receiver answers for),
//!    [`ReceiverEvent::Delivered`] (bytes, metadata,
//!    retransmitted blocks, latency), [`ReceiverEvent::Missed`] (fetch it another way),
//!    [`ReceiverEvent::IndexGap`], [`ReceiverEvent::BoundHit`].
//! 3. [`Receiver::poll_timeout`].
//!
//! Every product the receiver started on ends as exactly one `Delivered` or `Missed` event.
//!
//! # Example
//!
//! ```
//! use ldm7_fmtp_proto::{Instant, Receiver, ReceiverConfig, ReceiverId, Sender, SenderConfig, OutgoingProduct};
//! use ldm7_fmtp_proto::{ReceiverEvent, Destination, wire::Message};
//!
//! let now = Instant::ZERO;
//! let mut sender = Sender::new(SenderConfig::with_rate(100_000_000), now).unwrap();
//! let mut receiver = Receiver::new(ReceiverConfig::default()).unwrap();
//! sender.receiver_connected(now, ReceiverId(1));
//! let index = sender.enqueue(now, OutgoingProduct::new(vec![7u8; 5000], *b"0123456789abcdef")).unwrap();
//!
//! let mut buf = Vec::new();
//! while let Some(transmit) = sender.poll_transmit(now, &mut buf) {
//!     assert_eq!(transmit.destination, Destination::Multicast);
//!     receiver.handle_datagram(now, &buf[buf.len() - transmit.len..]);
//! }
//! // The receiver asks the sender to confirm the first index it saw (BOP_REQ) and holds its
//! // events, and its RETX_END, until the answer comes over TCP (a RETX_BOP: confirmed).
//! let ask = receiver.poll_transmit().unwrap();
//! sender.handle_stream(now, ReceiverId(1), &ask);
//! assert_eq!(receiver.poll_event(), None);
//! while let Some(transmit) = sender.poll_transmit(now, &mut buf) {
//!     assert_eq!(transmit.destination, Destination::Receiver(ReceiverId(1)));
//!     receiver.handle_stream_frame(now, &buf[buf.len() - transmit.len..]).unwrap();
//! }
//! // The receiver reports completion with RETX_END on its TCP connection.
//! let end = receiver.poll_transmit().unwrap();
//! sender.handle_stream(now, ReceiverId(1), &end);
//! assert_eq!(receiver.poll_event(), Some(ReceiverEvent::Started { index }));
//! let Some(ReceiverEvent::Delivered(delivery)) = receiver.poll_event() else { panic!() };
//! assert_eq!((delivery.index, delivery.data.len()), (index, 5000));
//! ```

pub mod index;
pub mod lists;
pub mod mac;
pub mod pacing;
pub mod parity;
mod ranges;
pub mod receiver;
pub mod sender;
pub mod sink;
pub mod time;
pub mod wire;

pub use index::ProductIndex;
pub use ldm7_plan::repair::RECEIVE_GAP_DEFAULT;
pub use pacing::Pacing;
pub use parity::{PLANNED_LOSS_DEFAULT, PLANNED_SUBSCRIBERS_DEFAULT, ParityChoice, ParityConfig, ParityEncoder};
pub use receiver::{
    Assembly, BlockRun, DeliveredProduct, InFlight, IndexTrust, MissReason, PARITY_DEFER_MAX, PARITY_RETRY_MIN,
    PROBED_SENDER_SLACK, RETX_EOP_DEFER_MAX, ReceiveTimer, Receiver, ReceiverBound, ReceiverConfig, ReceiverCounters,
    ReceiverEvent, SPARE_BUFFER_BYTES_MAX, SPARE_BUFFERS_MAX, block_fingerprint, sampled_block_fingerprint,
};
pub use sender::{
    Completion, CompletionOutcome, DataUnavailable, DeadlinePolicy, Destination, EnqueueError, EnqueueRefusal,
    OutgoingProduct, ProductData, REPAIR_ROUND_MIN, ReceiverId, ReleaseReason, Sender, SenderBound, SenderConfig,
    SenderCounters, SenderEvent, Transmit,
};
pub use sink::{ProductSink, SinkError};
pub use time::{Instant, WallClock, WallTime};
pub use wire::Message;

/// Why a configuration cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid FMTP configuration: {0}")]
pub struct ConfigError(pub String);
