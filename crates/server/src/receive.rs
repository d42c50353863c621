//! Products arriving from elsewhere (a REQUEST's upstream, or a HIYA push): vetted, origin
//! rewritten, inserted into the queue (duplicates dropped), one log line each.

use std::sync::atomic::Ordering;

use ldm7_pq::InsertOutcome;
use ldm7_types::ProdInfo;

use ldm7_io::log_target::PRODUCT;

use crate::Shared;

/// The origin LDM stores for a product received from `upstream_host`: the original origin up
/// to its first `_v_`, then `_v_<upstream host>` (ldm6-protocol.md §8), cut to the 64-byte
/// limit.
pub fn relayed_origin(origin: &str, upstream_host: &str) -> String {
    let base = origin.find("_v_").map_or(origin, |at| &origin[..at]);
    let mut rewritten = format!("{base}_v_{upstream_host}");
    if rewritten.len() > ldm7_types::ORIGIN_LEN_MAX {
        let mut cut = ldm7_types::ORIGIN_LEN_MAX;
        while !rewritten.is_char_boundary(cut) {
            cut -= 1;
        }
        rewritten.truncate(cut);
    }
    rewritten
}

/// Whether to accept a COMINGSOON: not a duplicate, and it fits the queue.
pub(crate) fn wants(shared: &Shared, info: &ProdInfo) -> bool {
    let duplicate = shared
        .queue
        .snapshot()
        .is_ok_and(|snapshot| snapshot.product_by_signature(&info.signature).is_ok_and(|found| found.is_some()));
    if duplicate {
        tracing::info!(target: PRODUCT, "comingsoon6: duplicate: {info}");
        shared.counters.duplicates.fetch_add(1, Ordering::Relaxed);
        return false;
    }
    if let Err(error) = shared.queue.check_fits(info) {
        tracing::error!("Product too big: {info}: {error}");
        return false;
    }
    true
}

/// Inserts a received product; returns whether it was new.
pub(crate) fn insert(shared: &Shared, upstream_host: &str, info: ProdInfo, data: &[u8]) -> bool {
    let Some(info) = vet(shared, upstream_host, info, data.len()) else { return false };
    let outcome = shared.queue.insert(&info, data);
    record(shared, upstream_host, &info, outcome)
}

/// Inserts received products in one queue transaction, each exactly as [`insert`] would (vetted,
/// origin rewritten, logged, counted); if the queue refuses the batch as a whole (one product is
/// too big for it), one by one.
pub(crate) fn insert_batch(shared: &Shared, upstream_host: &str, products: &mut Vec<ldm7_ldm_proto::ReceivedProduct>) {
    if products.is_empty() {
        return;
    }
    let vetted: Vec<(ProdInfo, ldm7_ldm_proto::ReceivedData)> = products
        .drain(..)
        .filter_map(|product| {
            let len = product.data.len();
            vet(shared, upstream_host, product.info, len).map(|info| (info, product.data))
        })
        .collect();
    let pairs: Vec<(&ProdInfo, &[u8])> = vetted.iter().map(|(info, data)| (info, &data[..])).collect();
    match shared.queue.insert_batch(&pairs) {
        Ok(outcomes) => {
            for ((info, _), outcome) in vetted.iter().zip(outcomes) {
                record(shared, upstream_host, info, Ok(outcome));
            }
        }
        Err(_) => {
            for (info, data) in &vetted {
                let outcome = shared.queue.insert(info, data);
                record(shared, upstream_host, info, outcome);
            }
        }
    }
}

/// A received product's metadata ready to store (origin rewritten), or `None` (logged and
/// counted) when its data does not have its announced size.
fn vet(shared: &Shared, upstream_host: &str, mut info: ProdInfo, data_len: usize) -> Option<ProdInfo> {
    if data_len != info.size as usize {
        tracing::error!("{upstream_host}: product of {data_len} bytes announced as {}: {info}", info.size);
        shared.counters.malformed.fetch_add(1, Ordering::Relaxed);
        return None;
    }
    info.origin = relayed_origin(&info.origin, upstream_host);
    Some(info)
}

/// Logs and counts what an insert did; returns whether the product was new.
fn record(
    shared: &Shared,
    upstream_host: &str,
    info: &ProdInfo,
    outcome: Result<InsertOutcome, ldm7_pq::InsertError>,
) -> bool {
    match outcome {
        Ok(InsertOutcome::Inserted { .. }) => {
            shared.counters.products_received.fetch_add(1, Ordering::Relaxed);
            tracing::info!(target: PRODUCT, "{info}");
            true
        }
        Ok(InsertOutcome::Duplicate { .. }) => {
            shared.counters.duplicates.fetch_add(1, Ordering::Relaxed);
            tracing::info!(target: PRODUCT, "{upstream_host}: duplicate: {info}");
            false
        }
        Err(error) => {
            shared.counters.insert_errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!("{upstream_host}: cannot insert {info}: {error}");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::relayed_origin;

    #[test]
    fn origin_is_rewritten_as_ldm_does() {
        assert_eq!(relayed_origin("vm", "127.0.0.1"), "vm_v_127.0.0.1");
        assert_eq!(relayed_origin("vm_v_a.edu", "b.edu"), "vm_v_b.edu");
        assert_eq!(relayed_origin("", "b.edu"), "_v_b.edu");
        assert_eq!(relayed_origin("x", &"h".repeat(80)).len(), 64);
    }
}
