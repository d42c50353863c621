//! Per-link, per-minute sums of delivery events and the metrics derived from them.
//!
//! A link is (feed, publisher, subscriber). For each link and minute (τ = 1 min, by the time
//! the product reached the subscriber's queue):
//!
//! | sum | meaning |
//! |---|---|
//! | N | products received, every mode |
//! | N′, S′, L′ | FMTP-received products: count, summed sizes, summed latencies |
//! | N″, S″, L″ | multicast-itself-sufficient products (FMTP, no block retransmitted) |
//! | ΣS | summed sizes of all products received |
//! | B | blocks retransmitted (over the repair connection) |
//! | backstop, backlog | products that came by the backstop or the backlog |
//! | host_drops | multicast datagrams dropped at the subscriber's host (its socket buffer was full): not path loss |
//!
//! Derived, as the research defines them: T^fmtp = S′/L′, T^mc = S″/L″,
//! T^retx = (S′−S″)/(L′−L″) (harmonic means of per-product size/latency); FFDR by count N′/N
//! and by size S′/ΣS; MPLR = B·1448/S′. A longer window is the sum of its minutes' sums, then
//! derived — never an average of per-minute ratios.

use std::collections::BTreeMap;

use ldm7_types::{FeedType, Timestamp};

/// Bytes of data per FMTP block (the MPLR's 1448).
pub const BLOCK_SIZE: u64 = 1448;

/// How a product reached the subscriber.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// By FMTP, no block retransmitted (multicast itself sufficed).
    Multicast,
    /// By FMTP with at least one block retransmitted.
    Retransmitted,
    /// By the unicast backstop.
    Backstop,
    /// By the backlog after an outage.
    Backlog,
}

impl Mode {
    /// The mode of an FMTP-received product with `blocks` retransmitted.
    pub fn fmtp(blocks: u32) -> Self {
        if blocks == 0 { Self::Multicast } else { Self::Retransmitted }
    }
}

/// A publisher → subscriber link of one feed.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Link {
    /// The feed's name as LDM prints it (e.g. `NGRID`).
    pub feed: String,
    /// The publisher's host name.
    pub publisher: String,
    /// The subscriber's host name.
    pub subscriber: String,
}

impl Link {
    /// A link for `feed`.
    pub fn new(feed: FeedType, publisher: impl Into<String>, subscriber: impl Into<String>) -> Self {
        Self { feed: feed.to_string(), publisher: publisher.into(), subscriber: subscriber.into() }
    }
}

/// A UTC minute: minutes since 1970-01-01T00:00Z.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Minute(pub i64);

impl Minute {
    /// The minute holding `time`.
    pub fn of(time: Timestamp) -> Self {
        Self(time.secs.div_euclid(60))
    }

    /// Its first second, Unix time.
    pub fn start_secs(self) -> i64 {
        self.0 * 60
    }

    /// `YYYYMMDDhhmm` (UTC).
    pub fn text(self) -> String {
        let (days, minute_of_day) = (self.0.div_euclid(1440), self.0.rem_euclid(1440));
        let (year, month, day) = ldm7_types::time::civil_from_days(days);
        format!("{year:04}{month:02}{day:02}{:02}{:02}", minute_of_day / 60, minute_of_day % 60)
    }

    /// Parses `YYYYMMDDhhmm`.
    pub fn parse(text: &str) -> Option<Self> {
        if text.len() != 12 || !text.bytes().all(|byte| byte.is_ascii_digit()) {
            return None;
        }
        let number = |range: std::ops::Range<usize>| text[range].parse::<i64>().ok();
        let (year, month, day, hour, minute) =
            (number(0..4)?, number(4..6)?, number(6..8)?, number(8..10)?, number(10..12)?);
        if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
            return None;
        }
        let days = ldm7_types::time::days_from_civil(year, month, day);
        if ldm7_types::time::civil_from_days(days) != (year, month, day) {
            return None;
        }
        Some(Self(days * 1440 + hour * 60 + minute))
    }
}

/// One product delivered at a subscriber.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeliveryEvent {
    /// The link.
    pub link: Link,
    /// When it reached the subscriber's queue.
    pub completed: Timestamp,
    /// How.
    pub mode: Mode,
    /// Its size, bytes.
    pub size: u64,
    /// Completion − creation at the publisher, µs (small negative values occur: two clocks).
    pub latency_us: i64,
    /// Blocks retransmitted (FMTP).
    pub retx_blocks: u32,
}

