//! Link models: loss processes (Bernoulli and Gilbert–Elliott bursts), the shared multicast
//! bottleneck (a rate with a finite drop-tail queue), and the per-receiver TCP channel (in
//! order, delay, optional rate and socket buffer, stall windows, resets).
//!
//! Invariants:
//! * Every link is FIFO: a message never arrives before one sent earlier on the same link
//!   (jitter delays, it does not reorder — RESEARCH.md §2: the multipoint path delivers in
//!   order, and the receiver relies on it).
//! * A TCP channel loses nothing while it is up; a reset loses everything in flight on it (the
//!   channel's generation changes and stale arrivals are discarded).

use std::collections::VecDeque;
use std::time::Duration;

use ldm7_fmtp_proto::Instant;

use crate::rng::{Chance, SimRng};

/// How a link loses datagrams.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum LossModel {
    /// No loss.
    #[default]
    None,
    /// Each datagram is lost independently with this probability.
    Bernoulli(f64),
    /// Gilbert–Elliott: a two-state Markov chain (good, bad) stepped once per datagram, with a
    /// loss probability in each state.
    GilbertElliott {
        /// P(good → bad) per datagram.
        good_to_bad: f64,
        /// P(bad → good) per datagram.
        bad_to_good: f64,
        /// Loss probability in the good state.
        loss_good: f64,
        /// Loss probability in the bad state.
        loss_bad: f64,
    },
}

impl LossModel {
    /// Bursts with the given long-run loss rate and mean burst length (in datagrams): every
    /// datagram in the bad state is lost, none in the good state.
    pub fn bursts(loss_rate: f64, mean_burst_len: f64) -> Self {
        let bad_to_good = 1.0 / mean_burst_len.max(1.0);
        let loss_rate = loss_rate.clamp(0.0, 0.999);
        let good_to_bad = bad_to_good * loss_rate / (1.0 - loss_rate);
        Self::GilbertElliott { good_to_bad, bad_to_good, loss_good: 0.0, loss_bad: 1.0 }
    }

    /// The long-run fraction of datagrams lost.
    pub fn mean_loss(&self) -> f64 {
        match *self {
            Self::None => 0.0,
            Self::Bernoulli(p) => p,
            Self::GilbertElliott { good_to_bad, bad_to_good, loss_good, loss_bad } => {
                let total = good_to_bad + bad_to_good;
                if total <= 0.0 {
                    return loss_good;
                }
                let bad = good_to_bad / total;
                bad * loss_bad + (1.0 - bad) * loss_good
            }
        }
    }
}

/// A loss model's running state and random stream.
#[derive(Clone, Debug)]
pub(crate) struct LossProcess {
    kind: LossKind,
    bad: bool,
    rng: SimRng,
}

#[derive(Clone, Copy, Debug)]
enum LossKind {
    None,
    Bernoulli(Chance),
    GilbertElliott { good_to_bad: Chance, bad_to_good: Chance, loss_good: Chance, loss_bad: Chance },
}

impl LossProcess {
    pub(crate) fn new(model: &LossModel, rng: SimRng) -> Self {
        let kind = match *model {
            LossModel::None => LossKind::None,
            LossModel::Bernoulli(p) if Chance::new(p).is_never() => LossKind::None,
            LossModel::Bernoulli(p) => LossKind::Bernoulli(Chance::new(p)),
            LossModel::GilbertElliott { good_to_bad, bad_to_good, loss_good, loss_bad } => LossKind::GilbertElliott {
                good_to_bad: Chance::new(good_to_bad),
                bad_to_good: Chance::new(bad_to_good),
                loss_good: Chance::new(loss_good),
                loss_bad: Chance::new(loss_bad),
            },
        };
        Self { kind, bad: false, rng }
    }

    /// Whether the next datagram is lost.
    #[inline]
    pub(crate) fn lose(&mut self) -> bool {
        match self.kind {
            LossKind::None => false,
            LossKind::Bernoulli(chance) => self.rng.hit(chance),
            LossKind::GilbertElliott { good_to_bad, bad_to_good, loss_good, loss_bad } => {
                let flip = if self.bad { bad_to_good } else { good_to_bad };
                if self.rng.hit(flip) {
                    self.bad = !self.bad;
                }
                self.rng.hit(if self.bad { loss_bad } else { loss_good })
            }
        }
    }

