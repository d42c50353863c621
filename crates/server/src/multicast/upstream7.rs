//! The upstream LDM-7 of one connection (ldm7-multicast.md §2.2–§2.4): the sans-IO
//! [`Publisher`] session driven over the connection's blocking socket, in the connection's
//! thread. It answers the SUBSCRIBE through the [`Multicaster`](super::Multicaster), answers
//! REQUEST_PRODUCT from the queue through the feed's product-index map (the backstop), and
//! streams the backlog of a REQUEST_BACKLOG from the queue while the session is ready, reading
//! the socket between batches so that the subscriber's requests and heartbeats keep flowing.
//! A subscriber's backlog fence (a request for an index not multicast yet) is answered once no
//! backlog is being sent, after END_BACKLOG; the other requests are answered meanwhile.
//!
//! Log lines (§5): NOTE `Incoming subscription request from <host> for feed <feed>`, the
//! decision; INFO (per product, `-v`) `Missed product sent: index=<n>, info="…"` and
//! `Backlog product sent: …`; NOTE when the backlog is complete and when the session ends.

use std::collections::VecDeque;
use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ldm7_io::Clock;
use ldm7_io::log_target::PRODUCT;
use ldm7_ldm_proto::{
    BacklogSpec, Inbound, InboundEvent, McastProdIndex, Publisher, PublisherEvent, SessionError, SubscriptionReply,
    UpstreamEvent,
};
use ldm7_types::{Signature, Timestamp};

use super::publisher::Subscription;
use crate::Shared;
use crate::access::PeerHost;
use crate::conn::ConnectionError;
use crate::wait::{Input, wait_input_or_stop};

/// How long the thread waits for input when it has nothing else to do (it answers fences, the
/// backstop requests for products not yet multicast, this often; a stop wakes it at once).
const IDLE_WAIT: Duration = Duration::from_millis(250);
/// How long it waits for input between batches of work.
const BUSY_WAIT: Duration = Duration::from_millis(1);
/// Products sent under one read transaction.
const BATCH_MAX: usize = 64;

/// A backlog being sent: from `position` on, products of the subscription's feed, up to the
/// product whose signature is `before` (not sent) or the newest product when it was asked.
struct Backlog {
    position: Timestamp,
    end: Timestamp,
    before: Signature,
    sent: u64,
}

/// Serves an LDM-7 connection until it closes or the server stops.
pub(crate) fn serve(
    shared: &Shared,
    mut stream: TcpStream,
    peer: &PeerHost,
    mut inbound: Inbound,
    mut buf: Vec<u8>,
) -> Result<(), ConnectionError> {
    let mut out = Vec::with_capacity(1 << 20);
    let mut subscription: Option<Subscription> = None;
    let mut requests: VecDeque<McastProdIndex> = VecDeque::new();
    let mut backlog: Option<Backlog> = None;
    let result = loop {
        let mut ended = None;
        while let Some(event) = inbound.poll_event() {
            let Some(publisher) = inbound.publisher() else { break };
            match event {
                InboundEvent::Ldm6(UpstreamEvent::Unserved(call))
                | InboundEvent::Ldm7(PublisherEvent::Unserved(call)) => {
                    shared.counters.unserved_calls.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("{peer}: {call}; answered as RPC does");
                }
                InboundEvent::Ldm6(other) => tracing::debug!("{peer}: LDM-6 event before LDM-7: {other:?}"),
                InboundEvent::Ldm7(PublisherEvent::Subscribe { feed, vc_end, offer }) => {
                    tracing::info!("Incoming subscription request from {peer} for feed {feed}");
                    let config = shared.config();
                    match shared.multicaster.subscribe(&config, peer, feed, &vc_end, offer) {
                        Ok(admitted) => {
                            let info = &admitted.info;
                            tracing::info!(
                                "{peer}: subscribed to {}: group {}, FMTP server {}, address {}",
                                info.mcast_info.feed,
                                info.mcast_info.group,
                                info.mcast_info.server,
                                info.fmtp_addr
                            );
                            publisher.answer_subscribe(Clock::now(), SubscriptionReply::Ok(info.clone()))?;
                            subscription = Some(admitted);
                        }
                        Err(refusal) => {
                            tracing::warn!("{peer}: subscription to {feed} refused ({}): {refusal}", refusal.status());
                            publisher.answer_subscribe(Clock::now(), SubscriptionReply::Refused(refusal.status()))?;
                        }
                    }
                }
                InboundEvent::Ldm7(PublisherEvent::RequestProduct { index }) => {
                    let fence = subscription
                        .as_ref()
                        .is_some_and(|s| shared.multicaster.is_fence(s, ldm7_fmtp_proto::ProductIndex(index)));
                    if fence {
                        publisher.set_aside_fence(index)?;
                    } else {
                        requests.push_back(index);
                    }
                }
                InboundEvent::Ldm7(PublisherEvent::RequestBacklog { spec }) => {
                    if backlog.is_some() {
                        tracing::warn!("{peer}: a new REQUEST_BACKLOG replaces the one being sent");
                    }
                    let cutoff = subscription.as_ref().and_then(|s| shared.multicaster.backlog_cutoff(s));
                    backlog = Some(start_backlog(shared, &spec, cutoff));
                }
                InboundEvent::Ldm7(PublisherEvent::TestConnection) => tracing::debug!("{peer}: TEST_CONNECTION"),
                InboundEvent::Ldm7(PublisherEvent::Closed(result)) => {
                    if let Err(SessionError::Malformed(_)) = &result {
                        shared.counters.malformed.fetch_add(1, Ordering::Relaxed);
                    }
                    ended = Some(result);
                }
            }
        }
        if let (Some(publisher), Some(subscription)) = (inbound.publisher(), &subscription) {
            answer_requests(shared, publisher, subscription, &mut requests)?;
            if let Some(current) = &mut backlog
                && send_backlog(shared, publisher, subscription, current)?
            {
                tracing::info!("{peer}: backlog of {} products sent", current.sent);
                publisher.end_backlog(Clock::now())?;
                backlog = None;
            }
            if backlog.is_none() {
                publisher.answer_fences(Clock::now())?;
            }
        }
        inbound.take_output(&mut out);
        if !out.is_empty() {
            stream.write_all(&out).map_err(ConnectionError::Write)?;
            out.clear();
        }
        if let Some(result) = ended {
            break result.map_err(ConnectionError::from);
        }
        if shared.is_stopping() {
            break Ok(());
        }
        let busy = !requests.is_empty() || backlog.is_some();
        let longest = if busy { BUSY_WAIT } else { IDLE_WAIT };
        match wait_input_or_stop(&mut stream, &mut buf, inbound.poll_timeout(), Some(longest), &shared.stop) {
            Ok(Input::Bytes(n)) => inbound.handle_input(Clock::now(), &buf[..n]),
            Ok(Input::Timeout) => inbound.handle_timeout(Clock::now()),
            Ok(Input::Eof) => inbound.handle_eof(),
            Ok(Input::Stopped) => break Ok(()),
            Err(error) => {
                tracing::debug!("{peer}: read: {error}");
                inbound.handle_eof();
            }
        }
    };
    if let Some(subscription) = subscription {
        tracing::info!("{peer}: subscription to {} ended", subscription.feedtype());
    }
    result
}

