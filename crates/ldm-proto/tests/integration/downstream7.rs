//! The LDM-7 subscriber's decisions (`Downstream7`) in virtual time: each decision of the
//! module documentation, from what FMTP, the control session and the inserter report, with
//! time an argument — including a reference publisher's sessions, which never send END_BACKLOG
//! (the control session reports the backlog complete when its fence is answered).

use std::time::Duration;

use ldm7_ldm_proto::downstream7::{
    BACKLOG_WAIT, BacklogReason, Downstream7, Downstream7Config, FIRST_QUIET, FmtpReport, INDEX_GAP_REQUESTS_MAX,
    ResumePoint, TAIL_OFFSET, TAIL_QUIET, UpstreamRequest,
};
use ldm7_ldm_proto::{BacklogSpec, fence_index};
use ldm7_types::{Instant, Signature};

fn signature(n: u8) -> Signature {
    Signature([n; 16])
}

fn config() -> Downstream7Config {
    Downstream7Config {
        time_offset: Duration::from_secs(3600),
        retry_min: Duration::from_secs(1),
        retry_max: Duration::from_secs(8),
    }
}

fn at(seconds: u64) -> Instant {
    Instant::from_nanos(1_000_000_000 + seconds * 1_000_000_000)
}

fn decisions(downstream: &mut Downstream7) -> Vec<UpstreamRequest> {
    std::iter::from_fn(|| downstream.poll_decision()).collect()
}

/// The REQUEST_BACKLOG from the resume point `after` (or an hour back) up to `before` (or the
/// newest product).
fn backlog(after: Option<Signature>, before: Option<Signature>) -> BacklogSpec {
    BacklogSpec {
        after: after.unwrap_or(Signature([0; 16])),
        after_is_set: after.is_some(),
        before: before.unwrap_or(Signature([0; 16])),
        time_offset_secs: 3600,
    }
}

#[test]
fn a_lossy_session_asks_its_backlog_when_its_first_product_is_resolved_not_before() {
    let mut downstream = Downstream7::new(config(), Some(signature(1)));
    downstream.session_started(at(0));
    downstream.fmtp(at(0), FmtpReport::Connected, Some((0, 0)));
    downstream.fmtp(at(0), FmtpReport::Started(10), Some((1, 1)));
    assert_eq!(downstream.poll_timeout(), Some(at(0) + BACKLOG_WAIT), "datagrams come: not a quiet feed");
    downstream.fmtp(at(1), FmtpReport::Delivered(12, Some(signature(12))), Some((40, 1)));
    downstream.handle_timeout(at(3), Some((40, 1)));
    assert_eq!(decisions(&mut downstream), [], "10, the first, is still being repaired");
    downstream.fmtp(at(4), FmtpReport::Delivered(10, Some(signature(10))), Some((60, 0)));
    assert_eq!(
        decisions(&mut downstream),
        [UpstreamRequest::RequestBacklog {
            spec: backlog(Some(signature(1)), Some(signature(10))),
            fence: Some(fence_index(12)),
            reason: BacklogReason::BeforeFirst,
        }]
    );
    downstream.fmtp(at(5), FmtpReport::Delivered(11, Some(signature(11))), Some((70, 0)));
    assert_eq!(decisions(&mut downstream), [], "once a session");
}

#[test]
fn a_first_product_the_backstop_brings_or_the_upstream_lost_ends_the_backlog_too() {
    let mut downstream = Downstream7::new(config(), None);
    downstream.session_started(at(0));
    downstream.fmtp(at(0), FmtpReport::Connected, None);
    downstream.fmtp(at(0), FmtpReport::Missed(10), None);
    assert_eq!(decisions(&mut downstream), [UpstreamRequest::RequestProduct(10)]);
    downstream.no_such_product(10);
    assert_eq!(decisions(&mut downstream), [], "the upstream no longer has it: the next one with its signature");
    downstream.backstop_delivered(11, signature(11));
    assert_eq!(
        decisions(&mut downstream),
        [UpstreamRequest::RequestBacklog {
            spec: backlog(None, Some(signature(11))),
            fence: Some(fence_index(10)),
            reason: BacklogReason::BeforeFirst,
        }]
    );
}

