//! Deterministic network simulator for the sans-IO FMTP state machines.
//!
//! One [`fmtp_proto::Sender`](ldm7_fmtp_proto::Sender) and N
//! [`Receiver`](ldm7_fmtp_proto::Receiver)s run on a seeded event heap in virtual time, over
//! modelled links: per-receiver multicast delay, jitter and loss (Bernoulli or Gilbert–Elliott
//! bursts), an optional shared bottleneck (rate with a finite drop-tail queue), and a
//! per-receiver TCP channel (in order, delay, rate, socket buffer, stalls, resets). Checkers run
//! after every step ([`ledger`]): each product is delivered once with the right content or
//! reported missed, never silently lost. A run is a pure function of its seed and
//! configuration; a failure prints the seed, and [`seed_from_env`] lets `LDM7_SEED=n` replay it.
//!
//! ```
//! use std::time::Duration;
//! use ldm7_sim::{LossModel, ReceiverSpec, SimConfig, Simulation, Workload};
//!
//! let receivers = (0..3)
//!     .map(|_| ReceiverSpec::with_rtt(Duration::from_millis(30)).loss(LossModel::Bernoulli(0.01)))
//!     .collect();
//! let config = SimConfig::new(7, receivers);
//! let workload = Workload::uniform(20, 100_000, Duration::from_millis(10));
//! let report = Simulation::new(config, workload).unwrap().run().unwrap();
//! assert_eq!(report.delivered(), 3 * 21); // 20 products and the liveness sentinel
//! ```

pub mod control;
mod due;
pub mod idd;
pub mod ledger;
pub mod net;
mod queue;
pub mod relay;
pub mod rng;
pub mod sim;
pub mod stats;
pub mod workload;

pub use ledger::{ReceiverTally, Violation};
pub use net::{Bottleneck, LossModel, Reset, Stall, TcpSpec, Uplink};
pub use sim::{
    Backstop, ContentMode, DeliveryRecord, DropFilter, Failure, Liveness, ReceiverReport, ReceiverSpec, Report,
    SimConfig, SimConfigError, Simulation,
};
pub use stats::LatencyStats;
pub use workload::{ProductSpec, TraceError, Workload};

/// The seed to run with: `LDM7_SEED` when set (to replay a failure), else `default`.
///
/// # Panics
/// If `LDM7_SEED` is set but is not an unsigned integer (a replay must not silently run
/// another seed).
pub fn seed_from_env(default: u64) -> u64 {
    match std::env::var("LDM7_SEED") {
        Ok(text) => text.trim().parse().unwrap_or_else(|_| panic!("LDM7_SEED={text:?} is not an unsigned integer")),
        Err(_) => default,
    }
}
