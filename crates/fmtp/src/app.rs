//! The FMTP transport as a tool (`ldm7 fmtp send | recv`, issue #3): for tests, benchmarks and
//! operators, without LDM's queue or sessions. The command line only parses flags into these
//! typed options and prints; everything else is here.
//!
//! * [`send`]: loads products from files, or synthesizes them from a trace (sizes and, with a
//!   [`Speedup`], times), waits for the wanted number of receivers (LDM sends nothing without
//!   one), multicasts them — BOP metadata = the 16-byte MD5 of the data, as LDM-7 uses it —
//!   serving repairs, then lingers until every product was released.
//! * [`recv`]: joins, connects (retrying until the connect deadline), repairs, checks each
//!   product's MD5 against its metadata and, with an output directory, stores it there as
//!   `<md5>`: through the spool (`SpoolSink`), so that no product is held whole in memory, the
//!   spool file being renamed into place.
//!
//! Progress is reported through a callback, so that the caller decides what to print.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use ldm7_fmtp_proto::{
    DeadlinePolicy, EnqueueRefusal, MissReason, Product, ProductIndex, SenderConfig, SenderCounters, SenderEvent,
};
use ldm7_io::Clock;
use ldm7_types::{Rate, Signature};

use crate::receiver::{FmtpReceiver, ReceiveError, ReceiverNotice, ReceiverOptions, ReceiverReport};
use crate::sender::{FmtpSender, SenderDriverCounters, SenderNotice, SenderOptions};
use crate::udp::{MulticastConfig, buffer_bytes_for_rate};

/// On-the-wire overhead paced per message, as tc HTB counts it: Ethernet (14), IPv4 (20) and
/// UDP (8) headers.
const WIRE_OVERHEAD_BYTES: u64 = 42;

/// Extra time after the linger for the last notices to arrive.
const LINGER_GRACE: Duration = Duration::from_secs(1);

/// What [`send`] sends.
#[derive(Clone, Debug, PartialEq)]
pub enum ProductSource {
    /// These files, one product each.
    Files(Vec<PathBuf>),
    /// Synthetic products with a trace's sizes (content derived from the product's position).
    Replay {
        /// The trace file (`ldm7_types::trace` format).
        trace: PathBuf,
        /// At most this many products.
        limit: Option<usize>,
        /// Pace by the trace's times divided by this.
        speed: Speedup,
    },
}

/// Replay pacing: the trace's time divided by a factor; [`Speedup::UNPACED`] (0) sends as fast
/// as the rate allows.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
pub struct Speedup(f64);

impl Speedup {
    /// No pacing by the trace's times.
    pub const UNPACED: Speedup = Speedup(0.0);

    /// The factor (finite, ≥ 0).
    pub fn factor(self) -> f64 {
        self.0
    }
}

impl FromStr for Speedup {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim().parse::<f64>() {
            Ok(factor) if factor.is_finite() && factor >= 0.0 => Ok(Speedup(factor)),
            _ => Err(format!(
                "speed {text:?} is not valid: expected a factor such as \"10\" (ten times the trace's pace) or \"0\" (as fast as the rate allows)"
            )),
        }
    }
}

/// The receive-side loss filter's probability, 0 ≤ p < 1.
#[derive(Clone, Copy, Debug, Default, PartialEq, PartialOrd)]
pub struct DropProbability(f64);

impl DropProbability {
    /// The probability.
    pub fn probability(self) -> f64 {
        self.0
    }
}

impl FromStr for DropProbability {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim().parse::<f64>() {
            Ok(probability) if (0.0..1.0).contains(&probability) => Ok(DropProbability(probability)),
            _ => Err(format!(
                "drop probability {text:?} is not valid: expected a fraction from 0 to below 1, such as \"0.05\""
            )),
        }
    }
}

/// Settings of [`send`].
#[derive(Clone, Debug, PartialEq)]
pub struct SendOptions {
    /// Multicast group and port.
    pub group: SocketAddr,
    /// Address of the interface to send from.
    pub interface: IpAddr,
    /// Sending rate (multicast and repairs, each).
    pub rate: Rate,
    /// Where the retransmission server listens (`None`: the interface, any port).
    pub retx_listen: Option<SocketAddr>,
    /// Multicast TTL.
    pub ttl: u32,
    /// Receivers to wait for before sending.
    pub receivers: usize,
    /// Retransmission deadline per product.
    pub retx_timeout: Duration,
    /// After handing every product over, how long to wait for them all to be released.
    pub linger: Duration,
    /// The products.
    pub source: ProductSource,
}

