//! The rtstats sender (`ldm7 rtstats`, `rtstats`): LDM's per-feed statistics reports from the
//! products a host's queue receives, sent to a statistics host as the reference's `rtstats`
//! sends them (ldm-formats.md §7) — binned per hour of creation, feedtype and origin
//! (`ldm7_metrics::RtStatsBins`); every 60 s plus a random 0–30 s, one EXP product per bin that
//! changed, by HIYA and HEREIS; identifier `rtstats-<version>/<host>/<FEEDTYPE>/<origin>`,
//! signature the MD5 of the line, sequence numbers counting 0 to 999. A server runs one per host
//! an `EXEC "rtstats -h HOST"` or `[rtstats] hosts` names, for LDM-6 and LDM-7 feeds alike: both
//! insert into the queue.

use std::time::{Duration, Instant};

use ldm7_client::{ClientError, PushOptions, PushProduct, ServerAddress};
use ldm7_metrics::{RtStats, RtStatsBins};
use ldm7_pq::{Queue, StorageError};
use ldm7_types::{FeedType, Pattern, ProdClass, ProdInfo, ProdSpec, Signature, Timestamp};

/// The reference's report interval and its random spread.
pub const REPORT_INTERVAL: Duration = Duration::from_secs(60);
/// Up to this much is added to each interval, at random (the reference's `DEFAULT_RANDOM`).
pub const REPORT_SPREAD: Duration = Duration::from_secs(30);

/// What an rtstats sender reports and where.
#[derive(Clone, Debug)]
pub struct RtstatsOptions {
    /// The statistics host.
    pub host: ServerAddress,
    /// This host's name in the reports.
    pub myname: String,
    /// Only products of these feedtypes …
    pub feed: FeedType,
    /// … whose identifiers match.
    pub pattern: Pattern,
    /// Products inserted from this time on are counted.
    pub from: Timestamp,
    /// Time between reports (before the random spread).
    pub interval: Duration,
    /// Largest random addition to each interval.
    pub spread: Duration,
    /// End when the parent process is no longer this one (an EXEC child of a server that was
    /// killed): the server's pid, which it passes as `LDM7_SERVER_PID`.
    pub exit_with_parent: Option<u32>,
}

/// Why the sender stopped.
#[derive(Debug, thiserror::Error)]
pub enum RtstatsError {
    /// The queue cannot be read.
    #[error("rtstats: the queue: {0}")]
    Queue(#[from] StorageError),
}

/// Follows the queue and reports forever (SIGTERM ends the process, as the reference's); a
/// report that cannot be sent is logged and its bins sent with the next one.
pub fn run(queue: &Queue, options: &RtstatsOptions) -> Result<(), RtstatsError> {
    let version = ldm7_metrics::rtstats::reporter_version();
    let mut bins = RtStatsBins::new(options.myname.clone(), version);
    let mut follower = queue.follow(options.from);
    let mut seqno = 0u32;
    // The first report goes with the first product, as the reference's.
    let mut next_report = Instant::now();
    loop {
        if options.exit_with_parent.is_some_and(|parent| std::os::unix::process::parent_id() != parent) {
            tracing::info!("rtstats: the server that started it is gone: exiting");
            return Ok(());
        }
        // At most a second at a time: the parent is looked at that often.
        let wait = next_report.saturating_duration_since(Instant::now()).min(Duration::from_secs(1));
        let product = follower.next_with(Some(wait), |product| {
            let info = &product.info;
            (options.feed.intersects(info.feedtype) && options.pattern.is_match(&info.ident)).then(|| {
                let feed = (info.feedtype.to_string(), info.feedtype.bits());
                (feed, info.origin.clone(), info.arrival, info.size, product.insertion)
            })
        })?;
        if let Some(Some(((feed, bits), origin, creation, size, insertion))) = product {
            bins.add((&feed, bits), &origin, creation, u64::from(size), insertion);
        }
        if Instant::now() >= next_report {
            let reports = bins.take_changed();
            if reports.is_empty() {
                // Nothing new: the next product is reported within a second of its arrival (and
                // the parent is looked at as often).
                next_report = Instant::now() + options.interval.min(Duration::from_secs(1));
                continue;
            }
            if let Err(error) = send(options, &reports, &mut seqno) {
                tracing::warn!("rtstats: {}: {error}; the reports go with the next ones", options.host);
                bins.mark_changed(&reports);
            }
            next_report = Instant::now() + options.interval + spread(options.spread);
        }
    }
}

/// Sends one product per report.
fn send(options: &RtstatsOptions, reports: &[RtStats], seqno: &mut u32) -> Result<(), ClientError> {
    let exp = FeedType::EXP;
    let products: Vec<PushProduct> = reports
        .iter()
        .map(|report| {
            let data = report.line().into_bytes();
            let info = ProdInfo {
                arrival: now(),
                signature: Signature::md5_of(&data),
                origin: options.myname.clone(),
                feedtype: exp,
                seqno: *seqno,
                ident: report.ident(),
                size: data.len() as u32,
            };
            *seqno = (*seqno + 1) % 1000;
            PushProduct { info, data }
        })
        .collect();
    let class = ProdClass {
        from: now(),
        to: Timestamp::END,
        specs: vec![ProdSpec::new(exp, "^rtstats-").expect("a valid pattern")],
    };
    let host = &options.host;
    let summary = ldm7_client::push(&PushOptions::new(host.clone(), class), products, |progress| match progress {
        ldm7_client::PushProgress::NotAccepted(info) => {
            tracing::warn!("rtstats: {host} does not accept {}", info.ident);
        }
        ldm7_client::PushProgress::Declined(signature) => {
            tracing::debug!("rtstats: {host} declined {signature} (it has it)");
        }
    })?;
    tracing::info!(target: ldm7_io::log_target::PRODUCT, "rtstats: {} report(s) sent to {host}", summary.sent);
    Ok(())
}

fn now() -> Timestamp {
    Timestamp::from_system_time(std::time::SystemTime::now())
}

/// A random part of `spread` (the reference's `random() & 0x7f` share of it).
fn spread(spread: Duration) -> Duration {
    use std::hash::BuildHasher;
    // A fresh `RandomState` is randomly keyed: enough to disperse the reporting times.
    let share = (std::collections::hash_map::RandomState::new().hash_one(Instant::now()) & 0x7f) as f64 / 127.0;
    spread.mul_f64(share)
}
