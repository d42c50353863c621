//! Sans-IO LDM sessions, LDM-6 (ldm6-protocol.md §6) and LDM-7 (ldm7-multicast.md §2): the
//! logic of every session type, with no sockets, threads or clocks. A driver feeds received
//! bytes (`handle_input`), takes bytes to write (`take_output`), drains events
//! (`poll_event`), answers the decisions events ask for, and calls `handle_timeout` at
//! `poll_timeout`. Time is [`ldm7_types::Instant`].
//!
//! | session | who | sequence |
//! |---|---|---|
//! | [`Inbound`] | the server side of any accepted connection, LDM-6 or LDM-7 | starts as an [`Upstream`]; a first call of version 7 hands the connection over to a [`Publisher`]; events are [`InboundEvent::Ldm6`] / [`InboundEvent::Ldm7`], answered through [`Inbound::upstream`] / [`Inbound::publisher`] |
//! | [`Upstream`] | the server side of an LDM-6 connection | first call decides: FEEDME → reply → turn-around (a NULLPROC probe answered, or 1 s as the reference), HEREIS (primary) or COMINGSOON + BLKDATA (alternate), NULLPROC flush and 30 s keep-alive; NOTIFYME → NOTIFICATIONs; HIYA → receives pushed products; IS_ALIVE; NULLPROC. Alone, it answers version-7 calls PROG_MISMATCH 6..6 |
//! | [`Downstream`] | a REQUEST | FEEDME (from, SIG= resume spec, primary/alternate), RECLASS loop, then receives HEREIS / COMINGSOON + BLKDATA, answers NULLPROC; silence limit |
//! | [`NotifyClient`] | `ldm7 notify` | NOTIFYME, then NOTIFICATIONs |
//! | [`PushClient`] | `ldm7 send` | HIYA, then HEREIS (`sz ≤ max_hereis`) or COMINGSOON + BLKDATA, NULLPROC flush |
//! | [`Publisher`] | the upstream LDM-7 of one connection | SUBSCRIBE → [`PublisherEvent::Subscribe`] → [`Publisher::answer_subscribe`]; then one-way calls only: REQUEST_PRODUCT → DELIVER_MISSED_PRODUCT / NO_SUCH_PRODUCT in request order, REQUEST_BACKLOG → DELIVER_BACKLOG_PRODUCTs (+ END_BACKLOG), while [`Publisher::ready`]; TEST_CONNECTION after 60 s without hearing anything |
//! | [`Subscriber`] | a RECEIVE (downstream LDM-7) | SUBSCRIBE (600 s reply timeout) → [`SubscriberEvent::Subscribed`] / [`SubscriberEvent::Refused`]; then [`Subscriber::request_product`], [`Subscriber::request_backlog`]; answers not for the oldest request are [`SubscriberEvent::Unexpected`] and dropped; TEST_CONNECTION 30 s after the last send |
//!
//! Decisions that need the configuration or the queue (access, duplicates) are events the
//! driver answers (`answer_*`), so that these state machines stay pure and testable.
//!
//! LDM-7 calls an end does not serve: another program → PROG_UNAVAIL, another version →
//! PROG_MISMATCH 7..7, an unknown procedure number → PROC_UNAVAIL (the RPC answers); a known
//! procedure of the other direction → PROC_UNAVAIL if it expects a reply (SUBSCRIBE), else no
//! reply at all (nothing is ever replied on an LDM-7 connection after SUBSCRIBE, and the
//! reference's RPC server drops the connection on a reply). Each is counted
//! (`unserved_calls`) and reported as an `Unserved` event; the session goes on. A record that
//! does not decode closes the session with [`SessionError::Malformed`].

mod downstream;
pub mod downstream7;
pub mod fmtp_product;
mod inbound;
mod notify;
mod peer;
mod publisher;
mod push;
mod receive;
mod receive7;
mod subscriber;
mod upstream;

use std::time::Duration;

use ldm7_types::class::PatternError;
use ldm7_types::{FeedType, ProdClass, ProdSpec, Signature, Timestamp};
use ldm7_xdr::ldm::{WireClass, WireSpec};

