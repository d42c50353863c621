//! The classic LDM 6 `rtstats` product (ldm-formats.md §7): an hourly bin of one feed from one
//! origin at one reporting host, so LDM 6 hosts show on the monitor too.
//!
//! Identifier `rtstats-<LDM version>/<reporting host>/<FEEDTYPE>/<product origin>`; data one
//! line of blank-separated fields: the last product's creation and insertion times
//! (`YYYYMMDDhhmmss`), reporting host, feedtype, product origin, number of products, number of
//! bytes, the latest product's latency (s), mean latency (s), `<max latency>@<MMSS>`, LDM
//! version.

use ldm7_types::Timestamp;

/// Identifier prefix of rtstats products.
pub const IDENT_PREFIX: &str = "rtstats-";

/// One rtstats report.
#[derive(Clone, Debug, PartialEq)]
pub struct RtStats {
    /// Creation time of the last product of the bin.
    pub creation: Timestamp,
    /// Its insertion time in the reporting host's queue.
    pub insertion: Timestamp,
    /// The reporting host.
    pub host: String,
    /// The feedtype, as printed.
    pub feed: String,
    /// The products' origin (the host that inserted them first).
    pub origin: String,
    /// Products in the bin (the hour so far).
    pub products: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Latency of the latest product, s.
    pub latency_latest_s: f64,
    /// Mean latency, s.
    pub latency_mean_s: f64,
    /// Largest latency, s.
    pub latency_max_s: f64,
    /// `MMSS` of the slowest product's creation.
    pub max_at: String,
    /// The reporter's LDM version.
    pub version: String,
}

/// Why an rtstats product cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rtstats: {0}")]
pub struct RtStatsError(pub String);

fn time(text: &str, what: &str) -> Result<Timestamp, RtStatsError> {
    if text.len() != 14 {
        return Err(RtStatsError(format!("{what} {text:?} is not YYYYMMDDhhmmss")));
    }
    text.parse::<Timestamp>().map_err(|_| RtStatsError(format!("{what} {text:?} is not YYYYMMDDhhmmss")))
}

fn number(text: &str, what: &str) -> Result<f64, RtStatsError> {
    text.parse::<f64>()
        .ok()
        .filter(|value| value.is_finite())
        .ok_or_else(|| RtStatsError(format!("{what} {text:?} is not a number")))
}

impl RtStats {
    /// Whether an identifier names an rtstats product.
    pub fn is_rtstats_ident(ident: &str) -> bool {
        ident.starts_with(IDENT_PREFIX)
    }

    /// Reads the data line of an rtstats product.
    pub fn parse(body: &[u8]) -> Result<Self, RtStatsError> {
        let text = std::str::from_utf8(body).map_err(|_| RtStatsError("not text".into()))?;
        let line = text.lines().next().unwrap_or_default();
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() != 11 {
            return Err(RtStatsError(format!("{} fields where 11 are expected: {line:?}", fields.len())));
        }
        let count = |text: &str, what: &str| -> Result<u64, RtStatsError> {
            let value = number(text, what)?;
            if !(0.0..=1e18).contains(&value) {
                return Err(RtStatsError(format!("{what} {text:?} is out of range")));
            }
            Ok(value.round() as u64)
        };
        let (max, at) = fields[9]
            .split_once('@')
            .ok_or_else(|| RtStatsError(format!("{:?} is not <max latency>@<MMSS>", fields[9])))?;
        Ok(Self {
            creation: time(fields[0], "creation time")?,
            insertion: time(fields[1], "insertion time")?,
            host: fields[2].to_owned(),
            feed: fields[3].to_owned(),
            origin: fields[4].to_owned(),
            products: count(fields[5], "product count")?,
            bytes: count(fields[6], "byte count")?,
            latency_latest_s: number(fields[7], "latency")?,
            latency_mean_s: number(fields[8], "mean latency")?,
            latency_max_s: number(max, "largest latency")?,
            max_at: at.to_owned(),
            version: fields[10].to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line as the reference's format string writes it
    /// (`%14s %14s %32s %7.10s %32s %12.0f %12.0f %.8g %10.2f %4.0f@%4.4s %20.20s`).
    const LINE: &str = "20261123213001 20261123213002                 idd.example.edu   NGRID              \
                        ncep.example.gov         1234     98765432 1.2345678       0.87    3@3001               6.15.0\n";

    #[test]
    fn a_reference_line_is_read() {
        let stats = RtStats::parse(LINE.as_bytes()).unwrap();
        assert_eq!(stats.creation, "20261123213001".parse::<Timestamp>().unwrap());
        assert_eq!(
            (stats.host.as_str(), stats.feed.as_str(), stats.origin.as_str()),
            ("idd.example.edu", "NGRID", "ncep.example.gov")
        );
        assert_eq!((stats.products, stats.bytes), (1234, 98_765_432));
        assert_eq!((stats.latency_latest_s, stats.latency_mean_s, stats.latency_max_s), (1.2345678, 0.87, 3.0));
        assert_eq!((stats.max_at.as_str(), stats.version.as_str()), ("3001", "6.15.0"));
        assert!(RtStats::is_rtstats_ident("rtstats-6.15.0/idd.example.edu/NGRID/ncep.example.gov"));
    }

    #[test]
    fn malformed_lines_are_refused_with_the_reason() {
        for (line, expected) in [
            ("", "0 fields"),
            ("20261123213001 20261123213002 h NGRID o 1 2 3 4 5@0000", "10 fields"),
            ("2026112321300 20261123213002 h NGRID o 1 2 3 4 5@0000 v", "creation time"),
            ("20261123213001 20261123213002 h NGRID o x 2 3 4 5@0000 v", "product count"),
            ("20261123213001 20261123213002 h NGRID o 1 2 nan 4 5@0000 v", "latency"),
            ("20261123213001 20261123213002 h NGRID o 1 2 3 4 5 v", "@"),
            ("20261123213001 20261123213002 h NGRID o -1 2 3 4 5@0000 v", "out of range"),
        ] {
            let error = RtStats::parse(line.as_bytes()).unwrap_err().to_string();
            assert!(error.contains(expected), "{line:?}: {error}");
        }
    }
}
