//! What a run did ([`Report`], per receiver [`ReceiverReport`]), its deliveries one by one
//! ([`DeliveryRecord`]), and a failed run ([`Failure`]).

use std::fmt;
use std::time::Duration;

use ldm7_fmtp_proto::{Instant, ProductIndex, ReceiverCounters, SenderCounters};

use crate::ledger::{ReceiverTally, Violation};
use crate::stats::LatencyStats;

use super::Simulation;

/// One delivery at one receiver (kept with [`Simulation::with_delivery_log`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeliveryRecord {
    /// The receiver.
    pub receiver: usize,
    /// When it completed.
    pub at: Instant,
    /// From the product's creation to its completion.
    pub latency: Duration,
    /// Its size.
    pub bytes: u32,
    /// Blocks of it that came by repair.
    pub retransmitted_blocks: u32,
}

/// A failed run: which invariant broke, when, and the seed that replays it.
#[derive(Debug, thiserror::Error)]
#[error("simulation failed at {at} (seed {seed}): {violation}; replay with LDM7_SEED={seed}")]
pub struct Failure {
    /// The seed.
    pub seed: u64,
    /// Virtual time of the failure.
    pub at: Instant,
    /// What broke.
    pub violation: Violation,
}

/// What a run did.
#[derive(Clone, Debug)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// Products the sender accepted (the liveness sentinel included).
    pub products: u64,
    /// Products the sender refused because no receiver was connected (LDM policy).
    pub products_skipped: u64,
    /// Bytes of the accepted products.
    pub product_bytes: u64,
    /// Virtual time of the last activity (stale timer wakes of cancelled timers excluded).
    pub virtual_time: Instant,
    /// Events processed.
    pub events: u64,
    /// Multicast datagrams the sender emitted.
    pub multicast_datagrams: u64,
    /// Of those, lost before the fan-out (shared loss, bottleneck queue).
    pub multicast_lost_shared: u64,
    /// Bytes through the repair uplink, and the longest a repair waited in it (zero without one).
    pub repair_uplink: (u64, Duration),
    /// Receiver deliveries of multicast datagrams (after per-receiver loss).
    pub datagram_deliveries: u64,
    /// Deliveries of products taken whole
    /// ([`SimConfig::whole_products`](crate::SimConfig::whole_products)).
    pub whole_products: u64,
    /// Products asked for through the LDM-7 backstop (with [`crate::sim::Backstop`]).
    pub backstop_requests: u64,
    /// Backlog and fence requests the subscribers' decisions made (not served: no restarts).
    pub backlog_requests: u64,
    /// The sender's counters.
    pub sender: SenderCounters,
    /// Per receiver, in configuration order.
    pub receivers: Vec<ReceiverReport>,
}

/// One receiver's results.
#[derive(Clone, Debug)]
pub struct ReceiverReport {
    /// Outcomes, retransmissions and latencies.
    pub tally: ReceiverTally,
    /// The receiver's own counters.
    pub counters: ReceiverCounters,
    /// The first product it got a datagram of.
    pub first_contact: Option<ProductIndex>,
    /// Multicast datagrams it lost.
    pub datagrams_lost: u64,
}

impl Report {
    /// The publisher's bytes sent (multicast, unicast repairs and parity shards, FMTP headers
    /// included) per product byte.
    pub fn egress_per_product_byte(&self) -> f64 {
        let sent = self.sender.multicast_bytes + self.sender.retx_bytes + self.sender.parity_bytes;
        sent as f64 / self.product_bytes.max(1) as f64
    }

    /// Products delivered, all receivers.
    pub fn delivered(&self) -> u64 {
        self.receivers.iter().map(|r| r.tally.delivered).sum()
    }

    /// Products missed, all receivers.
    pub fn missed(&self) -> u64 {
        self.receivers.iter().map(|r| r.tally.missed).sum()
    }

    /// Products the LDM-7 backstop brought, all receivers.
    pub fn backstop(&self) -> u64 {
        self.receivers.iter().map(|r| r.tally.backstop).sum()
    }

