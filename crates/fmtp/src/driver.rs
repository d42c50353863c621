//! Runs the sans-IO FMTP [`Sender`] and [`Receiver`] on real sockets: multicast UDP through
//! [`crate::udp`], one TCP retransmission connection per receiver. One tokio task owns each
//! state machine and follows its documented polling order (transmit, events, timeout); the
//! driver decides nothing about the protocol.
//!
//! Connection opening (ldm7-multicast.md §3.7): the receiver sends a length-prefixed blob (the
//! reference sends a PEM RSA public key), the sender answers with a length-prefixed blob (the
//! reference: a 256-byte RSA-OAEP ciphertext of the MAC key, empty key at MAC level 0). We frame
//! both exactly; at MAC level 0 our sender answers with 256 zero bytes and our receiver ignores
//! the answer. Interoperating with a reference LDM-7 receiver needs the real RSA encryption,
//! which is not implemented yet.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ldm7_fmtp_proto::wire::{self, Split, handshake};
use ldm7_fmtp_proto::{
    Destination, Instant, Message, Product, Receiver, ReceiverConfig, ReceiverCounters, ReceiverEvent, ReceiverId,
    Sender, SenderConfig, SenderCounters, SenderEvent,
};
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::udp::{MulticastConfig, MulticastReceiver, MulticastSender, datagrams};

/// Bytes of the sender's answer blob at MAC level 0 (the size of an RSA-2048 ciphertext).
const KEY_ANSWER_LEN: usize = 256;
/// Largest FMTP datagram (12-byte header + 1448 bytes).
const DATAGRAM_LEN_MAX: usize = 1460;

/// A monotonic clock mapped to the protocol's [`Instant`].
#[derive(Clone, Copy, Debug)]
struct Clock(std::time::Instant);

impl Clock {
    fn now(&self) -> Instant {
        Instant::from_nanos(u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }
    fn deadline(&self, at: Instant) -> tokio::time::Instant {
        tokio::time::Instant::from_std(self.0 + Duration::from_nanos(at.as_nanos()))
    }
}

/// Who may open a retransmission connection (LDM: the subscriber's allowed address).
pub type Authorizer = Arc<dyn Fn(SocketAddr) -> bool + Send + Sync>;

/// Settings of an [`FmtpSender`].
#[derive(Clone)]
pub struct SenderOptions {
    /// The multicast group, interface, TTL.
    pub multicast: MulticastConfig,
    /// Where the retransmission server listens (port 0: any).
    pub retx_listen: SocketAddr,
    /// Protocol settings (rate, deadline, bounds).
    pub proto: SenderConfig,
    /// Connection filter on the peer address.
    pub authorize: Authorizer,
}

impl std::fmt::Debug for SenderOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SenderOptions")
            .field("multicast", &self.multicast)
            .field("retx_listen", &self.retx_listen)
            .finish()
    }
}

enum SenderInput {
    Product(Product),
    Connected(ReceiverId, mpsc::UnboundedSender<Vec<u8>>, SocketAddr),
    Frame(ReceiverId, Vec<u8>),
    Disconnected(ReceiverId),
}

/// What the sending application hears.
#[derive(Debug)]
pub enum SenderNotice {
    /// A protocol event (sent, released, bound hit).
    Event(SenderEvent),
    /// A receiver's retransmission connection opened.
    ReceiverJoined(ReceiverId, SocketAddr),
    /// A receiver's connection closed.
    ReceiverLeft(ReceiverId),
    /// A product was refused (e.g. no receiver connected, LDM's policy); it was not sent.
    Refused(String),
}

/// A running FMTP sender: hand it products, read its notices.
#[derive(Debug)]
pub struct FmtpSender {
    inputs: mpsc::UnboundedSender<SenderInput>,
    notices: mpsc::UnboundedReceiver<SenderNotice>,
    retx_addr: SocketAddr,
    source_addr: SocketAddr,
    counters: tokio::sync::watch::Receiver<SenderCounters>,
}

