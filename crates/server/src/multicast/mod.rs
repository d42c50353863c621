//! The LDM-7 multicast service (ldm7-multicast.md §2, §4; RESEARCH.md §2–§3): per-feed FMTP
//! client address pools ([`pool`]) and the persistent product-index maps ([`index_map`]).

pub mod index_map;
pub mod pool;
