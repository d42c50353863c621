//! The holding-interval recurrences (RESEARCH.md §4).
//!
//! Times are seconds from the start of the trace, sizes bytes, rates bit/s. The backlog a
//! product finds when it arrives does not count the product itself, as in the research:
//! `B_k` is the largest backlog found, and the product then waits `q(a_i) / R_k` before its
//! first byte is sent.
//!
//! Across intervals the backlog is carried: what is unsent at the end of interval `k − 1` (at
//! its rate) is the backlog at the start of interval `k`, drained at `R_k` until the first
//! product of `k` arrives (`q(a_1)`; the research writes `q(a_1) = q(start)`, which is this
//! when the first product arrives at the start). The first interval starts empty.

/// A product offered to the sender.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Arrival {
    /// When it arrives, seconds from the start of the trace.
    pub at_s: f64,
    /// Its size, bytes.
    pub bytes: u64,
}

/// What one rate gives over a span of arrivals.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Occupancy {
    /// The loss-free buffer: the largest backlog a product found, bytes.
    pub buffer_bytes: f64,
    /// The longest waiting, `max_i q(a_i) / R`, seconds.
    pub wait_max_s: f64,
    /// What is still unsent at the end of the span, bytes.
    pub backlog_end_bytes: f64,
}

/// How to plan.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlanConfig {
    /// The holding interval, seconds.
    pub interval_s: f64,
    /// `W`: the longest a product may wait for the sender, seconds.
    pub wait_max_s: f64,
    /// The smallest rate considered, bit/s.
    pub rate_min_bps: f64,
    /// The largest rate the path can have (its ceiling), bit/s.
    pub rate_max_bps: f64,
    /// Rates are multiples of this, bit/s (a path is set up in steps).
    pub rate_step_bps: f64,
}

impl Default for PlanConfig {
    /// One-hour intervals, `W` = 2 ms (the research's suggestion for the IDD), rates from
    /// 1 Mbit/s to 10 Gbit/s in steps of 1 Mbit/s.
    fn default() -> Self {
        Self { interval_s: 3600.0, wait_max_s: 0.002, rate_min_bps: 1e6, rate_max_bps: 1e10, rate_step_bps: 1e6 }
    }
}

/// The plan of one holding interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IntervalPlan {
    /// Its start, seconds from the start of the trace.
    pub start_s: f64,
    /// Its end (exclusive).
    pub end_s: f64,
    /// Products that arrived in it.
    pub products: usize,
    /// Their bytes.
    pub bytes: u64,
    /// The backlog carried in from the interval before, bytes.
    pub backlog_in_bytes: f64,
    /// `R_k`: the smallest rate (a multiple of the step, at least the minimum) at which no
    /// product waits more than `W`; `None` when even the ceiling does not do (the other figures
    /// are then those of the ceiling).
    pub rate_bps: Option<f64>,
    /// The rate the figures below are for: `rate_bps`, or the ceiling.
    pub held_rate_bps: f64,
    /// `B_k` at that rate, bytes.
    pub buffer_bytes: f64,
    /// The longest waiting at that rate, seconds.
    pub wait_max_s: f64,
}

impl IntervalPlan {
    /// The offered load: the interval's bytes over its length, bit/s.
    pub fn offered_bps(&self) -> f64 {
        self.bytes as f64 * 8.0 / (self.end_s - self.start_s)
    }
}

/// Why a plan cannot be made.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PlanError {
    /// The arrivals are not in time order (or a time is not a finite number ≥ 0).
    #[error("arrival {index} at {at_s} s is before the one before it (sort the arrivals by time)")]
    Unsorted {
        /// Its position.
        index: usize,
        /// Its time.
        at_s: f64,
    },
    /// A setting is out of range.
    #[error("{0}")]
    Config(String),
}

/// The recurrence over `arrivals` (in time order, all within `[start_s, end_s]`) at `rate_bps`,
/// from `backlog_start` bytes unsent at `start_s`.
pub fn occupancy(arrivals: &[Arrival], start_s: f64, end_s: f64, backlog_start: f64, rate_bps: f64) -> Occupancy {
    let rate = rate_bps / 8.0;
    let (mut backlog, mut at, mut last_size, mut buffer) = (backlog_start, start_s, 0.0, 0.0f64);
    for arrival in arrivals {
        backlog = (backlog + last_size - rate * (arrival.at_s - at)).max(0.0);
        buffer = buffer.max(backlog);
        at = arrival.at_s;
        last_size = arrival.bytes as f64;
    }
    let backlog_end_bytes = (backlog + last_size - rate * (end_s - at).max(0.0)).max(0.0);
    Occupancy { buffer_bytes: buffer, wait_max_s: buffer / rate, backlog_end_bytes }
}

