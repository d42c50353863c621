//! The vocabulary of ldm7: feedtypes, product signatures, timestamps, product metadata
//! ([`ProdInfo`]), product classes (feed + pattern + time range), the protocols' time
//! ([`Instant`], [`Duration`], [`WallTime`]) and operator quantities ([`units`]: rates, sizes,
//! durations parsed once from text).
//!
//! This crate is sans-IO: no sockets, threads, clocks or randomness. Wire and printed forms
//! follow `docs/spec/ldm-formats.md` §3 (feedtypes) and §5 (printed forms).

pub mod backoff;
pub mod class;
pub mod content;
pub mod feedtype;
pub mod host;
pub mod instant;
pub mod prodinfo;
pub mod quantile;
pub mod signature;
pub mod time;
pub mod trace;
pub mod units;

pub use class::{Pattern, ProdClass, ProdSpec};
pub use feedtype::FeedType;
pub use host::{HostPort, HostPortError};
pub use instant::{Instant, WallClock, WallTime};
pub use prodinfo::ProdInfo;
pub use signature::Signature;
pub use std::time::Duration;
pub use time::Timestamp;
pub use units::{ByteSize, LossPercent, QuantityError, Rate};

/// Longest origin host name LDM accepts (`HOSTNAMESIZE`, ldm6-protocol.md §3).
pub const ORIGIN_LEN_MAX: usize = 64;
/// Longest product identifier LDM accepts (`KEYSIZE`, ldm6-protocol.md §3).
pub const IDENT_LEN_MAX: usize = 255;
/// Longest product-class pattern LDM accepts (`MAXPATTERN`, ldm6-protocol.md §3).
pub const PATTERN_LEN_MAX: usize = 255;
