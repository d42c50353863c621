//! Draining the state machines: what the sender and the receivers emit (transmits, events,
//! timeouts) is checked and scheduled.

use std::rc::Rc;
use std::time::Duration;

use ldm7_fmtp_proto::{Destination, Instant, ProductIndex, ReceiverId, SenderEvent};
use ldm7_ldm_proto::downstream7::{FmtpReport, UpstreamRequest};

use crate::ledger::Violation;

use super::stream::{Request, schedule_requests};
use super::{DeliveryRecord, Event, Simulation};

impl Simulation {
    pub(super) fn drain_sender(&mut self) -> Result<(), Violation> {
        loop {
            loop {
                self.buf.clear();
                let Some(transmit) = self.sender.poll_transmit(self.now, &mut self.buf) else { break };
                if transmit.len != self.buf.len() {
                    return Err(Violation::Sender(format!(
                        "transmit of {} bytes wrote {}",
                        transmit.len,
                        self.buf.len()
                    )));
                }
                match transmit.destination {
                    Destination::Multicast => self.on_multicast_transmit()?,
                    Destination::Receiver(id) => self.on_repair_transmit(id)?,
                }
            }
            while let Some(event) = self.sender.poll_event() {
                self.ledger.sender_event(&event)?;
                if let SenderEvent::BoundHit { .. } = event {
                    self.counters.sender_bound_hits += 1;
                }
            }
            let fed = self.feed_backlog()? | self.feed_held()?;
            if !fed {
                break;
            }
        }
        if self.sender.retained_products() > self.retained_products_max {
            return Err(Violation::Sender(format!("retains {} products", self.sender.retained_products())));
        }
        if self.sender.queued_products() > self.queued_products_max {
            return Err(Violation::Sender(format!("queues {} products", self.sender.queued_products())));
        }
        if !self.liveness_scheduled
            && self.next_arrival == self.workload.products.len()
            && self.backlog.is_empty()
            && self.sender.queued_products() == 0
        {
            self.liveness_scheduled = true;
            self.queue.push(self.now + self.liveness.delay, Event::Liveness);
        }
        if let Some(at) = self.sender.poll_timeout() {
            let at = at.max(self.now);
            if self.sender_wake.is_none_or(|wake| at < wake) {
                self.sender_wake = Some(at);
                self.queue.push(at, Event::SenderWake);
            }
        }
        Ok(())
    }

    fn on_multicast_transmit(&mut self) -> Result<(), Violation> {
        self.ledger.check_multicast(self.now, &self.buf)?;
        self.counters.multicast_datagrams += 1;
        if let Some(uplink) = &mut self.repair_uplink {
            uplink.multicast(self.now, self.buf.len());
        }
        if self.shared_loss.lose() {
            self.counters.multicast_lost_shared += 1;
            return Ok(());
        }
        let departure = match &mut self.bottleneck {
            Some(link) => match link.admit(self.now, self.buf.len(), !self.healed) {
                Some(departure) => departure,
                None => {
                    self.counters.multicast_lost_shared += 1;
                    return Ok(());
                }
            },
            None => self.now,
        };
        let datagram: Rc<[u8]> = Rc::from(&self.buf[..]);
        for (position, group) in self.groups.iter_mut().enumerate() {
            if group.joined == 0 {
                continue;
            }
            let jitter = if group.jitter.is_zero() {
                Duration::ZERO
            } else {
                Duration::from_nanos(self.jitter_rng.below(group.jitter.as_nanos() as u64 + 1))
            };
            let arrival = (departure + group.delay + jitter).max(group.last_arrival);
            group.last_arrival = arrival;
            self.queue.push(arrival, Event::Multicast { group: position, datagram: datagram.clone() });
        }
        Ok(())
    }

    fn on_repair_transmit(&mut self, id: ReceiverId) -> Result<(), Violation> {
        self.ledger.check_repair(&self.buf)?;
        let receiver = (id.0 & 0xffff_ffff) as usize;
        let node = self
            .nodes
            .get_mut(receiver)
            .filter(|node| node.id == id && node.connected)
            .ok_or_else(|| Violation::Sender(format!("repair for {id}, which is not connected")))?;
        let ready = match &mut self.repair_uplink {
            Some(uplink) => uplink.pass(self.now, self.buf.len()),
            None => self.now,
        };
        let arrival = node.to_receiver.send_after(self.now, ready, self.buf.len());
        let generation = node.to_receiver.generation;
        self.queue.push(arrival, Event::ToReceiver { receiver, generation, frame: self.buf.clone() });
        if let Err(at) = node.to_receiver.writable(self.now) {
            self.sender.set_writable(id, false);
            self.queue.push(at.max(self.now), Event::Writable { receiver, generation });
        }
        Ok(())
    }

