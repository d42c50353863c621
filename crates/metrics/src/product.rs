//! The statistics product (format version 1): what one subscriber host delivered in one
//! minute, per link, published on the EXP feed so that the distribution system carries its own
//! statistics to the monitor.
//!
//! * Identifier: `ldm7-stats/1/<subscriber host>/<YYYYMMDDhhmm>` (the minute, UTC).
//! * Data: UTF-8 text. The first line is `ldm7-stats 1`; then one line per link, blank-separated
//!   `key=value` pairs:
//!
//! ```text
//! ldm7-stats 1
//! feed=NGRID publisher=pub.example.edu subscriber=sub.example.edu n=52 n_fmtp=52 n_mc=50 s_all=91234567 s_fmtp=91234567 s_mc=88000000 l_all_us=5200000 l_fmtp_us=5200000 l_mc_us=4900000 retx_blocks=31 backstop=0 backlog=0 latency_max_us=412000 host_drops=0
//! ```
//!
//! Every key of [`MinuteSums`] is required but `host_drops` (added later: an older server's
//! report leaves it out, read as 0); keys a reader does not know are ignored (a later
//! version may add some); a different version number is refused. The minute comes from the
//! identifier. Host names and feed names hold no blanks or `=`.

use crate::sums::{Link, Minute, MinuteRow, MinuteSums};

/// The identifier prefix of statistics products.
pub const IDENT_PREFIX: &str = "ldm7-stats/";
/// The format version written.
pub const VERSION: u32 = 1;

/// A statistics product: one subscriber's rows of one minute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatsProduct {
    /// The subscriber host that reports.
    pub reporter: String,
    /// The minute.
    pub minute: Minute,
    /// Its rows (each link's sums).
    pub rows: Vec<MinuteRow>,
}

/// Why a product is not a statistics product this version can read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProductError {
    /// The identifier is not `ldm7-stats/1/<host>/<YYYYMMDDhhmm>`.
    #[error("identifier {0:?} is not ldm7-stats/<version>/<host>/<YYYYMMDDhhmm>")]
    Ident(String),
    /// A version this reader does not know.
    #[error("statistics format version {0} (this reader knows version {VERSION})")]
    Version(String),
    /// The data is not what the format says.
    #[error("line {line}: {message}")]
    Body {
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
}

impl StatsProduct {
    /// The product's identifier.
    pub fn ident(&self) -> String {
        format!("{IDENT_PREFIX}{VERSION}/{}/{}", self.reporter, self.minute.text())
    }

    /// The product's data.
    pub fn body(&self) -> String {
        let mut text = format!("ldm7-stats {VERSION}\n");
        for row in &self.rows {
            text.push_str(&format!(
                "feed={} publisher={} subscriber={}",
                row.link.feed, row.link.publisher, row.link.subscriber
            ));
            for (key, value) in MinuteSums::NAMES.iter().zip(row.sums.values()) {
                text.push_str(&format!(" {key}={value}"));
            }
            text.push('\n');
        }
        text
    }

    /// Whether an identifier names a statistics product (of any version).
    pub fn is_stats_ident(ident: &str) -> bool {
        ident.starts_with(IDENT_PREFIX)
    }

