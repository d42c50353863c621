//! The repair budget of a multicast feed: what its subscribers' losses cost the publisher on
//! top of the data, and the buffer each subscriber's host needs (docs/planning.md "Repairs").
//!
//! With independent loss `p` at each of `N` subscribers, FMTP's unicast repairs resend about
//! `N·p` of the data: each subscriber's losses over its own connection. With parity repair
//! (docs/parity.md) the publisher multicasts, per group of `G` blocks, about as many shards as
//! the most unlucky subscriber lost there: the expected largest of `N` binomial(`G`, `p`)
//! counts, `E[max] = Σ_k (1 − F(k)^N)`, less than `G·p·N` once `N` is more than a few. A
//! subscriber that lost more than the `S` shards a group can have asks for the rest by unicast.

/// The distribution of one subscriber's loss count in a group of `n` blocks at loss `p`:
/// `tails[k]` = P(count > k), `k` in `0..=n`.
fn upper_tails(n: u32, p: f64) -> Vec<f64> {
    let p = p.clamp(0.0, 0.5);
    let mut pmf = Vec::with_capacity(n as usize + 1);
    let mut term = (1.0 - p).powi(n as i32);
    for k in 0..=n {
        pmf.push(term);
        term *= f64::from(n - k) / f64::from(k + 1) * p / (1.0 - p);
    }
    // Summed from the top, for precision near 1.
    let mut tails = vec![0.0; n as usize + 1];
    let mut tail = 0.0;
    for k in (0..n as usize).rev() {
        tail += pmf[k + 1];
        // A probability, whatever the rounding of the sum.
        tails[k] = tail.clamp(0.0, 1.0);
    }
    tails
}

/// The smallest `k` such that the largest of `draws` independent binomial(`n`, `p`) counts is
/// at most `k` with probability ≥ `confidence`.
pub fn largest_loss_quantile(n: u32, p: f64, draws: u32, confidence: f64) -> u32 {
    if p.is_nan() || p <= 0.0 {
        return 0;
    }
    // P(max ≤ k) = F(k)^draws ≥ confidence ⇔ F(k) ≥ confidence^(1/draws).
    let wanted = (confidence.ln() / f64::from(draws.max(1))).exp();
    let tails = upper_tails(n, p);
    (0..=n).find(|&k| 1.0 - tails[k as usize] >= wanted).unwrap_or(n)
}

/// The expected largest of `draws` independent binomial(`n`, `p`) counts.
pub fn expected_largest_loss(n: u32, p: f64, draws: u32) -> f64 {
    if p.is_nan() || p <= 0.0 {
        return 0.0;
    }
    let draws = f64::from(draws.max(1));
    // E[max] = Σ_{k ≥ 0} P(max > k) = Σ_k (1 − F(k)^draws), F(k) = 1 − P(count > k).
    upper_tails(n, p).iter().map(|tail| -(draws * (-tail).ln_1p()).exp_m1()).sum()
}

/// The data blocks plus shards of a group a publisher chooses for parity (docs/parity.md
/// "Defaults"): a group of `1024 − shards` blocks. Reed–Solomon decoding works on the group and
/// its shards rounded up to a power of two, so that 1024 data blocks and 32 shards decode as
/// 2048 (2.5 ms per group measured) where 992 and 32 decode as 1024 (1.6 ms).
pub const PARITY_GROUP_SPAN: u32 = 1024;
/// The fewest parity shards a publisher chooses per group.
pub const PARITY_SHARDS_MIN: u32 = 8;
/// How sure the chosen shard count is to cover the most unlucky subscriber's losses in a group.
pub const PARITY_SHARDS_CONFIDENCE: f64 = 0.999;

/// The parity coding a publisher chooses for `subscribers`, each losing `loss` of the datagrams
/// independently: as shards, the smallest power of two from [`PARITY_SHARDS_MIN`] to 256 that
/// covers the largest loss count of any subscriber in a group of [`PARITY_GROUP_SPAN`] blocks
/// with probability [`PARITY_SHARDS_CONFIDENCE`]; groups of [`PARITY_GROUP_SPAN`] less the
/// shards (which lose no more).
pub fn parity_for(subscribers: u32, loss: f64) -> Repair {
    let needed = largest_loss_quantile(PARITY_GROUP_SPAN, loss, subscribers.max(1), PARITY_SHARDS_CONFIDENCE);
    let shards = needed.max(PARITY_SHARDS_MIN).checked_next_power_of_two().unwrap_or(256).min(256);
    Repair::Parity { group_blocks: PARITY_GROUP_SPAN - shards, shards }
}

/// How a feed's losses are repaired, for planning.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Repair {
    /// Each subscriber's losses over its own connection (FMTP as the reference has it).
    Unicast,
    /// Parity shards multicast for groups of `group_blocks` blocks, up to `shards` per group.
    Parity {
        /// Data blocks per group.
        group_blocks: u32,
        /// Shards a group can have.
        shards: u32,
    },
}

