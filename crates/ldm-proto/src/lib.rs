//! Sans-IO LDM-6 sessions (ldm6-protocol.md §6): the logic of every session type, with no
//! sockets, threads or clocks. A driver feeds received bytes (`handle_input`), takes bytes to
//! write (`take_output`), drains events (`poll_event`), answers the decisions events ask for,
//! and calls `handle_timeout` at `poll_timeout`.
//!
//! | session | who | sequence |
//! |---|---|---|
//! | [`Upstream`] | the server side of any accepted connection | first call decides: FEEDME → reply → 1 s → turn-around, HEREIS (primary) or COMINGSOON + BLKDATA (alternate), NULLPROC flush and 30 s keep-alive; NOTIFYME → NOTIFICATIONs; HIYA → receives pushed products; IS_ALIVE; NULLPROC |
//! | [`Downstream`] | a REQUEST | FEEDME (from, SIG= resume spec, primary/alternate), RECLASS loop, then receives HEREIS / COMINGSOON + BLKDATA, answers NULLPROC; silence limit |
//! | [`NotifyClient`] | `ldm7 notify` | NOTIFYME, then NOTIFICATIONs |
//! | [`PushClient`] | `ldm7 send` | HIYA, then HEREIS (`sz ≤ max_hereis`) or COMINGSOON + BLKDATA, NULLPROC flush |
//!
//! Decisions that need the configuration or the queue (access, duplicates) are events the
//! driver answers (`answer_*`), so that these state machines stay pure and testable.

mod downstream;
mod notify;
mod peer;
mod push;
mod receive;
mod upstream;

use std::time::Duration;

use ldm7_types::class::PatternError;
use ldm7_types::{FeedType, ProdClass, ProdSpec, Signature, Timestamp};
use ldm7_xdr::ldm::{WireClass, WireSpec};

pub use downstream::{Downstream, DownstreamConfig, DownstreamEvent};
pub use notify::{NotifyClient, NotifyEvent};
pub use peer::{CALL_TIMEOUT, RECORD_MAX};
pub use push::{PushClient, PushEvent};
pub use receive::ReceivedProduct;
pub use upstream::{FeedMode, HiyaAnswer, RequestAnswer, Upstream, UpstreamEvent};

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
    if let Some(last) = specs.last() {
        if last.feedtype == FeedType::NONE && last.pattern.len() > 4 && last.pattern[..4].eq_ignore_ascii_case("SIG=") {
            signature = last.pattern[4..].parse::<Signature>().ok();
            specs = &specs[..specs.len() - 1];
        }
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
