//! Typed quantities parsed from operator text — flags, TOML settings, lab specs: rates, byte
//! sizes, durations, delays and loss percentages. Every command-line flag and configuration
//! field of these kinds goes through the one parser here.
//!
//! Parse, don't validate: a spec field such as `rate = "40 Mbit/s"` becomes a [`Rate`] once, and
//! everything after that works with the typed value. Prefixes are decimal (k = 1000) except the
//! explicit binary ones (`KiB`, `MiB`, `GiB`, `TiB`), as in tc(8) for rates and as LDM's
//! `pqcreate` reads sizes. Values that are not finite, negative or absurdly large are refused
//! with what was expected, never panicked on.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A bad quantity in operator text: what was given and what is expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {text:?} is not valid: {expected}")]
pub struct QuantityError {
    what: &'static str,
    text: String,
    expected: &'static str,
}

impl QuantityError {
    fn new(what: &'static str, text: &str, expected: &'static str) -> Self {
        QuantityError { what, text: text.to_string(), expected }
    }
}

/// A data rate in bits per second (path rate, HTB rate, leg bandwidth).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct Rate {
    bits_per_s: u64,
}

impl Rate {
    /// A rate of `bits_per_s` bits per second.
    pub const fn from_bits_per_s(bits_per_s: u64) -> Rate {
        Rate { bits_per_s }
    }

    /// A rate of `megabits_per_s` × 10⁶ bits per second.
    pub const fn from_megabits_per_s(megabits_per_s: u64) -> Rate {
        Rate { bits_per_s: megabits_per_s * 1_000_000 }
    }

    /// Bits per second.
    pub const fn bits_per_s(self) -> u64 {
        self.bits_per_s
    }

    /// Bytes per second, rounded down.
    pub const fn bytes_per_s(self) -> u64 {
        self.bits_per_s / 8
    }

    /// Whole megabits per second, rounded up (OESS reserves bandwidth in Mbit/s).
    pub const fn megabits_per_s_ceil(self) -> u64 {
        self.bits_per_s.div_ceil(1_000_000)
    }

    /// The rate scaled by `fraction` (0.0–1.0), at least 1 bit/s.
    pub fn scaled(self, fraction: f64) -> Rate {
        Rate { bits_per_s: ((self.bits_per_s as f64 * fraction) as u64).max(1) }
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.bits_per_s;
        if b >= 1_000_000_000 && b.is_multiple_of(1_000_000) {
            write!(f, "{} Gbit/s", b as f64 / 1e9)
        } else if b >= 1_000_000 && b.is_multiple_of(1000) {
            write!(f, "{} Mbit/s", b as f64 / 1e6)
        } else if b >= 1000 && b.is_multiple_of(1000) {
            write!(f, "{} kbit/s", b / 1000)
        } else {
            write!(f, "{b} bit/s")
        }
    }
}

impl FromStr for Rate {
    type Err = QuantityError;

    /// Accepts `40M`, `40Mbit`, `40 Mbit/s`, `40mbps`, `1.5G`, `100kbit`, `64000` (bit/s).
    fn from_str(text: &str) -> Result<Rate, QuantityError> {
        const EXPECTED: &str = "expected a positive rate such as \"40 Mbit/s\", \"500M\", \"1G\" or \"64000\" (bit/s)";
        let (number, unit) = split_number(text).ok_or_else(|| QuantityError::new("rate", text, EXPECTED))?;
        let unit = unit.to_ascii_lowercase();
        let unit = unit.strip_suffix("/s").unwrap_or(&unit);
        let unit = unit.strip_suffix("ps").unwrap_or(unit);
        let unit = unit.strip_suffix("bit").or_else(|| unit.strip_suffix('b')).unwrap_or(unit);
        let multiplier = match unit {
            "" | "b" => 1.0,
            "k" => 1e3,
            "m" => 1e6,
            "g" => 1e9,
            _ => return Err(QuantityError::new("rate", text, EXPECTED)),
        };
        let bits_per_s = number * multiplier;
        if !(1.0..1e13).contains(&bits_per_s) {
            return Err(QuantityError::new("rate", text, EXPECTED));
        }
        Ok(Rate { bits_per_s: bits_per_s.round() as u64 })
    }
}

/// A size in bytes (BFIFO limit, buffers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct ByteSize {
    bytes: u64,
}

impl ByteSize {
    /// A size of `bytes` bytes.
    pub const fn from_bytes(bytes: u64) -> ByteSize {
        ByteSize { bytes }
    }

