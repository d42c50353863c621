//! `ldm7 cat` (pqcat): products already in the queue, oldest first — their data to standard
//! output, or their LDM info lines.

use std::io::Write;
use std::path::PathBuf;

use ldm7_types::{FeedType, Timestamp};

use crate::common::{open_queue, parse_feed, parse_pattern, queue_path, since};
use crate::exit::{CmdResult, runtime};

/// Arguments of `ldm7 cat` / `pqcat`.
#[derive(clap::Args, Debug)]
pub struct CatArgs {
    /// Feedtype expression the products must match.
    #[arg(short = 'f', long = "feed", default_value = "ANY")]
    pub feed: String,
    /// Extended regular expression the product identifier must match.
    #[arg(short = 'p', long = "pattern", default_value = ".*")]
    pub pattern: String,
    /// Only products inserted in the last OFFSET seconds [default: all].
    #[arg(short = 'o', long = "offset", value_name = "SECONDS")]
    pub offset: Option<f64>,
    /// Only the last N matching products.
    #[arg(long, value_name = "N")]
    pub last: Option<usize>,
    /// Print each product's info line on standard error (the data still goes to standard output).
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// Info lines carry the signature.
    #[arg(short = 'x')]
    pub debug: bool,
    /// Print only the info lines, on standard output, and no data.
    #[arg(long)]
    pub info: bool,
    /// The queue [default: $LDM7_QUEUE or ./ldm7.pq].
    #[arg(short = 'q', long = "queue", value_name = "PATH")]
    pub queue: Option<PathBuf>,
    /// Accepted for LDM compatibility; logging goes to standard error.
    #[arg(short = 'l', value_name = "LOGFILE", hide = true)]
    pub log: Option<String>,
}

/// Runs `cat`.
pub fn run(args: &CatArgs) -> CmdResult {
    let feed = parse_feed(&args.feed)?;
    let pattern = parse_pattern(&args.pattern)?;
    let from = since(args.offset)?;
    let queue = open_queue(&queue_path(args.queue.as_deref()))?;
    let snapshot = queue.snapshot().map_err(runtime)?;
    let selects = |feedtype: FeedType, ident: &str| feed.intersects(feedtype) && pattern.is_match(ident);
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
    let mut emit = |info: &ldm7_types::ProdInfo, data: &[u8]| -> std::io::Result<()> {
        if args.info {
            writeln!(out, "{}", info.line(args.debug))
        } else {
            if args.verbose {
                eprintln!("{}", info.line(args.debug));
            }
            out.write_all(data)
        }
    };
    let broken_pipe = |error: &std::io::Error| error.kind() == std::io::ErrorKind::BrokenPipe;
    match args.last {
        None => {
            for product in snapshot.products_from(from).map_err(runtime)? {
                let product = product.map_err(runtime)?;
                if selects(product.info.feedtype, &product.info.ident) {
                    if let Err(error) = emit(&product.info, product.data) {
                        return if broken_pipe(&error) { Ok(()) } else { Err(runtime(error)) };
                    }
                }
            }
        }
        Some(count) => {
            let mut chosen = Vec::new();
            for product in snapshot.products_before_reversed(Timestamp::END).map_err(runtime)? {
                let product = product.map_err(runtime)?;
                if product.insertion < from || chosen.len() == count {
                    break;
                }
                if selects(product.info.feedtype, &product.info.ident) {
                    chosen.push(product);
                }
            }
            for product in chosen.iter().rev() {
                if let Err(error) = emit(&product.info, product.data) {
                    return if broken_pipe(&error) { Ok(()) } else { Err(runtime(error)) };
                }
            }
        }
    }
    match out.flush() {
        Err(error) if !broken_pipe(&error) => Err(runtime(error)),
        _ => Ok(()),
    }
}
