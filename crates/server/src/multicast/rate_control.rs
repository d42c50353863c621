//! The online latency-violation monitor of one multicast feed (RESEARCH.md §4; docs/planning.md,
//! "The online monitor in the publisher"): what each subscriber's RETX_END tells about its
//! latency, tallied per interval by [`ViolationMonitor`], and the rate steps it decides carried
//! out on the path service, the publisher's own HTB tree and the FMTP pacing.
//!
//! The publisher does not see when a subscriber has a product; it sees the subscriber's
//! RETX_END on the repair connection (ldm7-multicast.md §3.8), half a round trip later. The
//! latency of product `i` at subscriber `j` is estimated as
//! `d_ij ≈ (RETX_END handled − RTT_j / 2) − product created`, where "created" is when the
//! product entered this publisher's queue: the delay this path's rate can change (a relayed
//! product's upstream delay cannot). `RTT_j` is the kernel's smoothed RTT of the repair
//! connection, and the repair rounds are [`Completion::repair_rounds`]. A subscriber that gave a
//! product up ([`CompletionOutcome::GaveUp`]), or had not finished it when the sender released
//! it (deadline, eviction), counts one violating delivery.
//!
//! [`RateControl`] is the bookkeeping, without I/O or clock; [`run`] is the task that ends
//! intervals and changes the rate. A rate is raised bottom-up (path, then HTB, then pacing) and
//! lowered top-down, so FMTP never paces above what the path carries; when one step fails the
//! steps already made are undone, the failure is logged and counted, and the rate stays.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ldm7_fmtp::RateHandle;
use ldm7_fmtp_proto::wire::{BLOCK_LEN, BOP_FIXED_LEN, HEADER_LEN};
use ldm7_fmtp_proto::{Completion, CompletionOutcome, ProductIndex, ReceiverId, WallClock};
use ldm7_net::path::PathService;
use ldm7_plan::violation::{Decision, IntervalTally, MonitorCounters, MonitoredDelivery, ViolationMonitor};
use ldm7_types::Timestamp;
use ldm7_types::units::Rate;

use crate::settings::RateControlSettings;

/// The path service of the publisher, shared by every feed.
pub(crate) type SharedPath = Arc<Mutex<Option<Box<dyn PathService + Send>>>>;

/// What the metrics show of one feed's monitor.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RateControlStatus {
    /// The rate held now, bit/s.
    pub rate_bits_per_s: u64,
    /// The monitor's totals (raises and lowers that were carried out).
    pub counters: MonitorCounters,
    /// Rate steps the path service, the HTB tree or FMTP refused (the rate stayed).
    pub rate_change_failures: u64,
    /// Completions of products the monitor did not know (not counted).
    pub unknown_products: u64,
    /// Products handed to FMTP beyond the bound of followed products (not measured).
    pub unmeasured_products: u64,
    /// The tally of the last interval.
    pub last_interval: IntervalTally,
}

/// One feed's monitor and the creation times of the products it is waiting on.
#[derive(Debug)]
pub(crate) struct RateControl {
    monitor: ViolationMonitor,
    wall_clock: WallClock,
    /// When each product handed to FMTP and not yet released entered the queue.
    created: HashMap<ProductIndex, Timestamp>,
    /// Bound of `created`: the products FMTP holds at most.
    created_max: usize,
    created_full: bool,
    /// Bytes each datagram costs beyond the FMTP message (what the pacing counts).
    overhead_bytes_per_message: u64,
    rate_change_failures: u64,
    unknown_products: u64,
    unmeasured_products: u64,
}

impl RateControl {
    /// A monitor at the first rate step; `wall_clock` maps the FMTP sender's instants to wall
    /// time; at most `created_max` products are followed at once; each datagram costs
    /// `overhead_bytes_per_message` on the wire beyond its FMTP message.
    pub(crate) fn new(
        settings: &RateControlSettings,
        wall_clock: WallClock,
        created_max: usize,
        overhead_bytes_per_message: u64,
    ) -> Result<Self, String> {
        Ok(Self {
            overhead_bytes_per_message,
            monitor: ViolationMonitor::new(settings.monitor_config())?,
            wall_clock,
            created: HashMap::new(),
            created_max,
            created_full: false,
            rate_change_failures: 0,
            unknown_products: 0,
            unmeasured_products: 0,
        })
    }

