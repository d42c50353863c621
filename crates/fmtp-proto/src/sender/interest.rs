//! Who holds a product: the receivers connected at its BOP and those that asked for repairs
//! since, each pending until its RETX_END, with its repair rounds
//! ([`Completion::repair_rounds`]).

use std::time::Duration;

use crate::time::Instant;

use super::ReceiverId;

#[cfg(doc)]
use super::Completion;

/// One receiver's repair rounds for one product ([`Completion::repair_rounds`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct RepairRounds {
    count: u32,
    /// The first request of the round in progress.
    started: Instant,
}

impl RepairRounds {
    /// A request at `now`: a new round unless it came within `round` of the round's start.
    pub(super) fn request(&mut self, now: Instant, round: Duration) {
        if self.count == 0 || now >= self.started + round {
            self.count = self.count.saturating_add(1);
            self.started = now;
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Interest {
    Pending,
    Done,
}

/// The receivers that hold a product, with a count of those still pending: whether all are
/// done is asked at every RETX_END, and a scan would cost N² per product for N receivers. Each
/// keeps its repair rounds of the product with it (found by the one search that finds it).
#[derive(Debug, Default)]
pub(super) struct InterestSet {
    /// Sorted by id (a product's set is made from the receivers in order, and late holders are
    /// few: a vector, not a tree, for hundreds of receivers per product).
    by_receiver: Vec<Holder>,
    pending: usize,
}

/// A receiver that holds a product.
#[derive(Clone, Copy, Debug)]
struct Holder {
    id: ReceiverId,
    interest: Interest,
    /// Its repair rounds since it asked (a count of 0: it has not asked since its last
    /// RETX_END).
    rounds: RepairRounds,
}

impl Holder {
    fn new(id: ReceiverId, interest: Interest) -> Self {
        Self { id, interest, rounds: RepairRounds { count: 0, started: Instant::ZERO } }
    }
}

impl InterestSet {
    /// Every one of `ids` (in increasing order) pending.
    pub(super) fn all_pending(ids: impl Iterator<Item = ReceiverId>) -> Self {
        let by_receiver: Vec<Holder> = ids.map(|id| Holder::new(id, Interest::Pending)).collect();
        debug_assert!(by_receiver.windows(2).all(|pair| pair[0].id < pair[1].id));
        Self { pending: by_receiver.len(), by_receiver }
    }

    fn find(&self, id: ReceiverId) -> Result<usize, usize> {
        // Ids are handed out in increasing order, so with none gone a receiver sits as far from
        // the first as its id is: try there before searching.
        let guess = self.by_receiver.first().and_then(|first| usize::try_from(id.0.checked_sub(first.id.0)?).ok());
        if let Some(at) = guess.filter(|&at| self.by_receiver.get(at).is_some_and(|known| known.id == id)) {
            return Ok(at);
        }
        self.by_receiver.binary_search_by_key(&id, |holder| holder.id)
    }

    pub(super) fn get(&self, id: ReceiverId) -> Option<Interest> {
        self.find(id).ok().map(|at| self.by_receiver[at].interest)
    }

    /// `id` holds the product (pending) unless it is known already; its repair rounds.
    pub(super) fn hold(&mut self, id: ReceiverId) -> &mut RepairRounds {
        let at = match self.find(id) {
            Ok(at) => at,
            Err(at) => {
                self.by_receiver.insert(at, Holder::new(id, Interest::Pending));
                self.pending += 1;
                at
            }
        };
        &mut self.by_receiver[at].rounds
    }

    /// `id` is done; what it was before.
    pub(super) fn finish(&mut self, id: ReceiverId) -> Option<Interest> {
        match self.find(id) {
            Ok(at) => {
                let before = std::mem::replace(&mut self.by_receiver[at].interest, Interest::Done);
                if before == Interest::Pending {
                    self.pending -= 1;
                }
                Some(before)
            }
            Err(at) => {
                self.by_receiver.insert(at, Holder::new(id, Interest::Done));
                None
            }
        }
    }

    /// `id`'s repair rounds of the product, which end (its RETX_END).
    pub(super) fn take_rounds(&mut self, id: ReceiverId) -> u32 {
        let Ok(at) = self.find(id) else { return 0 };
        std::mem::replace(&mut self.by_receiver[at].rounds.count, 0)
    }

    pub(super) fn remove(&mut self, id: ReceiverId) -> Option<Interest> {
        let before = self.by_receiver.remove(self.find(id).ok()?).interest;
        if before == Interest::Pending {
            self.pending -= 1;
        }
        Some(before)
    }

    pub(super) fn any_pending(&self) -> bool {
        self.pending > 0
    }

    /// The receivers still pending, in order.
    pub(super) fn pending(&self) -> impl Iterator<Item = ReceiverId> + '_ {
        self.by_receiver.iter().filter(|holder| holder.interest == Interest::Pending).map(|holder| holder.id)
    }

    /// The receivers that asked for repairs since their last RETX_END, in order.
    pub(super) fn asking(&self) -> impl Iterator<Item = ReceiverId> + '_ {
        self.by_receiver.iter().filter(|holder| holder.rounds.count > 0).map(|holder| holder.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interest_count_follows_every_change() {
        let ids = |n: u64| (0..n).map(ReceiverId);
        let mut interest = InterestSet::all_pending(ids(3));
        assert!(interest.any_pending());
        assert_eq!(interest.finish(ReceiverId(0)), Some(Interest::Pending));
        assert_eq!(interest.finish(ReceiverId(0)), Some(Interest::Done));
        // Unknown until now: done at once, nothing pending added.
        assert_eq!(interest.finish(ReceiverId(9)), None);
        interest.hold(ReceiverId(9));
        interest.hold(ReceiverId(4));
        assert_eq!(interest.remove(ReceiverId(1)), Some(Interest::Pending));
        assert_eq!(interest.remove(ReceiverId(1)), None);
        assert_eq!(interest.pending().collect::<Vec<_>>(), vec![ReceiverId(2), ReceiverId(4)]);
        interest.finish(ReceiverId(2));
        assert!(interest.any_pending());
        assert_eq!(interest.remove(ReceiverId(4)), Some(Interest::Pending));
        assert!(!interest.any_pending());
        assert_eq!(interest.get(ReceiverId(9)), Some(Interest::Done));
    }

    #[test]
    fn a_holder_keeps_its_repair_rounds_until_its_retx_end() {
        let round = Duration::from_millis(100);
        let at = |ms: u64| Instant::ZERO + Duration::from_millis(ms);
        let mut interest = InterestSet::all_pending((0..3).map(ReceiverId));
        assert_eq!(interest.asking().count(), 0);
        // Two requests within a round are one round; one after it, another. A receiver not
        // holding the product yet holds it (pending) once it asks.
        interest.hold(ReceiverId(1)).request(at(0), round);
        interest.hold(ReceiverId(1)).request(at(50), round);
        interest.hold(ReceiverId(1)).request(at(150), round);
        interest.hold(ReceiverId(7)).request(at(10), round);
        assert_eq!(interest.asking().collect::<Vec<_>>(), vec![ReceiverId(1), ReceiverId(7)]);
        assert_eq!(interest.get(ReceiverId(7)), Some(Interest::Pending));
        assert_eq!(interest.take_rounds(ReceiverId(1)), 2);
        assert_eq!(interest.take_rounds(ReceiverId(1)), 0);
        assert_eq!(interest.take_rounds(ReceiverId(5)), 0);
        assert_eq!(interest.asking().collect::<Vec<_>>(), vec![ReceiverId(7)]);
        // A receiver gone takes its rounds with it.
        assert_eq!(interest.remove(ReceiverId(7)), Some(Interest::Pending));
        assert_eq!(interest.asking().count(), 0);
    }
}
