//! Pieces shared by the subcommands: the queue path, opening it, product selection, the time
//! and origin of products inserted here (the test bed's, [`ldm7_testbed::replay`]), and the
//! parsers of flag values that are quantities (durations, speeds): every such flag parses into
//! a typed value or is refused by clap with what was expected (exit 1).

use std::path::{Path, PathBuf};
use std::time::Duration;

use ldm7_pq::{OpenError, Queue};
use ldm7_types::units::{QuantityError, parse_duration};
use ldm7_types::{FeedType, Pattern, Timestamp};

use crate::exit::{CmdResult, bad_input, input, runtime};

/// Now from the system clock, and the local host's origin name: the test bed's replay stamps its
/// products with them too.
pub use ldm7_testbed::replay::{now, origin};

/// The site's settings named by `$LDM7_SETTINGS`, which `ldm7 admin start` sets for the server
/// and so for its EXEC children: where `pqact` and `scour` find their configuration and data
/// directory when not told, as LDM's programs read the registry. `None` without the variable.
pub fn site_settings() -> CmdResult<Option<ldm7_config::site::SiteSettings>> {
    let Some(file) = std::env::var_os("LDM7_SETTINGS") else { return Ok(None) };
    let settings = ldm7_config::settings::Settings::load(Path::new(&file)).map_err(crate::exit::input)?;
    Ok(settings.site)
}

/// The queue used when none is given: `$LDM7_QUEUE`, else `./ldm7.pq`.
pub fn default_queue() -> PathBuf {
    std::env::var_os("LDM7_QUEUE").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("ldm7.pq"))
}

/// The queue path from `-q`, or the default.
pub fn queue_path(given: Option<&Path>) -> PathBuf {
    given.map(Path::to_path_buf).unwrap_or_else(default_queue)
}

/// Opens a queue; a missing or foreign path is bad input, a damaged queue, a full file system or
/// a storage failure a runtime failure.
pub fn open_queue(path: &Path) -> CmdResult<Queue> {
    Queue::open(path).map_err(|error| match error {
        OpenError::Missing(_) | OpenError::NotAQueue { .. } => input(error),
        OpenError::Damaged { .. } | OpenError::FileSystemFull { .. } | OpenError::Storage { .. } => runtime(error),
    })
}

/// Parses a feedtype expression argument.
pub fn parse_feed(text: &str) -> CmdResult<FeedType> {
    text.parse::<FeedType>().map_err(input)
}

/// Compiles a product-identifier pattern argument.
pub fn parse_pattern(text: &str) -> CmdResult<Pattern> {
    Pattern::new(text).map_err(|error| bad_input(format!("{error}: check the -p argument")))
}

/// `now − offset` (LDM's `-o` offsets), or the beginning of time for `None`.
pub fn since(offset: Option<Duration>) -> Timestamp {
    offset.map_or(Timestamp::ZERO, |offset| now().saturating_sub(offset))
}

/// A duration flag: `300` (seconds, as LDM's flags), `1.5s`, `250ms`, `5min`, `2h`
/// ([`parse_duration`]); negative, `inf`, `nan` and garbage are refused.
pub fn duration_arg(text: &str) -> Result<Duration, QuantityError> {
    parse_duration(text)
}

/// A duration flag that must be more than zero (a timeout).
pub fn positive_duration_arg(text: &str) -> Result<Duration, String> {
    match parse_duration(text) {
        Ok(duration) if duration.is_zero() => {
            Err(format!("{text:?} is zero: give a duration above 0 such as \"300\" (seconds)"))
        }
        Ok(duration) => Ok(duration),
        Err(error) => Err(error.to_string()),
    }
}

/// A replay speed: 1 = the trace's own pace, 60 = an hour in a minute, 0 = as fast as possible.
pub fn speed_arg(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(speed) if speed.is_finite() && (0.0..=1e9).contains(&speed) => Ok(speed),
        _ => Err(format!("speed {text:?} is not valid: give 0 (as fast as possible) or a factor such as 1 or 60")),
    }
}

/// The product selection and line format of notifyme-style commands (`watch`, `notify`).
#[derive(clap::Args, Debug)]
pub struct LineOptions {
    /// Feedtype expression the products must match.
    #[arg(short = 'f', long = "feed", default_value = "ANY")]
    pub feed: String,
    /// Extended regular expression the product identifier must match.
    #[arg(short = 'p', long = "pattern", default_value = ".*")]
    pub pattern: String,
    /// Start this far back, e.g. 3600 (seconds) or 1h; 0: only new products.
    #[arg(short = 'o', long = "offset", value_name = "DURATION", default_value = "0", value_parser = duration_arg)]
    pub offset: Duration,
    /// Append the product's origin to each line.
    #[arg(short = 'O')]
    pub origin: bool,
    /// Exit after this many products.
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
}

impl LineOptions {
    /// The selection: feedtype, pattern and the time to start from (now − offset).
    pub fn selection(&self) -> CmdResult<(FeedType, Pattern, Timestamp)> {
        let feed = parse_feed(&self.feed)?;
        let pattern = parse_pattern(&self.pattern)?;
        Ok((feed, pattern, now().saturating_sub(self.offset)))
    }

    /// A product's line, as notifyme prints it (with the signature in debug mode, `-x`).
    pub fn line(&self, info: &ldm7_types::ProdInfo, with_signature: bool) -> String {
        let mut line = info.line(with_signature);
        if self.origin {
            line.push(' ');
            line.push_str(&info.origin);
        }
        line
    }
}

/// The pid of the `ldm7 serve` that started this program as an EXEC child (`LDM7_SERVER_PID`):
/// the program stops once its parent is another process (the server was killed outright). The
/// server's pid, not the parent at start: a server killed before the child looked would
/// otherwise leave it running for good.
pub fn server_pid() -> Option<u32> {
    std::env::var("LDM7_SERVER_PID").ok()?.parse().ok()
}

/// The start of the `ldm7 serve` that EXEC'd this process (`LDM7_SERVER_STARTED`, Unix
/// microseconds): where a reader with no position begins, so that it misses nothing the server
/// received while the reader was starting.
pub fn server_started() -> Option<Timestamp> {
    std::env::var("LDM7_SERVER_STARTED").ok()?.parse().ok().map(Timestamp::from_unix_micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantity_flags_parse_or_say_what_is_expected() {
        assert_eq!(duration_arg("300").unwrap(), Duration::from_secs(300));
        assert_eq!(duration_arg("0.5").unwrap(), Duration::from_millis(500));
        assert_eq!(positive_duration_arg("1h").unwrap(), Duration::from_secs(3600));
        for bad in ["inf", "nan", "-1", "1e400", "x", ""] {
            assert!(duration_arg(bad).unwrap_err().to_string().contains("expected a duration"), "{bad}");
        }
        assert!(positive_duration_arg("0").unwrap_err().contains("above 0"));
        assert_eq!(speed_arg("60"), Ok(60.0));
        for bad in ["inf", "nan", "-1", "fast"] {
            assert!(speed_arg(bad).unwrap_err().contains("speed"), "{bad}");
        }
    }
}