    /// A product was handed to FMTP as `index`; it entered the queue at `created`. Products
    /// beyond the bound of followed products are not measured (counted); returns true for the
    /// first of them in an episode, for the caller to log.
    pub(crate) fn handed(&mut self, index: ProductIndex, created: Timestamp) -> bool {
        if self.created.len() >= self.created_max {
            self.unmeasured_products += 1;
            let first = !self.created_full;
            self.created_full = true;
            return first;
        }
        self.created_full = false;
        self.created.insert(index, created);
        false
    }

    /// A subscriber's RETX_END ([`ldm7_fmtp_proto::SenderEvent::Completed`]).
    pub(crate) fn completed(&mut self, completion: &Completion) {
        let subscriber = subscriber(completion.receiver);
        if completion.outcome == CompletionOutcome::GaveUp {
            self.monitor.observe_failure(subscriber);
            return;
        }
        let Some(created) = self.created.get(&completion.index) else {
            self.unknown_products += 1;
            return;
        };
        let ended_nanos = self.wall_clock.wall_at(completion.at).as_unix_nanos() as i128;
        let finished_nanos = ended_nanos - (completion.rtt / 2).as_nanos() as i128;
        let latency_nanos = finished_nanos - i128::from(created.as_unix_micros()) * 1000;
        self.monitor.observe(&MonitoredDelivery {
            subscriber,
            latency_s: latency_nanos.max(0) as f64 / 1e9,
            bytes: multicast_bytes(completion.size, self.overhead_bytes_per_message),
            rtt_s: completion.rtt.as_secs_f64(),
            repair_rounds: completion.repair_rounds,
        });
    }

    /// The sender released a product; `unfinished` had not sent RETX_END.
    pub(crate) fn released(&mut self, index: ProductIndex, unfinished: &[ReceiverId]) {
        self.created.remove(&index);
        for receiver in unfinished {
            self.monitor.observe_failure(subscriber(*receiver));
        }
    }

    /// Ends the interval: the decision, already applied (see [`RateControl::refused`]).
    pub(crate) fn end_interval(&mut self) -> (Decision, IntervalTally) {
        let decision = self.monitor.end_interval();
        (decision, self.monitor.last_interval())
    }

    /// The rate change of `decision` could not be made: the rate stays where it was.
    pub(crate) fn refused(&mut self, decision: &Decision) {
        self.monitor.revert(decision);
        self.rate_change_failures += 1;
    }

    /// What the metrics show.
    pub(crate) fn status(&self) -> RateControlStatus {
        RateControlStatus {
            rate_bits_per_s: self.monitor.rate_bps() as u64,
            counters: self.monitor.counters(),
            rate_change_failures: self.rate_change_failures,
            unknown_products: self.unknown_products,
            unmeasured_products: self.unmeasured_products,
            last_interval: self.monitor.last_interval(),
        }
    }
}

/// What multicasting a product of `size` bytes puts on the wire: its data, and for the BOP
/// (with the LDM metadata, a 16-byte signature), every block and the EOP an FMTP header and
/// `overhead_bytes_per_message`. The monitor's `s_i`: the pacing sends these bytes at the rate.
fn multicast_bytes(size: u32, overhead_bytes_per_message: u64) -> u64 {
    let blocks = u64::from(size).div_ceil(BLOCK_LEN as u64);
    let per_message = HEADER_LEN as u64 + overhead_bytes_per_message;
    u64::from(size) + (blocks + 2) * per_message + (BOP_FIXED_LEN + LDM_METADATA_LEN) as u64
}

/// The BOP metadata of an LDM product: its MD5 signature (ldm7-multicast.md §3.4).
const LDM_METADATA_LEN: usize = 16;

/// The monitor's subscriber number of a repair connection (ids count connections from 1; the
/// monitor needs them distinct only among the connections of one interval).
fn subscriber(receiver: ReceiverId) -> u32 {
    receiver.0 as u32
}

/// What [`run`] acts on.
pub(crate) struct Actuators {
    /// The feed's name, for log lines.
    pub feed: String,
    /// The path service and the feed's path on it.
    pub path: SharedPath,
    /// The path's name.
    pub path_name: String,
    /// The interface whose HTB tree ([`ldm7_net::tc`]) holds the feed to its path rate.
    pub shaped_interface: Option<String>,
    /// The FMTP sender's pacing.
    pub pacing: RateHandle,
}

