//! Feedtypes: LDM's 32-bit feed mask, its names and aliases, expressions and printing
//! (ldm-formats.md §3).

use std::fmt;
use std::ops::{BitAnd, BitOr, Not, Sub};
use std::str::FromStr;

/// A set of feeds as LDM's 32-bit mask (`feedtypet`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct FeedType(pub u32);

macro_rules! feeds {
    ($($(#[$doc:meta])* $name:ident = $value:expr;)*) => {
        impl FeedType {
            $($(#[$doc])* pub const $name: Self = Self($value);)*
        }
    };
}

feeds! {
    /// No feed.
    NONE = 0;
    /// Public Products Service (bit 0).
    PPS = 0x1;
    /// Domestic Data Service (bit 1).
    DDS = 0x2;
    /// High-resolution Data Service (bit 2).
    HDS = 0x4;
    /// International Data Service (bit 3).
    IDS = 0x8;
    /// Spare (bit 4).
    SPARE = 0x10;
    /// Unidata-Wisconsin imagery (bit 5).
    UNIWISC = 0x20;
    /// ACARS aircraft reports (bit 6).
    PCWS = 0x40;
    /// Profiler data (bit 7).
    FSL2 = 0x80;
    /// FSL feed 3 (bit 8).
    FSL3 = 0x100;
    /// FSL feed 4 (bit 9).
    FSL4 = 0x200;
    /// FSL feed 5 (bit 10).
    FSL5 = 0x400;
    /// GPS source data (bit 11).
    GPSSRC = 0x800;
    /// NCEP model output (bit 12).
    CONDUIT = 0x1000;
    /// Composite NEXRAD imagery (bit 13).
    FNEXRAD = 0x2000;
    /// Lightning data (bit 14).
    LIGHTNING = 0x4000;
    /// WSI (bit 15).
    WSI = 0x8000;
    /// Satellite imagery (bit 16).
    SATELLITE = 0x10000;
    /// FAA 604 (bit 17).
    FAA604 = 0x20000;
    /// GPS (bit 18).
    GPS = 0x40000;
    /// Navy FNMOC model output (bit 19).
    FNMOC = 0x80000;
    /// Canadian GEM model output (bit 20).
    GEM = 0x100000;
    /// NOAAPort imagery (bit 21).
    NIMAGE = 0x200000;
    /// NOAAPort text (bit 22).
    NTEXT = 0x400000;
    /// NOAAPort model output (bit 23).
    NGRID = 0x800000;
    /// NOAAPort point data (bit 24).
    NPOINT = 0x1000000;
    /// NOAAPort graphics (bit 25).
    NGRAPH = 0x2000000;
    /// NOAAPort other (bit 26).
    NOTHER = 0x4000000;
    /// NEXRAD level-III radar products (bit 27).
    NEXRAD3 = 0x8000000;
    /// NEXRAD level-II radar data (bit 28).
    NEXRAD2 = 0x10000000;
    /// NEXRAD source (bit 29).
    NXRDSRC = 0x20000000;
    /// Experimental feed (bit 30), `pqinsert`'s default.
    EXP = 0x40000000;
    /// PPS|DDS.
    DDPLUS = 0x3;
    /// PPS|DDS|HDS|IDS (not SPARE).
    WMO = 0xF;
    /// WMO|UNIWISC.
    UNIDATA = 0x2F;
    /// Bits 6–10.
    FSL = 0x7C0;
    /// Bits 11–13.
    NMC = 0x3800;
    /// NTEXT|NGRID|NPOINT|NGRAPH|NOTHER (not NIMAGE).
    NPORT = 0x7C00000;
    /// Every feed.
    ANY = 0xFFFF_FFFF;
}

/// LDM's name table in `atofeedt.c` order: printed names first within each value. Printing walks
/// it from the end (ANY) backwards and takes the first name of each value it meets, so every
/// value's print name must come first among its entries.
const NAMES: &[(&str, u32)] = &[
    ("NONE", 0),
    ("PPS", 0x1),
    ("FT0", 0x1),
    ("DDS", 0x2),
    ("DOMESTIC", 0x2),
    ("FT1", 0x2),
    ("DDPLUS", 0x3),
    ("HDS", 0x4),
    ("HRS", 0x4),
    ("FT2", 0x4),
    ("IDS", 0x8),
    ("INTNL", 0x8),
    ("FT3", 0x8),
    ("WMO", 0xF),
    ("SPARE", 0x10),
    ("NPS", 0x10),
    ("FT4", 0x10),
    ("UNIWISC", 0x20),
    ("MCIDAS", 0x20),
    ("FT5", 0x20),
    ("UNIDATA", 0x2F),
    ("PCWS", 0x40),
    ("ACARS", 0x40),
    ("FT6", 0x40),
    ("FSL2", 0x80),
    ("PROFILER", 0x80),
    ("FT7", 0x80),
    ("FSL3", 0x100),
    ("FT8", 0x100),
    ("FSL4", 0x200),
    ("FT9", 0x200),
    ("FSL5", 0x400),
    ("FT10", 0x400),
    ("FSL", 0x7C0),
    ("PROFS", 0x7C0),
    ("GPSSRC", 0x800),
    ("AFOS", 0x800),
    ("NMC1", 0x800),
    ("FT11", 0x800),
    ("CONDUIT", 0x1000),
    ("NMC2", 0x1000),
    ("NCEPH", 0x1000),
    ("FT12", 0x1000),
    ("FNEXRAD", 0x2000),
    ("NMC3", 0x2000),
    ("FT13", 0x2000),
    ("NMC", 0x3800),
    ("LIGHTNING", 0x4000),
    ("NLDN", 0x4000),
    ("FT14", 0x4000),
    ("WSI", 0x8000),
    ("FT15", 0x8000),
    ("SATELLITE", 0x10000),
    ("DIFAX", 0x10000),
    ("FT16", 0x10000),
    ("FAA604", 0x20000),
    ("FAA", 0x20000),
    ("604", 0x20000),
    ("FT17", 0x20000),
    ("GPS", 0x40000),
    ("FT18", 0x40000),
    ("FNMOC", 0x80000),
    ("NOGAPS", 0x80000),
    ("SEISMIC", 0x80000),
    ("FT19", 0x80000),
    ("GEM", 0x100000),
    ("CMC", 0x100000),
    ("FT20", 0x100000),
    ("NIMAGE", 0x200000),
    ("IMAGE", 0x200000),
    ("FT21", 0x200000),
    ("NTEXT", 0x400000),
    ("TEXT", 0x400000),
    ("FT22", 0x400000),
    ("NGRID", 0x800000),
    ("GRID", 0x800000),
    ("FT23", 0x800000),
    ("NPOINT", 0x1000000),
    ("POINT", 0x1000000),
    ("NBUFR", 0x1000000),
    ("BUFR", 0x1000000),
    ("FT24", 0x1000000),
    ("NGRAPH", 0x2000000),
    ("GRAPH", 0x2000000),
    ("FT25", 0x2000000),
    ("NOTHER", 0x4000000),
    ("OTHER", 0x4000000),
    ("FT26", 0x4000000),
    ("NPORT", 0x7C00000),
    ("NEXRAD3", 0x8000000),
    ("NNEXRAD", 0x8000000),
    ("NEXRAD", 0x8000000),
    ("FT27", 0x8000000),
    ("NEXRAD2", 0x10000000),
    ("NEXRD2", 0x10000000),
    ("CRAFT", 0x10000000),
    ("FT28", 0x10000000),
    ("NXRDSRC", 0x20000000),
    ("FT29", 0x20000000),
    ("EXP", 0x40000000),
    ("FT30", 0x40000000),
    ("ANY", 0xFFFF_FFFF),
];

impl FeedType {
    /// The raw mask.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Whether the two sets share a feed (LDM's bitwise-AND match).
    pub const fn intersects(self, other: Self) -> bool {
        self.0 & other.0 != 0
    }

    /// Whether every feed of `other` is in `self`.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether this is the empty set.
    pub const fn is_none(self) -> bool {
        self.0 == 0
    }

    /// The value of one feedtype name or alias (case-insensitive), as LDM's table has it.
    pub fn from_name(name: &str) -> Option<Self> {
        NAMES.iter().find(|(known, _)| known.eq_ignore_ascii_case(name)).map(|&(_, bits)| Self(bits))
    }

    /// Every name and alias with its value, in LDM's table order.
    pub fn names() -> impl Iterator<Item = (&'static str, Self)> {
        NAMES.iter().map(|&(name, bits)| (name, Self(bits)))
    }

    /// The names printing uses: the first entry of each distinct value, in table order.
    fn print_names() -> impl DoubleEndedIterator<Item = (&'static str, u32)> {
        NAMES
            .iter()
            .enumerate()
            .filter(|(index, (_, bits))| NAMES[..*index].iter().all(|(_, seen)| seen != bits))
            .map(|(_, &(name, bits))| (name, bits))
    }
}

impl BitOr for FeedType {
    type Output = Self;
    fn bitor(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }
}

impl BitAnd for FeedType {
    type Output = Self;
    fn bitand(self, other: Self) -> Self {
        Self(self.0 & other.0)
    }
}

impl Sub for FeedType {
    type Output = Self;
    fn sub(self, other: Self) -> Self {
        Self(self.0 & !other.0)
    }
}

impl Not for FeedType {
    type Output = Self;
    fn not(self) -> Self {
        Self(!self.0)
    }
}

/// LDM's `ft_format`: `NONE` for 0; otherwise the largest named sets first (composites such as
/// WMO or NPORT before their members), joined with `|`; unnamed leftover bits as `0x%08x`.
impl fmt::Display for FeedType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            return f.write_str("NONE");
        }
        let mut left = self.0;
        let mut first = true;
        for (name, bits) in Self::print_names().rev() {
            if bits != 0 && left & bits == bits {
                if !first {
                    f.write_str("|")?;
                }
                f.write_str(name)?;
                first = false;
                left &= !bits;
                if left == 0 {
                    return Ok(());
                }
            }
        }
        if !first {
            f.write_str("|")?;
        }
        write!(f, "0x{left:08x}")
    }
}

/// Why a feedtype expression did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseFeedTypeError {
    /// An empty expression.
    #[error("empty feedtype expression: give a feedtype name such as NGRID, ANY or \"WMO|NEXRAD3\"")]
    Empty,
    /// A name that is not in LDM's feedtype table.
    #[error("unknown feedtype {name:?} in {expression:?}: use a name such as NGRID, NEXRAD3, WMO or ANY")]
    UnknownName {
        /// The unknown name.
        name: String,
        /// The whole expression.
        expression: String,
    },
    /// A character or token where it does not belong.
    #[error("feedtype expression {expression:?}: {problem} at column {column}")]
    Syntax {
        /// What is wrong.
        problem: &'static str,
        /// 1-based column of the problem.
        column: usize,
        /// The whole expression.
        expression: String,
    },
}

