//! Pieces shared by the subcommands: the queue path, opening it, product selection.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use ldm7_pq::{OpenError, Queue};
use ldm7_types::{FeedType, Pattern, Timestamp};

use crate::exit::{CmdResult, bad_input, input, runtime};

/// The queue used when none is given: `$LDM7_QUEUE`, else `./ldm7.pq`.
pub fn default_queue() -> PathBuf {
    std::env::var_os("LDM7_QUEUE").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("ldm7.pq"))
}

/// The queue path from `-q`, or the default.
pub fn queue_path(given: Option<&Path>) -> PathBuf {
    given.map(Path::to_path_buf).unwrap_or_else(default_queue)
}

/// Opens a queue; a missing or foreign path is bad input, a storage failure a runtime failure.
pub fn open_queue(path: &Path) -> CmdResult<Queue> {
    Queue::open(path).map_err(|error| match error {
        OpenError::Missing(_) | OpenError::NotAQueue { .. } => input(error),
        OpenError::Storage { .. } => runtime(error),
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

/// Now, from the system clock.
pub fn now() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

/// `now − offset_secs` (LDM's `-o` offsets), or the beginning of time for `None`.
pub fn since(offset_secs: Option<f64>) -> CmdResult<Timestamp> {
    match offset_secs {
        None => Ok(Timestamp::ZERO),
        Some(secs) if secs.is_finite() && secs >= 0.0 => Ok(now().saturating_sub(Duration::from_secs_f64(secs))),
        Some(secs) => Err(bad_input(format!("invalid offset {secs}: give a number of seconds ≥ 0"))),
    }
}

/// The local host name as LDM uses it for the origin (at most 64 bytes).
pub fn origin() -> String {
    let mut name = hostname::get().ok().and_then(|name| name.into_string().ok()).unwrap_or_else(|| "localhost".into());
    while name.len() > ldm7_types::ORIGIN_LEN_MAX {
        name.pop();
    }
    name
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
    /// Start OFFSET seconds back [default: 0 = only new products].
    #[arg(short = 'o', long = "offset", value_name = "SECONDS", default_value_t = 0.0)]
    pub offset: f64,
    /// Lines carry the signature.
    #[arg(short = 'x')]
    pub debug: bool,
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
        if !(self.offset.is_finite() && self.offset >= 0.0) {
            return Err(bad_input(format!("invalid offset {}: give seconds ≥ 0", self.offset)));
        }
        Ok((feed, pattern, now().saturating_sub(Duration::from_secs_f64(self.offset))))
    }

    /// A product's line, as notifyme prints it.
    pub fn line(&self, info: &ldm7_types::ProdInfo) -> String {
        let mut line = info.line(self.debug);
        if self.origin {
            line.push(' ');
            line.push_str(&info.origin);
        }
        line
    }
}