/// What [`send`] reports as it goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SendProgress {
    /// The sockets are open.
    Started {
        /// Where multicast comes from.
        source: SocketAddr,
        /// The retransmission server (give it to receivers).
        retx: SocketAddr,
    },
    /// A receiver connected.
    ReceiverJoined {
        /// Its address.
        peer: SocketAddr,
        /// Receivers so far.
        joined: usize,
        /// Receivers waited for.
        wanted: usize,
    },
    /// The protocol refused a product (e.g. no receiver connected any more).
    Refused(EnqueueRefusal),
}

/// What [`send`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendSummary {
    /// Products loaded.
    pub products: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Products multicast whole.
    pub sent: usize,
    /// Products released.
    pub released: usize,
    /// Products refused.
    pub refused: usize,
    /// From the first product handed over to the last release.
    pub elapsed: Duration,
    /// The protocol's counters.
    pub protocol: SenderCounters,
    /// The driver's counters.
    pub driver: SenderDriverCounters,
}

impl SendSummary {
    /// Product bytes per second of `elapsed`, in bits.
    pub fn goodput_bits_per_s(&self) -> f64 {
        self.bytes as f64 * 8.0 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Settings of [`recv`].
#[derive(Clone, Debug, PartialEq)]
pub struct RecvOptions {
    /// Multicast group and port.
    pub group: SocketAddr,
    /// Address of the interface to join on.
    pub interface: IpAddr,
    /// The sender's retransmission server.
    pub sender: SocketAddr,
    /// Join source-specifically on this sender address.
    pub source: Option<IpAddr>,
    /// Directory for received products (named by MD5); `None`: products are only checked.
    pub out: Option<PathBuf>,
    /// Receive-side loss filter (tests and demos).
    pub drop: DropProbability,
    /// Seed of the loss filter.
    pub seed: u64,
    /// Stop after this many products were delivered or missed.
    pub count: Option<u64>,
    /// Stop after this long without a notice.
    pub idle_timeout: Duration,
    /// Expected rate (sizes the socket buffer).
    pub rate: Rate,
    /// How long to keep trying to connect to the sender.
    pub connect_deadline: Duration,
}

/// What [`recv`] reports as it goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecvProgress {
    /// Connected to the sender's retransmission server.
    Connected(SocketAddr),
    /// A product will not arrive over FMTP.
    Missed {
        /// Its index.
        index: ProductIndex,
        /// Why.
        reason: MissReason,
    },
}

/// What [`recv`] got.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecvSummary {
    /// Products delivered.
    pub delivered: u64,
    /// Products missed.
    pub missed: u64,
    /// Blocks that came by retransmission.
    pub retransmitted_blocks: u64,
    /// Delivered products whose MD5 differs from their metadata.
    pub corrupt: u64,
    /// The receiver's counters.
    pub report: ReceiverReport,
}

/// Why [`send`] or [`recv`] failed.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The options or the input files are wrong.
    #[error("{0}")]
    Input(String),
    /// The sender could not start.
    #[error("cannot start the FMTP sender: {0}")]
    Start(io::Error),
    /// The sender stopped unexpectedly.
    #[error("the FMTP sender stopped unexpectedly")]
    SenderStopped,
    /// Products were still held for repairs when the linger time ended.
    #[error("{unreleased} products were not released within the linger time ({linger:?}): receivers did not finish")]
    NotReleased {
        /// How many.
        unreleased: usize,
        /// The linger time.
        linger: Duration,
    },
    /// The receiver failed.
    #[error(transparent)]
    Receive(ReceiveError),
    /// A product could not be stored.
    #[error("cannot store a product in {path}: {source}")]
    Output {
        /// Where.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// Products did not match their MD5 (see [`RecvSummary::corrupt`]).
    #[error("{0} products did not match their MD5")]
    Corrupt(u64),
}

impl AppError {
    /// Whether the caller's input was wrong (the command exits 1) rather than the run failing.
    pub fn is_input(&self) -> bool {
        matches!(self, Self::Input(_) | Self::Receive(ReceiveError::DropProbability(_)))
    }
}