    /// How many datagrams pass before the next lost one (0: the next is lost; `u64::MAX`:
    /// none is lost) — the same process as [`LossProcess::lose`] datagram by datagram, sampled
    /// at once: a geometric gap for Bernoulli loss, the chain stepped to its next loss for
    /// Gilbert–Elliott.
    pub(crate) fn until_loss(&mut self) -> u64 {
        match self.kind {
            LossKind::None => u64::MAX,
            LossKind::Bernoulli(chance) => {
                let p = chance.probability();
                if p >= 1.0 {
                    return 0;
                }
                // P(gap = k) = (1 − p)^k p: ⌊ln U / ln(1 − p)⌋ with U uniform in (0, 1].
                let u = 1.0 - self.rng.unit();
                let gap = (u.ln() / (-p).ln_1p()).floor();
                if gap >= u64::MAX as f64 { u64::MAX - 1 } else { gap as u64 }
            }
            LossKind::GilbertElliott { .. } => {
                let mut gap = 0u64;
                while !self.lose() {
                    gap += 1;
                    if gap == u64::MAX - 1 {
                        break;
                    }
                }
                gap
            }
        }
    }

    /// Stops losing (the liveness phase heals the network).
    pub(crate) fn heal(&mut self) {
        self.kind = LossKind::None;
    }
}

/// A shared bottleneck on the multicast path, before the fan-out: datagrams are serialized at
/// `rate_bits_per_s` through a drop-tail queue of `queue_bytes`. A drop here is lost by every
/// receiver (a publisher-side loss).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bottleneck {
    /// Link rate.
    pub rate_bits_per_s: u64,
    /// Queue capacity: bytes not yet serialized, the datagram on the wire included.
    pub queue_bytes: u64,
}

/// The bottleneck's running state.
#[derive(Clone, Debug)]
pub(crate) struct BottleneckState {
    spec: Bottleneck,
    /// When the link finishes serializing everything accepted so far.
    busy_until: Instant,
}

impl BottleneckState {
    pub(crate) fn new(spec: Bottleneck) -> Self {
        Self { spec, busy_until: Instant::ZERO }
    }

    /// A datagram of `len` bytes arrives at `now`: when it leaves the link, or `None` when
    /// the queue is full and `may_drop` (the liveness phase queues without limit).
    pub(crate) fn admit(&mut self, now: Instant, len: usize, may_drop: bool) -> Option<Instant> {
        let waiting = transmission_bytes(self.busy_until.saturating_duration_since(now), self.spec.rate_bits_per_s);
        if may_drop && waiting + len as u64 > self.spec.queue_bytes {
            return None;
        }
        let start = self.busy_until.max(now);
        self.busy_until = start + transmission_time(len as u64, self.spec.rate_bits_per_s);
        Some(self.busy_until)
    }
}

/// One direction of a receiver's TCP connection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TcpSpec {
    /// One-way propagation delay.
    pub delay: Duration,
    /// Serialization rate (`None`: unlimited).
    pub rate_bits_per_s: Option<u64>,
    /// Socket send buffer: while more than this is waiting to leave, the writer is told the
    /// connection is not writable (`Sender::set_writable`). `None`: unbounded.
    pub buffer_bytes: Option<u64>,
}

/// A stall of a receiver's TCP connection: nothing leaves either end during `[start, start +
/// duration)`; what was written waits and goes in order afterwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stall {
    /// When it starts.
    pub start: Instant,
    /// How long.
    pub duration: Duration,
}

/// A reset of a receiver's TCP connection at `at`: everything in flight is lost, the sender
/// sees `receiver_disconnected`; after `reconnect_after` the connection is up again
/// (`receiver_connected`, `Receiver::stream_reset`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reset {
    /// When it breaks.
    pub at: Instant,
    /// How long until it is re-established.
    pub reconnect_after: Duration,
}

/// One direction of a TCP connection, as the simulator runs it.
#[derive(Clone, Debug)]
pub(crate) struct Channel {
    spec: TcpSpec,
    stalls: Vec<(Instant, Instant)>,
    /// Bumped by a reset: arrivals of an older generation are discarded.
    pub(crate) generation: u32,
    /// When the serializer is free.
    free_at: Instant,
    /// The latest arrival scheduled (FIFO).
    last_arrival: Instant,
    /// Messages not yet fully departed: (departure end, bytes).
    unsent: VecDeque<(Instant, u64)>,
    unsent_bytes: u64,
    healed: bool,
}

impl Channel {
    pub(crate) fn new(spec: TcpSpec, stalls: &[Stall]) -> Self {
        let mut stalls: Vec<(Instant, Instant)> = stalls.iter().map(|s| (s.start, s.start + s.duration)).collect();
        stalls.sort();
        Self {
            spec,
            stalls,
            generation: 0,
            free_at: Instant::ZERO,
            last_arrival: Instant::ZERO,
            unsent: VecDeque::new(),
            unsent_bytes: 0,
            healed: false,
        }
    }

