//! `ldm7 watch` (a local notifyme): follows the queue and prints one LDM line per new product
//! that matches, as `notifyme` prints NOTIFICATIONs (ldm-formats.md §5).

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use crate::common::{LineOptions, duration_arg, open_queue, queue_path};
use crate::exit::{CmdResult, runtime};

/// Arguments of `ldm7 watch` / `notifyme` (local queue).
#[derive(clap::Args, Debug)]
pub struct WatchArgs {
    #[command(flatten)]
    pub lines: LineOptions,
    /// Exit (status 0) after this long without a product, e.g. 30 (seconds) or 5min.
    #[arg(long, short = 'T', value_name = "DURATION", value_parser = duration_arg)]
    pub timeout: Option<Duration>,
    /// Print a summary on standard error at exit.
    #[arg(long)]
    pub summary: bool,
    /// The queue [default: $LDM7_QUEUE or ./ldm7.pq].
    #[arg(short = 'q', long = "queue", value_name = "PATH")]
    pub queue: Option<PathBuf>,
}

/// Runs `watch` (lines with the signature when `with_signature`, `-x`).
pub fn run(args: &WatchArgs, with_signature: bool) -> CmdResult {
    let (feed, pattern, from) = args.lines.selection()?;
    let timeout = args.timeout;
    let queue = open_queue(&queue_path(args.queue.as_deref()))?;
    let mut follower = queue.follow(from);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let (mut matched, mut seen, mut skipped_reported) = (0u64, 0u64, 0u64);
    while args.lines.count.is_none_or(|count| matched < count) {
        let line = follower
            .next_with(timeout, |product| {
                let info = &product.info;
                if !(feed.intersects(info.feedtype) && pattern.is_match(&info.ident)) {
                    return None;
                }
                Some(args.lines.line(info, with_signature))
            })
            .map_err(runtime)?;
        let Some(line) = line else { break };
        seen += 1;
        if follower.skipped() > skipped_reported {
            tracing::warn!(
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
