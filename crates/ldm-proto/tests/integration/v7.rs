//! LDM-7 session tests (ldm7-multicast.md §2): a [`Subscriber`] and a [`Publisher`] talk
//! through byte buffers in virtual time — subscription accepted and refused, missed products
//! answered in request order, NO_SUCH_PRODUCT, an unexpected delivery dropped, a backlog
//! streamed under backpressure with END_BACKLOG, heartbeats at 30 s and 60 s, malformed and
//! unserved records; the [`Inbound`] dispatcher; and the records against the real capture
//! `captures/fmtp-ldm7.txt` (same layout, byte for byte except our own xids).

use std::net::Ipv4Addr;
use std::time::Duration;

use ldm7_ldm_proto::{
    BacklogSpec, CidrAddr, HEARD_NOTHING_LIMIT, Inbound, InboundEvent, Ldm7Status, McastInfo, McastSubInfo,
    OUTPUT_HIGH_WATER, ParityAnswer, Publisher, PublisherEvent, SessionError, SubscribeAnswer, SubscribeOffer,
    Subscriber, SubscriberConfig, SubscriberEvent, SubscriptionReply, Upstream, UpstreamEvent, VcEndPoint,
};
use ldm7_testkit::capture_streams;
use ldm7_types::{FeedType, Instant, ProdInfo, Signature, Timestamp};
use ldm7_xdr::ldm7::{self, AcceptStat, Call, Ldm7Call, Message, ReplyBody};
use ldm7_xdr::rpc::RecordReader;

const CAPTURE: &str = "captures/fmtp-ldm7.txt";

fn start() -> Instant {
    Instant::from_nanos(1_000_000_000)
}

fn product(n: u32, size: usize) -> (ProdInfo, Vec<u8>) {
    let data: Vec<u8> = (0..size).map(|k| (k as u32).wrapping_mul(31).wrapping_add(n) as u8).collect();
    let info = ProdInfo {
        arrival: Timestamp { secs: 1_795_338_479, micros: n as i32 },
        signature: Signature::md5_of(&data),
        origin: "vm".into(),
        feedtype: FeedType::EXP,
        seqno: n,
        ident: format!("TEST/cap.{n}"),
        size: size as u32,
    };
    (info, data)
}

fn sub_info(server: &str) -> McastSubInfo {
    McastSubInfo {
        mcast_info: McastInfo { feed: FeedType::ANY, group: "224.0.55.1:38801".into(), server: server.into() },
        fmtp_addr: CidrAddr { addr: Ipv4Addr::new(10, 77, 0, 2), prefix_len: 32 },
        answer: None,
    }
}

/// Moves bytes both ways until neither side has output.
fn pump(now: Instant, down: &mut Subscriber, up: &mut Publisher) {
    loop {
        let mut bytes = Vec::new();
        down.take_output(&mut bytes);
        let from_down = !bytes.is_empty();
        up.handle_input(now, &bytes);
        let mut back = Vec::new();
        up.take_output(&mut back);
        down.handle_input(now, &back);
        if !from_down && back.is_empty() {
            return;
        }
    }
}

/// A subscriber and a publisher past an accepted SUBSCRIBE.
fn subscribed(now: Instant) -> (Subscriber, Publisher) {
    let mut config = SubscriberConfig::new(FeedType::ANY);
    config.upstream_host = Some("10.77.0.1".into());
    let mut down = Subscriber::new(now, config);
    let mut up = Publisher::new(now);
    pump(now, &mut down, &mut up);
    match up.poll_event() {
        Some(PublisherEvent::Subscribe { feed, vc_end, offer }) => {
            assert_eq!(feed, FeedType::ANY);
            assert_eq!(vc_end, VcEndPoint::unused());
            assert_eq!(offer, None);
        }
        other => panic!("{other:?}"),
    }
    assert!(!up.ready(), "not subscribed before the answer");
    up.answer_subscribe(now, SubscriptionReply::Ok(sub_info("0.0.0.0:42263"))).unwrap();
    pump(now, &mut down, &mut up);
    match down.poll_event() {
        // §2.2 step 3: the unspecified server host becomes the upstream host.
        Some(SubscriberEvent::Subscribed { info }) => assert_eq!(info, sub_info("10.77.0.1:42263")),
        other => panic!("{other:?}"),
    }
    assert!(up.ready());
    (down, up)
}

#[test]
fn an_offer_gets_the_publishers_answer_and_only_an_offer_does() {
    let now = start();
    let parity = ParityAnswer { group_blocks: 256, shards: 16, port: 38801 };
    for (offer, given, expected) in [
        // An ldm7 subscriber offering parity, a publisher granting it.
        (
            Some(SubscribeOffer { parity: true }),
            Some(SubscribeAnswer { parity: Some(parity), address6: None }),
            Some(Some(parity)),
        ),
        // A publisher declining (parity = "off"): the subscriber still learns it talks to ldm7.
        (Some(SubscribeOffer { parity: true }), None, Some(None)),
        // A subscriber not offering (the reference's SUBSCRIBE): the reference's reply.
        (None, Some(SubscribeAnswer { parity: Some(parity), address6: None }), None),
    ] {
        let mut config = SubscriberConfig::new(FeedType::ANY);
        config.offer = offer;
        let mut down = Subscriber::new(now, config);
        let mut up = Publisher::new(now);
        pump(now, &mut down, &mut up);
        match up.poll_event() {
            Some(PublisherEvent::Subscribe { offer: seen, .. }) => assert_eq!(seen, offer),
            other => panic!("{other:?}"),
        }
        let info = McastSubInfo { answer: given, ..sub_info("10.77.0.1:42263") };
        up.answer_subscribe(now, SubscriptionReply::Ok(info)).unwrap();
        pump(now, &mut down, &mut up);
        match down.poll_event() {
            Some(SubscriberEvent::Subscribed { info }) => {
                assert_eq!(info.answer.map(|answer| answer.parity), expected, "{offer:?} {given:?}");
            }
            other => panic!("{other:?}"),
        }
    }
}

