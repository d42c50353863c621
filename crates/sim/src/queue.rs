//! The event heap: events ordered by virtual time, ties broken by insertion order, so a run is a
//! pure function of its seed and configuration.

use std::cmp::Ordering;

use dary_heap::QuaternaryHeap;

use ldm7_fmtp_proto::Instant;

/// A min-heap of `(time, sequence, event)`: four children per node (half the depth of a binary
/// heap, so half the moves of the large entries per pop — the heap's pop was the run's largest
/// single cost).
#[derive(Debug)]
pub(crate) struct EventQueue<E> {
    heap: QuaternaryHeap<Entry<E>>,
    sequence: u64,
}

impl<E> EventQueue<E> {
    pub(crate) fn new() -> Self {
        Self { heap: QuaternaryHeap::new(), sequence: 0 }
    }

    /// Schedules `event` at `at`; events at the same time run in the order they were pushed.
    pub(crate) fn push(&mut self, at: Instant, event: E) {
        self.sequence += 1;
        self.heap.push(Entry { at, sequence: self.sequence, event });
    }

    /// The earliest event.
    pub(crate) fn pop(&mut self) -> Option<(Instant, E)> {
        self.heap.pop().map(|entry| (entry.at, entry.event))
    }

    /// When the earliest event is due.
    pub(crate) fn peek_time(&self) -> Option<Instant> {
        self.heap.peek().map(|entry| entry.at)
    }

    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }
}

#[derive(Debug)]
struct Entry<E> {
    at: Instant,
    sequence: u64,
    event: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.sequence) == (other.at, other.sequence)
    }
}

impl<E> Eq for Entry<E> {}

impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<E> Ord for Entry<E> {
    /// Reversed: the earliest (time, sequence) is the greatest, on top of the max-heap.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.sequence).cmp(&(self.at, self.sequence))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_in_time_then_insertion_order() {
        let mut queue = EventQueue::new();
        queue.push(Instant::from_nanos(5), 'a');
        queue.push(Instant::from_nanos(1), 'b');
        queue.push(Instant::from_nanos(5), 'c');
        queue.push(Instant::from_nanos(1), 'd');
        assert_eq!(queue.peek_time(), Some(Instant::from_nanos(1)));
        let order: Vec<char> = std::iter::from_fn(|| queue.pop().map(|(_, e)| e)).collect();
        assert_eq!(order, vec!['b', 'd', 'a', 'c']);
        assert_eq!(queue.len(), 0);
    }

    /// Pushes and pops interleaved at random, many at the same instants: the same order as
    /// sorting by (time, insertion sequence).
    #[test]
    fn matches_a_sort_by_time_then_sequence() {
        let mut rng = crate::rng::SimRng::new(7, 0);
        for round in 0..200 {
            let mut queue = EventQueue::new();
            let mut pending: Vec<(u64, u64)> = Vec::new();
            let mut now = 0;
            let mut sequence = 0;
            for _ in 0..rng.below(400) {
                if rng.below(3) > 0 || pending.is_empty() {
                    let at = now + rng.below(if round % 2 == 0 { 4 } else { 50 });
                    sequence += 1;
                    queue.push(Instant::from_nanos(at), sequence);
                    pending.push((at, sequence));
                } else {
                    pending.sort_unstable();
                    let expected = pending.remove(0);
                    assert_eq!(queue.peek_time(), Some(Instant::from_nanos(expected.0)));
                    let (at, popped) = queue.pop().expect("pending");
                    assert_eq!((at.as_nanos(), popped), expected);
                    now = at.as_nanos();
                }
                assert_eq!(queue.len(), pending.len());
            }
            pending.sort_unstable();
            for expected in pending {
                let (at, popped) = queue.pop().expect("pending");
                assert_eq!((at.as_nanos(), popped), expected);
            }
            assert!(queue.pop().is_none());
        }
    }
}