/// Answers product requests in order while the session can take more output.
fn answer_requests(
    shared: &Shared,
    publisher: &mut Publisher,
    subscription: &Subscription,
    requests: &mut VecDeque<McastProdIndex>,
) -> Result<(), ConnectionError> {
    let counters = shared.multicaster.counters();
    while publisher.ready() {
        let Some(&index) = requests.front() else { break };
        let signature = shared.multicaster.signature_of(subscription, ldm7_fmtp_proto::ProductIndex(index));
        let snapshot = shared.queue.snapshot().map_err(ConnectionError::Queue)?;
        let found = match signature {
            Some(signature) => snapshot.product_by_signature(&signature).map_err(ConnectionError::Queue)?,
            None => None,
        };
        match found {
            Some(product) => {
                publisher.deliver_missed_product(Clock::now(), index, &product.info, product.data)?;
                counters.missed_products_sent.fetch_add(1, Ordering::Relaxed);
                tracing::info!(target: PRODUCT, "Missed product sent: index={index}, info=\"{}\"", product.info);
            }
            None => {
                publisher.no_such_product(Clock::now(), index)?;
                counters.no_such_products.fetch_add(1, Ordering::Relaxed);
                tracing::info!("Requested product {index} is not in the queue (no such product)");
            }
        }
        requests.pop_front();
    }
    Ok(())
}

/// Where a backlog starts and ends (§2.4): just after `after` if the queue has it, else
/// `time_offset` before now; up to `before` or the newest product now, and never past `cutoff`
/// (the feed's products after it are on their way by multicast: an ldm7 addition, so that a
/// subscriber asking just as a product is inserted does not get it twice).
fn start_backlog(shared: &Shared, spec: &BacklogSpec, cutoff: Option<Timestamp>) -> Backlog {
    let now = Timestamp::from_system_time(std::time::SystemTime::now());
    let (position, end) = match shared.queue.snapshot() {
        Ok(snapshot) => {
            let (position, end) = backlog_bounds(&snapshot, spec, now);
            (position, cutoff.map_or(end, |cutoff| end.min(cutoff)))
        }
        Err(error) => {
            tracing::error!("reading the queue for a backlog: {error}");
            (now.saturating_sub(spec.time_offset()), now)
        }
    };
    Backlog { position, end, before: spec.before, sent: 0 }
}