/// The sums of one link over one minute (or, added, over any set of minutes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MinuteSums {
    /// N: products received, every mode.
    pub n: u64,
    /// N′: FMTP-received.
    pub n_fmtp: u64,
    /// N″: multicast-itself-sufficient.
    pub n_mc: u64,
    /// ΣS: bytes of every product received.
    pub s_all: u64,
    /// S′: bytes of FMTP-received products.
    pub s_fmtp: u64,
    /// S″: bytes of multicast-itself-sufficient products.
    pub s_mc: u64,
    /// Summed latency of every product received, µs.
    pub l_all_us: i64,
    /// L′: summed latency of FMTP-received products, µs.
    pub l_fmtp_us: i64,
    /// L″: summed latency of multicast-itself-sufficient products, µs.
    pub l_mc_us: i64,
    /// B: blocks retransmitted.
    pub retx_blocks: u64,
    /// Products that came by the backstop.
    pub backstop: u64,
    /// Products that came by the backlog.
    pub backlog: u64,
    /// The largest latency, µs (merged by maximum; 0 when nothing was received).
    pub latency_max_us: i64,
    /// Multicast datagrams dropped at the subscriber's host (the receiving socket's buffer was
    /// full), apart from the path's loss. Absent from reports of older servers (read as 0).
    pub host_drops: u64,
}

impl MinuteSums {
    /// The sums' names, in the order of [`MinuteSums::values`]: the statistics product's keys
    /// and the monitor's columns.
    pub const NAMES: [&'static str; 14] = [
        "n",
        "n_fmtp",
        "n_mc",
        "s_all",
        "s_fmtp",
        "s_mc",
        "l_all_us",
        "l_fmtp_us",
        "l_mc_us",
        "retx_blocks",
        "backstop",
        "backlog",
        "latency_max_us",
        "host_drops",
    ];

    /// Names of [`MinuteSums::NAMES`] a report may leave out (read as 0): added after the
    /// first servers reported.
    pub const OPTIONAL: [&'static str; 1] = ["host_drops"];

    /// The sums, in the order of [`MinuteSums::NAMES`].
    pub fn values(&self) -> [i128; 14] {
        [
            self.n.into(),
            self.n_fmtp.into(),
            self.n_mc.into(),
            self.s_all.into(),
            self.s_fmtp.into(),
            self.s_mc.into(),
            self.l_all_us.into(),
            self.l_fmtp_us.into(),
            self.l_mc_us.into(),
            self.retx_blocks.into(),
            self.backstop.into(),
            self.backlog.into(),
            self.latency_max_us.into(),
            self.host_drops.into(),
        ]
    }

    /// Sums from values in the order of [`MinuteSums::NAMES`]; `Err(index)` names the first
    /// value out of its field's range (negative counts, or beyond 64 bits).
    pub fn from_values(values: [i128; 14]) -> Result<Self, usize> {
        let unsigned = |index: usize| u64::try_from(values[index]).map_err(|_| index);
        let signed = |index: usize| i64::try_from(values[index]).map_err(|_| index);
        Ok(Self {
            n: unsigned(0)?,
            n_fmtp: unsigned(1)?,
            n_mc: unsigned(2)?,
            s_all: unsigned(3)?,
            s_fmtp: unsigned(4)?,
            s_mc: unsigned(5)?,
            l_all_us: signed(6)?,
            l_fmtp_us: signed(7)?,
            l_mc_us: signed(8)?,
            retx_blocks: unsigned(9)?,
            backstop: unsigned(10)?,
            backlog: unsigned(11)?,
            latency_max_us: signed(12)?,
            host_drops: unsigned(13)?,
        })
    }

    /// Adds one event.
    pub fn add(&mut self, event: &DeliveryEvent) {
        self.n += 1;
        self.s_all += event.size;
        self.l_all_us += event.latency_us;
        self.latency_max_us = if self.n == 1 { event.latency_us } else { self.latency_max_us.max(event.latency_us) };
        match event.mode {
            Mode::Multicast | Mode::Retransmitted => {
                self.n_fmtp += 1;
                self.s_fmtp += event.size;
                self.l_fmtp_us += event.latency_us;
                self.retx_blocks += u64::from(event.retx_blocks);
                if event.mode == Mode::Multicast {
                    self.n_mc += 1;
                    self.s_mc += event.size;
                    self.l_mc_us += event.latency_us;
                }
            }
            Mode::Backstop => self.backstop += 1,
            Mode::Backlog => self.backlog += 1,
        }
    }

    /// Adds another set of sums (another minute, or the same minute reported again later).
    pub fn merge(&mut self, other: &MinuteSums) {
        let max = match (self.n, other.n) {
            (0, _) => other.latency_max_us,
            (_, 0) => self.latency_max_us,
            _ => self.latency_max_us.max(other.latency_max_us),
        };
        self.n += other.n;
        self.n_fmtp += other.n_fmtp;
        self.n_mc += other.n_mc;
        self.s_all += other.s_all;
        self.s_fmtp += other.s_fmtp;
        self.s_mc += other.s_mc;
        self.l_all_us += other.l_all_us;
        self.l_fmtp_us += other.l_fmtp_us;
        self.l_mc_us += other.l_mc_us;
        self.retx_blocks += other.retx_blocks;
        self.backstop += other.backstop;
        self.backlog += other.backlog;
        self.host_drops += other.host_drops;
        self.latency_max_us = max;
    }

    /// The sums of several minutes.
    pub fn total<'a>(minutes: impl IntoIterator<Item = &'a MinuteSums>) -> MinuteSums {
        let mut total = MinuteSums::default();
        for minute in minutes {
            total.merge(minute);
        }
        total
    }

