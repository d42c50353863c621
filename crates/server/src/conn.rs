//! One accepted connection: the sans-IO [`Inbound`] session driven over a blocking socket in
//! its own thread (LDM forks a process per connection; a thread is our equivalent). The first
//! call decides: LDM-6 calls are served here as an [`Upstream`]; an LDM-7 call (SUBSCRIBE) hands
//! the connection to the multicast service ([`crate::multicast::upstream7`]).
//!
//! Feeding reads the queue with a [`ldm7_pq::Follower`] from the requested position and
//! writes products in batches; when it catches up it flushes with NULLPROC and waits for the
//! queue to change (or for the keep-alive to be due).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ldm7_io::Clock;
use ldm7_ldm_proto::{FeedMode, HiyaAnswer, Inbound, LimitHit, RequestAnswer, Upstream, UpstreamEvent, UpstreamLimits};
use ldm7_types::{ProdClass, Signature, Timestamp};

use ldm7_io::log_target::PRODUCT;
use ldm7_ldm_proto::SessionError;

use crate::Shared;
use crate::access::{self, PeerHost};
use crate::limits::{ConnectionRefusal, FeederRegistration};
use crate::wait::{Input, wait_input_or_stop};

/// Write when this much output is pending.
const WRITE_BATCH: usize = 256 << 10;
/// Most products sent under one read transaction.
const BATCH_MAX: usize = 64;
/// The read buffer of a connection that went LDM-7 (its peer sends only small calls).
const UPSTREAM7_READ: usize = 64 << 10;
/// How long product data is written straight from a queue snapshot while the socket drains;
/// what is still unwritten then is copied and the snapshot released.
const SNAPSHOT_SEND_MAX: Duration = Duration::from_millis(100);

