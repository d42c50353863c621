//! Stream messages from receivers to the sender: encoded inline ([`Request`]), batched per
//! arrival instant, held back under the sender's backpressure, and the RETX_ENDs of members that
//! took a product whole.

use ldm7_fmtp_proto::wire::{Body, Message};
use ldm7_fmtp_proto::{Instant, ProductIndex};

use crate::ledger::Violation;
use crate::queue::EventQueue;

use super::{Event, Simulation};

impl Simulation {
    /// A stream message from receiver `receiver` reaches the sender (on its connection of
    /// generation `generation`); whether the sender took it (the caller then lets it send).
    pub(super) fn on_request(&mut self, receiver: usize, generation: u32, request: Request) -> Result<bool, Violation> {
        if generation != self.nodes[receiver].to_sender.generation {
            self.counters.stream_lost_in_reset += 1;
            return Ok(false);
        }
        self.pass_request(receiver, request)
    }

    /// Hands the sender a stream message that reached it from receiver `receiver`, unless the
    /// connection is down or backpressure holds it back (behind what it holds already); whether
    /// the sender took it.
    fn pass_request(&mut self, receiver: usize, request: Request) -> Result<bool, Violation> {
        let node = &mut self.nodes[receiver];
        if !node.connected {
            self.counters.stream_lost_in_reset += 1;
            return Ok(false);
        }
        if !node.held.is_empty() || !self.sender.accepts_stream(node.id) {
            // TCP backpressure: the sender stops reading this connection.
            if node.held.is_empty() {
                self.held_nodes.push(receiver);
            }
            node.held.push_back(request);
            return Ok(false);
        }
        self.sender
            .handle_stream_frame(self.now, node.id, request.frame())
            .map_err(|e| Violation::Receiver { receiver, what: format!("sent a malformed frame: {e}") })?;
        Ok(true)
    }

    /// Schedules the stream messages to the sender that arrive at one instant as one event.
    pub(super) fn flush_requests(&mut self) {
        schedule_requests(&mut self.queue, &mut self.requests, self.requests_at);
    }

    /// The RETX_ENDs of members that took a product whole reach the sender (each as if on its
    /// own connection), then the sender sends what it has to (a RETX_END changes no
    /// transmission that the others could come before, but a release).
    pub(super) fn on_whole_ends(&mut self, index: ProductIndex, receivers: &[u32]) -> Result<(), Violation> {
        let Some(&first) = receivers.first() else { return Ok(()) };
        let request = Request::encode(first as usize, &Message { index, body: Body::RetxEnd })?;
        for &receiver in receivers {
            self.pass_request(receiver as usize, request)?;
        }
        self.drain_sender()
    }

    /// Hands the sender stream messages it held back, while it accepts them; returns whether
    /// any was.
    pub(super) fn feed_held(&mut self) -> Result<bool, Violation> {
        let mut fed = false;
        let mut k = 0;
        while k < self.held_nodes.len() {
            let receiver = self.held_nodes[k];
            let node = &mut self.nodes[receiver];
            while self.sender.accepts_stream(node.id) {
                let Some(request) = node.held.pop_front() else { break };
                self.sender
                    .handle_stream_frame(self.now, node.id, request.frame())
                    .map_err(|e| Violation::Receiver { receiver, what: format!("sent a malformed frame: {e}") })?;
                fed = true;
            }
            if node.held.is_empty() {
                self.held_nodes.swap_remove(k);
            } else {
                k += 1;
            }
        }
        Ok(fed)
    }
}

/// Schedules `requests` (stream messages to the sender that arrive at `at`, in the order they
/// were sent), if any, as one event.
pub(super) fn schedule_requests(queue: &mut EventQueue<Event>, requests: &mut Vec<(u32, u32, Request)>, at: Instant) {
    if !requests.is_empty() {
        queue.push(at, Event::ToSender { requests: std::mem::take(requests) });
    }
}

/// A stream message from a receiver, encoded, kept inline (a receiver's messages are requests
/// and RETX_ENDs: a header and a few bytes; millions of them would otherwise be as many
/// allocations).
#[derive(Clone, Copy)]
pub(super) struct Request {
    len: u8,
    bytes: [u8; Request::LEN_MAX],
}

impl Request {
    const LEN_MAX: usize = 24;

    pub(super) fn encode(receiver: usize, message: &Message<'_>) -> Result<Self, Violation> {
        let mut request = Self { len: 0, bytes: [0; Self::LEN_MAX] };
        let len = message.buffer_len();
        if len > Self::LEN_MAX {
            return Err(Violation::Receiver {
                receiver,
                what: format!("sent a {len}-byte stream message: {message:?}"),
            });
        }
        message
            .emit(&mut request.bytes[..len])
            .map_err(|e| Violation::Receiver { receiver, what: format!("cannot emit {message:?}: {e}") })?;
        // ≤ LEN_MAX.
        request.len = len as u8;
        Ok(request)
    }

    pub(super) fn frame(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}
