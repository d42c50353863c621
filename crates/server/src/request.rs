//! A REQUEST entry: a downstream that connects to its upstream, asks with FEEDME, inserts what
//! arrives, and reconnects after failures — resuming just after the last product it received,
//! which survives restarts in a small state file.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ldm7_io::{Clock, Stop};
use ldm7_ldm_proto::{Downstream, DownstreamConfig, DownstreamEvent, FeedMode, SessionError};
use ldm7_types::{ProdClass, Signature, Timestamp};
use md5::{Digest, Md5};

use crate::client::{ConnectError, ServerAddress, connect};
use crate::wait::{Input, wait_input_or_stop};
use crate::{Shared, receive};

/// How long a REQUEST waits for its upstream to accept the connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Why one connection of a REQUEST ended (it reconnects after a back-off delay).
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// No connection to the upstream.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The session failed: a malformed record, a protocol error, silence, a call timed out.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// The upstream cannot be written to (it closed the connection or the network failed).
    #[error("cannot write to the upstream: {0}")]
    Write(#[source] std::io::Error),
    /// The upstream cannot be read from.
    #[error("cannot read from the upstream: {0}")]
    Read(#[source] std::io::Error),
}

/// One REQUEST as the runner needs it.
#[derive(Clone, Debug)]
pub struct RequestSpec {
    /// The class (feed and pattern; times are chosen per connection).
    pub class: ProdClass,
    /// The upstream host as written in ldmd.conf (also used in the origin rewrite).
    pub host: String,
    /// Its port.
    pub port: u16,
    /// Primary or alternate (the first REQUEST of a feed/pattern is primary).
    pub mode: FeedMode,
}

impl RequestSpec {
    /// The upstream's address (an IPv6 host in brackets when shown).
    pub fn address(&self) -> ServerAddress {
        ServerAddress::new(self.host.clone(), self.port)
    }

    /// The state file of this request: `.<md5 of host, port and specs>.info` in `dir` (the
    /// reference's naming, ldm6-protocol.md §8).
    pub fn state_path(&self, dir: &std::path::Path) -> PathBuf {
        let mut hasher = Md5::new();
        hasher.update(self.host.as_bytes());
        hasher.update(self.port.to_be_bytes());
        for spec in &self.class.specs {
            hasher.update(spec.feedtype.bits().to_be_bytes());
            hasher.update(spec.pattern.as_str().as_bytes());
        }
        let digest: [u8; 16] = hasher.finalize().into();
        dir.join(format!(".{}.info", Signature(digest)))
    }
}

/// The resume point: the last product received.
fn load_state(path: &std::path::Path) -> Option<Signature> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines().next()?.trim().parse().ok()
}

fn save_state(path: &std::path::Path, signature: &Signature) {
    let temporary = path.with_extension("info.tmp");
    let saved = std::fs::write(&temporary, format!("{signature}\n")).and_then(|()| std::fs::rename(&temporary, path));
    if let Err(error) = saved {
        tracing::warn!("cannot save the resume point in {}: {error}", path.display());
    }
}

/// How often the resume point is written while products arrive (the first one of a session at
/// once).
const SAVE_EVERY: Duration = Duration::from_secs(1);

/// Runs the request until `stop` is given (the server stops, or a reload removed the REQUEST).
pub(crate) fn run(shared: Arc<Shared>, request: RequestSpec, stop: Arc<Stop>) {
    let state_path = request.state_path(&shared.options.state_dir);
    let mut resume_after = load_state(&state_path);
    let mut backoff = shared.options.retry_min;
    while !stop.is_stopped() {
        let started = Clock::now();
        let outcome = session(&shared, &request, &state_path, &mut resume_after, &stop);
        if let Err(error) = &outcome {
            tracing::warn!("{}: {error}", request.address());
        }
        if stop.is_stopped() {
            break;
        }
        // A session that ran a while resets the back-off.
        if (Clock::now() - started) > shared.options.retry_max {
            backoff = shared.options.retry_min;
        }
        tracing::info!("{}: reconnecting in {} s", request.address(), backoff.as_secs_f64());
        stop.wait(backoff);
        backoff = (backoff * 2).min(shared.options.retry_max);
    }
    if let Some(signature) = resume_after {
        save_state(&state_path, &signature);
    }
}

