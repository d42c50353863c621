//! `ldm7 cat` (pqcat): products already in the queue, oldest first — their data to standard
//! output, or their LDM info lines.

use std::io::Write;
use std::path::PathBuf;

use std::time::Duration;

use ldm7_io::log_target::PRODUCT;
use ldm7_types::{FeedType, Timestamp};

use crate::common::{duration_arg, open_queue, parse_feed, parse_pattern, queue_path, since};
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
    /// Only products inserted this recently, e.g. 3600 (seconds) or 1h [default: all].
    #[arg(short = 'o', long = "offset", value_name = "DURATION", value_parser = duration_arg)]
    pub offset: Option<Duration>,
    /// Only the last N matching products.
    #[arg(long, value_name = "N")]
    pub last: Option<usize>,
    /// Print only the info lines, on standard output, and no data.
    #[arg(long)]
    pub info: bool,
    /// The queue [default: $LDM7_QUEUE or ./ldm7.pq].
    #[arg(short = 'q', long = "queue", value_name = "PATH")]
    pub queue: Option<PathBuf>,
    /// Check each product's data against its signature (MD5); each mismatch is an ERROR line,
    /// and any makes the exit status 1 (LDM's pqcat -c).
    #[arg(short = 'c', long = "check-signatures")]
    pub check_signatures: bool,
    /// Also check the queue itself once the products are written (as `ldm7 queue check`;
    /// LDM's pqcat -s).
    #[arg(short = 's', long = "sanity")]
    pub sanity: bool,
}

/// Runs `cat`. With `-v` each product's info line is logged (INFO; the data still goes to
/// standard output); lines carry the signature when `with_signature` (`-x`).
pub fn run(args: &CatArgs, with_signature: bool) -> CmdResult {
    let feed = parse_feed(&args.feed)?;
    let pattern = parse_pattern(&args.pattern)?;
    let from = since(args.offset);
    let queue = open_queue(&queue_path(args.queue.as_deref()))?;
    let snapshot = queue.snapshot().map_err(runtime)?;
    let selects = |feedtype: FeedType, ident: &str| feed.intersects(feedtype) && pattern.is_match(ident);
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
    let mut mismatches = 0u64;
    let mut emit = |info: &ldm7_types::ProdInfo, data: &[u8]| -> std::io::Result<()> {
        if args.check_signatures && ldm7_types::Signature::md5_of(data) != info.signature {
            mismatches += 1;
            tracing::error!("cat: the data of {} do not match its signature", info.line(true));
        }
        if args.info {
            writeln!(out, "{}", info.line(with_signature))
        } else {
            tracing::info!(target: PRODUCT, "{}", info.line(with_signature));
            out.write_all(data)
        }
    };
    let broken_pipe = |error: &std::io::Error| error.kind() == std::io::ErrorKind::BrokenPipe;
    match args.last {
        None => {
            for product in snapshot.products_from(from).map_err(runtime)? {
                let product = product.map_err(runtime)?;
                if selects(product.info.feedtype, &product.info.ident)
                    && let Err(error) = emit(&product.info, product.data)
                {
                    return if broken_pipe(&error) { Ok(()) } else { Err(runtime(error)) };
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
    if let Err(error) = out.flush()
        && !broken_pipe(&error)
    {
        return Err(runtime(error));
    }
    if args.sanity {
        let report = queue.check().map_err(runtime)?;
        for problem in &report.problems {
            tracing::error!("cat: the queue: {problem}");
        }
        if !report.is_ok() {
            return Err(runtime(anyhow::anyhow!(
                "the queue has {} problem(s): see `ldm7 queue check`",
                report.problems.len()
            )));
        }
        tracing::info!("cat: the queue is sound ({} products)", report.product_count);
    }
    if mismatches > 0 {
        return Err(crate::exit::bad_input(format!("{mismatches} product(s) whose data do not match their signature")));
    }
    Ok(())
}
