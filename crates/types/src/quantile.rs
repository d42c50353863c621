//! The one definition of a quantile in the workspace: nearest rank. The `q` quantile of `n`
//! values is the value of rank `⌈q·n⌉` in ascending order (rank 1 for `q` = 0): the smallest
//! value with at least a share `q` of the values at or below it. It is always one of the values
//! (never an interpolation), so a p99 latency is a latency some product had. The median is the
//! 0.5 quantile by the same rule: of an even number of values, the lower of the two middle ones.
//!
//! Benchmarks, the test bed, the trace statistics and the simulator's reports use it; the
//! simulator's streaming histogram (`ldm7_sim::stats`) approximates it within its bin width.

/// The `q` quantile (0 ≤ `q` ≤ 1) of `sorted`, which is in ascending order; `None` when empty.
pub fn quantile<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1));
    sorted.get(rank - 1).copied()
}

/// The `q` quantile of `values` in any order (sorted here); `None` when there are none.
pub fn quantile_of<T: Copy + Ord>(values: impl IntoIterator<Item = T>, q: f64) -> Option<T> {
    let mut sorted: Vec<T> = values.into_iter().collect();
    sorted.sort_unstable();
    quantile(&sorted, q)
}

/// The median of `values` in any order, NaNs left out; NaN when none is left.
pub fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut sorted: Vec<f64> = values.into_iter().filter(|value| !value.is_nan()).collect();
    sorted.sort_by(f64::total_cmp);
    quantile(&sorted, 0.5).unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let values: Vec<u32> = (1..=100).collect();
        assert_eq!(quantile(&values, 0.0), Some(1));
        assert_eq!(quantile(&values, 0.5), Some(50));
        assert_eq!(quantile(&values, 0.99), Some(99));
        assert_eq!(quantile(&values, 0.991), Some(100));
        assert_eq!(quantile(&values, 1.0), Some(100));
        assert_eq!(quantile::<u32>(&[], 0.5), None);
        assert_eq!(quantile_of([3, 1, 2], 0.5), Some(2));
    }

    #[test]
    fn the_median_is_a_value_and_leaves_nans_out() {
        assert_eq!(median([3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median([4.0, 1.0, 3.0, 2.0]), 2.0);
        assert_eq!(median([f64::NAN, 5.0]), 5.0);
        assert!(median([f64::NAN]).is_nan());
    }
}