impl FmtpSender {
    /// Opens the sockets and starts the sender task (inside a tokio runtime).
    pub async fn start(options: SenderOptions) -> io::Result<Self> {
        let udp = MulticastSender::open(&options.multicast).map_err(io::Error::other)?;
        let source_addr = udp.local_addr()?;
        let listener = TcpListener::bind(options.retx_listen).await?;
        let retx_addr = listener.local_addr()?;
        let clock = Clock(std::time::Instant::now());
        let mut proto = options.proto.clone();
        for pacing in [&mut proto.multicast_pacing, &mut proto.retx_pacing].into_iter().flatten() {
            pacing.bucket_bytes = pacing.bucket_bytes.max(timer_burst_bytes(pacing.rate_bits_per_s));
        }
        let sender = Sender::new(proto, clock.now()).map_err(io::Error::other)?;
        let (inputs, input_rx) = mpsc::unbounded_channel();
        let (notice_tx, notices) = mpsc::unbounded_channel();
        let (counters_tx, counters) = tokio::sync::watch::channel(SenderCounters::default());
        tokio::spawn(accept_loop(listener, options.authorize.clone(), inputs.clone(), notice_tx.clone()));
        tokio::spawn(sender_loop(sender, clock, udp, input_rx, notice_tx, counters_tx));
        Ok(Self { inputs, notices, retx_addr, source_addr, counters })
    }

    /// The retransmission server's address (give it to receivers).
    pub fn retx_addr(&self) -> SocketAddr {
        self.retx_addr
    }

    /// The address multicast datagrams come from.
    pub fn source_addr(&self) -> SocketAddr {
        self.source_addr
    }

    /// Hands a product over for multicast.
    pub fn send(&self, product: Product) -> io::Result<()> {
        self.inputs.send(SenderInput::Product(product)).map_err(|_| io::Error::other("the FMTP sender task ended"))
    }

    /// The next notice; `None` once the task ended.
    pub async fn next_notice(&mut self) -> Option<SenderNotice> {
        self.notices.recv().await
    }

    /// The protocol counters as of the last loop turn.
    pub fn counters(&self) -> SenderCounters {
        self.counters.borrow().clone()
    }
}

/// Bucket depth that keeps the rate when the task wakes at the timer's granularity (about a
/// millisecond, often more under load): two milliseconds of traffic, and at least one full GSO
/// batch (44 datagrams). A smaller bucket caps the rate at bucket ÷ wake-up interval.
fn timer_burst_bytes(rate_bits_per_s: u64) -> u64 {
    (rate_bits_per_s / 8 / 500).max(44 * DATAGRAM_LEN_MAX as u64)
}

async fn accept_loop(
    listener: TcpListener,
    authorize: Authorizer,
    inputs: mpsc::UnboundedSender<SenderInput>,
    notices: mpsc::UnboundedSender<SenderNotice>,
) {
    let mut next_id = 1u64;
    loop {
        let Ok((stream, peer)) = listener.accept().await else { continue };
        if !authorize(peer) {
            tracing::warn!(%peer, "refused FMTP retransmission connection: peer not authorized");
            continue;
        }
        let id = ReceiverId(next_id);
        next_id += 1;
        let inputs = inputs.clone();
        let notices = notices.clone();
        tokio::spawn(async move {
            if let Err(error) = serve_receiver(stream, peer, id, inputs.clone(), notices).await {
                tracing::info!(%peer, %error, "FMTP retransmission connection closed");
            }
            let _ = inputs.send(SenderInput::Disconnected(id));
        });
    }
}

async fn serve_receiver(
    stream: TcpStream,
    peer: SocketAddr,
    id: ReceiverId,
    inputs: mpsc::UnboundedSender<SenderInput>,
    notices: mpsc::UnboundedSender<SenderNotice>,
) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let (mut read, mut write) = stream.into_split();
    let mut buffer = Vec::with_capacity(1 << 16);
    // §3.7: the receiver's key blob first, then our answer.
    let rest = loop {
        match handshake::split_blob(&buffer).map_err(io::Error::other)? {
            Split::Frame { rest, .. } => break rest.to_vec(),
            Split::Incomplete { .. } => read_more(&mut read, &mut buffer).await?,
        }
    };
    let mut answer = Vec::new();
    handshake::emit_blob(&[0u8; KEY_ANSWER_LEN], &mut answer).map_err(io::Error::other)?;
    write.write_all(&answer).await?;
    buffer = rest;
    let (out_tx, mut out_rx) = mpsc::unbounded_channel::<Vec<u8>>();
    tokio::spawn(async move {
        while let Some(bytes) = out_rx.recv().await {
            if write.write_all(&bytes).await.is_err() {
                break;
            }
        }
    });
    // The sender learns of the receiver before anyone is told it joined: products handed over
    // after the notice then count it among their receivers.
    if inputs.send(SenderInput::Connected(id, out_tx, peer)).is_err() {
        return Ok(());
    }
    let _ = notices.send(SenderNotice::ReceiverJoined(id, peer));
    loop {
        while let Split::Frame { frame, rest } = wire::split_frame(&buffer).map_err(io::Error::other)? {
            let consumed = buffer.len() - rest.len();
            if inputs.send(SenderInput::Frame(id, frame.to_vec())).is_err() {
                return Ok(());
            }
            buffer.drain(..consumed);
        }
        read_more(&mut read, &mut buffer).await?;
    }
}

