//! Sans-IO session tests: the state machines talk to each other through byte buffers in
//! virtual time — FEEDME with turn-around (primary and alternate), RECLASS, refusals, NOTIFYME,
//! HIYA push with HEREIS and COMINGSOON/BLKDATA, keep-alive, silence, malformed input, and the
//! upstream's bounds (record length before and after HIYA, first-call and push idle timeouts).

use std::time::Duration;

use ldm7_types::Instant;

use ldm7_ldm_proto::{
    Downstream, DownstreamConfig, DownstreamEvent, FeedMode, HiyaAnswer, LimitHit, NotifyClient, NotifyEvent,
    PushClient, PushEvent, RequestAnswer, SessionError, Upstream, UpstreamEvent, UpstreamLimits,
};
use ldm7_types::{FeedType, ProdClass, ProdInfo, Signature, Timestamp};

fn product(n: u32, size: usize) -> (ProdInfo, Vec<u8>) {
    let data: Vec<u8> = (0..size).map(|k| (k as u32).wrapping_mul(31).wrapping_add(n) as u8).collect();
    let info = ProdInfo {
        arrival: Timestamp { secs: 1_795_338_382, micros: n as i32 },
        signature: Signature::md5_of(&data),
        origin: "vm".into(),
        feedtype: FeedType::EXP,
        seqno: n,
        ident: format!("TEST/cap.{n}"),
        size: size as u32,
    };
    (info, data)
}

fn exp_class() -> ProdClass {
    ProdClass::new(FeedType::EXP, ".*").unwrap()
}

/// Moves bytes between an upstream and a downstream until neither has output.
fn pump(now: Instant, up: &mut Upstream, down: &mut Downstream) {
    loop {
        let mut bytes = Vec::new();
        up.take_output(&mut bytes);
        let from_up = !bytes.is_empty();
        down.handle_input(now, &bytes);
        let mut back = Vec::new();
        down.take_output(&mut back);
        up.handle_input(now, &back);
        if !from_up && back.is_empty() {
            return;
        }
    }
}

fn feed_started(now: Instant, mode: FeedMode) -> (Upstream, Downstream, Instant) {
    let mut up = Upstream::new(now);
    let mut config = DownstreamConfig::new(exp_class());
    config.mode = mode;
    let mut down = Downstream::new(now, config);
    pump(now, &mut up, &mut down);
    match up.poll_event() {
        Some(UpstreamEvent::FeedRequest { mode: got, resume_after: None, .. }) => assert_eq!(got, mode),
        other => panic!("{other:?}"),
    }
    up.answer_request(now, RequestAnswer::Ok { id: 42 }).unwrap();
    pump(now, &mut up, &mut down);
    assert!(matches!(down.poll_event(), Some(DownstreamEvent::Accepted { id: 42, .. })));
    // The turn-around: a NULLPROC probe 10 ms after the reply; its answer starts the feed.
    assert!(!up.ready());
    assert_eq!(up.poll_timeout(), Some(now + Duration::from_millis(10)));
    let later = now + Duration::from_millis(10);
    up.handle_timeout(later);
    assert!(!up.ready(), "the probe awaits its answer");
    pump(later, &mut up, &mut down);
    assert!(matches!(up.poll_event(), Some(UpstreamEvent::FeedStarted)));
    assert!(up.ready());
    assert!(down.poll_event().is_none(), "a probe is no product");
    (up, down, later)
}

/// A probe that the downstream never answers (the reference downstream loses a call read
/// together with the FEEDME reply) delays the feed to the reference's 1 s, no longer; its late
/// answer is a stray reply.
#[test]
fn turn_around_without_an_answer_feeds_after_one_second() {
    let now = Instant::from_nanos(1_000_000_000);
    let mut up = Upstream::new(now);
    let mut down = Downstream::new(now, DownstreamConfig::new(exp_class()));
    pump(now, &mut up, &mut down);
    assert!(matches!(up.poll_event(), Some(UpstreamEvent::FeedRequest { .. })));
    up.answer_request(now, RequestAnswer::Ok { id: 7 }).unwrap();
    pump(now, &mut up, &mut down);
    up.handle_timeout(now + Duration::from_millis(10));
    let mut probe = Vec::new();
    up.take_output(&mut probe);
    assert!(!probe.is_empty(), "the probe went out");
    // The probe is lost; nothing happens until the reference's pause has passed.
    assert_eq!(up.poll_timeout(), Some(now + Duration::from_secs(1)));
    up.handle_timeout(now + Duration::from_millis(999));
    assert!(!up.ready());
    up.handle_timeout(now + Duration::from_secs(1));
    assert!(matches!(up.poll_event(), Some(UpstreamEvent::FeedStarted)));
    assert!(up.ready());
    // The probe's answer arrives after all: skipped as stray, the feed goes on.
    down.handle_input(now + Duration::from_secs(1), &probe);
    pump(now + Duration::from_secs(1), &mut up, &mut down);
    assert_eq!(up.stray_replies(), 1);
    assert!(up.ready());
    assert!(!up.is_closed());
}