    /// The derived metrics.
    pub fn derived(&self) -> Derived {
        let rate = |bytes: u64, latency_us: i64| (latency_us > 0).then(|| bytes as f64 * 8.0 * 1e6 / latency_us as f64);
        let ratio = |part: u64, whole: u64| (whole > 0).then(|| part as f64 / whole as f64);
        Derived {
            throughput_fmtp_bps: rate(self.s_fmtp, self.l_fmtp_us),
            throughput_mc_bps: rate(self.s_mc, self.l_mc_us),
            throughput_retx_bps: rate(self.s_fmtp - self.s_mc, self.l_fmtp_us - self.l_mc_us),
            ffdr_count: ratio(self.n_fmtp, self.n),
            ffdr_size: ratio(self.s_fmtp, self.s_all),
            mplr: (self.s_fmtp > 0).then(|| (self.retx_blocks * BLOCK_SIZE) as f64 / self.s_fmtp as f64),
            latency_mean_us: (self.n > 0).then(|| self.l_all_us as f64 / self.n as f64),
        }
    }
}

/// The research's metrics of a set of sums; `None` where undefined (nothing received, or the
/// summed latency not positive).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Derived {
    /// T^fmtp = S′/L′, bits per second.
    pub throughput_fmtp_bps: Option<f64>,
    /// T^mc = S″/L″, bits per second.
    pub throughput_mc_bps: Option<f64>,
    /// T^retx = (S′−S″)/(L′−L″), bits per second.
    pub throughput_retx_bps: Option<f64>,
    /// FFDR by count: N′/N.
    pub ffdr_count: Option<f64>,
    /// FFDR by size: S′/ΣS.
    pub ffdr_size: Option<f64>,
    /// MPLR = B·1448/S′.
    pub mplr: Option<f64>,
    /// Mean latency of every product received, µs.
    pub latency_mean_us: Option<f64>,
}

/// One link's sums over one minute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MinuteRow {
    /// The link.
    pub link: Link,
    /// The minute.
    pub minute: Minute,
    /// Its sums.
    pub sums: MinuteSums,
}

/// Collects events into per-link, per-minute sums and hands out the minutes that are over.
#[derive(Debug, Default)]
pub struct Aggregator {
    open: BTreeMap<(Minute, Link), MinuteSums>,
    /// Minutes before this one were handed out; a late event is counted in this minute.
    closed_before: Option<Minute>,
    late: u64,
}

impl Aggregator {
    /// An empty aggregator.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an event to its minute (or, if that minute was handed out already, to the first
    /// minute still open, counted in [`Aggregator::late`]).
    pub fn record(&mut self, event: &DeliveryEvent) {
        let mut minute = Minute::of(event.completed);
        if let Some(first_open) = self.closed_before
            && minute < first_open
        {
            minute = first_open;
            self.late += 1;
        }
        self.open.entry((minute, event.link.clone())).or_default().add(event);
    }

