//! Products into the store: statistics products (`ldm7-stats/…`) and classic rtstats
//! (`rtstats-…`); anything else is ignored. A malformed product is counted, logged and skipped.

use std::sync::atomic::{AtomicU64, Ordering};

use ldm7_metrics::{RtStats, StatsProduct};

use crate::store::{Store, StoreError};

/// What ingestion did.
#[derive(Debug, Default)]
pub struct IngestCounters {
    /// Statistics products stored.
    pub stats: AtomicU64,
    /// Statistics products refused (malformed, unknown version).
    pub stats_bad: AtomicU64,
    /// rtstats products stored.
    pub rtstats: AtomicU64,
    /// rtstats products refused.
    pub rtstats_bad: AtomicU64,
    /// Other products (ignored).
    pub other: AtomicU64,
    /// Statistics products stored before (not counted again).
    pub repeated: AtomicU64,
}

/// What became of one product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ingested {
    /// A statistics product, stored.
    Stats,
    /// An rtstats product, stored.
    RtStats,
    /// Malformed: counted and skipped.
    Refused,
    /// Not a statistics product.
    Ignored,
    /// A statistics product stored before.
    Repeated,
}

/// Stores what a product reports. `signature` identifies it (a statistics product seen before
/// is not counted again); `arrival` (Unix seconds) is its creation time: the time of the report.
pub async fn ingest(
    store: &Store,
    counters: &IngestCounters,
    signature: &str,
    ident: &str,
    data: &[u8],
    arrival: i64,
) -> Result<Ingested, StoreError> {
    if StatsProduct::is_stats_ident(ident) {
        match StatsProduct::parse(ident, data) {
            Ok(product) => {
                if !store.add_stats_product(signature, &product, arrival).await? {
                    counters.repeated.fetch_add(1, Ordering::Relaxed);
                    return Ok(Ingested::Repeated);
                }
                counters.stats.fetch_add(1, Ordering::Relaxed);
                Ok(Ingested::Stats)
            }
            Err(error) => {
                counters.stats_bad.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("monitor: statistics product {ident:?} skipped: {error}");
                Ok(Ingested::Refused)
            }
        }
    } else if RtStats::is_rtstats_ident(ident) {
        match RtStats::parse(data) {
            Ok(stats) => {
                store.add_rtstats(&stats, arrival).await?;
                store.note_report(&stats.host, arrival, "ldm6").await?;
                counters.rtstats.fetch_add(1, Ordering::Relaxed);
                Ok(Ingested::RtStats)
            }
            Err(error) => {
                counters.rtstats_bad.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("monitor: rtstats product {ident:?} skipped: {error}");
                Ok(Ingested::Refused)
            }
        }
    } else {
        counters.other.fetch_add(1, Ordering::Relaxed);
        Ok(Ingested::Ignored)
    }
}