/// Plans every holding interval from the start of the trace (time 0) to its last arrival.
pub fn plan(arrivals: &[Arrival], config: &PlanConfig) -> Result<Vec<IntervalPlan>, PlanError> {
    check(arrivals, config)?;
    let Some(last) = arrivals.last() else { return Ok(Vec::new()) };
    let intervals = ((last.at_s / config.interval_s).floor() as usize) + 1;
    let (step, floor, ceiling) = steps(config);
    let mut plans = Vec::with_capacity(intervals);
    let mut backlog = 0.0;
    let mut from = 0;
    for k in 0..intervals {
        let (start_s, end_s) = (k as f64 * config.interval_s, (k + 1) as f64 * config.interval_s);
        let to = from + arrivals[from..].partition_point(|arrival| arrival.at_s < end_s);
        let span = &arrivals[from..to];
        let at = |multiple: u64| occupancy(span, start_s, end_s, backlog, multiple as f64 * step);
        let meets = |multiple: u64| at(multiple).wait_max_s <= config.wait_max_s * (1.0 + 1e-12);
        let rate = if !meets(ceiling) {
            None
        } else if meets(floor) {
            Some(floor)
        } else {
            // The waiting falls as the rate rises: the smallest multiple that meets W.
            let (mut low, mut high) = (floor, ceiling);
            while high - low > 1 {
                let middle = low + (high - low) / 2;
                if meets(middle) { high = middle } else { low = middle }
            }
            Some(high)
        };
        let held = rate.unwrap_or(ceiling);
        let result = at(held);
        plans.push(IntervalPlan {
            start_s,
            end_s,
            products: span.len(),
            bytes: span.iter().map(|arrival| arrival.bytes).sum(),
            backlog_in_bytes: backlog,
            rate_bps: rate.map(|multiple| multiple as f64 * step),
            held_rate_bps: held as f64 * step,
            buffer_bytes: result.buffer_bytes,
            wait_max_s: result.wait_max_s,
        });
        backlog = result.backlog_end_bytes;
        from = to;
    }
    Ok(plans)
}

/// The whole trace as one span at each of `rates_bps`: the loss-free buffer and the longest
/// waiting against the rate (the research's buffer-versus-rate figure).
pub fn sweep(arrivals: &[Arrival], rates_bps: &[f64]) -> Result<Vec<(f64, Occupancy)>, PlanError> {
    check_order(arrivals)?;
    let end = arrivals.last().map_or(0.0, |arrival| arrival.at_s);
    Ok(rates_bps.iter().map(|&rate| (rate, occupancy(arrivals, 0.0, end, 0.0, rate))).collect())
}

/// The step, and the smallest and largest multiples of it allowed.
fn steps(config: &PlanConfig) -> (f64, u64, u64) {
    let step = config.rate_step_bps;
    let floor = ((config.rate_min_bps / step).ceil() as u64).max(1);
    let ceiling = ((config.rate_max_bps / step).floor() as u64).max(floor);
    (step, floor, ceiling)
}

fn check(arrivals: &[Arrival], config: &PlanConfig) -> Result<(), PlanError> {
    let positive = |value: f64| value.is_finite() && value > 0.0;
    if !positive(config.interval_s) {
        return Err(PlanError::Config(format!("the holding interval must be positive, not {} s", config.interval_s)));
    }
    if !(config.wait_max_s.is_finite() && config.wait_max_s >= 0.0) {
        return Err(PlanError::Config(format!("W must be at least 0, not {} s", config.wait_max_s)));
    }
    if !positive(config.rate_step_bps) || !positive(config.rate_min_bps) || !positive(config.rate_max_bps) {
        return Err(PlanError::Config("rates and the rate step must be positive".into()));
    }
    if config.rate_max_bps < config.rate_min_bps.max(config.rate_step_bps) {
        return Err(PlanError::Config(format!(
            "the ceiling {} bit/s is below the smallest rate {} bit/s (or the step)",
            config.rate_max_bps, config.rate_min_bps
        )));
    }
    check_order(arrivals)
}

