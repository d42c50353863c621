//! `ldm7 serve`: the LDM server (ldmd) — ALLOW/ACCEPT/REQUEST/EXEC/INCLUDE from ldmd.conf,
//! upstream sessions from the queue, downstream REQUESTs into it, and the LDM-7 multicast
//! service (MULTICAST feeds to subscribers, RECEIVE subscriptions; settings in `ldm7.toml`).
//! `--check` validates the configuration and the settings and exits. SIGTERM/SIGINT drain and
//! exit; SIGHUP reloads the configuration (and reopens the log file, `crate::logging`).

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use ldm7_server::config::Config;
use ldm7_server::settings::Settings;
use ldm7_server::{Server, ServerOptions};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::common::{duration_arg, queue_path};
use crate::exit::{CmdResult, input, runtime};

/// The shortest `--retry-max` (a reconnection loop must not spin).
const RETRY_MAX_LOWEST: Duration = Duration::from_millis(10);

/// Arguments of `ldm7 serve`.
#[derive(clap::Args, Clone, Debug)]
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
    /// Address to listen on: `::` (the default) takes IPv6 and IPv4 connections, `0.0.0.0` IPv4
    /// only, an address only connections to it; give -I again for more addresses (same port).
    #[arg(short = 'I', long = "listen", value_name = "ADDR", default_value = "::", action = clap::ArgAction::Append)]
    pub listen: Vec<IpAddr>,
    /// Directory for REQUEST resume points (`.<md5>.info` files).
    #[arg(long = "state-dir", value_name = "DIR", default_value = ".")]
    pub state_dir: PathBuf,
    /// How far back a fresh REQUEST asks, e.g. 3600 (seconds) or 1h.
    #[arg(short = 'o', long = "time-offset", value_name = "DURATION", default_value = "3600", value_parser = duration_arg)]
    pub time_offset: Duration,
    /// Products older than this are ignored by downstreams, e.g. 3600 (seconds) or 1h.
    #[arg(short = 'm', long = "max-latency", value_name = "DURATION", default_value = "3600", value_parser = duration_arg)]
    pub max_latency: Duration,
    /// Longest delay between reconnection attempts, e.g. 60 (seconds); doubles from 1 s.
    #[arg(long = "retry-max", value_name = "DURATION", default_value = "60", value_parser = retry_max_arg)]
    pub retry_max: Duration,
    /// Most connections served at once; more are refused (LDM's /server/max-clients).
    #[arg(long = "max-clients", short = 'M', default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_clients: u32,
    /// The settings file (multicast rate and deadline, path service, subscribers; see
    /// docs/ldm7.md) [default: ldm7.toml next to the configuration file, if there is one].
    #[arg(long = "settings", value_name = "LDM7_TOML")]
    pub settings: Option<PathBuf>,
    /// Check the configuration and the settings, print what they define, and exit (ldmd -n).
    #[arg(long = "check", short = 'n')]
    pub check: bool,
    /// Accepted for ldmd's -t (its LDM-5 RPC timeout): ldm7 speaks LDM-6 and LDM-7.
    #[arg(short = 't', value_name = "SECONDS", hide_short_help = true)]
    pub rpc_timeout: Option<u64>,
    /// The configuration file, as ldmd's positional argument (instead of -c).
    #[arg(value_name = "CONF_FILE", conflicts_with = "config")]
    pub config_file: Option<PathBuf>,
    /// This server's name in its per-minute statistics products [default: the host name, with
    /// :PORT when the port is not 388].
    #[arg(long = "stats-name", value_name = "NAME")]
    pub stats_name: Option<String>,
    /// Serve Prometheus metrics at http://ADDR/metrics, e.g. 127.0.0.1:9388.
    #[arg(long = "metrics", value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
    /// Run as this user once the port is bound (start as root to bind 388); the EXEC children
    /// run as it too.
    #[arg(long = "user", value_name = "USER")]
    pub user: Option<String>,
}

