//! The FMTP product index (§3.2 `prodindex`): a `u32` that wraps, compared with serial-number
//! arithmetic (RFC 1982 style). Two indexes exactly 2³¹ apart have no order; the receiver treats
//! such a jump as invalid (§3.9 "gaps > 2³¹ are treated as invalid").

use std::fmt;

/// A product index. Deliberately not `Ord`: after a wrap 0 comes after `u32::MAX`; use
/// [`ProductIndex::serial_difference`] and the `is_after`/`is_before` helpers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ProductIndex(pub u32);

impl ProductIndex {
    /// The index that follows this one (wrapping).
    pub const fn next(self) -> Self {
        Self(self.0.wrapping_add(1))
    }

    /// This index moved forward by `count` (wrapping).
    pub const fn wrapping_add(self, count: u32) -> Self {
        Self(self.0.wrapping_add(count))
    }

    /// `self − earlier` as a signed serial difference, or `None` when the two are exactly 2³¹
    /// apart (no order). Positive means `self` is newer.
    pub const fn serial_difference(self, earlier: Self) -> Option<i32> {
        let difference = self.0.wrapping_sub(earlier.0) as i32;
        if difference == i32::MIN { None } else { Some(difference) }
    }

    /// Whether `self` is strictly newer than `other` in serial order.
    pub const fn is_after(self, other: Self) -> bool {
        matches!(self.serial_difference(other), Some(d) if d > 0)
    }

    /// Whether `self` is strictly older than `other` in serial order.
    pub const fn is_before(self, other: Self) -> bool {
        other.is_after(self)
    }
}

impl fmt::Display for ProductIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<u32> for ProductIndex {
    fn from(value: u32) -> Self {
        Self(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wraps_in_serial_order() {
        let last = ProductIndex(u32::MAX);
        assert_eq!(last.next(), ProductIndex(0));
        assert!(ProductIndex(0).is_after(last));
        assert!(last.is_before(ProductIndex(5)));
        assert_eq!(ProductIndex(3).serial_difference(last), Some(4));
        assert_eq!(ProductIndex(1 << 31).serial_difference(ProductIndex(0)), None);
        assert!(!ProductIndex(1 << 31).is_after(ProductIndex(0)));
        assert!(!ProductIndex(0).is_after(ProductIndex(1 << 31)));
    }

    proptest! {
        #[test]
        fn difference_inverts_addition(start: u32, step in 1u32..(1 << 31)) {
            let a = ProductIndex(start);
            let b = a.wrapping_add(step);
            prop_assert_eq!(b.serial_difference(a), Some(step as i32));
            prop_assert!(b.is_after(a));
            prop_assert!(a.is_before(b));
        }
    }
}
