//! `ldm7 notify` (remote notifyme) and `ldm7 send` (ldmsend): LDM-6 client sessions over a
//! blocking socket.

use std::io::Write;
use std::net::{TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use ldm7_io::Clock;
use ldm7_ldm_proto::{NotifyClient, NotifyEvent, PushClient, PushEvent};
use ldm7_server::wait::{Input, wait_input};
use ldm7_types::{Instant, ProdClass, ProdInfo, Signature, Timestamp};

use crate::common::{LineOptions, now, origin, parse_feed};
use crate::exit::{CmdResult, bad_input, input, runtime};

/// LDM's well-known port.
pub const LDM_PORT: u16 = 388;

/// `HOST[:PORT]` → address (port 388 by default; no IPv6 literals, as LDM).
fn connect(host: &str) -> CmdResult<TcpStream> {
    let (name, port) = match host.split_once(':') {
        Some((name, port)) => {
            let port =
                port.parse::<u16>().map_err(|_| bad_input(format!("invalid port in {host:?}: give HOST[:PORT]")))?;
            (name, port)
        }
        None => (host, LDM_PORT),
    };
    let address = (name, port)
        .to_socket_addrs()
        .map_err(|error| input(anyhow::anyhow!("cannot resolve {name}: {error}")))?
        .next()
        .ok_or_else(|| bad_input(format!("{name} has no address")))?;
    let stream = TcpStream::connect_timeout(&address, Duration::from_secs(25)).map_err(|error| {
        runtime(anyhow::anyhow!("cannot connect to {name}:{port}: {error}: is an LDM server running there?"))
    })?;
    stream.set_nodelay(true).ok();
    Ok(stream)
}

/// Writes the session's output, then waits for input until its next timeout.
fn pump(stream: &mut TcpStream, buf: &mut [u8], out: &mut Vec<u8>, timeout: Option<Instant>) -> CmdResult<Input> {
    if !out.is_empty() {
        stream.write_all(out).map_err(|error| runtime(anyhow::anyhow!("write: {error}")))?;
        out.clear();
    }
    wait_input(stream, buf, timeout, Duration::from_secs(1)).map_err(|error| runtime(anyhow::anyhow!("read: {error}")))
}

/// Arguments of `ldm7 notify` / `notifyme`.
#[derive(clap::Args, Debug)]
#[command(disable_help_flag = true)]
pub struct NotifyArgs {
    /// Print help (`-h` is the host, as in LDM).
    #[arg(long = "help", action = clap::ArgAction::Help)]
    pub help: Option<bool>,
    /// The upstream LDM server.
    #[arg(short = 'h', long = "host", value_name = "HOST[:PORT]", default_value = "localhost")]
    pub host: String,
    #[command(flatten)]
    pub lines: LineOptions,
    /// Exit after this many seconds without a message (notifyme: 300).
    #[arg(short = 'T', long = "timeout", value_name = "SECONDS", default_value_t = 300.0)]
    pub timeout: f64,
    /// Accepted for LDM compatibility; logging goes to standard error.
    #[arg(short = 'l', value_name = "LOGFILE", hide = true)]
    pub log: Option<String>,
    /// Accepted for LDM compatibility (verbose).
    #[arg(short = 'v', hide = true)]
    pub verbose: bool,
}

/// Runs `notify`: one line per NOTIFICATION, as notifyme prints it.
pub fn notify(args: &NotifyArgs) -> CmdResult {
    let (feedtype, pattern, from) = args.lines.selection()?;
    if !(args.timeout.is_finite() && args.timeout > 0.0) {
        return Err(bad_input(format!("invalid timeout {}: give seconds > 0", args.timeout)));
    }
    let class = ProdClass { from, to: Timestamp::END, specs: vec![ldm7_types::ProdSpec { feedtype, pattern }] };
    let mut stream = connect(&args.host)?;
    let mut session = NotifyClient::new(Clock::now(), class, Duration::from_secs_f64(args.timeout));
    let mut buf = vec![0u8; 64 << 10];
    let mut out = Vec::new();
    let mut seen = 0u64;
    let stdout = std::io::stdout();
    loop {
        while let Some(event) = session.poll_event() {
            match event {
                NotifyEvent::Accepted { class, .. } => eprintln!("notify: {}: NOTIFYME {class} accepted", args.host),
                NotifyEvent::Reclassified(class) => eprintln!("notify: {}: reclassified to {class}", args.host),
                NotifyEvent::Notification(info) => {
                    let line = args.lines.line(&info);
                    let mut lock = stdout.lock();
                    if writeln!(lock, "{line}").and_then(|()| lock.flush()).is_err() {
                        return Ok(()); // stdout closed (e.g. piped into head)
                    }
                    seen += 1;
                    if args.lines.count.is_some_and(|count| seen >= count) {
                        return Ok(());
                    }
                }
                NotifyEvent::Refused { why } => return Err(input(anyhow::anyhow!("{}: {why}", args.host))),
                NotifyEvent::Closed(Ok(())) => return Ok(()),
                NotifyEvent::Closed(Err(error)) => return Err(runtime(anyhow::anyhow!("{}: {error}", args.host))),
            }
        }
        session.take_output(&mut out);
        let timeout = session.poll_timeout();
        match pump(&mut stream, &mut buf, &mut out, timeout)? {
            Input::Bytes(n) => session.handle_input(Clock::now(), &buf[..n]),
            Input::Timeout => session.handle_timeout(Clock::now()),
            Input::Eof => session.handle_eof(),
        }
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
    pub host: String,
    /// Feedtype of the products.
    #[arg(short = 'f', long = "feed", default_value = "EXP")]
    pub feed: String,
    /// Sequence number of the first product.
    #[arg(short = 's', long = "seqno", default_value_t = 0)]
    pub seqno: u32,
    /// The files; each one's path is its product identifier.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Accepted for LDM compatibility (verbose).
    #[arg(short = 'v', hide = true)]
    pub verbose: bool,
    /// Accepted for LDM compatibility; logging goes to standard error.
    #[arg(short = 'l', value_name = "LOGFILE", hide = true)]
    pub log: Option<String>,
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
        products.push((info, data));
    }
    let class = ProdClass {
        from: now(),
        to: Timestamp::END,
        specs: vec![ldm7_types::ProdSpec::new(feed, ".*").map_err(input)?],
    };
    let mut stream = connect(&args.host)?;
    let mut session = PushClient::new(Clock::now(), &class);
    let mut buf = vec![0u8; 64 << 10];
    let mut out = Vec::new();
    let mut next = 0;
    let mut flushed = false;
    let (mut sent, mut declined) = (0u64, 0u64);
    loop {
        while let Some(event) = session.poll_event() {
            match event {
                PushEvent::Accepted { class: accepted, .. } => {
                    // Products outside a reclassified offer are skipped.
                    products.retain(|(info, _)| {
                        let keep = accepted.matches_feed_ident(info.feedtype, &info.ident);
                        if !keep {
                            eprintln!("send: {}: not accepted by {}", info.ident, args.host);
                        }
                        keep
                    });
                }
                PushEvent::Refused { why } => return Err(input(anyhow::anyhow!("{}: {why}", args.host))),
                PushEvent::Declined { signature } => {
                    declined += 1;
                    sent -= 1;
                    eprintln!("send: {}: declined {signature} (already there or too big)", args.host);
                }
                PushEvent::Flushed => flushed = true,
                PushEvent::Closed(Ok(())) => {
                    return Err(runtime(anyhow::anyhow!("{} closed the connection", args.host)));
                }
                PushEvent::Closed(Err(error)) => return Err(runtime(anyhow::anyhow!("{}: {error}", args.host))),
            }
        }
        if flushed {
            eprintln!("send: {sent} sent, {declined} declined, to {}", args.host);
            return Ok(());
        }
        while session.ready() && next < products.len() {
            let (info, data) = &products[next];
            session.send_product(Clock::now(), info, data).map_err(runtime)?;
            sent += 1;
            next += 1;
        }
        if session.ready() && next == products.len() {
            session.flush(Clock::now()).map_err(runtime)?;
            next += 1;
        }
        session.take_output(&mut out);
        let timeout = session.poll_timeout();
        match pump(&mut stream, &mut buf, &mut out, timeout)? {
            Input::Bytes(n) => session.handle_input(Clock::now(), &buf[..n]),
            Input::Timeout => session.handle_timeout(Clock::now()),
            Input::Eof => session.handle_eof(),
        }
    }
}