/// Ends an interval every `interval` and carries out the monitor's decisions, until aborted.
pub(crate) async fn run(control: Arc<Mutex<RateControl>>, interval: Duration, actuators: Actuators) {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let feed = &actuators.feed;
    // The HTB tree may hold another rate (left by an earlier run, or set up for the ceiling):
    // it starts where the monitor does.
    let first = rate(control.lock().unwrap_or_else(PoisonError::into_inner).status().rate_bits_per_s as f64);
    if let Err(error) = set(&actuators, Actuator::Htb, first).await {
        tracing::warn!("{feed}: rate monitor: cannot start the HTB tree at {first}: {error}");
    }
    loop {
        ticks.tick().await;
        let (decision, tally) = control.lock().unwrap_or_else(PoisonError::into_inner).end_interval();
        let counts = if tally.subscribers == 0 {
            "no deliveries".to_owned()
        } else {
            format!(
                "{} of {} subscribers violated ({} of {} deliveries late)",
                tally.violating, tally.subscribers, tally.violations, tally.deliveries
            )
        };
        let (from, to, verb) = match decision {
            Decision::Hold { rate_bps } => {
                tracing::debug!("{feed}: rate monitor: {counts}; the path rate stays {}", rate(rate_bps));
                continue;
            }
            Decision::AtCeiling { rate_bps } => {
                tracing::info!("{feed}: rate monitor: {counts}; the path rate is at its ceiling, {}", rate(rate_bps));
                continue;
            }
            Decision::Raise { from_bps, to_bps } => (rate(from_bps), rate(to_bps), "raised"),
            Decision::Lower { from_bps, to_bps } => (rate(from_bps), rate(to_bps), "lowered"),
        };
        match change_rate(&actuators, from, to).await {
            Ok(()) => tracing::info!("{feed}: rate monitor: {counts}; path rate {verb} from {from} to {to}"),
            Err(error) => {
                control.lock().unwrap_or_else(PoisonError::into_inner).refused(&decision);
                tracing::warn!(
                    "{feed}: rate monitor: {counts}; cannot change the path rate from {from} to {to}: {error}; it stays at {from}"
                );
            }
        }
    }
}

fn rate(bits_per_s: f64) -> Rate {
    Rate::from_bits_per_s(bits_per_s.round() as u64)
}

/// One of the things that hold the feed to a rate, in the order a raise changes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Actuator {
    Path,
    Htb,
    Pacing,
}

/// Moves every actuator from `from` to `to` in the safe order; on a failure, the ones moved
/// already go back to `from`.
async fn change_rate(actuators: &Actuators, from: Rate, to: Rate) -> Result<(), String> {
    let mut order = [Actuator::Path, Actuator::Htb, Actuator::Pacing];
    if to < from {
        order.reverse();
    }
    for (done, actuator) in order.iter().enumerate() {
        if let Err(error) = set(actuators, *actuator, to).await {
            for undo in order[..done].iter().rev() {
                if let Err(again) = set(actuators, *undo, from).await {
                    tracing::error!("{}: rate monitor: cannot restore {from} ({undo:?}): {again}", actuators.feed);
                }
            }
            return Err(error);
        }
    }
    Ok(())
}

async fn set(actuators: &Actuators, actuator: Actuator, rate: Rate) -> Result<(), String> {
    match actuator {
        Actuator::Pacing => actuators.pacing.set_rate(rate.bits_per_s()).await.map_err(|error| error.to_string()),
        Actuator::Path => {
            let (path, name) = (actuators.path.clone(), actuators.path_name.clone());
            blocking(move || match path.lock().unwrap_or_else(PoisonError::into_inner).as_mut() {
                Some(service) => service.set_rate(&name, rate).map_err(|error| format!("path {name}: {error}")),
                None => Ok(()),
            })
            .await
        }
        Actuator::Htb => {
            let Some(device) = actuators.shaped_interface.clone() else { return Ok(()) };
            blocking(move || match ldm7_net::tc::change_rate(None, &device, rate) {
                Ok(Some(_)) => Ok(()),
                Ok(None) => Err(format!("the HTB tree on {device} is gone")),
                Err(error) => Err(format!("HTB on {device}: {error}")),
            })
            .await
        }
    }
}

/// Runs a path or tc command off the runtime's threads.
async fn blocking(work: impl FnOnce() -> Result<(), String> + Send + 'static) -> Result<(), String> {
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|error| Err(format!("the change did not finish: {error}")))
}

