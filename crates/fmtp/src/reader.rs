//! The receiving end's datagram reader: a thread that does nothing but read the multicast
//! sockets and hand what it read to the receiver task.
//!
//! A receiver task does everything else too — the protocol, MAC checks, spool writes, the
//! application's notices — and on a busy host it is not scheduled for tens of milliseconds at a
//! time. Left to it, the socket buffer fills meanwhile and the kernel drops what the path
//! delivered (each a repair over TCP, and at a feed's rate whole products for the backstop). A
//! thread that only reads sleeps in `poll` between bursts, so the scheduler runs it first when
//! datagrams come; what it read waits in memory, bounded in bytes
//! ([`ReaderOptions::queue_bytes_max`]). At the bound the thread stops reading and the socket
//! buffer takes over (never dropped here: the kernel then drops, and counts).
//!
//! The kernel's drops of each socket (`SO_MEMINFO`'s `SK_MEMINFO_DROPS`: datagrams the socket
//! buffer had no room for) are read every [`DROPS_POLL`] and summed in
//! [`ReaderCounters::host_drops`]: "dropped at this host", apart from the path's loss.

use std::io::{self, IoSliceMut};
use std::net::UdpSocket as StdUdpSocket;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use quinn_udp::{RecvMeta, UdpSockRef, UdpSocketState};
use tokio::sync::mpsc;

use crate::udp::datagrams;

/// Largest FMTP datagram (12-byte header + 1448 bytes).
const DATAGRAM_LEN_MAX: usize = 1460;
/// Receive buffers per `recvmmsg`.
const RECV_BATCH: usize = 32;
/// Emptied batches kept for reuse ([`DatagramReader::recycle`]).
const SPARE_BATCHES_MAX: usize = 8;
/// How long the thread sleeps in `poll` before it looks at its stop flag.
const POLL_TIMEOUT_MS: i32 = 100;
/// How often the kernel's drop counts are read.
pub const DROPS_POLL: Duration = Duration::from_millis(100);
/// How long the thread waits when its queue is at the bound before it looks again.
const FULL_WAIT: Duration = Duration::from_millis(1);
/// `SO_MEMINFO` (Linux `asm-generic/socket.h`).
const SO_MEMINFO: libc::c_int = 55;
/// Index of the drop count in `SO_MEMINFO`'s array (`SK_MEMINFO_DROPS`, `linux/sock_diag.h`).
const SK_MEMINFO_DROPS: usize = 8;
/// Entries of that array this code reads up to.
const SK_MEMINFO_VARS: usize = 9;

/// Datagrams read in one wake-up, copied out of the read buffers.
#[derive(Debug, Default)]
pub struct Batch {
    bytes: Vec<u8>,
    lens: Vec<u16>,
}

impl Batch {
    /// The datagrams, in the order read.
    pub fn datagrams(&self) -> impl Iterator<Item = &[u8]> {
        let mut at = 0;
        self.lens.iter().map(move |&len| {
            let datagram = &self.bytes[at..at + usize::from(len)];
            at += usize::from(len);
            datagram
        })
    }

    /// Datagrams held.
    pub fn len(&self) -> usize {
        self.lens.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.lens.is_empty()
    }

    /// Bytes held.
    pub fn len_bytes(&self) -> usize {
        self.bytes.len()
    }

    fn push(&mut self, datagram: &[u8]) {
        self.bytes.extend_from_slice(datagram);
        self.lens.push(u16::try_from(datagram.len()).unwrap_or(u16::MAX));
    }
}

/// Settings of a reader.
#[derive(Clone, Copy, Debug)]
pub struct ReaderOptions {
    /// Bytes read and not yet taken by the receiver task, at most.
    pub queue_bytes_max: usize,
}

/// What a reader counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReaderCounters {
    /// Datagrams read.
    pub datagrams: u64,
    /// Datagrams the kernel dropped at these sockets (their buffer was full), since they opened.
    pub host_drops: u64,
    /// Times the queue was at its bound and the thread waited (the socket buffer then fills).
    pub queue_full: u64,
}

#[derive(Debug, Default)]
struct Shared {
    stop: AtomicBool,
    /// Batches taken and handed back ([`DatagramReader::recycle`]), for the thread to fill again.
    spares: Mutex<Vec<Batch>>,
    queued_bytes: AtomicUsize,
    datagrams: AtomicU64,
    host_drops: AtomicU64,
    queue_full: AtomicU64,
}

