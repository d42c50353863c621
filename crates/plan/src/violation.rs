//! The online latency-violation monitor (RESEARCH.md §4): per interval, which subscribers saw
//! products wait for the sender longer than `W`, and whether the feed's path rate should step
//! up (or, after calm intervals, back down).
//!
//! A product `i` *violates* at subscriber `j` when its latency, less what it would take at the
//! held rate anyway, exceeds `W`: `d_ij − (ε_ij + s_i / r_k + RTT_j / 2) > W`, with the repair
//! time estimated as `ε_ij = RTT_j × retransmission rounds + c`. A subscriber violates in an
//! interval when more than `α` of its products did; when more than `β` of the subscribers that
//! received anything violate, the next interval gets the next rate step (up to the ceiling, the
//! last step). After `lower_after` intervals in a row without a violating subscriber the rate
//! steps back down, never below the first step: the hysteresis that keeps a path from being
//! re-signalled every interval.
//!
//! Sans-IO: the caller reports deliveries and ends intervals; rate changes are returned, not
//! made.

use std::collections::BTreeMap;

/// The monitor's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct MonitorConfig {
    /// `W`, seconds (the research suggests 2 ms for the IDD).
    pub wait_max_s: f64,
    /// `α`: the share of a subscriber's products that may violate (0.1).
    pub alpha: f64,
    /// `β`: the share of subscribers that may violate (0.01).
    pub beta: f64,
    /// `c` of `ε = RTT × rounds + c`, seconds.
    pub epsilon_s: f64,
    /// The path rates, ascending, bit/s: the first is where the feed starts and the floor; the
    /// last is the ceiling.
    pub rate_steps_bps: Vec<f64>,
    /// Calm intervals in a row before the rate steps down.
    pub lower_after: u32,
}

impl MonitorConfig {
    /// The research's suggestion for the IDD (W = 2 ms, α = 0.1, β = 0.01; c = 2 ms) over
    /// `rate_steps_bps`, stepping down after three calm intervals.
    pub fn research(rate_steps_bps: Vec<f64>) -> Self {
        Self { wait_max_s: 0.002, alpha: 0.1, beta: 0.01, epsilon_s: 0.002, rate_steps_bps, lower_after: 3 }
    }

    fn check(&self) -> Result<(), String> {
        let share = |value: f64| (0.0..=1.0).contains(&value);
        if !(self.wait_max_s.is_finite() && self.wait_max_s >= 0.0) {
            return Err(format!("W must be at least 0, not {} s", self.wait_max_s));
        }
        if !share(self.alpha) || !share(self.beta) {
            return Err(format!("α and β are shares in [0, 1], not {} and {}", self.alpha, self.beta));
        }
        if !(self.epsilon_s.is_finite() && self.epsilon_s >= 0.0) {
            return Err(format!("c must be at least 0, not {} s", self.epsilon_s));
        }
        if self.rate_steps_bps.is_empty()
            || self.rate_steps_bps.iter().any(|rate| !(rate.is_finite() && *rate > 0.0))
            || self.rate_steps_bps.windows(2).any(|pair| pair[1] <= pair[0])
        {
            return Err("the rate steps must be positive and ascending".into());
        }
        if self.lower_after == 0 {
            return Err("lower_after must be at least 1 interval".into());
        }
        Ok(())
    }
}

/// One product delivered to one subscriber.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MonitoredDelivery {
    /// The subscriber.
    pub subscriber: u32,
    /// `d_ij`: creation at the publisher to complete at the subscriber, seconds.
    pub latency_s: f64,
    /// `s_i`, bytes.
    pub bytes: u64,
    /// The subscriber's round-trip time to the publisher, seconds.
    pub rtt_s: f64,
    /// Rounds of retransmission it needed (0 when it came whole by multicast).
    pub repair_rounds: u32,
}

/// What the monitor decided at the end of an interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Decision {
    /// Keep the rate.
    Hold {
        /// The rate, bit/s.
        rate_bps: f64,
    },
    /// Step the rate up for the next interval.
    Raise {
        /// From, bit/s.
        from_bps: f64,
        /// To, bit/s.
        to_bps: f64,
    },
    /// Too many subscribers violate, but the rate is at the ceiling already.
    AtCeiling {
        /// The ceiling, bit/s.
        rate_bps: f64,
    },
    /// Calm long enough: step back down.
    Lower {
        /// From, bit/s.
        from_bps: f64,
        /// To, bit/s.
        to_bps: f64,
    },
}