/// Why a served connection ended before its peer closed it.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    /// The session failed: a malformed record, a protocol error, a call timed out.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// The peer cannot be written to (it closed the connection or the network failed); a
    /// downstream reconnects by itself.
    #[error("cannot write to the peer: {0}")]
    Write(#[source] std::io::Error),
    /// The product queue cannot be read: check it with `ldm7 queue check`.
    #[error("reading the queue: {0}: check it with `ldm7 queue check`")]
    Queue(#[source] ldm7_pq::StorageError),
}

/// What the feeding part needs once a FEEDME or NOTIFYME was accepted.
struct Feed {
    class: ProdClass,
    filter: access::ProductFilter,
    resume_after: Option<Signature>,
    notify: bool,
}

/// Serves one connection until it closes or the server shuts down.
pub(crate) fn serve(shared: Arc<Shared>, stream: TcpStream, peer: PeerHost) {
    let name = peer.to_string();
    let mut registration = None;
    let result = serve_inner(&shared, stream, &peer, &mut registration);
    let replaced = registration.as_ref().is_some_and(FeederRegistration::is_replaced);
    match result {
        Ok(()) => tracing::debug!("{name}: connection closed"),
        // Its socket was shut down by the feed that replaced it: that was logged.
        Err(error) if replaced => tracing::debug!("{name}: replaced feed ended: {error}"),
        Err(error) => tracing::warn!("{name}: {error}"),
    }
}

/// The bounds of a connection's session: the `[ldm6]` settings, and products up to what the
/// queue can hold.
fn limits(shared: &Shared) -> UpstreamLimits {
    let settings = &shared.options.settings.ldm6;
    // A record is the product plus its call header and metadata (well under 4 KiB).
    let queue_record_max = usize::try_from(shared.queue.capacity().bytes).unwrap_or(usize::MAX).saturating_add(4096);
    UpstreamLimits {
        call_bytes_max: usize::try_from(settings.call_bytes_max.bytes()).unwrap_or(usize::MAX),
        push_record_bytes_max: queue_record_max.min(ldm7_ldm_proto::RECORD_MAX),
        first_call_timeout: settings.first_call_timeout,
        push_idle_timeout: settings.push_idle_timeout,
    }
}

fn serve_inner(
    shared: &Shared,
    mut stream: TcpStream,
    peer: &PeerHost,
    registration: &mut Option<FeederRegistration>,
) -> Result<(), ConnectionError> {
    stream.set_nodelay(true).ok();
    let config = shared.config();
    if !access::is_host_allowed(&config, peer) {
        shared.counters.refusals.refuse(ConnectionRefusal::Host, || {
            format!("Denying connection from {peer}: no ALLOW or ACCEPT entry matches")
        });
        refuse_host(&mut stream);
        return Ok(());
    }
    tracing::info!(target: PRODUCT, "Connection from {peer}");
    let limits = limits(shared);
    let mut inbound = Inbound::with_limits(Clock::now(), limits);
    let mut serving =
        Serving { shared, peer, config, limits, feed: None, accepted: None, follower_from: None, out: Vec::new() };
    loop {
        let Some(session) = inbound.upstream() else {
            let buf = vec![0u8; UPSTREAM7_READ];
            return crate::multicast::upstream7::serve(shared, stream, peer, inbound, buf);
        };
        // Decisions and state changes.
        while let Some(event) = session.poll_event() {
            if let Step::End = serving.on_event(session, &mut stream, registration, event)? {
                return Ok(());
            }
        }
        write_all(&mut stream, session, &mut serving.out)?;
        if shared.is_stopping() || registration.as_ref().is_some_and(FeederRegistration::is_replaced) {
            return Ok(());
        }
        // Feeding: products while ready; else read the socket until the next timeout.
        if let (Some(from), Some(feed)) = (serving.follower_from, &serving.feed)
            && session.ready()
        {
            let next =
                feed_products(shared, session, &mut stream, &mut serving.out, from, feed, registration.as_ref())?;
            serving.follower_from = Some(next);
            continue;
        }
        let timeout = inbound.poll_timeout();
        let Some(space) = inbound.input_space() else { continue };
        // Read straight into the session's record buffer (no copy).
        // Until input, the session's next timeout or the server's stop.
        match wait_input_or_stop(&mut stream, space, timeout, None, &shared.stop) {
            Ok(Input::Bytes(n)) => inbound.handle_input_filled(Clock::now(), n),
            Ok(Input::Timeout) => {
                // Quiet: the buffer goes back until bytes come again.
                inbound.release_idle_buffers();
                inbound.handle_timeout(Clock::now());
            }
            Ok(Input::Eof) => inbound.handle_eof(),
            Ok(Input::Stopped) => return Ok(()),
            Err(error) => {
                inbound.handle_eof();
                tracing::debug!("{peer}: read: {error}");
            }
        }
    }
}

/// What serving one LDM-6 connection holds between session events.
struct Serving<'a> {
    shared: &'a Shared,
    peer: &'a PeerHost,
    config: Arc<crate::config::Config>,
    limits: UpstreamLimits,
    /// The accepted FEEDME or NOTIFYME.
    feed: Option<Feed>,
    /// The class an accepted HIYA may send.
    accepted: Option<ProdClass>,
    /// Where feeding goes on in the queue, once it started.
    follower_from: Option<Timestamp>,
    /// Output not yet written (allocated when a feed starts: an idle connection holds only its
    /// session's small record buffer).
    out: Vec<u8>,
}

/// After a session event: go on, or the connection ends.
enum Step {
    Continue,
    End,
}