/// The reading thread and the queue of what it read. Dropping it stops the thread (within
/// [`POLL_TIMEOUT_MS`]).
#[derive(Debug)]
pub struct DatagramReader {
    batches: mpsc::UnboundedReceiver<io::Result<Batch>>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// The sockets the thread reads (duplicates): whether the kernel holds datagrams the thread
    /// has not read yet ([`DatagramReader::is_idle`]).
    unread: Vec<StdUdpSocket>,
}

/// A socket the reader reads, with its batching state.
pub(crate) struct ReaderSocket {
    pub(crate) socket: StdUdpSocket,
    pub(crate) state: UdpSocketState,
    pub(crate) gro_segments: usize,
}

impl DatagramReader {
    /// Starts the thread on non-blocking sockets (the group's, and any other the receiver joins).
    pub(crate) fn spawn(sockets: Vec<ReaderSocket>, options: ReaderOptions) -> io::Result<Self> {
        let shared = Arc::new(Shared::default());
        let unread = sockets.iter().map(|socket| socket.socket.try_clone()).collect::<io::Result<Vec<_>>>()?;
        let (tx, batches) = mpsc::unbounded_channel();
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("fmtp-reader".into())
            .spawn(move || read_loop(&sockets, &tx, &thread_shared, options))?;
        Ok(Self { batches, shared, thread: Some(thread), unread })
    }

    /// The next batch read (`None` once the thread ended; an error ends it).
    pub async fn next(&mut self) -> Option<io::Result<Batch>> {
        let batch = self.batches.recv().await?;
        if let Ok(batch) = &batch {
            self.shared.queued_bytes.fetch_sub(batch.len_bytes(), Ordering::SeqCst);
        }
        Some(batch)
    }

    /// Hands a taken batch back, emptied, for the thread to fill again (at most
    /// [`SPARE_BATCHES_MAX`] are kept). A batch allocated afresh for every read cost the reading
    /// thread page faults on new memory: a tenth of its time with four receivers on two cores.
    pub fn recycle(&self, mut batch: Batch) {
        batch.bytes.clear();
        batch.lens.clear();
        let mut spares = self.shared.spares.lock().unwrap_or_else(PoisonError::into_inner);
        if spares.len() < SPARE_BATCHES_MAX {
            spares.push(batch);
        }
    }

    /// Whether nothing read waits to be taken (the receiver has caught up with the multicast).
    pub fn is_idle(&self) -> bool {
        self.shared.queued_bytes.load(Ordering::SeqCst) == 0
    }

    /// Whether nothing received waits at all: [`DatagramReader::is_idle`], and nothing in the
    /// sockets' buffers that the thread has not read yet (on a busy host the thread too waits
    /// to be scheduled). A system call per socket: for the decisions that need it (a timer's, a
    /// RETX_EOP's),
    /// not for every batch.
    pub fn is_caught_up(&self) -> bool {
        self.is_idle() && self.unread.iter().all(|socket| !has_unread(socket))
    }

    /// What it counted so far.
    pub fn counters(&self) -> ReaderCounters {
        self.shared.counters()
    }

    /// A handle on the counters that outlives the reader's borrow.
    pub(crate) fn counter_handle(&self) -> ReaderCounterHandle {
        ReaderCounterHandle(self.shared.clone())
    }
}

/// Reads a reader's counters from elsewhere.
#[derive(Clone, Debug)]
pub(crate) struct ReaderCounterHandle(Arc<Shared>);

impl ReaderCounterHandle {
    /// Bytes read and not yet taken from the queue.
    pub(crate) fn queued_bytes(&self) -> usize {
        self.0.queued_bytes.load(Ordering::SeqCst)
    }

    pub(crate) fn counters(&self) -> ReaderCounters {
        self.0.counters()
    }
}

impl Shared {
    fn counters(&self) -> ReaderCounters {
        ReaderCounters {
            datagrams: self.datagrams.load(Ordering::Relaxed),
            host_drops: self.host_drops.load(Ordering::Relaxed),
            queue_full: self.queue_full.load(Ordering::Relaxed),
        }
    }
}

impl Drop for DatagramReader {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Not joined: it ends at its next wake-up, and a drop in a task must not block.
        drop(self.thread.take());
    }
}

