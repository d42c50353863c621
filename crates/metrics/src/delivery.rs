//! The subscriber's delivery record: one per product that reached the queue, in one of three
//! modes (RESEARCH.md §5; ldm7-multicast.md §5), logged as one line and counted.
//!
//! Written ([`QueueDelivery`]'s `Display`) and read back ([`DeliveryLine::parse`]: the test harness,
//! the demo, the lab's records) by this module only. Line format (the reference's `Received:`
//! line with the latency in microseconds, and the same fields for the other two modes so that
//! one parser reads them all):
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

use ldm7_types::ProdInfo;

/// How a product reached the subscriber's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeliveryMode {
    /// By FMTP.
    Received,
    /// By the backstop.
    Inserted,
    /// By the backlog.
    Backlog,
}

impl DeliveryMode {
    /// Every mode, in the order of the keywords.
    pub const ALL: [DeliveryMode; 3] = [DeliveryMode::Received, DeliveryMode::Inserted, DeliveryMode::Backlog];

    /// The line's keyword.
    pub fn keyword(self) -> &'static str {
        match self {
            Self::Received => "Received",
            Self::Inserted => "Inserted",
            Self::Backlog => "Backlog",
        }
    }
}

impl fmt::Display for DeliveryMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.keyword())
    }
}

/// One product delivered into the queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueDelivery {
    /// How.
    pub mode: DeliveryMode,
    /// Microseconds from the product's creation (BOP time) to its insertion.
    pub latency_us: i64,
    /// Its FMTP index (none for backlog products).
    pub index: Option<u32>,
    /// Blocks repaired over TCP (FMTP only).
    pub retransmitted_blocks: Option<u32>,
    /// The product.
    pub info: ProdInfo,
}

impl fmt::Display for QueueDelivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {{latency: {} µs, index: ", self.mode.keyword(), self.latency_us)?;
        match self.index {
            Some(index) => write!(f, "{index}")?,
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

/// A delivery line read back: what [`QueueDelivery`] wrote, the product as its printed metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeliveryLine<'a> {
    /// Its mode.
    pub mode: DeliveryMode,
    /// The latency it states, microseconds.
    pub latency_us: i64,
    /// Its FMTP index (`-` for the backlog).
    pub index: Option<u32>,
    /// Retransmitted blocks (`-` for the backstop and the backlog).
    pub retransmitted_blocks: Option<u32>,
    /// The product's printed metadata (`ProdInfo`'s `Display`).
    pub info: &'a str,
}

impl<'a> DeliveryLine<'a> {
    /// The delivery a log line carries (`… INFO Received: {latency: N µs, index: I, retrans:
    /// B, info: "…"}`, and the `Inserted` and `Backlog` forms, after any prefix); `None` for any
    /// other line.
    pub fn parse(line: &'a str) -> Option<Self> {
        let (mode, rest) = DeliveryMode::ALL.iter().find_map(|mode| {
            let marker = format!("{}: {{latency: ", mode.keyword());
            let at = line.find(&marker)?;
            (at == 0 || line[..at].ends_with(' ')).then(|| (*mode, &line[at + marker.len()..]))
        })?;
        let (latency, rest) = rest.split_once(" µs, index: ")?;
        let (index, rest) = rest.split_once(", retrans: ")?;
        let (retrans, rest) = rest.split_once(", info: \"")?;
        let info = rest.strip_suffix("\"}")?;
        Some(Self {
            mode,
            latency_us: latency.parse().ok()?,
            index: index.parse().ok(),
            retransmitted_blocks: retrans.parse().ok(),
            info,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ldm7_types::{FeedType, Signature, Timestamp};

    fn info(micros: i32, ident: &str) -> ProdInfo {
        ProdInfo {
            arrival: Timestamp { secs: 1_700_000_000, micros },
            signature: Signature::md5_of(b"x"),
            origin: "vm".into(),
            feedtype: FeedType::EXP,
            seqno: 7,
            ident: ident.into(),
            size: 1,
        }
    }

    #[test]
    fn lines_have_one_shape_for_every_mode() {
        let info = info(123_456, "TEST/1");
        let received = QueueDelivery {
            mode: DeliveryMode::Received,
            latency_us: 1843,
            index: Some(17),
            retransmitted_blocks: Some(0),
            info: info.clone(),
        };
        assert_eq!(
            received.to_string(),
            "Received: {latency: 1843 µs, index: 17, retrans: 0, info: \"         1 20231114221320.123456 EXP 007  TEST/1\"}"
        );
        let backlog = QueueDelivery {
            mode: DeliveryMode::Backlog,
            latency_us: -5,
            index: None,
            retransmitted_blocks: None,
            info,
        };
        assert!(backlog.to_string().starts_with("Backlog: {latency: -5 µs, index: -, retrans: -, info: "));
    }

    #[test]
    fn every_line_written_reads_back_the_same() {
        let info = info(1, "an \"odd\" ident: {x}");
        let printed = info.to_string();
        for (mode, index, blocks) in [
            (DeliveryMode::Received, Some(4), Some(2)),
            (DeliveryMode::Inserted, Some(5), None),
            (DeliveryMode::Backlog, None, None),
        ] {
            let delivery =
                QueueDelivery { mode, latency_us: -7, index, retransmitted_blocks: blocks, info: info.clone() };
            let line = format!("20261123T115936.301490Z ldm7[22800] INFO {delivery}");
            assert_eq!(
                DeliveryLine::parse(&line),
                Some(DeliveryLine { mode, latency_us: -7, index, retransmitted_blocks: blocks, info: &printed })
            );
        }
        assert_eq!(DeliveryLine::parse("x ldm7[1] NOTE Received: {latency: 5 µs"), None);
        assert_eq!(DeliveryLine::parse("x NOTE NotReceived: {latency: 5 µs, index: 1, retrans: 0, info: \"a\"}"), None);
    }
}