/// What repairs cost a feed, per byte of data multicast.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RepairBudget {
    /// Repair bytes the publisher sends per data byte (shards or retransmitted blocks).
    pub share: f64,
    /// Of those, bytes sent by unicast (retransmissions), per data byte.
    pub unicast_share: f64,
}

impl RepairBudget {
    /// The share of the path rate to assure to repairs so that the data keeps its rate:
    /// `share / (1 + share)`.
    pub fn path_share(&self) -> f64 {
        self.share / (1.0 + self.share)
    }
}

/// The repair budget of `subscribers` each losing `loss` of the datagrams independently.
pub fn repair_budget(subscribers: u32, loss: f64, repair: Repair) -> RepairBudget {
    let loss = if loss.is_nan() { 0.0 } else { loss.clamp(0.0, 0.5) };
    let n = f64::from(subscribers);
    match repair {
        Repair::Unicast => RepairBudget { share: n * loss, unicast_share: n * loss },
        Repair::Parity { group_blocks, shards } => {
            let group = group_blocks.max(1);
            let multicast = expected_largest_loss(group, loss, subscribers) / f64::from(group);
            // A subscriber's losses beyond the shards of a group come by unicast: the expected
            // excess E[(X − S)⁺] per group, for each subscriber.
            let tails = upper_tails(group, loss);
            let excess: f64 = tails.iter().skip(shards as usize).sum();
            let unicast = n * excess / f64::from(group);
            RepairBudget { share: multicast + unicast, unicast_share: unicast }
        }
    }
}

/// The longest time a receiving host is planned not to read its multicast socket (the reader
/// thread not scheduled, a burst beyond the path's share): its buffer takes what arrives
/// meanwhile.
pub const RECEIVE_GAP_DEFAULT: std::time::Duration = std::time::Duration::from_millis(500);

/// The receive buffer a subscriber's host needs to ride out `gap_s` seconds of not reading a
/// feed multicast at `rate_bps` (path rate: bursts come at it), bytes.
pub fn receive_buffer_bytes(rate_bps: f64, gap_s: f64) -> f64 {
    (rate_bps / 8.0 * gap_s).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_of_the_largest_loss_count() {
        assert_eq!(largest_loss_quantile(256, 0.01, 570, 0.999), 13);
        assert_eq!(largest_loss_quantile(256, 0.01, 256, 0.999), 12);
        assert_eq!(largest_loss_quantile(256, 0.01, 8, 0.999), 10);
        assert_eq!(largest_loss_quantile(256, 0.05, 570, 0.999), 32);
        assert_eq!(largest_loss_quantile(256, 0.0, 570, 0.999), 0);
    }

    #[test]
    fn the_expected_largest_count_grows_slower_than_the_sum() {
        // One subscriber: the mean, n·p.
        assert!((expected_largest_loss(256, 0.01, 1) - 2.56).abs() < 1e-9);
        let e570 = expected_largest_loss(256, 0.01, 570);
        assert!((8.0..9.5).contains(&e570), "{e570}");
        assert!(expected_largest_loss(256, 0.01, 8) < e570);
    }

    #[test]
    fn heavy_loss_gives_finite_figures() {
        for loss in [0.05, 0.2, 0.3, 0.5, 0.9] {
            for subscribers in [1, 2, 8, 570] {
                let budget = repair_budget(subscribers, loss, parity_for(subscribers, loss));
                assert!(
                    budget.share.is_finite() && budget.path_share().is_finite(),
                    "{subscribers} {loss}: {budget:?}"
                );
                assert!(expected_largest_loss(256, loss, subscribers) <= 256.0);
            }
        }
    }

    #[test]
    fn parity_costs_the_largest_loss_unicast_the_sum() {
        let unicast = repair_budget(570, 0.01, Repair::Unicast);
        assert!((unicast.share - 5.7).abs() < 1e-9);
        let parity = repair_budget(570, 0.01, Repair::Parity { group_blocks: 256, shards: 16 });
        assert!((0.03..0.04).contains(&parity.share), "{parity:?}");
        assert!(parity.unicast_share < 1e-3, "{parity:?}");
        let eight = repair_budget(8, 0.01, Repair::Parity { group_blocks: 256, shards: 16 });
        assert!((0.015..0.025).contains(&eight.share), "{eight:?}");
        // Too few shards: the excess goes by unicast.
        let short = repair_budget(570, 0.05, Repair::Parity { group_blocks: 256, shards: 8 });
        assert!(short.unicast_share > 0.5, "{short:?}");
        assert!((eight.path_share() - eight.share / (1.0 + eight.share)).abs() < 1e-12);
        assert_eq!(receive_buffer_bytes(400e6, 0.5), 25e6);
    }
}
