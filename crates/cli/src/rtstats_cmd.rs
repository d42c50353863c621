//! `ldm7 rtstats` (`rtstats`): LDM's per-feed statistics reports, from the queue's products to a
//! statistics host, with the reference's flags; the work is `ldm7_server::rtstats`'s.

use std::path::PathBuf;
use std::time::Duration;

use ldm7_server::rtstats::RtstatsOptions;

use crate::common::{duration_arg, now, open_queue, origin, parse_feed, parse_pattern, queue_path};
use crate::exit::{CmdResult, runtime};

/// Arguments of `ldm7 rtstats` / `rtstats`.
#[derive(clap::Args, Debug)]
#[command(disable_help_flag = true)]
pub struct RtstatsArgs {
    /// Print help (`-h` is the host, as in LDM).
    #[arg(long = "help", action = clap::ArgAction::Help)]
    pub help: Option<bool>,
    /// The statistics host.
    #[arg(short = 'h', long = "host", value_name = "HOST[:PORT]", default_value = "localhost")]
    pub host: ldm7_client::ServerAddress,
    /// Its port [default: the one in --host, else 388].
    #[arg(short = 'P', long = "port")]
    pub port: Option<u16>,
    /// The queue [default: $LDM7_QUEUE or ./ldm7.pq].
    #[arg(short = 'q', long = "queue", value_name = "PATH")]
    pub queue: Option<PathBuf>,
    /// Only products of this feedtype expression.
    #[arg(short = 'f', long = "feed", default_value = "ANY")]
    pub feed: String,
    /// Only products whose identifier matches this extended regular expression.
    #[arg(short = 'p', long = "pattern", default_value = ".*")]
    pub pattern: String,
    /// Count products inserted this long ago, e.g. 3600 (seconds) or 1h [default: from now; for
    /// one a server EXECs, from the server's start].
    #[arg(short = 'o', long = "offset", value_name = "DURATION", value_parser = duration_arg)]
    pub offset: Option<Duration>,
    /// Accepted for LDM's queue-polling interval; products are counted as they arrive.
    #[arg(short = 'i', value_name = "SECONDS")]
    pub poll: Option<u64>,
    /// This host's name in the reports [default: `[server] hostname` of $LDM7_SETTINGS, else the
    /// host's name].
    #[arg(short = 'H', long = "hostname", value_name = "NAME")]
    pub hostname: Option<String>,
    /// Time between reports (the reference's 60 s), before the random spread.
    #[arg(long = "report-interval", value_name = "DURATION", value_parser = duration_arg,
          default_value = "60")]
    pub report_interval: Duration,
    /// Largest random addition to each interval (the reference's 30 s).
    #[arg(long = "report-spread", value_name = "DURATION", value_parser = duration_arg,
          default_value = "30")]
    pub report_spread: Duration,
}

/// Runs the sender until the process is stopped.
pub fn run(args: &RtstatsArgs) -> CmdResult {
    let mut host = args.host.clone();
    if let Some(port) = args.port {
        host.port = port;
    }
    let site = crate::common::site_settings()?;
    let myname = args.hostname.clone().or_else(|| site.and_then(|site| site.server.hostname)).unwrap_or_else(origin);
    let options = RtstatsOptions {
        host,
        myname,
        feed: parse_feed(&args.feed)?,
        pattern: parse_pattern(&args.pattern)?,
        // Started by a server, it counts from the server's start: a product the server received
        // while this process was starting is in the reports.
        from: args
            .offset
            .map_or_else(|| crate::common::server_started().unwrap_or_else(now), |offset| now().saturating_sub(offset)),
        interval: args.report_interval.max(Duration::from_millis(100)),
        spread: args.report_spread,
        // An EXEC child of `ldm7 serve` (which sets LDM7_SERVER_PID) ends with the server.
        exit_with_parent: crate::common::server_pid(),
    };
    let queue = open_queue(&queue_path(args.queue.as_deref()))?;
    tracing::info!("rtstats: reporting as {} to {}", options.myname, options.host);
    ldm7_server::rtstats::run(&queue, &options).map_err(runtime)
}