impl Serving<'_> {
    /// Decides on one session event and changes the state it names.
    fn on_event(
        &mut self,
        session: &mut Upstream,
        stream: &mut TcpStream,
        registration: &mut Option<FeederRegistration>,
        event: UpstreamEvent,
    ) -> Result<Step, ConnectionError> {
        let (shared, peer) = (self.shared, self.peer);
        match event {
            UpstreamEvent::FeedRequest { class, mode, resume_after } => {
                let (answer, filter) = decide_request(shared, peer, &class);
                if let RequestAnswer::Ok { .. } = answer {
                    tracing::info!(
                        "Starting Up(ldm7/6): {class}, SIG={}, {}",
                        resume_after.map_or("NONE".to_owned(), |s| s.to_string()),
                        if mode == FeedMode::Primary { "Primary" } else { "Alternate" }
                    );
                    *registration = Some(register_feeder(shared, peer, stream, &class));
                    self.feed = Some(Feed { class, filter, resume_after, notify: false });
                }
                session.answer_request(Clock::now(), answer)?;
            }
            UpstreamEvent::NotifyRequest { class } => {
                let (answer, filter) = decide_request(shared, peer, &class);
                if let RequestAnswer::Ok { .. } = answer {
                    tracing::info!("Starting Up(ldm7/6): NOTIFYME {class}");
                    self.feed = Some(Feed { class, filter, resume_after: None, notify: true });
                }
                session.answer_request(Clock::now(), answer)?;
            }
            UpstreamEvent::Hiya { class } => {
                tracing::info!("hiya6: {class}");
                let (decision, accepted_class) = access::accept(&self.config, peer, &class);
                let answer = match decision {
                    access::AcceptDecision::Ok => HiyaAnswer::Ok { max_hereis: u32::MAX },
                    access::AcceptDecision::Reclass(class) => HiyaAnswer::Reclass { class, max_hereis: u32::MAX },
                    access::AcceptDecision::Refuse => {
                        tracing::info!("{peer}: no ACCEPT entry takes {class}");
                        HiyaAnswer::Refuse
                    }
                };
                self.accepted = Some(accepted_class);
                session.answer_hiya(Clock::now(), answer)?;
            }
            UpstreamEvent::IsAlive { id } => {
                session.answer_is_alive(Clock::now(), shared.is_alive(id))?;
            }
            UpstreamEvent::FeedStarted => {
                // The session starts feeding only after an accepted FEEDME or NOTIFYME, which
                // set `feed`.
                if let Some(feed) = &self.feed {
                    self.follower_from = Some(start_position(shared, feed));
                    self.out.reserve(WRITE_BATCH * 2);
                }
            }
            UpstreamEvent::Declined { signature } => {
                tracing::debug!("{peer}: declined {signature}");
            }
            UpstreamEvent::Product(product) => {
                let wanted = self
                    .accepted
                    .as_ref()
                    .is_some_and(|class| class.matches_feed_ident(product.info.feedtype, &product.info.ident));
                if wanted {
                    crate::receive::insert(shared, &peer.origin_name(), product.info, &product.data);
                } else {
                    tracing::warn!("{peer}: ignoring unaccepted product: {}", product.info);
                }
            }
            UpstreamEvent::ComingSoon { info, .. } => {
                let accept = crate::receive::wants(shared, &info);
                session.answer_coming_soon(Clock::now(), accept)?;
            }
            UpstreamEvent::BadPattern(error) => tracing::warn!("{peer}: {error}"),
            UpstreamEvent::Unserved(call) => {
                shared.counters.unserved_calls.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("{peer}: {call}; answered as RPC does");
            }
            UpstreamEvent::Closed(result) => {
                if let Some(hit) = session.closed_by() {
                    // A bound closed the session: logged and counted as a refusal.
                    refuse_by_limit(shared, peer, hit, &self.limits, &result);
                    let _ = write_all(stream, session, &mut self.out);
                    return Ok(Step::End);
                }
                if let Err(ldm7_ldm_proto::SessionError::Malformed(_)) = &result {
                    shared.counters.malformed.fetch_add(1, Ordering::Relaxed);
                }
                write_all(stream, session, &mut self.out)?;
                result?;
                return Ok(Step::End);
            }
        }
        Ok(Step::Continue)
    }
}

