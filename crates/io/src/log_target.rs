//! Log targets with a meaning for the one subscriber of the `ldm7` binary.
//!
//! Every crate logs through `tracing`; the binary prints LDM-style lines (ldm-formats.md §5)
//! with LDM's levels. tracing has no NOTE level, so the mapping is:
//!
//! | tracing | target | printed as | shown |
//! |---|---|---|---|
//! | ERROR | any | ERROR | always |
//! | WARN | any | WARN | always |
//! | INFO | [`PRODUCT`] | INFO | with `-v` (or `-x`) |
//! | INFO | any other | NOTE | always |
//! | DEBUG | any | DEBUG | with `-x` |
//!
//! So: session-level events (a session starting or ending, a reload) are `tracing::info!`;
//! the per-product lines LDM logs at INFO (`sending: …`, an insertion, a duplicate) and the
//! other lines LDM keeps for its verbose mode are `tracing::info!(target: PRODUCT, …)`.

/// The target of the lines LDM logs at INFO: one per product, shown only in verbose mode.
pub const PRODUCT: &str = "ldm7::product";
