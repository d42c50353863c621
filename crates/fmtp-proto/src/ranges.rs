//! A set of byte ranges `[start, end)`: which bytes of a product a receiver holds, or has
//! requested. Ranges are kept sorted, disjoint and non-adjacent, so in-order arrival keeps the
//! set at one range and appends are O(1).

use smallvec::SmallVec;

/// Sorted, disjoint, non-adjacent half-open ranges: the first two inline (a product being
/// received most often holds one or two, and a receiver makes two sets per product).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RangeSet {
    ranges: SmallVec<[(u64, u64); 2]>,
}

impl RangeSet {
    /// Adds `[start, end)`; returns how many bytes were not in the set before.
    pub(crate) fn insert(&mut self, start: u64, end: u64) -> u64 {
        if start >= end {
            return 0;
        }
        if let Some(last) = self.ranges.last_mut() {
            if start > last.1 {
                self.ranges.push((start, end));
                return end - start;
            }
            if start >= last.0 && start <= last.1 && end >= last.1 {
                let added = end - last.1;
                last.1 = end;
                return added;
            }
        } else {
            self.ranges.push((start, end));
            return end - start;
        }
        // General case: merge every range that overlaps or touches [start, end).
        let first = self.ranges.partition_point(|r| r.1 < start);
        let mut last = first;
        let mut overlap = 0;
        let (mut merged_start, mut merged_end) = (start, end);
        while last < self.ranges.len() && self.ranges[last].0 <= end {
            let (a, b) = self.ranges[last];
            overlap += b.min(end).saturating_sub(a.max(start));
            merged_start = merged_start.min(a);
            merged_end = merged_end.max(b);
            last += 1;
        }
        if first == last {
            self.ranges.insert(first, (merged_start, merged_end));
        } else {
            self.ranges[first] = (merged_start, merged_end);
            self.ranges.drain(first + 1..last);
        }
        (end - start) - overlap
    }

    /// Whether every byte of `[start, end)` is in the set.
    pub(crate) fn contains(&self, start: u64, end: u64) -> bool {
        if start >= end {
            return true;
        }
        let at = self.ranges.partition_point(|r| r.1 <= start);
        self.ranges.get(at).is_some_and(|&(a, b)| a <= start && end <= b)
    }

    /// The parts of `[start, end)` not in the set, in order (the first four inline).
    pub(crate) fn gaps(&self, start: u64, end: u64) -> SmallVec<[(u64, u64); 4]> {
        self.gaps_iter(start, end).collect()
    }

    /// [`RangeSet::gaps`] without a vector.
    pub(crate) fn gaps_iter(&self, start: u64, end: u64) -> Gaps<'_> {
        let first = self.ranges.partition_point(|r| r.1 <= start);
        Gaps { ranges: &self.ranges[first..], cursor: start, end }
    }

    /// The parts of `[start, end)` in the set, in order (what [`RangeSet::gaps`] leaves).
    pub(crate) fn within(&self, start: u64, end: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let first = self.ranges.partition_point(|r| r.1 <= start);
        self.ranges[first..].iter().take_while(move |r| r.0 < end).map(move |&(a, b)| (a.max(start), b.min(end)))
    }

    /// Removes `[start, end)` from the set.
    #[cfg(test)]
    pub(crate) fn remove(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let mut kept = SmallVec::with_capacity(self.ranges.len() + 1);
        for &(a, b) in &self.ranges {
            if b <= start || a >= end {
                kept.push((a, b));
                continue;
            }
            if a < start {
                kept.push((a, start));
            }
            if b > end {
                kept.push((end, b));
            }
        }
        self.ranges = kept;
    }

    /// Bytes in the set.
    pub(crate) fn len(&self) -> u64 {
        self.ranges.iter().map(|(a, b)| b - a).sum()
    }

    /// Number of separate ranges.
    #[cfg(test)]
    pub(crate) fn range_count(&self) -> usize {
        self.ranges.len()
    }
}

/// The gaps of a [`RangeSet`] in a window ([`RangeSet::gaps_iter`]).
pub(crate) struct Gaps<'a> {
    /// The set's ranges from the first that ends after the cursor.
    ranges: &'a [(u64, u64)],
    cursor: u64,
    end: u64,
}

impl Iterator for Gaps<'_> {
    type Item = (u64, u64);

    fn next(&mut self) -> Option<(u64, u64)> {
        while self.cursor < self.end {
            let Some((&(a, b), rest)) = self.ranges.split_first() else {
                let gap = (self.cursor, self.end);
                self.cursor = self.end;
                return Some(gap);
            };
            if a >= self.end {
                let gap = (self.cursor, self.end);
                self.cursor = self.end;
                return Some(gap);
            }
            self.ranges = rest;
            let gap = (self.cursor, a);
            self.cursor = self.cursor.max(b);
            if gap.0 < gap.1 {
                return Some(gap);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn merges_and_counts_new_bytes() {
        let mut set = RangeSet::default();
        assert_eq!(set.insert(0, 10), 10);
        assert_eq!(set.insert(20, 30), 10);
        assert_eq!(set.insert(5, 25), 10);
        assert_eq!(set.range_count(), 1);
        assert_eq!(set.insert(0, 30), 0);
        assert!(set.contains(3, 30));
        assert!(!set.contains(3, 31));
        assert_eq!(set.gaps(0, 40).as_slice(), [(30, 40)]);
        set.remove(10, 12);
        assert_eq!(set.gaps(0, 40).as_slice(), [(10, 12), (30, 40)]);
        assert_eq!(set.len(), 28);
    }

    proptest! {
        #[test]
        fn behaves_like_a_bitmap(ops in proptest::collection::vec((0u64..200, 0u64..40, any::<bool>()), 0..60)) {
            let mut set = RangeSet::default();
            let mut bits = [false; 240];
            for (start, len, add) in ops {
                let end = start + len;
                if add {
                    let fresh = bits[start as usize..end as usize].iter().filter(|b| !**b).count() as u64;
                    prop_assert_eq!(set.insert(start, end), fresh);
                    bits[start as usize..end as usize].fill(true);
                } else {
                    set.remove(start, end);
                    bits[start as usize..end as usize].fill(false);
                }
                prop_assert_eq!(set.len(), bits.iter().filter(|b| **b).count() as u64);
                let gaps: u64 = set.gaps(0, 240).iter().map(|(a, b)| b - a).sum();
                prop_assert_eq!(gaps, 240 - set.len());
                // A window: what is in it and its gaps cover it, apart and in order.
                let (from, to) = (start.min(end / 2), end + 7);
                let mut pieces: Vec<(u64, u64)> = set.within(from, to).chain(set.gaps(from, to)).collect();
                pieces.sort_unstable();
                prop_assert!(pieces.iter().all(|(a, b)| a < b), "{:?}", pieces);
                prop_assert_eq!(pieces.first().map(|p| p.0), Some(from).filter(|_| from < to));
                prop_assert_eq!(pieces.last().map(|p| p.1), Some(to).filter(|_| from < to));
                prop_assert!(pieces.windows(2).all(|w| w[0].1 == w[1].0), "{:?}", pieces);
                for (a, b) in set.within(from, to) {
                    prop_assert!(bits[a as usize..b as usize].iter().all(|bit| *bit));
                }
                for window in set.ranges.windows(2) {
                    prop_assert!(window[0].1 < window[1].0);
                }
                prop_assert_eq!(set.contains(start, end), bits[start as usize..end as usize].iter().all(|b| *b));
            }
        }
    }
}