    /// The size in bytes.
    pub const fn bytes(self) -> u64 {
        self.bytes
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.bytes;
        if b >= 1_000_000 && b.is_multiple_of(1000) {
            write!(f, "{} MB", b as f64 / 1e6)
        } else if b >= 1000 && b.is_multiple_of(1000) {
            write!(f, "{} kB", b / 1000)
        } else {
            write!(f, "{b} B")
        }
    }
}

impl FromStr for ByteSize {
    type Err = QuantityError;

    /// Accepts `600MB`, `600 MB`, `600M`, `64KiB`, `1GiB`, `2T`, `1500`, `1500B` (at least one
    /// byte).
    fn from_str(text: &str) -> Result<ByteSize, QuantityError> {
        const EXPECTED: &str = "expected a size such as \"600 MB\", \"500M\", \"64KiB\" or \"1500\" (bytes)";
        let (number, unit) = split_number(text).ok_or_else(|| QuantityError::new("size", text, EXPECTED))?;
        let multiplier = match unit.to_ascii_lowercase().as_str() {
            "" | "b" => 1.0,
            "k" | "kb" => 1e3,
            "m" | "mb" => 1e6,
            "g" | "gb" => 1e9,
            "t" | "tb" => 1e12,
            "kib" => 1024.0,
            "mib" => 1024.0 * 1024.0,
            "gib" => 1024.0 * 1024.0 * 1024.0,
            "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
            _ => return Err(QuantityError::new("size", text, EXPECTED)),
        };
        let bytes = number * multiplier;
        if !(1.0..1e16).contains(&bytes) {
            return Err(QuantityError::new("size", text, EXPECTED));
        }
        Ok(ByteSize { bytes: bytes.round() as u64 })
    }
}