/// The insertion times a backlog covers, both inclusive: from just after `after` (or
/// `time_offset` before `now`) to the newest product, but never to `before` or past it when the
/// queue has it. A `before` older than the start (a subscriber whose first product took longer
/// than `time_offset` to resolve) makes the backlog empty: everything after it is the session's
/// own, on its way by FMTP, and would otherwise come twice, the backlog's copy first.
fn backlog_bounds(snapshot: &ldm7_pq::Snapshot<'_>, spec: &BacklogSpec, now: Timestamp) -> (Timestamp, Timestamp) {
    let after = spec.after().and_then(|after| snapshot.product_by_signature(&after).ok().flatten());
    let position = after
        .map(|product| Timestamp::from_unix_micros(product.insertion.as_unix_micros() + 1))
        .unwrap_or_else(|| now.saturating_sub(spec.time_offset()));
    let newest = snapshot.products_before_reversed(Timestamp::END).ok().and_then(|mut products| products.next());
    let mut end = newest.and_then(Result::ok).map_or(now, |product| product.insertion);
    if let Some(before) = snapshot.product_by_signature(&spec.before).ok().flatten() {
        end = end.min(Timestamp::from_unix_micros(before.insertion.as_unix_micros() - 1));
    }
    (position, end)
}

/// Sends backlog products while the session is ready; returns whether the backlog is complete.
fn send_backlog(
    shared: &Shared,
    publisher: &mut Publisher,
    subscription: &Subscription,
    backlog: &mut Backlog,
) -> Result<bool, ConnectionError> {
    let counters = shared.multicaster.counters();
    let feedtype = subscription.feedtype();
    if !publisher.ready() {
        return Ok(false);
    }
    let snapshot = shared.queue.snapshot().map_err(ConnectionError::Queue)?;
    let mut batch = 0;
    for product in snapshot.products_from(backlog.position).map_err(ConnectionError::Queue)? {
        let product = product.map_err(ConnectionError::Queue)?;
        if product.insertion > backlog.end || product.info.signature == backlog.before {
            return Ok(true);
        }
        backlog.position = Timestamp::from_unix_micros(product.insertion.as_unix_micros() + 1);
        if super::goes_out_on(feedtype, &product.info) && subscription.filter.allows(&product.info) {
            publisher.deliver_backlog_product(Clock::now(), &product.info, product.data)?;
            backlog.sent += 1;
            batch += 1;
            counters.backlog_products_sent.fetch_add(1, Ordering::Relaxed);
            tracing::info!(target: PRODUCT, "Backlog product sent: {}", product.info);
        }
        if !publisher.ready() || batch >= BATCH_MAX {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use ldm7_pq::{Capacity, Queue};
    use ldm7_types::{FeedType, ProdInfo};

    use super::*;

    const SECOND: i64 = 1_000_000;

    /// A queue holding products 0..5 inserted one second apart from `start`; their signatures.
    fn queue_of_five(dir: &std::path::Path, start: i64) -> (Queue, Vec<Signature>) {
        let queue = Queue::create(&dir.join("q"), Capacity { bytes: 1 << 20, slots: 100 }, false).expect("queue");
        let signatures = (0..5)
            .map(|k| {
                let data = vec![k as u8; 100];
                let info = ProdInfo {
                    arrival: Timestamp::from_unix_micros(start),
                    signature: Signature::md5_of(&data),
                    origin: "origin".into(),
                    feedtype: FeedType::NGRID,
                    seqno: k,
                    ident: format!("product {k}"),
                    size: 100,
                };
                let at = Timestamp::from_unix_micros(start + i64::from(k) * SECOND);
                queue.insert_at(at, &info, &data).expect("insert");
                info.signature
            })
            .collect();
        (queue, signatures)
    }

    fn spec(after: Option<Signature>, before: Signature, time_offset_secs: u32) -> BacklogSpec {
        BacklogSpec {
            after: after.unwrap_or(Signature([0; 16])),
            after_is_set: after.is_some(),
            before,
            time_offset_secs,
        }
    }

    #[test]
    fn a_backlog_ends_before_its_first_product_even_one_older_than_its_time_offset() {
        let dir = tempfile::tempdir().expect("tempdir");
        let start = 1_800_000_000 * SECOND;
        let (queue, signatures) = queue_of_five(dir.path(), start);
        let snapshot = queue.snapshot().expect("snapshot");
        let at = |k: i64| Timestamp::from_unix_micros(start + k * SECOND);
        let just_before = |k: i64| Timestamp::from_unix_micros(start + k * SECOND - 1);
        let now = at(5);
        // From 2.5 s back up to product 4 (not sent): product 3 only.
        let (position, end) = backlog_bounds(&snapshot, &spec(None, signatures[4], 2), now);
        assert_eq!((position, end), (at(3), just_before(4)));
        // The session's first product (1) is older than the offset's start (3 s back = 2): the
        // backlog is empty, not products 2..=4, which the session has by FMTP.
        let (position, end) = backlog_bounds(&snapshot, &spec(None, signatures[1], 3), now);
        assert!(end < position, "{position:?}..={end:?} is empty");
        // After product 0 up to product 3: products 1 and 2.
        let (position, end) = backlog_bounds(&snapshot, &spec(Some(signatures[0]), signatures[3], 1), now);
        assert_eq!((position, end), (Timestamp::from_unix_micros(start + 1), just_before(3)));
        // A `before` the queue does not have: up to the newest product.
        let (_, end) = backlog_bounds(&snapshot, &spec(None, Signature([7; 16]), 10), now);
        assert_eq!(end, at(4));
    }
}