fn check_order(arrivals: &[Arrival]) -> Result<(), PlanError> {
    let mut previous = 0.0;
    for (index, arrival) in arrivals.iter().enumerate() {
        if !(arrival.at_s.is_finite() && arrival.at_s >= previous) {
            return Err(PlanError::Unsorted { index, at_s: arrival.at_s });
        }
        previous = arrival.at_s;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arrival(at_s: f64, bytes: u64) -> Arrival {
        Arrival { at_s, bytes }
    }

    #[test]
    fn the_backlog_follows_the_recurrence_by_hand() {
        // 1000 B/s. Products of 3000 B at 0 s and 0.5 s, 1000 B at 4 s.
        let arrivals = [arrival(0.0, 3000), arrival(0.5, 3000), arrival(4.0, 1000)];
        let result = occupancy(&arrivals, 0.0, 10.0, 0.0, 8000.0);
        // q(a_1) = 0; q(a_2) = 3000 − 500 = 2500; q(a_3) = max(0, 2500 + 3000 − 3500) = 2000.
        assert_eq!(result.buffer_bytes, 2500.0);
        assert_eq!(result.wait_max_s, 2.5);
        // At 10 s: 2000 + 1000 − 6000 < 0.
        assert_eq!(result.backlog_end_bytes, 0.0);
    }

    #[test]
    fn the_backlog_is_carried_into_the_next_interval() {
        let config = PlanConfig {
            interval_s: 1.0,
            wait_max_s: 100.0,
            rate_min_bps: 8000.0,
            rate_max_bps: 8000.0,
            rate_step_bps: 1000.0,
        };
        let arrivals = [arrival(0.0, 3000), arrival(0.5, 3000), arrival(1.5, 10)];
        let plans = plan(&arrivals, &config).unwrap();
        assert_eq!(plans.len(), 2);
        assert_eq!((plans[0].products, plans[0].bytes, plans[0].buffer_bytes), (2, 6000, 2500.0));
        // At 1 s, 2500 + 3000 − 500 = 5000 unsent; the product at 1.5 s finds 4500.
        assert_eq!(plans[1].backlog_in_bytes, 5000.0);
        assert_eq!(plans[1].buffer_bytes, 4500.0);
        assert_eq!(plans[1].rate_bps, Some(8000.0));
    }

    #[test]
    fn the_ideal_rate_is_the_smallest_step_that_meets_w() {
        // Two products of 1000 B at once: the second waits 1000 B / R. W = 1 ms → R ≥ 8 Mbit/s.
        let config = PlanConfig {
            interval_s: 60.0,
            wait_max_s: 0.001,
            rate_min_bps: 1000.0,
            rate_max_bps: 1e9,
            rate_step_bps: 1000.0,
        };
        let plans = plan(&[arrival(0.0, 1000), arrival(0.0, 1000)], &config).unwrap();
        assert_eq!(plans[0].rate_bps, Some(8_000_000.0));
        assert_eq!(plans[0].buffer_bytes, 1000.0);
        assert!((plans[0].wait_max_s - 0.001).abs() < 1e-12);
        // 100 ms apart: the first must be (nearly) sent when the second comes: 80 kbit/s
        // (8000 / R − 0.1 ≤ 0.001 gives R ≥ 79,208 bit/s).
        let plans = plan(&[arrival(0.0, 1000), arrival(0.1, 1000)], &config).unwrap();
        assert_eq!(plans[0].rate_bps, Some(80_000.0));
        // Under a ceiling of 1 Mbit/s the burst cannot meet W: figures at the ceiling.
        let capped = PlanConfig { rate_max_bps: 1e6, ..config };
        let plans = plan(&[arrival(0.0, 1000), arrival(0.0, 1000)], &capped).unwrap();
        assert_eq!(plans[0].rate_bps, None);
        assert_eq!(plans[0].held_rate_bps, 1e6);
        assert_eq!(plans[0].wait_max_s, 0.008);
    }

    #[test]
    fn an_empty_interval_keeps_draining_the_backlog() {
        let config = PlanConfig {
            interval_s: 1.0,
            wait_max_s: 100.0,
            rate_min_bps: 8000.0,
            rate_max_bps: 8000.0,
            rate_step_bps: 8000.0,
        };
        let plans = plan(&[arrival(0.0, 2500), arrival(2.2, 1)], &config).unwrap();
        assert_eq!(plans.len(), 3);
        assert_eq!(plans[1].products, 0);
        assert_eq!(plans[1].backlog_in_bytes, 1500.0);
        assert_eq!(plans[2].backlog_in_bytes, 500.0);
        assert!((plans[2].buffer_bytes - 300.0).abs() < 1e-9);
    }

    #[test]
    fn bad_input_is_refused() {
        let config = PlanConfig::default();
        assert_eq!(
            plan(&[arrival(1.0, 1), arrival(0.5, 1)], &config),
            Err(PlanError::Unsorted { index: 1, at_s: 0.5 })
        );
        assert!(plan(&[arrival(f64::NAN, 1)], &config).is_err());
        assert!(matches!(plan(&[], &PlanConfig { interval_s: 0.0, ..config }), Err(PlanError::Config(_))));
        assert!(matches!(plan(&[], &PlanConfig { rate_max_bps: 1.0, ..config }), Err(PlanError::Config(_))));
        assert_eq!(plan(&[], &config), Ok(Vec::new()));
    }
}
