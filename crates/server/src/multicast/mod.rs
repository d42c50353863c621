//! The LDM-7 multicast service (ldm7-multicast.md §2, §4; RESEARCH.md §2–§3): per-feed FMTP
//! client address pools ([`pool`]), the persistent product-index maps ([`index_map`]), LDM
//! products as FMTP carries them ([`product`]), and the online rate monitor
//! ([`rate_control`]).

pub mod downstream7;
pub mod index_map;
pub mod product;
pub mod publisher;
pub mod rate_control;
pub(crate) mod upstream7;

pub use publisher::{Multicaster, PublisherCounters, SubscribeRefusal, Subscription};

use ldm7_types::{FeedType, ProdInfo};

/// Whether a product of the queue goes out on the LDM-7 feed `feedtype` (by multicast or in a
/// backlog): a product of the feed, except the server's statistics products. Those are fetched
/// by request from each server (docs/monitoring.md); multicast, every subscriber would count
/// its publisher's statistics as deliveries of the feed, and they would take the rate planned
/// for the feed's data.
pub(crate) fn goes_out_on(feedtype: FeedType, info: &ProdInfo) -> bool {
    feedtype.intersects(info.feedtype) && !ldm7_metrics::StatsProduct::is_stats_ident(&info.ident)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics_products_never_go_out_on_a_feed() {
        let info = |feedtype: FeedType, ident: &str| ProdInfo {
            arrival: ldm7_types::Timestamp::ZERO,
            signature: ldm7_types::Signature::md5_of(ident.as_bytes()),
            origin: "pub.example".into(),
            feedtype,
            seqno: 0,
            ident: ident.into(),
            size: 1,
        };
        assert!(goes_out_on(FeedType::EXP, &info(FeedType::EXP, "EXP/product/1")));
        assert!(!goes_out_on(FeedType::NGRID, &info(FeedType::EXP, "EXP/product/1")));
        assert!(!goes_out_on(FeedType::EXP, &info(FeedType::EXP, "ldm7-stats/1/pub.example/202611240100")));
        assert!(!goes_out_on(FeedType::ANY, &info(FeedType::EXP, "ldm7-stats/1/pub.example/202611240100")));
    }
}