/// Registers an accepted FEEDME; with `one_feeder_per_host`, the feeds this server sends the
/// same host that the request covers end (ldm6-protocol.md §6.1 step 3; [`crate::limits`]).
fn register_feeder(shared: &Shared, peer: &PeerHost, stream: &TcpStream, class: &ProdClass) -> FeederRegistration {
    let replace = shared.options.settings.ldm6.one_feeder_per_host;
    let (registration, replaced) = shared.feeders.register(peer.ip, class, stream.try_clone().ok(), replace);
    if !replaced.is_empty() {
        // A replaced feed's thread may wait for the queue to change: it wakes, sees its flag
        // and ends (its socket, shut down, wakes a read).
        shared.queue.wake_waiters();
    }
    for old in replaced {
        shared.counters.refusals.refuse(ConnectionRefusal::Replaced, || {
            format!(
                "{peer}: a new FEEDME for {class} (feed #{}) replaces feed #{} of {} to the same host; that \
                 connection is closed (one feeder per host and feed: ldm6.one_feeder_per_host)",
                registration.id, old.id, old.class
            )
        });
    }
    registration
}

/// Logs and counts a session a bound closed.
fn refuse_by_limit(
    shared: &Shared,
    peer: &PeerHost,
    hit: LimitHit,
    limits: &UpstreamLimits,
    result: &Result<(), ldm7_ldm_proto::SessionError>,
) {
    let refusals = &shared.counters.refusals;
    match hit {
        LimitHit::FirstCallTimeout => refusals.refuse(ConnectionRefusal::Idle, || {
            format!(
                "closing the connection from {peer}: no FEEDME, NOTIFYME or HIYA within {:?} \
                 (ldm6.first_call_timeout)",
                limits.first_call_timeout
            )
        }),
        LimitHit::PushIdle => refusals.refuse(ConnectionRefusal::Idle, || {
            format!(
                "closing the push connection from {peer}: nothing received for {:?} (ldm6.push_idle_timeout)",
                limits.push_idle_timeout
            )
        }),
        LimitHit::RecordTooLong => refusals.refuse(ConnectionRefusal::RecordTooLong, || {
            let why = match result {
                Err(error) => error.to_string(),
                Ok(()) => "record too long".into(),
            };
            format!(
                "closing the connection from {peer}: {why}, refused before reading it (ldm6.call_bytes_max \
                 before a session; the queue's capacity on a push)"
            )
        }),
    }
}