async fn read_more(read: &mut (impl AsyncReadExt + Unpin), buffer: &mut Vec<u8>) -> io::Result<()> {
    let mut chunk = [0u8; 65536];
    let count = read.read(&mut chunk).await?;
    if count == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "peer closed the connection"));
    }
    buffer.extend_from_slice(&chunk[..count]);
    Ok(())
}

async fn sender_loop(
    mut sender: Sender,
    clock: Clock,
    udp: MulticastSender,
    mut inputs: mpsc::UnboundedReceiver<SenderInput>,
    notices: mpsc::UnboundedSender<SenderNotice>,
    counters: tokio::sync::watch::Sender<SenderCounters>,
) {
    sender.set_wall_clock(clock.now(), std::time::SystemTime::now().into());
    let mut writers: HashMap<ReceiverId, mpsc::UnboundedSender<Vec<u8>>> = HashMap::new();
    let max_segments = udp.max_segments().clamp(1, 44);
    let mut message = Vec::with_capacity(DATAGRAM_LEN_MAX);
    let mut batch = Vec::with_capacity(DATAGRAM_LEN_MAX * max_segments);
    let mut segment_len = 0usize;
    let mut segments = 0usize;
    loop {
        // 1. Transmit: multicast datagrams in GSO batches of equal-sized segments.
        let now = clock.now();
        let mut per_receiver: HashMap<ReceiverId, Vec<u8>> = HashMap::new();
        loop {
            message.clear();
            let Some(transmit) = sender.poll_transmit(now, &mut message) else { break };
            match transmit.destination {
                Destination::Multicast => {
                    let len = message.len();
                    if segments > 0 && (len > segment_len || batch.len() % segment_len != 0) {
                        flush(&udp, &mut batch, segment_len, &mut segments).await;
                    }
                    if segments == 0 {
                        segment_len = len;
                    }
                    batch.extend_from_slice(&message);
                    segments += 1;
                    if segments == max_segments || len < segment_len {
                        flush(&udp, &mut batch, segment_len, &mut segments).await;
                    }
                }
                Destination::Receiver(id) => per_receiver.entry(id).or_default().extend_from_slice(&message),
            }
        }
        if segments > 0 {
            flush(&udp, &mut batch, segment_len, &mut segments).await;
        }
        for (id, bytes) in per_receiver {
            if let Some(writer) = writers.get(&id) {
                let _ = writer.send(bytes);
            }
        }
        // 2. Events.
        while let Some(event) = sender.poll_event() {
            let _ = notices.send(SenderNotice::Event(event));
        }
        counters.send_replace(sender.counters().clone());
        // 3. Wait for the timeout or an input.
        let timeout = sender.poll_timeout();
        let input = match timeout {
            Some(at) if at <= clock.now() => None,
            Some(at) => tokio::select! {
                input = inputs.recv() => Some(input),
                () = tokio::time::sleep_until(clock.deadline(at)) => None,
            },
            None => Some(inputs.recv().await),
        };
        let now = clock.now();
        match input {
            None => sender.handle_timeout(now),
            Some(None) => return,
            Some(Some(SenderInput::Product(product))) => {
                if let Err(error) = sender.enqueue(now, product) {
                    let _ = notices.send(SenderNotice::Refused(format!("{:?}", error.reason)));
                }
            }
            Some(Some(SenderInput::Connected(id, writer, _peer))) => {
                writers.insert(id, writer);
                sender.receiver_connected(now, id);
            }
            Some(Some(SenderInput::Frame(id, frame))) => {
                if let Err(error) = sender.handle_stream_frame(now, id, &frame) {
                    tracing::warn!(receiver = id.0, %error, "malformed FMTP message from a receiver");
                }
            }
            Some(Some(SenderInput::Disconnected(id))) => {
                if writers.remove(&id).is_some() {
                    sender.receiver_disconnected(now, id);
                    let _ = notices.send(SenderNotice::ReceiverLeft(id));
                }
            }
        }
    }
}

async fn flush(udp: &MulticastSender, batch: &mut Vec<u8>, segment_len: usize, segments: &mut usize) {
    if let Err(error) = udp.send_segments(batch, segment_len).await {
        tracing::warn!(%error, "multicast send failed");
    }
    batch.clear();
    *segments = 0;
}

