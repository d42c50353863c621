//! Members riding their group's run: bringing a member's state machine up to date before it is
//! visited (whole products, the held BOP), and handing it datagrams and its share of the run.

use ldm7_fmtp_proto::ProductIndex;

use crate::ledger::Violation;

use super::{Ride, Simulation};

impl Simulation {
    /// Brings member `receiver`'s state machine up to date before it is visited: the whole
    /// products it took since its last visit
    /// ([`Receiver::took_whole_products`](ldm7_fmtp_proto::Receiver::took_whole_products), and
    /// the ledger settles them), then — if it is taking the current product whole — the held
    /// BOP, as of when it came (its ride goes on from there).
    pub(super) fn catch_up(&mut self, receiver: usize) -> Result<(), Violation> {
        let lane = &mut self.lanes[receiver];
        let (from, to) = lane.whole;
        let group = lane.group as usize;
        if from < to {
            lane.whole = (to, to);
            let entries = &self.groups[group].products[from as usize..to as usize];
            let newest = entries[entries.len() - 1].index;
            let (datagrams, bytes) = entries
                .iter()
                .fold((0, 0), |(datagrams, bytes), entry| (datagrams + entry.datagrams, bytes + entry.wire_bytes));
            self.nodes[receiver]
                .receiver
                .took_whole_products(newest, to - from, datagrams, bytes)
                .map_err(|e| Violation::Receiver { receiver, what: e.0 })?;
            for entry in entries {
                self.ledger.delivered_whole(receiver, entry.index, entry.latency_ns)?;
            }
        }
        if let Ride::Whole(from) = self.lanes[receiver].ride {
            self.lanes[receiver].ride = Ride::From(from);
            let Some(bop) = &self.groups[group].bop else {
                return Err(Violation::Receiver { receiver, what: "takes a product whole without its BOP".into() });
            };
            let (at, datagram) = (bop.at, bop.datagram.clone());
            self.nodes[receiver].receiver.handle_datagram(at, &datagram);
            self.drain_receiver_at(receiver, at)?;
        }
        Ok(())
    }

    /// Receiver `receiver` takes the next datagram at once. (A joined receiver is in its
    /// group's attention list exactly when its ride is [`Ride::Attention`].)
    pub(super) fn attend(&mut self, receiver: usize) {
        let lane = &mut self.lanes[receiver];
        if lane.ride != Ride::Attention {
            lane.ride = Ride::Attention;
            self.groups[lane.group as usize].attention.push(receiver);
        }
    }

    /// Hands receiver `receiver` a datagram now.
    pub(super) fn hand_over(&mut self, receiver: usize, index: ProductIndex, datagram: &[u8]) -> Result<(), Violation> {
        self.catch_up(receiver)?;
        self.ledger.contact(receiver, index);
        self.nodes[receiver].receiver.handle_datagram(self.now, datagram);
        self.drain_receiver(receiver)
    }

    /// Hands a riding receiver its share of its group's run before group datagram `to` (and
    /// first brings it up to date: [`Simulation::catch_up`]).
    ///
    /// A timer of the receiver that was due before the last of these blocks came (one set as of
    /// the held BOP that [`Simulation::catch_up`] just handed it, say) fires between the blocks
    /// that came before it and the others, as it would have: handed the run at once, the
    /// receiver would take its blocks as come after the timer.
    pub(super) fn flush_member_to(&mut self, receiver: usize, to: u64) -> Result<(), Violation> {
        if !self.lanes[receiver].ride.rides() {
            return Ok(());
        }
        self.catch_up(receiver)?;
        let Ride::From(mut from) = self.lanes[receiver].ride else { return Ok(()) };
        self.lanes[receiver].ride = Ride::From(to.max(from));
        let group = self.lanes[receiver].group as usize;
        let mut timers = true;
        while from < to {
            let due = if timers { self.nodes[receiver].receiver.poll_timeout() } else { None };
            let until = due.map_or(to, |due| self.groups[group].run.arrived_by(from, to, due));
            if until > from {
                if !self.hand_share(receiver, group, from, until)? {
                    break;
                }
                from = until;
                continue;
            }
            // Due before block `from` came (and after the blocks handed).
            let Some(due) = due else { break };
            let node = &mut self.nodes[receiver];
            node.receiver.handle_timeout(due);
            // A timer due again at once: the rest goes as one run.
            timers = node.receiver.poll_timeout().is_none_or(|next| next > due);
            self.drain_receiver_at(receiver, due)?;
        }
        Ok(())
    }

    /// Hands receiver `receiver` the blocks `[from, to)` of its group's run as one run, as of
    /// when the last came; whether there were any.
    fn hand_share(&mut self, receiver: usize, group: usize, from: u64, to: u64) -> Result<bool, Violation> {
        let Some((run, at)) = self.groups[group].run.share(from, to) else { return Ok(false) };
        let index = run.index;
        self.ledger.contact(receiver, index);
        let (nodes, ledger) = (&mut self.nodes, &self.ledger);
        nodes[receiver]
            .receiver
            .handle_block_run(at, &run, &mut |start, end| ledger.range_fingerprint(index, start, end));
        self.drain_receiver_at(receiver, at)?;
        Ok(true)
    }

    /// Hands a riding receiver the blocks it was not handed yet, as of when the last arrived
    /// (before anything else concerns it).
    pub(super) fn flush_run(&mut self, receiver: usize) -> Result<(), Violation> {
        let to = self.groups[self.lanes[receiver].group as usize].seq;
        self.flush_member_to(receiver, to)
    }

    /// [`Simulation::flush_run`] for every receiver; whether any had blocks to hand over (or a
    /// held BOP).
    pub(super) fn flush_runs(&mut self) -> Result<bool, Violation> {
        let mut any = false;
        for receiver in 0..self.nodes.len() {
            let lane = &self.lanes[receiver];
            let group = &self.groups[lane.group as usize];
            let pending = match lane.ride {
                Ride::From(from) => group.run.share(from, group.seq).is_some(),
                Ride::Whole(_) => true,
                Ride::Attention => false,
            };
            if pending {
                any = true;
                self.flush_run(receiver)?;
            }
        }
        Ok(any)
    }

    /// Brings every member's state machine and ledger up to date (the whole products they took
    /// since their last visit), before the checks at rest and the report.
    pub(super) fn catch_up_all(&mut self) -> Result<(), Violation> {
        for receiver in 0..self.nodes.len() {
            self.catch_up(receiver)?;
        }
        Ok(())
    }
}