    /// Adds `count` datagrams dropped at the subscriber's host at `at` to the link's minute (as
    /// [`Aggregator::record`] places a late one).
    pub fn record_host_drops(&mut self, link: &Link, at: Timestamp, count: u64) {
        let mut minute = Minute::of(at);
        if let Some(first_open) = self.closed_before {
            minute = minute.max(first_open);
        }
        self.open.entry((minute, link.clone())).or_default().host_drops += count;
    }

    /// Events that arrived after their minute was handed out.
    pub fn late(&self) -> u64 {
        self.late
    }

    /// Hands out every minute before `before`, oldest first.
    pub fn take_before(&mut self, before: Minute) -> Vec<MinuteRow> {
        let keep = self.open.split_off(&(before, Link::default_min()));
        let done = std::mem::replace(&mut self.open, keep);
        self.closed_before = Some(self.closed_before.map_or(before, |closed| closed.max(before)));
        done.into_iter().map(|((minute, link), sums)| MinuteRow { link, minute, sums }).collect()
    }

    /// Hands out every minute (at shutdown).
    pub fn take_all(&mut self) -> Vec<MinuteRow> {
        std::mem::take(&mut self.open)
            .into_iter()
            .map(|((minute, link), sums)| MinuteRow { link, minute, sums })
            .collect()
    }
}

