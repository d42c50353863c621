//! A simulation's settings: content mode, liveness phase, receivers' links and faults, scripted
//! drops, and why a configuration cannot run.

use std::time::Duration;

use ldm7_fmtp_proto::wire::Message;
use ldm7_fmtp_proto::{IndexTrust, Instant, ParityConfig, ReceiverConfig, SenderConfig};

use crate::net::{Bottleneck, LossModel, Reset, Stall, TcpSpec, Uplink};

/// Decides whether receiver `n` (its position in [`SimConfig::receivers`]) loses a multicast
/// datagram, on top of its loss model: scripted losses for named scenarios.
pub type DropFilter = Box<dyn FnMut(usize, &Message<'_>) -> bool>;

/// How product bytes are made and checked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ContentMode {
    /// Products are materialized in memory, their metadata is their MD5 signature (as LDM),
    /// receivers assemble them, and each delivery's MD5 is checked.
    #[default]
    Memory,
    /// Products are generated on demand from a seed
    /// ([`PatternData`](crate::workload::PatternData)); receivers discard bytes
    /// ([`Assembly::Discard`](ldm7_fmtp_proto::Assembly::Discard)); each sender message is
    /// checked byte by byte against the pattern once, and each delivery by its fingerprint. For
    /// runs at scale.
    Pattern,
}

/// When and how the liveness phase starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Liveness {
    /// Time after the last workload product was multicast before the network is healed (the
    /// receive timers get this long to recover tails under faults).
    pub delay: Duration,
    /// Size of the sentinel product multicast after healing (`None`: no sentinel).
    pub sentinel_size: Option<u32>,
}

impl Default for Liveness {
    fn default() -> Self {
        Self { delay: Duration::from_secs(1), sentinel_size: Some(1_000) }
    }
}

/// A receiver's links and faults.
#[derive(Clone, Debug, PartialEq)]
pub struct ReceiverSpec {
    /// One-way delay of the multicast path.
    pub multicast_delay: Duration,
    /// Extra multicast delay, uniform in `[0, jitter]`, drawn per datagram and delay group
    /// (the path segment the group shares); FIFO is kept.
    pub jitter: Duration,
    /// Multicast loss seen by this receiver alone.
    pub loss: LossModel,
    /// TCP, receiver → sender (requests).
    pub to_sender: TcpSpec,
    /// TCP, sender → receiver (repairs).
    pub to_receiver: TcpSpec,
    /// Stall windows of the TCP connection (both directions).
    pub stalls: Vec<Stall>,
    /// Resets of the TCP connection.
    pub resets: Vec<Reset>,
    /// When the receiver joins (connects and joins the group).
    pub join_at: Instant,
    /// Its own receiver settings (default: [`SimConfig::receiver`]).
    pub config: Option<ReceiverConfig>,
}

impl ReceiverSpec {
    /// A receiver at round-trip time `rtt` (half each way on every path), no loss, unlimited
    /// TCP rate with a 4 MiB socket buffer at the sender.
    pub fn with_rtt(rtt: Duration) -> Self {
        let one_way = rtt / 2;
        Self {
            multicast_delay: one_way,
            jitter: Duration::ZERO,
            loss: LossModel::None,
            to_sender: TcpSpec { delay: one_way, rate_bits_per_s: None, buffer_bytes: None },
            to_receiver: TcpSpec { delay: one_way, rate_bits_per_s: None, buffer_bytes: Some(4 << 20) },
            stalls: Vec::new(),
            resets: Vec::new(),
            join_at: Instant::ZERO,
            config: None,
        }
    }

    /// With this multicast loss.
    pub fn loss(mut self, loss: LossModel) -> Self {
        self.loss = loss;
        self
    }

    /// With this multicast jitter.
    pub fn jitter(mut self, jitter: Duration) -> Self {
        self.jitter = jitter;
        self
    }

    /// With TCP limited to `rate_bits_per_s` in both directions and a socket buffer of
    /// `buffer_bytes` at the sender.
    pub fn tcp_rate(mut self, rate_bits_per_s: u64, buffer_bytes: u64) -> Self {
        self.to_sender.rate_bits_per_s = Some(rate_bits_per_s);
        self.to_receiver.rate_bits_per_s = Some(rate_bits_per_s);
        self.to_receiver.buffer_bytes = Some(buffer_bytes);
        self
    }

    /// With this one-way TCP delay (both directions).
    pub fn tcp_delay(mut self, delay: Duration) -> Self {
        self.to_sender.delay = delay;
        self.to_receiver.delay = delay;
        self
    }

    /// With a TCP stall.
    pub fn stall(mut self, stall: Stall) -> Self {
        self.stalls.push(stall);
        self
    }

