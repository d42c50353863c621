//! `ldm7 fmtp send | recv`: the FMTP transport alone, for tests, benchmarks and operators
//! (issue #3). The flags parse into the typed options of [`ldm7_fmtp::app`], which does the
//! work; this module only defines the flags and prints: the start line and the summary on
//! standard output, progress (waiting for receivers or for the sender, connections) as NOTE
//! log lines on standard error.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ldm7_config::keys;
use ldm7_fmtp::app::{
    self, AppError, DropProbability, ProductSource, RecvOptions, RecvProgress, SendOptions, SendProgress, Speedup,
};
use ldm7_fmtp::{MacLevel, MacSigning, ParityChoice};
use ldm7_types::Rate;
use ldm7_types::units::parse_duration;

use crate::exit::{CmdResult, bad_input, runtime};

/// `ldm7 fmtp …`
#[derive(clap::Subcommand, Debug)]
pub enum FmtpCommand {
    /// Multicast products and serve retransmissions.
    Send(SendArgs),
    /// Receive products from a multicast group, repairing losses over TCP.
    Recv(RecvArgs),
    /// Make a publisher identity: an Ed25519 key pair that signs the key exchange (FILE, mode
    /// 0600) and its public key for subscribers to pin (FILE.pub).
    Keygen(KeygenArgs),
}

/// Arguments of `fmtp keygen`.
#[derive(clap::Args, Debug)]
pub struct KeygenArgs {
    /// The private key file to create (never overwritten); the public key goes to FILE.pub.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
}

/// Arguments of `fmtp send`.
#[derive(clap::Args, Debug)]
pub struct SendArgs {
    /// Multicast group and port.
    #[arg(long, value_name = "ADDR:PORT")]
    pub group: SocketAddr,
    /// Address of the interface to send from.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1")]
    pub iface: IpAddr,
    /// Sending rate: bits/s with k, M, G (10^3, 10^6, 10^9), e.g. 100M or "40 Mbit/s".
    #[arg(long, default_value = "100M", allow_hyphen_values = true)]
    pub rate: Rate,
    /// Where the retransmission server listens [default: the interface, any port].
    #[arg(long, value_name = "ADDR:PORT")]
    pub retx_listen: Option<SocketAddr>,
    /// Multicast TTL.
    #[arg(long, default_value_t = 1, allow_hyphen_values = true)]
    pub ttl: u32,
    /// Wait for this many receivers before sending (LDM sends nothing with no receiver).
    #[arg(long, default_value_t = 1, allow_hyphen_values = true)]
    pub receivers: usize,
    /// Retransmission deadline per product: seconds, or with a unit (500ms, 5min).
    #[arg(long, value_name = "DURATION", default_value = "300", value_parser = parse_duration, allow_hyphen_values = true)]
    pub retx_timeout: Duration,
    /// After sending, wait at most this long for every product to be released.
    #[arg(long, value_name = "DURATION", default_value = "60", value_parser = parse_duration, allow_hyphen_values = true)]
    pub linger: Duration,
    /// Replay synthetic products following this trace instead of files.
    #[arg(long, value_name = "TRACE", conflicts_with = "files")]
    pub replay: Option<PathBuf>,
    /// With --replay: at most this many products.
    #[arg(long, allow_hyphen_values = true)]
    pub limit: Option<usize>,
    /// With --replay: pace by the trace's times divided by SPEED (0 = as fast as the rate allows).
    #[arg(long, default_value = "0", allow_hyphen_values = true)]
    pub speed: Speedup,
    /// MAC of each multicast datagram: 0 none, 1 HMAC-SHA-256, 2 Ed25519 (every receiver must use
    /// the same level).
    #[arg(long, env = "FMTP_MAC_LEVEL", default_value = "0", value_name = "LEVEL")]
    pub mac_level: MacLevel,
    /// Sign each key exchange with this publisher identity (`fmtp keygen`), for receivers that
    /// pin its public key (an ldm7 extension: reference receivers cannot read signed answers).
    #[arg(long, value_name = "FILE")]
    pub identity: Option<PathBuf>,
    /// Make a new MAC key this often and hand it to every receiver over its repair connection
    /// (an ldm7 extension: every receiver must be ldm7; at least 1s).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub mac_rotation: Option<Duration>,
    /// At MAC level 2: `lists` signs a list of the digests of up to 32 datagrams at a time (an
    /// ldm7 extension: every receiver must be ldm7; a thirty-second of the signing and
    /// checking), `datagram` signs each datagram, as the reference does and requires.
    #[arg(long, value_name = "lists|datagram", default_value = "lists")]
    pub mac_signing: MacSigning,
    /// Repair by parity (an ldm7 extension, docs/parity.md): answer receivers' parity requests
    /// with parity shards multicast once for all of them, to the group's next port. `auto`:
    /// what an LDM-7 publisher with default settings chooses (992/32); GROUP/SHARDS: GROUP data
    /// blocks per group and up to SHARDS shards each; `off`: unicast repairs only. Receivers
    /// need the same value.
    #[arg(long, value_name = "auto|off|GROUP/SHARDS", default_value = "auto")]
    pub parity: ParityChoice,
    /// Files to send, one product each, read in turn as they are sent (a pipe is held in memory
    /// until its product is released).
    pub files: Vec<PathBuf>,
}

