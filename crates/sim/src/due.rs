//! Who is due at a group's next datagram: the members that lose it ([`LossCalendar`]) and the
//! riders waiting for the multicast to pass an offset ([`DueList`]). Both are asked at every
//! data block a group takes; a block nobody is due at costs a bucket or a comparison, not a
//! heap's work.

use std::cmp::Reverse;

use dary_heap::QuaternaryHeap;

/// Members' next lost datagrams by their group's sequence number: a ring of buckets for the
/// next [`LossCalendar::SPAN`] datagrams (at 1% loss a member's next loss is a hundred
/// datagrams ahead on average), a heap for those further ahead. Sequence numbers are taken in
/// order, each once.
#[derive(Debug)]
pub(crate) struct LossCalendar {
    /// The next sequence number to take: every entry in the ring is for one from here to
    /// `cursor + SPAN`, in the bucket of its number modulo `SPAN`.
    cursor: u64,
    ring: Vec<Vec<usize>>,
    far: QuaternaryHeap<Reverse<(u64, usize)>>,
}

impl LossCalendar {
    const SPAN: u64 = 1024;

    pub(crate) fn new() -> Self {
        Self { cursor: 0, ring: (0..Self::SPAN).map(|_| Vec::new()).collect(), far: QuaternaryHeap::new() }
    }

    fn bucket(&mut self, at: u64) -> &mut Vec<usize> {
        // < SPAN.
        &mut self.ring[(at % Self::SPAN) as usize]
    }

    /// `member` loses datagram `at`. One already taken (before the cursor) can never come:
    /// it is dropped.
    pub(crate) fn push(&mut self, at: u64, member: usize) {
        if at >= self.cursor + Self::SPAN {
            self.far.push(Reverse((at, member)));
        } else if at >= self.cursor {
            self.bucket(at).push(member);
        }
    }

    /// Appends to `due` the members that lose datagram `seq` (at or after the cursor; those
    /// of numbers skipped are dropped), in increasing order, each as often as it was pushed.
    pub(crate) fn take(&mut self, seq: u64, due: &mut Vec<usize>) {
        // Numbers skipped (none when every datagram is taken): their members go.
        while self.cursor < seq {
            if self.cursor + Self::SPAN <= seq {
                self.ring.iter_mut().for_each(Vec::clear);
                self.cursor = seq;
                break;
            }
            let cursor = self.cursor;
            self.bucket(cursor).clear();
            self.cursor += 1;
        }
        self.refill();
        let start = due.len();
        due.append(self.bucket(seq));
        due[start..].sort_unstable();
        self.cursor = seq + 1;
        self.refill();
    }

    /// Moves the far entries that are now within the ring's span into it (dropping any before
    /// the cursor).
    fn refill(&mut self) {
        while let Some(&Reverse((at, member))) = self.far.peek() {
            if at >= self.cursor + Self::SPAN {
                break;
            }
            self.far.pop();
            if at >= self.cursor {
                self.bucket(at).push(member);
            }
        }
    }

    pub(crate) fn clear(&mut self) {
        self.ring.iter_mut().for_each(Vec::clear);
        self.far.clear();
    }
}

/// Members due when their group's multicast reaches an offset of the product being multicast,
/// unordered until taken: the offsets are a few block-group ends.
#[derive(Debug)]
pub(crate) struct DueList {
    entries: Vec<(u32, usize)>,
    /// The smallest offset of `entries` (`u32::MAX` when empty).
    earliest: u32,
}

impl DueList {
    pub(crate) fn new() -> Self {
        Self { entries: Vec::new(), earliest: u32::MAX }
    }

    pub(crate) fn push(&mut self, offset: u32, member: usize) {
        self.entries.push((offset, member));
        self.earliest = self.earliest.min(offset);
    }

    /// Whether any is due at offset `end`.
    pub(crate) fn any_due(&self, end: u32) -> bool {
        self.earliest <= end
    }

    /// Moves the entries due at offset `end` (offset ≤ `end`) to `due`, earliest offset first
    /// and members in increasing order at one offset.
    pub(crate) fn take(&mut self, end: u32, due: &mut Vec<(u32, usize)>) {
        if !self.any_due(end) {
            return;
        }
        let start = due.len();
        let mut earliest = u32::MAX;
        self.entries.retain(|&entry| {
            if entry.0 <= end {
                due.push(entry);
                false
            } else {
                earliest = earliest.min(entry.0);
                true
            }
        });
        self.earliest = earliest;
        due[start..].sort_unstable();
    }

    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.earliest = u32::MAX;
    }
}

#[cfg(test)]
mod tests {
    use super::{DueList, LossCalendar};
    use dary_heap::QuaternaryHeap;
    use proptest::prelude::*;
    use std::cmp::Reverse;

    /// What a min-heap of `(key, member)` pops up to `until` (inclusive), in order.
    fn pop_until<K: Ord + Copy>(heap: &mut QuaternaryHeap<Reverse<(K, usize)>>, until: K) -> Vec<(K, usize)> {
        let mut popped = Vec::new();
        while let Some(&Reverse(entry)) = heap.peek() {
            if entry.0 > until {
                break;
            }
            heap.pop();
            popped.push(entry);
        }
        popped
    }

    proptest! {
        /// The calendar gives what a heap of `(sequence number, member)` pops at each number,
        /// in the same order, with pushes ahead near and far.
        #[test]
        fn the_calendar_takes_what_a_heap_pops(pushes in proptest::collection::vec((0u64..3000, 0usize..600), 1..300)) {
            let (mut calendar, mut heap) = (LossCalendar::new(), QuaternaryHeap::new());
            let mut pushes = pushes.into_iter();
            for seq in 0..3200u64 {
                // A few pushes before each number, at or after it.
                for (ahead, member) in pushes.by_ref().take(2) {
                    calendar.push(seq + ahead, member);
                    heap.push(Reverse((seq + ahead, member)));
                }
                let mut due = Vec::new();
                calendar.take(seq, &mut due);
                let popped: Vec<usize> = pop_until(&mut heap, seq).into_iter().map(|(_, member)| member).collect();
                prop_assert_eq!(due, popped);
            }
        }

        /// The list gives what a heap of `(offset, member)` pops up to each offset.
        #[test]
        fn the_list_takes_what_a_heap_pops(pushes in proptest::collection::vec((0u32..50, 0usize..600), 0..100), ends in proptest::collection::vec(0u32..60, 1..10)) {
            let (mut list, mut heap) = (DueList::new(), QuaternaryHeap::new());
            for (offset, member) in pushes {
                list.push(offset, member);
                heap.push(Reverse((offset, member)));
            }
            for end in ends {
                let mut due = Vec::new();
                list.take(end, &mut due);
                prop_assert_eq!(due, pop_until(&mut heap, end));
                prop_assert_eq!(list.any_due(end), false);
            }
        }
    }
}