    /// Writes `len` bytes at `now`: when they arrive at the other end.
    pub(crate) fn send(&mut self, now: Instant, len: usize) -> Instant {
        self.send_after(now, now, len)
    }

    /// Like [`Channel::send`] for a message written at `now` that can leave no earlier than
    /// `ready` (it waits in the publisher's uplink first); it counts against the socket buffer
    /// from `now`.
    pub(crate) fn send_after(&mut self, now: Instant, ready: Instant, len: usize) -> Instant {
        let mut start = self.free_at.max(ready);
        if !self.healed {
            for &(stall_start, stall_end) in &self.stalls {
                if start >= stall_start && start < stall_end {
                    start = stall_end;
                }
            }
        }
        let departed = match self.spec.rate_bits_per_s {
            Some(rate) => start + transmission_time(len as u64, rate),
            None => start,
        };
        self.free_at = departed;
        if self.spec.buffer_bytes.is_some() && departed > now {
            self.unsent.push_back((departed, len as u64));
            self.unsent_bytes += len as u64;
        }
        let arrival = (departed + self.spec.delay).max(self.last_arrival);
        self.last_arrival = arrival;
        arrival
    }

    /// Whether the writer may write more at `now`; if not, when to ask again.
    pub(crate) fn writable(&mut self, now: Instant) -> Result<(), Instant> {
        let Some(buffer) = self.spec.buffer_bytes else { return Ok(()) };
        while let Some(&(departed, len)) = self.unsent.front() {
            if departed > now {
                break;
            }
            self.unsent.pop_front();
            self.unsent_bytes -= len;
        }
        if self.unsent_bytes < buffer {
            return Ok(());
        }
        Err(self.unsent.front().map_or(now, |(departed, _)| *departed))
    }

    /// The connection broke at `now`: everything in flight is lost.
    pub(crate) fn reset(&mut self, now: Instant) {
        self.generation = self.generation.wrapping_add(1);
        self.free_at = now;
        self.last_arrival = now;
        self.unsent.clear();
        self.unsent_bytes = 0;
    }

    /// Stops stalling (liveness phase).
    pub(crate) fn heal(&mut self) {
        self.healed = true;
    }
}

/// The publisher's uplink for repair traffic: every repair connection's bytes go through it
/// in the order they are written, at `rate_bits_per_s`, before each subscriber's own path
/// ([`TcpSpec`]: delay, rate, socket buffer). Without it, repairs are limited only by the
/// sender's repair pacing and each subscriber's path.
///
/// Two models ([`Uplink::repairs_only`], [`Uplink::htb_share`]): a link of the repairs' own, or
/// the publisher's one interface shared with the multicast as the host's two tc HTB classes —
/// the multicast class assured the feed's path rate (which the sender paces to, so it is never
/// held back), the repair class getting whatever the multicast leaves of the link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Uplink {
    /// Its rate.
    pub rate_bits_per_s: u64,
    /// Whether the multicast leaves through it too (the HTB share), taking its time first.
    pub shared_with_multicast: bool,
}

impl Uplink {
    /// A link that carries the repairs alone.
    pub fn repairs_only(rate_bits_per_s: u64) -> Self {
        Self { rate_bits_per_s, shared_with_multicast: false }
    }

    /// The publisher's interface shared by multicast and repairs as two HTB classes; the
    /// multicast's path rate must be below `rate_bits_per_s`, or repairs wait for every gap.
    pub fn htb_share(rate_bits_per_s: u64) -> Self {
        Self { rate_bits_per_s, shared_with_multicast: true }
    }
}

/// An uplink in a run.
///
/// With the HTB share, each multicast datagram takes the link for its transmission time; when
/// repairs are queued at that moment, the queue's end moves back by that time (the multicast
/// class goes first, up to its assured rate, and the sender never exceeds it). A repair's
/// departure is fixed when it is written: multicast datagrams sent after it delay only the repairs
/// written after them — an approximation that errs by at most the queue's drain time at that
/// moment.
#[derive(Debug)]
pub(crate) struct UplinkState {
    rate_bits_per_s: u64,
    shared_with_multicast: bool,
    free_at: Instant,
    /// Repair bytes through it.
    pub(crate) bytes: u64,
    /// The longest a repair message waited in it.
    pub(crate) wait_max: Duration,
    /// Multicast bytes through it (the HTB share).
    pub(crate) multicast_bytes: u64,
}