/// Arguments of `fmtp recv`.
#[derive(clap::Args, Debug)]
pub struct RecvArgs {
    /// Multicast group and port.
    #[arg(long, value_name = "ADDR:PORT")]
    pub group: SocketAddr,
    /// Address of the interface to join on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1")]
    pub iface: IpAddr,
    /// The sender's retransmission server.
    #[arg(long, value_name = "ADDR:PORT")]
    pub sender: SocketAddr,
    /// Join source-specifically on this sender address.
    #[arg(long, value_name = "ADDR")]
    pub source: Option<IpAddr>,
    /// Directory for received products (named by MD5, spooled there as they arrive); omitted:
    /// products are only checked.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Drop this fraction of multicast datagrams on receipt (tests and demos), 0 to below 1.
    #[arg(long, default_value = "0", allow_hyphen_values = true)]
    pub drop: DropProbability,
    /// Seed of the drop filter.
    #[arg(long, default_value_t = 1, allow_hyphen_values = true)]
    pub seed: u64,
    /// Exit after this many products were delivered or missed.
    #[arg(long, allow_hyphen_values = true)]
    pub count: Option<u64>,
    /// Exit after this long without a product: seconds, or with a unit. A sender that does not
    /// listen yet is waited for this long (retrying), then the command fails.
    #[arg(long, value_name = "DURATION", default_value = "120", value_parser = parse_duration, allow_hyphen_values = true)]
    pub timeout: Duration,
    /// Keep trying to connect to the sender this long instead: seconds, or with a unit
    /// [default: --timeout].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, allow_hyphen_values = true)]
    pub connect_timeout: Option<Duration>,
    /// Expected rate, e.g. 100M (sizes the socket buffer).
    #[arg(long, default_value = "100M", allow_hyphen_values = true)]
    pub rate: Rate,
    /// MAC of each multicast datagram: the sender's level (0 none, 1 HMAC-SHA-256, 2 Ed25519).
    #[arg(long, env = "FMTP_MAC_LEVEL", default_value = "0", value_name = "LEVEL")]
    pub mac_level: MacLevel,
    /// Accept only a key exchange signed by this publisher public key (the `.pub` file of
    /// `fmtp keygen`): a man in the middle of the repair connection is refused.
    #[arg(long, value_name = "FILE")]
    pub pin: Option<PathBuf>,
    /// Ask for lost blocks as parity (an ldm7 extension): the sender's --parity value.
    #[arg(long, value_name = "auto|off|GROUP/SHARDS", default_value = "auto")]
    pub parity: ParityChoice,
}