#[test]
fn primary_feed_sends_hereis_then_nullproc_flush_and_keepalive() {
    let start = Instant::from_nanos(1_000_000_000);
    let (mut up, mut down, now) = feed_started(start, FeedMode::Primary);
    let products: Vec<_> = (1..=3).map(|n| product(n, 8 + n as usize * 5)).collect();
    for (info, data) in &products {
        up.send_product(now, info, data).unwrap();
        assert!(up.ready(), "HEREIS awaits no reply");
    }
    up.flush(now);
    assert!(!up.ready(), "the flush awaits its reply");
    pump(now, &mut up, &mut down);
    assert!(up.ready());
    for (info, data) in &products {
        match down.poll_event() {
            Some(DownstreamEvent::Product(got)) => assert_eq!((&got.info, &got.data[..]), (info, &data[..])),
            other => panic!("{other:?}"),
        }
    }
    // A flush with nothing new is not sent; the keep-alive comes 30 s after the last send.
    up.flush(now);
    assert!(up.ready());
    assert_eq!(up.poll_timeout(), Some(now + Duration::from_secs(30)));
    up.handle_timeout(now + Duration::from_secs(30));
    assert!(!up.ready());
    pump(now + Duration::from_secs(30), &mut up, &mut down);
    assert!(up.ready());
    assert!(down.poll_event().is_none());
}

#[test]
fn alternate_feed_uses_comingsoon_and_blkdata_and_honours_dont_send() {
    let (mut up, mut down, now) = feed_started(Instant::from_nanos(1_000_000_000), FeedMode::Alternate);
    let (first, first_data) = product(1, 3000);
    up.send_product(now, &first, &first_data).unwrap();
    assert!(!up.ready(), "COMINGSOON awaits its reply");
    pump(now, &mut up, &mut down);
    match down.poll_event() {
        Some(DownstreamEvent::ComingSoon { info, abandoned: None }) => assert_eq!(info, first),
        other => panic!("{other:?}"),
    }
    down.answer_coming_soon(now, true).unwrap();
    pump(now, &mut up, &mut down);
    match down.poll_event() {
        Some(DownstreamEvent::Product(got)) => assert_eq!(got.data, first_data),
        other => panic!("{other:?}"),
    }
    assert!(up.ready());
    let (second, second_data) = product(2, 10);
    up.send_product(now, &second, &second_data).unwrap();
    pump(now, &mut up, &mut down);
    assert!(matches!(down.poll_event(), Some(DownstreamEvent::ComingSoon { .. })));
    down.answer_coming_soon(now, false).unwrap();
    pump(now, &mut up, &mut down);
    assert!(matches!(up.poll_event(), Some(UpstreamEvent::Declined { signature }) if signature == second.signature));
    assert!(down.poll_event().is_none());
    assert!(up.ready());
}

#[test]
fn reclass_is_followed_by_a_new_feedme_on_the_same_connection() {
    let now = Instant::from_nanos(1_000_000_000);
    let mut up = Upstream::new(now);
    let wanted = ProdClass::new(FeedType(0x4000_0001), ".*").unwrap();
    let mut down = Downstream::new(now, DownstreamConfig::new(wanted));
    pump(now, &mut up, &mut down);
    assert!(matches!(up.poll_event(), Some(UpstreamEvent::FeedRequest { .. })));
    up.answer_request(now, RequestAnswer::Reclass(exp_class())).unwrap();
    pump(now, &mut up, &mut down);
    assert!(
        matches!(down.poll_event(), Some(DownstreamEvent::Reclassified(class)) if class.feedtype() == FeedType::EXP)
    );
    match up.poll_event() {
        Some(UpstreamEvent::FeedRequest { class, .. }) => assert_eq!(class.feedtype(), FeedType::EXP),
        other => panic!("{other:?}"),
    }
    up.answer_request(now, RequestAnswer::Ok { id: 7 }).unwrap();
    pump(now, &mut up, &mut down);
    assert!(matches!(down.poll_event(), Some(DownstreamEvent::Accepted { id: 7, .. })));
}