/// The interface carrying `address` when it has ldm7's HTB tree: the monitor changes its rate
/// with the path's. `None` (nothing to change) otherwise, or when it cannot be told.
pub(crate) fn shaped_interface(address: std::net::IpAddr) -> Option<String> {
    if address.is_unspecified() {
        return None;
    }
    let device = ldm7_io::interface_holding(address)?;
    let text = ldm7_net::command::Cmd::new("tc").args(["class", "show", "dev", &device]).run().ok()?;
    ldm7_net::tc::installed_rates(&text).map(|_| device)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ldm7_fmtp_proto::{Instant, WallTime};

    const MS: Duration = Duration::from_millis(1);

    fn control() -> RateControl {
        let mut settings =
            RateControlSettings::research(vec![Rate::from_megabits_per_s(20), Rate::from_megabits_per_s(50)]);
        settings.lower_after = 1;
        // Instant::ZERO is wall time 1000 s.
        let wall_clock = WallClock { instant: Instant::ZERO, wall: WallTime { secs: 1000, nanos: 0 } };
        RateControl::new(&settings, wall_clock, 4, 0).expect("settings")
    }

    /// A product of 25 kB (10 ms at 20 Mbit/s) created at wall time 1000 s, completed at `at`
    /// ms after it by a subscriber 40 ms away.
    fn completion(receiver: u64, at_ms: u64, outcome: CompletionOutcome) -> Completion {
        Completion {
            index: ProductIndex(7),
            receiver: ReceiverId(receiver),
            at: Instant::ZERO + Duration::from_millis(at_ms),
            size: 25_000,
            rtt: 40 * MS,
            repair_rounds: 0,
            outcome,
        }
    }

    fn created() -> Timestamp {
        Timestamp::from_unix_micros(1_000_000_000)
    }

    #[test]
    fn latency_is_estimated_from_retx_end_less_half_the_rtt() {
        let mut control = control();
        assert!(!control.handed(ProductIndex(7), created()));
        // Expected at the subscriber: ε 2 ms + 10.1 ms (25 kB and 20 FMTP headers at 20 Mbit/s)
        // + 20 ms one way = 32.1 ms, W = 2 ms: up to 34.1 ms after creation is in time.
        // RETX_END comes 20 ms (RTT/2) after that.
        control.completed(&completion(1, 54, CompletionOutcome::Whole));
        control.completed(&completion(2, 55, CompletionOutcome::Whole));
        let (decision, tally) = control.end_interval();
        assert_eq!((tally.subscribers, tally.violating, tally.deliveries), (2, 1, 2));
        assert_eq!(decision, Decision::Raise { from_bps: 20e6, to_bps: 50e6 });
        assert_eq!(control.status().rate_bits_per_s, 50_000_000);
    }

    #[test]
    fn the_size_on_the_wire_counts_every_message_and_its_overhead() {
        assert_eq!(multicast_bytes(0, 0), 2 * 12 + 18 + 16);
        // 2 blocks, BOP and EOP: 4 messages of 12 + 42 bytes.
        assert_eq!(multicast_bytes(1449, 42), 1449 + 4 * 54 + 34);
    }

    #[test]
    fn given_up_and_unfinished_products_violate_and_released_products_are_forgotten() {
        let mut control = control();
        control.handed(ProductIndex(7), created());
        control.completed(&completion(1, 10, CompletionOutcome::GaveUp));
        control.released(ProductIndex(7), &[ReceiverId(2)]);
        // Released: a late RETX_END of it is not measured.
        control.completed(&completion(3, 30, CompletionOutcome::Whole));
        let (_, tally) = control.end_interval();
        assert_eq!((tally.subscribers, tally.violating, tally.violations), (2, 2, 2));
        assert_eq!(control.status().unknown_products, 1);
    }

    #[test]
    fn a_refused_change_keeps_the_rate_and_is_counted() {
        let mut control = control();
        control.completed(&completion(1, 10, CompletionOutcome::GaveUp));
        let (decision, _) = control.end_interval();
        control.refused(&decision);
        let status = control.status();
        assert_eq!((status.rate_bits_per_s, status.rate_change_failures, status.counters.raises), (20_000_000, 1, 0));
    }

    #[test]
    fn the_followed_products_are_bounded_and_the_first_hit_is_told() {
        let mut control = control();
        for index in 0..4 {
            assert!(!control.handed(ProductIndex(index), created()));
        }
        assert!(control.handed(ProductIndex(4), created()), "the first hit of an episode is told");
        assert!(!control.handed(ProductIndex(5), created()), "the next is counted only");
        assert_eq!(control.status().unmeasured_products, 2);
        control.released(ProductIndex(0), &[]);
        assert!(!control.handed(ProductIndex(6), created()));
        assert!(control.handed(ProductIndex(8), created()), "a new episode");
    }
}
