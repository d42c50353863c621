//! The subscriber's delivery record: one per product that reached the queue, in one of three
//! modes (RESEARCH.md §5; ldm7-multicast.md §5), logged as one line and counted.
//!
//! Line format (the reference's `Received:` line with the latency in microseconds, and the same
//! fields for the other two modes so that one parser reads them all):
//!
//! ```text
//! Received: {latency: 1843 µs, index: 17, retrans: 0, info: "     12345 20261123101500.123456 NGRID 000  ident"}
//! Inserted: {latency: 81234 µs, index: 18, retrans: -, info: "…"}
//! Backlog: {latency: 3601234567 µs, index: -, retrans: -, info: "…"}
//! ```
//!
//! `Received` = by FMTP (multicast, with `retrans` blocks repaired over TCP; 0 = multicast
//! itself sufficed); `Inserted` = by the unicast backstop (REQUEST_PRODUCT); `Backlog` = by the
//! backlog after an outage (REQUEST_BACKLOG). Latency = when the product reached the queue −
//! the BOP's creation time at the publisher when FMTP saw the product, else the product's own
//! creation (arrival) time; clocks of two hosts disagree a little, so small negative values
//! occur.

use std::fmt;

use ldm7_fmtp_proto::ProductIndex;
use ldm7_types::ProdInfo;

/// How a product reached the subscriber's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeliveryMode {
    /// By FMTP.
    Received,
    /// By the backstop.
    Inserted,
    /// By the backlog.
    Backlog,
}

impl DeliveryMode {
    /// The line's keyword.
    pub fn keyword(self) -> &'static str {
        match self {
            Self::Received => "Received",
            Self::Inserted => "Inserted",
            Self::Backlog => "Backlog",
        }
    }
}

/// One product delivered into the queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// How.
    pub mode: DeliveryMode,
    /// Microseconds from the product's creation (BOP time) to its insertion.
    pub latency_us: i64,
    /// Its FMTP index (none for backlog products).
    pub index: Option<ProductIndex>,
    /// Blocks repaired over TCP (FMTP only).
    pub retransmitted_blocks: Option<u32>,
    /// The product.
    pub info: ProdInfo,
}

impl fmt::Display for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {{latency: {} µs, index: ", self.mode.keyword(), self.latency_us)?;
        match self.index {
            Some(index) => write!(f, "{}", index.0)?,
            None => f.write_str("-")?,
        }
        f.write_str(", retrans: ")?;
        match self.retransmitted_blocks {
            Some(blocks) => write!(f, "{blocks}")?,
            None => f.write_str("-")?,
        }
        write!(f, ", info: \"{}\"}}", self.info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ldm7_types::{FeedType, Signature, Timestamp};

    #[test]
    fn lines_have_one_shape_for_every_mode() {
        let info = ProdInfo {
            arrival: Timestamp { secs: 1_700_000_000, micros: 123_456 },
            signature: Signature::md5_of(b"x"),
            origin: "vm".into(),
            feedtype: FeedType::EXP,
            seqno: 7,
            ident: "TEST/1".into(),
            size: 1,
        };
        let received = Delivery {
            mode: DeliveryMode::Received,
            latency_us: 1843,
            index: Some(ProductIndex(17)),
            retransmitted_blocks: Some(0),
            info: info.clone(),
        };
        assert_eq!(
            received.to_string(),
            "Received: {latency: 1843 µs, index: 17, retrans: 0, info: \"         1 20231114221320.123456 EXP 007  TEST/1\"}"
        );
        let backlog =
            Delivery { mode: DeliveryMode::Backlog, latency_us: -5, index: None, retransmitted_blocks: None, info };
        assert!(backlog.to_string().starts_with("Backlog: {latency: -5 µs, index: -, retrans: -, info: "));
    }
}
