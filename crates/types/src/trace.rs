//! Product-metadata traces (`shared/data/README.md` §1): one product per line,
//! `SIZE_BYTES YYYYMMDDhhmmss.fff[ FEEDTYPE]`, in creation-time order; `#` starts a comment.
//! Used by replays (`ldm7 insert --replay`, `ldm7 fmtp send --replay`, the demo) and by the
//! simulator's workloads.

use std::path::Path;

use crate::{FeedType, Timestamp};

/// One product of a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceProduct {
    /// Data size in bytes.
    pub size: u32,
    /// Creation time at the origin.
    pub created: Timestamp,
    /// Feed, when the trace names one.
    pub feed: Option<FeedType>,
    /// 1-based line number.
    pub line: usize,
}

/// A line that is not a trace entry.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{line}: {what}")]
pub struct TraceError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub what: String,
}

/// Parses trace text; blank lines and comments are skipped.
pub fn parse_trace(text: &str) -> Result<Vec<TraceProduct>, TraceError> {
    let mut products = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line_number = number + 1;
        let content = line.split('#').next().unwrap_or("").trim();
        if content.is_empty() {
            continue;
        }
        let fail = |what: String| TraceError { line: line_number, what };
        let mut fields = content.split_whitespace();
        let size_text = fields.next().unwrap_or("");
        let size: u32 = size_text.parse().map_err(|_| {
            fail(format!("size {size_text:?} is not a byte count (expected `SIZE YYYYMMDDhhmmss.fff`)"))
        })?;
        let time_text = fields.next().ok_or_else(|| fail("missing creation time".into()))?;
        let created: Timestamp = time_text.parse().map_err(|error| fail(format!("{error}")))?;
        let feed = match fields.next() {
            Some(feed) => Some(feed.parse::<FeedType>().map_err(|error| fail(error.to_string()))?),
            None => None,
        };
        if let Some(extra) = fields.next() {
            return Err(fail(format!("unexpected field {extra:?} (expected `SIZE YYYYMMDDhhmmss.fff [FEED]`)")));
        }
        products.push(TraceProduct { size, created, feed, line: line_number });
    }
    Ok(products)
}

/// The feed a trace is about, guessed from its file name (`…_NGRID_…`), if any.
pub fn feed_from_name(path: &Path) -> Option<FeedType> {
    let name = path.file_name()?.to_str()?;
    name.split(|c: char| !c.is_ascii_alphanumeric()).filter(|part| part.len() >= 3).find_map(|part| {
        let upper = part.to_ascii_uppercase();
        (upper == part && !upper.starts_with("FT")).then(|| FeedType::from_name(part)).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_reports_lines() {
        let products = parse_trace("# header\n90654 20150615000000.009\n\n165 20150911225956.151 NEXRAD3\n").unwrap();
        assert_eq!(products.len(), 2);
        assert_eq!(products[0].size, 90654);
        assert_eq!(products[0].created.micros, 9000);
        assert_eq!(products[1].feed, Some(FeedType::NEXRAD3));
        assert_eq!(products[1].line, 4);
        let error = parse_trace("1 20150615000000.009\nabc 20150615000000.009\n").unwrap_err();
        assert_eq!(error.to_string(), "2: size \"abc\" is not a byte count (expected `SIZE YYYYMMDDhhmmss.fff`)");
        assert_eq!(parse_trace("12 2015\n").unwrap_err().line, 1);
        assert!(parse_trace("1 20150615000000.009 NGRID extra\n").is_err());
    }

    #[test]
    fn feed_from_file_name() {
        assert_eq!(feed_from_name(Path::new("unidata_ldm_NGRID_1hr_20150615T00Z.txt")), Some(FeedType::NGRID));
        assert_eq!(feed_from_name(Path::new("x/unidata_ldm_NEXRAD3_500prod.txt")), Some(FeedType::NEXRAD3));
        assert_eq!(feed_from_name(Path::new("trace.txt")), None);
    }
}