    /// Products reported through index gaps, all receivers.
    pub fn gap_reported(&self) -> u64 {
        self.receivers.iter().map(|r| r.tally.gap_reported).sum()
    }

    /// Products lost whole before a receiver's first contact, all receivers.
    pub fn unknown_before_first_contact(&self) -> u64 {
        self.receivers.iter().map(|r| r.tally.unknown_before_first_contact).sum()
    }

    /// Retransmitted blocks over delivered products, all receivers.
    pub fn retransmitted_blocks(&self) -> u64 {
        self.receivers.iter().map(|r| r.tally.retransmitted_blocks).sum()
    }

    /// Latencies of the given receivers together.
    pub fn latency_of(&self, receivers: impl IntoIterator<Item = usize>) -> LatencyStats {
        let mut stats = LatencyStats::default();
        for receiver in receivers {
            stats.merge(&self.receivers[receiver].tally.latency);
        }
        stats
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let latency = self.latency_of(0..self.receivers.len());
        writeln!(
            f,
            "seed {}: {} products ({} bytes, {} skipped) to {} receivers in {} virtual",
            self.seed,
            self.products,
            self.product_bytes,
            self.products_skipped,
            self.receivers.len(),
            self.virtual_time
        )?;
        writeln!(
            f,
            "delivered {}, missed {}, gap-reported {}, unknown before first contact {}, retransmitted blocks {}",
            self.delivered(),
            self.missed(),
            self.gap_reported(),
            self.unknown_before_first_contact(),
            self.retransmitted_blocks()
        )?;
        if self.backstop_requests > 0 {
            writeln!(
                f,
                "backstop: {} products asked for, {} brought; missed for good {}",
                self.backstop_requests,
                self.backstop(),
                (self.missed() + self.gap_reported()).saturating_sub(self.backstop())
            )?;
        }
        writeln!(
            f,
            "publisher egress {:.3} per product byte (multicast {}, repairs {}, parity {} bytes)",
            self.egress_per_product_byte(),
            self.sender.multicast_bytes,
            self.sender.retx_bytes,
            self.sender.parity_bytes
        )?;
        write!(
            f,
            "latency mean {:?} p99 {:?} max {:?}; {} multicast datagrams ({} lost before fan-out); {} events; {} \
             deliveries taken whole",
            latency.mean(),
            latency.quantile(0.99),
            latency.max(),
            self.multicast_datagrams,
            self.multicast_lost_shared,
            self.events,
            self.whole_products
        )?;
        let (bytes, wait_max) = self.repair_uplink;
        if bytes > 0 {
            write!(f, "; repair uplink {bytes} bytes, longest wait {wait_max:?}")?;
        }
        Ok(())
    }
}

impl Simulation {
    /// The report so far (products members took whole since their last visit count once
    /// [`Simulation::finish`] has brought them up to date).
    pub fn report(&self) -> Report {
        Report {
            seed: self.seed,
            products: self.ledger.product_count() as u64,
            products_skipped: self.counters.products_skipped,
            product_bytes: self.counters.product_bytes,
            virtual_time: self.last_active,
            events: self.counters.events,
            multicast_datagrams: self.counters.multicast_datagrams,
            multicast_lost_shared: self.counters.multicast_lost_shared,
            repair_uplink: self
                .repair_uplink
                .as_ref()
                .map_or((0, Duration::ZERO), |uplink| (uplink.bytes, uplink.wait_max)),
            datagram_deliveries: self.counters.datagram_deliveries,
            whole_products: self.counters.whole_products,
            backstop_requests: self.counters.backstop_requests,
            backlog_requests: self.counters.backlog_requests,
            sender: self.sender.counters().clone(),
            receivers: (0..self.nodes.len())
                .map(|n| ReceiverReport {
                    tally: self.ledger.tally(n).clone(),
                    counters: self.nodes[n].receiver.counters().clone(),
                    first_contact: self.ledger.first_contact(n),
                    datagrams_lost: self.nodes[n].datagrams_lost,
                })
                .collect(),
        }
    }
}
