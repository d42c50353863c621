//! `ldm7 watch` (a local notifyme): follows the queue and prints one LDM line per new product
//! that matches, as `notifyme` prints NOTIFICATIONs (ldm-formats.md §5).

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use crate::common::{now, open_queue, parse_feed, parse_pattern, queue_path, since};
use crate::exit::{CmdResult, runtime};

/// Arguments of `ldm7 watch` / `notifyme` (local queue).
#[derive(clap::Args, Debug)]
pub struct WatchArgs {
    /// Feedtype expression the products must match.
    #[arg(short = 'f', long = "feed", default_value = "ANY")]
    pub feed: String,
    /// Extended regular expression the product identifier must match.
    #[arg(short = 'p', long = "pattern", default_value = ".*")]
    pub pattern: String,
    /// Start OFFSET seconds back in the queue [default: 0 = only new products].
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
    /// Exit after this many seconds without a matching product.
    #[arg(long, short = 'T', value_name = "SECONDS")]
    pub timeout: Option<f64>,
    /// Print a summary on standard error at exit.
    #[arg(long)]
    pub summary: bool,
    /// The queue [default: $LDM7_QUEUE or ./ldm7.pq].
    #[arg(short = 'q', long = "queue", value_name = "PATH")]
    pub queue: Option<PathBuf>,
    /// Accepted for LDM compatibility; logging goes to standard error.
    #[arg(short = 'l', value_name = "LOGFILE", hide = true)]
    pub log: Option<String>,
    /// Accepted for LDM compatibility (verbose).
    #[arg(short = 'v', hide = true)]
    pub verbose: bool,
}

/// Runs `watch`.
pub fn run(args: &WatchArgs) -> CmdResult {
    let feed = parse_feed(&args.feed)?;
    let pattern = parse_pattern(&args.pattern)?;
    let from = if args.offset == 0.0 { now() } else { since(Some(args.offset))? };
    let timeout = match args.timeout {
        Some(secs) if secs.is_finite() && secs >= 0.0 => Some(Duration::from_secs_f64(secs)),
        Some(secs) => return Err(crate::exit::bad_input(format!("invalid --timeout {secs}: give seconds ≥ 0"))),
        None => None,
    };
    let queue = open_queue(&queue_path(args.queue.as_deref()))?;
    let mut follower = queue.follow(from);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let (mut matched, mut seen, mut skipped_reported) = (0u64, 0u64, 0u64);
    while args.count.is_none_or(|count| matched < count) {
        let line = follower
            .next_with(timeout, |product| {
                let info = &product.info;
                if !(feed.intersects(info.feedtype) && pattern.is_match(&info.ident)) {
                    return None;
                }
                let mut line = info.line(args.debug);
                if args.origin {
                    line.push(' ');
                    line.push_str(&info.origin);
                }
                Some(line)
            })
            .map_err(runtime)?;
        let Some(line) = line else { break };
        seen += 1;
        if follower.skipped() > skipped_reported {
            eprintln!(
                "watch: {} product(s) were evicted from the queue before they could be read",
                follower.skipped() - skipped_reported
            );
            skipped_reported = follower.skipped();
        }
        if let Some(line) = line {
            matched += 1;
            if let Err(error) = writeln!(out, "{line}").and_then(|()| out.flush()) {
                if error.kind() == std::io::ErrorKind::BrokenPipe {
                    return Ok(());
                }
                return Err(runtime(error));
            }
        }
    }
    if args.summary {
        eprintln!("watch: {matched} matching of {seen} products read, {} skipped", follower.skipped());
    }
    Ok(())
}
