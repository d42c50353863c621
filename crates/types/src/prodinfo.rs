//! Product metadata (`prod_info`, ldm6-protocol.md §4).

use crate::{FeedType, Signature, Timestamp};

/// What LDM knows about a product besides its bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ProdInfo {
    /// Creation ("arrival") time of the product at its origin, with microseconds.
    pub arrival: Timestamp,
    /// The 16-byte signature (MD5) that identifies the product; duplicates share it.
    pub signature: Signature,
    /// Host that created or injected the product (at most [`crate::ORIGIN_LEN_MAX`] bytes).
    pub origin: String,
    /// The product's feedtype (normally one bit).
    pub feedtype: FeedType,
    /// Sequence number chosen by the producer.
    pub seqno: u32,
    /// Product identifier, what patterns match (at most [`crate::IDENT_LEN_MAX`] bytes).
    pub ident: String,
    /// Size of the product's data in bytes.
    pub size: u32,
}
