//! What every driver of a sans-IO protocol crate shares (ARCHITECTURE.md, "The sans-IO
//! boundary"): the one process clock that maps the operating system's monotonic clock to the
//! protocols' [`ldm7_types::Instant`] ([`clock`]), reconnection back-off ([`backoff`], pure: it
//! lives in `ldm7_types` and is re-exported here), the
//! log targets every driver logs per-product lines with ([`log_target`]), and the counter and
//! once-per-episode logging decision for a named bound that was hit ([`bound`]).
//!
//! Protocol crates never read a clock; drivers (the FMTP driver, the server's session threads,
//! the command-line clients) read it here, so that every `Instant` in a process is on one
//! timeline and comparable across sessions.

pub use ldm7_types::backoff;
pub mod bound;
pub mod clock;
pub mod log_target;

pub use backoff::Backoff;
pub use bound::{BoundHits, Throttle};
pub use clock::Clock;
