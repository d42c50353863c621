//! The research's online rate control in the simulator: every interval of virtual time, the
//! deliveries of the interval go to a [`ViolationMonitor`] (`ldm7_plan::violation`) and its
//! decision changes the sender's path rate, as a publisher would through its path service.
//!
//! A delivery's repair rounds are counted as one when any of its blocks came by repair (the
//! receiver does not report rounds; RTT × 1 is the smallest a repair takes).

use std::time::Duration;

use ldm7_fmtp_proto::Instant;
use ldm7_plan::{Decision, MonitoredDelivery, ViolationMonitor};

use crate::sim::{Failure, Report, Simulation};

/// A run under rate control.
#[derive(Debug)]
pub struct ControlledRun {
    /// The simulator's report (every checker passed).
    pub report: Report,
    /// The rate from the start, then each change: (when, bit/s).
    pub rates: Vec<(Instant, f64)>,
    /// Each interval's decision, in order.
    pub decisions: Vec<Decision>,
}

impl ControlledRun {
    /// The highest rate held.
    pub fn peak_rate_bps(&self) -> f64 {
        self.rates.iter().map(|&(_, rate)| rate).fold(0.0, f64::max)
    }

    /// The rate held at the end.
    pub fn final_rate_bps(&self) -> f64 {
        self.rates.last().map_or(0.0, |&(_, rate)| rate)
    }
}

/// Runs `simulation` to its end with `monitor` choosing the sender's rate every `interval`
/// (starting at the monitor's first step). The simulation must keep its delivery log
/// ([`Simulation::with_delivery_log`]).
pub fn run_with_rate_control(
    mut simulation: Simulation,
    monitor: &mut ViolationMonitor,
    interval: Duration,
) -> Result<ControlledRun, Failure> {
    simulation.set_rate(monitor.rate_bps() as u64)?;
    let mut rates = vec![(Instant::ZERO, monitor.rate_bps())];
    let mut decisions = Vec::new();
    let mut next = Instant::ZERO + interval;
    loop {
        let at_rest = simulation.run_until(next)?;
        for record in simulation.take_deliveries() {
            let rtt = simulation.receiver_rtt(record.receiver).unwrap_or_default();
            monitor.observe(&MonitoredDelivery {
                subscriber: record.receiver as u32,
                latency_s: record.latency.as_secs_f64(),
                bytes: u64::from(record.bytes),
                rtt_s: rtt.as_secs_f64(),
                repair_rounds: u32::from(record.retransmitted_blocks > 0),
            });
        }
        if at_rest {
            break;
        }
        let decision = monitor.end_interval();
        if let Decision::Raise { to_bps, .. } | Decision::Lower { to_bps, .. } = decision {
            simulation.set_rate(to_bps as u64)?;
            rates.push((next, to_bps));
        }
        decisions.push(decision);
        next = next + interval;
    }
    Ok(ControlledRun { report: simulation.finish()?, rates, decisions })
}