fn read_loop(
    sockets: &[ReaderSocket],
    tx: &mpsc::UnboundedSender<io::Result<Batch>>,
    shared: &Shared,
    options: ReaderOptions,
) {
    let buffer_len = |gro: usize| 65535.min(DATAGRAM_LEN_MAX * gro.max(1)).max(DATAGRAM_LEN_MAX);
    let len = sockets.iter().map(|socket| buffer_len(socket.gro_segments)).max().unwrap_or(DATAGRAM_LEN_MAX);
    let mut storage = vec![vec![0u8; len]; RECV_BATCH];
    let mut meta = vec![RecvMeta::default(); RECV_BATCH];
    let mut last_batch = (0, 0);
    let mut fds: Vec<libc::pollfd> = sockets
        .iter()
        .map(|socket| libc::pollfd { fd: socket.socket.as_raw_fd(), events: libc::POLLIN, revents: 0 })
        .collect();
    let mut drops_read = Instant::now();
    let mut was_full = false;
    while !shared.stop.load(Ordering::SeqCst) && !tx.is_closed() {
        if drops_read.elapsed() >= DROPS_POLL {
            drops_read = Instant::now();
            let drops = sockets.iter().map(|socket| kernel_drops(&socket.socket)).sum();
            shared.host_drops.store(drops, Ordering::Relaxed);
        }
        if shared.queued_bytes.load(Ordering::SeqCst) >= options.queue_bytes_max {
            if !was_full {
                was_full = true;
                let episodes = shared.queue_full.fetch_add(1, Ordering::Relaxed) + 1;
                if episodes.is_power_of_two() {
                    tracing::warn!(
                        bound = options.queue_bytes_max,
                        episodes,
                        "FMTP receiver: the receiver falls behind the multicast; datagrams read and not yet handled \
                         reached the bound, the socket buffer fills meanwhile"
                    );
                }
            }
            std::thread::sleep(FULL_WAIT);
            continue;
        }
        was_full = false;
        for fd in &mut fds {
            fd.revents = 0;
        }
        match poll(&mut fds, POLL_TIMEOUT_MS) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => {
                let _ = tx.send(Err(error));
                return;
            }
        }
        // One handed back, or one sized as the last: growing a batch datagram by datagram
        // reallocated and copied it several times per wake-up.
        let spare = shared.spares.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let mut batch = spare.unwrap_or_else(|| Batch {
            bytes: Vec::with_capacity(last_batch.0),
            lens: Vec::with_capacity(last_batch.1),
        });
        for (socket, fd) in sockets.iter().zip(&fds) {
            if fd.revents == 0 {
                continue;
            }
            // Whatever is there now, up to a few reads, so that one busy socket does not starve
            // the other and a batch stays small enough to hand over promptly.
            for _ in 0..4 {
                let mut buffers: Vec<IoSliceMut<'_>> = storage.iter_mut().map(|b| IoSliceMut::new(b)).collect();
                match socket.state.recv(UdpSockRef::from(&socket.socket), &mut buffers, &mut meta) {
                    Ok(count) => {
                        for (buffer, meta) in storage.iter().zip(&meta).take(count) {
                            for datagram in datagrams(buffer, meta) {
                                batch.push(datagram);
                            }
                        }
                        if count < RECV_BATCH {
                            break;
                        }
                    }
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                    Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                    Err(error) => {
                        let _ = tx.send(Err(error));
                        return;
                    }
                }
            }
        }
        if batch.lens.is_empty() {
            continue;
        }
        last_batch = (batch.bytes.len(), batch.lens.len());
        shared.datagrams.fetch_add(batch.lens.len() as u64, Ordering::Relaxed);
        shared.queued_bytes.fetch_add(batch.len_bytes(), Ordering::SeqCst);
        if tx.send(Ok(batch)).is_err() {
            return;
        }
    }
}