/// Multicasts the products, serving repairs, and waits for their release. See the module doc.
pub async fn send(options: &SendOptions, mut progress: impl FnMut(SendProgress)) -> Result<SendSummary, AppError> {
    let products = load_products(&options.source)?;
    let multicast = multicast_config(options.group, options.interface, options.ttl, options.rate)?;
    let mut proto = SenderConfig::with_rate(options.rate.bits_per_s());
    for pacing in [&mut proto.multicast_pacing, &mut proto.retx_pacing].into_iter().flatten() {
        pacing.overhead_bytes_per_message = WIRE_OVERHEAD_BYTES;
    }
    proto.deadline = DeadlinePolicy::Constant(options.retx_timeout);
    proto.retained_products_max = proto.retained_products_max.max(products.len() + 1);
    let retx_listen = options.retx_listen.unwrap_or(SocketAddr::new(options.interface, 0));
    let mut sender =
        FmtpSender::start(SenderOptions::new(multicast, retx_listen, proto)).await.map_err(AppError::Start)?;
    progress(SendProgress::Started { source: sender.source_addr(), retx: sender.retx_addr() });
    let mut joined = 0;
    while joined < options.receivers {
        match sender.next_notice().await {
            Some(SenderNotice::ReceiverJoined(_, peer)) => {
                joined += 1;
                progress(SendProgress::ReceiverJoined { peer, joined, wanted: options.receivers });
            }
            Some(_) => {}
            None => return Err(AppError::SenderStopped),
        }
    }
    let total = products.len();
    let bytes: u64 = products.iter().map(|product| product.data.len() as u64).sum();
    let started = Clock::now();
    // Products go in from a task of their own while this one reads the notices (the sender
    // takes no product while notices go unread).
    let feeder = sender.product_sender();
    let mut feeding = tokio::spawn(async move {
        for outgoing in products {
            if let Some(due) = outgoing.due {
                tokio::time::sleep_until(tokio::time::Instant::from_std(Clock::to_std(started + due))).await;
            }
            if feeder.send(Product::new(outgoing.data, outgoing.signature.to_vec())).await.is_err() {
                return;
            }
        }
    });
    let (mut sent, mut released, mut refused) = (0usize, 0usize, 0usize);
    let mut linger_until = None;
    let mut last_release = started;
    while released + refused < total {
        let linger = async {
            match linger_until {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            notice = sender.next_notice() => match notice {
                Some(SenderNotice::Event(SenderEvent::Sent { .. })) => sent += 1,
                Some(SenderNotice::Event(SenderEvent::Released { .. })) => {
                    released += 1;
                    last_release = Clock::now();
                }
                Some(SenderNotice::Refused(error)) => {
                    refused += 1;
                    progress(SendProgress::Refused(error.reason));
                }
                Some(_) => {}
                None => return Err(AppError::SenderStopped),
            },
            _ = &mut feeding, if linger_until.is_none() => {
                linger_until = Some(tokio::time::Instant::now() + options.linger + LINGER_GRACE);
            }
            () = linger => break,
        }
    }
    let summary = SendSummary {
        products: total,
        bytes,
        sent,
        released,
        refused,
        elapsed: last_release.saturating_duration_since(started),
        protocol: sender.counters(),
        driver: sender.driver_counters(),
    };
    if released + refused < total {
        return Err(AppError::NotReleased { unreleased: total - released - refused, linger: options.linger });
    }
    Ok(summary)
}

/// Receives products until the count or the idle timeout, checking (and storing) each; the
/// summary counts the corrupt ones ([`AppError::Corrupt`] is the caller's to raise). See the
/// module doc.
pub async fn recv(options: &RecvOptions, mut progress: impl FnMut(RecvProgress)) -> Result<RecvSummary, AppError> {
    let multicast = multicast_config(options.group, options.interface, 1, options.rate)?;
    if let Some(out) = &options.out {
        std::fs::create_dir_all(out)
            .map_err(|error| AppError::Input(format!("cannot create --out {}: {error}", out.display())))?;
    }
    let mut receiver_options = ReceiverOptions::new(multicast, options.sender);
    receiver_options.source = options.source;
    receiver_options.spool = options.out.clone();
    receiver_options.drop_probability = options.drop.probability();
    receiver_options.seed = options.seed;
    receiver_options.connect_deadline = options.connect_deadline;
    let mut receiver = FmtpReceiver::start(receiver_options).map_err(AppError::Receive)?;
    let mut summary = RecvSummary::default();
    while options.count.is_none_or(|count| summary.delivered + summary.missed < count) {
        let notice = match tokio::time::timeout(options.idle_timeout, receiver.next_notice()).await {
            Ok(Some(notice)) => notice,
            Ok(None) | Err(_) => break,
        };
        match notice {
            ReceiverNotice::Connected(addr) => progress(RecvProgress::Connected(addr)),
            ReceiverNotice::Delivered { delivery, product } => {
                summary.delivered += 1;
                summary.retransmitted_blocks += u64::from(delivery.retransmitted_blocks);
                let digest = product
                    .md5()
                    .map_err(|source| AppError::Output { path: options.out.clone().unwrap_or_default(), source })?;
                if delivery.metadata.len() == 16 && delivery.metadata != digest {
                    summary.corrupt += 1;
                }
                if let Some(out) = &options.out {
                    let path = out.join(Signature(digest).to_string());
                    product.persist(&path).map_err(|source| AppError::Output { path, source })?;
                }
            }
            ReceiverNotice::Event(ldm7_fmtp_proto::ReceiverEvent::Missed { index, reason }) => {
                summary.missed += 1;
                progress(RecvProgress::Missed { index, reason });
            }
            ReceiverNotice::Event(_) => {}
        }
    }
    summary.report = receiver.finish().await.map_err(AppError::Receive)?;
    Ok(summary)
}

/// A product to send, with its due time after the start (replay pacing).
struct Outgoing {
    data: Vec<u8>,
    signature: [u8; 16],
    due: Option<Duration>,
}

fn load_products(source: &ProductSource) -> Result<Vec<Outgoing>, AppError> {
    match source {
        ProductSource::Replay { trace, limit, speed } => replay_products(trace, *limit, *speed),
        ProductSource::Files(files) if files.is_empty() => {
            Err(AppError::Input("nothing to send: name files or give --replay TRACE".into()))
        }
        ProductSource::Files(files) => files
            .iter()
            .map(|file| {
                let data = std::fs::read(file)
                    .map_err(|error| AppError::Input(format!("cannot read {}: {error}", file.display())))?;
                Ok(Outgoing { signature: Signature::md5_of(&data).0, data, due: None })
            })
            .collect(),
    }
}

fn replay_products(trace: &Path, limit: Option<usize>, speed: Speedup) -> Result<Vec<Outgoing>, AppError> {
    let text = std::fs::read_to_string(trace)
        .map_err(|error| AppError::Input(format!("cannot read trace {}: {error}: check the path", trace.display())))?;
    let mut entries = ldm7_types::trace::parse_trace(&text)
        .map_err(|error| AppError::Input(format!("{}:{error}", trace.display())))?;
    if entries.is_empty() {
        return Err(AppError::Input(format!("trace {} holds no products", trace.display())));
    }
    if let Some(limit) = limit {
        entries.truncate(limit);
    }
    let first = entries.first().map_or(0, |entry| entry.created.as_unix_micros());
    Ok(entries
        .iter()
        .enumerate()
        .map(|(position, entry)| {
            let data = synthetic_bytes(position as u64, entry.size as usize);
            let due = (speed.factor() > 0.0).then(|| {
                let micros = (entry.created.as_unix_micros() - first).max(0) as f64;
                Duration::try_from_secs_f64(micros / 1e6 / speed.factor()).unwrap_or(Duration::MAX)
            });
            Outgoing { signature: Signature::md5_of(&data).0, data, due }
        })
        .collect())
}

/// Deterministic pseudo-random content for the product at `position` (SplitMix64), starting
/// with the position itself so that equal sizes never give equal products.
fn synthetic_bytes(position: u64, len: usize) -> Vec<u8> {
    let mut state = position.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0x5eed;
    let mut data = Vec::with_capacity(len + 8);
    data.extend_from_slice(&position.to_be_bytes());
    while data.len() < len {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        data.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    data.truncate(len);
    data
}

fn multicast_config(group: SocketAddr, interface: IpAddr, ttl: u32, rate: Rate) -> Result<MulticastConfig, AppError> {
    if !group.ip().is_multicast() {
        return Err(AppError::Input(format!("--group {group} is not a multicast address (224.0.0.0/4 or ff00::/8)")));
    }
    Ok(MulticastConfig {
        group,
        interface,
        interface_index: 0,
        ttl,
        loopback: interface.is_loopback(),
        buffer_bytes: buffer_bytes_for_rate(rate.bits_per_s()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_values_parse_or_say_what_is_expected() {
        assert_eq!("0".parse::<Speedup>(), Ok(Speedup::UNPACED));
        assert_eq!("2.5".parse::<Speedup>().map(Speedup::factor), Ok(2.5));
        for bad in ["inf", "nan", "-1", "fast", ""] {
            assert!(bad.parse::<Speedup>().is_err(), "{bad}");
        }
        assert_eq!("0.05".parse::<DropProbability>().map(DropProbability::probability), Ok(0.05));
        for bad in ["1", "inf", "nan", "-0.1", "5%"] {
            let error = bad.parse::<DropProbability>().expect_err(bad);
            assert!(error.contains("expected a fraction"), "{error}");
        }
    }

    #[test]
    fn synthetic_products_differ_and_have_their_size() {
        let a = synthetic_bytes(0, 100);
        let b = synthetic_bytes(1, 100);
        assert_eq!((a.len(), b.len()), (100, 100));
        assert_ne!(a, b);
        assert_eq!(synthetic_bytes(3, 5), 3u64.to_be_bytes()[..5]);
        assert_eq!(synthetic_bytes(0, 100), a, "deterministic");
    }

    #[test]
    fn a_unicast_group_is_refused_as_input() {
        let error = multicast_config(
            "127.0.0.1:5000".parse().expect("addr"),
            IpAddr::from([127, 0, 0, 1]),
            1,
            Rate::from_megabits_per_s(1),
        )
        .expect_err("unicast");
        assert!(error.is_input() && error.to_string().contains("not a multicast address"), "{error}");
    }
}
