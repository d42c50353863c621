//! The LDM-7 multicast service (ldm7-multicast.md §2, §4; RESEARCH.md §2–§3): per-feed FMTP
//! client address pools ([`pool`]), the persistent product-index maps ([`index_map`]), and LDM
//! products as FMTP carries them ([`product`]).

pub mod delivery;
pub mod downstream7;
pub mod index_map;
pub mod pool;
pub mod product;
pub mod publisher;
pub(crate) mod upstream7;

pub use publisher::{Multicaster, PublisherCounters, Refusal, Subscription};