/// Settings of a receiver.
#[derive(Clone, Debug)]
pub struct ReceiverOptions {
    /// The group and the interface to join on.
    pub multicast: MulticastConfig,
    /// Source-specific join on this sender address (LDM-7 joins source-specifically).
    pub source: Option<IpAddr>,
    /// The sender's retransmission server.
    pub sender_retx: SocketAddr,
    /// Protocol settings.
    pub proto: ReceiverConfig,
    /// Receive-side loss filter for tests and demos: drop this fraction of datagrams.
    pub drop_probability: f64,
    /// Seed of the loss filter.
    pub seed: u64,
}

/// Runs a receiver until `stop` fires or the sender's connection ends, sending every event to
/// `events`. Returns the protocol counters.
pub async fn run_receiver(
    options: ReceiverOptions,
    events: mpsc::UnboundedSender<ReceiverEvent>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> io::Result<ReceiverCounters> {
    let udp = MulticastReceiver::join(&options.multicast, options.source).map_err(io::Error::other)?;
    let stream = TcpStream::connect(options.sender_retx).await?;
    stream.set_nodelay(true)?;
    let (mut read, mut write) = stream.into_split();
    let mut hello = Vec::new();
    handshake::emit_blob(
        b"-----BEGIN RSA PUBLIC KEY-----\nldm7 MAC level 0\n-----END RSA PUBLIC KEY-----\n",
        &mut hello,
    )
    .map_err(io::Error::other)?;
    write.write_all(&hello).await?;
    let mut stream_buffer = Vec::with_capacity(1 << 16);
    loop {
        match handshake::split_blob(&stream_buffer).map_err(io::Error::other)? {
            Split::Frame { rest, .. } => {
                stream_buffer = rest.to_vec();
                break;
            }
            Split::Incomplete { .. } => read_more(&mut read, &mut stream_buffer).await?,
        }
    }
    let clock = Clock(std::time::Instant::now());
    let mut receiver = Receiver::new(options.proto.clone()).map_err(io::Error::other)?;
    receiver.set_wall_clock(clock.now(), std::time::SystemTime::now().into());
    let mut rng = rand::rngs::StdRng::seed_from_u64(options.seed);
    let batch = 32;
    let gro = udp.gro_segments().max(1);
    let mut storage = vec![vec![0u8; 65535.min(DATAGRAM_LEN_MAX * gro).max(DATAGRAM_LEN_MAX)]; batch];
    let mut meta = vec![quinn_udp::RecvMeta::default(); batch];
    let mut chunk = vec![0u8; 1 << 16];
    let mut outgoing = Vec::new();
    loop {
        // Drain outputs in the documented order.
        outgoing.clear();
        while let Some(message) = receiver.poll_transmit() {
            message.emit_to_vec(&mut outgoing).map_err(io::Error::other)?;
        }
        if !outgoing.is_empty() {
            write.write_all(&outgoing).await?;
        }
        while let Some(event) = receiver.poll_event() {
            let _ = events.send(event);
        }
        let timeout = receiver.poll_timeout();
        let sleep_until = timeout.map(|at| clock.deadline(at));
        let far = tokio::time::Instant::now() + Duration::from_secs(3600);
        tokio::select! {
            received = async {
                let mut buffers: Vec<io::IoSliceMut<'_>> = storage.iter_mut().map(|b| io::IoSliceMut::new(b)).collect();
                udp.recv_batch(&mut buffers, &mut meta).await
            } => {
                let count = received?;
                let now = clock.now();
                for (buffer, meta) in storage.iter().zip(&meta).take(count) {
                    for datagram in datagrams(buffer, meta) {
                        if options.drop_probability > 0.0 && rng.random::<f64>() < options.drop_probability {
                            continue;
                        }
                        receiver.handle_datagram(now, datagram);
                    }
                }
            }
            read_count = read.read(&mut chunk) => {
                let count = read_count?;
                if count == 0 {
                    return Ok(receiver.counters().clone());
                }
                stream_buffer.extend_from_slice(&chunk[..count]);
                let now = clock.now();
                while let Split::Frame { frame, rest } = wire::split_frame(&stream_buffer).map_err(io::Error::other)? {
                    let consumed = stream_buffer.len() - rest.len();
                    match Message::parse(frame) {
                        Ok(message) => receiver.handle_stream(now, &message),
                        Err(error) => tracing::warn!(%error, "malformed FMTP message from the sender"),
                    }
                    stream_buffer.drain(..consumed);
                }
            }
            () = tokio::time::sleep_until(sleep_until.unwrap_or(far)) => receiver.handle_timeout(clock.now()),
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    return Ok(receiver.counters().clone());
                }
            }
        }
    }
}