#[test]
fn refused_request_ends_both_sessions() {
    let now = Instant::from_nanos(1_000_000_000);
    let mut up = Upstream::new(now);
    let mut down = Downstream::new(now, DownstreamConfig::new(ProdClass::new(FeedType::IDS, ".*").unwrap()));
    pump(now, &mut up, &mut down);
    assert!(matches!(up.poll_event(), Some(UpstreamEvent::FeedRequest { .. })));
    up.answer_request(now, RequestAnswer::Refuse).unwrap();
    pump(now, &mut up, &mut down);
    assert!(matches!(up.poll_event(), Some(UpstreamEvent::Closed(Ok(())))));
    assert!(matches!(down.poll_event(), Some(DownstreamEvent::Refused { .. })));
    assert!(matches!(down.poll_event(), Some(DownstreamEvent::Closed(Ok(())))));
}

#[test]
fn resume_signature_travels_as_a_sig_spec() {
    let now = Instant::from_nanos(1_000_000_000);
    let mut up = Upstream::new(now);
    let (info, _) = product(9, 10);
    let mut config = DownstreamConfig::new(exp_class());
    config.resume_after = Some(info.signature);
    let mut down = Downstream::new(now, config);
    pump(now, &mut up, &mut down);
    match up.poll_event() {
        Some(UpstreamEvent::FeedRequest { class, resume_after, .. }) => {
            assert_eq!(resume_after, Some(info.signature));
            assert_eq!(class.specs.len(), 1, "the SIG= spec is removed from the class");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_pattern_is_answered_badpattern() {
    let now = Instant::from_nanos(1_000_000_000);
    let mut up = Upstream::new(now);
    let mut class = ldm7_ldm_proto::wire_class(&exp_class());
    class.specs[0].pattern = "(".into();
    let mut record = Vec::new();
    ldm7_xdr::ldm::encode_call(
        &mut record,
        &ldm7_xdr::ldm::Call {
            xid: 5,
            version: 6,
            call: ldm7_xdr::ldm::LdmCall::Feedme { class, max_hereis: u32::MAX },
        },
    );
    up.handle_input(now, &record);
    assert!(matches!(up.poll_event(), Some(UpstreamEvent::BadPattern(_))));
    let mut reply = Vec::new();
    up.take_output(&mut reply);
    let decoded = ldm7_xdr::ldm::decode_message(&reply[4..], |_| Some(ldm7_xdr::ldm::Proc::Feedme)).unwrap();
    assert!(matches!(
        decoded,
        ldm7_xdr::ldm::Message::Reply(r) if r.body == ldm7_xdr::ldm::ReplyBody::Fornme(ldm7_xdr::ldm::FornmeReply::BadPattern)
    ));
}

#[test]
fn calls_not_served_get_the_rpc_answer_and_the_connection_goes_on() {
    use ldm7_xdr::ldm::{AcceptStat, Call, LdmCall, Message, ReplyBody, decode_message, encode_call};
    let now = Instant::from_nanos(1_000_000_000);
    let mut up = Upstream::new(now);
    let feedme = LdmCall::Feedme { class: ldm7_ldm_proto::wire_class(&exp_class()), max_hereis: u32::MAX };
    let mut records = Vec::new();
    // An LDM-5 peer's FEEDME, then an unknown procedure (header only), then a version-6 FEEDME.
    encode_call(&mut records, &Call { xid: 7, version: 5, call: feedme.clone() });
    let mut unknown = Vec::new();
    encode_call(&mut unknown, &Call { xid: 8, version: 6, call: LdmCall::Nullproc });
    unknown[4 + 20..4 + 24].copy_from_slice(&99u32.to_be_bytes());
    records.extend_from_slice(&unknown);
    encode_call(&mut records, &Call { xid: 9, version: 6, call: feedme });
    up.handle_input(now, &records);
    assert!(matches!(up.poll_event(), Some(UpstreamEvent::Unserved(why)) if why.contains("version 5")));
    assert!(matches!(up.poll_event(), Some(UpstreamEvent::Unserved(why)) if why.contains("procedure 99")));
    assert!(matches!(up.poll_event(), Some(UpstreamEvent::FeedRequest { .. })));
    let mut out = Vec::new();
    up.take_output(&mut out);
    let mut replies = Vec::new();
    let mut rest = &out[..];
    while !rest.is_empty() {
        let len = (u32::from_be_bytes(rest[..4].try_into().unwrap()) & 0x7fff_ffff) as usize;
        replies.push(decode_message(&rest[4..4 + len], |_| None).unwrap());
        rest = &rest[4 + len..];
    }
    let expected = [(7, AcceptStat::ProgMismatch { low: 6, high: 6 }), (8, AcceptStat::ProcUnavail)];
    assert_eq!(replies.len(), expected.len());
    for (reply, (xid, stat)) in replies.iter().zip(expected) {
        assert!(matches!(reply, Message::Reply(r) if r.xid == xid && r.body == ReplyBody::Error(stat)), "{reply:?}");
    }
    assert!(!up.is_closed());
}

#[test]
fn malformed_record_closes_the_session_with_an_error() {
    let now = Instant::from_nanos(1_000_000_000);
    let mut up = Upstream::new(now);
    up.handle_input(now, &[0x80, 0, 0, 8, 1, 2, 3, 4, 0, 0, 0, 9]);
    assert!(matches!(up.poll_event(), Some(UpstreamEvent::Closed(Err(_)))));
    assert!(up.is_closed());
}

#[test]
fn idle_connection_and_silent_upstream_time_out() {
    let now = Instant::from_nanos(1_000_000_000);
    let mut up = Upstream::new(now);
    up.handle_timeout(now + Duration::from_secs(120));
    assert!(matches!(up.poll_event(), Some(UpstreamEvent::Closed(Err(_)))));
    let (_up, mut down, then) = feed_started(now, FeedMode::Primary);
    let _ = down.poll_event();
    let limit = down.poll_timeout().unwrap();
    assert_eq!(limit, then + Duration::from_secs(300), "silence counts from the last call received (the probe)");
    down.handle_timeout(then + Duration::from_secs(300));
    assert!(matches!(down.poll_event(), Some(DownstreamEvent::Closed(Err(_)))));
}

#[test]
fn notify_receives_notifications_and_skips_stray_replies() {
    let now = Instant::from_nanos(1_000_000_000);
    let mut up = Upstream::new(now);
    let mut client = NotifyClient::new(now, exp_class(), Duration::from_secs(120));
    let mut bytes = Vec::new();
    client.take_output(&mut bytes);
    up.handle_input(now, &bytes);
    assert!(matches!(up.poll_event(), Some(UpstreamEvent::NotifyRequest { .. })));
    up.answer_request(now, RequestAnswer::Ok { id: 1 }).unwrap();
    let mut bytes = Vec::new();
    up.take_output(&mut bytes);
    client.handle_input(now, &bytes);
    assert!(matches!(client.poll_event(), Some(NotifyEvent::Accepted { id: 1, .. })));
    let later = now + Duration::from_secs(1);
    up.handle_timeout(later);
    assert!(matches!(up.poll_event(), Some(UpstreamEvent::FeedStarted)));
    let (info, _) = product(1, 100);
    up.send_product(later, &info, &[]).unwrap();
    up.flush(later);
    let mut bytes = Vec::new();
    up.take_output(&mut bytes);
    client.handle_input(later, &bytes);
    assert!(matches!(client.poll_event(), Some(NotifyEvent::Notification(got)) if got == info));
    let mut back = Vec::new();
    client.take_output(&mut back);
    // The reference notifyme also answers the NOTIFICATION with PROC_UNAVAIL: the upstream
    // skips such stray replies while it waits for its NULLPROC reply.
    let mut stray = Vec::new();
    ldm7_xdr::ldm::encode_reply(
        &mut stray,
        0x4c44_0001,
        &ldm7_xdr::ldm::ReplyBody::Error(ldm7_xdr::ldm::AcceptStat::ProcUnavail),
    );
    stray.extend_from_slice(&back);
    up.handle_input(later, &stray);
    assert!(up.ready());
    assert_eq!(up.stray_replies(), 1);
}

#[test]
fn push_sends_hereis_under_max_hereis_and_comingsoon_above() {
    let now = Instant::from_nanos(1_000_000_000);
    let mut receiver = Upstream::new(now);
    let mut pusher = PushClient::new(now, &exp_class());
    let exchange = |receiver: &mut Upstream, pusher: &mut PushClient| {
        let mut bytes = Vec::new();
        pusher.take_output(&mut bytes);
        receiver.handle_input(now, &bytes);
        let mut back = Vec::new();
        receiver.take_output(&mut back);
        pusher.handle_input(now, &back);
    };
    exchange(&mut receiver, &mut pusher);
    assert!(matches!(receiver.poll_event(), Some(UpstreamEvent::Hiya { .. })));
    receiver.answer_hiya(now, HiyaAnswer::Ok { max_hereis: 1000 }).unwrap();
    exchange(&mut receiver, &mut pusher);
    assert!(matches!(pusher.poll_event(), Some(PushEvent::Accepted { max_hereis: 1000, .. })));
    let (small, small_data) = product(1, 500);
    let (big, big_data) = product(2, 5000);
    pusher.send_product(now, &small, &small_data).unwrap();
    pusher.send_product(now, &big, &big_data).unwrap();
    exchange(&mut receiver, &mut pusher);
    assert!(matches!(receiver.poll_event(), Some(UpstreamEvent::Product(p)) if p.info == small));
    assert!(matches!(receiver.poll_event(), Some(UpstreamEvent::ComingSoon { info, .. }) if info == big));
    receiver.answer_coming_soon(now, true).unwrap();
    exchange(&mut receiver, &mut pusher);
    exchange(&mut receiver, &mut pusher);
    assert!(matches!(receiver.poll_event(), Some(UpstreamEvent::Product(p)) if p.data == big_data));
    pusher.flush(now).unwrap();
    exchange(&mut receiver, &mut pusher);
    assert!(matches!(pusher.poll_event(), Some(PushEvent::Flushed)));
}

/// Hex words of a transcript's byte stream (`NNNNNNNN  xxxxxxxx xxxxxxxx … |…|` lines) after
/// the line starting with `header`; `None` (the test skips) when the shared data is absent.
fn capture_stream(file: &str, header: &str) -> Option<Vec<u8>> {
    let path = ldm7_testkit::shared_data_or_skip(&format!("captures/{file}"))?;
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut bytes = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with(header) {
            inside = true;
            continue;
        }
        if inside {
            let Some((offset, rest)) = line.split_once("  ") else { break };
            if offset.len() != 8 || !offset.chars().all(|c| c.is_ascii_hexdigit()) {
                break;
            }
            for word in rest.split('|').next().unwrap_or("").split_whitespace() {
                for k in (0..word.len()).step_by(2) {
                    bytes.push(u8::from_str_radix(&word[k..k + 2], 16).unwrap());
                }
            }
        }
    }
    Some(bytes)
}

/// Splits a byte stream into records (single fragments, as in the captures).
fn split_records(mut bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut records = Vec::new();
    while bytes.len() >= 4 {
        let len = (u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) & 0x7fff_ffff) as usize;
        records.push(bytes[..4 + len].to_vec());
        bytes = &bytes[4 + len..];
    }
    records
}

#[test]
fn our_upstream_answers_the_captured_feedme_with_the_captured_bytes() {
    // The real downstream's FEEDME (LDM 6.15), fed to our upstream session: the reply and the
    // HEREIS records must be the bytes the real upstream sent, except the xids of our calls.
    let Some(client) = capture_stream("ldm6-feedme-primary.txt", "### Byte stream C>S") else { return };
    let Some(server) = capture_stream("ldm6-feedme-primary.txt", "### Byte stream S>C") else { return };
    let (client, server) = (split_records(&client), split_records(&server));
    let now = Instant::from_nanos(1_000_000_000);
    let mut up = Upstream::new(now);
    up.handle_input(now, &client[0]);
    let Some(UpstreamEvent::FeedRequest { class, mode: FeedMode::Primary, resume_after: None }) = up.poll_event()
    else {
        panic!("no FEEDME")
    };
    assert_eq!(class.to_string(), "20261122080618.545555 TS_ENDT {{EXP, \".*\"}}");
    up.answer_request(now, RequestAnswer::Ok { id: 29362 }).unwrap();
    let mut reply = Vec::new();
    up.take_output(&mut reply);
    assert_eq!(reply, server[0], "FEEDME reply");
    up.handle_timeout(now + Duration::from_secs(1));
    assert!(matches!(up.poll_event(), Some(UpstreamEvent::FeedStarted)));
    for record in &server[1..4] {
        // Re-send the captured product through our session.
        let decoded = ldm7_xdr::ldm::decode_message(&record[4..], |_| None).unwrap();
        let ldm7_xdr::ldm::Message::Call(ldm7_xdr::ldm::Call {
            call: ldm7_xdr::ldm::LdmCall::Hereis { info, data },
            ..
        }) = decoded
        else {
            panic!("not a HEREIS")
        };
        up.send_product(now, &info, &data).unwrap();
        let mut ours = Vec::new();
        up.take_output(&mut ours);
        assert_eq!(ours.len(), record.len());
        assert_eq!(ours[8..], record[8..], "HEREIS of {} differs beyond the xid", info.ident);
    }
    up.flush(now);
    let mut flush = Vec::new();
    up.take_output(&mut flush);
    assert_eq!(flush[8..], server[4][8..], "NULLPROC flush");
}

#[test]
fn our_downstream_feedme_has_the_captured_layout() {
    let Some(client) = capture_stream("ldm6-feedme-primary.txt", "### Byte stream C>S") else { return };
    let client = split_records(&client);
    let decoded = ldm7_xdr::ldm::decode_message(&client[0][4..], |_| None).unwrap();
    let ldm7_xdr::ldm::Message::Call(ldm7_xdr::ldm::Call {
        call: ldm7_xdr::ldm::LdmCall::Feedme { class, .. }, ..
    }) = decoded
    else {
        panic!("not a FEEDME")
    };
    let (class, _) = ldm7_ldm_proto::compile_class(&class).unwrap();
    let now = Instant::from_nanos(1_000_000_000);
    let mut down = Downstream::new(now, DownstreamConfig::new(class));
    let mut ours = Vec::new();
    down.take_output(&mut ours);
    assert_eq!(ours.len(), client[0].len());
    assert_eq!(ours[8..], client[0][8..], "FEEDME beyond the xid");
}

fn small_limits() -> UpstreamLimits {
    UpstreamLimits {
        call_bytes_max: 16 << 10,
        push_record_bytes_max: 1 << 20,
        first_call_timeout: Duration::from_secs(5),
        push_idle_timeout: Duration::from_secs(3),
    }
}

/// A pushing client whose HIYA `receiver` accepted.
fn push_accepted(now: Instant, receiver: &mut Upstream) -> PushClient {
    let mut pusher = PushClient::new(now, &exp_class());
    let mut bytes = Vec::new();
    pusher.take_output(&mut bytes);
    receiver.handle_input(now, &bytes);
    assert!(matches!(receiver.poll_event(), Some(UpstreamEvent::Hiya { .. })));
    receiver.answer_hiya(now, HiyaAnswer::Ok { max_hereis: u32::MAX }).unwrap();
    let mut back = Vec::new();
    receiver.take_output(&mut back);
    pusher.handle_input(now, &back);
    assert!(matches!(pusher.poll_event(), Some(PushEvent::Accepted { .. })));
    pusher
}

/// Regression (issue #16): a record marker announcing a huge record before any session was
/// buffered up to 256 MiB. Now the header alone is refused, before a byte of the record is
/// kept, and a record split into fragments is bounded by its total.
#[test]
fn a_record_over_the_bound_is_refused_at_its_header_before_a_session() {
    let now = Instant::from_nanos(1_000_000_000);
    let mut up = Upstream::with_limits(now, small_limits());
    up.handle_input(now, &(0x8000_0000u32 | (200 << 20)).to_be_bytes());
    match up.poll_event() {
        Some(UpstreamEvent::Closed(Err(SessionError::Malformed(error)))) => {
            assert!(error.to_string().contains("exceeds the limit of 16384"), "{error}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(up.closed_by(), Some(LimitHit::RecordTooLong));
    // Fragments of 4 KiB, none last: refused once their total passes the bound.
    let mut up = Upstream::with_limits(now, small_limits());
    let mut fed = 0;
    while !up.is_closed() {
        let mut fragment = (4096u32).to_be_bytes().to_vec();
        fragment.resize(4 + 4096, 0);
        up.handle_input(now, &fragment);
        fed += 4096;
        assert!(fed <= 20 << 10, "still reading after {fed} bytes");
    }
    assert_eq!(up.closed_by(), Some(LimitHit::RecordTooLong));
}

#[test]
fn a_push_takes_products_larger_than_the_call_bound() {
    let now = Instant::from_nanos(1_000_000_000);
    let mut receiver = Upstream::with_limits(now, small_limits());
    let mut pusher = push_accepted(now, &mut receiver);
    let (info, data) = product(1, 600 << 10);
    pusher.send_product(now, &info, &data).unwrap();
    let mut bytes = Vec::new();
    pusher.take_output(&mut bytes);
    // Read the way the server reads: straight into the session's record buffer.
    let mut rest = &bytes[..];
    while !rest.is_empty() {
        let space = receiver.input_space();
        let len = space.len().min(rest.len());
        space[..len].copy_from_slice(&rest[..len]);
        receiver.handle_input_filled(now, len);
        rest = &rest[len..];
    }
    assert!(matches!(receiver.poll_event(), Some(UpstreamEvent::Product(p)) if p.data == data));
    // A product over the push bound (1 MiB here; the queue's capacity in the server) is not.
    let (info, data) = product(2, 2 << 20);
    pusher.send_product(now, &info, &data).unwrap();
    let mut bytes = Vec::new();
    pusher.take_output(&mut bytes);
    receiver.handle_input(now, &bytes[..64]);
    assert!(matches!(receiver.poll_event(), Some(UpstreamEvent::Closed(Err(_)))));
    assert_eq!(receiver.closed_by(), Some(LimitHit::RecordTooLong));
}

#[test]
fn an_idle_connection_is_closed_at_the_first_call_timeout_and_an_idle_push_later() {
    let now = Instant::from_nanos(1_000_000_000);
    let limits = small_limits();
    let mut up = Upstream::with_limits(now, limits);
    // NULLPROCs are answered but do not extend the limit.
    let nullproc = [0x8000_0028_u32, 1, 0, 2, 0x0004_93fd, 6, 0, 0, 0, 0, 0];
    let nullproc: Vec<u8> = nullproc.iter().flat_map(|w| w.to_be_bytes()).collect();
    up.handle_input(now + Duration::from_secs(4), &nullproc);
    assert!(up.has_output());
    assert_eq!(up.poll_timeout(), Some(now + limits.first_call_timeout));
    up.handle_timeout(now + limits.first_call_timeout);
    assert!(matches!(up.poll_event(), Some(UpstreamEvent::Closed(Err(SessionError::Silence(5))))));
    assert_eq!(up.closed_by(), Some(LimitHit::FirstCallTimeout));
    // A push: each byte received restarts its idle bound.
    let mut receiver = Upstream::with_limits(now, limits);
    let mut pusher = push_accepted(now, &mut receiver);
    let (info, data) = product(1, 100);
    pusher.send_product(now, &info, &data).unwrap();
    let mut bytes = Vec::new();
    pusher.take_output(&mut bytes);
    let later = now + Duration::from_secs(2);
    receiver.handle_input(later, &bytes);
    assert!(matches!(receiver.poll_event(), Some(UpstreamEvent::Product(_))));
    assert_eq!(receiver.poll_timeout(), Some(later + limits.push_idle_timeout));
    receiver.handle_timeout(later + Duration::from_secs(2));
    assert!(!receiver.is_closed());
    receiver.handle_timeout(later + limits.push_idle_timeout);
    assert!(matches!(receiver.poll_event(), Some(UpstreamEvent::Closed(Err(SessionError::Silence(3))))));
    assert_eq!(receiver.closed_by(), Some(LimitHit::PushIdle));
}

#[test]
fn an_idle_connection_holds_no_input_buffer_once_released() {
    let now = Instant::from_nanos(1_000_000_000);
    let mut up = Upstream::with_limits(now, small_limits());
    assert!(up.input_space().len() <= 4096, "a small first buffer");
    assert!(up.release_idle_buffers());
    assert!(!up.release_idle_buffers(), "nothing held any more");
}
