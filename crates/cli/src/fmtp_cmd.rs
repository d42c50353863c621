//! `ldm7 fmtp send | recv`: the FMTP transport alone, for tests, benchmarks and operators
//! (issue #3). `send` multicasts files or a trace's synthetic products (BOP metadata = the
//! 16-byte MD5 of the data, as LDM-7 uses it) and serves repairs; `recv` joins, repairs, writes
//! each product to `--out DIR/<md5>` and prints a summary line.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ldm7_fmtp::udp::{MulticastConfig, buffer_bytes_for_rate};
use ldm7_fmtp::{FmtpSender, ReceiverOptions, SenderNotice, SenderOptions, run_receiver};
use ldm7_fmtp_proto::{Product, ReceiverConfig, ReceiverEvent, SenderConfig, SenderEvent};
use ldm7_types::Signature;
use rand::{RngCore, SeedableRng};

use crate::exit::{CmdResult, bad_input, runtime};
use crate::trace::read_trace;
use ldm7_types::Rate;

/// `ldm7 fmtp …`
#[derive(clap::Subcommand, Debug)]
pub enum FmtpCommand {
    /// Multicast products and serve retransmissions.
    Send(SendArgs),
    /// Receive products from a multicast group, repairing losses over TCP.
    Recv(RecvArgs),
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
    #[arg(long, default_value = "100M")]
    pub rate: Rate,
    /// Where the retransmission server listens [default: the interface, any port].
    #[arg(long, value_name = "ADDR:PORT")]
    pub retx_listen: Option<SocketAddr>,
    /// Multicast TTL.
    #[arg(long, default_value_t = 1)]
    pub ttl: u32,
    /// Wait for this many receivers before sending (LDM sends nothing with no receiver).
    #[arg(long, default_value_t = 1)]
    pub receivers: usize,
    /// Retransmission deadline per product, seconds.
    #[arg(long, default_value_t = 300.0)]
    pub retx_timeout: f64,
    /// After sending, wait at most this long for every product to be released.
    #[arg(long, default_value_t = 60.0)]
    pub linger: f64,
    /// Replay synthetic products following this trace instead of files.
    #[arg(long, value_name = "TRACE", conflicts_with = "files")]
    pub replay: Option<PathBuf>,
    /// With --replay: at most this many products.
    #[arg(long)]
    pub limit: Option<usize>,
    /// With --replay: pace by the trace's times divided by SPEED (0 = as fast as the rate allows).
    #[arg(long, default_value_t = 0.0)]
    pub speed: f64,
    /// Files to send.
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
    /// Directory for received products (named by MD5); omitted: products are only counted.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Drop this fraction of multicast datagrams on receipt (tests and demos).
    #[arg(long, default_value_t = 0.0)]
    pub drop: f64,
    /// Seed of the drop filter.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Exit after this many products were delivered or missed.
    #[arg(long)]
    pub count: Option<u64>,
    /// Exit after this many seconds without a product.
    #[arg(long, default_value_t = 120.0)]
    pub timeout: f64,
    /// Expected rate, e.g. 100M (sizes the socket buffer).
    #[arg(long, default_value = "100M")]
    pub rate: Rate,
}

/// Runs an `fmtp` subcommand.
pub fn run(command: &FmtpCommand) -> CmdResult {
    let runtime_handle =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(runtime)?;
    match command {
        FmtpCommand::Send(args) => runtime_handle.block_on(send(args)),
        FmtpCommand::Recv(args) => runtime_handle.block_on(recv(args)),
    }
}

fn multicast(group: SocketAddr, iface: IpAddr, ttl: u32, rate: u64) -> CmdResult<MulticastConfig> {
    if !group.ip().is_multicast() {
        return Err(bad_input(format!("--group {group} is not a multicast address (224.0.0.0/4 or ff00::/8)")));
    }
    Ok(MulticastConfig {
        group,
        interface: iface,
        interface_index: 0,
        ttl,
        loopback: iface.is_loopback(),
        buffer_bytes: buffer_bytes_for_rate(rate),
    })
}

