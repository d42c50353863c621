//! The classic LDM 6 `rtstats` product (ldm-formats.md §7): an hourly bin of one feed from one
//! origin at one reporting host, so LDM 6 hosts show on the monitor too.
//!
//! Identifier `rtstats-<LDM version>/<reporting host>/<FEEDTYPE>/<product origin>`; data one
//! line of blank-separated fields: the last product's creation and insertion times
//! (`YYYYMMDDhhmmss`), reporting host, feedtype, product origin, number of products, number of
//! bytes, the latest product's latency (s), mean latency (s), `<max latency>@<MMSS>`, LDM
//! version.
//!
//! Written too ([`RtStats::line`], [`RtStats::ident`]) from [`RtStatsBins`], the reference's
//! binning (per hour of creation, feedtype and origin), by `ldm7 rtstats`.

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

/// The host a report's products came from: the upstream an origin `origin_v_upstream` names
/// (a relay rewrites a product's origin so, ldm6-protocol.md §8), else the origin itself
/// (products inserted where they were made).
pub fn upstream_of(origin: &str) -> &str {
    origin.find("_v_").map_or(origin, |at| &origin[at + 3..])
}

/// The product-format version of ldm7's reports: where LDM writes its version (`6.15.0`), in the
/// identifier and the last field.
pub fn reporter_version() -> String {
    format!("ldm7-{}", env!("CARGO_PKG_VERSION"))
}

impl RtStats {
    /// The data line, as the reference's format writes it (ldm-formats.md §7:
    /// `%14.14s %14.14s %32s %7.10s %32s %12.0f %12.0f %.8g %10.2f %4.0f@%4.4s %20.20s\n`).
    pub fn line(&self) -> String {
        let seconds = |time: Timestamp| time.to_string().chars().take(14).collect::<String>();
        let feed: String = self.feed.chars().take(10).collect();
        let origin: String = self.origin.chars().take(HOSTNAME_MAX).collect();
        let host: String = self.host.chars().take(POSIX_HOST_NAME_MAX).collect();
        let max_at: String = self.max_at.chars().take(4).collect();
        let version: String = self.version.chars().take(20).collect();
        format!(
            "{:>14} {:>14} {host:>32} {feed:>7} {origin:>32} {:>12.0} {:>12.0} {} {:>10.2} {:>4.0}@{max_at:>4} {version:>20}\n",
            seconds(self.creation),
            seconds(self.insertion),
            self.products as f64,
            self.bytes as f64,
            format_g8(self.latency_latest_s),
            self.latency_mean_s,
            self.latency_max_s,
        )
    }

    /// The product's identifier: `rtstats-<version>/<reporting host>/<FEEDTYPE>/<origin>`, the
    /// feedtype and origin as the line prints them.
    pub fn ident(&self) -> String {
        let feed: String = self.feed.chars().take(10).collect();
        let origin: String = self.origin.chars().take(HOSTNAME_MAX).collect();
        format!("{IDENT_PREFIX}{}/{}/{feed}/{origin}", self.version, self.host)
    }
}

/// The longest origin the line holds (LDM's `HOSTNAMESIZE`).
const HOSTNAME_MAX: usize = 64;

/// The longest reporting host name the line holds (`_POSIX_HOST_NAME_MAX`).
const POSIX_HOST_NAME_MAX: usize = 255;

/// C's `%.8g`: eight significant digits, trailing zeros removed, the exponent form below 1e-4 and
/// from 1e8.
pub fn format_g8(value: f64) -> String {
    const PRECISION: i32 = 8;
    if value == 0.0 {
        return if value.is_sign_negative() { "-0".into() } else { "0".into() };
    }
    if !value.is_finite() {
        return if value.is_nan() {
            "nan".into()
        } else if value > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        };
    }
    let scientific = format!("{:.*e}", (PRECISION - 1) as usize, value);
    let (mantissa, exponent) = scientific.split_once('e').expect("an exponent");
    let exponent: i32 = exponent.parse().expect("a number");
    let trim = |text: &str| -> String {
        if text.contains('.') { text.trim_end_matches('0').trim_end_matches('.').to_owned() } else { text.to_owned() }
    };
    if !(-4..PRECISION).contains(&exponent) {
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mantissa), exponent.abs())
    } else {
        trim(&format!("{:.*}", (PRECISION - 1 - exponent) as usize, value))
    }
}

