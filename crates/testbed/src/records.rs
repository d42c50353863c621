//! Per-product records of a queue and its server's log, and the check of one queue against
//! another.
//!
//! A record joins a product in the queue (signature, size, creation = `info.arrival`, insertion
//! = the queue's insertion stamp, each product's data checked against its MD5 signature) with
//! its delivery line in the log of an LDM-7 subscriber (`Received`, `Inserted`, `Backlog`: mode,
//! retransmitted blocks; written and read by `ldm7_metrics::delivery`). The join key is the
//! product's printed metadata (`ProdInfo`'s `Display`, the `info: "…"` of the line), which holds
//! the creation time to the microsecond and the identifier.
//!
//! Latency = insertion − creation. In the lab every host shares one clock, and a replayed
//! product's creation time is its insertion time at the publisher, so this is the time from the
//! publisher's queue to the subscriber's (the research's latency, RESEARCH.md §5).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::Path;

use ldm7_pq::Queue;
use ldm7_types::{Signature, Timestamp};
use md5::{Digest, Md5};

use crate::{Result, TestbedError};

pub use ldm7_metrics::{DeliveryLine, DeliveryMode};

/// One product in a queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProductRecord {
    /// Its MD5 signature (from its metadata).
    pub signature: Signature,
    /// Its size, bytes.
    pub size: u64,
    /// Its creation time (`info.arrival`).
    pub created: Timestamp,
    /// When it was inserted into this queue.
    pub inserted: Timestamp,
    /// `inserted − created`, microseconds.
    pub latency_us: i64,
    /// How it arrived, from its delivery line (`None`: no line, e.g. an LDM-6 downstream or the
    /// publisher itself).
    pub mode: Option<DeliveryMode>,
    /// Blocks repaired over TCP (FMTP deliveries only).
    pub retransmitted_blocks: Option<u32>,
    /// Whether the MD5 of its data equals its signature.
    pub intact: bool,
    /// Its printed metadata.
    pub info: String,
}

/// Reads every product of the queue at `queue` (checking each one's MD5) and, when `log` is
/// given, joins each with its delivery line. Products come in insertion order.
/// Statistics products (`ldm7-stats/…`) are left out: they are the server's own, not the data
/// under test.
pub fn read_records(queue: &Path, log: Option<&str>) -> Result<Vec<ProductRecord>> {
    let error = |message: String| TestbedError::Queue { path: queue.to_path_buf(), message };
    let lines = log.map(delivery_lines).unwrap_or_default();
    let opened = Queue::open(queue).map_err(|e| error(e.to_string()))?;
    let snapshot = opened.snapshot().map_err(|e| error(e.to_string()))?;
    let mut records = Vec::new();
    for product in snapshot.products_from(Timestamp::ZERO).map_err(|e| error(e.to_string()))? {
        let product = product.map_err(|e| error(e.to_string()))?;
        // A server's own statistics products are not part of the data under test.
        if ldm7_metrics::StatsProduct::is_stats_ident(&product.info.ident) {
            continue;
        }
        let digest: [u8; 16] = Md5::digest(product.data).into();
        let info = product.info.to_string();
        let line = lines.get(info.as_str());
        records.push(ProductRecord {
            signature: product.info.signature,
            size: product.data.len() as u64,
            created: product.info.arrival,
            inserted: product.insertion,
            latency_us: product.insertion.as_unix_micros() - product.info.arrival.as_unix_micros(),
            mode: line.map(|line| line.mode),
            retransmitted_blocks: line.and_then(|line| line.retransmitted_blocks),
            intact: Signature(digest) == product.info.signature,
            info,
        });
    }
    Ok(records)
}

/// Counts of a subscriber's log: delivery lines per mode and rejected duplicates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogCounts {
    /// `Received` lines.
    pub received: usize,
    /// `Inserted` lines.
    pub inserted: usize,
    /// `Backlog` lines.
    pub backlog: usize,
    /// `Duplicate data-product` lines (a second copy the queue refused).
    pub duplicates: usize,
    /// `Received` lines with at least one retransmitted block.
    pub repaired: usize,
}

impl LogCounts {
    /// Counts the lines of `log`.
    pub fn of(log: &str) -> LogCounts {
        let mut counts = LogCounts::default();
        for line in log.lines() {
            if line.contains(" Duplicate data-product: ") {
                counts.duplicates += 1;
            } else if let Some(delivery) = DeliveryLine::parse(line) {
                match delivery.mode {
                    DeliveryMode::Received => {
                        counts.received += 1;
                        counts.repaired += usize::from(delivery.retransmitted_blocks.unwrap_or(0) > 0);
                    }
                    DeliveryMode::Inserted => counts.inserted += 1,
                    DeliveryMode::Backlog => counts.backlog += 1,
                }
            }
        }
        counts
    }

    /// Delivery lines of every mode.
    pub fn delivered(&self) -> usize {
        self.received + self.inserted + self.backlog
    }
}

impl fmt::Display for LogCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Received {} ({} repaired), Inserted {}, Backlog {}, duplicates refused {}",
            self.received, self.repaired, self.inserted, self.backlog, self.duplicates
        )
    }
}

/// One subscriber's queue against the publisher's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Comparison {
    /// Products of the publisher the subscriber lacks (their printed metadata).
    pub missing: Vec<String>,
    /// Products the subscriber has that the publisher does not.
    pub unexpected: Vec<String>,
    /// Products whose data does not match their signature (either queue).
    pub corrupt: Vec<String>,
}

