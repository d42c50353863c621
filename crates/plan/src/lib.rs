//! Rate and sender-buffer planning of LDM-7 feeds (RESEARCH.md §4), sans-IO: numbers in,
//! numbers out, no clock and no files.
//!
//! A feed's products arrive at the publisher (arrival `a_i`, size `s_i`); FMTP sends them at
//! the path rate `R`, so a product waits behind what is still unsent. Per holding interval `k`
//! (the time a rate is held before the path is changed), [`interval`] computes, exactly as the
//! research defines them:
//!
//! * the backlog a product finds when it arrives,
//!   `q(a_i) = max(0, q(a_{i−1}) + s_{i−1} − R_k (a_i − a_{i−1}))`, from the backlog carried into
//!   the interval;
//! * the loss-free sender buffer `B_k = max_i q(a_i)` and each product's waiting
//!   `w'_i = q(a_i) / R_k`;
//! * the ideal rate: the smallest `R_k` with `w'_i ≤ W` for every product of the interval.
//!
//! [`repair`] is the repair budget: what subscribers' losses cost on top of the data, by
//! unicast or by parity, and the receive buffer a subscriber needs.
//!
//! [`violation`] is the research's online monitor: from the latencies subscribers see, whether
//! the feed's path rate should step up for the next interval (or back down after calm ones).

pub mod interval;
pub mod repair;
pub mod violation;

pub use interval::{Arrival, IntervalPlan, Occupancy, PlanConfig, PlanError, occupancy, plan, sweep};
pub use repair::{Repair, RepairBudget, repair_budget};
pub use violation::{Decision, MonitorConfig, MonitoredDelivery, ViolationMonitor};
