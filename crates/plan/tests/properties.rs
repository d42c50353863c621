//! Properties of the planning recurrences over random arrivals.

use ldm7_plan::{Arrival, PlanConfig, occupancy, plan, sweep};
use proptest::prelude::*;

/// Sorted arrivals over about ten seconds, in bursts (equal times happen).
fn arrivals() -> impl Strategy<Value = Vec<Arrival>> {
    prop::collection::vec((0u32..2_000, 1u64..5_000_000), 0..60).prop_map(|mut raw| {
        raw.sort_by_key(|&(millis, _)| millis);
        raw.into_iter().map(|(millis, bytes)| Arrival { at_s: f64::from(millis / 4 * 20) / 1e3, bytes }).collect()
    })
}

proptest! {
    #[test]
    fn each_rate_is_the_smallest_step_that_meets_w(
        arrivals in arrivals(),
        interval_s in 0.5f64..6.0,
        wait_max_s in 0.0f64..2.0,
    ) {
        let config = PlanConfig {
            interval_s,
            wait_max_s,
            rate_min_bps: 1e5,
            rate_max_bps: 1e10,
            rate_step_bps: 1e5,
        };
        let plans = plan(&arrivals, &config).unwrap();
        let total: usize = plans.iter().map(|plan| plan.products).sum();
        prop_assert_eq!(total, arrivals.len());
        let mut from = 0;
        for plan in &plans {
            let span = &arrivals[from..from + plan.products];
            from += plan.products;
            let at = |rate: f64| occupancy(span, plan.start_s, plan.end_s, plan.backlog_in_bytes, rate);
            let Some(rate) = plan.rate_bps else {
                prop_assert!(at(config.rate_max_bps).wait_max_s > wait_max_s);
                continue;
            };
            prop_assert!(at(rate).wait_max_s <= wait_max_s * (1.0 + 1e-9));
            if rate > config.rate_min_bps {
                prop_assert!(at(rate - config.rate_step_bps).wait_max_s > wait_max_s, "{} is not the smallest", rate);
            }
        }
    }

    #[test]
    fn the_buffer_never_grows_with_the_rate(arrivals in arrivals()) {
        let rates = [1e6, 2e6, 5e6, 2e7, 1e8, 1e9];
        let results = sweep(&arrivals, &rates).unwrap();
        for pair in results.windows(2) {
            prop_assert!(pair[1].1.buffer_bytes <= pair[0].1.buffer_bytes);
            prop_assert!(pair[1].1.wait_max_s <= pair[0].1.wait_max_s);
        }
    }
}
