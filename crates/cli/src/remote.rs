//! `ldm7 notify` (remote notifyme) and `ldm7 send` (ldmsend): the flags and the printing; the
//! sessions themselves are [`ldm7_client`].

use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::time::Duration;

use ldm7_client::{self as client, ClientError, NotifyOptions, NotifyProgress, PushOptions, PushProduct, PushProgress};
use ldm7_types::{ProdClass, ProdInfo, Signature, Timestamp};

use crate::common::{LineOptions, now, origin, parse_feed, positive_duration_arg};
use crate::exit::{CmdResult, Failure, bad_input, input, runtime};

/// Arguments of `ldm7 notify` / `notifyme`.
#[derive(clap::Args, Debug)]
#[command(disable_help_flag = true)]
pub struct NotifyArgs {
    /// Print help (`-h` is the host, as in LDM).
    #[arg(long = "help", action = clap::ArgAction::Help)]
    pub help: Option<bool>,
    /// The upstream LDM server.
    #[arg(short = 'h', long = "host", value_name = "HOST[:PORT]", default_value = "localhost")]
    pub host: client::ServerAddress,
    #[command(flatten)]
    pub lines: LineOptions,
    /// Exit (status 0) after this long without a message, e.g. 300 (seconds) or 5min.
    #[arg(short = 'T', long = "timeout", value_name = "DURATION", default_value = "300", value_parser = positive_duration_arg)]
    pub timeout: Duration,
    /// The upstream's port (notifyme -P) [default: the one in --host, else 388].
    #[arg(short = 'P', long = "port")]
    pub port: Option<u16>,
    /// How long to wait for the connection (notifyme -t, its RPC timeout), e.g. 25 (seconds).
    #[arg(short = 't', long = "rpc-timeout", value_name = "DURATION", value_parser = positive_duration_arg)]
    pub rpc_timeout: Option<Duration>,
}

/// Runs `notify`: one line per NOTIFICATION on standard output, as notifyme prints it (with
/// the signature when `with_signature`, `-x`). The `-T` timeout ends it normally (exit 0), as
/// `watch -T` does: the operator asked for it.
pub fn notify(args: &NotifyArgs, with_signature: bool) -> CmdResult {
    let (feedtype, pattern, from) = args.lines.selection()?;
    let class = ProdClass { from, to: Timestamp::END, specs: vec![ldm7_types::ProdSpec { feedtype, pattern }] };
    let mut server = args.host.clone();
    if let Some(port) = args.port {
        server.port = port;
    }
    let mut options = NotifyOptions::new(server, class);
    options.silence = args.timeout;
    if let Some(timeout) = args.rpc_timeout {
        options.connect_timeout = timeout;
    }
    let stdout = std::io::stdout();
    let mut seen = 0u64;
    let host = &args.host;
    let result = client::notify(&options, |progress| {
        match progress {
            NotifyProgress::Accepted(class) => tracing::info!("notify: {host}: NOTIFYME {class} accepted"),
            NotifyProgress::Reclassified(class) => tracing::info!("notify: {host}: reclassified to {class}"),
            NotifyProgress::Notification(info) => {
                let line = args.lines.line(&info, with_signature);
                let mut lock = stdout.lock();
                if writeln!(lock, "{line}").and_then(|()| lock.flush()).is_err() {
                    return ControlFlow::Break(()); // stdout closed (e.g. piped into head)
                }
                seen += 1;
                if args.lines.count.is_some_and(|count| seen >= count) {
                    return ControlFlow::Break(());
                }
            }
        }
        ControlFlow::Continue(())
    });
    match result {
        Err(error) if error.is_silence() => {
            tracing::info!("notify: {host}: nothing for {:?} (-T): exiting", args.timeout);
            Ok(())
        }
        other => other.map_err(client_failure),
    }
}

/// Arguments of `ldm7 send` (ldmsend).
#[derive(clap::Args, Debug)]
#[command(disable_help_flag = true)]
pub struct SendArgs {
    /// Print help (`-h` is the host, as in LDM).
    #[arg(long = "help", action = clap::ArgAction::Help)]
    pub help: Option<bool>,
    /// The receiving LDM server.
    #[arg(short = 'h', long = "host", value_name = "HOST[:PORT]", default_value = "localhost")]
    pub host: client::ServerAddress,
    /// Feedtype of the products.
    #[arg(short = 'f', long = "feed", default_value = "EXP")]
    pub feed: String,
    /// Sequence number of the first product.
    #[arg(short = 's', long = "seqno", default_value_t = 0)]
    pub seqno: u32,
    /// The files; each one's path is its product identifier.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
}

/// Runs `send`: HIYA, then every file, then a NULLPROC flush.
pub fn send(args: &SendArgs) -> CmdResult {
    let feed = parse_feed(&args.feed)?;
    // Read and check everything before connecting: nothing half-sent because of a bad file.
    let origin = origin();
    let mut products = Vec::new();
    for (k, path) in args.files.iter().enumerate() {
        let data =
            std::fs::read(path).map_err(|error| input(anyhow::anyhow!("cannot read {}: {error}", path.display())))?;
        let size = u32::try_from(data.len())
            .map_err(|_| bad_input(format!("{} is larger than LDM's 4 GiB product limit", path.display())))?;
        let info = ProdInfo {
            arrival: now(),
            signature: Signature::md5_of(&data),
            origin: origin.clone(),
            feedtype: feed,
            seqno: args.seqno.wrapping_add(k as u32),
            ident: path.display().to_string(),
            size,
        };
        info.validate().map_err(|error| bad_input(format!("{}: {error}", path.display())))?;
        products.push(PushProduct { info, data });
    }
    let class = ProdClass {
        from: now(),
        to: Timestamp::END,
        specs: vec![ldm7_types::ProdSpec::new(feed, ".*").map_err(input)?],
    };
    let host = &args.host;
    let summary = client::push(&PushOptions::new(host.clone(), class), products, |progress| match progress {
        PushProgress::NotAccepted(info) => tracing::warn!("send: {}: not accepted by {host}", info.ident),
        PushProgress::Declined(signature) => {
            tracing::info!("send: {host}: declined {signature} (already there or too big)");
        }
    })
    .map_err(client_failure)?;
    tracing::info!("send: {} sent, {} declined, to {host}", summary.sent, summary.declined);
    Ok(())
}

/// A refusal or a bad address is the operator's to fix (exit 1); the rest is a runtime failure.
fn client_failure(error: ClientError) -> Failure {
    if error.is_refusal() { input(error) } else { runtime(error) }
}
