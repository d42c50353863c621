//! The unicast baseline: LDM-6 as the IDD runs it, a relay tree over TCP, modelled at the level
//! of products (no packets), so that it runs at IDD scale in a moment and sits beside the FMTP
//! simulation of the same workload.
//!
//! The publisher feeds the top tier; each relay feeds its share of the next tier; the leaves
//! are the subscribers. Every node sends each product once to each of its children, in the
//! order the products reached it, over its own uplink (one FIFO at the uplink rate: an LDM
//! upstream's connections share its network interface), and a relay sends a product on only
//! once it holds all of it (it inserts into its queue first). A connection to a child then takes
//! the link's one-way delay; its throughput is capped by TCP under loss (the Mathis bound
//! `MSS / (RTT · sqrt(2p/3))`) when the link loses packets.
//!
//! What it reports is what the research compares: the publisher's egress per ingested byte,
//! and each subscriber's latency and throughput (bytes over summed latency).

use std::time::Duration;

use crate::stats::LatencyStats;
use crate::workload::Workload;

/// TCP's maximum segment size on the links, bytes.
const MSS: f64 = 1448.0;

/// The shape of the tree and its links.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RelayTree {
    /// Subscribers (the leaves).
    pub subscribers: usize,
    /// Children of the publisher (the top tier: relays, or the subscribers themselves when
    /// there are no more of them).
    pub top_fanout: usize,
    /// Children of each relay.
    pub relay_fanout: usize,
    /// Each node's uplink rate, bit/s.
    pub uplink_bits_per_s: u64,
    /// One-way delay of every link.
    pub link_delay: Duration,
    /// Packet loss on every link (caps each connection's throughput).
    pub loss: f64,
}

/// A node of the tree.
#[derive(Clone, Debug)]
struct Node {
    children: Vec<usize>,
    /// Whether it is a subscriber (a leaf) — relays are subscribers too in the IDD, but here
    /// the leaves are the subscribers counted.
    leaf: bool,
}

/// What a run of the tree gives.
#[derive(Clone, Debug)]
pub struct RelayReport {
    /// Bytes the workload offered.
    pub ingest_bytes: u64,
    /// Bytes the publisher sent.
    pub publisher_egress_bytes: u64,
    /// Relays in the tree (nodes that are neither the publisher nor a leaf).
    pub relays: usize,
    /// Latency of every product at every subscriber.
    pub latency: LatencyStats,
    /// Per subscriber: its bytes over its summed latency, bit/s (the research's throughput).
    pub throughput_bits_per_s: Vec<f64>,
}

impl RelayReport {
    /// Publisher egress per ingested byte.
    pub fn egress_per_ingest(&self) -> f64 {
        self.publisher_egress_bytes as f64 / self.ingest_bytes.max(1) as f64
    }

    /// The mean of the subscribers' throughputs, bit/s.
    pub fn mean_throughput_bits_per_s(&self) -> f64 {
        let values = &self.throughput_bits_per_s;
        values.iter().sum::<f64>() / values.len().max(1) as f64
    }
}

impl RelayTree {
    /// A tree like the IDD's: the publisher feeds up to `top_fanout` relays, each relay up to
    /// `relay_fanout` nodes of the next tier, until every subscriber has a parent.
    pub fn build(&self) -> Result<Vec<Vec<usize>>, String> {
        if self.subscribers == 0 || self.top_fanout == 0 || self.relay_fanout == 0 {
            return Err("subscribers and fan-outs must be at least 1".into());
        }
        if self.relay_fanout == 1 && self.subscribers > self.top_fanout {
            return Err("a relay fan-out of 1 cannot reach more subscribers than the top tier".into());
        }
        Ok(self.nodes().into_iter().map(|node| node.children).collect())
    }

    /// Node 0 is the publisher; leaves are the subscribers.
    fn nodes(&self) -> Vec<Node> {
        // Tiers from the bottom: the subscribers, then as many relays as they need, …
        let mut tiers = vec![self.subscribers];
        while *tiers.last().expect("a tier") > self.top_fanout {
            let below = *tiers.last().expect("a tier");
            tiers.push(below.div_ceil(self.relay_fanout));
        }
        tiers.reverse();
        let mut nodes = vec![Node { children: Vec::new(), leaf: false }];
        let mut parents = vec![0usize];
        for (depth, &count) in tiers.iter().enumerate() {
            let first = nodes.len();
            let leaf = depth + 1 == tiers.len();
            for k in 0..count {
                let parent = parents[k * parents.len() / count];
                nodes[parent].children.push(first + k);
                nodes.push(Node { children: Vec::new(), leaf });
            }
            parents = (first..first + count).collect();
        }
        nodes
    }

    /// The rate one connection gets under the link's loss (TCP's Mathis bound), bit/s.
    fn connection_cap(&self) -> f64 {
        if self.loss <= 0.0 {
            return f64::INFINITY;
        }
        let rtt = (2.0 * self.link_delay.as_secs_f64()).max(1e-6);
        MSS * 8.0 / (rtt * (2.0 * self.loss / 3.0).sqrt())
    }

