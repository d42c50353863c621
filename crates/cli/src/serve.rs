//! `ldm7 serve`: the LDM server (ldmd) — ALLOW/ACCEPT/REQUEST/EXEC/INCLUDE from ldmd.conf,
//! upstream sessions from the queue, downstream REQUESTs into it. SIGTERM/SIGINT drain and
//! exit; SIGHUP reloads the configuration.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use ldm7_server::log::{self, Level};
use ldm7_server::{Server, ServerOptions};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::common::queue_path;
use crate::exit::{CmdResult, bad_input, input, runtime};

/// Arguments of `ldm7 serve`.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// The configuration file (ldmd.conf syntax).
    #[arg(long = "config", short = 'c', value_name = "LDMD_CONF", default_value = "ldmd.conf")]
    pub config: PathBuf,
    /// The product queue [default: $LDM7_QUEUE or ./ldm7.pq].
    #[arg(short = 'q', long = "queue", value_name = "PATH")]
    pub queue: Option<PathBuf>,
    /// TCP port (LDM's 388 needs root; any high port works without).
    #[arg(short = 'P', long = "port", default_value_t = 388)]
    pub port: u16,
    /// Address to listen on.
    #[arg(short = 'I', long = "listen", value_name = "ADDR", default_value_t = IpAddr::V4(Ipv4Addr::UNSPECIFIED))]
    pub listen: IpAddr,
    /// Directory for REQUEST resume points (`.<md5>.info` files).
    #[arg(long = "state-dir", value_name = "DIR", default_value = ".")]
    pub state_dir: PathBuf,
    /// How far back a fresh REQUEST asks, seconds.
    #[arg(short = 'o', long = "time-offset", value_name = "SECONDS", default_value_t = 3600)]
    pub time_offset: u64,
    /// Products older than this are ignored by downstreams, seconds.
    #[arg(short = 'm', long = "max-latency", value_name = "SECONDS", default_value_t = 3600)]
    pub max_latency: u64,
    /// Longest delay between reconnection attempts, seconds (doubles from 1 s).
    #[arg(long = "retry-max", value_name = "SECONDS", default_value_t = 60.0)]
    pub retry_max: f64,
    /// Most connections served at once; more are refused (LDM's /server/max-clients).
    #[arg(long = "max-clients", default_value_t = 256)]
    pub max_clients: usize,
    /// One log line per product (INFO).
    #[arg(short = 'v', long = "verbose")]
    pub verbose: bool,
    /// Debug logging.
    #[arg(short = 'x', long = "debug")]
    pub debug: bool,
}

/// Runs the server until SIGTERM or SIGINT.
pub fn run(args: &ServeArgs) -> CmdResult {
    if !(args.retry_max.is_finite() && args.retry_max >= 0.01) {
        return Err(bad_input(format!("invalid --retry-max {}: give seconds ≥ 0.01", args.retry_max)));
    }
    log::set_level(if args.debug {
        Level::Debug
    } else if args.verbose {
        Level::Info
    } else {
        Level::Notice
    });
    let mut options = ServerOptions::new(
        args.config.clone(),
        queue_path(args.queue.as_deref()),
        SocketAddr::new(args.listen, args.port),
    );
    options.state_dir = args.state_dir.clone();
    options.time_offset = Duration::from_secs(args.time_offset);
    options.max_latency = Duration::from_secs(args.max_latency);
    options.retry_max = Duration::from_secs_f64(args.retry_max);
    options.retry_min = options.retry_min.min(options.retry_max);
    options.max_clients = args.max_clients.max(1);
    let mut signals = Signals::new([SIGTERM, SIGINT, SIGHUP]).map_err(runtime)?;
    let server = Server::start(options).map_err(|error| match error {
        ldm7_server::ServerError::Config(_) | ldm7_server::ServerError::Queue { .. } => input(error),
        other => runtime(other),
    })?;
    for signal in signals.forever() {
        match signal {
            SIGHUP => {
                if let Err(error) = server.reload() {
                    log::error(format_args!("reload failed, keeping the previous configuration: {error}"));
                }
            }
            _ => break,
        }
    }
    server.stop();
    Ok(())
}