impl UplinkState {
    pub(crate) fn new(uplink: Uplink) -> Self {
        Self {
            rate_bits_per_s: uplink.rate_bits_per_s.max(1),
            shared_with_multicast: uplink.shared_with_multicast,
            free_at: Instant::ZERO,
            bytes: 0,
            wait_max: Duration::ZERO,
            multicast_bytes: 0,
        }
    }

    /// When a `len`-byte repair message written at `now` has left the uplink.
    pub(crate) fn pass(&mut self, now: Instant, len: usize) -> Instant {
        let start = self.free_at.max(now);
        self.wait_max = self.wait_max.max(start.saturating_duration_since(now));
        self.free_at = start + transmission_time(len as u64, self.rate_bits_per_s);
        self.bytes += len as u64;
        self.free_at
    }

    /// A `len`-byte multicast datagram leaves at `now` (only the HTB share is affected).
    pub(crate) fn multicast(&mut self, now: Instant, len: usize) {
        if !self.shared_with_multicast {
            return;
        }
        self.multicast_bytes += len as u64;
        if self.free_at > now {
            self.free_at = self.free_at + transmission_time(len as u64, self.rate_bits_per_s);
        }
    }
}

pub(crate) fn transmission_time(bytes: u64, rate_bits_per_s: u64) -> Duration {
    if rate_bits_per_s == 0 {
        return Duration::ZERO;
    }
    let nanos = u128::from(bytes) * 8 * 1_000_000_000 / u128::from(rate_bits_per_s);
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// The bytes `duration` carries at `rate_bits_per_s`.
fn transmission_bytes(duration: Duration, rate_bits_per_s: u64) -> u64 {
    let bytes = duration.as_nanos() * u128::from(rate_bits_per_s) / 8 / 1_000_000_000;
    u64::try_from(bytes).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn at_ms(ms: u64) -> Instant {
        Instant::from_nanos(ms * 1_000_000)
    }

    #[test]
    fn bursts_have_the_requested_mean() {
        let model = LossModel::bursts(0.05, 4.0);
        assert!((model.mean_loss() - 0.05).abs() < 1e-9);
        let mut process = LossProcess::new(&model, SimRng::new(3, 0));
        let (mut lost, mut runs, mut previous) = (0, 0, false);
        for _ in 0..200_000 {
            let now = process.lose();
            lost += usize::from(now);
            runs += usize::from(now && !previous);
            previous = now;
        }
        let rate = lost as f64 / 200_000.0;
        assert!((0.045..0.055).contains(&rate), "{rate}");
        let mean_burst = lost as f64 / runs as f64;
        assert!((3.5..4.5).contains(&mean_burst), "{mean_burst}");
    }

    #[test]
    fn bottleneck_serializes_and_drops_when_full() {
        // 8 Mbit/s = 1 byte/µs; room for 2000 bytes of queue.
        let mut link = BottleneckState::new(Bottleneck { rate_bits_per_s: 8_000_000, queue_bytes: 2_000 });
        assert_eq!(link.admit(Instant::ZERO, 1_000, true), Some(Instant::from_nanos(1_000_000)));
        assert_eq!(link.admit(Instant::ZERO, 1_000, true), Some(Instant::from_nanos(2_000_000)));
        assert_eq!(link.admit(Instant::ZERO, 1_000, true), None, "3000 bytes would wait, room for 2000");
        assert_eq!(link.admit(at_ms(1), 1_000, true), Some(at_ms(3)));
        assert_eq!(link.admit(at_ms(5), 1_000, true), Some(at_ms(6)));
    }

    #[test]
    fn channel_is_fifo_and_stalls() {
        let spec = TcpSpec { delay: 10 * MS, rate_bits_per_s: Some(8_000_000), buffer_bytes: Some(1_500) };
        let stall = Stall { start: at_ms(100), duration: 50 * MS };
        let mut channel = Channel::new(spec, &[stall]);
        assert_eq!(channel.send(Instant::ZERO, 1_000), at_ms(11));
        assert!(channel.writable(Instant::ZERO).is_ok());
        assert_eq!(channel.send(Instant::ZERO, 1_000), at_ms(12));
        assert_eq!(channel.writable(Instant::ZERO), Err(at_ms(1)));
        assert!(channel.writable(at_ms(1)).is_ok());
        // During the stall nothing departs: the message leaves at 150 ms.
        assert_eq!(channel.send(at_ms(120), 1_000), at_ms(161));
        channel.reset(at_ms(130));
        assert_eq!(channel.generation, 1);
        assert_eq!(channel.send(at_ms(200), 1_000), at_ms(211));
    }
}