/// Runs an `fmtp` subcommand.
pub fn run(command: &FmtpCommand) -> CmdResult {
    let runtime_handle =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(runtime)?;
    match command {
        FmtpCommand::Send(args) => runtime_handle.block_on(send(args)),
        FmtpCommand::Recv(args) => runtime_handle.block_on(recv(args)),
        FmtpCommand::Keygen(args) => keygen(args),
    }
}

fn keygen(args: &KeygenArgs) -> CmdResult {
    let public = keys::generate_identity(&args.out).map_err(bad_input)?;
    println!(
        "fmtp keygen: publisher identity {} (keep it private: `fmtp send --identity`); public key {} \
         (give it to subscribers: `fmtp recv --pin`)",
        args.out.display(),
        public.display()
    );
    Ok(())
}

async fn send(args: &SendArgs) -> CmdResult {
    let identity = match &args.identity {
        Some(path) => Some(Arc::new(keys::read_identity(path).map_err(bad_input)?)),
        None => None,
    };
    let source = match &args.replay {
        Some(trace) => ProductSource::Replay { trace: trace.clone(), limit: args.limit, speed: args.speed },
        None => ProductSource::Files(args.files.clone()),
    };
    let options = SendOptions {
        group: args.group,
        interface: args.iface,
        rate: args.rate,
        retx_listen: args.retx_listen,
        ttl: args.ttl,
        receivers: args.receivers,
        retx_timeout: args.retx_timeout,
        linger: args.linger,
        source,
        mac_level: args.mac_level,
        identity,
        mac_rotation: args.mac_rotation,
        mac_signing: args.mac_signing,
        parity: args.parity.resolve_default(),
    };
    let summary = app::send(&options, |progress| match progress {
        SendProgress::Started { source, retx } => {
            println!("fmtp send: group {} from {source}, retransmission server {retx}", args.group);
        }
        SendProgress::Waiting { wanted, retx } => {
            let plural = if wanted == 1 { "" } else { "s" };
            tracing::info!("fmtp send: waiting for {wanted} receiver{plural} at {retx} (nothing is sent before)");
        }
        SendProgress::ReceiverJoined { peer, joined, wanted } if joined <= wanted => {
            tracing::info!("fmtp send: {joined} of {wanted} receivers connected ({peer})");
        }
        SendProgress::ReceiverJoined { peer, joined, .. } => {
            tracing::info!("fmtp send: receiver {peer} connected ({joined} in all)");
        }
        SendProgress::Refused(reason) => eprintln!("fmtp send: product refused: {reason}"),
    })
    .await
    .map_err(failure)?;
    let peak_memory =
        ldm7_io::peak_resident_bytes(None).map_or(String::new(), |bytes| format!("; peak memory {} MiB", bytes >> 20));
    println!(
        "fmtp send: {} products, {} bytes; multicast {} in {:.3} s ({:.1} Mbit/s goodput); released {}, refused {}; retransmitted blocks {}, rejections {}{peak_memory}",
        summary.products,
        summary.bytes,
        summary.sent,
        summary.elapsed.as_secs_f64(),
        summary.goodput_bits_per_s() / 1e6,
        summary.released,
        summary.refused,
        summary.protocol.retx_data_blocks,
        summary.protocol.rejects
    );
    if args.parity != ParityChoice::Off {
        let protocol = &summary.protocol;
        println!(
            "fmtp send: parity: {} requests, {} shards multicast ({} bytes, {:.2}% of the product bytes), {} groups \
             and {} runs coded",
            protocol.parity_requests,
            protocol.parity_datagrams,
            protocol.parity_bytes,
            protocol.parity_bytes as f64 * 100.0 / summary.bytes.max(1) as f64,
            protocol.parity_groups_coded,
            protocol.parity_runs_coded
        );
    }
    Ok(())
}

