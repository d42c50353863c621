//! The multicast fan-out: a datagram reaching a delay group, to each member with losses drawn per
//! datagram, or with losses sampled ahead (members riding the group's run, products taken whole).

use std::rc::Rc;
use std::time::Duration;

use ldm7_fmtp_proto::wire::{Body, Message};
use ldm7_fmtp_proto::{ProductIndex, WallClock, block_fingerprint};

use crate::ledger::Violation;

use super::{ContentMode, DeliveryRecord, Event, HeldBop, Ride, Simulation, WholeProduct};

impl Simulation {
    /// Whether losses are sampled ahead ([`Simulation::on_multicast_sampled`]): with pattern
    /// content and no scripted drops, decided once, when the first receiver joins.
    pub(super) fn sampled(&mut self) -> bool {
        *self.sampled.get_or_insert(matches!(self.content, ContentMode::Pattern) && self.drop_filter.is_none())
    }

    pub(super) fn on_multicast(&mut self, group: usize, datagram: Rc<[u8]>) -> Result<(), Violation> {
        if self.sampled() {
            return self.on_multicast_sampled(group, datagram);
        }
        // Scripted drops or memory content: each datagram to each receiver, losses drawn per
        // datagram. The sender's datagrams were checked when emitted: the header is there.
        let index = ProductIndex(u32::from_be_bytes([datagram[0], datagram[1], datagram[2], datagram[3]]));
        let message = match self.drop_filter {
            Some(_) => Some(Message::parse(&datagram).map_err(|e| Violation::Sender(e.to_string()))?),
            None => None,
        };
        for member in 0..self.groups[group].members.len() {
            let receiver = self.groups[group].members[member];
            if !self.lanes[receiver].joined {
                continue;
            }
            let node = &mut self.nodes[receiver];
            let mut lost = node.loss.lose();
            if let (Some(filter), Some(message)) = (&mut self.drop_filter, &message) {
                lost |= filter(receiver, message);
            }
            if lost {
                node.datagrams_lost += 1;
                continue;
            }
            self.counters.datagram_deliveries += 1;
            self.hand_over(receiver, index, &datagram)?;
        }
        Ok(())
    }

    /// A multicast datagram reaches a group whose members' losses are sampled: each member's
    /// next lost datagram is drawn ahead
    /// ([`LossProcess::until_loss`](crate::net::LossProcess::until_loss)), members riding the
    /// group's run of data blocks take a block without anything done for them, and only the
    /// members that lose it, that lost the one before, or that must see it at once (BOP, EOP,
    /// a break in the group's run) are visited — a datagram's cost grows with the losses, not
    /// with the members. Members that take a product whole are not visited for its BOP and
    /// EOP either ([`Ride::Whole`]).
    fn on_multicast_sampled(&mut self, group: usize, datagram: Rc<[u8]>) -> Result<(), Violation> {
        let message = Message::parse(&datagram).map_err(|e| Violation::Sender(e.to_string()))?;
        let index = message.index;
        if let Body::Parity { group: of_group, .. } = message.body {
            return self.on_parity_sampled(group, index, of_group, &datagram);
        }
        let seq = self.groups[group].seq;
        self.groups[group].seq += 1;
        // Who loses it (each draws its next loss).
        let mut losers = std::mem::take(&mut self.losers);
        losers.clear();
        let mut due = std::mem::take(&mut self.due);
        due.clear();
        self.groups[group].losses.take(seq, &mut due);
        for &member in &due {
            let node = &mut self.nodes[member];
            if node.next_loss != seq || !self.lanes[member].joined {
                continue;
            }
            node.datagrams_lost += 1;
            node.next_loss = (seq + 1).saturating_add(node.loss.until_loss());
            if node.next_loss != u64::MAX {
                self.groups[group].losses.push(node.next_loss, member);
            }
            losers.push(member);
        }
        self.due = due;
        self.counters.datagram_deliveries += (self.groups[group].joined - losers.len()) as u64;
        let result = match message.body {
            Body::MemData { offset, data } => {
                // offset + len ≤ the product size ≤ u32::MAX.
                let end = offset + data.len() as u32;
                self.on_block_sampled(
                    group,
                    seq,
                    index,
                    offset,
                    end,
                    block_fingerprint(offset, data),
                    &datagram,
                    &losers,
                )
            }
            Body::Bop(ref bop) => {
                let held = HeldBop {
                    at: self.now,
                    seq,
                    index,
                    size: bop.product_size,
                    start_time: bop.start_time,
                    metadata: bop.metadata.try_into().ok(),
                    datagram: datagram.clone(),
                };
                self.on_bop_sampled(group, held, &losers)
            }
            _ => self.on_eop_sampled(group, seq, index, &datagram, &losers),
        };
        self.losers = losers;
        result
    }

