//! Product-metadata traces (`shared/data/README.md` §1): one product per line,
//! `SIZE_BYTES YYYYMMDDhhmmss.fff[ FEEDTYPE]`, in creation-time order; `#` starts a comment.

use std::path::Path;

use ldm7_types::{FeedType, Timestamp};

/// One product of a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceProduct {
    /// Data size in bytes.
    pub size: u32,
    /// Creation time at the origin.
    pub created: Timestamp,
    /// Feed, when the trace names one.
    pub feed: Option<FeedType>,
    /// 1-based line number in the file.
    pub line: usize,
}

/// Reads and parses a whole trace; errors name `file:line`.
pub fn read_trace(path: &Path) -> Result<Vec<TraceProduct>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|error| format!("cannot read trace {}: {error}: check the path", path.display()))?;
    let mut products = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line_number = number + 1;
        let content = line.split('#').next().unwrap_or("").trim();
        if content.is_empty() {
            continue;
        }
        let fail = |what: String| format!("{}:{line_number}: {what}", path.display());
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
        products.push(TraceProduct { size, created, feed, line: line_number });
    }
    if products.is_empty() {
        return Err(format!("trace {} holds no products", path.display()));
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
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.txt");
        std::fs::write(&path, "# header\n90654 20150615000000.009\n\n165 20150911225956.151 NEXRAD3\n").expect("write");
        let products = read_trace(&path).expect("parse");
        assert_eq!(products.len(), 2);
        assert_eq!(products[0].size, 90654);
        assert_eq!(products[0].created.micros, 9000);
        assert_eq!(products[1].feed, Some(FeedType::NEXRAD3));
        assert_eq!(products[1].line, 4);
        std::fs::write(&path, "1 20150615000000.009\nabc 20150615000000.009\n").expect("write");
        let error = read_trace(&path).unwrap_err();
        assert!(
            error.ends_with(":2: size \"abc\" is not a byte count (expected `SIZE YYYYMMDDhhmmss.fff`)"),
            "{error}"
        );
    }

    #[test]
    fn feed_from_file_name() {
        assert_eq!(feed_from_name(Path::new("unidata_ldm_NGRID_1hr_20150615T00Z.txt")), Some(FeedType::NGRID));
        assert_eq!(feed_from_name(Path::new("x/unidata_ldm_NEXRAD3_500prod.txt")), Some(FeedType::NEXRAD3));
        assert_eq!(feed_from_name(Path::new("trace.txt")), None);
    }
}
