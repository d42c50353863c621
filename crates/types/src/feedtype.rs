//! Feedtypes: LDM's 32-bit feed mask, its names and aliases, expressions and printing
//! (ldm-formats.md §3).

/// A set of feeds as LDM's 32-bit mask (`feedtypet`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct FeedType(pub u32);

impl FeedType {
    /// No feed.
    pub const NONE: Self = Self(0);
    /// Every feed.
    pub const ANY: Self = Self(0xFFFF_FFFF);
    /// Experimental feed (bit 30), `pqinsert`'s default.
    pub const EXP: Self = Self(0x4000_0000);
    /// NOAAPort model output (bit 23).
    pub const NGRID: Self = Self(0x0080_0000);

    /// The raw mask.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Whether the two sets share a feed (LDM's bitwise-AND match).
    pub const fn intersects(self, other: Self) -> bool {
        self.0 & other.0 != 0
    }
}