    /// A parity shard reaches a group: only the members whose product still misses blocks of
    /// that block group take it, each deciding its loss on its own (a draw of its loss model,
    /// apart from the sampled losses of the data stream), after their share of the run so far.
    /// It takes no place in the group's run: the next block continues it.
    ///
    /// Whether a member wants it is asked of its state machine as of the member's last visit,
    /// before its share of the run is handed over: a member riding the product's run since its
    /// BOP wants every shard of it that the run has not passed. A member taking the product
    /// whole ([`Ride::Whole`]) is such a member; when it wants the shard it is visited like one
    /// (its BOP, then its share).
    fn on_parity_sampled(
        &mut self,
        group: usize,
        index: ProductIndex,
        of_group: u16,
        datagram: &[u8],
    ) -> Result<(), Violation> {
        let seq = self.groups[group].seq;
        // A run's shard (docs/parity.md "Runs") repairs products `index` to `newest`.
        let run_count = of_group.checked_sub(ldm7_fmtp_proto::parity::RUN_MARK);
        let newest = ProductIndex(index.0.wrapping_add(u32::from(run_count.unwrap_or(1)).saturating_sub(1)));
        let current = self.groups[group]
            .bop
            .as_ref()
            .filter(|bop| {
                bop.index.serial_difference(index).is_some_and(|d| d >= 0)
                    && newest.serial_difference(bop.index).is_some_and(|d| d >= 0)
            })
            .map(|bop| (bop.index, bop.size));
        let parity = self.groups[group].parity;
        // What a member taking the product whole would say: the block group is incomplete there
        // while the run has not passed it (once it has, the shard is for the others). A run's
        // shard is wanted where a product of the run lost blocks, and such a member lost none.
        let current_wants = current.zip(parity).is_some_and(|((current, size), parity)| {
            let size = u64::from(size);
            run_count.is_none()
                && u64::from(of_group) < parity.groups(size)
                && parity.group_range(u32::from(of_group), size).1 > u64::from(self.groups[group].run.end_of(current))
        });
        for member in 0..self.groups[group].members.len() {
            let receiver = self.groups[group].members[member];
            let lane = &self.lanes[receiver];
            if !lane.joined {
                continue;
            }
            let wants = match lane.ride {
                // (A run's shard is the receiver's to judge: such a member may hold an older
                // product of the run that lost blocks.)
                Ride::Whole(_) if current.is_some() && run_count.is_none() => current_wants,
                // Nothing older than what it held at its last visit can be in flight there
                // (products are created newer than the newest).
                _ => {
                    lane.oldest.is_some_and(|oldest| newest.serial_difference(oldest).is_some_and(|d| d >= 0))
                        && self.nodes[receiver].receiver.wants_parity(index, of_group)
                }
            };
            if !wants {
                continue;
            }
            let node = &mut self.nodes[receiver];
            if node.loss.lose() {
                node.datagrams_lost += 1;
                continue;
            }
            self.counters.datagram_deliveries += 1;
            self.flush_member_to(receiver, seq)?;
            self.hand_over(receiver, index, datagram)?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn on_block_sampled(
        &mut self,
        group: usize,
        seq: u64,
        index: ProductIndex,
        offset: u32,
        end: u32,
        fingerprint: u64,
        datagram: &[u8],
        losers: &[usize],
    ) -> Result<(), Violation> {
        if !self.groups[group].run.continues(index, offset, seq) {
            // A break in the group's stream (a shared loss, or blocks of a product whose BOP
            // never came): nobody rides across it.
            for member in 0..self.groups[group].members.len() {
                let receiver = self.groups[group].members[member];
                if self.lanes[receiver].ride.rides() {
                    self.flush_member_to(receiver, seq)?;
                    self.attend(receiver);
                }
            }
            self.groups[group].run.reset(index, seq, offset);
        }
        self.groups[group].run.push(end, self.now, fingerprint, datagram.len() as u64);
        // Riders that lose it: their share ends before it. One whose state machine would only
        // note the gap (parity repair: the group's request waits for the multicast to pass it)
        // rides on from the next block and is visited when a block passes the group; the others
        // take the next datagram at once.
        let mut noted = std::mem::take(&mut self.noted);
        noted.clear();
        for &receiver in losers {
            if self.lanes[receiver].ride.rides() {
                self.flush_member_to(receiver, seq)?;
                match self.nodes[receiver].receiver.notes_gap(index, offset) {
                    Some(group_end) => {
                        self.lanes[receiver].ride = Ride::From(seq + 1);
                        noted.push((group_end, receiver));
                    }
                    None => self.attend(receiver),
                }
            }
        }
        // Members that lost the datagram before take this one at once (and ride from the next),
        // unless they lose it too.
        let attention = std::mem::take(&mut self.groups[group].attention);
        for receiver in attention {
            if losers.contains(&receiver) || self.lanes[receiver].ride != Ride::Attention {
                if self.lanes[receiver].ride == Ride::Attention {
                    self.groups[group].attention.push(receiver);
                }
                continue;
            }
            self.hand_over(receiver, index, datagram)?;
            self.lanes[receiver].ride = Ride::From(seq + 1);
        }
        // Riders waiting for the multicast to pass a block group (to ask for its parity) take
        // their share up to this block, which passes it, as it comes; those that lost it wait
        // for the next one.
        let mut passed = std::mem::take(&mut self.passed);
        while self.groups[group].waiting.any_due(end) {
            passed.clear();
            self.groups[group].waiting.take(end, &mut passed);
            for &(group_end, receiver) in &passed {
                if losers.contains(&receiver) {
                    noted.push((group_end, receiver));
                    continue;
                }
                self.lanes[receiver].waiting = None;
                if matches!(self.lanes[receiver].ride, Ride::From(_)) {
                    self.flush_member_to(receiver, seq + 1)?;
                }
            }
        }
        self.passed = passed;
        for &(group_end, receiver) in &noted {
            self.lanes[receiver].waiting = Some((index, group_end));
            self.groups[group].waiting.push(group_end, receiver);
        }
        self.noted = noted;
        Ok(())
    }

    /// A BOP reaches a group: every member's share of the run ends here. A member that may
    /// take the product whole ([`Simulation::takes_whole`]) is not visited: it rides from here
    /// with the BOP held for it; the others take the BOP at once (unless they lose it).
    fn on_bop_sampled(&mut self, group: usize, bop: HeldBop, losers: &[usize]) -> Result<(), Violation> {
        self.groups[group].attention.clear();
        self.groups[group].waiting.clear();
        let whole = self.groups[group].whole.is_some() && bop.size > 0;
        for member in 0..self.groups[group].members.len() {
            let receiver = self.groups[group].members[member];
            if !self.lanes[receiver].joined {
                continue;
            }
            // The previous product's run (with its held BOP, when its EOP never came).
            self.flush_member_to(receiver, bop.seq)?;
            let ride = if losers.contains(&receiver) {
                Ride::Attention
            } else if whole && self.takes_whole(receiver, bop.index, bop.size) {
                Ride::Whole(bop.seq + 1)
            } else {
                self.hand_over(receiver, bop.index, &bop.datagram)?;
                Ride::From(bop.seq + 1)
            };
            self.lanes[receiver].ride = ride;
            if ride == Ride::Attention {
                self.groups[group].attention.push(receiver);
            }
        }
        self.groups[group].run.reset(bop.index, bop.seq + 1, 0);
        self.groups[group].bop = Some(bop);
        Ok(())
    }

    /// An EOP reaches a group: members that took the product whole complete it together (one
    /// entry in the group's log, their RETX_ENDs as one event); everyone else's share of the
    /// run ends here and they take the EOP at once (unless they lose it).
    fn on_eop_sampled(
        &mut self,
        group: usize,
        seq: u64,
        index: ProductIndex,
        datagram: &[u8],
        losers: &[usize],
    ) -> Result<(), Violation> {
        self.groups[group].attention.clear();
        let entry = self.whole_product(group, seq, index, datagram.len())?;
        let number = self.groups[group].products.len() as u32;
        let mut completers = Vec::new();
        for member in 0..self.groups[group].members.len() {
            let receiver = self.groups[group].members[member];
            if !self.lanes[receiver].joined {
                continue;
            }
            let lost = losers.contains(&receiver);
            let lane = &mut self.lanes[receiver];
            if entry.is_some() && !lost && matches!(lane.ride, Ride::Whole(_)) {
                lane.whole = match lane.whole {
                    (from, to) if from == to => (number, number + 1),
                    (from, to) if to == number => (from, to + 1),
                    (from, to) => {
                        let what = format!("took product {index} whole out of turn (after entries {from}..{to})");
                        return Err(Violation::Receiver { receiver, what });
                    }
                };
                completers.push(receiver as u32);
            } else {
                self.flush_member_to(receiver, seq)?;
                if !lost {
                    self.hand_over(receiver, index, datagram)?;
                }
            }
            self.lanes[receiver].ride = Ride::Attention;
            self.groups[group].attention.push(receiver);
        }
        self.groups[group].run.clear();
        let Some(entry) = entry else { return Ok(()) };
        if completers.is_empty() {
            return Ok(());
        }
        if let Some(log) = &mut self.delivery_log {
            for &receiver in &completers {
                log.push(DeliveryRecord {
                    receiver: receiver as usize,
                    at: entry.completed_at,
                    latency: Duration::from_nanos(entry.latency_ns.max(0) as u64),
                    bytes: entry.size,
                    retransmitted_blocks: 0,
                });
            }
        }
        let delay = self.groups[group].whole.map_or(Duration::ZERO, |whole| whole.to_sender);
        let arrival = (entry.completed_at + delay).max(self.now);
        self.counters.whole_products += completers.len() as u64;
        self.groups[group].products.push(entry);
        self.queue.push(arrival, Event::WholeEnds { index, receivers: completers });
        Ok(())
    }

    /// The group's current product as a member that took it whole got it, checked as the ledger
    /// checks a delivery — or `None` when nobody can have (the run since its BOP is not the
    /// whole product, or its blocks came so far apart that a receive timer could have fired
    /// between them).
    fn whole_product(
        &self,
        group: usize,
        seq: u64,
        index: ProductIndex,
        eop_len: usize,
    ) -> Result<Option<WholeProduct>, Violation> {
        let group = &self.groups[group];
        let (Some(bop), Some(whole)) = (&group.bop, group.whole) else { return Ok(None) };
        if bop.index != index || group.run.first_seq != bop.seq + 1 || group.run.start != 0 {
            return Ok(None);
        }
        let Some((run, completed_at)) = group.run.share(bop.seq + 1, seq) else { return Ok(None) };
        if run.end != bop.size || u64::from(run.datagrams) != seq - bop.seq - 1 {
            return Ok(None);
        }
        let mut last = bop.at;
        for &at in &group.run.times {
            if at - last >= whole.gap_max {
                return Ok(None);
            }
            last = at;
        }
        let Some(metadata) = bop.metadata else { return Ok(None) };
        self.ledger.check_whole(index, bop.size, metadata, bop.start_time, run.fingerprint)?;
        Ok(Some(WholeProduct {
            index,
            size: bop.size,
            completed_at,
            // As the receiver reckons it (the simulator leaves its wall clock at the default).
            latency_ns: WallClock::default().wall_at(completed_at).signed_nanos_since(bop.start_time),
            datagrams: u64::from(run.datagrams) + 2,
            wire_bytes: run.wire_bytes + bop.datagram.len() as u64 + eop_len as u64,
        }))
    }

    /// Whether member `receiver` may take product `index` of `size` bytes whole: its state
    /// machine (as of its last visit, with the whole products since) allows it
    /// ([`Receiver::whole_product_room`](ldm7_fmtp_proto::Receiver::whole_product_room)) and has
    /// seen the product just before.
    fn takes_whole(&self, receiver: usize, index: ProductIndex, size: u32) -> bool {
        let lane = &self.lanes[receiver];
        let Some((seen, room)) = lane.room else { return false };
        let newest = match lane.whole {
            (from, to) if from < to => self.groups[lane.group as usize].products[to as usize - 1].index,
            _ => seen,
        };
        newest.next() == index && size <= room
    }
}