/// Sends products from `from` on while the session is ready; returns where to go on. Products
/// are read in batches under one read transaction; a primary feed's data is written straight
/// from the queue as the socket takes it, for at most [`SNAPSHOT_SEND_MAX`]; what remains then
/// is copied and written after the transaction is released, so a slow downstream never pins
/// queue pages for long.
/// When caught up, flushes and waits for the queue to change until the next session timeout.
fn feed_products(
    shared: &Shared,
    session: &mut Upstream,
    stream: &mut TcpStream,
    out: &mut Vec<u8>,
    from: Timestamp,
    feed: &Feed,
    registration: Option<&FeederRegistration>,
) -> Result<Timestamp, ConnectionError> {
    let queue = &shared.queue;
    let storage = ConnectionError::Queue;
    let mut position = from;
    let mut sent = 0u64;
    while session.ready() {
        let changes = queue.changes();
        let mut caught_up = true;
        {
            let snapshot = queue.snapshot().map_err(storage)?;
            // A primary feed's data goes from the queue to the socket without a copy: the
            // pieces are HEREIS heads (in `out`), product data in the snapshot, and padding.
            let vectored = session.sends_hereis();
            let mut pieces: Vec<Piece<'_>> = Vec::new();
            // Bytes of product data and padding in `pieces` (the rest is in `out`).
            let mut piece_bytes = 0;
            let mut batch = 0;
            for product in snapshot.products_from(position).map_err(storage)? {
                let product = product.map_err(storage)?;
                position = Timestamp::from_unix_micros(product.insertion.as_unix_micros() + 1);
                if feed.class.matches(&product.info) && feed.filter.allows(&product.info) {
                    if vectored {
                        let head_from = out.len();
                        let pad = session.send_product_head(Clock::now(), &product.info)?;
                        session.take_output(out);
                        pieces.push(Piece::Out(head_from..out.len()));
                        pieces.push(Piece::Data(product.data));
                        pieces.push(Piece::Pad(pad));
                        piece_bytes += product.data.len() + pad;
                    } else {
                        session.send_product(Clock::now(), &product.info, product.data)?;
                        session.take_output(out);
                    }
                    if feed.notify {
                        tracing::info!(target: PRODUCT, "notifying: {}", product.info);
                    } else {
                        tracing::info!(target: PRODUCT, "sending: {}", product.info);
                    }
                    sent += 1;
                    batch += 1;
                }
                if !session.ready() || out.len() + piece_bytes >= WRITE_BATCH || batch >= BATCH_MAX {
                    caught_up = false;
                    break;
                }
            }
            if !pieces.is_empty() {
                // What the socket takes soon goes straight from the queue; the rest is copied so
                // that the snapshot is released before a long blocking write.
                let deadline = std::time::Instant::now() + SNAPSHOT_SEND_MAX;
                let rest = send_until(stream, out, &pieces, deadline).map_err(ConnectionError::Write)?;
                out.clear();
                out.extend_from_slice(&rest);
            }
        }
        if !out.is_empty() {
            stream.write_all(out).map_err(ConnectionError::Write)?;
            out.clear();
        }
        if !caught_up {
            continue;
        }
        session.flush(Clock::now());
        if !session.ready() {
            // The flush waits for its reply: read it in the caller's loop.
            break;
        }
        // Nothing new and nothing unflushed: wait for products or the keep-alive.
        write_all(stream, session, out)?;
        let now = Clock::now();
        // Until an insert, the keep-alive, or a wake-up by the server's stop or a replacing
        // FEEDME (both wake the queue's waiters after setting their flags).
        let wait = session.poll_timeout().map(|at| at.saturating_duration_since(now));
        if wait.is_some_and(|wait| wait.is_zero()) {
            session.handle_timeout(now);
            break;
        }
        // Checked after `changes` was read: a stop or replacement after this check bumps the
        // counter, so the wait below returns at once.
        if shared.is_stopping() || registration.is_some_and(FeederRegistration::is_replaced) {
            break;
        }
        queue.wait_for_change(changes, wait);
        if shared.is_stopping() || registration.is_some_and(FeederRegistration::is_replaced) {
            break;
        }
    }
    shared.counters.products_sent.fetch_add(sent, Ordering::Relaxed);
    Ok(position)
}

/// A piece of output: bytes of the output buffer, product data in a queue snapshot, or XDR
/// padding.
enum Piece<'s> {
    Out(std::ops::Range<usize>),
    Data(&'s [u8]),
    Pad(usize),
}