impl Link {
    /// The smallest link (for range splits).
    fn default_min() -> Self {
        Self { feed: String::new(), publisher: String::new(), subscriber: String::new() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn event(mode: Mode, size: u64, latency_us: i64, retx_blocks: u32, secs: i64) -> DeliveryEvent {
        DeliveryEvent {
            link: Link::new(FeedType::NGRID, "pub", "sub"),
            completed: Timestamp { secs, micros: 0 },
            mode,
            size,
            latency_us,
            retx_blocks,
        }
    }

    /// Hand-computed: three FMTP products (two multicast only), one backstop, one backlog.
    #[test]
    fn every_formula_by_hand() {
        let mut sums = MinuteSums::default();
        for event in [
            event(Mode::Multicast, 1_000_000, 1_000_000, 0, 60),
            event(Mode::Multicast, 3_000_000, 2_000_000, 0, 61),
            event(Mode::Retransmitted, 2_000_000, 4_000_000, 10, 62),
            event(Mode::Backstop, 500_000, 9_000_000, 0, 63),
            event(Mode::Backlog, 500_000, 100_000_000, 0, 64),
        ] {
            sums.add(&event);
        }
        assert_eq!((sums.n, sums.n_fmtp, sums.n_mc, sums.backstop, sums.backlog), (5, 3, 2, 1, 1));
        assert_eq!((sums.s_all, sums.s_fmtp, sums.s_mc), (7_000_000, 6_000_000, 4_000_000));
        assert_eq!((sums.l_fmtp_us, sums.l_mc_us, sums.retx_blocks), (7_000_000, 3_000_000, 10));
        assert_eq!(sums.latency_max_us, 100_000_000);
        let derived = sums.derived();
        // T^fmtp = 6 MB / 7 s = 6,857,142.857 bit/s.
        assert!((derived.throughput_fmtp_bps.unwrap() - 6e6 * 8.0 / 7.0).abs() < 1e-6);
        // T^mc = 4 MB / 3 s.
        assert!((derived.throughput_mc_bps.unwrap() - 4e6 * 8.0 / 3.0).abs() < 1e-6);
        // T^retx = (6 − 4) MB / (7 − 3) s = 4 Mbit/s.
        assert!((derived.throughput_retx_bps.unwrap() - 4e6).abs() < 1e-6);
        assert_eq!(derived.ffdr_count, Some(0.6));
        assert!((derived.ffdr_size.unwrap() - 6.0 / 7.0).abs() < 1e-12);
        // MPLR = 10 · 1448 / 6,000,000.
        assert!((derived.mplr.unwrap() - 14_480.0 / 6e6).abs() < 1e-15);
        assert_eq!(derived.latency_mean_us, Some(116_000_000.0 / 5.0));
    }

    #[test]
    fn undefined_metrics_are_none() {
        let empty = MinuteSums::default().derived();
        assert_eq!(empty, Derived::default());
        let mut backstop_only = MinuteSums::default();
        backstop_only.add(&event(Mode::Backstop, 100, 5, 0, 0));
        let derived = backstop_only.derived();
        assert_eq!((derived.ffdr_count, derived.ffdr_size), (Some(0.0), Some(0.0)));
        assert_eq!((derived.throughput_fmtp_bps, derived.mplr), (None, None));
        // Negative latencies (two clocks) do not give a negative throughput.
        let mut skewed = MinuteSums::default();
        skewed.add(&event(Mode::Multicast, 100, -3, 0, 0));
        assert_eq!(skewed.derived().throughput_fmtp_bps, None);
    }

    #[test]
    fn a_window_is_derived_from_summed_minutes_not_averaged_ratios() {
        let mut first = MinuteSums::default();
        first.add(&event(Mode::Multicast, 1_000, 1_000, 0, 0));
        let mut second = MinuteSums::default();
        second.add(&event(Mode::Multicast, 9_000, 1_000, 0, 60));
        second.add(&event(Mode::Backstop, 9_000, 1_000, 0, 61));
        let window = MinuteSums::total([&first, &second]);
        // By count: 2 of 3, not the mean of 1/1 and 1/2.
        assert!((window.derived().ffdr_count.unwrap() - 2.0 / 3.0).abs() < 1e-12);
        // Throughput: 10,000 bytes over 2 ms.
        assert!((window.derived().throughput_fmtp_bps.unwrap() - 10_000.0 * 8.0 / 0.002).abs() < 1e-6);
    }

    #[test]
    fn the_aggregator_hands_out_finished_minutes_and_counts_late_events() {
        let mut aggregator = Aggregator::new();
        aggregator.record(&event(Mode::Multicast, 10, 1, 0, 119));
        aggregator.record(&event(Mode::Multicast, 20, 1, 0, 120));
        let mut other = event(Mode::Backstop, 5, 1, 0, 121);
        other.link.subscriber = "sub2".into();
        aggregator.record(&other);
        let rows = aggregator.take_before(Minute(2));
        assert_eq!(rows.len(), 1);
        assert_eq!((rows[0].minute, rows[0].sums.s_all), (Minute(1), 10));
        // Minute 1 is over: a late event goes into minute 2.
        aggregator.record(&event(Mode::Multicast, 40, 1, 0, 100));
        assert_eq!(aggregator.late(), 1);
        let rows = aggregator.take_all();
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].minute, rows[0].sums.s_all, rows[0].sums.n), (Minute(2), 60, 2));
        assert_eq!(rows[1].link.subscriber, "sub2");
    }

    #[test]
    fn minutes_print_and_parse() {
        let minute = Minute::of("20261123213705".parse::<Timestamp>().unwrap());
        assert_eq!(minute.text(), "202611232137");
        assert_eq!(Minute::parse("202611232137"), Some(minute));
        for bad in ["20261123213", "202613232137", "202602302137", "202611232460", "2026112321x7"] {
            assert_eq!(Minute::parse(bad), None, "{bad}");
        }
    }

    fn arbitrary_event() -> impl Strategy<Value = DeliveryEvent> {
        (0u8..4, 0u64..5_000_000, -1_000i64..100_000_000, 0u32..500, 0i64..600).prop_map(
            |(mode, size, latency_us, blocks, secs)| {
                let mode = [Mode::Multicast, Mode::Retransmitted, Mode::Backstop, Mode::Backlog][mode as usize];
                let blocks = if mode == Mode::Retransmitted { blocks.max(1) } else { 0 };
                event(mode, size, latency_us, blocks, secs)
            },
        )
    }

    proptest! {
        /// Minutes merged in any order, or events added one by one, give the same totals.
        #[test]
        fn merging_is_order_independent(events in prop::collection::vec(arbitrary_event(), 0..60), seed in any::<u64>()) {
            let mut aggregator = Aggregator::new();
            let mut direct = MinuteSums::default();
            for event in &events {
                aggregator.record(event);
                direct.add(event);
            }
            let mut rows = aggregator.take_all();
            // A deterministic shuffle.
            let mut state = seed | 1;
            for index in (1..rows.len()).rev() {
                state ^= state << 13; state ^= state >> 7; state ^= state << 17;
                rows.swap(index, (state % (index as u64 + 1)) as usize);
            }
            let merged = MinuteSums::total(rows.iter().map(|row| &row.sums));
            prop_assert_eq!(merged, direct);
            let reversed = MinuteSums::total(rows.iter().rev().map(|row| &row.sums));
            prop_assert_eq!(reversed, direct);
        }
    }
}