/// Parses LDM's feedtype expressions (`atofeedt.c`):
/// `expr := term { ('|' | '+') term }`, `term := primary { '-' primary }`,
/// `primary := NAME | '~' primary | '(' expr ')'`; names are case-insensitive; whitespace is
/// allowed; numbers are not (only the alias `604`).
impl FromStr for FeedType {
    type Err = ParseFeedTypeError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.trim().is_empty() {
            return Err(ParseFeedTypeError::Empty);
        }
        let mut parser = Parser { text, position: 0 };
        let value = parser.expression()?;
        parser.skip_space();
        if parser.position < text.len() {
            return Err(parser.syntax("unexpected character"));
        }
        Ok(value)
    }
}

struct Parser<'a> {
    text: &'a str,
    position: usize,
}

impl Parser<'_> {
    fn skip_space(&mut self) {
        let rest = &self.text[self.position..];
        self.position += rest.len() - rest.trim_start().len();
    }

    fn peek(&mut self) -> Option<char> {
        self.skip_space();
        self.text[self.position..].chars().next()
    }

    fn syntax(&self, problem: &'static str) -> ParseFeedTypeError {
        ParseFeedTypeError::Syntax { problem, column: self.position + 1, expression: self.text.to_owned() }
    }

    fn expression(&mut self) -> Result<FeedType, ParseFeedTypeError> {
        let mut value = self.term()?;
        while let Some('|' | '+') = self.peek() {
            self.position += 1;
            value = value | self.term()?;
        }
        Ok(value)
    }

    fn term(&mut self) -> Result<FeedType, ParseFeedTypeError> {
        let mut value = self.primary()?;
        while let Some('-') = self.peek() {
            self.position += 1;
            value = value - self.primary()?;
        }
        Ok(value)
    }

    fn primary(&mut self) -> Result<FeedType, ParseFeedTypeError> {
        match self.peek() {
            Some('~') => {
                self.position += 1;
                Ok(!self.primary()?)
            }
            Some('(') => {
                self.position += 1;
                let value = self.expression()?;
                if self.peek() != Some(')') {
                    return Err(self.syntax("missing ')'"));
                }
                self.position += 1;
                Ok(value)
            }
            Some(c) if c.is_ascii_alphanumeric() => {
                let rest = &self.text[self.position..];
                let length = rest.find(|c: char| !c.is_ascii_alphanumeric()).unwrap_or(rest.len());
                let name = &rest[..length];
                self.position += length;
                FeedType::from_name(name).ok_or_else(|| ParseFeedTypeError::UnknownName {
                    name: name.to_owned(),
                    expression: self.text.to_owned(),
                })
            }
            Some(_) => Err(self.syntax("expected a feedtype name, '~' or '('")),
            None => Err(self.syntax("expression ends where a feedtype name was expected")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> FeedType {
        text.parse().unwrap_or_else(|error| panic!("{text}: {error}"))
    }

    #[test]
    fn every_bit_has_its_print_name() {
        let expected = [
            "PPS",
            "DDS",
            "HDS",
            "IDS",
            "SPARE",
            "UNIWISC",
            "PCWS",
            "FSL2",
            "FSL3",
            "FSL4",
            "FSL5",
            "GPSSRC",
            "CONDUIT",
            "FNEXRAD",
            "LIGHTNING",
            "WSI",
            "SATELLITE",
            "FAA604",
            "GPS",
            "FNMOC",
            "GEM",
            "NIMAGE",
            "NTEXT",
            "NGRID",
            "NPOINT",
            "NGRAPH",
            "NOTHER",
            "NEXRAD3",
            "NEXRAD2",
            "NXRDSRC",
            "EXP",
        ];
        for (bit, name) in expected.iter().enumerate() {
            let feed = FeedType(1 << bit);
            assert_eq!(feed.to_string(), *name);
            assert_eq!(parse(name), feed);
        }
        assert_eq!(FeedType(1 << 31).to_string(), "0x80000000");
    }

    #[test]
    fn aliases_are_accepted() {
        for (alias, bits) in [
            ("domestic", 0x2),
            ("HRS", 0x4),
            ("intnl", 0x8),
            ("NPS", 0x10),
            ("mcidas", 0x20),
            ("ACARS", 0x40),
            ("PROFILER", 0x80),
            ("AFOS", 0x800),
            ("NMC1", 0x800),
            ("NMC2", 0x1000),
            ("NCEPH", 0x1000),
            ("NMC3", 0x2000),
            ("NLDN", 0x4000),
            ("DIFAX", 0x10000),
            ("FAA", 0x20000),
            ("604", 0x20000),
            ("NOGAPS", 0x80000),
            ("SEISMIC", 0x80000),
            ("CMC", 0x100000),
            ("IMAGE", 0x200000),
            ("TEXT", 0x400000),
            ("GRID", 0x800000),
            ("POINT", 0x1000000),
            ("NBUFR", 0x1000000),
            ("BUFR", 0x1000000),
            ("GRAPH", 0x2000000),
            ("OTHER", 0x4000000),
            ("NNEXRAD", 0x8000000),
            ("NEXRAD", 0x8000000),
            ("NEXRD2", 0x10000000),
            ("CRAFT", 0x10000000),
            ("PROFS", 0x7C0),
            ("ft30", 0x40000000),
            ("FT0", 0x1),
        ] {
            assert_eq!(parse(alias), FeedType(bits), "{alias}");
        }
    }

    #[test]
    fn composites_print_first() {
        assert_eq!(FeedType::WMO.to_string(), "WMO");
        assert_eq!(FeedType(0x1F).to_string(), "SPARE|WMO");
        assert_eq!(FeedType::DDPLUS.to_string(), "DDPLUS");
        assert_eq!(FeedType::UNIDATA.to_string(), "UNIDATA");
        assert_eq!(FeedType::NPORT.to_string(), "NPORT");
        assert_eq!(FeedType(0x7E00000).to_string(), "NPORT|NIMAGE");
        assert_eq!(FeedType::ANY.to_string(), "ANY");
        assert_eq!(FeedType::NONE.to_string(), "NONE");
        assert_eq!((FeedType::WMO | FeedType::NEXRAD3).to_string(), "NEXRAD3|WMO");
        assert_eq!(FeedType(0x8000_0001).to_string(), "PPS|0x80000000");
        assert_eq!(
            (FeedType::ANY - FeedType::EXP).to_string(),
            "NXRDSRC|NEXRAD2|NEXRAD3|NPORT|NIMAGE|GEM|FNMOC|GPS|FAA604|SATELLITE|WSI|LIGHTNING|NMC|FSL|UNIDATA|SPARE|0x80000000"
        );
    }

    #[test]
    fn expressions() {
        assert_eq!(parse("WMO|NEXRAD3"), FeedType(0x800_000F));
        assert_eq!(parse("wmo + nexrad3"), FeedType(0x800_000F));
        assert_eq!(parse("ANY-EXP"), FeedType(0xBFFF_FFFF));
        assert_eq!(parse("ANY - (EXP | NGRID)"), FeedType(0xBF7F_FFFF));
        assert_eq!(parse("~EXP"), FeedType(0xBFFF_FFFF));
        assert_eq!(parse("~~EXP"), FeedType::EXP);
        assert_eq!(parse("WMO-DDS|EXP"), FeedType(0x4000_000D));
        assert_eq!(parse(" NGRID "), FeedType::NGRID);
    }

    #[test]
    fn bad_expressions_say_why() {
        assert_eq!("".parse::<FeedType>(), Err(ParseFeedTypeError::Empty));
        assert!(matches!("3".parse::<FeedType>(), Err(ParseFeedTypeError::UnknownName { .. })));
        assert!(matches!("BOGUS".parse::<FeedType>(), Err(ParseFeedTypeError::UnknownName { .. })));
        let error = "(WMO".parse::<FeedType>().unwrap_err();
        assert!(error.to_string().contains("missing ')'"), "{error}");
        assert!("WMO|".parse::<FeedType>().is_err());
        assert!("WMO)".parse::<FeedType>().is_err());
        assert!("WMO,DDS".parse::<FeedType>().is_err());
    }

    proptest::proptest! {
        #[test]
        fn printed_form_parses_back(bits in proptest::prelude::any::<u32>()) {
            let feed = FeedType(bits);
            let printed = feed.to_string();
            if bits & 0x8000_0000 == 0 || bits == u32::MAX {
                proptest::prop_assert_eq!(printed.parse::<FeedType>(), Ok(feed));
            } else {
                proptest::prop_assert!(printed.ends_with("0x80000000"));
            }
        }
    }
}