async fn recv(args: &RecvArgs) -> CmdResult {
    let pin = match &args.pin {
        Some(path) => Some(keys::read_pin(path).map_err(bad_input)?),
        None => None,
    };
    let options = RecvOptions {
        group: args.group,
        interface: args.iface,
        sender: args.sender,
        source: args.source,
        out: args.out.clone(),
        drop: args.drop,
        seed: args.seed,
        count: args.count,
        idle_timeout: args.timeout,
        rate: args.rate,
        connect_deadline: args.connect_timeout.unwrap_or(args.timeout),
        mac_level: args.mac_level,
        pin,
        parity: args.parity.resolve_default(),
    };
    let summary = app::recv(&options, |progress| match progress {
        RecvProgress::Waiting { sender, deadline, last_error } => tracing::info!(
            "fmtp recv: waiting for the sender at {sender} ({last_error}); retrying for up to {:.1} s",
            deadline.as_secs_f64()
        ),
        RecvProgress::Connected(sender) => tracing::info!("fmtp recv: connected to {sender}"),
        RecvProgress::Missed { index, reason } => eprintln!("fmtp recv: missed product {index:?} ({reason:?})"),
        RecvProgress::IndexGap { first, last } => {
            eprintln!("fmtp recv: missed products {first:?}..={last:?} (skipped by the product index, not requested)")
        }
    })
    .await
    .map_err(failure)?;
    println!(
        "fmtp recv: delivered {}, missed {}, retransmitted blocks {}, corrupt {}, datagrams {}",
        summary.delivered,
        summary.missed,
        summary.retransmitted_blocks,
        summary.corrupt,
        summary.report.protocol.datagrams
    );
    let protocol = &summary.report.protocol;
    if args.parity != ParityChoice::Off {
        println!(
            "fmtp recv: parity: {} requests ({} on a lost shard seen), {} shards taken, {} blocks recovered, {} groups asked for with RETX_REQ",
            protocol.parity_requests,
            protocol.parity_gap_requests,
            protocol.parity_shards,
            protocol.parity_blocks,
            protocol.parity_fallbacks
        );
    }
    let dropped = [
        ("truncated", protocol.truncated),
        ("oversized", protocol.oversized),
        ("unknown type", protocol.unknown_type),
        ("other malformed", protocol.malformed - protocol.truncated - protocol.oversized - protocol.unknown_type),
        ("unexpected type", protocol.unexpected),
        ("index not believed", protocol.index_unbelieved),
        ("stale or replayed", protocol.stale),
        ("bad MAC", summary.report.driver.bad_mac),
        ("named by no signed list", summary.report.driver.unlisted),
        ("past the product's end", protocol.out_of_range),
        ("parity coded otherwise", protocol.parity_mismatched),
    ];
    if dropped.iter().any(|(_, count)| *count > 0) || protocol.index_forged > 0 {
        let list: Vec<String> =
            dropped.iter().filter(|(_, count)| *count > 0).map(|(reason, count)| format!("{reason} {count}")).collect();
        println!(
            "fmtp recv: dropped datagrams: {}; indexes the sender refuted {}",
            if list.is_empty() { "none".to_owned() } else { list.join(", ") },
            protocol.index_forged
        );
    }
    if summary.corrupt > 0 {
        return Err(runtime(AppError::Corrupt(summary.corrupt)));
    }
    if summary.missed > 0 {
        return Err(runtime(AppError::Missed(summary.missed)));
    }
    let got = summary.delivered + summary.missed;
    if let Some(count) = args.count.filter(|count| got < *count) {
        return Err(runtime(AppError::Short { got, count, idle: args.timeout }));
    }
    Ok(())
}

/// Input errors exit 1, the others 2.
fn failure(error: AppError) -> crate::exit::Failure {
    if error.is_input() { bad_input(error) } else { runtime(error) }
}