/// One bin of the reports: the products of one feedtype from one origin created in one hour.
#[derive(Clone, Debug, PartialEq)]
struct Bin {
    creation: Timestamp,
    insertion: Timestamp,
    products: u64,
    bytes: u64,
    latency_sum_s: f64,
    latency_max_s: f64,
    /// Creation of the slowest product (none while no latency was above zero: `0000`).
    slowest_at: Option<Timestamp>,
    changed: bool,
}

/// The products a host received, binned as the reference's rtstats bins them: per hour of
/// creation, feedtype and origin; a bin is reported again when a product was added to it.
/// The reference keeps 4,000 bins; the oldest hours go first.
#[derive(Clone, Debug)]
pub struct RtStatsBins {
    host: String,
    version: String,
    /// (hour, feedtype bits, feedtype name, origin) → bin.
    bins: std::collections::BTreeMap<(std::cmp::Reverse<i64>, u32, String, String), Bin>,
}

/// The most bins kept (the reference's `MAXBINS`).
pub const BINS_MAX: usize = 4000;

impl RtStatsBins {
    /// Bins reported as `host`, with `version` in the identifier and the line.
    pub fn new(host: impl Into<String>, version: impl Into<String>) -> Self {
        Self { host: host.into(), version: version.into(), bins: Default::default() }
    }

    /// Adds a product: its feedtype (as printed and as bits, for the order), origin, creation
    /// time, size, and when this host inserted it.
    pub fn add(&mut self, feed: (&str, u32), origin: &str, creation: Timestamp, size: u64, insertion: Timestamp) {
        let hour = creation.as_unix_micros().div_euclid(3_600_000_000) * 3600;
        let latency = (insertion.as_unix_micros() - creation.as_unix_micros()) as f64 / 1e6;
        let key = (std::cmp::Reverse(hour), feed.1, feed.0.to_owned(), origin.to_owned());
        let bin = self.bins.entry(key).or_insert(Bin {
            creation,
            insertion,
            products: 0,
            bytes: 0,
            latency_sum_s: 0.0,
            latency_max_s: 0.0,
            slowest_at: None,
            changed: false,
        });
        bin.products += 1;
        bin.bytes += size;
        bin.creation = creation;
        bin.insertion = insertion;
        bin.latency_sum_s += latency;
        if latency > bin.latency_max_s {
            bin.latency_max_s = latency;
            bin.slowest_at = Some(creation);
        }
        bin.changed = true;
        while self.bins.len() > BINS_MAX {
            let oldest = self.bins.keys().next_back().cloned().expect("a bin");
            self.bins.remove(&oldest);
        }
    }

    /// Marks the bins of `reports` changed again (their sending failed: they go with the next).
    pub fn mark_changed(&mut self, reports: &[RtStats]) {
        for report in reports {
            let hour = report.creation.as_unix_micros().div_euclid(3_600_000_000) * 3600;
            for ((bin_hour, _, feed, origin), bin) in self.bins.iter_mut() {
                if bin_hour.0 == hour && *feed == report.feed && *origin == report.origin {
                    bin.changed = true;
                }
            }
        }
    }