async fn send(args: &SendArgs) -> CmdResult {
    let products = load_products(args)?;
    let mut proto = SenderConfig::with_rate(args.rate.bits_per_s());
    // Pace on-the-wire bytes, as tc HTB counts them: Ethernet (14), IPv4 (20) and UDP (8) headers.
    for pacing in [&mut proto.multicast_pacing, &mut proto.retx_pacing].into_iter().flatten() {
        pacing.overhead_bytes_per_message = 42;
    }
    proto.deadline = ldm7_fmtp_proto::DeadlinePolicy::Constant(Duration::from_secs_f64(args.retx_timeout.max(0.001)));
    proto.queued_products_max = proto.queued_products_max.max(products.len() + 1);
    proto.retained_products_max = proto.retained_products_max.max(products.len() + 1);
    let retx_listen = args.retx_listen.unwrap_or(SocketAddr::new(args.iface, 0));
    let mut sender = FmtpSender::start(SenderOptions {
        multicast: multicast(args.group, args.iface, args.ttl, args.rate.bits_per_s())?,
        retx_listen,
        proto,
        authorize: Arc::new(|_| true),
    })
    .await
    .map_err(|error| runtime(anyhow::anyhow!("cannot start the FMTP sender: {error}")))?;
    println!(
        "fmtp send: group {} from {}, retransmission server {}",
        args.group,
        sender.source_addr(),
        sender.retx_addr()
    );
    let mut joined = 0;
    while joined < args.receivers {
        match sender.next_notice().await {
            Some(SenderNotice::ReceiverJoined(_, peer)) => {
                joined += 1;
                eprintln!("fmtp send: receiver {peer} connected ({joined}/{})", args.receivers);
            }
            Some(_) => {}
            None => return Err(runtime(anyhow::anyhow!("the sender stopped"))),
        }
    }
    let start = Instant::now();
    let total = products.len();
    let bytes: u64 = products.iter().map(|(data, _, _)| data.len() as u64).sum();
    for (data, signature, due) in products {
        if let Some(due) = due {
            tokio::time::sleep_until(tokio::time::Instant::from_std(start + due)).await;
        }
        sender.send(Product::new(data, signature.to_vec())).map_err(runtime)?;
    }
    let (mut sent, mut released, mut refused) = (0usize, 0usize, 0usize);
    let linger = tokio::time::Instant::now() + Duration::from_secs_f64(args.linger.max(0.0)) + Duration::from_secs(1);
    while released + refused < total {
        match tokio::time::timeout_at(linger, sender.next_notice()).await {
            Ok(Some(SenderNotice::Event(SenderEvent::Sent { .. }))) => sent += 1,
            Ok(Some(SenderNotice::Event(SenderEvent::Released { .. }))) => released += 1,
            Ok(Some(SenderNotice::Refused(why))) => {
                refused += 1;
                eprintln!("fmtp send: product refused: {why}");
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => break,
        }
    }
    let elapsed = start.elapsed().as_secs_f64().max(1e-9);
    let counters = sender.counters();
    println!(
        "fmtp send: {total} products, {bytes} bytes; multicast {sent} in {elapsed:.3} s ({:.1} Mbit/s goodput); released {released}, refused {refused}; retransmitted blocks {}, rejections {}",
        bytes as f64 * 8.0 / elapsed / 1e6,
        counters.retx_data_blocks,
        counters.rejects
    );
    if released + refused < total {
        return Err(runtime(anyhow::anyhow!(
            "{} products were not released within --linger",
            total - released - refused
        )));
    }
    Ok(())
}

type Outgoing = (Vec<u8>, [u8; 16], Option<Duration>);

fn load_products(args: &SendArgs) -> CmdResult<Vec<Outgoing>> {
    if let Some(trace) = &args.replay {
        let mut entries = read_trace(trace).map_err(bad_input)?;
        if let Some(limit) = args.limit {
            entries.truncate(limit);
        }
        let first = entries.first().map(|entry| entry.created.as_unix_micros()).unwrap_or(0);
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        return Ok(entries
            .iter()
            .enumerate()
            .map(|(index, entry)| {
                let mut data = vec![0u8; entry.size as usize];
                rng.fill_bytes(&mut data);
                for (byte, value) in data.iter_mut().zip((index as u64).to_be_bytes()) {
                    *byte = value;
                }
                let due = (args.speed > 0.0).then(|| {
                    Duration::from_secs_f64((entry.created.as_unix_micros() - first).max(0) as f64 / 1e6 / args.speed)
                });
                let signature = Signature::md5_of(&data).0;
                (data, signature, due)
            })
            .collect());
    }
    if args.files.is_empty() {
        return Err(bad_input("nothing to send: name files or give --replay TRACE"));
    }
    args.files
        .iter()
        .map(|file| {
            let data =
                std::fs::read(file).map_err(|error| bad_input(format!("cannot read {}: {error}", file.display())))?;
            let signature = Signature::md5_of(&data).0;
            Ok((data, signature, None))
        })
        .collect()
}

async fn recv(args: &RecvArgs) -> CmdResult {
    if !(0.0..1.0).contains(&args.drop) {
        return Err(bad_input(format!("--drop {} must be in [0, 1)", args.drop)));
    }
    if let Some(out) = &args.out {
        std::fs::create_dir_all(out)
            .map_err(|error| bad_input(format!("cannot create --out {}: {error}", out.display())))?;
    }
    let options = ReceiverOptions {
        multicast: multicast(args.group, args.iface, 1, args.rate.bits_per_s())?,
        source: args.source,
        sender_retx: args.sender,
        proto: ReceiverConfig::default(),
        drop_probability: args.drop,
        seed: args.seed,
    };
    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(run_receiver(options, events_tx, stop));
    let (mut delivered, mut missed, mut retransmitted, mut corrupt) = (0u64, 0u64, 0u64, 0u64);
    let idle = Duration::from_secs_f64(args.timeout.max(0.001));
    while args.count.is_none_or(|count| delivered + missed < count) {
        match tokio::time::timeout(idle, events.recv()).await {
            Ok(Some(ReceiverEvent::Delivered(delivery))) => {
                delivered += 1;
                retransmitted += u64::from(delivery.retransmitted_blocks);
                let signature = Signature::md5_of(&delivery.data);
                if delivery.metadata.len() == 16 && delivery.metadata != signature.0 {
                    corrupt += 1;
                }
                if let Some(out) = &args.out {
                    std::fs::write(out.join(signature.to_string()), &delivery.data).map_err(runtime)?;
                }
            }
            Ok(Some(ReceiverEvent::Missed { index, reason })) => {
                missed += 1;
                eprintln!("fmtp recv: missed product {index:?} ({reason:?})");
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => break,
        }
    }
    let _ = stop_tx.send(true);
    let counters = match task.await {
        Ok(Ok(counters)) => counters,
        Ok(Err(error)) => return Err(runtime(anyhow::anyhow!("FMTP receiver failed: {error}"))),
        Err(error) => return Err(runtime(error)),
    };
    println!(
        "fmtp recv: delivered {delivered}, missed {missed}, retransmitted blocks {retransmitted}, corrupt {corrupt}, datagrams {}",
        counters.datagrams
    );
    if corrupt > 0 {
        return Err(runtime(anyhow::anyhow!("{corrupt} products did not match their MD5")));
    }
    Ok(())
}