/// An interval's tally.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct IntervalTally {
    /// Subscribers that received something.
    pub subscribers: usize,
    /// Of those, the ones that violated (over `α`).
    pub violating: usize,
    /// Products received, all subscribers.
    pub deliveries: u64,
    /// Of those, the ones that violated.
    pub violations: u64,
}

/// Totals since the start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MonitorCounters {
    /// Intervals ended.
    pub intervals: u64,
    /// Deliveries observed.
    pub deliveries: u64,
    /// Of those, violations.
    pub violations: u64,
    /// Rate steps up.
    pub raises: u64,
    /// Rate steps down.
    pub lowers: u64,
    /// Intervals that wanted a step up at the ceiling.
    pub at_ceiling: u64,
}

/// The monitor of one feed.
#[derive(Debug)]
pub struct ViolationMonitor {
    config: MonitorConfig,
    step: usize,
    calm: u32,
    /// Per subscriber: (products, violations) in the interval in progress.
    interval: BTreeMap<u32, (u64, u64)>,
    counters: MonitorCounters,
    last: IntervalTally,
}

impl ViolationMonitor {
    /// A monitor at the first rate step.
    pub fn new(config: MonitorConfig) -> Result<Self, String> {
        config.check()?;
        Ok(Self {
            config,
            step: 0,
            calm: 0,
            interval: BTreeMap::new(),
            counters: MonitorCounters::default(),
            last: IntervalTally::default(),
        })
    }

    /// The rate now held, bit/s.
    pub fn rate_bps(&self) -> f64 {
        self.config.rate_steps_bps[self.step]
    }

    /// Totals since the start.
    pub fn counters(&self) -> MonitorCounters {
        self.counters
    }

    /// The tally of the last interval ended.
    pub fn last_interval(&self) -> IntervalTally {
        self.last
    }

    /// Whether `delivery` violates at the rate now held.
    pub fn violates(&self, delivery: &MonitoredDelivery) -> bool {
        let epsilon = delivery.rtt_s * f64::from(delivery.repair_rounds) + self.config.epsilon_s;
        let expected = epsilon + delivery.bytes as f64 * 8.0 / self.rate_bps() + delivery.rtt_s / 2.0;
        delivery.latency_s - expected > self.config.wait_max_s
    }

    /// Counts a delivery in the interval in progress.
    pub fn observe(&mut self, delivery: &MonitoredDelivery) {
        let violated = self.violates(delivery);
        let entry = self.interval.entry(delivery.subscriber).or_default();
        entry.0 += 1;
        entry.1 += u64::from(violated);
        self.counters.deliveries += 1;
        self.counters.violations += u64::from(violated);
    }

    /// Counts a product a subscriber did not get in time at all (it gave the product up, or the
    /// sender's retransmission deadline passed first): a violating delivery, whatever the rate.
    pub fn observe_failure(&mut self, subscriber: u32) {
        let entry = self.interval.entry(subscriber).or_default();
        entry.0 += 1;
        entry.1 += 1;
        self.counters.deliveries += 1;
        self.counters.violations += 1;
    }

    /// Takes back a [`Decision::Raise`] or [`Decision::Lower`] that could not be carried out
    /// (the path service refused the rate): the rate is the one before it again and the step
    /// is not counted; the next intervals decide anew. Other decisions change nothing.
    pub fn revert(&mut self, decision: &Decision) {
        let from_bps = match *decision {
            Decision::Raise { from_bps, .. } => {
                self.counters.raises = self.counters.raises.saturating_sub(1);
                from_bps
            }
            Decision::Lower { from_bps, .. } => {
                self.counters.lowers = self.counters.lowers.saturating_sub(1);
                from_bps
            }
            Decision::Hold { .. } | Decision::AtCeiling { .. } => return,
        };
        if let Some(step) = self.config.rate_steps_bps.iter().position(|rate| *rate == from_bps) {
            self.step = step;
        }
    }