    /// With a TCP reset.
    pub fn reset(mut self, reset: Reset) -> Self {
        self.resets.push(reset);
        self
    }

    /// Joining at `at`.
    pub fn join_at(mut self, at: Instant) -> Self {
        self.join_at = at;
        self
    }
}

/// A simulation's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// The seed: the run is a function of it and of the rest of this configuration.
    pub seed: u64,
    /// The sender.
    pub sender: SenderConfig,
    /// Receivers without their own settings. By default they believe every product index
    /// ([`IndexTrust::All`]): the simulated paths carry no forged datagrams, and the ledger's
    /// liveness check counts from each receiver's first datagram, where a receiver that asks the
    /// sender to confirm its first index drops a first product the sender already released
    /// (covered by LDM-7's backlog, not by FMTP).
    pub receiver: ReceiverConfig,
    /// How product bytes are made and checked.
    pub content: ContentMode,
    /// Multicast loss shared by all receivers (at the publisher, before the fan-out).
    pub shared_loss: LossModel,
    /// A bottleneck on the multicast path, before the fan-out.
    pub bottleneck: Option<Bottleneck>,
    /// The publisher's uplink for repairs, shared by every repair connection (`None`: repairs
    /// are limited only by the sender's repair pacing and each receiver's path).
    pub repair_uplink: Option<Uplink>,
    /// The receivers.
    pub receivers: Vec<ReceiverSpec>,
    /// The liveness phase.
    pub liveness: Liveness,
    /// Virtual time by which the run must be at rest.
    pub time_limit: Duration,
    /// Whether members that get a product without loss may take it whole, without being
    /// handed its BOP and EOP one by one (docs/simulator.md; on by default, off to compare).
    pub whole_products: bool,
    /// The LDM-7 backstop (`None`: FMTP alone, what it misses is counted missed).
    pub backstop: Option<Backstop>,
}

/// The LDM-7 subscriber's backstop in the simulation: every receiver runs the subscriber's
/// decisions ([`ldm7_ldm_proto::downstream7::Downstream7`], as the server's RECEIVE does) on
/// its FMTP reports, and each product it asks for (REQUEST_PRODUCT: missed, or skipped by a
/// jump of the index) arrives over unicast a round trip later plus its transfer at `rate`.
/// The unicast path is a delay, not a shared link; the backlog and tail-check requests the
/// decisions also make are counted, not served (receivers here do not restart).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backstop {
    /// The unicast transfer rate of a backstop product, bits per second.
    pub rate_bits_per_s: u64,
}

impl SimConfig {
    /// Sender paced at 100 Mbit/s (multicast and repairs), default receivers, memory content.
    pub fn new(seed: u64, receivers: Vec<ReceiverSpec>) -> Self {
        Self {
            seed,
            sender: SenderConfig::with_rate(100_000_000),
            receiver: ReceiverConfig { index_trust: IndexTrust::All, ..ReceiverConfig::default() },
            content: ContentMode::Memory,
            shared_loss: LossModel::None,
            bottleneck: None,
            repair_uplink: None,
            receivers,
            liveness: Liveness::default(),
            time_limit: Duration::from_secs(7 * 24 * 3600),
            whole_products: true,
            backstop: None,
        }
    }

    /// Sets the LDM-7 backstop ([`Backstop`]) at `rate_bits_per_s` for every receiver.
    pub fn with_backstop(mut self, rate_bits_per_s: u64) -> Self {
        self.backstop = Some(Backstop { rate_bits_per_s });
        self
    }

    /// Sets parity repair ([`ldm7_fmtp_proto::parity`]) at the sender and every receiver:
    /// groups of `group_blocks` data blocks with up to `shards` parity shards each, a receiver
    /// asking again after twice the largest round-trip time and 100 ms more.
    pub fn with_parity(mut self, group_blocks: u32, shards: u32) -> Self {
        let rtt_max =
            self.receivers.iter().map(|spec| spec.to_sender.delay + spec.to_receiver.delay).max().unwrap_or_default();
        let parity = ParityConfig {
            group_blocks,
            shards,
            block_len: self.sender.block_len,
            retry: rtt_max * 2 + Duration::from_millis(100),
            ..ParityConfig::default()
        };
        self.sender.parity = Some(parity);
        self.receiver.parity = Some(parity);
        self
    }
}

/// Why a configuration cannot run.
#[derive(Debug, thiserror::Error)]
pub enum SimConfigError {
    /// The sender or a receiver refused its settings.
    #[error(transparent)]
    Fmtp(#[from] ldm7_fmtp_proto::ConfigError),
    /// Too many receivers for the simulator's id space.
    #[error("{0} receivers: at most {max} are supported", max = u32::MAX)]
    TooManyReceivers(usize),
}
