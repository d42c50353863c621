//! QueueDelivery metrics of LDM-7, as the research defines them (RESEARCH.md §5), with no I/O and no
//! clock: callers hand in delivery events and times.
//!
//! * [`sums`]: a delivery event per product at a subscriber, and per link (feed, publisher,
//!   subscriber) and minute the sums N, N′, N″, S, S′, S″, L′, L″, B and the backstop and
//!   backlog counts; the derived metrics (throughputs, FMTP file delivery ratios, multicast
//!   packet loss rate) from any set of minutes by adding their sums first.
//! * [`product`]: the statistics product every subscriber publishes each minute (the
//!   distribution system carries its own statistics): a documented, versioned text format.
//! * [`rtstats`]: the classic LDM 6 `rtstats` product (ldm-formats.md §7), so LDM 6 hosts show
//!   too.

pub mod delivery;
pub mod product;
pub mod rtstats;
pub mod sums;

pub use delivery::{DeliveryLine, DeliveryMode, QueueDelivery};
pub use product::{ProductError, StatsProduct};
pub use rtstats::{RtStats, RtStatsBins, RtStatsError};
pub use sums::{Aggregator, BLOCK_SIZE, DeliveryEvent, Derived, Link, Minute, MinuteRow, MinuteSums, Mode};