/// Writes `out` up to the first piece, then the pieces in order (vectored), as far as the
/// socket takes them until `deadline`; returns the bytes not written, copied.
fn send_until(
    stream: &TcpStream,
    out: &[u8],
    pieces: &[Piece<'_>],
    deadline: std::time::Instant,
) -> std::io::Result<Vec<u8>> {
    const ZEROS: [u8; 4] = [0; 4];
    let first = match pieces.first() {
        Some(Piece::Out(range)) => range.start,
        _ => out.len(),
    };
    let mut slices = Vec::with_capacity(pieces.len() + 1);
    if first > 0 {
        slices.push(std::io::IoSlice::new(&out[..first]));
    }
    for piece in pieces {
        let bytes = match piece {
            Piece::Out(range) => &out[range.clone()],
            Piece::Data(data) => data,
            Piece::Pad(pad) => &ZEROS[..*pad],
        };
        if !bytes.is_empty() {
            slices.push(std::io::IoSlice::new(bytes));
        }
    }
    let socket = socket2::SockRef::from(stream);
    let mut remaining = &mut slices[..];
    while !remaining.is_empty() {
        // At most IOV_MAX slices per call.
        let count = remaining.len().min(1024);
        match socket.send_vectored_with_flags(&remaining[..count], libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) {
            Ok(0) => break,
            Ok(written) => std::io::IoSlice::advance_slices(&mut remaining, written),
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                if !wait_writable(stream, deadline) {
                    break;
                }
            }
            Err(error) => return Err(error),
        }
    }
    let mut rest = Vec::with_capacity(remaining.iter().map(|slice| slice.len()).sum());
    for slice in remaining.iter() {
        rest.extend_from_slice(slice);
    }
    Ok(rest)
}

/// Waits until the socket takes more bytes or `deadline` passes; whether it does.
fn wait_writable(stream: &TcpStream, deadline: std::time::Instant) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return false;
        }
        let timeout = PollTimeout::from(left.as_millis().clamp(1, u128::from(u16::MAX)) as u16);
        let mut fds = [PollFd::new(stream.as_fd(), PollFlags::POLLOUT)];
        match poll(&mut fds, timeout) {
            Ok(0) => return false,
            // Writable, or an error the next write reports.
            Ok(_) => return true,
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return true,
        }
    }
}

fn decide_request(shared: &Shared, peer: &PeerHost, class: &ProdClass) -> (RequestAnswer, access::ProductFilter) {
    let config = shared.config();
    match access::reduce_to_allowed(&config, peer, class) {
        access::Allowed::Ok(filter) => (RequestAnswer::Ok { id: shared.next_session_id() }, filter),
        access::Allowed::Reclass(class, filter) => (RequestAnswer::Reclass(class), filter),
        access::Allowed::Nothing | access::Allowed::NotAllowedHost => {
            (RequestAnswer::Refuse, access::ProductFilter::nothing())
        }
    }
}

/// Where the feed starts: just after the product whose signature came in `SIG=` if the queue
/// has it, else at the class's `from` time.
fn start_position(shared: &Shared, feed: &Feed) -> Timestamp {
    let from = if feed.class.from <= feed.class.to { feed.class.from } else { feed.class.to };
    let Some(signature) = feed.resume_after else { return from };
    let found =
        shared.queue.snapshot().ok().and_then(|snapshot| {
            snapshot.product_by_signature(&signature).ok().flatten().map(|product| product.insertion)
        });
    match found {
        Some(insertion) => Timestamp::from_unix_micros(insertion.as_unix_micros() + 1),
        None => from,
    }
}

fn write_all(stream: &mut TcpStream, session: &mut Upstream, out: &mut Vec<u8>) -> Result<(), ConnectionError> {
    session.take_output(out);
    if !out.is_empty() {
        stream.write_all(out).map_err(ConnectionError::Write)?;
        out.clear();
    }
    Ok(())
}

/// A host no ALLOW or ACCEPT entry names: after its first call, a MSG_DENIED/AUTH_ERROR reply with
/// xid 0, then a reset — what the reference does (ldm6-protocol.md §11).
fn refuse_host(stream: &mut TcpStream) {
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let mut first = [0u8; 4096];
    let _ = stream.read(&mut first);
    let mut reply = Vec::new();
    ldm7_xdr::ldm::encode_reply(&mut reply, 0, &ldm7_xdr::ldm::ReplyBody::Denied(ldm7_xdr::ldm::AuthStat::TooWeak));
    let _ = stream.write_all(&reply);
    let _ = socket2::SockRef::from(&*stream).set_linger(Some(Duration::ZERO));
    let _ = stream.shutdown(Shutdown::Both);
}