impl Comparison {
    /// Compares `subscriber`'s records with `publisher`'s.
    pub fn of(publisher: &[ProductRecord], subscriber: &[ProductRecord]) -> Comparison {
        let expected: HashSet<Signature> = publisher.iter().map(|r| r.signature).collect();
        let got: HashSet<Signature> = subscriber.iter().map(|r| r.signature).collect();
        let corrupt = publisher.iter().chain(subscriber).filter(|r| !r.intact).map(|r| r.info.clone()).collect();
        Comparison {
            missing: publisher.iter().filter(|r| !got.contains(&r.signature)).map(|r| r.info.clone()).collect(),
            unexpected: subscriber
                .iter()
                .filter(|r| !expected.contains(&r.signature))
                .map(|r| r.info.clone())
                .collect(),
            corrupt,
        }
    }

    /// Whether the subscriber holds exactly the publisher's products, all intact.
    pub fn is_exact(&self) -> bool {
        self.missing.is_empty() && self.unexpected.is_empty() && self.corrupt.is_empty()
    }
}

impl fmt::Display for Comparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} missing, {} unexpected, {} corrupt",
            self.missing.len(),
            self.unexpected.len(),
            self.corrupt.len()
        )?;
        for (what, list) in [("missing", &self.missing), ("unexpected", &self.unexpected), ("corrupt", &self.corrupt)] {
            for info in list.iter().take(3) {
                write!(f, "\n  {what}: {info}")?;
            }
        }
        Ok(())
    }
}

fn delivery_lines(log: &str) -> HashMap<&str, DeliveryLine<'_>> {
    log.lines().filter_map(DeliveryLine::parse).map(|line| (line.info, line)).collect()
}

/// Quantiles of latencies (microseconds; `ldm7_types::quantile`); `None` when there are none.
pub fn latency_quantile_us(records: &[&ProductRecord], quantile: f64) -> Option<i64> {
    ldm7_types::quantile::quantile_of(records.iter().map(|r| r.latency_us), quantile)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RECEIVED: &str = "20261123T115936.301490Z ldm7[22800] INFO Received: {latency: 15714 µs, index: 3, \
        retrans: 7, info: \"     12725 20261123115936.285705 NGRID 004  NGRID/x/4 20150615000000.227000\"}";

    #[test]
    fn delivery_lines_parse_in_every_mode() {
        let line = DeliveryLine::parse(RECEIVED).expect("parsed");
        assert_eq!(line.mode, DeliveryMode::Received);
        assert_eq!(line.latency_us, 15714);
        assert_eq!(line.retransmitted_blocks, Some(7));
        assert_eq!(line.info, "     12725 20261123115936.285705 NGRID 004  NGRID/x/4 20150615000000.227000");
        let backlog = "x ldm7[1] INFO Backlog: {latency: -5 µs, index: -, retrans: -, info: \"a b\"}";
        let line = DeliveryLine::parse(backlog).expect("parsed");
        assert_eq!(
            (line.mode, line.latency_us, line.retransmitted_blocks, line.info),
            (DeliveryMode::Backlog, -5, None, "a b")
        );
        assert!(DeliveryLine::parse("x ldm7[1] INFO Duplicate data-product: a b").is_none());
        assert!(DeliveryLine::parse("x ldm7[1] NOTE Received: {latency: 5 µs").is_none());
    }

    #[test]
    fn log_counts_count_modes_repairs_and_duplicates() {
        let log = format!(
            "{RECEIVED}\n{}\nx INFO Inserted: {{latency: 9 µs, index: 4, retrans: -, info: \"b\"}}\n\
             x INFO Duplicate data-product: c\n",
            RECEIVED.replace("retrans: 7", "retrans: 0")
        );
        let counts = LogCounts::of(&log);
        assert_eq!(counts, LogCounts { received: 2, inserted: 1, backlog: 0, duplicates: 1, repaired: 1 });
        assert_eq!(counts.delivered(), 3);
    }

    #[test]
    fn queues_are_read_into_records_joined_with_their_lines() {
        use ldm7_pq::Capacity;
        use ldm7_types::{FeedType, ProdInfo};
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("q.pq");
        let queue = Queue::create(&path, Capacity { bytes: 1 << 20, slots: 16 }, true).expect("create");
        let mut infos = Vec::new();
        for k in 0..3u8 {
            let data = vec![k; 100 + usize::from(k)];
            let info = ProdInfo {
                arrival: Timestamp { secs: 1_700_000_000, micros: i32::from(k) },
                signature: Signature::md5_of(&data),
                origin: "here".into(),
                feedtype: FeedType::EXP,
                seqno: u32::from(k),
                ident: format!("p/{k}"),
                size: data.len() as u32,
            };
            queue.insert(&info, &data).expect("insert");
            infos.push(info);
        }
        drop(queue);
        let log = format!("t INFO Received: {{latency: 3 µs, index: 0, retrans: 2, info: \"{}\"}}\n", infos[1]);
        let records = read_records(&path, Some(&log)).expect("read");
        assert_eq!(records.len(), 3);
        assert!(records.iter().all(|r| r.intact));
        assert_eq!(records[1].mode, Some(DeliveryMode::Received));
        assert_eq!(records[1].retransmitted_blocks, Some(2));
        assert_eq!(records[0].mode, None);
        assert_eq!(records[2].size, 102);
        let fewer = &records[..2];
        let comparison = Comparison::of(&records, fewer);
        assert_eq!((comparison.missing.len(), comparison.is_exact()), (1, false));
        assert!(Comparison::of(&records, &records).is_exact());
        let all: Vec<&ProductRecord> = records.iter().collect();
        assert!(latency_quantile_us(&all, 0.5).is_some());
    }
}