    /// Reads a statistics product.
    pub fn parse(ident: &str, body: &[u8]) -> Result<Self, ProductError> {
        let bad_ident = || ProductError::Ident(ident.to_owned());
        let rest = ident.strip_prefix(IDENT_PREFIX).ok_or_else(bad_ident)?;
        let mut parts = rest.split('/');
        let (Some(version), Some(reporter), Some(minute), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad_ident());
        };
        if version != VERSION.to_string() {
            return Err(ProductError::Version(version.to_owned()));
        }
        let minute = Minute::parse(minute).ok_or_else(bad_ident)?;
        if reporter.is_empty() {
            return Err(bad_ident());
        }
        let text =
            std::str::from_utf8(body).map_err(|_| ProductError::Body { line: 1, message: "not UTF-8 text".into() })?;
        let mut lines = text.lines().enumerate();
        match lines.next() {
            Some((_, first)) if first.trim() == format!("ldm7-stats {VERSION}") => {}
            Some((_, first)) => {
                return Err(ProductError::Body {
                    line: 1,
                    message: format!("{first:?} is not \"ldm7-stats {VERSION}\""),
                });
            }
            None => return Err(ProductError::Body { line: 1, message: "empty".into() }),
        }
        let mut rows = Vec::new();
        for (index, line) in lines {
            if line.trim().is_empty() {
                continue;
            }
            let error = |message: String| ProductError::Body { line: index + 1, message };
            let mut fields = std::collections::HashMap::new();
            for pair in line.split_whitespace() {
                let (key, value) = pair.split_once('=').ok_or_else(|| error(format!("{pair:?} is not key=value")))?;
                fields.insert(key, value);
            }
            let text_field = |key: &str| -> Result<String, ProductError> {
                fields
                    .get(key)
                    .filter(|value| !value.is_empty())
                    .map(|value| (*value).to_owned())
                    .ok_or_else(|| error(format!("no {key}")))
            };
            let link = Link {
                feed: text_field("feed")?,
                publisher: text_field("publisher")?,
                subscriber: text_field("subscriber")?,
            };
            let mut numbers = [0i128; 14];
            for (slot, key) in numbers.iter_mut().zip(MinuteSums::NAMES) {
                let value = match fields.get(key) {
                    Some(value) => value,
                    None if MinuteSums::OPTIONAL.contains(&key) => "0",
                    None => return Err(error(format!("no {key}"))),
                };
                *slot = value.parse().map_err(|_| error(format!("{key}={value} is not an integer")))?;
            }
            let sums = MinuteSums::from_values(numbers)
                .map_err(|index| error(format!("{}={} is out of range", MinuteSums::NAMES[index], numbers[index])))?;
            if sums.n_mc > sums.n_fmtp || sums.n_fmtp > sums.n || sums.s_mc > sums.s_fmtp || sums.s_fmtp > sums.s_all {
                return Err(error("inconsistent sums (N″ ≤ N′ ≤ N and S″ ≤ S′ ≤ ΣS must hold)".into()));
            }
            rows.push(MinuteRow { link, minute, sums });
        }
        Ok(Self { reporter: reporter.to_owned(), minute, rows })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> StatsProduct {
        let sums = MinuteSums {
            n: 52,
            n_fmtp: 52,
            n_mc: 50,
            s_all: 91_234_567,
            s_fmtp: 91_234_567,
            s_mc: 88_000_000,
            l_all_us: 5_200_000,
            l_fmtp_us: 5_200_000,
            l_mc_us: 4_900_000,
            retx_blocks: 31,
            backstop: 0,
            backlog: 0,
            latency_max_us: 412_000,
            host_drops: 0,
        };
        let minute = Minute::parse("202611232137").unwrap();
        let link =
            Link { feed: "NGRID".into(), publisher: "pub.example.edu".into(), subscriber: "sub.example.edu".into() };
        StatsProduct { reporter: "sub.example.edu".into(), minute, rows: vec![MinuteRow { link, minute, sums }] }
    }

    #[test]
    fn the_documented_example_round_trips() {
        let product = sample();
        assert_eq!(product.ident(), "ldm7-stats/1/sub.example.edu/202611232137");
        let body = product.body();
        assert_eq!(
            body,
            "ldm7-stats 1\nfeed=NGRID publisher=pub.example.edu subscriber=sub.example.edu n=52 n_fmtp=52 n_mc=50 \
             s_all=91234567 s_fmtp=91234567 s_mc=88000000 l_all_us=5200000 l_fmtp_us=5200000 l_mc_us=4900000 \
             retx_blocks=31 backstop=0 backlog=0 latency_max_us=412000 host_drops=0\n"
        );
        assert_eq!(StatsProduct::parse(&product.ident(), body.as_bytes()).unwrap(), product);
        // Keys a later version adds are ignored.
        let extended = body.replace("backlog=0", "backlog=0 future_key=7");
        assert_eq!(StatsProduct::parse(&product.ident(), extended.as_bytes()).unwrap(), product);
        // An older server's report, without host_drops, reads as none dropped.
        let older = body.replace(" host_drops=0", "");
        assert_eq!(StatsProduct::parse(&product.ident(), older.as_bytes()).unwrap(), product);
    }

    #[test]
    fn malformed_products_are_refused_with_the_reason() {
        let product = sample();
        let ident = product.ident();
        let body = product.body();
        let cases: Vec<(String, String, &str)> = vec![
            ("ldm7-stats/2/h/202611232137".into(), body.clone(), "version 2"),
            ("ldm7-stats/1/h".into(), body.clone(), "is not ldm7-stats"),
            ("ldm7-stats/1/h/202613232137".into(), body.clone(), "is not ldm7-stats"),
            ("rtstats-6.15/h/NGRID/o".into(), body.clone(), "is not ldm7-stats"),
            (ident.clone(), "garbage\n".into(), "line 1"),
            (ident.clone(), body.replace(" n=52", ""), "no n"),
            (ident.clone(), body.replace("n_mc=50", "n_mc=x"), "n_mc=x is not an integer"),
            (ident.clone(), body.replace("s_all=91234567", "s_all=-1"), "out of range"),
            (ident.clone(), body.replace("n_mc=50", "n_mc=60"), "inconsistent"),
            (ident.clone(), body.replace("feed=NGRID ", "NGRID "), "not key=value"),
        ];
        for (ident, body, expected) in cases {
            let error = StatsProduct::parse(&ident, body.as_bytes()).unwrap_err().to_string();
            assert!(error.contains(expected), "{ident} {body:?}: {error}");
        }
        assert!(StatsProduct::parse(&ident, &[0xff, 0xfe]).is_err());
    }
}