    #[inline]
    pub(super) fn drain_receiver(&mut self, receiver: usize) -> Result<(), Violation> {
        self.drain_receiver_at(receiver, self.now)
    }

    /// Takes what receiver `receiver` has to send and report, as of `at` (`now`, or when the
    /// last block of a run it was just handed arrived).
    pub(super) fn drain_receiver_at(&mut self, receiver: usize, at: Instant) -> Result<(), Violation> {
        let node = &mut self.nodes[receiver];
        if node.connected {
            while let Some(message) = node.receiver.poll_transmit() {
                let request = Request::encode(receiver, &message)?;
                let arrival = node.to_sender.send(at, request.frame().len()).max(self.now);
                let generation = node.to_sender.generation;
                // Messages that arrive at the same instant go as one event (members that lost
                // the same datagram, or finished a product together, ask or end at once).
                if arrival != self.requests_at {
                    schedule_requests(&mut self.queue, &mut self.requests, self.requests_at);
                    self.requests_at = arrival;
                }
                // Receiver positions are < 2³² (checked at construction).
                self.requests.push((receiver as u32, generation, request));
            }
        }
        while let Some(event) = node.receiver.poll_event() {
            if let Some(subscriber) = &mut node.subscriber {
                subscriber.fmtp(at, fmtp_report(&event), None);
                while let Some(decision) = subscriber.poll_decision() {
                    // The backstop: REQUEST_PRODUCT answered a round trip plus the product's
                    // transfer later. Backlog and fence requests concern restarts (none here).
                    if let UpstreamRequest::RequestProduct(index) = decision {
                        let index = ProductIndex(index);
                        let bytes = u64::from(self.ledger.size_of(index).unwrap_or(0));
                        let rate = self.backstop.map_or(u64::MAX, |backstop| backstop.rate_bits_per_s.max(1));
                        let transfer = Duration::from_secs_f64(bytes as f64 * 8.0 / rate as f64);
                        self.queue.push(at.max(self.now) + node.rtt + transfer, Event::Backstop { receiver, index });
                        self.counters.backstop_requests += 1;
                    } else {
                        self.counters.backlog_requests += 1;
                    }
                }
            }
            if let (Some(log), ldm7_fmtp_proto::ReceiverEvent::Delivered(delivery)) = (&mut self.delivery_log, &event) {
                log.push(DeliveryRecord {
                    receiver,
                    at,
                    latency: Duration::from_nanos(delivery.latency_ns.max(0) as u64),
                    bytes: self.ledger.size_of(delivery.index).unwrap_or(0),
                    retransmitted_blocks: delivery.retransmitted_blocks,
                });
            }
            self.ledger.receiver_event(receiver, event)?;
        }
        let lane = &mut self.lanes[receiver];
        lane.oldest = node.receiver.oldest_in_flight();
        lane.room = node.receiver.whole_product_room();
        if let Some((index, offset)) = node.receiver.parity_waiting() {
            let group = &mut self.groups[lane.group as usize];
            if lane.waiting != Some((index, offset)) && group.bop.as_ref().is_some_and(|bop| bop.index == index) {
                lane.waiting = Some((index, offset));
                group.waiting.push(offset, receiver);
            }
        }
        if node.receiver.in_flight_products() > node.in_flight_products_max
            || node.receiver.in_flight_bytes() > node.in_flight_bytes_max
        {
            let what = format!(
                "holds {} products, {} bytes, over its bounds",
                node.receiver.in_flight_products(),
                node.receiver.in_flight_bytes()
            );
            return Err(Violation::Receiver { receiver, what });
        }
        if let Some(at) = node.receiver.poll_timeout() {
            let at = at.max(self.now);
            if node.wake.is_none_or(|wake| at < wake) {
                node.wake = Some(at);
                self.queue.push(at, Event::ReceiverWake { receiver });
            }
        }
        Ok(())
    }
}

/// An FMTP receiver's event as the LDM-7 subscriber's decisions see it (as the server's driver
/// reports its receiver's notices).
fn fmtp_report(event: &ldm7_fmtp_proto::ReceiverEvent) -> FmtpReport {
    use ldm7_fmtp_proto::ReceiverEvent;
    match event {
        ReceiverEvent::Delivered(delivery) => {
            let signature = delivery.metadata.get(..16).and_then(|bytes| <[u8; 16]>::try_from(bytes).ok());
            FmtpReport::Delivered(delivery.index.0, signature.map(ldm7_types::Signature))
        }
        ReceiverEvent::Started { index } => FmtpReport::Started(index.0),
        ReceiverEvent::Missed { index, .. } => FmtpReport::Missed(index.0),
        ReceiverEvent::IndexGap { first, last } => FmtpReport::IndexGap(first.0, last.0),
        ReceiverEvent::BoundHit { .. } => FmtpReport::Other,
    }
}