    /// The reports of the bins that changed since the last call, newest hour first (the
    /// reference's order), marking them reported.
    pub fn take_changed(&mut self) -> Vec<RtStats> {
        let (host, version) = (&self.host, &self.version);
        self.bins
            .iter_mut()
            .filter(|(_, bin)| bin.changed)
            .map(|((_, _, feed, origin), bin)| {
                bin.changed = false;
                let since_hour =
                    bin.slowest_at.map_or(0, |at| at.as_unix_micros().div_euclid(1_000_000).rem_euclid(3600));
                RtStats {
                    creation: bin.creation,
                    insertion: bin.insertion,
                    host: host.clone(),
                    feed: feed.clone(),
                    origin: origin.clone(),
                    products: bin.products,
                    bytes: bin.bytes,
                    latency_latest_s: (bin.insertion.as_unix_micros() - bin.creation.as_unix_micros()) as f64 / 1e6,
                    latency_mean_s: bin.latency_sum_s / bin.products.max(1) as f64,
                    latency_max_s: bin.latency_max_s,
                    max_at: format!("{:02}{:02}", since_hour / 60, since_hour % 60),
                    version: version.clone(),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relayed_origin_names_its_upstream() {
        assert_eq!(upstream_of("vm_v_10.77.2.1"), "10.77.2.1");
        assert_eq!(upstream_of("vm_v_relay_v_x.edu"), "relay_v_x.edu", "the rewrite keeps the origin's first part");
        assert_eq!(upstream_of("vm"), "vm", "inserted where made");
    }

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

    /// A product LDM 6.15's rtstats sent (to an ldm7 server, which stored it): three NGRID
    /// products of 1,000, 2,000 and 3,000 bytes inserted by pqinsert.
    const REFERENCE_LINE: &str = "20261128085342 20261128085342                    ldm.site.test   NGRID                    \
                                  ldm.site.test            3         6000 1.2e-05       0.00    0@5342               6.15.0\n";

    #[test]
    fn a_line_written_is_byte_for_byte_the_reference_s() {
        let at = |text: &str| text.parse::<Timestamp>().unwrap();
        let stats = RtStats {
            creation: at("20261128085342.123456"),
            insertion: at("20261128085342.123468"),
            host: "ldm.site.test".into(),
            feed: "NGRID".into(),
            origin: "ldm.site.test".into(),
            products: 3,
            bytes: 6000,
            latency_latest_s: 1.2e-05,
            latency_mean_s: 4e-06,
            latency_max_s: 1.2e-05,
            max_at: "5342".into(),
            version: "6.15.0".into(),
        };
        assert_eq!(stats.line(), REFERENCE_LINE);
        assert_eq!(stats.ident(), "rtstats-6.15.0/ldm.site.test/NGRID/ldm.site.test");
        let read = RtStats::parse(stats.line().as_bytes()).unwrap();
        assert_eq!((read.products, read.bytes, read.latency_latest_s), (3, 6000, 1.2e-05));
    }

    #[test]
    fn g8_is_cs_percent_point_8_g() {
        for (value, printed) in [
            (0.0, "0"),
            (1.2345678, "1.2345678"),
            (1.23456789, "1.2345679"),
            (0.5, "0.5"),
            (12.0, "12"),
            (-3.25, "-3.25"),
            (123456789.0, "1.2345679e+08"),
            (12345678.0, "12345678"),
            (0.0001, "0.0001"),
            (0.00001234, "1.234e-05"),
            (100000000.0, "1e+08"),
        ] {
            assert_eq!(format_g8(value), printed, "{value}");
        }
    }

    #[test]
    fn bins_are_per_hour_feedtype_and_origin_and_reported_when_changed() {
        let at = |text: &str| text.parse::<Timestamp>().unwrap();
        let mut bins = RtStatsBins::new("relay.example.edu", "ldm7-0.1.0");
        bins.add(("NGRID", 1 << 22), "a.example", at("20261123213001"), 100, at("20261123213003"));
        bins.add(("NGRID", 1 << 22), "a.example", at("20261123214510"), 50, at("20261123214511"));
        bins.add(("NGRID", 1 << 22), "b.example", at("20261123214510"), 7, at("20261123214510"));
        bins.add(("IDS", 4), "a.example", at("20261123205959"), 1, at("20261123210000"));
        let reports = bins.take_changed();
        let keys: Vec<(&str, &str, u64)> =
            reports.iter().map(|report| (report.feed.as_str(), report.origin.as_str(), report.products)).collect();
        // The newest hour first, then by feedtype, then origin.
        assert_eq!(keys, [("NGRID", "a.example", 2), ("NGRID", "b.example", 1), ("IDS", "a.example", 1)]);
        let first = &reports[0];
        assert_eq!((first.bytes, first.creation, first.insertion), (150, at("20261123214510"), at("20261123214511")));
        assert_eq!((first.latency_latest_s, first.latency_mean_s, first.latency_max_s), (1.0, 1.5, 2.0));
        assert_eq!(first.max_at, "3001", "the slowest product's minute and second");
        assert_eq!(reports[1].max_at, "0000", "no latency above zero");
        assert!(bins.take_changed().is_empty(), "nothing changed since");
        bins.add(("IDS", 4), "a.example", at("20261123205959"), 1, at("20261123210000"));
        assert_eq!(bins.take_changed().len(), 1);
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