/// Runs the server until SIGTERM or SIGINT.
pub fn run(args: &ServeArgs, log: &crate::logging::LogArgs) -> CmdResult {
    // ldmd's positional configuration file stands for -c.
    let args = &ServeArgs { config: args.config_file.clone().unwrap_or_else(|| args.config.clone()), ..args.clone() };
    let settings = load_settings(args)?;
    if args.check {
        return check(args, &settings);
    }
    let mut options = ServerOptions::new(
        args.config.clone(),
        queue_path(args.queue.as_deref()),
        SocketAddr::new(args.listen.first().copied().unwrap_or(IpAddr::V6(Ipv6Addr::UNSPECIFIED)), args.port),
    );
    options.state_dir = args.state_dir.clone();
    options.also_listen = args.listen.iter().skip(1).copied().collect();
    options.time_offset = args.time_offset;
    options.max_latency = args.max_latency;
    options.retry_max = args.retry_max;
    options.retry_min = options.retry_min.min(options.retry_max);
    options.max_clients = args.max_clients as usize;
    options.settings = std::sync::Arc::new(settings);
    options.stats_name = args.stats_name.clone();
    options.metrics_listen = args.metrics;
    options.run_as = args.user.clone();
    options.log_file = log.to_file().then(|| log.log_file.clone()).flatten().map(|file| {
        // The children may run elsewhere: an absolute path.
        std::path::absolute(&file).unwrap_or(file)
    });
    let mut signals = Signals::new([SIGTERM, SIGINT, SIGHUP]).map_err(runtime)?;
    let server = Server::start(options).map_err(|error| match error {
        ldm7_server::ServerError::Config(_) | ldm7_server::ServerError::Queue { .. } => input(error),
        other => runtime(other),
    })?;
    // Under systemd (Type=notify): ready once listening, and the watchdog fed while the server
    // accepts connections. Elsewhere these do nothing.
    let _ = sd_notify::notify(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(&format!("listening on {}", server.local_addr())),
    ]);
    if let Some(period) = sd_notify::watchdog_enabled() {
        let health = server.health();
        std::thread::Builder::new()
            .name("watchdog".into())
            .spawn(move || {
                while health.is_alive() {
                    let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
                    std::thread::sleep(period / 2);
                }
            })
            .map_err(runtime)?;
    }
    for signal in signals.forever() {
        match signal {
            SIGHUP => {
                if let Err(error) = server.reload() {
                    tracing::error!("reload failed, keeping the previous configuration: {error}");
                }
            }
            _ => break,
        }
    }
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    server.stop();
    Ok(())
}

/// The settings: `--settings FILE`, else `ldm7.toml` beside the configuration file, else the
/// defaults.
fn load_settings(args: &ServeArgs) -> CmdResult<Settings> {
    let path = match &args.settings {
        Some(path) => Some(path.clone()),
        None => {
            let beside = args.config.parent().unwrap_or(std::path::Path::new(".")).join("ldm7.toml");
            beside.is_file().then_some(beside)
        }
    };
    match path {
        Some(path) => Settings::load(&path).map_err(input),
        None => Ok(Settings::default()),
    }
}

/// `--check`: parses everything, prints a summary, exits 0 (or 1 with the first error).
fn check(args: &ServeArgs, settings: &Settings) -> CmdResult {
    let config = Config::load(&args.config).map_err(input)?;
    println!("{}: OK", args.config.display());
    match &settings.source {
        Some(path) => println!("{}: OK", path.display()),
        None => println!("settings: defaults (no ldm7.toml)"),
    }
    println!(
        "ALLOW {}, ACCEPT {}, REQUEST {}, EXEC {}, MULTICAST {}, RECEIVE {}",
        config.allows.len(),
        config.accepts.len(),
        config.requests.len(),
        config.execs.len(),
        config.multicasts.len(),
        config.receives.len()
    );
    for entry in &config.multicasts {
        let feed = settings.multicast(entry.feedtype);
        let port = entry.group_port.unwrap_or(args.port);
        let subnet = if entry.subnet_len > 0 {
            format!("addresses from {}/{}", entry.fmtp_server, entry.subnet_len)
        } else {
            "subscribers keep their own address".to_owned()
        };
        println!(
            "MULTICAST {} to {}:{port} at {}, deadline {:?}, FMTP server {}:{}, {subnet}",
            entry.feedtype, entry.group, feed.rate, feed.deadline, entry.fmtp_server, entry.fmtp_port
        );
        if let Some(control) = &feed.rate_control {
            let steps: Vec<String> = control.steps.iter().map(ToString::to_string).collect();
            println!(
                "  rate control: steps {}, interval {:?}, W {:?}, alpha {}, beta {}, epsilon {:?}, lower after {}",
                steps.join(" → "),
                control.interval,
                control.wait,
                control.alpha,
                control.beta,
                control.epsilon,
                control.lower_after
            );
        }
    }
    for entry in &config.receives {
        let feed = settings.receive(entry.feedtype);
        println!(
            "RECEIVE {} from {}:{} (backlog {} s when new, retry {}–{} s{})",
            entry.feedtype,
            entry.host,
            entry.port.unwrap_or(args.port),
            feed.time_offset.as_secs(),
            feed.retry_min.as_secs_f64(),
            feed.retry_max.as_secs_f64(),
            entry.interface.as_deref().map(|name| format!(", interface {name}")).unwrap_or_default()
        );
    }
    Ok(())
}

/// `--retry-max`: a duration of at least [`RETRY_MAX_LOWEST`].
fn retry_max_arg(text: &str) -> Result<Duration, String> {
    match duration_arg(text) {
        Ok(duration) if duration >= RETRY_MAX_LOWEST => Ok(duration),
        Ok(_) => Err(format!("{text:?} is too short: give at least 10ms (the delay doubles from 1 s up to it)")),
        Err(error) => Err(error.to_string()),
    }
}