fn session(
    shared: &Shared,
    request: &RequestSpec,
    state_path: &std::path::Path,
    resume_after: &mut Option<Signature>,
    stop: &Stop,
) -> Result<(), RequestError> {
    let mut stream = connect(&request.address(), CONNECT_TIMEOUT)?;
    let now = SystemTime::now();
    let from = Timestamp::from_system_time(now).saturating_sub(shared.options.time_offset);
    let class = request.class.clone().between(from, Timestamp::END);
    tracing::info!("Starting Up(ldm7): {} {class}", request.address());
    let mut config = DownstreamConfig::new(class);
    config.mode = request.mode;
    config.resume_after = *resume_after;
    config.silence = shared.options.silence;
    let mut session = Downstream::new(Clock::now(), config);
    let mut out = Vec::new();
    // The first resume point of a session is saved at once, later ones every SAVE_EVERY: a
    // downstream killed early in a session still resumes where it was.
    let mut last_save: Option<ldm7_types::Instant> = None;
    let mut unsaved = false;
    let result = loop {
        let mut ended = None;
        // Products of this pass go into the queue together (one transaction).
        let mut received = Vec::new();
        while let Some(event) = session.poll_event() {
            match event {
                DownstreamEvent::Accepted { id, class } => {
                    tracing::info!(
                        "Upstream LDM-6 on {} is willing to be {} feeder (id {id}): {class}",
                        request.host,
                        if request.mode == FeedMode::Primary { "a primary" } else { "an alternate" }
                    );
                }
                DownstreamEvent::Reclassified(class) => {
                    tracing::info!("{}: reclassified to {class}", request.host);
                }
                DownstreamEvent::Product(product) => {
                    let max_latency = shared.options.max_latency;
                    let oldest = Timestamp::from_system_time(SystemTime::now()).saturating_sub(max_latency);
                    if product.info.arrival < oldest {
                        tracing::warn!("Ignoring too-old product: {}", product.info);
                    } else if !session.class().matches_feed_ident(product.info.feedtype, &product.info.ident) {
                        tracing::warn!("Ignoring unrequested product: {}", product.info);
                    } else {
                        *resume_after = Some(product.info.signature);
                        unsaved = true;
                        received.push(product);
                    }
                }
                DownstreamEvent::ComingSoon { info, .. } => {
                    // Whether it is a duplicate depends on what came before it.
                    receive::insert_batch(shared, &request.host, &mut received);
                    let accept = receive::wants(shared, &info);
                    session.answer_coming_soon(Clock::now(), accept)?;
                }
                DownstreamEvent::Refused { why } => tracing::error!("{}: {why}", request.host),
                DownstreamEvent::Closed(result) => ended = Some(result.map_err(RequestError::from)),
            }
        }
        receive::insert_batch(shared, &request.host, &mut received);
        if unsaved && last_save.is_none_or(|at| (Clock::now() - at) >= SAVE_EVERY) {
            if let Some(signature) = resume_after {
                save_state(state_path, signature);
            }
            last_save = Some(Clock::now());
            unsaved = false;
        }
        session.take_output(&mut out);
        if !out.is_empty() {
            stream.write_all(&out).map_err(RequestError::Write)?;
            out.clear();
        }
        if let Some(result) = ended {
            break result;
        }
        if stop.is_stopped() {
            break Ok(());
        }
        // Read straight into the session's buffer: products stay where they arrived until they
        // are in the queue.
        let timeout = session.poll_timeout();
        // At most 250 ms: the resume point is saved between reads (SAVE_EVERY); a stop wakes it
        // at once.
        match wait_input_or_stop(&mut stream, session.input_space(), timeout, Some(Duration::from_millis(250)), stop) {
            Ok(Input::Bytes(n)) => session.input_received(Clock::now(), n),
            Ok(Input::Timeout) => session.handle_timeout(Clock::now()),
            Ok(Input::Eof) => session.handle_eof(),
            Ok(Input::Stopped) => break Ok(()),
            Err(error) => break Err(RequestError::Read(error)),
        }
    };
    if unsaved && let Some(signature) = resume_after {
        save_state(state_path, signature);
    }
    result
}