#[test]
fn a_quiet_feed_asks_up_to_the_newest_product_and_fences_it_with_the_first_index() {
    let mut downstream = Downstream7::new(config(), Some(signature(1)));
    downstream.session_started(at(0));
    assert_eq!(downstream.poll_timeout(), None, "nothing before the FMTP connection");
    downstream.fmtp(at(0), FmtpReport::Connected, Some((0, 0)));
    assert_eq!(downstream.poll_timeout(), Some(at(0) + FIRST_QUIET));
    downstream.handle_timeout(at(1), Some((0, 0)));
    assert_eq!(decisions(&mut downstream), [], "early");
    downstream.handle_timeout(at(0) + FIRST_QUIET, Some((0, 0)));
    assert_eq!(
        decisions(&mut downstream),
        [UpstreamRequest::RequestBacklog {
            spec: backlog(Some(signature(1)), None),
            fence: None,
            reason: BacklogReason::UpToNewest
        }]
    );
    downstream.fmtp(at(5), FmtpReport::Started(40), Some((1, 1)));
    assert_eq!(decisions(&mut downstream), [UpstreamRequest::FenceBacklogs(fence_index(40))]);
    downstream.fmtp(at(6), FmtpReport::Delivered(40, Some(signature(40))), Some((9, 0)));
    assert_eq!(decisions(&mut downstream), [], "asked already");
}

#[test]
fn nothing_resolved_for_long_asks_up_to_the_newest() {
    let mut downstream = Downstream7::new(config(), None);
    downstream.session_started(at(0));
    downstream.fmtp(at(0), FmtpReport::Connected, None);
    downstream.fmtp(at(1), FmtpReport::Started(7), None);
    downstream.handle_timeout(at(0) + BACKLOG_WAIT, None);
    let [UpstreamRequest::RequestBacklog { reason: BacklogReason::UpToNewest, fence, .. }] =
        decisions(&mut downstream)[..]
    else {
        panic!("a backlog up to the newest");
    };
    assert_eq!(fence, Some(fence_index(7)));
}

#[test]
fn missed_products_gaps_and_unusable_ones_go_to_the_backstop() {
    let mut downstream = Downstream7::new(config(), None);
    downstream.session_started(at(0));
    downstream.fmtp(at(0), FmtpReport::Missed(5), None);
    downstream.fmtp(at(0), FmtpReport::IndexGap(7, 9), None);
    downstream.unusable(12);
    assert_eq!(
        decisions(&mut downstream),
        [5, 7, 8, 9, 12].map(UpstreamRequest::RequestProduct),
        "each in the order FMTP and the inserter reported"
    );
    downstream.fmtp(at(0), FmtpReport::IndexGap(100, 100 + 2 * INDEX_GAP_REQUESTS_MAX), None);
    assert_eq!(decisions(&mut downstream).len(), INDEX_GAP_REQUESTS_MAX as usize, "bounded");
}

#[test]
fn the_tail_is_checked_after_the_backlog_once_per_newest_product_when_nothing_comes() {
    // A reference publisher: no END_BACKLOG; the control session reports the backlog complete
    // when its fence is answered, which is all the decisions see.
    let mut downstream = Downstream7::new(config(), None);
    downstream.session_started(at(0));
    downstream.fmtp(at(0), FmtpReport::Connected, Some((0, 0)));
    downstream.fmtp(at(0), FmtpReport::Started(1), Some((1, 1)));
    downstream.fmtp(at(1), FmtpReport::Delivered(1, Some(signature(1))), Some((10, 0)));
    let _ = decisions(&mut downstream);
    downstream.inserted(1, signature(1));
    assert_eq!(downstream.poll_timeout(), None, "asked for the backlog; no tail check before it is complete");
    assert!(!downstream.backlog_complete(), "the session's own backlog");
    assert_eq!(downstream.poll_timeout(), Some(at(1) + TAIL_QUIET));
    // Messages arrived since the last notice (repairs still coming): look again later.
    downstream.handle_timeout(at(1) + TAIL_QUIET, Some((14, 0)));
    assert_eq!(decisions(&mut downstream), []);
    let again = downstream.poll_timeout().expect("looks again");
    // Products in FMTP's hands: FMTP resolves them itself.
    downstream.handle_timeout(again, Some((14, 2)));
    assert_eq!(decisions(&mut downstream), []);
    let again = downstream.poll_timeout().expect("looks again");
    downstream.handle_timeout(again, Some((14, 0)));
    assert_eq!(
        decisions(&mut downstream),
        [UpstreamRequest::RequestBacklog {
            spec: BacklogSpec {
                after: signature(1),
                after_is_set: true,
                before: Signature([0; 16]),
                time_offset_secs: TAIL_OFFSET.as_secs() as u32,
            },
            fence: Some(fence_index(1)),
            reason: BacklogReason::Tail,
        }]
    );
    assert_eq!(downstream.poll_timeout(), None, "asked: nothing until it is answered");
    assert!(downstream.backlog_complete(), "the tail check's backlog (logged quietly)");
    assert_eq!(downstream.poll_timeout(), None, "once per newest product");
    downstream.fmtp(at(30), FmtpReport::Delivered(2, Some(signature(2))), Some((20, 0)));
    downstream.inserted(2, signature(2));
    assert_eq!(downstream.poll_timeout(), Some(at(30) + TAIL_QUIET), "a newer product: checked again");
}