    /// Ends the interval in progress: the decision for the next one (already applied to
    /// [`ViolationMonitor::rate_bps`]).
    pub fn end_interval(&mut self) -> Decision {
        let interval = std::mem::take(&mut self.interval);
        let violating = interval
            .values()
            .filter(|(products, violations)| *violations as f64 > self.config.alpha * *products as f64)
            .count();
        self.last = IntervalTally {
            subscribers: interval.len(),
            violating,
            deliveries: interval.values().map(|(products, _)| products).sum(),
            violations: interval.values().map(|(_, violations)| violations).sum(),
        };
        self.counters.intervals += 1;
        let from_bps = self.rate_bps();
        let too_many = violating > 0 && violating as f64 > self.config.beta * interval.len() as f64;
        if too_many {
            self.calm = 0;
            if self.step + 1 < self.config.rate_steps_bps.len() {
                self.step += 1;
                self.counters.raises += 1;
                return Decision::Raise { from_bps, to_bps: self.rate_bps() };
            }
            self.counters.at_ceiling += 1;
            return Decision::AtCeiling { rate_bps: from_bps };
        }
        if violating == 0 {
            self.calm += 1;
        } else {
            self.calm = 0;
        }
        if self.calm >= self.config.lower_after && self.step > 0 {
            self.calm = 0;
            self.step -= 1;
            self.counters.lowers += 1;
            return Decision::Lower { from_bps, to_bps: self.rate_bps() };
        }
        Decision::Hold { rate_bps: from_bps }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MBIT: f64 = 1e6;

    fn monitor() -> ViolationMonitor {
        ViolationMonitor::new(MonitorConfig::research(vec![20.0 * MBIT, 40.0 * MBIT, 100.0 * MBIT])).unwrap()
    }

    fn delivery(subscriber: u32, latency_s: f64) -> MonitoredDelivery {
        // 25 kB at 20 Mbit/s: 10 ms to send; RTT 40 ms (20 ms one way); no repair: ε = 2 ms.
        MonitoredDelivery { subscriber, latency_s, bytes: 25_000, rtt_s: 0.040, repair_rounds: 0 }
    }

    #[test]
    fn a_product_violates_when_it_waited_more_than_w_beyond_its_expected_latency() {
        let monitor = monitor();
        // Expected: 2 ms + 10 ms + 20 ms = 32 ms; W = 2 ms.
        assert!(!monitor.violates(&delivery(1, 0.0339)));
        assert!(monitor.violates(&delivery(1, 0.0341)));
        // Two repair rounds add two RTTs to what is expected.
        let repaired = MonitoredDelivery { repair_rounds: 2, ..delivery(1, 0.1139) };
        assert!(!monitor.violates(&repaired));
        assert!(monitor.violates(&MonitoredDelivery { latency_s: 0.1141, ..repaired }));
    }

    #[test]
    fn past_alpha_a_subscriber_violates_and_past_beta_the_rate_steps_up() {
        let mut monitor = monitor();
        // 200 subscribers; subscriber 7 has 2 of 10 products late (over α = 0.1): 1 of 200
        // subscribers is 0.5%, under β = 1%: hold.
        for subscriber in 0..200 {
            for k in 0..10 {
                let late = subscriber == 7 && k < 2;
                monitor.observe(&delivery(subscriber, if late { 0.5 } else { 0.025 }));
            }
        }
        assert_eq!(monitor.end_interval(), Decision::Hold { rate_bps: 20.0 * MBIT });
        assert_eq!(monitor.last_interval().violating, 1);
        // Three of them: 1.5% > β.
        for subscriber in 0..200 {
            for k in 0..10 {
                let late = subscriber < 3 && k < 2;
                monitor.observe(&delivery(subscriber, if late { 0.5 } else { 0.025 }));
            }
        }
        assert_eq!(monitor.end_interval(), Decision::Raise { from_bps: 20.0 * MBIT, to_bps: 40.0 * MBIT });
        // One late product of ten is not over α.
        monitor.observe(&delivery(1, 0.5));
        for _ in 0..9 {
            monitor.observe(&delivery(1, 0.025));
        }
        assert_eq!(monitor.end_interval(), Decision::Hold { rate_bps: 40.0 * MBIT });
    }

    #[test]
    fn the_rate_rises_under_a_burst_stops_at_the_ceiling_and_falls_back_after_calm_intervals() {
        let mut monitor = monitor();
        let burst = |monitor: &mut ViolationMonitor| {
            for subscriber in 0..10 {
                monitor.observe(&delivery(subscriber, 2.0));
            }
            monitor.end_interval()
        };
        let calm = |monitor: &mut ViolationMonitor| {
            for subscriber in 0..10 {
                monitor.observe(&delivery(subscriber, 0.025));
            }
            monitor.end_interval()
        };
        assert_eq!(burst(&mut monitor), Decision::Raise { from_bps: 20.0 * MBIT, to_bps: 40.0 * MBIT });
        assert_eq!(burst(&mut monitor), Decision::Raise { from_bps: 40.0 * MBIT, to_bps: 100.0 * MBIT });
        assert_eq!(burst(&mut monitor), Decision::AtCeiling { rate_bps: 100.0 * MBIT });
        assert_eq!(calm(&mut monitor), Decision::Hold { rate_bps: 100.0 * MBIT });
        assert_eq!(calm(&mut monitor), Decision::Hold { rate_bps: 100.0 * MBIT });
        assert_eq!(calm(&mut monitor), Decision::Lower { from_bps: 100.0 * MBIT, to_bps: 40.0 * MBIT });
        // An interval with no deliveries is calm too.
        assert_eq!(monitor.end_interval(), Decision::Hold { rate_bps: 40.0 * MBIT });
        assert_eq!(calm(&mut monitor), Decision::Hold { rate_bps: 40.0 * MBIT });
        assert_eq!(calm(&mut monitor), Decision::Lower { from_bps: 40.0 * MBIT, to_bps: 20.0 * MBIT });
        for _ in 0..5 {
            assert_eq!(calm(&mut monitor), Decision::Hold { rate_bps: 20.0 * MBIT });
        }
        let counters = monitor.counters();
        assert_eq!((counters.raises, counters.lowers, counters.at_ceiling), (2, 2, 1));
        assert_eq!(counters.violations, 30);
    }

    #[test]
    fn a_product_given_up_violates_and_a_refused_step_is_taken_back() {
        let mut monitor = monitor();
        // One subscriber of two gave a product up (over β), the other got its product in time.
        monitor.observe_failure(1);
        monitor.observe(&delivery(2, 0.025));
        let raise = monitor.end_interval();
        assert_eq!(raise, Decision::Raise { from_bps: 20.0 * MBIT, to_bps: 40.0 * MBIT });
        assert_eq!((monitor.last_interval().violating, monitor.counters().violations), (1, 1));
        monitor.revert(&raise);
        assert_eq!((monitor.rate_bps(), monitor.counters().raises), (20.0 * MBIT, 0));
        // Holding or being at the ceiling has nothing to take back.
        monitor.revert(&Decision::Hold { rate_bps: 20.0 * MBIT });
        assert_eq!(monitor.rate_bps(), 20.0 * MBIT);
        // A refused lower stays up; calm intervals try again later.
        monitor.observe_failure(1);
        assert!(matches!(monitor.end_interval(), Decision::Raise { .. }));
        let lower = (0..3).map(|_| monitor.end_interval()).last().unwrap();
        assert_eq!(lower, Decision::Lower { from_bps: 40.0 * MBIT, to_bps: 20.0 * MBIT });
        monitor.revert(&lower);
        assert_eq!((monitor.rate_bps(), monitor.counters().lowers), (40.0 * MBIT, 0));
        let again = (0..3).map(|_| monitor.end_interval()).last().unwrap();
        assert_eq!(again, Decision::Lower { from_bps: 40.0 * MBIT, to_bps: 20.0 * MBIT });
    }

    #[test]
    fn bad_settings_are_refused() {
        let steps = vec![20.0 * MBIT, 40.0 * MBIT];
        let base = MonitorConfig::research(steps);
        assert!(ViolationMonitor::new(MonitorConfig { alpha: 1.5, ..base.clone() }).is_err());
        assert!(ViolationMonitor::new(MonitorConfig { rate_steps_bps: vec![40.0, 20.0], ..base.clone() }).is_err());
        assert!(ViolationMonitor::new(MonitorConfig { rate_steps_bps: vec![], ..base.clone() }).is_err());
        assert!(ViolationMonitor::new(MonitorConfig { lower_after: 0, ..base.clone() }).is_err());
        assert!(ViolationMonitor::new(MonitorConfig { wait_max_s: f64::NAN, ..base }).is_err());
    }
}