    /// Runs `workload` through the tree.
    pub fn run(&self, workload: &Workload) -> Result<RelayReport, String> {
        self.build()?;
        let nodes = self.nodes();
        let uplink = self.uplink_bits_per_s.max(1) as f64;
        let cap = self.connection_cap();
        let delay = self.link_delay.as_secs_f64();
        // When each node holds each product (seconds); the publisher at creation.
        let products = &workload.products;
        let mut holds: Vec<Vec<f64>> = vec![Vec::new(); nodes.len()];
        holds[0] = products.iter().map(|product| product.at.as_secs_f64()).collect();
        let mut egress = vec![0u64; nodes.len()];
        // Nodes are numbered tier by tier, so a parent is done before its children.
        for parent in 0..nodes.len() {
            if nodes[parent].children.is_empty() {
                continue;
            }
            // Products in the order the parent got them (stable for equal times).
            let mut order: Vec<usize> = (0..products.len()).collect();
            order.sort_by(|&a, &b| holds[parent][a].total_cmp(&holds[parent][b]));
            let mut uplink_free = 0.0f64;
            // Each connection's own pace under loss: when it can take its next product.
            let mut connection_free = vec![0.0f64; nodes[parent].children.len()];
            let mut arrivals = vec![vec![0.0f64; products.len()]; nodes[parent].children.len()];
            for &product in &order {
                let bits = f64::from(products[product].size) * 8.0;
                let ready = holds[parent][product];
                for (slot, _) in nodes[parent].children.iter().enumerate() {
                    let start = ready.max(uplink_free).max(connection_free[slot]);
                    let on_uplink = start + bits / uplink;
                    let done = if cap.is_finite() { on_uplink.max(start + bits / cap) } else { on_uplink };
                    uplink_free = on_uplink;
                    connection_free[slot] = done;
                    arrivals[slot][product] = done + delay;
                    egress[parent] += u64::from(products[product].size);
                }
            }
            for (slot, &child) in nodes[parent].children.iter().enumerate() {
                holds[child] = std::mem::take(&mut arrivals[slot]);
            }
        }
        let mut latency = LatencyStats::default();
        let mut throughput_bits_per_s = Vec::new();
        for (node, times) in nodes.iter().zip(&holds) {
            if !node.leaf {
                continue;
            }
            let mut summed = 0.0;
            for (product, &at) in products.iter().zip(times) {
                let taken = (at - product.at.as_secs_f64()).max(0.0);
                summed += taken;
                latency.record((taken * 1e9).round() as i64);
            }
            throughput_bits_per_s.push(workload.total_bytes() as f64 * 8.0 / summed.max(1e-9));
        }
        Ok(RelayReport {
            ingest_bytes: workload.total_bytes(),
            publisher_egress_bytes: egress[0],
            relays: nodes.iter().skip(1).filter(|node| !node.leaf).count(),
            latency,
            throughput_bits_per_s,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::ProductSpec;

    fn tree(subscribers: usize, top_fanout: usize, relay_fanout: usize) -> RelayTree {
        RelayTree {
            subscribers,
            top_fanout,
            relay_fanout,
            uplink_bits_per_s: 8_000_000,
            link_delay: Duration::from_millis(10),
            loss: 0.0,
        }
    }

    #[test]
    fn the_tree_has_the_fanouts_asked_for() {
        let children = tree(570, 20, 10).build().unwrap();
        assert_eq!(children[0].len(), 6, "570 leaves need 57 relays, which need 6 above them");
        let leaves = children.iter().filter(|c| c.is_empty()).count();
        assert_eq!(leaves, 570);
        assert!(children.iter().all(|c| c.len() <= 20));
        // Few subscribers: the publisher feeds them directly.
        assert_eq!(tree(8, 20, 10).build().unwrap()[0].len(), 8);
        assert!(tree(0, 20, 10).build().is_err());
    }

    #[test]
    fn store_and_forward_by_hand() {
        // One product of 1 MB (8 Mbit) at 0 s; uplinks at 8 Mbit/s; 10 ms per link.
        let workload = Workload { products: vec![ProductSpec { at: Duration::ZERO, size: 1_000_000 }] };
        // Two subscribers fed directly: the second waits for the first's copy on the uplink.
        let report = tree(2, 2, 2).run(&workload).unwrap();
        assert_eq!(report.egress_per_ingest(), 2.0);
        assert_eq!(report.latency.count(), 2);
        assert_eq!(report.latency.max(), Duration::from_millis(2010));
        assert_eq!(report.latency.mean(), Duration::from_millis(1510));
        // Four subscribers behind two relays: 1 s + 10 ms to a relay, then 1 s and 2 s more.
        let report = tree(4, 2, 2).run(&workload).unwrap();
        assert_eq!((report.relays, report.egress_per_ingest()), (2, 2.0));
        assert_eq!(report.latency.max(), Duration::from_millis(2010 + 2010));
    }

    #[test]
    fn loss_caps_each_connection() {
        let workload = Workload { products: vec![ProductSpec { at: Duration::ZERO, size: 1_000_000 }] };
        let lossy = RelayTree { loss: 0.01, uplink_bits_per_s: 1_000_000_000, ..tree(1, 1, 1) };
        // Mathis at 20 ms RTT and 1%: 1448·8 / (0.02 · sqrt(0.02/3)) ≈ 7.09 Mbit/s.
        let report = lossy.run(&workload).unwrap();
        let seconds = report.latency.max().as_secs_f64();
        assert!((1.12..1.15).contains(&seconds), "{seconds}");
    }
}