/// Parses a delay such as `20ms`, `0.1 ms`, `1s`, `250us` or `0`.
pub fn parse_delay(text: &str) -> Result<Duration, QuantityError> {
    const EXPECTED: &str = "expected a delay with a unit such as \"20ms\", \"0.05ms\", \"1s\" or \"0\"";
    let (number, unit) = split_number(text).ok_or_else(|| QuantityError::new("delay", text, EXPECTED))?;
    let seconds = match unit.to_ascii_lowercase().as_str() {
        "" if number == 0.0 => 0.0,
        "s" => number,
        "ms" => number / 1e3,
        "us" | "µs" => number / 1e6,
        _ => return Err(QuantityError::new("delay", text, EXPECTED)),
    };
    if !(0.0..=60.0).contains(&seconds) {
        return Err(QuantityError::new("delay", text, "expected a delay between 0 and 60 s"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Longest duration accepted from operator text: ten years (anything longer is a typo).
pub const DURATION_MAX: Duration = Duration::from_secs(10 * 365 * 86_400);

/// Parses a duration such as `300` (seconds, as LDM's flags take them), `1.5s`, `250ms`,
/// `50us`, `5min`, `2h` or `1d`. Refuses negative, non-finite (`inf`, `nan`) and longer than
/// [`DURATION_MAX`] values with a message saying what is expected.
pub fn parse_duration(text: &str) -> Result<Duration, QuantityError> {
    const EXPECTED: &str =
        "expected a duration such as \"300\" (seconds), \"1.5s\", \"250ms\", \"5min\" or \"2h\" (at most 10 years)";
    let (number, unit) = split_number(text).ok_or_else(|| QuantityError::new("duration", text, EXPECTED))?;
    let seconds = match unit.to_ascii_lowercase().as_str() {
        "" | "s" | "sec" | "secs" => number,
        "ms" => number / 1e3,
        "us" | "µs" => number / 1e6,
        "ns" => number / 1e9,
        "m" | "min" | "mins" => number * 60.0,
        "h" | "hr" | "hours" => number * 3600.0,
        "d" | "days" => number * 86_400.0,
        _ => return Err(QuantityError::new("duration", text, EXPECTED)),
    };
    if !(seconds.is_finite() && seconds >= 0.0 && seconds <= DURATION_MAX.as_secs_f64()) {
        return Err(QuantityError::new("duration", text, EXPECTED));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Formats a duration the way [`parse_duration`] reads it back (`300s`, `1.5s`, `250ms`).
pub fn format_duration(duration: Duration) -> String {
    if duration.subsec_nanos() == 0 {
        format!("{}s", duration.as_secs())
    } else if duration < Duration::from_secs(1) && duration.as_nanos().is_multiple_of(1_000_000) {
        format!("{}ms", duration.as_millis())
    } else {
        format!("{}s", duration.as_secs_f64())
    }
}

/// A loss probability given in percent, 0–100.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Default, serde::Serialize, serde::Deserialize)]
pub struct LossPercent(f64);

impl LossPercent {
    /// No loss.
    pub const ZERO: LossPercent = LossPercent(0.0);

    /// A loss of `percent` % (0–100).
    pub fn new(percent: f64) -> Result<LossPercent, QuantityError> {
        if (0.0..=100.0).contains(&percent) {
            Ok(LossPercent(percent))
        } else {
            Err(QuantityError::new("loss_percent", &percent.to_string(), "expected a number from 0 to 100"))
        }
    }

    /// The loss in percent.
    pub fn percent(self) -> f64 {
        self.0
    }

    /// The loss as a probability 0.0–1.0.
    pub fn probability(self) -> f64 {
        self.0 / 100.0
    }

    /// True when nothing is dropped.
    pub fn is_zero(self) -> bool {
        self.0 == 0.0
    }
}

/// Splits `"40 Mbit/s"` into `(40.0, "Mbit/s")`.
fn split_number(text: &str) -> Option<(f64, &str)> {
    let text = text.trim();
    let end = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let number: f64 = text[..end].parse().ok()?;
    Some((number, text[end..].trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_in_the_usual_spellings() {
        for (text, bits) in [
            ("40M", 40_000_000),
            ("40Mbit", 40_000_000),
            ("40 Mbit/s", 40_000_000),
            ("40mbps", 40_000_000),
            ("1.5G", 1_500_000_000),
            ("100kbit", 100_000),
            ("64000", 64_000),
            ("500 Mbit/s", 500_000_000),
        ] {
            assert_eq!(text.parse::<Rate>().unwrap().bits_per_s(), bits, "{text}");
        }
        for bad in ["", "fast", "0", "-5M", "40 parsecs", "40Mbyte"] {
            assert!(bad.parse::<Rate>().is_err(), "{bad}");
        }
    }

    #[test]
    fn rate_display_and_ceil() {
        assert_eq!(Rate::from_megabits_per_s(40).to_string(), "40 Mbit/s");
        assert_eq!(Rate::from_bits_per_s(1_500_000_000).to_string(), "1.5 Gbit/s");
        assert_eq!(Rate::from_bits_per_s(40_000_001).megabits_per_s_ceil(), 41);
        assert_eq!(Rate::from_megabits_per_s(20).bytes_per_s(), 2_500_000);
    }

    #[test]
    fn sizes_parse_decimal_and_binary() {
        assert_eq!("600MB".parse::<ByteSize>().unwrap().bytes(), 600_000_000);
        assert_eq!("600 M".parse::<ByteSize>().unwrap().bytes(), 600_000_000);
        assert_eq!("64KiB".parse::<ByteSize>().unwrap().bytes(), 65_536);
        assert_eq!("1500".parse::<ByteSize>().unwrap().bytes(), 1500);
        assert_eq!("2T".parse::<ByteSize>().unwrap().bytes(), 2_000_000_000_000);
        assert_eq!("1.5k".parse::<ByteSize>().unwrap().bytes(), 1500);
        assert!("lots".parse::<ByteSize>().is_err());
        assert!("-5M".parse::<ByteSize>().is_err());
        assert!("0".parse::<ByteSize>().is_err());
    }

    #[test]
    fn delays_need_units_except_zero() {
        assert_eq!(parse_delay("20ms").unwrap(), Duration::from_millis(20));
        assert_eq!(parse_delay("0.05 ms").unwrap(), Duration::from_micros(50));
        assert_eq!(parse_delay("1s").unwrap(), Duration::from_secs(1));
        assert_eq!(parse_delay("0").unwrap(), Duration::ZERO);
        assert!(parse_delay("20").is_err());
        assert!(parse_delay("2h").is_err());
        assert!(parse_delay("120s").is_err());
    }

    #[test]
    fn durations_parse_or_are_refused_clearly() {
        assert_eq!(parse_duration("300").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("5min").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("2 h").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        for bad in ["inf", "nan", "-1", "", "5 parsecs", "1e400", "99999999999"] {
            let error = parse_duration(bad).unwrap_err().to_string();
            assert!(error.contains("expected a duration"), "{bad}: {error}");
        }
        for duration in [Duration::from_secs(300), Duration::from_millis(1500), Duration::from_millis(250)] {
            assert_eq!(parse_duration(&format_duration(duration)).unwrap(), duration);
        }
    }

    #[test]
    fn loss_is_bounded() {
        assert_eq!(LossPercent::new(5.0).unwrap().probability(), 0.05);
        assert!(LossPercent::new(101.0).is_err());
        assert!(LossPercent::new(-1.0).is_err());
    }
}