/// Waits up to `timeout_ms` for one of `fds` to be readable (`revents` say which).
#[allow(unsafe_code)]
fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<()> {
    // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()` pollfd structures.
    let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if ready < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Whether a socket's receive buffer holds a datagram (`FIONREAD`: the length of the next one; a
/// socket that cannot say counts as empty).
#[allow(unsafe_code)]
fn has_unread(socket: &StdUdpSocket) -> bool {
    let mut next: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int to the pointer, which is valid and exclusively borrowed.
    let result = unsafe { libc::ioctl(socket.as_raw_fd(), libc::FIONREAD, &mut next) };
    result == 0 && next > 0
}

/// The kernel's count of datagrams dropped at a socket (0 where it cannot be read).
#[allow(unsafe_code)]
pub fn kernel_drops(socket: &StdUdpSocket) -> u64 {
    let mut info = [0u32; SK_MEMINFO_VARS];
    let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
    // SAFETY: `info` is writable for `len` bytes; the kernel writes at most `len` and sets it.
    let result = unsafe {
        libc::getsockopt(socket.as_raw_fd(), libc::SOL_SOCKET, SO_MEMINFO, info.as_mut_ptr().cast(), &mut len)
    };
    if result != 0 || (len as usize) < (SK_MEMINFO_DROPS + 1) * 4 {
        return 0;
    }
    u64::from(info[SK_MEMINFO_DROPS])
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};

    use super::*;
    use crate::udp::{MulticastConfig, MulticastReceiver, MulticastSender};

    fn group() -> SocketAddr {
        let port = StdUdpSocket::bind("127.0.0.1:0").and_then(|s| s.local_addr()).map(|a| a.port()).unwrap_or(38803);
        SocketAddr::new(IpAddr::V4(Ipv4Addr::new(239, 255, 78, 1)), port)
    }

    #[tokio::test]
    async fn datagrams_are_handed_over_in_order() {
        let config = MulticastConfig::loopback(group());
        let receiver = MulticastReceiver::join(&config, None).expect("join");
        let mut reader = DatagramReader::spawn(
            vec![receiver.into_reader_socket().expect("socket")],
            ReaderOptions { queue_bytes_max: 1 << 20 },
        )
        .expect("reader");
        let sender = MulticastSender::open(&config).expect("sender");
        for k in 0..50u8 {
            sender.send_segments(&[k; 100], 100, None).await.expect("send");
        }
        let mut seen = Vec::new();
        while seen.len() < 50 {
            let batch = tokio::time::timeout(Duration::from_secs(5), reader.next()).await.expect("in time");
            seen.extend(batch.expect("open").expect("read").datagrams().map(|datagram| datagram[0]));
        }
        assert_eq!(seen, (0..50).collect::<Vec<u8>>());
        assert!(reader.is_idle());
        assert_eq!(reader.counters().datagrams, 50);
        assert_eq!(reader.counters().host_drops, 0);
    }

    /// Datagrams in a socket's buffer that no one has read yet are seen (the receiver is then
    /// behind the multicast even with nothing read waiting).
    #[test]
    fn unread_datagrams_in_the_socket_are_seen() {
        let socket = StdUdpSocket::bind("127.0.0.1:0").expect("bind");
        assert!(!has_unread(&socket));
        let sender = StdUdpSocket::bind("127.0.0.1:0").expect("bind");
        sender.send_to(&[7; 100], socket.local_addr().expect("addr")).expect("send");
        assert!(has_unread(&socket));
        let mut buffer = [0u8; 200];
        assert_eq!(socket.recv(&mut buffer).expect("recv"), 100);
        assert!(!has_unread(&socket));
    }

    /// A receiver that takes nothing: the reader's queue reaches its bound, the thread stops
    /// reading, the small socket buffer overflows, and the kernel's drops are counted.
    #[tokio::test]
    async fn the_kernels_drops_are_counted_when_the_receiver_falls_behind() {
        let config = MulticastConfig { buffer_bytes: 8 << 10, ..MulticastConfig::loopback(group()) };
        let receiver = MulticastReceiver::join(&config, None).expect("join");
        let reader = DatagramReader::spawn(
            vec![receiver.into_reader_socket().expect("socket")],
            ReaderOptions { queue_bytes_max: 1 },
        )
        .expect("reader");
        let sender = MulticastSender::open(&config).expect("sender");
        for _ in 0..400 {
            sender.send_segments(&[7; 1400], 1400, None).await.expect("send");
        }
        // Past the deadline the condition itself fails, with the counters.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        ldm7_testkit::wait_until(Duration::from_secs(6), "the kernel's drops to be counted", || {
            let counters = reader.counters();
            assert!(counters.host_drops > 0 || std::time::Instant::now() < deadline, "no drops counted: {counters:?}");
            (counters.host_drops > 0).then_some(())
        });
        let counters = reader.counters();
        assert!(counters.queue_full >= 1, "{counters:?}");
        assert!(counters.datagrams + counters.host_drops <= 400, "{counters:?}");
    }
}
