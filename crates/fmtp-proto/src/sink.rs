//! Where a [`Receiver`](crate::Receiver) writes product bytes when it does not assemble them in
//! memory ([`Assembly::Sink`](crate::Assembly::Sink)): the receiving counterpart of the
//! sender's [`ProductData`](crate::ProductData).
//!
//! The trait is synchronous and small so that the state machine stays sans-IO: the driver
//! implements it (a spool file per product, a reservation in the product queue), the tests with
//! memory. Every product the receiver opens is closed exactly once, `completed` or not, before
//! the product's `Delivered` or `Missed` event is queued; each byte `[0, size)` of a completed
//! product was written exactly once (blocks arrive in any order, retransmissions included).
//! A failing sink (disk full, queue full) never stops the receiver: the product is reported
//! missed with [`MissReason::SinkFailed`](crate::MissReason::SinkFailed) and the application
//! fetches it another way.

use std::fmt;

use crate::index::ProductIndex;

/// Takes the bytes of the products a receiver assembles. See the module documentation for the
/// call order.
pub trait ProductSink: Send {
    /// A product's BOP arrived: make room for `size` bytes. `metadata` is the BOP metadata (LDM:
    /// the MD5 signature). An error makes the product missed.
    fn open(&mut self, index: ProductIndex, size: u32, metadata: &[u8]) -> Result<(), SinkError>;

    /// Bytes `[offset, offset + bytes.len())` of an open product, inside `[0, size)`. An error
    /// makes the product missed (the sink is then closed with `completed = false`).
    fn write_at(&mut self, index: ProductIndex, offset: u32, bytes: &[u8]) -> Result<(), SinkError>;

    /// The product is finished: `completed` when every byte was written (its `Delivered` event
    /// follows), otherwise abandoned (discard what was written; its `Missed` event follows).
    fn close(&mut self, index: ProductIndex, completed: bool);

    /// Whether [`ProductSink::read_at`] works: a receiver repairs by parity
    /// ([`ReceiverConfig::parity`](crate::ReceiverConfig::parity)) into a sink only when it can
    /// read back the blocks a decode needs.
    fn reads_back(&self) -> bool {
        false
    }

    /// Reads bytes `[offset, offset + out.len())` written earlier to an open product.
    fn read_at(&mut self, index: ProductIndex, offset: u32, out: &mut [u8]) -> Result<(), SinkError> {
        let _ = (index, offset, out);
        Err(SinkError::new("this product sink cannot read back"))
    }
}

/// A sink could not take a product (the driver says why; the receiver only counts it).
#[derive(Debug, thiserror::Error)]
#[error("product sink failed: {0}")]
pub struct SinkError(Box<dyn std::error::Error + Send + Sync>);

impl SinkError {
    /// Wraps the underlying error (an I/O error, a message).
    pub fn new(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self(error.into())
    }
}

/// The receiver's handle on its sink (a named type so that the receiver can stay `Debug`).
pub(crate) struct SinkSlot(pub(crate) Box<dyn ProductSink>);

impl fmt::Debug for SinkSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ProductSink")
    }
}