pub use downstream::{Downstream, DownstreamConfig, DownstreamEvent};
pub use notify::{NotifyClient, NotifyEvent};
pub use peer::{CALL_TIMEOUT, RECORD_MAX};
pub use push::{PushClient, PushEvent};
pub use receive::{ReceivedData, ReceivedProduct};
pub use upstream::{
    CALL_BYTES_MAX, CALL_CHUNK, FIRST_CALL_LIMIT, FeedMode, HiyaAnswer, LimitHit, PUSH_IDLE_TIMEOUT, RequestAnswer,
    Upstream, UpstreamEvent, UpstreamLimits,
};

pub use inbound::{Inbound, InboundEvent};
pub use ldm7_xdr::ldm7::{
    BacklogSpec, CidrAddr, Ldm7Status, McastInfo, McastProdIndex, McastSubInfo, ParityAnswer, RecordBytes,
    SubscribeAnswer, SubscribeOffer, SubscriptionReply, VcEndPoint, WireProduct,
};
pub use publisher::{HEARD_NOTHING_LIMIT, OUTPUT_HIGH_WATER, Publisher, PublisherEvent};
pub use subscriber::{
    FENCE_DISTANCE, REQUESTED_MAX, SUBSCRIBE_TIMEOUT, Subscriber, SubscriberConfig, SubscriberEvent, fence_index,
    is_fence, substitute_unspecified_host,
};

/// The upstream's keep-alive period and queue-poll interval (`interval`, ldm6-protocol.md §7).
pub const INTERVAL: Duration = Duration::from_secs(30);

/// `max_hereis` of a primary feed or an ACCEPT (every product by HEREIS).
pub const MAX_HEREIS_PRIMARY: u32 = u32::MAX;

/// Why a session ended or cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The bytes are not a valid LDM record.
    #[error("malformed record: {0}")]
    Malformed(#[from] ldm7_xdr::XdrError),
    /// A valid record that makes no sense here.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// A synchronous call got no reply in time.
    #[error("no reply to {0} within {secs} s", secs = CALL_TIMEOUT.as_secs())]
    CallTimeout(String),
    /// A synchronous call with its own timeout got no reply in time (LDM-7 SUBSCRIBE: 600 s).
    #[error("no reply to {call} within {timeout_secs} s")]
    ReplyTimeout {
        /// The call.
        call: &'static str,
        /// Its timeout.
        timeout_secs: u64,
    },
    /// The peer closed the connection while a reply was awaited.
    #[error("the peer closed the connection before replying to {0}")]
    ClosedBeforeReply(String),
    /// Nothing arrived for too long.
    #[error("nothing received for {0} s")]
    Silence(u64),
    /// The application called a method the session's state does not allow.
    #[error("session misuse: {0}")]
    Usage(&'static str),
}

/// The `SIG=` spec a resuming downstream appends (feedtype NONE, ldm6-protocol.md §6.1).
pub fn signature_spec(signature: &Signature) -> WireSpec {
    WireSpec { feedtype: FeedType::NONE, pattern: format!("SIG={signature}") }
}

/// Compiles a class received on the wire; a trailing `SIG=` spec (feedtype NONE) is removed
/// and returned.
pub fn compile_class(wire: &WireClass) -> Result<(ProdClass, Option<Signature>), PatternError> {
    let mut specs = wire.specs.as_slice();
    let mut signature = None;
    if let Some(last) = specs.last()
        && last.feedtype == FeedType::NONE
        && last.pattern.len() > 4
        && last.pattern[..4].eq_ignore_ascii_case("SIG=")
    {
        signature = last.pattern[4..].parse::<Signature>().ok();
        specs = &specs[..specs.len() - 1];
    }
    let specs = specs.iter().map(|spec| ProdSpec::new(spec.feedtype, &spec.pattern)).collect::<Result<Vec<_>, _>>()?;
    Ok((ProdClass { from: wire.from, to: wire.to, specs }, signature))
}

/// A class as sent on the wire.
pub fn wire_class(class: &ProdClass) -> WireClass {
    WireClass {
        from: class.from,
        to: class.to,
        specs: class
            .specs
            .iter()
            .map(|spec| WireSpec { feedtype: spec.feedtype, pattern: spec.pattern.as_str().to_owned() })
            .collect(),
    }
}

/// The class a RECLASS with nothing allowed carries: no specs, from = to = 0.
pub fn nothing_class() -> ProdClass {
    ProdClass { from: Timestamp::ZERO, to: Timestamp::ZERO, specs: Vec::new() }
}