/// Splits a byte stream into records (the bytes after each record mark).
fn records(stream: &[u8]) -> Vec<Vec<u8>> {
    let mut reader = RecordReader::new(1 << 30);
    reader.push(stream);
    let mut records = Vec::new();
    while let Some(record) = reader.next_record().expect("valid record marking") {
        records.push(record.to_vec());
    }
    assert_eq!(reader.pending(), 0);
    records
}

fn decode(record: &[u8]) -> Message {
    ldm7::decode_message(record.to_vec(), |_| Some(ldm7::Proc::Subscribe)).expect("a v7 record")
}

/// `record` with its xid (the first word) replaced.
fn with_xid(record: &[u8], xid: u32) -> Vec<u8> {
    let mut record = record.to_vec();
    record[..4].copy_from_slice(&xid.to_be_bytes());
    record
}

fn xid_of(record: &[u8]) -> u32 {
    u32::from_be_bytes([record[0], record[1], record[2], record[3]])
}

#[test]
fn missed_products_are_answered_in_request_order() {
    let now = start();
    let (mut down, mut up) = subscribed(now);
    for index in [5, 6, 7] {
        assert!(down.request_product(now, index).unwrap());
    }
    pump(now, &mut down, &mut up);
    for index in [5, 6, 7] {
        assert!(matches!(up.poll_event(), Some(PublisherEvent::RequestProduct { index: got }) if got == index));
    }
    assert_eq!(up.requested().collect::<Vec<_>>(), [5, 6, 7]);
    let (first, first_data) = product(5, 3000);
    let (third, third_data) = product(7, 11);
    // Out of order is refused here: the downstream would drop it (§2.3).
    assert!(matches!(up.no_such_product(now, 6), Err(SessionError::Usage(_))));
    up.deliver_missed_product(now, 5, &first, &first_data).unwrap();
    up.no_such_product(now, 6).unwrap();
    up.deliver_missed_product(now, 7, &third, &third_data).unwrap();
    assert_eq!(up.requested().len(), 0);
    pump(now, &mut down, &mut up);
    match down.poll_event() {
        Some(SubscriberEvent::MissedProduct { index: 5, product }) => {
            assert_eq!((&product.info, &product.data[..]), (&first, &first_data[..]));
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(down.poll_event(), Some(SubscriberEvent::NoSuchProduct { index: 6 })));
    match down.poll_event() {
        Some(SubscriberEvent::MissedProduct { index: 7, product }) => assert_eq!(product.data.into_vec(), third_data),
        other => panic!("{other:?}"),
    }
    assert!(down.poll_event().is_none());
    assert_eq!(down.requested().len(), 0);
    assert!(up.poll_event().is_none(), "one-way calls: no replies, no events");
}

#[test]
fn a_large_missed_product_arrives_whole() {
    let now = start();
    let (mut down, mut up) = subscribed(now);
    down.request_product(now, 1).unwrap();
    pump(now, &mut down, &mut up);
    let _ = up.poll_event();
    let (info, data) = product(1, 12 << 20);
    up.deliver_missed_product(now, 1, &info, &data).unwrap();
    assert!(!up.ready(), "over the high-water mark until the output is taken");
    let mut bytes = Vec::new();
    up.take_output(&mut bytes);
    assert!(up.ready());
    // Arrives in socket-sized pieces.
    for piece in bytes.chunks(64 << 10) {
        down.handle_input(now, piece);
    }
    match down.poll_event() {
        Some(SubscriberEvent::MissedProduct { index: 1, product }) => {
            assert_eq!(product.info, info);
            assert!(product.data[..] == data[..]);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn unexpected_deliveries_are_reported_and_dropped() {
    let now = start();
    let (mut down, mut up) = subscribed(now);
    down.request_product(now, 5).unwrap();
    down.request_product(now, 6).unwrap();
    pump(now, &mut down, &mut up);
    // An upstream that answers out of order (ours refuses to): raw records.
    let (info, data) = product(6, 20);
    let mut bytes = Vec::new();
    ldm7::encode_deliver_missed_product(&mut bytes, 1, 6, &info, &data);
    ldm7::encode_call(&mut bytes, &Call { xid: 2, call: Ldm7Call::NoSuchProduct(99) });
    ldm7::encode_call(&mut bytes, &Call { xid: 3, call: Ldm7Call::NoSuchProduct(5) });
    ldm7::encode_deliver_missed_product(&mut bytes, 4, 6, &info, &data);
    down.handle_input(now, &bytes);
    assert!(matches!(
        down.poll_event(),
        Some(SubscriberEvent::Unexpected { proc: ldm7::Proc::DeliverMissedProduct, index: 6, expected: Some(5) })
    ));
    assert!(matches!(
        down.poll_event(),
        Some(SubscriberEvent::Unexpected { proc: ldm7::Proc::NoSuchProduct, index: 99, expected: Some(5) })
    ));
    assert!(matches!(down.poll_event(), Some(SubscriberEvent::NoSuchProduct { index: 5 })));
    assert!(matches!(down.poll_event(), Some(SubscriberEvent::MissedProduct { index: 6, .. })));
    assert_eq!(down.unexpected_deliveries(), 2);
    assert!(!down.is_closed());
    // With nothing requested, any delivery is unexpected.
    let mut bytes = Vec::new();
    ldm7::encode_call(&mut bytes, &Call { xid: 5, call: Ldm7Call::NoSuchProduct(7) });
    down.handle_input(now, &bytes);
    assert!(matches!(down.poll_event(), Some(SubscriberEvent::Unexpected { index: 7, expected: None, .. })));
}

#[test]
fn subscription_refused_closes_both_ends() {
    let now = start();
    let mut down = Subscriber::new(now, SubscriberConfig::new(FeedType::EXP));
    let mut up = Publisher::new(now);
    pump(now, &mut down, &mut up);
    assert!(matches!(up.poll_event(), Some(PublisherEvent::Subscribe { feed: FeedType::EXP, .. })));
    assert!(matches!(
        up.answer_subscribe(now, SubscriptionReply::Refused(Ldm7Status::Ok)),
        Err(SessionError::Usage(_))
    ));
    up.answer_subscribe(now, SubscriptionReply::Refused(Ldm7Status::Unauth)).unwrap();
    assert!(matches!(up.poll_event(), Some(PublisherEvent::Closed(Ok(())))));
    pump(now, &mut down, &mut up);
    assert!(matches!(down.poll_event(), Some(SubscriberEvent::Refused { status: Ldm7Status::Unauth })));
    assert!(matches!(down.poll_event(), Some(SubscriberEvent::Closed(Ok(())))));
    assert!(matches!(down.request_product(now, 1), Err(SessionError::Usage(_))));
}

#[test]
fn an_rpc_error_or_an_ldm6_only_upstream_ends_the_subscription() {
    let now = start();
    // SYSTEM_ERR (the reference upstream's internal failure).
    let mut down = Subscriber::new(now, SubscriberConfig::new(FeedType::EXP));
    let mut up = Publisher::new(now);
    pump(now, &mut down, &mut up);
    let _ = up.poll_event();
    up.answer_subscribe_system_error(now).unwrap();
    pump(now, &mut down, &mut up);
    assert!(
        matches!(down.poll_event(), Some(SubscriberEvent::Closed(Err(SessionError::Protocol(why)))) if why.contains("SystemErr"))
    );
    // An LDM-6-only upstream answers PROG_MISMATCH 6..6.
    let mut down = Subscriber::new(now, SubscriberConfig::new(FeedType::EXP));
    let mut old = Upstream::new(now);
    let mut bytes = Vec::new();
    down.take_output(&mut bytes);
    old.handle_input(now, &bytes);
    assert!(matches!(old.poll_event(), Some(UpstreamEvent::Unserved(_))));
    let mut back = Vec::new();
    old.take_output(&mut back);
    down.handle_input(now, &back);
    match down.poll_event() {
        Some(SubscriberEvent::Closed(Err(SessionError::Protocol(why)))) => {
            assert!(why.contains("ProgMismatch { low: 6, high: 6 }"), "{why}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn subscribe_waits_600_s_for_its_reply() {
    let now = start();
    let mut down = Subscriber::new(now, SubscriberConfig::new(FeedType::EXP));
    assert_eq!(down.poll_timeout(), Some(now + Duration::from_secs(600)));
    down.handle_timeout(now + Duration::from_secs(599));
    assert!(down.poll_event().is_none());
    down.handle_timeout(now + Duration::from_secs(600));
    match down.poll_event() {
        Some(SubscriberEvent::Closed(Err(error @ SessionError::ReplyTimeout { .. }))) => {
            assert_eq!(error.to_string(), "no reply to SUBSCRIBE within 600 s");
        }
        other => panic!("{other:?}"),
    }
    // Closing before the reply is an error too.
    let mut down = Subscriber::new(now, SubscriberConfig::new(FeedType::EXP));
    down.handle_eof();
    assert!(matches!(down.poll_event(), Some(SubscriberEvent::Closed(Err(SessionError::ClosedBeforeReply(_))))));
}

#[test]
fn backlog_streams_under_backpressure_then_end_backlog() {
    let now = start();
    let (mut down, mut up) = subscribed(now);
    let spec = BacklogSpec {
        after: Signature([1; 16]),
        after_is_set: false,
        before: Signature([2; 16]),
        time_offset_secs: 3600,
    };
    down.request_backlog(now, spec, None).unwrap();
    pump(now, &mut down, &mut up);
    assert!(matches!(up.poll_event(), Some(PublisherEvent::RequestBacklog { spec: got }) if got == spec));
    let products: Vec<_> = (1..=40).map(|n| product(n, 100_000 + n as usize)).collect();
    let mut next = products.iter();
    let mut buffered_max = 0;
    let mut rounds = 0;
    loop {
        let mut sent_any = false;
        while up.ready() {
            let Some((info, data)) = next.next() else { break };
            up.deliver_backlog_product(now, info, data).unwrap();
            sent_any = true;
        }
        let mut bytes = Vec::new();
        up.take_output(&mut bytes);
        buffered_max = buffered_max.max(bytes.len());
        down.handle_input(now, &bytes);
        rounds += 1;
        if !sent_any {
            break;
        }
    }
    // Never more than the high-water mark plus one product waited in the session.
    assert!(buffered_max < OUTPUT_HIGH_WATER + 101_000 + 200, "{buffered_max}");
    assert!(rounds > 3, "the stream was paced: {rounds} rounds");
    up.end_backlog(now).unwrap();
    pump(now, &mut down, &mut up);
    for (info, data) in &products {
        match down.poll_event() {
            Some(SubscriberEvent::BacklogProduct { product }) => {
                assert_eq!(&product.info, info);
                assert!(product.data[..] == data[..]);
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(matches!(down.poll_event(), Some(SubscriberEvent::BacklogComplete)));
    assert!(down.poll_event().is_none());
}

/// A backlog's fence tells the subscriber the backlog is complete against an upstream that
/// never sends END_BACKLOG (the reference, which answers calls in order: the fence's
/// NO_SUCH_PRODUCT after the last backlog product), and against ours (END_BACKLOG first, the
/// fence answered out of order after other requests): once each, the other signal dropped.
#[test]
fn a_backlog_is_complete_at_its_fence_or_at_end_backlog() {
    let now = start();
    let spec =
        BacklogSpec { after: Signature([1; 16]), after_is_set: true, before: Signature([2; 16]), time_offset_secs: 60 };
    let fence = ldm7_ldm_proto::fence_index(41);
    assert!(ldm7_ldm_proto::is_fence(fence, 42));

    // The reference's order: backlog products, then the fence's answer; a product requested
    // after the fence is answered after it, in order.
    let (mut down, mut up) = subscribed(now);
    down.request_backlog(now, spec, Some(fence)).unwrap();
    down.request_product(now, 40).unwrap();
    pump(now, &mut down, &mut up);
    assert!(matches!(up.poll_event(), Some(PublisherEvent::RequestBacklog { .. })));
    assert!(matches!(up.poll_event(), Some(PublisherEvent::RequestProduct { index }) if index == fence));
    assert!(matches!(up.poll_event(), Some(PublisherEvent::RequestProduct { index: 40 })));
    let (info, data) = product(1, 1000);
    up.deliver_backlog_product(now, &info, &data).unwrap();
    up.no_such_product(now, fence).unwrap();
    up.no_such_product(now, 40).unwrap();
    pump(now, &mut down, &mut up);
    assert_eq!(down.pending_backlogs(), 0);
    assert!(matches!(down.poll_event(), Some(SubscriberEvent::BacklogProduct { .. })));
    assert!(matches!(down.poll_event(), Some(SubscriberEvent::BacklogComplete)));
    assert!(matches!(down.poll_event(), Some(SubscriberEvent::NoSuchProduct { index: 40 })));
    assert!(down.poll_event().is_none());

    // Ours: a request after the fence is answered first, then END_BACKLOG, then the fence.
    let (mut down, mut up) = subscribed(now);
    down.request_backlog(now, spec, Some(fence)).unwrap();
    down.request_product(now, 40).unwrap();
    pump(now, &mut down, &mut up);
    while up.poll_event().is_some() {}
    up.set_aside_fence(fence).unwrap();
    up.no_such_product(now, 40).unwrap();
    up.deliver_backlog_product(now, &info, &data).unwrap();
    up.end_backlog(now).unwrap();
    assert_eq!(up.answer_fences(now).unwrap(), 1);
    pump(now, &mut down, &mut up);
    assert!(matches!(down.poll_event(), Some(SubscriberEvent::NoSuchProduct { index: 40 })));
    assert!(matches!(down.poll_event(), Some(SubscriberEvent::BacklogProduct { .. })));
    assert!(matches!(down.poll_event(), Some(SubscriberEvent::BacklogComplete)));
    assert!(down.poll_event().is_none(), "the fence's answer after END_BACKLOG is dropped");
    assert_eq!(down.unexpected_deliveries(), 0);

    // A backlog asked before any index was known is fenced later; the reference still
    // answers after the backlog.
    let (mut down, mut up) = subscribed(now);
    down.request_backlog(now, spec, None).unwrap();
    assert_eq!(down.fence_backlogs(now, fence).unwrap(), 1);
    assert_eq!(down.fence_backlogs(now, fence).unwrap(), 0, "once");
    pump(now, &mut down, &mut up);
    while up.poll_event().is_some() {}
    up.no_such_product(now, fence).unwrap();
    pump(now, &mut down, &mut up);
    assert!(matches!(down.poll_event(), Some(SubscriberEvent::BacklogComplete)));
    assert_eq!(down.pending_backlogs(), 0);
    assert_eq!(up.answer_fences(now).unwrap(), 0, "only the fences set aside");
}

#[test]
fn heartbeats_every_30_s_downstream_and_after_60_s_of_silence_upstream() {
    let now = start();
    let (mut down, mut up) = subscribed(now);
    // Downstream: 30 s after its last request.
    assert_eq!(down.poll_timeout(), Some(now + Duration::from_secs(30)));
    let t10 = now + Duration::from_secs(10);
    down.request_product(t10, 3).unwrap();
    assert_eq!(down.poll_timeout(), Some(t10 + Duration::from_secs(30)));
    pump(t10, &mut down, &mut up);
    assert!(matches!(up.poll_event(), Some(PublisherEvent::RequestProduct { index: 3 })));
    let t40 = t10 + Duration::from_secs(30);
    down.handle_timeout(t40);
    pump(t40, &mut down, &mut up);
    assert!(matches!(up.poll_event(), Some(PublisherEvent::TestConnection)));
    assert_eq!(down.poll_timeout(), Some(t40 + Duration::from_secs(30)));

    // Upstream: 60 s after it last heard anything (here the downstream's heartbeats are lost).
    assert_eq!(up.poll_timeout(), Some(t40 + HEARD_NOTHING_LIMIT));
    up.handle_timeout(t40 + Duration::from_secs(59));
    assert!(!up.has_output());
    let t100 = t40 + Duration::from_secs(60);
    up.handle_timeout(t100);
    let mut bytes = Vec::new();
    up.take_output(&mut bytes);
    let heartbeat = records(&bytes);
    assert_eq!(heartbeat.len(), 1);
    assert!(matches!(decode(&heartbeat[0]), Message::Call(Call { call: Ldm7Call::TestConnection, .. })));
    assert_eq!(up.poll_timeout(), Some(t100 + Duration::from_secs(60)));
    // The downstream accepts it silently; no reply goes back.
    down.handle_input(t100, &bytes);
    assert!(down.poll_event().is_none());
    assert!(!down.has_output());
    assert!(!up.is_closed() && !down.is_closed());
}

#[test]
fn a_malformed_record_closes_only_its_session() {
    let now = start();
    let (mut down, mut up) = subscribed(now);
    let (mut other_down, mut other_up) = subscribed(now);
    // A version-7 NO_SUCH_PRODUCT cut short.
    let mut bytes = Vec::new();
    ldm7::encode_call(&mut bytes, &Call { xid: 1, call: Ldm7Call::NoSuchProduct(4) });
    bytes.truncate(bytes.len() - 2);
    bytes[3] -= 2;
    up.handle_input(now, &bytes);
    assert!(matches!(up.poll_event(), Some(PublisherEvent::Closed(Err(SessionError::Malformed(_))))));
    down.handle_input(now, &bytes);
    assert!(matches!(down.poll_event(), Some(SubscriberEvent::Closed(Err(SessionError::Malformed(_))))));
    // The other pair goes on.
    other_down.request_product(now, 9).unwrap();
    pump(now, &mut other_down, &mut other_up);
    assert!(matches!(other_up.poll_event(), Some(PublisherEvent::RequestProduct { index: 9 })));
}

#[test]
fn calls_not_served_follow_the_rpc_rules_and_the_session_goes_on() {
    let now = start();
    let (mut down, mut up) = subscribed(now);
    let (info, data) = product(1, 8);
    let mut bytes = Vec::new();
    // One-way calls of the other direction: counted, no reply.
    ldm7::encode_deliver_backlog_product(&mut bytes, 1, &info, &data);
    ldm7::encode_call(&mut bytes, &Call { xid: 2, call: Ldm7Call::EndBacklog });
    // An unknown procedure: PROC_UNAVAIL.
    let mut unknown = Vec::new();
    ldm7::encode_call(&mut unknown, &Call { xid: 3, call: Ldm7Call::TestConnection });
    unknown[4 + 20..4 + 24].copy_from_slice(&9u32.to_be_bytes());
    bytes.extend_from_slice(&unknown);
    // Another version: PROG_MISMATCH 7..7.
    ldm7_xdr::ldm::encode_call(
        &mut bytes,
        &ldm7_xdr::ldm::Call { xid: 4, version: 6, call: ldm7_xdr::ldm::LdmCall::Nullproc },
    );
    // A stray reply: skipped.
    ldm7::encode_reply(&mut bytes, 77, &ReplyBody::Error(AcceptStat::ProcUnavail));
    up.handle_input(now, &bytes);
    for _ in 0..4 {
        assert!(matches!(up.poll_event(), Some(PublisherEvent::Unserved(_))));
    }
    assert!(up.poll_event().is_none());
    assert_eq!((up.unserved_calls(), up.stray_replies()), (4, 1));
    let mut out = Vec::new();
    up.take_output(&mut out);
    let replies: Vec<_> = records(&out).iter().map(|record| decode(record)).collect();
    let expected = [(3, AcceptStat::ProcUnavail), (4, AcceptStat::ProgMismatch { low: 7, high: 7 })];
    assert_eq!(replies.len(), 2);
    for (reply, (xid, stat)) in replies.iter().zip(expected) {
        assert!(matches!(reply, Message::Reply(r) if r.xid == xid && r.body == ReplyBody::Error(stat)), "{reply:?}");
    }
    // SUBSCRIBE expects a reply: the subscriber answers it PROC_UNAVAIL.
    let mut bytes = Vec::new();
    let request = ldm7::McastSubReq { feed: FeedType::EXP, vc_end: VcEndPoint::unused(), offer: None };
    ldm7::encode_call(&mut bytes, &Call { xid: 5, call: Ldm7Call::Subscribe(request) });
    down.handle_input(now, &bytes);
    assert!(matches!(down.poll_event(), Some(SubscriberEvent::Unserved(_))));
    let mut out = Vec::new();
    down.take_output(&mut out);
    assert!(
        matches!(decode(&records(&out)[0]), Message::Reply(r) if r.xid == 5 && r.body == ReplyBody::Error(AcceptStat::ProcUnavail))
    );
    // Both sessions go on.
    down.request_product(now, 1).unwrap();
    pump(now, &mut down, &mut up);
    assert!(matches!(up.poll_event(), Some(PublisherEvent::RequestProduct { index: 1 })));
}

#[test]
fn one_inbound_session_serves_ldm6_and_ldm7_first_calls() {
    let now = start();
    // LDM-7: the dispatcher hands over to the publisher.
    let mut inbound = Inbound::new(now);
    let mut down = Subscriber::new(now, SubscriberConfig::new(FeedType::EXP));
    let mut bytes = Vec::new();
    down.take_output(&mut bytes);
    // The SUBSCRIBE in two pieces, and a TEST_CONNECTION right behind it.
    ldm7::encode_call(&mut bytes, &Call { xid: 0x99, call: Ldm7Call::TestConnection });
    inbound.handle_input(now, &bytes[..10]);
    assert!(!inbound.is_ldm7());
    inbound.handle_input(now, &bytes[10..]);
    assert!(inbound.is_ldm7());
    assert!(matches!(inbound.poll_event(), Some(InboundEvent::Ldm7(PublisherEvent::Subscribe { .. }))));
    assert!(matches!(inbound.poll_event(), Some(InboundEvent::Ldm7(PublisherEvent::TestConnection))));
    inbound.publisher().unwrap().answer_subscribe(now, SubscriptionReply::Ok(sub_info("10.77.0.1:1"))).unwrap();
    let mut back = Vec::new();
    inbound.take_output(&mut back);
    down.handle_input(now, &back);
    assert!(matches!(down.poll_event(), Some(SubscriberEvent::Subscribed { .. })));
    assert!(inbound.upstream().is_none());

    // LDM-6: FEEDME goes to the upstream as before.
    let mut inbound = Inbound::new(now);
    let feedme = ldm7_xdr::ldm::LdmCall::Feedme {
        class: ldm7_ldm_proto::wire_class(&ldm7_types::ProdClass::new(FeedType::EXP, ".*").unwrap()),
        max_hereis: u32::MAX,
    };
    let mut bytes = Vec::new();
    ldm7_xdr::ldm::encode_call(&mut bytes, &ldm7_xdr::ldm::Call { xid: 1, version: 6, call: feedme });
    inbound.handle_input(now, &bytes);
    assert!(!inbound.is_ldm7());
    assert!(matches!(inbound.poll_event(), Some(InboundEvent::Ldm6(UpstreamEvent::FeedRequest { .. }))));
    assert!(inbound.upstream().is_some() && inbound.publisher().is_none());
    assert_eq!(inbound.poll_timeout(), None, "deciding: no deadline");

    // Before the first real call: a version-5 call (PROG_MISMATCH 6..7) and a NULLPROC
    // (answered), then SUBSCRIBE: still LDM-7.
    let mut inbound = Inbound::new(now);
    let mut bytes = Vec::new();
    let v5 = ldm7_xdr::ldm::Call { xid: 1, version: 5, call: ldm7_xdr::ldm::LdmCall::Nullproc };
    ldm7_xdr::ldm::encode_call(&mut bytes, &v5);
    let null = ldm7_xdr::ldm::Call { xid: 2, version: 6, call: ldm7_xdr::ldm::LdmCall::Nullproc };
    ldm7_xdr::ldm::encode_call(&mut bytes, &null);
    let request = ldm7::McastSubReq { feed: FeedType::EXP, vc_end: VcEndPoint::unused(), offer: None };
    ldm7::encode_call(&mut bytes, &Call { xid: 3, call: Ldm7Call::Subscribe(request) });
    inbound.handle_input(now, &bytes);
    assert!(
        matches!(inbound.poll_event(), Some(InboundEvent::Ldm6(UpstreamEvent::Unserved(why))) if why.contains("version 5"))
    );
    assert!(matches!(inbound.poll_event(), Some(InboundEvent::Ldm7(PublisherEvent::Subscribe { .. }))));
    let mut out = Vec::new();
    inbound.take_output(&mut out);
    let replies = records(&out);
    let first = ldm7_xdr::ldm::decode_message(&replies[0], |_| None).unwrap();
    assert!(matches!(first, ldm7_xdr::ldm::Message::Reply(r)
        if r.body == ldm7_xdr::ldm::ReplyBody::Error(AcceptStat::ProgMismatch { low: 6, high: 7 })));
    assert_eq!(xid_of(&replies[1]), 2, "the NULLPROC reply");
    assert_eq!(replies.len(), 2);

    // A silent connection still times out after 120 s.
    let mut inbound = Inbound::new(now);
    assert_eq!(inbound.poll_timeout(), Some(now + Duration::from_secs(120)));
    inbound.handle_timeout(now + Duration::from_secs(120));
    assert!(matches!(inbound.poll_event(), Some(InboundEvent::Ldm6(UpstreamEvent::Closed(Err(_))))));
    assert!(inbound.is_closed());

    // Alone, the LDM-6 upstream still answers version 7 PROG_MISMATCH 6..6.
    let mut up = Upstream::new(now);
    let mut bytes = Vec::new();
    Subscriber::new(now, SubscriberConfig::new(FeedType::EXP)).take_output(&mut bytes);
    up.handle_input(now, &bytes);
    assert!(matches!(up.poll_event(), Some(UpstreamEvent::Unserved(why)) if why.contains("version 7")));
}

// ---------------------------------------------------------------------------------------------
// Against the capture.

/// The captured LDM-7 connection as records: (downstream → upstream, upstream → downstream).
/// RPC records, each a byte vector.
type Records = Vec<Vec<u8>>;

/// `None` (the test skips) when the shared data is absent.
fn captured() -> Option<(Records, Records)> {
    let connections = capture_streams(CAPTURE)?;
    Some((records(&connections[0].0), records(&connections[0].1)))
}

fn captured_backlog_spec() -> BacklogSpec {
    BacklogSpec {
        after: "94889dfa3a668c941c06638dbae6cdd8".parse().unwrap(),
        after_is_set: true,
        before: "b6adbdcdf07512b2f9d18b417453a896".parse().unwrap(),
        time_offset_secs: 3600,
    }
}

fn captured_product(n: u32, micros: i32, signature: &str) -> (ProdInfo, Vec<u8>) {
    let info = ProdInfo {
        arrival: Timestamp { secs: 1_795_338_479, micros },
        signature: signature.parse().unwrap(),
        origin: "vm".into(),
        feedtype: FeedType::EXP,
        seqno: n,
        ident: format!("TEST/cap.{n}"),
        size: 8,
    };
    (info, format!("hello {n}\n").into_bytes())
}

#[test]
fn our_subscriber_sends_the_captured_records() {
    let Some((client, server)) = captured() else { return };
    let now = start();
    let mut down = Subscriber::new(now, SubscriberConfig::new(FeedType::ANY));
    let mut bytes = Vec::new();
    down.take_output(&mut bytes);
    let ours = records(&bytes);
    assert_eq!(ours.len(), 1);
    let xid = xid_of(&ours[0]);
    assert_eq!(ours[0], with_xid(&client[0], xid), "SUBSCRIBE, except the xid");

    // The captured reply (its xid is the reference's, so it is skipped), then the same reply to
    // our xid, then the two backlog products that followed.
    down.handle_input(now, &framed(&server[0]));
    assert!(down.poll_event().is_none(), "a reply to another xid is skipped");
    assert_eq!(down.stray_replies(), 1);
    down.handle_input(now, &framed(&with_xid(&server[0], xid)));
    match down.poll_event() {
        Some(SubscriberEvent::Subscribed { info }) => assert_eq!(info, sub_info("10.77.0.1:42263")),
        other => panic!("{other:?}"),
    }
    let later = now + Duration::from_secs(6);
    down.request_backlog(later, captured_backlog_spec(), None).unwrap();
    let mut bytes = Vec::new();
    down.take_output(&mut bytes);
    let ours = records(&bytes);
    assert_eq!(ours[0], with_xid(&client[1], xid_of(&ours[0])), "REQUEST_BACKLOG, except the xid");

    for record in &server[1..] {
        down.handle_input(later, &framed(record));
    }
    for n in [1, 2] {
        match down.poll_event() {
            Some(SubscriberEvent::BacklogProduct { product }) => {
                assert_eq!(product.info.ident, format!("TEST/cap.{n}"));
                assert_eq!(&product.data[..], format!("hello {n}\n").as_bytes());
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn our_publisher_answers_the_captured_subscribe_and_sends_the_captured_backlog() {
    let Some((client, server)) = captured() else { return };
    let now = start();
    let mut inbound = Inbound::new(now);
    inbound.handle_input(now, &framed(&client[0]));
    match inbound.poll_event() {
        Some(InboundEvent::Ldm7(PublisherEvent::Subscribe { feed, vc_end, offer })) => {
            assert_eq!((feed, vc_end, offer), (FeedType::ANY, VcEndPoint::unused(), None));
        }
        other => panic!("{other:?}"),
    }
    let publisher = inbound.publisher().unwrap();
    // An answer to an offer the reference never makes is not sent to it.
    let parity = ParityAnswer { group_blocks: 256, shards: 16, port: 38801 };
    let info = McastSubInfo {
        answer: Some(SubscribeAnswer { parity: Some(parity), address6: None }),
        ..sub_info("10.77.0.1:42263")
    };
    publisher.answer_subscribe(now, SubscriptionReply::Ok(info)).unwrap();
    let mut bytes = Vec::new();
    publisher.take_output(&mut bytes);
    assert_eq!(records(&bytes), [server[0].clone()], "the captured reply, byte for byte");

    let later = now + Duration::from_secs(6);
    inbound.handle_input(later, &framed(&client[1]));
    match inbound.poll_event() {
        Some(InboundEvent::Ldm7(PublisherEvent::RequestBacklog { spec })) => assert_eq!(spec, captured_backlog_spec()),
        other => panic!("{other:?}"),
    }
    let publisher = inbound.publisher().unwrap();
    let products = [
        captured_product(1, 704_874, "99472f8d2f760bcc394e80d09275150a"),
        captured_product(2, 717_420, "26c5cb6d09e64fbeeb09c9cd9c0183f2"),
    ];
    for (info, data) in &products {
        assert!(publisher.ready());
        publisher.deliver_backlog_product(later, info, data).unwrap();
    }
    let mut bytes = Vec::new();
    publisher.take_output(&mut bytes);
    let ours = records(&bytes);
    assert_eq!(ours.len(), 2);
    for (mine, theirs) in ours.iter().zip(&server[1..]) {
        assert_eq!(*mine, with_xid(theirs, xid_of(mine)), "DELIVER_BACKLOG_PRODUCT, except the xid");
    }
}

/// A record with its record mark, as on the wire.
fn framed(record: &[u8]) -> Vec<u8> {
    let mut bytes = (0x8000_0000u32 | record.len() as u32).to_be_bytes().to_vec();
    bytes.extend_from_slice(record);
    bytes
}

// ---------------------------------------------------------------------------------------------
// Properties.

mod properties {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Whatever arrives, no session panics; each either goes on or closes.
        #[test]
        fn arbitrary_input_never_panics(
            raw in proptest::collection::vec(any::<u8>(), 0..600),
            proc in 0u32..12,
            framed_call in any::<bool>(),
            split in 0usize..600,
        ) {
            let now = start();
            // Either raw bytes or one framed version-7 call header followed by them.
            let bytes = if framed_call {
                let mut record = vec![0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 4, 0x93, 0xfd, 0, 0, 0, 7];
                record.extend_from_slice(&proc.to_be_bytes());
                record.extend_from_slice(&[0; 16]);
                record.extend_from_slice(&raw);
                framed(&record)
            } else {
                raw
            };
            let split = split.min(bytes.len());
            let mut inbound = Inbound::new(now);
            let mut fresh = Subscriber::new(now, SubscriberConfig::new(FeedType::EXP));
            let (mut down, mut up) = subscribed(now);
            for piece in [&bytes[..split], &bytes[split..]] {
                inbound.handle_input(now, piece);
                fresh.handle_input(now, piece);
                down.handle_input(now, piece);
                up.handle_input(now, piece);
            }
            while inbound.poll_event().is_some() {}
            let mut out = Vec::new();
            inbound.take_output(&mut out);
            up.take_output(&mut out);
        }

        /// Requests answered in order arrive as the matching events, however the bytes are cut.
        #[test]
        fn answers_arrive_in_request_order_whatever_the_reads(
            requests in proptest::collection::vec((any::<u32>(), any::<bool>(), 0usize..5000), 1..20),
            chunk in 1usize..4000,
        ) {
            let now = start();
            let (mut down, mut up) = subscribed(now);
            for (index, _, _) in &requests {
                prop_assert!(down.request_product(now, *index).unwrap());
            }
            let mut bytes = Vec::new();
            down.take_output(&mut bytes);
            for piece in bytes.chunks(chunk) {
                up.handle_input(now, piece);
            }
            let mut products = Vec::new();
            for (n, (index, found, size)) in requests.iter().enumerate() {
                let asked = matches!(up.poll_event(), Some(PublisherEvent::RequestProduct { index: got }) if got == *index);
                prop_assert!(asked, "request {} not reported", index);
                if *found {
                    let (info, data) = product(n as u32, *size);
                    up.deliver_missed_product(now, *index, &info, &data).unwrap();
                    products.push(Some((info, data)));
                } else {
                    up.no_such_product(now, *index).unwrap();
                    products.push(None);
                }
            }
            let mut bytes = Vec::new();
            up.take_output(&mut bytes);
            for piece in bytes.chunks(chunk) {
                down.handle_input(now, piece);
            }
            for ((index, _, _), expected) in requests.iter().zip(products) {
                match (down.poll_event(), expected) {
                    (Some(SubscriberEvent::MissedProduct { index: got, product }), Some((info, data))) => {
                        prop_assert_eq!(got, *index);
                        prop_assert_eq!(product.info, info);
                        prop_assert_eq!(&product.data[..], &data[..]);
                    }
                    (Some(SubscriberEvent::NoSuchProduct { index: got }), None) => prop_assert_eq!(got, *index),
                    (other, _) => prop_assert!(false, "{other:?}"),
                }
            }
            prop_assert!(down.poll_event().is_none());
            prop_assert_eq!(down.requested().len(), 0);
        }
    }
}