#[test]
fn the_resume_point_moves_along_the_resolved_prefix_once_the_backlog_is_complete() {
    let mut downstream = Downstream7::new(config(), None);
    downstream.session_started(at(0));
    downstream.fmtp(at(0), FmtpReport::Started(10), None);
    downstream.inserted(12, signature(12)); // 11 still in FMTP's hands
    downstream.inserted(10, signature(10));
    assert_eq!(downstream.resume_to_save(), None, "not before the session's backlog is complete");
    downstream.backlog_complete();
    assert_eq!(downstream.resume_to_save(), Some(signature(10)), "below 11, not yet resolved");
    downstream.resume_saved();
    assert_eq!(downstream.resume_to_save(), None);
    downstream.backstop_delivered(11, signature(11));
    assert_eq!(downstream.resume_to_save(), Some(signature(12)));
    downstream.resume_saved();
    // A new session keeps the point until its own backlog is complete, and starts its backlog
    // after it.
    downstream.session_started(at(10));
    downstream.fmtp(at(10), FmtpReport::Started(20), None);
    downstream.inserted(20, signature(20));
    assert_eq!(downstream.resume_to_save(), None);
    downstream.fmtp(at(11), FmtpReport::Delivered(20, Some(signature(20))), None);
    let [UpstreamRequest::RequestBacklog { spec, .. }] = decisions(&mut downstream)[..] else { panic!("the backlog") };
    assert_eq!(spec.after(), Some(signature(12)));
    downstream.backlog_complete();
    assert_eq!(downstream.resume_to_save(), Some(signature(20)));
}

#[test]
fn the_resume_prefix_skips_given_up_products_and_ignores_the_backlogs() {
    let mut resume = ResumePoint::new(None);
    assert_eq!(resume.session_started(), None);
    resume.seen(10);
    resume.resolved(10, Some(signature(10)));
    resume.backlog_complete();
    resume.resolved(9, Some(signature(9))); // before the first index: the backlog's
    assert_eq!(resume.point(), Some(signature(10)));
    resume.resolved(12, Some(signature(12)));
    resume.resolved(11, None); // the upstream no longer has it: given up
    assert_eq!(resume.point(), Some(signature(12)));
}

#[test]
fn resubscription_backs_off_doubling_and_starts_over_after_a_session_that_worked() {
    let mut downstream = Downstream7::new(config(), None);
    let mut now = at(0);
    let mut delays = Vec::new();
    for _ in 0..6 {
        downstream.session_started(now);
        let resubscribe = downstream.session_ended(now);
        assert_eq!(resubscribe.outage_starts, delays.is_empty(), "only the first end of an outage is loud");
        delays.push(resubscribe.delay.as_secs());
        now = now + resubscribe.delay;
    }
    assert_eq!(delays, [1, 2, 4, 8, 8, 8]);
    assert!(downstream.in_outage());
    downstream.session_started(now);
    assert!(downstream.subscribed(), "the outage ends: log the resubscription");
    assert!(!downstream.subscribed());
    // The session worked for longer than the longest delay: the schedule starts over.
    let resubscribe = downstream.session_ended(now + Duration::from_secs(60));
    assert_eq!(
        resubscribe,
        ldm7_ldm_proto::downstream7::Resubscribe { delay: Duration::from_secs(1), outage_starts: true }
    );
}
